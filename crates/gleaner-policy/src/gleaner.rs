//! The Gleaner consolidation controller (Gleaner paper, ATC'14, section 5).
//!
//! Once per period the agent (or the simulator) hands the controller a [`Snapshot`] of the
//! active vCPUs; the controller answers with [`Decision`]s. It never touches the OS.
//!
//! ```text
//!   measurements (sums over active vCPUs, one period):
//!     l_comp = T_work / S_yield     computation length between two idle periods of a vCPU
//!     g_comp = T_work / S_work      computation length of a thread between two sync points
//!     l_idle = T_idle / S_yield     length of an idle period
//!
//!            +--------+  (1) l_comp <= rho*(N-1)*l_idle        +----------+
//!   start -->| Steady |--- and (2) g_comp <= min(eta*l_idle, ---->| Probing  |
//!            +--------+        min_time_slice)                  | (cpu, m0)|
//!             ^  ^  |           => Deactivate(cpu)              +----------+
//!             |  |  | major change (util +-20%, a vCPU >90%,      |      |
//!             |  |  | g_comp x2 or /2) => ResetAll               |      |
//!             |  |  +--------------------------------------------+      |
//!             |  +--- next period: utilization kept => accept ---------+ |
//!             +------ utilization and sync rate dropped, or a vCPU >90% =>   |
//!                     Restore(cpu) and lower eta (saturated) or rho ------+
//! ```
//!
//! The 0.9 rules: after a rollback with a saturated vCPU, `eta <- 0.9*min(eta, g_comp/l_idle)`;
//! otherwise `rho <- 0.9*min(rho, l_comp/((N-1)*l_idle))`, both with the measurements that
//! justified the rolled-back consolidation, so the same situation is refused next time.

use serde::{Deserialize, Serialize};

/// Tunables of the controller. `Default` gives the paper's values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Params {
    /// Load factor rho in (0, 1]: condition (1) `l_comp <= rho*(N-1)*l_idle`.
    pub rho: f64,
    /// Granularity factor eta in (0, 1]: condition (2) `g_comp <= min(eta*l_idle, min_time_slice)`.
    pub eta: f64,
    /// The OS's minimum time slice: only threads computing less than this are consolidated.
    pub min_time_slice_ns: u64,
    /// A relative change of the workload's utilization above this is a major change (0.20).
    pub util_change: f64,
    /// A vCPU busier than this fraction of the period is a major change (0.90).
    pub busy_threshold: f64,
    /// g_comp growing by this factor, or shrinking by its inverse, is a major change (2.0).
    pub gcomp_change: f64,
    /// A utilization drop larger than this fraction after a consolidation rolls it back.
    pub rollback_drop: f64,
    /// Never go below this many active vCPUs.
    pub min_active: usize,
    /// Utilization (in vCPUs) below which changes of utilization and granularity are noise:
    /// they neither roll a consolidation back nor count as a major change (an idle
    /// workload's 0.01 -> 0.008 vCPUs).
    pub min_util: f64,
    /// Periods with fewer idle periods (`S_yield`) than this carry too little information to
    /// decide on; the controller then keeps the current set.
    pub min_idle_periods: u64,
    /// A workload with threads it pinned itself ([`Snapshot::pinned`]) keeps every vCPU: its
    /// program places its threads, and they run and pin where it asks (true). false: the
    /// paper's Gleaner, whose cpuset moves every thread, pinned or not.
    pub keep_pinned: bool,
    /// Consolidation as an experiment against every vCPU (true): the period after a start or
    /// a reset is measured on the whole set and is not a basis for a step, and a step is
    /// rolled back where the workload's sync rate falls below the whole set's beyond chance
    /// (Poisson on the sync points counted) while it uses less CPU, so that steps each under
    /// `rollback_drop` cannot add up to a loss. false: the paper's controller, deciding from
    /// its first period and judging a step only against the one before it.
    pub measured: bool,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            rho: 1.0,
            eta: 1.0,
            min_time_slice_ns: 3_000_000,
            util_change: 0.20,
            busy_threshold: 0.90,
            gcomp_change: 2.0,
            rollback_drop: 0.05,
            min_active: 1,
            min_idle_periods: 8,
            min_util: 0.05,
            keep_pinned: true,
            measured: true,
        }
    }
}

