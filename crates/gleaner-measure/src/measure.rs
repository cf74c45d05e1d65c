//! Measuring one run: wall time, CPU time and context switches (rusage), vCPU idle entries
//! (cpuidle `usage` counters; `/proc/stat` idle time as the fallback) and steal time.
//!
//! ```text
//!   SystemMeter::start ── run (in-process kernel, or a child process tree) ── stop
//!     /proc/stat per CPU            getrusage(SELF) delta | wait4 rusage      /proc/stat
//!     cpuidle usage sums                                                      cpuidle usage
//! ```
//!
//! `wait4` returns the rusage of the child *and of its descendants that were reaped* (the
//! `RUSAGE_CHILDREN` rule): grandchildren count once their parent waited for them, which is
//! the normal case for shells and `sysbench`/`stress-ng` workers.

use std::process::Child;
use std::time::Instant;

use anyhow::Context;
use gleaner_os::cpuset::CpuSet;
use gleaner_os::procfs::{ProcStat, Procfs};
use gleaner_os::rusage::{self, Rusage};
use gleaner_os::sched;
use gleaner_os::sysfs::Sysfs;
use gleaner_policy::stats::percentile_sorted;
use serde::{Deserialize, Serialize};

/// Everything measured about one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunMetrics {
    /// Wall-clock time, ns.
    pub wall_ns: u64,
    /// User CPU time of the workload (all threads / whole process tree), ns.
    pub user_ns: u64,
    /// System CPU time, ns.
    pub sys_ns: u64,
    /// Voluntary context switches (blocking).
    pub vcsw: u64,
    /// Involuntary context switches (preemption).
    pub nivcsw: u64,
    /// vCPU idle entries on the measured CPUs during the run (cpuidle usage counters);
    /// `None` when the machine has no cpuidle (then see `idle_ns`).
    pub idle_entries: Option<u64>,
    /// Where `idle_entries` came from: `cpuidle` or `proc-stat` (idle time only).
    pub idle_source: String,
    /// Idle entries per second of wall time.
    pub idle_entries_per_s: Option<f64>,
    /// Idle time of the measured CPUs (`/proc/stat` idle + iowait), ns.
    pub idle_ns: u64,
    /// Busy time of the measured CPUs (`/proc/stat`), ns: includes other processes.
    pub busy_ns: u64,
    /// Steal time of the measured CPUs (`/proc/stat`), ns.
    pub steal_ns: u64,
    /// CPUs the workload was allowed to use (affinity of the measuring process).
    pub cpus_available: u32,
    /// Exit code of an external command (128 + signal when killed); `None` for kernels.
    pub exit_code: Option<i32>,
    /// Work items completed (kernels); `None` for external commands.
    pub items: Option<u64>,
    /// Items per second of wall time (kernels).
    pub throughput: Option<f64>,
    /// Peak resident set size, KiB (largest process of the tree for external commands).
    pub maxrss_kib: u64,
    /// Latency of each round or request of a latency kernel (`pingpong`, `openloop`); absent
    /// for throughput kernels and commands (documents without it read back as `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<LatencySummary>,
}

/// The latency distribution of one run of a latency kernel, exact from all its samples, ns.
/// Percentiles are type 7 (`gleaner_policy::stats`, linear interpolation between closest
/// ranks), so they can fall between two samples.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Samples: round trips (`pingpong`) or answered requests (`openloop`).
    pub samples: u64,
    pub mean_ns: f64,
    pub min_ns: u64,
    pub p50_ns: f64,
    pub p90_ns: f64,
    pub p99_ns: f64,
    /// The 99.9th percentile.
    pub p999_ns: f64,
    pub max_ns: u64,
    /// Open loop: the arrival rate asked for, requests/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_per_s: Option<f64>,
    /// Open loop: requests answered per second of the run's window (from the first scheduled
    /// arrival to the last reply, at least the requested duration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub achieved_per_s: Option<f64>,
    /// Open loop: how late the sender queued requests after their scheduled times (its timer
    /// wakeup), median and 99th percentile, ns; part of the latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_lag_p50_ns: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_lag_p99_ns: Option<f64>,
}

