//! Host-side CPU time of each QEMU thread, from `/proc/<pid>/task/<tid>/{comm,schedstat}`.
//!
//! With `-name NAME,debug-threads=on` QEMU names its vCPU threads `CPU <n>/TCG` or
//! `CPU <n>/KVM`; every other thread (main loop, I/O, RCU) is "other". (This small reader
//! belongs in `gleaner-os::procfs` once that adapter lands; it keeps the `with_root` shape.)

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// CPU time of one thread at one instant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadCpu {
    pub tid: u32,
    pub name: String,
    /// Time spent running on a CPU, in nanoseconds (`schedstat` field 1; `stat` utime+stime
    /// as a fallback at clock-tick resolution).
    pub run_ns: u64,
}

impl ThreadCpu {
    /// The vCPU index when the thread is a vCPU thread (`CPU 1/TCG` -> 1).
    pub fn vcpu(&self) -> Option<u32> {
        let rest = self.name.strip_prefix("CPU ")?;
        rest.split('/').next()?.trim().parse().ok()
    }
}

/// Reads per-thread CPU time under a procfs root.
#[derive(Debug, Clone)]
pub struct ProcThreads {
    root: PathBuf,
}

impl ProcThreads {
    pub fn new() -> Self {
        Self::with_root("/proc")
    }

    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// All threads of `pid` (empty once the process is gone).
    pub fn snapshot(&self, pid: u32) -> Vec<ThreadCpu> {
        let task = self.root.join(pid.to_string()).join("task");
        let mut out: Vec<ThreadCpu> = fs::read_dir(&task)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let tid: u32 = e.file_name().to_str()?.parse().ok()?;
                read_thread(&e.path(), tid)
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

fn read_thread(dir: &Path, tid: u32) -> Option<ThreadCpu> {
    let name = fs::read_to_string(dir.join("comm")).ok()?.trim_end().to_string();
    let run_ns = fs::read_to_string(dir.join("schedstat"))
        .ok()
        .and_then(|s| parse_schedstat(&s))
        .or_else(|| fs::read_to_string(dir.join("stat")).ok().and_then(|s| parse_stat_cpu_ns(&s)))?;
    Some(ThreadCpu { tid, name, run_ns })
}

/// First field of `schedstat`: nanoseconds on CPU.
pub fn parse_schedstat(s: &str) -> Option<u64> {
    s.split_whitespace().next()?.parse().ok()
}

/// utime+stime of a `stat` line, converted from clock ticks to nanoseconds.
pub fn parse_stat_cpu_ns(s: &str) -> Option<u64> {
    // The comm field may contain spaces and parentheses: split after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ')' fields start at 3 (state); utime is field 14, stime 15 -> index 11, 12.
    let ut: u64 = f.get(11)?.parse().ok()?;
    let st: u64 = f.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|&h| h > 0).unwrap_or(100);
    Some((ut + st) * 1_000_000_000 / hz)
}

/// Per-thread CPU time used between two snapshots (threads matched by tid; a thread that
/// appeared in between counts from zero).
pub fn delta(before: &[ThreadCpu], after: &[ThreadCpu]) -> Vec<ThreadCpu> {
    after
        .iter()
        .map(|a| {
            let b = before.iter().find(|b| b.tid == a.tid).map_or(0, |b| b.run_ns);
            ThreadCpu { tid: a.tid, name: a.name.clone(), run_ns: a.run_ns.saturating_sub(b) }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(tasks: &[(u32, &str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (tid, comm, schedstat) in tasks {
            let t = d.path().join("42/task").join(tid.to_string());
            fs::create_dir_all(&t).unwrap();
            fs::write(t.join("comm"), format!("{comm}\n")).unwrap();
            fs::write(t.join("schedstat"), schedstat).unwrap();
        }
        d
    }

    #[test]
    fn snapshot_reads_vcpu_threads() {
        let d = fixture(&[(42, "qemu-system-x86", "100 5 3\n"), (44, "CPU 1/TCG", "900 0 1\n"), (43, "CPU 0/TCG", "700 1 1\n")]);
        let s = ProcThreads::with_root(d.path()).snapshot(42);
        assert_eq!(s.len(), 3);
        assert_eq!(s[1], ThreadCpu { tid: 43, name: "CPU 0/TCG".into(), run_ns: 700 });
        assert_eq!(s[1].vcpu(), Some(0));
        assert_eq!(s[2].vcpu(), Some(1));
        assert_eq!(s[0].vcpu(), None);
    }

    #[test]
    fn malformed_schedstat_falls_back_or_skips() {
        let d = fixture(&[(50, "CPU 0/KVM", "garbage\n")]);
        assert!(ProcThreads::with_root(d.path()).snapshot(42).is_empty());
        assert_eq!(parse_schedstat("x y"), None);
        let stat = "50 (CPU 0/KVM) S 1 1 1 0 -1 0 0 0 0 0 250 50 0 0 20 0 1 0 1 0 0";
        // SAFETY: sysconf has no memory-safety preconditions.
        let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap();
        assert_eq!(parse_stat_cpu_ns(stat), Some(300 * 1_000_000_000 / hz));
    }

    #[test]
    fn empty_or_missing_process() {
        let d = tempfile::tempdir().unwrap();
        assert!(ProcThreads::with_root(d.path()).snapshot(7).is_empty());
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_stat_cpu_ns(""), None);
    }

    #[test]
    fn delta_matches_threads() {
        let a = vec![ThreadCpu { tid: 1, name: "CPU 0/TCG".into(), run_ns: 10 }];
        let b = vec![
            ThreadCpu { tid: 1, name: "CPU 0/TCG".into(), run_ns: 25 },
            ThreadCpu { tid: 2, name: "CPU 1/TCG".into(), run_ns: 5 },
        ];
        let d = delta(&a, &b);
        assert_eq!(d[0].run_ns, 15);
        assert_eq!(d[1].run_ns, 5);
    }
}
