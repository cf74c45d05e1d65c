//! Does retention pay *now*? The start-up verdict ([`super::retention_verdict`]) is only a
//! prior: a host can start or stop polling halted vCPUs, a co-runner can arrive, the workload
//! can change phase. The governor re-decides online from the workload's own progress.
//!
//! Time is cut into epochs (one control period each). The governor keeps a *baseline* mode and
//! now and then runs one *probe* epoch in the other mode, then one more baseline epoch, and
//! compares the probe with the two baseline epochs around it (an A-B-A sandwich, so a steady
//! trend in the workload cancels out):
//!
//! ```text
//!  epochs  ... A A A [A] (B) [A] A A A A A A [A] (B) [A] ...       A: baseline, B: probe
//!                    before probe after             interval doubles while the answer holds
//! ```
//!
//! Progress is the workload's voluntary context switches per second (its blocking sync points;
//! the controller's progress proxy too), or, where the workload moves bytes through read/write
//! calls in every epoch of the comparison (a server, a pipe, a file), those bytes per second:
//! the work itself. Sync points are no measure of a server's work under a policy that changes
//! how much it batches: kernel polling wakes nginx serving 50 connections at once for every
//! request, where a halted vCPU's slower wakeup lets several queue, and its context switches
//! per request rose from 0.45 to 0.74 while its requests a second fell (see
//! [`ProgressUnit`]). Retention's cost is what it holds of the host, in vCPUs: the CPU its
//! yielding threads burn (or the kernel polled), and the steal the VM meets more under it than
//! without it. On a shared host a pCPU a polling vCPU holds is taken from a co-runner or from
//! the VM's own runnable vCPUs, and the host gives it back as steal; where the host has pCPUs
//! to spare there is none, and the cost is the CPU alone. Steal moves between epochs of the
//! same mode too, so only what "on" meets beyond the spread of the two baseline epochs counts.
//! One comparison:
//!
//! ```text
//!  gain       = rate(on) / rate(off) - 1
//!  held       = burned vCPUs + (steal vCPUs on - off - the baseline epochs' spread, >= 0)
//!  break_even = cpu_price * held
//!  latency    = mean wakeup off / on - 1, where every epoch has min_wakeups traced wakeups
//!  verdict    = by latency where measured and progress did not fall beyond the tolerance
//!               (margin, or chance if larger; chance alone when progress is bytes):
//!               Pays if latency >= latency_gain, Loses if it is under margin and gain < break_even
//!               otherwise by progress:
//!               Pays   if gain >= break_even + margin
//!               Loses  if gain <  break_even
//!               Neutral otherwise (the dead band: neither mode is wrong enough to leave)
//!               Inconclusive if the number of active vCPUs changed within the sandwich
//!               (consolidation moved), or if an epoch has fewer than min_progress sync
//!               points and the yielders burned less than IDLE_BURN_VCPUS (with more, Loses:
//!               a workload that hardly synchronizes has nothing retention could speed up),
//!               or if progress is sync points and the governor judges by work only
//!               (`work_progress_only`: the ladder's comparison with the yielders)
//! ```
//!
//! A comparison that disagrees with the baseline (Pays while off, Loses while on) counts
//! towards a switch; `confirm` of them in a row switch the baseline. Anything else but an
//! inconclusive one resets that count. One exception, asymmetric on purpose: while on, a
//! comparison in which retention slowed the workload by more than `decisive_loss` (gain below
//! `-decisive_loss`) counts as `confirm - 1` of them and the next probe follows after one
//! baseline epoch, so one more losing comparison switches retention off 3 epochs later (9
//! epochs after the start instead of 18). A single outlier still does not switch. A wrong
//! "on" costs a vCPU of spinning and, in the TCG lab next to a co-runner, 20-40% of the run;
//! a wrong "off" costs the halt penalty until the next probe. Probing backs off exponentially while comparisons agree
//! (the interval between probes doubles from `probe_every_min` to `probe_every_max` epochs,
//! and on to `probe_every_settled` while retention is on and pays by `settle_gain` or more)
//! and snaps back to `probe_every_min` on a disagreeing one or after a switch, so a doubt is
//! confirmed or dropped quickly and a settled answer costs one wrong-mode epoch every
//! `probe_every_max + 2` epochs (`probe_every_settled + 2` where retention pays clearly).
//!
//! The governor also tells the adaptive timeouts when to stand still: from a comparison that
//! says `Pays` until one that does not, they are held at their cap
//! ([`super::IdleDetector::hold_at_cap`]). Shrinking a timeout saves spinning where retention
//! barely matters; where it clearly pays, the spinning is worth its CPU, and shrinking can set
//! off a cascade the detector cannot see (halted vCPUs wake slower and lose their pCPUs to
//! other VMs, so the threads waiting for them idle longer, which shrinks more timeouts). In
//! `gleaner sim fig7` streamcluster that cascade, started by a probe epoch, took the speedup
//! from 1.90x (fixed timeout) to 1.03x; with the hold it is 1.82x.

