//! The host of the static-tree allreduce baselines of Canary's evaluation (`../shared/specs/
//! canary.md` §3.1, A21; with `inalab_switch::StaticTreeSwitch`). There is no leader: a host
//! cuts its tensor into 256-value blocks, sends block b up tree b mod N (its first hop is its
//! ToR, which knows its parent in every tree), and waits for the block's Result, which the
//! tree's root multicasts down the same tree to every host.
//!
//! Window: a host sends block b only while b < (its oldest unfinished block) + window. The
//! scheme keeps the window at most half the job's slots per switch, so a block's slot is
//! never needed by another block: a host sends block b + slots only once every host had
//! block b's result (see the switch program).
//!
//! Loss: a block whose Result is late is sent again (flagged as a re-send); the switches
//! never sum it twice and answer from where the block is. The timeout doubles at each expiry
//! of the same block, up to 64 times the configured one (`inalab_core::backed_off`).

use crate::blocks::Blocks;
use crate::ConfigError;
use inalab_core::wire::{Header, StaticTreeHeader, StaticTreeKind};
use inalab_core::{AppRequest, Endpoint, HostEvent, HostProtocol, NodeId, Packet, Payload, Time, TimerTable, backed_off};
use std::collections::{BTreeMap, VecDeque};

/// Values per packet: Canary's blocks (§5.1: 256 x 4 B), so the baselines compare alike.
pub const STATIC_TREE_BLOCK_VALUES: usize = 256;

#[derive(Debug, Clone, PartialEq)]
pub struct StaticTreeConfig {
    /// The job id the switches keep its blocks apart by.
    pub job: u16,
    /// Every host of the job, by rank (all on the same protocol port).
    pub workers: Vec<Endpoint>,
    /// The root switch of each tree, by tree index: the destination of a block's packets
    /// (switches forward them by the tree, not by it). Block b uses tree b mod `roots.len()`.
    pub roots: Vec<NodeId>,
    /// Bytes on the wire besides the values (Canary's accounting, §5.1: 57 B).
    pub header_bytes: u32,
    /// A block whose Result is this late is sent again, ps.
    pub rtx_timeout_ps: Time,
    /// Blocks from the oldest unfinished one a host may have sent.
    pub window_blocks: u32,
}

impl StaticTreeConfig {
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.workers.is_empty() || self.workers.len() > u16::MAX as usize {
            return Err(ConfigError(format!("{} workers; a static tree's counter holds 1..=65535", self.workers.len())));
        }
        if self.roots.is_empty() || self.roots.len() > u8::MAX as usize + 1 {
            return Err(ConfigError(format!("{} trees; the header names 1..=256", self.roots.len())));
        }
        if self.window_blocks == 0 || self.rtx_timeout_ps == 0 {
            return Err(ConfigError("window_blocks and rtx_timeout_ps must be positive".into()));
        }
        Ok(())
    }
}

/// A block sent and not yet finished.
struct Flight {
    tensor: usize,
    /// Expiries so far: the next timeout is `rtx_timeout << expiries` (bounded).
    expiries: u32,
}

#[derive(Default)]
struct Counters {
    sent: u64,
    resent: u64,
    results: u64,
    duplicates: u64,
    malformed: u64,
}

pub struct StaticTreeHost {
    cfg: StaticTreeConfig,
    me: Endpoint,
    /// Submitted tensors: blocks `next_send..blocks.next` are not sent yet.
    blocks: Blocks,
    next_send: u64,
    flights: BTreeMap<u64, Flight>,
    /// When each block in flight is sent again (none: queued for a re-send).
    deadlines: TimerTable<u64>,
    resend: VecDeque<u64>,
    events: VecDeque<HostEvent>,
    c: Counters,
}

impl StaticTreeHost {
    pub fn new(cfg: StaticTreeConfig, rank: usize) -> Result<Self, ConfigError> {
        cfg.check()?;
        let me = *cfg.workers.get(rank).ok_or_else(|| ConfigError(format!("rank {rank} is not in 0..{}", cfg.workers.len())))?;
        Ok(StaticTreeHost { cfg, me, blocks: Blocks::new(STATIC_TREE_BLOCK_VALUES), next_send: 0, flights: BTreeMap::new(), deadlines: TimerTable::new(), resend: VecDeque::new(), events: VecDeque::new(), c: Counters::default() })
    }

    fn tree_of(&self, block: u64) -> usize {
        (block % self.cfg.roots.len() as u64) as usize
    }

    /// The oldest block not finished: the window starts there.
    fn oldest(&self) -> u64 {
        self.flights.keys().next().copied().unwrap_or(self.next_send)
    }

