//! ATP's AIMD congestion window (ATP paper §3.7), independent of any transport so that both
//! the host transport and ATP's INA workers can use it.
//!
//! Rules:
//! - below `ssthresh` (slow start) the window grows by `increment_bytes` per ACK;
//! - at or above `ssthresh` it grows by `increment_bytes` per window of acknowledged bytes
//!   (an exact integer accumulator, so the growth is `increment * acked / cwnd` without
//!   rounding drift);
//! - a congestion signal (an ECN echo, or the caller's loss detection: three out-of-order or
//!   duplicate ACKs, or a timeout) halves the window and sets `ssthresh` to the new window;
//! - the window never drops below `min_window_bytes` and never grows above `max_window_bytes`
//!   (ATP's workers cap it at their slot table: a job never has two fragments in flight on
//!   one aggregator; the authors' `CC_manager` clamps the same way).
//!
//! Once-per-window reaction: all packets in flight when the window is cut were sent at the old
//! rate, so their congestion signals describe the same episode. After a cut the window
//! remembers the caller's sequence number at the cut (the next sequence it will send) and
//! ignores further signals until an ACK's cumulative sequence reaches it, i.e. until the data
//! that was in flight at the cut is acknowledged. This is TCP's (RFC 3168/NewReno) choice;
//! ATP does not say, and halving on every marked ACK of one window would collapse the window.

/// AIMD parameters. Sizes are on-wire bytes (headers included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AimdConfig {
    /// Window at start, bytes. Default 60 000 (ATP: 200 packets of 300 B, about one
    /// bandwidth-delay product of a 100 Gbps rack).
    pub initial_window_bytes: u64,
    /// Additive increase, bytes: per ACK in slow start, per window above `ssthresh`.
    /// Default 1500 (one MTU).
    pub increment_bytes: u64,
    /// Floor of the window, bytes: one packet. Default 1500 (one MTU-sized packet; ATP's
    /// workers use their 300 B packet size).
    pub min_window_bytes: u64,
    /// Slow-start threshold at start, bytes. Default `u64::MAX`: slow start until the first
    /// congestion signal.
    pub initial_ssthresh_bytes: u64,
    /// Ceiling of the window, bytes. Default `u64::MAX` (none).
    pub max_window_bytes: u64,
}

impl Default for AimdConfig {
    fn default() -> Self {
        AimdConfig {
            initial_window_bytes: 60_000,
            increment_bytes: 1500,
            min_window_bytes: 1500,
            initial_ssthresh_bytes: u64::MAX,
            max_window_bytes: u64::MAX,
        }
    }
}

/// A congestion window driven by ACKs and congestion signals. Sequence numbers are the
/// caller's (any monotone counter: segments, packets or bytes), used only to scope the
/// once-per-window reaction.
#[derive(Debug, Clone)]
pub struct AimdWindow {
    cfg: AimdConfig,
    cwnd: u64,
    ssthresh: u64,
    /// Bytes acknowledged since the last congestion-avoidance increment.
    ca_acked: u64,
    /// Sequence at the last cut; signals are ignored until an ACK reaches it.
    cut_seq: Option<u64>,
    cuts: u64,
}

impl AimdWindow {
    pub fn new(cfg: AimdConfig) -> Self {
        let cwnd = cfg.initial_window_bytes.min(cfg.max_window_bytes).max(cfg.min_window_bytes);
        AimdWindow { ssthresh: cfg.initial_ssthresh_bytes, cfg, cwnd, ca_acked: 0, cut_seq: None, cuts: 0 }
    }

    /// Current window, bytes.
    pub fn window(&self) -> u64 {
        self.cwnd
    }

    /// Current slow-start threshold, bytes.
    pub fn ssthresh(&self) -> u64 {
        self.ssthresh
    }

    /// How many times the window was cut.
    pub fn cuts(&self) -> u64 {
        self.cuts
    }

    /// An ACK arrived. `acked_bytes`: bytes it newly acknowledges (0 for a duplicate ACK,
    /// which then only delivers its ECN signal); `ecn`: it echoes a congestion mark;
    /// `ack_seq`: its cumulative sequence (next expected); `seq_now`: the caller's next
    /// sequence to send, remembered if this ACK cuts the window. Returns whether it cut.
    pub fn on_ack(&mut self, acked_bytes: u64, ecn: bool, ack_seq: u64, seq_now: u64) -> bool {
        if self.cut_seq.is_some_and(|s| ack_seq >= s) {
            self.cut_seq = None;
        }
        if ecn {
            // A marked ACK never grows the window, even while a cut is in force.
            return self.on_congestion(seq_now);
        }
        if acked_bytes == 0 {
            return false;
        }
        if self.cwnd < self.ssthresh {
            self.cwnd = self.cwnd.saturating_add(self.cfg.increment_bytes);
        } else {
            self.ca_acked += acked_bytes;
            while self.ca_acked >= self.cwnd {
                self.ca_acked -= self.cwnd;
                self.cwnd = self.cwnd.saturating_add(self.cfg.increment_bytes);
            }
        }
        self.cwnd = self.cwnd.min(self.cfg.max_window_bytes).max(self.cfg.min_window_bytes);
        false
    }

    /// A retransmission timeout (RFC 5681 §3.1): the threshold halves, and the window restarts
    /// from its minimum in slow start, so that the resends of a whole window do not flood the
    /// path that delayed it. Counts as a cut.
    pub fn on_timeout(&mut self, seq_now: u64) {
        let flight = self.cwnd;
        self.ssthresh = (flight / 2).max(self.cfg.min_window_bytes);
        self.cwnd = self.cfg.min_window_bytes;
        self.ca_acked = 0;
        self.cut_seq = Some(seq_now);
        self.cuts += 1;
    }

