//! Fault injection through the real binary: the agent killed at each phase, the
//! workload's cgroup removed by someone else, a cpuset write refused, thread churn, a full run
//! directory, and a second agent on the same target. After each: the workload has all its CPUs
//! back (timed and printed; only 10 s fails), no `gleaner*` cgroup, socket or state file is
//! left, and the agent's exit status and message name what happened. They need root and a
//! cpuset cgroup and fail saying so; they change host-global state (cgroups, a tmpfs mount), so
//! they run serially.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serial_test::serial;

/// A spawned agent whose stderr goes to a file (the guardian, which inherits it, writes there
/// too), killed and reaped on drop.
struct Agent {
    child: Started,
    err: PathBuf,
}

impl Agent {
    fn spawn(mut cmd: Command, dir: &Path) -> Self {
        let err = dir.join("agent.stderr");
        let child = cmd.stderr(std::fs::File::create(&err).unwrap()).spawn().unwrap();
        Self { child: Started(child), err }
    }
    fn pid(&self) -> u32 {
        self.child.0.id()
    }
    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }
    fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        match wait_child(&mut self.child.0, timeout) {
            Some(s) => s,
            None => panic!("agent did not exit within {timeout:?}; stderr: {}", self.stderr()),
        }
    }
}

/// The checks made after every fault: CPUs back (well under a second here; 10 s only catches
/// a hang), then no leftovers.
fn assert_recovered(workload: u32, original_cgroup: &str, original_cpus: &str, run_dir: &Path, since: Instant, what: &str) {
    assert!(
        wait_until(Duration::from_secs(10).saturating_sub(since.elapsed()), || {
            cpuset_cgroup_of(workload) == original_cgroup && cpus_allowed(workload) == original_cpus
        }),
        "{what}: workload not back in {original_cgroup} with CPUs {original_cpus} within 10 s (now {} on {})",
        cpuset_cgroup_of(workload),
        cpus_allowed(workload)
    );
    eprintln!("{what}: workload had its CPUs back {:?} after the fault", since.elapsed());
    assert!(
        wait_until(Duration::from_secs(3), || leftover_agent_groups().is_empty()),
        "{what}: cgroups left: {:?}",
        leftover_agent_groups()
    );
    let only_calibration = || {
        std::fs::read_dir(run_dir)
            .map(|d| {
                d.flatten().all(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with("calibration") || name == "idle-knobs"
                })
            })
            .unwrap_or(true)
    };
    assert!(wait_until(Duration::from_secs(3), only_calibration), "{what}: state file or socket left in {}", run_dir.display());
    assert_no_leftovers(run_dir);
}

fn sleeper() -> Started {
    Started(Command::new("sleep").arg("60").spawn().unwrap())
}

/// A sleeping workload, where it started (its cpuset cgroup and CPUs), and an agent attached to
/// it (`attach --pid`, 50 ms periods) with `env` set, its stderr in `dir`.
struct Attached {
    _workload: Started,
    pid: u32,
    cgroup: String,
    cpus: String,
    agent: Agent,
}

fn attach_to_sleeper(dir: &Path, run_dir: &Path, env: &[(&str, &str)]) -> Attached {
    let workload = sleeper();
    let pid = workload.0.id();
    let (cgroup, cpus) = (cpuset_cgroup_of(pid), cpus_allowed(pid));
    let mut cmd = gleaner();
    cmd.args(["attach", "--timeout-us", "50", "--period-ms", "50", "--run-dir"]).arg(run_dir).args(["--pid", &pid.to_string()]);
    cmd.envs(env.iter().copied());
    Attached { _workload: workload, pid, cgroup, cpus, agent: Agent::spawn(cmd, dir) }
}

fn require_two_cpus() {
    let (list, n) = online_cpus();
    assert!(n >= 2, "this test needs at least 2 online CPUs to consolidate (online: {list})");
}

