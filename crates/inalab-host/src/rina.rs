//! Rina's hosts (Chen et al., ICNP 2024, §IV; `../shared/specs/rina.md` §1; with
//! `inalab_switch::RinaSwitch` on the ToRs of INA racks).
//!
//! The job's workers form G groups in ring order: an INA rack with two or more of the job's
//! workers is one group (an abstracted worker whose agent is its lowest rank), every other
//! worker a group of its own (autonomous). A tensor is cut into G chunks. ScatterReduce: at
//! step s = 0..G-1 group g reduces chunk (g - s) mod G and sends it to the next group's
//! receiver (its agent, or the autonomous worker); the last step delivers the finished chunk
//! to the group that started it. AllGather: the finished chunk travels G-1 more hops. 2G-1
//! hops in all, against the plain ring's 2(N-1).
//!
//! Roles:
//! - **agent** (member 0 of an INA rack): receives the previous group's partials and ACKs
//!   them; once a chunk's partial is in, adds its own values and sends its ToR a TASK, which
//!   the ToR copies to every member as a PULL; forwards AllGather packets to the next group
//!   (the ToR already copied them to the rack), and repairs members' missed copies (NACK);
//! - **member** (every worker of an INA rack, the agent too): answers a PULL with its DATA
//!   for the chunk, under its window; the ToR sums the rack's DATA and sends the sum on as an
//!   AGG; the next group's ACK comes back through the ToR to every member;
//! - **autonomous**: sends its own values plus the partial it received straight to the next
//!   group as AGGs, ACKs what it receives, and forwards AllGather packets, like a ring worker.
//!
//! Failures (spec §1.8, docs/rina.md "Failures"): told by its driver that a worker died, a
//! host rebuilds the ring over the survivors by the set-up rule (a rack whose agent died
//! becomes autonomous workers, a dead member leaves its rack, a dead autonomous worker leaves
//! the ring) under a new epoch (the top 8 bits of `req`). The epoch's first allreduce carries
//! every survivor's progress; each request some survivor finished is repaired from the
//! lowest-rank such survivor's kept result, every other unfinished one runs again from the
//! inputs over the survivors, so all survivors end with the same sums.
//!
//! Choices beyond the paper (docs/rina.md): the agent forwards AllGather packets to the next
//! group itself (spec §1.3 item 4's option, so one host owns each hop's reliability); an
//! autonomous hop uses Rina's packets and windows, not the host transport, so every hop is
//! paced and recovered alike; every chunk has at least one packet (a tensor shorter than G
//! values sends empty ones).

use crate::aimd::AimdConfig;
use crate::cc::{CongestionControl, WindowRules};
use crate::rtt::{RttConfig, RttEstimator};
use crate::ConfigError;
use inalab_core::wire::{Header, RinaHeader, RinaKind};
use inalab_core::{AppRequest, Endpoint, HostEvent, HostProtocol, NodeId, Packet, Payload, Time, TimerTable, backed_off};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Values per packet: the switch's slot width (ATP's 62).
pub const RINA_PACKET_VALUES: usize = 62;
/// Smallest frame on the wire (Ethernet's minimum).
const MIN_FRAME_BYTES: u32 = 64;
/// An agent keeps the results of this many requests back to repair its members' copies.
const KEPT_RESULTS: usize = 64;
/// After a failure, the requests past its lowest unfinished one a host reports as finished
/// or not (a bitmap of 8 words), and how far back every host keeps its results to repair
/// the others: a host may be this many requests ahead of the slowest survivor.
const PROGRESS_BITS: usize = 256;
const PROGRESS_WORDS: usize = PROGRESS_BITS / 32;
/// Values per rank in the progress allreduce: the lowest unfinished request and the bitmap.
const PROGRESS_VALUES: usize = 1 + PROGRESS_WORDS;
const EPOCH_SHIFT: u32 = RinaHeader::EPOCH_SHIFT;
/// Packets of requests or epochs not opened yet a host keeps at most.
const MAX_EARLY_PACKETS: usize = 1 << 16;
const REQ_MASK: u32 = RinaHeader::REQ_MASK;

/// One ring position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RinaGroup {
    /// The group's workers; the first is its receiver (the agent of an INA rack).
    pub members: Vec<Endpoint>,
    /// The ToR running Rina's program for an INA rack; `None` for an autonomous worker.
    pub tor: Option<NodeId>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RinaConfig {
    pub job: u16,
    /// The groups in ring order.
    pub groups: Vec<RinaGroup>,
    /// Every worker's endpoint by rank (groups in ring order are sorted by their lowest rank;
    /// a rebuilt ring after a failure too).
    pub ranks: Vec<Endpoint>,
    /// Bytes on the wire besides the values of a packet.
    pub header_bytes: u32,
    /// Floor and initial value of the retransmission timeout (RFC 6298 estimate above it).
    pub rto_ps: Time,
    /// Window of ScatterReduce (its start and its cap, "full speed") and the cap of
    /// AllGather's, which starts at one packet (§IV-C-1), bytes.
    pub window_bytes: u64,
    /// Slots of the job's region at its INA ToRs: a member's DATA in flight span fewer.
    pub slots: u32,
    /// A rack member that heard nothing of an unfinished allreduce for this long asks its
    /// agent for the AllGather packets it misses.
    pub repair_ps: Time,
    /// Per-step cost of §III-A's dependency chain (eq. 1): each host waits `O +
    /// max(0, sigma Z)` (Z standard normal) before its part of a ScatterReduce step (a member
    /// before its DATA, an autonomous worker before its AGGs), so a step waits for the slowest.
    /// Both 0 (the default): no wait.
    pub step_overhead_ps: Time,
    pub step_jitter_ps: Time,
    /// Seeds this host's draws (the driver passes its run's seed mixed with the job and rank).
    pub seed: u64,
}

impl RinaConfig {
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.groups.is_empty() || self.groups.len() > u16::MAX as usize {
            return Err(ConfigError(format!("{} groups; a Rina job has 1..=65535", self.groups.len())));
        }
        for (g, grp) in self.groups.iter().enumerate() {
            let ok = if grp.tor.is_some() { (2..=32).contains(&grp.members.len()) } else { grp.members.len() == 1 };
            if !ok {
                return Err(ConfigError(format!("group {g}: {} members; an INA rack has 2..=32, an autonomous worker is alone", grp.members.len())));
            }
        }
        // Every rank in exactly one group (a set: jobs have up to thousands of workers).
        let listed: usize = self.groups.iter().map(|g| g.members.len()).sum();
        let members: BTreeSet<&Endpoint> = self.groups.iter().flat_map(|g| &g.members).collect();
        if listed != self.ranks.len() || members.len() != listed || !self.ranks.iter().all(|r| members.contains(r)) {
            return Err(ConfigError(format!("the groups must list each of the {} ranks once; they list {listed} workers, {} distinct", self.ranks.len(), members.len())));
        }
        if self.rto_ps == 0 || self.repair_ps == 0 || self.slots == 0 || self.window_bytes == 0 {
            return Err(ConfigError("rto_ps, repair_ps, slots and window_bytes must be positive".into()));
        }
        Ok(())
    }
    fn packet_bytes(&self, values: usize) -> u32 {
        self.header_bytes + 4 * values as u32
    }
}

