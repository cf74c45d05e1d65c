//! The agent loop: set up the target, then once per period sample, decide, apply; on any exit
//! path undo every change.
//!
//! ```text
//!   setup: cgroup (recorded in the state file, guardian started) -> yielding threads
//!          -> guardian armed (it says so) -> workload started
//!          -> status socket / metrics / events
//!   loop:  wait(period | workload exit | signal) -> Sampler::sample -> Controller::step
//!          -> cpuset.cpus + Yielders::set_active -> RetentionGovernor::step
//!          -> Yielders::set_retention -> status, events
//!   exit:  stop yielders -> undo state file -> guardian finishes -> servers stop
//! ```

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use gleaner_os::cgroup::{Cgroups, CpusetCgroup};
use gleaner_os::cpuset::CpuSet;
use gleaner_os::procfs::Procfs;
use gleaner_os::rusage::Rusage;
use gleaner_os::sysfs::Sysfs;
use gleaner_os::BadInput;
use gleaner_policy::gleaner::{Controller, Decision, Metrics, Snapshot};
use gleaner_policy::retention::{
    EpochReading, GovernorStep, PriorStrength, RetentionConfig, RetentionGovernor, RetentionMode, RetentionVerdict, WakeupCosts,
};
use tracing::{info, warn};

use crate::cache::{CalibrationResults, CalibrationSource};
use crate::config::{AgentConfig, RetentionStart};
use crate::sampler::Sampler;
use crate::server::{self, Server};
use crate::state::{Change, Guardian, StateFile};
use crate::status::{EventKind, EventLog, EventRecord, SharedStatus, StatusReport};
use crate::yielders::Yielders;

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
    /// CPU time of the yielding threads alone.
    pub yielder_cpu_ns: u64,
    pub decisions: u64,
    pub timeouts: u64,
    /// Control periods, and how many of them ran with retention on.
    pub periods: u64,
    pub retention_on_periods: u64,
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
    /// Retention as already decided, with where its calibration came from, as
    /// [`retention_plan`] returns them (`compare` calibrates once for all its runs); `None`
    /// decides it at start.
    pub retention_plan: Option<(RetentionPlan, Option<CalibrationSource>)>,
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

/// Retention as decided at start: its parameters, or why it stays off.
#[derive(Debug, Clone, PartialEq)]
pub enum RetentionPlan {
    /// `measured`: the wakeups behind a calibrated timeout (`None` when configured, or when
    /// the measurement failed and a default is used).
    On { config: RetentionConfig, measured: Option<WakeupCosts> },
    /// Asked for, but measured not to pay on this machine; `timeout_ns` and
    /// `idle_threshold_ns` are the calibrated ones (`CalibrationResults`), with which the
    /// governor keeps the threads ready (the timeout is the cap of the adaptive ones).
    Off { why: String, measured: WakeupCosts, timeout_ns: u64, idle_threshold_ns: u64 },
}

impl RetentionPlan {
    /// The wakeup medians the decision was made from, if it was measured.
    pub fn measured(&self) -> Option<WakeupCosts> {
        match self {
            Self::On { measured, .. } => *measured,
            Self::Off { measured, .. } => Some(*measured),
        }
    }
}

/// Decides the retention parameters: configured values, or the calibration of this machine,
/// which is read from the run dir's record when one is valid and measured (and stored)
/// otherwise ([`crate::cache`]). Returns where the numbers came from (`None`: all configured).
///
/// A calibrated timeout comes with a second measurement: how fast a vCPU idle for exactly
/// the timeout wakes. If the host already keeps halted vCPUs polling that long (KVM halt
/// polling), retention would burn CPU for nothing and starts off (the verdict,
/// [`gleaner_policy::retention::retention_verdict`], is the governor's prior; see
/// `RetentionSetup::decide`). A configured `timeout_us` skips the
/// wakeup measurements and always retains; its idle threshold then comes from a valid record
/// or a quick sample.
///
/// The lines printed here start with `gleaner: calibrated retention timeout` or
/// `gleaner: retention off:`; keep those prefixes (guest console logs are read for them; the
/// lab itself now reads `gleaner calibrate --json`).
pub fn retention_plan(cfg: &AgentConfig, cpus: &CpuSet, quiet: bool) -> (RetentionPlan, Option<CalibrationSource>) {
    let policy = cfg.cache_policy();
    let world = crate::cache::World::real();
    let on = |timeout_ns: u64, idle_threshold_ns: u64, measured: Option<WakeupCosts>| RetentionPlan::On {
        config: retention_config(cfg, timeout_ns, idle_threshold_ns),
        measured,
    };
    if let Some(us) = cfg.timeout_us {
        if let Some(t) = cfg.idle_threshold_us {
            return (on(us * 1000, t * 1000, None), None);
        }
        let (idle, source) = crate::cache::idle_threshold(&policy, &world, cpus, crate::calibrate::idle_threshold_now);
        return (on(us * 1000, idle, None), Some(source));
    }
    let got = crate::cache::obtain(&policy, &world, cpus, || crate::calibrate::measure(cpus));
    let source = got.source;
    let from = format!("[calibration {}]", source.describe());
    let r = match got.results {
        Ok(r) => r,
        Err(inc) => {
            warn!("{} {from}", inc.error);
            return (on(inc.timeout_ns, inc.idle_threshold_ns, None), Some(source));
        }
    };
    let Some(why) = retention_off_reason(&r) else {
        if !quiet {
            eprintln!("gleaner: calibrated retention timeout {} us ({}) {from}", r.timeout_ns / 1000, medians(&r));
        }
        return (on(r.timeout_ns, r.idle_threshold_ns, Some(r.wakeup_costs)), Some(source));
    };
    if !quiet {
        let governed = if governed(cfg) { "; the governor re-checks it while running" } else { "" };
        eprintln!("gleaner: retention off: {why}{governed}; --timeout-us forces it {from}");
    }
    let (timeout_ns, idle_threshold_ns) = (r.timeout_ns, r.idle_threshold_ns);
    (RetentionPlan::Off { why, measured: r.wakeup_costs, timeout_ns, idle_threshold_ns }, Some(source))
}

