//! What the guest loop starts with, decided once from what the adapter found: the means the
//! machine offers, the wake-cost curve (or why there is none), and what the user asked for.
//! The agent, the simulator and the lab's predictor all call [`decide`]; each maps its own
//! world onto a [`SetupInput`].
//!
//! ```text
//!  retention off                         -> no means, no governors
//!  a fixed yielding window (--timeout-us) -> yielders with that window, no governors
//!  no curve                              -> no means (nothing to plan from), and why
//!  kernel polling offered and allowed    -> its forms (window, until work), no yielders
//!  else                                  -> yielders (parked until the plan gives a window)
//!  the governors' first level: as asked, or from the curve (kernel polling: on; yielders:
//!  on where a busy vCPU wakes clearly faster than a halted one, else off, and why)
//! ```

use super::{GuestConfig, LoopPriors, StartConfig};
use crate::gleaner::Params;
use crate::idle::{Means, PlanConfig, WakeCurve};
use crate::retention::{GovernorConfig, RetentionMode};

/// What the machine offers to keep idle vCPUs from halting (the adapter's reading of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Offer {
    /// A POLL state some governor enters.
    pub kernel_polling: bool,
    /// The haltpoll governor's window.
    pub poll_window: bool,
    /// Per-CPU polling until work (resume latency limits).
    pub poll_always: bool,
}

/// The governors' first level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prior {
    /// From the curve (module documentation).
    Calibrated,
    /// As given.
    Fixed(RetentionMode),
}

/// Everything [`decide`] reads.
#[derive(Debug, Clone)]
pub struct SetupInput<'a> {
    pub cpus: Vec<u32>,
    /// Retention asked for.
    pub retention: bool,
    /// A fixed yielding window for every vCPU (`--timeout-us`), ns.
    pub fixed_yield_ns: Option<u64>,
    /// The wake-cost curve, or why there is none.
    pub curve: Result<&'a WakeCurve, String>,
    /// What the machine offers (`None`: unreadable).
    pub offer: Option<Offer>,
    /// Kernel polling may be used: asked for and the knobs are this agent's (`Err`: why not;
    /// a reason only where the user would not expect it, e.g. another agent holds the knobs).
    pub kernel_polling: Result<bool, String>,
    /// There is a workload whose progress the governors can read.
    pub workload: bool,
    /// The governors' configuration (`None`: the plan is applied without comparisons).
    pub governor: Option<GovernorConfig>,
    pub prior: Prior,
    pub plan: PlanConfig,
    pub start: StartConfig,
    pub consolidation: Option<Params>,
    /// The configured control period, ns.
    pub period_ns: u64,
    /// The loop's priors.
    pub priors: LoopPriors,
}

/// What [`decide`] decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Setup {
    /// The guest loop's configuration.
    pub guest: GuestConfig,
    /// The adapter drives the kernel's idle knobs.
    pub kernel: bool,
    /// The adapter starts yielding threads (their window: `guest.fixed_yield_ns`, else
    /// parked until the plan gives one).
    pub yielders: bool,
    /// Why retention is off, or why kernel polling is not used although offered.
    pub note: Option<String>,
}

