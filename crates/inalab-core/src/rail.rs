//! Sticky saturation: how every fixed-point sum in inalab leaves its range (docs/runtime.md,
//! "Workers and quantization").
//!
//! Switches sum int32. A sum that leaves the range must not come back as a plausible number:
//! wrapping turns 15 + 15 at scale 1e8 into -12.95, and a plain saturating add (a Tofino
//! register ALU's) lets a later negative contribution pull a saturated partial back into
//! range, masking the overflow. So the two ends of the range are *rails*: a partial sum that
//! reaches [`RAIL`] or [`NEG_RAIL`] stays there through every later add and merge, and a
//! contribution that is a rail makes the sum one. A worker whose value has no fixed-point form
//! (NaN, infinity, out of range) sends a rail in its place, so every worker of the job finds
//! the rail in the sum at that index and fails the call, instead of one worker failing and the
//! others taking a wrong sum. A Tofino can do the same with a saturating register ALU and a
//! predicate on the stored value (equal to either end: keep it).
//!
//! In-range sums are unchanged bit for bit: a rail is only ever produced by an add whose exact
//! result is at or beyond an end, or by a contribution that is a rail.

/// The upper rail: a sum at or above `i32::MAX`, or a marked value (a NaN or a value beyond the
/// range, positive).
pub const RAIL: i32 = i32::MAX;
/// The lower rail: a sum at or below `i32::MIN`, or a marked negative value.
pub const NEG_RAIL: i32 = i32::MIN;

/// Whether `x` is at a rail.
#[inline(always)]
pub fn is_rail(x: i32) -> bool {
    x == RAIL || x == NEG_RAIL
}

crate::avx2_dispatch! {
    /// Adds `v` into `acc` element-wise with sticky saturation (see the module docs); returns
    /// how many elements reached a rail with this add (they were not at one before: a
    /// program's overflow flag and counter). Branch-free, so it vectorizes: it is a switch's
    /// per-value work.
    pub fn sticky_add(acc: &mut [i32], v: &[i32]) -> u32 {
        let mut railed = 0u32;
        for (a, &b) in acc.iter_mut().zip(v) {
            let x = *a;
            let s = x.wrapping_add(b);
            // All ones when the signs of both inputs differ from the sum's: an overflow,
            // toward the inputs' sign, saturated there.
            let o = ((x ^ s) & (b ^ s)) >> 31;
            let sat = (s & !o) | (((x >> 31) ^ i32::MAX) & o);
            // Masks, all ones when x is a rail (it stays), or else b is (it wins).
            let x_rail = -(((x == RAIL) | (x == NEG_RAIL)) as i32);
            let b_rail = -(((b == RAIL) | (b == NEG_RAIL)) as i32) & !x_rail;
            let r = (x & x_rail) | (b & b_rail) | (sat & !x_rail & !b_rail);
            *a = r;
            railed += (((r == RAIL) | (r == NEG_RAIL)) & (x_rail == 0)) as u32;
        }
        railed
    }
}

crate::avx2_dispatch! {
    /// How many values of `v` are at a rail (one vectorized pass; a result is checked with it).
    pub fn count_rails(v: &[i32]) -> usize {
        v.iter().map(|&x| ((x == RAIL) | (x == NEG_RAIL)) as usize).sum()
    }
}

/// The index of the first value of `v` at a rail, if any: counted in one vectorized pass,
/// located only when there is one.
pub fn first_rail(v: &[i32]) -> Option<usize> {
    if count_rails(v) == 0 {
        return None;
    }
    v.iter().position(|&x| is_rail(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(a: i32, b: i32) -> i32 {
        let mut acc = [a];
        sticky_add(&mut acc, &[b]);
        acc[0]
    }

    #[test]
    fn in_range_sums_are_exact_and_leaving_the_range_sticks() {
        assert_eq!(add(5, -7), -2);
        assert_eq!(add(i32::MAX - 3, 2), i32::MAX - 1);
        // Reaching an end is a rail, and nothing pulls it back.
        assert_eq!(add(i32::MAX - 3, 3), RAIL);
        assert_eq!(add(1_500_000_000, 1_500_000_000), RAIL);
        assert_eq!(add(-1_500_000_000, -1_500_000_000), NEG_RAIL);
        assert_eq!(add(RAIL, -1_500_000_000), RAIL);
        assert_eq!(add(NEG_RAIL, 2_000_000_000), NEG_RAIL);
        // A contribution at a rail makes the sum one, whatever was there.
        assert_eq!(add(-2_000_000_000, RAIL), RAIL);
        assert_eq!(add(7, NEG_RAIL), NEG_RAIL);
        // Two rails: the first one stays (either fails the call).
        assert_eq!(add(RAIL, NEG_RAIL), RAIL);
    }

    #[test]
    fn the_vectorized_add_matches_an_i64_reference_and_counts_rails() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let edges = [0, 1, -1, i32::MAX, i32::MIN, i32::MAX - 1, i32::MIN + 1, 1 << 30, -(1 << 30)];
        let (mut a, mut b) = (vec![], vec![]);
        for i in 0..10_000 {
            let (x, y) = (next(), next());
            a.push(if i % 5 == 0 { edges[(x % 9) as usize] } else { x as i32 });
            b.push(if i % 7 == 0 { edges[(y % 9) as usize] } else { (y as i32) >> (y % 8) });
        }
        let want: Vec<i32> = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| {
                if is_rail(x) {
                    x
                } else if is_rail(y) {
                    y
                } else {
                    (x as i64 + y as i64).clamp(i32::MIN as i64, i32::MAX as i64) as i32
                }
            })
            .collect();
        let mut got = a.clone();
        let railed = sticky_add(&mut got, &b);
        assert_eq!(got, want);
        assert_eq!(railed as usize, want.iter().zip(&a).filter(|(&x, &before)| is_rail(x) && !is_rail(before)).count());
        assert_eq!(count_rails(&got), want.iter().filter(|&&x| is_rail(x)).count());
        assert_eq!(first_rail(&got), want.iter().position(|&x| is_rail(x)));
        assert_eq!(first_rail(&[1, 2, 3]), None);
    }
}