/// The three wakeup medians of a calibration, in one phrase.
pub fn medians(r: &CalibrationResults) -> String {
    let (t, m) = (r.timeout_ns, r.wakeup_costs);
    format!(
        "wakeup mean: {} us busy vCPU, {} us after {} us idle, {} us after {} us idle",
        m.busy_ns / 1000,
        m.idle_at_timeout_ns / 1000,
        t / 1000,
        m.idle_long_ns / 1000,
        crate::calibrate::LONG_GAP_US
    )
}

/// Why retention stays off with these numbers (`None`: it pays).
pub fn retention_off_reason(r: &CalibrationResults) -> Option<String> {
    match r.verdict {
        RetentionVerdict::Pays => None,
        RetentionVerdict::HostPolls => {
            Some(format!("the host polls halted vCPUs for at least the {} us timeout ({})", r.timeout_ns / 1000, medians(r)))
        }
        RetentionVerdict::NoHaltPenalty => Some(format!("no halt penalty to hide ({})", medians(r))),
    }
}

/// The yielding threads' configuration for a timeout (configured or calibrated) and an idle
/// threshold (calibrated: from the record, or sampled where there is none), unless the idle
/// threshold is configured. The timeout adapts per vCPU (with this timeout as its cap) unless
/// adaptation is off or the timeout was configured.
pub fn retention_config(cfg: &AgentConfig, timeout_ns: u64, idle_threshold_ns: u64) -> RetentionConfig {
    RetentionConfig {
        idle_threshold_ns: cfg.idle_threshold_us.map_or(idle_threshold_ns, |u| u * 1000),
        timeout_ns,
        max_sleep_ns: cfg.max_sleep_ms * 1_000_000,
        step_aside_ns: cfg.step_aside_us * 1_000,
        adapt: governed(cfg),
        ..RetentionConfig::default()
    }
}

/// Whether retention adapts and is governed online: asked for, and the timeout not pinned.
pub fn governed(cfg: &AgentConfig) -> bool {
    cfg.adapt && cfg.timeout_us.is_none()
}

/// Retention for one run: the yielding threads' configuration (`None`: no threads), the mode
/// they start in, whether the governor runs, why retention started off, and where the
/// calibration came from.
struct RetentionSetup {
    config: Option<RetentionConfig>,
    start: RetentionMode,
    governor: Option<RetentionGovernor>,
    note: Option<String>,
    calibration: Option<CalibrationSource>,
}

impl RetentionSetup {
    /// Takes the start-up plan (`opts.retention_plan`, or [`retention_plan`] now: the
    /// calibration cache's numbers and verdict) as the governor's prior. Without the
    /// governor, as before it: on with the plan's timeout, or no threads.
    /// `workload`: there is a workload whose progress the governor can measure (the daemon
    /// without targets has none: its timeouts adapt, but the start-up verdict holds).
    fn decide(cfg: &AgentConfig, cpus: &CpuSet, opts: &RunOptions, workload: bool) -> Self {
        let off = |note, calibration| Self { config: None, start: RetentionMode::Off, governor: None, note, calibration };
        if !cfg.retention {
            return off(None, None);
        }
        let (plan, calibration) = opts.retention_plan.clone().unwrap_or_else(|| retention_plan(cfg, cpus, opts.quiet));
        let strength = plan.measured().map_or(PriorStrength::Plain, |m| PriorStrength::of(&m));
        let (config, verdict, note) = match plan {
            RetentionPlan::On { config, .. } => (config, RetentionMode::On, None),
            RetentionPlan::Off { why, .. } if !governed(cfg) => return off(Some(why), calibration),
            RetentionPlan::Off { why, timeout_ns, idle_threshold_ns, .. } => {
                (retention_config(cfg, timeout_ns, idle_threshold_ns), RetentionMode::Off, Some(why))
            }
        };
        if !governed(cfg) || !workload {
            return match verdict {
                RetentionMode::On => Self { config: Some(config), start: RetentionMode::On, governor: None, note, calibration },
                RetentionMode::Off => off(note, calibration),
            };
        }
        let (start, strength) = match cfg.retention_start {
            RetentionStart::Calibrated => (verdict, strength),
            RetentionStart::On => (RetentionMode::On, PriorStrength::Plain),
            RetentionStart::Off => (RetentionMode::Off, PriorStrength::Plain),
        };
        // A prior measured to gain little or to make wakeups slower (a busy vCPU wakes barely
        // faster, or slower, than a halted one: TCG, a co-runner on the pCPUs) is probed late
        // and rarely, so short runs never pay for a probe (PriorStrength::of).
        let governor = Some(RetentionGovernor::with_prior(cfg.governor, start, strength));
        Self { config: Some(config), start, governor, note, calibration }
    }
}

