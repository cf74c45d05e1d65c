//! The adaptive timeout on synthetic idle-period traces (module docs of `retention`).

use super::synthetic::{bimodal, drive_idle_periods, PeriodOutcome};
use super::*;

const CAP: u64 = 100_000;
const FLOOR: u64 = 10_000;

fn cfg() -> RetentionConfig {
    RetentionConfig {
        idle_threshold_ns: 10_000,
        timeout_ns: CAP,
        min_sleep_ns: 50_000,
        max_sleep_ns: 20_000_000,
        step_aside_ns: 0,
        adapt: true,
        min_timeout_ns: FLOOR,
        timeout_grow: 2,
        timeout_shrink: 2,
        long_idle_ns: 1_000_000,
    }
}

fn run(periods: &[u64], sleep_evidence: bool) -> (IdleDetector, Vec<PeriodOutcome>) {
    let mut d = IdleDetector::new(cfg());
    let out = drive_idle_periods(&mut d, periods, 20_000, 1_000, sleep_evidence);
    (d, out)
}

#[test]
fn idle_periods_shorter_than_the_timeout_leave_it() {
    let (d, out) = run(&[30_000; 500], true);
    assert!(out.iter().all(|p| p.caught && p.timeout_ns == CAP));
    let c = d.counters();
    assert_eq!((c.timeouts, c.timeout_grows, c.timeout_shrinks, c.timeout_ns), (0, 0, 0, CAP));
    assert_eq!(c.busy_returns, 500);
}

#[test]
fn long_idle_periods_shrink_the_timeout_to_the_floor() {
    let (d, out) = run(&[5_000_000; 20], true);
    assert!(out.iter().all(|p| !p.caught));
    // 100 -> 50 -> 25 -> 12.5 -> 10 (the floor), and no lower.
    assert_eq!(d.timeout_ns(), FLOOR);
    assert_eq!(d.counters().timeout_shrinks, 4);
    assert_eq!(d.counters().timeout_grows, 0);
}

#[test]
fn bimodal_periods_catch_the_short_ones_and_the_long_ones_shrink_the_timeout() {
    // 70% of the idle periods last 15 us (a pipeline hand-off), 30% 1-3 ms (waiting for I/O).
    let periods = bimodal(4000, 15_000, 2_000_000, 0.3, 7);
    let (d, out) = run(&periods, true);
    let tail = &out[400..];
    // Every short period that begins with the thread yielding is caught: after a long period
    // halved the timeout, the first short one that times out doubles it back past 15 us.
    let awake: Vec<bool> = tail.windows(2).filter(|w| w[0].caught && w[1].length_ns == 15_000).map(|w| w[1].caught).collect();
    let caught = awake.iter().filter(|&&c| c).count() as f64 / awake.len() as f64;
    assert!(awake.len() > 50 && caught > 0.95, "{} short periods with the thread awake, {caught:.2} caught", awake.len());
    assert!(tail.iter().filter(|p| p.length_ns > CAP).all(|p| !p.caught));
    // The long periods shrink it: it settles near the short mode, far below the cap.
    let mut t: Vec<u64> = tail.iter().map(|p| p.timeout_ns).collect();
    t.sort_unstable();
    let median = t[t.len() / 2];
    assert!((FLOOR..=2 * 15_000).contains(&median), "median timeout {median}");
    assert!(t.iter().all(|&x| (FLOOR..=CAP).contains(&x)));
    let c = d.counters();
    assert!(c.timeout_grows > 100 && c.timeout_shrinks > 100, "{c:?}");
    // Overall it catches more short periods than the fixed cap, which never notices work while
    // it sleeps and so backs off to long sleeps through bursts of short periods.
    let mut fixed = IdleDetector::new(RetentionConfig { adapt: false, ..cfg() });
    let fixed_out = drive_idle_periods(&mut fixed, &periods, 20_000, 1_000, true);
    let share = |o: &[PeriodOutcome]| o.iter().filter(|p| p.length_ns == 15_000 && p.caught).count();
    assert!(share(&out) > share(&fixed_out), "{} vs {}", share(&out), share(&fixed_out));
}

