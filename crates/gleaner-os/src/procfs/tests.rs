use super::*;
use std::fs;

const STAT: &str = "cpu  14734 0 5460 976587 1217 0 271 12468 0 0\n\
cpu0 6965 0 2554 489673 232 0 24 5919 0 0\n\
cpu1 7769 0 2905 486914 985 0 246 6548 0 0\n\
intr 123 0 0\n\
ctxt 9876543\n\
btime 1700000000\n\
processes 9000\n\
procs_running 3\n\
procs_blocked 1\n";

fn fixture() -> (tempfile::TempDir, Procfs) {
    let d = tempfile::tempdir().unwrap();
    let p = Procfs::with_root(d.path());
    (d, p)
}

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, text).unwrap();
}

/// A `stat` line with the given pid, comm, ppid, utime, stime, processor, policy.
fn stat_line(pid: i32, comm: &str, ppid: i32, utime: u64, stime: u64, cpu: u32, policy: u32) -> String {
    // fields 3..=52 after comm; fill with distinct numbers so an off-by-one shows.
    let mut f: Vec<String> = (3..=52).map(|n| (1000 + n).to_string()).collect();
    f[0] = "S".into();
    f[4 - 3] = ppid.to_string();
    f[14 - 3] = utime.to_string();
    f[15 - 3] = stime.to_string();
    f[39 - 3] = cpu.to_string();
    f[41 - 3] = policy.to_string();
    f[19 - 3] = "-5".into();
    f[20 - 3] = "3".into();
    format!("{pid} ({comm}) {}\n", f.join(" "))
}

#[test]
fn stat_valid() {
    let (d, p) = fixture();
    write(d.path(), "stat", STAT);
    let s = p.stat().unwrap();
    assert_eq!(s.cpus.len(), 2);
    assert_eq!(s.ctxt, 9_876_543);
    assert_eq!(s.clk_tck, 100);
    assert_eq!(s.total.steal, 12468);
    assert_eq!((s.procs_running, s.procs_blocked), (3, 1));
    let c1 = s.cpus[&1];
    assert_eq!(c1.user, 7769);
    assert_eq!(c1.busy_ticks(), 7769 + 2905 + 246);
    assert_eq!(c1.idle_ticks(), 486_914 + 985);
    assert_eq!(c1.busy_ns(100), (7769 + 2905 + 246) * 10_000_000);
    assert_eq!(c1.steal_ns(100), 6548 * 10_000_000);
    assert_eq!(c1.total_ticks(), c1.busy_ticks() + c1.idle_ticks() + c1.steal);
    let d = c1.delta(&s.cpus[&0]);
    assert_eq!(d.user, 7769 - 6965);
    assert_eq!(s.cpus[&0].delta(&c1).user, 0, "delta saturates");
}

/// Found by fuzzing (`procfs_stat`): a counter near `u64::MAX` (`cpu 18446744073709551615 14
/// ...`) overflowed the busy/idle/total sums (a panic with overflow checks, a tiny wrapped
/// busy time without). They saturate.
#[test]
fn cpu_times_near_u64_max_saturate_not_overflow() {
    let path = Path::new("/proc/stat");
    let s = parse_stat(path, "cpu 18446744073709551615 14 542468 0 0\ncpu0 1 2 3 18446744073709551615 1\nctxt 5\n", 100).unwrap();
    assert_eq!(s.total.busy_ticks(), u64::MAX);
    assert_eq!(s.total.busy_ns(100), u64::MAX);
    assert_eq!(s.cpus[&0].idle_ticks(), u64::MAX);
    assert_eq!(s.cpus[&0].total_ticks(), u64::MAX);
    assert_eq!(s.cpus[&0].busy_ticks(), 1 + 2 + 3);
}

#[test]
fn stat_old_kernel_with_four_fields() {
    let (d, p) = fixture();
    write(d.path(), "stat", "cpu 1 2 3 4\ncpu0 1 2 3 4\nctxt 5\n");
    let s = p.stat().unwrap();
    assert_eq!(s.cpus[&0].idle, 4);
    assert_eq!(s.cpus[&0].steal, 0);
}

#[test]
fn stat_malformed() {
    let (d, p) = fixture();
    write(d.path(), "stat", "cpu 1 2 3 4\ncpu0 1 x 3 4\nctxt 5\n");
    let e = p.stat().unwrap_err();
    assert!(matches!(e, OsError::Parse { line: 2, .. }), "{e}");
    write(d.path(), "stat", "cpu 1 2 3 4\ncpuX 1 2 3 4\nctxt 5\n");
    assert!(matches!(p.stat().unwrap_err(), OsError::Parse { line: 2, .. }));
    write(d.path(), "stat", "cpu 1 2\ncpu0 1 2\nctxt 5\n");
    assert!(matches!(p.stat().unwrap_err(), OsError::Parse { line: 1, .. }));
    write(d.path(), "stat", "cpu 1 2 3 4\ncpu0 1 2 3 4\n");
    assert!(p.stat().unwrap_err().to_string().contains("ctxt"));
}

