//! Builds the controller's [`Snapshot`] of one period from the OS (read the world, then decide).
//!
//! - `T_work` in total: per-thread `schedstat` run time of the workload's threads (ns exact).
//!   A thread that starts and ends between two readings is in no list the sampler reads, and
//!   one that ends takes its last stretch with it: where the threads changed, the total is at
//!   least the processes' own CPU time (their ended threads included) and that of the
//!   children they waited for (`/proc/<pid>/stat` fields 14-17, ticks), so a build of many
//!   short compiler processes reads as the busy workload it is.
//! - `T_work` per vCPU: `/proc/stat` busy time of the vCPU minus the yielding thread's run time
//!   on it, scaled so the vCPUs add up to the exact total (other processes are discounted).
//! - `T_idle` per vCPU: the period minus its `T_work`; `T_yield`: the yielding thread's idle
//!   yielding time.
//! - `S_yield` per vCPU: slow yields of its yielding thread (each ends one idle period), or
//!   cpuidle entries when retention is off (no yielding threads, or parked by the governor).
//! - `S_work`: voluntary context switches of the workload's threads (their blocking
//!   synchronization points; preemptions are not sync points).
//! - I/O: bytes and calls of the workload's threads' read/write-like system calls (per-thread
//!   `io`: `rchar + wchar`, `syscr + syscw`), the governor's progress of a workload that moves
//!   bytes.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use gleaner_os::cpuset::CpuSet;
use gleaner_os::procfs::{duration_to_ticks, ticks_to_ns, IoFile, Procfs, SchedstatFile, StatFile, StatusFile};
use gleaner_os::sysfs::{IdleCount, IdleCounters, Sysfs};
use gleaner_policy::gleaner::{Snapshot, VcpuSample};
use gleaner_policy::guest::VcpuIdle;
use gleaner_policy::idle::Log2Hist;
use gleaner_policy::retention::WorkloadIo;

use crate::agent::pace::Pacer;
use crate::yielders::Yielders;

/// What the sampler reads of the workload: its threads, and its processes (thread group
/// ids), whose own and waited-for children's CPU time cover the threads no list showed.
#[derive(Debug, Clone, Copy)]
pub struct Workload<'a> {
    pub tids: &'a [i32],
    pub pids: &'a [i32],
}

/// The process tree's CPU time as last read ([`Sampler::sample_tree`]), ticks.
#[derive(Debug, Clone, Default)]
struct TreeTime {
    /// The highest sum so far, less what joined processes brought.
    max: u64,
    /// The CPU time processes had when they joined the workload from outside (started before
    /// a reading that did not list them): theirs, not the workload's.
    joined: u64,
    /// The processes listed, and the boot time of the reading.
    pids: std::collections::HashSet<i32>,
    at: u64,
}

/// Per-thread cumulative values at the previous sample.
#[derive(Debug, Clone, Copy, Default)]
struct ThreadPrev {
    run_ns: u64,
    vcsw: u64,
    /// Bytes and calls of its read/write-like system calls.
    io_bytes: u64,
    io_calls: u64,
    /// Its voluntary switches in the last period (the sync points it made then).
    synced: u64,
}

/// Threads whose files the sampler keeps open (three descriptors each: well inside the usual
/// 1024-descriptor soft limit); the rest are read with an open each period.
const MAX_KEPT_THREADS: usize = 192;

/// One thread's kept procfs files.
#[derive(Debug)]
struct ThreadFiles {
    schedstat: SchedstatFile,
    status: StatusFile,
    /// `None` where the thread's `io` cannot be opened (another user's thread without
    /// `CAP_SYS_PTRACE`): it counts no bytes.
    io: Option<IoFile>,
}

/// A thread's bytes and calls through read/write-like system calls (0 where unreadable).
fn io_sums(io: Option<gleaner_os::procfs::TaskIo>) -> (u64, u64) {
    let t = io.unwrap_or_default();
    (t.rchar.saturating_add(t.wchar), t.syscr.saturating_add(t.syscw))
}

impl ThreadFiles {
    fn open(procfs: &Procfs, pid: i32, tid: i32) -> Option<Self> {
        Some(Self {
            schedstat: procfs.open_task_schedstat(pid, tid).ok()?,
            status: procfs.open_task_status(pid, tid).ok()?,
            io: procfs.open_task_io(pid, tid).ok(),
        })
    }
}

/// One vCPU's retention timeout, as reported per period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VcpuTimeout {
    pub cpu: u32,
    /// Its yielding thread's timeout now (adaptive, or the fixed one).
    pub timeout_ns: u64,
    /// Times it grew / shrank (in the period for `period` events, since start in the status).
    pub grows: u64,
    pub shrinks: u64,
}

/// Extra readings of a period that the controller does not use but status/metrics show.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct PeriodExtras {
    /// Workload threads seen this period.
    pub threads: usize,
    /// Yielding-thread CPU time in the period (the agent's retention cost).
    pub yielder_run_ns: u64,
    /// Timeouts of the yielding threads in the period.
    pub timeouts: u64,
    /// Yield calls in the period.
    pub yields: u64,
    /// Times a yielding thread stepped aside for a thread waiting on another vCPU.
    pub step_asides: u64,
    /// Slow yields during which no other task ran (interrupts, host preemption): not counted
    /// as idle periods.
    pub noise_returns: u64,
    /// Each yielding thread's timeout at the end of the period, with the grows and shrinks in
    /// the period (empty without yielding threads).
    pub vcpus: Vec<VcpuTimeout>,
    /// Every managed vCPU's idle counters in the period (the idle planner's input).
    pub idle: Vec<VcpuIdle>,
    /// Kernel polling in the period, all managed vCPUs (the POLL state's time), ns.
    pub poll_ns: u64,
    /// Per yielding thread, the idle periods it caught in the period (the tracer does not see
    /// them: the idle planner adds them).
    pub caught: Vec<(u32, Log2Hist)>,
    /// What the workload's threads moved through read/write calls in the period.
    pub io: WorkloadIo,
}