#[test]
fn idle_periods_just_past_the_timeout_grow_it_to_the_cap_and_no_further() {
    // Long periods first (down to the floor), then 95 us ones: each times out, ends during the
    // first sleep and doubles the timeout, until it covers them.
    let mut periods = vec![5_000_000; 12];
    periods.extend([95_000; 200]);
    let (d, out) = run(&periods, true);
    assert_eq!(out[12].timeout_ns, FLOOR);
    let grows_before = d.counters().timeout_grows;
    assert_eq!(grows_before, 4, "10 -> 20 -> 40 -> 80 -> 100");
    assert_eq!(d.timeout_ns(), CAP);
    assert!(out.iter().all(|p| p.timeout_ns <= CAP));
    let first_at_cap = out.iter().position(|p| p.timeout_ns == CAP && p.length_ns == 95_000).expect("reaches the cap");
    assert!(first_at_cap < 40, "{first_at_cap}");
    assert!(out[first_at_cap + 1..].iter().all(|p| p.caught && p.timeout_ns == CAP));
    // Periods past the cap but within the first sleep: the timeout grows to the cap and stops
    // there (whether spinning to the cap would catch them cannot be told apart).
    let mut d = IdleDetector::new(RetentionConfig { timeout_ns: 40_000, ..cfg() });
    let out = drive_idle_periods(&mut d, &[60_000; 100], 20_000, 1_000, true);
    assert!(out.iter().all(|p| !p.caught && p.timeout_ns == 40_000));
}

#[test]
fn without_evidence_from_sleeps_the_timeout_errs_towards_shrinking() {
    // Idle periods of 110 us: past the cap, within the first sleep. A thread that can tell
    // that work ran while it slept sees each end within that sleep: the timeout stays at the
    // cap. One that cannot sees an end only at its next slow yield, an upper bound that may
    // span the next period too, and then shrinks the timeout (until a shorter timeout lets it
    // see the end within a yield stretch again): the error leans towards less spinning, never
    // past the cap.
    // The bound between "not long after" and "far past" is haltpoll's here (the cap plus the
    // first sleep), so that the error shows.
    let haltpoll = RetentionConfig { long_idle_ns: 0, ..cfg() };
    let mut d = IdleDetector::new(haltpoll);
    let out = drive_idle_periods(&mut d, &[110_000; 300], 20_000, 1_000, true);
    assert_eq!((d.timeout_ns(), d.counters().timeout_shrinks), (CAP, 0));
    assert!(out.iter().all(|p| !p.caught));
    let mut d = IdleDetector::new(haltpoll);
    let out = drive_idle_periods(&mut d, &[110_000; 300], 20_000, 1_000, false);
    assert!(d.counters().timeout_shrinks > 50, "{:?}", d.counters());
    assert!(out.iter().all(|p| p.timeout_ns <= CAP));
    assert!(out.iter().filter(|p| p.timeout_ns < CAP).count() > 50);
}

#[test]
fn idle_periods_a_few_times_the_cap_do_not_shrink_it() {
    // Waits of 150-400 us with a 100 us cap: on a shared host such waits are often made by the
    // halts themselves (a halted vCPU wakes slower and may lose its pCPU, so the threads waiting
    // for it idle longer). Below `long_idle_ns` (1 ms) they keep the timeout at the cap; with
    // haltpoll's bound (the cap plus the first sleep) they shrink it to the floor, which is how
    // `gleaner sim fig7` streamcluster lost retention's speedup (2.18x -> 1.03x).
    let periods: Vec<u64> = (0..400).map(|i| 150_000 + (i * 37_000) % 250_000).collect();
    let (d, _) = run(&periods, true);
    assert_eq!((d.timeout_ns(), d.counters().timeout_shrinks), (CAP, 0));
    let mut d = IdleDetector::new(RetentionConfig { long_idle_ns: 0, ..cfg() });
    drive_idle_periods(&mut d, &periods, 20_000, 1_000, true);
    assert_eq!(d.timeout_ns(), FLOOR);
}

