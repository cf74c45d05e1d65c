//! The guest loop on synthetic periods.

use super::*;
use crate::gleaner::VcpuSample;
use crate::idle::curve::CurvePoint;
use crate::idle::plan::{Mechanism, PlanReason, ALWAYS};

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

/// The in-kernel tracer's idle periods are counted for the slice that saw them (S / (S - g)
/// times), never to more idle time than the slice had; a model's are taken as they are.
#[test]
fn traced_idle_periods_are_reweighted_for_their_slice() {
    let woken = |source, gaps: u64| {
        let mut r = server_period(0, 50_000);
        let t = r.trace.as_mut().unwrap();
        t.source = source;
        t.traced_ns = 20_000_000;
        t.vcpus[1].woken = Log2Hist::default();
        t.vcpus[1].woken.record_n(10_000_000, gaps);
        let mut g = GuestController::new(cfg(HALTPOLL));
        g.step(&r);
        g.seen().into_iter().find(|(v, _)| v.cpu == 1).unwrap().0.woken
    };
    // One 10 ms idle period in a 20 ms slice: seen whole half the time, so it counts twice.
    assert_eq!(woken(TraceSource::Bpf, 1).count(), 2);
    assert_eq!(woken(TraceSource::Model, 1).count(), 1);
    // Two of them would count 40 ms of idle time in a 20 ms slice: held to the slice's.
    let held = woken(TraceSource::Bpf, 2);
    assert!(held.count() >= 2 && held.sum_ns() <= 20_000_000, "{held:?}");
}

/// Regression: the smoothing halved the woken and other idle periods but not the local ones
/// (a workload's own timers), which piled up against a halving observed time until every
/// window looked too dear (openloop at 20,000/s: the client's window shrank 524 -> 16 us).
#[test]
fn every_kind_of_idle_period_is_smoothed_alike() {
    let mut g = GuestController::new(cfg(HALTPOLL));
    let mut r = server_period(0, 50_000);
    let t = r.trace.as_mut().unwrap();
    t.vcpus[0].local.record_n(40_000, 400);
    for _ in 0..30 {
        g.step(&r);
    }
    for (gaps, observed) in g.seen() {
        let share = gaps.all().sum_ns() as f64 / observed as f64;
        assert!(share <= 1.0, "cpu{}: {share} of the observed time idle", gaps.cpu);
    }
}

#[test]
fn the_periods_around_a_probe_want_a_trace() {
    let mut c = cfg(HALTPOLL);
    c.governor = Some(GovernorConfig { probe_every_min: 4, probe_every_max: 4, ..GovernorConfig::default() });
    let mut g = GuestController::new(c);
    let mut wanted = Vec::new();
    for _ in 0..12 {
        wanted.push(g.trace_need() == TraceNeed::Now);
        g.step(&server_period(0, 50_000));
    }
    // Nothing traced yet; then baseline x4 (the last one is "before"), probe, confirm; again.
    assert_eq!(wanted, [true, false, false, true, true, true, false, false, false, true, true, true]);
}

/// Regression: a sockperf ping-pong started half a second after its agent: the first traced
/// period saw no wakeups, the plan halted, and the tracer's next turn came a second later, so
/// 1-2% of the round trips ran at stock latency (p99 42 us against haltpoll's 12).
#[test]
fn the_start_stands_until_the_workload_is_seen_and_a_new_rate_asks_for_a_trace() {
    let mut g = GuestController::new(cfg(HALTPOLL));
    let start = g.applied().clone();
    // An idle start: traced, nothing woken.
    let mut quiet = server_period(0, 50_000);
    quiet.snapshot.s_work = 2;
    let t = quiet.trace.as_mut().unwrap();
    t.vcpus[1].woken = Log2Hist::default();
    t.latency = Default::default();
    let s = g.step(&quiet);
    assert_eq!(s.plan, start, "the start stands while nothing is seen");
    assert_eq!(g.trace_need(), TraceNeed::Now, "and the next period is traced");
    // The workload starts, untraced: its rate changed, so the next period is traced.
    let mut busy = quiet.clone();
    busy.trace = None;
    busy.snapshot.s_work = 400;
    g.step(&busy);
    assert_eq!(g.trace_need(), TraceNeed::Now);
    // Traced: planned from it.
    let s = g.step(&server_period(0, 50_000));
    assert_ne!(s.plan, start);
    assert_eq!(s.plan.of(1).unwrap().why, crate::idle::plan::PlanReason::BestValue);
    // The same rate again: the tracer's own cadence.
    g.step(&server_period(0, 50_000));
    let mut same = server_period(0, 50_000);
    same.trace = None;
    g.step(&same);
    assert_ne!(g.trace_need(), TraceNeed::Now);
}

/// Regression: vCPUs given back by a consolidation reset had seen nothing of the workload, and
/// the planner halted them (too few wakeups) until the tracer's next turn.
#[test]
fn vcpus_given_back_start_over_from_the_start_plan() {
    let mut c = cfg(Means { poll_window: true, poll_always: true, yielders: true });
    c.consolidation = Some(Params::default());
    c.governor = None;
    let mut g = GuestController::new(c);
    let start = g.applied().clone();
    g.step(&server_period(0, 50_000));
    // An idle workload, traced: nothing woken, plans halt, consolidation gives a vCPU up.
    let mut idle = server_period(0, 50_000);
    idle.snapshot.s_work = 0;
    for v in &mut idle.snapshot.vcpus {
        v.t_work_ns = 0;
        v.t_idle_ns = PERIOD;
        v.s_yield = 0;
    }
    let t = idle.trace.as_mut().unwrap();
    t.vcpus[1].woken = Log2Hist::default();
    t.latency = Default::default();
    let shrank = (0..20).any(|_| {
        let s = g.step(&idle);
        s.active.len() < 2 && !s.plan.retains()
    });
    assert!(shrank, "an idle workload is consolidated while its vCPUs halt");
    // The workload wakes up and runs its one vCPU full: consolidation resets...
    let mut busy = idle.clone();
    busy.trace = None;
    busy.snapshot.s_work = 40_000;
    let active = g.active();
    for v in &mut busy.snapshot.vcpus {
        if active.contains(&v.cpu) {
            v.t_work_ns = PERIOD;
            v.t_idle_ns = 0;
        }
    }
    let s = (0..5).map(|_| g.step(&busy)).find(|s| s.active.len() == 2).expect("a full vCPU resets consolidation");
    // ...and the plan starts over: the start plan, traced next period.
    assert_eq!(s.plan, start, "{:?}", s.plan);
    assert_eq!(g.trace_need(), TraceNeed::Now);
}