#[test]
fn stat_empty_and_missing() {
    let (d, p) = fixture();
    assert!(matches!(p.stat().unwrap_err(), OsError::Read { .. }));
    write(d.path(), "stat", "");
    let e = p.stat().unwrap_err();
    assert!(matches!(e, OsError::Parse { .. }), "{e}");
    assert!(e.to_string().contains(&d.path().join("stat").display().to_string()), "error names the path: {e}");
}

#[test]
fn ticks_conversion() {
    assert_eq!(ticks_to_ns(1, 100), 10_000_000);
    assert_eq!(ticks_to_ns(3, 1000), 3_000_000);
    assert_eq!(ticks_to_ns(7, 0), 70_000_000);
    // Its inverse rounds down to whole ticks.
    assert_eq!(duration_to_ticks(std::time::Duration::from_millis(29), 100), 2);
    assert_eq!(duration_to_ticks(std::time::Duration::from_millis(30), 0), 3);
    assert_eq!(duration_to_ticks(std::time::Duration::from_nanos(ticks_to_ns(12_345, 250)), 250), 12_345);
    assert_eq!(ticks_to_ns(u64::MAX, 1), u64::MAX);
}

#[test]
fn task_files_valid() {
    let (d, p) = fixture();
    write(d.path(), "42/task/43/schedstat", "123456789 2000 17\n");
    write(
        d.path(),
        "42/task/43/status",
        "Name:\tworker 1\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t42\nvoluntary_ctxt_switches:\t100\nnonvoluntary_ctxt_switches:\t7\n",
    );
    write(d.path(), "42/task/43/stat", &stat_line(43, "a) (b c)", 1, 55, 66, 1, 5));
    write(d.path(), "42/task/42/stat", &stat_line(42, "main", 1, 1, 1, 0, 0));
    assert_eq!(p.tasks(42).unwrap(), vec![42, 43]);
    assert_eq!(p.task_schedstat(42, 43).unwrap(), SchedStat { run_ns: 123_456_789, wait_ns: 2000, timeslices: 17 });
    let st = p.task_status(42, 43).unwrap();
    assert_eq!(st.name, "worker 1");
    assert_eq!(st.state, 'S');
    assert_eq!((st.voluntary_ctxt_switches, st.nonvoluntary_ctxt_switches), (100, 7));
    let ts = p.task_stat(42, 43).unwrap();
    assert_eq!(ts.comm, "a) (b c)");
    assert_eq!(ts.state, 'S');
    assert_eq!(ts.ppid, 1);
    assert_eq!((ts.utime_ticks, ts.stime_ticks, ts.processor, ts.policy), (55, 66, 1, 5));
    assert_eq!((ts.nice, ts.num_threads, ts.starttime_ticks), (-5, 3, 1022));
    assert_eq!((ts.cutime_ticks, ts.cstime_ticks), (1016, 1017));
}

#[test]
fn task_files_malformed() {
    let (d, p) = fixture();
    write(d.path(), "42/task/43/schedstat", "12 x 3\n");
    write(
        d.path(),
        "42/task/43/status",
        "Name:\tw\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\tmany\nnonvoluntary_ctxt_switches:\t7\n",
    );
    write(d.path(), "42/task/43/stat", "43 (short) S 1 2 3\n");
    assert!(matches!(p.task_schedstat(42, 43).unwrap_err(), OsError::Parse { .. }));
    assert!(matches!(p.task_status(42, 43).unwrap_err(), OsError::Parse { line: 3, .. }));
    let e = p.task_stat(42, 43).unwrap_err();
    assert!(e.to_string().contains("fields after comm, need field"), "{e}");
    write(d.path(), "42/task/43/stat", "43 no parens S 1\n");
    assert!(matches!(p.task_stat(42, 43).unwrap_err(), OsError::Parse { .. }));
}

#[test]
fn task_files_empty() {
    let (d, p) = fixture();
    write(d.path(), "42/task/43/schedstat", "");
    write(d.path(), "42/task/43/status", "");
    write(d.path(), "42/task/43/stat", "");
    assert!(matches!(p.task_schedstat(42, 43).unwrap_err(), OsError::Parse { .. }));
    assert!(p.task_status(42, 43).unwrap_err().to_string().contains("Name"));
    assert!(matches!(p.task_stat(42, 43).unwrap_err(), OsError::Parse { .. }));
}