#[test]
#[serial(host)]
fn agent_killed_at_each_phase_leaves_nothing_behind() {
    require_root_and_cpuset();
    require_two_cpus();
    // Every phase the agent declares (a new one is covered here without editing the test).
    for &phase in gleaner_agent::seam::PHASES {
        let dir = tempfile::tempdir().unwrap();
        let run_dir = dir.path().join("run");
        let Attached { _workload, pid: w, cgroup, cpus, mut agent } =
            attach_to_sleeper(dir.path(), &run_dir, &[("GLEANER_TEST_STOP_AT", phase)]);
        if phase == "mid-restore" {
            // The agent restores when told to stop: let it take the workload, then stop it.
            assert!(
                wait_until(Duration::from_secs(5), || cpuset_cgroup_of(w).contains("gleaner-agent-")),
                "{phase}: workload never moved; stderr: {}",
                agent.stderr()
            );
            signal(agent.pid().cast_signed(), libc::SIGTERM);
        }
        assert!(
            wait_until(Duration::from_secs(10), || stopped(agent.pid())),
            "{phase}: the agent never reached the phase; stderr: {}",
            agent.stderr()
        );
        assert!(agent.stderr().contains(&format!("test seam: stopped at {phase}")), "{phase}: {}", agent.stderr());
        let guardian = children_of(agent.pid())
            .into_iter()
            .find(|p| std::fs::read_to_string(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.contains("__guardian")));
        assert_eq!(guardian.is_some(), phase != "before-journal", "{phase}: guardian {guardian:?}");
        let t0 = Instant::now();
        signal(agent.pid().cast_signed(), libc::SIGKILL);
        let status = agent.wait(Duration::from_secs(5));
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{phase}: {status:?}");
        assert_recovered(w, &cgroup, &cpus, &run_dir, t0, phase);
        if let Some(g) = guardian {
            assert!(wait_until(Duration::from_secs(3), || !alive(g)), "{phase}: guardian {g} still running");
            assert!(
                agent.stderr().contains("guardian: agent") && agent.stderr().contains("recorded change(s)"),
                "{phase}: {}",
                agent.stderr()
            );
        }
    }
}

/// Needs what makes an agent turn the kernel's idle knobs: a cpuidle driver with a POLL state.
fn require_poll_state() {
    let driver = std::fs::read_to_string("/sys/devices/system/cpu/cpuidle/current_driver").unwrap_or_default();
    let state0 = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cpuidle/state0/name").unwrap_or_default();
    assert!(
        state0.trim() == "POLL" && !matches!(driver.trim(), "" | "none"),
        "this test needs a cpuidle driver with a POLL state (CI's machines load haltpoll with cpuidle_haltpoll.force=1): driver '{}', state0 '{}'",
        driver.trim(),
        state0.trim()
    );
}

/// `gleaner run` of a ping-pong whose vCPUs idle 50 us between hand-offs (what makes the
/// agent poll), stopped by the seam at `phase`; returns the agent and the workload's pid.
fn polling_agent(dir: &Path, run_dir: &Path, phase: &str) -> (Agent, i32) {
    let mut cmd = gleaner();
    cmd.args(["run", "--recalibrate", "--no-consolidation", "--period-ms", "50", "--run-dir"])
        .arg(run_dir)
        .args(["--", env!("CARGO_BIN_EXE_gleaner"), "bench", "workload", "pingpong", "--think-us", "50", "--duration-ms", "20000"])
        .env("GLEANER_TEST_STOP_AT", phase);
    let agent = Agent::spawn(cmd, dir);
    assert!(
        wait_until(Duration::from_secs(20), || stopped(agent.pid())),
        "{phase}: the agent never reached the phase; stderr: {}",
        agent.stderr()
    );
    assert!(agent.stderr().contains(&format!("test seam: stopped at {phase}")), "{phase}: {}", agent.stderr());
    // The workload starts after the calibration: at measuring-poll there is none yet.
    let workload = children_of(agent.pid())
        .into_iter()
        .find(|p| std::fs::read_to_string(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.contains("pingpong")))
        .unwrap_or(0);
    (agent, workload)
}

fn guardian_of(agent: &Agent) -> Option<i32> {
    children_of(agent.pid())
        .into_iter()
        .find(|p| std::fs::read_to_string(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.contains("__guardian")))
}

