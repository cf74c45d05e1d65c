//! What the guest loop remembers of the workload between periods: each vCPU's idle periods
//! (traced, or estimated from the cpuidle counters), the idle share of the VM and of each
//! vCPU, smoothed over periods, and each vCPU's budget, tightened where retention ran over it
//! or met steal.

use super::{GuestController, GuestReading, VcpuIdle};
use crate::idle::plan::exponential_gaps;
use crate::idle::{Log2Hist, TraceSource, VcpuGaps, WakeCurve, WakeTrace};
use crate::retention::EpochReading;

/// A share smoothed over periods, each weighed by its length and the older halved each period:
/// a short period (the first, a probe) counts for less. `sysbench threads` left its first 50 ms
/// (start-up) half idle and no idle time after: counted as a full period, its start kept it
/// polling for 5 periods, a second. A first reading weighs as two of its periods (full periods
/// then halve the older, as the idle periods are smoothed).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Smoothed {
    pub(super) value: f64,
    /// The time `value` stands for, ns.
    pub(super) weight: f64,
}

impl Smoothed {
    /// `prev` with a period of `period_ns` at `x` folded in.
    pub(super) fn fold(prev: Option<Self>, x: f64, period_ns: u64) -> Self {
        let p = period_ns as f64;
        match prev {
            None => Self { value: x, weight: 2.0 * p },
            Some(s) => {
                let w = s.weight / 2.0;
                Self { value: (s.value * w + x * p) / (w + p), weight: w + p }
            }
        }
    }
}

/// The smoothed idle periods of one vCPU and the time they stand for.
#[derive(Debug, Clone, Default)]
pub(super) struct Seen {
    pub(super) gaps: VcpuGaps,
    pub(super) observed_ns: u64,
    /// Multiplier of the configured budget (1: as configured).
    pub(super) budget_scale: f64,
    /// Multiplier of the budget after the host took the vCPU away while it retained (1: none).
    pub(super) steal_scale: f64,
    /// Share of its time the workload left it idle, measured (not traced), smoothed; `None`
    /// before a reading had it.
    pub(super) idle_share: Option<Smoothed>,
}

impl Seen {
    /// The budget's multiplier now.
    pub(super) fn scale(&self) -> f64 {
        self.budget_scale * self.steal_scale
    }
}

/// What the host's sharing of its pCPUs does to retention, as the loop measures it.
///
/// The planner's price (`PlanConfig::price`) values an idle vCPU's time as otherwise unused, and
/// the calibrated curve's retained costs (a yielder's B, the POLL state's P) were measured with
/// the waiter's vCPU on its pCPU. On a host that shares the pCPUs, neither holds, and the VM
/// meets it as steal (the host ran something else while a vCPU wanted to run):
///
/// - A retained vCPU is runnable: its polling or yielding takes turns on its pCPU that the
///   host would otherwise give the co-runner, and a fair host charges them to the vCPU, whose
///   own work then waits for them. As often as the host has something else to run there (the
///   contention: steal over the time the vCPUs were runnable), a nanosecond retained is a
///   nanosecond of the VM's own time: Planned's price rises by the contention
///   (`gleaner sim fig7` on a host whose slices drift: the yielders took streamcluster to
///   0.45x of stock, their wakeups not slower than a halted vCPU's).
/// - A wakeup for a runnable vCPU waits while the host runs the other (the lab's TCG cells
///   next to a co-runner: a yielder-kept vCPU woke in 1.4-7.2 ms on average against 125-341
///   us halted, docs/lab.md "Wake costs"). In a period in which the managed vCPUs met steal
///   ([`LoopPriors::steal_share`](super::LoopPriors::steal_share) of the time they were
///   runnable, and more than [`LoopPriors::steal_min_ns`](super::LoopPriors::steal_min_ns):
///   not the counters' rounding), the traced wakeups onto vCPUs that were not halted (busy,
///   or polling) are what a retained vCPU's wakeup costs here now; Planned takes them where
///   dearer than the calibration's.
///
/// The ladder's Wide level plans at no price and on the calibration, so its probes still test
/// holding the vCPUs where this pricing says it does not pay.
///
/// A VM alone on its pCPUs meets no steal: its price and curve are as configured.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct HostWait {
    /// Steal over the time the managed vCPUs were runnable (ran, polled, yielded or waited),
    /// smoothed; `None` before a reading.
    pub(super) contention: Option<Smoothed>,
    /// The last period met steal.
    pub(super) contended: bool,
    /// The mean wakeup onto a runnable vCPU in the periods that met steal, ns, smoothed.
    pub(super) runnable_wake: Option<Smoothed>,
}

