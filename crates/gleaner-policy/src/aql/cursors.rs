//! Equations 1 to 5: per-period counters to the five type cursors (percentages).

use serde::{Deserialize, Serialize};

/// What the monitor read for one vCPU over one period. `None` = the source does not exist on
/// this host (not "zero"): e.g. no hardware LLC counters, no KVM statistics for a TCG guest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuCounters {
    /// Length of the period the counts cover.
    pub period_ns: u64,
    /// I/O requests handled by the vCPU (`IOInt_level`).
    pub io_events: Option<u64>,
    /// Spin events: pause-loop exits or equivalent (`ConSpin_level`).
    pub spin_events: Option<u64>,
    /// LLC references.
    pub llc_refs: Option<u64>,
    /// LLC misses.
    pub llc_misses: Option<u64>,
    /// Instructions retired (normalizes the LLC counts).
    pub instructions: Option<u64>,
    /// CPU time the vCPU ran in the period (informational; not a cursor input).
    pub run_ns: Option<u64>,
}

/// A metric source a cursor needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    IoEvents,
    SpinEvents,
    LlcRefs,
    LlcMisses,
    Instructions,
}

/// The thresholds of equations 1, 3 and 4. The paper does not publish its values: these
/// defaults are ours (documented in docs/host.md) and are meant to be tuned per host.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// `IOInt_LIMIT` as a rate: I/O events per second at and above which a vCPU is 100% IOInt.
    pub io_int_per_s: f64,
    /// `ConSpin_LIMIT` as a rate: spin events per second for 100% ConSpin.
    pub con_spin_per_s: f64,
    /// `LLC_RR_LIMIT`: LLC references per 1000 instructions a LoLCF vCPU stays below.
    pub llc_rr_per_kinstr: f64,
    /// `LLC_MR_LIMIT`: LLC misses per 1000 instructions a LLCF vCPU stays below.
    pub llc_mr_per_kinstr: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Self { io_int_per_s: 10_000.0, con_spin_per_s: 5_000.0, llc_rr_per_kinstr: 10.0, llc_mr_per_kinstr: 3.0 }
    }
}

/// The three CPU-burn cursors; they sum to 100 (equation 2).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheCursors {
    pub lolcf: f64,
    pub llcf: f64,
    pub llco: f64,
}

/// The five cursors of one period (percent, 0..=100); `None` when a source is missing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Cursors {
    pub io_int: Option<f64>,
    pub con_spin: Option<f64>,
    pub cache: Option<CacheCursors>,
}

impl Cursors {
    /// The sources these cursors lacked.
    pub fn missing(c: &VcpuCounters) -> Vec<Source> {
        let mut m = Vec::new();
        if c.io_events.is_none() {
            m.push(Source::IoEvents);
        }
        if c.spin_events.is_none() {
            m.push(Source::SpinEvents);
        }
        if c.llc_refs.is_none() {
            m.push(Source::LlcRefs);
        }
        if c.llc_misses.is_none() {
            m.push(Source::LlcMisses);
        }
        if c.instructions.is_none() {
            m.push(Source::Instructions);
        }
        m
    }
}

/// Equation 1: `level*100/LIMIT` below the limit, 100 at or above it.
fn saturating_cursor(level: f64, limit: f64) -> f64 {
    if level < limit {
        level * 100.0 / limit
    } else {
        100.0
    }
}

/// Computes the cursors of one period (equations 1 to 5). Levels are rates (events per second
/// for IOInt/ConSpin, events per 1000 instructions for the LLC ratios) so the period length
/// does not change the thresholds. A zero-length period gives no cursor.
pub fn cursors(c: &VcpuCounters, limits: &Limits) -> Cursors {
    let secs = c.period_ns as f64 / 1e9;
    let rate = |v: Option<u64>| if secs > 0.0 { v.map(|n| n as f64 / secs) } else { None };
    let io_int = rate(c.io_events).map(|l| saturating_cursor(l, limits.io_int_per_s));
    let con_spin = rate(c.spin_events).map(|l| saturating_cursor(l, limits.con_spin_per_s));
    let cache = match (c.llc_refs, c.llc_misses, c.instructions) {
        (Some(refs), Some(misses), Some(instr)) if instr > 0 => {
            let rr = refs as f64 * 1000.0 / instr as f64;
            let mr = misses as f64 * 1000.0 / instr as f64;
            // Equation 3.
            let lolcf =
                if rr < limits.llc_rr_per_kinstr { (limits.llc_rr_per_kinstr - rr) * 100.0 / limits.llc_rr_per_kinstr } else { 0.0 };
            // Equation 4.
            let llcf = if mr < limits.llc_mr_per_kinstr {
                (100.0 - lolcf).min((limits.llc_mr_per_kinstr - mr) * 100.0 / limits.llc_mr_per_kinstr)
            } else {
                0.0
            };
            // Equation 5.
            let llco = 100.0 - lolcf - llcf;
            Some(CacheCursors { lolcf, llcf, llco })
        }
        _ => None,
    };
    Cursors { io_int, con_spin, cache }
}