/// Why a parameter set is unusable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParamsError {
    #[error("{name} = {value} is out of range: allowed {allowed}")]
    OutOfRange { name: &'static str, value: String, allowed: &'static str },
}

impl Params {
    /// Checks every field against its allowed range.
    pub fn validate(&self) -> Result<(), ParamsError> {
        fn unit(name: &'static str, v: f64) -> Result<(), ParamsError> {
            if v > 0.0 && v <= 1.0 {
                Ok(())
            } else {
                Err(ParamsError::OutOfRange { name, value: v.to_string(), allowed: "(0, 1]" })
            }
        }
        unit("rho", self.rho)?;
        unit("eta", self.eta)?;
        unit("util_change", self.util_change)?;
        unit("busy_threshold", self.busy_threshold)?;
        unit("rollback_drop", self.rollback_drop)?;
        if !(self.gcomp_change > 1.0 && self.gcomp_change.is_finite()) {
            return Err(ParamsError::OutOfRange {
                name: "gcomp_change",
                value: self.gcomp_change.to_string(),
                allowed: "a finite number > 1",
            });
        }
        if self.min_time_slice_ns == 0 {
            return Err(ParamsError::OutOfRange { name: "min_time_slice_ns", value: "0".into(), allowed: "> 0" });
        }
        if !(self.min_util >= 0.0 && self.min_util.is_finite()) {
            return Err(ParamsError::OutOfRange { name: "min_util", value: self.min_util.to_string(), allowed: "a finite number >= 0" });
        }
        if self.min_active == 0 {
            return Err(ParamsError::OutOfRange { name: "min_active", value: "0".into(), allowed: ">= 1" });
        }
        Ok(())
    }
}

/// One active vCPU over one period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuSample {
    pub cpu: u32,
    /// Time the workload's threads ran on this vCPU (`T_work`).
    pub t_work_ns: u64,
    /// Time the yielding thread ran on this vCPU (`T_yield`); zero without retention.
    pub t_yield_ns: u64,
    /// Time this vCPU had nothing of the workload to run (`T_idle`): yielding plus halted.
    pub t_idle_ns: u64,
    /// Idle periods on this vCPU (`S_yield`): context switches of the yielding thread, or
    /// idle-state entries when retention is off.
    pub s_yield: u64,
}

/// What the controller sees of one period.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Length of the period.
    pub period_ns: u64,
    /// The active vCPUs (those the workload may run on).
    pub vcpus: Vec<VcpuSample>,
    /// Context switches of the workload's threads in the period (`S_work`).
    pub s_work: u64,
    /// The vCPUs of threads the workload pinned itself (a CPU affinity narrower than its
    /// cpuset), ascending: while there are any, consolidation keeps every vCPU
    /// ([`Params::keep_pinned`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned: Vec<u32>,
}

impl Snapshot {
    /// The workload's utilization in vCPUs (`sum T_work / period`).
    pub fn util(&self) -> f64 {
        self.vcpus.iter().map(|v| v.t_work_ns).sum::<u64>() as f64 / self.period_ns.max(1) as f64
    }
}

/// What the controller asks its environment to do, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Decision {
    /// Remove `cpu` from the workload's CPU set (consolidate).
    Deactivate { cpu: u32 },
    /// Give `cpu` back to the workload (rollback of the last consolidation).
    Restore { cpu: u32 },
    /// Major workload change: give the workload every vCPU again.
    ResetAll { reason: ResetReason },
    /// The load factor was lowered by the 0.9 rule.
    SetRho { from: f64, to: f64 },
    /// The granularity factor was lowered by the 0.9 rule.
    SetEta { from: f64, to: f64 },
}

/// Which indicator of a major change fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResetReason {
    UtilizationChange,
    BusyVcpu,
    GranularityChange,
    /// The guest loop keeps every vCPU while idle vCPUs poll in the kernel and the workload
    /// is not light (see `crate::guest`): a wakeup of a polling vCPU is cheap, and sharing
    /// fewer vCPUs would only queue the workload's threads.
    KernelPolling,
    /// The workload pinned some of its threads ([`Snapshot::pinned`]): it places them
    /// itself, on every vCPU it had.
    PinnedThreads,
}

