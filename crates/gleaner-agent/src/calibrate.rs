//! Calibration: the machine's wake-cost curve, measured once per boot with the same probe as
//! `gleaner bench wakeup` ([`crate::cache`] keeps it).
//!
//! ```text
//!  idle threshold   2000 sched_yield() with nothing else runnable -> 2 x p99 (>= 10 us)
//!  halted  C(g)     setting C after g = 10, 30, 100, 300 us, 1, 3, 10 ms, kernel polling off
//!                   (guest_halt_poll_ns 0; the waiter's resume latency limit lifted; under
//!                   menu/ladder its POLL state disabled)                        ~1.5 s
//!  busy    B        setting B: SCHED_IDLE yielders keep the waiter's vCPU busy, and
//!                   every other one but the waker's, as the agent runs them (where the
//!                   vCPUs share fewer host CPUs, the spinning ones delay the waiter)  ~0.1 s
//!  polling P        setting C with the waiter's vCPU polling (resume latency limit 0 on it),
//!                   where the machine has a POLL state                              ~0.3 s
//!  every knob: journaled before it changes, written back right after (KnobWriter)
//! ```
//!
//! Means, not medians: a workload pays every wakeup, and where the cost is in the tail the
//! median hides it (in the TCG lab next to a co-runner a busy vCPU woke in 60-100 us at the
//! median but 1.4-7 ms on average).

use anyhow::Context;
use gleaner_measure::wakeup::{self, Setting, SettingResult, WakeupConfig};
use gleaner_os::cpuset::CpuSet;
use gleaner_os::procfs::Procfs;
use gleaner_policy::idle::{CurvePoint, WakeCurve};
use gleaner_policy::num::saturating_u64;
use gleaner_policy::retention::idle_threshold_from_samples;

pub use gleaner_measure::calibration::measured_pair;
use gleaner_measure::calibration::{CalibrationResults, PollingControl};

pub use crate::knobs::Control;

/// Gaps (us) of the halted curve: log-spaced from 10 us to 10 ms.
pub const CURVE_GAPS_US: [u64; 7] = [10, 30, 100, 300, 1_000, 3_000, 10_000];

/// Most rounds per point.
const MAX_ROUNDS: u32 = 300;
/// Fewest rounds per point (the 10 ms gap).
const MIN_ROUNDS: u32 = 50;
/// Idle time spent per point, at most (rounds x gap), us.
const POINT_BUDGET_US: u64 = 400_000;
/// The gap of the busy and polling settings, us.
const SHORT_GAP_US: u64 = 300;

/// Rounds for a point with gap `gap_us`.
pub fn rounds_for(gap_us: u64) -> u32 {
    u32::try_from(POINT_BUDGET_US / gap_us.max(1)).unwrap_or(MAX_ROUNDS).clamp(MIN_ROUNDS, MAX_ROUNDS)
}

/// One setting measured on the two calibration vCPUs after `gap_us` of idleness.
pub fn measure_setting(cpus: &CpuSet, setting: Setting, gap_us: u64, rounds: u32) -> anyhow::Result<SettingResult> {
    if cpus.len() < 2 {
        anyhow::bail!("one CPU: no cross-vCPU wakeup to measure");
    }
    let mut cfg = WakeupConfig::for_cpus(cpus);
    cfg.settings = vec![setting];
    cfg.rounds = rounds;
    cfg.warmup = 10;
    cfg.period_us = gap_us.max(1);
    if setting == Setting::B {
        cfg.busy_also = cpus.iter().filter(|&c| c != cfg.waker_cpu && c != cfg.waiter_cpu).collect();
    }
    wakeup::run_setting(setting, &cfg, cpus, &Procfs::new()).context("measuring wakeup latency")
}

fn us_to_ns(us: f64) -> u64 {
    saturating_u64((us * 1000.0).round())
}

/// Mean and median (ns) of a measured setting.
fn mean_p50(r: &SettingResult) -> anyhow::Result<(u64, u64)> {
    let mean = r.mean_us.with_context(|| format!("no sample for setting {:?}", r.setting))?;
    Ok((us_to_ns(mean), us_to_ns(r.p50_us.unwrap_or(mean))))
}