impl LatencySummary {
    /// The distribution of `samples_ns` (any order); `None` when there are none. The rates and
    /// send lags are left empty for the caller.
    pub fn of(samples_ns: &[u64]) -> Option<LatencySummary> {
        let mut sorted = samples_ns.to_vec();
        sorted.sort_unstable();
        let (&min_ns, &max_ns) = (sorted.first()?, sorted.last()?);
        let total: u128 = sorted.iter().map(|&x| u128::from(x)).sum();
        let as_f64: Vec<f64> = sorted.iter().map(|&x| x as f64).collect();
        let p = |q: f64| percentile_sorted(&as_f64, q).unwrap_or(f64::NAN);
        Some(LatencySummary {
            samples: u64::try_from(sorted.len()).unwrap_or(u64::MAX),
            mean_ns: total as f64 / as_f64.len() as f64,
            min_ns,
            p50_ns: p(50.0),
            p90_ns: p(90.0),
            p99_ns: p(99.0),
            p999_ns: p(99.9),
            max_ns,
            ..LatencySummary::default()
        })
    }
}

impl RunMetrics {
    /// User + system CPU time, ns (the cycle proxy of `bench overhead`); saturates (documents
    /// read back from a guest's output can hold any number).
    pub fn cpu_ns(&self) -> u64 {
        self.user_ns.saturating_add(self.sys_ns)
    }
}

/// What the system did between [`SystemMeter::start`] and [`SystemMeter::stop`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SystemDelta {
    pub wall_ns: u64,
    pub idle_entries: Option<u64>,
    pub idle_source: String,
    pub steal_ns: u64,
    pub idle_ns: u64,
    pub busy_ns: u64,
    /// Per CPU: (cpu, busy ns, idle ns).
    pub per_cpu: Vec<(u32, u64, u64)>,
}

/// System counters sampled before a run, to be differenced after it.
#[derive(Debug)]
pub struct SystemMeter {
    procfs: Procfs,
    sysfs: Sysfs,
    cpus: CpuSet,
    started: Instant,
    stat: ProcStat,
    idle_entries: Option<u64>,
}

impl SystemMeter {
    /// Sample `/proc/stat` and the cpuidle counters of `cpus` now.
    pub fn start(procfs: &Procfs, sysfs: &Sysfs, cpus: &CpuSet) -> anyhow::Result<SystemMeter> {
        let idle_entries = sysfs.total_idle_entries(cpus).context("reading cpuidle counters")?;
        let stat = procfs.stat().context("reading CPU times")?;
        Ok(SystemMeter { procfs: procfs.clone(), sysfs: sysfs.clone(), cpus: cpus.clone(), started: Instant::now(), stat, idle_entries })
    }

    /// When the measurement started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Sample again and return the differences.
    pub fn stop(&self) -> anyhow::Result<SystemDelta> {
        let wall_ns = ns(self.started.elapsed());
        let stat = self.procfs.stat().context("reading CPU times")?;
        let idle_after = self.sysfs.total_idle_entries(&self.cpus).context("reading cpuidle counters")?;
        Ok(delta(&self.stat, &stat, self.idle_entries, idle_after, &self.cpus, wall_ns))
    }
}

/// The pure part of [`SystemMeter::stop`].
pub fn delta(
    before: &ProcStat,
    after: &ProcStat,
    idle_before: Option<u64>,
    idle_after: Option<u64>,
    cpus: &CpuSet,
    wall_ns: u64,
) -> SystemDelta {
    let clk = after.clk_tck;
    let mut d = SystemDelta { wall_ns, ..SystemDelta::default() };
    for cpu in cpus {
        let (Some(b), Some(a)) = (before.cpus.get(&cpu), after.cpus.get(&cpu)) else { continue };
        let x = a.delta(b);
        let (busy, idle) = (x.busy_ns(clk), x.idle_ns(clk));
        d.busy_ns += busy;
        d.idle_ns += idle;
        d.steal_ns += x.steal_ns(clk);
        d.per_cpu.push((cpu, busy, idle));
    }
    match (idle_before, idle_after) {
        (Some(b), Some(a)) => {
            d.idle_entries = Some(a.saturating_sub(b));
            d.idle_source = "cpuidle".into();
        }
        _ => d.idle_source = "proc-stat (idle time only, no entry counts)".into(),
    }
    d
}

