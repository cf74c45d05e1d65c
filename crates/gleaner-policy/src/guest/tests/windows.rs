//! Windows that come down, periods that lengthen, and going back to the machine's own settings.

use super::*;

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
