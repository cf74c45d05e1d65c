//! The idle policy: what an idle vCPU of a guest does while its workload waits, and for how
//! long, so that waking a blocked thread on it is cheap (the blocked-waiter wakeup problem).
//!
//! - [`hist`]: log2 histograms of durations (idle periods, wakeup latencies).
//! - [`curve`]: the machine's wake-cost curve: halted after a gap g, kept busy, polling.
//! - [`trace`]: what the scheduler tracer reports: wakeup latency by the target vCPU's state,
//!   idle periods by how they ended.
//! - [`plan`]: per vCPU, the mechanism (kernel polling, yielders, nothing) and its window.

pub mod curve;
pub mod hist;
pub mod plan;
pub mod trace;

pub use curve::{CurvePoint, GapSaving, WakeCurve};
pub use hist::Log2Hist;
pub use plan::{IdlePlan, Means, Mechanism, PlanConfig, VcpuPlan};
pub use trace::{LatencySummary, TargetState, TraceSource, VcpuGaps, WakeLatency, WakeSummary, WakeTrace};
