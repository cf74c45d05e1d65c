//! The guest loop on synthetic periods: the shared readings here, with the plan, the governor,
//! consolidation and the agent's own cost; the rest by topic in the files below.

mod load;
mod start;
mod trace;
mod windows;

use super::*;
use crate::gleaner::VcpuSample;
use crate::idle::curve::CurvePoint;
use crate::idle::plan::{Mechanism, PlanReason, ALWAYS};
use crate::retention::ProgressUnit;

const PERIOD: u64 = 200_000_000;

fn pt(gap_us: u64, mean_us: u64) -> CurvePoint {
    CurvePoint { gap_ns: gap_us * 1000, mean_ns: mean_us * 1000, p50_ns: mean_us * 1000 }
}

fn curve() -> WakeCurve {
    WakeCurve::new(vec![pt(10, 49), pt(100, 46), pt(1000, 58), pt(10_000, 116)], 40_000, Some(7_000))
}

fn cfg(means: Means) -> GuestConfig {
    GuestConfig {
        cpus: vec![0, 1],
        consolidation: None,
        // A host that does not cap the VM's CPU (the fixtures' vCPU 0 spins): the VM share
        // is the planner's, tested there.
        plan: PlanConfig { vm_share: 1.0, ..PlanConfig::default() },
        means,
        curve: Some(curve()),
        governor: Some(GovernorConfig::default()),
        prior: RetentionMode::On,
        fixed_yield_ns: None,
        // Traced from the first period: the tests drive the tracer's rules.
        start: StartConfig { trace_after_ns: 0, until_work: false, ..StartConfig::default() },
        period_ns: PERIOD,
        priors: LoopPriors::DEFAULT,
    }
}

const HALTPOLL: Means = Means { poll_window: true, poll_always: true, yielders: true };

fn snapshot(s_work: u64) -> Snapshot {
    let v = |cpu| VcpuSample { cpu, t_work_ns: PERIOD / 10, t_yield_ns: 0, t_idle_ns: PERIOD * 9 / 10, s_yield: 100 };
    Snapshot { period_ns: PERIOD, vcpus: vec![v(0), v(1)], s_work, pinned: Vec::new() }
}

/// Every vCPU of `s` busy `work_ns` of the period and idle the rest.
fn set_work(s: &mut Snapshot, work_ns: u64) {
    for v in &mut s.vcpus {
        v.t_work_ns = work_ns;
        v.t_idle_ns = PERIOD - work_ns;
    }
}

/// A server on vCPU 1 woken 2,000 times a second after ~480 us idle; vCPU 0 spins.
fn server_period(poll_ns: u64, wake_ns: u64) -> GuestReading {
    let mut t = WakeTrace::empty(TraceSource::Bpf, [0, 1]);
    t.traced_ns = PERIOD;
    t.vcpus[1].woken.record_n(480_000, 400);
    t.latency.halt.record_n(wake_ns, 400);
    GuestReading {
        snapshot: snapshot(400),
        idle: vec![
            VcpuIdle { cpu: 0, ..VcpuIdle::default() },
            VcpuIdle { cpu: 1, idle_ns: 192_000_000, entries: Some(400), poll_ns, yield_ns: 0, steal_ns: 0 },
        ],
        trace: Some(t),
        caught: Vec::new(),
        io: WorkloadIo::default(),
        counter: None,
        agent_work_ns: 0,
        trace_missed: 0.0,
    }
}

/// The haltpoll governor's window only (no per-CPU always-polling).
const WINDOW_ONLY: Means = Means { poll_window: true, poll_always: false, yielders: false };

/// A server on vCPU 1 woken 400 times a period after `gap_ns` idle, the kernel having polled
/// `poll_share` of the period there.
fn server_gaps(gap_ns: u64, poll_share: f64) -> GuestReading {
    let mut r = server_period(crate::num::saturating_u64(PERIOD as f64 * poll_share), 50_000);
    let t = r.trace.as_mut().unwrap();
    t.vcpus[1].woken = Log2Hist::default();
    t.vcpus[1].woken.record_n(gap_ns, 400);
    r
}

