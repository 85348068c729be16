//! A small deterministic driver for the tests: an ideal fabric where each host has one NIC of
//! `rate_bps` shared by its protocol endpoints (polled round-robin), every packet reaches its
//! destination a fixed `delay` after its serialization ends, and test-supplied closures drop
//! or ECN-mark packets as they leave the NIC.
#![allow(dead_code)] // Each test binary uses a different part of this module.

use inalab_core::time::{serialization, Time, US};
use inalab_core::wire::{Header, SegKind};
use inalab_core::{splitmix64, Endpoint, HostEvent, HostProtocol, NodeId, Packet, Payload};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

pub type PacketFilter = Box<dyn FnMut(&Packet) -> bool>;

enum Ev {
    NicFree(NodeId),
    Arrive(Packet),
    Timer(usize, Time),
}

struct Nic {
    busy: bool,
    members: Vec<usize>,
    next: usize,
}

pub struct Fabric {
    pub now: Time,
    rate_bps: u64,
    delay: Time,
    protos: Vec<Box<dyn HostProtocol>>,
    by_ep: BTreeMap<Endpoint, usize>,
    nics: BTreeMap<NodeId, Nic>,
    heap: BinaryHeap<Reverse<(Time, u64)>>,
    pending: BTreeMap<u64, Ev>,
    seq: u64,
    armed: Vec<Option<Time>>,
    /// Decides, for each packet leaving a NIC, whether the fabric loses it.
    pub drop: PacketFilter,
    /// Decides, for each packet leaving a NIC, whether it arrives with an ECN mark.
    pub mark: PacketFilter,
    /// Every event any protocol reported: (protocol index, time, event).
    pub events: Vec<(usize, Time, HostEvent)>,
    pub sent: u64,
    pub dropped: u64,
}

impl Fabric {
    /// 100 Gbps NICs and 1 us one-way delay, no loss, no marks.
    pub fn new() -> Self {
        Fabric::with(100_000_000_000, US)
    }

    pub fn with(rate_bps: u64, delay: Time) -> Self {
        Fabric {
            now: 0,
            rate_bps,
            delay,
            protos: Vec::new(),
            by_ep: BTreeMap::new(),
            nics: BTreeMap::new(),
            heap: BinaryHeap::new(),
            pending: BTreeMap::new(),
            seq: 0,
            armed: Vec::new(),
            drop: Box::new(|_| false),
            mark: Box::new(|_| false),
            events: Vec::new(),
            sent: 0,
            dropped: 0,
        }
    }

    pub fn add(&mut self, p: Box<dyn HostProtocol>) -> usize {
        let i = self.protos.len();
        let ep = p.endpoint();
        assert!(self.by_ep.insert(ep, i).is_none(), "endpoint {ep:?} added twice");
        self.nics.entry(ep.host).or_insert(Nic { busy: false, members: Vec::new(), next: 0 }).members.push(i);
        self.protos.push(p);
        self.armed.push(None);
        i
    }

    pub fn proto(&self, i: usize) -> &dyn HostProtocol {
        self.protos[i].as_ref()
    }

    pub fn counter(&self, i: usize, name: &str) -> u64 {
        self.protos[i].counters().into_iter().find(|(n, _)| *n == name).map_or(0, |(_, v)| v)
    }

    /// Sum of a counter over all protocols.
    pub fn total(&self, name: &str) -> u64 {
        (0..self.protos.len()).map(|i| self.counter(i, name)).sum()
    }

    pub fn submit(&mut self, i: usize, req: inalab_core::AppRequest) {
        self.protos[i].submit(self.now, req);
        self.after_input(i);
    }

    /// Runs until nothing is left to do or `until`; returns whether it went quiet.
    pub fn run(&mut self, until: Time) -> bool {
        while let Some(&Reverse((t, s))) = self.heap.peek() {
            if t > until {
                return false;
            }
            self.heap.pop();
            self.now = t;
            match self.pending.remove(&s).expect("scheduled") {
                Ev::NicFree(h) => {
                    self.nics.get_mut(&h).expect("nic").busy = false;
                    self.kick(h);
                }
                Ev::Arrive(pkt) => {
                    let ep = Endpoint { host: pkt.dst, port: pkt.dst_port };
                    let i = *self.by_ep.get(&ep).unwrap_or_else(|| panic!("no endpoint {ep:?}"));
                    self.protos[i].handle_packet(t, pkt);
                    self.after_input(i);
                }
                Ev::Timer(i, at) => {
                    if self.armed[i] == Some(at) {
                        self.armed[i] = None;
                        self.protos[i].handle_timeout(t);
                        self.after_input(i);
                    }
                }
            }
        }
        true
    }

