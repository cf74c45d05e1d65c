use super::*;
use std::fs;

fn write(p: &Path, text: &str) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, text).unwrap();
}

/// A fake v1 cpuset hierarchy root with the interface files the code touches.
fn v1_fixture() -> (tempfile::TempDir, Cgroups) {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("cpuset");
    write(&root.join("cpuset.cpus"), "0-3\n");
    write(&root.join("cpuset.mems"), "0\n");
    write(&root.join("cpuset.effective_cpus"), "0-3\n");
    write(&root.join("cgroup.procs"), "1\n");
    write(&root.join("tasks"), "1\n");
    (d, Cgroups::with_layout(Layout::V1 { cpuset_root: root }))
}

fn v2_fixture(root_subtree: &str) -> (tempfile::TempDir, Cgroups) {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("unified");
    write(&root.join("cgroup.controllers"), "cpuset cpu io memory pids\n");
    write(&root.join("cgroup.subtree_control"), root_subtree);
    write(&root.join("cgroup.procs"), "");
    (d, Cgroups::with_layout(Layout::V2 { root }))
}

#[test]
fn detect_prefers_v1_cpuset() {
    let d = tempfile::tempdir().unwrap();
    let proc_root = d.path().join("proc");
    write(&proc_root.join("self/mountinfo"), crate::procfs::tests::MOUNTINFO_V1);
    write(&d.path().join("sys/fs/cgroup/unified/cgroup.controllers"), "cpuset\n");
    let c = Cgroups::detect_in(&Procfs::with_root(&proc_root), d.path()).unwrap();
    assert_eq!(c.layout(), &Layout::V1 { cpuset_root: d.path().join("sys/fs/cgroup/cpuset") });
    assert_eq!(c.layout().version(), 1);
}

#[test]
fn detect_v2_with_cpuset_controller() {
    let d = tempfile::tempdir().unwrap();
    let proc_root = d.path().join("proc");
    write(
        &proc_root.join("self/mountinfo"),
        "22 1 254:0 / / rw - ext4 /dev/vda rw\n30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
    );
    write(&d.path().join("sys/fs/cgroup/cgroup.controllers"), "cpu io memory pids\n");
    let e = Cgroups::detect_in(&Procfs::with_root(&proc_root), d.path()).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, OsError::NoCpuset { .. }));
    assert!(msg.contains("cgroup2 at /sys/fs/cgroup with controllers 'cpu io memory pids'"), "{msg}");
    write(&d.path().join("sys/fs/cgroup/cgroup.controllers"), "cpuset cpu io memory pids\n");
    let c = Cgroups::detect_in(&Procfs::with_root(&proc_root), d.path()).unwrap();
    assert_eq!(c.layout(), &Layout::V2 { root: d.path().join("sys/fs/cgroup") });
}

#[test]
fn detect_reports_what_was_found() {
    // This machine's shape minus the cpuset mount: v1 without cpuset, cgroup2 with hugetlb.
    let d = tempfile::tempdir().unwrap();
    let proc_root = d.path().join("proc");
    let mi: String = crate::procfs::tests::MOUNTINFO_V1.lines().filter(|l| !l.contains("cpuset")).map(|l| format!("{l}\n")).collect();
    write(&proc_root.join("self/mountinfo"), &mi);
    write(&d.path().join("sys/fs/cgroup/unified/cgroup.controllers"), "hugetlb\n");
    let msg = Cgroups::detect_in(&Procfs::with_root(&proc_root), d.path()).unwrap_err().to_string();
    assert!(msg.contains("hugetlb") && msg.contains("/sys/fs/cgroup/cpu (rw,cpu)"), "{msg}");
    write(&proc_root.join("self/mountinfo"), "");
    let msg = Cgroups::detect_in(&Procfs::with_root(&proc_root), d.path()).unwrap_err().to_string();
    assert!(msg.contains("no cgroup or cgroup2 filesystem is mounted"), "{msg}");
}

