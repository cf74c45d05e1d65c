//! What the agent starts with, decided once: the calibration (the wake-cost curve, from the
//! run dir's record or measured now), what the machine offers to keep idle vCPUs from halting,
//! and from those the guest loop's configuration (`gleaner_policy::guest::GuestConfig`).
//!
//! ```text
//!  IdleKnobs::offer (POLL state? haltpoll window? per-CPU resume latency?)
//!  + the idle-knob lock (one agent drives them)      --> Means { poll_window, poll_always, yielders }
//!  cache::obtain (record, or calibrate::measure)     --> WakeCurve (C by gap, B, P)
//!  flags (--budget, --timeout-us, --no-adapt, ...)   --> SetupInput
//!  gleaner_policy::guest::setup::decide              --> Setup (GuestConfig, yielders' config)
//! ```

use gleaner_os::cpuset::CpuSet;
use gleaner_os::idle::IdleOffer;
use gleaner_policy::guest::setup::{self, Offer, Prior, Setup, SetupInput, YielderStart};
use gleaner_policy::idle::WakeCurve;
use gleaner_policy::retention::{RetentionConfig, RetentionMode};

use crate::cache::{CalibrationResults, CalibrationSource, PollingControl};
use crate::calibrate::Control;
use crate::config::{AgentConfig, RetentionStart};

/// The calibration an agent starts from, and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibrated {
    /// The numbers, or why there are none (retention then has no curve to plan from).
    pub results: Result<CalibrationResults, String>,
    /// `None`: nothing was calibrated (`--timeout-us` with `--idle-threshold-us`, or no
    /// retention).
    pub source: Option<CalibrationSource>,
    /// The idle threshold sampled without a curve (`--timeout-us` without
    /// `--idle-threshold-us`), ns.
    pub threshold_ns: Option<u64>,
}

impl Calibrated {
    pub fn curve(&self) -> Option<&WakeCurve> {
        self.results.as_ref().ok().map(|r| &r.curve)
    }

    /// The curve is the prior, not this VM's.
    pub fn is_prior(&self) -> bool {
        matches!(self.source, Some(CalibrationSource::Prior { .. }))
    }
}

/// The calibration for `cpus`: the run dir's record when valid; else, for a workload, the
/// prior (its workload starts at once; [`after_the_workload`] measures this VM's for the runs
/// after it), and for system-wide retention (the daemon at boot) or `--recalibrate` measured
/// now with the idle knobs under `control` (and stored). With `--timeout-us` only the idle
/// threshold is needed (from a valid record, or sampled now).
pub fn calibration(cfg: &AgentConfig, cpus: &CpuSet, control: Control<'_>, workload: bool) -> Calibrated {
    let policy = cfg.cache_policy();
    let world = crate::cache::World::real();
    if cfg.timeout_us.is_some() {
        let (idle, source) = match cfg.idle_threshold_us {
            Some(t) => (t * 1000, None),
            None => {
                let (v, s) = crate::cache::idle_threshold(&policy, &world, cpus, crate::calibrate::idle_threshold_now);
                (v, Some(s))
            }
        };
        let results = Err(format!("--timeout-us given: yielding threads with a fixed window, idle threshold {} us", idle / 1000));
        return Calibrated { results, source, threshold_ns: Some(idle) };
    }
    if workload && !cfg.recalibrate {
        return match crate::cache::lookup_valid(&policy, &world, cpus) {
            Ok(hit) => Calibrated { results: hit.results.map_err(|inc| inc.error), source: Some(hit.source), threshold_ns: None },
            Err(why) => prior(why),
        };
    }
    let got = crate::cache::obtain(&policy, &world, cpus, || crate::calibrate::measure(cpus, control));
    Calibrated { results: got.results.map_err(|inc| inc.error), source: Some(got.source), threshold_ns: None }
}

