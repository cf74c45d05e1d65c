//! Three levels of retention, chosen by experiment: the planner's model proposes, probes of
//! the neighbouring levels dispose.
//!
//! ```text
//!   Off       the machine's own idle settings (stock)
//!    |  low:  a governor comparing Planned ("on") with Off ("off")
//!   Planned   the planner's plan at the price (its priors: the saturation and bottleneck
//!    |        rules, the VM share)
//!    |  high: a governor comparing Wide ("on") with Planned ("off")
//!   Wide      the planner's plan with no price and no rules: every idle period whose halt
//!             would cost anything is covered, within the budget and the VM share
//! ```
//!
//! Each governor runs its own A-B-A sandwiches ([`RetentionGovernor`]) and switches its
//! baseline on its own evidence. Only adjacent levels are compared, and only from a baseline
//! at one of them: `low` runs while `high` sits at Planned, `high` while `low` sits at
//! Planned. At most one sandwich runs at a time; where both are due, the one that waited
//! goes first and the other keeps the epoch as the one before its probe. A pair whose two
//! plans run alike (the saturation rule made Planned a halt, or the plan already covers
//! everything Wide would) is not probed: its comparison would be of a plan with itself. So
//! no rule forbids a level: the rules shape Planned, and Wide, which ignores them, is always
//! one probe away, probed late and ever more rarely while the answer holds.
//!
//! On a VM the workload saturates, kernel polling has nothing to catch, and Wide is the
//! yielders instead ([`Ladder::set_wide_yields`]): a `SCHED_IDLE` thread on every vCPU, the
//! kernel's idle settings as found. Yielders change how such a workload is scheduled, not how
//! fast a wakeup is: they helped some message-passing programs and cost others (a POSIX
//! message queue and a pipe program ran 12-13% faster, a context-switch one 40% slower). The
//! upper governor then judges by the work alone (`work_progress_only`: under the yielders the
//! message queue program made half the context switches, so sync points would call its gain
//! a loss) and probes from the first periods (a saturated workload's probe is cheap: there is
//! no idle time for the yielders to burn, and its comparisons are not traced).

use crate::retention::{GovernorConfig, GovernorState, GovernorStep, Phase, PriorStrength, RetentionGovernor, RetentionMode, Verdict};

/// Which governor of the ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rung {
    /// Off against Planned.
    Low,
    /// Planned against Wide.
    High,
}

/// What one epoch of the ladder decided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LadderStep {
    /// The level of the next epoch.
    pub mode: RetentionMode,
    /// The governor that stepped, and what it decided (`None`: none did), its modes named as
    /// the ladder's levels (the upper governor's "off" is Planned, `On`; its "on" is `Wide`).
    pub governor: Option<(Rung, GovernorStep)>,
}

/// What probing cost the workload so far: the time run in probe epochs (a level the governors
/// do not believe in), and of it the time in probes that their comparison found worse than
/// the baseline (the governor's `Pays` for a probe of its lower mode, `Loses` for its upper).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProbeTime {
    pub probe_ns: u64,
    pub worse_ns: u64,
}

/// A probe epoch read and not judged yet: its governor, whether it ran that governor's upper
/// mode, and its length.
#[derive(Debug, Clone, Copy)]
struct PendingProbe {
    rung: Rung,
    upper: bool,
    ns: u64,
}

/// The two governors (module documentation).
#[derive(Debug, Clone)]
pub struct Ladder {
    low: Option<RetentionGovernor>,
    high: Option<RetentionGovernor>,
    /// The governor that last started a sandwich: the other goes first when both are due.
    last: Rung,
    /// The level without governors.
    prior: RetentionMode,
    /// The upper governor's configuration, its latency gains priced at the planner's price
    /// (kept to rebuild it when Wide changes its meaning).
    high_cfg: Option<GovernorConfig>,
    /// Wide is the yielders (a saturated VM), not the planner at no price.
    wide_yields: bool,
    /// Probing's cost so far ([`Self::probe_time`]).
    probes: ProbeTime,
    pending: Option<PendingProbe>,
}

