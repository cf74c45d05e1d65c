//! `gleaner compare`: the main job. Runs a workload alternately stock and under Gleaner and
//! reports medians, spread (min..max) and the ratio, measured in the same invocation.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use gleaner_measure::measure::{self, SystemMeter};
use gleaner_measure::RunMetrics;
use gleaner_os::cpuset::CpuSet;
use gleaner_os::procfs::Procfs;
use gleaner_os::sysfs::Sysfs;
use gleaner_os::BadInput;
use gleaner_policy::stats::Summary;
use serde::{Deserialize, Serialize};

use crate::agent::{self, RunOptions, Target};
use crate::cache::CalibrationSource;
use crate::AgentFlags;

/// `gleaner compare [--runs N] [-- CMD ...]`
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// Runs of each configuration (they alternate: stock, gleaner, stock, ...).
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub runs: u32,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub flags: AgentFlags,
    /// Command to measure instead of the built-in pipeline workload. Its output is captured
    /// and shown only if it fails.
    #[arg(last = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

/// How a run was made: alone, or under the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Stock,
    Gleaner,
}

impl Mode {
    /// The order runs alternate in.
    pub const ALL: [Mode; 2] = [Mode::Stock, Mode::Gleaner];

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Stock => "stock",
            Mode::Gleaner => "gleaner",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One measured run: the workload's [`RunMetrics`] (the record `gleaner bench` writes) and
/// what the agent cost in Gleaner runs.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub mode: Mode,
    #[serde(flatten)]
    pub metrics: RunMetrics,
    /// User + system CPU time of the workload, ns ([`RunMetrics::cpu_ns`]).
    pub cpu_ns: u64,
    pub agent_cpu_ns: Option<u64>,
    /// Peak resident memory of the agent process (KiB) after the run.
    pub agent_maxrss_kib: Option<u64>,
    pub decisions: Option<u64>,
    /// Share of the agent's control periods that ran with retention on.
    pub retention_on_share: Option<f64>,
}

impl Sample {
    /// A run without the agent.
    fn stock(metrics: RunMetrics) -> Sample {
        Sample {
            mode: Mode::Stock,
            cpu_ns: metrics.cpu_ns(),
            metrics,
            agent_cpu_ns: None,
            agent_maxrss_kib: None,
            decisions: None,
            retention_on_share: None,
        }
    }

    /// The workload's exit status (a run always has one here: both modes start a command).
    fn exit_code(&self) -> i32 {
        self.metrics.exit_code.unwrap_or(1)
    }
}

/// What the one start-up calibration of `compare` found.
#[derive(Debug, Default)]
struct Calibration {
    retention_note: Option<String>,
    curve: Option<gleaner_policy::idle::WakeCurve>,
    source: Option<CalibrationSource>,
    governed: bool,
}

/// The result of `gleaner compare`.
#[derive(Debug, Clone, Serialize)]
pub struct CompareReport {
    pub command: Vec<String>,
    pub runs: u32,
    pub cpus: String,
    /// Retention on at start (the start-up verdict, or forced by `--timeout-us`).
    pub retention: bool,
    /// Why retention started off although it was asked for (measured not to pay here).
    pub retention_note: Option<String>,
    /// The governor re-decided retention while running (per-vCPU timeouts adapt).
    pub governed: bool,
    /// How the governor's first mode was chosen (`calibrated`: `retention`).
    pub retention_start: Option<crate::config::RetentionStart>,
    /// The wake-cost curve retention was planned from (`None` when `--timeout-us` was given).
    pub curve: Option<gleaner_policy::idle::WakeCurve>,
    /// Where the calibration came from: a cached record (path, age) or measured now (why).
    /// `None` when nothing was calibrated (retention off, or timeout and threshold given).
    pub calibration: Option<CalibrationSource>,
    pub consolidation: bool,
    pub timeout_us: Option<u64>,
    pub samples: Vec<Sample>,
    pub stock_wall_s: Summary,
    pub gleaner_wall_s: Summary,
    /// Stock median wall time over Gleaner median wall time (> 1: Gleaner is faster).
    pub speedup: f64,
    pub stock_cpu_s: Summary,
    pub gleaner_cpu_s: Summary,
    pub stock_idle_entries: Option<Summary>,
    pub gleaner_idle_entries: Option<Summary>,
    pub gleaner_agent_cpu_s: Option<Summary>,
    /// Share of the Gleaner runs' control periods with retention on.
    pub gleaner_retention_on_share: Option<Summary>,
    /// Peak resident memory of the agent (MiB).
    pub agent_maxrss_mib: Option<f64>,
}

