//! The guest loop, once: what the Gleaner agent decides every control period, as a pure state
//! machine over what it measured. The real agent (`gleaner-agent`), the simulator
//! (`gleaner-sim`) and the lab's predictor are adapters: they read counters into a
//! [`GuestReading`] and apply the [`GuestStep`].
//!
//! ```text
//!  GuestReading ----+--> idle periods per vCPU  (the tracer's, reweighted for its slice, or
//!   snapshot        |    estimated from cpuidle usage/time and the workload's blocks)
//!                   |    -> smoothed (half-life 1 period)
//!   per-vCPU idle   |
//!   trace (delta)   +--> consolidation: Controller::step(snapshot)  (not in a probe period)
//!                   |
//!                   +--> budget per vCPU: tightened where polling/yielding took more than it
//!                   |
//!                   +--> idle::plan::plan(gaps, curve, budget) -> the plan to use when on
//!                   |
//!                   +--> RetentionGovernor::step(epoch: progress, retention CPU, wakeups)
//!                          -> on: the plan; off (or a probe of off): every vCPU halts
//!  GuestStep: active vCPUs + decisions, the plan to apply, the governor's step
//! ```
//!
//! The first period has seen nothing yet. Where the haltpoll governor's window is offered
//! (and polling measured cheaper than a halt), it starts with the kernel's own upstream cap
//! ([`INITIAL_POLL_WINDOW_NS`]: the guest haltpoll policy a tenant could pick, which adapts
//! each CPU's window below it); elsewhere every vCPU halts. The planner takes over after the
//! first period, which the adapters keep short ([`LoopPriors::first_period_share`]).

use serde::{Deserialize, Serialize};

use crate::gleaner::{Controller, Decision, Metrics, Params, Snapshot};
use crate::idle::plan::{plan, IdlePlan, Means, PlanConfig, PlanReason, VcpuInput};
use crate::idle::{Log2Hist, TraceSource, VcpuGaps, WakeCurve, WakeTrace};
use crate::retention::{EpochReading, GovernorConfig, GovernorState, GovernorStep, PriorStrength, RetentionMode, WorkloadIo};

pub mod ladder;
mod observe;
pub mod priors;
pub mod setup;
pub mod tracer;
mod window;

use ladder::{Ladder, Rung};
pub use observe::estimate_gaps;
use observe::{epoch_reading, Seen, Smoothed};
pub use priors::LoopPriors;
use window::WindowCheck;
pub use window::GOVERNOR_SWITCH_NS;

/// One vCPU's idle counters over a period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuIdle {
    pub cpu: u32,
    /// Time the vCPU was idle (`/proc/stat` idle, kernel polling included), ns.
    pub idle_ns: u64,
    /// Times it went idle (cpuidle usage), `None` without cpuidle.
    pub entries: Option<u64>,
    /// Time it polled in the kernel's POLL state, ns (counted idle by `/proc/stat`).
    pub poll_ns: u64,
    /// CPU time of its yielding thread, ns (counted busy by `/proc/stat`).
    pub yield_ns: u64,
    /// Time the host ran something else while the vCPU wanted to run (`/proc/stat` steal), ns.
    #[serde(default)]
    pub steal_ns: u64,
}

/// What the adapter measured over one period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuestReading {
    /// The consolidation controller's snapshot (active vCPUs, `S_work`).
    pub snapshot: Snapshot,
    /// Every managed vCPU.
    pub idle: Vec<VcpuIdle>,
    /// What the tracer saw in the period (`None`: no tracer, or not attached this period).
    pub trace: Option<WakeTrace>,
    /// Per vCPU, the idle periods its yielding thread caught in the period (the difference of
    /// `retention::IdleDetector::caught`): a scheduler tracer does not see them (the yielder,
    /// not the idle task, held the vCPU), so they join the traced or estimated ones as woken.
    #[serde(default)]
    pub caught: Vec<(u32, Log2Hist)>,
    /// What the workload's threads moved through read/write calls in the period (the
    /// governor's progress where it is enough: [`crate::retention::ProgressUnit`]); zero
    /// where not measured.
    #[serde(default)]
    pub io: WorkloadIo,
    /// How far the workload's own progress counter moved in the period (`--progress`), where
    /// the user gave one and it could be read: the governors' progress then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counter: Option<u64>,
    /// The agent's own work in the last period (sampling, deciding, applying), ns of CPU;
    /// 0 where not measured (the simulator's agent costs nothing).
    #[serde(default)]
    pub agent_work_ns: u64,
    /// Share of the period's sync points made by the workload's processes that started while the
    /// tracer counted, which it did not follow (it counts the processes it was armed with): 0 where
    /// none or not traced. A trace that missed [`LoopPriors::trace_missed_share`] or more is no
    /// basis for a plan ([`GuestController::step`]).
    #[serde(default)]
    pub trace_missed: f64,
}

/// How the guest loop runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuestConfig {
    /// The managed vCPUs.
    pub cpus: Vec<u32>,
    /// Consolidation's parameters (`None`: no consolidation).
    pub consolidation: Option<Params>,
    /// The idle planner's budget and price.
    pub plan: PlanConfig,
    /// What the machine offers (`Means { yielders: false, .. }` and no kernel polling: the
    /// idle policy is off).
    pub means: Means,
    /// The wake-cost curve (`None`: not measured; nothing is retained).
    pub curve: Option<WakeCurve>,
    /// The governor (`None`: the plan is applied without on/off comparisons).
    pub governor: Option<GovernorConfig>,
    /// The governor's first mode.
    pub prior: RetentionMode,
    /// A fixed yielding window for every vCPU instead of the planner's (`--timeout-us`: an
    /// experiment; no governor then).
    #[serde(default)]
    pub fixed_yield_ns: Option<u64>,
    /// How a run starts, before it has seen the workload.
    #[serde(default)]
    pub start: StartConfig,
    /// The configured control period, ns (a period runs a share of it:
    /// [`GuestStep::next_period_ns`]).
    #[serde(default = "default_period_ns")]
    pub period_ns: u64,
    /// The loop's priors: the numbers it starts from or bounds itself by.
    #[serde(default)]
    pub priors: LoopPriors,
}