#[test]
fn a_held_timeout_stays_at_the_cap_and_adapts_again_when_released() {
    let (mut d, _) = run(&[5_000_000; 20], true);
    assert_eq!(d.timeout_ns(), FLOOR);
    d.hold_at_cap(true);
    assert_eq!((d.timeout_ns(), d.counters().timeout_ns), (CAP, CAP));
    let shrinks = d.counters().timeout_shrinks;
    drive_idle_periods(&mut d, &[5_000_000; 20], 20_000, 1_000, true);
    assert_eq!((d.timeout_ns(), d.counters().timeout_shrinks), (CAP, shrinks));
    d.hold_at_cap(false);
    drive_idle_periods(&mut d, &[5_000_000; 20], 20_000, 1_000, true);
    assert_eq!(d.timeout_ns(), FLOOR);
    // A fixed timeout is not moved by holding.
    let mut f = IdleDetector::new(RetentionConfig { adapt: false, timeout_ns: 30_000, ..cfg() });
    f.hold_at_cap(true);
    assert_eq!(f.timeout_ns(), 30_000);
}

#[test]
fn a_fixed_timeout_never_adapts() {
    let mut d = IdleDetector::new(RetentionConfig { adapt: false, ..cfg() });
    let periods = bimodal(500, 15_000, 2_000_000, 0.5, 1);
    let out = drive_idle_periods(&mut d, &periods, 20_000, 1_000, true);
    assert!(out.iter().all(|p| p.timeout_ns == CAP));
    assert_eq!((d.counters().timeout_grows, d.counters().timeout_shrinks), (0, 0));
}

#[test]
fn noise_does_not_end_an_idle_period() {
    // A host preemption in the middle of a long idle period is not its end: the period still
    // runs far past the timeout and shrinks it once, when the work comes.
    let mut d = IdleDetector::new(cfg());
    let mut p = FnProbe(|| true, || false);
    d.on_yield_at(1_000_000, 50_000, &mut p); // work: a period starts at 1 ms
    let mut now = 1_000_000;
    let mut noise = FnProbe(|| false, || false);
    for k in 0..2000 {
        now += 1_000;
        let r = if k == 50 { d.on_yield_at(now + 40_000, 40_000, &mut noise) } else { d.on_yield_at(now, 1_000, &mut p) };
        if k == 50 {
            now += 40_000;
        }
        if let RetentionAction::Sleep { ns } = r {
            now += ns;
        }
    }
    assert_eq!(d.counters().noise_returns, 1);
    assert_eq!(d.counters().timeout_shrinks, 0, "the period has not ended yet");
    d.on_yield_at(now + 30_000, 30_000, &mut p);
    assert_eq!(d.counters().timeout_shrinks, 1);
}

#[test]
fn a_reset_keeps_the_learned_timeout_and_forgets_the_period() {
    let (mut d, _) = run(&[5_000_000; 10], true);
    assert_eq!(d.timeout_ns(), FLOOR);
    d.reset();
    assert_eq!(d.timeout_ns(), FLOOR);
    // The first period after the reset has no known start: not measured.
    let before = d.counters();
    let mut t = 1_000_000_000;
    loop {
        t += 1_000;
        if let RetentionAction::Sleep { ns } = d.on_yield_at(t, 1_000, &mut NoProbe) {
            t += ns;
            break;
        }
    }
    d.on_yield_at(t + 30_000_000, 30_000_000, &mut NoProbe);
    assert_eq!(d.counters().timeout_shrinks, before.timeout_shrinks);
    assert_eq!(d.counters().timeout_grows, before.timeout_grows);
}

#[test]
fn a_clock_that_goes_backwards_is_held() {
    let mut d = IdleDetector::new(cfg());
    d.on_yield_at(5_000_000, 50_000, &mut NoProbe);
    // An earlier reading (a caller bug) neither panics nor measures a negative period.
    assert_eq!(d.on_yield_at(1_000, 60_000, &mut NoProbe), RetentionAction::KeepYielding);
    assert_eq!(d.counters().busy_returns, 2);
}

#[test]
fn the_same_trace_gives_the_same_timeouts() {
    let periods = bimodal(3000, 15_000, 2_000_000, 0.3, 42);
    let a = run(&periods, true).1;
    let b = run(&periods, true).1;
    assert_eq!(a, b);
}