#[test]
fn v1_create_set_move_remove() {
    let (_d, cg) = v1_fixture();
    let g = cg.create(Path::new(""), "gleaner-run-1").unwrap();
    assert!(g.exists());
    assert_eq!(g.path(), cg.root().join("gleaner-run-1"));
    // copied from the parent so tasks can be attached
    assert_eq!(fs::read_to_string(g.path().join("cpuset.mems")).unwrap(), "0");
    assert_eq!(g.cpus().unwrap().to_string(), "0-3");
    g.set_cpus(&CpuSet::parse("1-2").unwrap()).unwrap();
    assert_eq!(g.cpus().unwrap().to_string(), "1-2");
    assert_eq!(g.effective_cpus().unwrap().to_string(), "1-2", "falls back to cpuset.cpus without effective_cpus");
    assert!(matches!(g.set_cpus(&CpuSet::new()).unwrap_err(), OsError::BadInput(_)));
    g.add_process(4242).unwrap();
    assert_eq!(g.procs().unwrap(), vec![4242]);
    g.add_thread(4243).unwrap();
    assert_eq!(g.threads().unwrap(), vec![4243]);
    let root = cg.root().to_path_buf();
    g.remove().unwrap();
    assert!(!root.join("gleaner-run-1").exists());
    // stragglers went to the parent (fixture files keep the last write)
    assert_eq!(fs::read_to_string(root.join("cgroup.procs")).unwrap(), "4242");
    assert_eq!(fs::read_to_string(root.join("tasks")).unwrap(), "4243");
}

#[test]
fn refuses_non_gleaner_names() {
    let (_d, cg) = v1_fixture();
    for bad in ["user.slice", "x-gleaner", "gleaner/../../etc", ""] {
        let e = cg.create(Path::new(""), bad).unwrap_err();
        assert!(matches!(e, OsError::NotGleanerCgroup { .. }), "{bad}: {e}");
    }
    assert!(matches!(cg.create(Path::new("../x"), "gleaner-a").unwrap_err(), OsError::BadInput(_)));
    fs::create_dir(cg.root().join("docker")).unwrap();
    let g = cg.open("docker").unwrap();
    assert!(matches!(g.remove().unwrap_err(), OsError::NotGleanerCgroup { .. }));
    assert!(cg.root().join("docker").exists());
    assert!(matches!(cg.open("/missing").unwrap_err(), OsError::Dir { op: "open", .. }));
}

#[test]
fn open_relative_absolute_and_proc_style() {
    let (_d, cg) = v1_fixture();
    let g = cg.create(Path::new(""), "gleaner-a").unwrap();
    let abs = g.path().to_path_buf();
    assert_eq!(cg.open(&abs).unwrap().path(), abs);
    assert_eq!(cg.open("gleaner-a").unwrap().path(), abs);
    assert_eq!(cg.open("/gleaner-a").unwrap().path(), abs);
    assert_eq!(cg.open_existing("gleaner-a").unwrap().map(|g| g.path().to_path_buf()), Some(abs.clone()));
    g.remove().unwrap();
    // Gone: `open` is an error naming the resolved path, `open_existing` says None.
    assert!(matches!(cg.open("gleaner-a").unwrap_err(), OsError::Dir { op: "open", path, .. } if path == abs));
    assert!(cg.open_existing("gleaner-a").unwrap().is_none());
    assert!(matches!(cg.open_existing("../x").unwrap_err(), OsError::BadInput(_)));
}

#[test]
fn nested_create_and_list_gleaner_groups() {
    let (_d, cg) = v1_fixture();
    fs::create_dir(cg.root().join("system")).unwrap();
    write(&cg.root().join("system/cpuset.cpus"), "0-1\n");
    write(&cg.root().join("system/cpuset.mems"), "0\n");
    let a = cg.create(Path::new("system"), "gleaner-x").unwrap();
    assert_eq!(a.cpus().unwrap().to_string(), "0-1", "copied from the nested parent");
    let b = cg.create(Path::new("system/gleaner-x"), "gleaner-y").unwrap();
    let top = cg.create(Path::new(""), "gleaner-top").unwrap();
    let list = cg.list_gleaner_groups().unwrap();
    assert_eq!(list, vec![top.path().to_path_buf(), b.path().to_path_buf(), a.path().to_path_buf()], "children before parents");
    assert!(matches!(cg.create(Path::new(""), "gleaner-top").unwrap_err(), OsError::Dir { op: "create", .. }));
    b.remove().unwrap();
    a.remove().unwrap();
    top.remove().unwrap();
    assert!(cg.list_gleaner_groups().unwrap().is_empty());
    assert!(cg.root().join("system").exists());
}