/// The agent's default control period, 200 ms.
pub const DEFAULT_PERIOD_NS: u64 = 200_000_000;

fn default_period_ns() -> u64 {
    DEFAULT_PERIOD_NS
}

/// How the guest loop starts (priors for a workload it has not seen yet).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StartConfig {
    /// The kernel polling window of the start plan, ns (0: halt), where the machine offers
    /// kernel polling and the curve says a poll is cheaper than a halt; with `until_work`, the
    /// plan of a start that is quiet ([`LoopPriors::quiet_rate`]).
    pub window_ns: u64,
    /// Start by polling until work on every vCPU (their resume latency limits), where the
    /// machine offers it: the best latency any idle policy gets, from the first wakeup, for
    /// the first period only unless the workload is quiet (then `window_ns`).
    pub until_work: bool,
    /// No period is traced before the run is this old, ns: the first periods plan from the
    /// cpuidle counters ([`estimate_gaps`]).
    pub trace_after_ns: u64,
}

impl Default for StartConfig {
    fn default() -> Self {
        Self { window_ns: INITIAL_POLL_WINDOW_NS, until_work: true, trace_after_ns: TRACE_AFTER_NS }
    }
}

/// The default [`StartConfig::trace_after_ns`]: a second. The tracer's fixed cost (loading its
/// programs, the statistics switch, the first attach) and its first slices weigh most on a
/// short run, and a run of a second is what the counters' estimate must serve alone
/// (docs/idle-policy.md, "Priors").
pub const TRACE_AFTER_NS: u64 = 1_000_000_000;

impl GuestConfig {
    /// The governor's prior strength from the curve: a machine whose only means are yielders
    /// and whose busy vCPU wakes less than a quarter faster than a halted one after a long
    /// gap is probed late ([`PriorStrength::Unpromising`]).
    pub fn prior_strength(&self) -> PriorStrength {
        let Some(c) = &self.curve else { return PriorStrength::Plain };
        if let (true, Some(p)) = (self.means.kernel_polling(), c.poll_ns) {
            let long = c.halted.last().map_or(0, |x| x.mean_ns);
            return if long.saturating_sub(p) >= crate::idle::curve::NOISE_NS.max(long / 4) {
                PriorStrength::Confident
            } else {
                PriorStrength::Plain
            };
        }
        if c.yielders_can_pay() {
            PriorStrength::Plain
        } else {
            PriorStrength::Unpromising
        }
    }
}

/// What one period decided.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GuestStep {
    /// The vCPUs the workload may use next period.
    pub active: Vec<u32>,
    /// Consolidation's decisions this period.
    pub decisions: Vec<Decision>,
    /// The idle plan to apply next period (every vCPU halts when retention is off).
    pub plan: IdlePlan,
    /// The plan the planner made, applied or not (for status: what "on" means now).
    pub planned: IdlePlan,
    /// Retention on or off next period.
    pub mode: RetentionMode,
    /// The next period is a probe of the other mode.
    pub probe: bool,
    /// What the governor that stepped read and decided (`None` without governors, or while
    /// neither compares: their plans run alike).
    pub governor: Option<GovernorStep>,
    /// Which of the ladder's governors that was ([`ladder`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rung: Option<Rung>,
    /// The epoch the governor read.
    pub reading: EpochReading,
    /// Where this period's idle periods came from.
    pub gaps_from: Option<TraceSource>,
    /// Each vCPU's budget now (tightened where the realized cost ran over).
    pub budget: Vec<(u32, f64)>,
    /// How long the next period should last, as a share of the configured period: a probe of the
    /// other mode is short ([`LoopPriors::probe_share`]), since it runs in the mode believed worse;
    /// once the plan has held for [`LoopPriors::calm_periods`], longer
    /// ([`LoopPriors::calm_period_share`]).
    pub next_period_share: f64,
    /// The next period's length: `next_period_share` of the configured period, the period first
    /// lengthened (up to [`LoopPriors::max_period_stretch`] times) where the agent's own work would
    /// take more than [`LoopPriors::agent_work_share`] of a vCPU.
    pub next_period_ns: u64,
    /// How applying `plan` brings each vCPU's own haltpoll window down to the plan's: a window
    /// lowered earlier is still polled at the older, larger one
    /// ([`LoopPriors::stale_window_excess`]).
    #[serde(default)]
    pub reset_poll_windows: WindowReset,
}

/// How the adapter brings each vCPU's own haltpoll window down to a lowered cap
/// ([`GuestStep::reset_poll_windows`]; the governor's rules at [`LoopPriors::stale_window_excess`]).
///
/// ```text
///  stale seen ──> Shrink (one period) ──> its vCPUs halted? ── yes ──> done (the windows are the plan's)
///                                                         └── no ──> while stale, the CPU polled past the
///                                                                    estimate adds up; once it costs more at
///                                                                    the price than the switch's halts ──> Switch
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowReset {
    /// Nothing to bring down: the fixed window's rules (no shrinking) as they are.
    #[default]
    Keep,
    /// Shrinking on for the coming period, to nothing (`guest_halt_poll_allow_shrink` Y,
    /// `guest_halt_poll_shrink` 0), off again at the next apply: a vCPU's first halt longer
    /// than the cap sets its window to 0, and its next idle period inside the cap grows it
    /// straight to the cap (`grow_start`). One missed poll per vCPU, where a governor switch
    /// halts every vCPU for ~15 ms.
    Shrink,
    /// Switch the cpuidle governor away and back (its `enable` sets every window to 0): for a
    /// vCPU that never halts past its old window, which shrinking cannot reach; and when the
    /// plan goes back to the machine's own settings after a window was polled (the adapter
    /// switches then unless restoring the cap already did).
    Switch,
}

