//! One AQL_Sched loop: the host agent's adapter and the simulator's adapter feed
//! the same `gleaner_policy::aql::AqlController`, so the same readings give the same plans,
//! period by period. The sequence has a starved spinning VM (typed ConSpin only when spin is
//! counted per VM per run time), an LLC-friendly hog and an I/O VM that turns CPU-bound
//! half-way (a changed plan, applied only once two windows agree).

use gleaner_host::monitor::VcpuReading;
use gleaner_policy::aql::{self, AqlController};
use gleaner_sim::policy::{AqlCfg, AqlHost, HostPlan, HostPolicy, HostPool, HostView, SimVcpuCounters};

const PERIOD: u64 = 30_000_000;
const PCPUS: u32 = 8;

/// Period `p`'s counters of every vCPU, as the simulator's engine reports them.
fn period(p: u32) -> Vec<SimVcpuCounters> {
    let spinner = |vcpu| SimVcpuCounters {
        vm: 0,
        vcpu,
        ple_exits: 1,
        spin_ns: 20_000,
        run_ns: 140_000,
        llc_refs: 300.0,
        llc_misses: 60.0,
        ..Default::default()
    };
    let hog = |vcpu| SimVcpuCounters { vm: 1, vcpu, run_ns: PERIOD, llc_refs: 1.2e6, llc_misses: 2.4e4, ..Default::default() };
    let io = |vcpu| SimVcpuCounters {
        vm: 2,
        vcpu,
        io_events: if p < 12 { 900 } else { 0 },
        run_ns: PERIOD / 2,
        llc_refs: 1e4,
        llc_misses: 1e3,
        ..Default::default()
    };
    (0..4).map(spinner).chain((0..4).map(hog)).chain((0..2).map(io)).collect()
}

/// The simulator's plan in the host's terms: per vCPU (in order), its pool's pCPUs and slice.
fn sim_terms(plan: &HostPlan) -> Vec<(Vec<u32>, u64)> {
    plan.assign
        .iter()
        .map(|&a| {
            let HostPool { pcpus, slice_ns } = &plan.pools[a as usize];
            (pcpus.clone(), *slice_ns)
        })
        .collect()
}

fn host_terms(plan: &aql::Plan, ids: &[aql::VcpuId]) -> Vec<(Vec<u32>, u64)> {
    ids.iter()
        .map(|id| {
            let pool = plan.pool_of(id).expect("every vCPU has a pool");
            (pool.pcpus.clone(), pool.quantum_ns)
        })
        .collect()
}

#[test]
fn host_and_simulator_adapters_make_the_same_plans_from_the_same_readings() {
    // The host agent's damping (gleaner host run's defaults), in both.
    let damping = AqlCfg { window: 4, decide_every: 4, confirm: true, hysteresis_points: 10.0 };
    let mut sim = AqlHost::new(PCPUS, 1, &damping);
    let mut host = AqlController::new(AqlHost::config(PCPUS, 1, &damping));
    let mut applied = 0;
    for p in 0..32 {
        let counters = period(p);
        let view = HostView { now_ns: u64::from(p) * PERIOD, period_ns: PERIOD, pcpus: PCPUS, vcpus: &counters };
        let sim_plan = sim.on_period(&view);

        // What the host's monitor would have read for the same vCPUs, through the host adapter.
        let monitor: Vec<VcpuReading> = AqlHost::readings(&view)
            .into_iter()
            .map(|r| VcpuReading { id: r.id, vm_name: format!("vm{}", r.id.vm), tid: 0, counters: r.counters, io_source: Some("test") })
            .collect();
        let ids: Vec<aql::VcpuId> = monitor.iter().map(|r| r.id).collect();
        let decision = host.step(&ids, &gleaner_host::controller_readings(&monitor));
        let host_plan = decision.filter(|d| d.apply).map(|d| d.plan);

        match (&sim_plan, &host_plan) {
            (None, None) => {}
            (Some(s), Some(h)) => {
                applied += 1;
                assert_eq!(sim_terms(s), host_terms(h, &ids), "period {p}: the adapters disagree");
            }
            _ => panic!("period {p}: the simulator applied {sim_plan:?}, the host {host_plan:?}"),
        }
    }
    assert_eq!(applied, 2, "the first plan, then the I/O VM's change once two windows agreed");
    // The starved spinners got the 1 ms pool (ConSpin per VM per run time), in both.
    let plan = host.current();
    let spinner = plan.pool_of(&aql::VcpuId { vm: 0, vcpu: 0 }).unwrap();
    assert_eq!(spinner.quantum_ns, 1_000_000);
}