/// Why consolidation cannot run here, if it cannot.
fn consolidation_blocker(cgroups: &gleaner_os::Result<Cgroups>) -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not running as root (no permission to manage cpuset cgroups)".into());
    }
    match cgroups {
        Ok(_) => None,
        Err(e) => Some(format!("no usable cpuset cgroup ({e:#})")),
    }
}

/// The managed workload's cgroup and how to list its threads.
struct Managed {
    cgroup: Option<CpusetCgroup>,
    /// Root of the process tree when there is no cgroup (retention only).
    root_pid: Option<i32>,
}

impl Managed {
    fn tids(&self, procfs: &Procfs) -> Vec<i32> {
        if let Some(cg) = &self.cgroup {
            if let Ok(t) = cg.threads() {
                return t;
            }
        }
        let Some(pid) = self.root_pid else {
            return Vec::new();
        };
        let pids = procfs.descendants(pid, true).unwrap_or_default();
        let mut tids = Vec::new();
        for p in pids {
            tids.extend(procfs.tasks(p).unwrap_or_default());
        }
        tids.sort_unstable();
        tids.dedup();
        tids
    }
}

impl Managed {
    /// The target ended: a process no longer alive, a cgroup with no process left (a command
    /// of ours ends through its exit status instead).
    fn workload_gone(&self, target: &Target) -> bool {
        match target {
            Target::Pid(pid) => !gleaner_os::procfs::alive(*pid),
            Target::Cgroup(_) => self.cgroup.as_ref().is_some_and(|c| c.exists() && c.procs().map(|p| p.is_empty()).unwrap_or(true)),
            Target::Command(_) | Target::System => false,
        }
    }

    /// Gives the workload the vCPUs `active` (it had `before`). A refused write gives every
    /// managed vCPU back and says what was refused.
    fn apply(&self, active: &CpuSet, before: &CpuSet, all: &CpuSet) -> Result<(), String> {
        let Some(cg) = &self.cgroup else { return Ok(()) };
        match cg.set_cpus(active) {
            Ok(()) => {
                if active.len() < before.len() {
                    crate::seam::stop_at(crate::seam::AFTER_SHRINK);
                }
                Ok(())
            }
            Err(e) => {
                let what = format!("writing CPUs {active} to {} was refused ({:#})", cg.path().display(), anyhow::Error::from(e));
                let _ = cg.set_cpus(all);
                Err(what)
            }
        }
    }
}

/// What a period ended with, for [`Session::publish`].
struct PeriodEnd {
    t_ms: u64,
    /// The workload's vCPUs after the period's decisions.
    active: CpuSet,
    metrics: Metrics,
    decisions: Vec<Decision>,
    extras: crate::sampler::PeriodExtras,
    /// The retention mode the period ran in (`None`: no yielding threads).
    ran: Option<RetentionMode>,
    reading: EpochReading,
    step: Option<GovernorStep>,
}

/// Waits for the end of the period, the workload's exit or a signal; `true` when the run ends
/// (the exit status or the signal recorded in `outcome`; a signal is passed on to a workload
/// of ours, which gets 5 s to go).
fn wait_period(
    waiter: Option<&ChildWaiter>,
    period: Duration,
    child_pid: Option<i32>,
    workload_start: Instant,
    outcome: &mut Outcome,
) -> anyhow::Result<bool> {
    if let Some(w) = waiter {
        if let Some((code, ru)) = w.wait(period)? {
            outcome.workload_wall_ns = duration_ns(workload_start.elapsed());
            outcome.exit_code = Some(code);
            outcome.rusage = Some(ru);
            return Ok(true);
        }
    } else {
        sleep_interruptible(period);
    }
    let Some(sig) = pending_signal() else { return Ok(false) };
    outcome.signal = Some(sig);
    if let Some(pid) = child_pid {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::try_from(sig).ok());
        if let Some((code, ru)) = waiter.map(|w| w.wait(Duration::from_secs(5))).transpose()?.flatten() {
            outcome.exit_code = Some(code);
            outcome.rusage = Some(ru);
        }
    }
    Ok(true)
}

