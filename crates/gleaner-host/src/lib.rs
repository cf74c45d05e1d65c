//! `gleaner host`.
use std::process::ExitCode;

/// `gleaner host ...`
#[derive(Debug, clap::Args)]
pub struct HostArgs {}

pub fn run(_args: HostArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("gleaner host: not built yet")
}
