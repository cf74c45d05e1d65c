//! Tests on the real kernel: they load programs (root, CAP_BPF + CAP_PERFMON) and fail naming
//! what is missing; the ones that attach to tracepoints are `#[serial(host)]`.

use std::os::fd::AsFd;
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use gleaner_policy::idle::hist::bucket_of;
use gleaner_policy::idle::{TargetState, WakeTrace};

use super::*;
use crate::cpuset::CpuSet;
use crate::sched;
use crate::sysfs::Sysfs;

fn require_root(what: &str) {
    assert!(nix::unistd::geteuid().is_root(), "{what} needs root (CAP_BPF and CAP_PERFMON): run the tests as root");
}

fn config() -> TracerConfig {
    TracerConfig::detect(&Sysfs::new()).expect("read CPUs and cpuidle states from /sys")
}

fn load(what: &str) -> WakeTracer {
    require_root(what);
    WakeTracer::load(&config()).unwrap_or_else(|e| panic!("{what}: loading the tracer: {e}"))
}

fn me() -> i32 {
    i32::try_from(std::process::id()).unwrap()
}

/// Runs `f` with the calling thread pinned to `cpu`, then restores its affinity.
fn on_cpu<T>(cpu: u32, f: impl FnOnce() -> T) -> T {
    let before = sched::affinity(0).unwrap();
    sched::set_affinity(0, &CpuSet::parse(&cpu.to_string()).unwrap()).unwrap();
    let r = f();
    sched::set_affinity(0, &before).unwrap();
    r
}

fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_string()
}

#[test]
fn bucket_in_bpf_equals_bucket_of() {
    require_root("loading the bucket test program");
    let insns = progs::bucket_probe().unwrap();
    let mut log = vec![0u8; 1 << 16];
    let fd = sys::prog_load(sys::PROG_TYPE_RAW_TRACEPOINT, &insns, "gl_bucket_test", Some(&mut log))
        .unwrap_or_else(|e| panic!("BPF_PROG_LOAD: {e}: {}", String::from_utf8_lossy(&log)));
    let mut values = vec![0u64, 1, 2, 3, 4, 5, 7, 8, 1023, 1024, 1025, 999_999_999, 1_000_000_000, u64::MAX];
    for k in 1..64 {
        values.extend([(1u64 << k) - 1, 1u64 << k, (1u64 << k) + 1]);
    }
    let mut x = 0x9e37_79b9_7f4a_7c15u64; // a fixed pseudo-random spread
    for _ in 0..200 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        values.push(x >> (x % 64));
    }
    for v in values {
        let got = sys::prog_test_run_raw_tp(fd.as_fd(), &[v]).expect("BPF_PROG_TEST_RUN");
        assert_eq!(usize::try_from(got).unwrap(), bucket_of(v), "bucket of {v}");
    }
}

