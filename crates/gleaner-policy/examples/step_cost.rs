//! The guest loop's time per step at 16, 64, 256 and 1024 vCPUs: the cost the agent pays each
//! period and the simulator pays per VM and period, at sizes no machine here has.
//!
//! `cargo run --release -p gleaner-policy --example step_cost [-- --steps N] [--quick] [--json]`
//!
//! Each size gets its own `GuestController`, configured as the agent configures itself on a
//! guest whose kernel offers haltpoll (`guest::setup::decide`: the prior wake-cost curve, kernel
//! polling by window and until work, the governors, consolidation with `Params::default()`, the
//! default plan and start), and `--steps` (default 300) periods of synthetic readings that vary
//! from step to step: each active vCPU's busy share drifts around a load that rises and falls,
//! and its wakeup rate moves through phases of 25 steps (a fast one, a light one in which
//! consolidation takes vCPUs away, one in which a vCPU of every 16 is a bottleneck); its idle
//! entries, steal now and then, the polling time the applied plan makes it spend, and,
//! in every period the controller does not skip tracing (the heaviest case: the tracer at
//! every turn), a traced slice with each vCPU's idle gaps by how they ended and the wakeup
//! latencies by the state the applied plan left the vCPU in. Periods last what the previous
//! step asked (`next_period_ns`). Only `GuestController::step` is timed; the readings are
//! deterministic (a fixed-seed LCG per size), so every run makes the same decisions.
//!
//! It prints, per size, the median and 90th percentile of the wall time per step, the same
//! per vCPU, how the per-vCPU median compares with the smallest size's, how often the
//! applied plan changed and how many vCPUs a step's plan moved to fit the VM share
//! (`PlanReason::VmShare`, each one a pass of the planner's VM-share fit over every vCPU),
//! and last the per-vCPU cost at the largest size over the smallest: a loop that grows at
//! most linearly keeps it near 1 (or below, where fixed per-step costs spread out).
//!
//! `--quick` runs 16 and 64 vCPUs for 20 steps (a smoke run, not a measurement). The unit
//! tests below time nothing: `cargo test -p gleaner-policy --example step_cost`.

use std::time::Instant;

use gleaner_policy::gleaner::{Params, Snapshot, VcpuSample};
use gleaner_policy::guest::setup::{decide, Offer, Prior, SetupInput};
use gleaner_policy::guest::{
    GuestConfig, GuestController, GuestReading, GuestStep, StartConfig, TraceNeed, VcpuIdle, DEFAULT_PERIOD_NS, FIRST_PERIOD_SHARE,
};
use gleaner_policy::idle::plan::{PlanReason, ALWAYS};
use gleaner_policy::idle::{IdlePlan, Mechanism, PlanConfig, TraceSource, VcpuPlan, WakeCurve, WakeTrace};
use gleaner_policy::num::saturating_u64;
use gleaner_policy::retention::{GovernorConfig, WorkloadIo};

const PERIOD_NS: u64 = DEFAULT_PERIOD_NS;
const SIZES: [u32; 4] = [16, 64, 256, 1024];
const QUICK_SIZES: [u32; 2] = [16, 64];
const DEFAULT_STEPS: u32 = 300;
const QUICK_STEPS: u32 = 20;
/// Steps per phase of the workload.
const PHASE_STEPS: u32 = 25;
/// The wakeup rate's multiplier in each phase: 50-450 idle entries per active vCPU and 200 ms
/// (0.1-1 ms idle gaps at half load), 8 times that, a light phase, and a bottleneck phase.
const PHASE_RATE: [f64; 4] = [1.0, 8.0, 0.5, 3.0];
/// The phase in which the whole workload is light, [`LIGHT_UTIL`] vCPUs over every active
/// one: consolidation runs while vCPUs poll only then (`guest::POLL_CONSOLIDATION_UTIL`).
const LIGHT_PHASE: usize = 2;
const LIGHT_UTIL: f64 = 0.1;
/// The phase in which a vCPU of every 16 is 97-99% busy (the planner's bottleneck rule).
const BOTTLENECK_PHASE: usize = 3;

