//! `gleaner`: make multithreaded programs run fast inside virtual machines.
//!
//! The binary only parses the command line and dispatches to the crate that owns each
//! command; errors are printed once, with their whole chain, and mapped to exit codes:
//! 2 for bad input ([`gleaner_os::BadInput`]), 1 for everything else.

use std::process::ExitCode;

use clap::CommandFactory;
use gleaner::cli::{Cli, Command};
use gleaner::generate;

/// `gleaner compare`, with its `--plot` drawn here: the agent does not link plotting.
fn compare(a: &gleaner_agent::compare::CompareArgs) -> anyhow::Result<ExitCode> {
    if let Some(p) = &a.plot {
        gleaner_bench::plot::check_path(p)?;
    }
    if a.cmd.is_empty() && a.from.is_none() {
        return first_compare(a);
    }
    let doc = gleaner_agent::compare::run_doc(a)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        gleaner_agent::compare::print_table(&doc);
    }
    if let Some(p) = &a.plot {
        gleaner_bench::plot::latency_cpu(p, &doc)?;
        if !a.json {
            println!("  plot: {}", p.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `gleaner compare` with no command: the latency and throughput kernels, both tables, the
/// latency plot (to `--plot`, else `gleaner-compare.svg` here) and the one-line verdict.
fn first_compare(a: &gleaner_agent::compare::CompareArgs) -> anyhow::Result<ExitCode> {
    let f = gleaner_agent::compare::first_run(a)?;
    let verdict = gleaner_agent::compare::first_run_verdict(&f);
    if a.json {
        let doc = serde_json::json!({"latency": f.latency, "throughput": f.throughput, "verdict": verdict});
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        gleaner_agent::compare::print_table(&f.latency);
        println!();
        gleaner_agent::compare::print_table(&f.throughput);
    }
    let plot = a.plot.clone().unwrap_or_else(|| std::path::PathBuf::from("gleaner-compare.svg"));
    gleaner_bench::plot::latency_cpu(&plot, &f.latency)?;
    if !a.json {
        println!();
        println!("{verdict}");
        println!("  latency against CPU, one point per run: {}", plot.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// What `diagnose` takes from the agent: the calibrated wake-cost curve and the eBPF tracer.
struct AgentSide;

impl gleaner_bench::diagnose::AgentSide for AgentSide {
    fn wake_curve(
        &self,
        recalibrate: bool,
        run_dir: Option<&std::path::Path>,
    ) -> Result<(gleaner_policy::idle::WakeCurve, String), String> {
        gleaner_agent::diagnose::wake_curve(recalibrate, run_dir)
    }
    fn trace_pid(&self, pid: i32, seconds: f64, progress: &mut dyn FnMut(f64)) -> anyhow::Result<gleaner_policy::idle::WakeTrace> {
        gleaner_agent::diagnose::trace_pid(pid, seconds, progress)
    }
}

/// `gleaner __guardian --state FILE`, exactly as `gleaner_agent::state::Guardian::spawn` starts
/// it: straight to its body, without building the whole command line (clap's tree of every
/// subcommand is most of a guardian's start-up, which every root agent waits for before its
/// workload starts: ~1 ms natively, tens of ms in an emulated guest).
fn guardian_fast_path() -> Option<ExitCode> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let [cmd, flag, state] = args.as_slice() else { return None };
    if cmd != "__guardian" || flag != "--state" {
        return None;
    }
    Some(match gleaner_agent::state::guardian_main(std::path::Path::new(state)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("gleaner: {err:#}");
            ExitCode::from(1)
        }
    })
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GLEANER_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Some(code) = guardian_fast_path() {
        return code;
    }
    let cli = match gleaner::cli::parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let result = match cli.command {
        Command::Bench(a) => gleaner_bench::run_bench(a),
        Command::Diagnose(a) => gleaner_bench::run_diagnose(a, &AgentSide),
        Command::Agent(gleaner_agent::AgentCommand::Compare(a)) => compare(&a),
        Command::Agent(c) => gleaner_agent::run(c),
        Command::Sim(a) => gleaner_sim::run(a),
        Command::Host(a) => gleaner_host::run(a),
        Command::Lab(a) => gleaner_lab::run(a),
        Command::Completions { shell } => generate::completions(Cli::command(), &shell),
        Command::ManPages { dir } => generate::man_pages(Cli::command(), &dir).map(|pages| {
            for p in pages {
                println!("{}", p.display());
            }
            ExitCode::SUCCESS
        }),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("gleaner: {err:#}");
            if err.chain().any(|c| c.is::<gleaner_os::BadInput>()) {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
