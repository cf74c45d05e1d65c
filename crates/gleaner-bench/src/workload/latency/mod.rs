//! Latency kernels: a client and a server pinned to two CPUs, handing requests over through
//! the same blocking, futex-based primitives as the throughput kernels ([`super::sync`]), timed
//! per request. They model a server with few connections, whose every request wakes a thread
//! blocked on another vCPU: the blocked-waiter wakeup the idle policies are judged by.
//!
//! ```text
//!  pingpong (closed loop)                          openloop (open loop, Poisson arrivals)
//!  client (client CPU)      server (server CPU)    sender (client CPU)      server (server CPU)
//!  t0 = now                                        sleep to scheduled t_k
//!  ping.put(k, v) --------> ping.take() (blocks)   requests.push(k, t_k) -> requests.pop() (blocks)
//!  pong.take() (blocks) <-- pong.put(k, f(v))                                work_us of compute
//!  sample = now - t0                               receiver (client CPU) <- replies.push(k, t_k, f(v))
//!  [sleep think_us]                                replies.pop() (blocks): sample = now - t_k
//! ```
//!
//! Both check every answer: the round or request it answers (in order, exactly once) and its
//! payload (a function of the request only the server computes), so a broken kernel fails
//! ([`LatencyCheckFailed`]) instead of looking fast; a lost hand-off ends in a stall error
//! after the stall timeout, never a hang.
//!
//! The open loop does not wait for replies before sending (no coordinated omission): each
//! request is stamped with its *scheduled* time, so a slow server or a late sender shows up
//! in the latency instead of slowing the arrivals down.

pub mod arrivals;
mod openloop;
mod pingpong;

use std::time::Duration;

use gleaner_measure::LatencySummary;
use gleaner_os::cpuset::CpuSet;
use gleaner_os::BadInput;
use serde::{Deserialize, Serialize};

use super::sync::{SyncError, STALL_TIMEOUT};
use super::Fault;

/// What a kernel's threads share: aborted as a whole when one thread fails, so that the
/// others wake with errors instead of waiting for it.
trait Abort {
    /// Wakes every thread waiting on the shared state with an error.
    fn abort(&self);

    /// Passes a thread's result on, aborting the others if it failed.
    fn guard<T>(&self, r: anyhow::Result<T>) -> anyhow::Result<T> {
        if r.is_err() {
            self.abort();
        }
        r
    }
}

/// A built-in latency kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LatencyKernel {
    /// Closed-loop cross-CPU ping-pong: one token handed back and forth.
    Pingpong,
    /// Open-loop request/response server at a fixed rate with Poisson arrivals.
    Openloop,
}

impl LatencyKernel {
    pub const ALL: [LatencyKernel; 2] = [LatencyKernel::Pingpong, LatencyKernel::Openloop];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            LatencyKernel::Pingpong => "pingpong",
            LatencyKernel::Openloop => "openloop",
        }
    }

    /// The latency kernel called `name`, if it is one.
    pub fn parse(name: &str) -> Option<LatencyKernel> {
        LatencyKernel::ALL.into_iter().find(|k| k.name() == name)
    }

    /// What one item (one latency sample) is.
    pub fn item_unit(self) -> &'static str {
        match self {
            LatencyKernel::Pingpong => "round trips",
            LatencyKernel::Openloop => "requests",
        }
    }
}

impl std::fmt::Display for LatencyKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Longest run, ms: keeps the samples (8 bytes each) in memory bounds.
pub const MAX_DURATION_MS: u64 = 60_000;
/// Most round trips of a `pingpong` run.
pub const MAX_ROUNDS: u64 = 10_000_000;
/// Highest `openloop` arrival rate, requests/s.
pub const MAX_RATE_PER_S: u32 = 200_000;
/// Longest `pingpong` think time, us.
pub const MAX_THINK_US: u64 = 1_000_000;
/// Default run length, ms.
pub const DEFAULT_DURATION_MS: u64 = 2_000;
/// `--quick` run length, ms.
pub const QUICK_DURATION_MS: u64 = 200;
/// Default `openloop` rate, requests/s.
pub const DEFAULT_RATE_PER_S: u32 = 2_000;
/// Default `openloop` server work per request, us.
pub const DEFAULT_WORK_US: f64 = 5.0;
/// Timer slack of the threads that sleep to a deadline (the open loop's sender, the
/// ping-pong client's think time), ns: the kernel's default 50 us would make every arrival
/// late by up to that much.
const TIMER_SLACK_NS: u64 = 1_000;

