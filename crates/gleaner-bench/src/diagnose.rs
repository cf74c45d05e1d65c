//! `gleaner diagnose`: does this machine suffer from the blocked-waiter wakeup (BWW)
//! problem?
//!
//! It reads the configuration (virtualization, cpuidle driver/governor, guest halt-poll
//! parameters, `idle=` boot options, steal time), measures a quick wakeup latency in
//! settings B (waiter's vCPU kept busy) and C (waiter's vCPU idle, halts) and the vCPU
//! idle-transition rate under the built-in `pipeline` kernel, then gives a verdict from the
//! C/B ratio: how much more a wakeup costs when the target vCPU has halted.
//!
//! ```text
//!   C/B >= 2.0  -> high      (halted vCPUs are expensive to wake: Gleaner's case)
//!   C/B >= 1.3  -> moderate
//!   otherwise   -> low
//! ```

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::Context;
use gleaner_measure::measure;
use gleaner_measure::wakeup::{self, Setting, SettingResult, WakeupConfig};
use gleaner_os::cpuset::CpuSet;
use gleaner_os::procfs::Procfs;
use gleaner_os::sysfs::Sysfs;
use serde::{Deserialize, Serialize};

use crate::workload::{self, Workload, WorkloadParams};
use crate::DiagnoseArgs;

/// Exposure to the BWW problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Exposure {
    High,
    Moderate,
    Low,
}

/// Thresholds of the verdict on the C/B p50 ratio.
pub const HIGH_RATIO: f64 = 2.0;
pub const MODERATE_RATIO: f64 = 1.3;

/// The verdict from the C/B ratio (pure).
pub fn exposure(c_over_b: Option<f64>, virtualized: bool) -> Exposure {
    match c_over_b {
        Some(r) if r >= HIGH_RATIO => Exposure::High,
        Some(r) if r >= MODERATE_RATIO => Exposure::Moderate,
        Some(_) => Exposure::Low,
        // No measurement (one CPU): a VM is at least moderately exposed.
        None if virtualized => Exposure::Moderate,
        None => Exposure::Low,
    }
}

/// Everything `diagnose` found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DiagnoseReport {
    pub virtualized: bool,
    pub hypervisor: Option<String>,
    pub evidence: Vec<String>,
    pub cpus: u32,
    pub cpuidle_driver: Option<String>,
    pub cpuidle_governor: Option<String>,
    /// Idle states of the first CPU: name and whether disabled.
    pub idle_states: Vec<(String, bool)>,
    /// `haltpoll` module parameters (guest halt polling), empty when not loaded.
    pub haltpoll_params: BTreeMap<String, String>,
    /// `cpuidle_haltpoll` module parameters.
    pub cpuidle_haltpoll_params: BTreeMap<String, String>,
    /// Idle-related kernel boot options (`idle=`, `*haltpoll*`, `*max_cstate*`, `nohz*`).
    pub boot_idle_options: Vec<String>,
    /// Steal time as a fraction of all CPU time since boot.
    pub steal_fraction_since_boot: f64,
    /// Steal time as a fraction of CPU time during the diagnosis.
    pub steal_fraction_now: f64,
    pub wakeup_b: Option<SettingResult>,
    pub wakeup_c: Option<SettingResult>,
    /// p50(C) / p50(B).
    pub c_over_b: Option<f64>,
    /// Idle fraction of the waiter's CPU during setting C (low: other load kept it from
    /// halting, so C understates the cost of waking a halted vCPU).
    pub c_waiter_cpu_idle_fraction: Option<f64>,
    /// vCPU idle entries per second under the built-in pipeline kernel.
    pub pipeline_idle_entries_per_s: Option<f64>,
    pub pipeline_wall_ms: f64,
    pub exposure: Exposure,
    /// False when other load kept the waiter's CPU from idling during C (the ratio then
    /// understates the exposure).
    pub verdict_reliable: bool,
    pub recommendations: Vec<String>,
}

fn steal_fraction(t: &gleaner_os::procfs::CpuTimes) -> f64 {
    let total = t.total_ticks();
    if total == 0 {
        0.0
    } else {
        t.steal as f64 / total as f64
    }
}

fn boot_idle_options(cmdline: &str) -> Vec<String> {
    cmdline
        .split_whitespace()
        .take_while(|w| *w != "--")
        .filter(|w| w.starts_with("idle=") || w.contains("haltpoll") || w.contains("max_cstate") || w.starts_with("nohz"))
        .map(str::to_string)
        .collect()
}