/// Whether a period should be traced ([`GuestController::trace_need`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceNeed {
    /// Not at all: the plan does not depend on what a trace would show.
    Skip,
    /// At the tracer's own cadence (its cost bounded).
    Cadence,
    /// This period: the governor compares it, the workload is not seen yet, or its rate moved.
    Now,
}

/// The haltpoll module's default `guest_halt_poll_ns`: the window a run starts with before it
/// has seen any idle period.
pub const INITIAL_POLL_WINDOW_NS: u64 = 200_000;

/// The guest loop's state machine (module documentation).
#[derive(Debug, Clone)]
pub struct GuestController {
    cfg: GuestConfig,
    consolidation: Option<Controller>,
    /// Off / Planned / Wide, chosen by experiment ([`ladder`]).
    ladder: Ladder,
    seen: Vec<Seen>,
    /// The mode the current period runs in.
    mode: RetentionMode,
    /// The plan applied in the current period.
    applied: IdlePlan,
    /// The plan the run started with.
    start: IdlePlan,
    /// A tracer reported before: periods it skipped keep the smoothed idle periods as they
    /// are instead of falling back to estimates.
    traced_before: bool,
    /// Traces set aside in a row: they missed processes the workload started meanwhile
    /// ([`LoopPriors::trace_missed_share`]); the next period is traced with them.
    set_aside: u32,
    /// Some vCPU has seen enough of the workload's wakeups to plan from: until then the plan
    /// it started with stands (the kernel's upstream haltpoll window where offered).
    informed: bool,
    /// The workload's sync points per second in the last traced period, and in the last one.
    traced_rate: Option<f64>,
    last_rate: f64,
    /// How many vCPUs the workload had last period.
    last_active: usize,
    /// vCPUs were given back since the start: an unseen workload runs the start window, not
    /// the start plan's polling until work.
    restarted: bool,
    /// The last period changed the workload's set of vCPUs: the idle periods of those left
    /// are another workload's now, so the next period is traced ([`Self::trace_need`]).
    moved: bool,
    /// Share of the managed vCPUs' time (steal excepted) the workload left idle (yielders' time
    /// counted idle), smoothed; `None` before the first reading with idle times.
    idle_share: Option<Smoothed>,
    /// What the host's sharing of its pCPUs costs retention, measured ([`observe::HostWait`]):
    /// Planned's price and retained wake costs on a host that shares them.
    host_wait: observe::HostWait,
    /// How long the workload has been quiet (under [`LoopPriors::quiet_rate`] sync points a
    /// second), ns, in the periods up to the last one; 0 once it is not.
    quiet_ns: u64,
    /// The largest haltpoll window applied since each vCPU's own was last reset (0: none, or
    /// the machine's own settings, which the adapter restores with a reset): what a vCPU may
    /// still poll at ([`LoopPriors::stale_window_excess`]).
    kernel_window_ns: u64,
    /// The largest haltpoll window applied since the last switch (0: none): what a vCPU may
    /// still hold where no shrink reaches, one polling until work never halting. Going back to
    /// the machine's own settings switches where it is not 0.
    grown_window_ns: u64,
    /// Where bringing a stale window down stands.
    window_check: WindowCheck,
    /// CPU polled past the estimate since a shrink that did not reach every vCPU, ns: what a
    /// switch would stop ([`Self::track_kernel_window`]).
    stale_cpu_ns: f64,
    /// Periods in a row the plan held ([`LoopPriors::calm_periods`]).
    calm: u32,
    /// The agent's own work in the period before the last one, ns (the stretch takes the
    /// lesser of the last two: [`Self::next_period_ns`]).
    work_before_ns: u64,
    /// Periods read so far, and the time they covered, ns.
    periods: u64,
    elapsed_ns: u64,
}

impl GuestController {
    /// The last period's rate of sync points is another workload than the last traced
    /// period's for the plan: twofold either way, and at least [`LoopPriors::min_rate_change`] (false
    /// before any traced period).
    fn rate_moved_since_trace(&self) -> bool {
        self.traced_rate.is_some_and(|then| {
            let (lo, hi) = if then < self.last_rate { (then, self.last_rate) } else { (self.last_rate, then) };
            hi >= self.cfg.priors.min_rate_change && hi >= 2.0 * lo
        })
    }

