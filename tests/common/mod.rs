//! Helpers shared by the binary-level tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// The `gleaner` binary under test.
pub fn gleaner() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gleaner"))
}

/// Polls `cond` every 10 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for a child with a deadline; kills it (by its PID) if the deadline passes.
pub fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

pub fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) with a pid we started and a valid signal number.
    unsafe {
        libc::kill(pid, sig);
    }
}

pub fn alive(pid: i32) -> bool {
    // A zombie still answers kill(0); look at the state instead.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s.rsplit_once(')').map(|(_, rest)| !rest.trim_start().starts_with('Z')).unwrap_or(false),
        Err(_) => false,
    }
}

/// Direct children of `pid`.
pub fn children_of(pid: u32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let text = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            out.extend(text.split_whitespace().filter_map(|s| s.parse::<i32>().ok()));
        }
    }
    out
}

pub fn no_agent_threads_of(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}/task")).exists() || !alive(pid.cast_signed())
}

/// The cpuset hierarchy root and whether it is cgroup v1.
pub fn cpuset_root() -> Option<(PathBuf, bool)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    for line in info.lines() {
        let (pre, post) = line.split_once(" - ")?;
        let mount = PathBuf::from(pre.split_whitespace().nth(4)?);
        let mut post = post.split_whitespace();
        let fstype = post.next()?;
        let opts = post.nth(1).unwrap_or("");
        if fstype == "cgroup" && opts.split(',').any(|o| o == "cpuset") {
            return Some((mount, true));
        }
        if fstype == "cgroup2" {
            let ctrl = std::fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default();
            if ctrl.split_whitespace().any(|c| c == "cpuset") {
                return Some((mount, false));
            }
        }
    }
    None
}

/// A TCP port free on loopback now: bound to port 0, read back, released (the kernel hands
/// out ports in turn, so it is not handed to anyone else at once; a port derived from the pid
/// could collide with a listener of any other process).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
    l.local_addr().expect("its address").port()
}

/// Fails (never skips) when the test cannot run for real.
pub fn require_root_and_cpuset() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root (CI runs as root)");
    assert!(cpuset_root().is_some(), "this test needs a cpuset cgroup hierarchy (cgroup v1 cpuset or cgroup2 with cpuset)");
}

/// Polls `gleaner status --json --run-dir DIR` until `cond` holds on the reports or `timeout`
/// passes; returns whether it held and the last reports.
pub fn wait_status(run_dir: &Path, timeout: Duration, cond: impl Fn(&serde_json::Value) -> bool) -> (bool, serde_json::Value) {
    let mut reports = serde_json::Value::Null;
    let held = wait_until(timeout, || {
        let out = gleaner().args(["status", "--json", "--run-dir"]).arg(run_dir).output().unwrap();
        reports = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        cond(&reports)
    });
    (held, reports)
}

/// Asserts that an agent left nothing in its run dir but the per-boot calibration records
/// (`calibration*.json`, kept on purpose; a temp file of an interrupted write is a leftover)
/// and the empty `idle-knobs` directory agents lock to take turns at the idle knobs.
pub fn assert_run_dir_clean(run_dir: &Path) {
    let all: Vec<PathBuf> = std::fs::read_dir(run_dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    let left: Vec<_> = all
        .into_iter()
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            let lock_dir = name == "idle-knobs" && p.is_dir() && std::fs::read_dir(p).map(|mut d| d.next().is_none()).unwrap_or(false);
            let record = name.starts_with("calibration") && name.ends_with(".json");
            !(lock_dir || record)
        })
        .collect();
    assert!(left.is_empty(), "leftover state files or sockets: {left:?}");
}