/// The prior curve, for a run without a valid record (`why`).
fn prior(why: crate::cache::Reason) -> Calibrated {
    let polling = PollingControl { halted: "not measured (the prior)".into(), poll: "not measured (the prior)".into() };
    let results =
        CalibrationResults { curve: WakeCurve::prior(), idle_threshold_ns: RetentionConfig::default().idle_threshold_ns, polling };
    Calibrated { results: Ok(results), source: Some(CalibrationSource::Prior { why }), threshold_ns: None }
}

/// After a workload that ran from the prior and ended by itself: measures this VM's curve and
/// stores it for the runs after this one (about 2 s, once per boot). The agent's changes are
/// undone by then; the measurement journals and restores its own. `say` is called just before
/// it measures. `None`: nothing to do (no prior, or a signal came).
pub fn after_the_workload(
    cfg: &AgentConfig,
    cpus: &CpuSet,
    calibrated: Option<&CalibrationSource>,
    say: impl FnOnce(),
) -> Option<CalibrationSource> {
    if !calibrated.is_some_and(CalibrationSource::wants_measuring) || gleaner_os::signal::received().is_some() {
        return None;
    }
    say();
    let got = crate::cache::obtain(&cfg.cache_policy(), &crate::cache::World::real(), cpus, || {
        crate::calibrate::measure_journaled(&cfg.run_dir, cpus)
    });
    Some(got.source)
}

/// The idle threshold a calibration gives the yielding threads (configured, measured, or the
/// default when nothing was).
pub fn idle_threshold_ns(cfg: &AgentConfig, calibrated: &Calibrated) -> u64 {
    if let Some(t) = cfg.idle_threshold_us {
        return t * 1000;
    }
    match (&calibrated.results, calibrated.threshold_ns) {
        (Ok(r), _) => r.idle_threshold_ns,
        (Err(_), Some(t)) => t,
        (Err(_), None) => RetentionConfig::default().idle_threshold_ns,
    }
}

/// Inputs of [`decide`] the agent gathered.
#[derive(Debug, Clone)]
pub struct Offered<'a> {
    /// What the machine offers (`None`: unreadable).
    pub offer: Option<&'a IdleOffer>,
    /// Why this agent may not turn the kernel's idle knobs (`None`: it may).
    pub no_knobs: Option<String>,
}

/// What the machine offers, as the policy reads it.
fn policy_offer(o: &IdleOffer) -> Offer {
    Offer { kernel_polling: o.kernel_polling(), poll_window: o.poll_window(), poll_always: o.poll_always() }
}

/// The policy's inputs from what this agent found and was asked for. `workload`: there is a
/// workload whose progress the governors can read (the daemon without targets has none).
pub fn setup_input<'a>(
    cfg: &AgentConfig,
    cpus: &CpuSet,
    calibrated: &'a Calibrated,
    offered: &Offered<'_>,
    workload: bool,
) -> SetupInput<'a> {
    let prior = match cfg.retention_start {
        RetentionStart::Calibrated => Prior::Calibrated,
        RetentionStart::On => Prior::Fixed(RetentionMode::On),
        RetentionStart::Off => Prior::Fixed(RetentionMode::Off),
    };
    SetupInput {
        cpus: cpus.iter().collect(),
        retention: cfg.retention,
        fixed_yield_ns: cfg.timeout_us.map(|us| us * 1000),
        curve: calibrated.curve().ok_or_else(|| calibrated.results.as_ref().err().cloned().unwrap_or_default()),
        curve_is_prior: calibrated.is_prior(),
        offer: offered.offer.map(policy_offer),
        kernel_polling: match (&offered.no_knobs, cfg.kernel_polling) {
            (_, false) => Ok(false),
            (None, true) => Ok(true),
            (Some(why), true) => Err(why.clone()),
        },
        workload,
        governor: cfg.adapt.then_some(cfg.governor),
        prior,
        plan: cfg.plan_config(),
        start: cfg.start,
        consolidation: None,
        period_ns: cfg.period_ms * 1_000_000,
        priors: cfg.priors,
        yielders: YielderStart {
            idle_threshold_ns: idle_threshold_ns(cfg, calibrated),
            max_sleep_ns: cfg.max_sleep_ms * 1_000_000,
            step_aside_ns: cfg.step_aside_us * 1_000,
        },
    }
}