use serde::{Deserialize, Serialize};

/// Yielding threads burning less than this (in vCPUs) during a comparison with too few sync
/// points to judge cost nothing worth turning them off for.
pub const IDLE_BURN_VCPUS: f64 = 0.01;

/// Whether retention runs, and how much of it. A governor compares two modes, `On` and
/// `Off`; the guest loop's ladder of two governors adds `Wide` (`crate::guest::ladder`):
/// `On` is the planner's plan there, `Wide` the plan with no price.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetentionMode {
    On,
    Off,
    Wide,
}

impl RetentionMode {
    /// The other mode of a governor (`Wide` counts as on).
    pub fn flipped(self) -> Self {
        match self {
            Self::On | Self::Wide => Self::Off,
            Self::Off => Self::On,
        }
    }

    /// Retention runs (the plan, or the wide plan).
    pub fn is_on(self) -> bool {
        self != Self::Off
    }
}

/// How much the start-up verdict says about retention here (see [`RetentionGovernor::with_prior`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PriorStrength {
    /// An ordinary prior: probe soon to confirm it.
    Plain,
    /// Retention measured to gain little or to make wakeups slower (a busy vCPU wakes less than
    /// a quarter faster than a halted one, or slower): probe late and rarely from the start, so
    /// short runs never pay for a probe that cannot win.
    Unpromising,
    /// Retention measured to gain a lot (a polling vCPU wakes several times faster than a
    /// halted one) and planned from traced idle periods: a probe of "off" costs a period of
    /// halted wakeups, so it comes late and rarely from the start too.
    Confident,
}

impl PriorStrength {
    /// `Unpromising` when waking a vCPU kept busy by a yielding thread saves less than a quarter
    /// of (and at least the noise floor of) waking a halted one after a long idle period, or
    /// costs more, else `Plain`. The TCG lab alone: busy 54 us vs halted 65 us (17% saved);
    /// next to a co-runner: busy 0.4-5 ms vs halted 90 us; the development VM: 13 vs 32 us
    /// (59%, `Plain`).
    pub fn of(c: &super::WakeupCosts) -> Self {
        let gain = c.idle_long_ns.saturating_sub(c.busy_ns);
        if gain < super::MIN_HALT_PENALTY_NS.max(c.idle_long_ns / 4) {
            Self::Unpromising
        } else {
            Self::Plain
        }
    }
}

/// Tunables of the governor (defaults in [`GovernorConfig::default`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GovernorConfig {
    /// Baseline epochs between probes after a start, a switch or a disagreeing comparison.
    pub probe_every_min: u32,
    /// Longest interval between probes, in epochs (reached by doubling while the answer holds).
    pub probe_every_max: u32,
    /// Longest interval between probes of "off" once retention is measured to pay by a wide
    /// margin ([`settle_gain`](Self::settle_gain)): the doubling goes on up to this many
    /// epochs while such comparisons follow each other, and drops back to `probe_every_max`
    /// at the first one that is not that clear.
    pub probe_every_settled: u32,
    /// How clear "retention pays" must be for the probes to back off beyond `probe_every_max`:
    /// wakeups with retention off slower by at least this share, or progress with it on
    /// higher by at least this share.
    pub settle_gain: f64,
    /// Gain above break-even that retention must show to be turned on (the dead band's width).
    pub margin: f64,
    /// Break-even gain per vCPU the yielding threads burn: retention that takes one vCPU must
    /// speed the workload up by this fraction to pay for it.
    pub cpu_price: f64,
    /// Disagreeing comparisons in a row that switch the baseline mode.
    pub confirm: u32,
    /// While on: a comparison with `gain < -decisive_loss` counts as `confirm - 1` losing ones
    /// and brings the next comparison forward (1 disables).
    pub decisive_loss: f64,
    /// Epochs with fewer sync points than this are too few to compare (see the module docs).
    pub min_progress: u64,
    /// Epochs with fewer traced wakeups than this do not judge by latency.
    pub min_wakeups: u64,
    /// Retention pays when it shortens the mean wakeup by this share (and the workload's
    /// progress did not fall by more than `margin`).
    pub latency_gain: f64,
    /// Where not 0, a latency gain pays only if the wakeup time it saves a second (mean
    /// shortening x sync points a second) is worth the CPU "on" takes more at this price (ns
    /// of latency per ns of CPU), else it loses: the ladder's upper governor, whose two modes
    /// both retain, uses the planner's price. 0: the gain alone decides.
    pub latency_price: f64,
    /// Epochs in which the workload moved fewer bytes than this through read/write calls (per
    /// full epoch) are judged by sync points; with at least this many in every epoch of a
    /// comparison, progress is the bytes ([`ProgressUnit::IoBytes`]).
    pub min_io_bytes: u64,
    /// Judge only by the work (the user's counter, or bytes moved): a comparison that would
    /// count sync points is inconclusive. Set by the guest loop's ladder for a comparison with
    /// the yielders, which change how often the workload blocks per unit of work (a POSIX
    /// message queue program made half the context switches under them and ran 12% faster),
    /// so its sync points are no measure of what they do. Not a configuration key.
    #[serde(skip)]
    pub work_progress_only: bool,
}

