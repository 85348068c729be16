//! Congestion control as a trait: a window of on-wire bytes driven by ACKs and congestion
//! signals. ATP's AIMD ([`AimdWindow`]) is one implementation; schemes that change its rules
//! (DSA, Rina) add their own beside it, and the transport and ATP's workers take any.

use crate::aimd::{AimdConfig, AimdWindow};

/// Which rules a protocol's congestion window follows (a config field for ATP and the
/// transport, so a scheme can swap the rules without touching the protocol). Every windowed
/// protocol (ATP, the transport, DSA, GRID, Rina) holds its window through it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WindowRules {
    /// ATP's AIMD (§3.7), the default everywhere.
    #[default]
    Aimd,
}

impl WindowRules {
    /// A window following these rules, from the AIMD settings.
    pub fn window(self, cfg: &AimdConfig) -> Box<dyn CongestionControl> {
        match self {
            WindowRules::Aimd => Box::new(AimdWindow::new(cfg.clone())),
        }
    }
}

/// A congestion window. Sequence numbers are the caller's (any monotone counter), used to
/// scope a once-per-window reaction.
pub trait CongestionControl: Send {
    /// Current window, bytes.
    fn window(&self) -> u64;
    /// An ACK newly acknowledging `acked_bytes` (0 for a duplicate), echoing a mark if
    /// `ecn`, with cumulative sequence `ack_seq`; `seq_now` is the next sequence to send.
    /// Returns whether the window was cut.
    fn on_ack(&mut self, acked_bytes: u64, ecn: bool, ack_seq: u64, seq_now: u64) -> bool;
    /// A congestion signal the caller detected (loss, timeout). Returns whether it cut.
    fn on_congestion(&mut self, seq_now: u64) -> bool;
    /// A retransmission timeout: the window restarts from its floor (RFC 5681 §3.1).
    fn on_timeout(&mut self, seq_now: u64);
    /// How many times the window was cut.
    fn cuts(&self) -> u64;
}

impl CongestionControl for AimdWindow {
    fn window(&self) -> u64 {
        AimdWindow::window(self)
    }
    fn on_ack(&mut self, acked_bytes: u64, ecn: bool, ack_seq: u64, seq_now: u64) -> bool {
        AimdWindow::on_ack(self, acked_bytes, ecn, ack_seq, seq_now)
    }
    fn on_congestion(&mut self, seq_now: u64) -> bool {
        AimdWindow::on_congestion(self, seq_now)
    }
    fn on_timeout(&mut self, seq_now: u64) {
        AimdWindow::on_timeout(self, seq_now)
    }
    fn cuts(&self) -> u64 {
        AimdWindow::cuts(self)
    }
}
