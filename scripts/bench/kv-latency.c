/* A closed-loop key-value client of one connection, for the idle-policy benchmark: GETs one
 * 100-byte value again and again for SECONDS and prints the request latencies' summary as
 * JSON (the keys of a BenchDoc run's `latency`). memcached's text protocol or redis's RESP;
 * or `http`: GET / over HTTP/1.1 keep-alive (the page is the server's, nothing is SET), so a
 * web server's requests can be dumped one by one as a key-value store's are.
 *
 *   cc -O2 -o kv-latency kv-latency.c
 *   taskset -c 0 ./kv-latency memcached 127.0.0.1 11211 3
 *   taskset -c 0 ./kv-latency redis 127.0.0.1 6379 3
 *   taskset -c 0 ./kv-latency http 127.0.0.1 8080 3
 *
 * A request's latency is from before its send() to the end of its reply's last byte
 * (CLOCK_MONOTONIC). The first WARMUP requests are not counted. With KV_LATENCY_DUMP=FILE
 * set, every counted request's end (CLOCK_MONOTONIC, ns) and latency (ns) go to FILE, a
 * line each: to line them up with the agent's `--events` (their `mono_ns`). Exits 2 on bad
 * arguments, 1 on a failure, naming it. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define VALUE_LEN 100
#define WARMUP 1000
#define MAX_SAMPLES (20u * 1000u * 1000u)

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void die(const char *what) {
  fprintf(stderr, "kv-latency: %s: %s\n", what, strerror(errno));
  exit(1);
}

static void send_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = send(fd, buf, len, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      die("send");
    }
    buf += n;
    len -= (size_t)n;
  }
}

/* Reads until `done(buf, len)` says the reply is complete; returns its length. */
static size_t read_reply(int fd, char *buf, size_t cap, int (*done)(const char *, size_t)) {
  size_t len = 0;
  while (!done(buf, len)) {
    if (len == cap) {
      errno = EMSGSIZE;
      die("reply larger than expected");
    }
    ssize_t n = recv(fd, buf + len, cap - len, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      die("recv");
    }
    if (n == 0) {
      errno = ECONNRESET;
      die("the server closed the connection");
    }
    len += (size_t)n;
  }
  return len;
}

static int ends_with(const char *buf, size_t len, const char *tail) {
  size_t t = strlen(tail);
  return len >= t && memcmp(buf + len - t, tail, t) == 0;
}

static int mc_get_done(const char *b, size_t n) { return ends_with(b, n, "END\r\n"); }
static int mc_set_done(const char *b, size_t n) { return ends_with(b, n, "\r\n"); }
/* "$100\r\n" + value + "\r\n" */
static int redis_get_done(const char *b, size_t n) {
  const char *crlf = memchr(b, '\n', n);
  if (!crlf) return 0;
  if (b[0] != '$') return 1; /* an error or a nil: complete at its first line */
  long v = strtol(b + 1, NULL, 10);
  return v < 0 || n >= (size_t)(crlf - b + 1) + (size_t)v + 2;
}
static int redis_set_done(const char *b, size_t n) { return ends_with(b, n, "\r\n"); }
/* Headers, then Content-Length bytes of body (a reply without one is complete at its
 * headers' end). */