    /// The block a 32-bit sequence number names among those in flight (they span less than
    /// the window, far below 2^31).
    fn block_of(&self, seq: u32) -> u64 {
        let oldest = self.oldest();
        oldest + seq.wrapping_sub(oldest as u32) as u64
    }

    fn reduce(&self, tensor: usize, block: u64, rtx: bool) -> Packet {
        let tree = self.tree_of(block);
        let h = StaticTreeHeader { job: self.cfg.job, tree: tree as u8, kind: StaticTreeKind::Reduce, rtx, seq: block as u32, counter: 1 };
        let (s, e) = self.blocks.span(tensor, block);
        let size = self.cfg.header_bytes + 4 * (e - s) as u32;
        let mut p = Packet::new(self.me.host, self.me.port, self.cfg.roots[tree], self.me.port, size, Header::StaticTree(h));
        p.payload = self.blocks.payload(tensor, block);
        p
    }

    fn arm(&mut self, block: u64, now: Time) {
        let f = self.flights.get_mut(&block).expect("in flight");
        // (Bounded: a block that expires 64 times, one whose peers never send it as when ranks
        // disagree on sizes, once overflowed an unbounded shift and panicked.)
        let at = now + backed_off(self.cfg.rtx_timeout_ps, f.expiries);
        self.deadlines.set(block, at);
    }

    fn on_result(&mut self, h: StaticTreeHeader, pkt: &Packet) {
        let block = self.block_of(h.seq);
        let Some(f) = self.flights.get(&block) else {
            // Answered already (a re-sent partial sum's second answer, or a re-send's).
            self.c.duplicates += 1;
            return;
        };
        let tensor = f.tensor;
        let values = match pkt.payload.as_deref() {
            None => None,
            Some(Payload::I32(v)) => Some(v.as_slice()),
            Some(_) => {
                self.c.malformed += 1;
                return;
            }
        };
        let fits = h.tree as usize == self.tree_of(block) && h.counter as usize == self.cfg.workers.len() && self.blocks.fits(tensor, block, values);
        if !fits {
            self.c.malformed += 1;
            return;
        }
        self.flights.remove(&block);
        if self.deadlines.cancel(block).is_none() {
            self.resend.retain(|&b| b != block);
        }
        self.c.results += 1;
        self.events.extend(self.blocks.finish(tensor, block, values));
    }
}

impl HostProtocol for StaticTreeHost {
    fn endpoint(&self) -> Endpoint {
        self.me
    }

    fn submit(&mut self, _now: Time, req: AppRequest) {
        if let Err(e) = self.blocks.submit(req, "static-tree hosts") {
            self.events.push_back(e);
        }
    }

    fn handle_packet(&mut self, _now: Time, pkt: Packet) {
        let Header::StaticTree(h) = pkt.header else { return };
        if h.job != self.cfg.job {
            return;
        }
        match h.kind {
            StaticTreeKind::Result => self.on_result(h, &pkt),
            StaticTreeKind::Reduce => self.c.malformed += 1,
        }
    }

    fn handle_timeout(&mut self, now: Time) {
        while let Some(block) = self.deadlines.pop_expired(now) {
            let f = self.flights.get_mut(&block).expect("a deadline is a block in flight");
            f.expiries += 1;
            self.resend.push_back(block);
        }
    }

    fn poll_transmit(&mut self, now: Time) -> Option<Packet> {
        // Re-sends first: the window cannot move past them.
        if let Some(block) = self.resend.pop_front() {
            let tensor = self.flights[&block].tensor;
            self.c.resent += 1;
            self.arm(block, now);
            return Some(self.reduce(tensor, block, true));
        }
        let block = self.next_send;
        if block == self.blocks.next || block >= self.oldest() + self.cfg.window_blocks as u64 {
            return None;
        }
        self.next_send += 1;
        let tensor = self.blocks.tensor_of(block);
        self.flights.insert(block, Flight { tensor, expiries: 0 });
        self.arm(block, now);
        self.c.sent += 1;
        Some(self.reduce(tensor, block, false))
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.deadlines.next()
    }