pub fn run(args: CompareArgs) -> anyhow::Result<ExitCode> {
    if !(1..=1000).contains(&args.runs) {
        return Err(BadInput::new("--runs", args.runs, "1..=1000").into());
    }
    let cfg = args.flags.resolve()?;
    let sysfs = Sysfs::new();
    let cpus = agent::managed_cpus(&cfg, &sysfs)?;
    let builtin = args.cmd.is_empty();
    let command = if builtin {
        let exe = std::env::current_exe().context("locating the gleaner binary")?;
        vec![exe.display().to_string(), "bench".into(), "workload".into(), "pipeline".into(), "--json".into()]
    } else {
        args.cmd.clone()
    };
    agent::check_program(&command)?;
    // Calibrate once, so every Gleaner run plans from the same wake-cost curve.
    let mut calibration = Calibration::default();
    let mut calibrated = None;
    if cfg.retention {
        let c = if cfg.timeout_us.is_some() {
            agent::setup::calibration(&cfg, &cpus, None)
        } else {
            let policy = cfg.cache_policy();
            let got = crate::cache::obtain(&policy, &crate::cache::World::real(), &cpus, || {
                crate::calibrate::measure_journaled(&cfg.run_dir, &cpus)
            });
            agent::Calibrated { results: got.results.map_err(|i| i.error), source: Some(got.source) }
        };
        calibration.source = c.source.clone();
        calibration.curve = c.curve().cloned();
        if let Err(e) = &c.results {
            calibration.retention_note = Some(e.clone());
        }
        calibrated = Some(c);
    }
    let governed = cfg.retention && cfg.adapt && cfg.timeout_us.is_none();
    let out_dir = tempfile::tempdir().context("creating a temp dir for workload output")?;
    calibration.governed = governed;
    let opts = RunOptions {
        quiet: true,
        stdout_to: Some(out_dir.path().join("out.txt")),
        stderr_to: Some(out_dir.path().join("err.txt")),
        status_socket: false,
        calibration: calibrated,
    };
    let total = args.runs * 2;
    let mut samples = Vec::new();
    let t0 = Instant::now();
    for i in 0..args.runs {
        for mode in Mode::ALL {
            let n = u32::try_from(samples.len()).map_or(u32::MAX, |done| done + 1);
            if !args.json {
                let eta = if n > 1 {
                    format!(", ~{:.0} s left", t0.elapsed().as_secs_f64() / f64::from(n - 1) * f64::from(total - n + 1))
                } else {
                    String::new()
                };
                eprint!("\rgleaner compare: run {n}/{total} ({mode}, round {}){eta}    ", i + 1);
            }
            let s = match mode {
                Mode::Stock => run_stock(&command, &cpus, &sysfs, &opts)?,
                Mode::Gleaner => run_gleaner(&command, &cfg, &cpus, &sysfs, &opts)?,
            };
            if s.exit_code() != 0 {
                let err = std::fs::read_to_string(out_dir.path().join("err.txt")).unwrap_or_default();
                anyhow::bail!(
                    "the workload failed in a {mode} run (exit status {}): {}{}",
                    s.exit_code(),
                    command.join(" "),
                    if err.is_empty() { String::new() } else { format!(": {}", err.trim()) }
                );
            }
            samples.push(s);
        }
    }
    if !args.json {
        eprintln!();
    }
    let report = summarize(command, args.runs, &cpus, &cfg, calibration, samples);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(ExitCode::SUCCESS)
}

/// The number of CPUs in `cpus` as [`RunMetrics::cpus_available`] counts them.
fn cpu_count(cpus: &CpuSet) -> u32 {
    u32::try_from(cpus.len()).unwrap_or(u32::MAX)
}

fn run_stock(command: &[String], cpus: &CpuSet, sysfs: &Sysfs, opts: &RunOptions) -> anyhow::Result<Sample> {
    let mut cmd = std::process::Command::new(&command[0]);
    cmd.args(&command[1..]);
    if let Some(p) = &opts.stdout_to {
        cmd.stdout(std::fs::File::create(p)?);
    }
    if let Some(p) = &opts.stderr_to {
        cmd.stderr(std::fs::File::create(p)?);
    }
    let meter = SystemMeter::start(&Procfs::new(), sysfs, cpus)?;
    let child = cmd.spawn().map_err(|e| BadInput::new("command", &command[0], format!("a program that can be started ({e})")))?;
    Ok(Sample::stock(measure::measure_child(child, meter)?))
}