/// The controller's view of the last period, for status and events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// Average computation length between two idle periods (`l_comp`); `None` if no idle period.
    pub l_comp_ns: Option<f64>,
    /// Average computation granularity (`g_comp`); `None` if the workload never switched.
    pub g_comp_ns: Option<f64>,
    /// Average idle period (`l_idle`); `None` if no idle period.
    pub l_idle_ns: Option<f64>,
    /// Workload utilization in vCPUs (`sum T_work / period`).
    pub util: f64,
    /// Busiest active vCPU's fraction of the period spent on the workload.
    pub max_vcpu_util: f64,
    /// Number of active vCPUs.
    pub active: usize,
    pub rho: f64,
    pub eta: f64,
    /// Idle periods counted (`S_yield`).
    pub s_yield: u64,
    /// Workload context switches (`S_work`).
    pub s_work: u64,
    /// Workload synchronization rate, `S_work` per second: the controller's progress proxy.
    pub sync_rate: f64,
}

impl Metrics {
    /// Computes the section-5 measurements of a snapshot.
    pub fn of(s: &Snapshot, rho: f64, eta: f64) -> Self {
        let t_work: u64 = s.vcpus.iter().map(|v| v.t_work_ns).sum();
        let t_idle: u64 = s.vcpus.iter().map(|v| v.t_idle_ns).sum();
        let s_yield: u64 = s.vcpus.iter().map(|v| v.s_yield).sum();
        let ratio = |num: u64, den: u64| (den > 0).then(|| num as f64 / den as f64);
        let period = s.period_ns.max(1) as f64;
        let max_vcpu_util = s.vcpus.iter().map(|v| v.t_work_ns as f64 / period).fold(0.0_f64, f64::max);
        Self {
            l_comp_ns: ratio(t_work, s_yield),
            g_comp_ns: ratio(t_work, s.s_work),
            l_idle_ns: ratio(t_idle, s_yield),
            util: s.util(),
            max_vcpu_util,
            active: s.vcpus.len(),
            rho,
            eta,
            s_yield,
            s_work: s.s_work,
            sync_rate: s.s_work as f64 * 1e9 / period,
        }
    }
}

/// Where the controller is in its cycle.
#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// No reference yet (start, or just after a reset).
    Unsettled,
    /// A settled set of active vCPUs, with the metrics it produced.
    Steady { reference: Metrics },
    /// `cpu` was just deactivated on the strength of `before`.
    Probing { cpu: u32, before: Metrics },
}

/// The consolidation state machine. Deterministic: the same snapshots give the same decisions.
#[derive(Debug, Clone)]
pub struct Controller {
    params: Params,
    all: Vec<u32>,
    active: Vec<u32>,
    /// Deactivated vCPUs, most recent last.
    deactivated: Vec<u32>,
    phase: Phase,
    last: Metrics,
    /// The last period run on every managed vCPU: what a consolidation is judged against
    /// in the end (steps each under [`Params::rollback_drop`] must not add up to more).
    whole: Option<Metrics>,
}

impl Controller {
    /// A controller managing `cpus` (all active at start). Duplicates are removed.
    pub fn new(cpus: Vec<u32>, params: Params) -> Self {
        let mut all = cpus;
        all.sort_unstable();
        all.dedup();
        let last = Metrics { rho: params.rho, eta: params.eta, active: all.len(), ..Metrics::default() };
        Self { active: all.clone(), all, deactivated: Vec::new(), phase: Phase::Unsettled, params, last, whole: None }
    }

    /// The vCPUs the workload may currently use, ascending.
    pub fn active(&self) -> &[u32] {
        &self.active
    }

    /// Every managed vCPU, ascending.
    pub fn all(&self) -> &[u32] {
        &self.all
    }

    /// Current parameters (rho and eta change over time).
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// The measurements of the last period given to [`Controller::step`].
    pub fn metrics(&self) -> Metrics {
        self.last
    }

