//! Built-in workload kernels modelled on the papers' benchmarks. Each does a fixed amount of
//! work and checks it, so a broken kernel cannot look fast.
//!
//! | kernel | models | synchronization | check |
//! |---|---|---|---|
//! | `pipeline` | PARSEC dedup | 4 stages joined by bounded mutex+condvar queues | every item's value (LCG jump-ahead), count |
//! | `barrier` | streamcluster | blocking barrier after each phase | per-thread accumulators |
//! | `condvar` | producer/consumer | one-slot mailboxes, condvar hand-offs | per-pair accumulators |
//! | `mutex` | lock-heavy code | one contended mutex, short critical sections | counter and sums |
//! | `spin-barrier` | volrend (survey listing 1) | user-level spinning barrier | per-thread accumulators |
//! | `matmul` | CPU-bound co-runner | none | `A x P` equals `A` with columns permuted |
//! | `freqsleep` | Gleaner's freqsleep | `nanosleep(1)` loops | completed sleeps |
//!
//! Beside these throughput kernels (a fixed amount of work, timed as a whole), the
//! [`latency`] kernels time every request of a client and a server on two CPUs:
//!
//! | kernel | models | synchronization | check |
//! |---|---|---|---|
//! | `pingpong` | a client waiting for each answer (closed loop) | two one-slot mailboxes | each round's answer and payload |
//! | `openloop` | a server under Poisson arrivals at a fixed rate | unbounded request and reply queues | every request answered once, in order, payload |
//!
//! The unit of compute is an LCG step ([`compute`]); `work_us` is converted to steps with a
//! rate calibrated once per process ([`compute::iters_per_us`]) unless
//! [`WorkloadParams::iters_per_us`] fixes it (use that for comparisons across processes).

pub mod compute;
mod kernels;
pub mod latency;
pub mod sync;

use std::time::Instant;

use gleaner_os::BadInput;
use serde::{Deserialize, Serialize};

/// A built-in throughput kernel (the latency kernels are [`latency::LatencyKernel`]s: they run
/// for a duration, not a fixed amount of work, and are not lab matrix kernels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// dedup-like pipeline: 4 stages, bounded queues, many small items.
    Pipeline,
    /// streamcluster-like phases separated by blocking barriers.
    Barrier,
    /// producer/consumer hand-offs through condvars.
    Condvar,
    /// contended short critical sections on one mutex.
    Mutex,
    /// volrend-like user-level spinning barrier.
    SpinBarrier,
    /// CPU-bound integer matrix multiply (co-runner).
    Matmul,
    /// one thread per CPU looping nanosleep(1) (co-runner).
    Freqsleep,
}

impl Workload {
    pub const ALL: [Workload; 7] = [
        Workload::Pipeline,
        Workload::Barrier,
        Workload::Condvar,
        Workload::Mutex,
        Workload::SpinBarrier,
        Workload::Matmul,
        Workload::Freqsleep,
    ];

    /// The command-line name (`spin-barrier`).
    pub fn name(self) -> &'static str {
        match self {
            Workload::Pipeline => "pipeline",
            Workload::Barrier => "barrier",
            Workload::Condvar => "condvar",
            Workload::Mutex => "mutex",
            Workload::SpinBarrier => "spin-barrier",
            Workload::Matmul => "matmul",
            Workload::Freqsleep => "freqsleep",
        }
    }

    /// Parse a command-line name; unknown names are [`BadInput`] (a latency kernel's name
    /// too, with a word on why).
    pub fn parse(name: &str) -> Result<Workload, BadInput> {
        Workload::ALL.into_iter().find(|w| w.name() == name).ok_or_else(|| {
            let throughput = Workload::ALL.map(Workload::name).join(", ");
            match latency::LatencyKernel::parse(name) {
                Some(k) => BadInput::new(
                    "workload",
                    name,
                    format!(
                        "a throughput kernel: {throughput} ({k} is a latency kernel: it runs for a duration, with no fixed amount of work)"
                    ),
                ),
                None => BadInput::new("workload", name, throughput),
            }
        })
    }

    /// What one item is, for throughput units.
    /// Compute steps (`work_us` each) per item with `threads` threads, where that is fixed: a
    /// pipeline item passes two stages, a hand-off is computed by producer and consumer, a
    /// barrier phase by every thread. `None` for kernels without a fixed count.
    pub fn compute_steps_per_item(self, threads: usize) -> Option<f64> {
        match self {
            Workload::Pipeline | Workload::Condvar => Some(2.0),
            Workload::Barrier | Workload::SpinBarrier => Some(threads as f64),
            _ => None,
        }
    }

    pub fn item_unit(self) -> &'static str {
        match self {
            Workload::Pipeline => "items",
            Workload::Barrier | Workload::SpinBarrier => "phases",
            Workload::Condvar => "hand-offs",
            Workload::Mutex => "lock acquisitions",
            Workload::Matmul => "64x64 multiplies",
            Workload::Freqsleep => "sleeps",
        }
    }
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A deliberate defect, for testing that the checks catch broken kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fault {
    /// Corrupt the result of one item.
    CorruptOneItem,
    /// Drop one item.
    DropOneItem,
}

