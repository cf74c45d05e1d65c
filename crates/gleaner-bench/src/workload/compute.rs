//! Checked compute: a 64-bit LCG iterated `n` times is the unit of work.
//!
//! The workers run the loop: real CPU work proportional to `n` that cannot be skipped, since
//! each step depends on the previous one (the optimizer does fold a few steps into one
//! multiply-add after unrolling: about 6 steps per ns on the development VM, which is why
//! work is expressed in calibrated microseconds, not steps). The checker computes the same
//! value in `O(log n)` with the LCG jump-ahead, so every item's result is verified without
//! redoing the work.

use std::sync::OnceLock;
use std::time::Instant;

const A: u64 = 6364136223846793005;
const C: u64 = 1442695040888963407;

/// Iterate the LCG `n` times from `x` (the work).
#[inline(never)]
pub fn spin(mut x: u64, n: u64) -> u64 {
    let n = std::hint::black_box(n);
    for _ in 0..n {
        x = x.wrapping_mul(A).wrapping_add(C);
    }
    std::hint::black_box(x)
}

/// The value `spin(x, n)` returns, computed in `O(log n)` (Brown's jump-ahead).
pub fn jump(x: u64, mut n: u64) -> u64 {
    let (mut acc_mul, mut acc_add) = (1u64, 0u64);
    let (mut cur_mul, mut cur_add) = (A, C);
    while n > 0 {
        if n & 1 == 1 {
            acc_mul = acc_mul.wrapping_mul(cur_mul);
            acc_add = acc_add.wrapping_mul(cur_mul).wrapping_add(cur_add);
        }
        cur_add = cur_mul.wrapping_add(1).wrapping_mul(cur_add);
        cur_mul = cur_mul.wrapping_mul(cur_mul);
        n >>= 1;
    }
    acc_mul.wrapping_mul(x).wrapping_add(acc_add)
}

/// A well-mixed seed for item `i` of stream `s` (splitmix64).
pub fn seed(s: u64, i: u64) -> u64 {
    let mut z = s.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(i).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// LCG iterations per microsecond on this CPU: the fastest of five ~1 ms trials (the least
/// disturbed one), measured once per process.
pub fn iters_per_us() -> f64 {
    static RATE: OnceLock<f64> = OnceLock::new();
    *RATE.get_or_init(|| best_iters_per_us(5))
}

/// LCG iterations per microsecond: the fastest of `trials` trials of 2^20 iterations (about
/// 1 ms natively, 15 ms under QEMU TCG), measured now.
pub fn best_iters_per_us(trials: u32) -> f64 {
    let n = 1u64 << 20;
    let mut best = f64::MAX;
    for i in 0..trials.max(1) {
        let t = Instant::now();
        spin(u64::from(i), n);
        best = best.min(t.elapsed().as_secs_f64());
    }
    n as f64 / (best.max(1e-9) * 1e6)
}

/// Iterations for `work_us` microseconds of compute at `rate` iterations per microsecond.
pub fn iters_for(work_us: f64, rate: f64) -> u64 {
    // work_us and rate are validated finite and >= 0; the product fits u64 for sane inputs.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let n = (work_us * rate).round() as u64;
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jump_matches_loop() {
        for n in [0u64, 1, 2, 3, 7, 1000, 12345] {
            for x in [0u64, 1, 42, u64::MAX] {
                assert_eq!(jump(x, n), spin(x, n), "x={x} n={n}");
            }
        }
    }

    #[test]
    fn rate_is_plausible() {
        let r = iters_per_us();
        assert!(r > 10.0 && r < 100_000.0, "{r} iterations per us");
    }
}