/// A vCPU's idle time in a period from its idle states' residency (`state`, microseconds, but
/// counted when a state is left, so an idle period still going on is missing) and from
/// `/proc/stat` (`stat`, the kernel's exact idle time cut to ticks of `tick_ns`, so within a
/// tick of the truth): the residency within a tick of `/proc/stat`. A tick is 2.5% of a 200 ms
/// period on 2 vCPUs, coarser than the 2% under which a workload is saturated: `sysbench
/// threads` read 0 or 2.5% a period from `/proc/stat` alone.
fn idle_time(state: Option<u64>, stat: Option<u64>, tick_ns: u64) -> u64 {
    match (state, stat) {
        (Some(s), Some(p)) => s.clamp(p.saturating_sub(tick_ns), p.saturating_add(tick_ns)),
        (Some(x), None) | (None, Some(x)) => x,
        (None, None) => 0,
    }
}

/// Samples the workload and the vCPUs once per period.
#[derive(Debug)]
pub struct Sampler {
    procfs: Procfs,
    sysfs: Sysfs,
    threads: HashMap<i32, ThreadPrev>,
    /// Every thread's procfs files, kept open between periods and re-read with one `pread`
    /// each (under TCG an open + read + close cost 240-350 us of guest time, a `pread` 4-52
    /// us: the agent's own sampling was 3-8% of a 1 s run). Dropped when a read fails (the
    /// thread exited; an open file pins the task, so a reused tid is never misread).
    files: HashMap<i32, ThreadFiles>,
    stat: Option<StatFile>,
    /// Each yielding thread's schedstat, kept open the same way (by tid).
    yielder_files: HashMap<i32, SchedstatFile>,
    cpu_busy_ns: BTreeMap<u32, u64>,
    cpu_idle_ns: BTreeMap<u32, u64>,
    cpu_steal_ns: BTreeMap<u32, u64>,
    yielder: HashMap<u32, YielderPrev>,
    /// Each yielding thread's catches when last read.
    caught: HashMap<u32, Log2Hist>,
    idle_entries: BTreeMap<u32, u64>,
    /// Cumulative POLL-state time per vCPU, ns.
    poll_ns: BTreeMap<u32, u64>,
    /// Cumulative time in any idle state per vCPU, ns.
    state_idle_ns: BTreeMap<u32, u64>,
    /// Every managed vCPU (the snapshot covers only the active ones).
    managed: CpuSet,
    /// The workload's process-tree CPU time at the last reading ([`Self::sample_tree`]).
    tree: Option<TreeTime>,
    /// The managed vCPUs' cpuidle counters, kept open ([`Self::read_idle_counters`]).
    idle_counters: Option<IdleCounters>,
    at: Instant,
}

#[derive(Debug, Clone, Copy, Default)]
struct YielderPrev {
    run_ns: u64,
    busy_returns: u64,
    idle_yield_ns: u64,
    timeouts: u64,
    yields: u64,
    step_asides: u64,
    noise_returns: u64,
    timeout_grows: u64,
    timeout_shrinks: u64,
}

impl YielderPrev {
    /// The counts since `prev`.
    fn since(&self, prev: &YielderPrev) -> YielderPrev {
        YielderPrev {
            run_ns: self.run_ns.saturating_sub(prev.run_ns),
            busy_returns: self.busy_returns.saturating_sub(prev.busy_returns),
            idle_yield_ns: self.idle_yield_ns.saturating_sub(prev.idle_yield_ns),
            timeouts: self.timeouts.saturating_sub(prev.timeouts),
            yields: self.yields.saturating_sub(prev.yields),
            step_asides: self.step_asides.saturating_sub(prev.step_asides),
            noise_returns: self.noise_returns.saturating_sub(prev.noise_returns),
            timeout_grows: self.timeout_grows.saturating_sub(prev.timeout_grows),
            timeout_shrinks: self.timeout_shrinks.saturating_sub(prev.timeout_shrinks),
        }
    }
}

/// The workload threads' counts over a period.
#[derive(Debug, Default)]
struct ThreadTotals {
    /// Exact run time, ns.
    run_ns: u64,
    /// Voluntary switches (sync points).
    s_work: u64,
    io: WorkloadIo,
}

/// Per-vCPU deltas of `/proc/stat` over a period, ns (tick resolution), and the tick.
#[derive(Debug, Default)]
struct StatDeltas {
    busy: BTreeMap<u32, u64>,
    idle: BTreeMap<u32, u64>,
    steal: BTreeMap<u32, u64>,
    tick_ns: u64,
}

/// Per-vCPU deltas of the cpuidle counters over a period: entries, POLL-state time, time in
/// the other states.
#[derive(Debug, Default)]
struct IdleDeltas {
    entries: BTreeMap<u32, u64>,
    poll: BTreeMap<u32, u64>,
    state_idle: BTreeMap<u32, u64>,
}

impl Sampler {
    /// The sync points (voluntary switches) thread `tid` made in the last sampled period: 0
    /// where it was not sampled.
    pub fn synced(&self, tid: i32) -> u64 {
        self.threads.get(&tid).map_or(0, |t| t.synced)
    }

