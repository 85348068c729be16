//! A round-trip-time estimator and retransmission timeout after RFC 6298: smoothed RTT and
//! its variation from samples, RTO = SRTT + max(G, 4 RTTVAR) kept within [min, max], doubled
//! on every timeout (back-off) until a new sample arrives. Integer picoseconds throughout, so
//! it is deterministic. Protocols with a fixed loss-recovery timeout can adopt it to stop
//! spurious-timeout storms on slow paths (the UDP runtime on busy cores).

use inalab_core::Time;

/// Estimator settings. Defaults in [`RttConfig::default`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RttConfig {
    /// RTO before the first sample, ps. Default 1 ms (RFC 6298 says 1 s for the Internet;
    /// a data center's RTTs are microseconds).
    pub initial_rto_ps: Time,
    /// Floor of the RTO, ps. Default 100 µs.
    pub min_rto_ps: Time,
    /// Ceiling of the RTO (and of its back-off), ps. Default 1 s.
    pub max_rto_ps: Time,
    /// Clock granularity G, ps. Default 1 µs.
    pub granularity_ps: Time,
}

impl Default for RttConfig {
    fn default() -> Self {
        let us = inalab_core::time::US;
        RttConfig { initial_rto_ps: 1000 * us, min_rto_ps: 100 * us, max_rto_ps: 1_000_000 * us, granularity_ps: us }
    }
}

/// RFC 6298's state. See the module docs.
#[derive(Debug, Clone)]
pub struct RttEstimator {
    cfg: RttConfig,
    srtt: Option<Time>,
    rttvar: Time,
    /// The RTO before back-off.
    base_rto: Time,
    backoffs: u32,
    /// When [`RttEstimator::on_timeout_of`] last backed off.
    backed_off_at: Option<Time>,
}

impl RttEstimator {
    pub fn new(cfg: RttConfig) -> Self {
        RttEstimator { base_rto: cfg.initial_rto_ps.clamp(cfg.min_rto_ps, cfg.max_rto_ps), cfg, srtt: None, rttvar: 0, backoffs: 0, backed_off_at: None }
    }

    /// A round-trip sample (never from a retransmitted packet: Karn's rule is the caller's).
    pub fn sample(&mut self, rtt: Time) {
        match self.srtt {
            None => {
                // (2.2): SRTT = R, RTTVAR = R / 2.
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(srtt) => {
                // (2.3) with alpha = 1/8, beta = 1/4.
                self.rttvar = (3 * self.rttvar + srtt.abs_diff(rtt)) / 4;
                self.srtt = Some((7 * srtt + rtt) / 8);
            }
        }
        let srtt = self.srtt.expect("set above");
        self.base_rto = (srtt + self.cfg.granularity_ps.max(4 * self.rttvar)).clamp(self.cfg.min_rto_ps, self.cfg.max_rto_ps);
        self.backoffs = 0;
    }

    /// The retransmission timer fired: back off (5.5).
    pub fn on_timeout(&mut self) {
        self.backoffs = self.backoffs.saturating_add(1);
    }

    /// A packet sent at `sent_at` timed out at `now`: back off, unless it was sent before the
    /// last back-off, when a shorter RTO timed it: packets of one window that expire together
    /// back off once (as TCP's one timer doubles once per loss), not once each.
    pub fn on_timeout_of(&mut self, sent_at: Time, now: Time) {
        if self.backed_off_at.map_or(true, |b| sent_at >= b) {
            self.on_timeout();
            self.backed_off_at = Some(now);
        }
    }

    /// New data was acknowledged, from a retransmission (no sample, by Karn's rule): the path
    /// works again, so the back-off ends (as Linux does on an ACK of new data) and the RTO is
    /// the last estimate's.
    pub fn on_progress(&mut self) {
        self.backoffs = 0;
    }

    /// The current RTO, ps.
    pub fn rto(&self) -> Time {
        let factor = 1u64.checked_shl(self.backoffs).unwrap_or(u64::MAX);
        self.base_rto.saturating_mul(factor).min(self.cfg.max_rto_ps)
    }

    /// SRTT + max(G, 4 RTTVAR) once a sample arrived, without the floor, ceiling and back-off
    /// of [`RttEstimator::rto`]: for a protocol that keeps its own bounds (ATP's loss timeout).
    pub fn estimate(&self) -> Option<Time> {
        self.srtt.map(|s| s + self.cfg.granularity_ps.max(4 * self.rttvar))
    }

    /// The smoothed RTT, once a sample arrived.
    pub fn srtt(&self) -> Option<Time> {
        self.srtt
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inalab_core::time::US;

    fn est() -> RttEstimator {
        RttEstimator::new(RttConfig { initial_rto_ps: 1000 * US, min_rto_ps: 10 * US, max_rto_ps: 100_000 * US, granularity_ps: US })
    }

    #[test]
    fn first_sample_sets_srtt_and_half_variation() {
        let mut e = est();
        assert_eq!(e.rto(), 1000 * US);
        e.sample(40 * US);
        // RTO = 40 + 4 x 20 = 120 µs.
        assert_eq!((e.srtt(), e.rto()), (Some(40 * US), 120 * US));
    }

    #[test]
    fn later_samples_smooth_with_one_eighth_and_one_quarter() {
        let mut e = est();
        e.sample(40 * US);
        e.sample(80 * US);
        // RTTVAR = (3 x 20 + 40) / 4 = 25; SRTT = (7 x 40 + 80) / 8 = 45; RTO = 45 + 100.
        assert_eq!((e.srtt(), e.rto()), (Some(45 * US), 145 * US));
    }

    #[test]
    fn progress_ends_the_back_off_and_keeps_the_estimate() {
        let mut e = est();
        e.sample(40 * US);
        e.on_timeout();
        e.on_timeout();
        assert_eq!(e.rto(), 480 * US);
        e.on_progress();
        assert_eq!((e.srtt(), e.rto()), (Some(40 * US), 120 * US));
    }

    #[test]
    fn timeouts_back_off_until_a_sample_and_stay_within_bounds() {
        let mut e = est();
        e.sample(40 * US);
        e.on_timeout();
        e.on_timeout();
        assert_eq!(e.rto(), 480 * US);
        (0..40).for_each(|_| e.on_timeout());
        assert_eq!(e.rto(), 100_000 * US, "capped at max");
        e.sample(40 * US);
        // RTTVAR = 3 x 20 / 4 = 15, SRTT = 40: no back-off left.
        assert_eq!(e.rto(), 100 * US, "a sample ends the back-off");
        let mut tiny = est();
        tiny.sample(1);
        assert_eq!(tiny.rto(), 10 * US, "floored at min");
    }

    #[test]
    fn a_window_expiring_together_backs_off_once() {
        let mut e = est();
        // Three packets sent at 0, 1 and 2 us all expire: one doubling.
        for sent in [0, US, 2 * US] {
            e.on_timeout_of(sent, 1000 * US);
        }
        assert_eq!(e.rto(), 2000 * US);
        // One sent after that back-off expires: a new loss, a second doubling.
        e.on_timeout_of(1500 * US, 3500 * US);
        assert_eq!(e.rto(), 4000 * US);
    }
}