    pub fn new(cfg: GuestConfig) -> Self {
        let consolidation = cfg.consolidation.clone().map(|p| Controller::new(cfg.cpus.clone(), p));
        // Wide is a level where there is something to widen: a curve to plan from and a
        // mechanism, and the planner's windows (not a fixed one).
        let wide = cfg.curve.is_some() && cfg.fixed_yield_ns.is_none() && (cfg.means.kernel_polling() || cfg.means.yielders);
        let ladder = Ladder::new(cfg.governor, cfg.prior, cfg.prior_strength(), wide, cfg.plan.price);
        let mode = ladder.mode();
        let polls_cheaper = cfg.curve.as_ref().is_some_and(|c| c.poll_ns.is_some_and(|p| c.halted.iter().any(|h| h.mean_ns > p)));
        let applied = match cfg.fixed_yield_ns {
            Some(w) if mode.is_on() => IdlePlan::fixed_yield(cfg.cpus.iter().copied(), w),
            None if mode.is_on() && polls_cheaper && cfg.start.until_work && cfg.means.poll_always => {
                IdlePlan::poll_until_work(cfg.cpus.iter().copied())
            }
            None if mode.is_on() && cfg.means.poll_window && polls_cheaper && cfg.start.window_ns > 0 => {
                IdlePlan::initial_poll(cfg.cpus.iter().copied(), cfg.start.window_ns.min(u64::from(u32::MAX)))
            }
            _ => IdlePlan::halt(cfg.cpus.iter().copied()),
        };
        let seen = cfg
            .cpus
            .iter()
            .map(|&cpu| Seen {
                gaps: VcpuGaps { cpu, ..VcpuGaps::default() },
                observed_ns: 0,
                budget_scale: 1.0,
                steal_scale: 1.0,
                idle_share: None,
            })
            .collect();
        let start = applied.clone();
        let kernel_window_ns = if applied.retains() { applied.poll_window_ns } else { 0 };
        Self {
            cfg,
            consolidation,
            ladder,
            seen,
            mode,
            applied,
            start,
            traced_before: false,
            set_aside: 0,
            informed: false,
            traced_rate: None,
            last_rate: 0.0,
            last_active: 0,
            moved: false,
            restarted: false,
            idle_share: None,
            quiet_ns: 0,
            kernel_window_ns,
            grown_window_ns: kernel_window_ns,
            window_check: WindowCheck::Clear,
            stale_cpu_ns: 0.0,
            calm: 0,
            work_before_ns: 0,
            host_wait: observe::HostWait::default(),
            periods: 0,
            elapsed_ns: 0,
        }
    }

    pub fn config(&self) -> &GuestConfig {
        &self.cfg
    }

    /// The workload's sync points a second over the last period (`None` before the first).
    pub fn sync_rate(&self) -> Option<f64> {
        (self.last_active > 0).then_some(self.last_rate)
    }

    /// The workload is starting: only the first (short) period has been read, which holds a
    /// command's start. Its rate says nothing about the next period's, so an adapter that
    /// sizes a traced slice by the rate traces its shortest slice instead. Sized by the
    /// start-up's rate (redis and nginx: 13-33 sync points in their first 50 ms, then
    /// 8,000-19,000 in the next 200 once the client ran), the slice was the whole next period,
    /// and the client's first 5,000-8,500 requests ran with the tracer counting (redis with
    /// one connection: p50 15.6 us against 13.7, p99 30-35 against 19-21). A count of sync
    /// points cannot tell a start from a light workload's steady rate: an open loop at 200
    /// requests a second made 50 in its first period. A light workload's whole-period slices
    /// come one period later. A quiet period of a workload not seen yet says no more (its
    /// rate, next to none, bounds no slice): a command whose client starts after a pause
    /// (`sleep 0.15; ping-pong`) counts the shortest slice in the period it starts in, not the
    /// whole of it.
    pub fn workload_starting(&self) -> bool {
        self.periods == 1 || (!self.informed && self.quiet_ns > 0)
    }

    /// Some vCPU has seen enough of the workload's wakeups to plan from (until then the start
    /// plan stands).
    pub fn informed(&self) -> bool {
        self.informed
    }

    /// The vCPUs the workload may use now.
    pub fn active(&self) -> Vec<u32> {
        self.consolidation.as_ref().map_or_else(|| self.cfg.cpus.clone(), |c| c.active().to_vec())
    }

    /// Consolidation's last measurements (default without consolidation).
    pub fn metrics(&self) -> Metrics {
        self.consolidation.as_ref().map(Controller::metrics).unwrap_or_default()
    }

    /// The retention mode of the current period.
    pub fn mode(&self) -> RetentionMode {
        self.mode
    }

    /// The plan applied in the current period.
    pub fn applied(&self) -> &IdlePlan {
        &self.applied
    }

    /// The smoothed idle periods of each vCPU and the time they stand for (what the planner
    /// plans from).
    pub fn seen(&self) -> Vec<(VcpuGaps, u64)> {
        self.seen.iter().map(|s| (s.gaps.clone(), s.observed_ns)).collect()
    }

    /// The lower governor's state (Off against Planned).
    pub fn governor_state(&self) -> Option<GovernorState> {
        self.ladder.low_state()
    }

    /// The upper governor's state (Planned against Wide).
    pub fn widen_state(&self) -> Option<GovernorState> {
        self.ladder.high_state()
    }

    /// The time the workload ran in probes so far, and in probes found worse than the
    /// baseline: what the loop's experiments cost it.
    pub fn probe_time(&self) -> ladder::ProbeTime {
        self.ladder.probe_time()
    }

    /// The current period is a probe (its readings are the probe's, not the workload's usual).
    pub fn probing(&self) -> bool {
        self.ladder.probing()
    }

    /// Whether the coming period should be traced:
    /// - now, whatever the tracer's own cadence: the governor compares it with its neighbours
    ///   by latency (the period before a probe, the probe, and the one after it); the plan has
    ///   not seen enough of the workload yet; the workload's rate of sync points has
    ///   changed twofold since the last traced period (a server that only now gets requests:
    ///   a sockperf ping-pong started half a second after its agent ran at stock latency for a
    ///   second, until the tracer's next turn); or consolidation changed the workload's vCPUs
    ///   (the one left after packing the open loop at 200 requests/s hosts its client and
    ///   server: its idle periods doubled, and its window planned from the two-vCPU ones, 4
    ///   ms against ~5 ms idle periods, halted it for 0.6 s, until the tracer's next turn);
    /// - not at all while the workload leaves too little idle time for any mechanism the
    ///   machine offers ([`Self::plan_forced`]): every vCPU halts whatever its idle periods,
    ///   so tracing them buys nothing and costs the workload most (`sysbench threads`, 8
    ///   threads on 2 vCPUs: 1.8 million switches a second, 105 ns of the programs' time
    ///   each, 9.7% of the VM while attached);
    /// - otherwise at the tracer's own cadence.
    pub fn trace_need(&self) -> TraceNeed {
        // A forced plan's comparisons (Wide against a saturated Planned) are judged by
        // progress: a trace would cost its switch storm most and show nothing it needs.
        if self.elapsed_ns < self.cfg.start.trace_after_ns || self.plan_forced() {
            return TraceNeed::Skip;
        }
        let governor = self.ladder.comparing();
        if governor || !self.informed || self.moved || self.set_aside > 0 || self.traced_rate.is_none() || self.rate_moved_since_trace() {
            TraceNeed::Now
        } else {
            TraceNeed::Cadence
        }
    }

