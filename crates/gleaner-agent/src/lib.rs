//! The Gleaner guest agent: resource retention and consolidation scheduling (Gleaner paper,
//! sections 4 to 6) at user level, for a VM user who cannot touch the hypervisor.
//!
//! - [`agent`]: the loop that samples, decides (with `gleaner_policy::gleaner::Controller`)
//!   and applies, and undoes everything on every exit path.
//! - [`yielders`]: the `SCHED_IDLE` yielding threads (retention mechanism).
//! - [`sampler`]: metric snapshots from procfs/sysfs.
//! - [`state`]: the state file, the guardian process and `restore`.
//! - [`report`]: status socket, Prometheus text, JSON-lines events.
//! - [`compare`]: the main job, stock vs Gleaner side by side.

pub mod agent;
pub mod cache;
pub mod calibrate;
pub mod compare;
pub mod config;
pub mod report;
pub mod sampler;
pub mod seam;
pub mod state;
pub mod yielders;

use std::path::PathBuf;
use std::process::ExitCode;

use config::AgentConfig;

/// Flags shared by `run` and `attach` (they override the `--config` file).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AgentFlags {
    /// TOML configuration file (see `gleaner daemon --print-config`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Do not run yielding threads (measure consolidation alone).
    #[arg(long)]
    pub no_retention: bool,
    /// Do not change the workload's cpuset (measure retention alone).
    #[arg(long)]
    pub no_consolidation: bool,
    /// Sleep (microseconds, 0..=1000) of a yielding thread that steps aside so the kernel can
    /// pull a thread waiting on another vCPU; 0 never steps aside (see docs/agent.md).
    #[arg(long, value_name = "US")]
    pub step_aside_us: Option<u64>,
    /// Control period in milliseconds (10..=10000).
    #[arg(long, value_name = "MS")]
    pub period_ms: Option<u64>,
    /// Retention timeout in microseconds. Default: calibrated from a measured vCPU wakeup (once
    /// per boot, see `calibrate`; the cap of each vCPU's adaptive timeout), and retention
    /// starts off where the host already polls halted vCPUs that long; giving a timeout skips
    /// the wakeup measurements, fixes the timeout and always retains (no governor).
    #[arg(long, value_name = "US")]
    pub timeout_us: Option<u64>,
    /// Keep the calibrated timeout fixed and the start-up retention verdict for the whole run
    /// (no per-vCPU adaptation, no governor): retention as before issue 13, for experiments.
    #[arg(long)]
    pub no_adapt: bool,
    /// The governor's first retention mode: the start-up verdict (calibrated), on or off; the
    /// governor then keeps or changes it from what it measures.
    #[arg(long, value_name = "MODE")]
    pub retention_start: Option<config::RetentionStart>,
    /// CPUs to manage (kernel list format, e.g. 0-3); default: every online CPU.
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<String>,
    /// Measure the calibration (wakeup costs, timeout, idle threshold) now even if a valid
    /// record exists in the run dir, and store the new one.
    #[arg(long)]
    pub recalibrate: bool,
    /// Seconds a stored calibration stays valid (0..=31536000; 0 measures at every start).
    /// Default: 86400, or `calibration_max_age_s` of the config file.
    #[arg(long, value_name = "S")]
    pub calibration_max_age_s: Option<u64>,
    /// Serve Prometheus text-format metrics: a port alone (e.g. 9464) listens on 127.0.0.1
    /// only; IP:PORT listens where told (another machine can then read them).
    #[arg(long, value_name = "[IP:]PORT")]
    pub metrics_addr: Option<String>,
    /// Append JSON lines to FILE: every consolidation decision, one `period` line per period
    /// (active vCPUs, timeouts, per-vCPU retention timeouts, retention mode, the agent's own
    /// CPU time), one `retention` line per change of retention mode (with the governor's
    /// state) and one `exit` line when the run ends.
    #[arg(long, value_name = "FILE")]
    pub events: Option<PathBuf>,
    /// Directory of state files, status sockets and the calibration record.
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
}