#[test]
fn vanished_pid_and_tid() {
    let (d, p) = fixture();
    write(d.path(), "42/task/42/schedstat", "1 2 3\n");
    let e = p.task_schedstat(42, 99).unwrap_err();
    assert!(matches!(e, OsError::Vanished { pid: 42, tid: Some(99) }), "{e}");
    assert!(e.is_vanished());
    assert!(matches!(p.tasks(7).unwrap_err(), OsError::Vanished { pid: 7, tid: None }));
    assert!(p.comm(7).unwrap_err().is_vanished());
    assert!(p.cmdline(7).unwrap_err().is_vanished());
}

#[test]
fn process_tree_with_children_files() {
    let (d, p) = fixture();
    // 1 -> 10 (from thread 11) -> 20 -> 30 ; 1 -> 12
    write(d.path(), "1/task/1/children", "12 ");
    write(d.path(), "1/task/11/children", "10 ");
    write(d.path(), "10/task/10/children", "20");
    write(d.path(), "12/task/12/children", "");
    write(d.path(), "20/task/20/children", "30 ");
    write(d.path(), "30/task/30/children", "");
    assert_eq!(p.children(1).unwrap(), vec![10, 12]);
    assert_eq!(p.descendants(1, false).unwrap(), vec![10, 12, 20, 30]);
    assert_eq!(p.descendants(10, true).unwrap(), vec![10, 20, 30]);
    // 30 vanished between listing and walking: skipped.
    fs::remove_dir_all(d.path().join("30")).unwrap();
    assert_eq!(p.descendants(10, false).unwrap(), vec![20, 30]);
    write(d.path(), "20/task/20/children", "x");
    assert!(matches!(p.children(20).unwrap_err(), OsError::Parse { .. }));
    assert!(p.descendants(99, true).unwrap_err().is_vanished());
}

/// Found by fuzzing (`procfs_tasks`): a task directory `011` was listed as tid 11, whose
/// rebuilt path `task/11` does not exist, so `children` (reading `task/011/children`) and
/// `descendants` (which then found no children file and scanned parent pids) disagreed. Only
/// the kernel's spelling of an id names a pid or tid.
#[test]
fn tasks_and_pids_take_only_canonical_ids() {
    let (d, p) = fixture();
    for dir in ["100/task/100", "100/task/011", "100/task/+7", "100/task/-3", "0100/task/1", "+5/task/5", "42/task/42"] {
        fs::create_dir_all(d.path().join(dir)).unwrap();
    }
    assert_eq!(p.tasks(100).unwrap(), vec![100]);
    assert_eq!(p.pids().unwrap(), vec![42, 100]);
}

#[test]
fn process_tree_without_children_files() {
    // This machine's kernel lacks CONFIG_PROC_CHILDREN: the parent pid scan must work.
    let (d, p) = fixture();
    for (pid, ppid) in [(1, 0), (10, 1), (12, 1), (20, 10), (30, 20), (40, 1)] {
        write(d.path(), &format!("{pid}/stat"), &stat_line(pid, "x y", ppid, 0, 0, 0, 0));
        write(d.path(), &format!("{pid}/task/{pid}/stat"), &stat_line(pid, "x y", ppid, 0, 0, 0, 0));
    }
    write(d.path(), "self/mountinfo", "");
    assert_eq!(p.pids().unwrap(), vec![1, 10, 12, 20, 30, 40]);
    assert_eq!(p.children(1).unwrap(), vec![10, 12, 40]);
    assert_eq!(p.descendants(10, false).unwrap(), vec![20, 30]);
    assert_eq!(p.descendants(10, true).unwrap(), vec![10, 20, 30]);
    assert_eq!(p.descendants(30, false).unwrap(), Vec::<i32>::new());
    fs::create_dir_all(d.path().join("20/task/21")).unwrap();
    assert_eq!(p.tree_threads(10).unwrap(), vec![(10, 10), (20, 20), (20, 21), (30, 30)]);
}

#[test]
fn comm_cmdline_vmrss() {
    let (d, p) = fixture();
    write(d.path(), "5/comm", "my prog\n");
    write(d.path(), "5/cmdline", "sysbench\0--threads=4\0\0cpu\0");
    write(d.path(), "5/status", "Name:\tx\nVmPeak:\t  900 kB\nVmRSS:\t  1234 kB\n");
    write(d.path(), "2/status", "Name:\tkthreadd\n");
    write(d.path(), "2/cmdline", "");
    write(d.path(), "6/status", "VmRSS:\t  lots kB\n");
    assert_eq!(p.comm(5).unwrap(), "my prog");
    assert_eq!(p.cmdline(5).unwrap(), vec!["sysbench", "--threads=4", "cpu"]);
    assert!(p.cmdline(2).unwrap().is_empty());
    assert_eq!(p.self_status_vmrss_kib(5).unwrap(), 1234);
    assert_eq!(p.self_status_vmrss_kib(2).unwrap(), 0);
    assert!(matches!(p.self_status_vmrss_kib(6).unwrap_err(), OsError::Parse { line: 1, .. }));
}