/// The controller's decisions for a period: none in a probe period (the readings are the
/// probe's) or with consolidation off (the controller still learns, then goes back to every
/// vCPU).
fn decide(controller: &mut Controller, snap: &Snapshot, probe: bool, consolidation: bool) -> Vec<Decision> {
    if probe {
        Vec::new()
    } else if consolidation {
        controller.step(snap)
    } else {
        let _ = controller.step(snap);
        controller.reset();
        Vec::new()
    }
}

/// Consolidation is off for the rest of the run: said once on stderr (`why`, then what happens
/// to the workload), the controller back to every vCPU, and the status says why.
fn stop_consolidation(controller: &mut Controller, consolidation: &mut bool, status: &SharedStatus, why: String, then: &str) {
    eprintln!("gleaner: {why}; consolidation stopped{then}");
    controller.reset();
    *consolidation = false;
    if let Ok(mut st) = status.lock() {
        st.consolidation = false;
        st.note = Some(why);
    }
}

/// The cpuset cgroup (absolute path) process `pid` is in: where it goes back to.
fn own_cpuset_cgroup(cgroups: &Cgroups, procfs: &Procfs, pid: i32) -> anyhow::Result<PathBuf> {
    let lines = procfs.cgroup_of(pid).with_context(|| format!("reading the cgroups of pid {pid}"))?;
    let v1 = cgroups.layout().version() == 1;
    let rel = lines
        .iter()
        .find(|(id, ctrl, _)| if v1 { ctrl.iter().any(|c| c == "cpuset") } else { *id == 0 && ctrl.is_empty() })
        .map(|(_, _, path)| path.clone())
        .with_context(|| format!("pid {pid} is in no cpuset cgroup"))?;
    Ok(cgroups.root().join(rel.trim_start_matches('/')))
}

/// The status socket in the (private) run directory.
fn serve_status(cfg: &AgentConfig, status: &SharedStatus) -> anyhow::Result<Server> {
    crate::state::create_private_dir(&cfg.run_dir)?;
    server::serve_status(&server::socket_path(&cfg.run_dir, std::process::id().cast_signed()), Arc::clone(status))
}

/// Refuses `attach --pid` of a process another live agent already manages (it is in that
/// agent's `gleaner-agent-<pid>` cgroup): two agents would fight over its cpuset.
fn refuse_if_managed(cgroups: &Cgroups, procfs: &Procfs, pid: i32) -> anyhow::Result<()> {
    let Ok(current) = own_cpuset_cgroup(cgroups, procfs, pid) else {
        return Ok(());
    };
    let name = current.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let me = std::process::id().cast_signed();
    if let Some(agent) = name.strip_prefix("gleaner-agent-").and_then(|p| p.parse::<i32>().ok()).filter(|a| *a != me) {
        if gleaner_os::procfs::alive(agent) {
            return Err(BadInput::new(
                "--pid",
                pid,
                format!(
                    "a process no other gleaner agent manages (agent {agent} manages it, in {}; stop that agent first)",
                    current.display()
                ),
            )
            .into());
        }
    }
    Ok(())
}