/// A small deterministic generator (64-bit LCG): the readings vary, runs repeat.
#[derive(Debug, Clone)]
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    /// In [0, n).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// In [0, 1).
    fn unit(&mut self) -> f64 {
        self.below(1_000_000) as f64 / 1e6
    }
}

/// The agent's configuration on an `n`-vCPU haltpoll guest (`guest::setup::decide`, as
/// `gleaner-agent` calls it, with the defaults of its configuration file).
fn config(n: u32) -> GuestConfig {
    let curve = WakeCurve::prior();
    let input = SetupInput {
        cpus: (0..n).collect(),
        retention: true,
        fixed_yield_ns: None,
        curve: Ok(&curve),
        offer: Some(Offer { kernel_polling: true, poll_window: true, poll_always: true }),
        kernel_polling: Ok(true),
        workload: true,
        governor: Some(GovernorConfig::default()),
        prior: Prior::Calibrated,
        plan: PlanConfig::default(),
        start: StartConfig::default(),
        consolidation: Some(Params::default()),
        period_ns: PERIOD_NS,
    };
    decide(input, |_| String::new()).guest
}

/// `x` ns scaled by `share`, saturating.
fn share_of(x: u64, share: f64) -> u64 {
    saturating_u64((x as f64 * share).round())
}

/// The synthetic workload on `n` vCPUs: one period's readings at a time.
#[derive(Debug, Clone)]
struct Load {
    n: u32,
    rng: Lcg,
    step: u32,
    /// The length of the coming period (what the last step asked).
    period_ns: u64,
}

impl Load {
    fn new(n: u32) -> Self {
        Self { n, rng: Lcg(0x9e37_79b9 ^ u64::from(n)), step: 0, period_ns: share_of(PERIOD_NS, FIRST_PERIOD_SHARE) }
    }

