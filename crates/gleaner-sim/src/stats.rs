//! Raw per-VM results of a run, the wake-up latency histogram, and rank correlation.

use gleaner_policy::num::saturating_u64;
use serde::Serialize;

use crate::queue::Ns;

const BUCKETS: usize = 10_000;

/// Wake-up latency histogram: 1 us buckets up to 10 ms, plus an overflow count.
#[derive(Debug, Clone)]
pub struct Hist {
    buckets: Vec<u32>,
    overflow: u64,
    count: u64,
    sum_ns: u128,
    max_ns: u64,
}

impl Default for Hist {
    fn default() -> Self {
        Self { buckets: vec![0; BUCKETS], overflow: 0, count: 0, sum_ns: 0, max_ns: 0 }
    }
}

/// Summary of a [`Hist`], in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl Hist {
    pub fn record(&mut self, ns: Ns) {
        let b = (ns / 1000) as usize;
        if b < BUCKETS {
            self.buckets[b] += 1;
        } else {
            self.overflow += 1;
        }
        self.count += 1;
        self.sum_ns += ns as u128;
        self.max_ns = self.max_ns.max(ns);
    }

    /// Quantile as the lower edge of the bucket holding it (1 us resolution, rounded down).
    fn quantile_us(&self, q: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let rank = saturating_u64((q * self.count as f64).ceil()).max(1);
        let mut acc = 0u64;
        for (i, &c) in self.buckets.iter().enumerate() {
            acc += c as u64;
            if acc >= rank {
                return i as f64;
            }
        }
        self.max_ns as f64 / 1000.0
    }

    pub fn summary(&self) -> LatencySummary {
        if self.count == 0 {
            return LatencySummary::default();
        }
        LatencySummary {
            count: self.count,
            mean_us: self.sum_ns as f64 / self.count as f64 / 1000.0,
            p50_us: self.quantile_us(0.5),
            p99_us: self.quantile_us(0.99),
            max_us: self.max_ns as f64 / 1000.0,
        }
    }
}

/// What one VM did in one run.
#[derive(Debug, Clone)]
pub struct VmOutcome {
    pub index: u32,
    pub name: String,
    pub vcpus: u32,
    pub background: bool,
    pub done_at: Option<Ns>,
    pub end_ns: Ns,
    pub run_ns: u64,
    pub overhead_ns: u64,
    pub work_ns: u64,
    pub spin_ns: u64,
    pub yield_ns: u64,
    pub guest_poll_ns: u64,
    pub host_poll_ns: u64,
    pub idle_entries: u64,
    pub exits_hlt: u64,
    pub exits_ipi: u64,
    pub exits_timer: u64,
    pub exits_ple: u64,
    pub exits_io: u64,
    pub halt_poll_attempts: u64,
    pub halt_poll_successes: u64,
    pub llc_refs: f64,
    pub llc_misses: f64,
    pub context_switches: u64,
    pub lat: Hist,
    /// Request latencies (`record` ops; empty when the workload records none).
    pub req: Hist,
    pub gleaner_active_end: Option<u32>,
    pub gleaner_decisions: u64,
    /// The retention governor's record (retention variants that govern).
    pub retention: Option<RetentionOutcome>,
}

/// What the retention governor and the adaptive timeouts did in one VM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RetentionOutcome {
    /// Gleaner periods (governor epochs), and those that ran with retention on.
    pub periods: u64,
    pub on_periods: u64,
    /// Baseline switches and probe epochs of the governor.
    pub switches: u64,
    pub probes: u64,
    /// Mean of the vCPUs' adaptive timeouts at the end.
    pub timeout_ns_mean_end: u64,
    /// Grows and shrinks of the adaptive timeouts, all vCPUs.
    pub timeout_grows: u64,
    pub timeout_shrinks: u64,
}

impl VmOutcome {
    /// Wall time of a finished VM, else the end of the run.
    pub fn wall_ns(&self) -> Ns {
        self.done_at.unwrap_or(self.end_ns)
    }
}

fn ranks(x: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut r = vec![0.0; x.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && x[idx[j + 1]] == x[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for k in i..=j {
            r[idx[k]] = avg;
        }
        i = j + 1;
    }
    r
}

/// Spearman rank correlation (average ranks for ties); `None` for fewer than 3 points or a
/// constant series.
pub fn spearman(x: &[f64], y: &[f64]) -> Option<f64> {
    if x.len() != y.len() || x.len() < 3 {
        return None;
    }
    let (rx, ry) = (ranks(x), ranks(y));
    let n = x.len() as f64;
    let (mx, my) = (rx.iter().sum::<f64>() / n, ry.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for i in 0..x.len() {
        sxy += (rx[i] - mx) * (ry[i] - my);
        sxx += (rx[i] - mx).powi(2);
        syy += (ry[i] - my).powi(2);
    }
    (sxx > 0.0 && syy > 0.0).then(|| sxy / (sxx * syy).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles() {
        let mut h = Hist::default();
        for us in 1..=100u64 {
            h.record(us * 1000 - 1);
        }
        let s = h.summary();
        assert_eq!(s.count, 100);
        assert_eq!(s.p50_us, 49.0);
        assert_eq!(s.p99_us, 98.0);
        h.record(50_000_000);
        assert_eq!(h.summary().max_us, 50_000.0);
    }

    #[test]
    fn spearman_basics() {
        assert_eq!(spearman(&[1.0, 2.0, 3.0, 4.0], &[10.0, 20.0, 30.0, 40.0]), Some(1.0));
        assert_eq!(spearman(&[1.0, 2.0, 3.0, 4.0], &[4.0, 3.0, 2.0, 1.0]), Some(-1.0));
        assert_eq!(spearman(&[1.0, 2.0], &[1.0, 2.0]), None);
        let r = spearman(&[1.0, 2.0, 3.0, 4.0, 5.0], &[2.0, 1.0, 4.0, 3.0, 5.0]).expect("defined");
        assert!((r - 0.8).abs() < 1e-9);
    }
}
