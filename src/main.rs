//! `gleaner`: make multithreaded programs run fast inside virtual machines.
//!
//! The binary only parses the command line and dispatches to the crate that owns each
//! command; errors are printed once, with their whole chain, and mapped to exit codes:
//! 2 for bad input ([`gleaner_os::BadInput`]), 1 for everything else.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GLEANER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(a) => gleaner_bench::run_bench(a),
        Command::Diagnose(a) => gleaner_bench::run_diagnose(a),
        Command::Agent(c) => gleaner_agent::run(c),
        Command::Sim(a) => gleaner_sim::run(a),
        Command::Host(a) => gleaner_host::run(a),
        Command::Lab(a) => gleaner_lab::run(a),
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
