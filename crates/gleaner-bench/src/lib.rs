//! Measurement toolkit: `gleaner bench` and `gleaner diagnose`.
//!
//! - [`workload`]: built-in, self-checking kernels (pipeline, barrier, condvar, mutex,
//!   spin-barrier, matmul, freqsleep) and the latency kernels (pingpong, openloop).
//! - [`diagnose`]: does this machine suffer from the blocked-waiter wakeup problem?
//! - [`plot`]: latency CDFs.
//!
//! The measurements themselves (the wakeup probe of Table 2, the system meter, [`measure::RunMetrics`]
//! and the JSON documents) live in gleaner-measure, which the agent and the lab use without
//! this crate; [`wakeup`], [`measure`] and [`report`] are re-exported from there.
//!
//! See docs/bench.md and docs/diagnose.md.

use std::process::ExitCode;

pub mod cli;
mod commands;
pub mod diagnose;
pub mod plot;
pub mod workload;

pub use cli::{BenchArgs, BenchCommand, DiagnoseArgs, OverheadArgs, RateArgs, RunArgs, WakeupArgs, WorkloadArgs, YieldersArgs};
pub use commands::{latency_params, overhead_of, workload_params, OverheadReport};
// The measurement modules and the wakeup document under their old paths, so that code written
// against `gleaner_bench::{wakeup, measure, report}` keeps compiling; new code imports
// gleaner_measure.
pub use gleaner_measure::report::WakeupDoc;
pub use gleaner_measure::{measure, report, wakeup};

/// Library entry points of the commands (for tests and other crates).
pub mod commands_for_tests {
    pub use crate::commands::{latency_doc, latency_params, run_doc, wakeup_config, workload_doc, workload_params};
}

pub fn run_bench(args: BenchArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        BenchCommand::Wakeup(a) => commands::wakeup(&a),
        BenchCommand::Workload(a) => commands::workload(&a),
        BenchCommand::Run(a) => commands::run(&a),
        BenchCommand::Overhead(a) => commands::overhead(&a),
        BenchCommand::Yielders(a) => commands::yielders(&a),
        BenchCommand::Rate(a) => {
            if !(1..=1000).contains(&a.trials) {
                return Err(gleaner_os::BadInput::new("--trials", a.trials, "1..=1000").into());
            }
            println!("{:.3}", workload::compute::best_iters_per_us(a.trials));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `gleaner diagnose`; `agent` gives what only the agent has (the calibrated wake-cost
/// curve, the eBPF tracer): [`diagnose::Standalone`] where it is not linked.
pub fn run_diagnose(args: DiagnoseArgs, agent: &dyn diagnose::AgentSide) -> anyhow::Result<ExitCode> {
    diagnose::run(&args, agent)
}
