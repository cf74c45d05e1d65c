//! The managed workload: its cgroup, its threads, when it is gone, and the checks that keep
//! two agents off the same target.

use std::path::{Path, PathBuf};

use anyhow::Context;
use gleaner_os::cgroup::{Cgroups, CpusetCgroup};
use gleaner_os::cpuset::CpuSet;
use gleaner_os::procfs::Procfs;
use gleaner_os::BadInput;

use super::Target;

/// Why consolidation cannot run here, if it cannot.
pub(crate) fn consolidation_blocker(cgroups: &gleaner_os::Result<Cgroups>) -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not running as root (no permission to manage cpuset cgroups)".into());
    }
    match cgroups {
        Ok(_) => None,
        Err(e) => Some(format!("no usable cpuset cgroup ({e:#})")),
    }
}

/// The managed workload's cgroup and how to list its threads.
pub(crate) struct Managed {
    pub(crate) cgroup: Option<CpusetCgroup>,
    /// Root of the process tree when there is no cgroup (retention only).
    pub(crate) root_pid: Option<i32>,
}

impl Managed {
    /// The workload's processes (thread group ids): the cgroup's, or the root's tree.
    pub(crate) fn pids(&self, procfs: &Procfs) -> Vec<i32> {
        if let Some(p) = self.cgroup.as_ref().and_then(|cg| cg.procs().ok()) {
            return p;
        }
        self.root_pid.map(|pid| procfs.descendants(pid, true).unwrap_or_default()).unwrap_or_default()
    }

    /// The workload's threads and its processes, from one listing: the cgroup's files, or
    /// one walk of the root's tree.
    pub(crate) fn threads_and_processes(&self, procfs: &Procfs) -> (Vec<i32>, Vec<i32>) {
        if let Some(cg) = &self.cgroup {
            if let Ok(t) = cg.threads() {
                return (t, cg.procs().unwrap_or_else(|_| self.pids(procfs)));
            }
        }
        let Some(pid) = self.root_pid else {
            return (Vec::new(), Vec::new());
        };
        let pids = procfs.descendants(pid, true).unwrap_or_default();
        let mut tids = Vec::new();
        for &p in &pids {
            tids.extend(procfs.tasks(p).unwrap_or_default());
        }
        tids.sort_unstable();
        tids.dedup();
        (tids, pids)
    }
}

impl Managed {
    /// The target ended: a process no longer alive, a cgroup with no process left (a command
    /// of ours ends through its exit status instead).
    pub(crate) fn workload_gone(&self, target: &Target) -> bool {
        match target {
            Target::Pid(pid) => !gleaner_os::procfs::alive(*pid),
            Target::Cgroup(_) => self.cgroup.as_ref().is_some_and(|c| c.exists() && c.procs().map(|p| p.is_empty()).unwrap_or(true)),
            Target::Command(_) | Target::System => false,
        }
    }

    /// Gives the workload the vCPUs `active` (it had `before`). A refused write gives every
    /// managed vCPU back and says what was refused.
    pub(crate) fn apply(&self, active: &CpuSet, before: &CpuSet, all: &CpuSet) -> Result<(), String> {
        let Some(cg) = &self.cgroup else { return Ok(()) };
        match cg.set_cpus(active) {
            Ok(()) => {
                if active.len() < before.len() {
                    crate::seam::stop_at(crate::seam::AFTER_SHRINK);
                }
                Ok(())
            }
            Err(e) => {
                let what = format!("writing CPUs {active} to {} was refused ({:#})", cg.path().display(), anyhow::Error::from(e));
                let _ = cg.set_cpus(all);
                Err(what)
            }
        }
    }
}

/// The cpuset cgroup (absolute path) process `pid` is in: where it goes back to.
pub(crate) fn own_cpuset_cgroup(cgroups: &Cgroups, procfs: &Procfs, pid: i32) -> anyhow::Result<PathBuf> {
    let lines = procfs.cgroup_of(pid).with_context(|| format!("reading the cgroups of pid {pid}"))?;
    let v1 = cgroups.layout().version() == 1;
    let rel = lines
        .iter()
        .find(|(id, ctrl, _)| if v1 { ctrl.iter().any(|c| c == "cpuset") } else { *id == 0 && ctrl.is_empty() })
        .map(|(_, _, path)| path.clone())
        .with_context(|| format!("pid {pid} is in no cpuset cgroup"))?;
    Ok(cgroups.root().join(rel.trim_start_matches('/')))
}

