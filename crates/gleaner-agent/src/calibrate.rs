//! Start-up calibration of the retention timeout from a measured vCPU wakeup on this machine
//! (the Gleaner paper sets the timeout "based on the cost incurred by context transitions if
//! hardware resources are released"). Uses the same measurement as `gleaner bench wakeup`.

use anyhow::Context;
use gleaner_bench::wakeup::{self, Setting, WakeupConfig};
use gleaner_os::cpuset::CpuSet;
use gleaner_os::procfs::Procfs;

/// Rounds per setting: about 0.2 s each with a 500 us period.
const ROUNDS: u32 = 300;

/// Median wakeup latency (ns) of a blocked thread on another vCPU when that vCPU halts
/// (setting C) and when a yielding thread keeps it busy (setting B).
pub fn wakeup_costs(cpus: &CpuSet) -> anyhow::Result<(u64, u64)> {
    if cpus.len() < 2 {
        anyhow::bail!("one CPU: no cross-vCPU wakeup to measure");
    }
    let mut cfg = WakeupConfig::for_cpus(cpus);
    cfg.settings = vec![Setting::C, Setting::B];
    cfg.rounds = ROUNDS;
    cfg.warmup = 10;
    cfg.period_us = 500;
    let results = wakeup::run(&cfg, cpus, &Procfs::new()).context("measuring wakeup latency")?;
    let p50 = |s: Setting| -> anyhow::Result<u64> {
        let r = results.iter().find(|r| r.setting == s).context("setting missing from the result")?;
        let us = r.p50_us.with_context(|| format!("no sample for setting {s:?}"))?;
        Ok((us * 1000.0).round() as u64)
    };
    Ok((p50(Setting::C)?, p50(Setting::B)?))
}
