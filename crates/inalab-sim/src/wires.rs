//! Packets on the wires: serializing or propagating, each wire a FIFO in arrival order.
//! The same pooled FIFOs hold the packets waiting at a PFC egress port (`pfc.rs`), with the
//! time each may start and the port it came in through as `M`.
//!
//! A wire is a linked list of fixed-size chunks drawn from one pool that all wires share;
//! emptied chunks return to the pool and are reused last-in first-out. Memory is about the
//! most packets ever in flight at once (a growable buffer per wire instead costs the sum of
//! every wire's own peak: 184 MB against a few MB in the 1024-host benchmark), while a wire's
//! packets stay contiguous within a chunk, as in a ring buffer, so reading the next head is
//! usually in a cache line already loaded.

use inalab_core::{Packet, Time};

const NIL: u32 = u32::MAX;
/// Packets per chunk: large enough that moving to the next chunk is rare, small enough that
/// a wire holding one packet wastes little.
const CHUNK: usize = 16;

struct Chunk<M> {
    /// The next chunk of the same wire, or of the free list.
    next: u32,
    /// (arrival time, what the user keeps beside it, packet); `None` where taken or not yet written.
    slots: [Option<(Time, M, Packet)>; CHUNK],
}

#[derive(Clone, Copy)]
struct Fifo {
    head: u32,
    tail: u32,
    /// Next slot to take in `head` and to fill in `tail`.
    head_at: u16,
    tail_at: u16,
    len: u32,
    bytes: u64,
}

const EMPTY: Fifo = Fifo { head: NIL, tail: NIL, head_at: 0, tail_at: 0, len: 0, bytes: 0 };

/// One FIFO of packets per port, each with a time and an `M`.
pub(crate) struct Fifos<M> {
    chunks: Vec<Chunk<M>>,
    /// First free chunk; free chunks chain through `next`.
    free: u32,
    fifos: Vec<Fifo>,
}

/// The links' packets: (arrival time, packet) per wire.
pub(crate) type Wires = Fifos<()>;

impl<M: Copy> Fifos<M> {
    pub fn new(ports: usize) -> Self {
        Fifos { chunks: Vec::new(), free: NIL, fifos: vec![EMPTY; ports] }
    }

    fn alloc(&mut self) -> u32 {
        if self.free != NIL {
            let c = self.free;
            self.free = std::mem::replace(&mut self.chunks[c as usize].next, NIL);
            return c;
        }
        self.chunks.push(Chunk { next: NIL, slots: std::array::from_fn(|_| None) });
        (self.chunks.len() - 1) as u32
    }

    fn release(&mut self, c: u32) {
        self.chunks[c as usize].next = self.free;
        self.free = c;
    }

    /// Appends a packet reaching the far end of `port` at `arrival` (not before the wire's
    /// last packet: links are FIFO), with the user's `meta` beside it. Returns true if the
    /// wire was empty, i.e. this packet is its head and needs an arrival event.
    #[inline]
    pub fn push(&mut self, port: usize, arrival: Time, meta: M, pkt: Packet) -> bool {
        let f = self.fifos[port];
        let was_empty = f.len == 0;
        let (tail, at) = if was_empty {
            let c = self.alloc();
            self.fifos[port].head = c;
            self.fifos[port].head_at = 0;
            (c, 0)
        } else if f.tail_at as usize == CHUNK {
            let c = self.alloc();
            self.chunks[f.tail as usize].next = c;
            (c, 0)
        } else {
            (f.tail, f.tail_at)
        };
        let f = &mut self.fifos[port];
        f.tail = tail;
        f.tail_at = at + 1;
        f.len += 1;
        f.bytes += pkt.size as u64;
        let slot = &mut self.chunks[tail as usize].slots[at as usize];
        debug_assert!(slot.is_none(), "a tail slot is empty");
        // SAFETY: `slot` is a valid, aligned slot past the wire's last packet, so it holds
        // nothing (taken, or never written). A plain assignment would first read it to drop
        // what it held, and that read was a cache miss per packet sent (a tenth of the read
        // misses of the 1024-host benchmark, issue #39); overwriting a packet would only leak it.
        unsafe { std::ptr::write(slot, Some((arrival, meta, pkt))) };
        was_empty
    }

