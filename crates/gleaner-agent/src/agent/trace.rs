//! The scheduler tracer as the agent runs it: the in-kernel eBPF programs of
//! [`gleaner_os::bpf::WakeTracer`] on the workload's processes, attached for a slice of some
//! periods only, so that their cost stays near [`COST_SHARE`] of a vCPU.
//!
//! Two costs bound how it runs. The programs sit in the scheduler's path (0.1-0.5 us per
//! event here): a ping-pong traced all the time ran 20% slower. And attaching or detaching a
//! raw tracepoint patches kernel text, which interrupts every CPU (`smp_text_poke`): doing it
//! every period took a third of the agent's CPU (a latency server's p99 was suspected too,
//! but alternated runs could not tell detaching at each slice from pausing: 45.3 against
//! 50.8 us on sockperf under load, p99s ranging 24-781 us). So a traced
//! period is one in [`EVERY`] (the planner keeps its smoothed idle periods between them) plus
//! the ones the governor compares (the periods around a probe), and of each only the first
//! `slice`, sized from the programs' measured cost; between slices the programs stay attached
//! but paused (their epoch 0: they return at their first test) while that costs at most
//! [`RESIDENT_SHARE`] of a vCPU, and are detached otherwise (a workload switching so often
//! that even a paused program's lookup per event counts):
//!
//! ```text
//!  start       load (root; verifier) + BPF run-time statistics on (kept on: toggling them
//!              patches kernel text too)
//!  arm_next    traced next period if the guest loop needs it now (the governor compares it,
//!              the workload is new, changed its rate or was moved by consolidation) or it
//!              is the EVERY-th, never while
//!              the plan is forced (a saturated VM halts whatever a trace shows: detached
//!              then): the managed processes refreshed (the cgroup's, or the command's
//!              tree), attach (or resume, when paused)
//!  slice       how long to count: (COST_SHARE - paused cost) x period x EVERY / (1 +
//!              SANDWICH) / cost while counting (the last slice's, or the last seen event
//!              rate at the last slice's cost per event where higher), and no more than that at the workload's last
//!              rate of sync points x SYNC_POINT_COST_NS (before a rate, at most
//!              MAX_SLICE_GROWTH times the last slice); the first slice MIN_SLICE, then on
//!              through the (short) first period as far as the cost measured over those
//!              allows (slice_more), the second MIN_SLICE (the first period's rate is a
//!              start-up's); MIN_SLICE .. the period
//!  end_slice   pause (resident) or detach; detach for cost at once where the slice's event
//!              rate says the paused programs would cost over RESIDENT_SHARE
//!  read_period read (cumulative) - last read = the slice's trace; the programs' run time
//!              over it sets the next slices
//!  each period the paused programs' cost over it: above RESIDENT_SHARE, detach, and detach
//!              at each slice's end for the next RETRY_SLICES slices (doubling at each
//!              detach for cost), then until a slice's event rate says pausing fits
//! ```
//!
//! Where the tracer cannot run (not root, BPF unavailable, a verifier refusal) the note says
//! why, and the guest loop estimates idle periods from cpuidle counters instead.

use std::time::{Duration, Instant};

use gleaner_os::bpf::{ProgStats, StatsGuard, TracerConfig, WakeTracer};
use gleaner_os::cpuset::CpuSet;
use gleaner_os::idle::IdleOffer;
use gleaner_policy::guest::TraceNeed;
use gleaner_policy::idle::WakeTrace;

use crate::config::AgentConfig;
use crate::status::TracerUse;

/// The tracer's cost, about, as a share of one vCPU.
pub const COST_SHARE: f64 = 0.005;
/// One period in this many is traced for the planner.
pub const EVERY: u64 = 5;
/// Traced periods the governor adds, at most, per EVERY periods (3 around each probe, which
/// come every 4 periods at the most frequent: 3 x 5 / 6).
const SANDWICH: f64 = 3.5;
/// The shortest slice traced.
pub const MIN_SLICE: Duration = Duration::from_millis(5);

