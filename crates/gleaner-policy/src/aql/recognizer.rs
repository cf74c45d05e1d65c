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
    /// The class given at the last [`TypeRecognizer::observe`] (for hysteresis).
    class: Option<VcpuClass>,
}

/// Per-vCPU sliding windows of cursors (the paper's 5 x n matrix per vCPU).
#[derive(Debug, Clone)]
pub struct TypeRecognizer {
    window: usize,
    limits: Limits,
    margin: f64,
    hist: BTreeMap<VcpuId, History>,
}

/// Window averages of each cursor over the periods that had it.
fn averages(h: &History) -> Averages {
    let avg = |f: &dyn Fn(&Cursors) -> Option<f64>| {
        let v: Vec<f64> = h.window.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let cache = match (avg(&|c| c.cache.map(|k| k.lolcf)), avg(&|c| c.cache.map(|k| k.llcf)), avg(&|c| c.cache.map(|k| k.llco))) {
        (Some(lolcf), Some(llcf), Some(llco)) => Some(CacheCursors { lolcf, llcf, llco }),
        _ => None,
    };
    Averages { io_int: avg(&|c| c.io_int), con_spin: avg(&|c| c.con_spin), cache }
}

/// The largest of the three cache cursors is at least this (they sum to 100).
const CACHE_MAX_LOWER_BOUND: f64 = 100.0 / 3.0;

impl TypeRecognizer {
    /// `window` periods per decision (the paper's n = 4); at least 1.
    pub fn new(window: usize, limits: Limits) -> Self {
        Self { window: window.max(1), limits, margin: 0.0, hist: BTreeMap::new() }
    }

    /// Hysteresis (not in the paper; default 0 = the paper's rule): a vCPU keeps its class
    /// until another cursor average beats its own by more than `points`.
    pub fn with_hysteresis(mut self, points: f64) -> Self {
        self.margin = points.max(0.0);
        self
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
        let a = averages(h);
        h.class = Some(decide(&a, h.class, self.margin));
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
        let averages = averages(h);
        let cache = averages.cache;
        let missing: BTreeSet<Source> = h.missing.iter().flatten().copied().collect();
        Some(Classification {
            class: h.class.unwrap_or(VcpuClass::Unknown),
            trashing: cache.is_some_and(|k| k.llco > k.llcf && k.llco > k.lolcf),
            averages,
            periods: h.window.len(),
            missing: missing.into_iter().collect(),
        })
    }
}

/// The candidate classes and their window averages, in tie-break order: the paper's order
/// (IOInt, ConSpin, LLCF, LoLCF, LLCO); when the cache cursors are unknown, `CpuBurn` at their
/// lower bound 100/3 comes first (a tie means "not shown to be IOInt/ConSpin").
fn candidates(a: &Averages) -> Vec<(VcpuClass, f64)> {
    let mut c = Vec::new();
    if a.cache.is_none() && (a.io_int.is_some() || a.con_spin.is_some()) {
        c.push((VcpuClass::CpuBurn, CACHE_MAX_LOWER_BOUND));
    }
    if let Some(v) = a.io_int {
        c.push((VcpuClass::IoInt, v));
    }
    if let Some(v) = a.con_spin {
        c.push((VcpuClass::ConSpin, v));
    }
    if let Some(k) = a.cache {
        c.extend([(VcpuClass::Llcf, k.llcf), (VcpuClass::Lolcf, k.lolcf), (VcpuClass::Llco, k.llco)]);
    }
    c
}

/// The highest average cursor wins (first in [`candidates`] order on ties). With a previous
/// class and a `margin` > 0, the previous class is kept unless the winner beats it by more
/// than `margin` points (hysteresis).
fn decide(a: &Averages, previous: Option<VcpuClass>, margin: f64) -> VcpuClass {
    let c = candidates(a);
    let Some(&(best, top)) = c.iter().fold(None, |acc: Option<&(VcpuClass, f64)>, x| match acc {
        Some(b) if x.1 <= b.1 => Some(b),
        _ => Some(x),
    }) else {
        return VcpuClass::Unknown;
    };
    if let Some(prev) = previous.filter(|_| margin > 0.0) {
        if let Some(&(_, pv)) = c.iter().find(|x| x.0 == prev) {
            if top <= pv + margin {
                return prev;
            }
        }
    }
    best
}
