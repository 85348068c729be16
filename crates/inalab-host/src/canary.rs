//! Canary's host (De Sensi et al. §3.1.4, §3.3; `../shared/specs/canary.md` §1.1, §1.7-1.10).
//! Every host is a sender for most blocks and the leader of one block in N (block b is led
//! by rank b mod N). A sender sends each block it does not lead to the block's leader, in
//! one packet, and waits for the block's Result. The leader adds the sums the network hands
//! it to its own data; once every other host is counted it sends one Result down the tree the
//! switches recorded, and a Restore to each switch that reported a collision.
//!
//! Loss: a sender whose Result is late asks the leader (RtxReq). Late means the retransmission
//! timeout: RFC 6298's smoothed RTT plus four deviations, measured on blocks answered at their
//! first send, never below `rtx_timeout_ps`, doubled per expiry of the same block (at most
//! 64 times, `inalab_core::backed_off`, and never beyond the RTO's ceiling of 1000
//! `rtx_timeout_ps`). A fixed timeout re-issued every block of a 4 MiB
//! window on a 100 Mbps path, where the window alone queues for hundreds of ms, and never finished. A leader that has the sum
//! sends it again; one that has not re-issues the block under its next attempt (Fail to every
//! host, which re-send it with the new id), and after `max_attempts` re-issues the hosts send
//! the block to the leader unaggregated (Fallback), which sums it by source. A leader that
//! cannot serve a request yet (it has not reached the block, waits for its own tensor before a
//! barrier, or has this host's fallback data and waits for another's) answers with the
//! block's current attempt: "wait". Only a leader that answers nothing to [`MAX_UNANSWERED`]
//! requests in a row is declared failed; before, a leader seconds behind its peers was.
//!
//! Completion (§3.3): a leader keeps the sums it led until every host has them. Each tensor
//! ends with one more block, its completion barrier: a one-value block every host contributes
//! once it has the whole tensor, reduced and recovered like any other. Its Result tells every
//! host that no peer can ask for the tensor's blocks again, and the leaders free them. The
//! paper has large reductions "always explicitly notify the completion" (a barrier is its
//! example); without it a host kept up to [`KEEP_LED_BLOCKS`] led sums, 1.4 GiB per host of a
//! 2-host job (#36).

use crate::{ConfigError, RttConfig, RttEstimator};
use inalab_core::wire::{CanaryHeader, CanaryType, Header};
use inalab_core::{AppRequest, Endpoint, HostEvent, HostProtocol, NodeId, Packet, Payload, Time, TimerTable, backed_off};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// Values per packet (§5.1: 256 x 4 B in the simulations).
pub const CANARY_BLOCK_VALUES: usize = 256;
/// Size of a packet without values (requests, Fail): a minimum frame.
const CONTROL_BYTES: u32 = 64;
/// A leader keeps a block it led (to answer late requests) until the tensor's completion
/// barrier, and never beyond this many blocks of the job: half the 22-bit sequence space, so a
/// request never meets an older block's entry. Only a barrier's own sum (one value) and the
/// blocks of a tensor whose barrier has not completed live that long.
const KEEP_LED_BLOCKS: u64 = 1 << 21;
/// Contributions for blocks this host will lead but has not reached yet, kept at most.
const EARLY_MAX: usize = 1 << 16;
/// A block whose leader has left this many requests in a row unanswered (about 190 RTOs with
/// the back-off) declares the leader failed: Canary does not recover a failed leader (§3.3,
/// spec case 15), so every pending allreduce of this host fails with the reason.
pub const MAX_UNANSWERED: u32 = 8;
/// A block whose leader answered "wait" (it cannot serve the block yet) this many times stops
/// counting the answers: the leader is then no longer believed alive for it, and
/// [`MAX_UNANSWERED`] more expiries declare it failed. About a minute at the back-off's cap of
/// 64 RTOs: a leader may lag its peers by seconds, but a host whose contribution never comes
/// (cut off, yet not reported failed by the driver) must not keep its peers for ever.
pub const MAX_WAITS: u32 = 1024;
/// The RTO never exceeds this many `rtx_timeout_ps` (1 s at the default 1 ms).
const MAX_RTO_FACTOR: u64 = 1000;

#[derive(Debug, Clone, PartialEq)]
pub struct CanaryConfig {
    /// The tenant prefix of the job's block ids.
    pub tenant: u8,
    /// Every host of the job, by rank (all on the same protocol port).
    pub workers: Vec<Endpoint>,
    /// Each rank's top-of-rack switch: where a leader sends its Result.
    pub tors: Vec<NodeId>,
    /// Bytes on the wire besides the values (§5.1: 19 B header + 14 B Ethernet + 24 B framing).
    pub header_bytes: u32,
    /// The least and the first retransmission timeout, ps: a sender asks the leader when a
    /// block's Result is later than the measured RTO, which never drops below this (§6: 2 RTT).
    pub rtx_timeout_ps: Time,
    /// Re-issues of a block before the hosts fall back to reducing it through its leader.
    pub max_attempts: u8,
    /// Blocks a sender has in flight at most (spec A8).
    pub window_blocks: u32,
    /// Rank 0 leads every block (an ablation the paper lacks, spec §3.3) instead of rank
    /// b mod N leading block b.
    pub single_leader: bool,
}

impl CanaryConfig {
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.workers.len() < 2 || self.workers.len() > u16::MAX as usize {
            return Err(ConfigError(format!("{} workers; Canary needs 2..=65535", self.workers.len())));
        }
        if self.tors.len() != self.workers.len() {
            return Err(ConfigError("one top-of-rack switch per worker".into()));
        }
        if self.max_attempts > 3 {
            return Err(ConfigError(format!("max_attempts {} does not fit the id's 2-bit attempt (0..=3)", self.max_attempts)));
        }
        if self.window_blocks == 0 || self.rtx_timeout_ps == 0 {
            return Err(ConfigError("window_blocks and rtx_timeout_ps must be positive".into()));
        }
        Ok(())
    }
}

