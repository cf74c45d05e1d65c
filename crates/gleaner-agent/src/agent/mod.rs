//! The agent: set up the target, then once per period sample, let the guest loop decide
//! ([`GuestController`], pure, shared with the simulator), apply; on any exit path undo every
//! change.
//!
//! ```text
//!   setup:  journal + guardian (root) -> idle knobs (lock, writer) -> calibration (curve)
//!           -> Setup (GuestConfig) -> cgroup -> yielding threads (no kernel polling)
//!           -> tracer -> guardian armed -> workload started -> status, metrics, events
//!   period: wait_period -> sample (Sampler: snapshot + per-vCPU idle counters; tracer delta)
//!           -> GuestController::step -> apply (cpuset.cpus, idle knobs, yielder windows)
//!           -> publish (events, status)
//!   exit:   yielders stop -> journal undone -> guardian finishes -> servers stop
//! ```
//!
//! Modules: [`setup`] (what the run starts with), [`session`] (what it holds and undoes),
//! [`apply`] (idle plans onto the knobs and threads), [`target`] (the workload's cgroup),
//! [`child`] (the workload as a process), [`trace`] (the eBPF tracer, duty-cycled).

pub mod apply;
pub mod background;
pub mod child;
pub mod pace;
mod period;
pub mod session;
pub mod setup;
pub mod target;
pub mod trace;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use gleaner_os::cgroup::Cgroups;
use gleaner_os::cpuset::CpuSet;
use gleaner_os::idle::IdleKnobs;
use gleaner_os::procfs::Procfs;
use gleaner_os::rusage::Rusage;
use gleaner_os::sysfs::Sysfs;
use gleaner_os::BadInput;
use gleaner_policy::gleaner::Decision;
use gleaner_policy::guest::{GuestController, GuestStep};
use gleaner_policy::idle::WakeSummary;
use gleaner_policy::retention::{ChangeCause, GovernorStep, RetentionMode};
use tracing::{info, warn};

pub use self::child::check_program;
use self::child::{self_cpu_ns, ChildWaiter};
use self::session::{serve_status, Session};
pub use self::setup::Calibrated;
use self::setup::Offered;
use self::target::{consolidation_blocker, refuse_if_managed, Managed};
use crate::config::AgentConfig;
use crate::sampler::{PeriodExtras, Sampler, Workload};
use crate::server;
use crate::status::{EventKind, EventLog, EventRecord, IdleStatus, Overhead, SharedStatus, StatusReport};
use crate::yielders::Yielders;
use gleaner_policy::guest::setup::Setup;

/// What the agent manages.
#[derive(Debug, Clone)]
pub enum Target {
    /// Start this command (argv) in a new cgroup and manage it until it exits.
    Command(Vec<String>),
    /// Move this process (and its descendants) into a new cgroup.
    Pid(i32),
    /// Manage the `cpuset.cpus` of this existing cgroup.
    Cgroup(PathBuf),
    /// No workload: keep retention on every managed vCPU until a signal (daemon without targets).
    System,
}

impl Target {
    fn describe(&self) -> String {
        match self {
            Target::Command(argv) => format!("command {}", argv.join(" ")),
            Target::Pid(p) => format!("pid {p}"),
            Target::Cgroup(p) => format!("cgroup {}", p.display()),
            Target::System => "system (retention only)".into(),
        }
    }
}

/// How a managed run ended.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Outcome {
    /// Exit code of the workload (`128+signal` if killed); `None` for attach targets.
    pub exit_code: Option<i32>,
    /// Resource usage of the workload's process tree (command targets only).
    pub rusage: Option<Rusage>,
    /// Wall time of the agent, setup and cleanup included.
    pub wall_ns: u64,
    /// Wall time of the workload alone: from its start to its exit (command targets).
    pub workload_wall_ns: u64,
    /// CPU time of the agent process, yielding threads included.
    pub agent_cpu_ns: u64,
    /// Peak resident memory of the agent process (this process: with `compare`, compare's).
    pub agent_maxrss_kib: u64,
    /// The workload's traced wakeups (every period the tracer ran), summarized at the end.
    pub wake: Option<WakeSummary>,
    /// CPU time of the eBPF tracer's programs (`None`: no tracer), and periods traced.
    pub tracer_cpu_ns: Option<u64>,
    pub traced_periods: u64,
    /// The signal that stopped the agent, if any.
    pub signal: Option<i32>,
    /// Management ended before the workload did because someone else took the target away
    /// (its cgroup removed): what happened, for the front end to print and exit with 1.
    pub lost: Option<String>,
    pub final_status: StatusReport,
}

