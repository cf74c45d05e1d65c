//! What the scheduler tracer (`gleaner_os::bpf::WakeTracer`) reports for a window of time: the
//! managed workload's wakeup latency split by the state of the vCPU it was woken on, and each
//! vCPU's idle periods split by how they ended. Plain data: the agent fills it from the
//! kernel, the simulator from its model, tests by hand.
//!
//! ```text
//!  sched_waking(task)        -> remember (task, now, waker CPU)
//!  cpu_idle(state, cpu)      -> the vCPU's last cpuidle state entered (POLL, halt, ...)
//!  sched_switch(idle -> task) on CPU c:
//!       idle period on c: now - when the idle task got c        -> gaps of c
//!       task was woken: latency = now - its sched_waking         -> latency by c's state:
//!          c was busy (another task ran)  -> busy                   busy, poll, halt, idle
//!          c was idle: its last state     -> poll / halt (idle: none seen)
//!  the next switch away from task (it is current then: its pid and tgid are known):
//!       task is the managed workload's -> commit the latency, and the gap as `woken` if the
//!       wakeup came from another CPU, `local` if from this one (a timer, an interrupt);
//!       any other task's -> `other`
//! ```

use serde::{Deserialize, Serialize};

use super::hist::Log2Hist;

/// The state of the vCPU a task was woken onto, when the wakeup was issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetState {
    /// Another task ran there (the workload, another process, a yielding thread): the waker
    /// had to send an IPI and the task may have waited for its turn.
    Busy,
    /// The vCPU polled in the kernel's POLL idle state: no IPI.
    Poll,
    /// The vCPU was halted (any cpuidle state but POLL, or the default idle): an IPI and a
    /// vCPU wakeup by the host.
    Halt,
    /// The vCPU was idle but the tracer saw no cpuidle state for it.
    Idle,
}

impl TargetState {
    pub const ALL: [TargetState; 4] = [TargetState::Busy, TargetState::Poll, TargetState::Halt, TargetState::Idle];

    pub fn name(self) -> &'static str {
        match self {
            Self::Busy => "busy",
            Self::Poll => "poll",
            Self::Halt => "halt",
            Self::Idle => "idle",
        }
    }
}

/// The managed workload's wakeup latency (from `sched_waking` to the task running), by the
/// state of its target vCPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeLatency {
    pub busy: Log2Hist,
    pub poll: Log2Hist,
    pub halt: Log2Hist,
    pub idle: Log2Hist,
}

impl WakeLatency {
    /// The histogram of one target state.
    #[must_use]
    pub fn of(&self, s: TargetState) -> &Log2Hist {
        match s {
            TargetState::Busy => &self.busy,
            TargetState::Poll => &self.poll,
            TargetState::Halt => &self.halt,
            TargetState::Idle => &self.idle,
        }
    }

    /// The histogram of one target state, to fill.
    pub fn of_mut(&mut self, s: TargetState) -> &mut Log2Hist {
        match s {
            TargetState::Busy => &mut self.busy,
            TargetState::Poll => &mut self.poll,
            TargetState::Halt => &mut self.halt,
            TargetState::Idle => &mut self.idle,
        }
    }

    /// Every wakeup, whatever the target's state.
    #[must_use]
    pub fn all(&self) -> Log2Hist {
        let mut h = self.busy.clone();
        for s in [TargetState::Poll, TargetState::Halt, TargetState::Idle] {
            h.merge(self.of(s));
        }
        h
    }

    /// What was added since `earlier`.
    #[must_use]
    pub fn delta_since(&self, earlier: &Self) -> Self {
        Self {
            busy: self.busy.delta_since(&earlier.busy),
            poll: self.poll.delta_since(&earlier.poll),
            halt: self.halt.delta_since(&earlier.halt),
            idle: self.idle.delta_since(&earlier.idle),
        }
    }

    pub fn merge(&mut self, other: &Self) {
        for s in TargetState::ALL {
            self.of_mut(s).merge(other.of(s));
        }
    }
}

/// A latency distribution in four numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_ns: f64,
    pub p50_ns: f64,
    pub p99_ns: f64,
}

impl LatencySummary {
    #[must_use]
    pub fn of(h: &Log2Hist) -> Self {
        Self {
            count: h.count(),
            mean_ns: h.mean_ns().unwrap_or(0.0),
            p50_ns: h.quantile_ns(0.5).unwrap_or(0.0),
            p99_ns: h.quantile_ns(0.99).unwrap_or(0.0),
        }
    }
}

/// [`WakeLatency`] summarized: every wakeup, and by target state (status, events).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct WakeSummary {
    pub all: LatencySummary,
    pub busy: LatencySummary,
    pub poll: LatencySummary,
    pub halt: LatencySummary,
    pub idle: LatencySummary,
}

impl WakeSummary {
    #[must_use]
    pub fn of(l: &WakeLatency) -> Self {
        Self {
            all: LatencySummary::of(&l.all()),
            busy: LatencySummary::of(&l.busy),
            poll: LatencySummary::of(&l.poll),
            halt: LatencySummary::of(&l.halt),
            idle: LatencySummary::of(&l.idle),
        }
    }
}

/// One vCPU's idle periods (the idle task held it), by how they ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuGaps {
    pub cpu: u32,
    /// Ended by a wakeup of a managed task issued from another CPU: the wakeups a vCPU kept
    /// from halting makes cheaper.
    pub woken: Log2Hist,
    /// Ended otherwise: another process's task, or nothing woken (an interrupt alone).
    pub other: Log2Hist,
    /// Ended by a wakeup of a managed task issued on this CPU: a timer of the workload's (a
    /// sleep, a timeout) or an interrupt handled here. A polling vCPU takes the timer without
    /// being woken by the host too.
    #[serde(default)]
    pub local: Log2Hist,
}

