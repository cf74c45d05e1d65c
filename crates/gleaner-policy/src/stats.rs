//! Order statistics used by every benchmark: median, percentiles, mean, min/max.
//!
//! Percentiles use **linear interpolation between closest ranks** (Hyndman & Fan type 7,
//! the default of NumPy and R): for `n` sorted values `x[0..n]` and `p` in `[0, 100]`,
//! `h = (n - 1) * p / 100`, and the result is `x[floor(h)] + (h - floor(h)) * (x[floor(h)+1] - x[floor(h)])`.
//! So `p = 0` is the minimum, `p = 100` the maximum and `p = 50` the usual median (the mean of
//! the two middle values when `n` is even).
//!
//! All functions are pure; empty input gives `None` and NaN values are rejected.
//!
//! [`bootstrap_ci`] gives percentile-bootstrap confidence intervals of any statistic of one or
//! more independent samples (a median, a ratio of two medians, a weighted speedup), resampled
//! with a seeded ChaCha RNG so the same data always gives the same interval.

use serde::{Deserialize, Serialize};

/// Why a statistic could not be computed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StatsError {
    /// There were no values.
    #[error("no values")]
    Empty,
    /// A value was NaN.
    #[error("value {index} is NaN")]
    NaN { index: usize },
    /// The percentile is outside `[0, 100]`.
    #[error("percentile {0} is outside 0..=100")]
    BadPercentile(f64),
}

/// Sort a copy of `values` ascending, rejecting NaN.
pub fn sorted(values: &[f64]) -> Result<Vec<f64>, StatsError> {
    if let Some(index) = values.iter().position(|v| v.is_nan()) {
        return Err(StatsError::NaN { index });
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    Ok(v)
}

/// The `p`-th percentile (`0..=100`) of values already sorted ascending, type-7 interpolation.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> Result<f64, StatsError> {
    if !(0.0..=100.0).contains(&p) {
        return Err(StatsError::BadPercentile(p));
    }
    let n = sorted.len();
    if n == 0 {
        return Err(StatsError::Empty);
    }
    let h = (n - 1) as f64 * p / 100.0;
    let lo = h.floor();
    // lo is in 0..=n-1 because 0 <= h <= n-1.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let i = lo as usize;
    if i + 1 >= n {
        return Ok(sorted[n - 1]);
    }
    Ok(sorted[i] + (h - lo) * (sorted[i + 1] - sorted[i]))
}

/// The `p`-th percentile (`0..=100`) of unsorted values.
pub fn percentile(values: &[f64], p: f64) -> Result<f64, StatsError> {
    percentile_sorted(&sorted(values)?, p)
}

/// The median (the 50th percentile).
pub fn median(values: &[f64]) -> Result<f64, StatsError> {
    percentile(values, 50.0)
}

/// The arithmetic mean.
pub fn mean(values: &[f64]) -> Result<f64, StatsError> {
    if values.is_empty() {
        return Err(StatsError::Empty);
    }
    if let Some(index) = values.iter().position(|v| v.is_nan()) {
        return Err(StatsError::NaN { index });
    }
    Ok(values.iter().sum::<f64>() / values.len() as f64)
}

/// A summary of a sample: count, mean, min, p10, p50, p90, p99, max.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    pub min: f64,
    pub p10: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    /// Summarize `values` (any order).
    pub fn of(values: &[f64]) -> Result<Summary, StatsError> {
        let s = sorted(values)?;
        if s.is_empty() {
            return Err(StatsError::Empty);
        }
        Ok(Summary {
            n: s.len(),
            mean: mean(&s)?,
            min: s[0],
            p10: percentile_sorted(&s, 10.0)?,
            p50: percentile_sorted(&s, 50.0)?,
            p90: percentile_sorted(&s, 90.0)?,
            p99: percentile_sorted(&s, 99.0)?,
            max: s[s.len() - 1],
        })
    }

    /// Relative spread `(p90 - p10) / p50` (0 when the median is 0).
    pub fn relative_spread(&self) -> f64 {
        if self.p50 == 0.0 {
            0.0
        } else {
            (self.p90 - self.p10) / self.p50
        }
    }
}