#[test]
fn cgroup_file() {
    let (d, p) = fixture();
    write(d.path(), "5/cgroup", "9:name=systemd:/\n4:memory:/a/b\n2:cpu,cpuacct:/\n0::/user.slice/x:y\n");
    let c = p.cgroup_of(5).unwrap();
    assert_eq!(c.len(), 4);
    assert_eq!(c[1], (4, vec!["memory".to_string()], "/a/b".to_string()));
    assert_eq!(c[2].1, vec!["cpu", "cpuacct"]);
    assert_eq!(c[3], (0, vec![], "/user.slice/x:y".to_string()));
    write(d.path(), "6/cgroup", "x:cpu:/\n");
    assert!(matches!(p.cgroup_of(6).unwrap_err(), OsError::Parse { line: 1, .. }));
    write(d.path(), "7/cgroup", "3 cpuset /\n");
    assert!(matches!(p.cgroup_of(7).unwrap_err(), OsError::Parse { .. }));
    write(d.path(), "8/cgroup", "");
    assert!(p.cgroup_of(8).unwrap().is_empty());
}

pub(crate) const MOUNTINFO_V1: &str = "22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n\
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

#[test]
fn mountinfo_valid() {
    let (d, p) = fixture();
    write(
        d.path(),
        "self/mountinfo",
        &format!("{MOUNTINFO_V1}50 22 0:40 /x /mnt/with\\040space rw shared:5 master:1 - fuse.sshfs user@host:/a\\040b rw,user_id=0\n"),
    );
    let m = p.mountinfo().unwrap();
    assert_eq!(m.len(), 6);
    assert_eq!(m[3].mount_point, PathBuf::from("/sys/fs/cgroup/cpuset"));
    assert_eq!(m[3].fstype, "cgroup");
    assert_eq!(m[3].super_options, vec!["rw", "cpuset"]);
    assert_eq!(m[4].fstype, "cgroup2");
    assert_eq!(m[5].mount_point, PathBuf::from("/mnt/with space"));
    assert_eq!(m[5].root, "/x");
    assert_eq!(m[5].source, "user@host:/a b");
}

/// Found by fuzzing (`cgroup_files`): `\777` overflowed the byte being decoded (a panic with
/// overflow checks, a wrong byte without).
#[test]
fn mountinfo_escape_above_a_byte_is_kept_not_overflowed() {
    let (d, p) = fixture();
    write(d.path(), "self/mountinfo", "40 25 0:30 / /mnt/a\\777b\\101\\400 rw - tmpfs none\\1 rw\n");
    let m = p.mountinfo().unwrap();
    assert_eq!(m[0].mount_point, PathBuf::from("/mnt/a\\777bA\\400"));
    assert_eq!(m[0].source, "none\\1");
}

#[test]
fn mountinfo_malformed_and_empty() {
    let (d, p) = fixture();
    write(d.path(), "self/mountinfo", "22 1 254:0 / / rw ext4 /dev/vda rw\n");
    assert!(matches!(p.mountinfo().unwrap_err(), OsError::Parse { line: 1, .. }));
    write(d.path(), "self/mountinfo", "22 1 / - ext4 /dev/vda rw\n");
    assert!(matches!(p.mountinfo().unwrap_err(), OsError::Parse { line: 1, .. }));
    write(d.path(), "self/mountinfo", "");
    assert!(p.mountinfo().unwrap().is_empty());
}

#[test]
fn cpuinfo_and_kernel_cmdline() {
    let (d, p) = fixture();
    write(
        d.path(),
        "cpuinfo",
        "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme hypervisor\n\nprocessor\t: 1\nflags\t\t: other\n",
    );
    assert_eq!(p.cpuinfo_flags().unwrap(), vec!["fpu", "vme", "hypervisor"]);
    write(d.path(), "cpuinfo", "processor\t: 0\nFeatures\t: fp asimd\n");
    assert_eq!(p.cpuinfo_flags().unwrap(), vec!["fp", "asimd"]);
    write(d.path(), "cpuinfo", "");
    assert!(p.cpuinfo_flags().unwrap().is_empty());
    write(d.path(), "cmdline", "console=ttyS0 quiet\n");
    assert_eq!(p.cmdline_kernel().unwrap(), "console=ttyS0 quiet");
}

// ---- the real /proc of this machine ----