#[test]
fn v2_enables_cpuset_and_undoes_it() {
    let (_d, cg) = v2_fixture("memory\n");
    let g = cg.create(Path::new(""), "gleaner-a").unwrap();
    assert_eq!(fs::read_to_string(cg.root().join("cgroup.subtree_control")).unwrap(), "+cpuset");
    assert_eq!(g.enabled_cpuset_in(), &[cg.root().to_path_buf()]);
    // v2 leaves cpuset.cpus empty (inherit from the parent): nothing is copied.
    assert!(g.cpus().unwrap().is_empty());
    g.set_cpus(&CpuSet::parse("0").unwrap()).unwrap();
    assert_eq!(g.cpus().unwrap().to_string(), "0");
    write(&g.path().join("cpuset.cpus.effective"), "0\n");
    assert_eq!(g.effective_cpus().unwrap().to_string(), "0");
    g.add_thread(77).unwrap();
    assert_eq!(g.threads().unwrap(), vec![77], "v2 threads live in cgroup.threads");
    g.remove().unwrap();
    assert_eq!(fs::read_to_string(cg.root().join("cgroup.subtree_control")).unwrap(), "-cpuset", "undone");
}

#[test]
fn v2_keeps_cpuset_when_already_enabled_or_still_needed() {
    let (_d, cg) = v2_fixture("cpuset memory\n");
    let g = cg.create(Path::new(""), "gleaner-a").unwrap();
    assert!(g.enabled_cpuset_in().is_empty());
    g.remove().unwrap();
    assert_eq!(fs::read_to_string(cg.root().join("cgroup.subtree_control")).unwrap(), "cpuset memory\n");

    let (_d, cg) = v2_fixture("memory\n");
    let g = cg.create(Path::new(""), "gleaner-a").unwrap();
    fs::create_dir(cg.root().join("other.slice")).unwrap();
    g.remove().unwrap();
    assert_eq!(fs::read_to_string(cg.root().join("cgroup.subtree_control")).unwrap(), "+cpuset", "another child may use cpuset");
}

#[test]
fn v2_nested_parent_enables_each_ancestor() {
    let (_d, cg) = v2_fixture("\n");
    let mid = cg.root().join("work.slice");
    write(&mid.join("cgroup.subtree_control"), "");
    let g = cg.create(Path::new("work.slice"), "gleaner-n").unwrap();
    assert_eq!(g.enabled_cpuset_in(), &[cg.root().to_path_buf(), mid.clone()]);
    assert_eq!(g.parent(), mid);
    g.remove().unwrap();
    assert_eq!(fs::read_to_string(mid.join("cgroup.subtree_control")).unwrap(), "-cpuset");
    assert_eq!(fs::read_to_string(cg.root().join("cgroup.subtree_control")).unwrap(), "-cpuset");
}

#[test]
fn ids_valid_malformed_empty() {
    let p = Path::new("cgroup.procs");
    assert_eq!(parse_ids(p, "1\n22\n333\n").unwrap(), vec![1, 22, 333]);
    assert!(matches!(parse_ids(p, "1\nx\n").unwrap_err(), OsError::Parse { line: 2, .. }));
    assert!(parse_ids(p, "").unwrap().is_empty());
}

#[test]
fn fixture_is_not_cgroupfs() {
    let (_d, cg) = v1_fixture();
    assert!(!is_cgroupfs(cg.root()));
}

// ---- the real cgroup v1 cpuset hierarchy (root needed) ----

fn real_cgroups() -> Cgroups {
    let c = Cgroups::detect().unwrap_or_else(|e| panic!("real cgroup test needs a cpuset controller: {e}"));
    assert!(is_cgroupfs(c.root()), "{} is not a cgroup filesystem", c.root().display());
    assert!(nix::unistd::geteuid().is_root(), "real cgroup test needs root (creates {}/gleaner-test-*)", c.root().display());
    c
}