    /// Events of protocol `i`, in order.
    pub fn events_of(&self, i: usize) -> Vec<HostEvent> {
        self.events.iter().filter(|(j, _, _)| *j == i).map(|(_, _, e)| e.clone()).collect()
    }

    fn schedule(&mut self, at: Time, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq)));
        self.pending.insert(self.seq, ev);
    }

    fn after_input(&mut self, i: usize) {
        self.kick(self.protos[i].endpoint().host);
        self.settle(i);
    }

    /// Re-arms the timer of protocol `i` and collects its events.
    fn settle(&mut self, i: usize) {
        let t = self.protos[i].poll_timeout();
        if t != self.armed[i] {
            self.armed[i] = t;
            if let Some(t) = t {
                self.schedule(t.max(self.now), Ev::Timer(i, t));
            }
        }
        while let Some(e) = self.protos[i].poll_event() {
            self.events.push((i, self.now, e));
        }
    }

    /// If the host's NIC is idle, asks its endpoints round-robin for one packet.
    fn kick(&mut self, host: NodeId) {
        let nic = self.nics.get_mut(&host).expect("nic");
        if nic.busy {
            return;
        }
        let m = nic.members.len();
        let order: Vec<usize> = (0..m).map(|k| nic.members[(nic.next + k) % m]).collect();
        for (k, i) in order.into_iter().enumerate() {
            let Some(mut pkt) = self.protos[i].poll_transmit(self.now) else { continue };
            let nic = self.nics.get_mut(&host).expect("nic");
            nic.next = (nic.next + k + 1) % m;
            nic.busy = true;
            let done = self.now + serialization(pkt.size as u64, self.rate_bps);
            self.schedule(done, Ev::NicFree(host));
            self.sent += 1;
            if (self.drop)(&pkt) {
                self.dropped += 1;
            } else {
                if (self.mark)(&pkt) {
                    pkt.ecn = true;
                }
                self.schedule(done + self.delay, Ev::Arrive(pkt));
            }
            self.settle(i);
            return;
        }
    }
}

pub fn is_data(p: &Packet) -> bool {
    matches!(&p.header, Header::Transport(h) if h.kind == SegKind::Data)
}

pub fn is_ack(p: &Packet) -> bool {
    matches!(&p.header, Header::Transport(h) if h.kind == SegKind::Ack)
}

/// Drops the packets whose 0-based index among those passing `filter` is in `which`.
pub fn drop_nth(which: Vec<u64>, filter: fn(&Packet) -> bool) -> PacketFilter {
    let mut n = 0;
    Box::new(move |p| {
        if !filter(p) {
            return false;
        }
        n += 1;
        which.contains(&(n - 1))
    })
}

/// Drops each packet passing `filter` with probability `per_mille / 1000`, from a seeded
/// deterministic sequence.
pub fn drop_random(seed: u64, per_mille: u64, filter: fn(&Packet) -> bool) -> PacketFilter {
    let mut n = seed.wrapping_mul(0x9E37_79B9);
    Box::new(move |p| {
        if !filter(p) {
            return false;
        }
        n += 1;
        splitmix64(n) % 1000 < per_mille
    })
}

/// Endpoints `port` on hosts `0..n`.
pub fn endpoints(n: usize, port: u16) -> Vec<Endpoint> {
    (0..n as u32).map(|host| Endpoint { host, port }).collect()
}

/// Rank `rank`'s i32 tensor: arbitrary values (sums wrap, exactly like the protocols').
pub fn i32_tensor(rank: usize, len: usize, salt: u64) -> Vec<i32> {
    (0..len).map(|i| splitmix64(salt ^ (rank as u64) << 40 ^ i as u64) as i32).collect()
}

/// Rank `rank`'s f32 tensor: integers below 2^12, so sums of up to 4096 of them are exact
/// in any order.
pub fn f32_tensor(rank: usize, len: usize, salt: u64) -> Vec<f32> {
    (0..len).map(|i| (splitmix64(salt ^ (rank as u64) << 40 ^ i as u64) % 4096) as f32 - 2048.0).collect()
}

/// Element-wise sum of tensors (wrapping for i32).
pub fn sum(tensors: &[Payload]) -> Payload {
    let mut acc = tensors[0].zeros_like(tensors[0].len());
    for t in tensors {
        acc.add_at(0, t);
    }
    acc
}
