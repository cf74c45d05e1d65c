//! The guest loop's priors: every number the loop starts from or bounds itself by, in one
//! typed configuration (`[priors]` in the agent's configuration file). Each field says what
//! it does and, in one line, why its default is what it is; the measurements behind the
//! defaults are in docs/idle-policy.md ("Priors"). The ones that shape a plan (the saturation
//! shares) choose the first plan, not the last: the ladder's probes of Wide, which ignores
//! them, check them on the workload in front of the loop.

use serde::{Deserialize, Serialize};

use crate::input::BadInput;

/// The guest loop's priors (module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoopPriors {
    /// Below this share of the managed vCPUs' time left idle (smoothed), Planned has no
    /// kernel polling: what polling can win is bounded by the idle time there is.
    pub saturated_idle_share: f64,
    /// Below this share left idle, Planned has no yielding threads: a `SCHED_IDLE` yielder
    /// keeps its vCPU from the new-idle balance and takes the run queue's lock the wakers need.
    pub saturated_yield_idle_share: f64,
    /// While vCPUs poll, consolidation runs only while the workload's own CPU time is at most
    /// this many vCPUs: a light workload on one polling vCPU never wakes across vCPUs, a
    /// busier one queues.
    pub poll_consolidation_util: f64,
    /// Sync points a second under which the workload is quiet: it has no wakeups to buy.
    pub quiet_rate: f64,
    /// A workload quiet this long before it was seen gives up the start plan and halts, ns:
    /// long enough for a server started before its client (sockperf's harness waits 0.5 s).
    pub quiet_start_ns: u64,
    /// The first period's length, a share of the period: the start plan is a guess and the
    /// first reading replaces it.
    pub first_period_share: f64,
    /// A probe period's length, a share of the period: it runs the level believed worse.
    pub probe_share: f64,
    /// Periods the plan must hold before periods lengthen to `calm_period_share`: every
    /// period's end costs a busy server a few requests (the agent's work).
    pub calm_periods: u32,
    /// A calm period's length, a share of the period.
    pub calm_period_share: f64,
    /// The share of a vCPU the agent's own period work may take before the periods
    /// lengthen: half of the 1% the agent may cost, the tracer's budget being the other half.
    pub agent_work_share: f64,
    /// The longest a period is lengthened for the agent's own cost, a multiple of the
    /// period: the loop still sees a changed workload within seconds.
    pub max_period_stretch: f64,
    /// The most sync points a second per active vCPU at which the agent's period work runs
    /// `SCHED_IDLE`: above it, the wakeups that preempt it would chop it into hundreds of
    /// pieces and cost the workload the interrupts.
    pub background_max_rate: f64,
    /// The longest stretch of the agent's period work between two points where it lets a
    /// woken thread run, ns: a wakeup is checked against the running task once, and a
    /// period's work (0.5-1 ms) outlasts the protected slice.
    pub agent_pace_ns: u64,
    /// The share of a traced period's sync points made by processes the trace did not follow
    /// from which the trace is set aside: a trace without the client plans a server alone.
    pub trace_missed_share: f64,
    /// Traces set aside in a row at most: a workload that keeps starting processes is then
    /// planned from what the tracer follows.
    pub max_set_aside: u32,
    /// Sync points a second below which a change of the workload's rate does not ask for a
    /// trace: a quiet workload's rate moves twofold by chance.
    pub min_rate_change: f64,
    /// The most an idle period seen whole in a tracer slice counts for the ones the slice
    /// cut (`Log2Hist::seen_whole_in`): a long gap in a short slice is mostly a guess.
    pub slice_max_weight: f64,
    /// A vCPU's haltpoll window is stale once its polling past the plan's estimate reaches
    /// this share of a vCPU ([`super::WindowReset`]): below it, a shrink costs more than it saves.
    pub stale_window_excess: f64,
    /// Steal above this share of a period in which retention spent above it halves that
    /// vCPU's budget: the host stops a VM that holds its pCPUs polling.
    pub steal_share: f64,
    /// ... and above this much steal, ns, whatever the period: `/proc/stat` counts steal in
    /// 10 ms ticks, so one or two ticks are rounding; the stalls the rule is for took ~100 ms.
    pub steal_min_ns: u64,
    /// Per steal-free period, a budget cut for steal grows back by this factor (about 7 s
    /// to double at the default 200 ms period).
    pub steal_recovery: f64,
}

impl Default for LoopPriors {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl LoopPriors {
    /// The defaults (each field's documentation gives its reason).
    pub const DEFAULT: LoopPriors = LoopPriors {
        saturated_idle_share: 0.02,
        saturated_yield_idle_share: 0.25,
        poll_consolidation_util: 0.15,
        quiet_rate: 10.0,
        quiet_start_ns: 1_000_000_000,
        first_period_share: 0.25,
        probe_share: 0.25,
        calm_periods: 5,
        calm_period_share: 2.5,
        agent_work_share: 0.005,
        max_period_stretch: 10.0,
        background_max_rate: 5_000.0,
        agent_pace_ns: 50_000,
        trace_missed_share: 0.1,
        max_set_aside: 3,
        min_rate_change: 100.0,
        slice_max_weight: 4.0,
        stale_window_excess: 0.05,
        steal_share: 0.02,
        steal_min_ns: 30_000_000,
        steal_recovery: 1.02,
    };