/// Options that are not configuration (set by the command, not the user's file).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Print nothing on stderr except errors (used by `compare`).
    pub quiet: bool,
    /// Send the workload's stdout here instead of passing it through.
    pub stdout_to: Option<PathBuf>,
    /// Send the workload's stderr here instead of passing it through.
    pub stderr_to: Option<PathBuf>,
    /// Serve the status socket.
    pub status_socket: bool,
    /// The calibration, already obtained (`compare` calibrates once for all its runs);
    /// `None` obtains it at start.
    pub calibration: Option<Calibrated>,
}

/// Catches SIGINT, SIGTERM and SIGHUP as a flag (`gleaner_os::signal`), without SA_RESTART so
/// the blocking wait on the workload returns as soon as one arrives.
pub fn install_signal_handlers() -> anyhow::Result<()> {
    gleaner_os::signal::catch_stop_signals(gleaner_os::signal::InterruptedCalls::Return).context("installing signal handlers")
}

/// The signal received since start, if any.
pub fn pending_signal() -> Option<i32> {
    gleaner_os::signal::received()
}

/// Resolves the CPUs to manage: the configured list (must be online) or every online CPU.
pub fn managed_cpus(cfg: &AgentConfig, sysfs: &Sysfs) -> anyhow::Result<CpuSet> {
    let online = sysfs.online_cpus().context("reading online CPUs")?;
    let Some(list) = &cfg.cpus else {
        return Ok(online);
    };
    let want = CpuSet::parse(list).map_err(|_| BadInput::new("cpus", list, "a CPU list such as 0-3"))?;
    if want.is_empty() || !want.iter().all(|c| online.contains(c)) {
        return Err(BadInput::new("cpus", list, format!("a non-empty subset of the online CPUs {online}")).into());
    }
    Ok(want)
}

/// Runs the agent on `target` until the workload exits (command), vanishes (pid), empties
/// (cgroup) or a signal arrives. Every change is undone before returning, also on error.
pub fn run(target: Target, cfg: &AgentConfig, opts: &RunOptions) -> anyhow::Result<Outcome> {
    cfg.validate()?;
    if let Target::Command(argv) = &target {
        check_program(argv)?;
    }
    let procfs = Procfs::new();
    let sysfs = Sysfs::new();
    let cpus = managed_cpus(cfg, &sysfs)?;
    if let Target::Pid(pid) = &target {
        target::check_attach_pid(&procfs, *pid, &target::Caller::this_process())?;
    }
    install_signal_handlers()?;
    let start = Instant::now();
    let agent_pid = std::process::id().cast_signed();

    let cgroups = Cgroups::detect();
    if let (Target::Pid(pid), Ok(cg)) = (&target, &cgroups) {
        refuse_if_managed(cg, &procfs, *pid)?;
    }
    let (consolidation, note) = consolidation_for(&target, cfg, opts, &cgroups)?;
    let status: SharedStatus = Arc::new(Mutex::new(StatusReport {
        agent_pid,
        target: target.describe(),
        consolidation,
        note: note.clone(),
        all_cpus: cpus.clone(),
        active_cpus: cpus.clone(),
        period_ms: cfg.period_ms,
        ..StatusReport::default()
    }));

    // Everything from here on is undone by `Session::finish`.
    let mut session = Session::new(cgroups.ok());
    let ctx = RunContext { target: &target, cfg, opts, cpus: &cpus, status: &status, procfs: &procfs, sysfs: &sysfs, start };
    let result = session.run_inner(&ctx, consolidation);
    let finish = session.finish();
    let mut outcome = result?;
    finish?;
    outcome.wall_ns = child::duration_ns(start.elapsed());
    outcome.agent_cpu_ns = self_cpu_ns().unwrap_or(0);
    outcome.agent_maxrss_kib = gleaner_os::rusage::self_rusage().map(|r| r.maxrss_kib).unwrap_or(0);
    outcome.final_status = status.lock().map(|s| s.clone()).unwrap_or_default();
    after_the_run(&outcome, cfg, opts, &cpus);
    Ok(outcome)
}