/// Values `[start, end)` of chunk `c` of `g` in a tensor of `n` values.
fn chunk(n: usize, g: usize, c: usize) -> (usize, usize) {
    (c * n / g, (c + 1) * n / g)
}

fn packets_in(len: usize) -> u32 {
    len.div_ceil(RINA_PACKET_VALUES).max(1) as u32
}

/// Which packets of a chunk arrived.
#[derive(Debug, Clone)]
struct Got {
    have: Vec<bool>,
    left: u32,
}

impl Got {
    fn new(n: u32) -> Self {
        Got { have: vec![false; n as usize], left: n }
    }
    /// Marks `seq`; false if it was there (or is out of range).
    fn mark(&mut self, seq: u32) -> bool {
        match self.have.get_mut(seq as usize) {
            Some(h) if !*h => {
                *h = true;
                self.left -= 1;
                true
            }
            _ => false,
        }
    }
    fn done(&self) -> bool {
        self.left == 0
    }
}

/// What a request of the current epoch is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// The application's k-th allreduce.
    App(usize),
    /// After a failure: every survivor's progress (`PROGRESS_VALUES` per rank).
    Progress,
    /// After a failure: the application's k-th allreduce, which rank `from` (the lowest-rank
    /// survivor that finished it) sends again while the others send zeros.
    Repair { k: usize, from: usize },
}

/// One of the application's allreduces, across epochs.
struct AppReq {
    id: u64,
    n: usize,
    payload: bool,
    /// Kept until it is finished: a failure may make it run again.
    input: Option<Vec<i32>>,
    /// Kept `PROGRESS_BITS` requests behind the lowest unfinished one, to repair others.
    result: Option<Vec<i32>>,
    finished: bool,
}

/// One allreduce on the wire, in the current epoch.
struct Req {
    purpose: Purpose,
    n: usize,
    /// The job-wide DATA index of each ScatterReduce step's first packet (this host's chunk
    /// order), so a packet's index costs no walk over the steps before it.
    step_q: Vec<u32>,
    data: Option<Vec<i32>>,
    /// The partials received (ScatterReduce), then this host's contribution per chunk.
    work: Option<Vec<i32>>,
    /// The allreduce's result.
    result: Option<Vec<i32>>,
    /// Receiver: the ScatterReduce partial of each chunk (the finished sum for its own).
    partial: BTreeMap<u16, Got>,
    /// Every host: the finished chunks' packets.
    full: Vec<Got>,
    chunks_left: usize,
    done: bool,
    /// Done, and nothing of it can be asked for again (no result kept to repair with):
    /// `partial` and `full` are freed, and a late packet for it is a duplicate. Kept, they
    /// grew a worker by a mark per packet per allreduce (#36).
    forgotten: bool,
    /// When a packet of this request last arrived (a member asks for repairs after quiet).
    last_heard: Time,
}

/// A packet sent and not yet acknowledged.
struct Flight {
    pkt: Packet,
    sent: Time,
    expiries: u32,
}

/// A windowed, acknowledged flow of packets (a member's DATA, an autonomous worker's AGGs,
/// a receiver's AllGather hops).
struct Flow<K: Ord + Copy + std::hash::Hash> {
    window: Box<dyn CongestionControl>,
    queue: BTreeMap<K, Packet>,
    flights: BTreeMap<K, Flight>,
    /// When each packet in flight is sent again.
    deadlines: TimerTable<K>,
    in_flight_bytes: u64,
    sent: u64,
}

impl<K: Ord + Copy + std::hash::Hash> Flow<K> {
    fn new(cfg: AimdConfig) -> Self {
        Flow { window: WindowRules::default().window(&cfg), queue: BTreeMap::new(), flights: BTreeMap::new(), deadlines: TimerTable::new(), in_flight_bytes: 0, sent: 0 }
    }
    /// The next packet the window lets out, if `allowed` accepts its key.
    fn next(&mut self, now: Time, rtt: &RttEstimator, allowed: impl Fn(K, Option<K>) -> bool) -> Option<Packet> {
        let (&k, p) = self.queue.first_key_value()?;
        let oldest = self.flights.keys().next().copied();
        if (!self.flights.is_empty() && self.in_flight_bytes + p.size as u64 > self.window.window()) || !allowed(k, oldest) {
            return None;
        }
        let pkt = self.queue.pop_first().expect("non-empty").1;
        let deadline = now + rtt.rto();
        self.in_flight_bytes += pkt.size as u64;
        self.sent += 1;
        self.deadlines.set(k, deadline);
        self.flights.insert(k, Flight { pkt: pkt.clone(), sent: now, expiries: 0 });
        Some(pkt)
    }
    /// `k` acknowledged: its RTT sample (first sends only, Karn) and the window's growth.
    fn ack(&mut self, k: K, ecn: bool, now: Time, rtt: &mut RttEstimator) -> bool {
        let Some(f) = self.flights.remove(&k) else { return false };
        self.deadlines.cancel(k);
        self.in_flight_bytes -= f.pkt.size as u64;
        if f.expiries == 0 {
            rtt.sample(now - f.sent);
        }
        self.window.on_ack(f.pkt.size as u64, ecn, self.sent - self.flights.len() as u64, self.sent);
        true
    }
    /// Expired packets, sent again with RETX (the window is cut once).
    fn expire(&mut self, now: Time, rtt: &RttEstimator, out: &mut VecDeque<Packet>) -> u64 {
        let mut n = 0;
        while let Some(k) = self.deadlines.pop_expired(now) {
            let f = self.flights.get_mut(&k).expect("armed flights are in flight");
            f.expiries += 1;
            self.deadlines.set(k, now + backed_off(rtt.rto(), f.expiries));
            let mut p = f.pkt.clone();
            if let Header::Rina(h) = &mut p.header {
                h.flags |= RinaHeader::RETX;
            }
            out.push_back(p);
            n += 1;
        }
        if n > 0 {
            self.window.on_congestion(self.sent);
        }
        n
    }
    fn next_deadline(&self) -> Option<Time> {
        self.deadlines.next()
    }
}

#[derive(Default)]
struct Counters {
    tasks: u64,
    task_resends: u64,
    pulls: u64,
    data_sent: u64,
    aggs_sent: u64,
    ag_sent: u64,
    retransmits: u64,
    duplicates: u64,
    sr_hops: u64,
    ag_hops: u64,
    nacks: u64,
    repairs: u64,
    repairs_unavailable: u64,
    early: u64,
    malformed: u64,
    failures: u64,
    repaired: u64,
    rerun: u64,
    unrepairable: u64,
    stale_epoch: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Agent,
    Member,
    Autonomous,
}

/// AllGather flow key: (request, chunk, seq).
type AgKey = (u32, u16, u32);