/// Parameters of `pingpong`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PingpongParams {
    /// CPU of the client thread.
    pub client_cpu: u32,
    /// CPU of the server thread (the client's own CPU is allowed: no cross-CPU wakeup then).
    pub server_cpu: u32,
    /// Pause of the client between rounds, us (its CPU idles meanwhile).
    pub think_us: u64,
    /// Run this long, ms; `None` when `rounds` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Run this many round trips; `None` when `duration_ms` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounds: Option<u64>,
    /// How long any single wait may last before the run fails as stalled, ms (default 30 000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_timeout_ms: Option<u64>,
    /// Deliberate defect (tests only): `DropOneItem` drops round 1's reply, `CorruptOneItem`
    /// corrupts it.
    #[serde(skip)]
    #[doc(hidden)]
    pub fault: Option<Fault>,
}

/// Parameters of `openloop`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenloopParams {
    /// CPU of the sender and the receiver.
    pub client_cpu: u32,
    /// CPU of the server thread.
    pub server_cpu: u32,
    /// Mean arrival rate, requests/s.
    pub rate_per_s: u32,
    /// Arrivals are scheduled over this long, ms.
    pub duration_ms: u64,
    /// Server compute per request, us.
    pub work_us: f64,
    /// Seed of the arrival schedule.
    pub seed: u64,
    /// Compute rate to use instead of calibrating (LCG steps per microsecond).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iters_per_us: Option<f64>,
    /// How long any single wait may last before the run fails as stalled, ms (default 30 000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_timeout_ms: Option<u64>,
    /// Deliberate defect (tests only): `DropOneItem` drops the reply to the middle request,
    /// `CorruptOneItem` corrupts it.
    #[serde(skip)]
    #[doc(hidden)]
    pub fault: Option<Fault>,
}

/// First and second CPU of `allowed` (the first twice when there is one).
fn default_cpus(allowed: &CpuSet) -> (u32, u32) {
    let v = allowed.to_vec();
    let client = v.first().copied().unwrap_or(0);
    (client, v.get(1).copied().unwrap_or(client))
}

impl PingpongParams {
    /// Defaults: the first two CPUs of `allowed`, no think time, 2 s.
    pub fn for_cpus(allowed: &CpuSet) -> PingpongParams {
        let (client_cpu, server_cpu) = default_cpus(allowed);
        PingpongParams {
            client_cpu,
            server_cpu,
            think_us: 0,
            duration_ms: Some(DEFAULT_DURATION_MS),
            rounds: None,
            stall_timeout_ms: None,
            fault: None,
        }
    }
}

impl OpenloopParams {
    /// Defaults: the first two CPUs of `allowed`, 2000 requests/s for 2 s, 5 us of work, seed 1.
    pub fn for_cpus(allowed: &CpuSet) -> OpenloopParams {
        let (client_cpu, server_cpu) = default_cpus(allowed);
        OpenloopParams {
            client_cpu,
            server_cpu,
            rate_per_s: DEFAULT_RATE_PER_S,
            duration_ms: DEFAULT_DURATION_MS,
            work_us: DEFAULT_WORK_US,
            seed: 1,
            iters_per_us: None,
            stall_timeout_ms: None,
            fault: None,
        }
    }
}

/// The parameters of one latency kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LatencyParams {
    Pingpong(PingpongParams),
    Openloop(OpenloopParams),
}

fn check_cpus(client: u32, server: u32, allowed: &CpuSet) -> Result<(), BadInput> {
    for (flag, cpu) in [("--client-cpu", client), ("--server-cpu", server)] {
        if !allowed.contains(cpu) {
            return Err(BadInput::new(flag, cpu, format!("a CPU this process may use: {allowed}")));
        }
    }
    Ok(())
}

fn check_duration(ms: u64) -> Result<(), BadInput> {
    if ms == 0 || ms > MAX_DURATION_MS {
        return Err(BadInput::new("--duration-ms", ms, format!("1..={MAX_DURATION_MS} milliseconds")));
    }
    Ok(())
}

impl LatencyParams {
    pub fn kernel(&self) -> LatencyKernel {
        match self {
            LatencyParams::Pingpong(_) => LatencyKernel::Pingpong,
            LatencyParams::Openloop(_) => LatencyKernel::Openloop,
        }
    }