#[test]
fn real_proc_self() {
    let p = Procfs::new();
    assert!(p.clk_tck() > 0);
    let me = i32::try_from(std::process::id()).unwrap();
    let tid = crate::sched::gettid();
    let s = p.stat().unwrap();
    assert!(!s.cpus.is_empty() && s.ctxt > 0);
    assert!(s.procs_running >= 1, "this thread is running: {}", s.procs_running);
    let online = crate::sysfs::Sysfs::new().online_cpus().unwrap();
    assert_eq!(s.cpus.len(), online.len(), "one cpuN line per online CPU");
    assert!(p.tasks(me).unwrap().contains(&tid));
    // Per-thread schedstat exists on this kernel (CONFIG_SCHEDSTATS); run time grows with work.
    let a = p.task_schedstat(me, tid).unwrap();
    // Spin until this thread's own CPU clock advanced 20 ms (wall time varies with load).
    let cpu_ns = || {
        let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).unwrap();
        std::time::Duration::from(t)
    };
    let c0 = cpu_ns();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while cpu_ns() - c0 < std::time::Duration::from_millis(20) {
        assert!(std::time::Instant::now() < deadline, "got no 20 ms of CPU in 20 s");
    }
    let b = p.task_schedstat(me, tid).unwrap();
    assert!(b.run_ns >= a.run_ns + 10_000_000, "20 ms of CPU, schedstat {a:?} -> {b:?}");
    let st = p.task_status(me, tid).unwrap();
    assert_eq!(st.state, 'R');
    let ts = p.task_stat(me, tid).unwrap();
    assert_eq!(ts.state, 'R');
    assert_eq!(ts.policy, 0);
    let ps = p.process_stat(me).unwrap();
    assert_eq!(ps.starttime_ticks, ts.starttime_ticks.min(ps.starttime_ticks));
    assert!(ps.num_threads >= 1);
    assert_eq!(ps.comm, p.comm(me).unwrap());
    assert!(online.contains(ts.processor));
    assert!(p.pids().unwrap().contains(&me));
    assert!(!p.cmdline(me).unwrap().is_empty());
    assert!(p.self_status_vmrss_kib(me).unwrap() > 0);
    assert!(p.mountinfo().unwrap().iter().any(|m| m.fstype == "proc"));
    assert!(!p.cgroup_of(me).unwrap().is_empty());
    assert!(!p.cmdline_kernel().unwrap().is_empty());
}

#[test]
fn real_children_and_descendants() {
    let p = Procfs::new();
    let me = i32::try_from(std::process::id()).unwrap();
    // sh -> sleep: the grandchild must show up among our descendants.
    let mut child = std::process::Command::new("sh").args(["-c", "sleep 30 & wait"]).spawn().expect("need /bin/sh");
    let cpid = i32::try_from(child.id()).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let found = loop {
        let d = p.descendants(me, false).unwrap();
        if d.contains(&cpid) && d.iter().any(|&x| x != cpid && p.comm(x).map(|c| c == "sleep").unwrap_or(false)) {
            break true;
        }
        if std::time::Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let kids = p.children(cpid).unwrap();
    let threads = p.tree_threads(cpid).unwrap();
    assert!(threads.contains(&(cpid, cpid)) && kids.iter().all(|k| threads.contains(&(*k, *k))), "{threads:?}");
    // Kill the sleep (our grandchild, by pid) and the shell.
    for k in &kids {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*k), nix::sys::signal::Signal::SIGKILL);
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(found, "sleep grandchild not found below {me}");
    assert_eq!(kids.len(), 1);
    assert!(p.children(me).unwrap().iter().all(|&c| c != me));
}

#[test]
fn real_exited_thread_is_vanished() {
    let p = Procfs::new();
    let me = i32::try_from(std::process::id()).unwrap();
    let parked = crate::testutil::ParkedThread::start();
    let tid = parked.tid;
    assert!(p.task_schedstat(me, tid).is_ok(), "live thread readable");
    assert!(p.task_status(me, tid).unwrap().state == 'S' || p.task_status(me, tid).unwrap().state == 'R');
    parked.finish();
    // After join the kernel has released the thread (CLONE_CHILD_CLEARTID fires after exit).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match p.task_schedstat(me, tid) {
            Err(e) if e.is_vanished() => break,
            Err(e) => panic!("expected Vanished, got {e}"),
            Ok(_) => assert!(std::time::Instant::now() < deadline, "thread {tid} still readable 2 s after join"),
        }
        std::thread::yield_now();
    }
    assert!(p.task_stat(me, tid).unwrap_err().is_vanished());
    assert!(!p.tasks(me).unwrap().contains(&tid));
}

