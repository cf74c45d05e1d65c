//! Host-side scheduling counters of each QEMU thread: CPU time, time waiting for a CPU, and
//! context switches, read through `gleaner_os::procfs` (`/proc/<pid>/task/<tid>/{comm,
//! schedstat,status}`).
//!
//! With `-name NAME,debug-threads=on` QEMU names its vCPU threads `CPU <n>/TCG` or
//! `CPU <n>/KVM`; every other thread (main loop, I/O, RCU) is "other". A vCPU thread's
//! voluntary context switches are the times it blocked: a halted vCPU (HLT: the thread sleeps
//! until an interrupt) or, rarer, a wait for QEMU's big lock; its involuntary ones are host
//! preemptions; its wait time is how long it was runnable but not running (the host's
//! scheduling delay, e.g. behind a co-runner VM).

use gleaner_os::procfs::Procfs;
use serde::{Deserialize, Serialize};

/// Counters of one thread at one instant (or their difference over a step).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadCpu {
    pub tid: u32,
    pub name: String,
    /// Time spent running on a CPU, ns (`schedstat` field 1).
    pub run_ns: u64,
    /// Time runnable but waiting for a CPU, ns (`schedstat` field 2).
    #[serde(default)]
    pub wait_ns: u64,
    /// Times the thread blocked (`voluntary_ctxt_switches`).
    #[serde(default)]
    pub voluntary: u64,
    /// Times the thread was preempted (`nonvoluntary_ctxt_switches`).
    #[serde(default)]
    pub involuntary: u64,
}

impl ThreadCpu {
    /// The vCPU index when the thread is a vCPU thread (`CPU 1/TCG` -> 1).
    pub fn vcpu(&self) -> Option<u32> {
        let rest = self.name.strip_prefix("CPU ")?;
        rest.split('/').next()?.trim().parse().ok()
    }
}

/// Reads per-thread counters under a procfs root.
#[derive(Debug, Clone)]
pub struct ProcThreads {
    procfs: Procfs,
}

impl ProcThreads {
    pub fn new() -> Self {
        Self { procfs: Procfs::new() }
    }

    pub fn with_root(root: impl Into<std::path::PathBuf>) -> Self {
        Self { procfs: Procfs::with_root(root) }
    }

    /// All threads of `pid` (empty once the process is gone; a thread that vanishes while
    /// being read is left out).
    pub fn snapshot(&self, pid: u32) -> Vec<ThreadCpu> {
        let Ok(pid) = i32::try_from(pid) else { return Vec::new() };
        let mut out: Vec<ThreadCpu> = self
            .procfs
            .tasks(pid)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|tid| {
                let name = self.procfs.task_comm(pid, tid).ok()?;
                let ss = self.procfs.task_schedstat(pid, tid).ok()?;
                let st = self.procfs.task_status(pid, tid).unwrap_or_default();
                Some(ThreadCpu {
                    tid: u32::try_from(tid).ok()?,
                    name,
                    run_ns: ss.run_ns,
                    wait_ns: ss.wait_ns,
                    voluntary: st.voluntary_ctxt_switches,
                    involuntary: st.nonvoluntary_ctxt_switches,
                })
            })
            .collect();
        out.sort_by_key(|t| t.tid);
        out
    }
}

impl Default for ProcThreads {
    fn default() -> Self {
        Self::new()
    }
}

/// Per-thread counters between two snapshots (threads matched by tid; a thread that
/// appeared in between counts from zero).
pub fn delta(before: &[ThreadCpu], after: &[ThreadCpu]) -> Vec<ThreadCpu> {
    after
        .iter()
        .map(|a| {
            let z = ThreadCpu::default();
            let b = before.iter().find(|b| b.tid == a.tid).unwrap_or(&z);
            ThreadCpu {
                tid: a.tid,
                name: a.name.clone(),
                run_ns: a.run_ns.saturating_sub(b.run_ns),
                wait_ns: a.wait_ns.saturating_sub(b.wait_ns),
                voluntary: a.voluntary.saturating_sub(b.voluntary),
                involuntary: a.involuntary.saturating_sub(b.involuntary),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// (tid, comm, schedstat, voluntary and involuntary switches in `status`).
    type Task<'a> = (u32, &'a str, &'a str, Option<(u64, u64)>);

    fn fixture(tasks: &[Task<'_>]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (tid, comm, schedstat, switches) in tasks {
            let t = d.path().join("42/task").join(tid.to_string());
            fs::create_dir_all(&t).unwrap();
            fs::write(t.join("comm"), format!("{comm}\n")).unwrap();
            fs::write(t.join("schedstat"), schedstat).unwrap();
            if let Some((v, n)) = switches {
                fs::write(
                    t.join("status"),
                    format!("Name:\t{comm}\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\t{v}\nnonvoluntary_ctxt_switches:\t{n}\n"),
                )
                .unwrap();
            }
        }
        d
    }

    #[test]
    fn snapshot_reads_vcpu_threads_and_their_switches() {
        let d = fixture(&[
            (42, "qemu-system-x86", "100 5 3\n", Some((1, 2))),
            (44, "CPU 1/TCG", "900 0 1\n", Some((7, 8))),
            (43, "CPU 0/TCG", "700 11 1\n", Some((30, 4))),
        ]);
        let s = ProcThreads::with_root(d.path()).snapshot(42);
        assert_eq!(s.len(), 3);
        assert_eq!(s[1], ThreadCpu { tid: 43, name: "CPU 0/TCG".into(), run_ns: 700, wait_ns: 11, voluntary: 30, involuntary: 4 });
        assert_eq!(s[1].vcpu(), Some(0));
        assert_eq!(s[2].vcpu(), Some(1));
        assert_eq!(s[0].vcpu(), None);
    }

    #[test]
    fn malformed_schedstat_skips_the_thread_and_missing_status_counts_zero() {
        let d = fixture(&[(50, "CPU 0/KVM", "garbage\n", None), (51, "CPU 1/KVM", "5 6 7\n", None)]);
        let s = ProcThreads::with_root(d.path()).snapshot(42);
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].tid, s[0].run_ns, s[0].voluntary), (51, 5, 0));
    }

    #[test]
    fn empty_or_missing_process() {
        let d = tempfile::tempdir().unwrap();
        assert!(ProcThreads::with_root(d.path()).snapshot(7).is_empty());
    }

    #[test]
    fn delta_matches_threads() {
        let t = |tid, run_ns, voluntary| ThreadCpu { tid, name: format!("CPU {tid}/TCG"), run_ns, voluntary, ..Default::default() };
        let d = delta(&[t(1, 10, 3)], &[t(1, 25, 10), t(2, 5, 1)]);
        assert_eq!((d[0].run_ns, d[0].voluntary), (15, 7));
        assert_eq!((d[1].run_ns, d[1].voluntary), (5, 1));
    }
}