/// Takes the exclusive lock that says "an agent manages this cgroup"; refuses when another
/// agent holds it.
fn lock_managed(path: &Path, what: &str) -> anyhow::Result<gleaner_os::private::DirLock> {
    match gleaner_os::private::try_lock_dir(path)? {
        Some(lock) => Ok(lock),
        None => Err(BadInput::new(
            what,
            path.display(),
            "a cgroup no other gleaner agent manages (another agent holds its lock; stop that agent first)",
        )
        .into()),
    }
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
        if *pid <= 0 || !gleaner_os::procfs::alive(*pid) {
            return Err(BadInput::new("--pid", pid, "the pid of a running process").into());
        }
    }
    install_signal_handlers()?;
    let start = Instant::now();
    let agent_pid = std::process::id().cast_signed();

    let cgroups = Cgroups::detect();
    if let (Target::Pid(pid), Ok(cg)) = (&target, &cgroups) {
        refuse_if_managed(cg, &procfs, *pid)?;
    }
    let mut note = None;
    let consolidation = cfg.consolidation && !matches!(target, Target::System) && {
        note = consolidation_blocker(&cgroups);
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

    let mut retention = RetentionSetup::decide(cfg, &cpus, opts, !matches!(target, Target::System));
    let rcfg = retention.config;

    let status: SharedStatus = Arc::new(Mutex::new(StatusReport {
        agent_pid,
        target: target.describe(),
        retention: rcfg.is_some(),
        retention_note: retention.note.clone(),
        calibration: retention.calibration.take(),
        retention_mode: rcfg.map(|_| retention.start),
        governor: retention.governor.as_ref().map(RetentionGovernor::state),
        adaptive_timeout: rcfg.is_some_and(|r| r.adapt),
        consolidation,
        note: note.clone(),
        all_cpus: cpus.to_string(),
        active_cpus: cpus.to_string(),
        timeout_us: rcfg.map(|r| r.timeout_ns / 1000).unwrap_or(0),
        idle_threshold_us: rcfg.map(|r| r.idle_threshold_ns / 1000).unwrap_or(0),
        period_ms: cfg.period_ms,
        ..StatusReport::default()
    }));

    // Everything from here on is undone by `Session::finish`.
    let mut session =
        Session { locks: Vec::new(), state: None, guardian: None, cgroups: cgroups.ok(), yielders: None, servers: Vec::new() };
    let ctx = RunContext { target: &target, cfg, opts, cpus: &cpus, status: &status, procfs: &procfs, sysfs: &sysfs, start };
    let result = session.run_inner(&ctx, consolidation, retention);
    let finish = session.finish();
    let mut outcome = result?;
    finish?;
    outcome.wall_ns = duration_ns(start.elapsed());
    outcome.agent_cpu_ns = self_cpu_ns().unwrap_or(0);
    outcome.final_status = status.lock().map(|s| s.clone()).unwrap_or_default();
    let f = &outcome.final_status;
    info!(
        "done: {} periods, {} decisions, {} yields, {} timeouts, {} step-asides, yielders {} ms CPU",
        f.periods,
        f.decisions,
        f.yields,
        f.timeouts,
        f.step_asides,
        f.yielder_cpu_ns / 1_000_000
    );
    Ok(outcome)
}

/// What every phase of a run reads: the target, configuration and the shared status.
#[derive(Clone, Copy)]
struct RunContext<'a> {
    target: &'a Target,
    cfg: &'a AgentConfig,
    opts: &'a RunOptions,
    cpus: &'a CpuSet,
    status: &'a SharedStatus,
    procfs: &'a Procfs,
    sysfs: &'a Sysfs,
    start: Instant,
}

struct Session {
    /// `flock`s on the managed cgroup: a second agent asked to manage it is refused.
    locks: Vec<gleaner_os::private::DirLock>,
    state: Option<StateFile>,
    guardian: Option<Guardian>,
    cgroups: Option<Cgroups>,
    yielders: Option<Yielders>,
    servers: Vec<Server>,
}

