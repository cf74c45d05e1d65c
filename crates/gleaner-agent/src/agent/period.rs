//! The control loop, one period at a time: wait (the tracer counting a slice of it), sample,
//! let the guest loop decide, apply, publish. [`Running`] holds what the loop carries from one
//! period to the next; [`Session::run_periods`] runs it until the workload ends, a signal
//! arrives or the target is taken away.

use std::time::{Duration, Instant};

use anyhow::Context;
use gleaner_os::cpuset::CpuSet;
use gleaner_policy::guest::{GuestController, GuestReading};
use gleaner_policy::idle::{WakeLatency, WakeSummary};
use gleaner_policy::retention::RetentionMode;
use tracing::warn;

use super::child::{wait_period, ChildWaiter};
use super::session::{journal_pins, Session};
use super::target::Managed;
use super::{background, pace, stop_consolidation, trace, Outcome, PeriodEnd, RunContext, Target};
use crate::progress::ProgressReader;
use crate::sampler::{PeriodExtras, Sampler, Workload};
use crate::status::EventLog;

/// What the loop carries from one period to the next.
pub(super) struct Running {
    pub(super) guest: GuestController,
    pub(super) managed: Managed,
    /// Consolidation still runs (it stops for good when the target refuses a cpuset).
    pub(super) consolidation: bool,
    pub(super) tracing: trace::Tracing,
    pub(super) events: Option<EventLog>,
    pub(super) sampler: Sampler,
    /// The workload started by `run`, and when.
    pub(super) waiter: Option<ChildWaiter>,
    pub(super) child_pid: Option<i32>,
    pub(super) workload_start: Instant,
    /// There is a workload (not the daemon's whole system).
    pub(super) workload: bool,
    /// The coming period's length.
    pub(super) period: Duration,
    /// The main thread's CPU for the last period's work: the guest loop lengthens the periods
    /// where it costs too much (`priors.agent_work_share`).
    pub(super) last_work_ns: u64,
    /// The workload's own counter, where given.
    pub(super) progress: Option<ProgressReader>,
    pub(super) outcome: Outcome,
    /// Every traced period's wakeups, summarized at the end.
    pub(super) all_wakes: WakeLatency,
    /// Every period's reading as the guest loop took it, for replaying it offline
    /// (`GLEANER_DUMP_READINGS`, `cargo run -p gleaner-policy --example replay -- FILE`).
    pub(super) dump: Option<std::fs::File>,
    /// The period's work in the workload's idle time (background.rs).
    pub(super) background: Result<background::Background, String>,
    pub(super) pacer: pace::Pacer,
}

/// A period's reading and what [`Session::publish`] reports of it.
struct Read {
    reading: GuestReading,
    extras: PeriodExtras,
    /// The vCPUs and the retention mode the period ran with.
    active_before: CpuSet,
    ran: RetentionMode,
    wake: Option<WakeSummary>,
    traced_ns: Option<u64>,
    trace_missed: f64,
}

impl Running {
    /// Waits out the coming period: a traced period is traced for its first slice (the
    /// tracer's cost bounded), then the rest is waited detached. True when the workload ended
    /// or a signal came.
    fn wait(&mut self) -> anyhow::Result<bool> {
        let period = self.period;
        let mut slice = self.tracing.slice(period, self.guest.sync_rate(), self.guest.workload_starting());
        let mut rest = period;
        if !slice.is_zero() && slice < period {
            let mut ended = self.wait_for(slice)?;
            // The first slice goes on for as long as its cost so far allows, measured again
            // each time it has doubled: a workload started with the agent may not run yet in
            // the first `MIN_SLICE` (a ping-pong counted at next to no cost there went on
            // counted through its 50 ms first period at a fifth of a vCPU).
            let mut more = if ended { Duration::ZERO } else { self.tracing.slice_more(period, slice) };
            while !more.is_zero() {
                let step = more.min(slice);
                ended = self.wait_for(step)?;
                slice += step;
                more = if ended { Duration::ZERO } else { self.tracing.slice_more(period, slice) };
            }
            if slice < period {
                self.tracing.end_slice();
            }
            if ended {
                return Ok(true);
            }
            rest = period.saturating_sub(slice);
        }
        self.wait_for(rest)
    }

    fn wait_for(&mut self, d: Duration) -> anyhow::Result<bool> {
        wait_period(self.waiter.as_ref(), d, self.child_pid, self.workload_start, &mut self.outcome)
    }
}

impl Session {
    /// The control loop (module documentation).
    pub(super) fn run_periods(&mut self, ctx: &RunContext<'_>, run: &mut Running) -> anyhow::Result<()> {
        self.run_in_background(&mut run.background, &run.guest, ctx.status);
        loop {
            if run.wait()? {
                return Ok(());
            }
            // The period's work from here, in pieces a woken thread need not wait out (pace.rs).
            run.pacer.start(run.guest.agent_paced());
            let work0 = gleaner_os::rusage::thread_cpu_ns();
            if !self.still_managing(ctx, run) {
                return Ok(());
            }
            let read = self.read_period(ctx, run)?;
            // Decide.
            let before = run.guest.applied().clone();
            let step = run.guest.step(&read.reading);
            self.run_in_background(&mut run.background, &run.guest, ctx.status);
            run.pacer.point();
            let (managed, procfs) = (&run.managed, ctx.procfs);
            run.tracing.arm_next(|| managed.pids(procfs), run.workload, run.guest.trace_need());
            if let (Some(why), Ok(mut st)) = (run.tracing.note(), ctx.status.lock()) {
                if let Some(i) = st.idle.as_mut().filter(|i| i.tracer_note.as_deref() != Some(why)) {
                    i.tracer_note = Some(why.to_string());
                }
            }
            run.pacer.point();
            // Apply.
            self.apply_active(ctx, run, &CpuSet::from_iter(step.active.iter().copied()), &read.active_before);
            run.pacer.point();
            self.apply_idle(&step, ctx.status);
            run.pacer.point();
            run.period = Duration::from_nanos(step.next_period_ns);
            // Publish.
            let ended = PeriodEnd {
                t_ms: u64::try_from(ctx.start.elapsed().as_millis()).unwrap_or(u64::MAX),
                mono_ns: gleaner_os::monotonic_ns(),
                traced_ns: read.traced_ns,
                trace_missed: read.trace_missed,
                plan_changed: step.plan != before,
                yields: run.pacer.yields(),
                step,
                extras: read.extras,
                ran: read.ran,
                wake: read.wake,
            };
            self.publish(ctx, ended, &run.guest, run.events.as_mut())?;
            run.last_work_ns = gleaner_os::rusage::thread_cpu_ns().saturating_sub(work0);
        }
    }