/// Whether this run consolidates, and why not where it was asked for and cannot (said once);
/// attaching to a cgroup without it is an error.
fn consolidation_for(
    target: &Target,
    cfg: &AgentConfig,
    opts: &RunOptions,
    cgroups: &gleaner_os::Result<Cgroups>,
) -> anyhow::Result<(bool, Option<String>)> {
    let mut note = None;
    let consolidation = cfg.consolidation && !matches!(target, Target::System) && {
        note = consolidation_blocker(cgroups);
        note.is_none()
    };
    if let Some(n) = &note {
        if cfg.consolidation && !opts.quiet {
            eprintln!("gleaner: consolidation disabled: {n}; running with retention only");
        }
    }
    if matches!(target, Target::Cgroup(_)) && !consolidation {
        return Err(anyhow::anyhow!(
            "attaching to a cgroup needs consolidation ({})",
            note.unwrap_or_else(|| "disabled by configuration".into())
        ));
    }
    Ok((consolidation, note))
}

/// After everything was undone: a run that planned from the prior measures this VM's curve
/// for the next ones (its workload ended by itself, not on a signal), and the run's last log
/// line.
fn after_the_run(outcome: &Outcome, cfg: &AgentConfig, opts: &RunOptions, cpus: &CpuSet) {
    let was = outcome.final_status.calibration.as_ref().filter(|_| outcome.lost.is_none());
    let say = || {
        if !opts.quiet {
            eprintln!(
                "gleaner: measuring this VM's wake costs for the runs after this one (about 2 s, once per boot; `gleaner calibrate` does it ahead of time)"
            );
        }
    };
    if let Some(now) = setup::after_the_workload(cfg, cpus, was, say) {
        info!("calibration {}", now.describe());
    }
    let f = &outcome.final_status;
    info!(
        "done: {} periods, {} decisions, {} yields, {} timeouts, yielders {} ms CPU, kernel polling {} ms; {}",
        f.totals.periods,
        f.totals.decisions,
        f.totals.yields,
        f.totals.timeouts,
        f.totals.yielder_cpu_ns / 1_000_000,
        f.idle.as_ref().map_or(0, |i| i.poll_ns) / 1_000_000,
        f.overhead.line(f.uptime_s)
    );
}

/// What every phase of a run reads: the target, configuration and the shared status.
#[derive(Clone, Copy)]
pub(crate) struct RunContext<'a> {
    pub(crate) target: &'a Target,
    pub(crate) cfg: &'a AgentConfig,
    pub(crate) opts: &'a RunOptions,
    pub(crate) cpus: &'a CpuSet,
    pub(crate) status: &'a SharedStatus,
    pub(crate) procfs: &'a Procfs,
    pub(crate) sysfs: &'a Sysfs,
    pub(crate) start: Instant,
}

/// What a period ended with, for [`Session::publish`].
struct PeriodEnd {
    t_ms: u64,
    step: GuestStep,
    extras: PeriodExtras,
    /// The retention mode the period ran in.
    ran: RetentionMode,
    /// `CLOCK_MONOTONIC` at its end, ns.
    mono_ns: u64,
    /// The period's traced wakeups, if traced.
    wake: Option<WakeSummary>,
    /// How long the tracer counted in it, ns, if it did.
    traced_ns: Option<u64>,
    /// Share of the period's sync points made by processes the trace missed (started while
    /// it counted).
    trace_missed: f64,
    /// The plan applied from the next period on changed.
    plan_changed: bool,
    /// The agent's yields to woken threads so far ([`pace::Pacer`]).
    yields: u64,
}

impl Session {
    /// Set-up, then the control loop until the workload ends, a signal arrives or the target
    /// is taken away (module documentation).
    fn run_inner(&mut self, ctx: &RunContext<'_>, consolidation: bool) -> anyhow::Result<Outcome> {
        let root = nix::unistd::geteuid().is_root();
        self.open_servers(ctx, root)?;
        let workload = !matches!(ctx.target, Target::System);
        let (idle, offer) = self.set_up_idle(ctx, workload);
        let mut run = self.start(ctx, &idle, offer.as_ref(), consolidation, root, workload)?;
        self.run_periods(ctx, &mut run)?;
        self.end_run(ctx, run)
    }