pub struct RinaHost {
    cfg: RinaConfig,
    me: Endpoint,
    rank: usize,
    g: usize,
    /// This host's index in its set-up rack (the ToR knows members by it, epochs after too).
    member: u8,
    role: Role,
    /// Agent: its rack's live members' bits, sent in every TASK.
    rack_bits: u32,
    /// The set-up groups and the ranks that died since.
    orig: Vec<RinaGroup>,
    dead: BTreeSet<usize>,
    epoch: u8,
    apps: Vec<AppReq>,
    /// The lowest unfinished application request, and the oldest whose result is kept.
    low: usize,
    kept_from: usize,
    /// Requests to open in order before the application's next (after a failure), the next
    /// application request to open past them, and whether the progress round is in flight.
    plan: VecDeque<Purpose>,
    next_app: usize,
    planning: bool,
    /// The plan's requests open one at a time (a survivor that submitted the next request
    /// already would fill its window toward a receiver that has not, while it still owes
    /// packets of the request before: found as a hang), and the application's after them.
    recovering: bool,
    reqs: Vec<Req>,
    next_q: u32,
    /// Member: PULLs not handled yet, by (request, step): a member queues its DATA strictly
    /// in (request, step) order, so it sends every DATA index after all lower ones and its
    /// ToR may take a slot whose tag is newer as proof the older one was acknowledged (an
    /// agent's steps become ready out of order when chunks' chains finish out of order).
    early_pulls: BTreeSet<(u32, u16)>,
    /// Member: the next (request, step) to queue DATA for.
    next_pull: (u32, u16),
    /// Member: when the next PULL's DATA may go (its step's wait, eq. 1).
    pull_due: Option<Time>,
    /// Autonomous: steps waiting out their step cost, by when they go.
    delayed: BTreeSet<(Time, u32, u16)>,
    steps: crate::collective::StepClock,
    /// Packets of requests not submitted yet (a faster group is an allreduce ahead), kept
    /// and handled at submission; the senders' windows bound them.
    early_packets: Vec<Packet>,
    /// Agent: TASKs with no ACK for any of their packets yet, with their resend time. Only an
    /// ACK shows every member got the PULL (a slot completes with every member's DATA); the
    /// agent's own PULL coming back does not: a member that lost it held the step's slots
    /// for ever (found under loss).
    tasks: BTreeMap<(u32, u16), (Time, Packet)>,
    sr: Flow<u32>,
    ag: Flow<AgKey>,
    rtt: RttEstimator,
    ctrl: VecDeque<Packet>,
    /// Member: when it asks its agent for missed AllGather packets.
    repair_at: Option<Time>,
    events: VecDeque<HostEvent>,
    c: Counters,
}

/// The ring over the survivors of `orig` (spec §1.8): a rack whose agent died becomes
/// autonomous workers, a rack left with one worker too, a dead worker leaves its group; groups
/// in order of their lowest rank.
fn rebuild(orig: &[RinaGroup], ranks: &[Endpoint], dead: &BTreeSet<usize>) -> Vec<RinaGroup> {
    let by_endpoint: BTreeMap<&Endpoint, usize> = ranks.iter().enumerate().map(|(r, e)| (e, r)).collect();
    let rank = |e: &Endpoint| by_endpoint[e];
    let mut groups = vec![];
    for g in orig {
        let live: Vec<Endpoint> = g.members.iter().copied().filter(|m| !dead.contains(&rank(m))).collect();
        let agent_alive = live.first() == g.members.first();
        if g.tor.is_some() && agent_alive && live.len() >= 2 {
            groups.push(RinaGroup { members: live, tor: g.tor });
        } else {
            groups.extend(live.into_iter().map(|m| RinaGroup { members: vec![m], tor: None }));
        }
    }
    groups.sort_by_key(|g| g.members.iter().map(rank).min());
    groups
}

/// The request a wire `req` (24 bits, the epoch above them) names, `next` requests opened so
/// far: the one with those low bits nearest `next` (requests in flight span far fewer than
/// 2^23), so a job of more than 2^24 requests goes on.
fn unwrap_req(next: u32, req: u32) -> u32 {
    const HALF: u32 = 1 << (EPOCH_SHIFT - 1);
    let r = (next & !REQ_MASK) | (req & REQ_MASK);
    if r > next.saturating_add(HALF) && r > REQ_MASK {
        r - (1 << EPOCH_SHIFT)
    } else if r.saturating_add(HALF) < next {
        r.saturating_add(1 << EPOCH_SHIFT)
    } else {
        r
    }
}

fn flow_configs(cfg: &RinaConfig) -> (AimdConfig, AimdConfig) {
    let full = AimdConfig { initial_window_bytes: cfg.window_bytes, max_window_bytes: cfg.window_bytes, min_window_bytes: cfg.packet_bytes(RINA_PACKET_VALUES) as u64, increment_bytes: cfg.packet_bytes(RINA_PACKET_VALUES) as u64, ..AimdConfig::default() };
    // AllGather starts from one packet and grows to the same cap (§IV-C-1).
    let ag = AimdConfig { initial_window_bytes: full.min_window_bytes, ..full.clone() };
    (full, ag)
}

impl RinaHost {
    pub fn new(cfg: RinaConfig, rank_endpoint: Endpoint) -> Result<Self, ConfigError> {
        cfg.check()?;
        let rank = cfg.ranks.iter().position(|&e| e == rank_endpoint).ok_or_else(|| ConfigError(format!("{rank_endpoint:?} is in no group")))?;
        let member = cfg.groups.iter().find_map(|g| g.members.iter().position(|&e| e == rank_endpoint)).expect("checked: every rank is in a group") as u8;
        let rtt = RttEstimator::new(RttConfig { initial_rto_ps: cfg.rto_ps, min_rto_ps: cfg.rto_ps, max_rto_ps: cfg.rto_ps * 1000, ..RttConfig::default() });
        let (full, ag) = flow_configs(&cfg);
        let mut host = RinaHost {
            me: rank_endpoint,
            rank,
            g: 0,
            member,
            role: Role::Autonomous,
            rack_bits: 0,
            orig: cfg.groups.clone(),
            dead: BTreeSet::new(),
            epoch: 0,
            apps: vec![],
            low: 0,
            kept_from: 0,
            plan: VecDeque::new(),
            next_app: 0,
            planning: false,
            recovering: false,
            reqs: vec![],
            next_q: 0,
            early_pulls: BTreeSet::new(),
            next_pull: (0, 0),
            pull_due: None,
            delayed: BTreeSet::new(),
            steps: crate::collective::StepClock::new(crate::StepCost {
                overhead_ps: cfg.step_overhead_ps,
                jitter_ps: cfg.step_jitter_ps,
                barrier: false,
                seed: cfg.seed ^ rank_endpoint.host as u64,
            }),
            early_packets: vec![],
            tasks: BTreeMap::new(),
            sr: Flow::new(full),
            ag: Flow::new(ag),
            rtt,
            ctrl: VecDeque::new(),
            repair_at: None,
            events: VecDeque::new(),
            c: Counters::default(),
            cfg,
        };
        host.place();
        Ok(host)
    }

    /// This host's group and role in the current ring, and its rack's live members' bits.
    fn place(&mut self) {
        let me = self.me;
        let g = self.cfg.groups.iter().position(|grp| grp.members.contains(&me)).expect("a survivor is in the ring");
        let grp = &self.cfg.groups[g];
        self.g = g;
        self.role = match (grp.tor, grp.members[0] == me) {
            (None, _) => Role::Autonomous,
            (Some(_), true) => Role::Agent,
            _ => Role::Member,
        };
        let orig = self.orig.iter().find(|o| o.members.contains(&me)).expect("a configured worker");
        self.rack_bits = grp.members.iter().filter_map(|m| orig.members.iter().position(|o| o == m)).fold(0, |b, i| b | 1 << i);
    }