/// Decides the idle policy's configuration: `gleaner_policy::guest::setup::decide` on
/// [`setup_input`].
pub fn decide(cfg: &AgentConfig, cpus: &CpuSet, calibrated: &Calibrated, offered: &Offered<'_>, workload: bool) -> Setup {
    setup::decide(setup_input(cfg, cpus, calibrated, offered, workload))
}

#[cfg(test)]
mod tests {
    use gleaner_os::idle::ModuleState;
    use gleaner_policy::idle::CurvePoint;

    use super::*;

    fn curve(poll: Option<u64>, busy_us: u64) -> WakeCurve {
        let pt = |g: u64, m: u64| CurvePoint { gap_ns: g * 1000, mean_ns: m * 1000, p50_ns: m * 1000 };
        WakeCurve::new(vec![pt(10, 49), pt(1000, 58), pt(10_000, 116)], busy_us * 1000, poll)
    }

    fn calibrated(c: WakeCurve) -> Calibrated {
        let polling = PollingControl { halted: "test".into(), poll: "test".into() };
        Calibrated { results: Ok(CalibrationResults { curve: c, idle_threshold_ns: 12_000, polling }), source: None, threshold_ns: None }
    }

    fn haltpoll_offer() -> IdleOffer {
        IdleOffer {
            driver: Some("haltpoll".into()),
            governor: Some("haltpoll".into()),
            governors: vec!["menu".into(), "haltpoll".into()],
            governor_switchable: true,
            poll_state: Some(0),
            haltpoll_params: true,
            resume_latency: true,
            haltpoll_driver: ModuleState::Builtin,
        }
    }

    fn cpus() -> CpuSet {
        CpuSet::parse("0-1").unwrap()
    }

    #[test]
    fn a_haltpoll_guest_polls_in_the_kernel_with_yielding_threads_parked_beside() {
        let o = haltpoll_offer();
        let s = decide(
            &AgentConfig::default(),
            &cpus(),
            &calibrated(curve(Some(7_000), 40)),
            &Offered { offer: Some(&o), no_knobs: None },
            true,
        );
        // The yielders are the ladder's Wide level on a saturated VM: started parked.
        assert!(s.kernel && s.yielders.is_some_and(|y| y.timeout_ns == 0), "{s:?}");
        assert!(s.guest.means.poll_window && s.guest.means.poll_always && s.guest.means.yielders);
        assert_eq!(s.guest.prior, RetentionMode::On);
        assert!(s.guest.governor.is_some());
    }

    #[test]
    fn without_a_poll_state_yielding_threads_serve_and_start_parked() {
        let s = decide(&AgentConfig::default(), &cpus(), &calibrated(curve(None, 40)), &Offered { offer: None, no_knobs: None }, true);
        assert!(!s.kernel && s.guest.means.yielders);
        assert_eq!(s.yielders.map(|y| y.timeout_ns), Some(0));
        assert_eq!(s.yielders.map(|y| y.idle_threshold_ns), Some(12_000));
    }

    #[test]
    fn another_agent_on_the_knobs_means_yielders_and_a_note() {
        let o = haltpoll_offer();
        let off = Offered { offer: Some(&o), no_knobs: Some("another agent drives the idle knobs".into()) };
        let s = decide(&AgentConfig::default(), &cpus(), &calibrated(curve(Some(7_000), 40)), &off, true);
        assert!(!s.kernel && s.guest.means.yielders);
        assert!(s.note.unwrap().contains("another agent"));
        // --no-kernel-polling: the same, without a note.
        let cfg = AgentConfig { kernel_polling: false, ..AgentConfig::default() };
        let s = decide(&cfg, &cpus(), &calibrated(curve(Some(7_000), 40)), &Offered { offer: Some(&o), no_knobs: None }, true);
        assert!(!s.kernel && s.note.is_none());
    }