    /// Reject values that make no sense, naming the value and what is allowed; `allowed` are
    /// the CPUs this process may use.
    pub fn validate(&self, allowed: &CpuSet) -> Result<(), BadInput> {
        match self {
            LatencyParams::Pingpong(p) => {
                check_cpus(p.client_cpu, p.server_cpu, allowed)?;
                match (p.duration_ms, p.rounds) {
                    (Some(ms), None) => check_duration(ms)?,
                    (None, Some(n)) if n == 0 || n > MAX_ROUNDS => {
                        return Err(BadInput::new("--rounds", n, format!("1..={MAX_ROUNDS}")));
                    }
                    (None, Some(_)) => {}
                    (d, r) => {
                        return Err(BadInput::new(
                            "--duration-ms/--rounds",
                            format!("{d:?}/{r:?}"),
                            "exactly one of a duration and a number of rounds",
                        ))
                    }
                }
                if p.think_us > MAX_THINK_US {
                    return Err(BadInput::new("--think-us", p.think_us, format!("0..={MAX_THINK_US} microseconds")));
                }
            }
            LatencyParams::Openloop(p) => {
                check_cpus(p.client_cpu, p.server_cpu, allowed)?;
                check_duration(p.duration_ms)?;
                if p.rate_per_s == 0 || p.rate_per_s > MAX_RATE_PER_S {
                    return Err(BadInput::new("--rate", p.rate_per_s, format!("1..={MAX_RATE_PER_S} requests per second")));
                }
                if !p.work_us.is_finite() || p.work_us < 0.0 || p.work_us > 1_000_000.0 {
                    return Err(BadInput::new("--work-us", p.work_us, "0..=1000000 microseconds"));
                }
                let load = f64::from(p.rate_per_s) * p.work_us / 1e6;
                if load > 1.0 {
                    return Err(BadInput::new(
                        "--work-us",
                        p.work_us,
                        format!(
                            "at most {} microseconds at --rate {} (the server's load, rate x work, must stay within 1: here {load:.2}; beyond it the queue grows without bound)",
                            1e6 / f64::from(p.rate_per_s),
                            p.rate_per_s
                        ),
                    ));
                }
                if u64::from(p.rate_per_s) * p.duration_ms < 1000 {
                    return Err(BadInput::new(
                        "--duration-ms",
                        p.duration_ms,
                        format!(
                            "at least {} ms at --rate {} (one request expected)",
                            1000_u64.div_ceil(u64::from(p.rate_per_s)),
                            p.rate_per_s
                        ),
                    ));
                }
                if let Some(r) = p.iters_per_us {
                    if !r.is_finite() || r <= 0.0 || r > 1e6 {
                        return Err(BadInput::new("--iters-per-us", r, "a number in (0, 1000000]"));
                    }
                }
            }
        }
        Ok(())
    }

    fn stall_timeout(&self) -> Duration {
        let ms = match self {
            LatencyParams::Pingpong(p) => p.stall_timeout_ms,
            LatencyParams::Openloop(p) => p.stall_timeout_ms,
        };
        ms.map_or(STALL_TIMEOUT, Duration::from_millis)
    }
}

/// What a latency kernel did, after its check passed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencyOutcome {
    pub kernel: LatencyKernel,
    /// Round trips, or requests answered (all of them: a shortfall is a failed check).
    pub items: u64,
    /// One latency per item, ns, in order.
    pub samples_ns: Vec<u64>,
    /// Open loop: how late the sender queued each request after its scheduled time, ns.
    pub send_lag_ns: Vec<u64>,
    /// The kernel's own window, ns: ping-pong from the first round to the last; open loop
    /// from the schedule's start to the last reply, at least the scheduled duration.
    pub window_ns: u64,
    /// Open loop: the arrival rate asked for, requests/s.
    pub requested_per_s: Option<f64>,
    /// A digest of the answers, identical across runs with the same parameters (and, for
    /// `pingpong`, the same number of rounds).
    pub checksum: u64,
    /// Open loop: LCG steps per request, and the compute rate used.
    pub iters_per_item: u64,
    pub iters_per_us: Option<f64>,
}

impl LatencyOutcome {
    /// Open loop: requests answered per second of [`LatencyOutcome::window_ns`].
    pub fn achieved_per_s(&self) -> Option<f64> {
        self.requested_per_s.map(|_| self.items as f64 * 1e9 / self.window_ns.max(1) as f64)
    }