impl HostWait {
    /// Takes in a period: its steal over the managed vCPUs, and where it met steal, its traced
    /// wakeups onto runnable vCPUs if there were at least `min_wakeups`.
    pub(super) fn observe(&mut self, r: &GuestReading, cpus: &[u32], period_ns: u64, priors: &super::LoopPriors, min_wakeups: u64) {
        let mut managed = r.idle.iter().filter(|v| cpus.contains(&v.cpu)).peekable();
        if managed.peek().is_none() {
            return;
        }
        let (steal, runnable) = managed.fold((0_u64, 0_u64), |(s, run), v| {
            // Runnable: all but the time it was halted (polling counts idle, but holds the pCPU).
            let halted = v.idle_ns.saturating_sub(v.poll_ns);
            (s.saturating_add(v.steal_ns), run.saturating_add(period_ns.saturating_sub(halted).max(v.steal_ns)))
        });
        let share = if runnable == 0 { 0.0 } else { (steal as f64 / runnable as f64).min(1.0) };
        self.contention = Some(Smoothed::fold(self.contention, share, period_ns));
        // Against the time the vCPUs wanted to run, not all of it: a 64-vCPU VM running one
        // lock holder at a time is mostly halted, and its steal diluted by the halted vCPUs
        // read as no contention while the few it retained waited for their pCPUs (`gleaner
        // sim fig7` at 64 vCPUs on a credit host: mutex 0.95x of stock).
        self.contended = steal > priors.steal_min_ns && steal as f64 > priors.steal_share * runnable as f64;
        if !self.contended {
            return;
        }
        let Some(t) = r.trace.as_ref().filter(|t| t.traced_ns > 0) else { return };
        let mut onto_runnable = t.latency.busy.clone();
        onto_runnable.merge(&t.latency.poll);
        if onto_runnable.count() < min_wakeups {
            return;
        }
        if let Some(mean) = onto_runnable.mean_ns() {
            self.runnable_wake = Some(Smoothed::fold(self.runnable_wake, mean, period_ns));
        }
    }

    /// What a retained nanosecond costs on top of the planner's price: the contention, where
    /// the host shares the pCPUs (its steal beyond the counters' rounding); else nothing.
    pub(super) fn price(&self) -> f64 {
        self.contention.filter(|_| self.contended).map_or(0.0, |c| c.value)
    }

    /// `curve` with its retained costs raised to the measured wakeup onto a runnable vCPU,
    /// while the host is contended and that was measured dearer; `None`: `curve` stands.
    pub(super) fn priced(&self, curve: &WakeCurve) -> Option<WakeCurve> {
        let measured = crate::num::saturating_u64(self.runnable_wake.filter(|_| self.contended)?.value.round());
        let dearer = measured > curve.busy_ns || curve.poll_ns.is_some_and(|p| measured > p);
        dearer.then(|| WakeCurve {
            halted: curve.halted.clone(),
            busy_ns: curve.busy_ns.max(measured),
            poll_ns: curve.poll_ns.map(|p| p.max(measured)),
        })
    }
}

/// Realized retention cost over budget by more than this share tightens the budget.
pub(super) const BUDGET_SLACK: f64 = 0.05;

