//! The command line of `gleaner bench` and `gleaner diagnose`: clap types only; the commands
//! resolve them (e.g. [`crate::workload_params`]) into typed parameters before measuring.

use std::path::PathBuf;

use gleaner_measure::wakeup;

/// `gleaner bench ...`
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

/// The benchmarks.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// Wakeup latency of a blocked thread (Gleaner paper, Table 2), settings A-D.
    Wakeup(WakeupArgs),
    /// Run a built-in workload kernel and measure it (its work is checked).
    Workload(WorkloadArgs),
    /// Measure any command: wall, CPU time and context switches of its process tree, idle
    /// entries, steal.
    Run(RunArgs),
    /// The survey's overhead metrics (d_eta_r, d_eta_t, omega) from two result files.
    Overhead(OverheadArgs),
    /// Run CMD with naive, always-on retention: a SCHED_IDLE `sched_yield()` loop on every CPU
    /// (no timeout, no consolidation), the user-level idle daemon of the Fudan technical report
    /// the Gleaner paper cites. A baseline policy for `gleaner lab`; exits with CMD's status.
    Yielders(YieldersArgs),
    /// Print this machine's compute rate (LCG steps per microsecond, the fastest of N ~1 ms
    /// trials): pass it to `bench workload --iters-per-us` so runs do the same work.
    Rate(RateArgs),
}

/// `gleaner bench rate`
#[derive(Debug, Clone, clap::Args)]
pub struct RateArgs {
    /// Trials; the fastest one counts (the least disturbed by preemption), 1..=1000.
    #[arg(long, default_value_t = 20)]
    pub trials: u32,
}

/// `gleaner bench yielders`
#[derive(Debug, Clone, clap::Args)]
pub struct YieldersArgs {
    /// CPUs to keep busy (kernel list, e.g. 0-3); default: every CPU this process may use.
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<String>,
    /// The command and its arguments (after `--`).
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `gleaner bench wakeup`
#[derive(Debug, Clone, clap::Args)]
pub struct WakeupArgs {
    /// Settings to run (A: same CPU; B: waiter's CPU kept busy by a SCHED_IDLE yielder;
    /// C: waiter's CPU idle; D: CPU-bound co-runner on every CPU). Comma-separated.
    #[arg(long = "setting", value_enum, ignore_case = true, value_delimiter = ',', default_values_t = wakeup::Setting::ALL)]
    pub settings: Vec<wakeup::Setting>,
    /// Primitive the waiter blocks in: condvar (timed from notify, pthread_cond_signal) or
    /// mutex (a glibc pthread mutex, timed from pthread_mutex_unlock, as in the paper).
    #[arg(long, value_enum, default_value_t = wakeup::Primitive::Condvar)]
    pub primitive: wakeup::Primitive,
    /// Measured rounds per setting.
    #[arg(long, default_value_t = 2000)]
    pub rounds: u32,
    /// Warm-up rounds per setting (not recorded).
    #[arg(long, default_value_t = 20)]
    pub warmup: u32,
    /// Time between the waiter blocking and the wakeup, microseconds (lets its CPU go idle).
    #[arg(long, default_value_t = 1000)]
    pub period_us: u64,
    /// CPU of the waking thread (default: first CPU this process may use).
    #[arg(long)]
    pub waker_cpu: Option<u32>,
    /// CPU of the blocked thread (default: second CPU this process may use).
    #[arg(long)]
    pub waiter_cpu: Option<u32>,
    /// A wakeup not arriving within this many ms counts as lost (0: 200 ms + 10 periods).
    #[arg(long, default_value_t = 0)]
    pub deadline_ms: u64,
    /// Print one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
    /// Write the latency CDF of each setting to FILE (.png or .svg).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
}

/// `gleaner bench workload`
#[derive(Debug, Clone, clap::Args)]
pub struct WorkloadArgs {
    /// Kernel: pipeline, barrier, condvar, mutex, spin-barrier, matmul, freqsleep.
    pub name: String,
    /// Worker threads (default: depends on the kernel and the CPU count).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Compute per item, microseconds.
    #[arg(long)]
    pub work_us: Option<f64>,
    /// Amount of work (items, phases, hand-offs, acquisitions, multiplies or sleeps).
    #[arg(long)]
    pub items: Option<u64>,
    /// Use the small test size (well under a second).
    #[arg(long)]
    pub quick: bool,
    /// Number of runs.
    #[arg(long, default_value_t = 1)]
    pub runs: u32,
    /// Compute rate in LCG steps per microsecond instead of calibrating (fixes the amount
    /// of work across processes).
    #[arg(long)]
    pub iters_per_us: Option<f64>,
    /// Print one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `gleaner bench run`
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Number of runs.
    #[arg(long, default_value_t = 5)]
    pub runs: u32,
    /// Print one JSON document on stdout (the command's stdout goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// The command and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `gleaner bench overhead`
#[derive(Debug, Clone, clap::Args)]
pub struct OverheadArgs {
    /// Result of the base configuration (native / stock), from `bench workload|run --json`.
    pub base: PathBuf,
    /// Result of the target configuration (virtualized / changed).
    pub target: PathBuf,
    /// Effective CPU count gamma of the base (default: CPUs available in its runs).
    #[arg(long)]
    pub gamma_base: Option<f64>,
    /// Effective CPU count gamma of the target (default: CPUs available in its runs; use
    /// half of it when two identical VMs share the pCPUs).
    #[arg(long)]
    pub gamma_target: Option<f64>,
    /// Print one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `gleaner diagnose`
#[derive(Debug, Clone, clap::Args)]
pub struct DiagnoseArgs {
    /// Print one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
    /// Wakeup rounds per setting (B and C), 1 ms apart.
    #[arg(long, default_value_t = 1000)]
    pub rounds: u32,
}