/// A period of nginx with 50 wrk connections: wrk's vCPU 0 woken often and idle a fifth of its
/// time, nginx's vCPU 1 idle `nginx_idle` of its time (its bottleneck under 5%).
fn nginx_c50_period(nginx_idle: f64) -> GuestReading {
    let mut t = WakeTrace::empty(TraceSource::Bpf, [0, 1]);
    t.traced_ns = PERIOD;
    t.vcpus[0].woken.record_n(10_000, 4_000);
    t.latency.halt.record_n(30_000, 4_000);
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // a share in [0, 1] of a period
    let idle1 = (PERIOD as f64 * nginx_idle) as u64;
    GuestReading {
        snapshot: snapshot(8_000),
        idle: vec![
            VcpuIdle { cpu: 0, idle_ns: PERIOD / 5, entries: Some(4_000), poll_ns: 0, yield_ns: 0, steal_ns: 0 },
            VcpuIdle { cpu: 1, idle_ns: idle1, entries: Some(10), poll_ns: 0, yield_ns: 0, steal_ns: 0 },
        ],
        trace: Some(t),
        caught: Vec::new(),
        io: WorkloadIo::default(),
        counter: None,
        agent_work_ns: 0,
        trace_missed: 0.0,
    }
}

#[test]
fn a_traced_server_gets_kernel_polling_covering_its_idle_periods() {
    let mut g = GuestController::new(cfg(HALTPOLL));
    // Before anything was seen: the kernel's upstream haltpoll window.
    assert_eq!(g.applied(), &IdlePlan::initial_poll([0, 1], INITIAL_POLL_WINDOW_NS));
    let yielders = GuestController::new(cfg(Means { poll_window: false, poll_always: false, yielders: true }));
    assert!(!yielders.applied().retains(), "yielders wait for the plan");
    let s = g.step(&server_period(0, 50_000));
    assert_eq!(s.gaps_from, Some(TraceSource::Bpf));
    let v = s.plan.of(1).unwrap();
    assert_eq!(v.mechanism, Mechanism::Poll);
    assert!(v.window_ns == ALWAYS || v.window_ns > 480_000, "{v:?}");
    assert_eq!(s.mode, RetentionMode::On);
    assert!(g.applied().retains());
}

#[test]
fn without_a_tracer_idle_periods_are_estimated_from_cpuidle_and_the_workloads_blocks() {
    let mut r = server_period(0, 50_000);
    r.trace = None;
    let est = estimate_gaps(&r);
    assert_eq!(est.source, TraceSource::Estimated);
    assert_eq!(est.gaps(1).unwrap().all().count(), 400);
    assert_eq!(est.gaps(1).unwrap().woken.count(), 400);
    assert_eq!(est.gaps(0).unwrap().all().count(), 0);
    let mut g = GuestController::new(cfg(HALTPOLL));
    let s = g.step(&r);
    assert_eq!(s.gaps_from, Some(TraceSource::Estimated));
    assert!(s.plan.of(1).unwrap().mechanism == Mechanism::Poll, "{:?}", s.plan);
}

#[test]
fn a_vcpu_that_polled_past_its_budget_gets_a_smaller_one() {
    let mut c = cfg(HALTPOLL);
    c.plan.budget = 0.5;
    let mut g = GuestController::new(c);
    // The kernel polled 90% of the period on vCPU 1.
    let s = g.step(&server_period(PERIOD * 9 / 10, 50_000));
    let b1 = s.budget.iter().find(|(c, _)| *c == 1).unwrap().1;
    assert!(b1 < 0.3, "{:?}", s.budget);
    assert!(s.plan.of(1).unwrap().estimate.cost_share <= b1 + 1e-9, "{:?}", s.plan);
    // Back within budget, it relaxes towards the configured one.
    let mut last = b1;
    for _ in 0..20 {
        last = g.step(&server_period(0, 50_000)).budget.iter().find(|(c, _)| *c == 1).unwrap().1;
    }
    assert!((last - 0.5).abs() < 1e-9, "{last}");
}