    /// A sampler reading `procfs` and `sysfs`; the first [`Sampler::sample`] establishes the
    /// baseline (call [`Sampler::prime`] right after starting the workload).
    pub fn new(procfs: Procfs, sysfs: Sysfs, managed: CpuSet) -> Self {
        Self {
            managed,
            cpu_idle_ns: BTreeMap::new(),
            cpu_steal_ns: BTreeMap::new(),
            poll_ns: BTreeMap::new(),
            state_idle_ns: BTreeMap::new(),
            procfs,
            sysfs,
            threads: HashMap::new(),
            files: HashMap::new(),
            stat: None,
            yielder_files: HashMap::new(),
            cpu_busy_ns: BTreeMap::new(),
            yielder: HashMap::new(),
            caught: HashMap::new(),
            idle_entries: BTreeMap::new(),
            idle_counters: None,
            tree: None,
            at: Instant::now(),
        }
    }

    /// The managed vCPUs' cpuidle counters, from the files kept open. They are (re)opened on
    /// the first period and after a read failed: a switch of the cpuidle governor (the
    /// windows' reset) recreates them, and reads of the old fail with ENODEV. `None`: no
    /// cpuidle, or unreadable.
    fn read_idle_counters(&mut self) -> Option<Vec<IdleCount>> {
        if let Some(Ok(c)) = self.idle_counters.as_ref().map(IdleCounters::read) {
            return Some(c);
        }
        self.idle_counters = self.sysfs.idle_counters(&self.managed).ok();
        self.idle_counters.as_ref()?.read().ok()
    }

    /// Takes baseline readings so the next sample covers exactly one period.
    pub fn prime(&mut self, workload: Workload<'_>, yielders: Option<&Yielders>, cpus: &CpuSet) {
        let _ = self.sample(workload, yielders, cpus, &mut Pacer::off());
    }

    /// Samples one period ending now. `cpus` are the active vCPUs (the snapshot covers only
    /// them); `workload` its threads and processes. `pace`: a point after each thread's files
    /// and each group of counters (a woken thread runs there, [`Pacer`]).
    pub fn sample(
        &mut self,
        workload: Workload<'_>,
        yielders: Option<&Yielders>,
        cpus: &CpuSet,
        pace: &mut Pacer,
    ) -> (Snapshot, PeriodExtras) {
        let now = Instant::now();
        let period_ns = u64::try_from(now.duration_since(self.at).as_nanos()).unwrap_or(u64::MAX).max(1);
        self.at = now;
        let churned = self.threads_churned(workload.tids);
        let mut work = self.sample_threads(workload.tids, pace);
        let boot = duration_to_ticks(gleaner_os::boottime(), self.procfs.clk_tck());
        let tree_ns = self.sample_tree(workload.pids, boot);
        if churned {
            work.run_ns = work.run_ns.max(tree_ns);
        }
        let stat = self.sample_stat();
        pace.point();
        let mut extras = PeriodExtras { threads: workload.tids.len(), io: work.io, ..PeriodExtras::default() };
        let ydelta = self.sample_yielders(yielders, &mut extras);
        pace.point();
        let states = self.sample_idle_states();
        extras.idle = self
            .managed
            .iter()
            .map(|cpu| VcpuIdle {
                cpu,
                idle_ns: idle_time(states.state_idle.get(&cpu).copied(), stat.idle.get(&cpu).copied(), stat.tick_ns),
                entries: states.entries.get(&cpu).copied(),
                poll_ns: states.poll.get(&cpu).copied().unwrap_or(0),
                yield_ns: ydelta.get(&cpu).map_or(0, |d| d.run_ns),
                steal_ns: stat.steal.get(&cpu).copied().unwrap_or(0),
            })
            .collect();
        extras.poll_ns = states.poll.values().sum();
        let retaining = yielders.is_some_and(Yielders::retaining);
        let vcpus = vcpu_samples(cpus, period_ns, &work, &stat, &ydelta, &states, retaining);
        (Snapshot { period_ns, vcpus, s_work: work.s_work, pinned: Vec::new() }, extras)
    }

    /// Some thread read last period is no longer listed, or one is new (not at the first
    /// reading): threads ended, and others may have started and ended unseen in between.
    fn threads_churned(&self, tids: &[i32]) -> bool {
        !self.threads.is_empty() && (tids.len() != self.threads.len() || tids.iter().any(|t| !self.threads.contains_key(t)))
    }

    /// The CPU time of the workload's process tree since the last reading, ns (tick
    /// resolution): each process's own (its ended threads included) and that of the children
    /// it waited for, which a child hands its parent when it is reaped. A child between its
    /// exit and its reaping is in neither, and one reaped outside the workload leaves it: the
    /// sum is kept at its highest, so such a dip costs the next readings, never counts twice.
    /// A process that joins from outside (started before the last reading, not listed then)
    /// brings its past, which is set aside. `boot`: the boot time now, ticks.
    fn sample_tree(&mut self, pids: &[i32], boot: u64) -> u64 {
        let mut tree = self.tree.take();
        let (mut sum, mut joined) = (0u64, 0u64);
        for &p in pids {
            let Ok(s) = self.procfs.process_stat(p) else { continue };
            let own = s.utime_ticks + s.stime_ticks + s.cutime_ticks + s.cstime_ticks;
            sum += own;
            if tree.as_ref().is_some_and(|t| !t.pids.contains(&p) && s.starttime_ticks < t.at) {
                joined += own;
            }
        }
        let t = tree.get_or_insert_with(|| TreeTime { max: sum, ..TreeTime::default() });
        t.joined += joined;
        let now = sum.saturating_sub(t.joined);
        let delta = now.saturating_sub(t.max);
        t.max = t.max.max(now);
        t.pids = pids.iter().copied().collect();
        t.at = boot;
        self.tree = tree;
        ticks_to_ns(delta, self.procfs.clk_tck())
    }