    /// Every value inside its range, or the first that is not: its key (`priors.NAME`), the
    /// value and what is allowed.
    pub fn validate(&self) -> Result<(), BadInput> {
        let share = |key: &str, x: f64, allowed: &str| -> Result<(), BadInput> {
            if x.is_finite() && (0.0..=1.0).contains(&x) {
                Ok(())
            } else {
                Err(BadInput::new(format!("priors.{key}"), x, allowed))
            }
        };
        share("saturated_idle_share", self.saturated_idle_share, "a share of the vCPUs' time in [0, 1] (0: never saturated)")?;
        share("saturated_yield_idle_share", self.saturated_yield_idle_share, "a share of the vCPUs' time in [0, 1]")?;
        share("trace_missed_share", self.trace_missed_share, "a share of the sync points in [0, 1]")?;
        share("stale_window_excess", self.stale_window_excess, "a share of a vCPU in [0, 1]")?;
        share("steal_share", self.steal_share, "a share of a period in [0, 1]")?;
        share("agent_work_share", self.agent_work_share, "a share of a vCPU in [0, 1]")?;
        let within = |key: &str, x: f64, lo: f64, hi: f64, allowed: &str| -> Result<(), BadInput> {
            if x.is_finite() && x >= lo && x <= hi {
                Ok(())
            } else {
                Err(BadInput::new(format!("priors.{key}"), x, allowed))
            }
        };
        within("poll_consolidation_util", self.poll_consolidation_util, 0.0, 1024.0, "vCPUs in [0, 1024] (0: never while polling)")?;
        within("quiet_rate", self.quiet_rate, 0.0, 1e9, "sync points a second in [0, 1e9]")?;
        within("first_period_share", self.first_period_share, 0.05, 1.0, "a share of the period in [0.05, 1]")?;
        within("probe_share", self.probe_share, 0.05, 1.0, "a share of the period in [0.05, 1]")?;
        within("calm_period_share", self.calm_period_share, 1.0, 10.0, "a multiple of the period in [1, 10]")?;
        within("max_period_stretch", self.max_period_stretch, 1.0, 100.0, "a multiple of the period in [1, 100]")?;
        within("background_max_rate", self.background_max_rate, 0.0, 1e9, "sync points a second per vCPU in [0, 1e9]")?;
        within("min_rate_change", self.min_rate_change, 0.0, 1e9, "sync points a second in [0, 1e9]")?;
        within("slice_max_weight", self.slice_max_weight, 1.0, 1e3, "a weight in [1, 1000]")?;
        within("steal_recovery", self.steal_recovery, 1.0, 2.0, "a factor in [1, 2]")?;
        let ns = |key: &str, x: u64, hi: u64, allowed: &str| -> Result<(), BadInput> {
            if x <= hi {
                Ok(())
            } else {
                Err(BadInput::new(format!("priors.{key}"), x, allowed))
            }
        };
        ns("quiet_start_ns", self.quiet_start_ns, 3_600_000_000_000, "0..=3600000000000 (ns, an hour)")?;
        ns("agent_pace_ns", self.agent_pace_ns, 1_000_000_000, "0..=1000000000 (ns; 0: step aside at every point)")?;
        ns("steal_min_ns", self.steal_min_ns, 60_000_000_000, "0..=60000000000 (ns)")?;
        if !(1..=1000).contains(&self.calm_periods) {
            return Err(BadInput::new("priors.calm_periods", self.calm_periods, "1..=1000 (periods)"));
        }
        if self.max_set_aside > 1000 {
            return Err(BadInput::new("priors.max_set_aside", self.max_set_aside, "0..=1000 (traces)"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_a_bad_value_names_its_key() {
        assert_eq!(LoopPriors::default().validate(), Ok(()));
        let bad = LoopPriors { probe_share: 2.0, ..LoopPriors::default() }.validate().unwrap_err();
        assert_eq!(bad.what, "priors.probe_share");
        assert_eq!(bad.value, "2");
        let bad = LoopPriors { saturated_idle_share: f64::NAN, ..LoopPriors::default() }.validate().unwrap_err();
        assert_eq!(bad.what, "priors.saturated_idle_share");
        let bad = LoopPriors { calm_periods: 0, ..LoopPriors::default() }.validate().unwrap_err();
        assert_eq!(bad.what, "priors.calm_periods");
    }

    #[test]
    fn a_partial_table_keeps_the_other_defaults_and_an_unknown_key_is_refused() {
        let p: LoopPriors = serde_json::from_str(r#"{"quiet_rate": 20.0}"#).unwrap();
        assert_eq!(p, LoopPriors { quiet_rate: 20.0, ..LoopPriors::default() });
        assert!(serde_json::from_str::<LoopPriors>(r#"{"quiet": 1}"#).is_err());
    }
}