    /// The journal first (root): from here a kill -9 is covered. The status socket right
    /// after, so the guardian removes it too; without a journal, right away. Then the metrics
    /// endpoint.
    fn open_servers(&mut self, ctx: &RunContext<'_>, root: bool) -> anyhow::Result<()> {
        let RunContext { cfg, opts, status, .. } = *ctx;
        if root {
            self.open_journal(cfg, status, opts.status_socket)?;
        } else if opts.status_socket {
            self.servers.push(serve_status(cfg, status)?);
        }
        if let Some(addr) = &cfg.metrics_addr {
            self.servers.push(server::serve_metrics(addr, Arc::clone(status))?);
        }
        Ok(())
    }

    /// What the machine offers, the curve, and the guest loop's configuration; the idle knobs
    /// given up where they are not ours to turn; said once and shown in the status.
    fn set_up_idle(&mut self, ctx: &RunContext<'_>, workload: bool) -> (Setup, Option<gleaner_os::idle::IdleOffer>) {
        let RunContext { cfg, opts, cpus, status, .. } = *ctx;
        let offer = IdleKnobs::new().offer(cpus).ok();
        let no_knobs = if cfg.retention && cfg.kernel_polling && cfg.timeout_us.is_none() {
            self.take_idle_knobs(cfg, cpus).err()
        } else {
            Some("not asked for".into())
        };
        let calibrated = match &opts.calibration {
            Some(c) => c.clone(),
            None if cfg.retention => {
                let control = match (self.knobs.as_mut(), self.state.as_mut()) {
                    (Some(k), Some(j)) => Some((k.writer_mut(), j)),
                    _ => None,
                };
                setup::calibration(cfg, cpus, control, workload)
            }
            None => Calibrated { results: Err("retention off".into()), source: None, threshold_ns: None },
        };
        let idle = setup::decide(cfg, cpus, &calibrated, &Offered { offer: offer.as_ref(), no_knobs }, workload);
        if !idle.kernel {
            // Not ours to turn: let another agent take them.
            self.knobs = None;
            self.locks.clear();
        }
        self.say_idle_setup(ctx, &idle, &calibrated);
        if let Ok(mut st) = status.lock() {
            st.retention = cfg.retention && (idle.kernel || idle.yielders.is_some());
            st.retention_note = idle.note.clone();
            st.calibration = calibrated.source.clone();
            st.idle = cfg.retention.then(|| IdleStatus {
                offer: offer.clone(),
                means: Some(idle.guest.means),
                kernel: idle.kernel,
                curve: idle.guest.curve.clone(),
                plan_config: idle.guest.plan,
                ..IdleStatus::default()
            });
            st.idle_threshold_us = idle.yielders.map_or(0, |y| y.idle_threshold_ns / 1000);
            // What the status and the retention_timeout_seconds metric report (they said 0).
            st.timeout_us = idle.yielders.map_or(0, |y| y.timeout_ns / 1000);
            st.adaptive_timeout = idle.yielders.is_some_and(|y| y.adapt);
        }
        (idle, offer)
    }

