//! Ports and their output queues.
//!
//! Every egress port is a FIFO served at the link rate, so the moment a packet finishes
//! serializing is known when it is enqueued: `start = max(ready, busy_until)`. The queue is
//! therefore kept as one number, `busy_until`, and its backlog in bytes is
//! `(busy_until - now) x rate`. One event per packet per hop (its arrival at the next node)
//! is all a hop costs, which is what makes the simulator fast; drop-tail, ECN marking and
//! adaptive routing read the same backlog a real output queue would show.
//!
//! That holds while a port always sends once it can. Under PFC (`pfc.rs`) a paused port holds
//! packets it has not started, so there the waiting packets sit in a real FIFO and `busy_until`
//! is only the end of the packet in service.

use inalab_core::time::serialization;
use inalab_core::{NodeId, PortId, Time};

/// Laid out for the cache: what routing, `enqueue` and an arrival read of a port is in its
/// first two cache lines (the line-0 fields, then `PortStats`' counters and its series' last
/// bins); the series' earlier bins follow. Spread over four lines it was a read miss more
/// per packet at 2,048 ports (issue #39).
#[derive(Debug, Clone)]
#[repr(C, align(64))]
pub struct PortState {
    /// When the last packet accepted by this port finishes serializing.
    pub busy_until: Time,
    pub rate_bps: u64,
    pub delay_ps: Time,
    pub peer: NodeId,
    pub peer_port: PortId,
    pub link: u32,
    /// Probability that a packet sent on this port is lost on the wire.
    pub loss: f64,
    pub stats: PortStats,
}

/// Counters first, then two sparse time series, each with its last bin kept inline (see
/// `PortState`): a packet adds to the current bin in the port's own cache lines. Kept at
/// the end of a vector, that entry was a cache miss per packet (a fifth of `enqueue`).
#[derive(Debug, Clone)]
#[repr(C)]
pub struct PortStats {
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub max_queue_bytes: u64,
    pub ecn_marks: u64,
    pub drops_queue: u64,
    pub drops_loss: u64,
    /// Each series' last (bin, value), `NO_BIN` while it has none (16 bytes; an `Option`
    /// would take 24 and push the second out of the line).
    tx_last: (u32, u64),
    queue_last: (u32, u64),
    tx_done: Vec<(u32, u64)>,
    queue_done: Vec<(u32, u64)>,
}

/// `PortStats`' bin of a series without entries (a run would need 2^32 bins to reach it).
const NO_BIN: u32 = u32::MAX;

impl Default for PortStats {
    fn default() -> Self {
        PortStats { tx_bytes: 0, tx_packets: 0, max_queue_bytes: 0, ecn_marks: 0, drops_queue: 0, drops_loss: 0, tx_last: (NO_BIN, 0), queue_last: (NO_BIN, 0), tx_done: vec![], queue_done: vec![] }
    }
}

/// Sets bin `bin` (not before `last`'s) of the series `(done, last)` to `f(old value)`, 0
/// where the bin is new.
#[inline(always)]
fn update(done: &mut Vec<(u32, u64)>, last: &mut (u32, u64), bin: u32, f: impl Fn(u64) -> u64) {
    if last.0 == bin {
        last.1 = f(last.1);
    } else {
        if last.0 != NO_BIN {
            done.push(*last);
        }
        *last = (bin, f(0));
    }
}

/// A series' entries, in bin order.
fn entries<'a>(done: &'a [(u32, u64)], last: &(u32, u64)) -> impl Iterator<Item = (u32, u64)> + 'a {
    done.iter().copied().chain((last.0 != NO_BIN).then_some(*last))
}

impl PortStats {
    /// Sparse time series: (bin, picoseconds of that bin the link spent serializing), each
    /// packet's time split over the bins it covers, so a bin is never more than full.
    pub fn tx_series(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        entries(&self.tx_done, &self.tx_last)
    }

    /// Sparse time series: (bin, largest backlog seen at an enqueue in that bin).
    pub fn queue_series(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        entries(&self.queue_done, &self.queue_last)
    }

    #[inline(always)]
    fn record_queue(&mut self, bin: u32, backlog: u64) {
        update(&mut self.queue_done, &mut self.queue_last, bin, |q| q.max(backlog));
    }
}

/// What happened to a packet offered to a port.
pub enum Enqueued {
    /// Accepted; it reaches the peer at `arrival`. `ecn` says whether it was marked.
    Sent { arrival: Time, ecn: bool },
    DroppedQueue,
    /// Accepted and serialized but lost on the wire.
    DroppedLoss,
}

impl PortState {
    /// Bytes waiting or in service at `now`.
    #[inline]
    pub fn backlog(&self, now: Time) -> u64 {
        if self.busy_until <= now {
            return 0;
        }
        inalab_core::time::bytes_in(self.busy_until - now, self.rate_bps)
    }