impl Default for GovernorConfig {
    fn default() -> Self {
        Self {
            probe_every_min: 4,
            probe_every_max: 32,
            // 51 s at the agent's 200 ms period: a quarter-period probe of "off" is then 0.1%
            // of the time (at 32, 0.7%: the p99 of a one-connection server).
            probe_every_settled: 256,
            settle_gain: 1.0,
            margin: 0.05,
            cpu_price: 0.05,
            confirm: 3,
            decisive_loss: 0.25,
            min_progress: 50,
            min_wakeups: 50,
            latency_gain: 0.10,
            latency_price: 0.0,
            // 320 KB/s at 200 ms epochs: a server answering a few hundred requests a second;
            // less is a log or a trickle that says nothing of the work.
            min_io_bytes: 64 * 1024,
            work_progress_only: false,
        }
    }
}

impl GovernorConfig {
    /// Checks the ranges; the error names the field and what is allowed.
    pub fn validate(&self) -> Result<(), String> {
        if self.probe_every_min == 0 || self.probe_every_max < self.probe_every_min {
            return Err(format!(
                "probe_every_min = {}, probe_every_max = {}: need 1 <= min <= max",
                self.probe_every_min, self.probe_every_max
            ));
        }
        if self.probe_every_settled < self.probe_every_max {
            return Err(format!(
                "probe_every_settled = {}: need at least probe_every_max = {}",
                self.probe_every_settled, self.probe_every_max
            ));
        }
        if !(0.0..=100.0).contains(&self.settle_gain) {
            return Err(format!("settle_gain = {}: need 0..=100", self.settle_gain));
        }
        if !(0.0..=1.0).contains(&self.margin) {
            return Err(format!("margin = {}: need 0..=1", self.margin));
        }
        if !(0.0..=1.0).contains(&self.cpu_price) {
            return Err(format!("cpu_price = {}: need 0..=1", self.cpu_price));
        }
        if !(0.0..=1.0).contains(&self.decisive_loss) {
            return Err(format!("decisive_loss = {}: need 0..=1 (1 disables)", self.decisive_loss));
        }
        if self.confirm == 0 {
            return Err("confirm = 0: need at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.latency_price) {
            return Err(format!("latency_price = {}: need 0..=1 (latency ns per CPU ns; 0: off)", self.latency_price));
        }
        if !(0.0..=10.0).contains(&self.latency_gain) {
            return Err(format!("latency_gain = {}: need 0..=10", self.latency_gain));
        }
        Ok(())
    }
}

/// What the agent (or the simulator) measured over one epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct EpochReading {
    /// Length of the epoch.
    pub duration_ns: u64,
    /// The workload's voluntary context switches (blocking sync points) in the epoch.
    pub progress: u64,
    /// CPU time retention took in the epoch: yielding threads and kernel polling (the POLL
    /// state's time, which `/proc/stat` counts as idle).
    #[serde(alias = "yielder_cpu_ns")]
    pub retention_cpu_ns: u64,
    /// Time the host ran something else while the VM's vCPUs wanted to run (`/proc/stat`
    /// steal, summed over the managed vCPUs), ns.
    #[serde(default)]
    pub steal_ns: u64,
    /// vCPUs the workload could run on during the epoch.
    pub active_vcpus: u32,
    /// The workload's wakeups seen by the tracer in the epoch (0: no tracer).
    #[serde(default)]
    pub wakeups: u64,
    /// Their mean latency, `sched_waking` to running, ns.
    #[serde(default)]
    pub wake_mean_ns: f64,
    /// What the workload's threads moved through read/write calls in the epoch (zero where
    /// not measured: the simulator).
    #[serde(default)]
    pub io: WorkloadIo,
    /// How far the workload's own progress counter moved in the epoch (`gleaner run
    /// --progress`: requests served, items done), where the user gave one: then it is the
    /// progress every comparison judges by ([`ProgressUnit::Counter`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counter: Option<u64>,
}

/// Bytes a workload's threads moved through read/write-like calls, and the calls
/// (`/proc/<pid>/task/<tid>/io`: `rchar + wchar`, `syscr + syscw`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadIo {
    pub bytes: u64,
    pub calls: u64,
}

