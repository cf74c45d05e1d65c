//! `gleaner host run`: the AQL loop applied to the host until stopped, as named phases.
//!
//! ```text
//!  setup:  config, topology, HostLoop, metrics endpoint, actuator (state file), signals
//!  every period:  sample -> decide (AqlController) -> apply (Actuator) -> publish (metrics, log)
//!  end:    restore everything, report
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use gleaner_os::cgroup::Cgroups;
use gleaner_os::procfs::Procfs;
use gleaner_os::sysfs::Sysfs;
use gleaner_policy::aql::{self, Classification, Plan, PlanDiff, Topology, VcpuId};
use serde::Serialize;

use super::{fmt_class, print_json, print_plan, topology};
use crate::actuate::{Actuator, Placement};
use crate::cli::RunOptions;
use crate::config::HostConfig;
use crate::discover::Vm;
use crate::host_loop::{controller_config, HostLoop, Pacer, VcpuReport};
use crate::metrics::Metrics;
use crate::monitor::SourceReport;

/// What `run` prints.
#[derive(Debug, Serialize)]
struct RunReport {
    dry_run: bool,
    config: Option<PathBuf>,
    quanta: aql::Quanta,
    topology: Topology,
    sources: SourceReport,
    periods: u64,
    plans_applied: u64,
    plan: Plan,
    changes: PlanDiff,
    vcpus: Vec<VcpuReport>,
    warnings: Vec<String>,
    restored: bool,
}