    fn groups(&self) -> usize {
        self.cfg.groups.len()
    }
    fn receiver(&self, g: usize) -> Endpoint {
        self.cfg.groups[g % self.groups()].members[0]
    }
    fn next_receiver(&self) -> Endpoint {
        self.receiver(self.g + 1)
    }
    fn is_receiver(&self) -> bool {
        self.role != Role::Member
    }
    /// The chunk this group reduces at ScatterReduce step `s`.
    fn chunk_at(&self, s: u16) -> u16 {
        let gs = self.groups();
        ((self.g + gs - s as usize % gs) % gs) as u16
    }
    /// The job-wide index of packet `seq` of step `s` of request `r` (every member of the
    /// group computes the same).
    fn q_of(&self, r: usize, s: u16, seq: u32) -> u32 {
        self.reqs[r].step_q[s as usize].wrapping_add(seq)
    }
    fn span(&self, r: usize, c: u16) -> (usize, usize) {
        chunk(self.reqs[r].n, self.groups(), c as usize)
    }
    fn header(&self, kind: RinaKind, r: usize, step: u16, c: u16, seq: u32) -> RinaHeader {
        RinaHeader { kind, flags: 0, member: self.member, hop: 0, job: self.cfg.job, step, chunk: c, count: 0, req: r as u32, seq, slot: 0, arg: 0 }
    }
    /// `h` as sent: its request tagged with the epoch.
    fn on_wire(&self, mut h: RinaHeader) -> RinaHeader {
        h.req = (h.req & REQ_MASK) | (self.epoch as u32) << EPOCH_SHIFT;
        h
    }
    /// Packet `seq` of chunk `c` of `values` (a whole tensor) as `h`, to `dst`.
    fn packet(&self, h: RinaHeader, values: Option<&[i32]>, r: usize, dst: Endpoint) -> Packet {
        let mut h = self.on_wire(h);
        let (s, e) = self.span(r, h.chunk);
        let a = (s + h.seq as usize * RINA_PACKET_VALUES).min(e);
        let b = (a + RINA_PACKET_VALUES).min(e);
        h.count = (b - a) as u16;
        let mut p = Packet::new(self.me.host, self.me.port, dst.host, dst.port, self.cfg.packet_bytes(b - a), Header::Rina(h));
        p.payload = values.map(|v| Box::new(Payload::I32(v[a..b].to_vec())));
        p
    }
    fn control(&self, h: RinaHeader, dst: Endpoint) -> Packet {
        let h = self.on_wire(h);
        // A packet without values (TASK, ACK, NACK) is its headers: the real frame's size.
        Packet::new(self.me.host, self.me.port, dst.host, dst.port, self.cfg.header_bytes.max(MIN_FRAME_BYTES), Header::Rina(h))
    }
    fn tor(&self) -> Endpoint {
        Endpoint { host: self.cfg.groups[self.g].tor.expect("an INA rack"), port: self.me.port }
    }

    /// Eq. (1)'s per-step wait: `O + max(0, sigma Z)`.
    fn step_wait(&mut self) -> Time {
        self.steps.draw(1)
    }

    /// This host's part of ScatterReduce step `s` of request `r` is ready: an agent sends its
    /// ToR a TASK, an autonomous worker queues its AGGs (after its step cost, eq. 1).
    fn start_step(&mut self, now: Time, r: usize, s: u16) {
        if self.role == Role::Autonomous {
            let wait = self.step_wait();
            if wait > 0 {
                self.delayed.insert((now + wait, r as u32, s));
                return;
            }
        }
        self.send_step(now, r, s);
    }

    fn send_step(&mut self, now: Time, r: usize, s: u16) {
        let c = self.chunk_at(s);
        let (a, b) = self.span(r, c);
        let n = packets_in(b - a);
        let full = s as usize == self.groups() - 1;
        match self.role {
            Role::Agent => {
                let mut h = self.header(RinaKind::Task, r, s, c, 0);
                h.arg = n;
                // The ToR learns the rack's live members and the next receiver from the TASKs
                // (they change only with an epoch).
                h.slot = self.rack_bits;
                h.seq = self.cfg.ranks.iter().position(|&e| e == self.next_receiver()).expect("a worker") as u32;
                let p = self.control(h, self.tor());
                self.c.tasks += 1;
                self.tasks.insert((r as u32, s), (now + self.rtt.rto(), p.clone()));
                self.ctrl.push_back(p);
            }
            Role::Autonomous => {
                let next = self.next_receiver();
                for seq in 0..n {
                    let mut h = self.header(RinaKind::Agg, r, s, c, seq);
                    h.slot = self.q_of(r, s, seq);
                    if full {
                        h.flags |= RinaHeader::FULL;
                    }
                    let p = self.packet(h, self.reqs[r].work.as_deref(), r, next);
                    self.sr.queue.insert(h.slot, p);
                }
            }
            Role::Member => unreachable!("members answer PULLs"),
        }
    }

    /// A member's DATA for step `s` of request `r` (the agent's carries the partial too).
    fn on_pulled(&mut self, r: usize, s: u16) {
        let c = self.chunk_at(s);
        let (a, b) = self.span(r, c);
        let tor = self.tor();
        // The agent's contribution (own values plus the partial) is in `work`.
        let values = if self.role == Role::Agent { self.reqs[r].work.as_deref() } else { self.reqs[r].data.as_deref() };
        for seq in 0..packets_in(b - a) {
            let mut h = self.header(RinaKind::Data, r, s, c, seq);
            h.slot = self.q_of(r, s, seq);
            if s as usize == self.groups() - 1 {
                h.flags |= RinaHeader::FULL;
            }
            let p = self.packet(h, values, r, tor);
            self.sr.queue.insert(h.slot, p);
        }
    }

    /// Queues the DATA of every PULL that is next in (request, step) order, each after its
    /// step cost (eq. 1).
    fn drain_pulls(&mut self, now: Time) {
        while (self.next_pull.0 as usize) < self.reqs.len() && self.early_pulls.contains(&self.next_pull) {
            let due = match self.pull_due {
                Some(t) => t,
                None => {
                    let t = now + self.step_wait();
                    self.pull_due = Some(t);
                    t
                }
            };
            if due > now {
                return;
            }
            self.pull_due = None;
            self.early_pulls.remove(&self.next_pull);
            let (r, s) = self.next_pull;
            self.on_pulled(r as usize, s);
            self.next_pull = if s as usize + 1 == self.groups() { (r + 1, 0) } else { (r, s + 1) };
        }
    }

