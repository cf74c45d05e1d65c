//! What the guest loop starts with, decided once from what the adapter found: the means the
//! machine offers, the wake-cost curve (or why there is none), and what the user asked for.
//! The agent, the simulator and the lab's predictor all call [`decide`]; each maps its own
//! world onto a [`SetupInput`].
//!
//! ```text
//!  retention off                         -> no means, no governors
//!  a fixed yielding window (--timeout-us) -> yielders with that window, no governors
//!  no curve                              -> no means (nothing to plan from), and why
//!  only the prior curve, no kernel polling -> no means (yielders start from this VM's own curve)
//!  kernel polling offered and allowed    -> its forms (window, until work), no yielders
//!  else                                  -> yielders (parked until the plan gives a window),
//!                                           their configuration from [`YielderStart`]
//!  the governors' first level: as asked, or from the curve (kernel polling: on; yielders:
//!  on where a busy vCPU wakes clearly faster than a halted one, else off, and why)
//! ```

use super::{GuestConfig, LoopPriors, StartConfig};
use crate::gleaner::Params;
use crate::idle::{Means, PlanConfig, WakeCurve};
use crate::retention::{GovernorConfig, RetentionConfig, RetentionMode};

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

/// What yielding threads start with where they serve (their window comes from the plan).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct YielderStart {
    /// A vCPU idle this long is taken to be waiting, ns (calibrated, configured, or the default).
    pub idle_threshold_ns: u64,
    /// The longest sleep after a timeout, ns.
    pub max_sleep_ns: u64,
    /// A sleep that lets new-idle balancing pull a waiting thread over, ns (0: never).
    pub step_aside_ns: u64,
}

impl Default for YielderStart {
    fn default() -> Self {
        let r = RetentionConfig::default();
        Self { idle_threshold_ns: r.idle_threshold_ns, max_sleep_ns: r.max_sleep_ns, step_aside_ns: r.step_aside_ns }
    }
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
    /// The curve is the prior ([`WakeCurve::prior`]), not this VM's: it serves the kernel's
    /// polling plan only (a wrong prior costs at most the budget there, a vCPU per yielder).
    pub curve_is_prior: bool,
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
    /// The yielding threads' start, where they serve.
    pub yielders: YielderStart,
}

impl<'a> SetupInput<'a> {
    /// The agent with no flags, for a workload, on `cpus` with `curve` (this VM's), on a
    /// machine whose idle offer is unknown (`offer: None`: yielders serve). The agent's
    /// default configuration maps onto exactly this (its tests check it); the lab's predictor
    /// starts from it.
    #[must_use]
    pub fn defaults(cpus: Vec<u32>, curve: Result<&'a WakeCurve, String>) -> Self {
        Self {
            cpus,
            retention: true,
            fixed_yield_ns: None,
            curve,
            curve_is_prior: false,
            offer: None,
            kernel_polling: Ok(true),
            workload: true,
            governor: Some(GovernorConfig::default()),
            prior: Prior::Calibrated,
            plan: PlanConfig::default(),
            start: StartConfig::default(),
            consolidation: None,
            period_ns: crate::guest::DEFAULT_PERIOD_NS,
            priors: LoopPriors::DEFAULT,
            yielders: YielderStart::default(),
        }
    }
}

/// What [`decide`] decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Setup {
    /// The guest loop's configuration.
    pub guest: GuestConfig,
    /// The adapter drives the kernel's idle knobs.
    pub kernel: bool,
    /// The yielding threads the adapter starts, with their configuration (their window:
    /// `guest.fixed_yield_ns`, else 0: parked until the plan gives one); `None`: none (no
    /// retention, or kernel polling serves and no governor runs the ladder, whose Wide level
    /// on a saturated VM they are).
    pub yielders: Option<RetentionConfig>,
    /// Why retention is off, or why kernel polling is not used although offered.
    pub note: Option<String>,
}