    fn poll_event(&mut self) -> Option<HostEvent> {
        self.events.pop_front()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = &self.c;
        vec![
            ("sent", c.sent),
            ("resent", c.resent),
            ("results", c.results),
            ("duplicate_results", c.duplicates),
            ("malformed", c.malformed),
            ("blocks_pending", self.flights.len() as u64 + (self.blocks.next - self.next_send)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inalab_core::MAX_BACKOFF;

    const RTX: Time = 1_000_000;

    fn cfg(n: usize, trees: usize, window_blocks: u32) -> StaticTreeConfig {
        StaticTreeConfig {
            job: 3,
            workers: (0..n as NodeId).map(|h| Endpoint { host: h, port: 9 }).collect(),
            roots: (0..trees as NodeId).map(|k| 100 + k).collect(),
            header_bytes: 57,
            rtx_timeout_ps: RTX,
            window_blocks,
        }
    }

    fn drain(h: &mut StaticTreeHost, now: Time) -> Vec<Packet> {
        std::iter::from_fn(|| h.poll_transmit(now)).collect()
    }

    fn header(p: &Packet) -> StaticTreeHeader {
        match p.header {
            Header::StaticTree(h) => h,
            _ => panic!("not a static-tree packet"),
        }
    }

    /// The Result of block `seq` as a root sends it: every host counted.
    fn result(n: usize, tree: u8, seq: u32, values: Option<Vec<i32>>) -> Packet {
        let h = StaticTreeHeader { job: 3, tree, kind: StaticTreeKind::Result, rtx: false, seq, counter: n as u16 };
        let mut p = Packet::new(100, 9, 0, 9, 1081, Header::StaticTree(h));
        p.payload = values.map(|v| Box::new(Payload::I32(v)));
        p
    }

    fn done(h: &mut StaticTreeHost) -> Option<Option<Payload>> {
        std::iter::from_fn(|| h.poll_event()).find_map(|e| match e {
            HostEvent::Done { data, .. } => Some(data),
            _ => None,
        })
    }

    #[test]
    fn a_block_never_answered_backs_off_to_the_cap_without_overflowing() {
        // Found with ranks that disagree on sizes (#36): their blocks are never completed, and
        // the 64th expiry's `1 << 64` panicked the worker's I/O thread.
        let mut h = StaticTreeHost::new(cfg(2, 1, 8), 0).unwrap();
        h.submit(0, AppRequest::allreduce(1, 4 * 10, None));
        drain(&mut h, 0);
        let mut last = 0;
        for _ in 0..100 {
            let at = h.poll_timeout().expect("the block stays armed");
            h.handle_timeout(at);
            assert_eq!(drain(&mut h, at).len(), 1, "resent");
            assert!(at - last <= MAX_BACKOFF * RTX);
            last = at;
        }
        assert_eq!(h.poll_timeout(), Some(last + MAX_BACKOFF * RTX));
    }

    #[test]
    fn blocks_go_round_robin_over_the_trees_in_full_packets() {
        let mut h = StaticTreeHost::new(cfg(4, 3, 64), 1).unwrap();
        h.submit(0, AppRequest::allreduce(1, 4 * 600, None));
        let sent = drain(&mut h, 0);
        assert_eq!(sent.len(), 3, "600 values: 256 + 256 + 88");
        for (b, p) in sent.iter().enumerate() {
            let hd = header(p);
            assert_eq!((hd.seq, hd.tree as usize, p.dst, hd.counter, hd.rtx), (b as u32, b % 3, 100 + (b % 3) as NodeId, 1, false));
        }
        assert_eq!(sent.iter().map(|p| p.size).collect::<Vec<_>>(), vec![1081, 1081, 57 + 4 * 88]);
    }

    #[test]
    fn the_window_slides_from_the_oldest_unfinished_block() {
        let mut h = StaticTreeHost::new(cfg(2, 1, 2), 0).unwrap();
        h.submit(0, AppRequest::allreduce(1, 4 * 256 * 5, None));
        assert_eq!(drain(&mut h, 0).len(), 2);
        // Block 1 finishes, block 0 not: block 2 would be two past the oldest.
        h.handle_packet(1, result(2, 0, 1, None));
        assert!(drain(&mut h, 1).is_empty());
        h.handle_packet(2, result(2, 0, 0, None));
        assert_eq!(drain(&mut h, 2).iter().map(|p| header(p).seq).collect::<Vec<_>>(), vec![2, 3]);
    }

    #[test]
    fn a_late_block_is_sent_again_with_back_off() {
        let mut h = StaticTreeHost::new(cfg(2, 2, 8), 0).unwrap();
        h.submit(0, AppRequest::allreduce(1, 4 * 256, None));
        assert_eq!(drain(&mut h, 0).len(), 1);
        let mut now = 0;
        let mut gaps = vec![];
        for _ in 0..9 {
            let at = h.poll_timeout().expect("armed");
            gaps.push((at - now) / RTX);
            now = at;
            h.handle_timeout(now);
            let again = drain(&mut h, now);
            assert_eq!(again.len(), 1);
            assert!(header(&again[0]).rtx);
        }
        assert_eq!(gaps, vec![1, 2, 4, 8, 16, 32, 64, 64, 64]);
        h.handle_packet(now, result(2, 0, 0, None));
        assert_eq!(h.poll_timeout(), None);
        assert!(done(&mut h).is_some());
        // A second answer (to another re-send) changes nothing.
        h.handle_packet(now, result(2, 0, 0, None));
        assert_eq!(h.counters().iter().find(|c| c.0 == "duplicate_results").unwrap().1, 1);
    }

    #[test]
    fn hosts_sum_exactly_through_a_root_and_reject_bad_results() {
        // Three hosts and a hand-made root: sum each block, multicast the result.
        let n = 3;
        let mut hosts: Vec<StaticTreeHost> = (0..n).map(|r| StaticTreeHost::new(cfg(n, 2, 4), r).unwrap()).collect();
        let values: usize = 1000;
        for (r, h) in hosts.iter_mut().enumerate() {
            let data: Vec<i32> = (0..values).map(|i| (i as i32) * (r as i32 + 1)).collect();
            h.submit(0, AppRequest::allreduce(7, 4 * values as u64, Some(Payload::I32(data))));
        }
        let mut sums: BTreeMap<u32, (u8, u16, Vec<i32>)> = BTreeMap::new();
        let mut finished = vec![None; n];
        for now in 0..100 {
            for h in &mut hosts {
                for p in drain(h, now) {
                    let hd = header(&p);
                    let Some(Payload::I32(v)) = p.payload.as_deref() else { panic!() };
                    let e = sums.entry(hd.seq).or_insert((hd.tree, 0, vec![0; v.len()]));
                    e.1 += hd.counter;
                    e.2.iter_mut().zip(v).for_each(|(a, b)| *a += b);
                }
            }
            let full: Vec<u32> = sums.iter().filter(|(_, e)| e.1 == n as u16).map(|(&s, _)| s).collect();
            for seq in full {
                let (tree, _, v) = sums.remove(&seq).unwrap();
                for h in &mut hosts {
                    // Malformed answers first: a wrong count and a wrong length are ignored.
                    h.handle_packet(now, result(n - 1, tree, seq, Some(v.clone())));
                    h.handle_packet(now, result(n, tree, seq, Some(v[1..].to_vec())));
                    h.handle_packet(now, result(n, tree, seq, Some(v.clone())));
                }
            }
            for (h, f) in hosts.iter_mut().zip(&mut finished) {
                if let Some(d) = done(h) {
                    *f = d;
                }
            }
        }
        let want: Vec<i32> = (0..values).map(|i| 6 * i as i32).collect();
        for f in finished {
            assert_eq!(f, Some(Payload::I32(want.clone())));
        }
        assert_eq!(hosts[0].counters().iter().find(|c| c.0 == "malformed").unwrap().1, 2 * values.div_ceil(256) as u64);
    }

    #[test]
    fn sequence_numbers_wrap_at_32_bits() {
        let mut h = StaticTreeHost::new(cfg(2, 1, 4), 0).unwrap();
        (h.blocks.next, h.next_send) = ((1 << 32) - 2, (1 << 32) - 2);
        h.submit(0, AppRequest::allreduce(1, 4 * 256 * 4, None));
        let seqs: Vec<u32> = drain(&mut h, 0).iter().map(|p| header(p).seq).collect();
        assert_eq!(seqs, vec![u32::MAX - 1, u32::MAX, 0, 1]);
        for s in [1, 0, u32::MAX, u32::MAX - 1] {
            h.handle_packet(1, result(2, 0, s, None));
        }
        assert!(done(&mut h).is_some());
    }

    #[test]
    fn bad_configurations_and_requests() {
        assert!(StaticTreeHost::new(cfg(0, 1, 4), 0).is_err());
        assert!(StaticTreeHost::new(cfg(2, 0, 4), 0).is_err());
        assert!(StaticTreeHost::new(cfg(2, 1, 0), 0).is_err());
        assert!(StaticTreeHost::new(cfg(2, 1, 4), 2).is_err());
        let mut h = StaticTreeHost::new(cfg(1, 1, 4), 0).unwrap();
        h.submit(0, AppRequest::allreduce(1, 8, Some(Payload::F32(vec![1.0, 2.0]))));
        assert!(matches!(h.poll_event(), Some(HostEvent::Rejected { .. })));
        h.submit(0, AppRequest::allreduce(2, 0, None));
        assert!(matches!(h.poll_event(), Some(HostEvent::Done { id: 2, .. })));
    }
}
