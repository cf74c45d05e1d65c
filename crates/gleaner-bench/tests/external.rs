//! `bench run` on real Debian-packaged programs (sysbench, stress-ng) and on a process tree.

use gleaner_bench::commands_for_tests::run_doc;

fn require(prog: &str, package: &str) {
    let found = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file())).unwrap_or(false);
    assert!(found, "{prog} not found: apt-get install {package}");
}

fn cmd(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

#[test]
#[serial_test::serial(external)]
fn sysbench_threads_and_mutex() {
    require("sysbench", "sysbench");
    for c in [
        "sysbench threads --threads=4 --thread-yields=200 --thread-locks=4 --time=1 run",
        "sysbench mutex --threads=2 --mutex-num=64 --mutex-locks=1000000 --mutex-loops=100 run",
    ] {
        let d = run_doc(&cmd(c), 1).unwrap_or_else(|e| panic!("{c}: {e:#}"));
        let r = &d.runs[0];
        assert_eq!(r.exit_code, Some(0), "{c}");
        assert!(r.wall_ns > 10_000_000, "{c}: wall {} ns", r.wall_ns);
        assert!(r.user_ns + r.sys_ns > 10_000_000, "{c}: CPU time {} ns not counted", r.user_ns + r.sys_ns);
        assert!(r.vcsw + r.nivcsw > 0, "{c}: no context switches counted");
        assert_eq!(d.kind, "run");
    }
}

#[test]
#[serial_test::serial(external)]
fn stress_ng_futex_and_mutex() {
    require("stress-ng", "stress-ng");
    for c in ["stress-ng --futex 2 --timeout 2s --quiet", "stress-ng --mutex 2 --timeout 1s --quiet"] {
        let d = run_doc(&cmd(c), 1).unwrap_or_else(|e| panic!("{c}: {e:#}"));
        let r = &d.runs[0];
        assert_eq!(r.exit_code, Some(0), "{c}");
        assert!(r.wall_ns >= 900_000_000, "{c}: wall {} ns", r.wall_ns);
        // stress-ng forks its stressors: their CPU time arrives through wait4 (reaped tree).
        assert!(r.user_ns + r.sys_ns > 100_000_000, "{c}: CPU time of the stressors not counted ({} ns)", r.user_ns + r.sys_ns);
        if c.contains("--futex") {
            // Futex waiters sleep in the kernel: every wake is a voluntary switch. (The mutex
            // stressor may run uncontended, so its switch count is not asserted.)
            assert!(r.vcsw > 100, "{c}: only {} voluntary context switches", r.vcsw);
        }
    }
}

#[test]
#[serial_test::serial(external)]
fn grandchildren_cpu_time_is_counted_and_exit_codes_kept() {
    // sh forks a busy child and waits for it: the grandchild's CPU time is in wait4's rusage.
    let c = vec!["sh".into(), "-c".into(), "i=0; (while [ $i -lt 20000 ]; do i=$((i+1)); done) & wait; exit 3".into()];
    let d = run_doc(&c, 2).unwrap();
    assert_eq!(d.runs.len(), 2);
    for r in &d.runs {
        assert_eq!(r.exit_code, Some(3));
        assert!(r.user_ns + r.sys_ns > 5_000_000, "CPU time {} ns", r.user_ns + r.sys_ns);
    }
    assert_eq!(d.summary.runs, 2);
}
