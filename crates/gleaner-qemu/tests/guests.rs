//! Real guests: boot, results back over the result port, cleanup on timeout and interrupt.
//! These need qemu-system-x86 and busybox-static, and the kernel in the lab cache (fetched
//! through the same code path as `gleaner lab fetch-kernel` when missing; that needs apt-get
//! with a done `apt-get update`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gleaner_qemu::guest::{self, GuestSpec};
use gleaner_qemu::kernel::{self as cache, Kernel};
use gleaner_qemu::session::{self, Session};
use gleaner_qemu::{interrupt, Accel, GuestError};

fn kernel() -> Kernel {
    let dir = cache::resolve_cache_dir(None);
    match cache::find_kernel(&dir, None) {
        Ok(k) => k,
        Err(_) => cache::fetch_kernel(&dir, None, &mut |s| eprintln!("fetch: {s}"))
            .unwrap_or_else(|e| panic!("the lab tests need a guest kernel in {} and could not fetch one: {e:#}", dir.display())),
    }
}

fn busybox() -> PathBuf {
    guest::find_busybox().unwrap_or_else(|e| panic!("{e}"))
}

fn qemu_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.starts_with("qemu"))
}

/// No process left whose command line mentions `marker` (the guest's temp dir).
fn no_process_mentions(marker: &Path) -> bool {
    let m = marker.to_string_lossy().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .all(|e| std::fs::read(e.path().join("cmdline")).map_or(true, |c| !String::from_utf8_lossy(&c).contains(&m)))
}

#[test]
#[serial_test::serial(host)]
fn guest_boots_runs_a_command_and_reports_back() {
    let k = kernel();
    let spec = GuestSpec::new("lab-test-boot").vcpus(2).memory_mib(384).accel(Accel::Tcg).job(
        "step facts sh -c 'nproc; cat /sys/fs/cgroup/cgroup.subtree_control; test -w /tmp && echo tmp-writable; test -w /usr || echo usr-readonly; uname -r'\n\
         step fails false\n",
    );
    let t0 = Instant::now();
    let (boot, steps, rc) = session::run_single(&k, &busybox(), &spec, Duration::from_secs(90)).expect("guest run");
    eprintln!("boot {boot:.2}s, total {:.2}s", t0.elapsed().as_secs_f64());
    assert_eq!(rc, 0);
    assert_eq!(steps.len(), 2, "{steps:?}");
    let out = &steps[0].stdout;
    assert_eq!(steps[0].rc, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "2", "guest should see 2 vCPUs: {out}");
    assert!(lines[1].contains("cpuset"), "cpuset controller enabled in the guest's cgroup2: {out}");
    assert!(out.contains("tmp-writable") && out.contains("usr-readonly"), "{out}");
    assert!(out.contains(&k.meta.version), "guest runs the cached kernel: {out}");
    assert_eq!(steps[1].rc, 1);
    // Host-side CPU time of named vCPU threads was measured.
    assert!(steps[0].host_threads.iter().any(|t| t.name == "CPU 0/TCG"), "{:?}", steps[0].host_threads);
    assert!(boot > 0.0 && boot < 60.0);
}

#[test]
#[serial_test::serial(host)]
fn timeout_kills_qemu_and_removes_temp_dir() {
    let k = kernel();
    let bb = busybox();
    let spec = GuestSpec::new("lab-test-timeout").vcpus(1).memory_mib(256).job("step hang sleep 1000\n");
    let mut s = Session::new(k, bb);
    let id = s.start(&spec).unwrap();
    let pid = s.guests[id].pid;
    let tmp = s.guests[id].temp_dir().to_path_buf();
    assert!(qemu_alive(pid));
    let err = s
        .drive(Instant::now() + Duration::from_secs(4), "job completion", &[id], &|s| s.states[0].done.is_some(), &mut |_| {})
        .unwrap_err();
    assert!(matches!(err, GuestError::Timeout { .. }), "{err}");
    drop(s);
    assert!(!qemu_alive(pid), "QEMU {pid} survived the timeout");
    assert!(!tmp.exists(), "temp dir {} survived", tmp.display());
    assert!(no_process_mentions(&tmp));
}

#[test]
#[serial_test::serial(host)]
fn interrupt_kills_all_guests_and_removes_temp_dirs() {
    let k = kernel();
    let bb = busybox();
    interrupt::install().unwrap();
    let mut s = Session::new(k, bb);
    let a = s.start(&GuestSpec::new("lab-test-int-a").vcpus(1).memory_mib(256).job("step spin sleep 1000\n")).unwrap();
    let b = s.start(&GuestSpec::new("lab-test-int-b").vcpus(1).memory_mib(256).job("step spin sleep 1000\n")).unwrap();
    let pids = [s.guests[a].pid, s.guests[b].pid];
    let tmps = [s.guests[a].temp_dir().to_path_buf(), s.guests[b].temp_dir().to_path_buf()];
    // A real SIGTERM to this process, delivered while the guests boot.
    let killer = std::thread::spawn(|| {
        std::thread::sleep(Duration::from_millis(1500));
        nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGTERM).unwrap();
    });
    let err = s
        .drive(Instant::now() + Duration::from_secs(60), "job completion", &[a, b], &|s| s.states[0].done.is_some(), &mut |_| {})
        .unwrap_err();
    killer.join().unwrap();
    interrupt::clear();
    assert!(matches!(err, GuestError::Interrupted), "{err}");
    drop(s);
    for (pid, tmp) in pids.iter().zip(&tmps) {
        assert!(!qemu_alive(*pid), "QEMU {pid} survived the interrupt");
        assert!(!tmp.exists(), "temp dir {} survived", tmp.display());
        assert!(no_process_mentions(tmp));
    }
}

/// Regression (oc2): a guest that finishes its job and powers off first is not a failure while
/// the session waits for the other guest.
#[test]
#[serial_test::serial(host)]
fn guest_finishing_first_is_not_a_failure() {
    let k = kernel();
    let mut s = Session::new(k, busybox());
    let a = s.start(&GuestSpec::new("lab-test-first-a").vcpus(1).memory_mib(256).job("step quick true\n")).unwrap();
    let b = s.start(&GuestSpec::new("lab-test-first-b").vcpus(1).memory_mib(256).job("step slow sleep 4\n")).unwrap();
    s.drive(Instant::now() + Duration::from_secs(90), "both jobs", &[a, b], &|s| s.states.iter().all(|x| x.done.is_some()), &mut |_| {})
        .expect("both guests finish");
    assert!(s.states[a].steps[0].0.rc == 0 && s.states[b].steps[0].0.rc == 0);
    assert!(s.states[b].steps[0].0.end_s - s.states[b].steps[0].0.begin_s >= 3.5);
}