/// Regression: a window shared from a handful of wakeups (a server's start-up) made the loop
/// believe it had seen the workload; the idle server that followed was halted (and then
/// consolidated) instead of keeping the start plan.
#[test]
fn a_handful_of_wakeups_does_not_end_the_start() {
    let mut g = GuestController::new(cfg(HALTPOLL));
    let start = g.applied().clone();
    let mut few = server_period(0, 50_000);
    few.snapshot.s_work = 3;
    let t = few.trace.as_mut().unwrap();
    t.vcpus[1].woken = Log2Hist::default();
    t.vcpus[1].woken.record_n(480_000, 3);
    let s = g.step(&few);
    assert!(s.plan.vcpus.iter().all(|v| v.why != PlanReason::BestValue), "{:?}", s.plan);
    let mut quiet = few.clone();
    quiet.trace.as_mut().unwrap().vcpus[1].woken = Log2Hist::default();
    quiet.snapshot.s_work = 0;
    for _ in 0..2 {
        assert!(g.step(&quiet).plan.retains(), "an idle server is not halted on a handful of wakeups");
    }
    // Once those few have faded from the smoothed periods: the start plan, not a halt (0.8 s
    // quiet, under priors.quiet_start_ns).
    let s = (0..2).map(|_| g.step(&quiet)).last().unwrap();
    assert_eq!(s.plan, start, "the start plan stands: {:?}", s.plan);
    // Quiet for a second: halted for that, not as if planned from the handful.
    let s = (0..2).map(|_| g.step(&quiet)).last().unwrap();
    assert!(s.plan.vcpus.iter().all(|v| v.why == PlanReason::TooFewWakeups), "{:?}", s.plan);
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

/// A yielder-kept vCPU whose yielder catches every wakeup: the tracer sees no idle period of
/// it (the yielding thread, not the idle task, held it), so only the yielder's catches show
/// that the window pays; without them the plan would halt it, see the halted periods again,
/// yield again, and so on.
#[test]
fn idle_periods_a_yielder_caught_keep_its_window() {
    const YIELDERS: Means = Means { poll_window: false, poll_always: false, yielders: true };
    let mut c = cfg(YIELDERS);
    c.governor = None;
    let period = |traced_gaps: u64, caught: Option<u64>| {
        let mut r = server_period(0, 50_000);
        let mut t = WakeTrace::empty(TraceSource::Bpf, [0, 1]);
        t.traced_ns = PERIOD;
        t.vcpus[1].woken.record_n(30_000, traced_gaps);
        r.trace = Some(t);
        r.idle[1].yield_ns = 400 * 30_000;
        if let Some(n) = caught {
            let mut h = Log2Hist::default();
            h.record_n(30_000, n);
            r.caught = vec![(1, h)];
        }
        r
    };
    let run = |with_catches: bool| {
        let mut g = GuestController::new(c.clone());
        // Seen halting first: 400 wakeups after 30 us.
        let first = g.step(&period(400, None));
        assert_eq!(first.plan.of(1).unwrap().mechanism, Mechanism::Yield, "{:?}", first.plan);
        // Then the yielder catches them all: the tracer sees none.
        (0..10).map(|_| g.step(&period(0, with_catches.then_some(400))).plan.of(1).unwrap().mechanism).collect::<Vec<_>>()
    };
    assert!(run(true).iter().all(|m| *m == Mechanism::Yield), "{:?}", run(true));
    assert!(run(false).contains(&Mechanism::Halt), "the blind spot this closes: {:?}", run(false));
}

#[test]
fn a_yielders_catches_count_for_the_traced_share_of_the_period() {
    let mut c = cfg(Means { poll_window: false, poll_always: false, yielders: true });
    c.governor = None;
    let mut g = GuestController::new(c);
    let mut r = server_period(0, 50_000);
    let t = r.trace.as_mut().unwrap();
    t.traced_ns = PERIOD / 4;
    t.vcpus[1] = VcpuGaps { cpu: 1, ..VcpuGaps::default() };
    let mut h = Log2Hist::default();
    h.record_n(30_000, 400);
    r.caught = vec![(1, h)];
    g.step(&r);
    let (gaps, observed) = g.seen().into_iter().find(|(v, _)| v.cpu == 1).unwrap();
    assert_eq!((gaps.woken.count(), observed), (100, PERIOD / 4));
}

/// A period after which the vCPUs switch from halting to retaining is no basis for
/// consolidation: its decisions are dropped, the next period (under the new plan) decides.
#[test]
fn consolidation_does_not_decide_across_a_change_of_idle_policy() {
    let mut c = cfg(Means { poll_window: false, poll_always: false, yielders: true });
    c.consolidation = Some(Params::default());
    c.governor = None;
    let mut g = GuestController::new(c.clone());
    // Yielders wait for the plan: the first period halts; the plan then retains on vCPU 1.
    assert!(!g.applied().retains());
    let first = g.step(&server_period(0, 50_000));
    assert!(first.plan.retains(), "{:?}", first.plan);
    assert!(first.decisions.is_empty() && first.active == vec![0, 1], "{:?}", first.decisions);
    // Under the same plan, the next period decides (one vCPU goes: the workload uses a tenth
    // of each).
    let second = g.step(&server_period(0, 50_000));
    assert!(!second.decisions.is_empty() && second.active.len() < 2, "{:?}", second.decisions);
    // Where the plan does not change, the first period decides at once: the consolidation
    // controller alone, with the same readings, gives a vCPU up after one period.
    let mut alone = Controller::new(vec![0, 1], Params::default());
    assert!(!alone.step(&server_period(0, 50_000).snapshot).is_empty());
}

/// A CPU-saturated workload (8 lock-bound threads on 2 vCPUs): thousands of short idle periods
/// a second, but under 2% of the vCPUs' time idle. Kernel polling is not planned there (it
/// could win at most that share and cost `sysbench threads` 8%), nor are yielders, and polling
/// comes back with the idle time.
#[test]
fn a_saturated_workload_gets_no_kernel_polling() {
    let saturated = || {
        let mut r = server_period(0, 50_000);
        let t = r.trace.as_mut().unwrap();
        t.vcpus[1].woken = Log2Hist::default();
        t.vcpus[1].woken.record_n(20_000, 150);
        r.idle[1].idle_ns = 3_000_000;
        r.idle[1].entries = Some(150);
        r
    };
    let mut g = GuestController::new(cfg(HALTPOLL));
    assert!(!g.agent_in_background(), "before the first period: at its own priority");
    assert!(g.agent_paced(), "before the first period: paced");
    g.step(&saturated());
    let s = g.step(&saturated());
    assert!(g.saturated());
    assert!(!g.agent_in_background(), "a saturated VM leaves the agent no idle time to run in");
    assert!(!g.agent_paced(), "a saturated VM: the agent's work in one piece");
    assert!(!s.plan.retains() || s.probe, "{:?}", s.plan);
    assert!(s.planned.vcpus.iter().all(|v| v.why == PlanReason::Saturated), "{:?}", s.planned);
    // Nothing a trace could show changes Planned: none is taken (it cost the workload most)
    // but for the upper governor's comparisons.
    assert!(g.plan_forced());
    assert_eq!(g.trace_need(), TraceNeed::Skip);
    // The lower governor does not probe a plan against itself: it holds. The rule forbids
    // nothing: the upper governor probes Wide (polling, which the rule left out), ever more
    // rarely while it gains nothing.
    let before = g.governor_state().expect("a governor");
    let mut wide = 0;
    for _ in 0..100 {
        let s = g.step(&saturated());
        assert_ne!(s.rung, Some(Rung::Low), "{s:?}");
        assert!(s.mode != RetentionMode::Off);
        wide += usize::from(s.mode == RetentionMode::Wide);
        assert!(s.probe || !s.plan.retains(), "Planned halts: {:?}", s.plan);
    }
    assert_eq!(g.governor_state().unwrap().probes, before.probes);
    assert!((1..=10).contains(&wide), "{wide} periods probed Wide");
    // The same periods without saturation (steal, not the workload, took the time): polled.
    let mut g = GuestController::new(cfg(HALTPOLL));
    let stolen = || {
        let mut r = saturated();
        for v in &mut r.idle {
            v.steal_ns = PERIOD - 4_000_000;
        }
        r
    };
    g.step(&stolen());
    let s = g.step(&stolen());
    assert!(!g.saturated());
    assert_eq!(s.plan.of(1).unwrap().mechanism, Mechanism::Poll, "{:?}", s.plan);
    assert_ne!(g.trace_need(), TraceNeed::Skip);
    // Yielders only: not planned either.
    let mut y = cfg(Means { poll_window: false, poll_always: false, yielders: true });
    y.governor = None;
    let mut g = GuestController::new(y);
    g.step(&saturated());
    let s = g.step(&saturated());
    assert!(!s.plan.retains(), "{:?}", s.plan);
    // Idle time back: polling back at once (the smoothed share halves the old).
    let mut g = GuestController::new(cfg(HALTPOLL));
    for _ in 0..3 {
        g.step(&saturated());
    }
    assert_eq!(g.trace_need(), TraceNeed::Skip);
    let s = g.step(&server_period(0, 50_000));
    assert!(!g.saturated());
    assert!(g.agent_in_background(), "the agent back in the idle time");
    assert!(g.agent_paced(), "and paced again");
    assert_eq!(s.plan.of(1).unwrap().mechanism, Mechanism::Poll, "{:?}", s.plan);
    assert_ne!(g.trace_need(), TraceNeed::Skip, "traced again with the idle time");
}

/// A busy workload (the built-in pipeline: about a tenth of the vCPUs' time idle, in many short
/// periods): kernel polling is planned, the yielders are not (on a busy VM they cost it
/// 2-15%: `priors.saturated_yield_idle_share`); a light one with the same wakeups gets its yielders.
#[test]
fn a_busy_workload_gets_kernel_polling_but_no_yielders() {
    let busy = |idle_ns: u64| {
        let mut r = server_period(0, 50_000);
        let t = r.trace.as_mut().unwrap();
        t.vcpus[1].woken = Log2Hist::default();
        t.vcpus[1].woken.record_n(20_000, 2_000);
        for v in &mut r.idle {
            v.idle_ns = idle_ns;
            v.entries = Some(2_000);
        }
        r
    };
    let yielders = || {
        let mut y = cfg(Means { poll_window: false, poll_always: false, yielders: true });
        y.governor = None;
        GuestController::new(y)
    };
    // 10% idle: yielders out, polling in.
    let mut g = yielders();
    g.step(&busy(PERIOD / 10));
    let s = g.step(&busy(PERIOD / 10));
    assert!(g.saturated_for(Mechanism::Yield) && !g.saturated_for(Mechanism::Poll));
    assert!(!s.plan.retains(), "{:?}", s.plan);
    assert_eq!(g.trace_need(), TraceNeed::Skip, "yielders only: nothing to plan from a trace");
    // The vCPU the yielder would have kept says why; the other had too few wakeups anyway.
    assert_eq!(s.planned.of(1).unwrap().why, PlanReason::Saturated, "{:?}", s.planned);
    let mut p = GuestController::new(cfg(HALTPOLL));
    p.step(&busy(PERIOD / 10));
    let s = p.step(&busy(PERIOD / 10));
    assert_eq!(s.plan.of(1).unwrap().mechanism, Mechanism::Poll, "{:?}", s.plan);
    assert!(!p.plan_forced(), "kernel polling still pays: traced");
    // Half the time idle: the yielders catch the same wakeups.
    let mut g = yielders();
    g.step(&busy(PERIOD / 2));
    let s = g.step(&busy(PERIOD / 2));
    assert!(!g.saturated_for(Mechanism::Yield));
    assert_eq!(s.plan.of(1).unwrap().mechanism, Mechanism::Yield, "{:?}", s.plan);
}

/// Regression: `sysbench threads` left its first, short period (start-up, 50 ms) half idle
/// and none after; counted as a full period it kept kernel polling on for a second. Weighed
/// by length, the share is under the line after three full periods.
#[test]
fn a_short_period_weighs_less_in_the_idle_share() {
    // `idle_pct`: percent of the period idle.
    let period = |len_ns: u64, idle_pct: u64| {
        let mut r = server_period(0, 50_000);
        r.snapshot.period_ns = len_ns;
        for v in &mut r.idle {
            v.idle_ns = len_ns * idle_pct / 100;
        }
        r
    };
    let mut g = GuestController::new(cfg(HALTPOLL));
    g.step(&period(PERIOD / 4, 50));
    let mut saturated_after = None;
    for n in 1..=6 {
        g.step(&period(PERIOD, 0));
        if g.saturated() {
            saturated_after = Some(n);
            break;
        }
    }
    assert_eq!(saturated_after, Some(3));
    // Full periods alone smooth as before: the older halved.
    let mut g = GuestController::new(cfg(HALTPOLL));
    g.step(&period(PERIOD, 5));
    g.step(&period(PERIOD, 0));
    assert!(!g.saturated(), "(5% + 0) / 2");
    g.step(&period(PERIOD, 0));
    assert!(g.saturated(), "(2.5% + 0) / 2");
}

/// Regression: `gleaner run -- sleep 2` kept the start plan's 200 us window on both vCPUs
/// the whole run (nothing of the workload was ever seen) and polled 40-52 ms of its 4
/// vCPU-seconds. A workload quiet for a second halts until it makes wakeups.
#[test]
fn a_quiet_workload_gives_up_the_start_plan_until_it_wakes() {
    let mut c = cfg(HALTPOLL);
    c.consolidation = Some(Params::default());
    let mut g = GuestController::new(c);
    let start = g.applied().clone();
    assert!(start.retains());
    let mut quiet = server_period(0, 50_000);
    quiet.snapshot.s_work = 0;
    for v in &mut quiet.snapshot.vcpus {
        (v.t_work_ns, v.t_idle_ns, v.s_yield) = (0, PERIOD, 0);
    }
    let t = quiet.trace.as_mut().unwrap();
    t.vcpus[1].woken = Log2Hist::default();
    t.latency = Default::default();
    let periods = LoopPriors::DEFAULT.quiet_start_ns / PERIOD;
    for k in 1..periods {
        let s = g.step(&quiet);
        assert_eq!(s.plan, start, "period {k}: the start stands for a second");
    }
    let s = g.step(&quiet);
    assert!(!s.plan.retains(), "quiet for a second: halted, {:?}", s.plan);
    assert!(s.plan.vcpus.iter().all(|v| v.why == PlanReason::TooFewWakeups), "{:?}", s.plan);
    for _ in 0..10 {
        let s = g.step(&quiet);
        assert!(!s.plan.retains());
        assert_eq!(s.active.len(), 2, "an unseen workload is not consolidated");
    }
    assert_eq!(g.trace_need(), TraceNeed::Now, "unseen: every period traced");
    // A little activity under the quiet rate changes nothing.
    let mut few = quiet.clone();
    few.snapshot.s_work = 1;
    assert!(!g.step(&few).plan.retains());
    // It wakes, untraced: the start plan is back at once and the next period traced...
    let mut woke = quiet.clone();
    woke.trace = None;
    woke.snapshot.s_work = 400;
    let s = g.step(&woke);
    assert_eq!(s.plan, start);
    assert_eq!(g.trace_need(), TraceNeed::Now);
    // ...and planned from.
    let s = g.step(&server_period(0, 50_000));
    assert_eq!(s.plan.of(1).unwrap().why, PlanReason::BestValue, "{:?}", s.plan);
}

/// A machine without kernel polling starts halted: the quiet rule changes nothing there.
#[test]
fn a_quiet_start_without_kernel_polling_halts_as_before() {
    let mut c = cfg(Means { poll_window: false, poll_always: false, yielders: true });
    c.governor = None;
    let mut g = GuestController::new(c);
    assert!(!g.applied().retains());
    let mut quiet = server_period(0, 50_000);
    quiet.snapshot.s_work = 0;
    quiet.trace.as_mut().unwrap().vcpus[1].woken = Log2Hist::default();
    for _ in 0..10 {
        assert!(!g.step(&quiet).plan.retains());
    }
}

/// Regression: consolidated onto vCPU 0, the open loop at 200 requests/s left vCPU 1 halted in
/// one long idle period the tracer never saw end; counted as busy, it took the VM share from
/// vCPU 0, whose window shrank from "until work" to 4 ms (63% of wakeups caught, p50 99 us
/// against 43). The VM share counts the measured idle time.
#[test]
fn a_vcpu_idle_all_along_counts_as_idle_in_the_vm_share() {
    let mut c = cfg(HALTPOLL);
    c.plan.vm_share = 0.9;
    let mut g = GuestController::new(c);
    let light = || {
        let mut t = WakeTrace::empty(TraceSource::Bpf, [0, 1]);
        t.traced_ns = PERIOD;
        t.vcpus[0].woken.record_n(4_800_000, 40);
        t.latency.halt.record_n(40_000, 40);
        GuestReading {
            snapshot: snapshot(80),
            idle: vec![
                VcpuIdle { cpu: 0, idle_ns: PERIOD * 97 / 100, entries: Some(40), poll_ns: 0, yield_ns: 0, steal_ns: 0 },
                VcpuIdle { cpu: 1, idle_ns: PERIOD, entries: Some(0), poll_ns: 0, yield_ns: 0, steal_ns: 0 },
            ],
            trace: Some(t),
            caught: Vec::new(),
            io: WorkloadIo::default(),
            counter: None,
            agent_work_ns: 0,
            trace_missed: 0.0,
        }
    };
    let mut s = g.step(&light());
    for _ in 0..5 {
        s = g.step(&light());
    }
    let v0 = s.plan.of(0).unwrap();
    assert_eq!((v0.window_ns, v0.why), (ALWAYS, PlanReason::BestValue), "{:?}", s.plan);
    assert_eq!(s.plan.poll_always, vec![0]);
    assert!(s.plan.of(1).unwrap().mechanism != Mechanism::Poll || s.plan.poll_window_ns == 0, "{:?}", s.plan);
}

/// nginx with one wrk connection: a start-up period traced before the load came (a handful of
/// long idle periods: nothing pays, every vCPU halts), then an untraced period at 25,000 sync
/// points a second. Consolidation waits for the trace the new rate asks for instead of packing
/// the workload under the stale plan; once traced, the plan polls and the busy workload keeps
/// its vCPUs.
#[test]
fn consolidation_waits_for_a_trace_at_a_new_rate() {
    let mut c = cfg(HALTPOLL);
    c.consolidation = Some(Params::default());
    c.governor = None;
    let start_up = || {
        let mut t = WakeTrace::empty(TraceSource::Bpf, [0, 1]);
        t.traced_ns = PERIOD;
        for cpu in 0..2 {
            t.vcpus[cpu].woken.record_n(24_000_000, 8);
        }
        t.latency.halt.record_n(60_000, 20);
        let mut snapshot = snapshot(20);
        for v in &mut snapshot.vcpus {
            v.t_work_ns = PERIOD / 100;
            v.t_idle_ns = PERIOD * 99 / 100;
        }
        GuestReading {
            snapshot,
            idle: Vec::new(),
            trace: Some(t),
            caught: Vec::new(),
            io: WorkloadIo::default(),
            counter: None,
            agent_work_ns: 0,
            trace_missed: 0.0,
        }
    };
    let loaded = |traced: bool| {
        let mut r = server_period(0, 50_000);
        r.snapshot.s_work = 5_000;
        set_work(&mut r.snapshot, PERIOD * 4 / 10);
        if !traced {
            r.trace = None;
        }
        r
    };
    let mut g = GuestController::new(c);
    let first = g.step(&start_up());
    assert!(!first.plan.vcpus.iter().any(|v| v.mechanism == Mechanism::Poll), "{:?}", first.plan);
    let untraced = g.step(&loaded(false));
    assert_eq!(untraced.active, vec![0, 1], "consolidated under a stale plan: {:?}", untraced.decisions);
    assert_eq!(g.trace_need(), TraceNeed::Now);
    for _ in 0..5 {
        let s = g.step(&loaded(true));
        assert_eq!(s.active, vec![0, 1], "{:?}", s.decisions);
        assert!(s.plan.vcpus.iter().any(|v| v.mechanism == Mechanism::Poll), "{:?}", s.plan);
    }
    // What was held: the consolidation controller alone gives a vCPU up on the untraced
    // period's readings.
    let mut alone = Controller::new(vec![0, 1], Params::default());
    let d = alone.step(&loaded(false).snapshot);
    assert!(d.iter().any(|d| matches!(d, Decision::Deactivate { .. })), "{d:?}");
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

/// Steps `g` on `reading(poll share the applied plan expects on vCPU 1)` until the applied
/// haltpoll window satisfies `until`; returns whether each step brought the windows down.
fn step_until(g: &mut GuestController, gap_ns: u64, extra: f64, until: impl Fn(u64) -> bool) -> Vec<bool> {
    let mut resets = Vec::new();
    for _ in 0..40 {
        let expected = g.applied().of(1).map_or(0.0, |v| v.estimate.cost_share);
        let s = g.step(&server_gaps(gap_ns, (expected + extra).min(1.0)));
        resets.push(s.reset_poll_windows != WindowReset::Keep);
        if until(s.plan.poll_window_ns) {
            return resets;
        }
    }
    panic!("the window never got there: {:?}", g.applied());
}

/// A controller whose window came down from above 480 us, the vCPUs polling what its plan
/// expects; with the window it came down to.
fn lowered_window() -> (GuestController, u64) {
    let mut c = cfg(WINDOW_ONLY);
    c.governor = None;
    // vCPU 0 spins (a client busy-polling for replies) and vCPU 1 is later busy three
    // quarters of its time polling past its window: a server the bottleneck rule would put
    // behind the spinning client. These tests are about windows.
    c.plan.bottleneck_idle_share = 0.0;
    let mut g = GuestController::new(c);
    // Long idle periods: a window above them.
    let resets = step_until(&mut g, 480_000, 0.0, |w| w > 480_000);
    assert!(resets.iter().all(|r| !r), "raising a window never resets: {resets:?}");
    let high = g.applied().poll_window_ns;
    // Short ones: the window comes down, and the vCPUs polled what the plan expected, so it
    // is just written (a reset halts vCPUs or misses polls).
    let resets = step_until(&mut g, 20_000, 0.0, |w| w > 0 && w < high);
    assert!(resets.iter().all(|r| !r), "{resets:?}");
    let low = g.applied().poll_window_ns;
    for _ in 0..5 {
        assert_eq!(step_polling(&mut g, LoopPriors::DEFAULT.stale_window_excess / 2.0), WindowReset::Keep, "within the excess allowed");
    }
    (g, low)
}

/// One period of the 20 us server, vCPU 1 polling `extra` of a vCPU past the plan's estimate
/// and halting the rest of its idle time.
fn step_polling(g: &mut GuestController, extra: f64) -> WindowReset {
    let expected = g.applied().of(1).unwrap().estimate.cost_share;
    g.step(&server_gaps(20_000, expected + extra)).reset_poll_windows
}

/// The same, vCPU 1 polling all its idle time: it never halted.
fn step_never_halting(g: &mut GuestController, extra: f64) -> WindowReset {
    let expected = g.applied().of(1).unwrap().estimate.cost_share;
    let mut r = server_gaps(20_000, expected + extra);
    r.idle[1].idle_ns = r.idle[1].poll_ns;
    g.step(&r).reset_poll_windows
}

#[test]
fn a_lowered_window_is_shrunk_only_when_the_vcpus_poll_past_it() {
    let (mut g, low) = lowered_window();
    // Polling well past the estimate: the old window still runs. A shrink for a period;
    assert_eq!(step_polling(&mut g, 0.2), WindowReset::Shrink);
    assert_eq!(g.applied().poll_window_ns, low);
    // in it vCPU 1 halted (after polling a whole old window each time): the shrink reached
    // it, and what it polls past the estimate from then on is the estimate's, which no switch
    // of the cpuidle governor (every vCPU halted meanwhile) would change.
    assert_eq!(step_polling(&mut g, 0.2), WindowReset::Keep);
    for _ in 0..3 {
        assert_eq!(step_polling(&mut g, 0.2), WindowReset::Keep, "the windows are the plan's now");
    }
}

#[test]
fn a_shrink_that_reached_the_vcpus_is_judged_by_nothing_more() {
    let (mut g, _) = lowered_window();
    assert_eq!(step_polling(&mut g, 0.2), WindowReset::Shrink);
    // The period it ran polled what the plan expects: done, with or without halts.
    assert_eq!(step_never_halting(&mut g, 0.0), WindowReset::Keep);
    assert_eq!(step_polling(&mut g, 0.2), WindowReset::Keep);
}

#[test]
fn a_window_still_stale_after_a_shrink_is_switched_once_its_polling_outweighs_the_switch() {
    let (mut g, _) = lowered_window();
    assert_eq!(step_polling(&mut g, 0.2), WindowReset::Shrink);
    // A vCPU that never halts (its idle periods all inside its old window) is not reached by
    // shrinking. Its polling past the estimate adds up until, at the planner's price, it
    // costs more than the switch's halts: every wakeup of GOVERNOR_SWITCH_NS halted.
    let mut kept: u32 = 0;
    let reset = loop {
        match step_never_halting(&mut g, 0.2) {
            WindowReset::Keep if kept < 100 => kept += 1,
            r => break r,
        }
    };
    assert_eq!(reset, WindowReset::Switch, "after {kept} periods");
    let curve = g.config().curve.clone().unwrap();
    let per_wake = curve.halt_cost_ns(g.applied().poll_window_ns as f64) - curve.poll_cost_ns().unwrap();
    let switch = g.sync_rate().unwrap() * GOVERNOR_SWITCH_NS as f64 / 1e9 * per_wake;
    let polled_past = g.config().plan.price * 0.2 * PERIOD as f64;
    // The shrink's own period is not counted (its polling was partly the old window's).
    let periods: u32 = crate::num::saturating_u32((switch / polled_past).ceil()) - 1;
    assert!(kept.abs_diff(periods) <= 1, "{kept} periods kept, {periods} expected ({switch} ns, {polled_past} ns a period)");
    assert!(kept >= 1, "a switch costs more than one period's excess here: {switch} ns");
    for _ in 0..3 {
        assert_eq!(step_never_halting(&mut g, 0.2), WindowReset::Keep, "the windows are the plan's now");
    }
}

/// The periods lengthen once the plan has held for priors.calm_periods, and are the configured length
/// again as soon as something needs watching: here the workload's rate, which needs a trace.
#[test]
fn periods_lengthen_once_the_plan_holds_and_shorten_when_the_rate_moves() {
    let mut c = cfg(WINDOW_ONLY);
    c.governor = None;
    let mut g = GuestController::new(c);
    let step = |g: &mut GuestController, s_work: u64, traced: bool| {
        let expected = g.applied().of(1).map_or(0.0, |v| v.estimate.cost_share);
        let mut r = server_gaps(20_000, expected);
        r.snapshot.s_work = s_work;
        if !traced {
            r.trace = None;
        }
        g.step(&r)
    };
    let shares: Vec<f64> = (0..20).map(|i| step(&mut g, 400, i % 5 == 0).next_period_share).collect();
    let calm = shares.iter().position(|&s| s == LoopPriors::DEFAULT.calm_period_share).unwrap_or_else(|| panic!("never calm: {shares:?}"));
    assert!(calm >= LoopPriors::DEFAULT.calm_periods as usize, "{shares:?}");
    assert!(
        shares[..calm].iter().all(|&s| s == 1.0) && shares[calm..].iter().all(|&s| s == LoopPriors::DEFAULT.calm_period_share),
        "{shares:?}"
    );
    // Four times the sync points in an untraced period: a trace is needed now, and the next
    // period is not calm.
    let s = step(&mut g, 1600, false);
    assert_eq!(g.trace_need(), TraceNeed::Now);
    assert_eq!(s.next_period_share, 1.0);
}

#[test]
fn the_machines_own_settings_reset_the_windows_so_none_is_stale_after() {
    let mut c = cfg(WINDOW_ONLY);
    c.governor = None;
    let mut g = GuestController::new(c);
    step_until(&mut g, 480_000, 0.0, |w| w > 480_000);
    // Nothing to catch: every vCPU halts (the adapter restores the machine's settings, which
    // resets the windows).
    let mut quiet = server_gaps(480_000, 0.0);
    quiet.trace.as_mut().unwrap().vcpus[1].woken = Log2Hist::default();
    quiet.snapshot.s_work = 0;
    for _ in 0..40 {
        if !g.step(&quiet).plan.retains() {
            break;
        }
    }
    assert!(!g.applied().retains(), "{:?}", g.applied());
    // Polling again at a lower window, past its estimate: nothing older is left to reset.
    let resets = step_until(&mut g, 20_000, 0.3, |w| w > 0);
    let more = step_polling(&mut g, 0.3);
    assert!(resets.iter().all(|r| !r) && more == WindowReset::Keep, "{resets:?} {more:?}");
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

/// The trace of redis's second period with one client (`gleaner run --events`, 3 s runs): the
/// client started while the tracer counted, armed with the server alone, so a whole period
/// traced at 40,000 sync points a second showed 31 wakeups (here 9, 21 ms apart). Taken, it
/// halted both vCPUs and consolidation packed client and server onto one. Set aside, the start
/// plan stands and the next period is traced with the client.
#[test]
fn a_trace_that_missed_the_workloads_busy_new_processes_is_set_aside() {
    let mut c = cfg(HALTPOLL);
    c.consolidation = Some(Params::default());
    let missed_client = || {
        let mut r = server_period(0, 50_000);
        r.trace.as_mut().unwrap().vcpus[1].woken = Log2Hist::default();
        r.trace.as_mut().unwrap().vcpus[1].woken.record_n(21_000_000, 9);
        r.snapshot.s_work = 8_000;
        set_work(&mut r.snapshot, PERIOD * 4 / 10);
        r.trace_missed = 0.5;
        r
    };
    // What the rule prevents: taken, the trace halts every vCPU for lack of wakeups.
    let mut taken = GuestController::new(c.clone());
    let halted = taken.step(&GuestReading { trace_missed: 0.0, ..missed_client() });
    assert!(!halted.plan.vcpus.iter().any(|v| v.mechanism == Mechanism::Poll), "{:?}", halted.plan);

    let mut g = GuestController::new(c);
    let start = g.applied().clone();
    let s = g.step(&missed_client());
    assert_eq!(s.gaps_from, None, "set aside, and no estimates in its place");
    assert_eq!(s.plan, start, "the start plan stands");
    assert_eq!(s.active, vec![0, 1], "{:?}", s.decisions);
    assert!(s.plan.vcpus.iter().any(|v| v.mechanism == Mechanism::Poll), "{:?}", s.plan);
    assert_eq!(g.trace_need(), TraceNeed::Now, "the next period is traced with the new processes");
    // A workload that keeps starting busy processes: the fourth trace in a row is taken.
    for _ in 1..LoopPriors::DEFAULT.max_set_aside {
        assert_eq!(g.step(&missed_client()).gaps_from, None, "set aside");
    }
    assert_eq!(g.step(&missed_client()).gaps_from, Some(TraceSource::Bpf));
    // Processes that made under a tenth of the sync points do not set a trace aside.
    let mut few = missed_client();
    few.trace_missed = LoopPriors::DEFAULT.trace_missed_share / 2.0;
    assert_eq!(GuestController::new(cfg(HALTPOLL)).step(&few).gaps_from, Some(TraceSource::Bpf));

    // Set aside after a trace was taken: the smoothed idle periods stand, as in an untraced
    // period, and so does the plan.
    let mut g = GuestController::new(cfg(HALTPOLL));
    let first = g.step(&server_period(0, 50_000));
    let s = g.step(&missed_client());
    assert_eq!(s.gaps_from, None);
    assert_eq!(s.plan, first.plan);
    assert_ne!(s.plan, start);
}

#[test]
fn the_first_period_read_is_a_workload_starting() {
    let step = |g: &mut GuestController, s_work: u64| {
        let mut r = server_gaps(20_000, 0.0);
        r.snapshot.s_work = s_work;
        g.step(&r);
        g.workload_starting()
    };
    // redis and nginx: 13-33 sync points in their first 50 ms, the client's thousands after.
    let mut g = GuestController::new(cfg(WINDOW_ONLY));
    assert!(!g.workload_starting(), "nothing read yet: the first slice is the adapter's own");
    assert!(step(&mut g, 20));
    assert!(!step(&mut g, 12_000));
    // A later quiet period is a quiet workload, not a start: its rate stands.
    assert!(!step(&mut g, 3));
    // Busy from the first period on (attached) makes no difference: the rate comes next.
    let mut g = GuestController::new(cfg(WINDOW_ONLY));
    assert!(step(&mut g, 50_000));
    assert!(!step(&mut g, 50_000));
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

/// Going back to the machine's own settings after kernel polling resets each vCPU's own
/// haltpoll window (a switch), once, at the step that stops retaining: restoring the cap does
/// not bring a window down on a vCPU whose idle periods end while it polls (wrk's, with nginx
/// at 50 connections, went on polling at the start plan's 200 us for 1.5 s after the plan
/// halted it), and a shrink at the cap's fall to 0 does not reach a vCPU kept polling until
/// work. A cap lowered to 0 while retaining is a shrink, once (the vCPU planned to halt polls
/// its old window out otherwise). No switch while the plan retains, none after.
#[test]
fn going_back_to_stock_after_polling_resets_the_windows_once() {
    let mut g = GuestController::new(cfg(HALTPOLL));
    assert!(g.applied().poll_window_ns > 0, "the start plan polls a window: {:?}", g.applied());
    let mut steps = Vec::new();
    for nginx_idle in [0.2, 0.2, 0.03, 0.03, 0.03, 0.03, 0.03] {
        let (retained, window) = (g.applied().retains(), g.applied().poll_window_ns);
        let s = g.step(&nginx_c50_period(nginx_idle));
        steps.push((retained, window, s.plan.retains(), s.plan.poll_window_ns, s.reset_poll_windows));
    }
    let stops = steps.iter().filter(|s| s.0 && !s.2).count();
    assert_eq!(stops, 1, "the plan polls, then halts behind the bottleneck: {steps:?}");
    for &(before, old_window, now, window, reset) in &steps {
        let want = if before && !now {
            WindowReset::Switch
        } else if now && old_window > 0 && window == 0 {
            WindowReset::Shrink
        } else {
            WindowReset::Keep
        };
        assert_eq!(reset, want, "{steps:?}");
    }
    assert_eq!(steps.iter().filter(|s| s.4 == WindowReset::Shrink).count(), 1, "the cap fell to 0 once: {steps:?}");
    // Yielders only: nothing polled a kernel window, nothing to reset.
    let mut g = GuestController::new(cfg(Means { poll_window: false, poll_always: false, yielders: true }));
    for nginx_idle in [0.2, 0.2, 0.03, 0.03, 0.03] {
        assert_eq!(g.step(&nginx_c50_period(nginx_idle)).reset_poll_windows, WindowReset::Keep);
    }
}

/// nginx with 50 wrk connections: wrk's vCPU 0 idle 20% of its time in ~10 us periods ended by
/// nginx's replies, nginx's vCPU 1 idle `nginx_idle` of it. Behind the busy nginx wrk's vCPU
/// halts, the loop stays informed (the tracer at its cadence, not every period), and polling
/// comes back once nginx's vCPU idles.
#[test]
fn a_vcpu_behind_a_bottleneck_halts_until_the_bottleneck_idles() {
    let period = nginx_c50_period;
    let mut c = cfg(HALTPOLL);
    let mut g = GuestController::new(c.clone());
    let mut s = g.step(&period(0.03));
    for _ in 0..3 {
        s = g.step(&period(0.03));
    }
    let v = s.planned.of(0).unwrap();
    assert_eq!((v.mechanism, v.why), (Mechanism::Halt, PlanReason::Bottleneck), "{:?}", s.planned);
    // The rule shapes Planned and forbids nothing: a period soon probes Wide (the high
    // rung's first probe comes after `probe_every_max` periods), which polls wrk's vCPU
    // anyway (what it gains decides).
    let max = GovernorConfig::default().probe_every_max;
    for _ in 0..=max + 4 {
        if s.probe {
            break;
        }
        assert!(!s.plan.retains(), "Planned halts behind the bottleneck until the probe: {:?}", s.plan);
        s = g.step(&period(0.03));
    }
    assert!(s.probe && s.mode == RetentionMode::Wide, "{s:?}");
    assert_eq!(s.plan.of(0).unwrap().why, PlanReason::Wide, "{:?}", s.plan);
    assert!(g.informed(), "a plan made from the workload: informed");
    s = g.step(&period(0.03));
    assert!(!s.probe && !s.plan.retains(), "back to Planned after the probe: {:?}", s.plan);
    // nginx's vCPU idles a third of its time: no bottleneck, wrk's vCPU polls again.
    for _ in 0..4 {
        s = g.step(&period(0.35));
    }
    assert_eq!(s.plan.of(0).unwrap().mechanism, Mechanism::Poll, "{:?}", s.plan);
    // With the rule off (`bottleneck_idle_share = 0`) it polls throughout.
    c.plan.bottleneck_idle_share = 0.0;
    let mut g = GuestController::new(c);
    for _ in 0..4 {
        s = g.step(&period(0.03));
    }
    assert_eq!(s.plan.of(0).unwrap().mechanism, Mechanism::Poll, "{:?}", s.plan);
}

/// The default start polls until work on every vCPU (the best latency any idle policy gets,
/// from the first wakeup); a quiet period gives it up for the start window, a quiet second for
/// a halt, and a workload that wakes after a quiet start gets the window back, not the whole
/// vCPUs: polling both vCPUs through a server's wait for its client cost sockperf's 1 s run
/// three times haltpoll's CPU at the same latency.
#[test]
fn a_start_polls_until_work_and_a_quiet_one_falls_back_to_the_window() {
    let mut c = cfg(HALTPOLL);
    c.start = StartConfig::default();
    assert!(c.start.until_work);
    let g = GuestController::new(c.clone());
    assert_eq!(g.applied().poll_always, vec![0, 1], "{:?}", g.applied());
    assert_eq!(g.applied().poll_window_ns, 0);
    let mut quiet = server_period(0, 50_000);
    quiet.snapshot.s_work = 0;
    quiet.trace = None;
    for v in &mut quiet.idle {
        v.entries = Some(0);
    }
    let mut g = GuestController::new(c.clone());
    let s = g.step(&quiet);
    assert!(s.plan.poll_always.is_empty() && s.plan.poll_window_ns == INITIAL_POLL_WINDOW_NS, "quiet: the window, {:?}", s.plan);
    let mut woke = quiet.clone();
    woke.snapshot.s_work = 1;
    let s = g.step(&woke);
    assert!(s.plan.poll_always.is_empty(), "still quiet: {:?}", s.plan);
    // Without per-CPU resume latency limits, the start is the window.
    let g = GuestController::new(GuestConfig { means: Means { poll_always: false, ..HALTPOLL }, ..c.clone() });
    assert_eq!((g.applied().poll_window_ns, g.applied().poll_always.len()), (INITIAL_POLL_WINDOW_NS, 0));
    // And a machine whose polls are dearer than its halts starts halted.
    let mut dear = c;
    dear.curve = Some(WakeCurve::new(vec![CurvePoint { gap_ns: 10_000, mean_ns: 5_000, p50_ns: 5_000 }], 40_000, Some(7_000)));
    assert!(!GuestController::new(dear).applied().retains());
}

/// Before the run is `trace_after_ns` old no period is traced: a short run plans from the
/// counters and never loads the tracer.
#[test]
fn no_period_is_traced_before_the_start_delay() {
    let mut c = cfg(HALTPOLL);
    c.start.trace_after_ns = 3 * PERIOD;
    let mut g = GuestController::new(c);
    let mut untraced = server_period(0, 50_000);
    untraced.trace = None;
    for _ in 0..3 {
        assert_eq!(g.trace_need(), TraceNeed::Skip);
        g.step(&untraced);
    }
    assert_eq!(g.trace_need(), TraceNeed::Now, "unseen by a tracer yet");
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
