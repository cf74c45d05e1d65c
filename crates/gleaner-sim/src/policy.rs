//! Host policies: every monitoring period the engine hands the policy per-vCPU counters and
//! may receive pCPU pools (sets of pCPUs with a time slice) and a vCPU -> pool assignment.
//!
//! - [`StockHost`]: one pool of every pCPU with the fixed `host.slice_us` (no period).
//! - [`AqlHost`]: AQL_Sched, i.e. `gleaner_policy::aql::AqlController` (type recognizer over a
//!   window of periods, clustering by algorithms 1 and 2, plan confirmation), exactly the loop
//!   `gleaner host run` runs.

use gleaner_policy::aql;
use gleaner_policy::num::saturating_u64;

use crate::queue::Ns;
pub use crate::scenario::AqlCfg;

/// One vCPU's counters over a period (or cumulative, inside the engine), as the simulated host
/// measures them ([`AqlHost::readings`] turns them into the policy's `aql::Reading`s).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SimVcpuCounters {
    /// VM index in the scenario.
    pub vm: u32,
    /// vCPU index in its VM.
    pub vcpu: u32,
    /// I/O completions handled.
    pub io_events: u64,
    /// Pause-loop exits.
    pub ple_exits: u64,
    /// Time spent spinning in user-level spin loops.
    pub spin_ns: u64,
    pub llc_refs: f64,
    pub llc_misses: f64,
    /// pCPU time the vCPU ran.
    pub run_ns: u64,
}

impl SimVcpuCounters {
    pub fn delta(&self, prev: &Self) -> Self {
        Self {
            vm: self.vm,
            vcpu: self.vcpu,
            io_events: self.io_events - prev.io_events,
            ple_exits: self.ple_exits - prev.ple_exits,
            spin_ns: self.spin_ns - prev.spin_ns,
            llc_refs: self.llc_refs - prev.llc_refs,
            llc_misses: self.llc_misses - prev.llc_misses,
            run_ns: self.run_ns - prev.run_ns,
        }
    }
}

/// What a host policy sees each period.
#[derive(Debug)]
pub struct HostView<'a> {
    pub now_ns: Ns,
    pub period_ns: Ns,
    pub pcpus: u32,
    /// Per vCPU (global order: VM by VM), counters over the last period.
    pub vcpus: &'a [SimVcpuCounters],
}

/// A pCPU pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPool {
    pub pcpus: Vec<u32>,
    pub slice_ns: Ns,
}

/// Pools and, per vCPU (global order), the index of its pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPlan {
    pub pools: Vec<HostPool>,
    pub assign: Vec<u32>,
}

impl HostPlan {
    /// Every pool non-empty, within the host, with a positive slice; one entry per vCPU.
    pub fn validate(&self, pcpus: u32, vcpus: usize) -> Result<(), String> {
        if self.assign.len() != vcpus {
            return Err(format!("{} assignments for {vcpus} vCPUs", self.assign.len()));
        }
        for (i, p) in self.pools.iter().enumerate() {
            if p.pcpus.is_empty() || p.slice_ns == 0 || p.pcpus.iter().any(|&c| c >= pcpus) {
                return Err(format!("pool {i} is empty, has a zero slice or a pCPU >= {pcpus}"));
            }
        }
        if self.assign.iter().any(|&a| a as usize >= self.pools.len()) {
            return Err("assignment to a pool that does not exist".into());
        }
        Ok(())
    }
}

/// A host-side scheduling policy (`Debug` so the engine and its set-up can be printed).
pub trait HostPolicy: Send + std::fmt::Debug {
    fn name(&self) -> &'static str;
    /// Monitoring period; `None` = never called.
    fn period_ns(&self) -> Option<Ns>;
    /// Called every period; `Some(plan)` replaces the current pools, slices and assignment.
    fn on_period(&mut self, view: &HostView<'_>) -> Option<HostPlan>;
}

/// The stock host: fixed slice, every pCPU in one pool.
#[derive(Debug, Default)]
pub struct StockHost;

impl HostPolicy for StockHost {
    fn name(&self) -> &'static str {
        "stock"
    }
    fn period_ns(&self) -> Option<Ns> {
        None
    }
    fn on_period(&mut self, _view: &HostView<'_>) -> Option<HostPlan> {
        None
    }
}