    /// One period on `active` under `applied` (the plan the coming period runs), traced or not.
    fn reading(&mut self, active: &[u32], applied: &IdlePlan, traced: bool) -> GuestReading {
        let n = self.n as usize;
        let period = self.period_ns.max(1);
        let step = self.step;
        let phase = (step / PHASE_STEPS) as usize % PHASE_RATE.len();
        // Counts are per 200 ms of the phase's rate, scaled to the period.
        let rate = PHASE_RATE[phase] * period as f64 / PERIOD_NS as f64;
        // A load that rises over 40 steps and drops (consolidation sees major changes).
        let load = 0.15 + 0.6 * f64::from(step % 40) / 40.0;
        // The tracer's slice: a fifth of the period up to all of it.
        let slice = period * u64::from(1 + step % 5) / 5;
        let in_slice = slice as f64 / period as f64;
        let mut on = vec![false; n];
        for &c in active {
            if let Some(x) = on.get_mut(c as usize) {
                *x = true;
            }
        }
        let mut plans: Vec<Option<VcpuPlan>> = vec![None; n];
        for v in &applied.vcpus {
            if let Some(x) = plans.get_mut(v.cpu as usize) {
                *x = Some(*v);
            }
        }
        let mut trace = WakeTrace::empty(TraceSource::Bpf, 0..self.n);
        trace.traced_ns = if traced { slice } else { 0 };
        let mut samples = Vec::with_capacity(active.len());
        let mut idle = Vec::with_capacity(n);
        let mut s_work = 0;
        for cpu in 0..self.n {
            let i = cpu as usize;
            let rng = &mut self.rng;
            // Steal: a stall of 35-60 ms in one vCPU-period of 64, else a tick or none.
            let steal = if rng.below(64) == 0 { 35_000_000 + rng.below(25_000_000) } else { rng.below(2) * 10_000_000 / 4 };
            let had = period.saturating_sub(steal);
            let busy = if !on[i] {
                0.0
            } else if phase == LIGHT_PHASE {
                LIGHT_UTIL / active.len().max(1) as f64 * (0.5 + rng.unit())
            } else if phase == BOTTLENECK_PHASE && cpu % 16 == 0 {
                0.97 + 0.02 * rng.unit()
            } else {
                let offset = f64::from((cpu * 37) % 11) / 11.0 * 0.2 - 0.1;
                (load + offset + 0.2 * (rng.unit() - 0.5)).clamp(0.02, 0.99)
            };
            let work = share_of(had, busy).min(had);
            let idle_ns = had - work;
            // Idle entries: the workload's blocks on an active vCPU, a few timer wakeups else.
            let entries = if on[i] { saturating_u64(((50 + rng.below(400)) as f64 * rate).round()).max(1) } else { 1 + rng.below(3) };
            let mean_gap = idle_ns / entries;
            let plan = plans[i].filter(|p| p.mechanism == Mechanism::Poll);
            // Polled: each idle period up to the window (until work: all of it), with noise.
            let poll_ns = plan.map_or(0, |p| {
                let per = if p.window_ns == ALWAYS { mean_gap } else { mean_gap.min(p.window_ns) };
                share_of(per.saturating_mul(entries), 0.8 + 0.3 * rng.unit()).min(idle_ns)
            });
            idle.push(VcpuIdle { cpu, idle_ns, entries: Some(entries), poll_ns, yield_ns: 0, steal_ns: steal });
            if on[i] {
                samples.push(VcpuSample { cpu, t_work_ns: work, t_yield_ns: 0, t_idle_ns: idle_ns, s_yield: entries });
                s_work += entries * 3 / 4;
            }
            if !traced {
                continue;
            }
            // The slice's idle periods: three quarters woken by the workload (short, typical
            // and long gaps), the rest ended by another task, and a timer's local wakeup.
            let seen = share_of(entries, in_slice);
            let woken = if on[i] { seen * 3 / 4 } else { 0 };
            let g = &mut trace.vcpus[i];
            g.woken.record_n(mean_gap * 3 / 10 + rng.below(2_000), woken * 2 / 5);
            g.woken.record_n(mean_gap + rng.below(mean_gap / 4 + 1), woken * 2 / 5);
            g.woken.record_n(mean_gap * 22 / 10, woken - 2 * (woken * 2 / 5));
            g.other.record_n(share_of(mean_gap, 0.8 + 0.4 * rng.unit()), seen - woken);
            g.local.record_n(4_000_000 + rng.below(100_000), u64::from(rng.below(4) == 0));
            // Their wakeups, by the state the plan left the vCPU in: a tenth found it busy;
            // of the rest, a polling vCPU caught those inside its window.
            let busy_wakes = woken / 10;
            let caught = plan.map_or(0, |p| {
                let share = if p.window_ns == ALWAYS { 1.0 } else { (p.window_ns as f64 / (2.0 * mean_gap.max(1) as f64)).min(1.0) };
                share_of(woken - busy_wakes, share)
            });
            trace.latency.busy.record_n(10_000 + rng.below(30_000), busy_wakes);
            trace.latency.poll.record_n(3_000 + rng.below(5_000), caught);
            trace.latency.halt.record_n(25_000 + rng.below(65_000), woken - busy_wakes - caught);
        }
        GuestReading {
            snapshot: Snapshot { period_ns: period, vcpus: samples, s_work, pinned: Vec::new() },
            idle,
            trace: traced.then_some(trace),
            caught: Vec::new(),
            io: WorkloadIo::default(),
            counter: None,
            agent_work_ns: 0,
            // Now and then a trace that missed a tenth of the sync points (set aside).
            trace_missed: if traced && step % 37 == 36 { 0.15 } else { 0.0 },
        }
    }
}

/// A controller and its synthetic workload.
#[derive(Debug, Clone)]
struct Run {
    g: GuestController,
    load: Load,
}

impl Run {
    fn new(n: u32) -> Self {
        Self { g: GuestController::new(config(n)), load: Load::new(n) }
    }

    /// The coming period's readings: traced unless the controller says to skip it.
    fn reading(&mut self) -> GuestReading {
        let traced = self.g.trace_need() != TraceNeed::Skip;
        self.load.reading(&self.g.active(), self.g.applied(), traced)
    }