    /// A congestion signal detected by the caller (ECN, three out-of-order/duplicate ACKs,
    /// timeout). Halves the window unless a cut is already in force for the data in flight;
    /// `seq_now` is the caller's next sequence to send. Returns whether it cut.
    pub fn on_congestion(&mut self, seq_now: u64) -> bool {
        if self.cut_seq.is_some() {
            return false;
        }
        self.cwnd = (self.cwnd / 2).max(self.cfg.min_window_bytes);
        self.ssthresh = self.cwnd;
        self.ca_acked = 0;
        self.cut_seq = Some(seq_now);
        self.cuts += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(initial: u64, ssthresh: u64) -> AimdWindow {
        AimdWindow::new(AimdConfig {
            initial_window_bytes: initial,
            initial_ssthresh_bytes: ssthresh,
            ..AimdConfig::default()
        })
    }

    #[test]
    fn defaults_are_atps() {
        let w = AimdWindow::new(AimdConfig::default());
        assert_eq!(w.window(), 60_000);
        assert_eq!(w.ssthresh(), u64::MAX);
    }

    #[test]
    fn a_timeout_restarts_from_the_minimum_with_half_the_window_as_threshold() {
        let mut w = window(60_000, u64::MAX);
        w.on_timeout(5);
        assert_eq!((w.window(), w.ssthresh(), w.cuts()), (1500, 30_000, 1));
        // Slow start up to the threshold again, and no further cut before seq 5 is acked.
        assert!(!w.on_congestion(6));
        w.on_ack(300, false, 5, 6);
        assert_eq!(w.window(), 3000);
    }

    #[test]
    fn slow_start_adds_one_mtu_per_ack() {
        let mut w = window(60_000, u64::MAX);
        for i in 1..=10 {
            assert!(!w.on_ack(300, false, i, i));
            assert_eq!(w.window(), 60_000 + 1500 * i);
        }
        // A duplicate ACK (nothing newly acked) does not grow the window.
        w.on_ack(0, false, 10, 10);
        assert_eq!(w.window(), 75_000);
    }

    #[test]
    fn congestion_avoidance_adds_one_mtu_per_window() {
        let mut w = window(30_000, 30_000);
        // 99 ACKs of 300 B = 29 700 B < one window: no growth yet.
        for i in 0..99 {
            w.on_ack(300, false, i, i);
        }
        assert_eq!(w.window(), 30_000);
        w.on_ack(300, false, 99, 99);
        assert_eq!(w.window(), 31_500);
        // The next increment needs a full 31 500 B window: 105 ACKs.
        for i in 0..104 {
            w.on_ack(300, false, 100 + i, 100 + i);
        }
        assert_eq!(w.window(), 31_500);
        w.on_ack(300, false, 204, 204);
        assert_eq!(w.window(), 33_000);
    }

    #[test]
    fn ecn_halves_and_sets_ssthresh() {
        let mut w = window(60_000, u64::MAX);
        assert!(w.on_ack(300, true, 5, 200));
        assert_eq!(w.window(), 30_000);
        assert_eq!(w.ssthresh(), 30_000);
        // Now in congestion avoidance: one ACK does not add a full MTU.
        w.on_ack(300, false, 201, 400);
        assert_eq!(w.window(), 30_000);
    }

    #[test]
    fn loss_signal_halves() {
        let mut w = window(10_000, u64::MAX);
        assert!(w.on_congestion(50));
        assert_eq!((w.window(), w.ssthresh()), (5_000, 5_000));
    }

    #[test]
    fn reacts_once_per_window() {
        let mut w = window(60_000, u64::MAX);
        assert!(w.on_ack(300, true, 10, 100));
        // Marks and losses for data sent before the cut (ack_seq < 100) are ignored.
        assert!(!w.on_ack(300, true, 50, 120));
        assert!(!w.on_congestion(130));
        assert!(!w.on_ack(300, true, 99, 140));
        assert_eq!(w.window(), 30_000);
        assert_eq!(w.cuts(), 1);
        // Once the ACKs pass the cut point the next signal cuts again.
        assert!(w.on_ack(300, true, 100, 150));
        assert_eq!(w.window(), 15_000);
        assert_eq!(w.cuts(), 2);
    }

    #[test]
    fn never_below_one_packet() {
        let mut w = AimdWindow::new(AimdConfig {
            initial_window_bytes: 2_000,
            min_window_bytes: 300,
            ..AimdConfig::default()
        });
        for seq in 0..20 {
            w.on_ack(300, true, seq, seq);
        }
        assert_eq!(w.window(), 300);
        assert_eq!(w.ssthresh(), 300);
        // The floor also applies to a configured initial window below it.
        let w = AimdWindow::new(AimdConfig { initial_window_bytes: 10, ..AimdConfig::default() });
        assert_eq!(w.window(), 1500);
    }

    #[test]
    fn never_above_the_ceiling() {
        let mut w = AimdWindow::new(AimdConfig { initial_window_bytes: 90_000, max_window_bytes: 61_200, ..AimdConfig::default() });
        assert_eq!(w.window(), 61_200, "the initial window is capped too");
        for seq in 0..50 {
            w.on_ack(306, false, seq, seq);
        }
        assert_eq!(w.window(), 61_200, "slow start stops at the ceiling");
        // A halving then starts from the ceiling, not from a window grown past it.
        w.on_congestion(60);
        assert_eq!(w.window(), 30_600);
    }
}
