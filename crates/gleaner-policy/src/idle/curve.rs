//! What a wakeup costs on this machine, as a function of how long the waiter's vCPU was idle:
//! the wake-cost curve, measured once per boot (`gleaner calibrate`) and read by the idle
//! planner ([`super::plan`]), `diagnose` and the simulator.
//!
//! ```text
//!  cost (us)                                     C(g): the waiter's vCPU halts at once
//!   60 |                                 *----   (setting C after a gap of g)
//!      |                               /
//!   25 |  *------*------*------*------*          the host polls a halted vCPU for a while:
//!   17 |  B  (a yielder keeps the vCPU busy: the waker must send an IPI)
//!    5 |  P  (the vCPU polls in the kernel's POLL state: no IPI at all)
//!      +--------------------------------------- gap g (log)
//!        10us   100us   1ms   3ms   10ms
//! ```
//!
//! A halted vCPU that was idle for g costs `C(g)`; one kept busy by a `SCHED_IDLE` yielder
//! costs `B` (the waker sends a reschedule IPI, which exits on the sender and interrupts the
//! receiver); one polling in the kernel's idle loop costs `P` (the waker sees
//! `TIF_POLLING_NRFLAG` and skips the IPI). Between measured gaps the curve is interpolated
//! linearly in log(g); outside them it is flat.

use serde::{Deserialize, Serialize};

/// One measured point of the halted curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CurvePoint {
    /// How long the waiter's vCPU was idle before the wakeup, ns.
    pub gap_ns: u64,
    /// Mean wakeup latency, ns (a workload pays every wakeup: means, not medians).
    pub mean_ns: u64,
    /// Median wakeup latency, ns (for people).
    pub p50_ns: u64,
}

/// The wake-cost curve of one machine (module documentation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WakeCurve {
    /// Setting C with kernel polling off, by ascending gap.
    pub halted: Vec<CurvePoint>,
    /// Setting B: the waiter's vCPU kept busy by a yielder (mean, ns).
    pub busy_ns: u64,
    /// Setting P: the waiter's vCPU polls in the kernel's POLL state (mean, ns); `None` where
    /// the machine has no POLL state to measure.
    pub poll_ns: Option<u64>,
}

/// A cost below this is within the measurement's noise (ns).
pub const NOISE_NS: u64 = 3_000;

/// The curve a run plans from before this VM's own is measured (no calibration record yet):
/// a prior, replaced by the measurement as soon as there is one. Each point is the mean of the
/// two development VMs' records (`docs/data/current/vm-matrix/vm1/calibration.json`: 38 us after
/// 10 us idle to 69 us after 10 ms, busy 29, polling 3.5; `-2026-11-28`: 17 to 74, busy 17,
/// polling 3.1), which agree with what these Firecracker/KVM hosts are known to do: a wakeup
/// after 50 us costs 21-35 us (the host still halt-polls), after 3 ms 60-80 us, polling in the
/// guest 4-6 us. Only the kernel's polling plan is started from it: its per-period plan and the
/// governor's probes judge it on the workload, and a wrong prior costs at most the budget.
/// Yielding threads are not (a wrong prior would cost a vCPU each).
pub const PRIOR_HALTED_US: [(u64, u64); 7] = [(10, 28), (30, 28), (100, 32), (300, 40), (1_000, 40), (3_000, 52), (10_000, 72)];
/// The prior's busy-vCPU cost, us ([`PRIOR_HALTED_US`]).
pub const PRIOR_BUSY_US: u64 = 23;
/// The prior's polling cost, us ([`PRIOR_HALTED_US`]).
pub const PRIOR_POLL_US: u64 = 3;

impl WakeCurve {
    /// The prior ([`PRIOR_HALTED_US`]): what a run plans from until this VM's curve is measured.
    #[must_use]
    pub fn prior() -> Self {
        let pt = |(gap_us, cost_us): (u64, u64)| CurvePoint { gap_ns: gap_us * 1000, mean_ns: cost_us * 1000, p50_ns: cost_us * 1000 };
        Self::new(PRIOR_HALTED_US.iter().copied().map(pt).collect(), PRIOR_BUSY_US * 1000, Some(PRIOR_POLL_US * 1000))
    }

    /// A curve from points in any order (sorted here; duplicates of a gap keep the last).
    #[must_use]
    pub fn new(mut halted: Vec<CurvePoint>, busy_ns: u64, poll_ns: Option<u64>) -> Self {
        halted.sort_by_key(|p| p.gap_ns);
        halted.dedup_by(|later, earlier| {
            if later.gap_ns == earlier.gap_ns {
                *earlier = *later;
                true
            } else {
                false
            }
        });
        Self { halted, busy_ns, poll_ns }
    }