    #[test]
    fn yielders_that_barely_beat_a_halt_start_off() {
        let s = decide(&AgentConfig::default(), &cpus(), &calibrated(curve(None, 110)), &Offered { offer: None, no_knobs: None }, true);
        assert_eq!(s.guest.prior, RetentionMode::Off);
        assert!(s.note.unwrap().contains("starts off"));
    }

    #[test]
    fn a_fixed_timeout_yields_with_it_and_no_curve_means_no_retention() {
        let cfg = AgentConfig { timeout_us: Some(100), ..AgentConfig::default() };
        let none = Calibrated { results: Err("one CPU".into()), source: None, threshold_ns: None };
        let s = decide(&cfg, &cpus(), &none, &Offered { offer: None, no_knobs: None }, true);
        assert_eq!(s.guest.fixed_yield_ns, Some(100_000));
        assert_eq!(s.yielders.map(|y| y.timeout_ns), Some(100_000));
        let s = decide(&AgentConfig::default(), &cpus(), &none, &Offered { offer: None, no_knobs: None }, true);
        assert!(s.yielders.is_none() && !s.kernel);
        assert!(s.note.unwrap().contains("one CPU"));
    }

    fn from_the_prior() -> Calibrated {
        super::prior(crate::cache::Reason::Missing)
    }

    #[test]
    fn the_prior_starts_the_kernel_s_polling_plan_but_never_yielders_alone() {
        let o = haltpoll_offer();
        let cfg = AgentConfig::default();
        let s = decide(&cfg, &cpus(), &from_the_prior(), &Offered { offer: Some(&o), no_knobs: None }, true);
        assert!(s.kernel && s.guest.means.kernel_polling(), "{s:?}");
        assert_eq!(s.guest.curve, Some(WakeCurve::prior()));
        // No POLL state, or the knobs are another agent's: no retention until this VM is measured.
        for off in [Offered { offer: None, no_knobs: None }, Offered { offer: Some(&o), no_knobs: Some("another agent".into()) }] {
            let s = decide(&cfg, &cpus(), &from_the_prior(), &off, true);
            assert!(!s.kernel && s.yielders.is_none(), "{s:?}");
            assert!(s.note.as_deref().is_some_and(|n| n.contains("measured wake costs")), "{:?}", s.note);
        }
    }

    #[test]
    fn a_fixed_timeout_keeps_the_idle_threshold_sampled_for_it() {
        let cfg = AgentConfig { timeout_us: Some(100), ..AgentConfig::default() };
        let sampled = Calibrated { results: Err("--timeout-us given".into()), source: None, threshold_ns: Some(7_000) };
        let s = decide(&cfg, &cpus(), &sampled, &Offered { offer: None, no_knobs: None }, true);
        assert_eq!(s.yielders.map(|y| (y.idle_threshold_ns, y.timeout_ns)), Some((7_000, 100_000)));
        // --idle-threshold-us wins over anything sampled.
        let cfg = AgentConfig { idle_threshold_us: Some(30), ..cfg };
        let s = decide(&cfg, &cpus(), &sampled, &Offered { offer: None, no_knobs: None }, true);
        assert_eq!(s.yielders.map(|y| y.idle_threshold_ns), Some(30_000));
    }

    #[test]
    fn the_default_configuration_is_the_policy_s_defaults() {
        // The lab's predictor starts from SetupInput::defaults: the agent with no flags must
        // decide exactly what it does, on every machine and curve.
        let o = haltpoll_offer();
        let curves = [calibrated(curve(Some(7_000), 40)), calibrated(curve(None, 40)), calibrated(curve(None, 110))];
        for c in &curves {
            for offer in [None, Some(&o)] {
                let agent = decide(&AgentConfig::default(), &cpus(), c, &Offered { offer, no_knobs: None }, true);
                let input = SetupInput {
                    offer: offer.map(policy_offer),
                    yielders: YielderStart { idle_threshold_ns: 12_000, ..YielderStart::default() },
                    ..SetupInput::defaults(vec![0, 1], Ok(c.curve().unwrap()))
                };
                assert_eq!(agent, setup::decide(input), "offer {offer:?}");
            }
        }
    }
}