    /// Feeds one period; returns what to change. Samples of vCPUs that are not active are
    /// ignored (their yielding threads sleep, so they carry no information).
    pub fn step(&mut self, snapshot: &Snapshot) -> Vec<Decision> {
        let mut s = snapshot.clone();
        s.vcpus.retain(|v| self.active.contains(&v.cpu));
        let m = Metrics::of(&s, self.params.rho, self.params.eta);
        self.last = m;
        if self.deactivated.is_empty() && self.params.measured {
            self.whole = Some(m);
        }
        let mut out = Vec::new();
        // A workload that pins its threads places them itself: it keeps every vCPU. Taking
        // only the unpinned ones would make its next pin fail (the kernel refuses a mask all
        // outside the cpuset with EINVAL: a sockperf client's `taskset -c 0` failed when the
        // vCPU was taken around its server's pin to vCPU 1), and taking a pinned one would run
        // that thread off its mask.
        if self.params.keep_pinned && !snapshot.pinned.is_empty() {
            if !self.deactivated.is_empty() {
                self.reset();
                out.push(Decision::ResetAll { reason: ResetReason::PinnedThreads });
            }
            self.phase = Phase::Unsettled;
            return out;
        }
        match std::mem::replace(&mut self.phase, Phase::Unsettled) {
            Phase::Probing { cpu, before } => {
                // A utilization drop is a slowdown only if the workload's progress (its
                // synchronization rate) dropped too: a time-paced workload uses less CPU once
                // its wakeups stop crossing vCPUs, which is the point of consolidating.
                // Judged against the set before this step and (`measured`) against every vCPU:
                // steps each under the margin must not add up to a loss (streamcluster next to a
                // co-runner lost 2-5% a step, 16 vCPUs down to 12: docs/sim.md, "Where
                // consolidation pays").
                let keep = 1.0 - self.params.rollback_drop;
                let fell = |from: &Metrics, util_keep: f64, sync_keep: f64| {
                    from.util >= self.params.min_util
                        && m.util < from.util * util_keep
                        && (from.sync_rate == 0.0 || m.sync_rate < from.sync_rate * sync_keep)
                };
                // Against every vCPU no margin but chance (any less CPU): sync rates a period
                // apart on a steady workload differ by about their counts' Poisson noise.
                let below_whole =
                    self.whole.as_ref().is_some_and(|w| fell(w, 1.0, 1.0 - crate::retention::governor::progress_noise(w.s_work, m.s_work)));
                let dropped = fell(&before, keep, keep) || below_whole;
                // A vCPU pushed past the major-change threshold is overloaded (the paper's
                // "100%"): keeping the set would only trigger a reset next period.
                let saturated = m.max_vcpu_util > self.params.busy_threshold;
                if dropped || saturated {
                    self.restore(cpu, &mut out);
                    self.lower_factor(&before, saturated, &mut out);
                    self.last.rho = self.params.rho;
                    self.last.eta = self.params.eta;
                    // The rolled-back set is the one that produced `before`.
                    self.phase = Phase::Steady { reference: before };
                } else {
                    self.phase = Phase::Steady { reference: m };
                    self.try_consolidate(&m, &mut out);
                }
            }
            Phase::Unsettled => {
                self.phase = Phase::Steady { reference: m };
                // A start's first period (the workload starting up) or a period on a set just
                // given back is the whole set's reference, not yet a basis for a step.
                if !self.params.measured {
                    self.try_consolidate(&m, &mut out);
                }
            }
            Phase::Steady { reference } => {
                if let Some(reason) = self.major_change(&reference, &m) {
                    if self.deactivated.is_empty() {
                        // Everything is active already: just adopt the new reference.
                        self.phase = Phase::Steady { reference: m };
                    } else {
                        self.deactivated.clear();
                        self.active = self.all.clone();
                        out.push(Decision::ResetAll { reason });
                        self.phase = Phase::Unsettled;
                    }
                } else {
                    self.phase = Phase::Steady { reference };
                    self.try_consolidate(&m, &mut out);
                }
            }
        }
        out
    }

    /// Gives every vCPU back, saying so when some were taken (the guest loop's reason).
    pub fn reset_with(&mut self, reason: ResetReason) -> Vec<Decision> {
        let had = !self.deactivated.is_empty();
        self.reset();
        if had {
            vec![Decision::ResetAll { reason }]
        } else {
            Vec::new()
        }
    }

