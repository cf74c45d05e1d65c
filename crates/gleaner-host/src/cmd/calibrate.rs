//! `gleaner host calibrate`: measure each type's best quantum and write the config.

use std::process::ExitCode;

use anyhow::Context;
use gleaner_os::sysfs::Sysfs;
use gleaner_os::BadInput;
use gleaner_policy::aql;

use super::print_json;
use crate::calibrate;
use crate::cli::CalibrateOptions;
use crate::config::HostConfig;

pub fn cmd_calibrate(a: &CalibrateOptions) -> anyhow::Result<ExitCode> {
    let sysfs = Sysfs::new();
    let online = sysfs.online_cpus()?;
    let cpu = a.cpu.or(online.last()).context("no online CPU")?;
    if !online.contains(cpu) {
        return Err(BadInput::new("--cpu", cpu, format!("an online CPU ({online})")).into());
    }
    let device_cpu = online.iter().find(|&c| c != cpu).unwrap_or(cpu);
    let llc = match a.llc_bytes {
        Some(b) => b,
        None => sysfs.llc_bytes(cpu)?.context("LLC size unknown in sysfs: pass --llc-bytes")?,
    };
    let l2 = sysfs.l2_bytes(cpu).unwrap_or(256 * 1024);
    let types = &a.types;
    let params = calibrate::CalibrationParams {
        cpu,
        device_cpu,
        slices_ms: a.slices_ms.clone(),
        duration_ms: u64::try_from(a.duration.as_millis()).unwrap_or(u64::MAX),
        repeats: a.repeats,
        competitors: a.competitors,
        llc_bytes: llc,
        l2_bytes: l2,
        agnostic_spread: a.agnostic_spread,
    };
    eprintln!("gleaner host calibrate: CPU {cpu}, {} competitors, LLC {} KiB, L2 {} KiB", a.competitors, llc / 1024, l2 / 1024);
    let cal = calibrate::calibrate(&params, types, |l| eprintln!("  {l}"))?;
    let quanta = cal.quanta();
    let written = match &a.out {
        None => None,
        Some(out) => {
            let cfg = HostConfig { quanta, limits: aql::Limits::default(), calibration: Some(cal.clone()) };
            cfg.save(out)?;
            Some(out.clone())
        }
    };
    if a.json {
        print_json(&serde_json::json!({ "calibration": cal, "quanta": quanta, "written": written }))?;
    } else {
        println!("type     {}", a.slices_ms.iter().map(|s| format!("{s:>7} ms")).collect::<String>());
        for t in types {
            let row: String = cal.points.iter().filter(|p| p.ty == *t).map(|p| format!("{:>10.3}", p.normalized)).collect();
            let b = cal.best.iter().find(|b| b.ty == *t);
            println!(
                "{:8} {row}   best {} ms{}",
                t.name(),
                b.map_or(0, |b| b.slice_ms),
                if b.is_some_and(|b| b.agnostic) { " (agnostic)" } else { "" }
            );
        }
        println!("(performance normalized to the 30 ms slice; higher is better)");
        if let Some(w) = written {
            println!("wrote {}", w.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
