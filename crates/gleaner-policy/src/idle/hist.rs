//! A log2 histogram of durations: the shape every idle-period and wakeup-latency distribution
//! is kept in, by the in-kernel tracer (`gleaner_os::bpf`), the yielding threads, the
//! simulator and synthetic tests alike.
//!
//! ```text
//!  bucket i holds durations in [2^i, 2^(i+1)) ns (bucket 0: [0, 2) ns); the last bucket
//!  (BUCKETS - 1 = 39, from ~550 s) holds everything longer.
//!  per bucket: count and sum of the durations, so sums below a power of two are exact:
//!     sum_{g < 2^k} g  = sum of sums[0..k]        count_{g >= 2^k} = sum of counts[k..]
//! ```
//!
//! A counter in the kernel only grows; a period's histogram is the difference of two
//! snapshots ([`Log2Hist::delta_since`]).

use serde::{Deserialize, Serialize};

/// Number of buckets.
pub const BUCKETS: usize = 40;

/// The bucket of a duration: `floor(log2(ns))`, 0 for 0 and 1, at most `BUCKETS - 1`.
#[must_use]
pub fn bucket_of(ns: u64) -> usize {
    if ns < 2 {
        return 0;
    }
    (63 - ns.leading_zeros() as usize).min(BUCKETS - 1)
}

/// Lower bound of bucket `i` in ns (`2^i`; 0 for bucket 0).
#[must_use]
pub fn bucket_lo(i: usize) -> u64 {
    if i == 0 {
        0
    } else {
        1u64 << i.min(63)
    }
}

/// Counts and sums of durations per log2 bucket (module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawHist", into = "RawHist")]
pub struct Log2Hist {
    counts: [u64; BUCKETS],
    sums: [u64; BUCKETS],
}

/// The serialized form: sparse, only non-empty buckets (`[bucket, count, sum_ns]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RawHist {
    buckets: Vec<(usize, u64, u64)>,
}

impl TryFrom<RawHist> for Log2Hist {
    type Error = String;
    fn try_from(r: RawHist) -> Result<Self, String> {
        let mut h = Log2Hist::default();
        for (i, c, s) in r.buckets {
            if i >= BUCKETS {
                return Err(format!("histogram bucket {i}: allowed 0..{BUCKETS}"));
            }
            h.counts[i] = h.counts[i].saturating_add(c);
            h.sums[i] = h.sums[i].saturating_add(s);
        }
        Ok(h)
    }
}

impl From<Log2Hist> for RawHist {
    fn from(h: Log2Hist) -> Self {
        RawHist { buckets: (0..BUCKETS).filter(|&i| h.counts[i] != 0 || h.sums[i] != 0).map(|i| (i, h.counts[i], h.sums[i])).collect() }
    }
}

impl Default for Log2Hist {
    fn default() -> Self {
        Self { counts: [0; BUCKETS], sums: [0; BUCKETS] }
    }
}

impl Log2Hist {
    /// A histogram from raw per-bucket counts and sums (a kernel map's contents); missing
    /// buckets are empty, extra ones are folded into the last.
    #[must_use]
    pub fn from_raw(counts: &[u64], sums: &[u64]) -> Self {
        let mut h = Self::default();
        for (i, &c) in counts.iter().enumerate() {
            let j = i.min(BUCKETS - 1);
            h.counts[j] = h.counts[j].saturating_add(c);
        }
        for (i, &s) in sums.iter().enumerate() {
            let j = i.min(BUCKETS - 1);
            h.sums[j] = h.sums[j].saturating_add(s);
        }
        h
    }

    /// Adds one duration.
    pub fn record(&mut self, ns: u64) {
        self.record_n(ns, 1);
    }

    /// Adds `n` durations of `ns` each.
    pub fn record_n(&mut self, ns: u64, n: u64) {
        let i = bucket_of(ns);
        self.counts[i] = self.counts[i].saturating_add(n);
        self.sums[i] = self.sums[i].saturating_add(ns.saturating_mul(n));
    }

    /// Adds every duration of `other`.
    pub fn merge(&mut self, other: &Self) {
        for i in 0..BUCKETS {
            self.counts[i] = self.counts[i].saturating_add(other.counts[i]);
            self.sums[i] = self.sums[i].saturating_add(other.sums[i]);
        }
    }