/// Refuses `attach --pid` of a process another live agent already manages (it is in that
/// agent's `gleaner-agent-<pid>` cgroup): two agents would fight over its cpuset.
pub(crate) fn refuse_if_managed(cgroups: &Cgroups, procfs: &Procfs, pid: i32) -> anyhow::Result<()> {
    let Ok(current) = own_cpuset_cgroup(cgroups, procfs, pid) else {
        return Ok(());
    };
    let name = current.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let me = std::process::id().cast_signed();
    if let Some(agent) = name.strip_prefix("gleaner-agent-").and_then(|p| p.parse::<i32>().ok()).filter(|a| *a != me) {
        if gleaner_os::procfs::alive(agent) {
            return Err(BadInput::new(
                "--pid",
                pid,
                format!(
                    "a process no other gleaner agent manages (agent {agent} manages it, in {}; stop that agent first)",
                    current.display()
                ),
            )
            .into());
        }
    }
    Ok(())
}

/// Takes the exclusive lock that says "an agent manages this cgroup"; refuses when another
/// agent holds it.
pub(crate) fn lock_managed(path: &Path, what: &str) -> anyhow::Result<gleaner_os::private::DirLock> {
    match gleaner_os::private::try_lock_dir(path)? {
        Some(lock) => Ok(lock),
        None => Err(BadInput::new(
            what,
            path.display(),
            "a cgroup no other gleaner agent manages (another agent holds its lock; stop that agent first)",
        )
        .into()),
    }
}

/// Who asks to attach: the agent's own pid and the user ids it runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub pid: i32,
    pub real_uid: u32,
    pub effective_uid: u32,
}

impl Caller {
    /// This process.
    pub fn this_process() -> Self {
        Self {
            pid: std::process::id().cast_signed(),
            real_uid: nix::unistd::getuid().as_raw(),
            effective_uid: nix::unistd::geteuid().as_raw(),
        }
    }
}

/// Longest chain of parents followed from the agent up to init (a kernel's pid chain is far
/// shorter; the bound only stops a fixture's loop).
const MAX_ANCESTORS: usize = 4096;

