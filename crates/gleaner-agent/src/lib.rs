//! The Gleaner guest agent: resource retention and consolidation scheduling (Gleaner paper,
//! sections 4 to 6) at user level, for a VM user who cannot touch the hypervisor.
//!
//! - [`agent`]: the loop that samples, decides (with `gleaner_policy::guest::GuestController`)
//!   and applies, and undoes everything on every exit path.
//! - [`yielders`]: the `SCHED_IDLE` yielding threads (retention mechanism).
//! - [`sampler`]: metric snapshots from procfs/sysfs.
//! - [`state`]: the state file, the guardian process and `restore`.
//! - [`mod@status`]: the typed status and JSON-lines events, each stat declared once
//!   ([`stats`]: its JSON field, Prometheus name, type and help, printed line); [`server`]: the
//!   status socket and Prometheus text.
//! - [`cli`]: the clap types of the agent's commands and their resolution into an
//!   [`config::AgentConfig`].
//! - [`compare`]: the main job, stock vs Gleaner side by side.

pub mod agent;
pub mod cache;
pub mod calibrate;
pub mod cli;
pub mod compare;
pub mod config;
pub mod diagnose;
pub mod knobs;
pub mod progress;
pub mod sampler;
pub mod seam;
pub mod server;
pub mod state;
pub mod stats;
pub mod status;
pub mod yielders;

use std::process::ExitCode;