impl Ladder {
    /// `low` from the prior (`RetentionMode::On`: Planned, `Off`: stock) and its strength;
    /// `high` at Planned, probing Wide at the governor's first interval, its latency gains
    /// priced at `price` (the planner's). `None`: no governors (the level stays at `prior`).
    pub fn new(cfg: Option<GovernorConfig>, prior: RetentionMode, strength: PriorStrength, wide: bool, price: f64) -> Self {
        let low_prior = if prior == RetentionMode::Off { RetentionMode::Off } else { RetentionMode::On };
        let high_prior = if prior == RetentionMode::Wide { RetentionMode::On } else { RetentionMode::Off };
        let high_cfg = cfg.filter(|_| wide).map(|g| GovernorConfig { latency_price: price, ..g });
        Self {
            low: cfg.map(|g| RetentionGovernor::with_prior(g, low_prior, strength)),
            high: high_cfg.map(|g| Self::high_governor(g, high_prior, false)),
            high_cfg,
            wide_yields: false,
            last: Rung::High,
            prior,
            probes: ProbeTime::default(),
            pending: None,
        }
    }

    /// The upper governor from `prior`. Wide as the planner at no price is probed late and
    /// rarely from the start (the first probe after `probe_every_max` periods): a probe and the
    /// two traced epochs around it cost a saturated workload a traced switch storm and its
    /// polling (xz -T2 ran 1.4% and `sysbench threads` 1.6% slower than stock with the first
    /// probe after 4 periods, scripts/bench/front-matrix.sh), and Planned is the planner's own
    /// answer until evidence says otherwise. Wide as the yielders (`yields`) is probed from the
    /// first periods, every other period until an answer holds: no prior says what they do to
    /// a saturated workload, its comparisons are untraced, and a program of a few seconds must
    /// see three of them to gain anything; it is judged by the work alone (module
    /// documentation).
    fn high_governor(cfg: GovernorConfig, prior: RetentionMode, yields: bool) -> RetentionGovernor {
        if yields {
            let cfg = GovernorConfig { probe_every_min: 1, work_progress_only: true, ..cfg };
            RetentionGovernor::with_prior(cfg, prior, PriorStrength::Plain)
        } else {
            RetentionGovernor::with_prior(cfg, prior, PriorStrength::Confident)
        }
    }

    /// Says what Wide is from now on: the yielders (`true`: the workload saturates the VM,
    /// so kernel polling has nothing to catch) or the planner at no price. A change of
    /// meaning starts the upper governor over at Planned: what it measured, and a baseline
    /// at Wide, were of the other Wide.
    pub fn set_wide_yields(&mut self, yields: bool) {
        if yields == self.wide_yields {
            return;
        }
        self.wide_yields = yields;
        if let Some(g) = self.high_cfg {
            let mut high = Self::high_governor(g, RetentionMode::Off, yields);
            // The epoch read next ran under the old Wide: a clean baseline epoch follows it.
            high.delay_first_probe(2);
            self.high = Some(high);
            self.pending = self.pending.filter(|p| p.rung != Rung::High);
        }
    }

    /// Wide is the yielders ([`Self::set_wide_yields`]).
    pub fn wide_yields(&self) -> bool {
        self.wide_yields
    }

    fn governor(&self, r: Rung) -> Option<&RetentionGovernor> {
        match r {
            Rung::Low => self.low.as_ref(),
            Rung::High => self.high.as_ref(),
        }
    }

    fn governor_mut(&mut self, r: Rung) -> Option<&mut RetentionGovernor> {
        match r {
            Rung::Low => self.low.as_mut(),
            Rung::High => self.high.as_mut(),
        }
    }