    /// After a step: the next period lasts what it asked.
    fn after(&mut self, s: &GuestStep) {
        self.load.period_ns = s.next_period_ns;
        self.load.step += 1;
    }
}

/// One size's measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Row {
    vcpus: u32,
    p50_ns: u64,
    p90_ns: u64,
    /// The most vCPUs a step's plan covered.
    planned_vcpus: usize,
    /// Steps after which the applied plan ran differently from the one before.
    plan_changes: u32,
    /// vCPUs per step the planner moved to fit the VM share, mean.
    vm_share_vcpus: f64,
}

impl Row {
    fn p50_per_vcpu(&self) -> f64 {
        self.p50_ns as f64 / f64::from(self.vcpus)
    }

    fn p90_per_vcpu(&self) -> f64 {
        self.p90_ns as f64 / f64::from(self.vcpus)
    }
}

/// The `pct`-th percentile (0..=100) of `sorted`, by nearest rank.
fn pct(sorted: &[u64], pct: usize) -> u64 {
    sorted.get(sorted.len().saturating_sub(1) * pct / 100).copied().unwrap_or(0)
}

/// `steps` steps at `n` vCPUs, each `GuestController::step` timed alone.
fn measure(n: u32, steps: u32) -> Row {
    let mut run = Run::new(n);
    let mut times = Vec::with_capacity(steps as usize);
    let (mut planned_vcpus, mut plan_changes, mut vm_share) = (0, 0, 0usize);
    let mut before = run.g.applied().clone();
    for _ in 0..steps {
        let r = run.reading();
        let t0 = Instant::now();
        let s = run.g.step(&r);
        let dt = t0.elapsed();
        times.push(u64::try_from(dt.as_nanos()).unwrap_or(u64::MAX));
        planned_vcpus = planned_vcpus.max(s.plan.vcpus.len());
        plan_changes += u32::from(!s.plan.runs_as(&before));
        vm_share += s.planned.vcpus.iter().filter(|v| v.why == PlanReason::VmShare).count();
        before = s.plan.clone();
        run.after(&s);
    }
    times.sort_unstable();
    Row {
        vcpus: n,
        p50_ns: pct(&times, 50),
        p90_ns: pct(&times, 90),
        planned_vcpus,
        plan_changes,
        vm_share_vcpus: vm_share as f64 / f64::from(steps.max(1)),
    }
}

/// The per-vCPU cost at the largest size over the smallest's, (p50, p90).
fn ratio(rows: &[Row]) -> Option<(f64, f64)> {
    let (first, last) = (rows.first()?, rows.last()?);
    Some((
        last.p50_per_vcpu() / first.p50_per_vcpu().max(f64::MIN_POSITIVE),
        last.p90_per_vcpu() / first.p90_per_vcpu().max(f64::MIN_POSITIVE),
    ))
}

fn json(rows: &[Row], steps: u32) -> serde_json::Value {
    let base = rows.first().map_or(1.0, Row::p50_per_vcpu).max(f64::MIN_POSITIVE);
    let sizes: Vec<_> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "vcpus": r.vcpus,
                "p50_ns": r.p50_ns,
                "p90_ns": r.p90_ns,
                "p50_ns_per_vcpu": r.p50_per_vcpu(),
                "p90_ns_per_vcpu": r.p90_per_vcpu(),
                "p50_per_vcpu_vs_smallest": r.p50_per_vcpu() / base,
                "planned_vcpus": r.planned_vcpus,
                "plan_changes": r.plan_changes,
                "vm_share_vcpus_per_step": r.vm_share_vcpus,
            })
        })
        .collect();
    let ratio = ratio(rows).map(|(p50, p90)| {
        serde_json::json!({
            "smallest": rows.first().map(|r| r.vcpus),
            "largest": rows.last().map(|r| r.vcpus),
            "p50": p50,
            "p90": p90,
        })
    });
    serde_json::json!({ "steps": steps, "period_ns": PERIOD_NS, "sizes": sizes, "per_vcpu_ratio_largest_to_smallest": ratio })
}

