//! The scheduler tracer as the agent runs it: the in-kernel eBPF programs of
//! [`gleaner_os::bpf::WakeTracer`] on the workload's processes, attached for a slice of some
//! periods only, so that their cost stays near [`COST_SHARE`] of a vCPU.
//!
//! Two costs bound how it runs. The programs sit in the scheduler's path (0.1-0.5 us per
//! event here): a ping-pong traced all the time ran 20% slower. And attaching or detaching a
//! raw tracepoint patches kernel text, which interrupts every CPU (`smp_text_poke`): doing it
//! every period took a third of the agent's CPU and showed in the workload's tail latency. So
//! a traced period is one in [`EVERY`] (the planner keeps its smoothed idle periods between
//! them) plus the ones the governor compares (the periods around a probe), and of each only
//! the first `slice`, sized from the programs' measured cost:
//!
//! ```text
//!  start       load (root; verifier) + BPF run-time statistics on (kept on: toggling them
//!              patches kernel text too)
//!  arm_next    traced next period if the guest loop needs it now (the governor compares it,
//!              the workload is new or changed its rate) or it is the EVERY-th, never while
//!              the plan is forced (a saturated VM halts whatever a trace shows): the managed
//!              processes refreshed (the cgroup's, or the command's tree), attach
//!  slice       how long to stay attached: COST_SHARE x period x EVERY x SANDWICH / cost
//!              while attached (MIN_SLICE .. the period)
//!  end_slice   detach
//!  read_period read (cumulative) - last read = the slice's trace; the programs' run time
//!              over it sets the next slices
//! ```
//!
//! Where the tracer cannot run (not root, BPF unavailable, a verifier refusal) the note says
//! why, and the guest loop estimates idle periods from cpuidle counters instead.

use std::time::Duration;

use gleaner_os::bpf::{ProgStats, StatsGuard, TracerConfig, WakeTracer};
use gleaner_os::cpuset::CpuSet;
use gleaner_os::idle::IdleOffer;
use gleaner_policy::guest::TraceNeed;
use gleaner_policy::idle::WakeTrace;

use crate::config::AgentConfig;

/// The tracer's cost, about, as a share of one vCPU.
pub const COST_SHARE: f64 = 0.005;
/// One period in this many is traced for the planner.
pub const EVERY: u64 = 5;
/// Traced periods the governor adds, at most, per EVERY periods (3 around each probe, which
/// come every 4 periods at the most frequent: 3 x 5 / 6).
const SANDWICH: f64 = 3.5;
/// The shortest slice traced.
pub const MIN_SLICE: Duration = Duration::from_millis(5);

/// The tracer of one run (module documentation).
#[derive(Debug)]
pub struct Tracing {
    tracer: Option<WakeTracer>,
    _stats: Option<StatsGuard>,
    note: Option<String>,
    /// The cumulative trace at the last read.
    last: Option<WakeTrace>,
    last_stats: Option<ProgStats>,
    /// The programs' cost while attached, as a share of one vCPU (`None` before measured).
    attached_share: Option<f64>,
    /// Periods since the tracer was armed for the planner.
    since: u64,
    /// The programs' run time so far, ns.
    cost_ns: u64,
    /// Periods traced.
    traced: u64,
}

impl Tracing {
    /// Loads the tracer and attaches it for the first period, or says why not (`cfg.trace`
    /// off, not root, BPF unavailable).
    pub fn start(cfg: &AgentConfig, cpus: &CpuSet, offer: Option<&IdleOffer>, root: bool) -> Self {
        let mut me = Self {
            tracer: None,
            _stats: None,
            note: None,
            last: None,
            last_stats: None,
            attached_share: None,
            since: 0,
            cost_ns: 0,
            traced: 0,
        };
        if !cfg.retention {
            me.note = Some("retention off".into());
            return me;
        }
        if !cfg.trace {
            me.note = Some("off (--no-trace)".into());
            return me;
        }
        if !root {
            me.note = Some("not root (eBPF needs CAP_BPF and CAP_PERFMON)".into());
            return me;
        }
        let tc = TracerConfig { cpus: cpus.clone(), poll_state: offer.and_then(|o| o.poll_state) };
        match WakeTracer::load(&tc) {
            Ok(t) => {
                // Without statistics the slice stays at its shortest.
                me._stats = WakeTracer::enable_stats().ok();
                me.last = t.read().ok();
                me.tracer = Some(t);
            }
            Err(e) => me.note = Some(format!("{e:#}")),
        }
        me
    }

    /// Why there is no tracer, if there is none.
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    /// The programs' run time so far, ns, and the periods traced.
    pub fn cost(&self) -> (u64, u64) {
        (self.cost_ns, self.traced)
    }

    /// Follows `pids` (the workload's processes), or every task when there is no workload.
    fn follow(t: &mut WakeTracer, pids: &[i32], workload: bool) {
        let r = if workload { t.set_managed(pids) } else { t.track_all(true) };
        if let Err(e) = r {
            tracing::warn!("tracer: following the workload's processes: {e:#}");
        }
    }

    /// How long to stay attached in a period of `period` (zero: not traced this period).
    pub fn slice(&self, period: Duration) -> Duration {
        if !self.tracer.as_ref().is_some_and(WakeTracer::attached) {
            return Duration::ZERO;
        }
        let want = match self.attached_share {
            Some(c) if c > 0.0 => period.mul_f64((COST_SHARE * EVERY as f64 / (1.0 + SANDWICH) / c).min(1.0)),
            Some(_) => period,
            None if self._stats.is_some() => MIN_SLICE.max(period / 10),
            None => MIN_SLICE,
        };
        want.clamp(MIN_SLICE.min(period), period)
    }

    /// The slice is over: detach until the next traced period.
    pub fn end_slice(&mut self) {
        if let Some(t) = &mut self.tracer {
            t.detach();
        }
    }

    /// The period's trace (the slice traced in it, if one was), and the programs' cost over
    /// it, which sizes the next slices.
    pub fn read_period(&mut self) -> Option<WakeTrace> {
        let t = self.tracer.as_mut()?;
        t.detach();
        let now = t.read().ok()?;
        let delta = match &self.last {
            Some(l) => now.delta_since(l),
            None => now.clone(),
        };
        self.last = Some(now);
        if delta.traced_ns == 0 {
            return None;
        }
        self.traced += 1;
        if let (Some(s), Some(l)) = (t.prog_stats(), self.last_stats) {
            let d = s.delta_since(&l).run_time_ns;
            self.cost_ns += d;
            self.attached_share = Some(d as f64 / delta.traced_ns as f64);
        }
        Some(delta)
    }

    /// Arms the next period: traced if the guest loop needs it now, or at the tracer's own
    /// cadence (one period in [`EVERY`]), not at all when it says the plan does not depend on
    /// a trace; the managed processes are refreshed before attaching.
    pub fn arm_next(&mut self, pids: &[i32], workload: bool, need: TraceNeed) {
        let Some(t) = self.tracer.as_mut() else { return };
        self.since += 1;
        match need {
            TraceNeed::Skip => return,
            TraceNeed::Cadence if self.since < EVERY => return,
            TraceNeed::Cadence => self.since = 0,
            TraceNeed::Now => {}
        }
        Self::follow(t, pids, workload);
        if let Err(e) = t.attach() {
            tracing::warn!("tracer: attach: {e:#}");
        }
        self.last_stats = t.prog_stats();
    }

    /// Detaches (the programs and maps go with the tracer).
    pub fn stop(&mut self) {
        if let Some(t) = &mut self.tracer {
            t.detach();
        }
    }
}