    /// A receiver got a ScatterReduce packet of the previous group (or of its own rack, in a
    /// job of one group).
    fn on_agg(&mut self, now: Time, h: RinaHeader, pkt: &Packet) {
        let r = h.req as usize;
        let gs = self.groups();
        if self.is_receiver() {
            // Every AGG is acknowledged, duplicates too (the first ACK may have been lost).
            let mut a = RinaHeader { kind: RinaKind::Ack, flags: if pkt.ecn { RinaHeader::ECN_ECHO } else { 0 }, count: 0, ..h };
            a.member = self.member;
            // In a job of one rack the AGG comes from this agent's own ToR on its behalf: the
            // ACK goes to that ToR.
            let from_me = pkt.src == self.me.host && pkt.src_port == self.me.port;
            let to = if from_me && self.role == Role::Agent { self.tor() } else { Endpoint { host: pkt.src, port: pkt.src_port } };
            self.ctrl.push_back(self.control(a, to));
        }
        if self.reqs[r].forgotten {
            self.c.duplicates += 1;
            return;
        }
        let full = h.has(RinaHeader::FULL);
        if full {
            return self.on_full_packet(now, r, h, pkt, 0);
        }
        if !self.is_receiver() || h.step as usize + 1 >= gs {
            self.c.malformed += 1;
            return;
        }
        let c = h.chunk;
        let (a, end) = self.span(r, c);
        let n = packets_in(end - a);
        let at = a + h.seq as usize * RINA_PACKET_VALUES;
        // A payload that does not fill exactly its packet's place is forged: dropped before the
        // packet is marked, so the genuine one still counts.
        let expected = (at + RINA_PACKET_VALUES).min(end).saturating_sub(at);
        if matches!(pkt.payload.as_deref(), Some(Payload::I32(v)) if v.len() != expected) {
            self.c.malformed += 1;
            return;
        }
        let got = self.reqs[r].partial.entry(c).or_insert_with(|| Got::new(n));
        if !got.mark(h.seq) {
            self.c.duplicates += 1;
            return;
        }
        let done = got.done();
        if let (Some(w), Some(Payload::I32(v))) = (&mut self.reqs[r].work, pkt.payload.as_deref()) {
            // Sticky saturation, as at the switches (inalab_core::rail): a sum beyond the
            // range stays at a rail, and every worker fails the call on it.
            inalab_core::rail::sticky_add(&mut w[at..at + v.len()], v);
        }
        if done {
            self.c.sr_hops += 1;
            self.start_step(now, r, h.step + 1);
        }
    }

    /// A packet of a finished chunk (the last ScatterReduce hop, `hop` 0, or an AllGather
    /// packet): stored, and a receiver passes it on while the chunk has hops to go.
    fn on_full_packet(&mut self, now: Time, r: usize, h: RinaHeader, pkt: &Packet, ag_hop: u8) {
        if self.reqs[r].forgotten {
            self.c.duplicates += 1;
            return;
        }
        let (a, b) = self.span(r, h.chunk);
        let q = &mut self.reqs[r];
        q.last_heard = now;
        let at = a + h.seq as usize * RINA_PACKET_VALUES;
        let expected = (at + RINA_PACKET_VALUES).min(b).saturating_sub(at);
        if matches!(pkt.payload.as_deref(), Some(Payload::I32(v)) if v.len() != expected) {
            self.c.malformed += 1;
            return;
        }
        let Some(got) = q.full.get_mut(h.chunk as usize) else {
            self.c.malformed += 1;
            return;
        };
        if !got.mark(h.seq) {
            self.c.duplicates += 1;
            return;
        }
        if let (Some(res), Some(Payload::I32(v))) = (&mut q.result, pkt.payload.as_deref()) {
            res[at..at + v.len()].copy_from_slice(v);
        }
        if got.done() {
            q.chunks_left -= 1;
            if h.kind == RinaKind::Agg {
                self.c.sr_hops += (self.is_receiver()) as u64;
            } else if self.is_receiver() && !h.has(RinaHeader::REPAIR) {
                self.c.ag_hops += 1;
            }
        }
        // Hops 0..G-2 of AllGather: the chunk goes on until the group before its origin.
        let gs = self.groups();
        if self.is_receiver() && (ag_hop as usize) < gs - 1 && !h.has(RinaHeader::REPAIR) {
            let mut f = RinaHeader { kind: RinaKind::Ag, flags: 0, hop: ag_hop, member: self.member, count: 0, slot: 0, arg: 0, ..h };
            f.flags = 0;
            let p = self.packet(f, self.reqs[r].result.as_deref(), r, self.next_receiver());
            self.ag.queue.insert((r as u32, h.chunk, h.seq), p);
        }
        self.finish(now, r);
    }

    fn finish(&mut self, now: Time, r: usize) {
        let agent = self.role == Role::Agent;
        let q = &mut self.reqs[r];
        if q.done || q.chunks_left > 0 {
            return;
        }
        q.done = true;
        q.data = None;
        q.work = None;
        // An agent keeps the result a while to repair members' missed copies.
        let result = if agent { q.result.clone() } else { q.result.take() };
        let purpose = q.purpose;
        if !agent {
            // Only an agent repairs: nothing of this request is asked for again.
            self.forget(r);
        } else if r >= KEPT_RESULTS {
            self.reqs[r - KEPT_RESULTS].result = None;
            if self.reqs[r - KEPT_RESULTS].done {
                self.forget(r - KEPT_RESULTS);
            }
        }
        match purpose {
            Purpose::App(k) | Purpose::Repair { k, .. } => self.app_finished(k, result),
            Purpose::Progress => return self.plan_recovery(now, result.unwrap_or_default()),
        }
        if self.recovering {
            self.open_ready(now);
        }
    }

    /// Per-packet marks the host keeps over its requests (what grows per allreduce unless
    /// forgotten): those of requests not done, and an agent's last [`KEPT_RESULTS`].
    pub fn retained_marks(&self) -> usize {
        self.reqs.iter().map(|q| q.full.iter().chain(q.partial.values()).map(|g| g.have.len()).sum::<usize>()).sum()
    }

    /// Frees what request `r` (done) kept to sum and repair: its per-packet marks.
    fn forget(&mut self, r: usize) {
        let q = &mut self.reqs[r];
        q.forgotten = true;
        q.partial = BTreeMap::new();
        q.full = Vec::new();
    }

    /// The application's k-th allreduce has its result (a repair of one this host already
    /// finished changes nothing: every survivor sums the same).
    fn app_finished(&mut self, k: usize, result: Option<Vec<i32>>) {
        let a = &mut self.apps[k];
        if a.finished {
            return;
        }
        a.finished = true;
        a.input = None;
        a.result = if a.payload { result } else { None };
        self.events.push_back(HostEvent::Done { id: a.id, data: a.result.clone().map(Payload::I32) });
        while self.low < self.apps.len() && self.apps[self.low].finished {
            self.low += 1;
        }
        // Not during a recovery: its plan may still name this host to repair an older one.
        while !self.recovering && !self.planning && self.kept_from + PROGRESS_BITS < self.low {
            self.apps[self.kept_from].result = None;
            self.kept_from += 1;
        }
    }