fn table(rows: &[Row], steps: u32) -> String {
    use std::fmt::Write as _;
    let base = rows.first().map_or(1.0, Row::p50_per_vcpu).max(f64::MIN_POSITIVE);
    let smallest = rows.first().map_or(0, |r| r.vcpus);
    let mut out = format!("guest loop, {steps} steps per size: wall time per step (median, p90), per step and per vCPU\n");
    let _ = writeln!(
        out,
        "{:>6} {:>10} {:>10} {:>12} {:>12} {:>10} {:>8} {:>13} {:>15}",
        "vCPUs",
        "p50 us",
        "p90 us",
        "p50 ns/vCPU",
        "p90 ns/vCPU",
        format!("vs {smallest}"),
        "planned",
        "plan changes",
        "vm-share/step"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:>6} {:>10.1} {:>10.1} {:>12.0} {:>12.0} {:>10.2} {:>8} {:>13} {:>15.1}",
            r.vcpus,
            r.p50_ns as f64 / 1e3,
            r.p90_ns as f64 / 1e3,
            r.p50_per_vcpu(),
            r.p90_per_vcpu(),
            r.p50_per_vcpu() / base,
            r.planned_vcpus,
            r.plan_changes,
            r.vm_share_vcpus
        );
    }
    if let (Some((p50, p90)), Some(last)) = (ratio(rows), rows.last()) {
        let _ = writeln!(
            out,
            "per-vCPU cost at {} vCPUs over at {smallest}: {p50:.2} (p50), {p90:.2} (p90); about 1 or less: at most linear",
            last.vcpus
        );
    }
    out
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut json_out, mut quick, mut steps) = (false, false, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => json_out = true,
            "--quick" => quick = true,
            "--steps" => {
                let s = it.next().map_or("", String::as_str);
                steps = Some(s.parse::<u32>().ok().filter(|&n| n >= 10).unwrap_or_else(|| {
                    eprintln!("step_cost: invalid --steps '{s}': allowed: a whole number of at least 10");
                    std::process::exit(2)
                }));
            }
            other => {
                eprintln!("step_cost: unknown argument '{other}': allowed: --steps N, --quick, --json");
                std::process::exit(2)
            }
        }
    }
    let sizes: &[u32] = if quick { &QUICK_SIZES } else { &SIZES };
    let steps = steps.unwrap_or(if quick { QUICK_STEPS } else { DEFAULT_STEPS });
    let rows: Vec<Row> = sizes.iter().map(|&n| measure(n, steps)).collect();
    if json_out {
        println!("{}", serde_json::to_string_pretty(&json(&rows, steps)).unwrap_or_default());
    } else {
        print!("{}", table(&rows, steps));
    }
}

/// What the loop does at each size, counted, not timed (shared machines are noisy).
#[cfg(test)]
mod tests {
    use super::*;

    /// Steps per size: the start plan, the first traced periods and the first plans.
    const TEST_STEPS: u32 = 10;

    fn cpus_of(plan: &IdlePlan) -> Vec<u32> {
        plan.vcpus.iter().map(|v| v.cpu).collect()
    }

    /// `steps` readings and steps at `n` vCPUs.
    fn run(n: u32, steps: u32) -> Vec<(GuestReading, GuestStep)> {
        let mut run = Run::new(n);
        (0..steps)
            .map(|_| {
                let r = run.reading();
                let s = run.g.step(&r);
                run.after(&s);
                (r, s)
            })
            .collect()
    }

    #[test]
    fn every_step_plans_every_vcpu_once_at_every_size() {
        for n in SIZES {
            let all: Vec<u32> = (0..n).collect();
            for (k, (r, s)) in run(n, TEST_STEPS).iter().enumerate() {
                assert_eq!(r.idle.len(), n as usize, "{n} vCPUs, step {k}: a reading of every vCPU");
                assert!(r.trace.as_ref().is_none_or(|t| t.vcpus.len() == n as usize));
                assert_eq!(cpus_of(&s.plan), all, "{n} vCPUs, step {k}: the applied plan covers each vCPU once");
                assert_eq!(cpus_of(&s.planned), all, "{n} vCPUs, step {k}: so does the planner's");
                assert_eq!(s.budget.iter().map(|b| b.0).collect::<Vec<_>>(), all, "{n} vCPUs, step {k}: a budget per vCPU");
                assert!(!s.active.is_empty() && s.active.windows(2).all(|w| w[0] < w[1]) && s.active.iter().all(|&c| c < n));
                assert!(s.plan.poll_always.iter().all(|&c| c < n) && s.plan.poll_always.len() <= n as usize);
                // Consolidation moves one vCPU a period (or gives them all back): its
                // decisions do not grow with the vCPUs.
                assert!(s.decisions.len() <= 3, "{n} vCPUs, step {k}: {:?}", s.decisions);
            }
        }
    }

