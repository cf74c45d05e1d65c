//! The scheduler tracer as the agent runs it: the in-kernel eBPF programs of
//! [`gleaner_os::bpf::WakeTracer`] on the workload's processes, attached for the first slice
//! of every period and detached for the rest, so that their cost stays under [`COST_SHARE`]
//! of a vCPU. The programs run in the scheduler's path (~0.1-0.5 us per event here): a
//! ping-pong traced all the time ran 20% slower; traced a slice of each period it is the
//! same in every period, so periods stay comparable for the governor.
//!
//! ```text
//!  start       load (root; verifier) + BPF run-time statistics on
//!  arm_next    attach; the managed processes refreshed (the cgroup's, or the command's tree)
//!  end_slice   detach after slice(period) = period x fraction
//!  read_period read (cumulative) - last read = the slice's trace; the programs' run time
//!              over the slice -> fraction = COST_SHARE / share traced (MIN_FRACTION .. 1)
//!  stop        detach; everything is released on drop
//! ```
//!
//! Where the tracer cannot run (not root, BPF unavailable, a verifier refusal) the note says
//! why, and the guest loop estimates idle periods from cpuidle counters instead.

use gleaner_os::bpf::{ProgStats, StatsGuard, TracerConfig, WakeTracer};
use gleaner_os::cpuset::CpuSet;
use gleaner_os::idle::IdleOffer;
use gleaner_policy::idle::WakeTrace;

use crate::config::AgentConfig;

/// The tracer's cost, at most, as a share of one vCPU.
pub const COST_SHARE: f64 = 0.005;
/// The smallest share of a period traced.
pub const MIN_FRACTION: f64 = 0.02;
/// The share traced where the cost cannot be measured (no BPF statistics).
pub const BLIND_FRACTION: f64 = 0.1;

/// The tracer of one run (module documentation).
#[derive(Debug)]
pub struct Tracing {
    tracer: Option<WakeTracer>,
    _stats: Option<StatsGuard>,
    note: Option<String>,
    /// The cumulative trace at the last read.
    last: Option<WakeTrace>,
    last_stats: Option<ProgStats>,
    /// Share of each period traced.
    fraction: f64,
    /// The programs' run time so far, ns.
    cost_ns: u64,
    /// Periods traced.
    traced: u64,
}

impl Tracing {
    /// Loads and attaches the tracer, or says why not (`cfg.trace` off, not root, BPF
    /// unavailable).
    pub fn start(cfg: &AgentConfig, cpus: &CpuSet, offer: Option<&IdleOffer>, root: bool) -> Self {
        let mut me = Self { tracer: None, _stats: None, note: None, last: None, last_stats: None, fraction: 1.0, cost_ns: 0, traced: 0 };
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
        let loaded = WakeTracer::load(&tc).and_then(|mut t| t.attach().map(|()| t));
        match loaded {
            Ok(t) => {
                // Statistics cost a clock read per program run; without them the tracer still
                // runs, a fixed share of each period.
                match WakeTracer::enable_stats() {
                    Ok(g) => me._stats = Some(g),
                    Err(_) => me.fraction = BLIND_FRACTION,
                }
                me.last = t.read().ok();
                me.last_stats = t.prog_stats();
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
    pub fn follow(&mut self, pids: &[i32], workload: bool) {
        let Some(t) = &mut self.tracer else { return };
        let r = if workload { t.set_managed(pids) } else { t.track_all(true) };
        if let Err(e) = r {
            tracing::warn!("tracer: following the workload's processes: {e:#}");
        }
    }

    /// How long to trace of a period of `period`.
    pub fn slice(&self, period: std::time::Duration) -> std::time::Duration {
        if self.tracer.as_ref().is_some_and(WakeTracer::attached) {
            period.mul_f64(self.fraction.clamp(0.0, 1.0))
        } else {
            std::time::Duration::ZERO
        }
    }

    /// The slice is over: detach until [`Self::arm_next`].
    pub fn end_slice(&mut self) {
        if let Some(t) = &mut self.tracer {
            t.detach();
        }
    }

    /// The period's trace (the slice traced in it), and the programs' cost over it, which
    /// sets the next slices.
    pub fn read_period(&mut self) -> Option<WakeTrace> {
        let t = self.tracer.as_mut()?;
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
            let share = d as f64 / delta.traced_ns as f64;
            self.fraction = if share > 0.0 { (COST_SHARE / share).clamp(MIN_FRACTION, 1.0) } else { 1.0 };
            self.last_stats = Some(s);
        }
        Some(delta)
    }

    /// Attaches for the next period's slice and follows the workload's current processes.
    pub fn arm_next(&mut self, pids: &[i32], workload: bool) {
        let Some(t) = self.tracer.as_mut() else { return };
        if !t.attached() {
            if let Err(e) = t.attach() {
                tracing::warn!("tracer: attach: {e:#}");
            }
        }
        self.last_stats = t.prog_stats();
        self.follow(pids, workload);
    }

    /// Detaches (the programs and maps go with the tracer).
    pub fn stop(&mut self) {
        if let Some(t) = &mut self.tracer {
            t.detach();
        }
    }
}