impl Session {
    /// Set-up, then the control loop until the workload ends, a signal arrives or the target
    /// is taken away. Phases: [`Session::take_target`] (journal, guardian, cgroup) ->
    /// yielders -> workload -> every period: [`wait_period`] -> sample -> [`decide`] ->
    /// apply ([`Managed::apply`]) -> govern (`RetentionGovernor::step`) ->
    /// [`Session::publish`] (events, outcome, status).
    fn run_inner(&mut self, ctx: &RunContext<'_>, mut consolidation: bool, retention: RetentionSetup) -> anyhow::Result<Outcome> {
        let RunContext { target, cfg, opts, cpus, status, procfs, sysfs, start } = *ctx;
        let mut child_pid = None;
        let mut workload_start = Instant::now();

        // Status first: once the workload is in our cgroup, `gleaner status` must find us (a
        // test raced the old order, which opened the socket after starting the yielders).
        // (With consolidation, right after the guardian starts: a kill -9 at any moment then
        // leaves no socket either, as the guardian removes it.)
        if opts.status_socket && !consolidation {
            self.servers.push(serve_status(cfg, status)?);
        }
        if let Some(addr) = &cfg.metrics_addr {
            self.servers.push(server::serve_metrics(addr, Arc::clone(status))?);
        }
        let mut managed = if consolidation { self.take_target(ctx)? } else { Managed { cgroup: None, root_pid: None } };

        // Yielding threads first, so the workload has them from its first instruction (parked
        // if retention starts off: the governor may turn them on).
        if let Some(r) = retention.config {
            self.yielders = Some(Yielders::start(cpus, r, retention.start.is_on())?);
        }
        let mut governor = retention.governor;
        if let Some(g) = self.guardian.as_mut() {
            g.wait_armed(Duration::from_secs(5))?;
        }
        if let Target::Command(argv) = target {
            workload_start = Instant::now();
            let pid = spawn_command(argv, managed.cgroup.as_ref(), opts)?;
            child_pid = Some(pid);
            managed.root_pid = Some(pid);
        } else if let Target::Pid(pid) = target {
            managed.root_pid = Some(*pid);
        }

        let mut events = cfg.events.as_deref().map(EventLog::open).transpose()?;
        if !opts.quiet {
            info!("managing {} on CPUs {cpus}", target.describe());
        }

        if let (Some(log), Some(_)) = (&mut events, &self.yielders) {
            let start = EventRecord {
                retention: Some(retention.start),
                governor: governor.as_ref().map(RetentionGovernor::state),
                ..EventRecord::new(0, EventKind::Retention, cpus.to_string(), Default::default())
            };
            log.write(&start)?;
        }

        let mut controller = Controller::new(cpus.iter().collect(), cfg.controller.clone());
        let mut sampler = Sampler::new(procfs.clone(), sysfs.clone());
        sampler.prime(&managed.tids(procfs), self.yielders.as_ref(), cpus);
        let waiter = child_pid.map(ChildWaiter::new).transpose()?;
        let period = Duration::from_millis(cfg.period_ms);
        let mut outcome = Outcome::default();

        loop {
            if wait_period(waiter.as_ref(), period, child_pid, workload_start, &mut outcome)? || managed.workload_gone(target) {
                break;
            }
            // Someone else removed the cgroup we manage (they had to move the workload out
            // first): there is nothing left to consolidate.
            if let Some(gone) = managed.cgroup.as_ref().filter(|c| !c.exists()).map(|c| c.path().to_path_buf()) {
                let what = format!("the workload's cgroup {} was removed by someone else", gone.display());
                if !matches!(target, Target::Command(_)) {
                    outcome.lost = Some(what);
                    break;
                }
                // A `run` workload is ours to wait for: it runs on, unmanaged, and its exit
                // status stays the run's.
                managed.cgroup = None;
                stop_consolidation(&mut controller, &mut consolidation, status, what, ", the workload runs on where it was moved");
                if let Some(y) = &self.yielders {
                    y.set_active(cpus);
                }
            }

            // Sample.
            let tids = managed.tids(procfs);
            let active_before = CpuSet::from_iter(controller.active().iter().copied());
            let (snap, extras) = sampler.sample(&tids, self.yielders.as_ref(), &active_before);
            // Decide. A probe period's readings are the probe's (retention in the other mode):
            // the controller does not judge the workload by them.
            let probe = governor.as_ref().is_some_and(RetentionGovernor::probing);
            let decisions = decide(&mut controller, &snap, probe, consolidation);
            // Apply.
            let active = CpuSet::from_iter(controller.active().iter().copied());
            if active != active_before {
                if let Err(what) = managed.apply(&active, &active_before, cpus) {
                    // Refused (a read-only file, a security module, a cpuset rule of the
                    // parent): stop consolidating rather than retrying every period.
                    let then = format!(" for the rest of this run, the workload keeps CPUs {cpus}");
                    stop_consolidation(&mut controller, &mut consolidation, status, what, &then);
                }
                if let Some(y) = &self.yielders {
                    y.set_active(&CpuSet::from_iter(controller.active().iter().copied()));
                }
            }
            // Retention: the governor reads the period that just ended and picks the mode of
            // the next one.
            let ran = self.yielders.as_ref().map(|y| if y.retaining() { RetentionMode::On } else { RetentionMode::Off });
            let reading = EpochReading {
                duration_ns: snap.period_ns,
                progress: snap.s_work,
                yielder_cpu_ns: extras.yielder_run_ns,
                active_vcpus: u32::try_from(active_before.len()).unwrap_or(u32::MAX),
            };
            let step = match (&mut governor, &self.yielders) {
                (Some(g), Some(y)) => {
                    let st = g.step(&reading);
                    y.set_retention(st.mode.is_on());
                    y.hold_timeouts(st.hold_timeouts);
                    Some(st)
                }
                _ => None,
            };
            // Publish.
            let ended = PeriodEnd {
                t_ms: u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
                active,
                metrics: controller.metrics(),
                decisions,
                extras,
                ran,
                reading,
                step,
            };
            self.publish(ctx, ended, &controller, governor.as_ref(), events.as_mut(), &mut outcome)?;
        }
        // The last, partial period: what the run ended with and what the agent cost in all.
        if let Some(log) = &mut events {
            let t_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
            let active = CpuSet::from_iter(controller.active().iter().copied());
            log.write(&EventRecord {
                agent_cpu_ns: self_cpu_ns(),
                ..EventRecord::new(t_ms, EventKind::Exit, active.to_string(), controller.metrics())
            })?;
        }
        Ok(outcome)
    }

