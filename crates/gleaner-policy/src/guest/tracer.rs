//! The tracer's cadence and slices, as rules: how long a traced period counts, when the
//! programs stay attached paused between slices and when they are detached, from the costs
//! the adapter measured (`gleaner-agent`'s `agent::trace::Tracing` keeps the measurements and
//! the programs; the simulator's model tracer counts whole periods and costs nothing).
//!
//! Two costs bound how the tracer runs. The programs sit in the scheduler's path (0.1-0.5 us
//! per event on the development VMs): a ping-pong traced all the time ran 20% slower. And
//! attaching or detaching a raw tracepoint patches kernel text, which interrupts every CPU.
//! So a traced period is one in [`EVERY`] plus the ones the governors compare, and of each
//! only the first slice, sized from the programs' measured cost to keep them near
//! [`COST_SHARE`] of a vCPU.

use std::time::Duration;

/// The tracer's cost, about, as a share of one vCPU.
pub const COST_SHARE: f64 = 0.005;
/// One period in this many is traced for the planner.
pub const EVERY: u64 = 5;
/// Traced periods the governor adds, at most, per EVERY periods (3 around each probe, which
/// come every 4 periods at the most frequent: 3 x 5 / 6).
pub const SANDWICH: f64 = 3.5;
/// The shortest slice traced.
pub const MIN_SLICE: Duration = Duration::from_millis(5);

/// Where the workload's rate is not known yet, a slice is at most this many times the last
/// one (where it is, the rate bounds it: [`slice_for`]): a cost measured at a lower event rate
/// understates the next. The first slices come while the workload is starting, read as
/// nearly free, and made the next slice a whole period at its full rate (redis with one
/// connection: a 200 ms slice of ~18,500 wakeups, its p99 1.3x haltpoll's over 7 alternated
/// rounds, 1.0x with `--no-trace`); growing step by step, each slice is measured at the rate
/// it will see. (Ignoring costs measured over few events instead kept a slow workload's
/// slices at a tenth of the period for good.)
pub const MAX_SLICE_GROWTH: u32 = 2;
/// The most the programs may cost while paused between slices, as a share of one vCPU, for
/// them to stay attached; it comes out of [`COST_SHARE`], so the slices shorten.
pub const RESIDENT_SHARE: f64 = COST_SHARE / 2.0;

/// `ns` of CPU over `wall`, as a share of one vCPU.
pub fn share_of(ns: u64, wall: Duration) -> f64 {
    ns as f64 / wall.as_nanos().max(1) as f64
}

/// Detached for their cost, the programs are paused again after this many slices (doubled at
/// each detach for cost, up to 32 times), in case the workload calmed down, and only if the
/// last slice's event rate says pausing would fit ([`pausing_fits`]). If not, the retry costs
/// one period of paused programs: they are detached at its end instead of at the slice's end,
/// no more attachments than detaching at once. (Retrying every 8 slices, a sockperf
/// ping-pong's tracer cost 0.37-0.72% of a vCPU, against 0.27-0.35% detaching each slice.)
pub const RETRY_SLICES: u64 = 8;

/// What tracing costs per sync point of the workload (a voluntary context switch), ns: a
/// guess, high, for sizing a slice at the workload's rate before the programs' cost was
/// measured at it (a sync point is a wakeup, two switches and a cpuidle event or two, at
/// 0.1-0.5 us each here).
pub const SYNC_POINT_COST_NS: f64 = 2_000.0;