/// Every directory named `gleaner*` in the cgroup hierarchies (depth <= 3).
pub fn gleaner_groups() -> Vec<PathBuf> {
    fn walk(dir: &Path, depth: u32, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if !e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                continue;
            }
            if e.file_name().to_string_lossy().starts_with("gleaner") {
                out.push(p.clone());
            }
            if depth > 1 {
                walk(&p, depth - 1, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(Path::new("/sys/fs/cgroup"), 3, &mut out);
    out
}

/// Removes a cgroup directory we created when dropped (moving stragglers to the parent).
pub struct RemoveDir(pub PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        if let (Ok(procs), Some(parent)) = (std::fs::read_to_string(self.0.join("cgroup.procs")), self.0.parent()) {
            for p in procs.lines() {
                let _ = std::fs::write(parent.join("cgroup.procs"), p);
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The cpuset cgroup (path relative to its hierarchy) of `pid`.
pub fn cpuset_cgroup_of(pid: u32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let v1 = text.lines().find(|l| l.split(':').nth(1).is_some_and(|c| c.split(',').any(|x| x == "cpuset")));
    let line = v1.or_else(|| text.lines().find(|l| l.starts_with("0::"))).unwrap_or("");
    line.splitn(3, ':').nth(2).unwrap_or("").to_string()
}

pub fn agent_groups() -> Vec<PathBuf> {
    gleaner_groups().into_iter().filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("gleaner-agent-"))).collect()
}

/// Agent cgroups whose agent is gone: `gleaner-agent-<pid>` of a dead pid. A live agent's
/// group is in use, not left over (other checkouts on a shared machine run agents too).
pub fn leftover_agent_groups() -> Vec<PathBuf> {
    agent_groups()
        .into_iter()
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            name.strip_prefix("gleaner-agent-").is_some_and(|pid| !pid.parse().is_ok_and(alive))
        })
        .collect()
}

/// Asserts an agent left no cgroup of a dead agent and nothing in its run dir.
pub fn assert_no_leftovers(run_dir: &Path) {
    assert!(leftover_agent_groups().is_empty(), "leftover agent cgroups: {:?}", leftover_agent_groups());
    assert_run_dir_clean(run_dir);
}

/// The CPUs `pid` may run on (`Cpus_allowed_list` of /proc/PID/status).
pub fn cpus_allowed(pid: u32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap_or("").trim().to_string()
}

/// Online CPUs in kernel list form (e.g. `0-1`) and how many there are.
pub fn online_cpus() -> (String, usize) {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default().trim().to_string();
    let n = text
        .split(',')
        .filter(|r| !r.is_empty())
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap_or(0) + 1 - a.parse::<usize>().unwrap_or(0),
            None => 1,
        })
        .sum();
    (text, n)
}

/// Whether `pid` is stopped (state `T`, e.g. by SIGSTOP).
pub fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('T')))
        .unwrap_or(false)
}

/// A process this test started, killed (by its PID) and reaped when dropped.
pub struct Started(pub Child);

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `gleaner run --no-consolidation --timeout-us 50 --config CFG --run-dir RUN_DIR -- true`: the
/// configuration accepted or refused, with a run dir of the test's own (/run/gleaner is left
/// alone).
pub fn run_true_with_config(cfg: &Path, run_dir: &Path) -> std::process::Output {
    gleaner()
        .args(["run", "--no-consolidation", "--timeout-us", "50", "--config"])
        .arg(cfg)
        .arg("--run-dir")
        .arg(run_dir)
        .args(["--", "true"])
        .output()
        .unwrap()
}

/// The kernel's idle knobs as they are now: the haltpoll module's parameters, the cpuidle
/// governor, every CPU's resume latency limit and idle states' `disable` flags. Take them
/// before a test and compare after (`assert_idle_knobs_as`): an agent must put every one back.
pub fn idle_knobs() -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    let mut put = |path: PathBuf| {
        if let Ok(v) = std::fs::read_to_string(&path) {
            out.insert(path.display().to_string(), v.trim().to_string());
        }
    };
    if let Ok(d) = std::fs::read_dir("/sys/module/haltpoll/parameters") {
        for e in d.flatten() {
            put(e.path());
        }
    }
    put(PathBuf::from("/sys/devices/system/cpu/cpuidle/current_governor"));
    let cpu = Path::new("/sys/devices/system/cpu");
    for e in std::fs::read_dir(cpu).map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.strip_prefix("cpu").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        put(e.path().join("power/pm_qos_resume_latency_us"));
        for s in std::fs::read_dir(e.path().join("cpuidle")).map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default() {
            put(s.path().join("disable"));
        }
    }
    out
}

/// Fails (never skips) when a CPU cannot use the kernel's idle states: a resume latency limit
/// of "n/a" (0 us: every idle period polls) or a disabled idle state. The kernel boots with
/// neither; a program that set one and was killed before putting it back (a benchmark's poll
/// peer) leaves a machine where every idle measurement polls, and the tests that measure the
/// agent's polling or watch it turn those knobs would blame the agent.
pub fn require_idle_states_in_use() {
    let set: Vec<String> = idle_knobs()
        .into_iter()
        .filter(|(k, v)| (k.ends_with("pm_qos_resume_latency_us") && v == "n/a") || (k.ends_with("/disable") && v != "0"))
        .map(|(k, v)| format!("{k} = {v}"))
        .collect();
    assert!(
        set.is_empty(),
        "this test needs the kernel's idle states in use, as the kernel boots (resume latency 0 = no limit, no state disabled), \
         and something left {set:?}: write 0 there and rerun"
    );
}

/// Asserts that every idle knob is as `before`, naming the ones that are not.
pub fn assert_idle_knobs_as(before: &std::collections::BTreeMap<String, String>) {
    let now = idle_knobs();
    let changed: Vec<String> = before
        .iter()
        .filter(|(k, v)| now.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k}: {v} -> {}", now.get(k).map_or("(gone)", String::as_str)))
        .collect();
    assert!(changed.is_empty(), "idle knobs not put back: {changed:?}");
}