impl AgentFlags {
    /// The configuration file (if any) with these flags applied on top.
    pub fn resolve(&self) -> anyhow::Result<AgentConfig> {
        let mut cfg = match &self.config {
            Some(p) => AgentConfig::load(p)?,
            None => AgentConfig::default(),
        };
        if self.no_retention {
            cfg.retention = false;
        }
        if self.no_consolidation {
            cfg.consolidation = false;
        }
        if let Some(v) = self.step_aside_us {
            cfg.step_aside_us = v;
        }
        if let Some(v) = self.period_ms {
            cfg.period_ms = v;
        }
        if let Some(v) = self.timeout_us {
            cfg.timeout_us = Some(v);
        }
        if self.no_adapt {
            cfg.adapt = false;
        }
        if let Some(v) = self.retention_start {
            cfg.retention_start = v;
        }
        if let Some(v) = &self.cpus {
            cfg.cpus = Some(v.clone());
        }
        cfg.recalibrate = self.recalibrate;
        if let Some(v) = self.calibration_max_age_s {
            cfg.calibration_max_age_s = v;
        }
        if let Some(v) = &self.metrics_addr {
            cfg.metrics_addr = Some(v.clone());
        }
        if let Some(v) = &self.events {
            cfg.events = Some(v.clone());
        }
        if let Some(v) = &self.run_dir {
            cfg.run_dir = v.clone();
        } else if cfg.run_dir == AgentConfig::default().run_dir {
            cfg.run_dir = default_run_dir();
        }
        cfg.validate()?;
        Ok(cfg)
    }
}

/// `/run/gleaner` for root; /run is root's, so an unprivileged agent keeps its socket and its
/// calibration in its own temp dir.
pub fn default_run_dir() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        AgentConfig::default().run_dir
    } else {
        std::env::temp_dir().join(format!("gleaner-{}", nix::unistd::geteuid()))
    }
}

/// Agent commands.
#[derive(Debug, clap::Subcommand)]
pub enum AgentCommand {
    /// Run CMD under Gleaner: in a cpuset cgroup the agent manages, with yielding threads on
    /// the active vCPUs. Passes CMD's output through and exits with its exit status.
    Run {
        #[command(flatten)]
        flags: AgentFlags,
        /// The command and its arguments.
        #[arg(last = true, required = true, value_name = "CMD")]
        cmd: Vec<String>,
    },
    /// Manage an already running workload: a cgroup (its cpuset.cpus is managed and restored)
    /// or a process and its descendants (moved into a new cgroup and back).
    Attach {
        #[command(flatten)]
        flags: AgentFlags,
        /// Existing cpuset cgroup (absolute path, or relative to the cpuset hierarchy root).
        #[arg(long, value_name = "PATH", conflicts_with = "pid", required_unless_present = "pid")]
        cgroup: Option<PathBuf>,
        /// Process to manage, with its descendants.
        #[arg(long, value_name = "PID")]
        pid: Option<i32>,
    },
    /// Measure this machine's wakeup costs once per boot and store them for the agents.
    ///
    /// Measures a wakeup of a busy and of a halted vCPU, the retention timeout and whether
    /// retention pays, and the idle threshold, and stores them in the run dir, where `run`,
    /// `attach`, `compare` and `daemon` reuse them instead of measuring (about 0.5 s) at every
    /// start. A valid record (same boot, kernel, online CPUs, cpuidle driver and governor,
    /// haltpoll parameters; younger than --max-age-s) is shown, not measured again, unless
    /// --recalibrate.
    Calibrate(CalibrateArgs),
    /// Run as a service (what the systemd unit gleaner.service runs): manage the `[[target]]`s
    /// of the configuration file, or, with none, keep retention on every vCPU of the VM.
    ///
    /// Also keeps the calibration record fresh: renews it before it expires, while the
    /// machine idles. The Debian package installs the unit (neither enabled nor started) and
    /// the sample configuration as /etc/gleaner/gleaner.toml; without it, see the header of
    /// dist/gleaner.service in the source tree.
    Daemon {
        /// Configuration file.
        #[arg(long, value_name = "FILE", default_value = "/etc/gleaner/gleaner.toml")]
        config: PathBuf,
        /// Print a commented sample configuration and exit.
        #[arg(long)]
        print_config: bool,
    },
    /// Live state of the running agents (over their root-only Unix sockets).
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Directory of the agents' sockets.
        #[arg(long, value_name = "DIR", default_value = "/run/gleaner")]
        run_dir: PathBuf,
    },
    /// Undo whatever crashed agents left behind (cpusets, cgroups), from their state files.
    Restore {
        /// Directory of the agents' state files.
        #[arg(long, value_name = "DIR", default_value = "/run/gleaner")]
        run_dir: PathBuf,
    },
    /// The main job: run a workload alternately stock and under Gleaner, N times each, and print
    /// medians, spread and ratios. Default workload: the built-in `pipeline` (dedup-like).
    Compare(compare::CompareArgs),
    /// Internal: the guardian process that restores the agent's changes if it dies.
    #[command(name = "__guardian", hide = true)]
    Guardian {
        #[arg(long)]
        state: PathBuf,
    },
}