struct Tensor {
    id: u64,
    values: usize,
    first_block: u64,
    /// Data blocks; the completion barrier is block `first_block + blocks`.
    blocks: u64,
    /// Payload mode (values travel), so the barrier carries its one value too.
    payload: bool,
    /// Data blocks without their sum yet here.
    left: u64,
    data: Option<Vec<i32>>,
    result: Option<Vec<i32>>,
}

/// A block this host sends (it does not lead it).
struct Sending {
    tensor: usize,
    attempt: u8,
    fallback: bool,
    /// When the block (this attempt) was sent; its Result is an RTT sample only if it was
    /// sent once and never asked for (Karn's rule).
    sent_at: Time,
    /// Expiries of this attempt: the back-off's exponent.
    expiries: u32,
    /// Expiries in a row with no answer from the leader ([`MAX_UNANSWERED`] declare it failed).
    unanswered: u32,
    /// "Wait" answers the leader gave ([`MAX_WAITS`]).
    waits: u32,
    /// A completion barrier this host may not send yet: its tensor is not done here.
    held: bool,
}

/// A block this host leads.
struct Leading {
    tensor: usize,
    attempt: u8,
    acc: Option<Vec<i32>>,
    count: u32,
    /// Collisions reported on the way: (switch, ingress port) whose subtree needs a Restore.
    restore: BTreeSet<(u16, u32)>,
    /// Fallback: the ranks whose data is in.
    fallback: Option<Vec<bool>>,
    done: bool,
    /// This host's own contribution is in: always for a data block, and for a completion
    /// barrier once the tensor is done here.
    own_in: bool,
}

#[derive(Default)]
struct Counters {
    sent: u64,
    results: u64,
    duplicates: u64,
    rtx_requests: u64,
    resent_results: u64,
    fails_sent: u64,
    reissues: u64,
    fallback_blocks: u64,
    restorations: u64,
    stale: u64,
    malformed: u64,
    early: u64,
    early_dropped: u64,
    leader_failures: u64,
    /// Requests, re-issues, fallbacks and resent Results for completion barriers: counted
    /// apart, since a barrier waits for the slowest host to have the tensor (and the job's
    /// last one runs after the job released the switches), so its repairs are not losses of
    /// the allreduce.
    barrier_repairs: u64,
    /// First timeouts put off because Results kept coming (the window was draining).
    deferred: u64,
}

enum Repair {
    Request,
    Reissue,
    Fallback,
    Resend,
}

impl Counters {
    fn repair(&mut self, barrier: bool, kind: Repair) -> &mut u64 {
        match (barrier, kind) {
            (true, _) => &mut self.barrier_repairs,
            (false, Repair::Request) => &mut self.rtx_requests,
            (false, Repair::Reissue) => &mut self.reissues,
            (false, Repair::Fallback) => &mut self.fallback_blocks,
            (false, Repair::Resend) => &mut self.resent_results,
        }
    }
}

pub struct CanaryHost {
    cfg: CanaryConfig,
    rank: usize,
    me: Endpoint,
    tensors: Vec<Tensor>,
    next_block: u64,
    /// By sequence number (block mod 2^22): blocks in flight are far fewer. Hash maps (point
    /// lookups only; nothing depends on their order) with a fixed hash, so runs stay
    /// deterministic: the ordered maps these were cost 9 % of a 1024-host Canary point (#39).
    sending: SeqMap<(u64, Sending)>,
    leading: SeqMap<(u64, Leading)>,
    /// The led data blocks in the order they were submitted, to forget the oldest.
    led_order: VecDeque<(u64, u32)>,
    /// The led completion barriers, oldest first: kept to [`KEEP_LED_BLOCKS`], as no later
    /// event says every host has their Result.
    led_barriers: VecDeque<(u64, u32)>,
    /// Contributions that arrived before this host submitted the tensor of a block it leads
    /// (its peers run ahead of it): replayed at the submission.
    early: Vec<Packet>,
    unsent: VecDeque<u32>,
    in_flight: u32,
    /// When the last Result for a block this host sent arrived (progress: see
    /// `handle_timeout`).
    last_result: Time,
    /// When each block in flight times out (none: queued, not yet (re)sent).
    deadlines: TimerTable<u32>,
    urgent: VecDeque<Packet>,
    events: VecDeque<HostEvent>,
    rtt: RttEstimator,
    /// This host declared a leader failed: it tells no peer to wait for it any more.
    gave_up: bool,
    c: Counters,
}

/// A map keyed by a block's sequence number, hashed by one multiplication (Fibonacci hashing:
/// consecutive sequence numbers spread over the buckets), with no per-process random state.
type SeqMap<V> = HashMap<u32, V, BuildHasherDefault<SeqHasher>>;

#[derive(Default)]
struct SeqHasher(u64);

