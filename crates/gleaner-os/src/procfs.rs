//! Readers for `/proc`: CPU times, threads, per-thread scheduler statistics, process tree,
//! cgroup membership, mounts, CPU flags.
//!
//! [`Procfs::with_root`] reads a fixture tree with the same layout. Files under a pid that
//! disappear while being read (the process or thread exited) give [`OsError::Vanished`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{OsError, Result};
use crate::util::{self, parse_err, parse_u64, Reread};

mod mounts;
pub use mounts::{parse_mountinfo, MountInfo};

/// Kernel tick rate assumed for fixtures (`USER_HZ` is 100 on every Linux architecture
/// gleaner runs on).
pub const DEFAULT_CLK_TCK: u64 = 100;

/// Access to a procfs tree.
#[derive(Debug, Clone)]
pub struct Procfs {
    root: PathBuf,
    clk_tck: u64,
}

/// CPU time counters of one CPU (or all) from `/proc/stat`, in clock ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CpuTimes {
    pub user: u64,
    pub nice: u64,
    pub system: u64,
    pub idle: u64,
    pub iowait: u64,
    pub irq: u64,
    pub softirq: u64,
    /// Time the hypervisor ran something else while this vCPU wanted to run.
    pub steal: u64,
    /// Time running a guest (already included in `user`).
    pub guest: u64,
    /// Time running a niced guest (already included in `nice`).
    pub guest_nice: u64,
}

impl CpuTimes {
    /// Ticks spent doing work: user + nice + system + irq + softirq (guest time is part of
    /// user/nice already; steal is neither busy nor idle). The sums saturate at `u64::MAX`:
    /// the counters come from the kernel (and some hypervisors have reported garbage steal).
    pub fn busy_ticks(&self) -> u64 {
        [self.nice, self.system, self.irq, self.softirq].into_iter().fold(self.user, u64::saturating_add)
    }
    /// Ticks idle: idle + iowait.
    pub fn idle_ticks(&self) -> u64 {
        self.idle.saturating_add(self.iowait)
    }
    /// All ticks: busy + idle + steal.
    pub fn total_ticks(&self) -> u64 {
        self.busy_ticks().saturating_add(self.idle_ticks()).saturating_add(self.steal)
    }
    /// Busy time in ns at `clk_tck` ticks per second.
    pub fn busy_ns(&self, clk_tck: u64) -> u64 {
        ticks_to_ns(self.busy_ticks(), clk_tck)
    }
    /// Idle time in ns.
    pub fn idle_ns(&self, clk_tck: u64) -> u64 {
        ticks_to_ns(self.idle_ticks(), clk_tck)
    }
    /// Steal time in ns.
    pub fn steal_ns(&self, clk_tck: u64) -> u64 {
        ticks_to_ns(self.steal, clk_tck)
    }
    /// Per-field difference `self - earlier`, saturating at 0 (counters can go back
    /// slightly on CPU hotplug).
    pub fn delta(&self, earlier: &CpuTimes) -> CpuTimes {
        CpuTimes {
            user: self.user.saturating_sub(earlier.user),
            nice: self.nice.saturating_sub(earlier.nice),
            system: self.system.saturating_sub(earlier.system),
            idle: self.idle.saturating_sub(earlier.idle),
            iowait: self.iowait.saturating_sub(earlier.iowait),
            irq: self.irq.saturating_sub(earlier.irq),
            softirq: self.softirq.saturating_sub(earlier.softirq),
            steal: self.steal.saturating_sub(earlier.steal),
            guest: self.guest.saturating_sub(earlier.guest),
            guest_nice: self.guest_nice.saturating_sub(earlier.guest_nice),
        }
    }
}

/// Converts clock ticks to nanoseconds (`clk_tck` 0 is treated as 100).
pub fn ticks_to_ns(ticks: u64, clk_tck: u64) -> u64 {
    let hz = if clk_tck == 0 { DEFAULT_CLK_TCK } else { clk_tck };
    let ns = u128::from(ticks) * 1_000_000_000 / u128::from(hz);
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// Converts a duration to whole clock ticks, rounded down (`clk_tck` 0 is treated as 100):
/// the inverse of [`ticks_to_ns`], to compare a time with `/proc` tick fields (a process's
/// `starttime`).
pub fn duration_to_ticks(d: std::time::Duration, clk_tck: u64) -> u64 {
    let hz = if clk_tck == 0 { DEFAULT_CLK_TCK } else { clk_tck };
    u64::try_from(d.as_nanos() * u128::from(hz) / 1_000_000_000).unwrap_or(u64::MAX)
}

/// `/proc/stat`: per-CPU and total CPU times, context switches since boot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProcStat {
    pub cpus: BTreeMap<u32, CpuTimes>,
    pub total: CpuTimes,
    /// Context switches since boot, all CPUs.
    pub ctxt: u64,
    /// Ticks per second of the CPU time counters.
    pub clk_tck: u64,
    /// Runnable threads now (`procs_running`; 0 when absent).
    pub procs_running: u64,
    /// Threads blocked on I/O now (`procs_blocked`; 0 when absent).
    pub procs_blocked: u64,
}