    /// Checks that the curve can be used: at least one point, gaps > 0.
    pub fn validate(&self) -> Result<(), String> {
        if self.halted.is_empty() {
            return Err("a wake-cost curve needs at least one halted point".into());
        }
        if let Some(p) = self.halted.iter().find(|p| p.gap_ns == 0) {
            return Err(format!("a halted point has gap 0 ns (mean {} ns): gaps must be > 0", p.mean_ns));
        }
        if self.halted.windows(2).any(|w| w[0].gap_ns >= w[1].gap_ns) {
            return Err("halted points must have strictly ascending gaps".into());
        }
        Ok(())
    }

    /// Mean cost (ns) of waking a vCPU that halted for `gap_ns`: interpolated linearly in
    /// log(gap) between measured points, flat outside them. 0 for an empty curve.
    #[must_use]
    pub fn halt_cost_ns(&self, gap_ns: f64) -> f64 {
        let pts = &self.halted;
        let (Some(first), Some(last)) = (pts.first(), pts.last()) else {
            return 0.0;
        };
        if gap_ns <= first.gap_ns as f64 {
            return first.mean_ns as f64;
        }
        if gap_ns >= last.gap_ns as f64 {
            return last.mean_ns as f64;
        }
        let lg = gap_ns.max(1.0).ln();
        for w in pts.windows(2) {
            let (a, b) = (w[0], w[1]);
            if gap_ns <= b.gap_ns as f64 {
                let (la, lb) = ((a.gap_ns as f64).ln(), (b.gap_ns as f64).ln());
                let t = if lb > la { (lg - la) / (lb - la) } else { 1.0 };
                return a.mean_ns as f64 + t * (b.mean_ns as f64 - a.mean_ns as f64);
            }
        }
        last.mean_ns as f64
    }

    /// The cost of a wakeup while the vCPU polls in the kernel, or `None` without a POLL state.
    #[must_use]
    pub fn poll_cost_ns(&self) -> Option<f64> {
        self.poll_ns.map(|p| p as f64)
    }

    /// The cost of a wakeup while a yielder keeps the vCPU busy.
    #[must_use]
    pub fn busy_cost_ns(&self) -> f64 {
        self.busy_ns as f64
    }

    /// Shortest and longest measured halted cost (ns).
    #[must_use]
    pub fn halted_range_ns(&self) -> Option<(u64, u64)> {
        let min = self.halted.iter().map(|p| p.mean_ns).min()?;
        let max = self.halted.iter().map(|p| p.mean_ns).max()?;
        Some((min, max))
    }

    /// How long the host keeps a halted vCPU cheap to wake: the longest measured gap whose
    /// cost is still within a quarter of the way from the cheapest halted wakeup to the
    /// dearest (`None` when the curve is flat within noise: no such window to speak of, or
    /// it spans every measured gap: then it is the last gap).
    #[must_use]
    pub fn host_poll_window_ns(&self) -> Option<u64> {
        let (min, max) = self.halted_range_ns()?;
        if max.saturating_sub(min) < NOISE_NS {
            return None;
        }
        let cheap = min as f64 + (max - min) as f64 / 4.0;
        // The window ends before the first gap past which the cost never comes back down.
        let mut window = None;
        for p in &self.halted {
            if (p.mean_ns as f64) <= cheap {
                window = Some(p.gap_ns);
            } else {
                break;
            }
        }
        window
    }

    /// Whether a yielding thread can pay here: a busy vCPU wakes faster than a halted one after
    /// a long gap by at least a quarter (and more than the noise). The TCG lab alone measured
    /// busy 54.5 us vs halted 65 us (17%: no); next to a co-runner busy 0.4-5 ms vs halted
    /// 90 us (no); the development VMs 13 vs 32 us and 40 vs 116 us (yes).
    #[must_use]
    pub fn yielders_can_pay(&self) -> bool {
        let long = self.halted.last().map_or(0, |p| p.mean_ns);
        long.saturating_sub(self.busy_ns) >= NOISE_NS.max(long / 4)
    }