    /// The workload threads: exact run time, voluntary switches, bytes moved. Files of threads
    /// no longer listed close here.
    fn sample_threads(&mut self, tids: &[i32], pace: &mut Pacer) -> ThreadTotals {
        let mut totals = ThreadTotals::default();
        let mut seen = HashMap::with_capacity(tids.len());
        let mut files = HashMap::with_capacity(tids.len());
        for &tid in tids {
            let kept = match self.files.remove(&tid) {
                Some(f) => Some(f),
                // Past MAX_KEPT_THREADS (two descriptors each) read once, as before.
                None if files.len() < MAX_KEPT_THREADS => ThreadFiles::open(&self.procfs, tid, tid),
                None => None,
            };
            let (ss, mut kept) = match kept {
                Some(mut f) => {
                    let Ok(ss) = f.schedstat.read() else { continue };
                    (ss, Some(f))
                }
                None => {
                    let Ok(ss) = self.procfs.task_schedstat(tid, tid) else { continue };
                    (ss, None)
                }
            };
            let before = self.threads.get(&tid).copied();
            let prev = before.unwrap_or_default();
            // A thread that did not run since the last sample neither switched nor moved a
            // byte: its `status` and `io` (most of the reading's cost: `status` is formatted
            // line by line) are not read again. A server's idle helper threads and its
            // harness are most of the threads listed.
            let (vcsw, io_bytes, io_calls) = match (before.filter(|b| b.run_ns == ss.run_ns), kept.as_mut()) {
                (Some(b), _) => (b.vcsw, b.io_bytes, b.io_calls),
                (None, Some(f)) => {
                    let (b, c) = io_sums(f.io.as_mut().and_then(|io| io.read().ok()));
                    (f.status.read().map(|s| s.voluntary_ctxt_switches).unwrap_or(0), b, c)
                }
                (None, None) => {
                    let (b, c) = io_sums(self.procfs.task_io(tid, tid).ok());
                    (self.procfs.task_status(tid, tid).map(|s| s.voluntary_ctxt_switches).unwrap_or(0), b, c)
                }
            };
            if let Some(f) = kept {
                files.insert(tid, f);
            }
            totals.run_ns += ss.run_ns.saturating_sub(prev.run_ns);
            totals.s_work += vcsw.saturating_sub(prev.vcsw);
            totals.io.bytes += io_bytes.saturating_sub(prev.io_bytes);
            totals.io.calls += io_calls.saturating_sub(prev.io_calls);
            seen.insert(tid, ThreadPrev { run_ns: ss.run_ns, vcsw, io_bytes, io_calls, synced: vcsw.saturating_sub(prev.vcsw) });
            pace.point();
        }
        self.threads = seen;
        self.files = files;
        totals
    }

    /// Per-vCPU busy, idle and steal time from `/proc/stat` (kept open; reopened after a
    /// failed read).
    fn sample_stat(&mut self) -> StatDeltas {
        if self.stat.is_none() {
            self.stat = self.procfs.open_stat().ok();
        }
        let stat = self.stat.as_mut().map(StatFile::read);
        if stat.as_ref().is_some_and(Result::is_err) {
            self.stat = None;
        }
        let mut d = StatDeltas::default();
        if let Some(Ok(stat)) = stat {
            d.tick_ns = ticks_to_ns(1, stat.clk_tck);
            for (&cpu, t) in &stat.cpus {
                let ns = t.busy_ns(stat.clk_tck);
                let prev = self.cpu_busy_ns.insert(cpu, ns).unwrap_or(ns);
                d.busy.insert(cpu, ns.saturating_sub(prev));
                let ns = t.idle_ns(stat.clk_tck);
                let prev = self.cpu_idle_ns.insert(cpu, ns).unwrap_or(ns);
                d.idle.insert(cpu, ns.saturating_sub(prev));
                let ns = t.steal_ns(stat.clk_tck);
                let prev = self.cpu_steal_ns.insert(cpu, ns).unwrap_or(ns);
                d.steal.insert(cpu, ns.saturating_sub(prev));
            }
        }
        d
    }

    /// The yielding threads: their own run time, slow yields, idle yielding, added to
    /// `extras` with each one's timeout and caught idle periods; the per-vCPU deltas.
    fn sample_yielders(&mut self, yielders: Option<&Yielders>, extras: &mut PeriodExtras) -> HashMap<u32, YielderPrev> {
        let mut ydelta: HashMap<u32, YielderPrev> = HashMap::new();
        let mut yielder_files = HashMap::new();
        if let Some(y) = yielders {
            let pid = std::process::id().cast_signed();
            for slot in y.slots() {
                let tid = slot.tid.load(std::sync::atomic::Ordering::Relaxed);
                let run_ns = if tid > 0 {
                    let file = match self.yielder_files.remove(&tid) {
                        Some(f) => Some(f),
                        None => self.procfs.open_task_schedstat(pid, tid).ok(),
                    };
                    match file.map(|mut f| (f.read(), f)) {
                        Some((Ok(ss), f)) => {
                            yielder_files.insert(tid, f);
                            ss.run_ns
                        }
                        _ => 0,
                    }
                } else {
                    0
                };
                let c = slot.counters.read();
                let cur = YielderPrev {
                    run_ns,
                    busy_returns: c.busy_returns,
                    idle_yield_ns: c.idle_yield_ns,
                    timeouts: c.timeouts,
                    yields: c.yields,
                    step_asides: c.step_asides,
                    noise_returns: c.noise_returns,
                    timeout_grows: c.timeout_grows,
                    timeout_shrinks: c.timeout_shrinks,
                };
                let prev = self.yielder.insert(slot.cpu, cur).unwrap_or(cur);
                let d = cur.since(&prev);
                extras.yielder_run_ns += d.run_ns;
                extras.timeouts += d.timeouts;
                extras.yields += d.yields;
                extras.step_asides += d.step_asides;
                extras.noise_returns += d.noise_returns;
                extras.vcpus.push(VcpuTimeout {
                    cpu: slot.cpu,
                    timeout_ns: c.timeout_ns,
                    grows: d.timeout_grows,
                    shrinks: d.timeout_shrinks,
                });
                ydelta.insert(slot.cpu, d);
                let caught = slot.caught();
                let delta = self.caught.get(&slot.cpu).map_or_else(|| caught.clone(), |p| caught.delta_since(p));
                if delta.count() > 0 {
                    extras.caught.push((slot.cpu, delta));
                }
                self.caught.insert(slot.cpu, caught);
            }
        }
        self.yielder_files = yielder_files;
        ydelta
    }