    /// Opens a request of the current epoch (the next wire index) and handles its packets
    /// that came early.
    fn open(&mut self, now: Time, purpose: Purpose, n: usize, data: Option<Vec<i32>>) {
        let gs = self.groups();
        let r = self.reqs.len();
        let full: Vec<Got> = (0..gs).map(|c| Got::new(packets_in(chunk(n, gs, c).1 - chunk(n, gs, c).0))).collect();
        let work = if self.role == Role::Member { None } else { data.clone() };
        let result = data.as_ref().map(|v| vec![0; v.len()]);
        let mut step_q = Vec::with_capacity(gs);
        let mut q = self.next_q;
        for s in 0..gs as u16 {
            step_q.push(q);
            q = q.wrapping_add(full[self.chunk_at(s) as usize].left);
        }
        self.next_q = q;
        self.reqs.push(Req { purpose, n, step_q, data, work, result, partial: BTreeMap::new(), full, chunks_left: gs, done: false, forgotten: false, last_heard: now });
        if self.role != Role::Member {
            self.start_step(now, r, 0);
        }
        self.drain_pulls(now);
        let tag = self.on_wire(RinaHeader { req: r as u32, ..Default::default() }).req;
        let (now_due, later): (Vec<Packet>, Vec<Packet>) = std::mem::take(&mut self.early_packets).into_iter().partition(|p| matches!(p.header, Header::Rina(h) if h.req == tag));
        self.early_packets = later;
        for p in now_due {
            self.handle_packet(now, p);
        }
        if self.role == Role::Member && self.repair_at.is_none() {
            self.repair_at = Some(now + self.cfg.repair_ps);
        }
    }

    /// Opens, in order, every request whose inputs are here: the plan's after a failure, then
    /// the application's.
    fn open_ready(&mut self, now: Time) {
        while !self.planning {
            if self.recovering {
                if self.reqs.iter().any(|q| !q.done) {
                    return;
                }
                self.recovering = !self.plan.is_empty();
            }
            let next = match self.plan.front() {
                Some(&p) => p,
                None => Purpose::App(self.next_app),
            };
            let k = match next {
                Purpose::App(k) | Purpose::Repair { k, .. } => k,
                Purpose::Progress => unreachable!("opened at the failure"),
            };
            if k >= self.apps.len() {
                return; // not submitted here yet
            }
            if self.plan.pop_front().is_none() {
                self.next_app += 1;
            }
            let a = &self.apps[k];
            let zeros = || a.payload.then(|| vec![0; a.n]);
            let data = match next {
                Purpose::Repair { from, .. } if from == self.rank => a.result.clone().or_else(zeros),
                Purpose::Repair { .. } => zeros(),
                // A request some survivor finished beyond the kept results runs again; this
                // host, if it finished it, has no input left to give (counted, docs/rina.md).
                _ => a.input.clone().or_else(zeros),
            };
            let n = a.n;
            self.open(now, next, n, data);
        }
    }

    /// Keeps a packet of a request (or epoch) not opened here yet; a bounded number, so forged
    /// ones cannot grow memory without end (the senders' windows bound genuine ones far below).
    fn keep_early(&mut self, pkt: Packet) {
        if self.early_packets.len() >= MAX_EARLY_PACKETS {
            self.c.malformed += 1;
            return;
        }
        self.c.early += 1;
        self.early_packets.push(pkt);
    }

    /// This host's progress: the lowest unfinished request and which of the next
    /// `PROGRESS_BITS` are finished, at its rank's place in the progress allreduce.
    fn progress(&self) -> Vec<i32> {
        let mut v = vec![0i32; PROGRESS_VALUES * self.cfg.ranks.len()];
        let at = PROGRESS_VALUES * self.rank;
        v[at] = self.low as i32;
        for (b, a) in self.apps.iter().enumerate().skip(self.low).take(PROGRESS_BITS) {
            if a.finished {
                let b = b - self.low;
                v[at + 1 + b / 32] |= 1 << (b % 32);
            }
        }
        v
    }

    /// Every survivor's progress is in: the same plan at every survivor. Each request some
    /// survivor finished is repaired from the lowest-rank one that keeps its result; every
    /// other unfinished one runs again from the inputs.
    fn plan_recovery(&mut self, now: Time, v: Vec<i32>) {
        self.planning = false;
        let alive: Vec<usize> = (0..self.cfg.ranks.len()).filter(|r| !self.dead.contains(r)).collect();
        let at = |i: usize| (v.get(PROGRESS_VALUES * i).map_or(0, |&l| l as u32 as usize), PROGRESS_VALUES * i + 1);
        let bit = |i: usize, k: usize| {
            let (l, w) = at(i);
            k >= l && k - l < PROGRESS_BITS && v.get(w + (k - l) / 32).is_some_and(|x| x >> ((k - l) % 32) & 1 == 1)
        };
        let finished = |i: usize, k: usize| k < at(i).0 || bit(i, k);
        // Kept: this host's results no more than PROGRESS_BITS behind its lowest unfinished.
        let keeps = |i: usize, k: usize| bit(i, k) || (k < at(i).0 && k + PROGRESS_BITS >= at(i).0);
        let low = alive.iter().map(|&i| at(i).0).min().unwrap_or(0);
        let last = alive.iter().flat_map(|&i| (0..PROGRESS_BITS).rev().find(|&b| bit(i, at(i).0 + b)).map(|b| at(i).0 + b + 1).into_iter().chain([at(i).0])).max().unwrap_or(low);
        self.plan.clear();
        for k in low..last {
            match alive.iter().find(|&&i| keeps(i, k)) {
                Some(&from) => {
                    self.plan.push_back(Purpose::Repair { k, from });
                    self.c.repaired += 1;
                }
                None => {
                    self.c.unrepairable += alive.iter().any(|&i| finished(i, k)) as u64;
                    self.plan.push_back(Purpose::App(k));
                }
            }
        }
        self.next_app = last.max(low);
        self.recovering = true;
        // This host's submitted requests that no survivor finished run again from the inputs.
        self.c.rerun += (low..self.apps.len()).filter(|&k| !alive.iter().any(|&i| finished(i, k))).count() as u64;
        self.open_ready(now);
    }

    fn on_nack(&mut self, h: RinaHeader, pkt: &Packet) {
        let r = h.req as usize;
        if self.reqs[r].forgotten {
            // Older than the results an agent keeps.
            self.c.repairs_unavailable += 1;
            return;
        }
        let Some(got) = self.reqs[r].full.get(h.chunk as usize) else { return };
        let to = Endpoint { host: pkt.src, port: pkt.src_port };
        let have: Vec<u32> = (h.seq..h.arg.min(got.have.len() as u32)).filter(|&s| got.have[s as usize]).collect();
        let payload = self.reqs[r].data.is_some() || self.reqs[r].result.is_some();
        if payload && self.reqs[r].result.is_none() {
            // Older than the results an agent keeps.
            self.c.repairs_unavailable += 1;
            return;
        }
        for seq in have {
            let f = RinaHeader { kind: RinaKind::Ag, flags: RinaHeader::REPAIR, hop: 0, member: self.member, count: 0, slot: 0, arg: 0, seq, ..h };
            let p = self.packet(f, self.reqs[r].result.as_deref(), r, to);
            self.ctrl.push_back(p);
            self.c.repairs += 1;
        }
    }