    /// Everything the loop needs, in order: the guest loop and its first plan (the kernel's
    /// upstream haltpoll window where offered) before the workload starts, the target taken,
    /// the yielding threads (parked until the plan gives their vCPU a window, so the workload
    /// has them from its first instruction), the tracer, the workload started once the
    /// guardian is armed, the first event, the sampler primed.
    fn start(
        &mut self,
        ctx: &RunContext<'_>,
        idle: &Setup,
        offer: Option<&gleaner_os::idle::IdleOffer>,
        consolidation: bool,
        root: bool,
        workload: bool,
    ) -> anyhow::Result<period::Running> {
        let RunContext { target, cfg, opts, cpus, status, procfs, sysfs, .. } = *ctx;
        let mut guest_cfg = idle.guest.clone();
        if consolidation {
            guest_cfg.consolidation = Some(cfg.controller.clone());
        }
        let guest = GuestController::new(guest_cfg);
        if let (Some(k), Some(j)) = (self.knobs.as_mut(), self.state.as_mut()) {
            if let Err(e) = k.apply(j, guest.applied(), guest.mode().is_on(), gleaner_policy::guest::WindowReset::Keep) {
                warn!("applying the first idle plan: {e:#}");
            }
        }
        let mut managed = if consolidation { self.take_target(ctx)? } else { Managed { cgroup: None, root_pid: None } };
        if let Some(r) = idle.yielders {
            let y = Yielders::start(cpus, r, guest.mode().is_on())?;
            apply::apply_yielders(&y, guest.applied(), guest.mode().is_on());
            self.yielders = Some(y);
        }
        let mut tracing = trace::Tracing::start(cfg, cpus, offer, root);
        if let Ok(mut st) = status.lock() {
            if let Some(i) = &mut st.idle {
                i.tracer_note = tracing.note().map(str::to_string);
            }
        }
        let (child_pid, workload_start) = self.launch(ctx, &mut managed)?;
        let mut events = cfg.events.as_deref().map(EventLog::open).transpose()?;
        if !opts.quiet {
            info!("managing {} on CPUs {cpus}", target.describe());
        }
        if let Some(log) = &mut events {
            let first = EventRecord {
                retention: Some(guest.mode()),
                governor: guest.governor_state(),
                mono_ns: Some(gleaner_os::monotonic_ns()),
                ..EventRecord::new(0, EventKind::Retention, cpus.to_string(), Default::default())
            };
            log.write(&first)?;
        }
        let mut sampler = Sampler::new(procfs.clone(), sysfs.clone(), cpus.clone());
        let (tids, pids) = managed.threads_and_processes(procfs);
        sampler.prime(Workload { tids: &tids, pids: &pids }, self.yielders.as_ref(), cpus);
        tracing.arm_next(|| managed.pids(procfs), workload, guest.trace_need());
        let waiter = child_pid.map(ChildWaiter::new).transpose()?;
        // The workload's own counter (validated with the configuration), read once now so
        // that the first period has a step.
        let mut progress = cfg.progress.as_deref().and_then(|s| s.parse().ok()).map(crate::progress::ProgressReader::new);
        if let Some(p) = &mut progress {
            p.step();
        }
        let dump = std::env::var_os("GLEANER_DUMP_READINGS").map(std::fs::File::create).transpose().context("GLEANER_DUMP_READINGS")?;
        Ok(period::Running {
            period: Duration::from_millis(cfg.period_ms).mul_f64(cfg.priors.first_period_share),
            guest,
            managed,
            consolidation,
            tracing,
            events,
            sampler,
            waiter,
            child_pid,
            workload_start,
            workload,
            last_work_ns: 0,
            progress,
            outcome: Outcome::default(),
            all_wakes: gleaner_policy::idle::WakeLatency::default(),
            dump,
            background: background::Background::for_this_thread(),
            pacer: pace::Pacer::new(Duration::from_nanos(cfg.priors.agent_pace_ns)),
        })
    }

    /// Starts a `run` workload in its cgroup once the guardian is armed (its pid and start),
    /// or takes an attached one's pid as the root of what is managed.
    fn launch(&mut self, ctx: &RunContext<'_>, managed: &mut Managed) -> anyhow::Result<(Option<i32>, Instant)> {
        self.guardian_armed()?;
        match ctx.target {
            Target::Command(argv) => {
                let workload_start = Instant::now();
                let pid = child::spawn_command(argv, managed.cgroup.as_ref(), ctx.opts)?;
                managed.root_pid = Some(pid);
                Ok((Some(pid), workload_start))
            }
            Target::Pid(pid) => {
                managed.root_pid = Some(*pid);
                Ok((None, Instant::now()))
            }
            _ => Ok((None, Instant::now())),
        }
    }

    /// The clean-up at the agent's own priority, and the last, partial period: what the run
    /// ended with and what the agent cost in all.
    fn end_run(&mut self, ctx: &RunContext<'_>, run: period::Running) -> anyhow::Result<Outcome> {
        let period::Running { background, mut outcome, all_wakes, mut events, mut tracing, guest, pacer, .. } = run;
        drop(background);
        outcome.wake = (all_wakes.all().count() > 0).then(|| WakeSummary::of(&all_wakes));
        let used = tracing.usage();
        if let Some(log) = &mut events {
            let t_ms = u64::try_from(ctx.start.elapsed().as_millis()).unwrap_or(u64::MAX);
            log.write(&EventRecord {
                agent_cpu_ns: self_cpu_ns(),
                agent_yields: Some(pacer.yields()),
                tracer: used,
                mono_ns: Some(gleaner_os::monotonic_ns()),
                ..EventRecord::new(t_ms, EventKind::Exit, CpuSet::from_iter(guest.active()).to_string(), guest.metrics())
            })?;
        }
        tracing.stop();
        outcome.tracer_cpu_ns = used.map(|u| u.cpu_ns);
        outcome.traced_periods = used.map_or(0, |u| u.traced_periods);
        Ok(outcome)
    }

