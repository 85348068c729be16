//! The event queue: events in time order, ties in insertion order, so a run is a pure function
//! of its spec and seed.

use inalab_core::{NodeId, Time, TimerToken};
use std::collections::VecDeque;

#[derive(Debug, Clone, Copy)]
pub enum Ev {
    /// The packet at the head of egress port `port`'s wire (global port index) reaches the
    /// far end. Links are FIFO, so only each wire's head packet needs a queue entry.
    Arrive { port: u32 },
    /// A host's NIC finished serializing and may take the next packet.
    NicFree { host: u32 },
    /// A host's CPU finished the oldest packet waiting for it (`network.host_costs`).
    CpuRx { host: u32 },
    /// PFC: switch egress port `port` (global index) finished serializing its packet.
    TxDone { port: u32 },
    /// PFC: the head packet of idle port `port` may start (it was not ready when the port was
    /// free: a capacity-limited switch was still processing it).
    PortReady { port: u32 },
    /// PFC: a PAUSE (`on`) or RESUME frame reaches the sender of egress port `port`. `gen` is
    /// the pausing port's generation when it was sent: a failure on that link or switch bumps
    /// it, which makes frames still on their way stale.
    Pause { port: u32, gen: u16, on: bool },
    /// Credits: `bytes` of credits reach the sender of egress port `port`; `gen` as in `Pause`.
    Credit { port: u32, gen: u16, bytes: u32 },
    /// Packets between co-located endpoints of a host wait to be delivered.
    Local { host: u32 },
    /// A host endpoint's protocol timer (stale ones are skipped by the handler).
    HostTimer { host: u32, ep: u16 },
    /// `epoch` is the switch's when the timer was set: a failure makes older timers stale.
    SwitchTimer { switch: u32, token: TimerToken, epoch: u16 },
    /// Switch `switch`'s processing stage (`network.switch_capacity`) finished the packets
    /// due now.
    Processed { switch: u32 },
    /// Failure `idx` of the spec starts / ends.
    Fail { idx: u32 },
    /// The membership service tells a failed host's jobs (the workloads').
    PeerFailed { host: NodeId, at: Time },
    Recover { idx: u32 },
    /// A worker's current compute step (forward or backward of one layer) finished.
    ComputeDone { job: u32, rank: u32 },
    JobStart { job: u32 },
    FlowStart { flow: u32 },
    /// A background host starts its next message.
    Background { host: u32 },
}

struct Entry {
    time: Time,
    ev: Ev,
}

/// A radix heap on event times (a monotone priority queue: nothing is scheduled before the
/// last event popped, which a simulator guarantees). Bucket `b > 0` holds events whose time
/// first differs from the last popped time at bit `b - 1`; bucket 0 holds events at exactly
/// that time, in insertion order. Push is O(1); a pop that finds bucket 0 empty redistributes
/// the lowest non-empty bucket, and each event moves down at most 64 times, so pops are
/// amortized O(log T) with small constants and no comparisons of whole entries. The order is
/// the binary heap's it replaced: time, then insertion order (which the structure keeps, so
/// entries need no sequence number).
pub struct EventQueue {
    buckets: [Vec<Entry>; 65],
    /// Events at `last`, oldest first.
    now: VecDeque<Entry>,
    /// The bucket being spread, kept between refills so its allocation is reused: a bucket
    /// taken and dropped grew again from nothing, and every push into the fresh memory missed
    /// the cache (the 1024-host benchmark spent 15 % of its time there).
    spare: Vec<Entry>,
    last: Time,
    len: usize,
}

impl Default for EventQueue {
    fn default() -> Self {
        EventQueue { buckets: std::array::from_fn(|_| Vec::new()), now: VecDeque::new(), spare: Vec::new(), last: 0, len: 0 }
    }
}

#[inline]
fn bucket(time: Time, last: Time) -> usize {
    64 - (time ^ last).leading_zeros() as usize
}