    /// A member asks its agent for the finished-chunk packets it misses.
    fn send_nacks(&mut self, now: Time) {
        let agent = self.receiver(self.g);
        let mut out = vec![];
        for (r, q) in self.reqs.iter().enumerate().filter(|(_, q)| !q.done) {
            if now < q.last_heard + self.cfg.repair_ps {
                continue;
            }
            for (c, got) in q.full.iter().enumerate() {
                let Some(first) = got.have.iter().position(|h| !h) else { continue };
                let last = got.have.iter().rposition(|h| !h).expect("one is missing");
                let h = RinaHeader { kind: RinaKind::Nack, flags: 0, member: self.member, hop: 0, job: self.cfg.job, step: 0, chunk: c as u16, count: 0, req: r as u32, seq: first as u32, slot: 0, arg: last as u32 + 1 };
                out.push(h);
            }
        }
        for h in out {
            self.c.nacks += 1;
            self.ctrl.push_back(self.control(h, agent));
        }
    }
}

impl HostProtocol for RinaHost {
    fn endpoint(&self) -> Endpoint {
        self.me
    }

    fn submit(&mut self, now: Time, req: AppRequest) {
        let AppRequest::Allreduce { id, bytes, data, .. } = req else {
            return self.events.push_back(HostEvent::Rejected { id: 0, reason: "Rina workers only allreduce".into() });
        };
        let data = match data {
            None => None,
            Some(Payload::I32(v)) => Some(v),
            Some(_) => return self.events.push_back(HostEvent::Rejected { id, reason: "Rina sums int32 values (floats go through the scheme's fixed-point quantization)".into() }),
        };
        let n = data.as_ref().map_or(bytes.div_ceil(4) as usize, Vec::len);
        self.apps.push(AppReq { id, n, payload: data.is_some(), input: data, result: None, finished: false });
        self.open_ready(now);
    }

    /// Worker `rank` died: the ring is rebuilt over the survivors under a new epoch, whose
    /// first allreduce is the survivors' progress (see the module docs).
    fn peer_failed(&mut self, now: Time, rank: u32) -> bool {
        let rank = rank as usize;
        if rank >= self.cfg.ranks.len() || rank == self.rank || !self.dead.insert(rank) {
            return rank != self.rank;
        }
        self.c.failures += 1;
        self.epoch = self.epoch.wrapping_add(1);
        self.cfg.groups = rebuild(&self.orig, &self.cfg.ranks, &self.dead);
        self.place();
        let (full, ag) = flow_configs(&self.cfg);
        (self.sr, self.ag) = (Flow::new(full), Flow::new(ag));
        self.reqs.clear();
        self.next_q = 0;
        self.early_pulls.clear();
        (self.next_pull, self.pull_due, self.repair_at) = ((0, 0), None, None);
        self.delayed.clear();
        self.tasks.clear();
        self.ctrl.clear();
        let epoch = self.epoch;
        self.early_packets.retain(|p| matches!(p.header, Header::Rina(h) if h.epoch().wrapping_sub(epoch) as i8 >= 0));
        self.plan.clear();
        self.planning = true;
        let v = self.progress();
        self.open(now, Purpose::Progress, v.len(), Some(v));
        true
    }

    fn handle_packet(&mut self, now: Time, pkt: Packet) {
        let Header::Rina(h) = pkt.header else { return };
        if h.job != self.cfg.job {
            return;
        }
        let ahead = h.epoch().wrapping_sub(self.epoch) as i8;
        if ahead < 0 {
            self.c.stale_epoch += 1;
            return;
        }
        if ahead > 0 {
            // From a survivor told of a failure before this host: kept for that epoch.
            return self.keep_early(pkt);
        }
        // The wire carries the request's low 24 bits: the one nearest the requests opened.
        let h = RinaHeader { req: unwrap_req(self.reqs.len() as u32, h.req), ..h };
        let r = h.req as usize;
        let known = r < self.reqs.len();
        if known {
            self.reqs[r].last_heard = now;
        }
        match h.kind {
            RinaKind::Pull if (h.step as usize) < self.groups() && self.role != Role::Autonomous => {
                self.c.pulls += 1;
                // A repeated PULL (its TASK was sent again) is for a step already queued.
                if (h.req, h.step) >= self.next_pull {
                    self.early_pulls.insert((h.req, h.step));
                    self.drain_pulls(now);
                }
            }
            RinaKind::Ack => {
                if self.sr.ack(h.slot, h.has(RinaHeader::ECN_ECHO), now, &mut self.rtt) {
                    self.tasks.retain(|&(tr, ts), _| !(tr == h.req && ts == h.step));
                }
            }
            RinaKind::AgAck => {
                self.ag.ack((h.req, h.chunk, h.seq), h.has(RinaHeader::ECN_ECHO), now, &mut self.rtt);
            }
            RinaKind::Agg if known && (h.chunk as usize) < self.groups() => self.on_agg(now, h, &pkt),
            RinaKind::Ag if known && (h.chunk as usize) < self.groups() => {
                if self.is_receiver() && !h.has(RinaHeader::REPAIR) {
                    let a = RinaHeader { kind: RinaKind::AgAck, flags: if pkt.ecn { RinaHeader::ECN_ECHO } else { 0 }, member: self.member, count: 0, ..h };
                    self.ctrl.push_back(self.control(a, Endpoint { host: pkt.src, port: pkt.src_port }));
                }
                self.on_full_packet(now, r, h, &pkt, h.hop + 1);
            }
            RinaKind::Nack if known && self.role == Role::Agent => self.on_nack(h, &pkt),
            RinaKind::Agg | RinaKind::Ag | RinaKind::Nack if !known => self.keep_early(pkt),
            _ => self.c.malformed += 1,
        }
    }

    fn handle_timeout(&mut self, now: Time) {
        while let Some(&(at, r, st)) = self.delayed.first() {
            if at > now {
                break;
            }
            self.delayed.pop_first();
            self.send_step(now, r as usize, st);
        }
        if self.pull_due.is_some_and(|t| t <= now) {
            self.drain_pulls(now);
        }
        let mut resend = VecDeque::new();
        self.c.retransmits += self.sr.expire(now, &self.rtt, &mut resend);
        self.c.retransmits += self.ag.expire(now, &self.rtt, &mut resend);
        self.ctrl.extend(resend);
        // A TASK whose PULL has not come back is sent again.
        let rto = self.rtt.rto();
        for (at, p) in self.tasks.values_mut() {
            if *at <= now {
                *at = now + rto;
                self.ctrl.push_back(p.clone());
                self.c.task_resends += 1;
            }
        }
        if self.repair_at.is_some_and(|t| t <= now) {
            self.send_nacks(now);
            self.repair_at = self.reqs.iter().any(|q| !q.done).then(|| now + self.cfg.repair_ps);
        }
    }

    fn poll_transmit(&mut self, now: Time) -> Option<Packet> {
        if let Some(p) = self.ctrl.pop_front() {
            return Some(p);
        }
        // A member's DATA in flight span fewer than the job's slots, so live tags never share
        // a slot at the ToR.
        let span = self.cfg.slots;
        if let Some(p) = self.sr.next(now, &self.rtt, |q, oldest| oldest.map_or(true, |o| q.wrapping_sub(o) < span)) {
            match self.role {
                Role::Autonomous => self.c.aggs_sent += 1,
                _ => self.c.data_sent += 1,
            }
            return Some(p);
        }
        let p = self.ag.next(now, &self.rtt, |_, _| true)?;
        self.c.ag_sent += 1;
        Some(p)
    }