/// How long to count in a period of `period`: what the budget left by the paused programs'
/// cost (`paused_share`) allows at the measured cost while counting (`attached_share`), and no
/// more than it allows at the workload's last rate of sync points (`rate`, a second) at
/// [`SYNC_POINT_COST_NS`] each. Before the first rate (the first period, which is short) the
/// whole period where the cost can be measured (`stats`), [`MIN_SLICE`] where not; a rate of
/// zero bounds nothing; without a rate after the first slice, at most [`MAX_SLICE_GROWTH`]
/// times the last slice. While the workload is `starting` (the rate is its first, short period's),
/// [`MIN_SLICE`]: the rate to come is unknown, and a command's client starts in the next
/// period.
///
/// Why the rate, not growth. A slice's cost measured at a lower event rate understates the
/// next (the first slices come while the workload starts), so slices used to grow at most
/// twofold from a tenth of the first period: 5, 10, 20, 40 ms. But a slice sees an idle
/// period only if it began and ended inside it, so a light workload's long idle periods, the
/// ones halting makes dear, went unseen for its first 0.7 s (docs/idle-policy.md, "The
/// tracer's slices"). The last period's rate bounds a busy workload's slices from its first
/// measured period on, growth or not.
pub fn slice_for(
    period: Duration,
    paused_share: f64,
    attached_share: Option<f64>,
    stats: bool,
    last: Option<Duration>,
    rate: Option<f64>,
    starting: bool,
) -> Duration {
    // What the paused programs cost comes out of the budget (at most half of it).
    let budget = COST_SHARE - paused_share.min(RESIDENT_SHARE);
    let allowed = |cost_share: f64| {
        if cost_share > 0.0 {
            period.mul_f64((budget * EVERY as f64 / (1.0 + SANDWICH) / cost_share).min(1.0))
        } else {
            period
        }
    };
    let want = match attached_share {
        Some(c) => allowed(c),
        None if stats => period,
        None => MIN_SLICE,
    };
    let cap = match (rate, last) {
        _ if starting => MIN_SLICE,
        (Some(r), _) => allowed(r * SYNC_POINT_COST_NS / 1e9),
        (None, Some(l)) => l * MAX_SLICE_GROWTH,
        (None, None) => period,
    };
    want.min(cap).clamp(MIN_SLICE.min(period), period)
}

/// What is left of the first slice, `counted` into it: as much as the budget allows at the
/// cost measured over those first [`MIN_SLICE`] (`share` of a vCPU), up to the whole (short)
/// first period. Nothing is known before it (no rate, no paused stretch, not a start-up's
/// rate yet), so the budget is [`slice_for`]'s with the measured share alone. The first slice
/// used to be the whole period, sized before any cost was known: a ping-pong started with the
/// agent (counting at 23% of a vCPU) was counted for 51 ms, its tracer's CPU 14.5 ms of a 3 s
/// run (4.7 ms now). A light workload, whose first slice costs next to nothing, is still
/// counted through the period, where its few long idle periods can be seen.
pub fn first_slice_rest(period: Duration, counted: Duration, share: f64) -> Duration {
    slice_for(period, 0.0, Some(share), true, None, None, false).saturating_sub(counted)
}

/// Slices to wait, detached, before pausing again after `detaches` detaches for cost.
pub fn retry_after(detaches: u64) -> u64 {
    RETRY_SLICES << detaches.saturating_sub(1).min(5)
}

/// What a paused program costs per event before one was measured, ns (measured here: 58-80,
/// BPF run-time statistics included; `scripts/bench/tracer-cost.sh`).
pub const PAUSED_NS_GUESS: f64 = 80.0;

/// Would the programs, paused, cost at most half of [`RESIDENT_SHARE`] at the event rate of
/// a slice (`runs` events counted in `traced_ns`), at what [`paused_ns_at`] gives each from
/// the last paused stretch (`paused`)? The rate is doubled: counting slows a switch storm
/// down (a 0-think ping-pong), so its slices undercount what the paused programs would see.
pub fn pausing_fits(runs: u64, traced_ns: u64, paused: Option<(f64, f64)>) -> bool {
    let rate = 2.0 * runs as f64 / (traced_ns.max(1) as f64 / 1e9);
    rate * paused_ns_at(rate, paused) / 1e9 <= RESIDENT_SHARE / 2.0
}

/// Would the programs, paused, cost more than [`RESIDENT_SHARE`] at `rate` scheduler events a
/// second? What `Tracing::check_paused` judges after a paused stretch, predicted from a
/// slice's rate, at the cost per event [`paused_ns_at`] gives from the last paused stretch
/// (`paused`: its events a second and ns an event).
pub fn pausing_costs_too_much(rate: f64, paused: Option<(f64, f64)>) -> bool {
    rate * paused_ns_at(rate, paused) / 1e9 > RESIDENT_SHARE
}