/// What a comparison measured progress in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgressUnit {
    /// The workload's blocking sync points (voluntary context switches).
    #[default]
    SyncPoints,
    /// Bytes the workload moved through read/write calls: chosen where every epoch of the
    /// comparison moved at least [`GovernorConfig::min_io_bytes`] (per full epoch). A loss of
    /// bytes beyond chance always decides (no margin): the bytes are the work (kernel polling cost
    /// nginx with 50 connections 1-4% of them on the development VM, a loss the 5% margin
    /// would have excused).
    IoBytes,
    /// The workload's own progress counter, as the user gave it: chosen wherever every epoch
    /// of the comparison read it. It is the work, so as with bytes only chance excuses a fall.
    Counter,
}

/// The outcome of one on/off comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pays,
    Loses,
    Neutral,
    Inconclusive,
}

/// One on/off comparison and the numbers behind it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Progress per second (in `unit`) with retention on / off.
    pub on_rate: f64,
    pub off_rate: f64,
    /// `on_rate / off_rate - 1`.
    pub gain: f64,
    /// vCPUs retention (yielding threads, kernel polling) took more in the on epochs.
    pub burn_vcpus: f64,
    /// vCPUs of steal the VM met more in the on epochs, beyond the spread of the baseline
    /// epochs (0 where the host has pCPUs to spare).
    #[serde(default)]
    pub steal_vcpus: f64,
    /// `cpu_price * (burn_vcpus + steal_vcpus)`.
    pub break_even: f64,
    /// Mean wakeup latency with retention on / off, ns (`None`: too few traced wakeups).
    #[serde(default)]
    pub on_wake_ns: Option<f64>,
    #[serde(default)]
    pub off_wake_ns: Option<f64>,
    /// How far the gain may be from the true one by chance alone ([`progress_noise`]): a
    /// fall of progress within it does not keep latency from deciding.
    #[serde(default)]
    pub progress_noise: f64,
    /// What progress was counted in.
    #[serde(default)]
    pub unit: ProgressUnit,
    pub verdict: Verdict,
}

/// Twice the relative standard deviation of the ratio of two counts of sync points, `a` and
/// `b`, were they Poisson: `2 sqrt(1/a + 1/b)`. A server at a fixed request rate counts its
/// arrivals; at 600 a second a 50 ms probe holds about 30, so a probe's "progress" is off by
/// 20-40% by chance (seen: gains of -13% to +67% for an open loop whose rate no mode can
/// move), while a CPU-bound workload's thousands of sync points an epoch give a few percent.
pub fn progress_noise(a: u64, b: u64) -> f64 {
    2.0 * (1.0 / a.max(1) as f64 + 1.0 / b.max(1) as f64).sqrt()
}

/// Where the governor is in its probe cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// In the baseline mode; the probe starts after `left` more epochs.
    Baseline { left: u32 },
    /// The probe epoch (the other mode) runs.
    Probe,
    /// The baseline epoch after the probe runs; the comparison follows it.
    Confirm,
}

/// Why the applied mode changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeCause {
    /// A probe epoch in the other mode begins.
    Probe,
    /// The probe is over: back to the baseline.
    ProbeEnd,
    /// `confirm` comparisons in a row disagreed with the baseline: it switched.
    Switch,
}

/// A change of the applied mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModeChange {
    pub from: RetentionMode,
    pub to: RetentionMode,
    pub cause: ChangeCause,
}

/// What one [`RetentionGovernor::step`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GovernorStep {
    /// The mode to apply in the next epoch.
    pub mode: RetentionMode,
    /// Set when `mode` differs from the mode of the epoch just read.
    pub change: Option<ModeChange>,
    /// The comparison made at the end of this epoch, if one was.
    pub comparison: Option<Comparison>,
    /// Hold the adaptive timeouts at their cap in the next epoch
    /// ([`GovernorState::hold_timeouts`]).
    pub hold_timeouts: bool,
}

impl GovernorStep {
    /// The step of the ladder's upper governor with its modes as the ladder's levels: its
    /// "off" is the plan (`On`), its "on" the wide plan (`Wide`).
    #[must_use]
    pub fn in_ladder_terms(self) -> Self {
        let level = |m: RetentionMode| if m.is_on() { RetentionMode::Wide } else { RetentionMode::On };
        Self { mode: level(self.mode), change: self.change.map(|c| ModeChange { from: level(c.from), to: level(c.to), ..c }), ..self }
    }
}

/// The governor's state, for status reports.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GovernorState {
    /// The mode the governor believes in.
    pub baseline: RetentionMode,
    /// The mode applied now (the baseline, or the other one during a probe).
    pub applied: RetentionMode,
    pub phase: Phase,
    /// Disagreeing comparisons in a row.
    pub streak: u32,
    /// Baseline epochs between probes now.
    pub probe_every: u32,
    pub probes: u64,
    pub comparisons: u64,
    pub switches: u64,
    pub last: Option<Comparison>,
    /// The last conclusive comparison said retention pays: hold the adaptive timeouts at
    /// their cap until one says it does not ([`super::IdleDetector::hold_at_cap`]).
    #[serde(default)]
    pub hold_timeouts: bool,
}

