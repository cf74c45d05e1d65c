//! Measurement below the front ends: what `gleaner bench`, `gleaner compare`, the agent's
//! calibration and the lab all measure or read, written once.
//!
//! - [`wakeup`]: the blocked-waiter wakeup probe (Table 2 of the Gleaner paper, settings A-D, and E),
//!   used by `gleaner bench wakeup`, `gleaner diagnose` and the agent's retention calibration.
//! - [`measure`]: the system meter (wall/CPU time, context switches, vCPU idle entries and
//!   steal of a run) and [`RunMetrics`], the one record of a measured run (with a
//!   [`LatencySummary`] when the run was a latency kernel's).
//! - [`calibration`]: the agent's calibration record (wake-cost curve, idle threshold, what
//!   it depends on), written by the agent, read by the simulator and the lab.
//! - [`compare`]: the document of `gleaner compare` (runs under each idle policy, CPU with
//!   kernel polling counted) and its summaries, written by the agent, plotted by bench.
//! - [`report`]: the JSON documents of `gleaner bench ... --json` and their provenance, read
//!   back as the same types by `bench overhead` and the lab.
//!
//! It depends on gleaner-os (the readers) and gleaner-policy (statistics) only, so the agent
//! daemon links it without the bench's workloads and plotting.

pub mod calibration;
pub mod compare;
pub mod measure;
pub mod report;
// The calibration record the simulator's tests read too (feature `testutil`, turned on by
// [dev-dependencies] only).
#[cfg(any(test, feature = "testutil"))]
#[doc(hidden)]
pub mod testutil;
pub mod wakeup;

pub use measure::{LatencySummary, RunMetrics};