/// Feeds events through the real programs with `BPF_PROG_TEST_RUN` (not attached): the
/// busy-target path, the managed filter, the forgotten wakeup of a preempted or exited task,
/// and a switch-in that is not followed by that task's switch-out.
#[test]
fn programs_follow_the_state_machine() {
    let mut t = load("feeding the programs");
    let cpus = Sysfs::new().online_cpus().unwrap();
    let (waker, target) = (cpus.first().unwrap(), cpus.last().unwrap());
    t.set_managed(&[me()]).unwrap();
    t.set_counting(true).unwrap();
    const P: u64 = 0xffff_8880_0000_1000; // fake task pointers: only compared, never read
    const X: u64 = 0xffff_8880_0000_2000;
    const Y: u64 = 0xffff_8880_0000_3000;
    const SLEEPING: u64 = 1; // TASK_INTERRUPTIBLE
    let run = |t: &WakeTracer, cpu: u32, prog: &str, args: &[u64]| on_cpu(cpu, || t.test_run(prog, args).expect(prog));
    // waking(P) on `waker`, X -> P on `target` (current is this test thread: not idle, so
    // the target was busy), then P -> Y commits P's latency with this process's tgid.
    let wake_and_run = |t: &WakeTracer| {
        run(t, waker, "gl_sched_waking", &[P]);
        std::thread::sleep(Duration::from_millis(2));
        run(t, target, "gl_sched_switch", &[0, X, P, SLEEPING]);
        run(t, target, "gl_sched_switch", &[0, P, Y, SLEEPING]);
    };

    let before = t.read().unwrap();
    wake_and_run(&t);
    let d = t.read().unwrap().delta_since(&before);
    assert_eq!((d.latency.busy.count(), d.latency.all().count()), (1, 1), "one busy-target wakeup: {d:?}");
    let ns = d.latency.busy.sum_ns();
    assert!((2_000_000..1_000_000_000).contains(&ns), "latency {ns} ns: from the waking to the switch, >= the 2 ms sleep");
    assert!(d.vcpus.iter().all(|g| g.all().count() == 0), "no idle period when the idle task did not run: {d:?}");

    // Not managed: nothing; tracking all: counted again.
    t.set_managed(&[]).unwrap();
    let before = t.read().unwrap();
    wake_and_run(&t);
    assert_eq!(t.read().unwrap().delta_since(&before).latency.all().count(), 0, "an unmanaged task's wakeup is not counted");
    t.track_all(true).unwrap();
    wake_and_run(&t);
    assert_eq!(t.read().unwrap().delta_since(&before).latency.all().count(), 1, "track_all counts it");

    // Woken while running, then preempted (prev_state TASK_RUNNING): forgotten, so switching
    // it in later gives no latency.
    let before = t.read().unwrap();
    run(&t, waker, "gl_sched_waking", &[P]);
    run(&t, target, "gl_sched_switch", &[1, P, X, 0]);
    run(&t, target, "gl_sched_switch", &[0, X, P, SLEEPING]);
    run(&t, target, "gl_sched_switch", &[0, P, Y, SLEEPING]);
    assert_eq!(t.read().unwrap().delta_since(&before).latency.all().count(), 0, "a preempted task's wakeup is forgotten");

    // Woken while running, then exits: forgotten too (its task_struct may be reused by a new
    // task, switched in without a sched_waking).
    run(&t, waker, "gl_sched_waking", &[P]);
    run(&t, target, "gl_sched_switch", &[0, P, X, u64::try_from(progs::TASK_DEAD).unwrap()]);
    run(&t, target, "gl_sched_switch", &[0, X, P, SLEEPING]);
    run(&t, target, "gl_sched_switch", &[0, P, Y, SLEEPING]);
    assert_eq!(t.read().unwrap().delta_since(&before).latency.all().count(), 0, "an exited task's wakeup is forgotten");

    // The pending sample is dropped when the next switch-out is not that task's (events
    // were missed).
    let before = t.read().unwrap();
    run(&t, waker, "gl_sched_waking", &[P]);
    run(&t, target, "gl_sched_switch", &[0, X, P, SLEEPING]);
    run(&t, target, "gl_sched_switch", &[0, Y, X, SLEEPING]);
    assert_eq!(t.read().unwrap().delta_since(&before).latency.all().count(), 0, "a pending sample of another task is dropped");
    // cpu_idle's exit event (u32::MAX) and a real state run without error.
    run(&t, target, "gl_cpu_idle", &[u64::from(u32::MAX), u64::from(target)]);
    run(&t, target, "gl_cpu_idle", &[1, u64::from(target)]);

    // Paused: the programs run and count nothing, and traced time stands still.
    t.set_managed(&[me()]).unwrap();
    t.track_all(false).unwrap();
    let before = t.read().unwrap();
    wake_and_run(&t);
    assert_eq!(t.read().unwrap().delta_since(&before).latency.all().count(), 1, "counting again");
    t.set_counting(false).unwrap();
    let paused = t.read().unwrap();
    wake_and_run(&t);
    let after = t.read().unwrap();
    assert_eq!(after, paused, "counts or traced time grew while paused");

    // A wakeup recorded before a pause is not paired with a switch-in after it (the task's
    // switch-in while paused was not seen), nor is a CPU's last switch from before it.
    let before = t.read().unwrap();
    t.set_counting(true).unwrap();
    run(&t, waker, "gl_sched_waking", &[P]);
    run(&t, target, "gl_sched_switch", &[0, X, Y, SLEEPING]); // the target's last switch
    t.set_counting(false).unwrap();
    t.set_counting(true).unwrap();
    run(&t, target, "gl_sched_switch", &[0, Y, P, SLEEPING]);
    run(&t, target, "gl_sched_switch", &[0, P, X, SLEEPING]);
    let d = t.read().unwrap().delta_since(&before);
    assert_eq!(d.latency.all().count(), 0, "a wakeup from the epoch before the pause was counted: {d:?}");
    // And the next epoch's own wakeup is.
    wake_and_run(&t);
    assert_eq!(t.read().unwrap().delta_since(&before).latency.all().count(), 1, "a wakeup of the new epoch");
}

