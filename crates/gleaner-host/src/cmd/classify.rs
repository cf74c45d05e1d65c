//! `gleaner host classify`: one window of monitoring, then each vCPU's cursors and type.

use std::process::ExitCode;

use gleaner_os::sysfs::Sysfs;

use super::{fmt_class, print_json, topology};
use crate::cli::MonitorOptions;
use crate::config::HostConfig;
use crate::host_loop::{controller_config, HostLoop, Pacer};

pub fn cmd_classify(m: &MonitorOptions, json: bool) -> anyhow::Result<ExitCode> {
    let cfg = HostConfig::load(m.config.as_deref())?;
    let topo = topology(None, None, &Sysfs::new())?;
    let mut e = HostLoop::new(m.filter.clone(), controller_config(m, cfg.config.limits, topo, cfg.config.quanta))?;
    // One baseline sample plus `window` periods.
    let mut pacer = Pacer::new(m.period);
    e.sample()?;
    for _ in 0..=m.window {
        pacer.wait();
        e.step()?;
    }
    let reports = e.reports();
    let sources = e.sources();
    if json {
        print_json(&serde_json::json!({
            "period_ms": m.period.as_millis(), "window": m.window,
            "limits": cfg.config.limits, "sources": sources, "vcpus": reports, "vm_io": e.vm_io(),
        }))?;
    } else {
        println!("sources: I/O: {}\n         spin: {}\n         LLC: {}", sources.io, sources.spin, sources.llc);
        for r in &reports {
            println!("{} vCPU {} (tid {}): {}", r.vm, r.vcpu, r.tid, fmt_class(&r.classification));
        }
        for v in e.vm_io() {
            println!(
                "VM pid {}: other threads {} syscalls, {} voluntary switches in the last period",
                v.pid, v.syscalls, v.voluntary_switches
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