/// Kills a child we started, even when the test fails.
struct Child(std::process::Child);
impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
#[serial_test::serial(host)]
fn real_create_attach_remove() {
    let cg = real_cgroups();
    let name = format!("gleaner-test-{}", std::process::id());
    let g = cg.create(Path::new(""), &name).unwrap();
    let path = g.path().to_path_buf();
    let child = Child(std::process::Command::new("sleep").arg("30").spawn().expect("need sleep"));
    let pid = i32::try_from(child.0.id()).unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        g.set_cpus(&CpuSet::parse("0").unwrap()).unwrap();
        assert_eq!(g.cpus().unwrap().to_string(), "0");
        assert_eq!(g.effective_cpus().unwrap().to_string(), "0");
        g.add_process(pid).unwrap();
        assert_eq!(g.procs().unwrap(), vec![pid]);
        assert_eq!(g.threads().unwrap(), vec![pid]);
        // The kernel applies the cpuset to the task's affinity.
        assert_eq!(crate::sched::affinity(pid).unwrap().to_string(), "0");
        let line = Procfs::new().cgroup_of(pid).unwrap().into_iter().find(|(_, c, _)| c.iter().any(|c| c == "cpuset")).unwrap();
        assert_eq!(line.2, format!("/{name}"));
        assert_eq!(cg.open(&line.2).unwrap().path(), path);
        assert!(cg.list_gleaner_groups().unwrap().contains(&path));
        assert!(matches!(g.add_process(i32::MAX - 1).unwrap_err(), OsError::Vanished { .. }));
    }));
    // remove() moves the sleep back to the root and rmdirs; run it even if asserts failed.
    g.remove().unwrap();
    assert!(!path.exists(), "{} still exists", path.display());
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
    let root_procs = read_ids(&cg.root().join("cgroup.procs")).unwrap();
    assert!(root_procs.contains(&pid), "straggler moved to the parent");
    drop(child);
}

#[test]
fn group_of_reads_proc_cgroup() {
    let (d, cg) = v1_fixture();
    let g = cg.create(Path::new(""), "gleaner-g").unwrap();
    let proc_root = d.path().join("proc");
    write(&proc_root.join("5/cgroup"), "9:name=systemd:/\n3:cpuset:/gleaner-g\n0::/\n");
    write(&proc_root.join("6/cgroup"), "0::/x\n");
    let procfs = Procfs::with_root(&proc_root);
    assert_eq!(cg.group_of(&procfs, 5).unwrap().path(), g.path());
    assert!(matches!(cg.group_of(&procfs, 6).unwrap_err(), OsError::NoCpuset { .. }));
    assert!(cg.group_of(&procfs, 7).unwrap_err().is_vanished());
    let (_d2, cg2) = v2_fixture("");
    fs::create_dir(cg2.root().join("x")).unwrap();
    assert_eq!(cg2.group_of(&procfs, 6).unwrap().path(), cg2.root().join("x"));
    g.remove().unwrap();
}

#[test]
fn v2_threaded_group_moves_threads() {
    let (_d, cg) = v2_fixture("cpuset\n");
    write(&cg.root().join("cgroup.threads"), "");
    let g = cg.create(Path::new(""), "gleaner-vcpus").unwrap();
    assert!(!g.is_threaded().unwrap());
    g.set_threaded().unwrap();
    assert!(g.is_threaded().unwrap());
    g.add_thread(501).unwrap();
    let root = cg.root().to_path_buf();
    g.remove().unwrap();
    assert_eq!(fs::read_to_string(root.join("cgroup.threads")).unwrap(), "501", "thread moved back to the parent");
    let (_d1, cg1) = v1_fixture();
    let g1 = cg1.create(Path::new(""), "gleaner-v1").unwrap();
    assert!(g1.is_threaded().unwrap());
    g1.set_threaded().unwrap();
    g1.remove().unwrap();
}

