//! `gleaner host`: AQL_Sched (aql-sched.txt) for stock Linux/KVM hosts. vCPUs are typed
//! every period from what the host can see (I/O, spin, LLC counters where they exist), then
//! grouped into pCPU pools, each a cpuset cgroup whose vCPU threads run with the pool's EEVDF
//! slice. The policy is `gleaner_policy::aql`; this crate is the mechanism.
//!
//! ```text
//!  discover (/proc: QEMU "CPU n/KVM|TCG", Firecracker "fc_vcpu N", Cloud Hypervisor "vcpuN")
//!     -> monitor every period (/proc task io + schedstat, QMP query-stats, perf counters)
//!     -> AqlController (TypeRecognizer n = 4, plan: algorithms 1, 2, diff, confirmation) -> Actuator
//!                                                      cpusets gleaner-aql-*, sched_setattr slices,
//!                                                      state file /run/gleaner/host-state.json
//! ```

pub mod actuate;
pub mod calibrate;
pub mod cli;
pub mod config;
pub mod discover;
pub mod extra;
pub mod metrics;
pub mod monitor;
pub mod perf;
pub mod qmp;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use gleaner_os::cgroup::Cgroups;
use gleaner_os::cpuset::CpuSet;
use gleaner_os::procfs::Procfs;
use gleaner_os::sysfs::Sysfs;
use gleaner_os::BadInput;
use gleaner_policy::aql::{self, AqlController, Classification, ControllerConfig, Plan, PlanDiff, Topology, VcpuId};
use serde::Serialize;

use crate::actuate::{Actuator, Placement, State};
use crate::config::HostConfig;
use crate::discover::Vm;
use crate::extra::{CpuTopo, ProcExtra};
use crate::monitor::{Monitor, SourceReport, VmIo};

pub use crate::cli::{
    CalibrateArgs, ClassifyArgs, DiscoverArgs, HostArgs, HostCommand, MonitorArgs, RunArgs, StateArgs, VmFilter, STATE_PATH,
};
use crate::cli::{CalibrateOptions, MonitorOptions, RunOptions};

/// Entry point of `gleaner host`.
pub fn run(args: HostArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        HostCommand::Discover(a) => cmd_discover(a),
        HostCommand::Classify(a) => cmd_classify(&a.monitor.resolve()?, a.json),
        HostCommand::Run(a) => cmd_run(&a.resolve()?),
        HostCommand::Calibrate(a) => cmd_calibrate(&a.resolve()?),
        HostCommand::Status(a) => cmd_status(a),
        HostCommand::Restore(a) => cmd_restore(a),
    }
}

fn print_json<T: Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// VMs passing the filter.
pub fn find_vms(procfs: &Procfs, filter: &VmFilter) -> anyhow::Result<Vec<Vm>> {
    Ok(discover::discover(procfs)?.into_iter().filter(|v| filter.keep(v)).collect())
}