fn ns(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn per_s(count: Option<u64>, wall_ns: u64) -> Option<f64> {
    count.filter(|_| wall_ns > 0).map(|c| c as f64 * 1e9 / wall_ns as f64)
}

/// Combine a rusage delta and a system delta.
pub fn metrics(r: &Rusage, sys: &SystemDelta, cpus_available: u32) -> RunMetrics {
    RunMetrics {
        wall_ns: sys.wall_ns,
        user_ns: r.user_ns,
        sys_ns: r.sys_ns,
        vcsw: r.nvcsw,
        nivcsw: r.nivcsw,
        idle_entries: sys.idle_entries,
        idle_source: sys.idle_source.clone(),
        idle_entries_per_s: per_s(sys.idle_entries, sys.wall_ns),
        idle_ns: sys.idle_ns,
        busy_ns: sys.busy_ns,
        steal_ns: sys.steal_ns,
        cpus_available,
        exit_code: None,
        items: None,
        throughput: None,
        maxrss_kib: r.maxrss_kib,
        latency: None,
    }
}

/// Wait for `child` (started after `meter`) with `wait4` and measure it: wall time from the
/// meter's start, rusage of the whole reaped process tree, system counters.
pub fn measure_child(child: Child, meter: SystemMeter) -> anyhow::Result<RunMetrics> {
    let pid = i32::try_from(child.id()).context("child pid out of range")?;
    // wait4 reaps the child; std's Child handle is dropped without waiting again.
    let (status, r) = rusage::wait4(pid).with_context(|| format!("waiting for child {pid}"))?;
    drop(child);
    let sys = meter.stop()?;
    let mut m = metrics(&r, &sys, cpu_count(&meter.cpus));
    m.exit_code = Some(status.code());
    Ok(m)
}

/// Run `f` in this process and measure it with `getrusage(RUSAGE_SELF)` (which includes
/// threads that already exited) and the system counters.
pub fn measure_in_process<T>(
    procfs: &Procfs,
    sysfs: &Sysfs,
    cpus: &CpuSet,
    f: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, RunMetrics)> {
    let r0 = rusage::self_rusage().context("getrusage")?;
    let meter = SystemMeter::start(procfs, sysfs, cpus)?;
    let out = f()?;
    let sys = meter.stop()?;
    let r1 = rusage::self_rusage().context("getrusage")?;
    let mut r = r1.delta(&r0);
    r.maxrss_kib = r1.maxrss_kib;
    Ok((out, metrics(&r, &sys, cpu_count(cpus))))
}

fn cpu_count(cpus: &CpuSet) -> u32 {
    u32::try_from(cpus.len()).unwrap_or(u32::MAX)
}

/// The CPUs this process may run on (its affinity), falling back to all online CPUs.
pub fn allowed_cpu_set() -> CpuSet {
    sched::affinity(0).ok().filter(|s| !s.is_empty()).or_else(|| Sysfs::new().online_cpus().ok()).unwrap_or_else(|| CpuSet::first_n(1))
}

/// [`allowed_cpu_set`] as a list.
pub fn allowed_cpus() -> Vec<u32> {
    allowed_cpu_set().to_vec()
}

/// Pin the calling thread to `cpu`.
pub fn pin_current_thread(cpu: u32) -> gleaner_os::Result<()> {
    sched::set_affinity(sched::gettid(), &std::iter::once(cpu).collect())
}

#[cfg(test)]
mod tests {
    /// Found with the `bench_json` fuzz target: a bench document whose run has `user_ns` near
    /// `u64::MAX` overflowed `cpu_ns` when the lab filled its result row (a panic with overflow
    /// checks, a tiny wrapped CPU time without).
    #[test]
    fn cpu_ns_of_huge_user_and_sys_times_saturates_not_overflows() {
        let r = super::RunMetrics { user_ns: u64::MAX, sys_ns: 5, ..Default::default() };
        assert_eq!(r.cpu_ns(), u64::MAX);
        assert_eq!(super::RunMetrics { user_ns: 7, sys_ns: 5, ..Default::default() }.cpu_ns(), 12);
    }

    use super::*;
    use gleaner_os::procfs::CpuTimes;

    fn stat(entries: &[(u32, u64, u64, u64)]) -> ProcStat {
        let mut s = ProcStat { clk_tck: 100, ..ProcStat::default() };
        for &(cpu, user, idle, steal) in entries {
            s.cpus.insert(cpu, CpuTimes { user, idle, steal, ..CpuTimes::default() });
        }
        s
    }

    #[test]
    fn delta_sums_selected_cpus_only() {
        let before = stat(&[(0, 100, 1000, 5), (1, 100, 1000, 5)]);
        let after = stat(&[(0, 150, 1050, 7), (1, 300, 1000, 5)]);
        let cpus: CpuSet = [0].into_iter().collect();
        let d = delta(&before, &after, Some(10), Some(25), &cpus, 1_000_000_000);
        assert_eq!(d.idle_entries, Some(15));
        assert_eq!(d.idle_source, "cpuidle");
        assert_eq!(d.steal_ns, 2 * 10_000_000);
        assert_eq!(d.idle_ns, 50 * 10_000_000);
        assert_eq!(d.per_cpu.len(), 1);
    }

    #[test]
    fn latency_summary_of_samples_matches_hand_computation() {
        // 1..=1000 shuffled: type-7 percentiles h = 999 p / 100 from the value 1.
        let mut v: Vec<u64> = (1..=1000).collect();
        v.reverse();
        v.swap(3, 700);
        let s = LatencySummary::of(&v).unwrap();
        assert_eq!((s.samples, s.min_ns, s.max_ns), (1000, 1, 1000));
        assert_eq!(s.mean_ns, 500.5);
        assert_eq!(s.p50_ns, 500.5);
        assert!((s.p90_ns - 900.1).abs() < 1e-9, "{}", s.p90_ns);
        assert!((s.p99_ns - 990.01).abs() < 1e-9, "{}", s.p99_ns);
        assert!((s.p999_ns - 999.001).abs() < 1e-9, "{}", s.p999_ns);
        assert_eq!(s.requested_per_s, None);
        assert_eq!(LatencySummary::of(&[]), None);
        let one = LatencySummary::of(&[7]).unwrap();
        assert_eq!((one.p50_ns, one.p999_ns, one.mean_ns), (7.0, 7.0, 7.0));
        // No overflow with huge samples.
        assert_eq!(LatencySummary::of(&[u64::MAX, u64::MAX]).unwrap().max_ns, u64::MAX);
    }

    /// Documents written before the latency kernels have no `latency` key: they still read,
    /// and runs without latency are written exactly as before (no key at all).
    #[test]
    fn run_metrics_without_latency_read_and_write_as_before() {
        let old = r#"{"wall_ns":100,"user_ns":50,"sys_ns":5,"vcsw":1,"nivcsw":0,"idle_entries":null,
            "idle_source":"cpuidle","idle_entries_per_s":null,"idle_ns":0,"busy_ns":0,"steal_ns":0,
            "cpus_available":2,"exit_code":null,"items":10,"throughput":null,"maxrss_kib":0}"#;
        let r: RunMetrics = serde_json::from_str(old).unwrap();
        assert_eq!(r.latency, None);
        assert_eq!(r.items, Some(10));
        let json = serde_json::to_string(&r).unwrap();
        assert!(!json.contains("latency"), "{json}");
        assert_eq!(serde_json::from_str::<RunMetrics>(&json).unwrap(), r);
    }

    #[test]
    fn run_metrics_with_latency_round_trip() {
        let mut lat = LatencySummary::of(&[10, 20, 30, 40_000]).unwrap();
        lat.requested_per_s = Some(2000.0);
        lat.achieved_per_s = Some(1987.5);
        lat.send_lag_p50_ns = Some(3.5);
        lat.send_lag_p99_ns = Some(90.0);
        let r = RunMetrics { wall_ns: 5, items: Some(4), latency: Some(lat), ..Default::default() };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["latency"]["p50_ns"], 25.0);
        assert_eq!(v["latency"]["max_ns"], 40_000);
        assert_eq!(v["latency"]["achieved_per_s"], 1987.5);
        assert_eq!(serde_json::from_value::<RunMetrics>(v).unwrap(), r);
        // A closed-loop kernel's summary has no rate keys.
        let closed = serde_json::to_string(&LatencySummary::of(&[5]).unwrap()).unwrap();
        assert!(!closed.contains("per_s") && !closed.contains("send_lag"), "{closed}");
    }

    #[test]
    fn delta_without_cpuidle_falls_back_to_proc_stat() {
        let s = stat(&[(0, 0, 0, 0)]);
        let d = delta(&s, &s, None, None, &[0].into_iter().collect(), 1);
        assert_eq!(d.idle_entries, None);
        assert!(d.idle_source.starts_with("proc-stat"));
    }
}