    /// Says once, on stderr, how retention runs (unless quiet).
    fn say_idle_setup(&self, ctx: &RunContext<'_>, idle: &Setup, calibrated: &Calibrated) {
        if ctx.opts.quiet || !ctx.cfg.retention {
            return;
        }
        let from = calibrated.source.as_ref().map_or(String::new(), |s| format!(" [calibration {}]", s.describe()));
        if let Some(n) = &idle.note {
            eprintln!("gleaner: {n}{from}");
        }
        if let Some(c) = &idle.guest.curve {
            let how = if idle.kernel {
                "kernel polling"
            } else if idle.guest.means.yielders {
                "yielding threads"
            } else {
                "nothing"
            };
            eprintln!("gleaner: idle policy: {how}, planned per vCPU (budget {:.2} of a vCPU); {}{from}", ctx.cfg.budget, c.describe());
        }
    }

    /// Puts the agent's main thread in the workload's idle time or takes it out, as the guest
    /// loop says (a refusal is said once and the agent stays at its own priority), and shows
    /// that and whether its work is paced in the status.
    fn run_in_background(&self, background: &mut Result<background::Background, String>, guest: &GuestController, status: &SharedStatus) {
        if let Ok(b) = background {
            if let Err(why) = b.set(guest.agent_in_background()) {
                warn!("{why}");
                *background = Err(why);
            }
        }
        let now = background.as_ref().is_ok_and(background::Background::is_background);
        if let Ok(mut st) = status.lock() {
            st.agent_in_background = now;
            st.agent_paced = guest.agent_paced();
        }
    }

    /// Applies the period's idle plan: the kernel knobs (a refused write stops kernel polling
    /// for the rest of the run, and says so) and the yielding threads' windows.
    fn apply_idle(&mut self, step: &GuestStep, status: &SharedStatus) {
        let on = step.mode.is_on();
        if let (Some(k), Some(j)) = (self.knobs.as_mut(), self.state.as_mut()) {
            let r = k.apply(j, &step.plan, on, step.reset_poll_windows);
            if r.is_ok() && on && step.plan.vcpus.iter().any(|v| v.mechanism == gleaner_policy::idle::Mechanism::Poll) {
                crate::seam::stop_at(crate::seam::AFTER_POLL);
            }
            if let Err(e) = r {
                let why = format!("changing the idle knobs failed ({e:#}); kernel polling stopped for the rest of this run");
                eprintln!("gleaner: {why}");
                let _ = k.stock();
                self.knobs = None;
                if let Ok(mut st) = status.lock() {
                    st.retention_note = Some(why);
                    if let Some(i) = &mut st.idle {
                        i.kernel = false;
                    }
                }
            }
        }
        if let Some(y) = &self.yielders {
            y.set_retention(on);
            apply::apply_yielders(y, &step.plan, on);
        }
    }