    /// The latency summary of the run, with the open loop's rates and send lag.
    pub fn summary(&self) -> Option<LatencySummary> {
        let mut s = LatencySummary::of(&self.samples_ns)?;
        s.requested_per_s = self.requested_per_s;
        s.achieved_per_s = self.achieved_per_s();
        if let Some(lag) = LatencySummary::of(&self.send_lag_ns) {
            s.send_lag_p50_ns = Some(lag.p50_ns);
            s.send_lag_p99_ns = Some(lag.p99_ns);
        }
        Some(s)
    }
}

/// A latency kernel's own check failed: an answer was missing, repeated, out of order or wrong.
#[derive(Debug, thiserror::Error)]
#[error("{kernel} check failed: {detail}")]
pub struct LatencyCheckFailed {
    pub kernel: LatencyKernel,
    pub detail: String,
}

fn check(kernel: LatencyKernel, ok: bool, detail: impl FnOnce() -> String) -> anyhow::Result<()> {
    if ok {
        Ok(())
    } else {
        Err(LatencyCheckFailed { kernel, detail: detail() }.into())
    }
}

/// Pin the calling thread to `cpu`; `role` names it in the error.
fn pin(cpu: u32, role: &str) -> anyhow::Result<()> {
    gleaner_measure::measure::pin_current_thread(cpu).map_err(|e| anyhow::anyhow!("pinning the {role} thread to CPU {cpu}: {e}"))
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The error to report from the threads' errors: a failed check first, then the root cause
/// (a stall, a pinning failure) over the "aborted" errors it caused in the other threads.
fn root_error(errors: Vec<anyhow::Error>) -> Option<anyhow::Error> {
    let rank = |e: &anyhow::Error| {
        if e.is::<LatencyCheckFailed>() {
            0
        } else if matches!(e.downcast_ref::<SyncError>(), Some(SyncError::Aborted { .. })) {
            2
        } else {
            1
        }
    };
    errors.into_iter().min_by_key(rank)
}

/// A thread's result: a panic is re-raised, an error collected.
fn collect<T>(r: std::thread::Result<anyhow::Result<T>>, errors: &mut Vec<anyhow::Error>) -> Option<T> {
    match r {
        Ok(Ok(v)) => Some(v),
        Ok(Err(e)) => {
            errors.push(e);
            None
        }
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// A latency kernel ready to run: validated, its compute rate fixed and (open loop) its
/// arrival schedule drawn, so that none of that is inside a measured run.
#[derive(Debug, Clone)]
pub struct LatencyPlan {
    params: LatencyParams,
    iters: u64,
    schedule: Vec<u64>,
}

impl LatencyPlan {
    /// Validate `params` against the CPUs this process may use and prepare the run.
    pub fn new(params: &LatencyParams) -> Result<LatencyPlan, BadInput> {
        params.validate(&gleaner_measure::measure::allowed_cpu_set())?;
        let mut params = params.clone();
        let (iters, schedule) = match &mut params {
            LatencyParams::Pingpong(_) => (0, Vec::new()),
            LatencyParams::Openloop(p) => {
                let rate = *p.iters_per_us.get_or_insert_with(super::compute::iters_per_us);
                let duration_ns = p.duration_ms * 1_000_000;
                (super::compute::iters_for(p.work_us, rate), arrivals::schedule(p.rate_per_s, duration_ns, p.seed))
            }
        };
        Ok(LatencyPlan { params, iters, schedule })
    }

    /// The parameters, with the compute rate filled in.
    pub fn params(&self) -> &LatencyParams {
        &self.params
    }

    pub fn kernel(&self) -> LatencyKernel {
        self.params.kernel()
    }

    /// Open loop: the scheduled arrivals, ns from the start.
    pub fn schedule(&self) -> &[u64] {
        &self.schedule
    }

    /// Run the kernel once in this process and check its answers.
    pub fn run(&self) -> anyhow::Result<LatencyOutcome> {
        let timeout = self.params.stall_timeout();
        match &self.params {
            LatencyParams::Pingpong(p) => pingpong::run(p, timeout),
            LatencyParams::Openloop(p) => openloop::run(p, &self.schedule, self.iters, timeout),
        }
    }
}

/// Validate, prepare and run a latency kernel once.
pub fn run_latency(params: &LatencyParams) -> anyhow::Result<LatencyOutcome> {
    LatencyPlan::new(params)?.run()
}
