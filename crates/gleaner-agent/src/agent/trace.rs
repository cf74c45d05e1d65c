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
//!              allows (slice_more, again at each doubling), the second MIN_SLICE (the first period's rate is a
//!              start-up's); MIN_SLICE .. the period
//!  end_slice   pause (resident) or detach; detach for cost where the slice's event rate
//!              says the paused programs would cost over RESIDENT_SHARE, the second reading
//!              over it in a row (CostStrikes: this prediction or a paused stretch's measure;
//!              none in the first period, whose rate is a start-up's)
//!  read_period read (cumulative) - last read = the slice's trace; the programs' run time
//!              over it sets the next slices
//!  each period the paused programs' cost over it: above RESIDENT_SHARE (the second reading
//!              over it in a row), detach, and detach
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
pub use gleaner_policy::guest::tracer::MIN_SLICE;
use gleaner_policy::guest::tracer::{
    counting_share, first_slice_rest, pausing_costs_too_much, pausing_fits, retry_after, share_of, slice_for, CostStrikes, EVERY,
    RESIDENT_SHARE,
};
use gleaner_policy::guest::TraceNeed;
use gleaner_policy::idle::WakeTrace;

use crate::config::AgentConfig;
use crate::status::TracerUse;

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
    /// The paused programs' cost as a share of a vCPU, and their events a second with what
    /// each cost, ns (the last paused stretch's).
    paused_share: f64,
    paused_at: Option<(f64, f64)>,
    /// Slices traced since the paused programs were last detached for their cost.
    detached_slices: u64,
    /// Times they were.
    cost_detaches: u64,
    /// The paused programs' cost readings over the bound in a row.
    strikes: CostStrikes,
    /// The workload's processes the programs were last armed with (`None`: every task
    /// counted, or not armed yet).
    armed: Option<std::collections::BTreeSet<i32>>,
    /// What to load the programs with, until the guest loop first asks for a trace
    /// ([`Self::arm_next`]): a run the loop never traces (a short or saturated one) pays
    /// nothing for the tracer, whose load, statistics switch and first attach take ~7 ms of
    /// the agent's CPU here.
    pending: Option<TracerConfig>,
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
            paused_at: None,
            detached_slices: 0,
            cost_detaches: 0,
            strikes: CostStrikes::default(),
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
                // detach at this slice's end rather than after a whole period of paying for
                // them (`check_paused` would, at its end), on the second reading over the
                // bound in a row (one may be a burst). Counting slows a storm, so the slice's
                // rate understates the paused one: this errs towards pausing.
                if self.resident && self.strikes.record(pausing_costs_too_much(rate, self.paused_at)) {
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
    /// stops pausing, when that is above [`RESIDENT_SHARE`] for the second reading in a row.
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
        let rate = d.run_cnt as f64 / wall.as_secs_f64();
        if let Some(ns) = d.ns_per_run() {
            self.paused_at = Some((rate, ns));
        }
        self.event_rate = Some(rate);
        let share = share_of(d.run_time_ns, wall);
        self.paused_share = share;
        if self.strikes.record(share > RESIDENT_SHARE) {
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
                self.resident =
                    self.detached_slices >= retry_after(self.cost_detaches) && pausing_fits(c.run_cnt, delta.traced_ns, self.paused_at);
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
        self.strikes.period_ended();
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
}
