//! vTRS (section 3.3.1): a sliding window of the last `n` cursors per vCPU; the type is the
//! cursor with the highest average.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::cursors::{cursors, CacheCursors, Cursors, Limits, Source, VcpuCounters};
use super::{VcpuClass, VcpuId};

/// Window averages of the cursors; `None` when no period in the window had that cursor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Averages {
    pub io_int: Option<f64>,
    pub con_spin: Option<f64>,
    pub cache: Option<CacheCursors>,
}

/// The recognizer's verdict on one vCPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Classification {
    pub class: VcpuClass,
    /// Algorithm 1's "trashing" (IOInt+/ConSpin+, LLCO): the LLCO cursor is the highest of the
    /// three cache cursors. False when the cache cursors are unknown.
    pub trashing: bool,
    pub averages: Averages,
    /// Periods in the window.
    pub periods: usize,
    /// Sources missing in at least one period of the window.
    pub missing: Vec<Source>,
}

#[derive(Debug, Clone, Default)]
struct History {
    window: VecDeque<Cursors>,
    missing: VecDeque<Vec<Source>>,
}

/// Per-vCPU sliding windows of cursors (the paper's 5 x n matrix per vCPU).
#[derive(Debug, Clone)]
pub struct TypeRecognizer {
    window: usize,
    limits: Limits,
    hist: BTreeMap<VcpuId, History>,
}

/// The largest of the three cache cursors is at least this (they sum to 100).
const CACHE_MAX_LOWER_BOUND: f64 = 100.0 / 3.0;

impl TypeRecognizer {
    /// `window` periods per decision (the paper's n = 4); at least 1.
    pub fn new(window: usize, limits: Limits) -> Self {
        Self { window: window.max(1), limits, hist: BTreeMap::new() }
    }

    /// The window length.
    pub fn window(&self) -> usize {
        self.window
    }

    /// The thresholds in use.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Records one period of `id` and returns that period's cursors.
    pub fn observe(&mut self, id: VcpuId, counters: &VcpuCounters) -> Cursors {
        let c = cursors(counters, &self.limits);
        let h = self.hist.entry(id).or_default();
        h.window.push_back(c);
        h.missing.push_back(Cursors::missing(counters));
        while h.window.len() > self.window {
            h.window.pop_front();
            h.missing.pop_front();
        }
        c
    }

    /// Drops a vCPU that no longer exists.
    pub fn forget(&mut self, id: &VcpuId) {
        self.hist.remove(id);
    }

    /// Keeps only the vCPUs for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&VcpuId) -> bool) {
        self.hist.retain(|id, _| keep(id));
    }

    /// The vCPUs with history.
    pub fn vcpus(&self) -> impl Iterator<Item = VcpuId> + '_ {
        self.hist.keys().copied()
    }

    /// The verdict for `id` from its window, `None` if it was never observed.
    pub fn classify(&self, id: VcpuId) -> Option<Classification> {
        let h = self.hist.get(&id)?;
        let avg = |f: &dyn Fn(&Cursors) -> Option<f64>| {
            let v: Vec<f64> = h.window.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        let io_int = avg(&|c| c.io_int);
        let con_spin = avg(&|c| c.con_spin);
        let cache = match (
            avg(&|c| c.cache.map(|k| k.lolcf)),
            avg(&|c| c.cache.map(|k| k.llcf)),
            avg(&|c| c.cache.map(|k| k.llco)),
        ) {
            (Some(lolcf), Some(llcf), Some(llco)) => Some(CacheCursors { lolcf, llcf, llco }),
            _ => None,
        };
        let averages = Averages { io_int, con_spin, cache };
        let missing: BTreeSet<Source> = h.missing.iter().flatten().copied().collect();
        Some(Classification {
            class: decide(&averages),
            trashing: cache.is_some_and(|k| k.llco > k.llcf && k.llco > k.lolcf),
            averages,
            periods: h.window.len(),
            missing: missing.into_iter().collect(),
        })
    }
}

/// The highest average cursor wins; ties go to the earlier in the paper's order (IOInt,
/// ConSpin, LLCF, LoLCF, LLCO). Unknown cache cursors count as `CpuBurn` at their lower bound.
fn decide(a: &Averages) -> VcpuClass {
    let mut best: Option<(VcpuClass, f64)> = None;
    let mut consider = |class: VcpuClass, v: Option<f64>| {
        if let Some(v) = v {
            if best.is_none_or(|(_, b)| v > b) {
                best = Some((class, v));
            }
        }
    };
    consider(VcpuClass::IoInt, a.io_int);
    consider(VcpuClass::ConSpin, a.con_spin);
    match a.cache {
        Some(k) => {
            consider(VcpuClass::Llcf, Some(k.llcf));
            consider(VcpuClass::Lolcf, Some(k.lolcf));
            consider(VcpuClass::Llco, Some(k.llco));
        }
        None if a.io_int.is_some() || a.con_spin.is_some() => {
            // Strictly above the bound to be IOInt/ConSpin: a tie means "not shown".
            let top = a.io_int.unwrap_or(0.0).max(a.con_spin.unwrap_or(0.0));
            if top <= CACHE_MAX_LOWER_BOUND {
                return VcpuClass::CpuBurn;
            }
        }
        None => {}
    }
    best.map_or(VcpuClass::Unknown, |(c, _)| c)
}