#[test]
fn off_means_every_vcpu_halts_and_a_probe_keeps_consolidation_still() {
    let mut c = cfg(HALTPOLL);
    c.prior = RetentionMode::Off;
    c.consolidation = Some(Params::default());
    let mut g = GuestController::new(c);
    let mut probes = 0;
    // Kernel polling measured to gain a lot: the first probe comes after probe_every_max.
    for _ in 0..40 {
        let probing = g.probing();
        let s = g.step(&server_period(0, 50_000));
        if s.mode == RetentionMode::Off {
            assert!(!s.plan.retains(), "{:?}", s.plan);
            assert!(s.planned.retains(), "the plan is still made");
        }
        if probing {
            probes += 1;
            assert!(s.decisions.is_empty());
        }
        if g.probing() {
            assert_eq!(s.next_period_share, LoopPriors::DEFAULT.probe_share);
        } else {
            assert!([1.0, LoopPriors::DEFAULT.calm_period_share].contains(&s.next_period_share), "{}", s.next_period_share);
        }
    }
    assert!(probes >= 1);
}

#[test]
fn the_governor_keeps_polling_that_shortens_wakeups() {
    let mut g = GuestController::new(cfg(HALTPOLL));
    for _ in 0..300 {
        let poll = if g.mode().is_on() { PERIOD * 9 / 10 } else { 0 };
        let wake = if g.mode().is_on() { 6_000 } else { 50_000 };
        g.step(&server_period(poll, wake));
    }
    let st = g.governor_state().unwrap();
    assert_eq!(st.baseline, RetentionMode::On);
    assert!(st.comparisons >= 3 && st.switches == 0, "{st:?}");
    // Wakeups 8x faster: a clear pay, so the probes of off back off beyond probe_every_max.
    assert!(st.probe_every > GovernorConfig::default().probe_every_max, "{st:?}");
}

#[test]
fn no_curve_no_retention() {
    let mut c = cfg(HALTPOLL);
    c.curve = None;
    let mut g = GuestController::new(c);
    assert!(!g.step(&server_period(0, 50_000)).plan.retains());
}

#[test]
fn yielders_only_with_a_busy_vcpu_barely_faster_is_an_unpromising_prior() {
    let mut c = cfg(Means { poll_window: false, poll_always: false, yielders: true });
    c.curve = Some(WakeCurve::new(vec![pt(10, 60), pt(10_000, 65)], 55_000, None));
    assert_eq!(c.prior_strength(), PriorStrength::Unpromising);
    // Kernel polling measured 7 us against 116 us halted: probed late too.
    assert_eq!(cfg(HALTPOLL).prior_strength(), PriorStrength::Confident);
    let mut flat = cfg(HALTPOLL);
    flat.curve = Some(WakeCurve::new(vec![pt(10, 20), pt(10_000, 22)], 20_000, Some(19_000)));
    assert_eq!(flat.prior_strength(), PriorStrength::Plain);
}

#[test]
fn the_same_readings_give_the_same_steps() {
    let run = || {
        let mut g = GuestController::new(cfg(HALTPOLL));
        (0..50).map(|k| g.step(&server_period(k * 1000, 40_000 + k))).collect::<Vec<_>>()
    };
    assert_eq!(run(), run());
}

#[test]
fn a_fixed_window_yields_on_every_vcpu_from_the_start() {
    let mut c = cfg(HALTPOLL);
    c.governor = None;
    c.fixed_yield_ns = Some(100_000);
    let mut g = GuestController::new(c);
    assert!(g.applied().vcpus.iter().all(|v| v.mechanism == Mechanism::Yield && v.window_ns == 100_000));
    let s = g.step(&server_period(0, 50_000));
    assert_eq!(s.plan, IdlePlan::fixed_yield([0, 1], 100_000));
}