/// v1 takes single threads: move one thread of this test process in and let `remove` move it
/// back (its affinity follows the cpuset both ways). On a v2 machine a domain group refuses
/// single threads with EOPNOTSUPP, and the thread goes in and out of a threaded group under
/// this process's own group instead (the host agent's way with QEMU's vCPU threads).
#[test]
#[serial_test::serial(host)]
fn real_single_thread_in_and_out() {
    let cg = real_cgroups();
    let name = format!("gleaner-test-thr-{}", std::process::id());
    let g = cg.create(Path::new(""), &name).unwrap();
    let path = g.path().to_path_buf();
    let parked = crate::testutil::ParkedThread::start();
    let tid = parked.tid;
    let before = crate::sched::affinity(tid).unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        g.set_cpus(&CpuSet::parse("0").unwrap()).unwrap();
        if cg.layout().version() == 2 {
            // A v2 domain group refuses single threads (only threaded subtrees take them).
            let e = g.add_thread(tid).unwrap_err();
            assert!(matches!(&e, OsError::Write { source, .. } if source.raw_os_error() == Some(libc::EOPNOTSUPP)), "{e}");
            let own = cg.group_of(&crate::procfs::Procfs::new(), std::process::id().cast_signed()).unwrap();
            let t = cg.create_threaded(own.path(), &format!("{name}-threaded")).unwrap();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                t.set_cpus(&CpuSet::parse("0").unwrap()).unwrap();
                t.add_thread(tid).unwrap();
                assert_eq!(t.threads().unwrap(), vec![tid]);
                assert_eq!(crate::sched::affinity(tid).unwrap().to_string(), "0");
            }));
            t.remove().unwrap();
            if let Err(p) = r {
                std::panic::resume_unwind(p);
            }
            return;
        }
        g.add_thread(tid).unwrap();
        assert_eq!(g.threads().unwrap(), vec![tid]);
        assert_eq!(crate::sched::affinity(tid).unwrap().to_string(), "0");
    }));
    g.remove().unwrap();
    let after = crate::sched::affinity(tid).unwrap();
    parked.finish();
    assert!(!path.exists());
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
    assert_eq!(after, before, "thread back in the root cpuset gets its CPUs back");
}

/// The v2 half of the single-thread path on any machine with a cgroup2 mount (on a hybrid
/// one, like the CI machine, cpuset is v1's, so this is where v2's code runs): a thread of
/// this process goes into a threaded group under the process's own v2 group
/// (`cgroup.threads`), is listed there, and `remove` moves it back (the threaded branch of
/// `move_stragglers`) and removes the group.
#[test]
#[serial_test::serial(host)]
fn real_v2_single_thread_in_and_out_of_a_threaded_group() {
    assert!(nix::unistd::geteuid().is_root(), "real cgroup test needs root");
    let procfs = crate::procfs::Procfs::new();
    let mount = procfs
        .mountinfo()
        .unwrap()
        .into_iter()
        .find(|m| m.fstype == "cgroup2")
        .unwrap_or_else(|| panic!("this test needs a cgroup2 filesystem mounted (cgroup v2)"))
        .mount_point;
    let v2 = Cgroups::with_layout(Layout::V2 { root: mount.clone() });
    let me = std::process::id().cast_signed();
    let own = v2.group_of(&procfs, me).unwrap();
    let home = own.path().to_path_buf();
    // By hand (no cpuset on a hybrid machine's v2): a threaded child of our own group.
    let path = home.join(format!("gleaner-test-thr-v2-{me}"));
    fs::create_dir(&path).unwrap();
    let g = v2.open(&path).unwrap();
    let parked = crate::testutil::ParkedThread::start();
    let tid = parked.tid;
    let group_of_thread = || {
        let line = fs::read_to_string(format!("/proc/self/task/{tid}/cgroup")).unwrap();
        line.lines().find_map(|l| l.strip_prefix("0::").map(str::to_string)).unwrap()
    };
    let before = group_of_thread();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        g.set_threaded().unwrap();
        assert!(g.is_threaded().unwrap());
        g.add_thread(tid).unwrap();
        assert_eq!(g.threads().unwrap(), vec![tid]);
        assert_eq!(mount.join(group_of_thread().trim_start_matches('/')), path, "the thread is in the threaded group");
    }));
    let removed = g.remove();
    let after = group_of_thread();
    parked.finish();
    if path.exists() {
        let _ = fs::remove_dir(&path);
    }
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
    removed.unwrap();
    assert!(!path.exists(), "group removed");
    assert_eq!(after, before, "the thread is back in the process's own group");
}