/// Entry point of `gleaner host run`.
pub fn cmd_run(a: &RunOptions) -> anyhow::Result<ExitCode> {
    let cfg = HostConfig::load(a.monitor.config.as_deref())?;
    let quanta = cfg.config.quanta;
    let topo = topology(a.cpus.as_ref(), a.reserve_cpus.as_ref(), &Sysfs::new())?;
    let host = HostLoop::new(a.monitor.filter.clone(), controller_config(&a.monitor, cfg.config.limits, topo.clone(), quanta))?;
    let metrics = serve_metrics(a)?;
    let actuator = open_actuator(a)?;
    gleaner_os::signal::clear();
    gleaner_os::signal::catch_stop_signals(gleaner_os::signal::InterruptedCalls::Restart).context("installing signal handlers")?;
    let mut run = Run {
        opts: a,
        host,
        metrics,
        actuator,
        started: Instant::now(),
        periods: 0,
        applied: 0,
        last_diff: PlanDiff::default(),
        dry_plan: None,
    };
    let result = run.periods();
    let (warnings, restored) = run.restore();
    result?;
    let report = RunReport {
        dry_run: a.dry_run,
        config: cfg.path,
        quanta,
        topology: topo,
        sources: run.host.sources(),
        periods: run.periods,
        plans_applied: run.applied,
        plan: run.dry_plan.take().unwrap_or_else(|| run.host.current_plan().clone()),
        changes: std::mem::take(&mut run.last_diff),
        vcpus: run.host.reports(),
        warnings,
        restored,
    };
    print_report(&report, a.json)?;
    Ok(if restored { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Starts the Prometheus endpoint when asked for one.
fn serve_metrics(a: &RunOptions) -> anyhow::Result<Metrics> {
    let metrics = Metrics::new();
    if let Some(addr) = a.metrics_addr {
        let local = metrics.serve(addr)?;
        if let Some(w) = gleaner_os::input::metrics_exposure(local) {
            eprintln!("gleaner host: warning: {w}");
        }
        eprintln!("gleaner host: metrics on http://{local}/metrics");
    }
    Ok(metrics)
}

/// The actuator (cgroups and state file), none on a dry run.
fn open_actuator(a: &RunOptions) -> anyhow::Result<Option<Actuator>> {
    if a.dry_run {
        return Ok(None);
    }
    let cg = Cgroups::detect().context("a cpuset cgroup controller is needed for pools")?;
    Ok(Some(Actuator::open(cg, Procfs::new(), a.state.clone())?))
}

/// A run in progress.
struct Run<'a> {
    opts: &'a RunOptions,
    host: HostLoop,
    metrics: Metrics,
    actuator: Option<Actuator>,
    started: Instant,
    periods: u64,
    applied: u64,
    last_diff: PlanDiff,
    /// The first plan, on a dry run.
    dry_plan: Option<Plan>,
}

impl Run<'_> {
    /// The loop: a baseline sample, then sample -> decide -> publish -> apply every period
    /// until a stop signal, the duration, the last VM's exit, or (dry run) the first plan.
    fn periods(&mut self) -> anyhow::Result<()> {
        let mut pacer = Pacer::new(self.opts.monitor.period);
        self.host.sample()?; // baseline
        loop {
            pacer.wait();
            if gleaner_os::signal::stop_requested() {
                return Ok(());
            }
            let readings = self.host.sample()?;
            let decision = self.host.decide(&readings);
            self.periods += 1;
            self.metrics.period();
            if let Some(d) = decision {
                self.publish(&d);
                if self.opts.dry_run {
                    self.last_diff = d.diff;
                    self.dry_plan = Some(d.plan);
                    return Ok(());
                }
                // The controller applies a vCPU's change of type once two consecutive windows agree on it.
                if d.apply {
                    self.apply(d)?;
                }
            }
            if self.finished() {
                return Ok(());
            }
        }
    }

    /// Exports the decision: each vCPU's class and the plan, as metrics.
    fn publish(&self, d: &aql::Decision) {
        let classes: Vec<(VcpuId, String, Classification)> = self
            .host
            .reports()
            .into_iter()
            .filter_map(|r| Some((VcpuId { vm: u64::try_from(r.pid).ok()?, vcpu: r.vcpu }, r.vm, r.classification?)))
            .collect();
        self.metrics.update(&classes, &d.plan, !d.diff.is_empty());
    }

    /// Brings the host to the decision's plan.
    fn apply(&mut self, d: aql::Decision) -> anyhow::Result<()> {
        if let Some(act) = self.actuator.as_mut() {
            act.apply(&d.plan, &placements(&d.plan, self.host.vms()))?;
        }
        self.applied += 1;
        tracing::info!(pools = d.plan.pools.len(), moves = d.diff.moves.len(), "plan applied");
        if !self.opts.json {
            eprintln!("gleaner host: plan {}: {} pools, {} vCPU moves", self.applied, d.plan.pools.len(), d.diff.moves.len());
        }
        self.last_diff = d.diff;
        Ok(())
    }

    /// True once the duration is over, or no VM is left when told to stop then.
    fn finished(&self) -> bool {
        self.opts.duration.is_some_and(|d| self.started.elapsed() >= d) || (self.opts.exit_when_no_vms && self.host.vms().is_empty())
    }

    /// Undoes every change; returns the actuator's warnings and whether all was restored.
    fn restore(&mut self) -> (Vec<String>, bool) {
        let Some(act) = self.actuator.as_mut() else {
            return (Vec::new(), true);
        };
        let r = act.restore_all();
        if let Err(e) = &r {
            eprintln!("gleaner host: restore failed: {e:#}");
        }
        // After the restore: what could not be put back is among the warnings.
        (act.warnings.clone(), r.is_ok())
    }
}

/// Placements of a plan's vCPUs on the discovered threads.
fn placements(plan: &Plan, vms: &[Vm]) -> Vec<Placement> {
    let mut out = Vec::new();
    for a in &plan.assignment {
        let Some(vm) = vms.iter().find(|v| u64::try_from(v.pid).ok() == Some(a.vcpu.vm)) else { continue };
        if let Some(t) = vm.vcpus.iter().find(|t| t.index == a.vcpu.vcpu) {
            out.push(Placement { pid: vm.pid, tid: t.tid, pool: a.pool });
        }
    }
    out
}

fn print_report(report: &RunReport, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(report);
    }
    if report.dry_run {
        println!("dry run: nothing was changed");
    }
    for r in &report.vcpus {
        println!("{} vCPU {} (tid {}): {}", r.vm, r.vcpu, r.tid, fmt_class(&r.classification));
    }
    print_plan(&report.plan, &report.changes);
    println!("{} periods, {} plans applied, restored: {}", report.periods, report.plans_applied, report.restored);
    for w in &report.warnings {
        println!("warning: {w}");
    }
    Ok(())
}
