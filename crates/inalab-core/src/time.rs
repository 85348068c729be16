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
    // In 64 bits up to 2.3 MB (every packet, and messages of that size): the same exact
    // result without a 128-bit division, once per packet and hop.
    match bytes.checked_mul(8 * S) {
        Some(bits_ps) => bits_ps.div_ceil(rate_bps),
        None => (bytes as u128 * 8 * S as u128).div_ceil(rate_bps as u128) as Time,
    }
}

/// The bytes a link of `rate_bps` sends in `ps` picoseconds, rounded down (a port's backlog
/// from its busy time); 64-bit arithmetic where it cannot overflow, the same result.
#[inline]
pub fn bytes_in(ps: Time, rate_bps: u64) -> u64 {
    match ps.checked_mul(rate_bps) {
        Some(bits_ps) => bits_ps / (8 * S),
        None => (ps as u128 * rate_bps as u128 / (8 * S as u128)) as u64,
    }
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
    fn the_64_bit_paths_give_the_128_bit_results() {
        for bytes in [0, 1, 64, 306, 1500, 9000, 1 << 20, 2_305_843, 2_305_844, 1 << 40] {
            for rate in [1, 999, 1_000_000_000, 25_000_000_000, 100_000_000_000, 400_000_000_000] {
                let wide = (bytes as u128 * 8 * S as u128).div_ceil(rate as u128) as Time;
                assert_eq!(serialization(bytes, rate), wide, "{bytes} B at {rate} bps");
            }
        }
        for ps in [0, 1, 80, 1_000_000, 184_467_440, 184_467_441, 1 << 50, u64::MAX] {
            for rate in [1, 10_000_000_000, 100_000_000_000, 1 << 40] {
                let wide = (ps as u128 * rate as u128 / (8 * S as u128)) as u64;
                assert_eq!(bytes_in(ps, rate), wide, "{ps} ps at {rate} bps");
            }
        }
    }

    #[test]
    fn serialization_is_exact_for_atp_packets() {
        // 306 B at 100 Gbps = 24.48 ns.
        assert_eq!(serialization(306, 100_000_000_000), 24_480);
        // Rounds up: 1 B at 3 bps is 2.666.. s.
        assert_eq!(serialization(1, 3), 2_666_666_666_667);
    }
}
