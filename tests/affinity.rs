//! Consolidation and the workload's own CPU affinity, through the real binary on this machine's
//! cpuset hierarchy: an unpinned idle workload consolidates; one with a thread its program
//! pinned (`taskset`, `sched_setaffinity`) keeps every vCPU, so the pinned thread runs inside
//! its own mask and the program's later pins to other vCPUs succeed; threads pinned apart are
//! not stacked onto one vCPU; and every mask is as it was once the agent is gone, after SIGTERM
//! and after `kill -9` (the guardian's restore). They need root, a cpuset cgroup
//! and two online CPUs, and fail saying so; they change cgroups, so they run serially.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use serial_test::serial;

/// A process tree we started, killed (by pid) and reaped when dropped.
struct Tree(Child);

impl Drop for Tree {
    fn drop(&mut self) {
        for c in children_of(self.0.id()) {
            signal(c, libc::SIGKILL);
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The first and the last online CPU (the test needs two).
fn first_and_last_cpu() -> (u32, u32) {
    let (list, n) = online_cpus();
    assert!(n >= 2, "this test needs at least 2 online CPUs to consolidate (online: {list})");
    let ids: Vec<u32> = list.split([',', '-']).filter_map(|s| s.parse().ok()).collect();
    (ids[0], *ids.last().unwrap())
}

/// `sh -c SCRIPT` (whose shell ends in an `exec`), and the pids of its `n` children once they
/// run their `sleep`.
fn workload(script: &str, n: usize) -> (Tree, Vec<i32>) {
    let tree = Tree(Command::new("sh").args(["-c", script]).spawn().unwrap());
    let mut kids = Vec::new();
    // The children run once they show their sleep (taskset has pinned itself and exec'd).
    let started = wait_until(Duration::from_secs(5), || {
        kids = children_of(tree.0.id());
        kids.len() == n && kids.iter().all(|k| std::fs::read_to_string(format!("/proc/{k}/comm")).is_ok_and(|c| c.trim() == "sleep"))
    });
    assert!(started, "the workload's {n} pinned children never started: {kids:?}");
    (tree, kids)
}

/// `gleaner attach --no-retention` (consolidation alone, 50 ms periods) to `pid`.
fn attach(pid: u32, run_dir: &std::path::Path) -> Child {
    gleaner()
        .args(["attach", "--no-retention", "--period-ms", "50", "--run-dir"])
        .arg(run_dir)
        .args(["--pid", &pid.to_string()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The `cpuset.cpus` of agent `agent`'s cgroup ("" while it has none).
fn agent_group_cpus(agent: u32) -> String {
    let (root, _) = cpuset_root().expect("a cpuset hierarchy");
    let file: PathBuf = root.join(format!("gleaner-agent-{agent}")).join("cpuset.cpus");
    std::fs::read_to_string(file).unwrap_or_default().trim().to_string()
}

/// Waits until the agent has shrunk its group to `cpus`.
fn wait_consolidated_to(agent: u32, cpus: &str) -> bool {
    wait_until(Duration::from_secs(15), || agent_group_cpus(agent) == cpus)
}

/// Watches the agent's group for `secs` seconds: it keeps every online CPU, and each pid of
/// `pins` keeps its own mask.
fn holds_every_cpu(agent: u32, secs: u64, pins: &[(i32, String)]) {
    let all = online_cpus().0;
    assert!(wait_until(Duration::from_secs(5), || agent_group_cpus(agent) == all), "the agent never took the workload over");
    for _ in 0..secs * 10 {
        std::thread::sleep(Duration::from_millis(100));
        let group = agent_group_cpus(agent);
        for (pid, mask) in pins {
            assert_eq!(&cpus_allowed(pid.cast_unsigned()), mask, "pid {pid} moved off its own mask (group at {group})");
        }
        assert_eq!(group, all, "a vCPU of a workload that pins its threads was taken");
    }
}

fn stop(agent: &mut Child) {
    signal(agent.id().cast_signed(), libc::SIGTERM);
    assert!(wait_child(agent, Duration::from_secs(10)).is_some(), "agent did not exit on SIGTERM");
}

#[test]
#[serial(host)]
fn an_unpinned_idle_workload_consolidates_and_gets_its_cpus_back() {
    require_root_and_cpuset();
    let (first, _) = first_and_last_cpu();
    let run_dir = tempfile::tempdir().unwrap();
    let (tree, kids) = workload("sleep 30 & exec sleep 30", 1);
    let (root, own) = (tree.0.id(), cpus_allowed(tree.0.id()));
    let mut agent = attach(root, run_dir.path());
    assert!(wait_consolidated_to(agent.id(), &first.to_string()), "never consolidated: '{}'", agent_group_cpus(agent.id()));
    assert_eq!(cpus_allowed(kids[0].cast_unsigned()), first.to_string(), "an unpinned thread follows the cpuset");
    stop(&mut agent);
    assert_eq!(cpus_allowed(root), own);
    assert_eq!(cpus_allowed(kids[0].cast_unsigned()), own);
    assert_no_leftovers(run_dir.path());
}

#[test]
#[serial(host)]
fn a_workload_that_pins_a_thread_keeps_every_vcpu_and_may_pin_the_next() {
    require_root_and_cpuset();
    let (first, last) = first_and_last_cpu();
    let run_dir = tempfile::tempdir().unwrap();
    // A server pinned to the last vCPU, then, 1.5 s later, a client pinning itself to the
    // first (sockperf's pattern in scripts/bench): the first vCPU must still be there.
    let (tree, kids) = workload(&format!("taskset -c {last} sleep 30 & sleep 1.5; exec taskset -c {first} sleep 30"), 1);
    let (root, server) = (tree.0.id(), kids[0]);
    let original = cpuset_cgroup_of(root);
    let mut agent = attach(root, run_dir.path());
    holds_every_cpu(agent.id(), 3, &[(server, last.to_string())]);
    let comm = std::fs::read_to_string(format!("/proc/{root}/comm")).unwrap_or_default();
    assert_eq!(comm.trim(), "sleep", "the client's `taskset -c {first}` failed (it would exit: EINVAL)");
    assert_eq!(cpus_allowed(root), first.to_string());
    stop(&mut agent);
    assert_eq!(cpuset_cgroup_of(root), original);
    assert_eq!(cpus_allowed(server.cast_unsigned()), last.to_string(), "the server keeps its own mask");
    assert_eq!(cpus_allowed(root), first.to_string(), "and the client its own");
    assert_no_leftovers(run_dir.path());
}

#[test]
#[serial(host)]
fn processes_pinned_apart_are_not_stacked() {
    require_root_and_cpuset();
    let (first, last) = first_and_last_cpu();
    let run_dir = tempfile::tempdir().unwrap();
    let (tree, kids) = workload(&format!("taskset -c {first} sleep 30 & taskset -c {last} sleep 30 & exec sleep 30"), 2);
    let mut masks: Vec<(i32, String)> = kids.iter().map(|&k| (k, cpus_allowed(k.cast_unsigned()))).collect();
    masks.sort_by_key(|(_, m)| m.clone());
    let mut want = vec![first.to_string(), last.to_string()];
    want.sort();
    assert_eq!(masks.iter().map(|(_, m)| m.clone()).collect::<Vec<_>>(), want, "the children pinned themselves");
    let mut agent = attach(tree.0.id(), run_dir.path());
    holds_every_cpu(agent.id(), 3, &masks);
    let (found, report) = wait_status(run_dir.path(), Duration::from_secs(5), |r| r[0]["pinned_cpus"] == online_cpus().0);
    assert!(found, "the status does not name both pinned CPUs: {report}");
    stop(&mut agent);
    for (pid, mask) in &masks {
        assert_eq!(&cpus_allowed(pid.cast_unsigned()), mask);
    }
    assert_no_leftovers(run_dir.path());
}

#[test]
#[serial(host)]
fn after_kill_9_every_mask_is_as_it_was() {
    require_root_and_cpuset();
    let (_, last) = first_and_last_cpu();
    let run_dir = tempfile::tempdir().unwrap();
    let (tree, kids) = workload(&format!("taskset -c {last} sleep 30 & exec sleep 30"), 1);
    let (root, pinned) = (tree.0.id(), kids[0]);
    let (original, own) = (cpuset_cgroup_of(root), cpus_allowed(root));
    let mut agent = attach(root, run_dir.path());
    holds_every_cpu(agent.id(), 1, &[(pinned, last.to_string())]);
    signal(agent.id().cast_signed(), libc::SIGKILL);
    let _ = agent.wait();
    // The guardian puts the workload back.
    assert!(
        wait_until(Duration::from_secs(10), || cpuset_cgroup_of(root) == original && cpuset_cgroup_of(pinned.cast_unsigned()) == original),
        "the workload is not back in {original}: {} / {}",
        cpuset_cgroup_of(root),
        cpuset_cgroup_of(pinned.cast_unsigned())
    );
    assert_eq!(cpus_allowed(root), own, "the unpinned process has its CPUs");
    assert_eq!(cpus_allowed(pinned.cast_unsigned()), last.to_string(), "the pinned one has its own mask");
    assert!(wait_until(Duration::from_secs(3), || leftover_agent_groups().is_empty()), "cgroup left: {:?}", leftover_agent_groups());
    let out = gleaner().args(["restore", "--run-dir"]).arg(run_dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_no_leftovers(run_dir.path());
}