/// Yields sampled for the idle threshold.
const IDLE_SAMPLES: usize = 2000;

/// Idle threshold when sampling gave nothing.
const DEFAULT_IDLE_THRESHOLD_NS: u64 = 20_000;

/// The idle threshold: twice the 99th percentile of yields with nothing else runnable.
pub fn idle_threshold_now() -> u64 {
    let samples = crate::yielders::sample_yields(IDLE_SAMPLES);
    idle_threshold_from_samples(&samples).unwrap_or(DEFAULT_IDLE_THRESHOLD_NS)
}

/// A calibration that could not measure the curve: nothing is stored, and retention has no
/// curve to plan from (it stays off and says why).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incomplete {
    pub idle_threshold_ns: u64,
    /// What failed, for the warning.
    pub error: String,
}

/// [`measure`] outside an agent's run (`gleaner calibrate`, `compare`, the daemon's refresh):
/// the idle knobs under a journal of its own in `run_dir`, guarded and undone after.
pub fn measure_journaled(run_dir: &std::path::Path, cpus: &CpuSet) -> Result<CalibrationResults, Incomplete> {
    crate::knobs::with_knob_journal(run_dir, cpus, |control, why| {
        if let Some(why) = &why {
            tracing::info!("calibrating without control of the idle knobs: {why}");
        }
        measure(cpus, control)
    })
}

/// The whole calibration (module documentation). Every knob changed is written back before
/// this returns, also on error.
pub fn measure(cpus: &CpuSet, mut control: Control<'_>) -> Result<CalibrationResults, Incomplete> {
    let idle_threshold_ns = idle_threshold_now();
    let result = measure_curve(cpus, &mut control);
    let restored = match &mut control {
        Some((w, _)) => w.restore_now(),
        None => Vec::new(),
    };
    let (curve, polling) = result.map_err(|e| Incomplete { idle_threshold_ns, error: format!("wake-cost calibration failed: {e:#}") })?;
    if !restored.is_empty() {
        return Err(Incomplete {
            idle_threshold_ns,
            error: format!("restoring the idle knobs after calibrating: {}", restored.join("; ")),
        });
    }
    Ok(CalibrationResults { curve, idle_threshold_ns, polling })
}

fn measure_curve(cpus: &CpuSet, control: &mut Control<'_>) -> anyhow::Result<(WakeCurve, PollingControl)> {
    let (_, waiter) = measured_pair(cpus);
    let halted_how = match control {
        Some((w, j)) => w.polling_off(j, waiter)?,
        None => "as found (no control of the idle knobs)".into(),
    };
    let mut halted = Vec::with_capacity(CURVE_GAPS_US.len());
    for gap in CURVE_GAPS_US {
        let r = measure_setting(cpus, Setting::C, gap, rounds_for(gap))?;
        let (mean_ns, p50_ns) = mean_p50(&r)?;
        halted.push(CurvePoint { gap_ns: gap * 1000, mean_ns, p50_ns });
    }
    let (busy_ns, _) = mean_p50(&measure_setting(cpus, Setting::B, SHORT_GAP_US, MAX_ROUNDS)?)?;
    let (poll_ns, poll_how) = match control {
        Some((w, j)) => match w.polling_on(j, waiter)? {
            Some(how) => {
                crate::seam::stop_at(crate::seam::MEASURING_POLL);
                let (p, _) = mean_p50(&measure_setting(cpus, Setting::C, SHORT_GAP_US, MAX_ROUNDS)?)?;
                (Some(p), how)
            }
            None => (None, "not measured: no POLL state".into()),
        },
        None => (None, "not measured: no control of the idle knobs".into()),
    };
    Ok((WakeCurve::new(halted, busy_ns, poll_ns), PollingControl { halted: halted_how, poll: poll_how }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_cover_short_gaps_fully_and_bound_long_ones() {
        assert_eq!(rounds_for(10), MAX_ROUNDS);
        assert_eq!(rounds_for(3_000), 133);
        assert_eq!(rounds_for(10_000), MIN_ROUNDS);
        let total_us: u64 = CURVE_GAPS_US.iter().map(|&g| g * u64::from(rounds_for(g))).sum();
        assert!(total_us < 2_000_000, "the halted curve idles {total_us} us");
    }
}