/// Decides the guest loop's configuration (module documentation). `describe_curve` words the
/// curve for a note.
pub fn decide(input: SetupInput<'_>, describe_curve: impl Fn(&WakeCurve) -> String) -> Setup {
    let off = Means { poll_window: false, poll_always: false, yielders: false };
    let mut guest = GuestConfig {
        cpus: input.cpus,
        consolidation: input.consolidation,
        plan: input.plan,
        means: off,
        curve: input.curve.as_ref().ok().map(|c| (*c).clone()),
        governor: None,
        prior: RetentionMode::On,
        fixed_yield_ns: None,
        start: input.start,
        period_ns: input.period_ns,
        priors: input.priors,
    };
    if !input.retention {
        return Setup { guest, kernel: false, yielders: false, note: None };
    }
    if let Some(ns) = input.fixed_yield_ns {
        guest.means = Means { yielders: true, ..off };
        guest.fixed_yield_ns = Some(ns);
        return Setup { guest, kernel: false, yielders: true, note: None };
    }
    let curve = match input.curve {
        Ok(c) => c,
        Err(why) => {
            return Setup { guest, kernel: false, yielders: false, note: Some(format!("retention off: no wake-cost curve ({why})")) }
        }
    };
    let mut note = None;
    let offered = input.offer.filter(|o| o.kernel_polling && curve.poll_ns.is_some());
    let kernel = match (offered, input.kernel_polling) {
        (Some(_), Ok(allowed)) => allowed,
        (Some(_), Err(why)) => {
            note = Some(format!("kernel polling not used: {why}; yielding threads instead"));
            false
        }
        (None, _) => false,
    };
    guest.means = match offered.filter(|_| kernel) {
        Some(o) => Means { poll_window: o.poll_window, poll_always: o.poll_always, yielders: false },
        None => Means { yielders: true, ..off },
    };
    if input.workload {
        guest.governor = input.governor;
    }
    guest.prior = match input.prior {
        Prior::Fixed(m) => m,
        // Kernel polling is planned per period and rarely costs more than its budget; a
        // yielder pays only where a busy vCPU wakes clearly faster than a halted one.
        Prior::Calibrated if kernel || curve.yielders_can_pay() => RetentionMode::On,
        Prior::Calibrated => {
            note.get_or_insert_with(|| {
                format!("retention starts off: a busy vCPU wakes barely faster than a halted one ({})", describe_curve(curve))
            });
            RetentionMode::Off
        }
    };
    Setup { guest, kernel, yielders: !kernel, note }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idle::CurvePoint;

    fn curve(poll: Option<u64>, busy_us: u64) -> WakeCurve {
        let pt = |g: u64, m: u64| CurvePoint { gap_ns: g * 1000, mean_ns: m * 1000, p50_ns: m * 1000 };
        WakeCurve::new(vec![pt(10, 49), pt(1000, 58), pt(10_000, 116)], busy_us * 1000, poll)
    }

    const HALTPOLL: Offer = Offer { kernel_polling: true, poll_window: true, poll_always: true };

    fn input(c: &WakeCurve) -> SetupInput<'_> {
        SetupInput {
            cpus: vec![0, 1],
            retention: true,
            fixed_yield_ns: None,
            curve: Ok(c),
            offer: Some(HALTPOLL),
            kernel_polling: Ok(true),
            workload: true,
            governor: Some(GovernorConfig::default()),
            prior: Prior::Calibrated,
            plan: PlanConfig::default(),
            start: StartConfig::default(),
            consolidation: None,
            period_ns: crate::guest::DEFAULT_PERIOD_NS,
            priors: LoopPriors::default(),
        }
    }

    fn words(_: &WakeCurve) -> String {
        "the curve".into()
    }

    #[test]
    fn a_haltpoll_guest_polls_in_the_kernel_and_starts_on() {
        let c = curve(Some(7_000), 40);
        let s = decide(input(&c), words);
        assert!(s.kernel && !s.yielders && s.note.is_none(), "{s:?}");
        assert_eq!(s.guest.means, Means { poll_window: true, poll_always: true, yielders: false });
        assert_eq!(s.guest.prior, RetentionMode::On);
        assert!(s.guest.governor.is_some());
        // Without a workload to read, no governors.
        assert!(decide(SetupInput { workload: false, ..input(&c) }, words).guest.governor.is_none());
    }

    #[test]
    fn no_poll_state_or_no_knobs_mean_yielders_and_a_reason_where_one_is_owed() {
        let c = curve(None, 40);
        let s = decide(input(&c), words);
        assert!(!s.kernel && s.yielders && s.guest.means.yielders, "a curve without polling: yielders");
        let c = curve(Some(7_000), 40);
        let s = decide(SetupInput { kernel_polling: Err("another agent drives the idle knobs".into()), ..input(&c) }, words);
        assert!(!s.kernel && s.yielders && s.note.unwrap().contains("another agent"));
        let s = decide(SetupInput { kernel_polling: Ok(false), ..input(&c) }, words);
        assert!(!s.kernel && s.yielders && s.note.is_none(), "--no-kernel-polling: no note");
    }

    #[test]
    fn yielders_that_barely_beat_a_halt_start_off_and_say_why() {
        let c = curve(None, 110);
        let s = decide(input(&c), words);
        assert_eq!(s.guest.prior, RetentionMode::Off);
        assert!(s.note.unwrap().contains("starts off"));
        assert_eq!(decide(SetupInput { prior: Prior::Fixed(RetentionMode::On), ..input(&c) }, words).guest.prior, RetentionMode::On);
    }

    #[test]
    fn a_fixed_window_yields_and_no_curve_or_no_retention_retains_nothing() {
        let c = curve(Some(7_000), 40);
        let s = decide(SetupInput { fixed_yield_ns: Some(100_000), ..input(&c) }, words);
        assert_eq!(s.guest.fixed_yield_ns, Some(100_000));
        assert!(s.yielders && !s.kernel && s.guest.governor.is_none());
        let s = decide(SetupInput { curve: Err("one CPU".into()), ..input(&c) }, words);
        assert!(!s.yielders && !s.kernel && s.note.unwrap().contains("one CPU"));
        let s = decide(SetupInput { retention: false, ..input(&c) }, words);
        assert!(!s.yielders && !s.kernel && s.guest.means == Means { poll_window: false, poll_always: false, yielders: false });
    }
}