impl Hasher for SeqHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, x: u32) {
        self.0 = (x as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

fn seq_of(block: u64) -> u32 {
    (block & ((1 << CanaryHeader::SEQ_BITS) - 1)) as u32
}

impl CanaryHost {
    pub fn new(cfg: CanaryConfig, rank: usize) -> Result<Self, ConfigError> {
        cfg.check()?;
        let cfg_rto = cfg.rtx_timeout_ps;
        let me = *cfg.workers.get(rank).ok_or_else(|| ConfigError(format!("rank {rank} is not in 0..{}", cfg.workers.len())))?;
        Ok(CanaryHost {
            cfg,
            rank,
            me,
            tensors: vec![],
            next_block: 0,
            sending: SeqMap::default(),
            leading: SeqMap::default(),
            led_order: VecDeque::new(),
            led_barriers: VecDeque::new(),
            early: vec![],
            unsent: VecDeque::new(),
            in_flight: 0,
            last_result: 0,
            deadlines: TimerTable::new(),
            urgent: VecDeque::new(),
            events: VecDeque::new(),
            rtt: RttEstimator::new(RttConfig {
                initial_rto_ps: cfg_rto,
                min_rto_ps: cfg_rto,
                max_rto_ps: cfg_rto.saturating_mul(MAX_RTO_FACTOR),
                granularity_ps: inalab_core::time::US.min(cfg_rto),
            }),
            gave_up: false,
            c: Counters::default(),
        })
    }

    fn n(&self) -> usize {
        self.cfg.workers.len()
    }

    /// Input values the host keeps (its tensors not done yet).
    pub fn retained_inputs(&self) -> usize {
        self.tensors.iter().filter_map(|t| t.data.as_ref()).map(Vec::len).sum()
    }

    fn leader_of(&self, block: u64) -> usize {
        if self.cfg.single_leader {
            return 0;
        }
        (block % self.n() as u64) as usize
    }

    fn is_barrier(&self, tensor: usize, block: u64) -> bool {
        let t = &self.tensors[tensor];
        block == t.first_block + t.blocks
    }

    /// Values [start, end) of `block` in its tensor; a barrier carries one value of its own.
    fn span(&self, tensor: usize, block: u64) -> (usize, usize) {
        if self.is_barrier(tensor, block) {
            return (0, 1);
        }
        let t = &self.tensors[tensor];
        let start = ((block - t.first_block) as usize) * CANARY_BLOCK_VALUES;
        (start, (start + CANARY_BLOCK_VALUES).min(t.values))
    }

    fn data(&self, tensor: usize, block: u64) -> Option<Vec<i32>> {
        if self.is_barrier(tensor, block) {
            return self.tensors[tensor].payload.then(|| vec![0]);
        }
        let (s, e) = self.span(tensor, block);
        self.tensors[tensor].data.as_ref().map(|d| d[s..e].to_vec())
    }

    /// Led data blocks of which this host keeps the sum.
    pub fn led_sums_kept(&self) -> usize {
        self.leading.values().filter(|(b, l)| l.done && !self.is_barrier(l.tensor, *b)).count()
    }

    fn header(&self, block: u64, attempt: u8, kind: CanaryType, dst: NodeId) -> CanaryHeader {
        let hosts = (self.n() - 1) as u16;
        CanaryHeader { dst, id: CanaryHeader::make_id(self.cfg.tenant, attempt, seq_of(block)), counter: 0, hosts, kind, ..Default::default() }
    }

    fn packet(&self, to: Endpoint, h: CanaryHeader, values: Option<Vec<i32>>, count: usize) -> Packet {
        let size = if values.is_some() || matches!(h.kind, CanaryType::Reduce | CanaryType::Result | CanaryType::Restore) || (h.kind == CanaryType::Fallback && h.counter == 1) {
            self.cfg.header_bytes + 4 * count as u32
        } else {
            CONTROL_BYTES
        };
        let mut p = Packet::new(self.me.host, self.me.port, to.host, to.port, size, Header::Canary(h));
        p.payload = values.map(|v| Box::new(Payload::I32(v)));
        p
    }

    /// The block's values as this host sends them (`Reduce` or `Fallback`).
    fn contribution(&self, block: u64, s: &Sending) -> Packet {
        let leader = self.cfg.workers[self.leader_of(block)];
        let kind = if s.fallback { CanaryType::Fallback } else { CanaryType::Reduce };
        let mut h = self.header(block, s.attempt, kind, leader.host);
        h.counter = 1;
        h.bypass = s.fallback;
        let (st, e) = self.span(s.tensor, block);
        self.packet(leader, h, self.data(s.tensor, block), e - st)
    }

    /// A block's timeout after `expiries` expiries of it: the RTO (which the estimator already
    /// backs off once per window that expired, RFC 6298 5.5) doubled per expiry of the block,
    /// never beyond the RTO's own ceiling. The two back-offs compound: uncapped, a block whose
    /// requests expired a few times under load waited 32-64 s for its next request, past a
    /// caller's 30 s timeout, while its leader was there to answer.
    fn block_timeout(&self, expiries: u32) -> Time {
        backed_off(self.rtt.rto(), expiries).min(self.cfg.rtx_timeout_ps.saturating_mul(MAX_RTO_FACTOR))
    }

    fn arm(&mut self, seq: u32, at: Time) {
        if self.sending.contains_key(&seq) {
            self.deadlines.set(seq, at);
        }
    }

    /// A block this host sends is complete with `values`.
    fn sent_block_done(&mut self, now: Time, seq: u32, values: Option<&[i32]>) {
        let Some((block, s)) = self.sending.remove(&seq) else {
            self.c.duplicates += 1;
            return;
        };
        let armed = self.deadlines.cancel(seq).is_some();
        if s.attempt == 0 && s.expiries == 0 && !s.fallback && armed {
            self.rtt.sample(now.saturating_sub(s.sent_at));
        }
        self.last_result = now;
        if armed {
            self.in_flight -= 1;
        } else {
            self.unsent.retain(|&q| q != seq);
        }
        self.block_done(s.tensor, block, values);
    }

    fn block_done(&mut self, tensor: usize, block: u64, values: Option<&[i32]>) {
        if self.is_barrier(tensor, block) {
            return self.barrier_done(tensor);
        }
        let (s, e) = self.span(tensor, block);
        let t = &mut self.tensors[tensor];
        if let (Some(r), Some(v)) = (&mut t.result, values) {
            if v.len() == e - s {
                r[s..e].copy_from_slice(v);
            }
        }
        t.left -= 1;
        if t.left == 0 {
            // Every block of it is done here, sent and led: its own values are not sent again
            // (a re-issue is for a block without its sum). Kept, they grew a host by the
            // tensor per allreduce (#36).
            t.data = None;
            let data = t.result.take().map(Payload::I32);
            let barrier = t.first_block + t.blocks;
            self.events.push_back(HostEvent::Done { id: t.id, data });
            self.release_barrier(barrier);
        }
    }

    /// The tensor is done here: this host's part of its completion barrier goes out.
    fn release_barrier(&mut self, barrier: u64) {
        let seq = seq_of(barrier);
        if let Some((_, s)) = self.sending.get_mut(&seq).filter(|(b, _)| *b == barrier) {
            if std::mem::take(&mut s.held) {
                self.unsent.push_back(seq);
            }
        } else if let Some((_, l)) = self.leading.get_mut(&seq).filter(|(b, _)| *b == barrier) {
            l.own_in = true;
            if !l.done && l.count == (self.n() - 1) as u32 {
                self.lead_done(seq);
            }
        }
    }

    /// Every host has the whole tensor: no one asks for its blocks again, so the sums this
    /// host led are freed.
    fn barrier_done(&mut self, tensor: usize) {
        let (first, blocks) = (self.tensors[tensor].first_block, self.tensors[tensor].blocks);
        for block in first..first + blocks {
            if self.leader_of(block) == self.rank {
                let seq = seq_of(block);
                if self.leading.get(&seq).is_some_and(|l| l.0 == block) {
                    self.leading.remove(&seq);
                }
            }
        }
        while self.led_order.front().is_some_and(|&(b, seq)| self.leading.get(&seq).map_or(true, |l| l.0 != b)) {
            self.led_order.pop_front();
        }
    }

    /// The leader has every contribution of `seq`: Result down the tree, Restores to the
    /// collided subtrees (or, after a fallback, the sum to every host directly).
    fn lead_done(&mut self, seq: u32) {
        let (block, l) = self.leading.get_mut(&seq).expect("leading");
        l.done = true;
        let (block, tensor, attempt, fallback) = (*block, l.tensor, l.attempt, l.fallback.is_some());
        let acc = l.acc.clone();
        let restore: Vec<(u16, u32)> = l.restore.iter().copied().collect();
        let (s, e) = self.span(tensor, block);
        let mut h = self.header(block, attempt, CanaryType::Result, self.cfg.tors[self.rank]);
        h.counter = h.hosts;
        if fallback {
            h.bypass = true;
            for r in (0..self.n()).filter(|&r| r != self.rank) {
                let to = self.cfg.workers[r];
                self.urgent.push_back(self.packet(to, CanaryHeader { dst: to.host, ..h }, acc.clone(), e - s));
            }
        } else {
            h.multicast = true;
            let tor = Endpoint { host: self.cfg.tors[self.rank], port: self.me.port };
            self.urgent.push_back(self.packet(tor, h, acc.clone(), e - s));
            // One Restore per switch and 32-port shard (spec A9).
            let mut shards: BTreeMap<(u16, u8), u32> = BTreeMap::new();
            // A port beyond the header's 4 shards of 32 cannot be named: its hosts recover by
            // asking (RtxReq), as after a loss.
            for (sw, port) in restore.into_iter().filter(|&(_, p)| p < 32 * CanaryHeader::SHARDS as u32) {
                *shards.entry((sw, (port / 32) as u8)).or_default() |= 1 << (port % 32);
            }
            for ((sw, shard), children) in shards {
                self.c.restorations += 1;
                let to = Endpoint { host: sw as NodeId, port: self.me.port };
                let r = CanaryHeader { dst: sw as u32, kind: CanaryType::Restore, bypass: true, multicast: true, children, shard, ..h };
                self.urgent.push_back(self.packet(to, r, acc.clone(), e - s));
            }
        }
        self.block_done(tensor, block, acc.as_deref());
    }

    fn on_contribution(&mut self, h: CanaryHeader, pkt: &Packet) {
        let seq = h.seq();
        let from = self.cfg.workers.iter().position(|w| w.host == pkt.src && w.port == pkt.src_port);
        let n = self.n();
        let Some((_, l)) = self.leading.get_mut(&seq) else {
            self.c.stale += 1;
            return;
        };
        if l.done && h.kind == CanaryType::Fallback {
            // A fallback sender whose result was lost resends its data: answer with the sum.
            if let Some(r) = from {
                self.resend_result(seq, r);
            }
            return;
        }
        if l.done || h.attempt() != l.attempt || h.kind == CanaryType::Fallback && l.fallback.is_none() {
            self.c.stale += 1;
            return;
        }
        let values = match pkt.payload.as_deref() {
            Some(Payload::I32(v)) => Some(v.as_slice()),
            _ => None,
        };
        let fits = match (&l.acc, values) {
            (Some(acc), Some(v)) => acc.len() == v.len(),
            (None, None) => true,
            _ => false,
        };
        if !fits || h.counter == 0 || l.count + h.counter as u32 > (n - 1) as u32 {
            self.c.malformed += 1;
            return;
        }
        if let Some(seen) = &mut l.fallback {
            // Unaggregated: one per host, by source.
            match from {
                Some(r) if !seen[r] && h.counter == 1 => seen[r] = true,
                Some(r) if seen[r] => {
                    // Its data again (its timer expired while another host's is missing):
                    // tell it to wait on.
                    self.c.stale += 1;
                    return self.send_fail(seq, r);
                }
                _ => {
                    self.c.stale += 1;
                    return;
                }
            }
        } else if h.bypass {
            l.restore.insert((h.switch, h.children));
        }
        if let (Some(acc), Some(v)) = (&mut l.acc, values) {
            // Sticky saturation, as at the switches (inalab_core::rail): a sum beyond the
            // range stays at a rail, and every worker fails the call on it.
            inalab_core::rail::sticky_add(acc, v);
        }
        l.count += h.counter as u32;
        if l.count == (n - 1) as u32 && l.own_in {
            self.lead_done(seq);
        }
    }

    fn on_rtx_request(&mut self, h: CanaryHeader, pkt: &Packet) {
        let seq = h.seq();
        let Some(r) = self.cfg.workers.iter().position(|w| w.host == pkt.src && w.port == pkt.src_port) else {
            self.c.malformed += 1;
            return;
        };
        let Some((block, l)) = self.leading.get_mut(&seq) else {
            self.c.stale += 1;
            if !self.gave_up && self.leads_later(seq) {
                // A peer ahead of this leader: its attempt stands (this leader has not started
                // the block), and the answer tells it to wait rather than count the leader
                // failed while it catches up.
                let to = self.cfg.workers[r];
                self.push_fail(to, CanaryHeader { dst: to.host, kind: CanaryType::Fail, ..h });
            }
            return;
        };
        let block = *block;
        if l.done {
            // The loss was in the broadcast: the sum again, to that host.
            return self.resend_result(seq, r);
        }
        if !l.own_in {
            // A barrier whose tensor this leader has not finished: the wait is for this host,
            // not a loss. Re-issuing would only make every host send it again; the current
            // attempt tells the requester to wait on.
            self.c.stale += 1;
            return self.send_fail(seq, r);
        }
        if h.attempt() == l.attempt && l.fallback.is_none() {
            // The loss was in the reduction: re-issue the block (or fall back) for everyone.
            let tensor = l.tensor;
            let (own, barrier) = (self.data(tensor, block), self.is_barrier(tensor, block));
            let l = &mut self.leading.get_mut(&seq).expect("leading").1;
            l.acc = own;
            l.count = 0;
            l.restore.clear();
            if l.attempt < self.cfg.max_attempts {
                l.attempt += 1;
            } else {
                l.fallback = Some(vec![false; self.cfg.workers.len()]);
            }
            let fell_back = l.fallback.is_some();
            *self.c.repair(barrier, if fell_back { Repair::Fallback } else { Repair::Reissue }) += 1;
            for r in 0..self.n() {
                if r != self.rank {
                    self.send_fail(seq, r);
                }
            }
        } else {
            self.send_fail(seq, r);
        }
    }

    /// Whether `seq` is a block this host will lead once it submits its tensor.
    fn leads_later(&self, seq: u32) -> bool {
        if self.leading.contains_key(&seq) {
            return false;
        }
        let ahead = seq.wrapping_sub(seq_of(self.next_block)) & ((1 << CanaryHeader::SEQ_BITS) - 1);
        // More than half the sequence space ahead is behind: an old block's late packet (with a
        // power-of-two number of hosts it would map onto a block this host leads again).
        (ahead as u64) < KEEP_LED_BLOCKS && self.leader_of(self.next_block + ahead as u64) == self.rank
    }

    /// The sum of a finished block, unicast to rank `r` (its copy was lost).
    fn resend_result(&mut self, seq: u32, r: usize) {
        let (block, l) = &self.leading[&seq];
        let (block, tensor, attempt, acc) = (*block, l.tensor, l.attempt, l.acc.clone());
        *self.c.repair(self.is_barrier(tensor, block), Repair::Resend) += 1;
        let to = self.cfg.workers[r];
        let (s, e) = self.span(tensor, block);
        let mut h = self.header(block, attempt, CanaryType::Result, to.host);
        h.counter = h.hosts;
        h.bypass = true;
        self.urgent.push_back(self.packet(to, h, acc, e - s));
    }

    /// The leader of `block` does not answer: fail every pending allreduce and stop.
    fn leader_failed(&mut self, block: u64) {
        let r = self.leader_of(block);
        let reason = format!(
            "Canary: rank {r} (node {}), the leader of block {block}, left {MAX_UNANSWERED} requests unanswered: it failed, or this host is cut off; a failed leader is not recovered (Canary §3.3)",
            self.cfg.workers[r].host
        );
        self.c.leader_failures += 1;
        self.gave_up = true;
        for t in self.tensors.iter_mut().filter(|t| t.left > 0) {
            t.left = 0;
            self.events.push_back(HostEvent::Failed { id: t.id, reason: reason.clone() });
        }
        self.sending.clear();
        self.leading.clear();
        self.led_order.clear();
        self.led_barriers.clear();
        self.unsent.clear();
        self.deadlines.clear();
        self.urgent.clear();
        self.in_flight = 0;
    }

    /// Tells rank `r` the block's current attempt (or that it falls back).
    fn send_fail(&mut self, seq: u32, r: usize) {
        let (block, l) = &self.leading[&seq];
        let kind = if l.fallback.is_some() { CanaryType::Fallback } else { CanaryType::Fail };
        let to = self.cfg.workers[r];
        let h = self.header(*block, l.attempt, kind, to.host);
        self.push_fail(to, h);
    }

    /// Sends a Fail or Fallback `h` to `to` ahead of the data, past the switches' aggregation.
    fn push_fail(&mut self, to: Endpoint, mut h: CanaryHeader) {
        h.bypass = true;
        self.c.fails_sent += 1;
        self.urgent.push_back(self.packet(to, h, None, 0));
    }

    /// A leader's Fail (re-issue under the next attempt) or Fallback request.
    fn on_fail(&mut self, h: CanaryHeader) {
        let seq = h.seq();
        let Some((_, s)) = self.sending.get_mut(&seq) else {
            self.c.stale += 1;
            return;
        };
        let fallback = h.kind == CanaryType::Fallback;
        if h.attempt() < s.attempt || h.attempt() == s.attempt && (fallback <= s.fallback) {
            // Nothing new, but the leader is there: it answers requests it cannot serve yet
            // (it waits for another host, or has not reached the block) with the current
            // attempt. Its silence so far was waiting, not failure; the back-off goes on.
            if h.attempt() == s.attempt && s.waits < MAX_WAITS {
                s.waits += 1;
                s.unanswered = 0;
            }
            self.c.stale += 1;
            return;
        }
        s.attempt = h.attempt();
        s.fallback = fallback;
        // The leader answered: its silence so far was loss, not failure.
        s.expiries = 0;
        s.unanswered = 0;
        if s.held {
            // A barrier re-issued before this host has the tensor: it goes out, under the
            // new attempt, once the tensor is done here.
            return;
        }
        // Re-send at the head of the queue (spec §1.10 item 3).
        if self.deadlines.cancel(seq).is_some() {
            self.in_flight -= 1;
        } else {
            self.unsent.retain(|&q| q != seq);
        }
        self.unsent.push_front(seq);
    }
}

impl HostProtocol for CanaryHost {
    fn endpoint(&self) -> Endpoint {
        self.me
    }

    fn submit(&mut self, now: Time, req: AppRequest) {
        let AppRequest::Allreduce { id, bytes, data, .. } = req else {
            return self.events.push_back(HostEvent::Rejected { id: 0, reason: "Canary hosts only allreduce".into() });
        };
        let data = match data {
            None => None,
            Some(Payload::I32(v)) => Some(v),
            Some(_) => return self.events.push_back(HostEvent::Rejected { id, reason: "Canary switches sum int32 values".into() }),
        };
        let values = data.as_ref().map_or((bytes / 4) as usize, Vec::len);
        if values == 0 {
            return self.events.push_back(HostEvent::Done { id, data: data.map(Payload::I32) });
        }
        let blocks = values.div_ceil(CANARY_BLOCK_VALUES) as u64;
        let tensor = self.tensors.len();
        let first_block = self.next_block;
        // The data blocks, then the completion barrier: every host numbers both alike.
        self.next_block += blocks + 1;
        let payload = data.is_some();
        self.tensors.push(Tensor { id, values, first_block, blocks, payload, left: blocks, result: data.clone(), data });
        for order in [&mut self.led_order, &mut self.led_barriers] {
            while order.front().is_some_and(|&(b, _)| b + KEEP_LED_BLOCKS < self.next_block) {
                let (b, seq) = order.pop_front().expect("checked");
                if self.leading.get(&seq).is_some_and(|l| l.0 == b) {
                    self.leading.remove(&seq);
                }
            }
        }
        for block in first_block..=first_block + blocks {
            let seq = seq_of(block);
            let barrier = block == first_block + blocks;
            if self.leader_of(block) == self.rank {
                let acc = self.data(tensor, block);
                let l = Leading { tensor, attempt: 0, acc, count: 0, restore: BTreeSet::new(), fallback: None, done: false, own_in: !barrier };
                self.leading.insert(seq, (block, l));
                if barrier { &mut self.led_barriers } else { &mut self.led_order }.push_back((block, seq));
            } else {
                self.sending.insert(seq, (block, Sending { tensor, attempt: 0, fallback: false, sent_at: 0, expiries: 0, unanswered: 0, waits: 0, held: barrier }));
                if !barrier {
                    self.unsent.push_back(seq);
                }
            }
        }
        for pkt in std::mem::take(&mut self.early) {
            self.handle_packet(now, pkt);
        }
    }


    fn handle_packet(&mut self, now: Time, pkt: Packet) {
        let Header::Canary(h) = pkt.header else { return };
        if h.tenant() != self.cfg.tenant {
            return;
        }
        if h.kind == CanaryType::Reduce && self.leads_later(h.seq()) {
            // A peer is ahead of this leader: keep its contribution for the submission.
            if self.early.len() < EARLY_MAX {
                self.c.early += 1;
                self.early.push(pkt);
            } else {
                self.c.early_dropped += 1;
            }
            return;
        }
        match h.kind {
            CanaryType::Result => {
                let Some((_, s)) = self.sending.get(&h.seq()) else {
                    self.c.duplicates += 1;
                    return;
                };
                if h.attempt() != s.attempt {
                    self.c.stale += 1;
                    return;
                }
                let values = match pkt.payload.as_deref() {
                    Some(Payload::I32(v)) => Some(v.as_slice()),
                    _ => None,
                };
                self.c.results += 1;
                self.sent_block_done(now, h.seq(), values);
            }
            CanaryType::Reduce if self.leading.contains_key(&h.seq()) => self.on_contribution(h, &pkt),
            CanaryType::Fallback if h.counter == 1 => self.on_contribution(h, &pkt),
            CanaryType::Fallback | CanaryType::Fail => self.on_fail(h),
            CanaryType::RtxReq => self.on_rtx_request(h, &pkt),
            _ => self.c.malformed += 1,
        }
    }

    fn handle_timeout(&mut self, now: Time) {
        while let Some(seq) = self.deadlines.pop_expired(now) {
            let Some((block, s)) = self.sending.get(&seq) else { continue };
            let (block, attempt) = (*block, s.attempt);
            // A block's first timeout covers the window it was sent in: while Results for
            // this host's blocks keep coming (one within an RTO, after this one was sent), the
            // path is draining the window, not losing it, and the timer restarts from the
            // latest Result (RFC 6298 5.3). A window of 4096 blocks to one leader drains for
            // 2.7 ms on 64 hosts; with the 1 ms first timeout every block re-issued itself and
            // the run never ended (issue #40).
            let resume = self.last_result.saturating_add(self.rtt.rto());
            if s.expiries == 0 && !s.fallback && self.last_result > s.sent_at && resume > now {
                self.deadlines.set(seq, resume);
                self.c.deferred += 1;
                continue;
            }
            if s.unanswered >= MAX_UNANSWERED {
                return self.leader_failed(block);
            }
            let p = if s.fallback {
                // Fallback data goes straight to the leader: resend it.
                self.contribution(block, s)
            } else {
                *self.c.repair(self.is_barrier(s.tensor, block), Repair::Request) += 1;
                let leader = self.cfg.workers[self.leader_of(block)];
                let mut h = self.header(block, attempt, CanaryType::RtxReq, leader.host);
                h.bypass = true;
                self.packet(leader, h, None, 0)
            };
            self.urgent.push_back(p);
            // Karn: no sample comes from a block that expired, so an RTO below the path's RTT
            // would never learn it; it backs off instead (RFC 6298 5.5), until a sample.
            self.rtt.on_timeout_of(self.sending[&seq].1.sent_at, now);
            let s = &mut self.sending.get_mut(&seq).expect("present").1;
            s.expiries += 1;
            s.unanswered += 1;
            let expiries = s.expiries;
            let at = now + self.block_timeout(expiries);
            self.deadlines.set(seq, at);
        }
    }

    fn poll_transmit(&mut self, now: Time) -> Option<Packet> {
        if let Some(p) = self.urgent.pop_front() {
            return Some(p);
        }
        if self.in_flight >= self.cfg.window_blocks {
            return None;
        }
        let seq = self.unsent.pop_front()?;
        let (block, s) = &self.sending[&seq];
        let p = self.contribution(*block, s);
        let at = now + self.block_timeout(s.expiries);
        self.in_flight += 1;
        self.c.sent += 1;
        if let Some((_, s)) = self.sending.get_mut(&seq) {
            s.sent_at = now;
        }
        self.arm(seq, at);
        Some(p)
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
            ("early_contributions", c.early),
            ("early_dropped", c.early_dropped),
            ("results", c.results),
            ("duplicate_results", c.duplicates),
            ("rtx_requests", c.rtx_requests),
            ("timeouts_deferred", c.deferred),
            ("resent_results", c.resent_results),
            ("fails_sent", c.fails_sent),
            ("reissues", c.reissues),
            ("fallback_blocks", c.fallback_blocks),
            ("leader_failures", c.leader_failures),
            ("barrier_repairs", c.barrier_repairs),
            ("restorations", c.restorations),
            ("stale", c.stale),
            ("malformed", c.malformed),
            ("blocks_pending", (self.sending.len() + self.leading.values().filter(|l| !l.1.done).count()) as u64),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_hosts() -> Vec<CanaryHost> {
        let ep = |h| Endpoint { host: h, port: 5 };
        let cfg = CanaryConfig {
            tenant: 1,
            workers: vec![ep(0), ep(1)],
            tors: vec![10, 10],
            header_bytes: 57,
            rtx_timeout_ps: 1_000_000,
            max_attempts: 3,
            window_blocks: 64,
            single_leader: false,
        };
        (0..2).map(|r| CanaryHost::new(cfg.clone(), r).unwrap()).collect()
    }

    /// Delivers packets between the two hosts until none is left, firing timers when the
    /// network is quiet; `drop` loses a packet. Returns the time reached.
    fn exchange(hosts: &mut [CanaryHost], mut now: Time, mut drop: impl FnMut(&Packet) -> bool) -> Time {
        for _ in 0..10_000 {
            let out: Vec<Packet> = hosts.iter_mut().flat_map(|h| std::iter::from_fn(move || h.poll_transmit(now))).collect();
            if out.is_empty() {
                let Some(at) = hosts.iter().filter_map(|h| h.poll_timeout()).min() else { return now };
                now = now.max(at);
                hosts.iter_mut().for_each(|h| h.handle_timeout(now));
                continue;
            }
            for mut p in out {
                if drop(&p) {
                    continue;
                }
                // To the ToR: its multicast copy reaches the host that did not send it.
                let to = if p.dst == 10 { 1 - p.src as usize } else { p.dst as usize };
                p.dst = to as NodeId;
                hosts[to].handle_packet(now, p);
            }
        }
        panic!("no quiet network after 10,000 rounds");
    }

    fn submit(h: &mut CanaryHost, now: Time, id: u64, rank: usize, values: usize) {
        h.submit(now, AppRequest::Allreduce { id, bytes: 0, data: Some(Payload::I32(vec![rank as i32 + 1; values])), attrs: Default::default() });
    }

    const VALUES: usize = 256 * 40 + 3;

    fn expect_done(h: &mut CanaryHost, id: u64) {
        match h.poll_event() {
            Some(HostEvent::Done { id: got, data: Some(Payload::I32(v)) }) => assert_eq!((got, v[0], v[VALUES - 1], v.len()), (id, 3, 3, VALUES)),
            e => panic!("allreduce {id}: {e:?}"),
        }
    }

    #[test]
    fn a_host_frees_its_inputs_and_led_sums_once_a_tensor_is_done_everywhere() {
        // Measured with benchmarks/memory_slope.py (#36): a host kept every tensor's own values
        // for the job, 4 MiB per allreduce of 1 M values, and then every sum it led up to
        // KEEP_LED_BLOCKS (1.4 GiB per host). Two hosts, each leading every other block.
        let mut hosts = two_hosts();
        let mut now = 0;
        for k in 0..50u64 {
            for (r, h) in hosts.iter_mut().enumerate() {
                submit(h, now, k, r, VALUES);
            }
            now = exchange(&mut hosts, now, |_| false);
            for h in &mut hosts {
                expect_done(h, k);
                assert_eq!(h.retained_inputs(), 0, "allreduce {k}");
                assert_eq!(h.led_sums_kept(), 0, "allreduce {k}: the completion barrier freed no led sum");
            }
        }
    }

    #[test]
    fn overlapping_tensors_and_lost_barriers_still_free_every_led_sum() {
        // Three tensors in flight at once (a layer-wise schedule), and the first two copies of
        // every barrier packet lost (contributions and Results alike): the barrier recovers as
        // any block does, and only then are the sums freed.
        let mut hosts = two_hosts();
        for k in 0..3u64 {
            for (r, h) in hosts.iter_mut().enumerate() {
                submit(h, 0, k, r, VALUES);
            }
        }
        let mut lost = 0;
        let one_value = |p: &Packet| matches!(p.payload.as_deref(), Some(Payload::I32(v)) if v.len() == 1);
        exchange(&mut hosts, 0, |p| {
            let drop = one_value(p) && lost < 2 * 3 * 2;
            lost += drop as usize;
            drop
        });
        assert!(lost > 0, "no barrier packet was sent");
        for h in &mut hosts {
            for k in 0..3 {
                expect_done(h, k);
            }
            assert_eq!(h.led_sums_kept(), 0);
            assert_eq!(h.poll_timeout(), None, "a barrier is still pending");
        }
    }

    #[test]
    fn a_barrier_waits_for_the_leaders_own_tensor() {
        // Host 1 leads the first tensor's barrier (block 41) but has not got host 0's led
        // block sums yet: host 0's barrier contribution alone must not complete it, and the
        // led sums stay until host 1 has the tensor.
        let mut hosts = two_hosts();
        for (r, h) in hosts.iter_mut().enumerate() {
            submit(h, 0, 0, r, VALUES);
        }
        // Host 0 leads blocks 0, 2, ...: lose every Result it sends, once.
        let mut dropped = std::collections::BTreeSet::new();
        exchange(&mut hosts, 0, |p| {
            matches!(p.header, Header::Canary(h) if h.kind == CanaryType::Result && p.src == 0 && p.payload.as_deref().is_some_and(|v| matches!(v, Payload::I32(v) if v.len() > 1)))
                && dropped.insert(match p.header { Header::Canary(h) => h.seq(), _ => 0 })
        });
        assert!(!dropped.is_empty());
        for h in &mut hosts {
            expect_done(h, 0);
            assert_eq!(h.led_sums_kept(), 0);
        }
        assert!(hosts[1].c.rtx_requests > 0, "host 1 recovered the lost Results by asking");
    }

    /// Three hosts, three allreduces each, through a network that loses `loss` of the packets
    /// and delays each by 1 to `spread` us (so reorders them), rank r pausing r x `drift` us
    /// after each allreduce. Without `mute`, every allreduce finishes with the exact sum, or the
    /// error says which did not. `mute`: a rank none of whose data (Reduce, Fallback) arrives,
    /// though it is there and answers; then the run ends once every host has failed or done
    /// each allreduce, and returns how many failed per host.
    fn lossy_reordering_run(seed: u64, loss: f64, spread: u64, drift: u64, mute: Option<usize>) -> Result<Vec<u64>, String> {
        let ep = |h| Endpoint { host: h, port: 5 };
        let n = 3usize;
        let cfg = CanaryConfig {
            tenant: 1,
            workers: (0..n as NodeId).map(ep).collect(),
            tors: vec![10; n],
            header_bytes: 57,
            rtx_timeout_ps: 1_000 * inalab_core::time::US,
            max_attempts: 3,
            window_blocks: 64,
            single_leader: false,
        };
        let mut hosts: Vec<CanaryHost> = (0..n).map(|r| CanaryHost::new(cfg.clone(), r).unwrap()).collect();
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let values = 256 * 30 + 7;
        let tensors = 3u64;
        // Packets in flight: (arrival, order sent, to), the packets by their order sent.
        let mut wire: BTreeSet<(Time, u64, usize)> = BTreeSet::new();
        let mut packets: HashMap<u64, Packet> = HashMap::new();
        let mut order = 0u64;
        let mut done = vec![0u64; n];
        let mut failed = vec![0u64; n];
        let mut submitted = vec![0u64; n];
        // When each host submits its next tensor: rank r pauses r x `drift` us after each.
        let mut ready = vec![0 as Time; n];
        let mut now: Time = 0;
        let us = inalab_core::time::US;
        for _ in 0..2_000_000 {
            // Each host submits its next tensor once its previous one is done, after a pause
            // of its own: the hosts drift apart.
            for r in 0..n {
                if submitted[r] == done[r] + failed[r] && submitted[r] < tensors && now >= ready[r] {
                    submit(&mut hosts[r], now, submitted[r], r, values);
                    submitted[r] += 1;
                }
            }
            for r in 0..n {
                while let Some(mut p) = hosts[r].poll_transmit(now) {
                    let copies: Vec<usize> = if p.dst == 10 { (0..n).filter(|&t| t != r).collect() } else { vec![p.dst as usize] };
                    for to in copies {
                        let data = matches!(&p.header, Header::Canary(h) if matches!(h.kind, CanaryType::Reduce | CanaryType::Fallback) && h.counter > 0);
                        if (next() % 1_000_000) as f64 / 1e6 < loss || mute == Some(r) && data {
                            continue;
                        }
                        p.dst = to as NodeId;
                        let at = now + (1 + next() % spread) * us;
                        order += 1;
                        packets.insert(order, p.clone());
                        wire.insert((at, order, to));
                    }
                }
                while let Some(e) = hosts[r].poll_event() {
                    match e {
                        HostEvent::Done { id, data: Some(Payload::I32(v)) } => {
                            if v.len() != values || v.iter().any(|&x| x != 6) {
                                return Err(format!("seed {seed}: rank {r}'s allreduce {id} has a wrong sum"));
                            }
                            done[r] += 1;
                            ready[r] = now + r as Time * drift * us;
                        }
                        HostEvent::Failed { .. } if mute.is_some() => failed[r] += 1,
                        e => return Err(format!("seed {seed}: rank {r}: {e:?} (counters {:?})", hosts[r].counters())),
                    }
                }
            }
            if (0..n).all(|r| done[r] + failed[r] == tensors) {
                return Ok(failed);
            }
            let pending = (0..n).filter(|&r| submitted[r] == done[r] + failed[r] && submitted[r] < tensors).map(|r| ready[r]);
            let timer = hosts.iter().filter_map(|h| h.poll_timeout()).chain(pending).min();
            let arrival = wire.first().map(|w| w.0);
            let packet_first = match (arrival, timer) {
                (Some(a), Some(t)) => a <= t,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => return Err(format!("seed {seed}: the network went quiet with allreduces done {done:?}")),
            };
            if packet_first {
                let (at, k, to) = wire.pop_first().unwrap();
                now = now.max(at);
                hosts[to].handle_packet(now, packets.remove(&k).unwrap());
            } else {
                now = now.max(timer.unwrap());
                hosts.iter_mut().for_each(|h| h.handle_timeout(now));
            }
        }
        Err(format!("seed {seed}: not done after 2 M steps, done {done:?}"))
    }

    #[test]
    fn loss_reordering_and_a_lagging_leader_never_strand_a_host() {
        // (delay spread, drift) in us: a reordering network (each packet 1 us to 3 ms, the
        // RTO 1 ms), and hosts drifting seconds apart (rank r pauses r x 2 s after each
        // allreduce). With the drift, a host ahead asked a lagging leader for blocks it had
        // not reached; the leader did not answer, and after 8 expiries the host declared it
        // failed: 99 of 100 seeds failed an allreduce before leaders answered "wait".
        for (spread, drift) in [(50, 200), (3000, 200), (50, 2_000_000), (3000, 2_000_000)] {
            let bad: Vec<String> = (1..=25).filter_map(|seed| lossy_reordering_run(seed, 0.03, spread, drift, None).err()).collect();
            assert!(bad.is_empty(), "spread {spread} us, drift {drift} us: {} of 25 seeds: {:?}", bad.len(), &bad[..bad.len().min(2)]);
        }
    }

    #[test]
    fn a_host_whose_data_never_arrives_fails_its_peers_in_bounded_time() {
        // Rank 2 is there and answers, but none of its contributions arrives (cut off one
        // way, and no driver reports it failed). Its peers' blocks are re-issued, fall back,
        // and their leaders answer "wait" while rank 2's data is missing: after MAX_WAITS of
        // them the requests count as unanswered again, and every host fails its allreduces
        // rather than waiting for ever.
        for seed in 1..=3 {
            let failed = lossy_reordering_run(seed, 0.0, 50, 200, Some(2)).unwrap();
            assert!(failed.iter().all(|&f| f > 0), "seed {seed}: every host failed an allreduce, got {failed:?}");
        }
    }
}