#[test]
fn loadavg_runnable_is_reread_at_each_call() {
    let (d, p) = fixture();
    write(d.path(), "loadavg", "0.00 0.30 2.03 2/78 16254\n");
    let mut l = p.open_loadavg().unwrap();
    assert_eq!(l.runnable().unwrap(), 2);
    write(d.path(), "loadavg", "7.88 4.02 2.88 13/96 20133\n");
    assert_eq!(l.runnable().unwrap(), 13);
    write(d.path(), "loadavg", "7.88 4.02 2.88\n");
    let e = l.runnable().unwrap_err().to_string();
    assert!(e.contains("loadavg") && e.contains("fourth field"), "{e}");
}

#[test]
fn loadavg_missing_names_the_file() {
    let (_d, p) = fixture();
    let e = p.open_loadavg().unwrap_err().to_string();
    assert!(e.contains("loadavg"), "{e}");
}

#[test]
fn loadavg_of_this_machine_counts_the_caller() {
    let mut l = Procfs::new().open_loadavg().unwrap();
    assert!(l.runnable().unwrap() >= 1);
}

#[test]
fn boot_id_and_kernel_release_valid_malformed_empty() {
    let (d, p) = fixture();
    write(d.path(), "sys/kernel/random/boot_id", "c3637bc8-ed44-4fad-95e4-ff8c310b0c77\n");
    write(d.path(), "sys/kernel/osrelease", "6.18.44-fc-v595\n");
    assert_eq!(p.boot_id().unwrap(), "c3637bc8-ed44-4fad-95e4-ff8c310b0c77");
    assert_eq!(p.kernel_release().unwrap(), "6.18.44-fc-v595");
    write(d.path(), "sys/kernel/random/boot_id", "two words\n");
    let e = p.boot_id().unwrap_err();
    assert!(matches!(e, OsError::Parse { .. }) && e.to_string().contains("boot_id"), "{e}");
    write(d.path(), "sys/kernel/osrelease", "\n");
    assert!(matches!(p.kernel_release().unwrap_err(), OsError::Parse { .. }));
    fs::remove_file(d.path().join("sys/kernel/random/boot_id")).unwrap();
    let e = p.boot_id().unwrap_err();
    assert!(matches!(e, OsError::Read { .. }) && e.to_string().contains("boot_id"), "{e}");
}

#[test]
fn real_boot_id_and_kernel_release() {
    let p = Procfs::new();
    let id = p.boot_id().expect("/proc/sys/kernel/random/boot_id");
    assert_eq!(id.len(), 36, "a UUID: {id}");
    assert_eq!(p.kernel_release().unwrap(), crate::kernel_release());
}

#[test]
fn open_schedstat_is_reread_at_each_call() {
    let (d, p) = fixture();
    write(d.path(), "7/task/8/schedstat", "1000 250 3\n");
    let mut f = p.open_task_schedstat(7, 8).unwrap();
    assert_eq!(f.read().unwrap(), SchedStat { run_ns: 1000, wait_ns: 250, timeslices: 3 });
    write(d.path(), "7/task/8/schedstat", "2000 900 5\n");
    assert_eq!(f.read().unwrap().wait_ns, 900);
}

#[test]
fn open_schedstat_malformed_and_empty_name_the_file() {
    let (d, p) = fixture();
    write(d.path(), "7/task/8/schedstat", "1000 x 3\n");
    let mut f = p.open_task_schedstat(7, 8).unwrap();
    let e = f.read().unwrap_err().to_string();
    assert!(e.contains("schedstat") && e.contains("wait_ns"), "{e}");
    write(d.path(), "7/task/8/schedstat", "");
    let e = f.read().unwrap_err().to_string();
    assert!(e.contains("schedstat"), "{e}");
    assert!(p.open_task_schedstat(7, 9).unwrap_err().to_string().contains("task/9/schedstat"));
}

/// Found by fuzzing (`procfs_schedstat`): the kept-open readers read into a fixed buffer (96
/// bytes for schedstat, 128 for loadavg) and parsed whatever fitted, so a longer text was cut:
/// a wrong value, or a "not UTF-8" error for a character cut in two. Longer texts are refused.
#[test]
fn schedstat_and_loadavg_longer_than_the_buffer_are_refused_not_cut() {
    let (d, p) = fixture();
    let long = format!("1 2 {}345\n", " ".repeat(90));
    write(d.path(), "7/task/8/schedstat", &long);
    assert_eq!(p.task_schedstat(7, 8).unwrap().timeslices, 345);
    let e = p.open_task_schedstat(7, 8).unwrap().read().unwrap_err().to_string();
    assert!(e.contains("task/8/schedstat") && e.contains("longer than any schedstat line"), "{e}");
    write(d.path(), "loadavg", &format!("0.00 0.30 2.03 {}12/78 16254\n", " ".repeat(120)));
    let e = p.open_loadavg().unwrap().runnable().unwrap_err().to_string();
    assert!(e.contains("loadavg") && e.contains("longer than any loadavg"), "{e}");
    // The longest real lines still fit.
    let max = format!("{m} {m} {m}\n", m = u64::MAX);
    write(d.path(), "7/task/8/schedstat", &max);
    assert_eq!(p.open_task_schedstat(7, 8).unwrap().read().unwrap().run_ns, u64::MAX);
}