/// The curve the loop may plan from: the prior serves the kernel's polling plan only.
fn usable_curve<'a>(input: &SetupInput<'a>) -> Result<&'a WakeCurve, String> {
    let curve = input.curve.clone()?;
    let kernel_polling = input.offer.is_some_and(|o| o.kernel_polling) && input.kernel_polling == Ok(true) && curve.poll_ns.is_some();
    if input.curve_is_prior && !kernel_polling {
        return Err("no calibration record yet, and yielding threads start only from this VM's measured wake costs (measured after this run; `gleaner calibrate` measures them now)".into());
    }
    Ok(curve)
}

/// The yielding threads' configuration at start: parked (window 0) until the plan gives one,
/// or the fixed window; they never adapt on their own (the plan sets each window).
fn yielder_config(start: YielderStart, window_ns: Option<u64>) -> RetentionConfig {
    RetentionConfig {
        idle_threshold_ns: start.idle_threshold_ns,
        timeout_ns: window_ns.unwrap_or(0),
        max_sleep_ns: start.max_sleep_ns,
        step_aside_ns: start.step_aside_ns,
        adapt: false,
        ..RetentionConfig::default()
    }
}

/// Decides the guest loop's configuration (module documentation).
pub fn decide(input: SetupInput<'_>) -> Setup {
    let off = Means { poll_window: false, poll_always: false, yielders: false };
    let usable = usable_curve(&input);
    let mut guest = GuestConfig {
        cpus: input.cpus,
        consolidation: input.consolidation,
        plan: input.plan,
        means: off,
        curve: usable.as_ref().ok().map(|c| (*c).clone()),
        governor: None,
        prior: RetentionMode::On,
        fixed_yield_ns: None,
        start: input.start,
        period_ns: input.period_ns,
        priors: input.priors,
    };
    if !input.retention {
        return Setup { guest, kernel: false, yielders: None, note: None };
    }
    if let Some(ns) = input.fixed_yield_ns {
        guest.means = Means { yielders: true, ..off };
        guest.fixed_yield_ns = Some(ns);
        return Setup { guest, kernel: false, yielders: Some(yielder_config(input.yielders, Some(ns))), note: None };
    }
    let curve = match usable {
        Ok(c) => c,
        Err(why) => {
            return Setup { guest, kernel: false, yielders: None, note: Some(format!("retention off: no wake-cost curve ({why})")) }
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
                format!("retention starts off: a busy vCPU wakes barely faster than a halted one ({})", curve.describe())
            });
            RetentionMode::Off
        }
    };
    // Beside kernel polling the yielders are the ladder's Wide level on a VM the workload
    // saturates (`guest::ladder`), which only the governors run: parked until then.
    let beside = kernel && guest.governor.is_some();
    guest.means.yielders |= beside;
    let yielders = (!kernel || beside).then(|| yielder_config(input.yielders, None));
    Setup { guest, kernel, yielders, note }
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
        SetupInput { offer: Some(HALTPOLL), ..SetupInput::defaults(vec![0, 1], Ok(c)) }
    }

    #[test]
    fn a_haltpoll_guest_polls_in_the_kernel_and_starts_on() {
        let c = curve(Some(7_000), 40);
        let s = decide(input(&c));
        assert!(s.kernel && s.note.is_none(), "{s:?}");
        // Yielders beside, parked: the ladder's Wide level on a saturated VM.
        assert_eq!(s.yielders.map(|y| (y.timeout_ns, y.adapt)), Some((0, false)));
        assert_eq!(s.guest.means, Means { poll_window: true, poll_always: true, yielders: true });
        assert_eq!(s.guest.prior, RetentionMode::On);
        assert!(s.guest.governor.is_some());
        // Without a workload to read, no governors, and no yielders.
        let s = decide(SetupInput { workload: false, ..input(&c) });
        assert!(s.guest.governor.is_none() && s.yielders.is_none() && !s.guest.means.yielders, "{s:?}");
    }

    #[test]
    fn no_poll_state_or_no_knobs_mean_yielders_and_a_reason_where_one_is_owed() {
        let c = curve(None, 40);
        let s = decide(input(&c));
        assert!(!s.kernel && s.yielders.is_some() && s.guest.means.yielders, "a curve without polling: yielders");
        let c = curve(Some(7_000), 40);
        let s = decide(SetupInput { kernel_polling: Err("another agent drives the idle knobs".into()), ..input(&c) });
        assert!(!s.kernel && s.yielders.is_some() && s.note.unwrap().contains("another agent"));
        let s = decide(SetupInput { kernel_polling: Ok(false), ..input(&c) });
        assert!(!s.kernel && s.yielders.is_some() && s.note.is_none(), "--no-kernel-polling: no note");
    }

    #[test]
    fn yielders_start_parked_with_the_threshold_they_were_given() {
        let c = curve(None, 40);
        let start = YielderStart { idle_threshold_ns: 12_000, max_sleep_ns: 5_000_000, step_aside_ns: 0 };
        let y = decide(SetupInput { yielders: start, ..input(&c) }).yielders.expect("yielders serve without a POLL state");
        assert_eq!((y.timeout_ns, y.idle_threshold_ns, y.max_sleep_ns, y.adapt), (0, 12_000, 5_000_000, false));
    }

    #[test]
    fn the_prior_curve_starts_kernel_polling_but_never_yielders_alone() {
        let p = WakeCurve::prior();
        let s = decide(SetupInput { curve_is_prior: true, ..input(&p) });
        // Yielders only beside the kernel's polling (Wide on a saturated VM), never planned.
        assert!(s.kernel && s.guest.means.kernel_polling() && s.guest.curve == Some(WakeCurve::prior()), "{s:?}");
        for no_polling in [
            SetupInput { curve_is_prior: true, offer: None, ..input(&p) },
            SetupInput { curve_is_prior: true, kernel_polling: Err("another agent".into()), ..input(&p) },
            SetupInput { curve_is_prior: true, kernel_polling: Ok(false), ..input(&p) },
        ] {
            let s = decide(no_polling);
            assert!(!s.kernel && s.yielders.is_none() && s.guest.curve.is_none(), "{s:?}");
            assert!(s.note.as_deref().is_some_and(|n| n.contains("measured wake costs")), "{:?}", s.note);
        }
    }

    #[test]
    fn yielders_that_barely_beat_a_halt_start_off_and_say_why() {
        let c = curve(None, 110);
        let s = decide(input(&c));
        assert_eq!(s.guest.prior, RetentionMode::Off);
        assert!(s.note.unwrap().contains("starts off"));
        assert_eq!(decide(SetupInput { prior: Prior::Fixed(RetentionMode::On), ..input(&c) }).guest.prior, RetentionMode::On);
    }

    #[test]
    fn a_fixed_window_yields_and_no_curve_or_no_retention_retains_nothing() {
        let c = curve(Some(7_000), 40);
        let s = decide(SetupInput { fixed_yield_ns: Some(100_000), ..input(&c) });
        assert_eq!(s.guest.fixed_yield_ns, Some(100_000));
        assert_eq!(s.yielders.map(|y| (y.timeout_ns, y.adapt)), Some((100_000, false)), "the fixed window, never adapted");
        assert!(s.yielders.is_some() && !s.kernel && s.guest.governor.is_none());
        let s = decide(SetupInput { curve: Err("one CPU".into()), ..input(&c) });
        assert!(s.yielders.is_none() && !s.kernel && s.note.unwrap().contains("one CPU"));
        let s = decide(SetupInput { retention: false, ..input(&c) });
        assert!(s.yielders.is_none() && !s.kernel && s.guest.means == Means { poll_window: false, poll_always: false, yielders: false });
    }
}