#[test]
#[serial(host)]
fn every_idle_knob_is_back_after_kill_9_by_the_guardian_or_restore() {
    require_root_and_cpuset();
    require_two_cpus();
    require_poll_state();
    require_idle_states_in_use();
    let knobs = idle_knobs();
    for &phase in gleaner_agent::seam::KNOB_PHASES {
        for kill_guardian_too in [false, true] {
            let what = format!("{phase}{}", if kill_guardian_too { " (guardian killed too)" } else { "" });
            let dir = tempfile::tempdir().unwrap();
            let run_dir = dir.path().join("run");
            let (mut agent, workload) = polling_agent(dir.path(), &run_dir, phase);
            assert_ne!(idle_knobs(), knobs, "{what}: the agent stopped after changing a knob, but none is changed");
            let guardian = guardian_of(&agent).unwrap_or_else(|| panic!("{what}: no guardian"));
            if kill_guardian_too {
                signal(guardian, libc::SIGKILL);
                assert!(wait_until(Duration::from_secs(3), || !alive(guardian)), "{what}: guardian {guardian} still running");
            }
            let t0 = Instant::now();
            signal(agent.pid().cast_signed(), libc::SIGKILL);
            assert_eq!(agent.wait(Duration::from_secs(5)).signal(), Some(libc::SIGKILL), "{what}");
            if workload > 0 {
                signal(workload, libc::SIGKILL);
            }
            if kill_guardian_too {
                // Nobody restores on their own: the knobs stay changed until `restore`.
                assert_ne!(idle_knobs(), knobs, "{what}: the knobs came back with no one to restore them");
                let out = gleaner().args(["restore", "--run-dir"]).arg(&run_dir).output().unwrap();
                assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
                assert!(String::from_utf8_lossy(&out.stdout).contains("restored"), "{what}: {}", String::from_utf8_lossy(&out.stdout));
                assert_idle_knobs_as(&knobs);
            } else {
                assert!(wait_until(Duration::from_secs(10), || idle_knobs() == knobs), "{what}: knobs not back within 10 s");
                eprintln!("{what}: knobs back {:?} after the kill", t0.elapsed());
                // The guardian says so once it has undone everything, after the knobs.
                assert!(wait_until(Duration::from_secs(3), || agent.stderr().contains("guardian: agent")), "{what}: {}", agent.stderr());
            }
            assert!(wait_until(Duration::from_secs(3), || leftover_agent_groups().is_empty()), "{what}: {:?}", leftover_agent_groups());
            let clean = || {
                std::fs::read_dir(&run_dir)
                    .map(|d| {
                        d.flatten().all(|e| e.file_name().to_string_lossy().starts_with("calibration") || e.file_name() == "idle-knobs")
                    })
                    .unwrap_or(true)
            };
            assert!(wait_until(Duration::from_secs(3), clean), "{what}: state file or socket left in {}", run_dir.display());
        }
    }
}

#[test]
#[serial(host)]
fn a_cgroup_removed_under_attach_ends_it_with_a_message() {
    require_root_and_cpuset();
    let (root, _) = cpuset_root().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let Attached { _workload, pid: w, cgroup, cpus, mut agent } = attach_to_sleeper(dir.path(), &run_dir, &[]);
    assert!(wait_until(Duration::from_secs(5), || cpuset_cgroup_of(w).contains("gleaner-agent-")), "stderr: {}", agent.stderr());
    // Someone else: moves the workload back, then removes the agent's group.
    let ours = root.join(cpuset_cgroup_of(w).trim_start_matches('/'));
    evacuate_and_remove(&ours, &root.join(cgroup.trim_start_matches('/')));
    let t0 = Instant::now();
    let status = agent.wait(Duration::from_secs(5));
    assert_eq!(status.code(), Some(1), "stderr: {}", agent.stderr());
    let msg = format!("stopped managing: the workload's cgroup {} was removed by someone else", ours.display());
    assert!(agent.stderr().contains(&msg), "{}", agent.stderr());
    assert_recovered(w, &cgroup, &cpus, &run_dir, t0, "cgroup removed under attach");
}

