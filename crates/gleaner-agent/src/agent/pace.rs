//! The agent's period work in short pieces: between its steps (and between the workload's
//! threads while sampling) the main thread calls `sched_yield()` once a piece has run
//! [`agent_pace_ns`], so a thread woken on its vCPU waits for one piece, not for the whole of
//! the period's work ([`GuestController::agent_paced`] says when; the rule and its numbers
//! are there).
//!
//! ```text
//!  period work   |--piece--|y|--piece--|y|--piece--|      y = sched_yield(): a woken
//!                 <= 50 us                                    thread runs here
//! ```
//!
//! [`agent_pace_ns`]: gleaner_policy::guest::LoopPriors::agent_pace_ns
//! [`GuestController::agent_paced`]: gleaner_policy::guest::GuestController::agent_paced

use std::time::{Duration, Instant};

use gleaner_os::sched;

/// Cuts a stretch of work into pieces of at most `every` between [`Pacer::point`]s.
#[derive(Debug)]
pub struct Pacer {
    every: Duration,
    on: bool,
    /// When the piece running now began.
    since: Instant,
    yields: u64,
}

impl Pacer {
    /// A pacer stepping aside once a piece has run `every`; off until [`Pacer::start`].
    pub fn new(every: Duration) -> Self {
        Self { every, on: false, since: Instant::now(), yields: 0 }
    }

    /// A pacer that never steps aside (tests, one-off samples).
    pub fn off() -> Self {
        Self::new(Duration::MAX)
    }

    /// Begins the period's work: paced (`on`) or in one piece.
    pub fn start(&mut self, on: bool) {
        self.on = on;
        self.since = Instant::now();
    }

    /// Whether [`Pacer::point`] steps aside this period.
    pub fn is_on(&self) -> bool {
        self.on
    }

    /// A point between two steps of the work: yields the CPU when the piece ending here ran
    /// `every` or longer (a thread woken meanwhile then runs; where none waits, the call
    /// returns at once).
    pub fn point(&mut self) {
        if !self.on || self.since.elapsed() < self.every {
            return;
        }
        sched::yield_now();
        self.yields += 1;
        self.since = Instant::now();
    }

    /// `sched_yield()` calls so far.
    pub fn yields(&self) -> u64 {
        self.yields
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_as_long_as_the_limit_ends_in_a_yield_and_an_unpaced_period_never_yields() {
        let mut p = Pacer::new(Duration::ZERO);
        p.point();
        assert_eq!(p.yields(), 0, "off until started");
        p.start(true);
        assert!(p.is_on());
        p.point();
        p.point();
        assert_eq!(p.yields(), 2, "every piece reached the limit of 0");
        p.start(false);
        p.point();
        assert_eq!(p.yields(), 2, "a period in one piece");

        let mut long = Pacer::new(Duration::from_secs(3600));
        long.start(true);
        long.point();
        assert_eq!(long.yields(), 0, "a piece shorter than the limit goes on");

        let mut off = Pacer::off();
        off.start(true);
        off.point();
        assert_eq!(off.yields(), 0);
    }

    #[test]
    fn the_limit_is_measured_from_the_last_yield() {
        // A piece begun 11 s ago against a 10 s limit, without sleeping through it: only a
        // 10 s stall between the two points below could make the second one yield too.
        let mut p = Pacer::new(Duration::from_secs(10));
        p.start(true);
        p.since = Instant::now().checked_sub(Duration::from_secs(11)).expect("the monotonic clock is past 11 s");
        p.point();
        assert_eq!(p.yields(), 1, "11 s of work past a 10 s limit");
        p.point();
        assert_eq!(p.yields(), 1, "the next piece starts at the yield");
    }
}
