//! Float to fixed-point conversion for in-network aggregation: switches sum i32, so end
//! hosts convert gradients before sending and convert the sums back. The functions here are
//! pure; [`crate::Quantized`] applies them in front of an INA protocol, in both drivers.
//!
//! Two schemes:
//!
//! - **ATP's fixed scale** ([`to_fixed`], [`from_fixed`]): every value is multiplied by one
//!   constant scale, [`ATP_SCALE`] = 1e8 by default, and rounded to the nearest integer.
//!   Values whose scaled magnitude exceeds `i32::MAX` saturate (and are counted). The error
//!   of a sum of `n` converted values is at most `n / (2 scale)` plus the f32 rounding of the
//!   result, *as long as the i32 sum does not overflow*: with scale 1e8 a sum must stay
//!   below 21.47 in magnitude, which heavy-tailed gradients can exceed (the switches then
//!   saturate stickily, `inalab_core::rail`: ATP falls back to floats, the schemes without a
//!   fallback fail the call on every worker). [`to_fixed_railed`] is their conversion.
//! - **SwitchML's per-block exponent** ([`block_exponent`], [`switchml_scale`],
//!   [`switchml_to_fixed`]): for one block (one packet's values) the workers agree on
//!   `e_max`, the largest frexp exponent of the block's values over all workers (each worker
//!   sends the exponent of its *next* block in the header of the current one and the switch
//!   keeps the maximum, so the agreed value is known one window ahead; inalab's
//!   [`crate::Quantized`] takes the whole tensor as the block and agrees on its exponent in
//!   one extra allreduce before the data). The block's scale is
//!   `i32::MAX / (n 2^e_max)`: every `|v| < 2^e_max` converts to less than `i32::MAX / n` in
//!   magnitude, so the sum of `n` converted values cannot overflow. Conversion also clamps
//!   to `floor(i32::MAX / n)` (counted as saturation), so the guarantee holds even for a
//!   value above the agreed exponent. Each converted value is within `1 / scale =
//!   n 2^e_max / i32::MAX` of its input (half of that from rounding, the rest only when the
//!   clamp applies), so the sum of `n` is within `n / scale = n^2 2^e_max / i32::MAX` of the
//!   exact sum (plus the f32 rounding of the result): the precision falls with `n` twice,
//!   once through the scale and once through the number of rounded terms.
//!
//! NaN and infinities are never converted: both `to_fixed` functions fail with the index of
//! the first one. [`block_exponent`] ignores them (the conversion reports them).
//!
//! All functions are pure and deterministic. Rounding is to nearest, ties away from zero.

use inalab_core::rail::{is_rail, NEG_RAIL, RAIL};
use std::fmt;

/// ATP's default fixed-point scale (values are multiplied by 10^8).
pub const ATP_SCALE: f64 = 1e8;

/// Why a conversion failed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum QuantError {
    /// `values[index]` is NaN or infinite.
    NonFinite { index: usize, value: f32 },
    /// The scale is not a finite positive number.
    BadScale { scale: f64 },
    /// SwitchML's scale needs at least one worker.
    NoWorkers,
}

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuantError::NonFinite { index, value } => {
                write!(f, "value {index} is {value}, which has no fixed-point form")
            }
            QuantError::BadScale { scale } => write!(f, "fixed-point scale {scale} must be finite and positive"),
            QuantError::NoWorkers => write!(f, "SwitchML's scale needs at least one worker"),
        }
    }
}

impl std::error::Error for QuantError {}

/// Converted values and how many of them saturated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fixed {
    pub values: Vec<i32>,
    /// Values whose scaled magnitude did not fit and were clamped.
    pub saturated: usize,
}

inalab_core::avx2_dispatch! {
    /// The largest biased exponent field of `values` (0xFF: a NaN or an infinity is among them;
    /// 0: all are zeros or subnormals), in one branch-free pass the compiler vectorizes.
    fn max_exponent_field(values: &[f32]) -> u32 {
        values.iter().fold(0, |m, v| m.max(v.to_bits() & 0x7F80_0000)) >> 23
    }
}

/// `x.round().clamp(-c, c) as i32` (ties away from zero) for any `x` but NaN and an integral
/// `c <= i32::MAX`, without the libm call and branches that keep the loop scalar: clamped
/// first (an integral bound rounds to itself), truncated, then the exact fraction `x - t`
/// rounds it away from zero at a half.
#[inline(always)]
fn round_clamped(x: f64, c: f64) -> i32 {
    let x = x.max(-c).min(c);
    // SAFETY: `x` is not NaN (a finite value times a finite positive scale; an infinite
    // product is clamped) and lies in [-c, c] within i32's range, where truncation is defined.
    // The checked `as` cast's saturation fix-ups kept the loop at half this speed.
    let t = unsafe { x.to_int_unchecked::<i32>() };
    let frac = x - t as f64;
    t + (frac >= 0.5) as i32 - (frac <= -0.5) as i32
}