    fn poll_timeout(&self) -> Option<Time> {
        let delayed = self.delayed.first().map(|&(t, _, _)| t);
        [self.sr.next_deadline(), self.ag.next_deadline(), self.tasks.values().map(|(t, _)| *t).min(), self.repair_at, delayed, self.pull_due].into_iter().flatten().min()
    }

    fn poll_event(&mut self) -> Option<HostEvent> {
        self.events.pop_front()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = &self.c;
        vec![
            ("tasks", c.tasks),
            ("task_resends", c.task_resends),
            ("pulls", c.pulls),
            ("data_sent", c.data_sent),
            ("aggs_sent", c.aggs_sent),
            ("ag_sent", c.ag_sent),
            ("retransmits", c.retransmits),
            ("duplicates", c.duplicates),
            ("sr_hops", c.sr_hops),
            ("ag_hops", c.ag_hops),
            ("nacks", c.nacks),
            ("repairs", c.repairs),
            ("repairs_unavailable", c.repairs_unavailable),
            ("early", c.early),
            ("window_cuts", self.sr.window.cuts() + self.ag.window.cuts()),
            ("in_flight", (self.sr.flights.len() + self.ag.flights.len()) as u64),
            ("queued", (self.sr.queue.len() + self.ag.queue.len()) as u64),
            ("chunks_missing", self.reqs.iter().map(|q| q.chunks_left as u64).sum()),
            ("malformed", c.malformed),
            ("failures", c.failures),
            ("repaired", c.repaired),
            ("rerun", c.rerun),
            ("unrepairable", c.unrepairable),
            ("stale_epoch", c.stale_epoch),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inalab_core::TensorAttrs;

    fn cfg() -> RinaConfig {
        let ep = |h| Endpoint { host: h, port: 1 };
        RinaConfig {
            job: 3,
            groups: vec![RinaGroup { members: vec![ep(0), ep(1)], tor: Some(10) }, RinaGroup { members: vec![ep(2)], tor: None }],
            ranks: vec![ep(0), ep(1), ep(2)],
            header_bytes: 71,
            rto_ps: 1_000_000,
            window_bytes: 60_000,
            slots: 256,
            repair_ps: 2_000_000,
            step_overhead_ps: 0,
            step_jitter_ps: 0,
            seed: 1,
        }
    }

    #[test]
    fn groups_must_list_each_rank_once() {
        let ep = |h| Endpoint { host: h, port: 1 };
        let mut c = cfg();
        c.groups[1].members = vec![ep(1)];
        let e = RinaHost::new(c, ep(2)).err().expect("rank 2 is in no group, rank 1 in two");
        assert!(e.0.contains("each of the 3 ranks once") && e.0.contains("2 distinct"), "{}", e.0);
    }

    #[test]
    fn a_wire_request_is_the_nearest_with_its_low_24_bits() {
        let m = 1u32 << 24;
        let epoch = 5 << 24;
        for (next, wire, want) in [(0, 0, 0), (3, 2, 2), (3, 7, 7), (m + 2, 1, m + 1), (m + 2, m - 1, m - 1), (m - 1, 3, m + 3), (2 * m + 9, 4, 2 * m + 4)] {
            assert_eq!(unwrap_req(next, wire | epoch), want, "next {next}, wire {wire}");
        }
    }

    /// Forged and garbled packets of every kind reach every role: each is counted or used,
    /// never a panic.
    #[test]
    fn hostile_packets_never_panic() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x = inalab_core::splitmix64(x);
            x
        };
        for me in [0, 1, 2] {
            let mut host = RinaHost::new(cfg(), Endpoint { host: me, port: 1 }).unwrap();
            host.submit(0, AppRequest::Allreduce { id: 1, bytes: 4000, data: Some(Payload::I32(vec![1; 1000])), attrs: TensorAttrs::default() });
            for t in 1..20_000u64 {
                let r = next();
                let h = RinaHeader {
                    kind: RinaKind::ALL[(r % 8) as usize],
                    flags: (r >> 3) as u8 & 0x0F,
                    member: (r >> 7) as u8 % 3,
                    hop: (r >> 9) as u8 % 4,
                    job: if r >> 11 & 7 == 0 { 4 } else { 3 },
                    step: (r >> 14) as u16 % 4,
                    chunk: (r >> 16) as u16 % 4,
                    count: (r >> 18) as u16 % 70,
                    req: (r >> 25) as u32 % 3,
                    seq: if r >> 27 & 1 == 0 { (r >> 28) as u32 % 12 } else { (r >> 28) as u32 },
                    slot: (r >> 32) as u32 % 600,
                    arg: (r >> 40) as u32 % 30,
                };
                let mut p = Packet::new((r >> 44) as u32 % 12, 1, me, 1, 300, Header::Rina(h));
                let len = (next() % 80) as usize;
                p.payload = (next() % 4 != 0).then(|| Box::new(Payload::I32(vec![7; len])));
                host.handle_packet(t * 1000, p);
                if t % 97 == 0 {
                    host.handle_timeout(t * 1000);
                }
                if t % 4999 == 0 {
                    // The driver says a worker died (any rank, this one and unknown ones too).
                    host.peer_failed(t * 1000, (next() % 5) as u32);
                }
                while host.poll_transmit(t * 1000).is_some() {}
            }
            assert!(host.counters().iter().any(|&(n, v)| n == "malformed" && v > 0));
        }
    }

    #[test]
    fn a_host_forgets_the_packet_marks_of_finished_allreduces() {
        // Found in the real runtime (#36): every request kept a mark per packet for the job,
        // about 17 KB per allreduce of 1 M values. Two autonomous workers in a ring, 300
        // allreduces of 6,200 values: the marks kept stay those of the one in progress.
        let ep = |h| Endpoint { host: h, port: 1 };
        let c = RinaConfig { groups: vec![RinaGroup { members: vec![ep(0)], tor: None }, RinaGroup { members: vec![ep(1)], tor: None }], ranks: vec![ep(0), ep(1)], ..cfg() };
        let mut hosts: Vec<RinaHost> = (0..2).map(|h| RinaHost::new(c.clone(), ep(h)).unwrap()).collect();
        for k in 0..300u64 {
            for (r, h) in hosts.iter_mut().enumerate() {
                h.submit(k, AppRequest::Allreduce { id: k, bytes: 0, data: Some(Payload::I32(vec![r as i32 + k as i32; 6200])), attrs: TensorAttrs::default() });
            }
            loop {
                let out: Vec<Packet> = hosts.iter_mut().flat_map(|h| std::iter::from_fn(move || h.poll_transmit(k))).collect();
                if out.is_empty() {
                    break;
                }
                for p in out {
                    let to = p.dst as usize;
                    hosts[to].handle_packet(k, p);
                }
            }
            for h in &mut hosts {
                match h.poll_event() {
                    Some(HostEvent::Done { id, data: Some(Payload::I32(v)) }) => assert_eq!((id, v[6199]), (k, 1 + 2 * k as i32)),
                    e => panic!("allreduce {k}: {e:?}"),
                }
                assert_eq!(h.retained_marks(), 0, "allreduce {k}: nothing in progress, no marks kept");
            }
        }
    }
}