    /// Whether the target is still there to manage: false once the workload is gone, or an
    /// attached target's cgroup was removed by someone else (they had to move the workload
    /// out first: nothing is left to consolidate). A `run` workload is ours to wait for: it
    /// runs on, unmanaged, and its exit status stays the run's.
    fn still_managing(&mut self, ctx: &RunContext<'_>, run: &mut Running) -> bool {
        if run.managed.workload_gone(ctx.target) {
            return false;
        }
        if let Some(gone) = run.managed.cgroup.as_ref().filter(|c| !c.exists()).map(|c| c.path().to_path_buf()) {
            let what = format!("the workload's cgroup {} was removed by someone else", gone.display());
            if !matches!(ctx.target, Target::Command(_)) {
                run.outcome.lost = Some(what);
                return false;
            }
            run.managed.cgroup = None;
            stop_consolidation(&mut run.guest, &mut run.consolidation, ctx.status, what, ", the workload runs on where it was moved");
            if let Some(y) = &self.yielders {
                y.set_active(ctx.cpus);
            }
        }
        true
    }

    /// Samples the period: the workload's and each vCPU's counters, the threads the workload
    /// pinned (a workload that pinned threads keeps every vCPU: the controller's rule), the
    /// tracer's slice, and the workload's own counter.
    fn read_period(&mut self, ctx: &RunContext<'_>, run: &mut Running) -> anyhow::Result<Read> {
        let procfs = ctx.procfs;
        let active_before = CpuSet::from_iter(run.guest.active());
        let ran = run.guest.mode();
        let (tids, pids) = run.managed.threads_and_processes(procfs);
        run.pacer.point();
        let workload = Workload { tids: &tids, pids: &pids };
        let (mut snapshot, extras) = run.sampler.sample(workload, self.yielders.as_ref(), &active_before, &mut run.pacer);
        if run.managed.cgroup.is_some() && ctx.cfg.controller.keep_pinned {
            self.pins.observe(&tids, &active_before);
            if let Some(state) = self.state.as_mut() {
                if let Err(e) = journal_pins(state, &self.pins) {
                    warn!("journaling the workload's pins: {e:#}");
                }
            }
            let pinned = self.pins.pinned();
            snapshot.pinned = pinned.to_vec();
            if let Ok(mut st) = ctx.status.lock() {
                st.pinned_cpus = pinned;
            }
        }
        let traced = run.tracing.read_period();
        // Processes started while the tracer counted were not followed: the share of the
        // period's sync points their threads made (the guest loop sets such a trace aside).
        let trace_missed = if traced.is_some() && snapshot.s_work > 0 {
            let missed = run.tracing.missed(&pids);
            let synced: u64 = missed.iter().flat_map(|&p| procfs.tasks(p).unwrap_or_default()).map(|t| run.sampler.synced(t)).sum();
            synced as f64 / snapshot.s_work as f64
        } else {
            0.0
        };
        run.pacer.point();
        if let Some(t) = &traced {
            run.all_wakes.merge(&t.latency);
        }
        let wake = traced.as_ref().filter(|t| t.latency.all().count() > 0).map(|t| WakeSummary::of(&t.latency));
        let traced_ns = traced.as_ref().map(|t| t.traced_ns);
        let reading = GuestReading {
            snapshot,
            idle: extras.idle.clone(),
            trace: traced,
            caught: extras.caught.clone(),
            io: extras.io,
            counter: run.progress.as_mut().and_then(ProgressReader::step),
            agent_work_ns: run.last_work_ns,
            trace_missed,
        };
        if let Some(f) = &mut run.dump {
            use std::io::Write;
            writeln!(f, "{}", serde_json::to_string(&reading)?).context("GLEANER_DUMP_READINGS")?;
        }
        Ok(Read { reading, extras, active_before, ran, wake, traced_ns, trace_missed })
    }

    /// Gives the workload the step's vCPUs where they changed. A refusal (a read-only file, a
    /// security module, a cpuset rule of the parent) stops consolidating rather than retrying
    /// every period.
    fn apply_active(&mut self, ctx: &RunContext<'_>, run: &mut Running, active: &CpuSet, active_before: &CpuSet) {
        if active == active_before {
            return;
        }
        let applied = run.managed.apply(active, active_before, ctx.cpus);
        // A kernel before 6.2 set every thread's mask to the new cpuset.
        self.pins.reapply();
        if let Err(what) = applied {
            let then = format!(" for the rest of this run, the workload keeps CPUs {}", ctx.cpus);
            stop_consolidation(&mut run.guest, &mut run.consolidation, ctx.status, what, &then);
        }
        if let Some(y) = &self.yielders {
            y.set_active(&CpuSet::from_iter(run.guest.active()));
        }
    }
}