/// Size of a kernel run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadParams {
    /// Worker threads (pipeline: per middle stage; condvar: rounded down to pairs;
    /// freqsleep: sleeping threads).
    pub threads: usize,
    /// Compute per item in microseconds (pipeline: per stage; mutex: outside the lock, an
    /// eighth of it inside; barrier/spin-barrier: per thread per phase; unused by matmul and
    /// freqsleep).
    pub work_us: f64,
    /// Amount of work: items, phases, hand-offs, lock acquisitions, multiplies or sleeps.
    pub items: u64,
    /// Compute rate to use instead of calibrating (LCG steps per microsecond).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iters_per_us: Option<f64>,
    /// Deliberate defect (tests only).
    #[serde(skip)]
    #[doc(hidden)]
    pub fault: Option<Fault>,
    /// How long any single wait may last before the run fails as stalled, ms
    /// (default: 30 000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_timeout_ms: Option<u64>,
}

/// Online CPUs as seen by this process (at least 1).
pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

impl WorkloadParams {
    /// The default size: about 1-3 s on an otherwise idle 2-vCPU VM (pipeline about 2 s, so
    /// that `gleaner compare` can do 5 + 5 runs in about a minute; longer under other load).
    pub fn default_for(w: Workload) -> WorkloadParams {
        Self::default_for_cpus(w, available_cpus())
    }

    /// The default size on a machine with `cpus` CPUs (what [`WorkloadParams::default_for`]
    /// gives there: the thread count follows the CPU count).
    pub fn default_for_cpus(w: Workload, cpus: usize) -> WorkloadParams {
        let cpus = cpus.max(1);
        let (threads, work_us, items) = match w {
            Workload::Pipeline => (cpus, 10.0, 100_000),
            Workload::Barrier => (cpus, 50.0, 15_000),
            Workload::Condvar => (cpus.max(2), 10.0, 150_000),
            Workload::Mutex => (cpus.max(2) * 2, 5.0, 400_000),
            Workload::SpinBarrier => (cpus, 50.0, 4_000),
            Workload::Matmul => (cpus, 0.0, 15_000),
            Workload::Freqsleep => (cpus, 0.0, 45_000),
        };
        WorkloadParams { threads, work_us, items, iters_per_us: None, fault: None, stall_timeout_ms: None }
    }

    /// A small size (well under a second) for tests and quick checks.
    pub fn quick(w: Workload) -> WorkloadParams {
        let mut p = Self::default_for(w);
        p.items = (p.items / 50).max(10);
        p
    }

    /// The stall timeout of every wait.
    pub fn stall_timeout(&self) -> std::time::Duration {
        self.stall_timeout_ms.map_or(sync::STALL_TIMEOUT, std::time::Duration::from_millis)
    }

    /// Reject sizes that make no sense, naming the value and what is allowed.
    pub fn validate(&self) -> Result<(), BadInput> {
        if self.threads == 0 || self.threads > 1024 {
            return Err(BadInput::new("--threads", self.threads, "1..=1024"));
        }
        if !self.work_us.is_finite() || self.work_us < 0.0 || self.work_us > 1_000_000.0 {
            return Err(BadInput::new("--work-us", self.work_us, "0..=1000000 microseconds"));
        }
        if self.items == 0 || self.items > 1_000_000_000 {
            return Err(BadInput::new("--items", self.items, "1..=1000000000"));
        }
        if let Some(r) = self.iters_per_us {
            if !r.is_finite() || r <= 0.0 || r > 1e6 {
                return Err(BadInput::new("--iters-per-us", r, "a number in (0, 1000000]"));
            }
        }
        Ok(())
    }
}

impl Default for WorkloadParams {
    /// The default size of the `pipeline` kernel (see [`WorkloadParams::default_for`]).
    fn default() -> Self {
        Self::default_for(Workload::Pipeline)
    }
}

/// What a kernel did, after its check passed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadOutcome {
    pub workload: Workload,
    /// Items completed (all of them: a shortfall is a failed check).
    pub items: u64,
    /// A digest of the results, identical across runs with the same parameters and rate.
    pub checksum: u64,
    /// LCG steps per item (per stage for the pipeline).
    pub iters_per_item: u64,
    /// The compute rate used.
    pub iters_per_us: f64,
    /// Wall time of the kernel alone.
    pub wall_ns: u64,
}

/// The kernel's own check failed: its result is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{workload} check failed: {detail}")]
pub struct CheckFailed {
    pub workload: Workload,
    pub detail: String,
}

/// Run kernel `w` in this process and check its work.
pub fn run_workload(w: Workload, params: &WorkloadParams) -> anyhow::Result<WorkloadOutcome> {
    params.validate()?;
    let rate = params.iters_per_us.unwrap_or_else(compute::iters_per_us);
    let iters = compute::iters_for(params.work_us, rate);
    let start = Instant::now();
    let (items, checksum) = kernels::run(w, params, iters)?;
    let wall_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    Ok(WorkloadOutcome { workload: w, items, checksum, iters_per_item: iters, iters_per_us: rate, wall_ns })
}