impl EventQueue {
    /// Queues `ev` at `time`, which must not be before the last event popped.
    #[inline]
    pub fn push(&mut self, time: Time, ev: Ev) {
        debug_assert!(time >= self.last, "event at {time} scheduled before {}", self.last);
        self.len += 1;
        let e = Entry { time, ev };
        match bucket(time, self.last) {
            0 => self.now.push_back(e),
            b => self.buckets[b].push(e),
        }
    }

    #[inline]
    pub fn pop(&mut self) -> Option<(Time, Ev)> {
        if self.now.is_empty() {
            self.refill()?;
        }
        self.len -= 1;
        self.now.pop_front().map(|e| (e.time, e.ev))
    }

    /// Moves the earliest events into `now`: finds the lowest non-empty bucket, advances
    /// `last` to its earliest time and spreads the bucket over the buckets below.
    #[cold]
    fn refill(&mut self) -> Option<()> {
        let b = (1..65).find(|&b| !self.buckets[b].is_empty())?;
        let mut entries = std::mem::replace(&mut self.buckets[b], std::mem::take(&mut self.spare));
        self.last = entries.iter().map(|e| e.time).min().expect("non-empty");
        // Events of one time always share a bucket (the bucket depends on the time alone) and
        // keep their insertion order in it: pushes append, and moving a bucket down keeps its
        // order. So `now` receives them oldest first.
        for e in entries.drain(..) {
            match bucket(e.time, self.last) {
                0 => self.now.push_back(e),
                nb => self.buckets[nb].push(e),
            }
        }
        self.spare = entries;
        Some(())
    }

    pub fn peek_time(&self) -> Option<Time> {
        if let Some(e) = self.now.front() {
            return Some(e.time);
        }
        let b = (1..65).find(|&b| !self.buckets[b].is_empty())?;
        self.buckets[b].iter().map(|e| e.time).min()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_stay_small() {
        // Queue entries are copied on every pop; the failure epoch must not grow them.
        assert!(std::mem::size_of::<Ev>() <= 16);
    }

    #[test]
    fn pops_in_time_then_insertion_order() {
        let mut q = EventQueue::default();
        q.push(5, Ev::JobStart { job: 0 });
        q.push(3, Ev::JobStart { job: 1 });
        q.push(5, Ev::JobStart { job: 2 });
        q.push(3, Ev::JobStart { job: 3 });
        let order: Vec<u32> = std::iter::from_fn(|| q.pop())
            .map(|(_, e)| match e {
                Ev::JobStart { job } => job,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(order, vec![1, 3, 0, 2]);
    }

    /// Against a sorted reference, with pushes interleaved with pops as a simulator does
    /// (never before the last time popped), many ties, and times across the whole u64 range.
    #[test]
    fn matches_a_sorted_reference_under_interleaved_use() {
        use rand::{Rng, SeedableRng};
        for seed in 0..20u64 {
            let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
            let mut q = EventQueue::default();
            let mut reference: std::collections::BTreeSet<(Time, u32)> = Default::default();
            let (mut now, mut id) = (0u64, 0u32);
            for _ in 0..20_000 {
                if rng.random_bool(0.55) || reference.is_empty() {
                    let dt = match rng.random_range(0..4) {
                        0 => 0,
                        1 => rng.random_range(0..10),
                        2 => rng.random_range(0..1_000_000),
                        _ => rng.random_range(0..1u64 << 50),
                    };
                    q.push(now + dt, Ev::JobStart { job: id });
                    reference.insert((now + dt, id));
                    id += 1;
                } else {
                    let want = reference.pop_first().expect("non-empty");
                    let (t, ev) = q.pop().expect("same length");
                    let Ev::JobStart { job } = ev else { unreachable!() };
                    assert_eq!((t, job), want, "seed {seed}");
                    now = t;
                }
                assert_eq!(q.len(), reference.len());
                assert_eq!(q.peek_time(), reference.first().map(|x| x.0));
            }
        }
    }
}