    /// Every vCPU halts whatever its idle periods: the workload leaves too little idle time for
    /// kernel polling ([`LoopPriors::saturated_idle_share`]) and for the yielders
    /// ([`LoopPriors::saturated_yield_idle_share`]) or the machine has no kernel polling. A fixed
    /// yielding window (`--timeout-us`) is never forced.
    pub fn plan_forced(&self) -> bool {
        self.cfg.fixed_yield_ns.is_none()
            && (self.saturated() || (!self.cfg.means.kernel_polling() && self.saturated_for(crate::idle::Mechanism::Yield)))
    }

    /// Stops consolidating for good: every vCPU back (the adapter could not apply a set).
    pub fn stop_consolidation(&mut self) {
        self.consolidation = None;
    }

    /// One period (module documentation): the reading taken, consolidation's decisions, the
    /// plan and its level chosen by experiment, then the next period's length.
    pub fn step(&mut self, r: &GuestReading) -> GuestStep {
        let period_ns = r.snapshot.period_ns.max(1);
        let (r, set_aside) = self.admit(r);
        let r = r.as_ref();
        let gaps_from = self.take_reading(r, period_ns, set_aside);
        let (mut decisions, consolidation_before) = self.consolidate(r);
        let active = self.active();
        self.restart_where_given_back(active.len());
        let planned = self.shaped_plan();
        let reading = epoch_reading(r, u32::try_from(active.len()).unwrap_or(u32::MAX));
        let (plan, rung, governor) = self.choose_level(&reading, &planned);
        self.hold_back(&mut decisions, consolidation_before, &plan);
        let active = self.active();
        self.moved = self.last_active > 0 && active.len() != self.last_active;
        self.last_active = active.len();
        let reset_poll_windows = self.track_kernel_window(r, period_ns, &plan);
        let held = plan.runs_as(&self.applied)
            && decisions.is_empty()
            && reset_poll_windows == WindowReset::Keep
            && governor.is_none_or(|g| g.change.is_none());
        self.applied = plan.clone();
        let next_period_share = self.next_share(held);
        // A one-off cost of the agent's (loading the tracer, a consolidation) does not
        // lengthen the periods: the lesser of the last two periods' work stretches them (a
        // sockperf client started after its server's quiet half second ran its whole 1 s
        // under a plan made for the quiet, in a 1.7 s period stretched by the tracer's load).
        let work_ns = r.agent_work_ns.min(self.work_before_ns);
        self.work_before_ns = r.agent_work_ns;
        GuestStep {
            next_period_ns: self.next_period_ns(work_ns, next_period_share),
            next_period_share,
            active,
            decisions,
            plan,
            planned,
            mode: self.mode,
            probe: self.probing(),
            governor,
            rung,
            reading,
            gaps_from,
            budget: self.seen.iter().map(|s| (s.gaps.cpu, self.cfg.plan.budget * s.scale())).collect(),
            reset_poll_windows,
        }
    }