/// Refuses `attach --pid pid` where moving the process and its descendants into a cpuset that
/// consolidation shrinks would hurt: init (pid 1: the whole system), the agent itself or one
/// of its ancestors (the agent would squeeze itself, and the shell that started it), and a
/// process the caller may not manage (the rule of kill(2): root, or a real or effective uid
/// equal to the process's real or saved uid). The error names the rule.
pub fn check_attach_pid(procfs: &Procfs, pid: i32, caller: &Caller) -> Result<(), BadInput> {
    let refuse = |allowed: String| BadInput::new("--pid", pid, allowed);
    if pid <= 0 || !procfs.alive(pid) {
        return Err(refuse("the pid of a running process".into()));
    }
    if pid == 1 {
        return Err(refuse("a process other than init (pid 1 is every process's ancestor: the whole system would be moved)".into()));
    }
    if pid == caller.pid {
        return Err(refuse("a process other than the agent itself".into()));
    }
    let mut at = caller.pid;
    for _ in 0..MAX_ANCESTORS {
        let Ok(stat) = procfs.process_stat(at) else { break };
        if stat.ppid <= 0 {
            break;
        }
        if stat.ppid == pid {
            return Err(refuse(format!(
                "a process that is not an ancestor of the agent (pid {pid} is, through pid {at}: the agent would be moved with it)"
            )));
        }
        at = stat.ppid;
    }
    if caller.effective_uid != 0 {
        let owner = procfs.uids(pid).map_err(|e| refuse(format!("a process whose owner can be read ({e})")))?;
        let mine = [caller.real_uid, caller.effective_uid];
        if !mine.contains(&owner.real) && !mine.contains(&owner.saved) {
            return Err(refuse(format!(
                "a process the caller may manage (root, or the same user: pid {pid} runs as uid {}, the caller is uid {})",
                owner.real, caller.effective_uid
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixture /proc: each (pid, ppid, uid) with the `stat` and `status` lines the check reads.
    fn procs(list: &[(i32, i32, u32)]) -> (tempfile::TempDir, Procfs) {
        let d = tempfile::tempdir().unwrap();
        for &(pid, ppid, uid) in list {
            let dir = d.path().join(pid.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            // Fields 3..=52 after comm; field 4 is the parent.
            let mut f: Vec<String> = (3..=52).map(|_| "0".to_string()).collect();
            f[0] = "S".into();
            f[1] = ppid.to_string();
            std::fs::write(dir.join("stat"), format!("{pid} (p{pid}) {}\n", f.join(" "))).unwrap();
            std::fs::write(dir.join("status"), format!("Name:\tp{pid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")).unwrap();
        }
        let p = Procfs::with_root(d.path());
        (d, p)
    }

    /// init <- shell (100, uid 1000) <- agent (200); a sibling workload (300, uid 1000), root's
    /// daemon (400), a setuid program started by uid 1000 (500: real 1000, saved 0).
    fn machine() -> (tempfile::TempDir, Procfs) {
        let (d, p) = procs(&[(1, 0, 0), (100, 1, 1000), (200, 100, 1000), (300, 100, 1000), (400, 1, 0)]);
        std::fs::create_dir_all(d.path().join("500")).unwrap();
        std::fs::copy(d.path().join("300/stat"), d.path().join("500/stat")).unwrap();
        std::fs::write(d.path().join("500/status"), "Uid:\t1000\t0\t0\t0\n").unwrap();
        (d, p)
    }

    const USER: Caller = Caller { pid: 200, real_uid: 1000, effective_uid: 1000 };
    const ROOT: Caller = Caller { pid: 200, real_uid: 0, effective_uid: 0 };

    fn refused(p: &Procfs, pid: i32, caller: &Caller) -> String {
        let e = check_attach_pid(p, pid, caller).unwrap_err();
        assert_eq!((e.what.as_str(), e.value.clone()), ("--pid", pid.to_string()));
        e.allowed
    }

    #[test]
    fn a_workload_beside_the_agent_is_accepted_for_its_owner_and_root() {
        let (_d, p) = machine();
        assert_eq!(check_attach_pid(&p, 300, &USER), Ok(()));
        assert_eq!(check_attach_pid(&p, 300, &ROOT), Ok(()));
        assert_eq!(check_attach_pid(&p, 400, &ROOT), Ok(()), "root manages anyone's");
        assert_eq!(check_attach_pid(&p, 500, &USER), Ok(()), "started by the caller (real uid), though setuid");
    }

    #[test]
    fn init_the_agent_and_its_ancestors_are_refused_even_for_root() {
        let (_d, p) = machine();
        assert!(refused(&p, 1, &ROOT).contains("other than init"));
        assert!(refused(&p, 200, &ROOT).contains("other than the agent itself"));
        let a = refused(&p, 100, &ROOT);
        assert!(a.contains("not an ancestor of the agent") && a.contains("through pid 200"), "{a}");
    }

    #[test]
    fn another_users_process_is_refused_to_a_user() {
        let (_d, p) = machine();
        let a = refused(&p, 400, &USER);
        assert!(a.contains("may manage") && a.contains("runs as uid 0, the caller is uid 1000"), "{a}");
    }

    #[test]
    fn a_process_that_is_not_there_is_refused() {
        let (_d, p) = machine();
        for pid in [0, -5, 999] {
            assert_eq!(refused(&p, pid, &ROOT), "the pid of a running process");
        }
    }

    #[test]
    fn a_loop_of_parents_ends() {
        let (_d, p) = procs(&[(1, 0, 0), (200, 201, 0), (201, 200, 0), (300, 1, 0)]);
        assert_eq!(check_attach_pid(&p, 300, &ROOT), Ok(()));
    }
}
