//! The start: the plan a run begins with, how long it stands, and when a period is too early
//! or too stale to end it.

use super::*;

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