impl VcpuGaps {
    /// Every idle period.
    #[must_use]
    pub fn all(&self) -> Log2Hist {
        let mut h = self.woken.clone();
        h.merge(&self.other);
        h.merge(&self.local);
        h
    }

    /// The idle periods that ended with the workload woken (from another CPU or this one):
    /// the wakeups a vCPU kept from halting makes cheaper.
    #[must_use]
    pub fn workload(&self) -> Log2Hist {
        let mut h = self.woken.clone();
        h.merge(&self.local);
        h
    }

    #[must_use]
    pub fn delta_since(&self, earlier: &Self) -> Self {
        Self {
            cpu: self.cpu,
            woken: self.woken.delta_since(&earlier.woken),
            other: self.other.delta_since(&earlier.other),
            local: self.local.delta_since(&earlier.local),
        }
    }

    pub fn merge(&mut self, other: &Self) {
        self.woken.merge(&other.woken);
        self.other.merge(&other.other);
        self.local.merge(&other.local);
    }

    /// Every kind reweighted for a window that saw only the idle periods inside it whole
    /// ([`Log2Hist::seen_whole_in`]).
    #[must_use]
    pub fn seen_whole_in(&self, window_ns: u64, max_weight: f64) -> Self {
        Self {
            cpu: self.cpu,
            woken: self.woken.seen_whole_in(window_ns, max_weight),
            other: self.other.seen_whole_in(window_ns, max_weight),
            local: self.local.seen_whole_in(window_ns, max_weight),
        }
    }

    /// Every kind scaled by `num / den` in count (an exponential decay of the past).
    #[must_use]
    pub fn scaled(&self, num: u64, den: u64) -> Self {
        Self { cpu: self.cpu, woken: self.woken.scaled(num, den), other: self.other.scaled(num, den), local: self.local.scaled(num, den) }
    }
}

/// Where a [`WakeTrace`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceSource {
    /// The in-kernel tracer on the scheduler tracepoints.
    Bpf,
    /// Estimated from cpuidle usage/time and the workload's context switches (no tracer):
    /// idle periods exponential with the measured mean, as many woken as the workload blocked.
    Estimated,
    /// A model (the simulator) or a test.
    Model,
}

/// What the tracer saw over `traced_ns` (cumulative counters, or one window's difference).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeTrace {
    pub source: TraceSource,
    /// Time the tracer was attached (it may trace only part of a period, to bound its cost).
    pub traced_ns: u64,
    pub latency: WakeLatency,
    /// Per traced vCPU, by CPU number.
    pub vcpus: Vec<VcpuGaps>,
}

impl WakeTrace {
    /// An empty trace of `cpus`.
    #[must_use]
    pub fn empty(source: TraceSource, cpus: impl IntoIterator<Item = u32>) -> Self {
        Self {
            source,
            traced_ns: 0,
            latency: WakeLatency::default(),
            vcpus: cpus.into_iter().map(|cpu| VcpuGaps { cpu, ..VcpuGaps::default() }).collect(),
        }
    }

    /// The gaps of `cpu`, if traced.
    #[must_use]
    pub fn gaps(&self, cpu: u32) -> Option<&VcpuGaps> {
        self.vcpus.iter().find(|g| g.cpu == cpu)
    }

    /// What was added since `earlier` (vCPUs matched by number; new ones count whole).
    #[must_use]
    pub fn delta_since(&self, earlier: &Self) -> Self {
        Self {
            source: self.source,
            traced_ns: self.traced_ns.saturating_sub(earlier.traced_ns),
            latency: self.latency.delta_since(&earlier.latency),
            vcpus: self.vcpus.iter().map(|g| earlier.gaps(g.cpu).map_or_else(|| g.clone(), |e| g.delta_since(e))).collect(),
        }
    }

    /// Adds `other` (vCPUs matched by number).
    pub fn merge(&mut self, other: &Self) {
        self.traced_ns = self.traced_ns.saturating_add(other.traced_ns);
        self.latency.merge(&other.latency);
        for g in &other.vcpus {
            match self.vcpus.iter_mut().find(|m| m.cpu == g.cpu) {
                Some(m) => m.merge(g),
                None => self.vcpus.push(g.clone()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_and_merges_match_vcpus_by_number() {
        let mut a = WakeTrace::empty(TraceSource::Bpf, [0, 1]);
        a.traced_ns = 100;
        a.latency.poll.record(5_000);
        a.vcpus[1].woken.record(40_000);
        let mut b = a.clone();
        b.traced_ns = 250;
        b.latency.halt.record(60_000);
        b.vcpus[1].woken.record(50_000);
        b.vcpus[0].other.record(4_000_000);
        let d = b.delta_since(&a);
        assert_eq!(d.traced_ns, 150);
        assert_eq!((d.latency.poll.count(), d.latency.halt.count()), (0, 1));
        assert_eq!(d.gaps(1).unwrap().woken.count(), 1);
        assert_eq!(d.gaps(0).unwrap().all().count(), 1);
        let mut m = a.clone();
        m.merge(&d);
        assert_eq!(m, b);
        assert_eq!(b.latency.all().count(), 2);
        assert!(d.gaps(7).is_none());
    }
}