    /// Takes the head packet of `port`'s wire and its `meta`, with the arrival time of the
    /// packet behind it. (No wrapper without `meta`: moving a packet through one more `Option`
    /// cost the drop-tail path 1.5 % of its instructions.)
    #[inline]
    pub fn pop(&mut self, port: usize) -> Option<(M, Packet, Option<Time>)> {
        let f = self.fifos[port];
        if f.len == 0 {
            return None;
        }
        let (_, meta, pkt) = self.chunks[f.head as usize].slots[f.head_at as usize].take().expect("a wire's head slot holds its packet");
        if f.len == 1 {
            self.release(f.head);
            self.fifos[port] = EMPTY;
            return Some((meta, pkt, None));
        }
        let (mut head, mut at) = (f.head, f.head_at as usize + 1);
        if at == CHUNK {
            let next = self.chunks[head as usize].next;
            self.release(head);
            (head, at) = (next, 0);
        }
        let next = self.chunks[head as usize].slots[at].as_ref().expect("a packet behind the head").0;
        let f = &mut self.fifos[port];
        f.head = head;
        f.head_at = at as u16;
        f.len -= 1;
        f.bytes -= pkt.size as u64;
        Some((meta, pkt, Some(next)))
    }

    /// The head's time and size, without taking it.
    #[inline]
    pub fn peek(&self, port: usize) -> Option<(Time, u32)> {
        let f = &self.fifos[port];
        if f.len == 0 {
            return None;
        }
        self.chunks[f.head as usize].slots[f.head_at as usize].as_ref().map(|(t, _, p)| (*t, p.size))
    }

    /// Bytes held by `port`'s FIFO.
    #[inline]
    pub fn bytes(&self, port: usize) -> u64 {
        self.fifos[port].bytes
    }

    /// Packets and bytes on all wires.
    pub fn in_flight(&self) -> (u64, u64) {
        self.fifos.iter().fold((0, 0), |(n, b), f| (n + f.len as u64, b + f.bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inalab_core::wire::Header;

    fn pkt(size: u32) -> Packet {
        Packet::new(0, 0, 1, 0, size, Header::Raw)
    }

    #[test]
    fn wires_are_fifos_that_share_and_reuse_chunks() {
        let mut w = Wires::new(3);
        assert!(w.push(0, 10, (), pkt(100)));
        assert!(!w.push(0, 20, (), pkt(200)));
        assert!(w.push(2, 15, (), pkt(300)));
        assert_eq!(w.in_flight(), (3, 600));
        let ((), p, next) = w.pop(0).unwrap();
        assert_eq!((p.size, next), (100, Some(20)));
        assert!(w.push(1, 30, (), pkt(400)));
        assert_eq!(w.pop(0).map(|((), p, n)| (p.size, n)), Some((200, None)));
        assert!(w.pop(0).is_none());
        // Wire 0's chunk went back to the pool and is the next one handed out.
        assert!(w.push(0, 40, (), pkt(1)));
        assert_eq!(w.chunks.len(), 3);
        assert_eq!(w.pop(1).map(|((), p, n)| (p.size, n)), Some((400, None)));
        assert_eq!(w.pop(2).map(|((), p, n)| (p.size, n)), Some((300, None)));
        assert_eq!(w.pop(0).map(|((), p, n)| (p.size, n)), Some((1, None)));
        assert_eq!(w.in_flight(), (0, 0));
    }

    #[test]
    fn a_long_wire_spans_chunks_in_order_and_frees_them() {
        let mut w = Wires::new(2);
        let n = 5 * CHUNK as u64 + 3;
        for i in 0..n {
            assert_eq!(w.push(1, i, (), pkt(i as u32 + 1)), i == 0);
        }
        assert_eq!(w.chunks.len(), 6);
        for i in 0..n {
            let ((), p, next) = w.pop(1).unwrap();
            assert_eq!(p.size as u64, i + 1);
            assert_eq!(next, (i + 1 < n).then_some(i + 1));
            // Interleave another wire so chunks are recycled while this one drains.
            assert!(w.push(0, i, (), pkt(1)));
            w.pop(0).unwrap();
        }
        assert_eq!(w.in_flight(), (0, 0));
        // One more for wire 0 while wire 1 still held all six; after that, wire 1's freed
        // chunks served it.
        assert_eq!(w.chunks.len(), 7);
    }
}