#[test]
#[serial(host)]
fn a_cgroup_removed_under_run_lets_the_workload_finish_unmanaged() {
    require_root_and_cpuset();
    let (root, _) = cpuset_root().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let mine = cpuset_cgroup_of(std::process::id());
    let mut cmd = gleaner();
    cmd.args(["run", "--timeout-us", "50", "--period-ms", "50", "--run-dir"]).arg(&run_dir).args(["--", "sh", "-c", "sleep 2; exit 7"]);
    let mut agent = Agent::spawn(cmd, dir.path());
    let sh = || {
        children_of(agent.pid()).into_iter().find(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "sh"))
    };
    assert!(wait_until(Duration::from_secs(5), || sh().is_some_and(|p| cpuset_cgroup_of(p.cast_unsigned()).contains("gleaner-agent-"))));
    let w = sh().unwrap().cast_unsigned();
    let ours = root.join(cpuset_cgroup_of(w).trim_start_matches('/'));
    // Move every process of the group (the shell and its sleep) back, then remove it.
    evacuate_and_remove(&ours, &root.join(mine.trim_start_matches('/')));
    let status = agent.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(7), "the workload's exit status stays the run's; stderr: {}", agent.stderr());
    assert!(
        agent.stderr().contains(&format!("the workload's cgroup {} was removed by someone else; consolidation stopped", ours.display())),
        "{}",
        agent.stderr()
    );
    assert_no_leftovers(&run_dir);
}

/// What "someone else" does to a group: moves every process out of `group` into `to`, then removes it.
/// Repeats until the removal succeeds: a process may fork into the group between reading
/// `cgroup.procs` and the last move (the shell of the `run` test starts its `sleep` at any time),
/// and the kernel answers EBUSY until the group is empty.
fn evacuate_and_remove(group: &Path, to: &Path) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let procs = std::fs::read_to_string(group.join("cgroup.procs")).unwrap_or_default();
        for p in procs.lines() {
            // A process that exited meanwhile (ESRCH) is already out of the group.
            let _ = std::fs::write(to.join("cgroup.procs"), p);
        }
        match std::fs::remove_dir(group) {
            Ok(()) => return,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("removing {} as someone else would: {e}", group.display()),
        }
    }
}

/// A cpuset cgroup of the test's own, holding `pid`, removed (and its file mode restored) on drop.
fn test_cgroup(name: &str, cpus: &str, pid: u32) -> (PathBuf, RemoveDir) {
    let (root, v1) = cpuset_root().unwrap();
    let cg = root.join(format!("gleaner-test-{name}-{}", std::process::id()));
    std::fs::create_dir(&cg).unwrap();
    let guard = RemoveDir(cg.clone());
    if v1 {
        std::fs::write(cg.join("cpuset.mems"), std::fs::read_to_string(root.join("cpuset.mems")).unwrap()).unwrap();
    } else {
        let sub = std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
        assert!(sub.split_whitespace().any(|c| c == "cpuset"), "cgroup2 root without +cpuset in subtree_control: {sub}");
    }
    std::fs::write(cg.join("cpuset.cpus"), cpus).unwrap();
    std::fs::write(cg.join("cgroup.procs"), pid.to_string()).unwrap();
    (cg, guard)
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `gleaner` without CAP_DAC_OVERRIDE, so a read-only cgroup file refuses root's write.
fn gleaner_without_dac_override() -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--bounding-set", "-dac_override", "--", env!("CARGO_BIN_EXE_gleaner")]);
    c
}

