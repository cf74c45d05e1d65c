//! Synthetic traces for the retention policies: a yielding thread on one vCPU living through a
//! list of idle periods, and a workload's epochs under a host that does or does not reward
//! retention. The unit tests and `examples/retention_curves.rs` (the curves in docs/agent.md)
//! use them; everything is deterministic (a seeded SplitMix64).

use super::governor::{EpochReading, GovernorStep, RetentionGovernor, RetentionMode};
use super::{IdleDetector, KnownProbe, RetentionAction};

/// SplitMix64: a tiny, portable, seeded generator for synthetic traces.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Rounds a non-negative, finite quantity of a synthetic trace (far below 2^64) to an integer.
fn whole(x: f64) -> u64 {
    crate::num::saturating_u64(x.round())
}

/// `n` idle periods: with probability `p_long` a long one, uniform in `long_ns` +- 50% (so
/// the sleep backoff meets their ends at every phase), else exactly `short_ns`.
pub fn bimodal(n: usize, short_ns: u64, long_ns: u64, p_long: f64, seed: u64) -> Vec<u64> {
    let mut rng = SplitMix64(seed);
    (0..n).map(|_| if rng.unit() < p_long { whole(long_ns as f64 * (0.5 + rng.unit())) } else { short_ns }).collect()
}

/// How one idle period went for the yielding thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeriodOutcome {
    /// When the idle period began and how long it lasted.
    pub start_ns: u64,
    pub length_ns: u64,
    /// It ended before the timeout: the vCPU never halted.
    pub caught: bool,
    /// The detector's timeout when the period ended.
    pub timeout_ns: u64,
    /// Quick yields (spinning) of the thread during the period.
    pub spin_ns: u64,
}

/// Runs `det` as the yielding thread of a vCPU whose workload alternates the idle periods
/// `periods` with `work_ns` of work: quick yields of `yield_ns` while idle, a slow yield when
/// work arrives during one (it returns when the work is done), sleeps exactly as long as asked
/// (the vCPU halts; work arriving meanwhile runs and the thread waits for it to finish).
/// `sleep_evidence`: the thread can tell that work ran while it slept
/// ([`YieldProbe::ran_while_asleep`]).
pub fn drive_idle_periods(
    det: &mut IdleDetector,
    periods: &[u64],
    work_ns: u64,
    yield_ns: u64,
    sleep_evidence: bool,
) -> Vec<PeriodOutcome> {
    let yield_ns = yield_ns.max(1);
    let mut out = Vec::with_capacity(periods.len());
    // Carry on from where the detector's clock is (a second trace on the same detector).
    let mut start = det.clock_ns();
    let mut t = start;
    let mut i = 0usize;
    let mut halted = false;
    let mut asleep_work = false;
    let mut spin = 0u64;
    let ended = |i: usize, start: u64, halted: bool, det: &IdleDetector, spin: &mut u64| PeriodOutcome {
        start_ns: start,
        length_ns: periods[i],
        caught: !halted,
        timeout_ns: det.timeout_ns(),
        spin_ns: std::mem::take(spin),
    };
    while i < periods.len() {
        let end_of_idle = start + periods[i];
        let call_end = t + yield_ns;
        let mut probe = KnownProbe { other_task_ran: true, ran_while_asleep: std::mem::take(&mut asleep_work) };
        if call_end > end_of_idle {
            // Work arrives during this call: it returns once the work is done.
            let back = end_of_idle + work_ns;
            det.on_yield_at(back, back - t, &mut probe);
            out.push(ended(i, start, halted, det, &mut spin));
            halted = false;
            start = back;
            t = back;
            i += 1;
            continue;
        }
        spin += yield_ns;
        match det.on_yield_at(call_end, yield_ns, &mut probe) {
            RetentionAction::KeepYielding => t = call_end,
            RetentionAction::StepAside { ns } => t = call_end + ns,
            RetentionAction::Sleep { ns } => {
                halted = true;
                let mut wake = call_end + ns;
                // Idle periods that end while the thread sleeps: their work runs, and the
                // thread, woken behind it, waits for it to finish.
                while i < periods.len() && start + periods[i] < wake {
                    asleep_work = sleep_evidence;
                    out.push(ended(i, start, true, det, &mut spin));
                    start += periods[i] + work_ns;
                    wake = wake.max(start);
                    i += 1;
                }
                t = wake;
            }
        }
    }
    out
}