#[test]
fn under_kernel_polling_only_a_light_workload_is_consolidated() {
    // The server period at 0.05 vCPUs of work each: light, so consolidation runs while the
    // vCPUs poll (an idle vCPU 0 is given up).
    let mut c = cfg(HALTPOLL);
    c.consolidation = Some(Params::default());
    let light = || {
        let mut r = server_period(0, 50_000);
        for v in &mut r.snapshot.vcpus {
            v.t_work_ns = PERIOD / 20;
            v.t_idle_ns = PERIOD * 19 / 20;
        }
        r
    };
    // Not before the workload was seen: the same light periods with no traced wakeups (a
    // server before its first client) keep every vCPU under the start plan's polling.
    let unseen = || {
        let mut r = light();
        let t = r.trace.as_mut().unwrap();
        t.vcpus[1].woken = Log2Hist::default();
        t.latency = Default::default();
        r
    };
    let mut g = GuestController::new(c.clone());
    for _ in 0..10 {
        let s = g.step(&unseen());
        assert_eq!(s.active, vec![0, 1], "{:?}", s.decisions);
        assert!(g.applied().vcpus.iter().any(|v| v.mechanism == Mechanism::Poll), "{:?}", g.applied());
    }
    let shrank = (0..10).any(|_| g.step(&light()).active.len() < 2);
    assert!(shrank);
    assert!(g.applied().vcpus.iter().any(|v| v.mechanism == Mechanism::Poll), "{:?}", g.applied());
    // The vCPU left hosts the whole workload now: its next period is traced to plan from.
    assert_eq!(g.trace_need(), TraceNeed::Now);
    // The same at 0.4 vCPUs each (0.8 in all, over priors.poll_consolidation_util): too busy to
    // pack while polling; every vCPU stays.
    let busy = || {
        let mut r = server_period(0, 50_000);
        for v in &mut r.snapshot.vcpus {
            v.t_work_ns = PERIOD * 4 / 10;
            v.t_idle_ns = PERIOD * 6 / 10;
        }
        r
    };
    let mut g = GuestController::new(c);
    for _ in 0..10 {
        let s = g.step(&busy());
        assert_eq!(s.active, vec![0, 1], "{:?}", s.decisions);
    }
    // Yielders only: the paper's consolidation runs whatever the load (its own conditions
    // decide: here l_comp <= l_idle holds).
    let mut c = cfg(Means { poll_window: false, poll_always: false, yielders: true });
    c.consolidation = Some(Params::default());
    let mut g = GuestController::new(c);
    let shrank = (0..10).any(|_| g.step(&busy()).active.len() < 2);
    assert!(shrank);
}

/// The host took the vCPU away (steal) while it polled: the budget halves at once and grows
/// back only slowly; steal while nothing was retained is not retention's doing.
#[test]
fn steal_while_retaining_halves_the_budget_and_it_comes_back_slowly() {
    let mut g = GuestController::new(cfg(HALTPOLL));
    let budget = |s: &GuestStep| s.budget.iter().find(|(c, _)| *c == 1).unwrap().1;
    let polling = server_period(PERIOD / 2, 50_000);
    assert_eq!(budget(&g.step(&polling)), 1.0);
    let mut stolen = polling.clone();
    stolen.idle[1].steal_ns = PERIOD / 2;
    let s = g.step(&stolen);
    assert!(budget(&s) <= 0.5, "{:?}", s.budget);
    let s = g.step(&stolen);
    assert!(budget(&s) <= 0.25, "{:?}", s.budget);
    // Ten quiet periods later it has grown by a fifth at most.
    let after = (0..10).map(|_| g.step(&polling)).last().unwrap();
    assert!(budget(&after) > 0.25 && budget(&after) < 0.31, "{:?}", after.budget);
    // The plan honours the cut: what it expects to spend fits the budget.
    let v = after.planned.of(1).unwrap();
    assert!(v.estimate.cost_share <= budget(&after) + 1e-9, "{v:?}");
    // One or two USER_HZ ticks of steal (10 ms each in /proc/stat) are its rounding: no cut,
    // even where they are over 2% of the period.
    let mut g = GuestController::new(cfg(HALTPOLL));
    g.step(&polling);
    let mut ticks = polling.clone();
    ticks.idle[1].steal_ns = 20_000_000;
    assert!(ticks.idle[1].steal_ns as f64 > 0.02 * PERIOD as f64);
    assert_eq!(budget(&g.step(&ticks)), 1.0);
    // Steal with nothing retained (a halted vCPU): no cut.
    let mut g = GuestController::new(cfg(HALTPOLL));
    let mut idle = server_period(0, 50_000);
    idle.idle[1].steal_ns = PERIOD / 2;
    assert_eq!(budget(&g.step(&idle)), 1.0);
}