fn recommendations(r: &DiagnoseReport) -> Vec<String> {
    let mut out = Vec::new();
    if !r.virtualized && r.exposure == Exposure::Low {
        out.push("Not a VM and wakeups of idle CPUs are cheap: the blocked-waiter wakeup problem does not apply.".into());
        return out;
    }
    if r.exposure != Exposure::Low {
        out.push("Run synchronization-heavy programs under `gleaner run -- CMD`: yielding threads keep vCPUs from halting during short idle periods and consolidation packs the workload onto fewer vCPUs.".into());
        out.push("Measure the effect on your program with `gleaner compare -- CMD` (stock vs gleaner, side by side).".into());
    }
    if let Some(ns) = r.haltpoll_params.get("guest_halt_poll_ns") {
        if ns.trim() == "0" {
            out.push("Guest halt polling is off (haltpoll.guest_halt_poll_ns=0): a root user can enable it (e.g. echo 200000 > /sys/module/haltpoll/parameters/guest_halt_poll_ns); it trades CPU time for shorter wakeups, like the yielding threads but without a workload-aware timeout.".into());
        }
    } else if r.virtualized && r.cpuidle_driver.as_deref() != Some("haltpoll") {
        out.push("The cpuidle-haltpoll driver is not in use; on KVM guests it polls before halting (modprobe cpuidle-haltpoll or boot with cpuidle_haltpoll.force=1).".into());
    }
    if r.boot_idle_options.iter().any(|o| o == "idle=poll") {
        out.push("idle=poll is set: vCPUs never halt, which removes the problem at the cost of burning every idle cycle (harmful when pCPUs are shared).".into());
    }
    if r.steal_fraction_now > 0.05 || r.steal_fraction_since_boot > 0.05 {
        out.push(format!(
            "Steal time is high ({:.1}% now, {:.1}% since boot): the pCPUs are shared; always-on retention hurts there, so keep gleaner's yield timeout enabled.",
            r.steal_fraction_now * 100.0,
            r.steal_fraction_since_boot * 100.0
        ));
    }
    if let Some(f) = r.c_waiter_cpu_idle_fraction.filter(|f| *f < 0.5) {
        out.insert(0, format!(
            "Other load kept the waiter's CPU busy during setting C (idle only {:.0}% of the time), so it rarely halted: the C/B ratio understates the exposure. Run `gleaner diagnose` again on a quiet machine.",
            f * 100.0
        ));
    }
    if r.cpus < 2 {
        out.push("Only one vCPU: cross-vCPU wakeups do not happen; more vCPUs may expose the problem.".into());
    }
    out
}

/// Run the diagnosis.
pub fn diagnose(rounds: u32) -> anyhow::Result<DiagnoseReport> {
    let procfs = Procfs::new();
    let sysfs = Sysfs::new();
    let virt = gleaner_os::virt::detect(&procfs, &sysfs).context("detecting virtualization")?;
    let allowed = measure::allowed_cpu_set();
    let first = allowed.first().unwrap_or(0);
    let stat0 = procfs.stat().context("reading /proc/stat")?;

    let mut wb = None;
    let mut wc = None;
    let mut c_idle = None;
    if allowed.len() >= 2 {
        let mut cfg = WakeupConfig::for_cpus(&allowed);
        cfg.rounds = rounds;
        cfg.warmup = 10;
        eprintln!("diagnose: measuring wakeup latency (settings B and C, {rounds} rounds each)...");
        wb = Some(wakeup::run_setting(Setting::B, &cfg, &allowed, &procfs).context("setting B")?);
        // How idle the waiter's CPU was during C: other load keeps it from halting.
        let waiter: CpuSet = std::iter::once(cfg.waiter_cpu).collect();
        let meter = measure::SystemMeter::start(&procfs, &sysfs, &waiter)?;
        wc = Some(wakeup::run_setting(Setting::C, &cfg, &allowed, &procfs).context("setting C")?);
        let d = meter.stop()?;
        let total = d.idle_ns + d.busy_ns + d.steal_ns;
        c_idle = (total > 0).then(|| d.idle_ns as f64 / total as f64);
    }
    let c_over_b = match (&wb, &wc) {
        (Some(b), Some(c)) => match (b.p50_us, c.p50_us) {
            (Some(b), Some(c)) if b > 0.0 => Some(c / b),
            _ => None,
        },
        _ => None,
    };

    eprintln!("diagnose: running the pipeline kernel to measure the idle-transition rate...");
    let mut p = WorkloadParams::default_for(Workload::Pipeline);
    p.items /= 2;
    let ((), m) = measure::measure_in_process(&procfs, &sysfs, &allowed, || workload::run_workload(Workload::Pipeline, &p).map(|_| ()))?;
    let stat1 = procfs.stat().context("reading /proc/stat")?;

    let mut r = DiagnoseReport {
        virtualized: virt.virtualized,
        hypervisor: virt.hypervisor,
        evidence: virt.evidence,
        cpus: sysfs.online_cpus().map(|c| u32::try_from(c.len()).unwrap_or(0)).unwrap_or(0),
        cpuidle_driver: sysfs.cpuidle_driver().ok().flatten(),
        cpuidle_governor: sysfs.cpuidle_governor().ok().flatten(),
        idle_states: sysfs.cpuidle_states(first).unwrap_or_default().into_iter().map(|s| (s.name, s.disabled)).collect(),
        haltpoll_params: sysfs.module_params("haltpoll").unwrap_or_default(),
        cpuidle_haltpoll_params: sysfs.module_params("cpuidle_haltpoll").unwrap_or_default(),
        boot_idle_options: procfs.cmdline_kernel().map(|c| boot_idle_options(&c)).unwrap_or_default(),
        steal_fraction_since_boot: steal_fraction(&stat1.total),
        steal_fraction_now: steal_fraction(&stat1.total.delta(&stat0.total)),
        c_over_b,
        c_waiter_cpu_idle_fraction: c_idle,
        wakeup_b: wb,
        wakeup_c: wc,
        pipeline_idle_entries_per_s: m.idle_entries_per_s,
        pipeline_wall_ms: m.wall_ns as f64 / 1e6,
        exposure: Exposure::Low,
        verdict_reliable: c_idle.is_none_or(|f| f >= 0.5),
        recommendations: Vec::new(),
    };
    r.exposure = exposure(r.c_over_b, r.virtualized);
    r.recommendations = recommendations(&r);
    Ok(r)
}

