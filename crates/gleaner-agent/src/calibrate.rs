//! Start-up calibration of the retention timeout from a measured vCPU wakeup on this machine
//! (the Gleaner paper sets the timeout "based on the cost incurred by context transitions if
//! hardware resources are released"). Uses the same measurement as `gleaner bench wakeup`.

use anyhow::Context;
use gleaner_bench::wakeup::{self, Setting, WakeupConfig};
use gleaner_os::cpuset::CpuSet;
use gleaner_os::procfs::Procfs;

/// Rounds per setting: about 0.2 s each with a 500 us period.
const ROUNDS: u32 = 300;

/// An idle period long enough for a halted vCPU to be descheduled by the host.
pub const LONG_GAP_US: u64 = 500;

/// Median wakeup latency (ns) of a blocked thread on another vCPU, per setting, with the
/// waiter's vCPU left idle for `gap_us` before each wakeup.
pub fn median_wakeups(cpus: &CpuSet, settings: &[Setting], gap_us: u64) -> anyhow::Result<Vec<u64>> {
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
            let us = r.p50_us.with_context(|| format!("no sample for setting {s:?}"))?;
            Ok((us * 1000.0).round() as u64)
        })
        .collect()
}

/// Median wakeup latency (ns) when the waiter's vCPU halts after a long idle period (setting
/// C, 500 us) and when a yielding thread keeps it busy (setting B).
pub fn wakeup_costs(cpus: &CpuSet) -> anyhow::Result<(u64, u64)> {
    let v = median_wakeups(cpus, &[Setting::C, Setting::B], LONG_GAP_US)?;
    Ok((v[0], v[1]))
}

/// Median wakeup latency (ns) of a halted vCPU that has been idle for `gap_us` (setting C).
pub fn idle_wakeup_after(cpus: &CpuSet, gap_us: u64) -> anyhow::Result<u64> {
    Ok(median_wakeups(cpus, &[Setting::C], gap_us.max(1))?[0])
}