/// The empirical CDF of a sample: sorted values with cumulative fractions `(i+1)/n`.
pub fn ecdf(values: &[f64]) -> Result<Vec<(f64, f64)>, StatsError> {
    let s = sorted(values)?;
    let n = s.len() as f64;
    Ok(s.into_iter().enumerate().map(|(i, v)| (v, (i + 1) as f64 / n)).collect())
}

/// A confidence interval `[lo, hi]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    pub lo: f64,
    pub hi: f64,
}

impl Interval {
    /// True when `v` lies outside the interval (e.g. a speedup interval excluding 1.0).
    pub fn excludes(&self, v: f64) -> bool {
        v < self.lo || v > self.hi
    }
}

/// Bootstrap resamples used by the reports (enough for a stable 95% percentile interval).
pub const BOOTSTRAP_RESAMPLES: usize = 4000;

/// Percentile bootstrap confidence interval at `level` (e.g. 0.95) of `stat` over independent
/// `samples`: each of `resamples` rounds draws every sample with replacement (same size) and
/// applies `stat`; rounds where `stat` gives `None` or a non-finite value are dropped. The
/// interval is the `(1-level)/2` and `(1+level)/2` percentiles of the statistics. Deterministic
/// for a given `seed`. `Empty` when a sample is empty or no round gave a value.
pub fn bootstrap_ci<T: Clone>(
    samples: &[&[T]],
    level: f64,
    resamples: usize,
    seed: u64,
    stat: impl Fn(&[Vec<T>]) -> Option<f64>,
) -> Result<Interval, StatsError> {
    use rand::{Rng, SeedableRng};
    if !(0.0..1.0).contains(&level) {
        return Err(StatsError::BadPercentile(level * 100.0));
    }
    if samples.is_empty() || samples.iter().any(|s| s.is_empty()) {
        return Err(StatsError::Empty);
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut draw: Vec<Vec<T>> = samples.iter().map(|s| s.to_vec()).collect();
    let mut stats = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        for (d, s) in draw.iter_mut().zip(samples) {
            for slot in d.iter_mut() {
                *slot = s[rng.gen_range(0..s.len())].clone();
            }
        }
        if let Some(v) = stat(&draw).filter(|v| v.is_finite()) {
            stats.push(v);
        }
    }
    let s = sorted(&stats)?;
    let tail = (1.0 - level) / 2.0 * 100.0;
    Ok(Interval { lo: percentile_sorted(&s, tail)?, hi: percentile_sorted(&s, 100.0 - tail)? })
}

/// 95% bootstrap interval of the median of `values`.
pub fn median_ci(values: &[f64], seed: u64) -> Result<Interval, StatsError> {
    bootstrap_ci(&[values], 0.95, BOOTSTRAP_RESAMPLES, seed, |d| median(&d[0]).ok())
}