/// Where the workload's rate is not known yet, a slice is at most this many times the last
/// one (where it is, the rate bounds it: [`slice_for`]): a cost measured at a lower event rate
/// understates the next. The first slices come while the workload is starting, read as
/// nearly free, and made the next slice a whole period at its full rate (redis with one
/// connection: a 200 ms slice of ~18,500 wakeups, its p99 1.3x haltpoll's over 7 alternated
/// rounds, 1.0x with `--no-trace`); growing step by step, each slice is measured at the rate
/// it will see. (Ignoring costs measured over few events instead kept a slow workload's
/// slices at a tenth of the period for good.)
pub const MAX_SLICE_GROWTH: u32 = 2;
/// The most the programs may cost while paused between slices, as a share of one vCPU, for
/// them to stay attached; it comes out of [`COST_SHARE`], so the slices shorten.
pub const RESIDENT_SHARE: f64 = COST_SHARE / 2.0;

/// `ns` of CPU over `wall`, as a share of one vCPU.
fn share_of(ns: u64, wall: Duration) -> f64 {
    ns as f64 / wall.as_nanos().max(1) as f64
}

/// The tracer of one run (module documentation).
#[derive(Debug)]
pub struct Tracing {
    tracer: Option<WakeTracer>,
    _stats: Option<StatsGuard>,
    note: Option<String>,
    /// The cumulative trace at the last read.
    last: Option<WakeTrace>,
    /// The programs' cost while attached, as a share of one vCPU (`None` before measured).
    attached_share: Option<f64>,
    /// Periods since the tracer was armed for the planner.
    since: u64,
    /// Periods traced.
    traced: u64,
    /// Stay attached, paused, between slices (module documentation).
    resident: bool,
    /// The programs' statistics at load.
    at_load: Option<ProgStats>,
    /// ... when the slice began, and when.
    at_resume: Option<ProgStats>,
    resumed_at: Option<Instant>,
    /// The scheduler's event rate the programs last saw, a second (a paused stretch's or a
    /// slice's), and what counting costs per event, ns (the last slice's): together what the
    /// next slice will cost ([`Self::slice`]).
    event_rate: Option<f64>,
    counting_ns_per_run: Option<f64>,
    /// ... when the paused stretch began or was last measured, and when.
    at_pause: Option<(Instant, ProgStats)>,
    /// What the last slice cost.
    slice_cost: Option<ProgStats>,
    /// How long the last slice counted.
    last_slice: Option<Duration>,
    /// The paused programs' cost as a share of a vCPU, and per event, ns (the last paused
    /// stretch's).
    paused_share: f64,
    paused_ns_per_run: Option<f64>,
    /// Slices traced since the paused programs were last detached for their cost.
    detached_slices: u64,
    /// Times they were.
    cost_detaches: u64,
    /// The workload's processes the programs were last armed with (`None`: every task
    /// counted, or not armed yet).
    armed: Option<std::collections::BTreeSet<i32>>,
    /// What to load the programs with, until the guest loop first asks for a trace
    /// ([`Self::arm_next`]): a run the loop never traces (a short or saturated one) pays
    /// nothing for the tracer, whose load, statistics switch and first attach take ~7 ms of
    /// the agent's CPU here.
    pending: Option<TracerConfig>,
}

/// Detached for their cost, the programs are paused again after this many slices (doubled at
/// each detach for cost, up to 32 times), in case the workload calmed down, and only if the
/// last slice's event rate says pausing would fit ([`pausing_fits`]). If not, the retry costs
/// one period of paused programs: they are detached at its end instead of at the slice's end,
/// no more attachments than detaching at once. (Retrying every 8 slices, a sockperf
/// ping-pong's tracer cost 0.37-0.72% of a vCPU, against 0.27-0.35% detaching each slice.)
const RETRY_SLICES: u64 = 8;

/// What tracing costs per sync point of the workload (a voluntary context switch), ns: a
/// guess, high, for sizing a slice at the workload's rate before the programs' cost was
/// measured at it (a sync point is a wakeup, two switches and a cpuidle event or two, at
/// 0.1-0.5 us each here).
pub const SYNC_POINT_COST_NS: f64 = 2_000.0;