/// `/proc/<pid>/task/<tid>/schedstat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SchedStat {
    /// Time on a CPU, ns.
    pub run_ns: u64,
    /// Time runnable but waiting for a CPU, ns.
    pub wait_ns: u64,
    /// Number of times the thread was put on a CPU.
    pub timeslices: u64,
}

/// The fields of `/proc/<pid>/task/<tid>/status` gleaner uses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TaskStatus {
    pub name: String,
    /// `R`, `S`, `D`, `Z`, ...
    pub state: char,
    pub voluntary_ctxt_switches: u64,
    pub nonvoluntary_ctxt_switches: u64,
}

/// A process's user ids (`Uid:` of `/proc/<pid>/status`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Uids {
    pub real: u32,
    pub effective: u32,
    pub saved: u32,
    pub fs: u32,
}

/// The fields of `/proc/<pid>/task/<tid>/stat` gleaner uses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TaskStat {
    pub comm: String,
    pub state: char,
    /// Parent pid (field 4).
    pub ppid: i32,
    pub utime_ticks: u64,
    pub stime_ticks: u64,
    /// User and system time of the children this process waited for, with theirs (fields 16
    /// and 17; in a process's `stat`, 0 in a thread's).
    pub cutime_ticks: u64,
    pub cstime_ticks: u64,
    /// CPU the thread last ran on (field 39).
    pub processor: u32,
    /// Scheduling policy number (field 41: 0 OTHER, 1 FIFO, 2 RR, 3 BATCH, 5 IDLE, 6 DEADLINE).
    pub policy: u32,
    /// Nice value (field 19).
    pub nice: i32,
    /// Threads in the process (field 20).
    pub num_threads: u32,
    /// Start time after boot, ticks (field 22): with the pid it identifies a process even
    /// after pid reuse.
    pub starttime_ticks: u64,
}

/// One line of `/proc/<pid>/cgroup`: hierarchy id, controllers (empty for cgroup v2 `0::`),
/// path within the hierarchy.
pub type CgroupLine = (u32, Vec<String>, String);

/// An open `/proc/<pid>/task/<tid>/status`: each [`StatusFile::read`] re-reads it with one
/// `pread`. Under TCG an open + read + close of a procfs file took 240-350 us of guest time
/// and a `pread` of a kept one 4-52 us, so a sampler keeps its files open.
#[derive(Debug)]
pub struct StatusFile {
    file: Reread,
    buf: Vec<u8>,
}

impl StatusFile {
    /// The thread's status now (an exited thread's file fails to read: drop it).
    pub fn read(&mut self) -> Result<TaskStatus> {
        let text = self.file.read_text(&mut self.buf)?;
        parse_status(&self.file.path, text)
    }
}

/// An open `/proc/stat`: each [`StatFile::read`] re-reads it with one `pread`.
#[derive(Debug)]
pub struct StatFile {
    file: Reread,
    buf: Vec<u8>,
    clk_tck: u64,
}

impl StatFile {
    /// The CPU times now.
    pub fn read(&mut self) -> Result<ProcStat> {
        let text = self.file.read_text(&mut self.buf)?;
        parse_stat(&self.file.path, text, self.clk_tck)
    }
}

/// An open `/proc/<pid>/task/<tid>/io`: each [`IoFile::read`] re-reads it with one `pread`
/// (the guest agent's progress by bytes moved, read every period like [`StatusFile`]).
#[derive(Debug)]
pub struct IoFile(Reread);

impl IoFile {
    /// The thread's I/O counters now (an exited thread's file fails to read: drop it).
    pub fn read(&mut self) -> Result<TaskIo> {
        // Seven lines of at most ~40 bytes: 512 is far more than any io file holds.
        let mut buf = [0u8; 512];
        parse_task_io(&self.0.path, self.0.read_short_str(&mut buf, "io file")?)
    }
}

/// An open `/proc/loadavg`: each [`Loadavg::runnable`] re-reads it with one `pread`.
#[derive(Debug)]
pub struct Loadavg(Reread);