    /// What was added since `earlier` (a snapshot of the same growing counters); a bucket that
    /// went down (counters reset) counts from zero.
    #[must_use]
    pub fn delta_since(&self, earlier: &Self) -> Self {
        let mut d = Self::default();
        for i in 0..BUCKETS {
            if self.counts[i] >= earlier.counts[i] && self.sums[i] >= earlier.sums[i] {
                d.counts[i] = self.counts[i] - earlier.counts[i];
                d.sums[i] = self.sums[i] - earlier.sums[i];
            } else {
                d.counts[i] = self.counts[i];
                d.sums[i] = self.sums[i];
            }
        }
        d
    }

    /// Every duration scaled by the factor `num / den` in count (an exponential decay of an
    /// average kept across periods: `scaled(1, 2)` halves the weight of the past).
    #[must_use]
    pub fn scaled(&self, num: u64, den: u64) -> Self {
        let den = den.max(1);
        let mut d = Self::default();
        for i in 0..BUCKETS {
            d.counts[i] = mul_div(self.counts[i], num, den);
            d.sums[i] = mul_div(self.sums[i], num, den);
        }
        d
    }

    /// The durations of a stationary stream as they were, from those a window of `window_ns`
    /// saw whole (begun and ended inside it): a duration `g` falls whole inside with
    /// probability `(window - g) / window` (its start anywhere in the stream, uniformly), so
    /// each bucket counts `window / (window - g)` times, `g` its mean, at most `max_weight`
    /// times (a duration near the window's length is seen rarely and would weigh without
    /// bound). Counts are rounded down (a short duration's weight just above 1 adds none),
    /// sums follow them (each bucket keeps its mean).
    #[must_use]
    pub fn seen_whole_in(&self, window_ns: u64, max_weight: f64) -> Self {
        let s = window_ns as f64;
        let mut d = self.clone();
        for i in 0..BUCKETS {
            if self.counts[i] == 0 {
                continue;
            }
            let g = self.bucket_mean_ns(i);
            let w = if g < s { (s / (s - g)).min(max_weight) } else { max_weight }.max(1.0);
            d.counts[i] = crate::num::saturating_u64((self.counts[i] as f64 * w).floor()).max(self.counts[i]);
            d.sums[i] = mul_div(self.sums[i], d.counts[i], self.counts[i]);
        }
        d
    }