    /// The curve in one phrase, for people: "wake cost 49..116 us halted (cheap up to 1000 us
    /// idle), 40 us kept busy, 7 us polling".
    #[must_use]
    pub fn describe(&self) -> String {
        let us = |ns: u64| format!("{:.0}", ns as f64 / 1000.0);
        let halted = match self.halted_range_ns() {
            Some((lo, hi)) => format!("{}..{} us halted", us(lo), us(hi)),
            None => "no halted points".into(),
        };
        let window = self.host_poll_window_ns().map_or(String::new(), |w| format!(" (cheap up to {} us idle)", us(w)));
        let poll = self.poll_ns.map_or(", no POLL state".to_string(), |p| format!(", {} us polling", us(p)));
        format!("wake cost {halted}{window}, {} us kept busy{poll}", us(self.busy_ns))
    }

    /// What a halt costs after a long idle period beyond the cheapest wakeup the machine can
    /// offer (a polling vCPU where there is one, else a busy one), ns.
    #[must_use]
    pub fn long_gap_penalty_ns(&self) -> u64 {
        let last = self.halted.last().map_or(0, |p| p.mean_ns);
        let best = self.poll_ns.map_or(self.busy_ns, |p| p.min(self.busy_ns));
        last.saturating_sub(best)
    }
}

/// What retention saves on one wakeup after an idle gap: the halted cost against the
/// cheapest retained wakeup (the kernel's POLL state where there is one, else a busy vCPU).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GapSaving {
    /// The idle gap before the wakeup, ns.
    pub gap_ns: u64,
    /// Mean cost when the vCPU halted, ns.
    pub halted_ns: u64,
    /// Mean cost when it was retained, ns.
    pub retained_ns: u64,
    /// Retained by polling in the kernel (else by a yielding thread).
    pub by_polling: bool,
    /// `halted - retained`, ns (0 when retaining does not help).
    pub saved_ns: u64,
    /// `halted / retained`: how many times faster a retained wakeup is.
    pub speedup: f64,
}

impl WakeCurve {
    /// The cheapest retained wakeup (ns) and whether it is by polling.
    #[must_use]
    pub fn retained_cost_ns(&self) -> (u64, bool) {
        match self.poll_ns {
            Some(p) if p <= self.busy_ns => (p, true),
            _ => (self.busy_ns, false),
        }
    }

    /// What retention saves per wakeup at every measured gap (`diagnose`'s table and verdict).
    #[must_use]
    pub fn savings(&self) -> Vec<GapSaving> {
        let (retained_ns, by_polling) = self.retained_cost_ns();
        self.halted
            .iter()
            .map(|p| GapSaving {
                gap_ns: p.gap_ns,
                halted_ns: p.mean_ns,
                retained_ns,
                by_polling,
                saved_ns: p.mean_ns.saturating_sub(retained_ns),
                speedup: if retained_ns == 0 { 1.0 } else { p.mean_ns as f64 / retained_ns as f64 },
            })
            .collect()
    }