    /// Gives every vCPU back (used when the environment resets on its own, e.g. on error).
    pub fn reset(&mut self) {
        self.deactivated.clear();
        self.active = self.all.clone();
        self.phase = Phase::Unsettled;
    }

    fn restore(&mut self, cpu: u32, out: &mut Vec<Decision>) {
        if let Some(pos) = self.deactivated.iter().rposition(|&c| c == cpu) {
            self.deactivated.remove(pos);
        }
        if !self.active.contains(&cpu) {
            self.active.push(cpu);
            self.active.sort_unstable();
        }
        out.push(Decision::Restore { cpu });
    }

    fn lower_factor(&mut self, before: &Metrics, saturated: bool, out: &mut Vec<Decision>) {
        let (Some(l_comp), Some(g_comp), Some(l_idle)) = (before.l_comp_ns, before.g_comp_ns, before.l_idle_ns) else {
            return;
        };
        if l_idle <= 0.0 {
            return;
        }
        if saturated {
            let from = self.params.eta;
            let to = 0.9 * from.min(g_comp / l_idle);
            self.params.eta = to.max(f64::MIN_POSITIVE);
            out.push(Decision::SetEta { from, to: self.params.eta });
        } else {
            let n_minus_1 = before.active.saturating_sub(1).max(1) as f64;
            let from = self.params.rho;
            let to = 0.9 * from.min(l_comp / (n_minus_1 * l_idle));
            self.params.rho = to.max(f64::MIN_POSITIVE);
            out.push(Decision::SetRho { from, to: self.params.rho });
        }
    }

    fn major_change(&self, reference: &Metrics, m: &Metrics) -> Option<ResetReason> {
        let p = &self.params;
        if m.max_vcpu_util > p.busy_threshold {
            return Some(ResetReason::BusyVcpu);
        }
        let base = reference.util.max(1e-9);
        let significant = reference.util.max(m.util) >= p.min_util;
        if significant && (m.util - reference.util).abs() / base > p.util_change && reference.util > 0.0 {
            return Some(ResetReason::UtilizationChange);
        }
        if let (true, Some(g0), Some(g1)) = (significant, reference.g_comp_ns, m.g_comp_ns) {
            if g0 > 0.0 && (g1 > g0 * p.gcomp_change || g1 < g0 / p.gcomp_change) {
                return Some(ResetReason::GranularityChange);
            }
        }
        None
    }

    /// Section 5's two conditions, as a pure predicate on one period's measurements.
    pub fn may_consolidate(params: &Params, m: &Metrics) -> bool {
        let n = m.active;
        if n <= params.min_active {
            return false;
        }
        // An (almost) idle workload has nothing to overload; its vCPUs may go. It also gives
        // few idle periods to count once retention keeps the vCPUs from halting.
        if m.util < params.min_util {
            return true;
        }
        if m.s_yield < params.min_idle_periods {
            return false;
        }
        let (Some(l_comp), Some(l_idle)) = (m.l_comp_ns, m.l_idle_ns) else { return false };
        // A workload that never switched has unbounded granularity: never consolidate it.
        let Some(g_comp) = m.g_comp_ns else { return m.util == 0.0 };
        let cond1 = l_comp <= params.rho * (n - 1) as f64 * l_idle;
        let cond2 = g_comp <= (params.eta * l_idle).min(params.min_time_slice_ns as f64);
        cond1 && cond2
    }

    fn try_consolidate(&mut self, m: &Metrics, out: &mut Vec<Decision>) {
        if !Self::may_consolidate(&self.params, m) {
            return;
        }
        // Deactivate the highest-numbered active vCPU: deterministic, and it keeps CPU 0
        // (where interrupts usually land) in the set.
        let Some(&cpu) = self.active.last() else { return };
        self.active.retain(|&c| c != cpu);
        self.deactivated.push(cpu);
        out.push(Decision::Deactivate { cpu });
        self.phase = Phase::Probing { cpu, before: *m };
    }
}

#[cfg(test)]
mod tests;