    /// Number of durations.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.counts.iter().fold(0u64, |a, &c| a.saturating_add(c))
    }

    /// Sum of the durations, ns.
    #[must_use]
    pub fn sum_ns(&self) -> u64 {
        self.sums.iter().fold(0u64, |a, &c| a.saturating_add(c))
    }

    /// Mean duration, ns (`None` when empty).
    #[must_use]
    pub fn mean_ns(&self) -> Option<f64> {
        let n = self.count();
        (n > 0).then(|| self.sum_ns() as f64 / n as f64)
    }

    /// Count and sum of bucket `i`.
    #[must_use]
    pub fn bucket(&self, i: usize) -> (u64, u64) {
        (self.counts.get(i).copied().unwrap_or(0), self.sums.get(i).copied().unwrap_or(0))
    }

    /// Mean of bucket `i`, or its geometric middle when it is empty or its sum unknown.
    #[must_use]
    pub fn bucket_mean_ns(&self, i: usize) -> f64 {
        let (c, s) = self.bucket(i);
        if c > 0 && s > 0 {
            s as f64 / c as f64
        } else if i == 0 {
            1.0
        } else {
            bucket_lo(i) as f64 * std::f64::consts::SQRT_2
        }
    }

    /// Non-empty buckets as `(bucket, count, sum_ns)`.
    pub fn iter(&self) -> impl Iterator<Item = (usize, u64, u64)> + '_ {
        (0..BUCKETS).filter(|&i| self.counts[i] > 0).map(|i| (i, self.counts[i], self.sums[i]))
    }

    /// The `q` quantile (0..=1), ns, interpolated linearly inside its bucket (`None` when
    /// empty).
    #[must_use]
    pub fn quantile_ns(&self, q: f64) -> Option<f64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let target = (q.clamp(0.0, 1.0) * n as f64).max(1.0);
        let mut seen = 0.0;
        for (i, c, _) in self.iter() {
            let c = c as f64;
            if seen + c >= target {
                let lo = bucket_lo(i) as f64;
                let hi = if i + 1 >= BUCKETS { lo * 2.0 } else { bucket_lo(i + 1) as f64 };
                let frac = ((target - seen) / c).clamp(0.0, 1.0);
                return Some(lo + (hi - lo) * frac);
            }
            seen += c;
        }
        None
    }

    /// Sum over every duration g of `min(g, w)`: the time a window of `w` spends per
    /// duration, exact for `w` a power of two (buckets below `w` count their sums), otherwise
    /// estimated from the bucket's mean.
    #[must_use]
    pub fn sum_min_ns(&self, w: u64) -> f64 {
        let mut total = 0.0;
        for (i, c, _) in self.iter() {
            let lo = bucket_lo(i);
            let hi = if i + 1 >= BUCKETS { u64::MAX } else { bucket_lo(i + 1) };
            let mean = self.bucket_mean_ns(i);
            total += if hi <= w {
                mean * c as f64
            } else if lo >= w {
                w as f64 * c as f64
            } else {
                mean.min(w as f64) * c as f64
            };
        }
        total
    }

    /// Durations of at most `w` (whole buckets below `w`; a bucket `w` cuts counts by its mean).
    #[must_use]
    pub fn count_at_most(&self, w: u64) -> u64 {
        self.iter()
            .filter(|&(i, _, _)| {
                let hi = if i + 1 >= BUCKETS { u64::MAX } else { bucket_lo(i + 1) };
                hi <= w || (bucket_lo(i) < w && self.bucket_mean_ns(i) <= w as f64)
            })
            .map(|(_, c, _)| c)
            .sum()
    }
}

