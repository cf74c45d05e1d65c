//! Calibration of the retention timeout from a measured vCPU wakeup on this machine (the
//! Gleaner paper sets the timeout "based on the cost incurred by context transitions if
//! hardware resources are released"). Uses the same measurement as `gleaner bench wakeup`.
//!
//! [`measure`] is the whole calibration (about 0.5 s); [`crate::cache`] keeps its result per
//! boot so that agents measure once, not at every start.

use anyhow::Context;
use gleaner_measure::wakeup::{self, Setting, WakeupConfig};
use gleaner_os::cpuset::CpuSet;
use gleaner_os::procfs::Procfs;
use gleaner_policy::retention::{idle_threshold_from_samples, retention_verdict, timeout_from_wakeup, WakeupCosts};

use crate::cache::CalibrationResults;

/// Rounds per setting: about 0.2 s each with a 500 us period.
const ROUNDS: u32 = 300;

/// An idle period long enough for a halted vCPU to be descheduled by the host.
pub const LONG_GAP_US: u64 = 500;

/// Mean wakeup latency (ns) of a blocked thread on another vCPU, per setting, with the
/// waiter's vCPU left idle for `gap_us` before each wakeup. The mean, not the median: a
/// workload pays every wakeup, and where the cost is in the tail the median hides it. In the
/// TCG lab next to a co-runner VM a vCPU kept busy by a yielder woke in 60-100 us at the
/// median but 1.4-7 ms on average (its vCPU thread waits for its turn on the host), and a
/// median-based verdict said `Pays` where retention cost 20-30% of the run.
pub fn mean_wakeups(cpus: &CpuSet, settings: &[Setting], gap_us: u64) -> anyhow::Result<Vec<u64>> {
    if cpus.len() < 2 {
        anyhow::bail!("one CPU: no cross-vCPU wakeup to measure");
    }
    let mut cfg = WakeupConfig::for_cpus(cpus);
    cfg.settings = settings.to_vec();
    cfg.rounds = ROUNDS;
    cfg.warmup = 10;
    cfg.period_us = gap_us;
    let results = wakeup::run(&cfg, cpus, &Procfs::new()).context("measuring wakeup latency")?;
    settings
        .iter()
        .map(|&s| {
            let r = results.iter().find(|r| r.setting == s).context("setting missing from the result")?;
            let us = r.mean_us.with_context(|| format!("no sample for setting {s:?}"))?;
            // A mean latency: finite, >= 0 and far below u64::MAX ns (saturating anyway).
            Ok(gleaner_policy::num::saturating_u64((us * 1000.0).round()))
        })
        .collect()
}

/// Mean wakeup latency (ns) when the waiter's vCPU halts after a long idle period (setting
/// C, 500 us) and when a yielding thread keeps it busy (setting B).
pub fn wakeup_costs(cpus: &CpuSet) -> anyhow::Result<(u64, u64)> {
    let v = mean_wakeups(cpus, &[Setting::C, Setting::B], LONG_GAP_US)?;
    Ok((v[0], v[1]))
}

/// Mean wakeup latency (ns) of a halted vCPU that has been idle for `gap_us` (setting C).
pub fn idle_wakeup_after(cpus: &CpuSet, gap_us: u64) -> anyhow::Result<u64> {
    Ok(mean_wakeups(cpus, &[Setting::C], gap_us.max(1))?[0])
}

/// Yields sampled for the idle threshold.
const IDLE_SAMPLES: usize = 2000;

/// Idle threshold when sampling gave nothing.
const DEFAULT_IDLE_THRESHOLD_NS: u64 = 20_000;

/// Retention timeout when no wakeup could be measured.
pub const DEFAULT_TIMEOUT_NS: u64 = 100_000;

/// The two vCPUs the wakeup measurement uses for `cpus`: (waker, waiter).
pub fn measured_pair(cpus: &CpuSet) -> (u32, u32) {
    let c = WakeupConfig::for_cpus(cpus);
    (c.waker_cpu, c.waiter_cpu)
}

/// The idle threshold: twice the 99th percentile of yields with nothing else runnable.
pub fn idle_threshold_now() -> u64 {
    let samples = crate::yielders::sample_yields(IDLE_SAMPLES);
    idle_threshold_from_samples(&samples).unwrap_or(DEFAULT_IDLE_THRESHOLD_NS)
}

/// A calibration that could not measure everything: retention runs with this timeout, and
/// nothing is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incomplete {
    pub timeout_ns: u64,
    pub idle_threshold_ns: u64,
    /// What failed, for the warning.
    pub error: String,
}

/// The whole calibration: settings B and C after a long gap, the timeout from them, setting C
/// after exactly the timeout (does the host poll that long?), the verdict, and the idle
/// threshold. Where a wakeup cannot be measured (one CPU) retention falls back to retaining
/// with a default timeout (no wakeups) or the calibrated one (no host-polling check).
pub fn measure(cpus: &CpuSet) -> Result<CalibrationResults, Incomplete> {
    let idle_threshold_ns = idle_threshold_now();
    let incomplete = |timeout_ns, error: String| Incomplete { timeout_ns, idle_threshold_ns, error };
    let (idle, busy) =
        wakeup_costs(cpus).map_err(|e| incomplete(DEFAULT_TIMEOUT_NS, format!("wakeup calibration failed ({e:#}); using 100 us")))?;
    let timeout_ns = timeout_from_wakeup(idle, busy);
    let at_t = idle_wakeup_after(cpus, timeout_ns / 1000)
        .map_err(|e| incomplete(timeout_ns, format!("host polling check failed ({e:#}); retaining")))?;
    let wakeup_costs = WakeupCosts { busy_ns: busy, idle_long_ns: idle, idle_at_timeout_ns: at_t };
    Ok(CalibrationResults { wakeup_costs, timeout_ns, idle_threshold_ns, verdict: retention_verdict(&wakeup_costs) })
}