    /// Publishes a period: its events (decisions, the period, a retention change) to the log,
    /// its counts to the outcome, and the live status.
    fn publish(
        &self,
        ctx: &RunContext<'_>,
        p: PeriodEnd,
        controller: &Controller,
        governor: Option<&RetentionGovernor>,
        events: Option<&mut EventLog>,
        outcome: &mut Outcome,
    ) -> anyhow::Result<()> {
        let event = |kind: EventKind| EventRecord::new(p.t_ms, kind, p.active.to_string(), p.metrics);
        let mut records: Vec<EventRecord> =
            p.decisions.iter().map(|d| EventRecord { decision: Some(d.clone()), ..event(EventRecord::kind_of(d)) }).collect();
        records.push(EventRecord {
            count: Some(p.extras.timeouts),
            vcpus: self.yielders.as_ref().map(|_| p.extras.vcpus.clone()),
            retention: p.ran,
            reading: p.step.map(|_| p.reading),
            comparison: p.step.and_then(|s| s.comparison),
            agent_cpu_ns: self_cpu_ns(),
            ..event(EventKind::Period)
        });
        if let Some(GovernorStep { mode, change: Some(change), comparison, .. }) = p.step {
            records.push(EventRecord {
                retention: Some(mode),
                change: Some(change),
                comparison,
                governor: governor.map(RetentionGovernor::state),
                ..event(EventKind::Retention)
            });
            if change.cause == gleaner_policy::retention::ChangeCause::Switch && !ctx.opts.quiet {
                let why = comparison
                    .map(|c| format!(" (sync points/s {:.0} on vs {:.0} off, {:.2} vCPU burned)", c.on_rate, c.off_rate, c.burn_vcpus));
                info!("retention {:?} -> {:?}{}", change.from, change.to, why.unwrap_or_default());
            }
        }
        if !ctx.opts.quiet {
            for d in &p.decisions {
                info!("{}", describe(d));
            }
        }
        if let Some(log) = events {
            for r in &records {
                log.write(r)?;
            }
        }
        outcome.decisions += p.decisions.len() as u64;
        outcome.timeouts += p.extras.timeouts;
        outcome.yielder_cpu_ns += p.extras.yielder_run_ns;
        outcome.periods += 1;
        outcome.retention_on_periods += u64::from(p.ran == Some(RetentionMode::On));
        if let Ok(mut s) = ctx.status.lock() {
            s.retention_mode = self.yielders.as_ref().map(|y| if y.retaining() { RetentionMode::On } else { RetentionMode::Off });
            s.governor = governor.map(RetentionGovernor::state);
            s.active_cpus = controller.active().iter().copied().collect::<CpuSet>().to_string();
            s.metrics = p.metrics;
            s.uptime_s = ctx.start.elapsed().as_secs_f64();
            s.add_period(&p.extras, p.decisions.len() as u64, records);
        }
        Ok(())
    }

    /// Consolidation's set-up, each change journaled before it is made: the state file and its
    /// guardian, the status socket, then the workload's cgroup (created, or the given one taken
    /// over and locked).
    fn take_target(&mut self, ctx: &RunContext<'_>) -> anyhow::Result<Managed> {
        let RunContext { target, cfg, opts, cpus, status, procfs, .. } = *ctx;
        let agent_pid = std::process::id().cast_signed();
        let mut managed = Managed { cgroup: None, root_pid: None };
        let cgroups = self.cgroups.as_ref().context("cgroups vanished")?;
        // An existing group to take over is opened and locked before any change: a second
        // agent on it stops here, having done nothing.
        let given = match target {
            Target::Cgroup(p) => {
                let cg = cgroups.open(p).map_err(|e| BadInput::new("--cgroup", p.display(), format!("an existing cpuset cgroup ({e})")))?;
                self.locks.push(lock_managed(cg.path(), "--cgroup")?);
                Some(cg)
            }
            _ => None,
        };
        crate::seam::stop_at(crate::seam::BEFORE_JOURNAL);
        let mut state = StateFile::create(&cfg.run_dir, agent_pid)?;
        self.guardian = Some(Guardian::spawn(state.path())?);
        if opts.status_socket {
            self.servers.push(serve_status(cfg, status)?);
        }
        let fallback = own_cpuset_cgroup(cgroups, procfs, agent_pid)?;
        match target {
            Target::Command(_) | Target::Pid(_) => {
                let name = format!("gleaner-agent-{agent_pid}");
                let path = cgroups.root().join(&name);
                state.record(Change::CreatedCgroup { path: path.clone(), fallback: fallback.clone() })?;
                crate::seam::stop_at(crate::seam::JOURNALED);
                let cg = cgroups.create(Path::new(""), &name)?;
                self.locks.push(lock_managed(cg.path(), "cgroup")?);
                for dir in cg.enabled_cpuset_in() {
                    state.record(Change::EnabledCpuset { dir: dir.clone() })?;
                }
                cg.set_cpus(cpus)?;
                if let Target::Pid(pid) = target {
                    let pids = procfs.descendants(*pid, true).unwrap_or_default();
                    for p in pids {
                        let from = own_cpuset_cgroup(cgroups, procfs, p)?;
                        state.record(Change::MovedProcess { pid: p, from, to: cg.path().to_path_buf() })?;
                        cg.add_process(p).with_context(|| format!("moving pid {p} into {}", cg.path().display()))?;
                    }
                    managed.root_pid = Some(*pid);
                }
                managed.cgroup = Some(cg);
            }
            Target::System => unreachable!("no consolidation without a workload"),
            Target::Cgroup(_) => {
                let cg = given.context("the --cgroup group was opened above")?;
                let original = cg.cpus()?.to_string();
                state.record(Change::SetCpus { path: cg.path().to_path_buf(), original })?;
                cg.set_cpus(cpus)?;
                managed.cgroup = Some(cg);
            }
        }
        self.state = Some(state);
        Ok(managed)
    }