    /// The level applied now (the prior without governors).
    pub fn mode(&self) -> RetentionMode {
        let (Some(low), high) = (&self.low, &self.high) else { return self.prior };
        if !low.mode().is_on() {
            RetentionMode::Off
        } else if high.as_ref().is_some_and(|h| h.mode().is_on()) {
            RetentionMode::Wide
        } else {
            RetentionMode::On
        }
    }

    /// The level the governors believe in (their baselines).
    pub fn baseline(&self) -> RetentionMode {
        let (Some(low), high) = (&self.low, &self.high) else { return self.prior };
        if !low.state().baseline.is_on() {
            RetentionMode::Off
        } else if high.as_ref().is_some_and(|h| h.state().baseline.is_on()) {
            RetentionMode::Wide
        } else {
            RetentionMode::On
        }
    }

    /// A governor may compare now: it exists and the level sits at one of its two plans.
    fn active(&self, r: Rung) -> bool {
        match r {
            Rung::Low => self.low.is_some() && self.high.as_ref().is_none_or(|h| !h.state().baseline.is_on()),
            Rung::High => self.high.is_some() && self.low.as_ref().is_some_and(|l| l.state().baseline.is_on()),
        }
    }

    fn mid_sandwich(g: &RetentionGovernor) -> bool {
        matches!(g.state().phase, Phase::Probe | Phase::Confirm)
    }

    fn due(g: &RetentionGovernor) -> bool {
        matches!(g.state().phase, Phase::Baseline { left } if left <= 1)
    }

    /// The epoch running now is a probe of a level the governors do not believe in.
    pub fn probing(&self) -> bool {
        self.low.as_ref().is_some_and(RetentionGovernor::probing) || self.high.as_ref().is_some_and(RetentionGovernor::probing)
    }

    /// Some governor compares the coming epoch (the one before its probe, the probe, the one
    /// after it): the adapter traces it.
    pub fn comparing(&self) -> bool {
        [Rung::Low, Rung::High]
            .into_iter()
            .any(|r| self.active(r) && self.governor(r).is_some_and(|g| Self::due(g) || Self::mid_sandwich(g)))
    }

    /// The time run in probes so far, and in probes found worse than the baseline.
    pub fn probe_time(&self) -> ProbeTime {
        self.probes
    }

    /// Counts the epoch `r` if it was `gov`'s probe (before `gov` reads it), and judges the
    /// probe pending for `rung` by the comparison `gov` made (after).
    fn count_probe(&mut self, rung: Rung, probed: Option<bool>, r: &crate::retention::EpochReading, s: &GovernorStep) {
        if let Some(upper) = probed {
            self.probes.probe_ns = self.probes.probe_ns.saturating_add(r.duration_ns);
            self.pending = Some(PendingProbe { rung, upper, ns: r.duration_ns });
        }
        let Some(c) = s.comparison else { return };
        if let Some(p) = self.pending.take_if(|p| p.rung == rung) {
            let worse = if p.upper { c.verdict == Verdict::Loses } else { c.verdict == Verdict::Pays };
            if worse {
                self.probes.worse_ns = self.probes.worse_ns.saturating_add(p.ns);
            }
        }
    }

    pub fn low_state(&self) -> Option<GovernorState> {
        self.low.as_ref().map(RetentionGovernor::state)
    }

    pub fn high_state(&self) -> Option<GovernorState> {
        self.high.as_ref().map(RetentionGovernor::state)
    }