/// The pure state machine that turns retention on and off (module documentation).
#[derive(Debug, Clone)]
pub struct RetentionGovernor {
    cfg: GovernorConfig,
    state: GovernorState,
    before: Option<EpochReading>,
    probe: Option<EpochReading>,
}

impl RetentionGovernor {
    /// A governor whose baseline starts at `prior` (the start-up verdict) and which probes the
    /// other mode after `probe_every_min` epochs.
    pub fn new(cfg: GovernorConfig, prior: RetentionMode) -> Self {
        Self::with_prior(cfg, prior, PriorStrength::Plain)
    }

    /// A governor whose prior is `strength`: a [`PriorStrength::Unpromising`] prior (measured: a
    /// vCPU kept busy wakes *slower* than a halted one, so retention would lengthen wakeups)
    /// starts probing at the longest interval, `probe_every_max`, instead of the shortest: the
    /// first probe comes late and a run short enough to end before it never pays a probe. A
    /// disagreeing comparison still snaps the interval back to `probe_every_min`.
    pub fn with_prior(cfg: GovernorConfig, prior: RetentionMode, strength: PriorStrength) -> Self {
        let every = match strength {
            PriorStrength::Plain => cfg.probe_every_min.max(1),
            PriorStrength::Unpromising | PriorStrength::Confident => cfg.probe_every_max.max(cfg.probe_every_min).max(1),
        };
        Self {
            state: GovernorState {
                baseline: prior,
                applied: prior,
                phase: Phase::Baseline { left: every },
                streak: 0,
                probe_every: every,
                probes: 0,
                comparisons: 0,
                switches: 0,
                last: None,
                hold_timeouts: false,
            },
            cfg,
            before: None,
            probe: None,
        }
    }

    pub fn config(&self) -> &GovernorConfig {
        &self.cfg
    }

    pub fn state(&self) -> GovernorState {
        self.state
    }

    /// The mode to apply now.
    pub fn mode(&self) -> RetentionMode {
        self.state.applied
    }

    /// Whether the epoch running now is a probe (retention in the non-baseline mode). Callers
    /// keep such an epoch from other decisions (the consolidation controller): its readings
    /// are the probe's, not the workload's.
    pub fn probing(&self) -> bool {
        self.state.phase == Phase::Probe
    }

    /// Whether the adaptive timeouts should be held at their cap now (retention measured to
    /// pay clearly).
    pub fn hold_timeouts(&self) -> bool {
        self.state.hold_timeouts
    }

    /// An epoch in the baseline mode that another comparison needs (the guest loop's ladder):
    /// kept as the epoch before this governor's probe, which waits for it (at least one more
    /// epoch).
    pub fn wait(&mut self, r: &EpochReading) {
        if let Phase::Baseline { left } = self.state.phase {
            self.before = Some(*r);
            self.state.phase = Phase::Baseline { left: left.saturating_sub(1).max(1) };
        }
    }

    /// Lets the first probe wait for at least `epochs` baseline epochs (the guest loop's ladder
    /// builds a governor anew when its upper level changes meaning: the epoch it reads first ran
    /// under the old one, so the baseline before its first probe is the one after).
    pub fn delay_first_probe(&mut self, epochs: u32) {
        if let Phase::Baseline { left } = self.state.phase {
            self.state.phase = Phase::Baseline { left: left.max(epochs) };
        }
    }

    /// An epoch this governor did not see (run in neither of its modes): the one it read
    /// before is no baseline for a probe now (its next step reads a fresh one).
    pub fn forget_before(&mut self) {
        if matches!(self.state.phase, Phase::Baseline { .. }) {
            self.before = None;
        }
    }

    /// Takes the reading of the epoch that just ended (run in [`Self::mode`]) and says which
    /// mode the next epoch runs in.
    pub fn step(&mut self, r: &EpochReading) -> GovernorStep {
        let from = self.state.applied;
        let mut comparison = None;
        let mut cause = ChangeCause::Probe;
        match self.state.phase {
            Phase::Baseline { left } => {
                self.before = Some(*r);
                if left <= 1 {
                    self.state.phase = Phase::Probe;
                    self.state.applied = self.state.baseline.flipped();
                    self.state.probes += 1;
                } else {
                    self.state.phase = Phase::Baseline { left: left - 1 };
                }
            }
            Phase::Probe => {
                self.probe = Some(*r);
                self.state.phase = Phase::Confirm;
                self.state.applied = self.state.baseline;
                cause = ChangeCause::ProbeEnd;
            }
            Phase::Confirm => {
                let c = match (self.before, self.probe) {
                    (Some(b), Some(p)) => Some(self.compare(&b, &p, r)),
                    _ => None,
                };
                let switched = c.is_some_and(|c| self.judge(&c));
                if switched {
                    cause = ChangeCause::Switch;
                }
                self.state.last = c.or(self.state.last);
                comparison = c;
                self.probe = None;
                // After a switch the next comparison needs a baseline epoch in the new mode.
                self.before = if switched { None } else { Some(*r) };
                self.state.applied = self.state.baseline;
                self.state.phase = Phase::Baseline { left: self.state.probe_every };
            }
        }
        let to = self.state.applied;
        GovernorStep {
            mode: to,
            change: (to != from).then_some(ModeChange { from, to, cause }),
            comparison,
            hold_timeouts: self.state.hold_timeouts,
        }
    }