    #[test]
    fn a_steps_input_and_output_grow_linearly_with_the_vcpus() {
        // Bytes per vCPU of the readings and of the steps (as JSON), over the same steps.
        let per_vcpu: Vec<(u32, f64, f64)> = SIZES
            .iter()
            .map(|&n| {
                let (mut input, mut output) = (0, 0);
                for (r, s) in run(n, TEST_STEPS) {
                    input += serde_json::to_string(&r).expect("a reading serializes").len();
                    output += serde_json::to_string(&s).expect("a step serializes").len();
                }
                let per = |bytes: usize| bytes as f64 / f64::from(n * TEST_STEPS);
                (n, per(input), per(output))
            })
            .collect();
        let (_, in16, out16) = per_vcpu[0];
        for &(n, input, output) in &per_vcpu {
            // At most linear: what a step reads and answers per vCPU stays within a band of
            // the smallest size's (fixed parts, the governor's step and epoch, spread out).
            assert!((0.5..=1.5).contains(&(input / in16)), "{n} vCPUs: {input:.0} bytes per vCPU read, {in16:.0} at 16");
            assert!((0.5..=1.5).contains(&(output / out16)), "{n} vCPUs: {output:.0} bytes per vCPU answered, {out16:.0} at 16");
        }
    }

    #[test]
    fn the_readings_repeat_and_the_plans_move() {
        let steps = 3 * PHASE_STEPS;
        let a = run(64, steps);
        assert_eq!(a, run(64, steps), "the same readings and steps every run");
        let changes = a.windows(2).filter(|w| !w[1].1.plan.runs_as(&w[0].1.plan)).count();
        assert!(changes >= 2, "the plan changed {changes} times in {steps} steps");
        let traced = a.iter().filter(|(r, _)| r.trace.as_ref().is_some_and(|t| t.traced_ns > 0)).count();
        assert!(traced > 0 && traced < a.len(), "{traced} of {steps} periods traced: the first second is not");
        assert!(a.iter().any(|(_, s)| !s.decisions.is_empty()), "consolidation decides at some step");
        assert!(a.windows(2).any(|w| w[0].0.snapshot.vcpus.len() != w[1].0.snapshot.vcpus.len()), "the active set moves");
    }

    #[test]
    fn the_table_and_the_json_report_every_size_and_the_ratio() {
        let row = |vcpus: u32, p50_ns: u64| Row {
            vcpus,
            p50_ns,
            p90_ns: 2 * p50_ns,
            planned_vcpus: vcpus as usize,
            plan_changes: 3,
            vm_share_vcpus: 0.5,
        };
        let rows = [row(16, 160_000), row(1024, 10_240_000)];
        let (p50, p90) = ratio(&rows).expect("two sizes");
        assert!((p50 - 1.0).abs() < 1e-9 && (p90 - 1.0).abs() < 1e-9);
        let j = json(&rows, 300);
        assert_eq!(j["sizes"].as_array().map(Vec::len), Some(2));
        assert_eq!(j["sizes"][1]["p50_ns_per_vcpu"], 10_000.0);
        assert_eq!(j["per_vcpu_ratio_largest_to_smallest"]["largest"], 1024);
        let t = table(&rows, 300);
        assert_eq!(t.lines().count(), 5, "{t}");
        assert!(t.contains("at 1024 vCPUs over at 16: 1.00 (p50)"), "{t}");
    }
}