#[test]
#[serial(host)]
fn a_refused_cpuset_write_stops_consolidation_and_says_so() {
    require_root_and_cpuset();
    require_two_cpus();
    let all = online_cpus().0;
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let workload = sleeper();
    let w = workload.0.id();
    // The group starts on the first CPU only, so the agent's taking it over (its first write,
    // all managed CPUs) is seen in the file.
    let first = all.split(['-', ',']).next().unwrap().to_string();
    let (cg, _guard) = test_cgroup("refused", &first, w);
    let file = cg.join("cpuset.cpus");
    let original = std::fs::read_to_string(&file).unwrap();
    let cpus_now = || std::fs::read_to_string(&file).unwrap_or_default().trim().to_string();

    // Refused mid-run: the shrink of an idle workload fails, the agent says so once and runs on.
    // The file is made read-only once the agent has taken the group over (the status socket
    // opens before that, so waiting for it raced the take-over: CI saw the agent's first
    // write refused). 1 s periods: the first decision comes a quarter period after the
    // take-over, long after the chmod below.
    let mut cmd = gleaner_without_dac_override();
    cmd.args(["attach", "--timeout-us", "50", "--period-ms", "1000", "--run-dir"]).arg(&run_dir).arg("--cgroup").arg(&cg);
    let mut agent = Agent::spawn(cmd, dir.path());
    let taken = wait_until(Duration::from_secs(10), || cpus_now() == all);
    assert!(taken, "the agent never gave the group every CPU ({all}; the file has {}); stderr: {}", cpus_now(), agent.stderr());
    set_mode(&file, 0o444);
    let t0 = Instant::now();
    let refused = wait_until(Duration::from_secs(10), || agent.stderr().contains("was refused"));
    set_mode(&file, 0o644);
    assert!(refused, "no refusal reported; stderr: {}", agent.stderr());
    let err = agent.stderr();
    assert!(err.contains(&format!("to {} was refused", cg.display())) && err.contains("Permission denied"), "{err}");
    assert!(err.contains("consolidation stopped for the rest of this run"), "{err}");
    assert_eq!(err.matches("was refused").count(), 1, "said once, not every period: {err}");
    assert_eq!(cpus_now(), all, "the workload kept every CPU");
    eprintln!("refusal reported {:?} after the file became read-only", t0.elapsed());
    let (_, st) = wait_status(&run_dir, Duration::from_secs(2), |r| r[0]["consolidation"] == false);
    assert_eq!(st[0]["consolidation"], false, "{st}");
    assert!(st[0]["note"].as_str().is_some_and(|n| n.contains("was refused")), "{st}");
    signal(agent.pid().cast_signed(), libc::SIGINT);
    let status = agent.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(128 + libc::SIGINT), "stderr: {}", agent.stderr());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), original, "the group's own CPUs are back");
    assert_no_leftovers(&run_dir);

    // Refused at start: the agent's first write fails; it says which file and why, changes
    // nothing and exits 1.
    assert_eq!(cpus_now(), first);
    set_mode(&file, 0o444);
    let out = gleaner_without_dac_override()
        .args(["attach", "--timeout-us", "50", "--run-dir"])
        .arg(&run_dir)
        .arg("--cgroup")
        .arg(&cg)
        .output()
        .unwrap();
    set_mode(&file, 0o644);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&file.display().to_string()) && err.contains("Permission denied"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), first);
    assert_no_leftovers(&run_dir);
}

#[test]
#[serial(host)]
fn thread_churn_is_sampled_without_leaking_files_or_failing() {
    require_root_and_cpuset();
    assert!(
        Command::new("python3").arg("-V").output().is_ok_and(|o| o.status.success()),
        "this test needs python3 (a thread-churning workload)"
    );
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let events = dir.path().join("events.jsonl");
    let out_file = dir.path().join("rate.txt");
    // Threads started and joined in batches of 8 for 3 s; prints how many.
    let churn = "import threading,time\nn=0\nt0=time.time()\nwhile time.time()-t0<3:\n ts=[threading.Thread(target=int) for _ in range(8)]\n [t.start() for t in ts]\n [t.join() for t in ts]\n n+=8\nprint(n)\n";
    let mut cmd = gleaner();
    cmd.args(["run", "--timeout-us", "50", "--period-ms", "20", "--events"])
        .arg(&events)
        .arg("--run-dir")
        .arg(&run_dir)
        .args(["--", "python3", "-c", churn])
        .stdout(std::fs::File::create(&out_file).unwrap());
    let mut agent = Agent::spawn(cmd, dir.path());
    let mut peak_fds = 0;
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline && agent.child.0.try_wait().unwrap().is_none() {
        if let Ok(d) = std::fs::read_dir(format!("/proc/{}/fd", agent.pid())) {
            peak_fds = peak_fds.max(d.count());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = agent.wait(Duration::from_secs(5));
    assert!(status.success(), "stderr: {}", agent.stderr());
    let churned: u64 = std::fs::read_to_string(&out_file).unwrap().trim().parse().unwrap();
    let periods = std::fs::read_to_string(&events).unwrap().lines().filter(|l| l.contains("\"event\":\"period\"")).count() as u64;
    eprintln!("{churned} threads churned in 3 s; agent: {periods} periods, peak {peak_fds} open fds");
    // The fault under test, whatever this machine's speed: the agent sampled the workload
    // again and again while its threads came and went (a batch of 8 per period on average).
    assert!(periods >= 2, "the agent sampled {periods} period(s): the churn was never sampled twice");
    assert!(churned >= 8 * periods, "{churned} threads over {periods} periods: most periods saw no thread come or go");
    assert!(peak_fds <= 64, "the agent held {peak_fds} fds for a workload with at most 9 live threads: files of ended threads leak");
    assert_no_leftovers(&run_dir);
}

/// A small tmpfs of the test's own, unmounted on drop.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
#[serial(host)]
fn a_full_run_directory_fails_cleanly_and_names_the_file() {
    require_root_and_cpuset();
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    std::fs::create_dir(&run_dir).unwrap();
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "size=64k,mode=0700", "gleaner-test-full"]).arg(&run_dir).status();
    assert!(mounted.is_ok_and(|s| s.success()), "mounting a tmpfs (needs root and mount(8))");
    let _mount = Mount(run_dir.clone());
    // Fill it.
    let filler = run_dir.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 4096];
    while std::io::Write::write_all(&mut f, &chunk).is_ok() {}
    drop(f);
    let out = gleaner().args(["run", "--timeout-us", "50", "--run-dir"]).arg(&run_dir).args(["--", "true"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("writing the state file") && err.contains("No space left on device"), "{err}");
    assert!(err.contains(&run_dir.display().to_string()), "names the file: {err}");
    let left: Vec<_> = std::fs::read_dir(&run_dir).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("filler")], "nothing but the filler is left");
    assert!(leftover_agent_groups().is_empty(), "{:?}", leftover_agent_groups());
}