    /// Idle-state entries and times. A CPU without cpuidle states (no cpuidle driver) has no
    /// count: it falls back to the workload's voluntary switches rather than reading as never
    /// idle, which would keep consolidation from ever running there. Read every period, so the
    /// count is the period's even right after the governor parked the yielding threads. The
    /// POLL state's time is kernel polling: idle for /proc/stat, work for the bill.
    fn sample_idle_states(&mut self) -> IdleDeltas {
        let mut d = IdleDeltas::default();
        let counts = self.read_idle_counters();
        for c in counts.unwrap_or_default() {
            let cpu = c.cpu;
            let prev = self.idle_entries.insert(cpu, c.entries).unwrap_or(c.entries);
            d.entries.insert(cpu, c.entries.saturating_sub(prev));
            let prev = self.poll_ns.insert(cpu, c.poll_ns).unwrap_or(c.poll_ns);
            d.poll.insert(cpu, c.poll_ns.saturating_sub(prev));
            let prev = self.state_idle_ns.insert(cpu, c.idle_ns).unwrap_or(c.idle_ns);
            d.state_idle.insert(cpu, c.idle_ns.saturating_sub(prev));
        }
        d
    }
}

/// The active vCPUs' samples: the workload's exact run time distributed over them by their
/// busy-minus-yielder time, and each one's sync points (the yielders' busy returns while they
/// retain, else its idle entries, else an even share of the workload's switches).
fn vcpu_samples(
    cpus: &CpuSet,
    period_ns: u64,
    work: &ThreadTotals,
    stat: &StatDeltas,
    ydelta: &HashMap<u32, YielderPrev>,
    states: &IdleDeltas,
    retaining: bool,
) -> Vec<VcpuSample> {
    let raw: Vec<(u32, u64)> = cpus
        .iter()
        .map(|cpu| {
            let busy = stat.busy.get(&cpu).copied().unwrap_or(0);
            let y = ydelta.get(&cpu).map(|d| d.run_ns).unwrap_or(0);
            (cpu, busy.saturating_sub(y))
        })
        .collect();
    let per_cpu = split_total(work.run_ns, &raw);
    let fallback_s_yield = if cpus.is_empty() { 0 } else { work.s_work / cpus.len() as u64 };
    per_cpu
        .into_iter()
        .map(|(cpu, t_work_ns)| {
            let t_work_ns = t_work_ns.min(period_ns);
            let s_yield = match (retaining, ydelta.get(&cpu), states.entries.get(&cpu)) {
                (true, Some(d), _) => d.busy_returns,
                (false, _, Some(&e)) => e,
                _ => fallback_s_yield,
            };
            VcpuSample {
                cpu,
                t_work_ns,
                t_yield_ns: ydelta.get(&cpu).map(|d| d.idle_yield_ns).unwrap_or(0),
                t_idle_ns: period_ns - t_work_ns,
                s_yield,
            }
        })
        .collect()
}