    /// Publishes a period: its events (decisions, the period, a retention change) to the log,
    /// its counts and the live status (the status totals them: `StatusReport::add_period`).
    fn publish(&self, ctx: &RunContext<'_>, p: PeriodEnd, guest: &GuestController, events: Option<&mut EventLog>) -> anyhow::Result<()> {
        let metrics = guest.metrics();
        let active = CpuSet::from_iter(p.step.active.iter().copied()).to_string();
        let event = |kind: EventKind| EventRecord { mono_ns: Some(p.mono_ns), ..EventRecord::new(p.t_ms, kind, active.clone(), metrics) };
        let mut records: Vec<EventRecord> =
            p.step.decisions.iter().map(|d| EventRecord { decision: Some(d.clone()), ..event(EventRecord::kind_of(d)) }).collect();
        let gov = p.step.governor;
        records.push(EventRecord {
            count: Some(p.extras.timeouts),
            vcpus: self.yielders.as_ref().map(|_| p.extras.vcpus.clone()),
            retention: Some(p.ran),
            reading: Some(p.step.reading),
            comparison: gov.and_then(|s| s.comparison),
            agent_cpu_ns: self_cpu_ns(),
            agent_yields: Some(p.yields),
            wake: p.wake,
            plan: p.plan_changed.then(|| p.step.plan.clone()),
            poll_ns: Some(p.extras.poll_ns),
            traced_ns: p.traced_ns,
            trace_missed: (p.trace_missed > 0.0).then_some(p.trace_missed),
            window_reset: (p.step.reset_poll_windows != gleaner_policy::guest::WindowReset::Keep).then_some(p.step.reset_poll_windows),
            budget: Some(p.step.budget.clone()),
            ..event(EventKind::Period)
        });
        if let Some(GovernorStep { mode, change: Some(change), comparison, .. }) = gov {
            records.push(EventRecord {
                retention: Some(mode),
                change: Some(change),
                comparison,
                governor: guest.governor_state(),
                ..event(EventKind::Retention)
            });
            if change.cause == ChangeCause::Switch && !ctx.opts.quiet {
                let why = comparison.map(|c| {
                    let steal = if c.steal_vcpus > 0.0 { format!(", {:.2} more steal", c.steal_vcpus) } else { String::new() };
                    let held = format!("{:.2} vCPU spent{steal}", c.burn_vcpus);
                    match (c.on_wake_ns, c.off_wake_ns) {
                        (Some(on), Some(off)) => format!(" (wakeup {:.1} us on vs {:.1} us off, {held})", on / 1e3, off / 1e3),
                        _ => format!(" (sync points/s {:.0} on vs {:.0} off, {held})", c.on_rate, c.off_rate),
                    }
                });
                info!("retention {:?} -> {:?}{}", change.from, change.to, why.unwrap_or_default());
            }
        }
        if !ctx.opts.quiet {
            for d in &p.step.decisions {
                info!("{}", describe(d));
            }
        }
        if let Some(log) = events {
            for r in &records {
                log.write(r)?;
            }
        }
        let n = p.step.decisions.len() as u64;
        if let Ok(mut s) = ctx.status.lock() {
            s.retention_mode = Some(guest.mode());
            s.governor = guest.governor_state();
            s.active_cpus = CpuSet::from_iter(p.step.active.iter().copied());
            s.metrics = metrics;
            s.uptime_s = ctx.start.elapsed().as_secs_f64();
            if let Some(i) = &mut s.idle {
                i.plan = Some(p.step.plan.clone());
                i.planned = Some(p.step.planned.clone());
                i.budget = p.step.budget.clone();
                i.gaps_from = p.step.gaps_from;
                if p.wake.is_some() {
                    i.wake = p.wake;
                }
            }
            s.add_period(&p.extras, n, p.ran, records);
            let probes = guest.probe_time();
            s.overhead = Overhead {
                probe_ns: probes.probe_ns,
                probe_worse_ns: probes.worse_ns,
                agent_cpu_ns: self_cpu_ns().unwrap_or(0).saturating_sub(s.totals.yielder_cpu_ns),
            };
        }
        Ok(())
    }
}

/// Consolidation is off for the rest of the run: said once on stderr (`why`, then what happens
/// to the workload), every vCPU back, and the status says why.
fn stop_consolidation(guest: &mut GuestController, consolidation: &mut bool, status: &SharedStatus, why: String, then: &str) {
    eprintln!("gleaner: {why}; consolidation stopped{then}");
    guest.stop_consolidation();
    *consolidation = false;
    if let Ok(mut st) = status.lock() {
        st.consolidation = false;
        st.note = Some(why);
    }
}

fn describe(d: &Decision) -> String {
    match d {
        Decision::Deactivate { cpu } => format!("consolidate: vCPU {cpu} deactivated"),
        Decision::Restore { cpu } => format!("restore: vCPU {cpu} given back"),
        Decision::ResetAll { reason } => format!("reset to all vCPUs ({reason:?})"),
        Decision::SetRho { from, to } => format!("rho {from:.3} -> {to:.3}"),
        Decision::SetEta { from, to } => format!("eta {from:.3} -> {to:.3}"),
    }
}