/// On a host that runs others beside the VM (it meets steal), a vCPU kept runnable takes turns
/// the host would give the co-runner, charged to the VM: the planner's price rises by the
/// contention (steal over the time the vCPUs were runnable). Steal of a tick or two is the
/// counters' rounding, and without steal the price is as configured.
#[test]
fn on_a_contended_host_a_retained_nanosecond_costs_the_contention() {
    // The server of `server_period`: vCPU 1 idle 480 us 400 times a period, polling through
    // them costing 0.96 of it and saving 51 us each at the calibrated costs; vCPU 0 (which
    // retains nothing, so no budget is cut) stolen `steal_ns`.
    let period = |steal_ns: u64| {
        let mut r = server_period(PERIOD / 2, 50_000);
        r.idle[0].steal_ns = steal_ns;
        r
    };
    let covers = |s: &GuestStep| s.planned.of(1).unwrap().estimate.caught_share > 0.9;
    let mut g = GuestController::new(cfg(HALTPOLL));
    assert!(covers(&g.step(&period(0))), "no steal: polling pays at the configured price");
    // A third of the runnable time stolen.
    let s = g.step(&period(PERIOD / 2));
    assert!(!covers(&s), "{:?}", s.planned);
    // Smoothed with the steal-free period before: half of 100 ms over 308 ms runnable.
    assert!((g.host_wait.price() - 0.5 * 100.0 / 308.0).abs() < 0.01, "{}", g.host_wait.price());
    assert!(covers(&g.step(&period(0))), "the host gave the pCPUs back");
    let mut g = GuestController::new(cfg(HALTPOLL));
    assert!(covers(&g.step(&period(20_000_000))), "two ticks of steal: the counters' rounding");
    assert_eq!(g.host_wait.price(), 0.0);
}

/// A VM whose vCPUs are mostly halted (a 16-vCPU VM running one lock holder at a time) meets
/// the host's contention on the few it runs: its steal is judged against the time they were
/// runnable, not diluted by the halted ones.
#[test]
fn steal_on_the_few_runnable_vcpus_of_a_mostly_halted_vm_is_contention() {
    let reading = |steal_ns: u64| GuestReading {
        snapshot: snapshot(1_000),
        idle: (0..16)
            .map(|cpu| VcpuIdle {
                cpu,
                // vCPU 0 runs the whole period; the others halt through it.
                idle_ns: if cpu == 0 { 0 } else { PERIOD },
                entries: Some(if cpu == 0 { 0 } else { 1 }),
                poll_ns: 0,
                yield_ns: 0,
                steal_ns: if cpu == 0 { steal_ns } else { 0 },
            })
            .collect(),
        trace: None,
        caught: Vec::new(),
        io: WorkloadIo::default(),
        counter: None,
        agent_work_ns: 0,
        trace_missed: 0.0,
    };
    let cpus: Vec<u32> = (0..16).collect();
    let priors = LoopPriors::DEFAULT;
    // 50 ms stolen: under 2% of the 16 vCPUs' 3.2 s, a fifth of vCPU 0's runnable 250 ms.
    let mut w = observe::HostWait::default();
    w.observe(&reading(50_000_000), &cpus, PERIOD, &priors, 50);
    assert!(w.contended && w.price() > 0.1, "{w:?}");
    // The counters' rounding (two ticks) is still none.
    let mut w = observe::HostWait::default();
    w.observe(&reading(20_000_000), &cpus, PERIOD, &priors, 50);
    assert!(!w.contended && w.price() == 0.0, "{w:?}");
}