/// Instructions per nanosecond of vCPU run time, to normalize LLC counts per 1000 instructions
/// (the simulator has no instruction counter; 2 per ns ~ IPC 1 at 2 GHz).
const INSTR_PER_NS: u64 = 2;

/// AQL_Sched on the simulated host: `gleaner_policy::aql::AqlController`, the loop
/// `gleaner host run` runs (ConSpin per VM per run time, a decision every window, a changed
/// plan applied once two windows agree). This adapter only turns the engine's counters into
/// readings and the controller's plan into pools.
#[derive(Debug)]
pub struct AqlHost {
    controller: aql::AqlController,
    period_ns: Ns,
}

impl AqlHost {
    /// 30 ms periods, calibrated quanta, and the loop's damping from `damping` (default: the
    /// paper's rule, a window of 4, a decision every period, every change applied).
    pub fn new(pcpus: u32, sockets: u32, damping: &AqlCfg) -> Self {
        Self { controller: aql::AqlController::new(Self::config(pcpus, sockets, damping)), period_ns: 30_000_000 }
    }

    /// The controller's settings for a host of `pcpus` on `sockets`.
    pub fn config(pcpus: u32, sockets: u32, damping: &AqlCfg) -> aql::ControllerConfig {
        aql::ControllerConfig {
            window: damping.window,
            decide_every: damping.decide_every,
            confirm: damping.confirm,
            limits: aql::Limits::default(),
            hysteresis: damping.hysteresis_points,
            topology: aql::Topology::uniform(sockets, pcpus / sockets.max(1)),
            quanta: aql::Quanta::paper(),
        }
    }

    /// The readings the controller gets for one period's counters.
    pub fn readings(view: &HostView<'_>) -> Vec<aql::Reading> {
        view.vcpus
            .iter()
            .map(|c| aql::Reading {
                id: vcpu_id(c),
                counters: aql::VcpuCounters {
                    period_ns: view.period_ns,
                    io_events: Some(c.io_events),
                    spin_events: Some(c.ple_exits),
                    llc_refs: Some(saturating_u64(c.llc_refs.round())),
                    llc_misses: Some(saturating_u64(c.llc_misses.round())),
                    instructions: Some(c.run_ns.saturating_mul(INSTR_PER_NS)),
                    run_ns: Some(c.run_ns),
                },
            })
            .collect()
    }
}

fn vcpu_id(c: &SimVcpuCounters) -> aql::VcpuId {
    aql::VcpuId { vm: u64::from(c.vm), vcpu: c.vcpu }
}