    /// Compares a probe epoch with the baseline epochs around it: by the wakeup latency the
    /// tracer measured where every epoch has enough wakeups (a server at a fixed rate shows
    /// retention only there), and by progress, which a loss always shows.
    fn compare(&mut self, before: &EpochReading, probe: &EpochReading, after: &EpochReading) -> Comparison {
        self.state.comparisons += 1;
        let s = Sandwich::new(before, probe, after);
        let unit = s.unit(self.cfg.min_io_bytes.max(1));
        let sides = self.sides(&s, unit);
        let break_even = self.cfg.cpu_price * sides.held_vcpus();
        let gain = if sides.off_rate > 0.0 { sides.on_rate / sides.off_rate - 1.0 } else { 0.0 };
        let too_small = s.all().iter().any(|e| e.duration_ns == 0 || !s.enough(e.progress, e, self.cfg.min_progress));
        let traced = s.all().iter().all(|e| s.enough(e.wakeups, e, self.cfg.min_wakeups));
        let moved = before.active_vcpus != probe.active_vcpus || probe.active_vcpus != after.active_vcpus;
        let latency = match (traced, sides.on_wake, sides.off_wake) {
            (true, Some(on), Some(off)) if on > 0.0 => Some(off / on - 1.0),
            _ => None,
        };
        let progress_noise = progress_noise(events_of(before, unit) + events_of(after, unit), events_of(probe, unit));
        // How far progress may fall while latency still decides: sync points are a proxy,
        // so a fall within the margin is not held against a faster wakeup; bytes are the
        // work, and only chance excuses a fall of them.
        let tolerance = match unit {
            ProgressUnit::SyncPoints => self.cfg.margin.max(progress_noise),
            ProgressUnit::IoBytes | ProgressUnit::Counter => progress_noise,
        };
        let verdict = if moved || (self.cfg.work_progress_only && unit == ProgressUnit::SyncPoints) {
            Verdict::Inconclusive
        } else if let Some(lg) = latency.filter(|_| gain > -tolerance) {
            self.latency_verdict(&s, &sides, lg, gain, break_even)
        } else {
            self.progress_verdict(too_small, sides.burn_vcpus, gain, break_even)
        };
        Comparison {
            on_rate: sides.on_rate,
            off_rate: sides.off_rate,
            gain,
            burn_vcpus: sides.burn_vcpus,
            steal_vcpus: sides.steal_vcpus,
            break_even,
            on_wake_ns: sides.on_wake.filter(|_| traced),
            off_wake_ns: sides.off_wake.filter(|_| traced),
            progress_noise,
            unit,
            verdict,
        }
    }

    /// The progress rates, mean wakeup latencies, and the retention CPU and steal "on" takes
    /// more, of the baseline epochs and the probe, put as the "on" and the "off" mode.
    fn sides(&self, s: &Sandwich, unit: ProgressUnit) -> Sides {
        let (before, probe, after) = (s.before, s.probe, s.after);
        let base_ns = s.base_ns();
        let base_rate = per_s(progress_of(before, unit) + progress_of(after, unit), base_ns);
        let probe_rate = per_s(progress_of(probe, unit), probe.duration_ns);
        let base_wakes = before.wakeups + after.wakeups;
        let base_wake = (base_wakes > 0)
            .then(|| (before.wake_mean_ns * before.wakeups as f64 + after.wake_mean_ns * after.wakeups as f64) / base_wakes as f64);
        let probe_wake = (probe.wakeups > 0).then_some(probe.wake_mean_ns);
        // What retention took in each mode, vCPUs: the price is of what "on" takes more (the
        // ladder's upper governor compares two retaining plans; "off" of the lower is stock).
        let base_burn = (before.retention_cpu_ns + after.retention_cpu_ns) as f64 / base_ns.max(1) as f64;
        let probe_burn = probe.retention_cpu_ns as f64 / probe.duration_ns.max(1) as f64;
        // The steal each mode met, vCPUs, and how far it moved between the two baseline
        // epochs, which share a mode: only what "on" meets beyond that spread is its own.
        let vcpus = |ns: u64, e: &EpochReading| ns as f64 / e.duration_ns.max(1) as f64;
        let base_steal = (before.steal_ns + after.steal_ns) as f64 / base_ns.max(1) as f64;
        let probe_steal = vcpus(probe.steal_ns, probe);
        let steal_spread = (vcpus(before.steal_ns, before) - vcpus(after.steal_ns, after)).abs();
        let on_more = |on: f64, off: f64| (on - off).max(0.0);
        let (on_rate, off_rate, burn_vcpus, steal_more, on_wake, off_wake) = if self.state.baseline.is_on() {
            (base_rate, probe_rate, on_more(base_burn, probe_burn), base_steal - probe_steal, base_wake, probe_wake)
        } else {
            (probe_rate, base_rate, on_more(probe_burn, base_burn), probe_steal - base_steal, probe_wake, base_wake)
        };
        let steal_vcpus = on_more(steal_more, steal_spread);
        Sides { on_rate, off_rate, burn_vcpus, steal_vcpus, on_wake, off_wake }
    }