/// Two threads of this process, pinned to two vCPUs, hand a token back and forth through a
/// Mutex + Condvar with `pause` between rounds (the waiter's vCPU idles meanwhile). Returns
/// the number of hand-overs that woke the other thread.
fn ping_pong(cpus: [u32; 2], rounds: u32, pause: Duration) -> u32 {
    let shared = Arc::new((Mutex::new((0usize, 0u32)), Condvar::new()));
    let threads: Vec<_> = (0..2usize)
        .map(|me| {
            let shared = Arc::clone(&shared);
            let cpu = cpus[me];
            std::thread::spawn(move || {
                sched::set_affinity(0, &CpuSet::parse(&cpu.to_string()).unwrap()).unwrap();
                let (lock, cv) = &*shared;
                for _ in 0..rounds {
                    let mut g = lock.lock().unwrap();
                    while g.0 != me {
                        g = cv.wait(g).unwrap();
                    }
                    drop(g);
                    std::thread::sleep(pause);
                    let mut g = lock.lock().unwrap();
                    g.0 = 1 - me;
                    g.1 += 1;
                    drop(g);
                    cv.notify_one();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let passes = shared.0.lock().unwrap().1;
    passes - 1 // the last hand-over finds the other thread gone
}

/// A ping-pong on `pair` traced by `t`: hand-overs, what the tracer counted, and each vCPU's
/// idle fraction from /proc/stat meanwhile.
fn traced_ping_pong(t: &WakeTracer, pair: [u32; 2], rounds: u32) -> (u32, WakeTrace, Vec<f64>) {
    let procfs = crate::procfs::Procfs::new();
    let (before, s0) = (t.read().unwrap(), procfs.stat().unwrap());
    let handovers = ping_pong(pair, rounds, Duration::from_micros(200));
    let (after, s1) = (t.read().unwrap(), procfs.stat().unwrap());
    let idle = pair
        .iter()
        .map(|c| {
            let d = s1.cpus[c].delta(&s0.cpus[c]);
            d.idle_ticks() as f64 / d.total_ticks().max(1) as f64
        })
        .collect();
    (handovers, after.delta_since(&before), idle)
}

fn sh_loop(n: u32) {
    let script = format!("i=0; while [ $i -lt {n} ]; do sleep 0.001; i=$((i+1)); done");
    let st = Command::new("sh").args(["-c", &script]).status().expect("run sh -c (needs sh and sleep)");
    assert!(st.success(), "sh loop: {st}");
}

fn woken(t: &WakeTrace) -> (u64, u64) {
    t.vcpus.iter().fold((0, 0), |(c, s), g| (c + g.woken.count(), s + g.woken.sum_ns()))
}

/// Regression: the gap kinds are laid out per CPU as `(cpu * KINDS + kind)`; the programs once
/// multiplied by a literal 2 after a third kind was added, and every CPU but the first read
/// another CPU's rows (the server vCPU of `openloop` showed no idle period at all).
#[test]
#[serial_test::serial(host)]
fn a_workload_timer_on_the_last_vcpu_ends_local_idle_periods_there() {
    let mut t = load("tracing timer sleeps");
    let cpus = Sysfs::new().online_cpus().unwrap();
    let cpu = cpus.last().unwrap();
    assert!(cpu > 0, "needs two CPUs: online {cpus}");
    // The sleeper is a process of its own: the tracer counts by process, and this test
    // binary's other threads (tests running beside this one) have timers too.
    let sleeps = 300u32;
    let mut go = [0i32; 2];
    // SAFETY: `go` is an array of the two ints pipe(2) writes.
    assert_eq!(unsafe { libc::pipe(go.as_mut_ptr()) }, 0, "pipe: {}", std::io::Error::last_os_error());
    // SAFETY: a cpu_set_t is a plain bit array; all zeros is the empty set.
    let mut mask: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is an online CPU, below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu as usize, &mut mask) };
    // SAFETY: the child calls only async-signal-safe functions (read, sched_setaffinity,
    // nanosleep, _exit) before it exits.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork: {}", std::io::Error::last_os_error());
    if child == 0 {
        // SAFETY: the forked child's buffers are its own; it ends with _exit.
        unsafe {
            let mut b = 0u8;
            libc::read(go[0], (&raw mut b).cast(), 1);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mask);
            let ts = libc::timespec { tv_sec: 0, tv_nsec: 500_000 };
            for _ in 0..sleeps {
                libc::nanosleep(&ts, std::ptr::null_mut());
            }
            libc::_exit(0);
        }
    }
    t.set_managed(&[child]).unwrap();
    t.attach().unwrap();
    let before = t.read().unwrap();
    // SAFETY: a one-byte buffer, and the pipe's fds, ours, closed once.
    unsafe {
        libc::write(go[1], [1u8].as_ptr().cast(), 1);
        libc::close(go[0]);
        libc::close(go[1]);
    }
    let mut status = 0;
    // SAFETY: `child` is the process forked above; `status` an int it writes.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "sleeper: status {status}");
    let d = t.read().unwrap().delta_since(&before);
    t.detach();
    let g = d.gaps(cpu).unwrap();
    // Most sleeps end an idle period of the vCPU by a timer handled there: local, this
    // process's. (Another task may have run there meanwhile: not every sleep is counted.)
    assert!(g.local.count() >= u64::from(sleeps) / 2, "local idle periods on cpu{cpu}: {g:?} (load {})", loadavg());
    assert!(g.local.count() <= u64::from(sleeps) + 10, "{g:?}");
    let mean = g.local.mean_ns().unwrap_or(0.0);
    // No shorter than most of the sleep; the upper bound (1000 times the sleep) only catches
    // periods that never end, however slowly this machine wakes a sleeper.
    assert!((300_000.0..500_000_000.0).contains(&mean), "a 500 us sleep's idle period, measured {mean} ns");
    let others: u64 = d.vcpus.iter().filter(|x| x.cpu != cpu).map(|x| x.local.count()).sum();
    assert!(others < g.local.count() / 4, "the other vCPUs saw no such timers: {d:?}");
}

#[test]
#[serial_test::serial(host)]
fn real_ping_pong_is_traced() {
    let cpus = Sysfs::new().online_cpus().unwrap();
    assert!(cpus.len() >= 2, "needs 2 online CPUs, has {cpus}");
    let pair = [cpus.first().unwrap(), cpus.last().unwrap()];
    let mut t = load("tracing a ping-pong");
    assert!(!t.attached());
    t.set_managed(&[me()]).unwrap();
    let attached_at = Instant::now();
    t.attach().unwrap();
    t.attach().unwrap(); // idempotent
    assert!(t.attached());

    // Another process's wakeups are not counted, unless every task is tracked.
    let before = t.read().unwrap();
    sh_loop(100);
    let d = t.read().unwrap().delta_since(&before);
    assert!(d.latency.all().count() <= 10, "an unmanaged sh loop added {} latencies", d.latency.all().count());
    t.track_all(true).unwrap();
    let before = t.read().unwrap();
    sh_loop(100);
    let all = t.read().unwrap().delta_since(&before).latency.all().count();
    assert!(all >= 100, "tracking all tasks, 100 sleeps of sh gave only {all} latencies");
    t.track_all(false).unwrap();

    // The managed ping-pong. Other developers' work may keep a vCPU busy (no idle period
    // then, the wakeup is `busy`): up to three tries for one where the vCPUs idled.
    let rounds = 400;
    let mut tries = Vec::new();
    let (handovers, d) = loop {
        let (handovers, d, idle) = traced_ping_pong(&t, pair, rounds);
        let (n_woken, _) = woken(&d);
        // Each vCPU receives half the hand-overs; it was idle at a wakeup about as often as
        // /proc/stat says it idled.
        let idle_handovers: f64 = idle.iter().map(|f| f * f64::from(handovers) / 2.0).sum();
        tries.push(format!("woken {n_woken} of {handovers} hand-overs, vCPUs idle {idle:.2?}, load {}", loadavg()));
        if idle_handovers >= f64::from(handovers) / 4.0 && n_woken as f64 >= idle_handovers / 2.0 {
            break (handovers, d);
        }
        assert!(tries.len() < 3, "too few woken gaps, or vCPUs too busy with other work to check them: {tries:#?}");
    };
    let lat = d.latency.all();
    let (n_woken, woken_ns) = woken(&d);
    let states: Vec<_> = TargetState::ALL.iter().map(|&s| (s.name(), d.latency.of(s).count(), d.latency.of(s).mean_ns())).collect();
    eprintln!(
        "ping-pong: {handovers} hand-overs, {} latencies (p50 {:?} ns) by state {states:?}; woken gaps {n_woken} (mean {} ns), other {:?}; tries {tries:?}",
        lat.count(),
        lat.quantile_ns(0.5),
        woken_ns.checked_div(n_woken).unwrap_or(0),
        d.vcpus.iter().map(|g| (g.cpu, g.other.count())).collect::<Vec<_>>(),
    );
    // Every hand-over and every sleep's end wakes a thread of this process.
    let expected = u64::from(handovers + 2 * rounds);
    assert!(lat.count() * 10 >= expected * 9, "{} latencies for {expected} wakeups (hand-overs + sleeps)", lat.count());
    assert!(lat.count() <= expected + expected / 4 + 20, "{} latencies for {expected} wakeups", lat.count());
    // A woken gap is committed with its wakeup's latency, whose target was idle then; and a
    // vCPU has no more woken gaps than hand-overs it received.
    let not_busy = lat.count() - d.latency.busy.count();
    assert!(not_busy >= n_woken, "{n_woken} woken gaps but only {not_busy} wakeups onto an idle vCPU");
    for g in &d.vcpus {
        assert!(
            g.woken.count() <= u64::from(handovers) / 2 + 5,
            "vCPU {}: {} woken gaps for {handovers} hand-overs in all",
            g.cpu,
            g.woken.count()
        );
    }
    // The waiter's vCPU idled from its hand-over until the other thread's, one pause later.
    let mean = woken_ns / n_woken.max(1);
    // Upper bound: 2500 times the pause, a hang's.
    assert!((100_000..500_000_000).contains(&mean), "woken gaps average {mean} ns with a 200 us pause");
    let traced_attached = t.read().unwrap().traced_ns;

    // Detached: nothing grows, traced time stops.
    t.detach();
    let attached_for = attached_at.elapsed();
    assert!(!t.attached());
    let frozen = t.read().unwrap();
    assert!(
        frozen.traced_ns >= traced_attached && u128::from(frozen.traced_ns) <= attached_for.as_nanos(),
        "traced {} ns",
        frozen.traced_ns
    );
    ping_pong(pair, 50, Duration::from_micros(200));
    let after = t.read().unwrap();
    assert_eq!(after, frozen, "counts and traced time grew while detached");

    // Paused, still attached: nothing grows either.
    t.attach().unwrap();
    t.pause();
    assert!(t.attached() && !t.counting());
    let paused = t.read().unwrap();
    ping_pong(pair, 50, Duration::from_micros(200));
    let after = t.read().unwrap();
    assert_eq!(after, paused, "counts and traced time grew while paused");

    // Attached again: it counts again, traced time resumes from where it was.
    t.detach();
    t.attach().unwrap();
    ping_pong(pair, 20, Duration::from_micros(200));
    let again = t.read().unwrap();
    assert!(again.latency.all().count() > frozen.latency.all().count(), "attach after detach counts again");
    assert!(again.traced_ns > frozen.traced_ns);
}

#[test]
#[serial_test::serial(host)]
fn stats_count_runs_while_the_guard_lives() {
    let sysctl = || std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").expect("/proc/sys/kernel/bpf_stats_enabled");
    let before = sysctl();
    let mut t = load("BPF run-time statistics");
    t.track_all(true).unwrap();
    t.attach().unwrap();
    let guard = WakeTracer::enable_stats().unwrap();
    let s0 = t.prog_stats().expect("run_time_ns and run_cnt in the programs' fdinfo");
    std::thread::sleep(Duration::from_millis(50));
    let d = t.prog_stats().unwrap().delta_since(&s0);
    assert!(d.run_cnt > 0 && d.run_time_ns > 0, "no runs counted with stats on: {d:?}");
    assert!(t.prog_stats_each().iter().all(|(_, s)| s.is_some()));
    // The statistics from BPF_OBJ_GET_INFO_BY_FD are those /proc/self/fdinfo shows.
    t.detach();
    for p in t.prog_fds() {
        let (run_time_ns, run_cnt, misses) = sys::prog_run_stats(p).unwrap().expect("statistics in bpf_prog_info");
        let info = sys::FdInfo::of(p).unwrap();
        assert_eq!(Some(run_time_ns), info.u64("run_time_ns"));
        assert_eq!(Some(run_cnt), info.u64("run_cnt"));
        assert_eq!(misses, info.u64("recursion_misses").unwrap_or(0));
    }
    drop(guard);
    assert_eq!(sysctl(), before, "kernel.bpf_stats_enabled changed");
}

#[test]
#[serial_test::serial(host)]
fn drop_releases_programs_and_maps() {
    let mut t = load("checking nothing is left behind");
    t.attach().unwrap();
    let (progs, maps) = t.object_ids();
    assert_eq!((progs.len(), maps.len()), (3, 6));
    assert!(sys::prog_get_fd_by_id(progs[0]).is_ok(), "a live program is found by id");
    drop(t);
    let gone = |r: std::io::Result<std::os::fd::OwnedFd>| matches!(r, Err(e) if e.raw_os_error() == Some(libc::ENOENT));
    // The kernel frees detached programs after an RCU grace period.
    assert!(
        wait_until(Duration::from_secs(5), || progs.iter().all(|&id| gone(sys::prog_get_fd_by_id(id)))
            && maps.iter().all(|&id| gone(sys::map_get_fd_by_id(id)))),
        "programs {progs:?} or maps {maps:?} still exist after drop"
    );
}

#[test]
fn a_refused_program_reports_the_verifier_log() {
    require_root("loading a program");
    // `exit` with R0 never written: the verifier refuses it.
    let e = WakeTracer::try_load("gl_refused", vec![insn::exit()]).unwrap_err();
    match &e {
        TraceError::Verifier { prog, log } => assert!(*prog == "gl_refused" && log.contains("R0"), "{log}"),
        other => panic!("expected a verifier refusal, got {other:?}"),
    }
    assert!(e.to_string().contains("gl_refused"), "{e}");
}

#[test]
fn bad_cpus_and_tgids_are_bad_input() {
    let mut t = load("checking arguments");
    let e = t.set_managed(&[0]).unwrap_err();
    assert!(matches!(&e, TraceError::Os(crate::OsError::BadInput(b)) if b.what == "managed process id"), "{e}");
    let cfg = TracerConfig { cpus: CpuSet::parse("4095").unwrap(), poll_state: None };
    let e = WakeTracer::load(&cfg).unwrap_err();
    assert!(e.to_string().contains("4095") || matches!(&e, TraceError::Os(crate::OsError::BadInput(b)) if b.value == "4095"), "{e}");
}

const UNPRIVILEGED_MARK: &str = "gleaner-bpf-unprivileged:";

#[test]
fn unprivileged_load_is_unavailable() {
    require_root("switching to user nobody");
    // A copy of this test binary that nobody may run, wherever the target directory is.
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("bpf-tests");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(&exe)
        .args(["--exact", "bpf::tests::unprivileged_child", "--ignored", "--nocapture", "--test-threads=1"])
        .output()
        .expect("run setpriv (util-linux) to drop privileges");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the unprivileged child failed: {text}");
    let line = text.lines().find(|l| l.contains(UNPRIVILEGED_MARK)).unwrap_or_else(|| panic!("no result line from the child: {text}"));
    assert!(line.contains("not root (CAP_BPF/CAP_PERFMON needed)"), "{line}");
}

/// Run by [`unprivileged_load_is_unavailable`] as user nobody.
#[test]
#[ignore = "run as user nobody by unprivileged_load_is_unavailable"]
fn unprivileged_child() {
    assert!(!nix::unistd::geteuid().is_root(), "must run unprivileged");
    let e = WakeTracer::load(&TracerConfig { cpus: CpuSet::parse("0").unwrap(), poll_state: None }).unwrap_err();
    assert!(matches!(e, TraceError::Unavailable { .. }), "{e:?}");
    println!("{UNPRIVILEGED_MARK} {e}");
}