pub use cli::{default_run_dir, AgentCommand, AgentFlags, CalibrateArgs};
use config::AgentConfig;

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
            let done = state::restore_dead(&run_dir, &state::UndoCx::real())?;
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
    let reports = server::query_all(run_dir)?;
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
        if !r.pinned_cpus.is_empty() {
            println!("  threads pinned by the workload on CPUs {}: it keeps every vCPU", r.pinned_cpus);
        }
        println!("  l_comp {}  g_comp {}  l_idle {}  utilization {:.2} vCPUs", ms(m.l_comp_ns), ms(m.g_comp_ns), ms(m.l_idle_ns), m.util);
        if let Some(i) = &r.idle {
            print_idle_status(i);
        }
        if r.totals.yields > 0 {
            println!("  {}", stats::line(status::Totals::STATS, &r.totals));
        }
        println!("  {}", r.overhead.line(r.uptime_s));
        if let Some(c) = &r.calibration {
            println!("  calibration {} at start; the numbers are {} old", c.describe(), cache::human_age(c.age_now_s()));
        }
        for e in r.recent.iter().rev().take(8) {
            println!("  [{:>8} ms] {} -> CPUs {}", e.t_ms, e.event, e.active_cpus);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `gleaner calibrate`: a valid record, or a new measurement stored for the agents.
fn calibrate(args: CalibrateArgs) -> anyhow::Result<ExitCode> {
    let mut cfg = AgentConfig {
        run_dir: args.run_dir.unwrap_or_else(default_run_dir),
        cpus: args.cpus,
        recalibrate: args.recalibrate,
        ..AgentConfig::default()
    };
    if let Some(s) = args.max_age_s {
        if s > config::MAX_CALIBRATION_AGE_S {
            return Err(gleaner_os::BadInput::new("--max-age-s", s, "0..=31536000 (seconds; 0 measures every time)").into());
        }
        cfg.calibration_max_age_s = s;
    }
    cfg.validate()?;
    let cpus = agent::managed_cpus(&cfg, &gleaner_os::sysfs::Sysfs::new())?;
    if !args.json {
        eprintln!("gleaner: calibrating on vCPUs {cpus} (about 2 s unless a valid record exists)");
    }
    let got = cache::obtain(&cfg.cache_policy(), &cache::World::real(), &cpus, || calibrate::measure_journaled(&cfg.run_dir, &cpus));
    let results = got.results.map_err(|inc| anyhow::anyhow!("calibration incomplete: {}", inc.error))?;
    let retaining = server::retention_agents(&cfg.run_dir);
    if retaining > 0 && matches!(got.source, cache::CalibrationSource::MeasuredNow { .. }) {
        eprintln!(
            "gleaner: note: {retaining} agent(s) with retention were running; they keep vCPUs from halting, so \
             the halted-vCPU wakeups may read too cheap (measure again when they are gone)"
        );
    }
    let report = CalibrateReport { source: got.source, record: got.record, results };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    let r = &report.results;
    println!("calibration: {}", report.source.describe());
    print_curve(&r.curve);
    println!("  kernel polling while measuring: halted: {}; polling: {}", r.polling.halted, r.polling.poll);
    println!("  idle threshold of yielding threads {} us", r.idle_threshold_ns / 1000);
    if let Some(rec) = &report.record {
        let d = &rec.depends_on;
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
        println!(
            "  valid for {} after it was measured while these stay the same; --recalibrate measures again",
            cache::human_age(cfg.calibration_max_age_s)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The idle policy of a running agent, for people.
fn print_idle_status(i: &status::IdleStatus) {
    use gleaner_policy::idle::plan::{Mechanism, ALWAYS};
    if let Some(o) = &i.offer {
        println!("  machine: {}", o.describe());
    }
    let us = |ns: u64| if ns == ALWAYS { "until work".to_string() } else { format!("{} us", ns / 1000) };
    if let Some(p) = &i.plan {
        let per: Vec<String> = p
            .vcpus
            .iter()
            .map(|v| match v.mechanism {
                Mechanism::Halt => format!("{}:halt", v.cpu),
                Mechanism::Poll => format!("{}:poll {}", v.cpu, us(v.window_ns)),
                Mechanism::Yield => format!("{}:yield {}", v.cpu, us(v.window_ns)),
            })
            .collect();
        let spent: f64 = p.expected_cost_vcpus();
        println!(
            "  idle plan: {} (expected {:.2} vCPU; budget {:.2} per vCPU, price {}, VM share {})",
            per.join("  "),
            spent,
            i.plan_config.budget,
            i.plan_config.price,
            i.plan_config.vm_share
        );
    }
    match (&i.gaps_from, &i.tracer_note) {
        (Some(src), None) => println!(
            "  idle periods from: {}",
            serde_json::to_value(src).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
        ),
        (_, Some(n)) => println!("  idle periods estimated (tracer: {n})"),
        _ => {}
    }
    if let Some(w) = &i.wake {
        let s = |l: &gleaner_policy::idle::LatencySummary| format!("{} @ {:.1} us", l.count, l.mean_ns / 1e3);
        println!(
            "  workload wakeups last traced period: all {}  (busy {}, poll {}, halt {})",
            s(&w.all),
            s(&w.busy),
            s(&w.poll),
            s(&w.halt)
        );
    }
    println!("  kernel polling since start {:.2} s", i.poll_ns as f64 / 1e9);
}

/// The wake-cost curve as a table, for people.
pub fn print_curve(c: &gleaner_policy::idle::WakeCurve) {
    println!("  wakeup of a blocked thread on another vCPU (means of the measured rounds):");
    println!("    {:>10}  {:>9}  {:>9}", "idle gap", "mean us", "p50 us");
    for p in &c.halted {
        println!("    {:>7} us  {:>9.1}  {:>9.1}   vCPU halted", p.gap_ns / 1000, p.mean_ns as f64 / 1e3, p.p50_ns as f64 / 1e3);
    }
    println!("    {:>10}  {:>9.1}  {:>9}   vCPU kept busy by a yielding thread", "any", c.busy_ns as f64 / 1e3, "");
    match c.poll_ns {
        Some(p) => println!("    {:>10}  {:>9.1}  {:>9}   vCPU polling in the kernel (POLL state)", "any", p as f64 / 1e3, ""),
        None => println!("    polling in the kernel: not measured (no POLL state, or no control of the idle knobs)"),
    }
    let w = c.host_poll_window_ns().map_or("none (flat)".to_string(), |w| format!("{} us", w / 1000));
    println!(
        "  the host keeps a halted vCPU cheap to wake up to {w}; a long idle gap costs {} us more than the cheapest wakeup",
        c.long_gap_penalty_ns() / 1000
    );
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
            let got =
                cache::obtain(&cfg.cache_policy(), &cache::World::real(), &cpus, || calibrate::measure_journaled(&cfg.run_dir, &cpus));
            tracing::info!("calibration {}", got.source.describe());
        }
        let run_dir = cfg.run_dir.clone();
        Some(cache::Refresher::spawn(cfg.cache_policy(), cpus, move || server::retention_agents(&run_dir))?)
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
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id().cast_signed()), nix::sys::signal::Signal::try_from(sig).ok());
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