#[test]
fn open_schedstat_of_this_thread_counts_its_run_time() {
    let me = std::process::id().cast_signed();
    let mut f = Procfs::new().open_task_schedstat(me, crate::sched::gettid()).unwrap();
    let a = f.read().unwrap().run_ns;
    let t0 = std::time::Instant::now();
    while t0.elapsed() < std::time::Duration::from_millis(5) {}
    assert!(f.read().unwrap().run_ns > a);
}

#[test]
fn open_status_and_stat_are_reread_whole_at_each_call() {
    let (d, p) = fixture();
    let status = |vcsw: u64, pad: usize| {
        // A status longer than the first 4 KiB buffer: the reader grows and reads again.
        format!(
            "Name:\tw\nState:\tS (sleeping)\nGroups:\t{}\nvoluntary_ctxt_switches:\t{vcsw}\nnonvoluntary_ctxt_switches:\t2\n",
            "1 ".repeat(pad)
        )
    };
    write(d.path(), "7/task/8/status", &status(10, 0));
    let mut f = p.open_task_status(7, 8).unwrap();
    assert_eq!(f.read().unwrap().voluntary_ctxt_switches, 10);
    write(d.path(), "7/task/8/status", &status(11, 5000));
    assert_eq!(f.read().unwrap().voluntary_ctxt_switches, 11, "10 KB of status, read whole");
    write(d.path(), "7/task/8/status", &status(12, 0));
    assert_eq!(f.read().unwrap().voluntary_ctxt_switches, 12, "shorter again: no stale tail");
    write(d.path(), "7/task/8/status", "Name:\tw\n");
    assert!(f.read().unwrap_err().to_string().contains("status"), "a malformed status names the file");
    assert!(p.open_task_status(7, 9).unwrap_err().to_string().contains("task/9/status"));

    write(d.path(), "stat", STAT);
    let mut s = p.open_stat().unwrap();
    let first = s.read().unwrap();
    assert_eq!(first, p.stat().unwrap(), "the kept file reads what a fresh open reads");
    write(d.path(), "stat", &STAT.replacen("cpu1 7769", "cpu1 8769", 1));
    assert_eq!(s.read().unwrap().cpus[&1].user, 8769);
}

#[test]
fn open_status_of_an_exited_thread_fails_and_of_this_one_counts_switches() {
    let me = std::process::id().cast_signed();
    let child = std::thread::spawn(crate::sched::gettid).join().unwrap();
    // The thread is gone: opening its files fails (Linux hands out pids in increasing order,
    // so its tid is not reused until the pid space wraps).
    assert!(Procfs::new().open_task_status(me, child).is_err());
    let mut f = Procfs::new().open_task_status(me, crate::sched::gettid()).unwrap();
    let a = f.read().unwrap().voluntary_ctxt_switches;
    std::thread::sleep(std::time::Duration::from_millis(2));
    assert!(f.read().unwrap().voluntary_ctxt_switches > a, "a sleep is a voluntary switch");
    let mut s = Procfs::new().open_stat().unwrap();
    assert!(!s.read().unwrap().cpus.is_empty());
}

#[test]
fn task_io_valid_malformed_empty() {
    let p = Path::new("/proc/1/task/1/io");
    let ok = "rchar: 10\nwchar: 20\nsyscr: 3\nsyscw: 4\nread_bytes: 0\nwrite_bytes: 0\ncancelled_write_bytes: 0\n";
    assert_eq!(parse_task_io(p, ok).unwrap(), TaskIo { syscr: 3, syscw: 4, rchar: 10, wchar: 20 });
    let e = parse_task_io(p, "rchar: x\n").unwrap_err().to_string();
    assert!(e.contains("/proc/1/task/1/io") && e.contains("line 1"), "{e}");
    let e = parse_task_io(p, "").unwrap_err().to_string();
    assert!(e.contains("no 'syscr' field"), "{e}");
}

