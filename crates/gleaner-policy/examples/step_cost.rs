//! The guest loop's time per step at 16, 64, 256 and 1024 vCPUs: the cost the agent pays each
//! period and the simulator pays per VM and period, at sizes no machine here has.
//!
//! `cargo run --release -p gleaner-policy --example step_cost [-- --steps N] [--json]`
//!
//! Each size gets its own `GuestController` with the agent's defaults where a machine offers
//! kernel polling (the prior wake-cost curve, the governor, consolidation) and `--steps`
//! (default 300) periods of varied readings: every vCPU busy a share of the period that moves
//! from step to step, a traced trace with idle gaps and wake latencies per vCPU, so plans and
//! consolidation change. It prints the median and 90th percentile of the wall time per step,
//! per vCPU, and how the per-vCPU cost at each size compares with the smallest: a loop that
//! grows linearly keeps that ratio near 1.

use std::time::Instant;

use gleaner_policy::gleaner::{Params, Snapshot, VcpuSample};
use gleaner_policy::guest::{GuestConfig, GuestController, GuestReading, VcpuIdle};
use gleaner_policy::idle::{Means, PlanConfig, TraceSource, WakeCurve, WakeTrace};
use gleaner_policy::num::saturating_u64;
use gleaner_policy::retention::{GovernorConfig, RetentionMode, WorkloadIo};

const PERIOD_NS: u64 = 200_000_000;
const SIZES: [u32; 4] = [16, 64, 256, 1024];

/// A small deterministic generator (64-bit LCG): the readings vary, runs repeat.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    /// In [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() % 1_000_000) as f64 / 1e6
    }
}

fn config(n: u32) -> GuestConfig {
    GuestConfig {
        cpus: (0..n).collect(),
        consolidation: Some(Params::default()),
        plan: PlanConfig::default(),
        means: Means { poll_window: true, poll_always: true, yielders: false },
        curve: Some(WakeCurve::prior()),
        governor: Some(GovernorConfig::default()),
        prior: RetentionMode::On,
        fixed_yield_ns: None,
        start: gleaner_policy::guest::StartConfig::default(),
        period_ns: PERIOD_NS,
        priors: gleaner_policy::guest::LoopPriors::DEFAULT,
    }
}

/// One period on `active` of `n` vCPUs: a load that drifts with `step`, per-vCPU noise.
fn reading(n: u32, active: &[u32], step: u32, rng: &mut Lcg) -> GuestReading {
    let load = 0.2 + 0.6 * (f64::from(step % 40) / 40.0);
    let mut trace = WakeTrace::empty(TraceSource::Bpf, 0..n);
    trace.traced_ns = PERIOD_NS / 5;
    let mut vcpus = Vec::with_capacity(n as usize);
    let mut idle = Vec::with_capacity(n as usize);
    for cpu in 0..n {
        let on = active.contains(&cpu);
        let busy = if on { (load + 0.2 * (rng.unit() - 0.5)).clamp(0.0, 1.0) } else { 0.0 };
        let work_ns = saturating_u64(busy * PERIOD_NS as f64).min(PERIOD_NS);
        let wakes = if on { 50 + rng.next() % 400 } else { 0 };
        vcpus.push(VcpuSample { cpu, t_work_ns: work_ns, t_yield_ns: 0, t_idle_ns: PERIOD_NS - work_ns, s_yield: wakes });
        idle.push(VcpuIdle { cpu, idle_ns: PERIOD_NS - work_ns, entries: Some(wakes), poll_ns: 0, yield_ns: 0, steal_ns: 0 });
        if on {
            let gaps = &mut trace.vcpus[cpu as usize];
            gaps.woken.record_n(20_000 + rng.next() % 2_000_000, wakes / 5);
            gaps.other.record_n(5_000_000 + rng.next() % 5_000_000, 2);
            trace.latency.halt.record_n(25_000 + rng.next() % 50_000, wakes / 10);
            trace.latency.poll.record_n(4_000 + rng.next() % 3_000, wakes / 20);
        }
    }
    let s_work = vcpus.iter().map(|v| v.s_yield).sum();
    GuestReading {
        snapshot: Snapshot { period_ns: PERIOD_NS, vcpus, s_work, pinned: Vec::new() },
        idle,
        trace: Some(trace),
        caught: Vec::new(),
        io: WorkloadIo::default(),
        counter: None,
        agent_work_ns: 0,
        trace_missed: 0.0,
    }
}

/// Per-step wall times (ns) of `steps` steps at `n` vCPUs, and the plans' sizes.
fn measure(n: u32, steps: u32) -> (Vec<u64>, usize) {
    let mut g = GuestController::new(config(n));
    let mut rng = Lcg(u64::from(n));
    let mut times = Vec::with_capacity(steps as usize);
    let mut planned = 0;
    for step in 0..steps {
        let r = reading(n, &g.active(), step, &mut rng);
        let t0 = Instant::now();
        let s = g.step(&r);
        times.push(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
        planned = planned.max(s.plan.vcpus.len());
    }
    times.sort_unstable();
    (times, planned)
}

/// The `pct`-th percentile (0..=100) of `sorted`, by nearest rank.
fn pct(sorted: &[u64], pct: usize) -> u64 {
    sorted[(sorted.len() - 1) * pct / 100]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    let steps = args.iter().position(|a| a == "--steps").and_then(|i| args.get(i + 1)).map_or(300, |s| {
        s.parse::<u32>().ok().filter(|&n| n >= 10).unwrap_or_else(|| {
            eprintln!("step_cost: invalid --steps '{s}': allowed: a whole number of at least 10");
            std::process::exit(2)
        })
    });
    let mut rows = Vec::new();
    for n in SIZES {
        let (times, planned) = measure(n, steps);
        let (p50, p90) = (pct(&times, 50), pct(&times, 90));
        rows.push((n, p50, p90, planned));
    }
    let base = rows[0].1 as f64 / f64::from(rows[0].0);
    if json {
        let doc: Vec<_> = rows
            .iter()
            .map(|&(n, p50, p90, planned)| {
                serde_json::json!({"vcpus": n, "steps": steps, "p50_ns": p50, "p90_ns": p90,
                    "p50_ns_per_vcpu": p50 as f64 / f64::from(n), "per_vcpu_vs_smallest": p50 as f64 / f64::from(n) / base,
                    "planned_vcpus": planned})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return;
    }
    println!("guest loop, {steps} steps per size (median and p90 wall time per step)");
    println!("{:>6} {:>12} {:>12} {:>14} {:>18} {:>8}", "vCPUs", "p50 us", "p90 us", "p50 ns/vCPU", "per vCPU vs 16", "planned");
    for (n, p50, p90, planned) in rows {
        let per = p50 as f64 / f64::from(n);
        println!("{n:>6} {:>12.1} {:>12.1} {per:>14.0} {:>18.2} {planned:>8}", p50 as f64 / 1e3, p90 as f64 / 1e3, per / base);
    }
}