/// The paused programs' cost readings over [`RESIDENT_SHARE`] in a row: a slice's prediction
/// ([`pausing_costs_too_much`]) or a paused stretch's measure. Two detach; one can be a burst
/// that passes (a light open loop at 50 requests/s was detached by one, now and then, in
/// full test-suite runs: its start-up, or the machine's own switching over a short
/// stretch), while a storm is over at every reading. No reading of the first period counts:
/// its rate is a start-up's (the tracer's second slice is sized afresh for that reason too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CostStrikes {
    over: u32,
    past_start: bool,
}

impl CostStrikes {
    /// Readings over the bound in a row that detach the programs.
    pub const TO_DETACH: u32 = 2;

    /// A period ended: readings from now on count.
    pub fn period_ended(&mut self) {
        self.past_start = true;
    }

    /// Records a reading (`over`: above the bound); true when it is the one that detaches
    /// (the count then starts again).
    pub fn record(&mut self, over: bool) -> bool {
        if !self.past_start {
            return false;
        }
        if !over {
            self.over = 0;
            return false;
        }
        self.over += 1;
        if self.over >= Self::TO_DETACH {
            self.over = 0;
            return true;
        }
        false
    }
}

/// What a paused program costs an event at `rate` events a second, from a paused stretch's
/// measure (`paused`: its rate and ns an event): that measure where it was taken at half this
/// rate or more; otherwise no more than [`PAUSED_NS_GUESS`]. An event's cost falls as the
/// rate rises (the programs stay in cache): a light workload's paused stretch measured 207 ns
/// an event, and that figure at its start-up slice's 16,000 a second detached its tracer
/// (the programs then cost ~60 ns an event). The prediction only ends a slice early;
/// `check_paused` measures the real cost a period later either way.
pub fn paused_ns_at(rate: f64, paused: Option<(f64, f64)>) -> f64 {
    match paused {
        Some((at, ns)) if at * 2.0 >= rate => ns,
        Some((_, ns)) => ns.min(PAUSED_NS_GUESS),
        None => PAUSED_NS_GUESS,
    }
}