/// How long to count in a period of `period`: what the budget left by the paused programs'
/// cost (`paused_share`) allows at the measured cost while counting (`attached_share`), and no
/// more than it allows at the workload's last rate of sync points (`rate`, a second) at
/// [`SYNC_POINT_COST_NS`] each. Before the first rate (the first period, which is short) the
/// whole period where the cost can be measured (`stats`), [`MIN_SLICE`] where not; a rate of
/// zero bounds nothing; without a rate after the first slice, at most [`MAX_SLICE_GROWTH`]
/// times the last slice. While the workload is `starting` (the rate is its first, short period's),
/// [`MIN_SLICE`]: the rate to come is unknown, and a command's client starts in the next
/// period.
///
/// Why the rate, not growth. A slice's cost measured at a lower event rate understates the
/// next (the first slices come while the workload starts), so slices used to grow at most
/// twofold from a tenth of the first period: 5, 10, 20, 40 ms. But a slice sees an idle
/// period only if it began and ended inside it, so a light workload's long idle periods, the
/// ones halting makes dear, went unseen for its first 0.7 s (docs/idle-policy.md, "The
/// tracer's slices"). The last period's rate bounds a busy workload's slices from its first
/// measured period on, growth or not.
fn slice_for(
    period: Duration,
    paused_share: f64,
    attached_share: Option<f64>,
    stats: bool,
    last: Option<Duration>,
    rate: Option<f64>,
    starting: bool,
) -> Duration {
    // What the paused programs cost comes out of the budget (at most half of it).
    let budget = COST_SHARE - paused_share.min(RESIDENT_SHARE);
    let allowed = |cost_share: f64| {
        if cost_share > 0.0 {
            period.mul_f64((budget * EVERY as f64 / (1.0 + SANDWICH) / cost_share).min(1.0))
        } else {
            period
        }
    };
    let want = match attached_share {
        Some(c) => allowed(c),
        None if stats => period,
        None => MIN_SLICE,
    };
    let cap = match (rate, last) {
        _ if starting => MIN_SLICE,
        (Some(r), _) => allowed(r * SYNC_POINT_COST_NS / 1e9),
        (None, Some(l)) => l * MAX_SLICE_GROWTH,
        (None, None) => period,
    };
    want.min(cap).clamp(MIN_SLICE.min(period), period)
}

/// What is left of the first slice, `counted` into it: as much as the budget allows at the
/// cost measured over those first [`MIN_SLICE`] (`share` of a vCPU), up to the whole (short)
/// first period. Nothing is known before it (no rate, no paused stretch, not a start-up's
/// rate yet), so the budget is [`slice_for`]'s with the measured share alone. The first slice
/// used to be the whole period, sized before any cost was known: a ping-pong started with the
/// agent (counting at 23% of a vCPU) was counted for 51 ms, its tracer's CPU 14.5 ms of a 3 s
/// run (4.7 ms now). A light workload, whose first slice costs next to nothing, is still
/// counted through the period, where its few long idle periods can be seen.
fn first_slice_rest(period: Duration, counted: Duration, share: f64) -> Duration {
    slice_for(period, 0.0, Some(share), true, None, None, false).saturating_sub(counted)
}

/// Slices to wait, detached, before pausing again after `detaches` detaches for cost.
fn retry_after(detaches: u64) -> u64 {
    RETRY_SLICES << detaches.saturating_sub(1).min(5)
}

/// What a paused program costs per event before one was measured, ns (measured here: 58-80,
/// BPF run-time statistics included; `scripts/bench/tracer-cost.sh`).
const PAUSED_NS_GUESS: f64 = 80.0;

/// Would the programs, paused, cost at most half of [`RESIDENT_SHARE`] at the event rate of
/// a slice (`runs` events counted in `traced_ns`), at `ns_per_run` each? The rate is doubled:
/// counting slows a switch storm down (a 0-think ping-pong), so its slices undercount what
/// the paused programs would see.
fn pausing_fits(runs: u64, traced_ns: u64, ns_per_run: Option<f64>) -> bool {
    let ns = 2.0 * runs as f64 * ns_per_run.unwrap_or(PAUSED_NS_GUESS);
    ns / traced_ns.max(1) as f64 <= RESIDENT_SHARE / 2.0
}

/// Would the programs, paused, cost more than [`RESIDENT_SHARE`] at `rate` scheduler events a
/// second, at `ns_per_run` each ([`PAUSED_NS_GUESS`] before measured)? What
/// `Tracing::check_paused` judges after a paused stretch, predicted from a slice's rate.
fn pausing_costs_too_much(rate: f64, ns_per_run: Option<f64>) -> bool {
    rate * ns_per_run.unwrap_or(PAUSED_NS_GUESS) / 1e9 > RESIDENT_SHARE
}