#[test]
#[serial(host)]
fn a_second_agent_on_the_same_target_is_refused() {
    require_root_and_cpuset();
    let dir = tempfile::tempdir().unwrap();
    let (run_a, run_b) = (dir.path().join("a"), dir.path().join("b"));
    let Attached { _workload, pid: w, cgroup, cpus, agent: mut first } = attach_to_sleeper(dir.path(), &run_a, &[]);
    assert!(wait_until(Duration::from_secs(5), || cpuset_cgroup_of(w).contains("gleaner-agent-")), "stderr: {}", first.stderr());
    let managed_in = cpuset_cgroup_of(w);

    // The same pid, from another run directory.
    let out = gleaner().args(["attach", "--timeout-us", "50", "--run-dir"]).arg(&run_b).args(["--pid", &w.to_string()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("agent {} manages it", first.pid())), "{err}");
    // The first agent's own group, as a cgroup target.
    let (root, _) = cpuset_root().unwrap();
    let group = root.join(managed_in.trim_start_matches('/'));
    let out = gleaner().args(["attach", "--timeout-us", "50", "--run-dir"]).arg(&run_b).arg("--cgroup").arg(&group).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("another agent holds its lock"), "{err}");
    assert_eq!(cpuset_cgroup_of(w), managed_in, "the refused agents changed nothing");
    assert!(alive(first.pid().cast_signed()));
    assert_no_leftovers(&run_b);
    signal(first.pid().cast_signed(), libc::SIGTERM);
    first.wait(Duration::from_secs(10));
    assert_recovered(w, &cgroup, &cpus, &run_a, Instant::now(), "first agent stopped");

    // A cgroup target, twice.
    let other = sleeper();
    let (cg, _guard) = test_cgroup("twice", &online_cpus().0, other.0.id());
    let mut cmd = gleaner();
    cmd.args(["attach", "--timeout-us", "50", "--period-ms", "50", "--run-dir"]).arg(&run_a).arg("--cgroup").arg(&cg);
    let mut first = Agent::spawn(cmd, dir.path());
    // A finished period: the group is taken and locked before the first one (the status
    // socket opens earlier, and a second agent started then could take the lock first).
    let (up, _) = wait_status(&run_a, Duration::from_secs(10), |r| r[0]["periods"].as_u64().is_some_and(|p| p >= 1));
    assert!(up, "the first agent never finished a period; stderr: {}", first.stderr());
    let out = gleaner().args(["attach", "--timeout-us", "50", "--run-dir"]).arg(&run_b).arg("--cgroup").arg(&cg).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&cg.display().to_string()) && err.contains("another agent holds its lock"), "{err}");
    signal(first.pid().cast_signed(), libc::SIGTERM);
    first.wait(Duration::from_secs(10));
    assert_no_leftovers(&run_a);
    assert_no_leftovers(&run_b);
}

