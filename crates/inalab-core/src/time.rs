//! Integer time in picoseconds. At 100 Gbps one byte lasts 80 ps, so picoseconds keep
//! serialization exact for every packet size and rate the papers use; u64 lasts 213 days.

/// Picoseconds since the start of a run.
pub type Time = u64;

pub const PS: Time = 1;
pub const NS: Time = 1_000;
pub const US: Time = 1_000_000;
pub const MS: Time = 1_000_000_000;
pub const S: Time = 1_000_000_000_000;

/// Serialization time of `bytes` at `rate_bps` bits per second, rounded up to the picosecond.
#[inline]
pub fn serialization(bytes: u64, rate_bps: u64) -> Time {
    debug_assert!(rate_bps > 0);
    let bits_ps = bytes as u128 * 8 * S as u128;
    bits_ps.div_ceil(rate_bps as u128) as Time
}

/// Seconds as a float, for reporting only (never for simulation arithmetic).
#[inline]
pub fn to_secs(t: Time) -> f64 {
    t as f64 / S as f64
}

/// Seconds (float, from a config) to picoseconds, rounded to the nearest picosecond.
#[inline]
pub fn from_secs(s: f64) -> Time {
    (s * S as f64).round() as Time
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialization_is_exact_for_atp_packets() {
        // 306 B at 100 Gbps = 24.48 ns.
        assert_eq!(serialization(306, 100_000_000_000), 24_480);
        // Rounds up: 1 B at 3 bps is 2.666.. s.
        assert_eq!(serialization(1, 3), 2_666_666_666_667);
    }
}