/// 95% bootstrap interval of `median(base) / median(target)` (a speedup when both are times).
pub fn ratio_of_medians_ci(base: &[f64], target: &[f64], seed: u64) -> Result<Interval, StatsError> {
    bootstrap_ci(&[base, target], 0.95, BOOTSTRAP_RESAMPLES, seed, |d| {
        let t = median(&d[1]).ok()?;
        (t > 0.0).then(|| median(&d[0]).ok().map(|b| b / t)).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_is_deterministic_and_covers_the_estimate() {
        let a: Vec<f64> = (0..9).map(|i| 10.0 + f64::from(i)).collect();
        let ci = median_ci(&a, 7).unwrap();
        assert_eq!(ci, median_ci(&a, 7).unwrap());
        assert!(ci.lo <= 14.0 && 14.0 <= ci.hi, "{ci:?}");
        assert!(ci.lo >= 10.0 && ci.hi <= 18.0);
        // A constant sample has a zero-width interval.
        let c = median_ci(&[3.0; 5], 1).unwrap();
        assert_eq!((c.lo, c.hi), (3.0, 3.0));
    }

    #[test]
    fn ratio_interval_excludes_one_only_for_a_clear_difference() {
        let slow = [2.0, 2.1, 1.9, 2.05, 1.95, 2.02, 1.98];
        let fast = [1.0, 1.05, 0.95, 1.02, 0.98, 1.01, 0.99];
        let ci = ratio_of_medians_ci(&slow, &fast, 3).unwrap();
        assert!(ci.excludes(1.0) && ci.lo > 1.8 && ci.hi < 2.2, "{ci:?}");
        let noisy_a = [1.0, 2.0, 1.5, 0.8, 1.9];
        let noisy_b = [1.1, 1.8, 1.4, 0.9, 2.1];
        assert!(!ratio_of_medians_ci(&noisy_a, &noisy_b, 3).unwrap().excludes(1.0));
    }

    #[test]
    fn bootstrap_rejects_empty_samples_and_bad_levels() {
        assert_eq!(median_ci(&[], 1), Err(StatsError::Empty));
        assert!(bootstrap_ci(&[&[1.0][..]], 1.5, 10, 1, |d| median(&d[0]).ok()).is_err());
        // A statistic that never has a value gives no interval.
        assert_eq!(bootstrap_ci(&[&[1.0][..]], 0.95, 10, 1, |_| None), Err(StatsError::Empty));
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn median_odd_and_even() {
        assert_eq!(median(&[3.0, 1.0, 2.0]).unwrap(), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]).unwrap(), 2.5);
        assert_eq!(median(&[7.0]).unwrap(), 7.0);
    }

    #[test]
    fn percentile_type7_matches_hand_computed() {
        // 1..=10: h = 9 * 0.9 = 8.1 -> x[8] + 0.1 * (x[9]-x[8]) = 9 + 0.1 = 9.1
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert!(close(percentile(&v, 90.0).unwrap(), 9.1));
        // h = 9 * 0.1 = 0.9 -> 1 + 0.9 = 1.9
        assert!(close(percentile(&v, 10.0).unwrap(), 1.9));
        // h = 9 * 0.99 = 8.91 -> 9.91
        assert!(close(percentile(&v, 99.0).unwrap(), 9.91));
        assert_eq!(percentile(&v, 0.0).unwrap(), 1.0);
        assert_eq!(percentile(&v, 100.0).unwrap(), 10.0);
    }

    #[test]
    fn empty_nan_and_bad_percentile_are_errors() {
        assert_eq!(median(&[]), Err(StatsError::Empty));
        assert_eq!(mean(&[]), Err(StatsError::Empty));
        assert_eq!(median(&[1.0, f64::NAN]), Err(StatsError::NaN { index: 1 }));
        assert_eq!(percentile(&[1.0], 101.0), Err(StatsError::BadPercentile(101.0)));
        assert_eq!(percentile(&[1.0], -1.0), Err(StatsError::BadPercentile(-1.0)));
        assert!(Summary::of(&[]).is_err());
    }

    #[test]
    fn summary_of_sample() {
        let s = Summary::of(&[5.0, 1.0, 3.0, 2.0, 4.0]).unwrap();
        assert_eq!(s.n, 5);
        assert!(close(s.mean, 3.0));
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 5.0);
        assert_eq!(s.p50, 3.0);
        // h = 4 * 0.1 = 0.4 -> 1.4 ; h = 4 * 0.9 = 3.6 -> 4.6
        assert!(close(s.p10, 1.4));
        assert!(close(s.p90, 4.6));
        assert!(close(s.relative_spread(), (4.6 - 1.4) / 3.0));
    }

    #[test]
    fn ecdf_is_monotone_and_ends_at_one() {
        let c = ecdf(&[3.0, 1.0, 2.0, 2.0]).unwrap();
        assert_eq!(c.first().unwrap(), &(1.0, 0.25));
        assert_eq!(c.last().unwrap(), &(3.0, 1.0));
        assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
    }
}