/// A workload's progress under a host, per epoch: `rate_per_s` sync points per second with
/// retention off, `rate_per_s * (1 + on_gain)` with it on while its threads burn `burn_vcpus`;
/// each reading is scaled by a uniform factor in `1 +- noise`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpochModel {
    pub rate_per_s: f64,
    pub on_gain: f64,
    pub burn_vcpus: f64,
    pub noise: f64,
    pub epoch_ns: u64,
    pub active_vcpus: u32,
    /// Traced wakeups per second (0: no tracer) and their mean latency off and on, ns.
    pub wakes_per_s: f64,
    pub wake_off_ns: f64,
    pub wake_on_ns: f64,
    /// A probe epoch lasts this share of `epoch_ns` (the agent's: `guest::PROBE_SHARE`); 1.0:
    /// as long as the others.
    pub probe_share: f64,
    /// Bytes the workload moves a second through read/write calls with retention off (0: no
    /// I/O), `io_bytes_per_s * (1 + io_on_gain)` with it on, in calls of 1 KiB each; the same
    /// jitter as the sync points.
    pub io_bytes_per_s: f64,
    pub io_on_gain: f64,
}

impl EpochModel {
    /// One epoch in `mode`, of the full length.
    pub fn reading(&self, mode: RetentionMode, rng: &mut SplitMix64) -> EpochReading {
        self.epoch(mode, self.epoch_ns, rng)
    }

    /// One epoch in `mode` lasting `epoch_ns`.
    fn epoch(&self, mode: RetentionMode, epoch_ns: u64, rng: &mut SplitMix64) -> EpochReading {
        let secs = epoch_ns as f64 / 1e9;
        let gain = if mode.is_on() { 1.0 + self.on_gain } else { 1.0 };
        let jitter = 1.0 + self.noise * (2.0 * rng.unit() - 1.0);
        let burn = if mode.is_on() { self.burn_vcpus } else { 0.0 };
        let bytes = self.io_bytes_per_s * secs * if mode.is_on() { 1.0 + self.io_on_gain } else { 1.0 } * jitter;
        EpochReading {
            duration_ns: epoch_ns,
            progress: whole(self.rate_per_s * secs * gain * jitter),
            retention_cpu_ns: whole(burn * epoch_ns as f64),
            steal_ns: 0,
            active_vcpus: self.active_vcpus,
            wakeups: whole(self.wakes_per_s * secs),
            wake_mean_ns: if mode.is_on() { self.wake_on_ns } else { self.wake_off_ns } * jitter,
            io: super::WorkloadIo { bytes: whole(bytes), calls: whole(bytes / 1024.0) },
            counter: None,
        }
    }
}

/// Runs `gov` for `epochs` epochs; epoch `k` is read from `model(k)` in the mode the governor
/// applies, a probe lasting the model's `probe_share`. Returns, per epoch, the mode it ran in
/// and the governor's step after it.
pub fn drive_governor(
    gov: &mut RetentionGovernor,
    epochs: usize,
    seed: u64,
    mut model: impl FnMut(usize) -> EpochModel,
) -> Vec<(RetentionMode, GovernorStep)> {
    let mut rng = SplitMix64(seed);
    (0..epochs)
        .map(|k| {
            let mode = gov.mode();
            let m = model(k);
            let ns = if gov.probing() { whole(m.epoch_ns as f64 * m.probe_share) } else { m.epoch_ns };
            let r = m.epoch(mode, ns, &mut rng);
            (mode, gov.step(&r))
        })
        .collect()
}
