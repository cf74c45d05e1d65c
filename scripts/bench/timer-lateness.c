// How late a guest timer wakes a sleeper: `clock_nanosleep(TIMER_ABSTIME)` to now + GAP us on
// CPU `cpu` (timer slack 1 ns), ROUNDS times after 20 warm-up rounds; with BUSY=1 the CPU is
// kept busy by a SCHED_IDLE sched_yield() loop (as the yielding threads keep it), else it halts.
// Prints the lateness p50/p90/p99 in us. docs/sim.md ("Costs", IRQ) has the numbers.
//
//   gcc -O2 -o timer-lateness scripts/bench/timer-lateness.c -lpthread
//   for g in 100 1000 5000; do ./timer-lateness 1 $g 0 400; ./timer-lateness 1 $g 1 400; done
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

static int cpu;
static volatile int stop;

static long long ns(struct timespec t) { return t.tv_sec * 1000000000LL + t.tv_nsec; }

static void pin(int c) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(c, &s);
    sched_setaffinity(0, sizeof s, &s);
}

static void *spin(void *arg) {
    (void)arg;
    pin(cpu);
    struct sched_param p = {0};
    sched_setscheduler(0, SCHED_IDLE, &p);
    while (!stop) sched_yield();
    return 0;
}

static int cmp(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s CPU GAP_US BUSY(0|1) ROUNDS\n", argv[0]);
        return 2;
    }
    cpu = atoi(argv[1]);
    long gap = atol(argv[2]);
    int busy = atoi(argv[3]), n = atoi(argv[4]);
    if (gap <= 0 || n <= 0) {
        fprintf(stderr, "GAP_US and ROUNDS must be positive\n");
        return 2;
    }
    pthread_t th;
    if (busy) pthread_create(&th, 0, spin, 0);
    pin(cpu);
    prctl(PR_SET_TIMERSLACK, 1UL);
    long long *v = malloc(n * sizeof *v);
    struct timespec t, now;
    for (int i = 0; i < n + 20; i++) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        long long target = ns(t) + gap * 1000;
        t.tv_sec = target / 1000000000LL;
        t.tv_nsec = target % 1000000000LL;
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, 0);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (i >= 20) v[i - 20] = ns(now) - target;
    }
    stop = 1;
    if (busy) pthread_join(th, 0);
    qsort(v, n, sizeof *v, cmp);
    printf("gap %ld us busy %d: p50 %.1f p90 %.1f p99 %.1f us\n", gap, busy, v[n / 2] / 1e3, v[n * 9 / 10] / 1e3, v[n * 99 / 100] / 1e3);
    free(v);
    return 0;
}
