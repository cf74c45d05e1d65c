//! Measurement toolkit: `gleaner bench` and `gleaner diagnose`.
use std::process::ExitCode;

/// `gleaner bench ...`
#[derive(Debug, clap::Args)]
pub struct BenchArgs {}

/// `gleaner diagnose`
#[derive(Debug, clap::Args)]
pub struct DiagnoseArgs {}

pub fn run_bench(_args: BenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("gleaner bench: not built yet")
}

pub fn run_diagnose(_args: DiagnoseArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("gleaner diagnose: not built yet")
}