/// `gleaner calibrate`
#[derive(Debug, Clone, clap::Args)]
pub struct CalibrateArgs {
    /// Print JSON (the provenance and the stored record).
    #[arg(long)]
    pub json: bool,
    /// Measure even if a valid record exists.
    #[arg(long)]
    pub recalibrate: bool,
    /// Seconds a record stays valid (0..=31536000). Default: 86400.
    #[arg(long, value_name = "S")]
    pub max_age_s: Option<u64>,
    /// Directory of the record (and of the agents' state files and sockets). Default:
    /// /run/gleaner as root, $TMPDIR/gleaner-<uid> otherwise.
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// CPUs the agents will manage (kernel list format); the wakeup is measured between the
    /// first two. Default: every online CPU.
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<String>,
}

/// What `gleaner calibrate --json` prints (the lab reads it back as this type).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CalibrateReport {
    /// Where the numbers came from (cached, or measured now and why).
    pub source: cache::CalibrationSource,
    /// The record read or stored (`None` when the measurement could not be stored).
    pub record: Option<cache::CalibrationRecord>,
    pub results: cache::CalibrationResults,
}

/// Runs an agent command.
pub fn run(cmd: AgentCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        AgentCommand::Run { flags, cmd } => {
            let cfg = flags.resolve()?;
            let opts = agent::RunOptions { status_socket: true, ..Default::default() };
            let out = agent::run(agent::Target::Command(cmd), &cfg, &opts)?;
            Ok(exit_code(out.exit_code.or(out.signal.map(|s| 128 + s)).unwrap_or(1)))
        }
        AgentCommand::Attach { flags, cgroup, pid } => {
            let cfg = flags.resolve()?;
            let target = match (cgroup, pid) {
                (Some(c), None) => agent::Target::Cgroup(c),
                (None, Some(p)) => agent::Target::Pid(p),
                _ => unreachable!("clap enforces exactly one of --cgroup and --pid"),
            };
            let opts = agent::RunOptions { status_socket: true, ..Default::default() };
            let out = agent::run(target, &cfg, &opts)?;
            if let Some(what) = &out.lost {
                // Everything of ours is undone; the target is gone from under us.
                eprintln!("gleaner: stopped managing: {what}");
                return Ok(ExitCode::FAILURE);
            }
            Ok(exit_code(out.signal.map(|s| 128 + s).unwrap_or(0)))
        }
        AgentCommand::Calibrate(args) => calibrate(args),
        AgentCommand::Daemon { config, print_config } => {
            if print_config {
                print!("{}", config::SAMPLE_CONFIG);
                return Ok(ExitCode::SUCCESS);
            }
            daemon(&config)
        }
        AgentCommand::Status { json, run_dir } => status(json, &run_dir),
        AgentCommand::Restore { run_dir } => {
            let cgroups = gleaner_os::cgroup::Cgroups::detect()?;
            let done = state::restore_dead(&run_dir, &cgroups)?;
            if done.is_empty() {
                println!("nothing to restore");
            }
            for line in done {
                println!("{line}");
            }
            Ok(ExitCode::SUCCESS)
        }
        AgentCommand::Compare(args) => compare::run(args),
        AgentCommand::Guardian { state } => {
            state::guardian_main(&state)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1))
}