/// `scripts/bench/front.py` running its poll peer (every vCPU's resume latency `n/a`) over a
/// `sleep`, ended by `sig` once the knob is turned; returns the sleep's pid (the test's to end).
fn front_series_ended_by(sig: i32) -> i32 {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bench/front.py");
    let mut front = Command::new("python3")
        .arg(&script)
        .args(["--rounds", "1", "--peers", "poll,gleaner=", "--", "sleep", "30"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3 runs scripts/bench/front.py (scripts/test.sh installs python3)");
    let pid = front.id();
    let polling = || idle_knobs().iter().any(|(k, v)| k.ends_with("pm_qos_resume_latency_us") && v == "n/a");
    let sleeper = || {
        children_of(pid).into_iter().find(|c| std::fs::read_to_string(format!("/proc/{c}/cmdline")).is_ok_and(|l| l.starts_with("sleep")))
    };
    assert!(wait_until(Duration::from_secs(10), || polling() && sleeper().is_some()), "front.py's poll peer never turned the knob");
    let sleep = sleeper().unwrap();
    signal(pid.cast_signed(), sig);
    let status = front.wait().unwrap();
    assert!(!status.success(), "{status:?}");
    sleep
}

#[test]
#[serial(host)]
fn a_benchmark_series_ended_or_killed_puts_the_idle_knobs_back() {
    require_root_and_cpuset();
    require_idle_states_in_use();
    let qos = Path::new("/sys/devices/system/cpu/cpu0/power/pm_qos_resume_latency_us");
    assert!(qos.exists(), "this test needs per-CPU resume latency limits, what front.py's poll peer turns ({} is missing)", qos.display());
    let knobs = idle_knobs();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bench/front.py");
    let record = Path::new("/run/gleaner-front/knobs.json");
    // SIGTERM: the series unwinds through its restore.
    let sleep = front_series_ended_by(libc::SIGTERM);
    signal(sleep, libc::SIGKILL);
    assert_idle_knobs_as(&knobs);
    assert!(!record.exists(), "a series that put its knobs back left {}", record.display());
    // SIGKILL: the knob stays turned, the record says what was found, and --restore puts it back.
    let sleep = front_series_ended_by(libc::SIGKILL);
    signal(sleep, libc::SIGKILL);
    let left = std::fs::read_to_string(record).unwrap_or_else(|e| panic!("no record after SIGKILL ({e})"));
    assert_ne!(idle_knobs(), knobs, "the poll peer's knob came back with no one to put it back: {left}");
    let out = Command::new("python3").arg(&script).arg("--restore").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("put back"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_idle_knobs_as(&knobs);
    assert!(!record.exists() && !record.parent().unwrap().exists(), "--restore left {}", record.display());
}

/// `front.py --control` runs gleaner a second time each round as the peer `control` and
/// reports gleaner/control per figure (the noise a peer's gap must exceed); a `--peers` list
/// naming `control` itself is refused. The peers here run the command bare (empty prefixes),
/// but each run still resets the haltpoll windows, so the test holds the host.
#[test]
#[serial(host)]
fn a_benchmark_series_with_a_control_measures_gleaner_against_itself() {
    require_root_and_cpuset();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bench/front.py");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("series.json");
    let out = Command::new("python3")
        .arg(&script)
        .args(["--control", "--rounds", "3", "--peers", "stock=,gleaner=", "--json"])
        .arg(&json)
        .args(["--", "sleep", "0.02"])
        .output()
        .expect("python3 runs scripts/bench/front.py (scripts/test.sh installs python3)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.lines().any(|l| l.trim_start().starts_with("control ")), "no control row: {stdout}");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(doc["runs"]["control"].as_array().map(Vec::len), Some(3), "{doc}");
    let wall = &doc["summary"]["control"]["wall_s"];
    let (r, lo, hi) = (wall["ratio"].as_f64().unwrap(), wall["ci"][0].as_f64().unwrap(), wall["ci"][1].as_f64().unwrap());
    // The same bare `sleep 0.02` both times: within a few ms of each other.
    assert!(lo <= r && r <= hi && (0.5..2.0).contains(&r), "{wall}");
    assert!(doc["summary"]["dominated_by"].as_object().is_some_and(|d| !d.contains_key("control")), "{doc}");
    let out = Command::new("python3").arg(&script).args(["--control", "--peers", "control=x,gleaner=", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--control adds the peer `control`"), "{out:?}");
}