impl HostPolicy for AqlHost {
    fn name(&self) -> &'static str {
        "aql"
    }
    fn period_ns(&self) -> Option<Ns> {
        Some(self.period_ns)
    }
    fn on_period(&mut self, view: &HostView<'_>) -> Option<HostPlan> {
        let live: Vec<aql::VcpuId> = view.vcpus.iter().map(vcpu_id).collect();
        let decision = self.controller.step(&live, &Self::readings(view))?;
        if !decision.apply {
            return None;
        }
        let plan = decision.plan;
        let pools: Vec<HostPool> = plan.pools.iter().map(|p| HostPool { pcpus: p.pcpus.clone(), slice_ns: p.quantum_ns }).collect();
        let mut assign = Vec::with_capacity(view.vcpus.len());
        for id in &live {
            let a = plan.assignment.iter().find(|a| a.vcpu == *id)?;
            assign.push(a.pool as u32);
        }
        Some(HostPlan { pools, assign })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_validation() {
        let ok = HostPlan { pools: vec![HostPool { pcpus: vec![0, 1], slice_ns: 1 }], assign: vec![0, 0] };
        assert!(ok.validate(2, 2).is_ok());
        assert!(ok.validate(1, 2).is_err());
        assert!(ok.validate(2, 3).is_err());
        let bad = HostPlan { pools: vec![HostPool { pcpus: vec![], slice_ns: 1 }], assign: vec![0] };
        assert!(bad.validate(2, 1).is_err());
    }

    #[test]
    fn aql_types_spinning_and_cache_friendly_vcpus_apart() {
        let mut h = AqlHost::new(4, 1, &AqlCfg::default());
        let period = 30_000_000;
        let spin =
            SimVcpuCounters { vm: 0, vcpu: 0, ple_exits: 1000, run_ns: period, llc_refs: 1e5, llc_misses: 1e4, ..Default::default() };
        // matmul-like: 20 refs per 1000 instructions, 0.4 misses per 1000.
        let llcf = SimVcpuCounters { vm: 1, vcpu: 0, run_ns: period, llc_refs: 1.2e6, llc_misses: 2.4e4, ..Default::default() };
        let mut last = None;
        for _ in 0..4 {
            let view = HostView { now_ns: 0, period_ns: period, pcpus: 4, vcpus: &[spin, llcf] };
            last = h.on_period(&view).or(last);
        }
        let plan = last.expect("a plan once vCPUs are typed");
        assert!(plan.validate(4, 2).is_ok());
        let s0 = plan.pools[plan.assign[0] as usize].slice_ns;
        let s1 = plan.pools[plan.assign[1] as usize].slice_ns;
        assert_eq!(s0, 1_000_000, "ConSpin gets 1 ms");
        assert_eq!(s1, 90_000_000, "LLCF gets 90 ms");
    }

    /// The counters the sim measured for the spin-barrier VM in a 90 ms pool next to matmul:
    /// 1 pause-loop exit in 30 ms, 0.14 ms of run time (all of it spinning or at the barrier).
    fn starved_spinner(vcpu: u32) -> SimVcpuCounters {
        SimVcpuCounters {
            vm: 0,
            vcpu,
            ple_exits: 1,
            spin_ns: 20_000,
            run_ns: 140_000,
            llc_refs: 300.0,
            llc_misses: 60.0,
            ..Default::default()
        }
    }

    /// gleaner_policy::aql counts ConSpin_level per vCPU per wall-clock period: a vCPU that
    /// spins whenever it runs but got 0.5% of a pCPU is typed LoLCF (rate 33/s < 5000/s), so
    /// it stays in the long-slice pool that starves it. This documents the policy's behaviour
    /// that the adapter works around; it fails once the policy normalizes by run time or VM.
    #[test]
    fn spin_level_per_wall_period_misses_a_starved_spinner() {
        let mut rec = aql::TypeRecognizer::new(4, aql::Limits::default());
        let id = aql::VcpuId { vm: 0, vcpu: 0 };
        let c = starved_spinner(0);
        for _ in 0..4 {
            rec.observe(
                id,
                &aql::VcpuCounters {
                    period_ns: 30_000_000,
                    io_events: Some(0),
                    spin_events: Some(c.ple_exits),
                    llc_refs: Some(300),
                    llc_misses: Some(60),
                    instructions: Some(c.run_ns * INSTR_PER_NS),
                    run_ns: Some(c.run_ns),
                },
            );
        }
        assert_eq!(rec.classify(id).expect("observed").class, aql::VcpuClass::Lolcf);
    }

    /// The adapter's ConSpin_level (the VM's exits per second of its run time) types the same
    /// starved spinners ConSpin and gives them the 1 ms pool, apart from the LLCF hog.
    #[test]
    fn spin_level_per_vm_run_time() {
        let mut h = AqlHost::new(4, 1, &AqlCfg::default());
        let hog = |vcpu| SimVcpuCounters { vm: 1, vcpu, run_ns: 30_000_000, llc_refs: 1.2e6, llc_misses: 2.4e4, ..Default::default() };
        let vcpus: Vec<SimVcpuCounters> = (0..8).map(starved_spinner).chain((0..8).map(hog)).collect();
        let mut last = None;
        for _ in 0..4 {
            last = h.on_period(&HostView { now_ns: 0, period_ns: 30_000_000, pcpus: 4, vcpus: &vcpus }).or(last);
        }
        let plan = last.expect("plan");
        for v in 0..8 {
            let pool = &plan.pools[plan.assign[v] as usize];
            assert_eq!(pool.slice_ns, 1_000_000, "spinner {v} in a 1 ms pool");
            assert!(plan.assign[8..].iter().all(|&a| a != plan.assign[v]), "spinners apart from the hog");
        }
    }
}
