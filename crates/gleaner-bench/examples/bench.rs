//! Stand-alone driver for `gleaner bench` / `gleaner diagnose` (same arguments), useful to
//! run the measurement toolkit without building the whole `gleaner` binary:
//! `cargo run -p gleaner-bench --release --example bench -- bench wakeup --rounds 500`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    Bench(gleaner_bench::BenchArgs),
    Diagnose(gleaner_bench::DiagnoseArgs),
}

fn main() -> ExitCode {
    let r = match Cli::parse().command {
        Cmd::Bench(a) => gleaner_bench::run_bench(a),
        Cmd::Diagnose(a) => gleaner_bench::run_diagnose(a, &gleaner_bench::diagnose::Standalone),
    };
    r.unwrap_or_else(|e| {
        eprintln!("gleaner: {e:#}");
        if e.chain().any(|c| c.is::<gleaner_os::BadInput>()) {
            ExitCode::from(2)
        } else {
            ExitCode::FAILURE
        }
    })
}
