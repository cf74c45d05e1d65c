//! The command handlers of `gleaner host`, one file each. They take resolved options
//! (`crate::cli`), never raw flags, and share the output helpers below.

pub mod calibrate;
pub mod classify;
pub mod discover;
pub mod restore;
pub mod run;
pub mod status;

use gleaner_os::cpuset::CpuSet;
use gleaner_os::sysfs::Sysfs;
use gleaner_os::BadInput;
use gleaner_policy::aql::{Classification, Plan, PlanDiff, Topology};
use serde::Serialize;

pub(crate) fn print_json<T: Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

pub(crate) fn fmt_class(c: &Option<Classification>) -> String {
    match c {
        None => "no period yet".into(),
        Some(c) => {
            let a = &c.averages;
            let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
            format!(
                "{:8}{} IOInt {} ConSpin {} LLCF {} LoLCF {} LLCO {}{}",
                c.class.name(),
                if c.trashing { "+" } else { " " },
                f(a.io_int),
                f(a.con_spin),
                f(a.cache.map(|k| k.llcf)),
                f(a.cache.map(|k| k.lolcf)),
                f(a.cache.map(|k| k.llco)),
                if c.missing.is_empty() { String::new() } else { format!("  missing: {:?}", c.missing) }
            )
        }
    }
}

pub(crate) fn print_plan(plan: &Plan, diff: &PlanDiff) {
    for p in &plan.pools {
        let members: Vec<String> = p.vcpus.iter().map(|v| v.to_string()).collect();
        println!(
            "pool {:14} pCPUs {:8} quantum {:>6.1} ms  vCPUs {}",
            p.name,
            CpuSet::from_iter(p.pcpus.iter().copied()).to_string(),
            p.quantum_ns as f64 / 1e6,
            members.join(" ")
        );
    }
    println!(
        "changes: {} pools added, {} removed, {} changed, {} vCPU moves",
        diff.pools_added.len(),
        diff.pools_removed.len(),
        diff.pools_changed.len(),
        diff.moves.len()
    );
}

/// The pCPUs available to pools, by socket: `cpus` (default: all online) minus `reserve`,
/// grouped by the package ids sysfs reports.
pub fn topology(cpus: Option<&CpuSet>, reserve: Option<&CpuSet>, sysfs: &Sysfs) -> anyhow::Result<Topology> {
    let online = sysfs.online_cpus()?;
    let mut set = cpus.unwrap_or(&online).clone();
    if !set.is_subset(&online) {
        return Err(BadInput::new("--cpus", set, format!("online CPUs ({online})")).into());
    }
    if let Some(r) = reserve {
        set = set.difference(r);
    }
    if set.is_empty() {
        return Err(BadInput::new("--cpus/--reserve-cpus", "(no CPU left)", "at least one CPU for the pools").into());
    }
    Ok(Topology { sockets: sysfs.cpus_by_package(&set)?.into_values().map(|s| s.to_vec()).collect() })
}