impl Loadavg {
    /// Tasks runnable right now on all CPUs (running or waiting in a run queue), the
    /// numerator of the fourth field ("2/78"); it counts the calling thread.
    pub fn runnable(&mut self) -> Result<u32> {
        let mut buf = [0u8; 128];
        let text = self.0.read_short(&mut buf, "loadavg")?;
        parse_loadavg_runnable(text)
            .ok_or_else(|| parse_err(&self.0.path, 1, format!("no 'R/T' fourth field in '{}'", String::from_utf8_lossy(text).trim())))
    }
}

/// An open `/proc/<pid>/task/<tid>/schedstat`: each [`SchedstatFile::read`] re-reads it with
/// one `pread`, so a thread can watch its own run-queue delay around a sleep.
#[derive(Debug)]
pub struct SchedstatFile(Reread);

impl SchedstatFile {
    /// The thread's run time, run-queue delay and timeslices now.
    pub fn read(&mut self) -> Result<SchedStat> {
        let mut buf = [0u8; 96];
        parse_schedstat(&self.0.path, self.0.read_short_str(&mut buf, "schedstat line")?)
    }
}

/// The runnable count of a `/proc/loadavg` text: the digits before '/' in the fourth field.
pub fn parse_loadavg_runnable(text: &[u8]) -> Option<u32> {
    let field = text.split(|b| b.is_ascii_whitespace()).filter(|f| !f.is_empty()).nth(3)?;
    let slash = field.iter().position(|&b| b == b'/')?;
    std::str::from_utf8(&field[..slash]).ok()?.parse().ok()
}

impl Default for Procfs {
    fn default() -> Self {
        Self::new()
    }
}

impl Procfs {
    /// The real `/proc`, tick rate from `sysconf(_SC_CLK_TCK)`.
    pub fn new() -> Self {
        // SAFETY: sysconf has no memory-safety preconditions; it returns -1 on error.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let clk_tck = u64::try_from(hz).ok().filter(|&h| h > 0).unwrap_or(DEFAULT_CLK_TCK);
        Procfs { root: PathBuf::from("/proc"), clk_tck }
    }

    /// A procfs tree at `root` (a fixture), tick rate 100.
    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        Procfs { root: root.into(), clk_tck: DEFAULT_CLK_TCK }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Ticks per second of `/proc/stat` and `/proc/<pid>/stat` times.
    pub fn clk_tck(&self) -> u64 {
        self.clk_tck
    }

    fn task_dir(&self, pid: i32, tid: i32) -> PathBuf {
        self.root.join(pid.to_string()).join("task").join(tid.to_string())
    }

    /// Opens `/proc/loadavg` for repeated cheap reads of the number of runnable tasks.
    pub fn open_loadavg(&self) -> Result<Loadavg> {
        Reread::open(self.root.join("loadavg")).map(Loadavg)
    }

    /// Opens `/proc/<pid>/task/<tid>/schedstat` for repeated cheap reads.
    pub fn open_task_schedstat(&self, pid: i32, tid: i32) -> Result<SchedstatFile> {
        Reread::open(self.task_dir(pid, tid).join("schedstat")).map(SchedstatFile)
    }

    /// Opens `/proc/<pid>/task/<tid>/status` for repeated cheap reads.
    pub fn open_task_status(&self, pid: i32, tid: i32) -> Result<StatusFile> {
        Reread::open(self.task_dir(pid, tid).join("status")).map(|file| StatusFile { file, buf: Vec::new() })
    }

    /// Opens `/proc/<pid>/task/<tid>/io` for repeated cheap reads.
    pub fn open_task_io(&self, pid: i32, tid: i32) -> Result<IoFile> {
        Reread::open(self.task_dir(pid, tid).join("io")).map(IoFile)
    }

    /// Opens `/proc/stat` for repeated cheap reads.
    pub fn open_stat(&self) -> Result<StatFile> {
        Reread::open(self.root.join("stat")).map(|file| StatFile { file, buf: Vec::new(), clk_tck: self.clk_tck })
    }

    /// `/proc/stat`.
    pub fn stat(&self) -> Result<ProcStat> {
        let path = self.root.join("stat");
        let text = util::read(&path)?;
        parse_stat(&path, &text, self.clk_tck)
    }