    /// Offers a packet of `size` bytes that is ready to leave at `ready` (>= now).
    /// `buffer` = None means unlimited (host NICs, which are only offered a packet when idle).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue(&mut self, now: Time, ready: Time, size: u32, buffer: Option<u64>, ecn_threshold: u64, lost: bool, bin_ps: Time) -> Enqueued {
        let backlog = self.backlog(now);
        if let Some(buf) = buffer {
            if backlog + size as u64 > buf {
                self.stats.drops_queue += 1;
                return Enqueued::DroppedQueue;
            }
        }
        let ecn = buffer.is_some() && backlog > ecn_threshold;
        if ecn {
            self.stats.ecn_marks += 1;
        }
        let start = ready.max(self.busy_until);
        self.busy_until = start + serialization(size as u64, self.rate_bps);
        let s = &mut self.stats;
        s.tx_bytes += size as u64;
        s.tx_packets += 1;
        s.max_queue_bytes = s.max_queue_bytes.max(backlog);
        s.record_busy(start, self.busy_until, bin_ps);
        if buffer.is_some() {
            s.record_queue((start / bin_ps) as u32, backlog);
        }
        if lost {
            s.drops_loss += 1;
            return Enqueued::DroppedLoss;
        }
        Enqueued::Sent { arrival: self.busy_until + self.delay_ps, ecn }
    }

    /// PFC (`pfc.rs`): a packet is offered to this switch port's queue, which holds `backlog`
    /// bytes (waiting or in service). Counts what `enqueue` counts of it; returns whether it
    /// is ECN-marked. Nothing is dropped: backpressure, not the buffer, bounds the queue.
    #[inline]
    pub fn note_queued(&mut self, now: Time, backlog: u64, ecn_threshold: u64, bin_ps: Time) -> bool {
        let s = &mut self.stats;
        let ecn = backlog > ecn_threshold;
        s.ecn_marks += ecn as u64;
        s.max_queue_bytes = s.max_queue_bytes.max(backlog);
        s.record_queue((now / bin_ps) as u32, backlog);
        ecn
    }

    /// PFC: a packet of `size` bytes starts serializing at `now`; returns when it ends.
    #[inline]
    pub fn start_tx(&mut self, now: Time, size: u32, bin_ps: Time) -> Time {
        self.busy_until = now + serialization(size as u64, self.rate_bps);
        let s = &mut self.stats;
        s.tx_bytes += size as u64;
        s.tx_packets += 1;
        s.record_busy(now, self.busy_until, bin_ps);
        self.busy_until
    }
}

impl PortStats {
    /// Adds the serialization from `start` to `end` to the bins it covers.
    #[inline(always)]
    fn record_busy(&mut self, start: Time, end: Time, bin_ps: Time) {
        let mut t = start;
        while t < end {
            let b = t / bin_ps;
            let upto = end.min((b + 1) * bin_ps);
            update(&mut self.tx_done, &mut self.tx_last, b as u32, |busy| busy + (upto - t));
            t = upto;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port() -> PortState {
        PortState { peer: 1, peer_port: 0, link: 0, rate_bps: 100_000_000_000, delay_ps: 1_000_000, busy_until: 0, loss: 0.0, stats: Default::default() }
    }

    #[test]
    fn fifo_serializes_back_to_back_and_drops_tail() {
        let mut p = port();
        // 1000 B at 100 Gbps = 80 ns; arrival adds 1 us propagation.
        match p.enqueue(0, 0, 1000, Some(2500), 10_000, false, 1_000_000) {
            Enqueued::Sent { arrival, ecn } => assert_eq!((arrival, ecn), (80_000 + 1_000_000, false)),
            _ => panic!(),
        }
        match p.enqueue(0, 0, 1000, Some(2500), 10_000, false, 1_000_000) {
            Enqueued::Sent { arrival, .. } => assert_eq!(arrival, 160_000 + 1_000_000),
            _ => panic!(),
        }
        assert_eq!(p.backlog(0), 2000);
        assert_eq!(p.backlog(40_000), 1500);
        assert!(matches!(p.enqueue(0, 0, 1000, Some(2500), 10_000, false, 1_000_000), Enqueued::DroppedQueue));
        assert_eq!(p.stats.drops_queue, 1);
        assert_eq!(p.backlog(160_000), 0);
    }

    #[test]
    fn a_series_keeps_its_entries_in_bin_order_with_the_last_one_inline() {
        let mut s = PortStats::default();
        assert_eq!(s.queue_series().count(), 0);
        for (bin, q) in [(2, 5), (2, 7), (2, 1), (3, 1), (3, 0), (7, 4), (7, 9), (7, 2)] {
            s.record_queue(bin, q);
        }
        assert_eq!(s.queue_series().collect::<Vec<_>>(), vec![(2, 7), (3, 1), (7, 9)]);
    }

    #[test]
    fn what_a_packet_touches_of_a_port_is_in_its_first_two_cache_lines() {
        let p = port();
        let base = &p as *const PortState as usize;
        let end = |f: *const u8, size: usize| f as usize - base + size;
        assert_eq!(base % 64, 0);
        assert!(end(&p.stats.queue_last as *const _ as *const u8, 16) <= 128);
        assert!(end(&p.loss as *const _ as *const u8, 8) <= 64);
    }

    #[test]
    fn a_packet_s_serialization_is_split_over_the_bins_it_covers() {
        let mut p = port();
        // 1000 B at 100 Gbps = 80 ns, from 60 ns with 100 ns bins: 40 ns in bin 0, 40 in bin 1.
        p.enqueue(60_000, 60_000, 1000, Some(10_000), 10_000, false, 100_000);
        assert_eq!(p.stats.tx_series().collect::<Vec<_>>(), vec![(0, 40_000), (1, 40_000)]);
        assert_eq!(p.stats.queue_series().collect::<Vec<_>>(), vec![(0, 0)]);
    }

    #[test]
    fn marks_ecn_above_threshold() {
        let mut p = port();
        p.enqueue(0, 0, 1500, Some(100_000), 1000, false, 1);
        match p.enqueue(0, 0, 1500, Some(100_000), 1000, false, 1) {
            Enqueued::Sent { ecn, .. } => assert!(ecn),
            _ => panic!(),
        }
        assert_eq!(p.stats.ecn_marks, 1);
    }
}