/// Converts with `scale`; scaled magnitudes at or above `threshold` count as saturated and
/// results are clamped to `[-clamp, clamp]`. One pass checks for NaN and infinities, one
/// converts (both vectorized: this is a worker's main CPU cost per tensor in the runtime).
fn convert(values: &[f32], scale: f64, threshold: f64, clamp: i32) -> Result<Fixed, QuantError> {
    if !(scale.is_finite() && scale > 0.0) {
        return Err(QuantError::BadScale { scale });
    }
    if max_exponent_field(values) == 0xFF {
        let index = values.iter().position(|v| !v.is_finite()).expect("a NaN or infinity is there");
        return Err(QuantError::NonFinite { index, value: values[index] });
    }
    let mut out = vec![0i32; values.len()];
    let saturated = convert_into(values, &mut out, scale, threshold, clamp as f64);
    Ok(Fixed { values: out, saturated })
}

inalab_core::avx2_dispatch! {
    /// The conversion loop of [`convert`]; returns how many saturated.
    fn convert_into(values: &[f32], out: &mut [i32], scale: f64, threshold: f64, c: f64) -> usize {
        let mut saturated = 0usize;
        for (o, &value) in out.iter_mut().zip(values) {
            let x = value as f64 * scale;
            saturated += (x.abs() >= threshold) as usize;
            *o = round_clamped(x, c);
        }
        saturated
    }
}

/// ATP's conversion: `round(v * scale)` (scale 1e8 = [`ATP_SCALE`] by default), saturating
/// at `±i32::MAX`. Fails on a non-positive or non-finite scale and on the first NaN/Inf.
pub fn to_fixed(values: &[f32], scale: f64) -> Result<Fixed, QuantError> {
    convert(values, scale, i32::MAX as f64 + 0.5, i32::MAX)
}

inalab_core::avx2_dispatch! {
    /// The loop of [`to_fixed_railed`]: `round(v x scale)` into `out`, a rail where that is
    /// not strictly inside the range; returns how many values went out as rails.
    fn railed_into(values: &[f32], out: &mut [i32], scale: f64) -> usize {
        let c = i32::MAX as f64;
        let mut railed = 0usize;
        for (o, &value) in out.iter_mut().zip(values) {
            let x = value as f64 * scale;
            // NaN goes to the upper rail; infinities clamp to an end like any large value.
            let q = round_clamped(if x.is_nan() { c } else { x }, c);
            // An end of the range is a rail (`-i32::MAX` becomes `i32::MIN`), so the value
            // cannot come back as a number: `inalab_core::rail`.
            let r = if q == i32::MAX { RAIL } else if q == -i32::MAX { NEG_RAIL } else { q };
            railed += is_rail(r) as usize;
            *o = r;
        }
        railed
    }
}

/// Fixed point for a protocol without an overflow fallback (`inalab_core::rail`): each value
/// as `round(v x scale)`, and a value with no place strictly inside the range (NaN, an
/// infinity, or `|round(v x scale)| >= i32::MAX`, i.e. `|v| >= (2^31 - 1.5) / scale`) as the
/// rail of its sign (NaN: the upper one), so that it reaches every worker's sum as a rail
/// and fails the call there. Returns the values and the index of the first one sent as a
/// rail. Fails only on a bad scale.
pub fn to_fixed_railed(values: &[f32], scale: f64) -> Result<(Vec<i32>, Option<usize>), QuantError> {
    if !(scale.is_finite() && scale > 0.0) {
        return Err(QuantError::BadScale { scale });
    }
    let mut out = vec![0i32; values.len()];
    let first = match railed_into(values, &mut out, scale) {
        0 => None,
        _ => out.iter().position(|&x| is_rail(x)),
    };
    Ok((out, first))
}

/// Back to floats: `x / scale` (computed in f64, rounded once to f32).
pub fn from_fixed(values: &[i32], scale: f64) -> Vec<f32> {
    let mut out = vec![0.0; values.len()];
    from_fixed_into(values, scale, &mut out);
    out
}

inalab_core::avx2_dispatch! {
    /// [`from_fixed`] into `out` (as long as `values`).
    pub fn from_fixed_into(values: &[i32], scale: f64, out: &mut [f32]) {
        for (o, &x) in out.iter_mut().zip(values) {
            *o = (x as f64 / scale) as f32;
        }
    }
}

/// Whether no value is a NaN or an infinity (one vectorized pass).
pub fn all_finite(values: &[f32]) -> bool {
    max_exponent_field(values) != 0xFF
}