fn mul_div(x: u64, num: u64, den: u64) -> u64 {
    u64::try_from(u128::from(x) * u128::from(num) / u128::from(den)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_floor_log2() {
        assert_eq!([bucket_of(0), bucket_of(1), bucket_of(2), bucket_of(3), bucket_of(4)], [0, 0, 1, 1, 2]);
        assert_eq!(bucket_of(1023), 9);
        assert_eq!(bucket_of(1024), 10);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_lo(10), 1024);
        for ns in [5u64, 100, 65_535, 1 << 20, 3_000_000] {
            let i = bucket_of(ns);
            assert!(bucket_lo(i) <= ns && ns < bucket_lo(i + 1), "{ns} in bucket {i}");
        }
    }

    #[test]
    fn counts_sums_and_means() {
        let mut h = Log2Hist::default();
        for ns in [10_000, 12_000, 300_000] {
            h.record(ns);
        }
        assert_eq!(h.count(), 3);
        assert_eq!(h.sum_ns(), 322_000);
        assert_eq!(h.bucket(bucket_of(10_000)), (2, 22_000));
        assert!((h.mean_ns().unwrap() - 322_000.0 / 3.0).abs() < 1e-6);
        assert_eq!(Log2Hist::default().mean_ns(), None);
    }

    #[test]
    fn sum_min_is_exact_at_powers_of_two() {
        let mut h = Log2Hist::default();
        h.record_n(10_000, 4); // bucket 13 ([8192, 16384))
        h.record_n(1_000_000, 2); // bucket 19
                                  // Window 2^14 = 16384: the short ones whole, the long ones cut.
        assert_eq!(h.sum_min_ns(16_384), 40_000.0 + 2.0 * 16_384.0);
        assert_eq!(h.sum_min_ns(1 << 21), 40_000.0 + 2_000_000.0);
        assert_eq!(h.count_at_most(16_384), 4);
        assert_eq!(h.count_at_most(1 << 21), 6);
        assert_eq!(h.count_at_most(0), 0);
    }

    #[test]
    fn delta_merge_and_scale() {
        let mut a = Log2Hist::default();
        a.record_n(5_000, 10);
        let mut b = a.clone();
        b.record_n(5_000, 3);
        b.record(2_000_000);
        let d = b.delta_since(&a);
        assert_eq!(d.count(), 4);
        assert_eq!(d.sum_ns(), 15_000 + 2_000_000);
        // A reset counter (the tracer restarted) counts from zero.
        assert_eq!(a.delta_since(&b).count(), a.count());
        let mut m = a.clone();
        m.merge(&d);
        assert_eq!(m.count(), 14);
        // Per bucket, rounded down: 13 / 2 and 1 / 2.
        assert_eq!(m.scaled(1, 2).count(), 6);
    }

    /// An exponential stream of idle periods (mean 5 ms) seen through 20 ms windows, each
    /// period kept only if it began and ended inside one (what the tracer's slices see): the
    /// long ones are undercounted (a 10 ms one fits half as often), and reweighting gives back
    /// the stream's own shares where the weight is not capped.
    #[test]
    fn durations_seen_whole_in_windows_are_reweighted_to_the_stream() {
        let (window, mean) = (20_000_000u64, 5_000_000.0);
        let (mut all, mut seen) = (Log2Hist::default(), Log2Hist::default());
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut t = 0u64;
        for _ in 0..400_000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let u = ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            let g = crate::num::saturating_u64(-mean * u.ln());
            // The window `t` falls in; the period is seen if it ends there too.
            if t / window == (t + g) / window {
                seen.record(g);
            }
            all.record(g);
            t += g + 1_000; // a short busy stretch between idle periods
        }
        let fixed = seen.seen_whole_in(window, 4.0);
        let long = |h: &Log2Hist| h.count() - h.count_at_most(1 << 22); // above 4.2 ms
        let share = |h: &Log2Hist, lo: usize, hi: usize| (lo..hi).map(|i| h.bucket(i).0).sum::<u64>() as f64 / h.count() as f64;
        // Seen raw, the long ones are far fewer than in the stream; reweighted, within 5%
        // (up to 8.4 ms, where the weight 20 / (20 - 8.4) = 1.7 is far from its cap).
        assert!((long(&seen) as f64) < 0.8 * long(&all) as f64 * seen.count() as f64 / all.count() as f64);
        for (lo, hi) in [(0, 22), (22, 23)] {
            let (want, got) = (share(&all, lo, hi), share(&fixed, lo, hi));
            assert!((got / want - 1.0).abs() < 0.05, "buckets {lo}..{hi}: {got} against the stream's {want}");
        }
        // Beyond the window nothing was seen, and nothing is made up.
        assert_eq!(fixed.count() - fixed.count_at_most(window), 0);
        assert_eq!(Log2Hist::default().seen_whole_in(window, 4.0), Log2Hist::default());
    }

    #[test]
    fn quantiles_interpolate_inside_buckets() {
        let mut h = Log2Hist::default();
        h.record_n(1_500, 50); // bucket 10: [1024, 2048)
        h.record_n(100_000, 50); // bucket 16: [65536, 131072)
        let p50 = h.quantile_ns(0.5).unwrap();
        assert!((1024.0..=2048.0).contains(&p50), "{p50}");
        let p99 = h.quantile_ns(0.99).unwrap();
        assert!((65_536.0..=131_072.0).contains(&p99), "{p99}");
        assert_eq!(Log2Hist::default().quantile_ns(0.5), None);
    }

    #[test]
    fn serializes_sparse_and_refuses_bad_buckets() {
        let mut h = Log2Hist::default();
        h.record(3_000);
        let j = serde_json::to_string(&h).unwrap();
        assert_eq!(j, r#"{"buckets":[[11,1,3000]]}"#);
        assert_eq!(serde_json::from_str::<Log2Hist>(&j).unwrap(), h);
        let e = serde_json::from_str::<Log2Hist>(r#"{"buckets":[[40,1,1]]}"#).unwrap_err();
        assert!(e.to_string().contains("bucket 40"), "{e}");
    }

    #[test]
    fn from_raw_folds_extra_buckets_into_the_last() {
        let mut counts = vec![0u64; BUCKETS + 2];
        counts[3] = 2;
        counts[BUCKETS + 1] = 5;
        let h = Log2Hist::from_raw(&counts, &[]);
        assert_eq!(h.bucket(3).0, 2);
        assert_eq!(h.bucket(BUCKETS - 1).0, 5);
    }
}
