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
    /// Wakeup latency of a blocked thread (Gleaner paper, Table 2), settings A-D (and E, a spinning waiter: not the paper's).
    Wakeup(WakeupArgs),
    /// Run a built-in workload kernel and measure it (its work is checked).
    ///
    /// Throughput kernels (pipeline, barrier, condvar, mutex, spin-barrier, matmul, freqsleep)
    /// do a fixed amount of work (--items) and report its wall and CPU time. Latency kernels
    /// time every request between a client and a server pinned to two CPUs, through blocking
    /// (futex) hand-offs, and report latency percentiles beside the same measurements:
    /// pingpong, a closed loop (the client waits for each answer, --think-us between rounds);
    /// openloop, a server under Poisson arrivals at --rate requests/s, each request timed from
    /// its scheduled arrival to its reply.
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
    /// C: waiter's CPU idle; D: CPU-bound co-runner on every CPU; E: as D, the waiter
    /// spinning instead of blocking, a polling vCPU's thread next to a co-runner as a host
    /// sees it, not run by default). Comma-separated.
    #[arg(long = "setting", value_enum, ignore_case = true, value_delimiter = ',', default_values_t = wakeup::Setting::ALL)]
    pub settings: Vec<wakeup::Setting>,
    /// Primitive the waiter blocks in: condvar (timed from notify, pthread_cond_signal) or
    /// mutex (a glibc pthread mutex, timed from pthread_mutex_unlock, as in the paper).
    #[arg(long, value_enum, default_value_t = wakeup::Primitive::Condvar)]
    pub primitive: wakeup::Primitive,
    /// Measured rounds per setting (1..=1000000).
    #[arg(long, default_value_t = 2000)]
    pub rounds: u32,
    /// Warm-up rounds per setting (not recorded), 0..=100000.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub warmup: u32,
    /// Time between the waiter blocking and the wakeup, microseconds (lets its CPU go idle),
    /// 1..=1000000.
    #[arg(long, default_value_t = 1000)]
    pub period_us: u64,
    /// CPU of the waking thread, 0..=4095 and one this process may use (default: the first).
    #[arg(long)]
    pub waker_cpu: Option<u32>,
    /// CPU of the blocked thread, 0..=4095 and one this process may use (default: the second).
    #[arg(long)]
    pub waiter_cpu: Option<u32>,
    /// A wakeup not arriving within this many ms counts as lost, 0..=60000 (0: 200 ms + 10
    /// periods).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=60_000))]
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
    /// Kernel: pipeline, barrier, condvar, mutex, spin-barrier, matmul, freqsleep
    /// (throughput); pingpong, openloop (latency).
    pub name: String,
    /// Worker threads, 1..=1024 (default: depends on the kernel and the CPU count). Throughput
    /// kernels.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Compute per item, microseconds, 0..=1000000 (openloop: the server's work per request,
    /// default 5; not used by pingpong).
    #[arg(long)]
    pub work_us: Option<f64>,
    /// Amount of work (items, phases, hand-offs, acquisitions, multiplies or sleeps),
    /// 1..=1000000000. Throughput kernels; the latency kernels run for --duration-ms.
    #[arg(long)]
    pub items: Option<u64>,
    /// Use the small test size (well under a second; latency kernels: 200 ms).
    #[arg(long)]
    pub quick: bool,
    /// Number of runs (1..=1000).
    #[arg(long, default_value_t = 1)]
    pub runs: u32,
    /// Compute rate in LCG steps per microsecond, in (0, 1000000], instead of calibrating
    /// (fixes the amount of work across processes; not used by pingpong).
    #[arg(long)]
    pub iters_per_us: Option<f64>,
    /// Latency kernels: CPU of the client (pingpong's client; openloop's sender and receiver),
    /// 0..=4095 and one this process may use. Default: the first CPU this process may use.
    #[arg(long, value_name = "CPU")]
    pub client_cpu: Option<u32>,
    /// Latency kernels: CPU of the server, 0..=4095 and one this process may use. Default: the
    /// second CPU this process may use (the
    /// first if it may use only one). The client's CPU is allowed too: every hand-off then
    /// stays on one CPU and no cross-CPU wakeup is measured.
    #[arg(long, value_name = "CPU")]
    pub server_cpu: Option<u32>,
    /// Latency kernels: how long to run, milliseconds (default 2000; 1..=60000). openloop
    /// schedules its arrivals over this time.
    #[arg(long, value_name = "MS")]
    pub duration_ms: Option<u64>,
    /// pingpong: stop after this many round trips instead of after --duration-ms
    /// (1..=10000000).
    #[arg(long, conflicts_with = "duration_ms")]
    pub rounds: Option<u64>,
    /// pingpong: the client sleeps this long between rounds, microseconds (0..=1000000,
    /// default 0), so both CPUs go idle before the next request.
    #[arg(long, value_name = "US")]
    pub think_us: Option<u64>,
    /// openloop: mean arrival rate, requests per second (Poisson arrivals; default 2000;
    /// 1..=200000; with --work-us, rate x work must stay within 1).
    #[arg(long, value_name = "PER_S")]
    pub rate: Option<u32>,
    /// openloop: seed of the arrival schedule, 0..=18446744073709551615 (the same seed gives
    /// the same arrivals; default 1).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `gleaner bench run`
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Number of runs (1..=1000).
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
    /// Effective CPU count gamma of the base, in (0, 1048576] (default: CPUs available in its
    /// runs).
    #[arg(long)]
    pub gamma_base: Option<f64>,
    /// Effective CPU count gamma of the target, in (0, 1048576] (default: CPUs available in its
    /// runs; use half of it when two identical VMs share the pCPUs).
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
    /// Wakeup rounds per setting (B and C), 1 ms apart, 1..=100000.
    #[arg(long, default_value_t = 1000)]
    pub rounds: u32,
    /// Draw the machine's wake-cost curve (halted cost by idle gap, busy and polling costs)
    /// into this file (.png or .svg).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<std::path::PathBuf>,
    /// Measure the wake-cost curve again even if a valid calibration record exists (the
    /// record lives where `gleaner calibrate` keeps it).
    #[arg(long)]
    pub recalibrate: bool,
    /// Directory of the calibration record. Default: /run/gleaner as root, $TMPDIR/gleaner-UID
    /// otherwise.
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<std::path::PathBuf>,
    /// Instead of judging the machine, trace a running process's wakeups with eBPF (root) and
    /// show its wakeup-latency histogram split by the state of the vCPU each wakeup targeted
    /// (busy, polling, halted). A running process's pid, 1..=4194304.
    #[arg(long, value_name = "PID")]
    pub pid: Option<i32>,
    /// With --pid: how long to trace, in seconds, in (0, 3600].
    #[arg(long, value_name = "S", default_value_t = 5.0, requires = "pid")]
    pub seconds: f64,
}