fn cmd_discover(a: DiscoverArgs) -> anyhow::Result<ExitCode> {
    let vms = find_vms(&Procfs::new(), &a.filter)?;
    if a.json {
        print_json(&serde_json::json!({ "vms": vms }))?;
    } else if vms.is_empty() {
        println!("no VM found (QEMU, Firecracker, Cloud Hypervisor)");
    } else {
        for vm in &vms {
            println!("{} pid {} {:?} accel {}", vm.name, vm.pid, vm.vmm, vm.accel.as_deref().unwrap_or("?"));
            for v in &vm.vcpus {
                println!("  vCPU {:2} tid {:7} {:12} ({:?})", v.index, v.tid, v.name, v.evidence);
            }
            if let Some(q) = &vm.qmp_socket {
                println!("  QMP {}", q.display());
            }
            for n in &vm.notes {
                println!("  note: {n}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One vCPU's verdict, for output.
#[derive(Debug, Clone, Serialize)]
pub struct VcpuReport {
    pub vm: String,
    pub pid: i32,
    pub vcpu: u32,
    pub tid: i32,
    pub io_source: Option<&'static str>,
    pub last: aql::VcpuCounters,
    pub classification: Option<Classification>,
}

/// The monitoring loop shared by `classify` and `run`: discovery, sampling, recognition.
struct Engine {
    procfs: Procfs,
    filter: VmFilter,
    monitor: Monitor,
    /// The whole AQL loop (gleaner_policy::aql::AqlController): this adapter only reads
    /// counters into it and applies its decisions.
    controller: AqlController,
    vms: Vec<Vm>,
    last: BTreeMap<VcpuId, monitor::VcpuReading>,
    vm_io: Vec<VmIo>,
    next_discovery: Instant,
}

impl Engine {
    fn new(filter: VmFilter, cfg: ControllerConfig) -> anyhow::Result<Self> {
        let procfs = Procfs::new();
        let vms = find_vms(&procfs, &filter)?;
        Ok(Self {
            monitor: Monitor::new(procfs.clone(), ProcExtra::new()),
            procfs,
            filter,
            controller: AqlController::new(cfg),
            vms,
            last: BTreeMap::new(),
            vm_io: Vec::new(),
            next_discovery: Instant::now() + Duration::from_secs(1),
        })
    }

    /// Rediscovers the VMs (every second) and reads the counters of the period since the
    /// last call, without stepping the controller (the baseline sample).
    fn sample(&mut self) -> anyhow::Result<Vec<aql::Reading>> {
        if Instant::now() >= self.next_discovery {
            self.vms = find_vms(&self.procfs, &self.filter)?;
            self.next_discovery = Instant::now() + Duration::from_secs(1);
            let live: Vec<VcpuId> = self.ids().collect();
            self.last.retain(|id, _| live.contains(id));
        }
        let (readings, vm_io) = self.monitor.sample(&self.vms);
        self.vm_io = vm_io;
        let out = controller_readings(&readings);
        self.last.extend(readings.into_iter().map(|r| (r.id, r)));
        Ok(out)
    }

    /// One period: sample, then the controller's step (a decision every window).
    fn step(&mut self) -> anyhow::Result<Option<aql::Decision>> {
        let readings = self.sample()?;
        let live: Vec<VcpuId> = self.ids().collect();
        Ok(self.controller.step(&live, &readings))
    }

    fn ids(&self) -> impl Iterator<Item = VcpuId> + '_ {
        self.vms.iter().flat_map(|vm| vm.vcpus.iter().map(|v| VcpuId { vm: u64::try_from(vm.pid).unwrap_or(0), vcpu: v.index }))
    }

    fn reports(&self) -> Vec<VcpuReport> {
        let mut out = Vec::new();
        for vm in &self.vms {
            for v in &vm.vcpus {
                let id = VcpuId { vm: u64::try_from(vm.pid).unwrap_or(0), vcpu: v.index };
                let last = self.last.get(&id);
                out.push(VcpuReport {
                    vm: vm.name.clone(),
                    pid: vm.pid,
                    vcpu: v.index,
                    tid: v.tid,
                    io_source: last.and_then(|l| l.io_source),
                    last: last.map(|l| l.counters).unwrap_or_default(),
                    classification: self.controller.classify(id),
                });
            }
        }
        out
    }
}

/// What the host adapter hands the AQL controller for one period: each vCPU's counters as the
/// monitor read them (raw per-vCPU spin events; the controller normalises them per VM).
pub fn controller_readings(readings: &[monitor::VcpuReading]) -> Vec<aql::Reading> {
    readings.iter().map(|r| aql::Reading { id: r.id, counters: r.counters }).collect()
}

/// The controller's settings from the host's flags and configuration.
fn controller_config(m: &MonitorOptions, limits: aql::Limits, topology: Topology, quanta: aql::Quanta) -> ControllerConfig {
    ControllerConfig { window: m.window, decide_every: m.window, confirm: true, limits, hysteresis: m.hysteresis_points, topology, quanta }
}

/// The next period boundary after `next`; when the loop fell behind (a slow step), it
/// restarts from now instead of running a burst of short periods.
fn advance(next: Instant, period: Duration) -> Instant {
    let n = next + period;
    let now = Instant::now();
    if n <= now {
        now + period
    } else {
        n
    }
}

/// Sleeps until `deadline` unless `stop` is set (checked every 10 ms).
/// Sleeps until `deadline` in steps of at most 10 ms, returning early on a stop signal.
fn sleep_until(deadline: Instant) {
    while !gleaner_os::signal::stop_requested() {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(10)));
    }
}

fn fmt_class(c: &Option<Classification>) -> String {
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

fn cmd_classify(m: &MonitorOptions, json: bool) -> anyhow::Result<ExitCode> {
    let cfg = HostConfig::load(m.config.as_deref())?;
    let topo = topology(None, None, &CpuTopo::new(), &Sysfs::new())?;
    let mut e = Engine::new(m.filter.clone(), controller_config(m, cfg.config.limits, topo, cfg.config.quanta))?;
    let period = m.period;
    // One baseline sample plus `window` periods.
    let mut next = Instant::now();
    e.sample()?;
    for _ in 0..=m.window {
        next = advance(next, period);
        sleep_until(next);
        e.step()?;
    }
    let reports = e.reports();
    let sources = e.monitor.sources();
    if json {
        print_json(&serde_json::json!({
            "period_ms": m.period.as_millis(), "window": m.window,
            "limits": cfg.config.limits, "sources": sources, "vcpus": reports, "vm_io": e.vm_io,
        }))?;
    } else {
        println!("sources: I/O: {}\n         spin: {}\n         LLC: {}", sources.io, sources.spin, sources.llc);
        for r in &reports {
            println!("{} vCPU {} (tid {}): {}", r.vm, r.vcpu, r.tid, fmt_class(&r.classification));
        }
        for v in &e.vm_io {
            println!(
                "VM pid {}: other threads {} syscalls, {} voluntary switches in the last period",
                v.pid, v.syscalls, v.voluntary_switches
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The pCPUs available to pools, by socket.
pub fn topology(cpus: Option<&CpuSet>, reserve: Option<&CpuSet>, topo: &CpuTopo, sysfs: &Sysfs) -> anyhow::Result<Topology> {
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
    let mut sockets: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for c in set.iter() {
        sockets.entry(topo.package_id(c)?.unwrap_or(0)).or_default().push(c);
    }
    Ok(Topology { sockets: sockets.into_values().collect() })
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

fn print_plan(plan: &Plan, diff: &PlanDiff) {
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

fn cmd_run(a: &RunOptions) -> anyhow::Result<ExitCode> {
    let cfg = HostConfig::load(a.monitor.config.as_deref())?;
    let quanta = cfg.config.quanta;
    let topo = topology(a.cpus.as_ref(), a.reserve_cpus.as_ref(), &CpuTopo::new(), &Sysfs::new())?;
    let mut engine = Engine::new(a.monitor.filter.clone(), controller_config(&a.monitor, cfg.config.limits, topo.clone(), quanta))?;
    let metrics = metrics::Metrics::new();
    if let Some(addr) = a.metrics_addr {
        let local = metrics.serve(addr)?;
        if let Some(w) = gleaner_os::input::metrics_exposure(local) {
            eprintln!("gleaner host: warning: {w}");
        }
        eprintln!("gleaner host: metrics on http://{local}/metrics");
    }
    let mut actuator = if a.dry_run {
        None
    } else {
        let cg = Cgroups::detect().context("a cpuset cgroup controller is needed for pools")?;
        Some(Actuator::new(cg, Procfs::new(), ProcExtra::new(), a.state.clone())?)
    };
    gleaner_os::signal::clear();
    gleaner_os::signal::catch_stop_signals(gleaner_os::signal::InterruptedCalls::Restart).context("installing signal handlers")?;
    let started = Instant::now();
    let period = a.monitor.period;
    let mut next = Instant::now();
    let mut last_diff = PlanDiff::default();
    let mut dry_plan: Option<Plan> = None;
    let (mut periods, mut applied) = (0u64, 0u64);
    let result: anyhow::Result<()> = (|| {
        engine.sample()?; // baseline
        loop {
            next = advance(next, period);
            sleep_until(next);
            if gleaner_os::signal::stop_requested() {
                break;
            }
            let decision = engine.step()?;
            periods += 1;
            metrics.period();
            if let Some(d) = decision {
                let classes: Vec<(VcpuId, String, Classification)> = engine
                    .reports()
                    .into_iter()
                    .filter_map(|r| Some((VcpuId { vm: u64::try_from(r.pid).ok()?, vcpu: r.vcpu }, r.vm, r.classification?)))
                    .collect();
                metrics.update(&classes, &d.plan, !d.diff.is_empty());
                if a.dry_run {
                    last_diff = d.diff;
                    dry_plan = Some(d.plan);
                    break;
                }
                // The controller applies a changed plan once two consecutive windows agree.
                if d.apply {
                    if let Some(act) = actuator.as_mut() {
                        act.apply(&d.plan, &placements(&d.plan, &engine.vms))?;
                    }
                    applied += 1;
                    tracing::info!(pools = d.plan.pools.len(), moves = d.diff.moves.len(), "plan applied");
                    if !a.json {
                        eprintln!("gleaner host: plan {applied}: {} pools, {} vCPU moves", d.plan.pools.len(), d.diff.moves.len());
                    }
                    last_diff = d.diff;
                }
            }
            if a.duration.is_some_and(|d| started.elapsed() >= d) {
                break;
            }
            if a.exit_when_no_vms && engine.vms.is_empty() {
                break;
            }
        }
        Ok(())
    })();
    let warnings = actuator.as_ref().map(|x| x.warnings.clone()).unwrap_or_default();
    let restored = match actuator.as_mut() {
        Some(act) => {
            let r = act.restore_all();
            if let Err(e) = &r {
                eprintln!("gleaner host: restore failed: {e:#}");
            }
            r.is_ok()
        }
        None => true,
    };
    result?;
    let report = RunReport {
        dry_run: a.dry_run,
        config: cfg.path,
        quanta,
        topology: topo,
        sources: engine.monitor.sources(),
        periods,
        plans_applied: applied,
        plan: dry_plan.unwrap_or_else(|| engine.controller.current().clone()),
        changes: last_diff,
        vcpus: engine.reports(),
        warnings,
        restored,
    };
    if a.json {
        print_json(&report)?;
    } else {
        if a.dry_run {
            println!("dry run: nothing was changed");
        }
        for r in &report.vcpus {
            println!("{} vCPU {} (tid {}): {}", r.vm, r.vcpu, r.tid, fmt_class(&r.classification));
        }
        print_plan(&report.plan, &report.changes);
        println!("{} periods, {} plans applied, restored: {}", periods, applied, restored);
        for w in &report.warnings {
            println!("warning: {w}");
        }
    }
    Ok(if restored { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn cmd_calibrate(a: &CalibrateOptions) -> anyhow::Result<ExitCode> {
    let sysfs = Sysfs::new();
    let online = sysfs.online_cpus()?;
    let cpu = a.cpu.or(online.last()).context("no online CPU")?;
    if !online.contains(cpu) {
        return Err(BadInput::new("--cpu", cpu, format!("an online CPU ({online})")).into());
    }
    let device_cpu = online.iter().find(|&c| c != cpu).unwrap_or(cpu);
    let topo = CpuTopo::new();
    let llc = match a.llc_bytes {
        Some(b) => b,
        None => topo.llc_bytes(cpu)?.context("LLC size unknown in sysfs: pass --llc-bytes")?,
    };
    let l2 = topo.l2_bytes(cpu).unwrap_or(256 * 1024);
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

/// What `status` shows of a thread.
#[derive(Debug, Serialize)]
struct ThreadStatus {
    tid: i32,
    pid: i32,
    comm: String,
    alive: bool,
    slice_ns_now: Option<u64>,
    slice_ns_before: u64,
}

fn cmd_status(a: StateArgs) -> anyhow::Result<ExitCode> {
    let Some(st) = State::load(&a.state)? else {
        if a.json {
            print_json(&serde_json::json!({ "running": false, "state": null }))?;
        } else {
            println!("no state file at {}: no host agent has changes in force", a.state.display());
        }
        return Ok(ExitCode::SUCCESS);
    };
    let running = Path::new(&format!("/proc/{}", st.agent_pid)).exists();
    let threads: Vec<ThreadStatus> = st
        .threads
        .values()
        .map(|r| {
            let alive = Procfs::new().task_comm(r.pid, r.tid).is_ok_and(|c| c == r.comm);
            ThreadStatus {
                tid: r.tid,
                pid: r.pid,
                comm: r.comm.clone(),
                alive,
                slice_ns_now: gleaner_os::sched::slice(r.tid).ok().map(|d| u64::try_from(d.as_nanos()).unwrap_or(0)),
                slice_ns_before: r.slice_ns,
            }
        })
        .collect();
    if a.json {
        print_json(&serde_json::json!({ "running": running, "state": st, "threads": threads }))?;
    } else {
        println!(
            "agent pid {} ({}), cgroup v{} at {}",
            st.agent_pid,
            if running { "running" } else { "NOT running: run `gleaner host restore`" },
            st.cgroup_version,
            st.cgroup_root.display()
        );
        print_plan(&st.plan, &PlanDiff::default());
        for g in &st.groups {
            println!("group {}", g.display());
        }
        for t in &threads {
            println!("tid {} ({}) slice now {:?} ns, before {} ns", t.tid, t.comm, t.slice_ns_now, t.slice_ns_before);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn cmd_restore(a: StateArgs) -> anyhow::Result<ExitCode> {
    let st = State::load(&a.state)?;
    if let Some(s) = &st {
        if s.agent_pid != 0 && Path::new(&format!("/proc/{}", s.agent_pid)).exists() && s.agent_pid != std::process::id() as i32 {
            let comm = Procfs::new().comm(s.agent_pid).unwrap_or_default();
            if comm.starts_with("gleaner") {
                anyhow::bail!("host agent pid {} is still running: stop it (SIGTERM) and it restores by itself", s.agent_pid);
            }
        }
    }
    let cg = Cgroups::detect()?;
    let removed = match &st {
        Some(s) => actuate::restore(&cg, &Procfs::new(), s)?,
        None => actuate::sweep(&cg)?,
    };
    if st.is_some() {
        std::fs::remove_file(&a.state).with_context(|| format!("cannot remove {}", a.state.display()))?;
    }
    let threads = st.as_ref().map_or(0, |s| s.threads.len());
    if a.json {
        print_json(&serde_json::json!({ "state_file": st.is_some(), "threads_restored": threads, "groups_removed": removed }))?;
    } else {
        println!("restored {threads} threads, removed {} groups{}", removed.len(), if st.is_none() { " (no state file)" } else { "" });
    }
    Ok(ExitCode::SUCCESS)
}