/// On a contended host a wakeup for a runnable vCPU also waits while the host runs the other:
/// the loop prices retention by the wakeups it traced onto runnable vCPUs while it met the
/// steal, where they cost more than calibrated; without steal, for a handful of wakeups or a
/// measure cheaper than calibrated, the calibration stands.
#[test]
fn on_a_contended_host_retention_is_priced_by_the_runnable_wakeups_it_measured() {
    // A server on vCPU 1 idle 50 us 400 times a period (polling through them costs a tenth of
    // it, so a little contention leaves it paying), its wakeups onto the polling vCPU measured
    // at `wake_ns`, and vCPU 0 stolen `steal_ns`.
    let period = |wake_ns: u64, n: u64, steal_ns: u64| {
        let mut r = server_gaps(50_000, 0.1);
        r.trace.as_mut().unwrap().latency.poll.record_n(wake_ns, n);
        r.idle[0].steal_ns = steal_ns;
        r
    };
    let covers = |s: &GuestStep| s.planned.of(1).unwrap().estimate.caught_share > 0.9;
    let stolen = 40_000_000;
    let mut g = GuestController::new(cfg(HALTPOLL));
    assert!(covers(&g.step(&period(2_000_000, 400, 0))), "no steal: the calibration stands");
    let s = g.step(&period(2_000_000, 400, stolen));
    assert!(!covers(&s), "2 ms a wakeup onto a runnable vCPU: catching it saves nothing: {:?}", s.planned);
    assert!(covers(&g.step(&period(0, 0, 0))), "the host gave the pCPUs back");
    // Too few wakeups to measure, or the measure cheaper than calibrated: the contention's
    // price alone, under which this server still pays.
    let mut g = GuestController::new(cfg(HALTPOLL));
    assert!(covers(&g.step(&period(2_000_000, 10, stolen))));
    let mut g = GuestController::new(cfg(HALTPOLL));
    assert!(covers(&g.step(&period(1_000, 400, stolen))));
}

/// The agent's period work runs in the background (SCHED_IDLE) for a workload that leaves
/// idle time and blocks a few thousand times a second per vCPU (a server at 2,000 requests a
/// second), at its own priority for a ping-pong (its wakeups would chop the work) and for a
/// saturated VM (above).
#[test]
fn the_agent_runs_in_the_background_only_for_a_slow_workload_with_idle_time() {
    let mut g = GuestController::new(cfg(HALTPOLL));
    assert!(!g.agent_in_background(), "before the first period, at its own priority: the VM may be saturated");
    g.step(&server_period(0, 50_000));
    assert!(g.agent_in_background(), "2,000 sync points a second");
    // Sync points in a period of the two vCPUs: the limit is 2,000 (5,000 a second each).
    assert_eq!(LoopPriors::DEFAULT.background_max_rate * 2.0 * PERIOD as f64 / 1e9, 2_000.0);
    let with_sync_points = |n: u64| {
        let mut r = server_period(0, 50_000);
        r.snapshot.s_work = n;
        r
    };
    g.step(&with_sync_points(36_000));
    assert!(!g.agent_in_background(), "a ping-pong's rate (90,000 a second per vCPU)");
    assert!(g.agent_paced(), "at the workload's priority, but stepping aside for its wakeups");
    g.step(&with_sync_points(2_000));
    assert!(g.agent_in_background(), "at the limit");
    g.step(&with_sync_points(2_020));
    assert!(!g.agent_in_background(), "over it");
}

/// Where the agent's own work in two periods in a row would take more than priors.agent_work_share
/// of a vCPU, the periods lengthen (up to priors.max_period_stretch times); a probe stays its share
/// of it. One costly period (the tracer's load) lengthens nothing.
#[test]
fn the_agents_own_cost_lengthens_its_periods() {
    let mut g = GuestController::new(cfg(HALTPOLL));
    let r = server_period(0, 50_000);
    assert_eq!(g.step(&r).next_period_ns, PERIOD, "a cheap period: the configured length");
    let costly = GuestReading { agent_work_ns: 5_000_000, ..r.clone() };
    let s = g.step(&costly);
    assert!(s.next_period_ns as f64 <= PERIOD as f64 * s.next_period_share + 1.0, "a one-off cost: {}", s.next_period_ns);
    let s = g.step(&costly);
    let want = (5_000_000.0 / LoopPriors::DEFAULT.agent_work_share * s.next_period_share).round();
    assert!((s.next_period_ns as f64 - want).abs() <= 1.0, "{} against {want}", s.next_period_ns);
    let s = g.step(&GuestReading { agent_work_ns: 1_000_000_000, ..r });
    assert!(s.next_period_ns as f64 <= PERIOD as f64 * LoopPriors::DEFAULT.max_period_stretch * s.next_period_share + 1.0);
}
