//! Sending at a link's rate from user space. The simulator's NIC takes a host's next packet
//! from its protocol only when the link is free, so a protocol's timers start when a packet
//! leaves. A real host hands the socket everything its window allows at once, and the
//! packets then wait in the kernel's queue (or a `tc` shaper's) with their timers running. A
//! [`Pacer`] in the send path gives the real runtime the simulator's behaviour: it lets a
//! frame go only when the link would be free, charging each its bytes on the wire.

use inalab_core::Time;

/// Bytes a datagram takes on an Ethernet link beyond its UDP payload: UDP 8 + IPv4 20 +
/// Ethernet 14, as `tc` counts them on a veth (and as scenarios' `header_bytes` include them).
pub const WIRE_OVERHEAD_BYTES: u64 = 42;
/// Bytes that may leave back to back at once (a NIC's burst), as the emulator's `tc` bucket.
pub const BURST_BYTES: u64 = 32 << 10;

#[derive(Debug, Clone, Copy)]
pub struct Pacer {
    rate_bps: u64,
    /// When the link has sent everything charged so far (ps, the driver's clock).
    free_at: Time,
    burst_ps: Time,
}

impl Pacer {
    /// A pacer for a link of `rate_bps` (> 0).
    pub fn new(rate_bps: u64) -> Pacer {
        let rate_bps = rate_bps.max(1);
        Pacer { rate_bps, free_at: 0, burst_ps: Self::wire_ps(rate_bps, BURST_BYTES) }
    }

    fn wire_ps(rate_bps: u64, bytes: u64) -> Time {
        (bytes as u128 * 8 * 1_000_000_000_000 / rate_bps as u128) as Time
    }

    /// Whether a frame may leave at `now`.
    pub fn ready(&self, now: Time) -> bool {
        self.free_at <= now + self.burst_ps
    }

    /// Charges a datagram of `bytes` (UDP payload) sent at `now`.
    pub fn charge(&mut self, now: Time, bytes: usize) {
        self.free_at = self.free_at.max(now) + Self::wire_ps(self.rate_bps, bytes as u64 + WIRE_OVERHEAD_BYTES);
    }

    /// When the next frame may leave.
    pub fn next_ready(&self) -> Time {
        self.free_at.saturating_sub(self.burst_ps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inalab_core::time::MS;

    #[test]
    fn a_paced_link_sends_at_its_rate_after_one_burst() {
        // 1 Gbps, 958 B datagrams = 1000 B on the wire = 8 us each.
        let mut p = Pacer::new(1_000_000_000);
        let (mut now, mut sent) = (0, 0u64);
        while now < 10 * MS {
            while p.ready(now) {
                p.charge(now, 958);
                sent += 1;
            }
            now = p.next_ready();
        }
        // 10 ms at 8 us per frame, plus the 32 KiB burst (33 frames) at the start.
        assert!((1250 + 32..=1250 + 34).contains(&sent), "{sent} frames");
    }
}