/// Splits `total` over CPUs in proportion to their weights (evenly if all weights are zero).
/// The parts add up to `total` exactly; the remainder goes to the heaviest CPUs first.
pub fn split_total(total: u64, weights: &[(u32, u64)]) -> Vec<(u32, u64)> {
    if weights.is_empty() {
        return Vec::new();
    }
    let sum: u128 = weights.iter().map(|&(_, w)| u128::from(w)).sum();
    let n = weights.len() as u128;
    let mut parts: Vec<(u32, u64)> = weights
        .iter()
        .map(|&(cpu, w)| {
            let share = (u128::from(total) * u128::from(w)).checked_div(sum).unwrap_or(u128::from(total) / n);
            (cpu, u64::try_from(share).unwrap_or(u64::MAX))
        })
        .collect();
    let mut rest = total - parts.iter().map(|p| p.1).sum::<u64>();
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(weights[i].1));
    for &i in order.iter().cycle() {
        if rest == 0 {
            break;
        }
        parts[i].1 += 1;
        rest -= 1;
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workload of these threads and no process files.
    fn threads(tids: &[i32]) -> Workload<'_> {
        Workload { tids, pids: &[] }
    }

    #[test]
    fn split_is_exact_and_proportional() {
        let p = split_total(1000, &[(0, 3), (1, 1)]);
        assert_eq!(p, vec![(0, 750), (1, 250)]);
        let p = split_total(10, &[(0, 0), (1, 0), (2, 0)]);
        assert_eq!(p.iter().map(|x| x.1).sum::<u64>(), 10);
        let p = split_total(7, &[(0, 1), (1, 1)]);
        assert_eq!(p.iter().map(|x| x.1).sum::<u64>(), 7);
        assert!(split_total(5, &[]).is_empty());
    }

    /// A /proc with one workload thread and a /sys with CPUs 0-1, cpuidle states optional.
    struct Fixture {
        dir: tempfile::TempDir,
    }

    impl Fixture {
        fn new(cpuidle: bool) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let f = Self { dir };
            std::fs::write(f.proc().join("stat"), "cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\nctxt 0\nbtime 0\nprocesses 0\nprocs_running 1\nprocs_blocked 0\n")
                .unwrap();
            for cpu in 0..2 {
                let d = f.sys().join(format!("devices/system/cpu/cpu{cpu}"));
                std::fs::create_dir_all(&d).unwrap();
                if cpuidle {
                    let s = d.join("cpuidle/state0");
                    std::fs::create_dir_all(&s).unwrap();
                    std::fs::write(s.join("name"), "HLT\n").unwrap();
                    std::fs::write(s.join("time"), "0\n").unwrap();
                }
            }
            f.set(0, 0, 0);
            f
        }
        fn proc(&self) -> std::path::PathBuf {
            let p = self.dir.path().join("proc");
            std::fs::create_dir_all(p.join("7/task/7")).unwrap();
            p
        }
        fn sys(&self) -> std::path::PathBuf {
            self.dir.path().join("sys")
        }
        /// The thread's run time and voluntary switches, and each CPU's idle-state entries.
        fn set(&self, run_ns: u64, vcsw: u64, idle_usage: u64) {
            let t = self.proc().join("7/task/7");
            std::fs::write(t.join("schedstat"), format!("{run_ns} 0 0\n")).unwrap();
            std::fs::write(
                t.join("status"),
                format!("Name:\tw\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\t{vcsw}\nnonvoluntary_ctxt_switches:\t0\n"),
            )
            .unwrap();
            for cpu in 0..2 {
                let s = self.sys().join(format!("devices/system/cpu/cpu{cpu}/cpuidle/state0"));
                if s.is_dir() {
                    std::fs::write(s.join("usage"), format!("{idle_usage}\n")).unwrap();
                }
            }
        }
        fn sampler(&self) -> Sampler {
            Sampler::new(Procfs::with_root(self.proc()), Sysfs::with_root(self.sys()), CpuSet::parse("0-1").unwrap())
        }
    }

    #[test]
    fn every_thread_counts_whether_its_files_are_kept_or_read_once() {
        // More threads than the sampler keeps open: all of them still count, each period.
        let f = Fixture::new(false);
        let n = MAX_KEPT_THREADS + 44;
        let tids: Vec<i32> = (1000..).take(n).collect();
        // Round `run`'s run time (1 us a round), `vcsw` switches.
        let write = |run: u64, vcsw: u64| {
            for &t in &tids {
                let d = f.proc().join(format!("{t}/task/{t}"));
                std::fs::create_dir_all(&d).unwrap();
                std::fs::write(d.join("schedstat"), format!("{} 0 0\n", run * 1000)).unwrap();
                std::fs::write(
                    d.join("status"),
                    format!("Name:\tw\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\t{vcsw}\nnonvoluntary_ctxt_switches:\t0\n"),
                )
                .unwrap();
                // Every thread but the first moves 100 bytes a round in read and 50 in write
                // calls; the first has no io file (another user's thread): it counts none.
                if t != tids[0] {
                    let io = format!("rchar: {}\nwchar: {}\nsyscr: {vcsw}\nsyscw: {vcsw}\n", vcsw * 100, vcsw * 50);
                    std::fs::write(d.join("io"), io).unwrap();
                }
            }
        };
        write(1, 1);
        let cpus = CpuSet::parse("0-1").unwrap();
        let mut s = f.sampler();
        s.prime(threads(&tids), None, &cpus);
        assert_eq!(s.files.len(), MAX_KEPT_THREADS);
        for round in 2..4u64 {
            write(round, round);
            let (snap, extras) = s.sample(threads(&tids), None, &cpus, &mut Pacer::off());
            assert_eq!((snap.s_work, extras.threads), (n as u64, n), "round {round}");
            let m = n as u64 - 1;
            assert_eq!(extras.io, WorkloadIo { bytes: 150 * m, calls: 2 * m }, "round {round}");
            // Each thread's own share: one switch a round, kept open or not.
            assert_eq!((s.synced(tids[0]), s.synced(tids[n - 1]), s.synced(1)), (1, 1, 0), "round {round}");
        }
        // No thread ran (their run times stand): status and io are not read, kept open or
        // not, so the switches and bytes they now show do not count.
        write(3, 9);
        let (snap, extras) = s.sample(threads(&tids), None, &cpus, &mut Pacer::off());
        assert_eq!((snap.s_work, extras.io, s.synced(tids[n - 1])), (0, WorkloadIo::default(), 0));
        // A thread no longer listed has its files closed.
        let (snap, _) = s.sample(threads(&tids[..10]), None, &cpus, &mut Pacer::off());
        assert_eq!((snap.s_work, s.files.len()), (0, 10));
    }

    #[test]
    fn the_process_tree_covers_threads_no_reading_saw() {
        let f = Fixture::new(false);
        // Every process here started at boot time 100 ticks; readings at 200 and on.
        let stat = |pid: i32, own: u64, children: u64| {
            // Fields 14-17 (utime, stime, cutime, cstime) and 22 (starttime), ticks; the rest
            // any numbers.
            let mut fields: Vec<String> = (3..=52).map(|n| n.to_string()).collect();
            fields[0] = "S".into();
            fields[14 - 3] = own.to_string();
            fields[15 - 3] = "0".into();
            fields[16 - 3] = children.to_string();
            fields[17 - 3] = "0".into();
            fields[22 - 3] = "100".into();
            std::fs::write(f.proc().join(format!("{pid}/stat")), format!("{pid} (w) {}\n", fields.join(" "))).unwrap();
        };
        let tick = Procfs::with_root(f.proc()).clk_tck();
        let ns = |ticks: u64| ticks_to_ns(ticks, tick);
        let mut s = f.sampler();
        stat(7, 10, 0);
        assert_eq!(s.sample_tree(&[7], 50), 0, "the first reading is the baseline");
        // A child ran 5 ticks and was reaped (its time moves into the parent's cutime), and
        // the parent ran 2: 7 ticks, whichever threads were seen.
        stat(7, 12, 5);
        assert_eq!(s.sample_tree(&[7], 60), ns(7));
        // A child process started since (at 100 ticks, after the reading at 60) counts its
        // own time; when its parent reaps it, the same time moves over: nothing counts twice.
        std::fs::create_dir_all(f.proc().join("8")).unwrap();
        stat(8, 4, 0);
        assert_eq!(s.sample_tree(&[7, 8], 200), ns(4));
        stat(7, 12, 9);
        assert_eq!(s.sample_tree(&[7], 210), 0);
        // Between its exit and its reaping a child is in neither: the dip counts nothing, and
        // neither does the way back to where the sum stood.
        stat(7, 12, 5);
        assert_eq!(s.sample_tree(&[7], 220), 0);
        stat(7, 13, 9);
        assert_eq!(s.sample_tree(&[7], 230), ns(1));
        // A process that joins from outside (started at 100, before the reading at 230 that
        // did not list it) brings 500 ticks of its past: only what it runs from now counts,
        // and once its parent here reaps it, nothing of it counts twice.
        std::fs::create_dir_all(f.proc().join("9")).unwrap();
        stat(9, 500, 0);
        assert_eq!(s.sample_tree(&[7, 9], 240), 0);
        stat(9, 503, 0);
        assert_eq!(s.sample_tree(&[7, 9], 250), ns(3));
        stat(7, 13, 9 + 503);
        assert_eq!(s.sample_tree(&[7], 260), 0);
        // Threads churn when one listed last period is gone or a new one is listed.
        s.threads = [(7, ThreadPrev::default()), (9, ThreadPrev::default())].into_iter().collect();
        assert!(!s.threads_churned(&[7, 9]) && s.threads_churned(&[7]) && s.threads_churned(&[7, 10]) && s.threads_churned(&[7, 9, 10]));
        s.threads.clear();
        assert!(!s.threads_churned(&[7]), "the first reading has nothing to churn from");
    }

    #[test]
    fn a_thread_that_did_not_run_keeps_its_counts_unread() {
        // Files kept open, and opened anew (read once: every_thread_counts_...).
        let f = Fixture::new(false);
        let cpus = CpuSet::parse("0-1").unwrap();
        let mut s = f.sampler();
        f.set(1_000, 5, 0);
        s.prime(threads(&[7]), None, &cpus);
        // Its status says 9 switches, but its run time did not move: not read (a thread
        // cannot switch without running), so no sync point.
        f.set(1_000, 9, 0);
        let (snap, _) = s.sample(threads(&[7]), None, &cpus, &mut Pacer::off());
        assert_eq!((snap.s_work, s.synced(7)), (0, 0));
        // It ran: read, and the switches since the last reading count.
        f.set(2_000, 12, 0);
        let (snap, _) = s.sample(threads(&[7]), None, &cpus, &mut Pacer::off());
        assert_eq!((snap.s_work, s.synced(7)), (7, 7));
        s.files.clear();
        f.set(2_000, 20, 0);
        let (snap, _) = s.sample(threads(&[7]), None, &cpus, &mut Pacer::off());
        assert_eq!(snap.s_work, 0, "files opened anew: the same rule");
        f.set(3_000, 20, 0);
        let (snap, _) = s.sample(threads(&[7]), None, &cpus, &mut Pacer::off());
        assert_eq!(snap.s_work, 8);
    }

    #[test]
    fn every_managed_vcpu_reports_its_idle_time_entries_and_kernel_polling() {
        let f = Fixture::new(true);
        for cpu in 0..2 {
            let s = f.sys().join(format!("devices/system/cpu/cpu{cpu}/cpuidle/state1"));
            std::fs::create_dir_all(&s).unwrap();
            for (k, v) in [("name", "POLL"), ("usage", "0"), ("time", "100")] {
                std::fs::write(s.join(k), format!("{v}\n")).unwrap();
            }
        }
        let cpus = CpuSet::parse("0").unwrap();
        let mut s = f.sampler();
        s.prime(threads(&[7]), None, &cpus);
        std::fs::write(f.sys().join("devices/system/cpu/cpu1/cpuidle/state1/time"), "2600\n").unwrap();
        std::fs::write(f.sys().join("devices/system/cpu/cpu0/cpuidle/state0/time"), "7000\n").unwrap();
        std::fs::write(f.sys().join("devices/system/cpu/cpu1/cpuidle/state0/time"), "1500\n").unwrap();
        std::fs::write(f.proc().join("stat"), "cpu  0 0 0 50 0 0 0 0 0 0\ncpu0 0 0 0 20 0 0 0 0 0 0\ncpu1 0 0 0 30 0 0 0 0 0 0\nctxt 0\nbtime 0\nprocesses 0\nprocs_running 1\nprocs_blocked 0\n").unwrap();
        f.set(0, 0, 5);
        // The snapshot covers the active vCPU 0; the idle counters every managed vCPU.
        let (snap, extras) = s.sample(threads(&[7]), None, &cpus, &mut Pacer::off());
        assert_eq!(snap.vcpus.len(), 1);
        assert_eq!(extras.idle.len(), 2);
        // Idle time from the states' residency, within a tick of /proc/stat's 20 and 30 ticks.
        let tick = 1_000_000_000 / nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).unwrap().unwrap().cast_unsigned();
        assert_eq!(
            extras.idle[0],
            VcpuIdle { cpu: 0, idle_ns: 7_000_000.clamp(19 * tick, 21 * tick), entries: Some(5), poll_ns: 0, yield_ns: 0, steal_ns: 0 }
        );
        assert_eq!(
            extras.idle[1],
            VcpuIdle {
                cpu: 1,
                idle_ns: 4_000_000.clamp(29 * tick, 31 * tick),
                entries: Some(5),
                poll_ns: 2_500_000,
                yield_ns: 0,
                steal_ns: 0
            }
        );
        assert_eq!(extras.poll_ns, 2_500_000);
    }

    #[test]
    fn idle_time_is_the_residency_within_a_tick_of_proc_stat() {
        let ms = 1_000_000;
        // sysbench threads: a few ms idle, /proc/stat 0 or 1 tick.
        assert_eq!(idle_time(Some(4 * ms), Some(0), 10 * ms), 4 * ms);
        assert_eq!(idle_time(Some(4 * ms), Some(10 * ms), 10 * ms), 4 * ms);
        // Halted the whole period, the state not left yet: /proc/stat's, less a tick.
        assert_eq!(idle_time(Some(0), Some(200 * ms), 10 * ms), 190 * ms);
        // The period it is left in: the residency of earlier periods, cut to a tick above.
        assert_eq!(idle_time(Some(900 * ms), Some(150 * ms), 10 * ms), 160 * ms);
        assert_eq!(idle_time(None, Some(30 * ms), 10 * ms), 30 * ms);
        assert_eq!(idle_time(Some(3 * ms), None, 10 * ms), 3 * ms);
        assert_eq!(idle_time(None, None, 10 * ms), 0);
    }

    #[test]
    fn without_idle_states_idle_time_is_proc_stat_ticks() {
        let f = Fixture::new(false);
        let cpus = CpuSet::parse("0-1").unwrap();
        let mut s = f.sampler();
        s.prime(threads(&[7]), None, &cpus);
        std::fs::write(f.proc().join("stat"), "cpu  0 0 0 50 0 0 0 0 0 0\ncpu0 0 0 0 20 0 0 0 0 0 0\ncpu1 0 0 0 30 0 0 0 0 0 0\nctxt 0\nbtime 0\nprocesses 0\nprocs_running 1\nprocs_blocked 0\n").unwrap();
        let (_, extras) = s.sample(threads(&[7]), None, &cpus, &mut Pacer::off());
        // 20 and 30 ticks of idle time, whatever a tick is here.
        let tick = extras.idle[0].idle_ns / 20;
        assert!(tick > 0, "{:?}", extras.idle);
        assert_eq!(extras.idle[1], VcpuIdle { cpu: 1, idle_ns: 30 * tick, entries: None, poll_ns: 0, yield_ns: 0, steal_ns: 0 });
    }

    fn s_yields(cpuidle: bool) -> Vec<u64> {
        let f = Fixture::new(cpuidle);
        let cpus = CpuSet::parse("0-1").unwrap();
        let mut s = f.sampler();
        s.prime(threads(&[7]), None, &cpus);
        f.set(1_000_000, 100, 30);
        let (snap, _) = s.sample(threads(&[7]), None, &cpus, &mut Pacer::off());
        assert_eq!(snap.s_work, 100);
        snap.vcpus.iter().map(|v| v.s_yield).collect()
    }

    /// The cpuidle files are kept open, and a governor switch recreates them (the kept ones
    /// then fail to read): a failed read reopens them, the period it happens in has no idle
    /// entries rather than wrong ones, and the next reads the new files.
    #[test]
    fn the_cpuidle_files_are_reopened_after_a_failed_read() {
        let f = Fixture::new(true);
        let cpus = CpuSet::parse("0-1").unwrap();
        let mut s = f.sampler();
        s.prime(threads(&[7]), None, &cpus);
        f.set(0, 0, 30);
        let (_, e) = s.sample(threads(&[7]), None, &cpus, &mut Pacer::off());
        assert_eq!(e.idle[0].entries, Some(30));
        // Unreadable where it is kept (a fixture's stand-in for ENODEV), then a new file.
        let usage = f.sys().join("devices/system/cpu/cpu0/cpuidle/state0/usage");
        std::fs::write(&usage, "gone\n").unwrap();
        let (_, e) = s.sample(threads(&[7]), None, &cpus, &mut Pacer::off());
        assert_eq!(e.idle[0].entries, None, "{:?}", e.idle);
        std::fs::remove_file(&usage).unwrap();
        std::fs::write(&usage, "45\n").unwrap();
        let (_, e) = s.sample(threads(&[7]), None, &cpus, &mut Pacer::off());
        assert_eq!((e.idle[0].entries, e.idle[1].entries), (Some(15), Some(0)), "{:?}", e.idle);
    }

    #[test]
    fn idle_periods_come_from_cpuidle_counters_when_there_are_any() {
        assert_eq!(s_yields(true), vec![30, 30]);
    }

    #[test]
    fn without_a_cpuidle_driver_idle_periods_fall_back_to_workload_switches() {
        // Regression: no cpuidle states read as zero idle periods, and consolidation never ran.
        assert_eq!(s_yields(false), vec![50, 50]);
    }
}