#[test]
fn task_io_file_rereads_the_counters_on_a_fixture_and_for_real() {
    let (d, p) = fixture();
    write(d.path(), "7/task/8/io", "rchar: 1\nwchar: 2\nsyscr: 3\nsyscw: 4\n");
    let mut f = p.open_task_io(7, 8).unwrap();
    assert_eq!(f.read().unwrap(), TaskIo { syscr: 3, syscw: 4, rchar: 1, wchar: 2 });
    write(d.path(), "7/task/8/io", "rchar: 10\nwchar: 20\nsyscr: 30\nsyscw: 40\n");
    assert_eq!(f.read().unwrap().wchar, 20, "a kept file reads the new text");
    write(d.path(), "7/task/8/io", "rchar: 10\n");
    assert!(f.read().unwrap_err().to_string().contains("no 'syscr' field"));
    assert!(p.open_task_io(7, 9).is_err(), "no such thread");
    // This thread's own counters grow by what it writes to a pipe.
    let pid = i32::try_from(std::process::id()).unwrap();
    let tid = nix::unistd::gettid().as_raw();
    let mut f = Procfs::new().open_task_io(pid, tid).unwrap();
    let before = f.read().unwrap();
    let (mut r, mut w) = std::io::pipe().unwrap();
    std::io::Write::write_all(&mut w, &[0u8; 1000]).unwrap();
    std::io::Read::read_exact(&mut r, &mut [0u8; 1000]).unwrap();
    let after = f.read().unwrap();
    assert!(after.wchar >= before.wchar + 1000 && after.rchar >= before.rchar + 1000, "{before:?} -> {after:?}");
    assert!(after.syscw > before.syscw && after.syscr > before.syscr);
}

#[test]
fn task_io_cgroup_and_alive_on_fixture() {
    let (d, p) = fixture();
    write(d.path(), "7/task/8/io", "rchar: 1\nwchar: 2\nsyscr: 3\nsyscw: 4\n");
    write(d.path(), "7/task/8/cgroup", "5:cpuset:/machine/vm1\n0::/user.slice\n");
    assert_eq!(p.task_io(7, 8).unwrap().syscw, 4);
    assert_eq!(p.task_cgroup(7, 8, Some("cpuset")).unwrap().as_deref(), Some("/machine/vm1"));
    assert_eq!(p.task_cgroup(7, 8, None).unwrap().as_deref(), Some("/user.slice"));
    assert_eq!(p.task_cgroup(7, 8, Some("memory")).unwrap(), None);
    assert!(p.task_io(7, 9).unwrap_err().is_vanished());
    assert!(p.alive(7) && !p.alive(9) && !p.alive(0) && !p.alive(-1));
    assert!(alive(i32::try_from(std::process::id()).unwrap()));
}

#[test]
fn meminfo_and_base_slice_on_fixture() {
    let (d, p) = fixture();
    assert!(p.mem_available_kib().is_err(), "no meminfo: an error naming the file");
    write(d.path(), "meminfo", "MemTotal:       25165824 kB\nMemFree:  1 kB\nMemAvailable:   1572864 kB\n");
    assert_eq!(p.mem_available_kib().unwrap(), Some(1_572_864));
    write(d.path(), "meminfo", "MemTotal:       25165824 kB\n");
    assert_eq!(p.mem_available_kib().unwrap(), None, "old kernels have no MemAvailable");
    write(d.path(), "meminfo", "MemAvailable:   lots kB\n");
    let e = p.mem_available_kib().unwrap_err().to_string();
    assert!(e.contains("meminfo") && e.contains("line 1"), "{e}");
    assert_eq!(p.sched_base_slice_ns().unwrap(), None);
    write(d.path(), "sys/kernel/sched_base_slice_ns", "3000000\n");
    assert_eq!(p.sched_base_slice_ns().unwrap(), Some(3_000_000));
}

#[test]
fn uids_valid() {
    let (d, p) = fixture();
    write(d.path(), "42/status", "Name:\tsh\nState:\tS (sleeping)\nUid:\t1000\t0\t1001\t1002\nGid:\t5\t5\t5\t5\n");
    assert_eq!(p.uids(42).unwrap(), Uids { real: 1000, effective: 0, saved: 1001, fs: 1002 });
}

#[test]
fn uids_malformed() {
    let (d, p) = fixture();
    write(d.path(), "42/status", "Name:\tsh\nUid:\t1000\troot\t0\t0\n");
    let e = p.uids(42).unwrap_err().to_string();
    assert!(e.contains("42/status") && e.contains("'root' is not a user id"), "{e}");
    write(d.path(), "42/status", "Uid:\t1000\t0\n");
    assert!(p.uids(42).unwrap_err().to_string().contains("2 ids, need 4"));
}

#[test]
fn uids_empty_and_missing() {
    let (d, p) = fixture();
    write(d.path(), "42/status", "");
    assert!(p.uids(42).unwrap_err().to_string().contains("no 'Uid' line"));
    assert!(p.uids(43).is_err(), "no such process");
}
