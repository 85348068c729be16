//! Sending at a link's rate from user space. The simulator's NIC takes a host's next packet
//! from its protocol only when the link is free, so a protocol's timers start when a packet
//! leaves. A real host hands the socket everything its window allows at once, and the
//! packets then wait in the kernel's queue (or a `tc` shaper's) with their timers running. A
//! [`Pacer`] in the send path gives the real runtime the simulator's behaviour: it lets a
//! frame go only when the link would be free, charging each its bytes on the wire.

use inalab_core::Time;
use std::collections::VecDeque;

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

    pub fn rate_bps(&self) -> u64 {
        self.rate_bps
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

    /// Bytes still to be sent at `now` of those charged (the queue a link draining at this
    /// rate would hold).
    pub fn backlog_bytes(&self, now: Time) -> u64 {
        inalab_core::time::bytes_in(self.free_at.saturating_sub(now), self.rate_bps)
    }

    /// Queues a datagram of `bytes` at `now` behind what the link still has to send; returns
    /// when its last bit is sent.
    pub fn admit(&mut self, now: Time, bytes: usize) -> Time {
        self.free_at = self.free_at.max(now) + Self::wire_ps(self.rate_bps, bytes as u64 + WIRE_OVERHEAD_BYTES);
        self.free_at
    }
}

/// A switch port's egress in user space (where `tc` cannot shape the link): datagrams leave
/// at the link's rate, each `delay_ps` after its last bit is sent; with more than
/// `buffer_bytes` waiting, new ones are dropped (tail drop, as a switch port's buffer).
#[derive(Debug)]
pub struct ShapedQueue {
    pacer: Pacer,
    delay_ps: Time,
    buffer_bytes: u64,
    queued_bytes: u64,
    queue: VecDeque<(Time, Vec<u8>)>,
    /// Datagrams dropped because the buffer was full.
    pub drops: u64,
}

impl ShapedQueue {
    pub fn new(rate_bps: u64, delay_ps: Time, buffer_bytes: u64) -> ShapedQueue {
        ShapedQueue { pacer: Pacer::new(rate_bps), delay_ps, buffer_bytes, queued_bytes: 0, queue: VecDeque::new(), drops: 0 }
    }

    /// Queues `datagram` at `now`; false if the buffer was full (it is dropped).
    pub fn push(&mut self, now: Time, datagram: Vec<u8>) -> bool {
        let wire = datagram.len() as u64 + WIRE_OVERHEAD_BYTES;
        if self.queued_bytes + wire > self.buffer_bytes {
            self.drops += 1;
            return false;
        }
        let due = self.pacer.admit(now, datagram.len()) + self.delay_ps;
        self.queued_bytes += wire;
        self.queue.push_back((due, datagram));
        true
    }

    /// The next datagram whose time has come.
    pub fn pop_due(&mut self, now: Time) -> Option<Vec<u8>> {
        if self.queue.front().is_some_and(|(due, _)| *due <= now) {
            let (_, d) = self.queue.pop_front()?;
            self.queued_bytes -= d.len() as u64 + WIRE_OVERHEAD_BYTES;
            return Some(d);
        }
        None
    }

    pub fn next_due(&self) -> Option<Time> {
        self.queue.front().map(|(due, _)| *due)
    }

    /// Bytes on the wire waiting in the queue.
    pub fn queued_bytes(&self) -> u64 {
        self.queued_bytes
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

    #[test]
    fn a_link_model_reports_what_it_still_has_to_send() {
        // 1 Gbps, 958 B = 1000 B on the wire = 8 us: three sent at 0 leave 3000 B queued,
        // drained at 125 B per us.
        let mut p = Pacer::new(1_000_000_000);
        for _ in 0..3 {
            p.admit(0, 958);
        }
        assert_eq!(p.backlog_bytes(0), 3000);
        assert_eq!(p.backlog_bytes(8 * MS / 1000), 2000);
        assert_eq!(p.backlog_bytes(MS), 0);
    }

    #[test]
    fn a_shaped_queue_releases_at_the_rate_after_the_delay_and_drops_beyond_its_buffer() {
        // 1 Gbps, 958 B = 8 us on the wire, 5 us delay, room for 3 datagrams.
        let mut q = ShapedQueue::new(1_000_000_000, 5 * inalab_core::time::US, 3000);
        assert!(q.push(0, vec![1; 958]) && q.push(0, vec![2; 958]) && q.push(0, vec![3; 958]));
        assert!(!q.push(0, vec![4; 958]), "a fourth does not fit");
        assert_eq!((q.drops, q.queued_bytes()), (1, 3000));
        assert_eq!(q.next_due(), Some(13 * inalab_core::time::US));
        assert_eq!(q.pop_due(12 * inalab_core::time::US), None);
        assert_eq!(q.pop_due(13 * inalab_core::time::US).map(|d| d[0]), Some(1));
        assert_eq!(q.next_due(), Some(21 * inalab_core::time::US));
        assert!(q.push(13 * inalab_core::time::US, vec![5; 958]), "room again");
        let order: Vec<u8> = std::iter::from_fn(|| q.pop_due(Time::MAX)).map(|d| d[0]).collect();
        assert_eq!(order, [2, 3, 5]);
    }
}