    /// Undoes everything, in reverse order of setup. Runs on every exit path.
    fn finish(&mut self) -> anyhow::Result<()> {
        if let Some(mut y) = self.yielders.take() {
            y.stop();
        }
        let mut result = Ok(());
        let mut undone = false;
        if let Some(state) = self.state.take() {
            if let Some(cg) = &self.cgroups {
                result = state.undo(cg);
                // `undo` removes the state file even when a step failed: nothing is left
                // for the guardian (`gleaner restore` finds orphan groups by name).
                undone = true;
            }
        }
        if let Some(g) = self.guardian.take() {
            if undone {
                g.dismiss();
            } else {
                g.finish();
            }
        }
        for s in self.servers.drain(..) {
            s.stop();
        }
        result
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

/// Starts `argv` with its own stdin/stderr; it joins `cgroup` before exec, so every thread it
/// ever creates is inside.
fn spawn_command(argv: &[String], cgroup: Option<&CpusetCgroup>, opts: &RunOptions) -> anyhow::Result<i32> {
    let (prog, args) = argv.split_first().ok_or_else(|| BadInput::new("command", "(empty)", "a program and its arguments after --"))?;
    let mut cmd = Command::new(prog);
    cmd.args(args);
    if let Some(p) = &opts.stdout_to {
        let f = std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
        cmd.stdout(f);
    }
    if let Some(p) = &opts.stderr_to {
        let f = std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
        cmd.stderr(f);
    }
    if let Some(cg) = cgroup {
        // v1 `tasks`: the child is single-threaded here, and a thread move skips the kernel lock
        // a `cgroup.procs` write waits on (5-19 ms per new group measured here).
        let join = CString::new(cg.self_join_file().into_os_string().into_encoded_bytes()).context("cgroup path")?;
        // SAFETY: the closure runs in the forked child before exec and only calls the
        // async-signal-safe open(2), write(2) and close(2) on memory allocated before fork.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(join.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let r = libc::write(fd, b"0\n".as_ptr().cast(), 2);
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if r < 0 {
                    return Err(err);
                }
                Ok(())
            });
        }
    }
    let child = cmd.spawn().map_err(|e| BadInput::new("command", prog, format!("a program that can be started ({e})")))?;
    Ok(child.id().cast_signed())
}

/// Fails early (before any change) if `argv[0]` cannot be found or executed.
pub fn check_program(argv: &[String]) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let prog = argv.first().ok_or_else(|| BadInput::new("command", "(empty)", "a program and its arguments after --"))?;
    let runnable = |p: &Path| p.is_file() && p.metadata().map(|m| m.permissions().mode() & 0o111 != 0).unwrap_or(false);
    let found = if prog.contains('/') {
        runnable(Path::new(prog))
    } else {
        std::env::var_os("PATH").map(|path| std::env::split_paths(&path).any(|d| runnable(&d.join(prog)))).unwrap_or(false)
    };
    if found {
        Ok(())
    } else {
        Err(BadInput::new("command", prog, "an executable file, or a program on PATH").into())
    }
}

/// Waits for a child with a timeout, through a pidfd (no polling loop).
struct ChildWaiter {
    pid: i32,
    pidfd: std::os::fd::OwnedFd,
}

impl ChildWaiter {
    fn new(pid: i32) -> anyhow::Result<Self> {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("pidfd_open");
        }
        let fd = i32::try_from(fd).context("pidfd out of range")?;
        // SAFETY: `fd` is a freshly opened descriptor that nothing else owns.
        let pidfd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        Ok(Self { pid, pidfd })
    }

    /// Returns the exit code and rusage if the child exited within `timeout` (or a signal
    /// interrupted the wait and it has exited).
    fn wait(&self, timeout: Duration) -> anyhow::Result<Option<(i32, Rusage)>> {
        if !gleaner_os::fd::wait_readable(&self.pidfd, timeout) {
            return Ok(None);
        }
        let (status, ru) = gleaner_os::rusage::wait4(self.pid).with_context(|| format!("waiting for pid {}", self.pid))?;
        Ok(Some((status.code(), ru)))
    }
}

/// The agent's own CPU time so far (every thread), if it can be read.
fn self_cpu_ns() -> Option<u64> {
    gleaner_os::rusage::self_rusage().ok().map(|r| r.user_ns + r.sys_ns)
}

fn sleep_interruptible(d: Duration) {
    let end = Instant::now() + d;
    while pending_signal().is_none() {
        let now = Instant::now();
        if now >= end {
            break;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