/// The frexp exponent of a value: the `e` with `v = m 2^e`, `0.5 <= |m| < 1`, so
/// `|v| < 2^e`. `None` for zero and non-finite values.
fn frexp_exponent(v: f32) -> Option<i32> {
    if v == 0.0 || !v.is_finite() {
        return None;
    }
    // Every f32, subnormals included, is normal as an f64.
    let bits = (v as f64).to_bits();
    Some(((bits >> 52) & 0x7FF) as i32 - 1022)
}

/// The block exponent of a block of zeros: below every finite value's (2^-149 is the
/// smallest float32 subnormal).
pub const ZERO_BLOCK_EXPONENT: i16 = -149;

/// SwitchML's block exponent: the largest frexp exponent of the finite non-zero values, so
/// every such `|v| < 2^e`. It covers every finite float32: from -148 (subnormals) to 128
/// (`f32::MAX` < 2^128). [`ZERO_BLOCK_EXPONENT`] for a block of zeros (and an empty block).
/// The block's exponent over all workers is the maximum of theirs.
pub fn block_exponent(values: &[f32]) -> i16 {
    match max_exponent_field(values) {
        // A normal f32 with biased exponent field f is m 2^(f - 126) with 0.5 <= m < 1.
        f @ 1..=0xFE => f as i16 - 126,
        // Only zeros and subnormals, or a NaN or infinity to leave out: value by value.
        _ => values.iter().filter_map(|&v| frexp_exponent(v)).max().map_or(ZERO_BLOCK_EXPONENT, |e| e as i16),
    }
}

/// [`block_exponent`] of a block of finite values, `None` if a NaN or infinity is among them:
/// one vectorized pass in the usual case.
pub fn finite_block_exponent(values: &[f32]) -> Option<i16> {
    match max_exponent_field(values) {
        0xFF => None,
        f @ 1..=0xFE => Some(f as i16 - 126),
        _ => Some(block_exponent(values)),
    }
}

/// SwitchML's scale of a block with exponent `e_max` summed over `n` workers:
/// `i32::MAX / (n 2^e_max)` (finite in f64 for every float32 exponent). Panics if `n` is 0.
pub fn switchml_scale(n: u32, e_max: i16) -> f64 {
    assert!(n > 0, "SwitchML's scale needs at least one worker");
    i32::MAX as f64 / (n as f64 * 2f64.powi(e_max as i32))
}