    /// The largest speedup retention gives a wakeup after a gap of at most `up_to_ns`, counting
    /// only savings above the noise (`None` for an empty curve or no gap that short).
    #[must_use]
    pub fn best_speedup(&self, up_to_ns: u64) -> Option<GapSaving> {
        self.savings()
            .into_iter()
            .filter(|s| s.gap_ns <= up_to_ns)
            .map(|s| if s.saved_ns < NOISE_NS { GapSaving { speedup: 1.0, ..s } } else { s })
            .max_by(|a, b| a.speedup.total_cmp(&b.speedup))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_prior_is_a_usable_curve_with_the_shape_of_a_kvm_host() {
        let p = WakeCurve::prior();
        assert!(p.validate().is_ok());
        assert!(p.host_poll_window_ns().is_some(), "the host's halt-polling window shows");
        assert!(p.long_gap_penalty_ns() > 60_000, "a long halt is dear");
        assert!(p.halt_cost_ns(50_000.0) < p.halt_cost_ns(3_000_000.0));
    }

    use super::*;

    fn pt(gap_us: u64, mean_us: u64) -> CurvePoint {
        CurvePoint { gap_ns: gap_us * 1000, mean_ns: mean_us * 1000, p50_ns: mean_us * 1000 }
    }

    #[test]
    fn the_curve_reads_in_one_phrase() {
        let c = WakeCurve::new(vec![pt(10, 49), pt(1000, 58), pt(10_000, 116)], 40_000, Some(7_000));
        assert_eq!(c.describe(), "wake cost 49..116 us halted (cheap up to 1000 us idle), 40 us kept busy, 7 us polling");
        let flat = WakeCurve::new(vec![pt(50, 19), pt(1000, 20)], 18_000, None);
        assert_eq!(flat.describe(), "wake cost 19..20 us halted, 18 us kept busy, no POLL state");
    }

    #[test]
    fn savings_price_each_gap_against_the_cheapest_retained_wakeup() {
        let vm = issue_vm();
        let s = vm.savings();
        assert_eq!(s.len(), vm.halted.len());
        assert!(s.iter().all(|g| g.by_polling && g.retained_ns == 6_000));
        let first = s[0];
        assert_eq!(first.saved_ns, first.halted_ns - 6_000);
        assert!((first.speedup - first.halted_ns as f64 / 6_000.0).abs() < 1e-9);
        // Short gaps: polling wakes ~3.5x faster than a halt on this VM.
        let best = vm.best_speedup(1_000_000).expect("gaps up to 1 ms");
        assert!(best.gap_ns <= 1_000_000 && best.speedup > 3.0, "{best:?}");
        // Without a POLL state only the yielders retain: B against C.
        let no_poll = WakeCurve { poll_ns: None, ..vm.clone() };
        assert!(no_poll.savings().iter().all(|g| !g.by_polling && g.retained_ns == 17_000));
        let b = no_poll.best_speedup(1_000_000).unwrap();
        assert!(b.speedup < 2.0, "{b:?}");
        // A saving within the noise is no speedup; no gap short enough is no verdict.
        let flat = WakeCurve::new(vec![pt(50, 19), pt(1000, 20)], 18_000, None);
        assert_eq!(flat.best_speedup(1_000_000).unwrap().speedup, 1.0);
        assert_eq!(vm.best_speedup(1_000), None);
        // A POLL state dearer than a busy vCPU: the yielders are the cheaper retention.
        let odd = WakeCurve { poll_ns: Some(30_000), ..vm };
        assert_eq!(odd.retained_cost_ns(), (17_000, false));
    }

    /// The retention issue's VM: C after 50..3000 us, B 17 us, P 6 us.
    pub(crate) fn issue_vm() -> WakeCurve {
        WakeCurve::new(vec![pt(50, 21), pt(150, 21), pt(300, 23), pt(1000, 25), pt(3000, 59)], 17_000, Some(6_000))
    }

    #[test]
    fn interpolates_in_log_gap_and_is_flat_outside() {
        let c = issue_vm();
        assert_eq!(c.halt_cost_ns(10_000.0), 21_000.0);
        assert_eq!(c.halt_cost_ns(50_000_000.0), 59_000.0);
        // Halfway between 1 ms and 3 ms in log space: sqrt(3) ms.
        let mid = c.halt_cost_ns(3f64.sqrt() * 1e6);
        assert!((mid - 42_000.0).abs() < 1.0, "{mid}");
        assert_eq!(c.halt_cost_ns(300_000.0), 23_000.0);
    }

    #[test]
    fn derives_the_hosts_poll_window_and_the_long_gap_penalty() {
        let c = issue_vm();
        // 21..59 us: cheap up to 21 + 9.5 = 30.5 us, i.e. through 1 ms.
        assert_eq!(c.host_poll_window_ns(), Some(1_000_000));
        assert_eq!(c.long_gap_penalty_ns(), 53_000);
        let flat = WakeCurve::new(vec![pt(10, 40), pt(10_000, 41)], 38_000, None);
        assert_eq!(flat.host_poll_window_ns(), None);
        assert_eq!(flat.long_gap_penalty_ns(), 3_000);
    }

    #[test]
    fn new_sorts_and_validate_names_the_problem() {
        let c = WakeCurve::new(vec![pt(1000, 30), pt(10, 20), pt(10, 22)], 15_000, None);
        assert_eq!(c.halted.iter().map(|p| p.gap_ns).collect::<Vec<_>>(), vec![10_000, 1_000_000]);
        assert_eq!(c.halted[0].mean_ns, 22_000);
        assert!(c.validate().is_ok());
        assert!(WakeCurve::new(vec![], 1, None).validate().unwrap_err().contains("at least one"));
        let zero = WakeCurve { halted: vec![pt(0, 5)], busy_ns: 1, poll_ns: None };
        assert!(zero.validate().unwrap_err().contains("gap 0"));
        let unsorted = WakeCurve { halted: vec![pt(5, 5), pt(1, 5)], busy_ns: 1, poll_ns: None };
        assert!(unsorted.validate().unwrap_err().contains("ascending"));
        assert_eq!(WakeCurve::new(vec![], 1, None).halt_cost_ns(5.0), 0.0);
    }
}