static int http_get_done(const char *b, size_t n) {
  const char *h = memmem(b, n, "\r\n\r\n", 4);
  if (!h) return 0;
  size_t head = (size_t)(h - b) + 4;
  const char *cl = memmem(b, head, "Content-Length:", 15);
  if (!cl) cl = memmem(b, head, "content-length:", 15);
  if (!cl) return 1;
  return n >= head + (size_t)strtoul(cl + 15, NULL, 10);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static uint64_t pct(const uint64_t *s, size_t n, double p) {
  size_t i = (size_t)(p / 100.0 * (double)(n - 1) + 0.5);
  return s[i < n ? i : n - 1];
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: kv-latency memcached|redis|http HOST PORT SECONDS\n");
    return 2;
  }
  int redis = strcmp(argv[1], "redis") == 0, http = strcmp(argv[1], "http") == 0;
  if (!redis && !http && strcmp(argv[1], "memcached") != 0) {
    fprintf(stderr, "kv-latency: protocol '%s': allowed memcached, redis, http\n", argv[1]);
    return 2;
  }
  char *end;
  long port = strtol(argv[3], &end, 10);
  if (*end || port < 1 || port > 65535) {
    fprintf(stderr, "kv-latency: port '%s': allowed 1..65535\n", argv[3]);
    return 2;
  }
  double secs = strtod(argv[4], &end);
  if (*end || !(secs > 0 && secs <= 3600)) {
    fprintf(stderr, "kv-latency: seconds '%s': allowed (0, 3600]\n", argv[4]);
    return 2;
  }
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1) {
    fprintf(stderr, "kv-latency: host '%s': allowed an IPv4 address\n", argv[2]);
    return 2;
  }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die("socket");
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

  char value[VALUE_LEN + 1];
  memset(value, 'g', VALUE_LEN);
  value[VALUE_LEN] = 0;
  char set[256], get[64], buf[4096];
  int set_len, get_len;
  int (*get_done)(const char *, size_t);
  if (http) {
    set_len = 0;
    get_len = snprintf(get, sizeof get, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", argv[2]);
    get_done = http_get_done;
  } else if (redis) {
    set_len = snprintf(set, sizeof set, "*3\r\n$3\r\nSET\r\n$7\r\ngleaner\r\n$%d\r\n%s\r\n", VALUE_LEN, value);
    get_len = snprintf(get, sizeof get, "*2\r\n$3\r\nGET\r\n$7\r\ngleaner\r\n");
    get_done = redis_get_done;
  } else {
    set_len = snprintf(set, sizeof set, "set gleaner 0 0 %d\r\n%s\r\n", VALUE_LEN, value);
    get_len = snprintf(get, sizeof get, "get gleaner\r\n");
    get_done = mc_get_done;
  }
  size_t n;
  if (!http) {
    send_all(fd, set, (size_t)set_len);
    n = read_reply(fd, buf, sizeof buf, redis ? redis_set_done : mc_set_done);
    if (!(redis ? ends_with(buf, n, "+OK\r\n") : ends_with(buf, n, "STORED\r\n"))) {
      fprintf(stderr, "kv-latency: the SET was refused: %.*s\n", (int)n, buf);
      return 1;
    }
  }

  uint64_t *s = malloc(MAX_SAMPLES * sizeof *s);
  if (!s) die("malloc");
  const char *dump = getenv("KV_LATENCY_DUMP");
  uint64_t *ends = dump ? malloc(MAX_SAMPLES * sizeof *ends) : NULL;
  if (dump && !ends) die("malloc");
  size_t count = 0, requests = 0;
  uint64_t start = now_ns(), stop = start + (uint64_t)(secs * 1e9), t = start;
  while (t < stop && count < MAX_SAMPLES) {
    uint64_t t0 = now_ns();
    send_all(fd, get, (size_t)get_len);
    n = read_reply(fd, buf, sizeof buf, get_done);
    t = now_ns();
    if (http ? memcmp(buf, "HTTP/1.1 200", 12) != 0 : n < VALUE_LEN) {
      fprintf(stderr, "kv-latency: a GET did not return the value: %.*s\n", (int)n, buf);
      return 1;
    }
    if (++requests > WARMUP) {
      if (ends) ends[count] = t;
      s[count++] = t - t0;
    }
  }
  if (count == 0) {
    fprintf(stderr, "kv-latency: no request counted in %.3f s (%zu made, the first %d are warm-up)\n", secs, requests, WARMUP);
    return 1;
  }
  if (dump) {
    FILE *f = fopen(dump, "w");
    if (!f) die(dump);
    for (size_t i = 0; i < count; i++) fprintf(f, "%lu %lu\n", (unsigned long)ends[i], (unsigned long)s[i]);
    if (fclose(f) != 0) die(dump);
  }
  uint64_t sum = 0;
  for (size_t i = 0; i < count; i++) sum += s[i];
  qsort(s, count, sizeof *s, cmp_u64);
  printf("{\"samples\": %zu, \"mean_ns\": %.1f, \"min_ns\": %lu, \"p50_ns\": %lu, \"p90_ns\": %lu, \"p99_ns\": %lu, "
         "\"p999_ns\": %lu, \"max_ns\": %lu, \"requests\": %zu, \"wall_ns\": %lu}\n",
         count, (double)sum / (double)count, (unsigned long)s[0], (unsigned long)pct(s, count, 50),
         (unsigned long)pct(s, count, 90), (unsigned long)pct(s, count, 99), (unsigned long)pct(s, count, 99.9),
         (unsigned long)s[count - 1], requests, (unsigned long)(t - start));
  close(fd);
  return 0;
}