fn run_gleaner(
    command: &[String],
    cfg: &crate::config::AgentConfig,
    cpus: &CpuSet,
    sysfs: &Sysfs,
    opts: &RunOptions,
) -> anyhow::Result<Sample> {
    let meter = SystemMeter::start(&Procfs::new(), sysfs, cpus)?;
    let before = gleaner_os::rusage::self_rusage()?;
    let out = agent::run(Target::Command(command.to_vec()), cfg, opts)?;
    let after = gleaner_os::rusage::self_rusage()?;
    // The system counters cover the agent's set-up and clean-up too; the wall time is the
    // workload's own, from its start to its exit.
    let system = measure::SystemDelta { wall_ns: out.workload_wall_ns, ..meter.stop()? };
    let mut metrics = measure::metrics(&out.rusage.unwrap_or_default(), &system, cpu_count(cpus));
    metrics.exit_code = Some(out.exit_code.unwrap_or(1));
    Ok(Sample {
        mode: Mode::Gleaner,
        cpu_ns: metrics.cpu_ns(),
        metrics,
        agent_cpu_ns: Some((after.user_ns + after.sys_ns).saturating_sub(before.user_ns + before.sys_ns)),
        agent_maxrss_kib: Some(after.maxrss_kib),
        decisions: Some(out.decisions),
        retention_on_share: (out.periods > 0).then(|| out.retention_on_periods as f64 / out.periods as f64),
    })
}

fn summarize(
    command: Vec<String>,
    runs: u32,
    cpus: &CpuSet,
    cfg: &crate::config::AgentConfig,
    calibration: Calibration,
    samples: Vec<Sample>,
) -> CompareReport {
    let pick =
        |mode: Mode, f: &dyn Fn(&Sample) -> Option<f64>| -> Vec<f64> { samples.iter().filter(|s| s.mode == mode).filter_map(f).collect() };
    let secs = |ns: u64| ns as f64 / 1e9;
    let wall = |m| Summary::of(&pick(m, &|s| Some(secs(s.metrics.wall_ns)))).expect("runs >= 1");
    let cpu = |m| Summary::of(&pick(m, &|s| Some(secs(s.cpu_ns)))).expect("runs >= 1");
    let idle = |m| Summary::of(&pick(m, &|s| s.metrics.idle_entries.map(|v| v as f64))).ok();
    let stock_wall_s = wall(Mode::Stock);
    let gleaner_wall_s = wall(Mode::Gleaner);
    CompareReport {
        command,
        runs,
        cpus: cpus.to_string(),
        retention: cfg.retention,
        retention_note: calibration.retention_note,
        governed: calibration.governed,
        curve: calibration.curve,
        calibration: calibration.source,
        consolidation: cfg.consolidation,
        timeout_us: cfg.timeout_us.filter(|_| cfg.retention),
        retention_start: calibration.governed.then_some(cfg.retention_start),
        speedup: stock_wall_s.p50 / gleaner_wall_s.p50,
        stock_wall_s,
        gleaner_wall_s,
        stock_cpu_s: cpu(Mode::Stock),
        gleaner_cpu_s: cpu(Mode::Gleaner),
        stock_idle_entries: idle(Mode::Stock),
        gleaner_idle_entries: idle(Mode::Gleaner),
        gleaner_agent_cpu_s: Summary::of(&pick(Mode::Gleaner, &|s| s.agent_cpu_ns.map(secs))).ok(),
        gleaner_retention_on_share: Summary::of(&pick(Mode::Gleaner, &|s| s.retention_on_share)).ok(),
        agent_maxrss_mib: samples.iter().filter_map(|s| s.agent_maxrss_kib).max().map(|k| k as f64 / 1024.0),
        samples,
    }
}