    /// The reading the loop plans from, and whether its trace was set aside. A trace that
    /// missed processes the workload started while it counted (a tenth of the sync points) is
    /// set aside, as if the period were not traced, and the next period traced with them (at
    /// most `priors.max_set_aside` in a row): the client of a server started during the
    /// agent's second period, a whole period traced without it, read as a server woken 31
    /// times in 200 ms at 40,000 sync points a second; the plan halted both vCPUs and
    /// consolidation packed client and server onto one (redis with one connection).
    fn admit<'r>(&mut self, r: &'r GuestReading) -> (std::borrow::Cow<'r, GuestReading>, bool) {
        let traced = r.trace.as_ref().is_some_and(|t| t.traced_ns > 0);
        let set_aside = traced && r.trace_missed >= self.cfg.priors.trace_missed_share && self.set_aside < self.cfg.priors.max_set_aside;
        if traced {
            self.set_aside = if set_aside { self.set_aside + 1 } else { 0 };
        }
        if set_aside {
            (std::borrow::Cow::Owned(GuestReading { trace: None, ..r.clone() }), true)
        } else {
            (std::borrow::Cow::Borrowed(r), false)
        }
    }

    /// Takes in the period's reading: the idle periods (none from a set-aside period: nor
    /// are estimates, which before any trace would stand in for one, from a start-up's
    /// counters), the workload's rate and quiet time, the budgets and the idle shares.
    fn take_reading(&mut self, r: &GuestReading, period_ns: u64, set_aside: bool) -> Option<TraceSource> {
        let gaps_from = if set_aside { None } else { self.observe(r) };
        self.last_rate = r.snapshot.s_work as f64 * 1e9 / period_ns as f64;
        self.periods += 1;
        self.elapsed_ns = self.elapsed_ns.saturating_add(period_ns);
        self.quiet_ns = if self.last_rate < self.cfg.priors.quiet_rate { self.quiet_ns.saturating_add(period_ns) } else { 0 };
        if r.trace.as_ref().is_some_and(|t| t.traced_ns > 0) {
            self.traced_rate = Some(self.last_rate);
        }
        self.tighten_budgets(r, period_ns);
        self.observe_idle_share(r, period_ns);
        let min_wakeups = self.cfg.governor.map_or(GovernorConfig::default().min_wakeups, |g| g.min_wakeups);
        self.host_wait.observe(r, &self.cfg.cpus, period_ns, &self.cfg.priors, min_wakeups);
        gaps_from
    }

    /// Consolidation's decisions for the period, and its state before them (for
    /// [`Self::hold_back`]). Consolidation does not judge the workload by a probe period's
    /// readings. While idle vCPUs poll it runs only for a light workload
    /// ([`LoopPriors::poll_consolidation_util`]): a cross-vCPU wakeup to a polling vCPU costs
    /// a few us, so packing a busy workload only queues its threads, but a light one on one
    /// polling vCPU wakes without crossing at all and leaves the others halted. And only once
    /// the workload has been seen: an idle start (a server before its first client) is no
    /// basis, and a cpuset shrunk then refuses the pinning a starting workload may do
    /// (`taskset -c 1` of a sockperf server started 0.5 s before its client failed with
    /// EINVAL).
    fn consolidate(&mut self, r: &GuestReading) -> (Vec<Decision>, Option<Controller>) {
        let probe_now = self.probing();
        // A quiet start that gave up polling is still unseen: no basis either.
        let start_polls = !self.informed && self.start.vcpus.iter().any(|v| v.mechanism == crate::idle::Mechanism::Poll);
        let polls = start_polls || self.applied.vcpus.iter().any(|v| v.mechanism == crate::idle::Mechanism::Poll);
        let light = self.informed && r.snapshot.util() <= self.cfg.priors.poll_consolidation_util;
        let before = self.consolidation.clone();
        let decisions = match (&mut self.consolidation, probe_now, polls) {
            (Some(c), false, true) if !light => c.reset_with(crate::gleaner::ResetReason::KernelPolling),
            (Some(c), false, _) => c.step(&r.snapshot),
            _ => Vec::new(),
        };
        (decisions, before)
    }

    /// vCPUs given back to the workload (consolidation reset: a vCPU ran full) have seen
    /// nothing of it while it ran elsewhere: the plan starts over, and the next period is
    /// traced (a sockperf ping-pong consolidated onto one vCPU while idle, then reset when
    /// both ends ran: 0.4 s at halted latency before the tracer's next turn planned polling
    /// again). Not from the whole vCPUs again: the start window covers a ping-pong's idle
    /// periods at a server's idle cost.
    fn restart_where_given_back(&mut self, active: usize) {
        if self.last_active > 0 && active > self.last_active {
            self.informed = false;
            self.restarted = true;
        }
    }

    /// The planner's plan with its priors applied: the VM's saturation halts polling (and the
    /// planner's own bottleneck rule: on a saturated VM every vCPU paces another), and a
    /// saturation for yielders halts the planned yielders. Fixed yielding windows (always-on
    /// retention, the paper's Gleaner) are the user's choice and stay: on a shared host they
    /// hold pCPUs against a co-runner, which is where the paper's gains are (`gleaner sim
    /// fig7`). Marks the loop informed first: some vCPU saw enough of the workload's wakeups to
    /// plan from on its own (a window shared from a handful of wakeups is not: a sockperf
    /// server's start-up woke it twice, and halting the idle server let consolidation pack it
    /// onto one vCPU); judged before the saturation rule, which halts a workload it has seen.
    fn shaped_plan(&mut self) -> IdlePlan {
        let planned = self.plan();
        self.informed |= planned
            .vcpus
            .iter()
            .any(|v| matches!(v.why, PlanReason::BestValue | PlanReason::NothingPays | PlanReason::VmShare | PlanReason::Bottleneck));
        if self.saturated() && planned.vcpus.iter().any(|v| v.mechanism == crate::idle::Mechanism::Poll || v.why == PlanReason::Bottleneck)
        {
            IdlePlan::halt_because(self.cfg.cpus.iter().copied(), PlanReason::Saturated)
        } else if self.cfg.fixed_yield_ns.is_none() && self.saturated_for(crate::idle::Mechanism::Yield) {
            let mut p = planned;
            for v in p.vcpus.iter_mut().filter(|v| v.mechanism == crate::idle::Mechanism::Yield) {
                *v = crate::idle::VcpuPlan { mechanism: crate::idle::Mechanism::Halt, window_ns: 0, why: PlanReason::Saturated, ..*v };
            }
            p
        } else {
            planned
        }
    }

    /// The ladder's step on the epoch: the level of the next period and its plan, with the
    /// governor that stepped. A rung whose two plans run alike is not compared (while the plan
    /// is forced, Planned is Off; a plan that already covers everything is Wide).
    fn choose_level(&mut self, reading: &EpochReading, planned: &IdlePlan) -> (IdlePlan, Option<Rung>, Option<GovernorStep>) {
        let off = IdlePlan::off(self.cfg.cpus.iter().copied());
        let yields = self.wide_yields();
        self.ladder.set_wide_yields(yields);
        let wide = self.wide_plan(planned);
        // The yielders are compared by the work alone: where it is not measured, not at all.
        let distinct_high = !planned.runs_as(&wide) && (!yields || self.work_measured(reading));
        let ladder = self.ladder.step(reading, !planned.runs_as(&off), distinct_high);
        let (rung, governor) = ladder.governor.map_or((None, None), |(r, g)| (Some(r), Some(g)));
        self.mode = ladder.mode;
        let plan = match self.mode {
            RetentionMode::Off => off,
            RetentionMode::On => planned.clone(),
            RetentionMode::Wide => wide,
        };
        (plan, rung, governor)
    }

    /// Drops the period's consolidation decisions (and puts consolidation back as it was)
    /// where the period is no basis for them. A period after which the vCPUs go from halting
    /// to retaining, or back, is none: a vCPU taken away now would be judged next period under
    /// another idle policy, which moves utilization on its own (a deactivation made while the
    /// first period halted was rolled back on the next, yielding, as a slowdown, and the
    /// rollback's cut of rho kept the VM from ever consolidating). Nor is a period whose rate
    /// of sync points changed twofold since the last traced one a basis for giving a vCPU up:
    /// the plan it would be judged under is stale, and the next period is traced for a new one
    /// (nginx with one wrk connection: an untraced period at 28,000 sync points a second,
    /// planned from a start-up trace taken before the load, packed server and client onto one
    /// vCPU until the rollback; its p99 doubled). Giving vCPUs back is never held.
    fn hold_back(&mut self, decisions: &mut Vec<Decision>, before: Option<Controller>, plan: &IdlePlan) {
        let stale = self.traced_before && self.rate_moved_since_trace();
        let gives_up = decisions.iter().any(|d| matches!(d, Decision::Deactivate { .. }));
        if !decisions.is_empty() && (plan.retains() != self.applied.retains() || (stale && gives_up)) {
            self.consolidation = before;
            decisions.clear();
        }
    }

    /// The next period's length as a share of the configured one, counting the calm periods
    /// (`held`: the plan just applied ran as the last). A probe is short; polling until work
    /// before the workload is seen costs every vCPU whole for a decision not yet made, so it is
    /// judged at the first period's length (`sleep 2` under the start plan polled both vCPUs
    /// for the first 250 ms when its second period was a whole one); calm periods lengthen,
    /// but not while the workload is quiet: what comes next is its start, which a long period
    /// would meet with the quiet's plan.
    fn next_share(&mut self, held: bool) -> f64 {
        self.calm = if held && !self.probing() && self.trace_need() != TraceNeed::Now { self.calm + 1 } else { 0 };
        let unseen_polls = !self.informed && !self.applied.poll_always.is_empty();
        if self.probing() {
            self.cfg.priors.probe_share
        } else if unseen_polls {
            self.cfg.priors.first_period_share
        } else if self.calm >= self.cfg.priors.calm_periods && self.last_rate >= self.cfg.priors.quiet_rate {
            self.cfg.priors.calm_period_share
        } else {
            1.0
        }
    }

    /// `share` of the configured period, lengthened where the agent's own work (`work_ns` last
    /// period) would take more than [`LoopPriors::agent_work_share`] of it.
    fn next_period_ns(&self, work_ns: u64, share: f64) -> u64 {
        let base = self.cfg.period_ns.max(1) as f64;
        let stretched = (work_ns as f64 / self.cfg.priors.agent_work_share).clamp(base, base * self.cfg.priors.max_period_stretch);
        crate::num::saturating_u64((stretched * share).round()).max(1)
    }

    /// Whether the agent's own period work runs in the background (the adapter makes it SCHED_IDLE)
    /// rather than at the workload's priority: while the VM is not [`Self::saturated`] and the
    /// workload blocks at most [`LoopPriors::background_max_rate`] times a second per active vCPU.
    ///
    /// The period's work (reading the counters, deciding, writing knobs) takes the agent 0.5-1 ms
    /// of a vCPU at a stretch, and the scheduler lets a running task finish its protected slice
    /// before a woken one of equal priority runs: a server woken on the vCPU the agent ran on
    /// waited for it (sockperf under load at 2,000 msg/s under `perf sched`: 14 of 15 such wakeups
    /// 481-821 us late). Any task preempts a SCHED_IDLE one at once (the same wakeups: 18-29 us).
    /// But a SCHED_IDLE agent runs in the workload's idle periods and is preempted at each wakeup,
    /// which then needs an interrupt where the vCPU would have been polling: a ping-pong blocking
    /// 90,000 times a second per vCPU chopped the agent's work into hundreds of pieces and its p99
    /// doubled (7.9 to 15.8 us, 11 alternated rounds). Hence the rate: at 5,000 a second a
    /// millisecond of work is cut about five times. A saturated VM leaves the background no time:
    /// there the agent takes its fair share, or its periods would wait for an idle task's turn
    /// (~0.5 s).
    pub fn agent_in_background(&self) -> bool {
        // Before the first reading nothing says the VM has idle time: a SCHED_IDLE agent on a
        // saturated VM did not end its first period before the workload did (`perf bench
        // sched messaging`, 160 processes: 520 ms for a 50 ms period).
        self.periods > 0 && !self.saturated() && self.last_rate <= self.cfg.priors.background_max_rate * self.last_active.max(1) as f64
    }

    /// Whether the agent's period work steps aside for a woken thread at least every
    /// [`LoopPriors::agent_pace_ns`] (the adapter calls `sched_yield()` between its steps): while
    /// the VM is not [`Self::saturated`].
    ///
    /// Above [`LoopPriors::background_max_rate`] the work runs at the workload's priority, and a
    /// thread woken on its vCPU waited for the whole of it: the scheduler checks a wakeup against
    /// the running task once, and the running task's protected slice outlasts 0.5-1 ms of work;
    /// nothing checks again before the next tick (4 ms at HZ 250). nginx with one connection
    /// (35,000 requests a second) had 18 wakeups a 3 s run wait 0.2-1.2 ms for the agent (`perf
    /// record -e sched:sched_switch,sched:sched_waking`), and its p99 with `--period-ms 1000` was
    /// 0.65x of the default's (9 alternated rounds). A `sched_yield()` lets the woken thread run at
    /// once (its deadline is the earlier now) and costs about a microsecond where nobody waits. A
    /// saturated VM always has someone waiting: there each yield would queue the agent behind a
    /// full slice and stretch its reading of the counters over tens of milliseconds, so it runs its
    /// work in one piece.
    pub fn agent_paced(&self) -> bool {
        !self.saturated()
    }

    /// The planner on the smoothed idle periods, with what the host's sharing of its pCPUs
    /// costs retention ([`observe::HostWait`]): the contention on top of the configured price,
    /// and the wakeups measured onto runnable vCPUs where dearer than calibrated. Planned only:
    /// Wide, the ladder's probe of holding the vCPUs, plans at the calibration.
    fn plan(&self) -> IdlePlan {
        let priced = self.cfg.curve.as_ref().and_then(|c| self.host_wait.priced(c));
        self.plan_with(&PlanConfig { price: self.cfg.plan.price + self.host_wait.price(), ..self.cfg.plan }, priced.as_ref())
    }

    /// The planner on the smoothed idle periods, with `plan_cfg`, on `curve` (`None`: the
    /// calibrated one).
    fn plan_with(&self, plan_cfg: &PlanConfig, curve: Option<&WakeCurve>) -> IdlePlan {
        if let Some(w) = self.cfg.fixed_yield_ns {
            return IdlePlan::fixed_yield(self.cfg.cpus.iter().copied(), w);
        }
        let Some(calibrated) = &self.cfg.curve else { return IdlePlan::halt(self.cfg.cpus.iter().copied()) };
        let curve = curve.unwrap_or(calibrated);
        let inputs: Vec<VcpuInput<'_>> = self
            .seen
            .iter()
            .filter(|s| s.observed_ns > 0)
            .map(|s| VcpuInput {
                gaps: &s.gaps,
                observed_ns: s.observed_ns,
                budget: plan_cfg.budget * s.scale(),
                idle_share: s.idle_share.map(|x| x.value),
            })
            .collect();
        if inputs.is_empty() {
            return if self.informed { IdlePlan::halt(self.cfg.cpus.iter().copied()) } else { self.unseen() };
        }
        let p = plan(&self.cfg.means, curve, plan_cfg, &inputs);
        if !self.informed && p.vcpus.iter().all(|v| v.why == PlanReason::TooFewWakeups) {
            return self.unseen();
        }
        p
    }

    /// Wide is the yielders: the machine has them beside kernel polling, and the workload
    /// leaves the kernel nothing to poll ([`Self::plan_forced`]), so the one retention that
    /// can still change its run is a thread holding each idle moment ([`ladder`]).
    fn wide_yields(&self) -> bool {
        self.cfg.means.yielders && self.cfg.means.kernel_polling() && self.plan_forced()
    }

    /// The epoch's work was measured (the user's counter, or the bytes a comparison counts:
    /// [`GovernorConfig::min_io_bytes`] a full period): the yielders can be compared by it.
    fn work_measured(&self, r: &EpochReading) -> bool {
        let min = self.cfg.governor.map_or(u64::MAX, |g| g.min_io_bytes) as f64;
        r.counter.is_some() || r.io.bytes as f64 >= min * r.duration_ns as f64 / self.cfg.period_ns.max(1) as f64
    }

    /// The ladder's top level: the planner with no price and none of its rules (no
    /// bottleneck, no saturation), within the budget and the VM share: every idle period
    /// whose halt would cost anything is covered; on a saturated VM with yielders beside
    /// kernel polling, a yielder on every vCPU ([`Self::wide_yields`]). Before the workload is
    /// seen, the start plan, as Planned (nothing to compare yet).
    fn wide_plan(&self, planned: &IdlePlan) -> IdlePlan {
        if !self.informed || self.cfg.fixed_yield_ns.is_some() {
            return planned.clone();
        }
        if self.ladder.wide_yields() {
            return IdlePlan::yield_always(self.cfg.cpus.iter().copied());
        }
        let cfg = PlanConfig { price: 0.0, bottleneck_idle_share: 0.0, ..self.cfg.plan };
        let mut p = self.plan_with(&cfg, None);
        for v in &mut p.vcpus {
            if v.why == PlanReason::BestValue {
                v.why = PlanReason::Wide;
            }
        }
        p
    }

    /// The plan while nothing is seen of the workload: what the run started with, unless the
    /// workload is quiet: polling until work gives way to the start window after a quiet period (a
    /// server waiting for its client polled both vCPUs whole for nothing: sockperf's half second
    /// before its client: three times haltpoll's CPU at the same latency), and every vCPU halts
    /// after [`LoopPriors::quiet_start_ns`].
    fn unseen(&self) -> IdlePlan {
        let until_work = !self.start.poll_always.is_empty();
        if self.quiet_ns >= self.cfg.priors.quiet_start_ns && self.start.retains() {
            IdlePlan::halt_because(self.cfg.cpus.iter().copied(), PlanReason::TooFewWakeups)
        } else if (self.quiet_ns > 0 || self.restarted) && until_work {
            self.quiet_start()
        } else {
            self.start.clone()
        }
    }

    /// The start window's plan (a quiet start), or halting where the machine has no window.
    fn quiet_start(&self) -> IdlePlan {
        if self.cfg.means.poll_window && self.cfg.start.window_ns > 0 {
            IdlePlan::initial_poll(self.cfg.cpus.iter().copied(), self.cfg.start.window_ns.min(u64::from(u32::MAX)))
        } else {
            IdlePlan::halt_because(self.cfg.cpus.iter().copied(), PlanReason::TooFewWakeups)
        }
    }
}

#[cfg(test)]
mod tests;
