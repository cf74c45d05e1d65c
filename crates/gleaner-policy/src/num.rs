//! Float-to-integer conversions with their semantics in the name. Rust's `as` from a float to
//! an unsigned integer saturates (negative and NaN give 0, values above the type's maximum give
//! the maximum) and truncates toward zero; these functions are exactly that conversion, so
//! results do not change where they replace `as`, but the reader sees the intent and clippy's
//! `cast_sign_loss` / `cast_possible_truncation` are answered once, here.

/// `x` truncated toward zero, saturating to `0..=u64::MAX` (NaN gives 0). Round first with
/// `x.round()` where a nearest integer is meant.
#[must_use]
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn saturating_u64(x: f64) -> u64 {
    x as u64
}

/// `x` truncated toward zero, saturating to `0..=u32::MAX` (NaN gives 0).
#[must_use]
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn saturating_u32(x: f64) -> u32 {
    x as u32
}

/// `x` truncated toward zero, saturating to `0..=usize::MAX` (NaN gives 0): an index or count
/// computed in floating point.
#[must_use]
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn saturating_usize(x: f64) -> usize {
    x as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    fn conversions_saturate_and_truncate_like_as() {
        for x in [0.0, 0.4, 0.5, 0.99, 1.0, 2.5, 1e9, -0.0, -1.0, -1e30, 1e30, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(saturating_u64(x), x as u64, "x = {x:?}");
            assert_eq!(saturating_u32(x), x as u32, "x = {x:?}");
            assert_eq!(saturating_usize(x), x as usize, "x = {x:?}");
        }
        assert_eq!(saturating_u64(-3.0), 0);
        assert_eq!(saturating_u64(f64::NAN), 0);
        assert_eq!(saturating_u32(1e12), u32::MAX);
        assert_eq!(saturating_u64(2.9), 2);
    }
}
