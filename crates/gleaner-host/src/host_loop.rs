//! The host's side of the AQL loop: discovery and sampling feed
//! [`gleaner_policy::aql::AqlController`], which owns the whole decision (windowing,
//! per-VM normalisation, plan confirmation). `classify` and `run` drive one [`HostLoop`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gleaner_os::procfs::Procfs;
use gleaner_policy::aql::{self, AqlController, Classification, ControllerConfig, Topology, VcpuId};
use serde::Serialize;

use crate::cli::{MonitorOptions, VmFilter};
use crate::discover::Vm;
use crate::monitor::{self, Monitor, VmIo};

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

/// VMs passing the filter.
pub fn find_vms(procfs: &Procfs, filter: &VmFilter) -> anyhow::Result<Vec<Vm>> {
    Ok(crate::discover::discover(procfs)?.into_iter().filter(|v| filter.keep(v)).collect())
}

/// The monitoring loop shared by `classify` and `run`: discovery, sampling, and the
/// controller's decision.
#[derive(Debug)]
pub struct HostLoop {
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

impl HostLoop {
    pub fn new(filter: VmFilter, cfg: ControllerConfig) -> anyhow::Result<Self> {
        let procfs = Procfs::new();
        let vms = find_vms(&procfs, &filter)?;
        Ok(Self {
            monitor: Monitor::with_procfs(procfs.clone()),
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
    /// last call, without stepping the controller (alone: the baseline sample).
    pub fn sample(&mut self) -> anyhow::Result<Vec<aql::Reading>> {
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

    /// The controller's step on one period's readings (a decision every window).
    pub fn decide(&mut self, readings: &[aql::Reading]) -> Option<aql::Decision> {
        let live: Vec<VcpuId> = self.ids().collect();
        self.controller.step(&live, readings)
    }

    /// One period: sample, then decide.
    pub fn step(&mut self) -> anyhow::Result<Option<aql::Decision>> {
        let readings = self.sample()?;
        Ok(self.decide(&readings))
    }

    /// The VMs found at the last discovery.
    pub fn vms(&self) -> &[Vm] {
        &self.vms
    }

    /// Each VM's other threads' I/O in the last period.
    pub fn vm_io(&self) -> &[VmIo] {
        &self.vm_io
    }

    /// Where each counter comes from, and what is missing.
    pub fn sources(&self) -> crate::monitor::SourceReport {
        self.monitor.sources()
    }

    /// The plan in force (the controller's).
    pub fn current_plan(&self) -> &aql::Plan {
        self.controller.current()
    }

    fn ids(&self) -> impl Iterator<Item = VcpuId> + '_ {
        self.vms.iter().flat_map(|vm| vm.vcpus.iter().map(|v| VcpuId { vm: u64::try_from(vm.pid).unwrap_or(0), vcpu: v.index }))
    }

    pub fn reports(&self) -> Vec<VcpuReport> {
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
pub fn controller_config(m: &MonitorOptions, limits: aql::Limits, topology: Topology, quanta: aql::Quanta) -> ControllerConfig {
    ControllerConfig { window: m.window, decide_every: m.window, confirm: true, limits, hysteresis: m.hysteresis_points, topology, quanta }
}

/// Paces a loop at a fixed period, returning early on a stop signal.
#[derive(Debug)]
pub struct Pacer {
    next: Instant,
    period: Duration,
}

impl Pacer {
    pub fn new(period: Duration) -> Self {
        Self { next: Instant::now(), period }
    }

    /// Sleeps until the next period boundary (in steps of at most 10 ms, returning early on a
    /// stop signal). When the loop fell behind (a slow step), the next period starts from now
    /// instead of running a burst of short periods.
    pub fn wait(&mut self) {
        let n = self.next + self.period;
        let now = Instant::now();
        self.next = if n <= now { now + self.period } else { n };
        while !gleaner_os::signal::stop_requested() {
            let now = Instant::now();
            if now >= self.next {
                return;
            }
            std::thread::sleep((self.next - now).min(Duration::from_millis(10)));
        }
    }
}
