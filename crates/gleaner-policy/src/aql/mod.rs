//! AQL_Sched (aql-sched.txt): vCPU type recognition (vTRS, section 3.3) and two-level
//! clustering of vCPUs into pCPU pools with per-type quanta (section 3.5). Pure: no OS access.
//! The host agent (`gleaner host`) and the simulator call exactly this code.
//!
//! ```text
//!  every period (30 ms), per vCPU          window of n=4 periods            every period
//!  VcpuCounters --cursors(eq. 1-5)--> Cursors --TypeRecognizer--> Classification --plan()--> Plan
//!   io_events     (None = missing)     IOInt    (sliding averages,   class = highest    algorithm 1:
//!   spin_events                        ConSpin   per-cursor count)   average cursor     sockets
//!   llc_refs                           LoLCF                         trashing = LLCO    algorithm 2:
//!   llc_misses                         LLCF                          highest of the     pools+quanta
//!   instructions                       LLCO                          cache cursors
//!                                                          Plan::diff(&old) -> PlanDiff (what to change)
//! ```
//!
//! # Using it (host agent or simulator)
//!
//! ```
//! use gleaner_policy::aql::*;
//! let mut rec = TypeRecognizer::new(4, Limits::default());
//! let id = VcpuId { vm: 1, vcpu: 0 };
//! // one call per vCPU per period; a `None` field means "this source does not exist here"
//! let c = VcpuCounters { period_ns: 30_000_000, io_events: Some(900), ..Default::default() };
//! rec.observe(id, &c);
//! let cls = rec.classify(id).unwrap();
//! assert_eq!(cls.class, VcpuClass::IoInt);
//! let topo = Topology::uniform(1, 2);                 // 1 socket of pCPUs 0-1
//! let plan = plan(&[VcpuInfo::from_classification(id, &cls)], &topo, &Quanta::paper());
//! assert_eq!(plan.pools.len(), 1);
//! assert_eq!(plan.pools[0].quantum_ns, 1_000_000);   // IOInt runs with a 1 ms quantum
//! let changes = plan.diff(&Plan::default());           // what to apply compared to nothing
//! assert_eq!(changes.pools_added.len(), 1);
//! ```
//!
//! `TypeRecognizer::with_hysteresis(points)` (not in the paper, off by default) keeps a vCPU's
//! class until another cursor beats it by more than `points`: the host agent uses it so that a
//! vCPU near a boundary does not migrate between pools every window.
//!
//! # Missing sources
//!
//! A counter that cannot be read on a host (no hardware LLC counters, no KVM statistics for a
//! TCG guest) is `None`; the cursor it feeds is `None` and is reported in
//! [`Classification::missing`]. The type is chosen among the cursors that exist. When the
//! three cache cursors are unknown (no LLC counters), their sum is still 100 (equation 2), so
//! their largest value is at least 100/3: the vCPU is typed IOInt or ConSpin only if that
//! cursor beats 100/3, otherwise it is [`VcpuClass::CpuBurn`] (a CPU-burn vCPU whose cache
//! sub-type is unknown; it runs with the default quantum). With no cursor at all it is
//! [`VcpuClass::Unknown`]. No value is ever made up.

mod cluster;
mod controller;
mod cursors;
mod diff;
mod recognizer;

#[cfg(test)]
mod tests;

pub use cluster::{plan, Plan, Pool, PoolKind, Quanta, QuantaError, Topology, VcpuAssignment, VcpuInfo, VmShare};
pub use controller::{normalise_spin, spin_events_per_period, AqlController, ControllerConfig, Decision, Reading};
pub use cursors::{cursors, CacheCursors, Cursors, Limits, Source, VcpuCounters};
pub use diff::{PlanDiff, PoolChange, VcpuMove};
pub use recognizer::{Averages, Classification, TypeRecognizer};

use serde::{Deserialize, Serialize};

/// A vCPU: the VM it belongs to (the host uses the VMM's pid; the simulator its VM index)
/// and its index in that VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct VcpuId {
    pub vm: u64,
    pub vcpu: u32,
}

impl std::fmt::Display for VcpuId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "vm{}/vcpu{}", self.vm, self.vcpu)
    }
}

/// The five application types of section 3.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum VcpuType {
    /// I/O intensive (latency critical).
    #[serde(rename = "IOInt")]
    IoInt,
    /// Concurrent, synchronizing with spin-locks.
    #[serde(rename = "ConSpin")]
    ConSpin,
    /// Working set fits in the last-level cache: sensitive to LLC pollution.
    #[serde(rename = "LLCF")]
    Llcf,
    /// Working set fits in the low-level caches: quantum agnostic.
    #[serde(rename = "LoLCF")]
    Lolcf,
    /// Working set overflows the LLC (thrashing): quantum agnostic, disturbs LLCF.
    #[serde(rename = "LLCO")]
    Llco,
}

impl VcpuType {
    /// All five, in the paper's order.
    pub const ALL: [VcpuType; 5] = [VcpuType::IoInt, VcpuType::ConSpin, VcpuType::Llcf, VcpuType::Lolcf, VcpuType::Llco];

    /// The paper's name (`IOInt`, `ConSpin`, `LLCF`, `LoLCF`, `LLCO`).
    pub fn name(self) -> &'static str {
        match self {
            VcpuType::IoInt => "IOInt",
            VcpuType::ConSpin => "ConSpin",
            VcpuType::Llcf => "LLCF",
            VcpuType::Lolcf => "LoLCF",
            VcpuType::Llco => "LLCO",
        }
    }
}

impl std::fmt::Display for VcpuType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What the recognizer could conclude about a vCPU: one of the five types, or less when
/// sources are missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum VcpuClass {
    #[serde(rename = "IOInt")]
    IoInt,
    #[serde(rename = "ConSpin")]
    ConSpin,
    #[serde(rename = "LLCF")]
    Llcf,
    #[serde(rename = "LoLCF")]
    Lolcf,
    #[serde(rename = "LLCO")]
    Llco,
    /// Neither IOInt nor ConSpin by the available cursors, cache sub-type unknown
    /// (no LLC counters): default quantum.
    CpuBurn,
    /// No cursor available (no source, or no period observed yet): default quantum.
    Unknown,
}

impl VcpuClass {
    /// The type, when the class is one of the paper's five.
    pub fn vcpu_type(self) -> Option<VcpuType> {
        match self {
            VcpuClass::IoInt => Some(VcpuType::IoInt),
            VcpuClass::ConSpin => Some(VcpuType::ConSpin),
            VcpuClass::Llcf => Some(VcpuType::Llcf),
            VcpuClass::Lolcf => Some(VcpuType::Lolcf),
            VcpuClass::Llco => Some(VcpuType::Llco),
            VcpuClass::CpuBurn | VcpuClass::Unknown => None,
        }
    }

    /// Name as printed (`IOInt`, ..., `CpuBurn`, `Unknown`).
    pub fn name(self) -> &'static str {
        match self.vcpu_type() {
            Some(t) => t.name(),
            None if self == VcpuClass::CpuBurn => "CpuBurn",
            None => "Unknown",
        }
    }
}

impl From<VcpuType> for VcpuClass {
    fn from(t: VcpuType) -> Self {
        match t {
            VcpuType::IoInt => VcpuClass::IoInt,
            VcpuType::ConSpin => VcpuClass::ConSpin,
            VcpuType::Llcf => VcpuClass::Llcf,
            VcpuType::Lolcf => VcpuClass::Lolcf,
            VcpuType::Llco => VcpuClass::Llco,
        }
    }
}

impl std::fmt::Display for VcpuClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