/// The governor's epoch from a period's readings.
pub(super) fn epoch_reading(r: &GuestReading, active_vcpus: u32) -> EpochReading {
    let latency = r.trace.as_ref().map(|t| t.latency.all());
    EpochReading {
        duration_ns: r.snapshot.period_ns,
        progress: r.snapshot.s_work,
        retention_cpu_ns: r.idle.iter().map(|v| v.poll_ns + v.yield_ns).sum(),
        steal_ns: r.idle.iter().map(|v| v.steal_ns).sum(),
        active_vcpus,
        wakeups: latency.as_ref().map_or(0, Log2Hist::count),
        wake_mean_ns: latency.as_ref().and_then(Log2Hist::mean_ns).unwrap_or(0.0),
        io: r.io,
        counter: r.counter,
    }
}

/// Idle periods estimated where no tracer saw them: per vCPU, as many as it went idle (or,
/// without cpuidle, as the workload blocked, shared evenly), exponential with the measured
/// mean, and as many of them woken by the workload as it blocked (its share by idle entries).
pub fn estimate_gaps(r: &GuestReading) -> WakeTrace {
    let n = r.idle.len().max(1) as u64;
    let s_work = r.snapshot.s_work;
    let total_entries: u64 = r.idle.iter().filter_map(|v| v.entries).sum();
    let mut t = WakeTrace::empty(TraceSource::Estimated, r.idle.iter().map(|v| v.cpu));
    for (v, g) in r.idle.iter().zip(t.vcpus.iter_mut()) {
        let entries = v.entries.unwrap_or(s_work / n);
        if entries == 0 || v.idle_ns == 0 {
            continue;
        }
        let woken = if total_entries > 0 && v.entries.is_some() {
            crate::num::saturating_u64((s_work as f64 * entries as f64 / total_entries as f64).round()).min(entries)
        } else {
            (s_work / n).min(entries)
        };
        let mean = v.idle_ns as f64 / entries as f64;
        g.woken = exponential_gaps(woken, mean);
        g.other = exponential_gaps(entries - woken, mean);
    }
    t.traced_ns = r.snapshot.period_ns;
    t
}

impl GuestController {
    /// Folds this period's idle periods into the smoothed ones (the older weigh half as much
    /// each period).
    pub(super) fn observe(&mut self, r: &GuestReading) -> Option<TraceSource> {
        let period_ns = r.snapshot.period_ns.max(1);
        let estimated;
        let (trace, observed_ns) = match &r.trace {
            Some(t) if t.traced_ns > 0 => {
                self.traced_before = true;
                (t, t.traced_ns)
            }
            // A period the tracer skipped: the smoothed idle periods stand.
            _ if self.traced_before => return None,
            _ => {
                estimated = estimate_gaps(r);
                (&estimated, period_ns)
            }
        };
        for s in &mut self.seen {
            let Some(g) = trace.gaps(s.gaps.cpu) else { continue };
            s.gaps = s.gaps.scaled(1, 2);
            if trace.source == TraceSource::Bpf {
                // Reweighted, but never more idle time than the slice had.
                let mut w = g.seen_whole_in(observed_ns, self.cfg.priors.slice_max_weight);
                let (idle, raw) = (w.all().sum_ns(), g.all().sum_ns());
                if idle > observed_ns.max(raw) {
                    w = w.scaled(observed_ns.max(raw), idle);
                }
                s.gaps.merge(&w);
            } else {
                s.gaps.merge(g);
            }
            // The yielder's catches over the whole period, scaled to the time traced.
            if let Some((_, c)) = r.caught.iter().find(|(cpu, _)| *cpu == s.gaps.cpu) {
                s.gaps.woken.merge(&c.scaled(observed_ns.min(period_ns), period_ns));
            }
            s.observed_ns = s.observed_ns / 2 + observed_ns;
        }
        Some(trace.source)
    }

