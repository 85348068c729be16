//! The event queue: a binary min-heap on (time, insertion sequence). The sequence number
//! makes ties break in insertion order, so a run is a pure function of its spec and seed.

use inalab_core::{Time, TimerToken};
use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Debug, Clone, Copy)]
pub enum Ev {
    /// The packet at the head of egress port `port`'s wire (global port index) reaches the
    /// far end. Links are FIFO, so only each wire's head packet needs a queue entry.
    Arrive { port: u32 },
    /// A host's NIC finished serializing and may take the next packet.
    NicFree { host: u32 },
    /// Packets between co-located endpoints of a host wait to be delivered.
    Local { host: u32 },
    /// A host endpoint's protocol timer (stale ones are skipped by the handler).
    HostTimer { host: u32, ep: u16 },
    SwitchTimer { switch: u32, token: TimerToken },
    /// A worker's current compute step (forward or backward of one layer) finished.
    ComputeDone { job: u32, rank: u32 },
    JobStart { job: u32 },
    FlowStart { flow: u32 },
    /// A background host starts its next message.
    Background { host: u32 },
}

struct Entry {
    time: Time,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        self.time == o.time && self.seq == o.seq
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    // Reversed: BinaryHeap is a max-heap and we pop the earliest event.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.time, o.seq).cmp(&(self.time, self.seq))
    }
}

#[derive(Default)]
pub struct EventQueue {
    heap: BinaryHeap<Entry>,
    seq: u64,
}

impl EventQueue {
    #[inline]
    pub fn push(&mut self, time: Time, ev: Ev) {
        self.seq += 1;
        self.heap.push(Entry { time, seq: self.seq, ev });
    }
    #[inline]
    pub fn pop(&mut self) -> Option<(Time, Ev)> {
        self.heap.pop().map(|e| (e.time, e.ev))
    }
    pub fn peek_time(&self) -> Option<Time> {
        self.heap.peek().map(|e| e.time)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