    /// Thread ids of process `pid` (`/proc/<pid>/task`), increasing.
    pub fn tasks(&self, pid: i32) -> Result<Vec<i32>> {
        let dir = self.root.join(pid.to_string()).join("task");
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if crate::error::is_gone(&e) => return Err(OsError::Vanished { pid, tid: None }),
            Err(source) => return Err(OsError::Dir { op: "list", path: dir, source }),
        };
        let mut tids: Vec<i32> = rd.filter_map(|e| id_of(e.ok()?.file_name().to_str()?)).collect();
        tids.sort_unstable();
        Ok(tids)
    }

    /// `/proc/<pid>/task/<tid>/schedstat`.
    pub fn task_schedstat(&self, pid: i32, tid: i32) -> Result<SchedStat> {
        let path = self.task_dir(pid, tid).join("schedstat");
        let text = util::read_proc(&path, pid, Some(tid))?;
        parse_schedstat(&path, &text)
    }

    /// `/proc/<pid>/task/<tid>/status`.
    pub fn task_status(&self, pid: i32, tid: i32) -> Result<TaskStatus> {
        let path = self.task_dir(pid, tid).join("status");
        let text = util::read_proc(&path, pid, Some(tid))?;
        parse_status(&path, &text)
    }

    /// `/proc/<pid>/task/<tid>/stat`.
    pub fn task_stat(&self, pid: i32, tid: i32) -> Result<TaskStat> {
        let path = self.task_dir(pid, tid).join("stat");
        let text = util::read_proc(&path, pid, Some(tid))?;
        parse_task_stat(&path, &text)
    }

    /// The user ids of process `pid` (the `Uid:` line of `/proc/<pid>/status`).
    pub fn uids(&self, pid: i32) -> Result<Uids> {
        let path = self.root.join(pid.to_string()).join("status");
        let text = util::read_proc(&path, pid, None)?;
        parse_uids(&path, &text)
    }

    /// `/proc/<pid>/stat` (the process as a whole; times summed over threads).
    pub fn process_stat(&self, pid: i32) -> Result<TaskStat> {
        let path = self.root.join(pid.to_string()).join("stat");
        let text = util::read_proc(&path, pid, None)?;
        parse_task_stat(&path, &text)
    }

    /// All process ids, increasing.
    pub fn pids(&self) -> Result<Vec<i32>> {
        let names = util::list_dir(&self.root)?;
        let mut pids: Vec<i32> = names.iter().filter_map(|n| id_of(n)).collect();
        pids.sort_unstable();
        Ok(pids)
    }

    /// Direct children of `pid`, increasing: the union of `/proc/<pid>/task/*/children`
    /// when the kernel has `CONFIG_PROC_CHILDREN`, otherwise found by scanning the parent
    /// pid of every process.
    pub fn children(&self, pid: i32) -> Result<Vec<i32>> {
        let tids = self.tasks(pid)?;
        let mut kids = BTreeSet::new();
        let mut have_children_file = false;
        for tid in tids {
            let path = self.task_dir(pid, tid).join("children");
            match std::fs::read_to_string(&path) {
                Ok(text) => {
                    have_children_file = true;
                    for (i, w) in text.split_whitespace().enumerate() {
                        let c = w.parse::<i32>().map_err(|_| parse_err(&path, 1, format!("item {i}: '{w}' is not a pid")))?;
                        kids.insert(c);
                    }
                }
                Err(e) if crate::error::is_gone(&e) => continue,
                Err(source) => return Err(OsError::Read { path, source }),
            }
        }
        if !have_children_file {
            for p in self.pids()? {
                match self.process_stat(p) {
                    Ok(st) if st.ppid == pid => {
                        kids.insert(p);
                    }
                    Ok(_) | Err(OsError::Vanished { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(kids.into_iter().collect())
    }

    /// All descendants of `pid` (children, their children, ...), increasing; with
    /// `include_self`, `pid` too. Processes that exit during the walk are skipped; if `pid`
    /// itself is gone the result is [`OsError::Vanished`].
    pub fn descendants(&self, pid: i32, include_self: bool) -> Result<Vec<i32>> {
        let mut seen = BTreeSet::new();
        let mut queue = VecDeque::from([pid]);
        // Without CONFIG_PROC_CHILDREN, build the parent map once instead of rescanning.
        let ppid_map = if self.has_children_files(pid)? { None } else { Some(self.parent_map()?) };
        while let Some(p) = queue.pop_front() {
            let kids = match &ppid_map {
                Some(map) => map.get(&p).cloned().unwrap_or_default(),
                None => match self.children(p) {
                    Ok(k) => k,
                    Err(OsError::Vanished { .. }) if p != pid => continue,
                    Err(e) => return Err(e),
                },
            };
            for k in kids {
                if k != pid && seen.insert(k) {
                    queue.push_back(k);
                }
            }
        }
        if include_self {
            seen.insert(pid);
        }
        Ok(seen.into_iter().collect())
    }

    /// Every `(pid, tid)` of `pid` and its descendants, skipping processes that exit during
    /// the walk.
    pub fn tree_threads(&self, pid: i32) -> Result<Vec<(i32, i32)>> {
        let mut out = Vec::new();
        for p in self.descendants(pid, true)? {
            match self.tasks(p) {
                Ok(tids) => out.extend(tids.into_iter().map(|t| (p, t))),
                Err(OsError::Vanished { .. }) if p != pid => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    fn has_children_files(&self, pid: i32) -> Result<bool> {
        let tids = self.tasks(pid)?;
        Ok(tids.first().is_some_and(|&t| self.task_dir(pid, t).join("children").exists()))
    }

    fn parent_map(&self) -> Result<BTreeMap<i32, Vec<i32>>> {
        let mut map: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
        for p in self.pids()? {
            match self.process_stat(p) {
                Ok(st) => map.entry(st.ppid).or_default().push(p),
                Err(OsError::Vanished { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(map)
    }

    /// `/proc/<pid>/comm` without the newline.
    pub fn comm(&self, pid: i32) -> Result<String> {
        let path = self.root.join(pid.to_string()).join("comm");
        Ok(util::read_proc(&path, pid, None)?.trim_end_matches('\n').to_string())
    }

    /// `/proc/<pid>/task/<tid>/comm` without the newline (thread name).
    pub fn task_comm(&self, pid: i32, tid: i32) -> Result<String> {
        let path = self.task_dir(pid, tid).join("comm");
        Ok(util::read_proc(&path, pid, Some(tid))?.trim_end_matches('\n').to_string())
    }

    /// `/proc/<pid>/cmdline` split at NUL (empty for kernel threads and zombies).
    pub fn cmdline(&self, pid: i32) -> Result<Vec<String>> {
        let path = self.root.join(pid.to_string()).join("cmdline");
        let text = util::read_proc(&path, pid, None)?;
        Ok(parse_cmdline(&text))
    }

    /// `/proc/<pid>/cgroup`: `(hierarchy id, controllers, path)` per line.
    pub fn cgroup_of(&self, pid: i32) -> Result<Vec<CgroupLine>> {
        let path = self.root.join(pid.to_string()).join("cgroup");
        let text = util::read_proc(&path, pid, None)?;
        parse_cgroup(&path, &text)
    }

    /// `/proc/<pid>/task/<tid>/io`: the thread's I/O counters (read/write system calls and
    /// bytes), used by the host agent as I/O evidence of a vCPU thread.
    pub fn task_io(&self, pid: i32, tid: i32) -> Result<TaskIo> {
        let path = self.task_dir(pid, tid).join("io");
        let text = util::read_proc(&path, pid, Some(tid))?;
        parse_task_io(&path, &text)
    }

    /// The thread's cgroup path in the hierarchy with controller `controller` (v1), or the
    /// unified (`0::`) path when `controller` is `None`; `None` when it has no such line.
    pub fn task_cgroup(&self, pid: i32, tid: i32, controller: Option<&str>) -> Result<Option<String>> {
        let path = self.task_dir(pid, tid).join("cgroup");
        let text = util::read_proc(&path, pid, Some(tid))?;
        Ok(parse_cgroup(&path, &text)?
            .into_iter()
            .find(|(id, ctl, _)| match controller {
                Some(c) => ctl.iter().any(|x| x == c),
                None => *id == 0,
            })
            .map(|(_, _, path)| path))
    }

    /// Whether process (or thread) `pid` exists: `<root>/<pid>` is there. A zombie counts as
    /// alive until it is reaped; ids below 1 never are.
    pub fn alive(&self, pid: i32) -> bool {
        pid > 0 && self.root.join(pid.to_string()).exists()
    }

    /// `/proc/self/mountinfo`.
    pub fn mountinfo(&self) -> Result<Vec<MountInfo>> {
        let path = self.root.join("self").join("mountinfo");
        let text = util::read(&path)?;
        parse_mountinfo(&path, &text)
    }

    /// CPU flags of the first processor in `/proc/cpuinfo` (`flags` on x86, `Features` on
    /// arm64); e.g. `hypervisor` in a VM. Empty when there is no such line.
    pub fn cpuinfo_flags(&self) -> Result<Vec<String>> {
        let path = self.root.join("cpuinfo");
        let text = util::read(&path)?;
        Ok(parse_cpuinfo_flags(&text))
    }

    /// The kernel command line (`/proc/cmdline`), trimmed.
    pub fn cmdline_kernel(&self) -> Result<String> {
        let path = self.root.join("cmdline");
        Ok(util::read(&path)?.trim().to_string())
    }

    /// The id of this boot (`sys/kernel/random/boot_id`, a UUID the kernel draws at boot):
    /// anything measured since boot is valid only while it stays the same.
    pub fn boot_id(&self) -> Result<String> {
        self.read_kernel_word("sys/kernel/random/boot_id", "boot id")
    }

    /// The running kernel's release (`sys/kernel/osrelease`, what `uname -r` prints).
    pub fn kernel_release(&self) -> Result<String> {
        self.read_kernel_word("sys/kernel/osrelease", "kernel release")
    }

    /// Memory available for new work in KiB (`MemAvailable` of `/proc/meminfo`); `None` on
    /// kernels without that line.
    pub fn mem_available_kib(&self) -> Result<Option<u64>> {
        let path = self.root.join("meminfo");
        let text = util::read(&path)?;
        parse_mem_available_kib(&path, &text)
    }

    /// EEVDF's base slice in ns (`/proc/sys/kernel/sched_base_slice_ns`, on kernels that put it
    /// there; most have it only in debugfs, see `Sysfs::debug_sched_base_slice_ns`); `None`
    /// when absent.
    pub fn sched_base_slice_ns(&self) -> Result<Option<u64>> {
        let path = self.root.join("sys/kernel/sched_base_slice_ns");
        util::read_opt(&path)?.map(|t| parse_u64(&path, 1, "base slice", t.trim())).transpose()
    }

    /// A one-line `/proc/sys` value: trimmed, non-empty, no whitespace inside.
    fn read_kernel_word(&self, rel: &str, what: &str) -> Result<String> {
        let path = self.root.join(rel);
        let text = util::read(&path)?;
        let v = text.trim();
        if v.is_empty() || v.contains(char::is_whitespace) {
            return Err(parse_err(&path, 1, format!("{what}: '{v}' is not one word")));
        }
        Ok(v.to_string())
    }

    /// Resident set size of `pid` in KiB (`VmRSS` in `/proc/<pid>/status`); 0 for kernel
    /// threads, which have no such line.
    pub fn self_status_vmrss_kib(&self, pid: i32) -> Result<u64> {
        let path = self.root.join(pid.to_string()).join("status");
        let text = util::read_proc(&path, pid, None)?;
        for (i, line) in text.lines().enumerate() {
            if let Some(v) = line.strip_prefix("VmRSS:") {
                let num = v.trim().trim_end_matches("kB").trim();
                return parse_u64(&path, i + 1, "VmRSS", num);
            }
        }
        Ok(0)
    }
}

/// The pid or tid a `/proc` directory is named after: a positive id in the kernel's own
/// spelling (`42`, not `042` or `+42`), so that the path rebuilt from it names the same
/// directory.
fn id_of(name: &str) -> Option<i32> {
    name.parse::<i32>().ok().filter(|&id| id > 0 && id.to_string() == name)
}

/// `/proc/<pid>/task/<tid>/io` fields: the host agent's I/O evidence of a vCPU thread, the
/// guest agent's progress of a workload that moves bytes (`rchar` and `wchar` count what
/// read/write-like calls moved, sockets and pipes included; `recvmsg`/`sendmsg`-style socket
/// calls are not counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskIo {
    /// read-like system calls
    pub syscr: u64,
    /// write-like system calls
    pub syscw: u64,
    pub rchar: u64,
    pub wchar: u64,
}

/// Parses an `io` file (`key: value` lines). Missing keys are an error.
/// `MemAvailable:   123456 kB` of `/proc/meminfo`, in KiB; `None` without that line.
pub fn parse_mem_available_kib(path: &Path, text: &str) -> Result<Option<u64>> {
    for (i, line) in text.lines().enumerate() {
        if let Some(v) = line.strip_prefix("MemAvailable:") {
            let num = v.split_whitespace().next().unwrap_or("");
            return parse_u64(path, i + 1, "MemAvailable", num).map(Some);
        }
    }
    Ok(None)
}

pub fn parse_task_io(path: &Path, text: &str) -> Result<TaskIo> {
    // Read every period for every workload thread: no allocation per line.
    let (mut syscr, mut syscw, mut rchar, mut wchar) = (None, None, None, None);
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let (k, v) = line.split_once(':').ok_or_else(|| parse_err(path, i + 1, format!("'{line}' is not 'key: value'")))?;
        let v: u64 = v.trim().parse().map_err(|_| parse_err(path, i + 1, format!("'{}' is not a number", v.trim())))?;
        match k.trim() {
            "syscr" => syscr = Some(v),
            "syscw" => syscw = Some(v),
            "rchar" => rchar = Some(v),
            "wchar" => wchar = Some(v),
            _ => {}
        }
    }
    let get = |v: Option<u64>, k: &str| v.ok_or_else(|| parse_err(path, 0, format!("no '{k}' field")));
    Ok(TaskIo { syscr: get(syscr, "syscr")?, syscw: get(syscw, "syscw")?, rchar: get(rchar, "rchar")?, wchar: get(wchar, "wchar")? })
}

/// Whether process (or thread) `pid` exists in the real `/proc` (see [`Procfs::alive`]).
pub fn alive(pid: i32) -> bool {
    Procfs::with_root("/proc").alive(pid)
}

/// Parses `/proc/stat` text.
pub fn parse_stat(path: &Path, text: &str, clk_tck: u64) -> Result<ProcStat> {
    let mut out = ProcStat { clk_tck, ..ProcStat::default() };
    let mut saw_total = false;
    let mut saw_ctxt = false;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let mut it = line.split_whitespace();
        let Some(key) = it.next() else { continue };
        if let Some(id) = key.strip_prefix("cpu") {
            let mut vals = [0u64; 10];
            let mut count = 0;
            for (k, w) in it.enumerate() {
                if k >= vals.len() {
                    break;
                }
                vals[k] = parse_u64(path, n, key, w)?;
                count += 1;
            }
            if count < 4 {
                return Err(parse_err(path, n, format!("{key}: {count} fields, need at least 4")));
            }
            let t = CpuTimes {
                user: vals[0],
                nice: vals[1],
                system: vals[2],
                idle: vals[3],
                iowait: vals[4],
                irq: vals[5],
                softirq: vals[6],
                steal: vals[7],
                guest: vals[8],
                guest_nice: vals[9],
            };
            if id.is_empty() {
                out.total = t;
                saw_total = true;
            } else {
                let cpu = id.parse::<u32>().map_err(|_| parse_err(path, n, format!("'{key}' is not cpuN")))?;
                out.cpus.insert(cpu, t);
            }
        } else if key == "ctxt" {
            let v = it.next().ok_or_else(|| parse_err(path, n, "ctxt without value"))?;
            out.ctxt = parse_u64(path, n, "ctxt", v)?;
            saw_ctxt = true;
        } else if key == "procs_running" || key == "procs_blocked" {
            let v = it.next().ok_or_else(|| parse_err(path, n, format!("{key} without value")))?;
            let v = parse_u64(path, n, key, v)?;
            if key == "procs_running" {
                out.procs_running = v;
            } else {
                out.procs_blocked = v;
            }
        }
    }
    if !saw_total || out.cpus.is_empty() {
        return Err(parse_err(path, 0, "no 'cpu' / 'cpuN' lines"));
    }
    if !saw_ctxt {
        return Err(parse_err(path, 0, "no 'ctxt' line"));
    }
    Ok(out)
}

/// Parses a `schedstat` line: `run_ns wait_ns timeslices`.
pub fn parse_schedstat(path: &Path, text: &str) -> Result<SchedStat> {
    let f: Vec<&str> = text.split_whitespace().collect();
    if f.len() < 3 {
        return Err(parse_err(path, 1, format!("{} fields, need 3", f.len())));
    }
    Ok(SchedStat {
        run_ns: parse_u64(path, 1, "run_ns", f[0])?,
        wait_ns: parse_u64(path, 1, "wait_ns", f[1])?,
        timeslices: parse_u64(path, 1, "timeslices", f[2])?,
    })
}

/// Parses a `status` file.
pub fn parse_status(path: &Path, text: &str) -> Result<TaskStatus> {
    let mut name = None;
    let mut state = None;
    let mut vol = None;
    let mut nonvol = None;
    for (i, line) in text.lines().enumerate() {
        let Some((k, v)) = line.split_once(':') else { continue };
        match k {
            "Name" => name = Some(v.trim().to_string()),
            "State" => {
                state = Some(v.trim().chars().next().ok_or_else(|| parse_err(path, i + 1, "empty State"))?);
            }
            "voluntary_ctxt_switches" => vol = Some(parse_u64(path, i + 1, k, v)?),
            "nonvoluntary_ctxt_switches" => nonvol = Some(parse_u64(path, i + 1, k, v)?),
            _ => {}
        }
    }
    let missing = |f: &str| parse_err(path, 0, format!("no '{f}' line"));
    Ok(TaskStatus {
        name: name.ok_or_else(|| missing("Name"))?,
        state: state.ok_or_else(|| missing("State"))?,
        voluntary_ctxt_switches: vol.ok_or_else(|| missing("voluntary_ctxt_switches"))?,
        nonvoluntary_ctxt_switches: nonvol.ok_or_else(|| missing("nonvoluntary_ctxt_switches"))?,
    })
}

/// Parses the `Uid:` line of a `status` file: real, effective, saved and filesystem uid.
pub fn parse_uids(path: &Path, text: &str) -> Result<Uids> {
    let (i, line) = text
        .lines()
        .enumerate()
        .find_map(|(i, l)| l.strip_prefix("Uid:").map(|v| (i, v)))
        .ok_or_else(|| parse_err(path, 0, "no 'Uid' line"))?;
    let ids: Vec<u32> = line
        .split_whitespace()
        .map(|v| v.parse::<u32>().map_err(|_| parse_err(path, i + 1, format!("Uid: '{v}' is not a user id"))))
        .collect::<Result<_>>()?;
    let [real, effective, saved, fs] = ids[..] else {
        return Err(parse_err(path, i + 1, format!("Uid: {} ids, need 4", ids.len())));
    };
    Ok(Uids { real, effective, saved, fs })
}

/// Parses a `stat` line (`pid (comm) state ppid ...`); `comm` may hold spaces and
/// parentheses, so the fields are counted from the last `)`.
pub fn parse_task_stat(path: &Path, text: &str) -> Result<TaskStat> {
    let open = text.find('(').ok_or_else(|| parse_err(path, 1, "no '(' before comm"))?;
    let close = text.rfind(')').ok_or_else(|| parse_err(path, 1, "no ')' after comm"))?;
    if close < open {
        return Err(parse_err(path, 1, "')' before '('"));
    }
    let comm = text[open + 1..close].to_string();
    let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
    // rest[0] is field 3 (state); field n is rest[n - 3].
    let field = |n: usize| -> Result<&str> {
        rest.get(n - 3).copied().ok_or_else(|| parse_err(path, 1, format!("{} fields after comm, need field {n}", rest.len())))
    };
    let state = field(3)?.chars().next().unwrap_or('?');
    let ppid = field(4)?.parse::<i32>().map_err(|_| parse_err(path, 1, "field 4 (ppid) is not a pid"))?;
    let processor = parse_u64(path, 1, "processor (field 39)", field(39)?)?;
    let policy = parse_u64(path, 1, "policy (field 41)", field(41)?)?;
    let nice = field(19)?.parse::<i32>().map_err(|_| parse_err(path, 1, "field 19 (nice) is not an integer"))?;
    let num_threads = parse_u64(path, 1, "num_threads (field 20)", field(20)?)?;
    Ok(TaskStat {
        comm,
        state,
        ppid,
        utime_ticks: parse_u64(path, 1, "utime (field 14)", field(14)?)?,
        stime_ticks: parse_u64(path, 1, "stime (field 15)", field(15)?)?,
        cutime_ticks: parse_u64(path, 1, "cutime (field 16)", field(16)?)?,
        cstime_ticks: parse_u64(path, 1, "cstime (field 17)", field(17)?)?,
        processor: u32::try_from(processor).map_err(|_| parse_err(path, 1, "processor out of range"))?,
        policy: u32::try_from(policy).map_err(|_| parse_err(path, 1, "policy out of range"))?,
        nice,
        num_threads: u32::try_from(num_threads).map_err(|_| parse_err(path, 1, "num_threads out of range"))?,
        starttime_ticks: parse_u64(path, 1, "starttime (field 22)", field(22)?)?,
    })
}

/// Splits a NUL-separated command line.
pub fn parse_cmdline(text: &str) -> Vec<String> {
    text.split('\0').filter(|s| !s.is_empty()).map(str::to_string).collect()
}

/// Parses `/proc/<pid>/cgroup`.
pub fn parse_cgroup(path: &Path, text: &str) -> Result<Vec<CgroupLine>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctl), Some(p)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(parse_err(path, i + 1, format!("'{line}' is not id:controllers:path")));
        };
        let id = id.parse::<u32>().map_err(|_| parse_err(path, i + 1, format!("hierarchy id '{id}' is not a number")))?;
        let controllers = ctl.split(',').filter(|c| !c.is_empty()).map(str::to_string).collect();
        out.push((id, controllers, p.to_string()));
    }
    Ok(out)
}

/// The flags of the first processor in cpuinfo text.
pub fn parse_cpuinfo_flags(text: &str) -> Vec<String> {
    for line in text.lines() {
        if let Some((k, v)) = line.split_once(':') {
            let k = k.trim();
            if k == "flags" || k == "Features" {
                return v.split_whitespace().map(str::to_string).collect();
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
pub(crate) mod tests;
