//! The Gleaner guest agent: resource retention and consolidation scheduling.
use std::process::ExitCode;

/// Agent commands: run, attach, daemon, status, restore, compare.
#[derive(Debug, clap::Subcommand)]
pub enum AgentCommand {}

pub fn run(cmd: AgentCommand) -> anyhow::Result<ExitCode> {
    match cmd {}
}