fn print(r: &DiagnoseReport) {
    let or_none = |o: &Option<String>| o.clone().unwrap_or_else(|| "none".into());
    println!(
        "virtualized:        {}{}",
        if r.virtualized { "yes" } else { "no" },
        r.hypervisor.as_ref().map(|h| format!(" ({h})")).unwrap_or_default()
    );
    for e in &r.evidence {
        println!("  evidence:         {e}");
    }
    println!("CPUs:               {}", r.cpus);
    println!("cpuidle:            driver {}, governor {}", or_none(&r.cpuidle_driver), or_none(&r.cpuidle_governor));
    if !r.idle_states.is_empty() {
        let s: Vec<String> = r.idle_states.iter().map(|(n, d)| if *d { format!("{n} (disabled)") } else { n.clone() }).collect();
        println!("  idle states:      {}", s.join(", "));
    }
    let params = |m: &BTreeMap<String, String>| m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
    println!(
        "guest halt polling: {}",
        if r.haltpoll_params.is_empty() { "haltpoll module not loaded".into() } else { params(&r.haltpoll_params) }
    );
    if !r.cpuidle_haltpoll_params.is_empty() {
        println!("cpuidle_haltpoll:   {}", params(&r.cpuidle_haltpoll_params));
    }
    println!("idle boot options:  {}", if r.boot_idle_options.is_empty() { "none".into() } else { r.boot_idle_options.join(" ") });
    println!("steal time:         {:.2}% now, {:.2}% since boot", r.steal_fraction_now * 100.0, r.steal_fraction_since_boot * 100.0);
    for w in [&r.wakeup_b, &r.wakeup_c].into_iter().flatten() {
        println!(
            "wakeup {}:           p50 {:.1} us, mean {:.1} us, p99 {:.1} us ({} samples, {} discarded, {} lost) - {}",
            w.setting,
            w.p50_us.unwrap_or(f64::NAN),
            w.mean_us.unwrap_or(f64::NAN),
            w.p99_us.unwrap_or(f64::NAN),
            w.samples,
            w.discarded,
            w.lost,
            w.description
        );
    }
    match r.pipeline_idle_entries_per_s {
        Some(x) => println!("idle transitions:   {x:.0} vCPU idle entries/s under the pipeline kernel ({:.0} ms)", r.pipeline_wall_ms),
        None => println!("idle transitions:   no cpuidle counters on this machine"),
    }
    if let Some(f) = r.c_waiter_cpu_idle_fraction {
        println!("waiter CPU idle:    {:.0}% of the time during C", f * 100.0);
    }
    let ratio = r.c_over_b.map_or_else(|| "not measured".into(), |x| format!("C/B = {x:.2}"));
    let caveat = if r.verdict_reliable { "" } else { "; UNRELIABLE: measured under other load" };
    println!("exposure:           {:?} ({ratio}; high >= {HIGH_RATIO}, moderate >= {MODERATE_RATIO}{caveat})", r.exposure);
    for rec in &r.recommendations {
        println!("- {rec}");
    }
}

pub(crate) fn run(a: &DiagnoseArgs) -> anyhow::Result<ExitCode> {
    if a.rounds == 0 || a.rounds > 100_000 {
        return Err(gleaner_os::BadInput::new("--rounds", a.rounds, "1..=100000").into());
    }
    let r = diagnose(a.rounds)?;
    if a.json {
        let mut out = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut out, &r)?;
        std::io::Write::write_all(&mut out, b"\n")?;
    } else {
        print(&r);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_thresholds() {
        assert_eq!(exposure(Some(2.5), true), Exposure::High);
        assert_eq!(exposure(Some(2.0), true), Exposure::High);
        assert_eq!(exposure(Some(1.5), true), Exposure::Moderate);
        assert_eq!(exposure(Some(1.0), false), Exposure::Low);
        assert_eq!(exposure(None, true), Exposure::Moderate);
        assert_eq!(exposure(None, false), Exposure::Low);
    }

    #[test]
    fn boot_options_are_filtered_and_stop_at_init_args() {
        let c = "console=ttyS0 idle=poll cpuidle_haltpoll.force=1 haltpoll.guest_halt_poll_ns=0 quiet -- idle=halt";
        assert_eq!(boot_idle_options(c), vec!["idle=poll", "cpuidle_haltpoll.force=1", "haltpoll.guest_halt_poll_ns=0"]);
        assert!(boot_idle_options("").is_empty());
    }
}