fn status(json: bool, run_dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    let reports = report::query_all(run_dir)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
        return Ok(ExitCode::SUCCESS);
    }
    if reports.is_empty() {
        println!("no running gleaner agent (no socket in {})", run_dir.display());
        return Ok(ExitCode::SUCCESS);
    }
    for r in reports {
        let m = &r.metrics;
        let ms = |v: Option<f64>| v.map(|x| format!("{:.1} us", x / 1e3)).unwrap_or_else(|| "-".into());
        println!("agent {} managing {} (up {:.0} s)", r.agent_pid, r.target, r.uptime_s);
        let mode = match (r.retention_mode, &r.governor) {
            (Some(m), Some(g)) => format!(
                "{} (governed: baseline {}, {} probes, {} switches)",
                on_off(m.is_on()),
                on_off(g.baseline.is_on()),
                g.probes,
                g.switches
            ),
            (Some(m), None) => on_off(m.is_on()).to_string(),
            (None, _) => on_off(false).to_string(),
        };
        println!(
            "  retention {mode}{}  consolidation {}{}",
            r.retention_note.as_deref().map(|n| format!(" (at start: {n})")).unwrap_or_default(),
            on_off(r.consolidation),
            r.note.as_deref().map(|n| format!(" ({n})")).unwrap_or_default()
        );
        println!("  active vCPUs {} of {}   rho {:.3}  eta {:.3}", r.active_cpus, r.all_cpus, m.rho, m.eta);
        println!(
            "  l_comp {}  g_comp {}  l_idle {}  utilization {:.2} vCPUs",
            ms(m.l_comp_ns),
            ms(m.g_comp_ns),
            ms(m.l_idle_ns),
            m.util
        );
        println!(
            "  yields {}  timeouts {}  noise {}  step-asides {}  retention timeout {} us  decisions {}",
            r.yields, r.timeouts, r.noise_returns, r.step_asides, r.timeout_us, r.decisions
        );
        if let Some(c) = &r.calibration {
            println!("  calibration {} at start; the numbers are {} old", c.describe(), cache::human_age(c.age_now_s()));
        }
        if !r.vcpu_timeouts.is_empty() {
            let t: Vec<String> = r.vcpu_timeouts.iter().map(|v| format!("{}:{}", v.cpu, v.timeout_ns / 1000)).collect();
            let (g, s): (u64, u64) = r.vcpu_timeouts.iter().fold((0, 0), |(g, s), v| (g + v.grows, s + v.shrinks));
            println!(
                "  per-vCPU timeouts (us) {}  ({}, cap {} us; {g} grows, {s} shrinks)",
                t.join(" "),
                if r.adaptive_timeout { "adaptive" } else { "fixed" },
                r.timeout_us
            );
        }
        for e in r.recent.iter().rev().take(8) {
            println!("  [{:>8} ms] {} -> CPUs {}", e.t_ms, e.event, e.active_cpus);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `gleaner calibrate`: a valid record, or a new measurement stored for the agents.
fn calibrate(args: CalibrateArgs) -> anyhow::Result<ExitCode> {
    let mut cfg = AgentConfig { run_dir: args.run_dir.unwrap_or_else(default_run_dir), cpus: args.cpus, recalibrate: args.recalibrate, ..AgentConfig::default() };
    if let Some(s) = args.max_age_s {
        if s > config::MAX_CALIBRATION_AGE_S {
            return Err(gleaner_os::BadInput::new("--max-age-s", s, "0..=31536000 (seconds; 0 measures every time)").into());
        }
        cfg.calibration_max_age_s = s;
    }
    cfg.validate()?;
    let cpus = agent::managed_cpus(&cfg, &gleaner_os::sysfs::Sysfs::new())?;
    if !args.json {
        eprintln!("gleaner: calibrating on vCPUs {cpus} (about 0.5 s unless a valid record exists)");
    }
    let got = cache::obtain(&cfg.cache_policy(), &cache::World::real(), &cpus, || calibrate::measure(&cpus));
    let results = got.results.map_err(|inc| anyhow::anyhow!("calibration incomplete: {}", inc.error))?;
    let retaining = report::retention_agents(&cfg.run_dir);
    if retaining > 0 && matches!(got.source, cache::CalibrationSource::MeasuredNow { .. }) {
        eprintln!(
            "gleaner: note: {retaining} agent(s) with retention were running; their yielding threads keep vCPUs \
             from halting, so the halted-vCPU wakeups may read too cheap (measure again when they are gone)"
        );
    }
    let report = CalibrateReport { source: got.source, record: got.record, results };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    let r = &report.results;
    println!("calibration: {}", report.source.describe());
    println!("  {}", agent::medians(r));
    println!("  retention timeout {} us, idle threshold {} us", r.timeout_ns / 1000, r.idle_threshold_ns / 1000);
    match agent::retention_off_reason(r) {
        None => println!("  verdict: retention pays here"),
        Some(why) => println!("  verdict: retention off: {why}"),
    }
    if let Some(rec) = &report.record {
        let d = &rec.depends_on;
        let params = |m: &std::collections::BTreeMap<String, String>| {
            if m.is_empty() { "not loaded".to_string() } else { m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ") }
        };
        println!(
            "  depends on: boot {}, kernel {}, online CPUs {}, vCPU {} wakes {}, cpuidle driver {} governor {}",
            d.boot_id,
            d.kernel_release,
            d.online_cpus,
            d.waker_cpu,
            d.waiter_cpu,
            d.cpuidle_driver.as_deref().unwrap_or("none"),
            d.cpuidle_governor.as_deref().unwrap_or("none")
        );
        println!("  haltpoll: {}; cpuidle_haltpoll: {}", params(&d.haltpoll), params(&d.cpuidle_haltpoll));
        println!(
            "  valid for {} after it was measured while these stay the same; --recalibrate measures again",
            cache::human_age(cfg.calibration_max_age_s)
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// `gleaner daemon`: one `gleaner attach` per target (each with its own guardian), or
/// system-wide retention without targets. Stops them all on SIGTERM/SIGINT.
fn daemon(config: &std::path::Path) -> anyhow::Result<ExitCode> {
    let cfg = AgentConfig::load(config)?;
    // The calibration is kept fresh for the agents started later (the daemon's own keep
    // the numbers they started with). With a configured timeout there is nothing to keep.
    let refresher = if cfg.retention && cfg.timeout_us.is_none() {
        let cpus = agent::managed_cpus(&cfg, &gleaner_os::sysfs::Sysfs::new())?;
        if !cfg.targets.is_empty() {
            // Once here, so the attach agents below all read it instead of queueing to measure.
            let got = cache::obtain(&cfg.cache_policy(), &cache::World::real(), &cpus, || calibrate::measure(&cpus));
            tracing::info!("calibration {}", got.source.describe());
        }
        Some(cache::Refresher::spawn(cfg.cache_policy(), cpus)?)
    } else {
        None
    };
    let result = daemon_agents(config, &cfg);
    if let Some(r) = refresher {
        r.stop();
    }
    result
}

/// The daemon's agents: system-wide retention in this process, or one `attach` per target.
fn daemon_agents(config: &std::path::Path, cfg: &AgentConfig) -> anyhow::Result<ExitCode> {
    if cfg.targets.is_empty() {
        let opts = agent::RunOptions { status_socket: true, ..Default::default() };
        let out = agent::run(agent::Target::System, cfg, &opts)?;
        return Ok(exit_code(out.signal.map(|_| 0).unwrap_or(0)));
    }
    agent::install_signal_handlers()?;
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for t in &cfg.targets {
        let mut c = std::process::Command::new(&exe);
        c.arg("attach").arg("--config").arg(config);
        match (&t.cgroup, t.pid) {
            (Some(p), _) => c.arg("--cgroup").arg(p),
            (None, Some(pid)) => c.arg("--pid").arg(pid.to_string()),
            (None, None) => unreachable!("validated"),
        };
        children.push(c.spawn()?);
    }
    let mut failed = false;
    loop {
        if let Some(sig) = agent::pending_signal() {
            for c in &children {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(c.id().cast_signed()),
                    nix::sys::signal::Signal::try_from(sig).ok(),
                );
            }
        }
        let mut running = 0;
        for c in &mut children {
            match c.try_wait()? {
                Some(s) => failed |= !s.success() && agent::pending_signal().is_none(),
                None => running += 1,
            }
        }
        if running == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