    /// The verdict where wakeups were measured and progress held: latency decides. Faster by
    /// latency_gain pays; not faster at all (within the margin) loses if the CPU had a price.
    fn latency_verdict(&self, s: &Sandwich, sides: &Sides, lg: f64, gain: f64, break_even: f64) -> Verdict {
        if lg >= self.cfg.latency_gain {
            // Where both modes retain (the ladder's upper governor), the wakeups "on"
            // saves must be worth the CPU it takes more at the planner's price: Planned
            // is priced already, and Wide gains by having no price.
            let sync_rate = if self.state.baseline.is_on() {
                per_s(s.before.progress + s.after.progress, s.base_ns())
            } else {
                per_s(s.probe.progress, s.probe.duration_ns)
            };
            let saved_ns_per_s = match (sides.on_wake, sides.off_wake) {
                (Some(on), Some(off)) => (off - on).max(0.0) * sync_rate,
                _ => 0.0,
            };
            if self.cfg.latency_price > 0.0 && saved_ns_per_s < self.cfg.latency_price * sides.held_vcpus() * 1e9 {
                Verdict::Loses
            } else {
                Verdict::Pays
            }
        } else if lg < self.cfg.margin.min(self.cfg.latency_gain) && gain < break_even {
            Verdict::Loses
        } else {
            Verdict::Neutral
        }
    }

    /// The verdict by progress alone (latency not measured, or progress fell).
    fn progress_verdict(&self, too_small: bool, burn_vcpus: f64, gain: f64, break_even: f64) -> Verdict {
        if too_small {
            // Too few sync points to compare: nothing for retention to speed up, so it loses
            // if it costs anything (an idle workload's backed-off yielders cost ~0.02 vCPU).
            // The CPU it burned alone: the steal of a short, light comparison is noise.
            if burn_vcpus > IDLE_BURN_VCPUS {
                Verdict::Loses
            } else {
                Verdict::Inconclusive
            }
        } else if gain >= break_even + self.cfg.margin {
            Verdict::Pays
        } else if gain < break_even {
            Verdict::Loses
        } else {
            Verdict::Neutral
        }
    }

    /// Whether `c` says retention pays by so wide a margin ([`GovernorConfig::settle_gain`])
    /// that its probes may back off beyond `probe_every_max`. Only a baseline of "on" settles:
    /// its probes halt the workload's wakeups, and under a server at a fixed rate a probe
    /// every 32 epochs held 0.7% of its requests at halted latency, its p99 (nginx with one
    /// connection on the development VM: `gleaner run` with probes 69.5 us, without 61.5,
    /// the kernel's guest haltpoll 53.5, medians of 6 alternated 20 s runs). A probe of "on"
    /// costs only the CPU it polls.
    fn settles(&self, c: &Comparison) -> bool {
        let by_latency = match (c.on_wake_ns, c.off_wake_ns) {
            (Some(on), Some(off)) if on > 0.0 => off / on - 1.0 >= self.cfg.settle_gain,
            _ => false,
        };
        self.state.baseline == RetentionMode::On && c.verdict == Verdict::Pays && (by_latency || c.gain >= self.cfg.settle_gain)
    }

