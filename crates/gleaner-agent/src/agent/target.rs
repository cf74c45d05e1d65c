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

    pub(crate) fn tids(&self, procfs: &Procfs) -> Vec<i32> {
        if let Some(cg) = &self.cgroup {
            if let Ok(t) = cg.threads() {
                return t;
            }
        }
        let Some(pid) = self.root_pid else {
            return Vec::new();
        };
        let pids = procfs.descendants(pid, true).unwrap_or_default();
        let mut tids = Vec::new();
        for p in pids {
            tids.extend(procfs.tasks(p).unwrap_or_default());
        }
        tids.sort_unstable();
        tids.dedup();
        tids
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
