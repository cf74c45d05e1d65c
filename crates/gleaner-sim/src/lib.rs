//! `gleaner sim`.
use std::process::ExitCode;

/// `gleaner sim ...`
#[derive(Debug, clap::Args)]
pub struct SimArgs {}

pub fn run(_args: SimArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("gleaner sim: not built yet")
}
