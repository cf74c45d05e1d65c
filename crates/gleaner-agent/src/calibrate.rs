//! Start-up calibration of the retention timeout from a measured vCPU wakeup on this machine.

use gleaner_os::cpuset::CpuSet;

/// Median wakeup latency (ns) of a blocked thread on another vCPU when that vCPU halts
/// (setting C) and when a yielding thread keeps it busy (setting B).
pub fn wakeup_costs(_cpus: &CpuSet) -> anyhow::Result<(u64, u64)> {
    anyhow::bail!("wakeup benchmark not available yet")
}
