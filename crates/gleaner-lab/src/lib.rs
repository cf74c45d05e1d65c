//! `gleaner lab`.
use std::process::ExitCode;

/// `gleaner lab ...`
#[derive(Debug, clap::Args)]
pub struct LabArgs {}

pub fn run(_args: LabArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("gleaner lab: not built yet")
}