/// What counting will cost in the next slice, as a share of one vCPU: the last slice's
/// measured share (`attached_share`), or, where higher, the scheduler's last seen event rate
/// (`event_rate`, a second: a paused stretch's or a slice's) at the last slice's cost per
/// event (`ns_per_run`). A slice measured while the rate was lower understates the next one:
/// `sysbench threads` (8 threads yielding on 2 vCPUs, 0.7-1 M events a second, few of them
/// sync points) read 4% from its start-up slice, and its next slice counted 24-29 ms at 36%.
pub fn counting_share(attached_share: Option<f64>, event_rate: Option<f64>, ns_per_run: Option<f64>) -> Option<f64> {
    let at_rate = event_rate.zip(ns_per_run).map(|(r, ns)| r * ns / 1e9);
    match (attached_share, at_rate) {
        (Some(a), Some(r)) => Some(a.max(r)),
        (a, r) => a.or(r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paused_program_s_share_is_its_run_time_over_the_wall_time() {
        assert!((share_of(5_000_000, Duration::from_secs(1)) - 0.005).abs() < 1e-12);
        assert!(share_of(1, Duration::ZERO).is_finite());
    }

    #[test]
    fn a_slice_is_bounded_by_the_workload_s_rate_and_before_one_grows_at_most_twofold() {
        let period = Duration::from_millis(200);
        let ms = Duration::from_millis;
        // Unmeasured, the first period: all of it with statistics, the shortest without.
        assert_eq!(slice_for(ms(50), 0.0, None, true, None, None, false), ms(50));
        assert_eq!(slice_for(period, 0.0, None, false, None, None, false), MIN_SLICE);
        // Measured nearly free, no rate: the whole period, but no more than twice the last.
        assert_eq!(slice_for(period, 0.0, Some(1e-6), true, None, None, false), period);
        assert_eq!(slice_for(period, 0.0, Some(1e-6), true, Some(ms(20)), None, false), ms(40));
        // A light workload (800 sync points a second, the open loop at 200 requests/s): 0.16%
        // of a vCPU at the guess, the whole period at once.
        assert_eq!(slice_for(period, 0.0, Some(1e-6), true, Some(ms(50)), Some(800.0), false), period);
        // A busy one (70,000 a second, redis with one connection) is held to the budget's
        // share at the guessed cost, however cheap its start-up slice read: 0.5% x 5 / 4.5 /
        // 14% = 4% of the period.
        let s = slice_for(period, 0.0, Some(1e-6), true, Some(ms(50)), Some(70_000.0), false);
        assert!((s.as_secs_f64() - 0.2 * 0.025 / 4.5 / 0.14).abs() < 1e-6, "{s:?}");
        // Costly as measured: the budget's share (0.5% x 5 periods / 4.5 / 5% = 11.1%).
        let s = slice_for(period, 0.0, Some(0.05), true, Some(period), Some(800.0), false);
        assert!((s.as_secs_f64() - 0.2 * 0.025 / 4.5 / 0.05).abs() < 1e-6, "{s:?}");
        // Never below MIN_SLICE (unless the period is shorter), never past the period; a
        // workload with no sync points bounds nothing.
        assert_eq!(slice_for(period, 0.0, Some(10.0), true, None, None, false), MIN_SLICE);
        assert_eq!(slice_for(ms(2), 0.0, Some(10.0), true, None, None, false), ms(2));
        assert_eq!(slice_for(period, 0.0, None, true, Some(ms(5)), Some(0.0), false), period);
        // A workload starting (the rate is its first period's): the shortest slice, whatever
        // the start-up's rate or cost allow. redis with one connection made 13-33 sync points
        // in its first 50 ms, a rate that let the next slice be the whole period, counted
        // through its client's first 5,000-8,500 requests.
        assert_eq!(slice_for(period, 0.0, Some(1e-6), true, Some(ms(50)), Some(300.0), true), MIN_SLICE);
        assert_eq!(slice_for(period, 0.0, Some(1e-6), true, Some(ms(50)), None, true), MIN_SLICE);
    }

    #[test]
    fn the_first_slice_goes_on_only_as_far_as_its_cost_allows() {
        let (first, ms) = (Duration::from_millis(50), Duration::from_millis);
        // A ping-pong started with the agent: counting cost 23% of a vCPU over the first
        // 5 ms, and the budget allows 0.5% x 5 / 4.5 / 23% of the period, 1.2 ms: it ends.
        assert_eq!(first_slice_rest(first, MIN_SLICE, 0.23), Duration::ZERO);
        // A light workload (an open loop at 200/s, or a server still starting): nearly
        // free, counted to the period's end; nothing counted at all, the same.
        assert_eq!(first_slice_rest(first, MIN_SLICE, 1e-5), first - MIN_SLICE);
        assert_eq!(first_slice_rest(first, MIN_SLICE, 0.0), first - MIN_SLICE);
        // In between, as far as the budget allows: 0.5% x 5 / 4.5 / 2% of 50 ms, 13.9 ms.
        let rest = first_slice_rest(first, MIN_SLICE, 0.02);
        assert!((rest.as_secs_f64() - (0.05 * 0.025 / 4.5 / 0.02 - 0.005)).abs() < 1e-6, "{rest:?}");
        // Never past the period, whatever was counted.
        assert_eq!(first_slice_rest(first, ms(60), 0.0), Duration::ZERO);
    }

    #[test]
    fn the_next_slice_costs_the_last_seen_event_rate_at_the_last_cost_per_event() {
        // sysbench threads: its start-up slice read 4%, the paused programs then saw 1 M
        // events a second, which counting at 210 ns each makes 21%.
        let c = counting_share(Some(0.04), Some(1e6), Some(210.0)).unwrap();
        assert!((c - 0.21).abs() < 1e-9, "{c}");
        // A slice measured dearer than the rate says (the rate fell since) keeps its share.
        assert_eq!(counting_share(Some(0.3), Some(1e6), Some(210.0)), Some(0.3));
        // Either alone, or nothing.
        assert_eq!(counting_share(Some(0.04), None, Some(210.0)), Some(0.04));
        assert_eq!(counting_share(None, Some(1e6), None), None);
        assert!((counting_share(None, Some(1e5), Some(200.0)).unwrap() - 0.02).abs() < 1e-12);
        // Which holds the slice to the budget: 0.5% x 5 / 4.5 / 21% of a 200 ms period, 5.3 ms.
        let period = Duration::from_millis(200);
        let s = slice_for(period, 0.0, Some(c), true, Some(Duration::from_millis(50)), Some(15_000.0), false);
        assert!((s.as_secs_f64() - 0.2 * 0.025 / 4.5 / 0.21).abs() < 1e-6, "{s:?}");
    }

    #[test]
    fn a_slice_s_event_rate_predicts_the_paused_cost_check() {
        // RESIDENT_SHARE (0.25% of a vCPU) at 80 ns an event: 31,250 events a second.
        assert!(!pausing_costs_too_much(30_000.0, None));
        assert!(pausing_costs_too_much(40_000.0, None));
        // sysbench threads' first slice: 700,000 a second.
        assert!(pausing_costs_too_much(700_000.0, Some((700_000.0, 60.0))));
        // sockperf under load at 2,000 messages/s (~16,000 a second) stays paused.
        assert!(!pausing_costs_too_much(16_000.0, Some((16_000.0, 60.0))));
        // A cost measured at this rate or near it is what it costs ...
        assert!(pausing_costs_too_much(16_000.0, Some((9_000.0, 207.0))));
        // ... but one measured over a light stretch is a cold figure, not the storm's.
        assert!(!pausing_costs_too_much(16_000.0, Some((500.0, 207.0))));
        assert!(pausing_costs_too_much(700_000.0, Some((500.0, 207.0))));
        assert_eq!(paused_ns_at(16_000.0, Some((500.0, 40.0))), 40.0);
    }

    #[test]
    fn one_reading_over_the_bound_is_a_burst_two_in_a_row_detach() {
        let mut s = CostStrikes::default();
        // The first period's readings, a start-up's, count for nothing.
        for _ in 0..3 {
            assert!(!s.record(true));
        }
        s.period_ended();
        // A burst between light readings never detaches.
        for over in [true, false, true, false, false, true] {
            assert!(!s.record(over), "{over}");
        }
        // Two in a row do, and the count starts again after.
        assert!(s.record(true));
        assert!(!s.record(true));
        assert!(s.record(true));
    }

    #[test]
    fn pausing_again_backs_off_and_needs_a_light_slice() {
        assert_eq!((retry_after(0), retry_after(1), retry_after(2), retry_after(3)), (8, 8, 16, 32));
        assert_eq!(retry_after(100), 8 << 5);
        // A 10 ms slice. sockperf under load at 2,000 messages/s: ~16,000 events/s, 160 in
        // the slice, at 60 ns each and doubled: 0.19% of a vCPU, over half the bound
        // (0.125%). (It pauses from the start, and its paused cost, ~0.1%, never detaches it.)
        let slice = 10_000_000;
        assert!(!pausing_fits(160, slice, Some((16_000.0, 60.0))));
        // An open loop at 500 requests/s: ~4,000 events/s: 0.05%.
        assert!(pausing_fits(40, slice, Some((4_000.0, 60.0))));
        // A 0-think ping-pong: hundreds of thousands a second.
        assert!(!pausing_fits(3_000, slice, Some((300_000.0, 60.0))));
        // Unmeasured: the guess.
        assert_eq!(pausing_fits(40, slice, None), pausing_fits(40, slice, Some((8_000.0, PAUSED_NS_GUESS))));
        // A cold figure from a lighter stretch counts for no more than the guess.
        assert_eq!(pausing_fits(40, slice, Some((400.0, 900.0))), pausing_fits(40, slice, None));
    }
}