    /// Applies a verdict to the streak, the probe interval and the baseline; true if the
    /// baseline switched.
    fn judge(&mut self, c: &Comparison) -> bool {
        let verdict = c.verdict;
        let decisive = verdict == Verdict::Loses && c.gain < -self.cfg.decisive_loss;
        let cap = if self.settles(c) { self.cfg.probe_every_settled } else { self.cfg.probe_every_max };
        let s = &mut self.state;
        if verdict != Verdict::Inconclusive {
            s.hold_timeouts = verdict == Verdict::Pays;
        }
        let disagrees = match verdict {
            Verdict::Inconclusive => return false,
            Verdict::Pays => s.baseline == RetentionMode::Off,
            Verdict::Loses => s.baseline == RetentionMode::On,
            Verdict::Neutral => false,
        };
        if !disagrees {
            s.streak = 0;
            s.probe_every = s.probe_every.saturating_mul(2).min(cap.max(1));
            return false;
        }
        // A decisive loss while on counts as all but one of the confirmations and asks for
        // the next comparison right away: one more losing comparison (3 epochs later) switches.
        let confirm = self.cfg.confirm.max(1);
        if decisive && s.baseline == RetentionMode::On {
            s.streak = (s.streak + confirm.saturating_sub(1)).max(s.streak + 1);
            s.probe_every = 1;
        } else {
            s.streak += 1;
            s.probe_every = self.cfg.probe_every_min.max(1);
        }
        if s.streak < confirm {
            return false;
        }
        s.streak = 0;
        s.baseline = s.baseline.flipped();
        s.switches += 1;
        true
    }
}

/// A probe epoch and the baseline epochs around it.
struct Sandwich<'a> {
    before: &'a EpochReading,
    probe: &'a EpochReading,
    after: &'a EpochReading,
    /// The longest of the three epochs, ns (at least 1).
    longest: u64,
}

impl<'a> Sandwich<'a> {
    /// The sandwich of `probe` between `before` and `after`.
    fn new(before: &'a EpochReading, probe: &'a EpochReading, after: &'a EpochReading) -> Self {
        let longest = [before, probe, after].iter().map(|e| e.duration_ns).max().unwrap_or(0).max(1);
        Self { before, probe, after, longest }
    }

    /// The three epochs in time order.
    fn all(&self) -> [&'a EpochReading; 3] {
        [self.before, self.probe, self.after]
    }

    /// The baseline epochs' length together, ns.
    fn base_ns(&self) -> u64 {
        self.before.duration_ns + self.after.duration_ns
    }

    /// Whether `n` of epoch `e` reaches `min`. The minimum counts are per full epoch: a
    /// shorter one (the agent's probe runs a quarter period) needs as much less. Judged by raw
    /// counts, a server at 600 sync points a second (about 30 in a 50 ms probe, under
    /// min_progress and min_wakeups) was "too small to compare" at every probe, so the
    /// polling "lost" and went off, halting its wakeups for seconds (`gleaner bench workload
    /// openloop --rate 200`).
    fn enough(&self, n: u64, e: &EpochReading, min: u64) -> bool {
        n as f64 >= min as f64 * e.duration_ns as f64 / self.longest as f64
    }

    /// What progress is measured in: the workload's counter where every epoch has one, else
    /// bytes moved where every epoch moved at least `min_io_bytes`, else sync points.
    fn unit(&self, min_io_bytes: u64) -> ProgressUnit {
        if self.all().iter().all(|e| e.counter.is_some()) {
            ProgressUnit::Counter
        } else if self.all().iter().all(|e| self.enough(e.io.bytes, e, min_io_bytes)) {
            ProgressUnit::IoBytes
        } else {
            ProgressUnit::SyncPoints
        }
    }
}

/// The two modes of a comparison: progress rates, mean wakeup latencies (where any were
/// traced), and the retention CPU and the steal "on" takes more than "off", vCPUs.
struct Sides {
    on_rate: f64,
    off_rate: f64,
    burn_vcpus: f64,
    steal_vcpus: f64,
    on_wake: Option<f64>,
    off_wake: Option<f64>,
}

impl Sides {
    /// What "on" holds of the host more than "off": its CPU and the steal it meets, vCPUs.
    fn held_vcpus(&self) -> f64 {
        self.burn_vcpus + self.steal_vcpus
    }
}

/// `progress` per second over `ns` (0 over no time).
fn per_s(progress: u64, ns: u64) -> f64 {
    if ns == 0 {
        0.0
    } else {
        progress as f64 * 1e9 / ns as f64
    }
}

/// An epoch's progress in `unit`.
fn progress_of(e: &EpochReading, unit: ProgressUnit) -> u64 {
    match unit {
        ProgressUnit::SyncPoints => e.progress,
        ProgressUnit::IoBytes => e.io.bytes,
        ProgressUnit::Counter => e.counter.unwrap_or(0),
    }
}

/// The count of events chance is judged from: the sync points, or for bytes the fewer of
/// the calls and the sync points (a request is a few calls and a block or two).
fn events_of(e: &EpochReading, unit: ProgressUnit) -> u64 {
    match unit {
        ProgressUnit::SyncPoints => e.progress,
        ProgressUnit::IoBytes if e.progress > 0 => e.io.calls.min(e.progress),
        ProgressUnit::IoBytes => e.io.calls,
        // A counter's steps, as many as the sync points at the most (a byte counter would
        // claim a precision its epochs do not have).
        ProgressUnit::Counter => e.counter.unwrap_or(0).min(e.progress.max(1)),
    }
}

#[cfg(test)]
mod tests;