/// rmdir of a group that still has a child group stays EBUSY: `remove` gives up after its
/// deadline with an error naming the directory (and the groups are then removed in order).
#[test]
#[serial_test::serial(host)]
fn real_remove_busy_gives_up_with_path() {
    let cg = real_cgroups();
    let name = format!("gleaner-test-busy-{}", std::process::id());
    let outer = cg.create(Path::new(""), &name).unwrap();
    let inner = cg.create(Path::new(&name), "gleaner-inner").unwrap();
    let outer_path = outer.path().to_path_buf();
    let t0 = Instant::now();
    let e = outer.remove().unwrap_err();
    let waited = t0.elapsed();
    let listed = cg.list_gleaner_groups().unwrap();
    inner.remove().unwrap();
    cg.open(&outer_path).unwrap().remove().unwrap();
    assert!(!outer_path.exists());
    assert!(matches!(&e, OsError::Dir { op: "remove", path, .. } if *path == outer_path), "{e}");
    assert!(waited >= Duration::from_secs(1), "gave up after {waited:?}");
    let i_inner = listed.iter().position(|p| p.ends_with("gleaner-inner")).unwrap();
    let i_outer = listed.iter().position(|p| *p == outer_path).unwrap();
    assert!(i_inner < i_outer, "children listed before parents: {listed:?}");
}

#[test]
fn v2_create_threaded_orders_steps() {
    let (_d, cg) = v2_fixture("\n");
    let vm = cg.root().join("machine.slice/qemu-1");
    write(&vm.join("cgroup.subtree_control"), "");
    write(&cg.root().join("machine.slice/cgroup.subtree_control"), "cpuset\n");
    let g = cg.create_threaded(Path::new("machine.slice/qemu-1"), "gleaner-pool-a").unwrap();
    assert!(g.is_threaded().unwrap());
    assert_eq!(g.enabled_cpuset_in(), &[cg.root().to_path_buf(), vm.clone()], "root first, the VM's group last");
    assert_eq!(fs::read_to_string(vm.join("cgroup.subtree_control")).unwrap(), "+cpuset");
    g.remove().unwrap();
    assert_eq!(fs::read_to_string(vm.join("cgroup.subtree_control")).unwrap(), "-cpuset");
}

#[test]
fn failed_create_rolls_back_cpuset_enablement() {
    // The parent's subtree_control exists but the group cannot be made (parent is missing
    // its own cgroup.subtree_control one level down): everything done so far is undone.
    let (_d, cg) = v2_fixture("\n");
    fs::create_dir_all(cg.root().join("a")).unwrap(); // no cgroup.subtree_control in "a"
    let e = cg.create(Path::new("a"), "gleaner-x").unwrap_err();
    assert!(matches!(e, OsError::Read { .. }), "{e}");
    assert_eq!(fs::read_to_string(cg.root().join("cgroup.subtree_control")).unwrap(), "-cpuset", "root enablement undone");
    assert!(!cg.root().join("a/gleaner-x").exists());
    // v1: parent without cpuset.mems -> the new directory is removed again.
    let (_d1, cg1) = v1_fixture();
    fs::remove_file(cg1.root().join("cpuset.mems")).unwrap();
    assert!(matches!(cg1.create(Path::new(""), "gleaner-y").unwrap_err(), OsError::Read { .. }));
    assert!(!cg1.root().join("gleaner-y").exists());
}

#[test]
fn a_forked_child_joins_v1_through_tasks_and_v2_through_cgroup_procs() {
    let (_d, cg) = v1_fixture();
    let g = cg.create(Path::new(""), "gleaner-agent-1").unwrap();
    assert_eq!(g.self_join_file(), g.path().join("tasks"));
    let (_d2, cg2) = v2_fixture("");
    let g2 = cg2.create(Path::new(""), "gleaner-agent-1").unwrap();
    assert_eq!(g2.self_join_file(), g2.path().join("cgroup.procs"));
}
