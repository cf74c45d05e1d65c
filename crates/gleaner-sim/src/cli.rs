//! The simulator's command line (`gleaner sim`): clap types only; [`crate::run`] resolves them
//! (scenario files and built-in names, seeds, `--set` values) into typed scenarios.

/// Options shared by a run and a sweep.
#[derive(Debug, Clone, clap::Args)]
pub struct RunOpts {
    /// RNG seed, 0..=18446744073709551615 (overrides the scenario's `seed`).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print one JSON document on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also draw wall times per variant and VM to this file (.svg or .png).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<std::path::PathBuf>,
    /// Leave the simulator's speed (wall-clock measurements) out of the output, so that the
    /// same seed gives byte-identical output.
    #[arg(long)]
    pub no_timing: bool,
    /// Worker threads for parallel runs, 1..=1024 (default: all cores).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub jobs: Option<usize>,
    /// Take the VM's wake costs from the agent's calibration record (default
    /// /run/gleaner/calibration.json): RT = P, IPI = B - RT, RV by idle gap = C(g) - B, and
    /// the POLL state for the agent's kernel polling; overrides the scenario's
    /// `costs.calibration`. Give FILE after the scenario, or as `--from-calibration=FILE`.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = crate::scenario::DEFAULT_CALIBRATION)]
    pub from_calibration: Option<std::path::PathBuf>,
}

/// `gleaner sim SCENARIO [--seed N] [--json] [--plot FILE]`, `gleaner sim --list`,
/// `gleaner sim sweep SCENARIO --set KEY=V1,V2 ...`
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SimArgs {
    #[command(subcommand)]
    pub command: Option<SimCommand>,
    /// A scenario file (TOML) or the name of a built-in scenario (see --list).
    pub scenario: Option<String>,
    /// List the built-in scenarios and workloads.
    #[arg(long)]
    pub list: bool,
    /// Print the scenario's TOML (after resolving a built-in name) and exit.
    #[arg(long)]
    pub print: bool,
    #[command(flatten)]
    pub opts: RunOpts,
}

#[derive(Debug, clap::Subcommand)]
pub enum SimCommand {
    /// Run a scenario over the cartesian product of parameter values, in parallel.
    Sweep(SweepArgs),
    /// Predict the idle policies' ratios to stock on a 2-vCPU VM (the `vm-matrix` scenario)
    /// and put them beside `gleaner compare --policies` measurements of the same workloads.
    Predict(PredictArgs),
}

/// `gleaner sim predict [--measured DIR] [--from-calibration [FILE]]`
#[derive(Debug, clap::Args)]
pub struct PredictArgs {
    /// A directory of `gleaner compare --json` documents as `scripts/bench/idle-policies.sh`
    /// writes them (pingpong.json, openloop-200.json, openloop-2000.json, openloop-20000.json,
    /// pipeline.json, stress-ng-cpu2.json); missing files leave their rows unmeasured.
    #[arg(long, value_name = "DIR")]
    pub measured: Option<std::path::PathBuf>,
    /// Take the wake costs from the agent's calibration record of this machine (default
    /// /run/gleaner/calibration.json, written by `gleaner run`, `compare` or `diagnose`)
    /// instead of the scenario's (the Gleaner paper's Table 2).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = crate::scenario::DEFAULT_CALIBRATION)]
    pub from_calibration: Option<std::path::PathBuf>,
    /// RNG seed, 0..=18446744073709551615 (default: the scenario's).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print one JSON document on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct SweepArgs {
    /// A scenario file (TOML) or the name of a built-in scenario.
    pub scenario: String,
    /// A dotted key and its values, e.g. `--set host.pcpus=4,8,16 --set vm.0.vcpus=4,8,16`
    /// (keys with the same value count vary together when joined with `+`:
    /// `--set host.pcpus+vm.0.vcpus=4,8`).
    #[arg(long = "set", value_name = "KEY=V1,V2,...", required = true)]
    pub set: Vec<String>,
    /// Seeds to run, e.g. `1-5` or `1,7,9` (default: the scenario's).
    #[arg(long)]
    pub seeds: Option<String>,
    #[command(flatten)]
    pub opts: RunOpts,
}