fn print_table(r: &CompareReport) {
    let mode = match (r.retention || r.governed, r.consolidation) {
        (true, true) => "retention + consolidation",
        (true, false) => "retention only",
        (false, true) => "consolidation only",
        (false, false) => "no mechanism (control run)",
    };
    let governed =
        if r.governed { format!("; retention governed, starting {}", if r.retention { "on" } else { "off" }) } else { String::new() };
    println!("gleaner compare: {}", r.command.join(" "));
    println!(
        "  {} runs each, alternating; CPUs {}; {}{}{}",
        r.runs,
        r.cpus,
        mode,
        governed,
        r.timeout_us.map(|t| format!("; retention timeout {t} us")).unwrap_or_default()
    );
    if let Some(n) = &r.retention_note {
        println!("  retention off{}: {n}", if r.governed { " at start" } else { "" });
    }
    if let Some(c) = &r.calibration {
        println!("  calibration: {}", c.describe());
    }
    println!("  {:<22} {:>26} {:>26}", "median [min..max]", "stock", "gleaner");
    let row = |name: &str, a: Option<Summary>, b: Option<Summary>, digits: usize| {
        let f = |s: Option<Summary>| {
            s.map(|s| format!("{:.d$} [{:.d$}..{:.d$}]", s.p50, s.min, s.max, d = digits)).unwrap_or_else(|| "-".into())
        };
        println!("  {:<22} {:>26} {:>26}", name, f(a), f(b));
    };
    row("wall time (s)", Some(r.stock_wall_s), Some(r.gleaner_wall_s), 3);
    row("workload CPU time (s)", Some(r.stock_cpu_s), Some(r.gleaner_cpu_s), 3);
    row("vCPU idle entries", r.stock_idle_entries, r.gleaner_idle_entries, 0);
    row("agent CPU time (s)", None, r.gleaner_agent_cpu_s, 3);
    if r.governed {
        row("periods retention on", None, r.gleaner_retention_on_share, 2);
    }
    if let Some(m) = r.agent_maxrss_mib {
        println!("  {:<22} {:>26} {:>26}", "agent peak RSS (MiB)", "-", format!("{m:.1}"));
    }
    println!("  speedup (stock median / gleaner median wall time): {:.2}x ({})", r.speedup, verdict(&r.stock_wall_s, &r.gleaner_wall_s));
}

/// Says "faster"/"slower" only when the runs do not overlap: a median ahead by less than
/// the run-to-run spread is no result.
fn verdict(stock: &Summary, gleaner: &Summary) -> &'static str {
    if gleaner.max < stock.min {
        "faster under Gleaner in every run"
    } else if gleaner.min > stock.max {
        "slower under Gleaner in every run"
    } else if gleaner.p50 < stock.p50 {
        "median faster under Gleaner, within the run-to-run spread"
    } else if gleaner.p50 > stock.p50 {
        "median slower under Gleaner, within the run-to-run spread"
    } else {
        "same median"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(v: &[f64]) -> Summary {
        Summary::of(v).unwrap()
    }

    /// `gleaner compare --json` keeps every key a sample had before it was built on
    /// `RunMetrics`, with the mode as the same lowercase word.
    #[test]
    fn a_sample_keeps_its_json_keys_and_lowercase_mode() {
        let metrics = RunMetrics { wall_ns: 10, user_ns: 3, sys_ns: 4, exit_code: Some(0), idle_entries: Some(2), ..Default::default() };
        let stock = serde_json::to_value(Sample::stock(metrics.clone())).unwrap();
        let gleaner = serde_json::to_value(Sample { mode: Mode::Gleaner, decisions: Some(1), ..Sample::stock(metrics) }).unwrap();
        for key in [
            "mode",
            "wall_ns",
            "cpu_ns",
            "vcsw",
            "nivcsw",
            "idle_entries",
            "agent_cpu_ns",
            "agent_maxrss_kib",
            "decisions",
            "retention_on_share",
            "exit_code",
        ] {
            assert!(stock.get(key).is_some(), "no {key} in {stock}");
        }
        assert_eq!((&stock["mode"], &gleaner["mode"]), (&"stock".into(), &"gleaner".into()));
        assert_eq!((&stock["cpu_ns"], &stock["exit_code"], &stock["idle_entries"]), (&7.into(), &0.into(), &2.into()));
        assert_eq!(Mode::ALL.map(|m| m.to_string()), ["stock", "gleaner"]);
    }

    #[test]
    fn a_verdict_needs_runs_that_do_not_overlap() {
        assert_eq!(verdict(&runs(&[2.0, 2.1]), &runs(&[1.0, 1.1])), "faster under Gleaner in every run");
        assert_eq!(verdict(&runs(&[1.0, 1.1]), &runs(&[2.0, 2.1])), "slower under Gleaner in every run");
        assert_eq!(
            verdict(&runs(&[1.9, 2.0, 2.1]), &runs(&[1.85, 1.95, 2.2])),
            "median faster under Gleaner, within the run-to-run spread"
        );
        assert_eq!(
            verdict(&runs(&[1.9, 2.0, 2.1]), &runs(&[1.95, 2.05, 2.08])),
            "median slower under Gleaner, within the run-to-run spread"
        );
        assert_eq!(verdict(&runs(&[1.0]), &runs(&[1.0])), "same median");
    }
}