/// What counting will cost in the next slice, as a share of one vCPU: the last slice's
/// measured share (`attached_share`), or, where higher, the scheduler's last seen event rate
/// (`event_rate`, a second: a paused stretch's or a slice's) at the last slice's cost per
/// event (`ns_per_run`). A slice measured while the rate was lower understates the next one:
/// `sysbench threads` (8 threads yielding on 2 vCPUs, 0.7-1 M events a second, few of them
/// sync points) read 4% from its start-up slice, and its next slice counted 24-29 ms at 36%.
fn counting_share(attached_share: Option<f64>, event_rate: Option<f64>, ns_per_run: Option<f64>) -> Option<f64> {
    let at_rate = event_rate.zip(ns_per_run).map(|(r, ns)| r * ns / 1e9);
    match (attached_share, at_rate) {
        (Some(a), Some(r)) => Some(a.max(r)),
        (a, r) => a.or(r),
    }
}

impl Tracing {
    /// The tracer of a run: loaded when the guest loop first asks for a trace
    /// ([`Self::arm_next`]), or says why there is none (`cfg.trace` off, not root; a load
    /// that fails says so then).
    pub fn start(cfg: &AgentConfig, cpus: &CpuSet, offer: Option<&IdleOffer>, root: bool) -> Self {
        let mut me = Self {
            tracer: None,
            _stats: None,
            note: None,
            last: None,
            attached_share: None,
            since: 0,
            traced: 0,
            resident: false,
            at_load: None,
            at_resume: None,
            resumed_at: None,
            event_rate: None,
            counting_ns_per_run: None,
            at_pause: None,
            slice_cost: None,
            last_slice: None,
            paused_share: 0.0,
            paused_ns_per_run: None,
            detached_slices: 0,
            cost_detaches: 0,
            armed: None,
            pending: None,
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
        me.pending = Some(TracerConfig { cpus: cpus.clone(), poll_state: offer.and_then(|o| o.poll_state) });
        me
    }

    /// Loads the programs now, if they wait to be ([`Self::pending`]); a failure is the note.
    fn load(&mut self) {
        let Some(tc) = self.pending.take() else { return };
        match WakeTracer::load(&tc) {
            Ok(t) => {
                // Without statistics the slice stays at its shortest.
                self._stats = WakeTracer::enable_stats().ok();
                // Pausing instead of detaching only where its cost can be measured.
                self.resident = self._stats.is_some();
                self.last = t.read().ok();
                self.at_load = t.prog_stats();
                self.tracer = Some(t);
            }
            Err(e) => {
                tracing::warn!("tracer: {e:#}; idle periods estimated from the cpuidle counters");
                self.note = Some(format!("{e:#}"));
            }
        }
    }

    /// The programs load when first asked for (a tracer that may still run counts as one).
    pub fn available(&self) -> bool {
        self.tracer.is_some() || self.pending.is_some()
    }

    /// Why there is no tracer, if there is none.
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    /// What the tracer cost and did so far (`None`: no tracer).
    pub fn usage(&self) -> Option<TracerUse> {
        let t = self.tracer.as_ref()?;
        let cost = match (t.prog_stats(), self.at_load) {
            (Some(s), Some(l)) => s.delta_since(&l).run_time_ns,
            _ => 0,
        };
        Some(TracerUse {
            cpu_ns: cost,
            traced_periods: self.traced,
            attaches: t.attaches(),
            cost_detaches: self.cost_detaches,
            resident: self.resident,
        })
    }

    /// Follows `pids` (the workload's processes), or every task when there is no workload.
    fn follow(t: &mut WakeTracer, pids: &[i32], workload: bool) {
        let r = if workload { t.set_managed(pids) } else { t.track_all(true) };
        if let Err(e) = r {
            tracing::warn!("tracer: following the workload's processes: {e:#}");
        }
    }

    /// How long to count in a period of `period` (zero: not traced this period), the
    /// workload's last rate of sync points a second being `rate` (`None`: not measured yet),
    /// `starting` while that rate is a start-up's
    /// ([`gleaner_policy::guest::GuestController::workload_starting`]). The first slice,
    /// before any cost was measured, is [`MIN_SLICE`] at first: what follows
    /// is for [`Self::slice_more`] to say, from its cost over those.
    pub fn slice(&self, period: Duration, rate: Option<f64>, starting: bool) -> Duration {
        if !self.tracer.as_ref().is_some_and(WakeTracer::counting) {
            return Duration::ZERO;
        }
        let attached = counting_share(self.attached_share, self.event_rate, self.counting_ns_per_run);
        let slice = slice_for(period, self.paused_share, attached, self._stats.is_some(), self.last_slice, rate, starting);
        if self.unmeasured() {
            slice.min(MIN_SLICE)
        } else {
            slice
        }
    }

    /// How much longer to count, `counted` into a slice of a period of `period` (zero: end
    /// it now). Only the first slice goes on ([`first_slice_rest`]); the others were sized
    /// whole by [`Self::slice`].
    pub fn slice_more(&self, period: Duration, counted: Duration) -> Duration {
        let Some(t) = self.tracer.as_ref().filter(|t| t.counting() && self.unmeasured()) else { return Duration::ZERO };
        let (Some(now), Some(at), Some(since)) = (t.prog_stats(), self.at_resume.as_ref(), self.resumed_at) else {
            return Duration::ZERO;
        };
        let share = share_of(now.delta_since(at).run_time_ns, since.elapsed());
        first_slice_rest(period, counted, share)
    }

    /// No slice's cost measured yet, and it can be (the run-time statistics are on).
    fn unmeasured(&self) -> bool {
        self.attached_share.is_none() && self.event_rate.is_none() && self._stats.is_some()
    }

    /// The slice is over: pause (resident) or detach until the next traced period.
    pub fn end_slice(&mut self) {
        let Some(t) = self.tracer.as_mut() else { return };
        if !t.counting() {
            return;
        }
        let s = t.prog_stats();
        self.slice_cost = s.zip(self.at_resume).map(|(s, r)| s.delta_since(&r));
        if let (Some(c), Some(at)) = (self.slice_cost, self.resumed_at) {
            let wall = at.elapsed();
            if wall >= Duration::from_millis(1) && c.run_cnt > 0 {
                let rate = c.run_cnt as f64 / wall.as_secs_f64();
                self.event_rate = Some(rate);
                self.counting_ns_per_run = c.ns_per_run();
                // A switch storm the paused programs would cost more than RESIDENT_SHARE in:
                // detach now rather than after a whole period of paying for them
                // (`check_paused` would, at its end). Counting slows a storm, so the slice's
                // rate understates the paused one: this errs towards pausing.
                if self.resident && pausing_costs_too_much(rate, self.paused_ns_per_run) {
                    tracing::debug!(
                        rate,
                        "tracer: the slice's event rate would make the paused programs cost too much; detaching between slices"
                    );
                    self.resident = false;
                    self.detached_slices = 0;
                    self.cost_detaches += 1;
                }
            }
        }
        if self.resident {
            t.pause();
            self.at_pause = s.map(|s| (Instant::now(), s));
        } else {
            t.detach();
            self.at_pause = None;
        }
    }

    /// Measures what the paused programs cost since the last measure; detaches them, and
    /// stops pausing, when that is above [`RESIDENT_SHARE`].
    fn check_paused(&mut self) {
        let Some(t) = self.tracer.as_mut() else { return };
        if !t.attached() || t.counting() {
            return;
        }
        let (Some((at, before)), Some(now)) = (self.at_pause, t.prog_stats()) else { return };
        let wall = at.elapsed();
        if wall < MIN_SLICE {
            return; // too short a stretch to judge a rate by: it goes on
        }
        self.at_pause = Some((Instant::now(), now));
        let d = now.delta_since(&before);
        if let Some(ns) = d.ns_per_run() {
            self.paused_ns_per_run = Some(ns);
        }
        self.event_rate = Some(d.run_cnt as f64 / wall.as_secs_f64());
        let share = share_of(d.run_time_ns, wall);
        self.paused_share = share;
        if share > RESIDENT_SHARE {
            tracing::debug!(
                share,
                wall_us = u64::try_from(wall.as_micros()).unwrap_or(u64::MAX),
                runs = d.run_cnt,
                ns = d.run_time_ns,
                "tracer: paused programs cost too much; detaching between slices"
            );
            self.resident = false;
            self.detached_slices = 0;
            self.cost_detaches += 1;
            self.detach_paused();
        }
    }

    /// Detaches the paused programs: nothing of the budget goes to them any more.
    fn detach_paused(&mut self) {
        if let Some(t) = self.tracer.as_mut() {
            t.detach();
        }
        self.at_pause = None;
        self.paused_share = 0.0;
    }

    /// The period's trace (the slice traced in it, if one was), and the programs' cost over
    /// it, which sizes the next slices.
    pub fn read_period(&mut self) -> Option<WakeTrace> {
        self.end_slice();
        let t = self.tracer.as_mut()?;
        // Nothing counted since the last read (an untraced period): the maps are as they were,
        // and reading them is most of what the tracer costs the agent (~110 us a period).
        let traced_ns = u64::try_from(t.traced().as_nanos()).unwrap_or(u64::MAX);
        if self.last.as_ref().is_some_and(|l| l.traced_ns == traced_ns) {
            return None;
        }
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
        self.last_slice = Some(Duration::from_nanos(delta.traced_ns));
        if let Some(c) = self.slice_cost.take() {
            let traced_ns = delta.traced_ns as f64;
            self.attached_share = Some(c.run_time_ns as f64 / traced_ns);
            if !self.resident && self._stats.is_some() {
                self.detached_slices += 1;
                self.resident = self.detached_slices >= retry_after(self.cost_detaches)
                    && pausing_fits(c.run_cnt, delta.traced_ns, self.paused_ns_per_run);
            }
        }
        Some(delta)
    }

    /// The workload's processes now (`pids`) the programs were not armed with: started
    /// since, so the period just read did not count them (none where every task is counted).
    /// Call after [`Self::read_period`] returned a trace.
    pub fn missed(&self, pids: &[i32]) -> Vec<i32> {
        self.armed.as_ref().map_or_else(Vec::new, |armed| pids.iter().copied().filter(|p| !armed.contains(p)).collect())
    }

    /// Arms the next period: traced if the guest loop needs it now, or at the tracer's own
    /// cadence (one period in [`EVERY`]), not at all when it says the plan does not depend on
    /// a trace; the managed processes (`pids`, listed only then) are refreshed before attaching.
    pub fn arm_next(&mut self, pids: impl FnOnce() -> Vec<i32>, workload: bool, need: TraceNeed) {
        self.check_paused();
        if need != TraceNeed::Skip {
            self.load();
        }
        let Some(t) = self.tracer.as_mut() else { return };
        self.since += 1;
        match need {
            // A saturated VM: the paused programs would run at its (high) switch rate for
            // nothing.
            TraceNeed::Skip => {
                if !t.counting() && t.attached() {
                    self.detach_paused();
                }
                return;
            }
            TraceNeed::Cadence if self.since < EVERY => return,
            TraceNeed::Cadence => self.since = 0,
            TraceNeed::Now => {}
        }
        let pids = pids();
        Self::follow(t, &pids, workload);
        self.armed = workload.then(|| pids.into_iter().collect());
        if let Err(e) = t.attach() {
            tracing::warn!("tracer: attach: {e:#}");
        }
        self.at_resume = t.prog_stats();
        self.resumed_at = Some(Instant::now());
    }

    /// Detaches (the programs and maps go with the tracer).
    pub fn stop(&mut self) {
        if let Some(t) = &mut self.tracer {
            t.detach();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Wakeups for the tracer to see: a thread on CPU 0 sleeping 200 us at a time for `d`.
    fn wakeups_for(d: Duration) {
        let end = Instant::now() + d;
        std::thread::spawn(move || {
            gleaner_os::sched::set_affinity(0, &CpuSet::parse("0").unwrap()).unwrap();
            while Instant::now() < end {
                std::thread::sleep(Duration::from_micros(200));
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn an_untraced_period_reads_no_maps_and_the_next_traced_one_counts_only_its_slice() {
        // Root and eBPF: a real tracer (fails naming what is missing, never skips).
        assert!(nix::unistd::geteuid().is_root(), "this test loads eBPF programs: run it as root");
        let cpus = CpuSet::parse("0").unwrap();
        let mut t = Tracing::start(&AgentConfig::default(), &cpus, None, true);
        assert!(t.tracer.is_none() && t.available(), "loaded only when a trace is asked for: {:?}", t.note());
        t.arm_next(Vec::new, false, TraceNeed::Skip);
        assert!(t.tracer.is_none(), "a skipped period loads nothing");
        t.arm_next(Vec::new, false, TraceNeed::Now);
        assert!(t.tracer.is_some(), "no tracer: {:?}", t.note());
        wakeups_for(Duration::from_millis(30));
        let first = t.read_period().expect("a traced period");
        assert!(first.latency.all().count() > 0, "{first:?}");
        let last = t.last.clone();

        // Not armed (the tracer's own cadence is one period in EVERY): nothing to read, and
        // the cumulative trace stays the one read last.
        t.arm_next(|| panic!("the processes are listed only when the tracer attaches"), false, TraceNeed::Cadence);
        wakeups_for(Duration::from_millis(100));
        assert!(t.read_period().is_none());
        assert_eq!(t.last, last);

        t.arm_next(Vec::new, false, TraceNeed::Now);
        wakeups_for(Duration::from_millis(30));
        let third = t.read_period().expect("traced again");
        assert!(third.latency.all().count() > 0);
        // Its traced time is its own slice's, not the untraced period's too.
        let slice = Duration::from_nanos(third.traced_ns);
        assert!(slice >= Duration::from_millis(30) && slice < Duration::from_millis(100), "{slice:?}");
        // Every task counted: no process is missed.
        assert!(t.missed(&[1, 2]).is_empty());

        // Armed with the workload's processes: those listed since are the ones it missed.
        let me = i32::try_from(std::process::id()).unwrap();
        t.arm_next(|| vec![me], true, TraceNeed::Now);
        wakeups_for(Duration::from_millis(10));
        assert!(t.read_period().is_some());
        assert_eq!(t.missed(&[me, me + 1_000_000]), vec![me + 1_000_000]);
        assert!(t.missed(&[me]).is_empty());
        t.stop();
    }

    #[test]
    fn a_paused_program_s_share_is_its_run_time_over_the_wall_time() {
        assert!((share_of(5_000_000, Duration::from_secs(1)) - 0.005).abs() < 1e-12);
        assert!(share_of(1, Duration::ZERO).is_finite());
    }

    #[test]
    fn a_slice_is_bounded_by_the_workload_s_rate_and_before_one_grows_at_most_twofold() {
        let period = Duration::from_millis(200);
        let ms = Duration::from_millis;
        // Unmeasured, the first period: all of it with statistics, the shortest without.
        assert_eq!(slice_for(ms(50), 0.0, None, true, None, None, false), ms(50));
        assert_eq!(slice_for(period, 0.0, None, false, None, None, false), MIN_SLICE);
        // Measured nearly free, no rate: the whole period, but no more than twice the last.
        assert_eq!(slice_for(period, 0.0, Some(1e-6), true, None, None, false), period);
        assert_eq!(slice_for(period, 0.0, Some(1e-6), true, Some(ms(20)), None, false), ms(40));
        // A light workload (800 sync points a second, the open loop at 200 requests/s): 0.16%
        // of a vCPU at the guess, the whole period at once.
        assert_eq!(slice_for(period, 0.0, Some(1e-6), true, Some(ms(50)), Some(800.0), false), period);
        // A busy one (70,000 a second, redis with one connection) is held to the budget's
        // share at the guessed cost, however cheap its start-up slice read: 0.5% x 5 / 4.5 /
        // 14% = 4% of the period.
        let s = slice_for(period, 0.0, Some(1e-6), true, Some(ms(50)), Some(70_000.0), false);
        assert!((s.as_secs_f64() - 0.2 * 0.025 / 4.5 / 0.14).abs() < 1e-6, "{s:?}");
        // Costly as measured: the budget's share (0.5% x 5 periods / 4.5 / 5% = 11.1%).
        let s = slice_for(period, 0.0, Some(0.05), true, Some(period), Some(800.0), false);
        assert!((s.as_secs_f64() - 0.2 * 0.025 / 4.5 / 0.05).abs() < 1e-6, "{s:?}");
        // Never below MIN_SLICE (unless the period is shorter), never past the period; a
        // workload with no sync points bounds nothing.
        assert_eq!(slice_for(period, 0.0, Some(10.0), true, None, None, false), MIN_SLICE);
        assert_eq!(slice_for(ms(2), 0.0, Some(10.0), true, None, None, false), ms(2));
        assert_eq!(slice_for(period, 0.0, None, true, Some(ms(5)), Some(0.0), false), period);
        // A workload starting (the rate is its first period's): the shortest slice, whatever
        // the start-up's rate or cost allow. redis with one connection made 13-33 sync points
        // in its first 50 ms, a rate that let the next slice be the whole period, counted
        // through its client's first 5,000-8,500 requests.
        assert_eq!(slice_for(period, 0.0, Some(1e-6), true, Some(ms(50)), Some(300.0), true), MIN_SLICE);
        assert_eq!(slice_for(period, 0.0, Some(1e-6), true, Some(ms(50)), None, true), MIN_SLICE);
    }

    #[test]
    fn the_first_slice_goes_on_only_as_far_as_its_cost_allows() {
        let (first, ms) = (Duration::from_millis(50), Duration::from_millis);
        // A ping-pong started with the agent: counting cost 23% of a vCPU over the first
        // 5 ms, and the budget allows 0.5% x 5 / 4.5 / 23% of the period, 1.2 ms: it ends.
        assert_eq!(first_slice_rest(first, MIN_SLICE, 0.23), Duration::ZERO);
        // A light workload (an open loop at 200/s, or a server still starting): nearly
        // free, counted to the period's end; nothing counted at all, the same.
        assert_eq!(first_slice_rest(first, MIN_SLICE, 1e-5), first - MIN_SLICE);
        assert_eq!(first_slice_rest(first, MIN_SLICE, 0.0), first - MIN_SLICE);
        // In between, as far as the budget allows: 0.5% x 5 / 4.5 / 2% of 50 ms, 13.9 ms.
        let rest = first_slice_rest(first, MIN_SLICE, 0.02);
        assert!((rest.as_secs_f64() - (0.05 * 0.025 / 4.5 / 0.02 - 0.005)).abs() < 1e-6, "{rest:?}");
        // Never past the period, whatever was counted.
        assert_eq!(first_slice_rest(first, ms(60), 0.0), Duration::ZERO);
    }

    #[test]
    fn the_next_slice_costs_the_last_seen_event_rate_at_the_last_cost_per_event() {
        // sysbench threads: its start-up slice read 4%, the paused programs then saw 1 M
        // events a second, which counting at 210 ns each makes 21%.
        let c = counting_share(Some(0.04), Some(1e6), Some(210.0)).unwrap();
        assert!((c - 0.21).abs() < 1e-9, "{c}");
        // A slice measured dearer than the rate says (the rate fell since) keeps its share.
        assert_eq!(counting_share(Some(0.3), Some(1e6), Some(210.0)), Some(0.3));
        // Either alone, or nothing.
        assert_eq!(counting_share(Some(0.04), None, Some(210.0)), Some(0.04));
        assert_eq!(counting_share(None, Some(1e6), None), None);
        assert!((counting_share(None, Some(1e5), Some(200.0)).unwrap() - 0.02).abs() < 1e-12);
        // Which holds the slice to the budget: 0.5% x 5 / 4.5 / 21% of a 200 ms period, 5.3 ms.
        let period = Duration::from_millis(200);
        let s = slice_for(period, 0.0, Some(c), true, Some(Duration::from_millis(50)), Some(15_000.0), false);
        assert!((s.as_secs_f64() - 0.2 * 0.025 / 4.5 / 0.21).abs() < 1e-6, "{s:?}");
    }

    #[test]
    fn a_slice_s_event_rate_predicts_the_paused_cost_check() {
        // RESIDENT_SHARE (0.25% of a vCPU) at 80 ns an event: 31,250 events a second.
        assert!(!pausing_costs_too_much(30_000.0, None));
        assert!(pausing_costs_too_much(40_000.0, None));
        // sysbench threads' first slice: 700,000 a second.
        assert!(pausing_costs_too_much(700_000.0, Some(60.0)));
        // sockperf under load at 2,000 messages/s (~16,000 a second) stays paused.
        assert!(!pausing_costs_too_much(16_000.0, Some(60.0)));
    }

    #[test]
    fn pausing_again_backs_off_and_needs_a_light_slice() {
        assert_eq!((retry_after(0), retry_after(1), retry_after(2), retry_after(3)), (8, 8, 16, 32));
        assert_eq!(retry_after(100), 8 << 5);
        // A 10 ms slice. sockperf under load at 2,000 messages/s: ~16,000 events/s, 160 in
        // the slice, at 60 ns each and doubled: 0.19% of a vCPU, over half the bound
        // (0.125%). (It pauses from the start, and its paused cost, ~0.1%, never detaches it.)
        let slice = 10_000_000;
        assert!(!pausing_fits(160, slice, Some(60.0)));
        // An open loop at 500 requests/s: ~4,000 events/s: 0.05%.
        assert!(pausing_fits(40, slice, Some(60.0)));
        // A 0-think ping-pong: hundreds of thousands a second.
        assert!(!pausing_fits(3_000, slice, Some(60.0)));
        // Unmeasured: the guess.
        assert_eq!(pausing_fits(40, slice, None), pausing_fits(40, slice, Some(PAUSED_NS_GUESS)));
    }
}