    /// One epoch (`r`, read under [`Self::mode`]). `distinct[rung]`: that rung's two plans run
    /// differently (module documentation).
    pub fn step(&mut self, r: &crate::retention::EpochReading, distinct_low: bool, distinct_high: bool) -> LadderStep {
        let distinct = |rung| if rung == Rung::Low { distinct_low } else { distinct_high };
        let rungs = [Rung::Low, Rung::High];
        // A sandwich under way finishes: its epochs were read under its levels.
        let running = rungs.into_iter().find(|&g| self.governor(g).is_some_and(Self::mid_sandwich));
        let turn = running.or_else(|| {
            let eligible: Vec<Rung> = rungs.into_iter().filter(|&g| self.active(g) && distinct(g)).collect();
            let due: Vec<Rung> = eligible.iter().copied().filter(|&g| self.governor(g).is_some_and(Self::due)).collect();
            match due.as_slice() {
                [] => None,
                [one] => Some(*one),
                _ => Some(if self.last == Rung::Low { Rung::High } else { Rung::Low }),
            }
        });
        let mut stepped = None;
        for g in rungs {
            let eligible = self.active(g) && distinct(g);
            let Some(gov) = self.governor_mut(g) else { continue };
            if Some(g) == turn {
                let before = gov.state().phase;
                // The epoch just read ran the governor's probe: its mode then is the probed one.
                let probed = gov.probing().then(|| gov.mode().is_on());
                let s = gov.step(r);
                let started = matches!(before, Phase::Baseline { .. }) && gov.probing();
                self.count_probe(g, probed, r, &s);
                if started {
                    self.last = g;
                }
                stepped = Some((g, if g == Rung::High { s.in_ladder_terms() } else { s }));
            } else if eligible && running.is_none() {
                // Its baseline epoch, while it waits its turn.
                gov.wait(r);
            } else {
                // Not its levels (or its plans alike): what it read before is stale.
                gov.forget_before();
            }
        }
        LadderStep { mode: self.mode(), governor: stepped }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retention::EpochReading;

    fn reading(progress: u64, cpu_ns: u64) -> EpochReading {
        EpochReading { duration_ns: 200_000_000, progress, retention_cpu_ns: cpu_ns, active_vcpus: 2, ..EpochReading::default() }
    }

    /// A closed loop that runs 20% faster under every level above the one below it: the
    /// ladder climbs Off -> Planned -> Wide by experiment and stays, probing less and less.
    #[test]
    fn a_workload_that_gains_at_every_level_climbs_to_wide() {
        let mut l = Ladder::new(Some(GovernorConfig::default()), RetentionMode::Off, PriorStrength::Plain, true, 0.005);
        let rate = |m: RetentionMode| match m {
            RetentionMode::Off => 10_000,
            RetentionMode::On => 12_000,
            RetentionMode::Wide => 14_400,
        };
        let cpu = |m: RetentionMode| match m {
            RetentionMode::Off => 0,
            RetentionMode::On => 40_000_000,
            RetentionMode::Wide => 100_000_000,
        };
        let mut modes = Vec::new();
        for _ in 0..200 {
            let m = l.mode();
            modes.push(m);
            l.step(&reading(rate(m), cpu(m)), true, true);
        }
        assert_eq!(l.baseline(), RetentionMode::Wide, "{modes:?}");
        let first_wide = modes.iter().position(|&m| m == RetentionMode::Wide).unwrap();
        assert!(modes[..first_wide].contains(&RetentionMode::On));
        let tail_off = modes[150..].iter().filter(|&&m| m != RetentionMode::Wide).count();
        assert!(tail_off <= 3, "settled at Wide, probing Planned rarely: {:?}", &modes[150..]);
        // Never a jump from Off straight to Wide.
        assert!(modes.windows(2).all(|w| !(w[0] == RetentionMode::Off && w[1] == RetentionMode::Wide)), "{modes:?}");
    }

    /// Wide burns CPU and gains nothing over Planned: probed, it loses, and the level stays
    /// at Planned; Off is still probed from there. A pair whose plans run alike is never probed.
    #[test]
    fn a_wide_level_that_only_costs_loses_and_alike_plans_are_not_probed() {
        let mut l = Ladder::new(Some(GovernorConfig::default()), RetentionMode::On, PriorStrength::Plain, true, 0.005);
        let mut modes = Vec::new();
        for _ in 0..120 {
            let m = l.mode();
            modes.push(m);
            let (rate, cpu) = match m {
                RetentionMode::Off => (8_000, 0),
                RetentionMode::On => (10_000, 40_000_000),
                RetentionMode::Wide => (10_000, 200_000_000),
            };
            l.step(&reading(rate, cpu), true, true);
        }
        assert_eq!(l.baseline(), RetentionMode::On);
        assert!(modes.contains(&RetentionMode::Wide) && modes.contains(&RetentionMode::Off), "both neighbours probed: {modes:?}");
        // Two sandwiches never overlap: a probe epoch is followed by the baseline.
        assert!(modes.windows(2).all(|w| w[0] == RetentionMode::On || w[1] == RetentionMode::On), "{modes:?}");
        let mut l = Ladder::new(Some(GovernorConfig::default()), RetentionMode::On, PriorStrength::Plain, true, 0.005);
        for _ in 0..60 {
            let s = l.step(&reading(10_000, 0), false, false);
            assert_eq!(s.mode, RetentionMode::On);
            assert!(s.governor.is_none());
        }
    }

    /// Probing's cost is counted by what the comparisons found: probes of levels that lose
    /// are time in a worse plan, probes that pay (the climb) or change nothing are not.
    #[test]
    fn probe_time_counts_the_probes_and_those_found_worse() {
        const EPOCH: u64 = 200_000_000;
        // Planned is the best level: every probe (of Off or of Wide) is found worse.
        let mut l = Ladder::new(Some(GovernorConfig::default()), RetentionMode::On, PriorStrength::Plain, true, 0.005);
        let mut probes = 0;
        for _ in 0..120 {
            let m = l.mode();
            probes += u64::from(l.probing());
            let (rate, cpu) = match m {
                RetentionMode::Off => (8_000, 0),
                RetentionMode::On => (10_000, 40_000_000),
                RetentionMode::Wide => (10_000, 200_000_000),
            };
            l.step(&reading(rate, cpu), true, true);
        }
        let t = l.probe_time();
        assert!(probes >= 4, "{probes} probes");
        assert_eq!(t.probe_ns, probes * EPOCH);
        // The last probe may not be judged yet.
        assert!(t.worse_ns + EPOCH >= t.probe_ns && t.worse_ns <= t.probe_ns, "{t:?}");

        // Climbing: the probes that found a better level cost nothing; once at Wide, the
        // probes of Planned below it are worse.
        let mut l = Ladder::new(Some(GovernorConfig::default()), RetentionMode::Off, PriorStrength::Plain, true, 0.005);
        for _ in 0..200 {
            let m = l.mode();
            let (rate, cpu) = match m {
                RetentionMode::Off => (10_000, 0),
                RetentionMode::On => (12_000, 40_000_000),
                RetentionMode::Wide => (14_400, 100_000_000),
            };
            l.step(&reading(rate, cpu), true, true);
        }
        let t = l.probe_time();
        assert_eq!(l.baseline(), RetentionMode::Wide);
        assert!(t.worse_ns > 0 && t.worse_ns < t.probe_ns, "{t:?}");

        // Every level alike (same progress, no CPU): probes are neutral, none worse.
        let mut l = Ladder::new(Some(GovernorConfig::default()), RetentionMode::On, PriorStrength::Plain, true, 0.005);
        for _ in 0..120 {
            l.step(&reading(10_000, 0), true, true);
        }
        let t = l.probe_time();
        assert!(t.probe_ns > 0);
        assert_eq!(t.worse_ns, 0, "{t:?}");
    }

    /// Without governors the level is the prior, whatever is read.
    #[test]
    fn no_governors_hold_the_prior() {
        let mut l = Ladder::new(None, RetentionMode::On, PriorStrength::Plain, true, 0.005);
        assert_eq!(l.step(&reading(1, 1), true, true).mode, RetentionMode::On);
        assert_eq!(Ladder::new(None, RetentionMode::Off, PriorStrength::Plain, true, 0.005).mode(), RetentionMode::Off);
        assert!(!l.probing() && !l.comparing());
    }
}