    /// The workload leaves the vCPUs (almost) no idle time
    /// ([`priors.saturated_idle_share`](super::LoopPriors::saturated_idle_share)).
    pub fn saturated(&self) -> bool {
        self.saturated_for(crate::idle::Mechanism::Poll)
    }

    /// The workload leaves the vCPUs too little idle time for `mechanism` to pay
    /// ([`priors.saturated_idle_share`](super::LoopPriors::saturated_idle_share) for kernel
    /// polling,
    /// [`priors.saturated_yield_idle_share`](super::LoopPriors::saturated_yield_idle_share) for the
    /// yielders; halting always pays).
    pub fn saturated_for(&self, mechanism: crate::idle::Mechanism) -> bool {
        let limit = match mechanism {
            crate::idle::Mechanism::Poll => self.cfg.priors.saturated_idle_share,
            crate::idle::Mechanism::Yield => self.cfg.priors.saturated_yield_idle_share,
            crate::idle::Mechanism::Halt => return false,
        };
        self.idle_share.is_some_and(|s| s.value < limit)
    }

    /// Folds the period's idle share, the VM's and each vCPU's, into the smoothed ones
    /// ([`Smoothed`]).
    pub(super) fn observe_idle_share(&mut self, r: &GuestReading, period_ns: u64) {
        // Of the time a vCPU had: steal (the host ran something else) is neither the
        // workload's nor idle; the yielders' time is the workload's idle time.
        let free_had = |v: &VcpuIdle| (v.idle_ns.saturating_add(v.yield_ns), period_ns.saturating_sub(v.steal_ns));
        let share = |(free, had): (u64, u64)| (free as f64 / had.max(1) as f64).min(1.0);
        let seen: Vec<(u32, (u64, u64))> = r.idle.iter().filter(|v| self.cfg.cpus.contains(&v.cpu)).map(|v| (v.cpu, free_had(v))).collect();
        if seen.is_empty() {
            return;
        }
        for s in &mut self.seen {
            if let Some(&(_, fh)) = seen.iter().find(|(cpu, _)| *cpu == s.gaps.cpu) {
                s.idle_share = Some(Smoothed::fold(s.idle_share, share(fh), period_ns));
            }
        }
        let total = seen.iter().fold((0, 0), |(f, h), (_, (free, had))| (f + free, h + had));
        self.idle_share = Some(Smoothed::fold(self.idle_share, share(total), period_ns));
    }

    /// Tightens the budget of a vCPU whose polling or yielding took more than its budget in
    /// the period, and relaxes it back towards the configured one otherwise. Halves it, and
    /// lets it grow back only slowly, when the host took the vCPU away while it retained:
    /// the CPU retention burns is the host's to give, and a host that caps the VM's CPU
    /// (these VMs: stalls of ~100 ms, counted as steal, in half the runs that polled both
    /// vCPUs for 3 s) makes the whole workload wait.
    pub(super) fn tighten_budgets(&mut self, r: &GuestReading, period_ns: u64) {
        let budget = self.cfg.plan.budget;
        for s in &mut self.seen {
            let Some(v) = r.idle.iter().find(|v| v.cpu == s.gaps.cpu) else { continue };
            let spent = (v.poll_ns + v.yield_ns) as f64 / period_ns as f64;
            let stolen = v.steal_ns as f64 / period_ns as f64;
            if stolen > self.cfg.priors.steal_share && v.steal_ns > self.cfg.priors.steal_min_ns && spent > self.cfg.priors.steal_share {
                s.steal_scale = (s.steal_scale * 0.5).max(0.05);
            } else {
                s.steal_scale = (s.steal_scale * self.cfg.priors.steal_recovery).min(1.0);
            }
            let allowed = budget * s.budget_scale;
            if spent > allowed * (1.0 + BUDGET_SLACK) && spent > 0.0 {
                s.budget_scale = (s.budget_scale * allowed / spent).max(0.05);
            } else {
                s.budget_scale = (s.budget_scale * 1.1).min(1.0);
            }
        }
    }
}
