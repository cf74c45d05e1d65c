//! `gleaner`: make multithreaded programs run fast inside virtual machines.
//!
//! The binary only parses the command line and dispatches to the crate that owns each
//! command; errors are printed once, with their whole chain, and mapped to exit codes:
//! 2 for bad input ([`gleaner_os::BadInput`]), 1 for everything else.

mod generate;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// Gleaner: mitigate the blocked-waiter wakeup problem of multithreaded programs in VMs,
/// type vCPUs on KVM hosts (AQL_Sched), and measure virtualization overhead.
#[derive(Debug, Parser)]
#[command(name = "gleaner", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Benchmarks: wakeup latency (Table 2), workload kernels, external commands, overhead metrics.
    Bench(gleaner_bench::BenchArgs),
    /// Tell whether this machine suffers from the blocked-waiter wakeup problem.
    Diagnose(gleaner_bench::DiagnoseArgs),
    #[command(flatten)]
    Agent(gleaner_agent::AgentCommand),
    /// Discrete-event simulator of two-level scheduling running the real policies.
    Sim(gleaner_sim::SimArgs),
    /// Host-side AQL_Sched for Linux/KVM: vCPU typing, pCPU pools, per-type slices.
    Host(gleaner_host::HostArgs),
    /// Real QEMU guests for the UC / OC / OC2 experiments.
    Lab(gleaner_lab::LabArgs),
    /// Print the shell completion script for gleaner, generated from its command line.
    ///
    /// Install it where the shell looks for completions, e.g. bash:
    /// `gleaner completions bash > /usr/share/bash-completion/completions/gleaner`; zsh: a file
    /// `_gleaner` in a directory of $fpath; fish: `~/.config/fish/completions/gleaner.fish`.
    /// The Debian package installs the bash, zsh and fish scripts.
    Completions {
        /// The shell: bash, elvish, fish, powershell or zsh.
        #[arg(value_name = "SHELL", value_parser = generate::ShellName)]
        shell: String,
    },
    /// Write the man pages, generated from the command line: gleaner.1 and one per subcommand
    /// (gleaner-run.1, gleaner-bench-wakeup.1, ...). Used by scripts/build-deb.sh.
    #[command(hide = true)]
    ManPages {
        /// Directory to write the pages into (created if missing).
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

/// `gleaner compare`, with its `--plot` drawn here: the agent does not link plotting.
fn compare(a: &gleaner_agent::compare::CompareArgs) -> anyhow::Result<ExitCode> {
    if let Some(p) = &a.plot {
        gleaner_bench::plot::check_path(p)?;
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

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GLEANER_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
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
