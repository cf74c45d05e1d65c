//! How busy the workload is: saturated and busy VMs, the idle share by period length, and a
//! vCPU behind a bottleneck.

use super::*;

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
    // nothing: the upper governor probes Wide, ever more rarely while it gains nothing. With
    // kernel polling alone, Wide is polling (which the rule left out); with yielders beside it,
    // the yielders (`a_saturated_vm_compares_the_yielders_by_its_work`).
    let mut g = GuestController::new(cfg(Means { yielders: false, ..HALTPOLL }));
    g.step(&saturated());
    g.step(&saturated());
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

/// A saturated VM with yielders beside kernel polling: Wide is a yielder on every vCPU, the
/// kernel as found, compared with Planned (every vCPU halting) by the work alone and from the
/// first periods. A message-passing program that moves 12% more bytes under the yielders, in
/// half the context switches (`stress-ng --pipe`, `--mq`), switches to them within a few
/// seconds; one that moves fewer stays at Planned, probing ever more rarely; one whose work is
/// not measured (sync points only) is never probed with them.
#[test]
fn a_saturated_vm_compares_the_yielders_by_its_work() {
    // 100 MB and 100,000 sync points a full period with every vCPU halting; `gain` more bytes
    // and half the sync points under the yielders, which catch the 1% idle time.
    let period = |yields: bool, gain: f64, bytes: bool, share: f64| {
        let ns = crate::num::saturating_u64(PERIOD as f64 * share);
        let scaled = |x: f64| crate::num::saturating_u64(x * share);
        let mut s = snapshot(scaled(if yields { 50_000.0 } else { 100_000.0 }));
        s.period_ns = ns;
        set_work(&mut s, ns * 99 / 100);
        let idle = |cpu| VcpuIdle {
            cpu,
            idle_ns: ns / 100,
            entries: Some(scaled(5_000.0)),
            poll_ns: 0,
            yield_ns: if yields { ns / 100 } else { 0 },
            steal_ns: 0,
        };
        let mb = if yields { 100e6 * (1.0 + gain) } else { 100e6 };
        GuestReading {
            snapshot: s,
            idle: vec![idle(0), idle(1)],
            trace: None,
            caught: Vec::new(),
            io: if bytes { WorkloadIo { bytes: scaled(mb), calls: scaled(200_000.0) } } else { WorkloadIo::default() },
            counter: None,
            agent_work_ns: 0,
            trace_missed: 0.0,
        }
    };
    let run = |gain: f64, bytes: bool, periods: usize| {
        let mut g = GuestController::new(cfg(HALTPOLL));
        let mut share = 1.0;
        let mut modes = Vec::new();
        for _ in 0..periods {
            let yields = g.applied().vcpus.iter().all(|v| v.mechanism == Mechanism::Yield);
            let s = g.step(&period(yields, gain, bytes, share));
            if g.plan_forced() {
                assert!(!s.plan.polls(), "a saturated VM polls at no level: {:?}", s.plan);
            }
            if s.mode == RetentionMode::Wide {
                assert_eq!(s.plan, IdlePlan::yield_always([0, 1]), "Wide on a saturated VM: the yielders");
                assert_eq!(s.plan.yield_window(1, true), ALWAYS);
            }
            modes.push((s.mode, g.widen_state().map(|w| w.baseline)));
            share = s.next_period_share;
        }
        let levels: Vec<RetentionMode> = modes.iter().map(|m| m.0).collect();
        let switched = modes.iter().position(|m| m.1 == Some(RetentionMode::On));
        (g, levels, switched)
    };
    // 12% more bytes: Wide (the yielders) from the first seconds on.
    let (g, modes, switched) = run(0.12, true, 40);
    assert_eq!(g.widen_state().map(|s| s.baseline), Some(RetentionMode::On), "{modes:?}");
    let first = modes.iter().position(|&m| m == RetentionMode::Wide).expect("probed");
    // modes[i]: the level step i chose for the next period (the first, the start, is no baseline).
    assert_eq!(first, 1, "probed in the third period, after a clean baseline: {modes:?}");
    assert!(switched.is_some_and(|i| i <= 10), "at Wide within 10 periods (2 s): {switched:?} {modes:?}");
    let tail = modes[20..].iter().filter(|&&m| m != RetentionMode::Wide).count();
    assert!(tail <= 3, "settled at Wide, probing Planned rarely: {modes:?}");
    assert!(g.widen_state().unwrap().last.is_some_and(|c| c.unit == ProgressUnit::IoBytes));
    // 5% fewer bytes: Planned stays, Wide probed ever more rarely.
    let (g, modes, switched) = run(-0.05, true, 120);
    assert_eq!((g.widen_state().map(|s| s.baseline), switched), (Some(RetentionMode::Off), None), "{modes:?}");
    let late = modes[60..].iter().filter(|&&m| m == RetentionMode::Wide).count();
    assert!((1..=3).contains(&late), "probes back off: {modes:?}");
    // No bytes: the sync points (halved under the yielders) are no measure; never probed.
    let (_, modes, _) = run(0.12, false, 60);
    assert!(modes.iter().all(|&m| m == RetentionMode::On), "{modes:?}");
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