/// Converts one worker's block with SwitchML's scale for `n` workers and block exponent
/// `e_max`, clamping to `±floor(i32::MAX / n)` so that the sum of `n` converted blocks never
/// overflows; values at or above `2^e_max` in magnitude count as saturated. Fails on `n = 0`
/// and on the first NaN/Inf. Convert the sum back with
/// `from_fixed(sum, switchml_scale(n, e_max))`.
pub fn switchml_to_fixed(values: &[f32], n: u32, e_max: i16) -> Result<Fixed, QuantError> {
    if n == 0 {
        return Err(QuantError::NoWorkers);
    }
    let bound = i32::MAX as f64 / n as f64;
    convert(values, switchml_scale(n, e_max), bound, bound.floor() as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frexp_exponents() {
        assert_eq!(block_exponent(&[1.0]), 1);
        assert_eq!(block_exponent(&[0.5]), 0);
        assert_eq!(block_exponent(&[0.75, -3.0]), 2);
        assert_eq!(block_exponent(&[0.0, -0.0]), ZERO_BLOCK_EXPONENT);
        assert_eq!(block_exponent(&[]), ZERO_BLOCK_EXPONENT);
        assert_eq!(block_exponent(&[f32::NAN, 0.25]), -1);
        assert_eq!(block_exponent(&[f32::MIN_POSITIVE]), -125);
        assert_eq!(block_exponent(&[1e-45]), -148); // the smallest subnormal, 2^-149
        assert_eq!(block_exponent(&[f32::MAX]), 128);
    }

    #[test]
    fn atp_round_trip_and_saturation() {
        let f = to_fixed(&[1.6e-8, -2.6e-8, 21.0, 22.0, -30.0], ATP_SCALE).unwrap();
        assert_eq!(f.values, vec![2, -3, 2_100_000_000, i32::MAX, -i32::MAX]);
        assert_eq!(f.saturated, 2);
        assert_eq!(from_fixed(&[150_000_000], ATP_SCALE), vec![1.5]);
    }

    #[test]
    fn non_finite_is_an_error_naming_the_first_index() {
        assert_eq!(
            to_fixed(&[1.0, f32::INFINITY, f32::NAN], 1e8),
            Err(QuantError::NonFinite { index: 1, value: f32::INFINITY })
        );
        let e = switchml_to_fixed(&[0.0, 0.0, f32::NEG_INFINITY], 4, 0).unwrap_err();
        assert!(matches!(e, QuantError::NonFinite { index: 2, .. }), "{e}");
        assert!(matches!(switchml_to_fixed(&[f32::NAN], 4, 0), Err(QuantError::NonFinite { index: 0, .. })));
        assert_eq!(to_fixed(&[1.0], 0.0), Err(QuantError::BadScale { scale: 0.0 }));
        assert_eq!(
            to_fixed(&[1.0], f64::NAN).unwrap_err().to_string(),
            "fixed-point scale NaN must be finite and positive"
        );
        assert_eq!(switchml_to_fixed(&[1.0], 0, 0), Err(QuantError::NoWorkers));
    }

    #[test]
    fn railed_conversion_marks_what_has_no_place_inside_the_range() {
        // At scale 1e8 the range is |round(v x 1e8)| <= 2^31 - 2: 21.474836 fits, 21.4748364
        // rounds to 2^31 - 1, an end, and goes as the rail like everything beyond.
        let v = [1.5, -2.5e-8, 21.474836, -21.474836, 21.474838, -21.474838, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, 0.0];
        let (q, first) = to_fixed_railed(&v, ATP_SCALE).unwrap();
        assert_eq!(q[..4], [150_000_000, -3, 2_147_483_635, -2_147_483_635]); // 21.474836 as f32
        assert_eq!(q[4..], [RAIL, NEG_RAIL, RAIL, RAIL, NEG_RAIL, RAIL, 0]);
        assert_eq!(first, Some(4));
        assert_eq!(to_fixed_railed(&[0.5, -1.0], 1e8).unwrap(), (vec![50_000_000, -100_000_000], None));
        assert_eq!(to_fixed_railed(&[1.0], 0.0), Err(QuantError::BadScale { scale: 0.0 }));
        // In range it is the plain conversion, bit for bit.
        let w: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.731).sin() * 21.0).collect();
        assert_eq!(to_fixed_railed(&w, ATP_SCALE).unwrap().0, to_fixed(&w, ATP_SCALE).unwrap().values);
    }

    #[test]
    fn switchml_clamps_to_the_per_worker_bound() {
        // n = 8: bound 268435455.875; 0.99999 * 2^1 -> just below, 3.0 > 2^1 -> clamped.
        let f = switchml_to_fixed(&[1.99999, 3.0, -3.0, 0.0], 8, 1).unwrap();
        assert_eq!(f.saturated, 2);
        assert_eq!(f.values[1], 268_435_455);
        assert_eq!(f.values[2], -268_435_455);
        assert!(f.values[0] <= 268_435_455);
        let total: i64 = f.values[1] as i64 * 8;
        assert!(total <= i32::MAX as i64);
    }

    /// The conversion as it was written before it was vectorized: the reference.
    fn reference(values: &[f32], scale: f64, threshold: f64, clamp: i32) -> (Vec<i32>, usize) {
        let x = |v: f32| v as f64 * scale;
        let out = values.iter().map(|&v| x(v).round().clamp(-(clamp as f64), clamp as f64) as i32).collect();
        (out, values.iter().filter(|&&v| x(v).abs() >= threshold).count())
    }

    #[test]
    fn the_vectorized_conversion_and_exponent_match_the_scalar_ones() {
        // Ties both ways, values next to the clamp, signed zeros, subnormals, and a spread of
        // magnitudes from a fixed generator.
        let mut values = vec![0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.0, -0.0, 1e-45, -1e-40, 21.474836, -21.474837, 1e30, -1e30];
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..100_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let v = f32::from_bits(seed as u32);
            if v.is_finite() {
                values.push(v);
            }
            values.push((seed >> 40) as f32 / 2f32.powi(((seed >> 8) % 40) as i32) - 1000.0);
        }
        // 1e300: the largest values' products overflow to infinity, which clamps too.
        for (scale, threshold, clamp) in [(ATP_SCALE, i32::MAX as f64 + 0.5, i32::MAX), (1.0, 1e6, 1_000_000), (0.5, 3.0, 3), (4.0, 8.0, 7), (1e300, 1.0, i32::MAX)] {
            let got = convert(&values, scale, threshold, clamp).unwrap();
            let (want, saturated) = reference(&values, scale, threshold, clamp);
            assert_eq!((got.values, got.saturated), (want, saturated), "scale {scale}");
        }
        for chunk in values.chunks(37) {
            let slow = chunk.iter().filter_map(|&v| frexp_exponent(v)).max().map_or(ZERO_BLOCK_EXPONENT, |e| e as i16);
            assert_eq!((block_exponent(chunk), finite_block_exponent(chunk)), (slow, Some(slow)), "{chunk:?}");
        }
        assert_eq!(finite_block_exponent(&[1.0, f32::INFINITY]), None);
        assert_eq!(finite_block_exponent(&[f32::NAN]), None);
        assert_eq!(finite_block_exponent(&[1e-45, 0.0]), Some(-148));
    }
}
