//! ATP's end hosts (Lao et al., NSDI '21, §3.6-3.8): [`AtpWorker`] streams gradient fragments
//! to the PS through ATP switches, [`AtpServer`] (the PS) completes whatever the switches did
//! not aggregate and returns parameter packets, which double as ACKs.
//!
//! # Layout ([`atp_layout`])
//! A job's aggregation hierarchy from the workers' racks and the PS's rack. A worker in a
//! rack other than the PS's whose switch runs ATP aggregates at level 1: `bitmap0` is its
//! one-hot position in its rack, `fan_in0` the job's workers in that rack, and the rack is
//! one level-2 contributor (`bitmap1` one-hot). A worker in the PS's rack (or in a rack
//! without ATP) skips level 1 (`esi` starts at 1) and is itself a level-2 contributor.
//! `fan_in1` is the number of level-2 contributors. At most 32 workers per rack and 32
//! contributors (32 x 32 = 1024 workers, 32-bit bitmaps).
//!
//! # Worker
//! Each `Allreduce` is cut into fragments of `(packet_bytes - header_bytes) / 4` values (62
//! for 306 B); sequence numbers run across the job's whole stream. As in the authors' code
//! (`common/HashTable.cc`, `client/p4ml_manager.cc`), a job has a table of `slots` aggregator
//! indexes ([`AtpConfig::slot_table`]), the same at every worker and the PS, and fragment
//! `seq` uses slot `seq % slots`. A sliding window with an expected sequence number:
//! fragments are sent while in flight < window (AIMD in packets of `packet_bytes`, or fixed,
//! never above `slots`) and while the new fragment is less than `slots` past the expected one,
//! so the slot's previous fragment has its parameter and its aggregator is free at every
//! switch the job uses: a job never collides with itself. A parameter with the expected seq
//! advances the window, already-received ones are ignored. Loss is detected per fragment,
//! like SACK holes: a fragment still missing when three parameters of later fragments have
//! arrived is resent once with `FLAG_RESEND` (ATP's "three out-of-order parameters", counted
//! for every missing fragment rather than only the expected one, so that several fragments
//! stalled in partial aggregations recover in one round trip), without a window cut; a
//! fragment without its parameter a loss timeout after its last (re)send is resent and the
//! window halves (each fragment's timer runs from its own departure). The loss timeout is the
//! configured timeout (the paper's 1 ms, SwitchML's), or RFC 6298's SRTT + 4 RTTVAR from
//! fragments sent once when that is longer, at most [`LOSS_TIMEOUT_MAX_FACTOR`] times the
//! timeout: a round trip that includes the wait for the other workers (ATP §3.7) can exceed a
//! fixed timeout on busy hosts, and a fixed timer then resends whole windows that were not
//! lost (the UDP runtime's 8-worker runs on two cores). Where round trips stay below the
//! timeout (the simulator's fabrics) it is the fixed timeout. The paper halves on three
//! out-of-order parameters too (§3.7); the authors' code does not, and neither does inalab: a
//! fragment behind its successors is mostly one stalled in a partial aggregation (some of its
//! packets collided at a switch, the others took a free aggregator), which is no congestion,
//! and congestion is marked by ECN before a queue overflows. Halving there cost 8 concurrent
//! jobs of 8 workers up to 2x their JCT (`benchmarks/ina_scale.py`). A request is `Done` when all
//! its fragments' parameters arrived (requests complete in FIFO order).
//!
//! The window may not run past a missing fragment by more than `slots`, so while a hole waits
//! the whole job waits. A lost *resend* would wait for the 1 ms timeout, which on a fabric
//! with microsecond round trips stalls every worker of the job for hundreds of round trips
//! and then makes the others time out too. So (our addition; the paper only has the
//! timeout): when the expected fragment was resent and holds the window back, it is resent
//! again ("probes") one RTO after its last resend, RFC 6298's SRTT + 4 RTTVAR from fragments
//! sent once, at least 10 us and at most the timeout, doubled on every probe. Like TCP's tail
//! loss probe, a probe does not cut the window (the resend may only be waiting at the PS for
//! other workers' resends).
//!
//! # PS
//! Per seq a worker bitset (up to 1024) reconstructed from the packet: `esi == 2` covers every
//! worker of each contributor in `bitmap1`; `esi < 2` covers the workers of the single
//! contributor in `bitmap1` (for a rack: the members in `bitmap0`). Non-overlapping packets
//! are summed; a packet overlapping what is already summed is dropped whole (§3.6). On
//! completion the parameter packet (`FLAG_ACK`, `FLAG_ECN` if any contributing packet was
//! marked, the values) goes either once toward the PS's ATP switch for multicast or once per
//! worker. Results are kept, so a resend for a completed seq is answered again: when switches
//! copy the answer, the first resend at once, further ones at most once per
//! `resend_holdoff_ps` (every worker resends a seq whose multicast was lost, and one answer
//! serves them all); when the PS sends to each worker itself, to the asking worker alone.
//!
//! # Dynamic hashing (§3.6)
//! A `FLAG_COLLISION` on any packet of a seq makes the PS move that seq's slot ([`Rehasher`]):
//! to an aggregator the job has never used, drawn from a seeded permutation of the pool
//! without replacement (the authors' `HashNew_predefine`), announced with `FLAG_REHASH` and
//! `bitmap0 = new` in the seq's parameter packets. Workers move the slot for good, so a
//! conflict between two jobs ends once the later one has moved, which is the convergence the
//! paper reports (§5.4.1). The paper writes the new index as HASH(<aggregatorIndex>); a hash
//! of the index alone sends every move along the same chains, which end in a few cycles, and
//! with replacement a move can land on another of the job's own slots. Only `Hashing::Hash`
//! moves slots; the linear strawman and static slices keep theirs.
//!
//! # Overflow (§3.8)
//! A float32 request is carried in fixed point with `AtpConfig::scale`; a fragment holding a
//! value whose scaled magnitude does not fit an i32 is sent saturated with `FLAG_OVERFLOW`.
//! A seq whose aggregate saturated (`FLAG_OVERFLOW` from a worker or a switch, or the PS's own
//! i32 sum overflowing) is answered with a `FLAG_OVERFLOW` parameter that carries no values and
//! asks for floats; workers resend that fragment as `Payload::F32` with `FLAG_FLOAT` (their
//! original float32 values; switches never aggregate those), the PS sums the floats per worker
//! and returns them with `FLAG_FLOAT | FLAG_ACK`, and a float request takes the float sum as
//! its result. An i32 request (the simulator's payload mode) sends its integers as floats
//! (exact below 2^24) and rounds the float sum back.

//! # Choices where the paper is silent
//! - Every newly received parameter (in order or not) feeds the AIMD window; duplicates are
//!   ignored entirely. AIMD reacts once per window (see [`AimdWindow`]).
//! - A resend uses the aggregator index the fragment was first sent with.
//! - A rehash applies only if the parameter's `agg_index` is the slot's current index and the
//!   new index is in the pool and not already in the table (a late duplicate cannot undo a
//!   newer move, a forged one cannot make two slots share an aggregator).
//! - The PS keeps a completed result only while a worker may still ask for it (the paper's PS
//!   stores parameters; kept for the whole run, it grew by 4.4 MiB per 1 M-value allreduce in
//!   the real runtime, #36). A worker sends fragment `t` only while `t` is less than `slots`
//!   past its first seq without a parameter, so once every worker sent `t` (its coverage is
//!   complete) every worker has the parameters of every seq up to `t - slots`: those are
//!   forgotten, and a late packet for one is dropped. At most about `3 x slots` seqs are kept.

use crate::aimd::AimdConfig;
use crate::cc::{CongestionControl, WindowRules};
use crate::error::ensure;
use crate::rtt::{RttConfig, RttEstimator};
use crate::ConfigError;
use inalab_core::time::{Time, MS};
use inalab_core::wire::{AtpHeader, Header};
use inalab_core::{splitmix64, AppRequest, Endpoint, HostEvent, HostProtocol, NodeId, Packet, Payload};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Most workers a job can have: 32 per rack x 32 level-2 contributors.
pub const ATP_MAX_WORKERS: usize = 1024;
const WORDS: usize = ATP_MAX_WORKERS / 64;
/// Floor of the RTO that probes a lost resend (and its clock granularity): 10 us.
const PROBE_MIN_PS: Time = 10 * inalab_core::time::US;
/// The loss timeout from measured round trips stays within this many times the configured
/// timeout (SwitchML's RTO back-off has the same ceiling).
pub const LOSS_TIMEOUT_MAX_FACTOR: Time = 64;
/// Default slots per job (and ceiling of the window in packets): 512 x 306 B = 157 KB, above
/// the bandwidth-delay product of a 100 Gbps fabric with a 10 us round trip. The paper starts
/// the window at 200 packets (§3.7); the authors' code caps both at 100 per thread.
pub const DEFAULT_SLOTS: u32 = 512;
/// Most slots a job may have: 2^20 (a 4 MiB table; a Tofino pool is a few tens of thousands).
pub const MAX_SLOTS: u32 = 1 << 20;

/// How a job fills its slot table (which aggregators its fragments use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hashing {
    /// ATP: slot i takes `HASH(<job, i>) % aggregators`, probed until the job's slots are
    /// distinct (the authors' `HashNew_crc`), and the PS moves a slot that collides to an
    /// aggregator the job has not used yet (§3.6, dynamic hashing).
    Hash,
    /// Slot i takes aggregator i: every job starts at aggregator 0, and nothing is rehashed
    /// (ATP Fig. 14's strawman, "without hashing enabled").
    Linear,
    /// Static allocation (SwitchML-style, ATP Figs. 13a and 14): the job owns aggregators
    /// `[offset, offset + size)` and has `size` slots, so its window is its slice; jobs never
    /// collide and nothing is rehashed.
    Static { offset: u32, size: u32 },
}

/// A worker's position in the aggregation hierarchy: the header fields it sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtpPosition {
    pub esi: u8,
    pub bitmap0: u32,
    pub bitmap1: u32,
    pub fan_in0: u8,
    pub fan_in1: u8,
}

/// A level-2 contributor: a rack aggregated at level 1 (its workers by position) or a single
/// worker, by rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Contributor {
    Rack(Vec<usize>),
    Worker(usize),
}

/// A job's aggregation hierarchy. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtpLayout {
    /// Per worker rank.
    pub positions: Vec<AtpPosition>,
    /// By `bitmap1` bit.
    pub contributors: Vec<Contributor>,
}

/// Builds a job's layout. `worker_racks[r]` is worker r's rack (any id, e.g. its ToR),
/// `ps_rack` the PS's rack, `aggregates(rack)` whether that rack's switch runs ATP.
pub fn atp_layout<R: PartialEq + Copy>(worker_racks: &[R], ps_rack: R, aggregates: impl Fn(R) -> bool) -> Result<AtpLayout, ConfigError> {
    ensure!(!worker_racks.is_empty(), "an ATP job needs at least one worker");
    ensure!(worker_racks.len() <= ATP_MAX_WORKERS, "an ATP job has at most {ATP_MAX_WORKERS} workers, got {}", worker_racks.len());
    let mut contributors: Vec<Contributor> = vec![];
    let mut rack_of: Vec<(R, usize)> = vec![];
    // (contributor, position in rack) per worker.
    let mut place = vec![];
    for (r, &rack) in worker_racks.iter().enumerate() {
        if rack != ps_rack && aggregates(rack) {
            let c = match rack_of.iter().find(|(x, _)| *x == rack) {
                Some(&(_, c)) => c,
                None => {
                    contributors.push(Contributor::Rack(vec![]));
                    rack_of.push((rack, contributors.len() - 1));
                    contributors.len() - 1
                }
            };
            let Contributor::Rack(members) = &mut contributors[c] else { unreachable!() };
            members.push(r);
            ensure!(members.len() <= 32, "an ATP job has at most 32 workers in one rack (bitmap0 is 32 bits)");
            place.push((c, members.len() - 1));
        } else {
            contributors.push(Contributor::Worker(r));
            place.push((contributors.len() - 1, 0));
        }
    }
    ensure!(
        contributors.len() <= 32,
        "an ATP job has at most 32 level-2 contributors (racks with ATP other than the PS's, plus workers in the PS's rack or in racks without ATP), got {}",
        contributors.len()
    );
    let fan_in1 = contributors.len() as u8;
    let positions = place
        .iter()
        .map(|&(c, pos)| match &contributors[c] {
            Contributor::Rack(m) => AtpPosition { esi: 0, bitmap0: 1 << pos, bitmap1: 1 << c, fan_in0: m.len() as u8, fan_in1 },
            Contributor::Worker(_) => AtpPosition { esi: 1, bitmap0: 1, bitmap1: 1 << c, fan_in0: 1, fan_in1 },
        })
        .collect();
    Ok(AtpLayout { positions, contributors })
}

/// Settings shared by an ATP job's worker and PS.
#[derive(Debug, Clone, PartialEq)]
pub struct AtpConfig {
    pub job: u32,
    /// Bytes on the wire of a full gradient packet. Default 306.
    pub packet_bytes: u32,
    /// Header bytes of a packet; the rest carries i32 values. Default 58.
    pub header_bytes: u32,
    pub hashing: Hashing,
    /// Aggregators the index is taken modulo (the smallest pool among the job's switches;
    /// 0 = no pool, every index is 0).
    pub aggregators: u32,
    /// Slots of the job's table: fragment `seq` uses slot `seq % slots`, and a worker never
    /// has fragments more than `slots` apart in flight, so a job never collides with itself
    /// while the pool has `slots` aggregators. A static job has at most its slice. Default 512.
    pub slots: u32,
    /// ECN/loss AIMD window (false: a fixed window of `aimd.initial_window_bytes`).
    pub congestion_control: bool,
    pub aimd: AimdConfig,
    /// The rules of the window. Default ATP's AIMD.
    pub window_rules: WindowRules,
    /// Worker loss-recovery timeout. Default 1 ms.
    pub timeout_ps: Time,
    /// Fixed-point scale of float32 requests (value x scale as i32). Default 1e8 (ATP's).
    pub scale: f64,
    /// The ECMP key every gradient packet of the job carries (tree mode: one key for the
    /// whole job, so that the routes to the PS form one tree); `None`: each worker's own flow.
    pub flow: Option<u64>,
    /// Fragments take this many paths that may overtake each other (seq modulo `lanes`: a
    /// sharded runtime switch's threads); a parameter counts as out of order only for missing
    /// fragments of its own path. Default 1.
    pub lanes: u32,
}

impl Default for AtpConfig {
    fn default() -> Self {
        AtpConfig {
            job: 0,
            packet_bytes: 306,
            header_bytes: 58,
            hashing: Hashing::Hash,
            aggregators: 0,
            slots: DEFAULT_SLOTS,
            congestion_control: true,
            aimd: AimdConfig { initial_window_bytes: 200 * 306, increment_bytes: 1500, min_window_bytes: 306, initial_ssthresh_bytes: u64::MAX, max_window_bytes: u64::MAX },
            window_rules: WindowRules::Aimd,
            timeout_ps: MS,
            scale: crate::quant::ATP_SCALE,
            flow: None,
            lanes: 1,
        }
    }
}

impl AtpConfig {
    fn check(&self) -> Result<usize, ConfigError> {
        ensure!(
            self.packet_bytes > self.header_bytes && (self.packet_bytes - self.header_bytes) % 4 == 0,
            "packet_bytes {} minus header_bytes {} must be a positive multiple of 4",
            self.packet_bytes,
            self.header_bytes
        );
        ensure!(self.timeout_ps > 0, "timeout must be positive");
        ensure!((1..=MAX_SLOTS).contains(&self.slots), "slots must be 1..={MAX_SLOTS}, got {}", self.slots);
        ensure!(self.scale.is_finite() && self.scale > 0.0, "scale must be a positive number, got {}", self.scale);
        Ok(((self.packet_bytes - self.header_bytes) / 4) as usize)
    }

    /// The job's slot table before any rehash: aggregator index per slot. Every worker and
    /// the PS compute the same one. With more slots than aggregators the table wraps around
    /// the pool: fragments on a repeated aggregator meet the job's own and fall back to the
    /// PS, so the job still sends its whole window and the PS link carries what the pool
    /// cannot (ATP's best effort, Figs. 13a and 15). A static job's table is its slice, so its
    /// window is the slice (SwitchML's). With no pool (or an empty slice) every slot holds
    /// index `aggregators`, beyond the pool, which switches send on to the PS.
    pub fn slot_table(&self) -> Vec<u32> {
        let pool = self.aggregators;
        let n = self.slots.max(1);
        match self.hashing {
            Hashing::Static { size: 0, .. } => vec![pool; n as usize],
            _ if pool == 0 => vec![pool; n as usize],
            Hashing::Static { offset, size } => (0..n.min(size)).map(|i| offset + i).collect(),
            Hashing::Linear => (0..n).map(|i| i % pool).collect(),
            Hashing::Hash => {
                let mut taken = BTreeSet::new();
                let distinct: Vec<u32> = (0..n.min(pool))
                    .map(|i| {
                        let key = splitmix64((self.job as u64) << 32 | i as u64);
                        // Probe with a salt until the slot is distinct (ATP's HashNew_crc);
                        // a near-full table falls back to the first free index.
                        let probed = (0..4 * pool as u64).map(|salt| (splitmix64(key ^ salt) % pool as u64) as u32).find(|x| !taken.contains(x));
                        let x = probed.unwrap_or_else(|| (0..pool).find(|x| !taken.contains(x)).expect("slots <= pool"));
                        taken.insert(x);
                        x
                    })
                    .collect();
                (0..n as usize).map(|i| distinct[i % distinct.len()]).collect()
            }
        }
    }

    /// Whether the PS moves colliding slots (ATP's dynamic hashing; not the strawmen).
    pub fn rehashes(&self) -> bool {
        self.hashing == Hashing::Hash && self.aggregators > 0
    }
}

/// The PS's choice of new aggregators for colliding slots (§3.6; the authors' PS takes them
/// from a shuffled list of the pool, `HashNew_predefine`): a lazy Fisher-Yates permutation of
/// the pool seeded by the job, skipping aggregators the job already uses, so each one is
/// handed out at most once and a job's moves never land on its own slots. An index that
/// collided keeps its replacement (`moved`), so every fragment of that slot gets the same
/// answer; when the pool is exhausted the slot stays where it is.
#[derive(Debug, Clone)]
pub struct Rehasher {
    pool: u32,
    seed: u64,
    /// Permutation prefix drawn so far; `swapped` holds the displaced tail entries.
    drawn: u32,
    swapped: BTreeMap<u32, u32>,
    used: BTreeSet<u32>,
    moved: BTreeMap<u32, u32>,
}

impl Rehasher {
    pub fn new(cfg: &AtpConfig) -> Self {
        let table = if cfg.rehashes() { cfg.slot_table() } else { Vec::new() };
        Rehasher::for_table(cfg.aggregators, cfg.job, &table)
    }

    /// The rehasher of job `job` whose slots start on `table` in a pool of `pool` (DSA's
    /// `move_slots` ablation draws from the same permutation ATP's PS would).
    pub fn for_table(pool: u32, job: u32, table: &[u32]) -> Self {
        let used = table.iter().copied().collect();
        Rehasher { pool, seed: splitmix64(0x5eed_0000_0000 ^ job as u64), drawn: 0, swapped: BTreeMap::new(), used, moved: BTreeMap::new() }
    }

    /// The aggregator that replaces `old`, or `None` if no unused one is left.
    pub fn replace(&mut self, old: u32) -> Option<u32> {
        if let Some(&new) = self.moved.get(&old) {
            return Some(new);
        }
        while self.drawn < self.pool {
            let i = self.drawn;
            let j = i + (splitmix64(self.seed ^ i as u64) % (self.pool - i) as u64) as u32;
            let at = |k: u32, m: &BTreeMap<u32, u32>| *m.get(&k).unwrap_or(&k);
            let (vi, vj) = (at(i, &self.swapped), at(j, &self.swapped));
            self.swapped.insert(j, vi);
            self.swapped.remove(&i);
            self.drawn += 1;
            if self.used.insert(vj) {
                self.moved.insert(old, vj);
                return Some(vj);
            }
        }
        None
    }
}

fn atp_header(p: &Packet) -> Option<AtpHeader> {
    match p.header {
        Header::Atp(h) => Some(h),
        _ => None,
    }
}

struct Request {
    id: u64,
    first_seq: u32,
    frags: u32,
    values: usize,
    /// What the fragments carry: i32, converted with `cfg.scale` if the request was floats.
    data: Option<Payload>,
    /// A float32 request's own values: what the overflow fallback sends (§3.8).
    floats: Option<Vec<f32>>,
    /// Fragments (by index in the request) with a value beyond the fixed-point range: sent
    /// with `FLAG_OVERFLOW`, so the PS asks for floats at once.
    saturated: BTreeSet<u32>,
    result: Option<Payload>,
    remaining: u32,
}

/// ATP worker. See the module docs.
pub struct AtpWorker {
    local: Endpoint,
    ps: Endpoint,
    cfg: AtpConfig,
    pos: AtpPosition,
    per_packet: usize,
    reqs: VecDeque<Request>,
    /// Next fragment seq to send for the first time; `end_seq` is one past the last submitted.
    next_seq: u32,
    end_seq: u32,
    /// First seq whose parameter has not arrived.
    expected: u32,
    /// Parameters received above `expected`.
    received: BTreeSet<u32>,
    /// Sent fragments whose parameter has not arrived.
    outstanding: BTreeMap<u32, Outstanding>,
    /// Aggregator index per slot (fragment `seq` uses slot `seq % slots.len()`), moved by
    /// the PS's rehash instructions; `in_table` holds the same indexes as a set.
    slots: Vec<u32>,
    in_table: BTreeSet<u32>,
    /// (send time, seq) of every (re)send, in time order: the loss-recovery timer runs from
    /// the oldest one still current (a seq resent later, or acknowledged, is skipped).
    sends: VecDeque<(Time, u32)>,
    /// Fragments to send as floats (the PS asked after an overflow).
    float_seqs: BTreeSet<u32>,
    /// Resends waiting for the NIC.
    resend_q: VecDeque<u32>,
    window: Box<dyn CongestionControl>,
    /// Round trips of fragments sent once, for the probe of a lost resend.
    rtt: RttEstimator,
    events: VecDeque<HostEvent>,
    fragments_sent: u64,
    resends: u64,
    timeouts: u64,
    ecn_cuts: u64,
    float_resends: u64,
    probes: u64,
}

/// A sent fragment waiting for its parameter.
#[derive(Debug, Clone, Copy)]
struct Outstanding {
    /// Aggregator index it was sent with (resends reuse it).
    index: u32,
    /// Last (re)send.
    sent_at: Time,
    /// Parameters of later fragments received since that send.
    later_params: u8,
    fast_resent: bool,
    /// Resent at least once (its parameter is then no RTT sample: Karn's rule).
    resent: bool,
}

impl AtpWorker {
    /// Worker at `local` sending to the PS at `ps` with its layout position.
    pub fn new(local: Endpoint, ps: Endpoint, pos: AtpPosition, cfg: AtpConfig) -> Result<Self, ConfigError> {
        let per_packet = cfg.check()?;
        let slots = cfg.slot_table();
        // The window never exceeds the slots, so no two fragments in flight share one.
        let aimd = AimdConfig { max_window_bytes: cfg.aimd.max_window_bytes.min(slots.len() as u64 * cfg.packet_bytes as u64), ..cfg.aimd.clone() };
        let window = cfg.window_rules.window(&aimd);
        Ok(AtpWorker {
            local,
            ps,
            pos,
            per_packet,
            reqs: VecDeque::new(),
            next_seq: 0,
            end_seq: 0,
            expected: 0,
            received: BTreeSet::new(),
            outstanding: BTreeMap::new(),
            in_table: slots.iter().copied().collect(),
            slots,
            sends: VecDeque::new(),
            float_seqs: BTreeSet::new(),
            resend_q: VecDeque::new(),
            window,
            rtt: RttEstimator::new(RttConfig { initial_rto_ps: cfg.timeout_ps, min_rto_ps: PROBE_MIN_PS.min(cfg.timeout_ps), max_rto_ps: cfg.timeout_ps, granularity_ps: PROBE_MIN_PS.min(cfg.timeout_ps) }),
            events: VecDeque::new(),
            fragments_sent: 0,
            resends: 0,
            timeouts: 0,
            ecn_cuts: 0,
            float_resends: 0,
            probes: 0,
            cfg,
        })
    }

    /// Current window, bytes.
    pub fn window_bytes(&self) -> u64 {
        self.window.window()
    }

    fn window_packets(&self) -> u64 {
        let bytes = if self.cfg.congestion_control { self.window.window() } else { self.cfg.aimd.initial_window_bytes };
        (bytes / self.cfg.packet_bytes as u64).clamp(1, self.slots.len() as u64)
    }

    /// A new fragment may go: within the window, and its slot's previous fragment (`slots`
    /// seqs back) has its parameter, so the slot is free at every switch.
    fn may_send(&self) -> bool {
        self.next_seq < self.end_seq && self.in_flight() < self.window_packets() && ((self.next_seq - self.expected) as usize) < self.slots.len()
    }

    fn in_flight(&self) -> u64 {
        (self.next_seq - self.expected) as u64 - self.received.len() as u64
    }

    fn request_of(&self, seq: u32) -> Option<usize> {
        let i = self.reqs.partition_point(|r| r.first_seq + r.frags <= seq);
        (i < self.reqs.len() && self.reqs[i].first_seq <= seq).then_some(i)
    }

    /// (request, first value, values) of a fragment.
    fn fragment(&self, seq: u32) -> (usize, usize, usize) {
        let r = self.request_of(seq).expect("fragment of a live request");
        let q = &self.reqs[r];
        let start = (seq - q.first_seq) as usize * self.per_packet;
        (r, start, (q.values - start).min(self.per_packet))
    }

    fn slot(&self, seq: u32) -> usize {
        seq as usize % self.slots.len()
    }

    fn current_index(&self, seq: u32) -> u32 {
        self.slots[self.slot(seq)]
    }

    fn build(&self, now: Time, seq: u32, resend: bool) -> Packet {
        let (r, start, len) = self.fragment(seq);
        let float = self.float_seqs.contains(&seq);
        let p = &self.pos;
        let mut flags = if resend { AtpHeader::FLAG_RESEND } else { 0 };
        if float {
            flags |= AtpHeader::FLAG_FLOAT | AtpHeader::FLAG_RESEND;
        } else if self.reqs[r].saturated.contains(&(seq - self.reqs[r].first_seq)) {
            flags |= AtpHeader::FLAG_OVERFLOW;
        }
        let agg_index = self.outstanding.get(&seq).map_or_else(|| self.current_index(seq), |o| o.index);
        let h = AtpHeader {
            job: self.cfg.job,
            seq,
            agg_index,
            bitmap0: p.bitmap0,
            bitmap1: p.bitmap1,
            fan_in0: p.fan_in0,
            fan_in1: p.fan_in1,
            esi: p.esi,
            flags,
        };
        let size = self.cfg.header_bytes + 4 * len as u32;
        let mut pkt = Packet::new(self.local.host, self.local.port, self.ps.host, self.ps.port, size, Header::Atp(h));
        pkt.created = now;
        if let Some(f) = self.cfg.flow {
            pkt.flow = f;
        }
        let req = &self.reqs[r];
        pkt.payload = match (float, &req.floats, &req.data) {
            // The fallback carries the application's own floats when it gave floats; the
            // simulator's integers otherwise (exact as f32 below 2^24).
            (true, Some(f), _) => Some(Box::new(Payload::F32(f[start..start + len].to_vec()))),
            (true, None, Some(Payload::I32(v))) => Some(Box::new(Payload::F32(v[start..start + len].iter().map(|&x| x as f32).collect()))),
            (_, _, d) => d.as_ref().map(|d| Box::new(d.slice(start, start + len))),
        };
        pkt
    }

    fn congestion(&mut self) {
        if self.cfg.congestion_control {
            self.window.on_congestion(self.next_seq as u64);
        }
    }

    fn queue_resend(&mut self, seq: u32) {
        if !self.resend_q.contains(&seq) {
            self.resend_q.push_back(seq);
        }
    }

    /// When the expected fragment, already resent and holding the window back, is resent
    /// again: one RTO (RFC 6298, from fragments sent once) after its last resend.
    /// How long a fragment waits for its parameter before it is resent (see the module docs).
    fn loss_timeout(&self) -> Time {
        let t = self.cfg.timeout_ps;
        self.rtt.estimate().map_or(t, |e| e.clamp(t, t.saturating_mul(LOSS_TIMEOUT_MAX_FACTOR)))
    }

    fn probe_at(&self) -> Option<Time> {
        let o = self.outstanding.get(&self.expected).filter(|o| o.resent)?;
        (!self.may_send() && self.resend_q.is_empty()).then(|| o.sent_at + self.rtt.rto())
    }

    /// Whether a (time, seq) entry of `sends` is still the seq's latest send and unanswered.
    fn current_send(&self, &(t, seq): &(Time, u32)) -> bool {
        self.outstanding.get(&seq).is_some_and(|o| o.sent_at == t)
    }

    fn drop_stale_sends(&mut self) {
        while self.sends.front().is_some_and(|e| !self.current_send(e)) {
            self.sends.pop_front();
        }
    }

    fn on_parameter(&mut self, now: Time, h: AtpHeader, pkt: Packet) {
        let seq = h.seq;
        if seq < self.expected || seq >= self.next_seq || self.received.contains(&seq) {
            return; // duplicate (or never sent): ignored
        }
        if h.has(AtpHeader::FLAG_OVERFLOW) {
            // The PS asks for this fragment's original values as floats.
            if self.float_seqs.insert(seq) {
                self.float_resends += 1;
                self.queue_resend(seq);
            }
            return;
        }
        let (r, start, len) = self.fragment(seq);
        let scale = self.cfg.scale;
        let req = &mut self.reqs[r];
        if let (Some(res), Some(p)) = (req.result.as_mut(), pkt.payload.as_deref()) {
            // A float request's result is floats: fixed-point sums scaled back, the fallback's
            // float sums as they are. An i32 request (the simulator's) stays i32.
            let v = match (&*res, p) {
                (Payload::F32(_), Payload::I32(v)) => Payload::F32(crate::quant::from_fixed(v, scale)),
                (Payload::I32(_), Payload::F32(f)) => Payload::I32(f.iter().map(|x| x.round() as i32).collect()),
                (_, other) => other.clone(),
            };
            if v.len() == len {
                res.copy_at(start, &v);
            }
        }
        req.remaining -= 1;
        if h.has(AtpHeader::FLAG_REHASH) {
            // The PS moved this slot to an aggregator the job does not use: take it for good,
            // unless a newer move already applied or the index is not one of the pool's.
            let (i, new) = (self.slot(seq), h.bitmap0);
            if self.slots[i] == h.agg_index && new < self.cfg.aggregators && !self.in_table.contains(&new) {
                self.in_table.remove(&h.agg_index);
                self.in_table.insert(new);
                self.slots[i] = new;
            }
        }
        if let Some(o) = self.outstanding.remove(&seq) {
            if !o.resent {
                self.rtt.sample(now.saturating_sub(o.sent_at));
            }
        }
        self.float_seqs.remove(&seq);
        let ecn = pkt.ecn || h.has(AtpHeader::FLAG_ECN);
        if seq == self.expected {
            self.expected += 1;
            while self.received.remove(&self.expected) {
                self.expected += 1;
            }
        } else {
            self.received.insert(seq);
            // Every fragment still missing below `seq` saw one more out-of-order parameter;
            // at three it is taken as lost (or stalled in a partial aggregation) and resent
            // once, like a SACK hole; the timeout covers a lost resend.
            let mut lost = vec![];
            let lanes = self.cfg.lanes.max(1);
            for (&m, o) in self.outstanding.range_mut(self.expected..seq).filter(|(&m, _)| m % lanes == seq % lanes) {
                o.later_params = o.later_params.saturating_add(1);
                if o.later_params == 3 && !o.fast_resent {
                    o.fast_resent = true;
                    lost.push(m);
                }
            }
            // No window cut here (the authors' `p4ml_manager.cc` does the same; the paper
            // halves on three out-of-order ACKs, §3.7): in ATP a fragment left behind is most
            // often stalled in a partial aggregation after a collision, not lost to
            // congestion, and congestion is marked by ECN before a queue overflows.
            lost.into_iter().for_each(|m| self.queue_resend(m));
        }
        if self.cfg.congestion_control && self.window.on_ack(self.cfg.packet_bytes as u64, ecn, self.expected as u64, self.next_seq as u64) {
            self.ecn_cuts += 1;
        }
        self.drop_stale_sends();
        // Completed requests, in order.
        while self.reqs.front().is_some_and(|q| q.remaining == 0) {
            let q = self.reqs.pop_front().expect("front");
            self.events.push_back(HostEvent::Done { id: q.id, data: q.result });
        }
    }
}

impl HostProtocol for AtpWorker {
    fn endpoint(&self) -> Endpoint {
        self.local
    }

    fn submit(&mut self, _now: Time, req: AppRequest) {
        match req {
            AppRequest::Allreduce { id, bytes, data, .. } => {
                let values = (bytes / 4) as usize;
                if bytes % 4 != 0 || data.as_ref().is_some_and(|d| d.len() != values) {
                    self.events.push_back(HostEvent::Failed { id, reason: "ATP needs bytes / 4 values".into() });
                    return;
                }
                let frags = values.div_ceil(self.per_packet).max(1) as u64;
                if self.end_seq as u64 + frags > u32::MAX as u64 {
                    self.events.push_back(HostEvent::Failed { id, reason: "ATP sequence numbers exhausted".into() });
                    return;
                }
                let frags = frags as u32;
                let result = data.as_ref().map(|d| d.zeros_like(values));
                // Floats are carried in fixed point; a value beyond its range saturates and
                // marks its fragment, whose sum then comes from the floats (§3.8). So does a
                // NaN or infinity (sent as 0 in fixed point): the float sum then carries it to
                // every worker, whose call fails on it, rather than leaving them waiting.
                let (data, floats, saturated) = match data {
                    Some(Payload::F32(f)) => {
                        let limit = i32::MAX as f64 + 0.5;
                        let saturated = (0..frags).filter(|&k| {
                            let (a, b) = (k as usize * self.per_packet, ((k as usize + 1) * self.per_packet).min(values));
                            f[a..b].iter().any(|&x| !x.is_finite() || (x as f64 * self.cfg.scale).abs() >= limit)
                        });
                        let saturated: BTreeSet<u32> = saturated.collect();
                        let fixed = if f.iter().all(|x| x.is_finite()) {
                            crate::quant::to_fixed(&f, self.cfg.scale)
                        } else {
                            crate::quant::to_fixed(&f.iter().map(|&x| if x.is_finite() { x } else { 0.0 }).collect::<Vec<_>>(), self.cfg.scale)
                        };
                        (Some(Payload::I32(fixed.expect("finite values, a checked scale").values)), Some(f), saturated)
                    }
                    other => (other, None, BTreeSet::new()),
                };
                self.reqs.push_back(Request { id, first_seq: self.end_seq, frags, values, data, floats, saturated, result, remaining: frags });
                self.end_seq += frags;
            }
            AppRequest::Send { id, .. } => {
                self.events.push_back(HostEvent::Failed { id, reason: "an ATP worker only allreduces".into() });
            }
        }
    }

    fn handle_packet(&mut self, now: Time, pkt: Packet) {
        if let Some(h) = atp_header(&pkt).filter(|h| h.has(AtpHeader::FLAG_ACK) && h.job == self.cfg.job) {
            self.on_parameter(now, h, pkt);
        }
    }

    fn handle_timeout(&mut self, now: Time) {
        if self.probe_at().is_some_and(|t| now >= t) {
            self.probes += 1;
            self.rtt.on_timeout();
            // A probe is no congestion signal (as TCP's tail loss probe, RFC 8985 §7): the
            // resend it repeats may just wait on other workers' resends at the PS.
            self.queue_resend(self.expected);
        }
        // Every fragment without its parameter a whole timeout after its last send is resent,
        // not only the oldest: stalled fragments then recover together.
        let mut stale = false;
        while let Some(&(t, seq)) = self.sends.front() {
            if t + self.loss_timeout() > now {
                break;
            }
            self.sends.pop_front();
            if self.current_send(&(t, seq)) {
                stale = true;
                self.queue_resend(seq);
            }
        }
        if stale {
            self.timeouts += 1;
            self.congestion();
        }
    }

    fn poll_transmit(&mut self, now: Time) -> Option<Packet> {
        while let Some(seq) = self.resend_q.pop_front() {
            let Some(o) = self.outstanding.get_mut(&seq) else { continue };
            self.resends += 1;
            // A resend counts again from its own departure; the entry it replaces is skipped.
            o.sent_at = now;
            o.later_params = 0;
            o.resent = true;
            self.sends.push_back((now, seq));
            return Some(self.build(now, seq, true));
        }
        if self.may_send() {
            let seq = self.next_seq;
            let pkt = self.build(now, seq, false);
            let index = self.current_index(seq);
            self.outstanding.insert(seq, Outstanding { index, sent_at: now, later_params: 0, fast_resent: false, resent: false });
            self.sends.push_back((now, seq));
            self.next_seq += 1;
            self.fragments_sent += 1;
            return Some(pkt);
        }
        None
    }

    fn poll_timeout(&self) -> Option<Time> {
        // Entries made stale by parameters are dropped as they arrive; one resent since its
        // entry was queued fires early, finds nothing current and is discarded.
        let timeout = self.sends.front().map(|&(t, _)| t + self.loss_timeout());
        [timeout, self.probe_at()].into_iter().flatten().min()
    }

    fn poll_event(&mut self) -> Option<HostEvent> {
        self.events.pop_front()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("fragments_sent", self.fragments_sent),
            ("resends", self.resends),
            ("timeouts", self.timeouts),
            ("ecn_cuts", self.ecn_cuts),
            ("window_cuts", self.window.cuts()),
            ("float_resends", self.float_resends),
            ("probes", self.probes),
        ]
    }
}

// ---- parameter server --------------------------------------------------------------------

type Bits = [u64; WORDS];

fn bits_overlap(a: &Bits, b: &Bits) -> bool {
    a.iter().zip(b).any(|(x, y)| x & y != 0)
}

fn bits_count(a: &Bits) -> u32 {
    a.iter().map(|x| x.count_ones()).sum()
}

fn bits_or(a: &mut Bits, b: &Bits) {
    for (x, y) in a.iter_mut().zip(b) {
        *x |= y;
    }
}

/// What the PS answers for a seq.
#[derive(Debug, Clone)]
enum Answer {
    /// The integer (or float) result.
    Result(Option<Payload>, bool),
    /// Please resend as floats.
    Overflow,
}

#[derive(Default)]
struct Seq {
    covered: Bits,
    sum: Option<Vec<i32>>,
    ecn: bool,
    overflow: bool,
    collision: bool,
    agg_index: Option<u32>,
    /// Where the PS moved the colliding slot (sent in every answer for this seq).
    moved_to: Option<u32>,
    len: usize,
    float_covered: Bits,
    float_sum: Option<Vec<f32>>,
    answer: Option<Answer>,
    /// When a resend was last answered.
    last_resent: Option<Time>,
}

/// PS settings beyond [`AtpConfig`].
#[derive(Debug, Clone, PartialEq)]
pub struct AtpServerConfig {
    pub atp: AtpConfig,
    pub layout: AtpLayout,
    /// Workers by rank (their layout positions are `layout.positions`).
    pub workers: Vec<Endpoint>,
    /// The PS's switch runs ATP: send one parameter packet per seq for it to multicast.
    pub multicast: bool,
    /// Tree mode when the PS's switch does not run ATP: one parameter copy per child of the
    /// tree's root, as (worker rank it is addressed to, ECMP key it is routed by), each copied
    /// on by the ATP switches below. Empty: `multicast` decides.
    pub targets: Vec<(usize, u64)>,
    /// After answering a resend, further resends of the same seq are answered at most this
    /// often (all workers resend a seq whose multicast was lost). The scheme sets 10 us,
    /// at most half the worker timeout.
    pub resend_holdoff_ps: Time,
}

/// ATP's parameter server. See the module docs.
pub struct AtpServer {
    local: Endpoint,
    cfg: AtpServerConfig,
    seqs: BTreeMap<u32, Seq>,
    /// Slots of the job's table: how far past its oldest missing parameter a worker sends.
    slots: u32,
    /// Every seq below it has its parameter at every worker: forgotten, and a packet for one
    /// is counted a duplicate.
    floor: u32,
    rehasher: Rehasher,
    txq: VecDeque<Packet>,
    events: VecDeque<HostEvent>,
    n: u32,
    completed: u64,
    duplicates: u64,
    rejected: u64,
    rehashes: u64,
    overflows: u64,
    params_resent: u64,
}

impl AtpServer {
    pub fn new(local: Endpoint, cfg: AtpServerConfig) -> Result<Self, ConfigError> {
        cfg.atp.check()?;
        ensure!(cfg.workers.len() == cfg.layout.positions.len(), "the layout has {} workers, the PS {}", cfg.layout.positions.len(), cfg.workers.len());
        ensure!(!cfg.workers.is_empty() && cfg.workers.len() <= ATP_MAX_WORKERS, "an ATP PS serves 1..={ATP_MAX_WORKERS} workers");
        ensure!(cfg.targets.iter().all(|&(r, _)| r < cfg.workers.len()), "a parameter target names a rank beyond the {} workers", cfg.workers.len());
        let n = cfg.workers.len() as u32;
        let rehasher = Rehasher::new(&cfg.atp);
        let slots = cfg.atp.slot_table().len() as u32;
        Ok(AtpServer {
            local,
            cfg,
            seqs: BTreeMap::new(),
            slots,
            floor: 0,
            rehasher,
            txq: VecDeque::new(),
            events: VecDeque::new(),
            n,
            completed: 0,
            duplicates: 0,
            rejected: 0,
            rehashes: 0,
            overflows: 0,
            params_resent: 0,
        })
    }

    /// Workers a gradient packet covers, or `None` if its directions are malformed.
    fn coverage(&self, h: &AtpHeader) -> Option<Bits> {
        let cs = &self.cfg.layout.contributors;
        let mut b: Bits = [0; WORDS];
        let mut set = |r: usize| b[r / 64] |= 1 << (r % 64);
        // `esi == 2`, or (tree mode) an intermediate node's aggregate of several contributors.
        if h.esi == 2 || h.bitmap1.count_ones() > 1 {
            if h.bitmap1 == 0 || (h.bitmap1 as u64) >> cs.len() != 0 {
                return None;
            }
            for (c, con) in cs.iter().enumerate() {
                if h.bitmap1 & (1 << c) != 0 {
                    match con {
                        Contributor::Rack(m) => m.iter().for_each(|&r| set(r)),
                        Contributor::Worker(r) => set(*r),
                    }
                }
            }
        } else {
            if h.bitmap1 == 0 {
                return None;
            }
            match cs.get(h.bitmap1.trailing_zeros() as usize)? {
                Contributor::Rack(m) => {
                    if h.bitmap0 == 0 || (h.bitmap0 as u64) >> m.len() != 0 {
                        return None;
                    }
                    for (i, &r) in m.iter().enumerate() {
                        if h.bitmap0 & (1 << i) != 0 {
                            set(r);
                        }
                    }
                }
                Contributor::Worker(r) => set(*r),
            }
        }
        Some(b)
    }

    /// Sends a seq's parameter. `resend` answers a worker's resend; only those are
    /// rate-limited, so the first resend after the original answer is always answered.
    fn send_answer(&mut self, now: Time, seq: u32, resend: bool) {
        self.send_answer_to(now, seq, resend, None)
    }

    /// Parameters go to each worker from the PS (no switch copies them).
    fn unicast(&self) -> bool {
        !self.cfg.multicast && self.cfg.targets.is_empty()
    }

    /// `only`: in unicast mode, answer that host's worker alone.
    fn send_answer_to(&mut self, now: Time, seq: u32, resend: bool, only: Option<NodeId>) {
        let s = self.seqs.get_mut(&seq).expect("seq");
        let Some(ans) = s.answer.clone() else { return };
        if resend {
            s.last_resent = Some(now);
        }
        if s.collision && s.moved_to.is_none() && self.cfg.atp.rehashes() {
            s.moved_to = s.agg_index.and_then(|old| self.rehasher.replace(old));
            self.rehashes += s.moved_to.is_some() as u64;
        }
        let mut flags = AtpHeader::FLAG_ACK;
        if s.ecn {
            flags |= AtpHeader::FLAG_ECN;
        }
        let mut bitmap0 = 0;
        let agg_index = s.agg_index.unwrap_or(0);
        if let Some(new) = s.moved_to {
            flags |= AtpHeader::FLAG_REHASH;
            bitmap0 = new;
        }
        let (payload, size) = match ans {
            Answer::Result(p, float) => {
                if float {
                    flags |= AtpHeader::FLAG_FLOAT;
                }
                (p, self.cfg.atp.header_bytes + 4 * s.len as u32)
            }
            Answer::Overflow => {
                flags |= AtpHeader::FLAG_OVERFLOW;
                (None, self.cfg.atp.header_bytes)
            }
        };
        let h = AtpHeader { job: self.cfg.atp.job, seq, agg_index, bitmap0, flags, ..AtpHeader::default() };
        let dsts: Vec<(Endpoint, Option<u64>)> = if !self.cfg.targets.is_empty() {
            self.cfg.targets.iter().map(|&(r, f)| (self.cfg.workers[r], Some(f))).collect()
        } else if self.cfg.multicast {
            vec![(self.cfg.workers[0], None)]
        } else {
            self.cfg.workers.iter().filter(|w| only.map_or(true, |h| w.host == h)).map(|&w| (w, None)).collect()
        };
        for (w, flow) in dsts {
            let mut p = Packet::new(self.local.host, self.local.port, w.host, w.port, size, Header::Atp(h));
            p.created = now;
            if let Some(f) = flow {
                p.flow = f;
            }
            p.payload = payload.clone().map(Box::new);
            self.txq.push_back(p);
        }
    }

    fn on_gradient(&mut self, now: Time, h: AtpHeader, pkt: Packet) {
        let Some(cov) = self.coverage(&h) else {
            self.rejected += 1;
            return;
        };
        if h.seq < self.floor {
            // Every worker has this seq's parameter: a late copy or a duplicate.
            self.duplicates += 1;
            return;
        }
        let holdoff = self.cfg.resend_holdoff_ps;
        let unicast = self.unicast();
        let n = self.n;
        let s = self.seqs.entry(h.seq).or_default();
        if s.agg_index.is_none() {
            s.agg_index = Some(h.agg_index);
        }
        if h.has(AtpHeader::FLAG_COLLISION) && s.answer.is_none() {
            s.collision = true;
        }
        let float = h.has(AtpHeader::FLAG_FLOAT);
        match &s.answer {
            // Waiting for floats: collect them below.
            Some(Answer::Overflow) if float => {}
            // Already answered (a resend, or a late copy): answer again. Sent for switches to
            // copy, one answer serves every worker, so it is rate-limited; sent per worker, the
            // asking worker alone gets it (answering every worker per resend made the PS's
            // link, already the bottleneck of a unicast PS, carry n copies per resend: 60x the
            // job's bytes on a 50 Mbps testbed).
            Some(_) => {
                if unicast {
                    self.params_resent += 1;
                    self.send_answer_to(now, h.seq, true, Some(pkt.src));
                } else if !matches!(s.last_resent, Some(t) if now < t + holdoff) {
                    self.params_resent += 1;
                    self.send_answer(now, h.seq, true);
                }
                return;
            }
            // Floats nobody asked for.
            None if float => {
                self.rejected += 1;
                return;
            }
            None => {}
        }
        let s = self.seqs.get_mut(&h.seq).expect("seq");
        if float {
            if bits_overlap(&s.float_covered, &cov) {
                self.duplicates += 1;
                return;
            }
            bits_or(&mut s.float_covered, &cov);
            if let Some(Payload::F32(v)) = pkt.payload.as_deref() {
                match &mut s.float_sum {
                    Some(acc) => acc.iter_mut().zip(v).for_each(|(a, b)| *a += b),
                    None => s.float_sum = Some(v.clone()),
                }
            }
            if bits_count(&s.float_covered) == n {
                s.answer = Some(Answer::Result(s.float_sum.take().map(Payload::F32), true));
                self.completed += 1;
                self.send_answer(now, h.seq, false);
            }
            return;
        }
        if bits_overlap(&s.covered, &cov) {
            self.duplicates += 1;
            return;
        }
        bits_or(&mut s.covered, &cov);
        s.ecn |= pkt.ecn || h.has(AtpHeader::FLAG_ECN);
        s.overflow |= h.has(AtpHeader::FLAG_OVERFLOW);
        s.len = (pkt.size.saturating_sub(self.cfg.atp.header_bytes) / 4) as usize;
        if let Some(Payload::I32(v)) = pkt.payload.as_deref() {
            s.len = v.len();
            match &mut s.sum {
                // Sticky saturation, as at the switches (inalab_core::rail): reaching an end
                // of the range takes the float fallback.
                Some(acc) => s.overflow |= inalab_core::rail::sticky_add(acc, v) > 0,
                None => s.sum = Some(v.clone()),
            }
        }
        if bits_count(&s.covered) == n {
            if s.overflow {
                self.overflows += 1;
                s.answer = Some(Answer::Overflow);
            } else {
                s.answer = Some(Answer::Result(s.sum.take().map(Payload::I32), false));
                self.completed += 1;
            }
            self.send_answer(now, h.seq, false);
            self.forget_before((h.seq + 1).saturating_sub(self.slots));
        }
    }

    /// Every worker sent a seq `slots` past each seq below `floor`, so each has their
    /// parameters (module docs): forgets them.
    fn forget_before(&mut self, floor: u32) {
        if floor <= self.floor {
            return;
        }
        self.floor = floor;
        while self.seqs.first_key_value().is_some_and(|(&s, _)| s < floor) {
            self.seqs.pop_first();
        }
    }

    /// Seqs the PS holds state for (partial sums and kept results): at most about `3 x slots`.
    pub fn retained(&self) -> usize {
        self.seqs.len()
    }
}

impl HostProtocol for AtpServer {
    fn endpoint(&self) -> Endpoint {
        self.local
    }

    /// The PS takes no application requests: it only reacts to gradients.
    fn submit(&mut self, _now: Time, req: AppRequest) {
        let (AppRequest::Allreduce { id, .. } | AppRequest::Send { id, .. }) = req;
        self.events.push_back(HostEvent::Failed { id, reason: "an ATP parameter server takes no requests".into() });
    }

    fn handle_packet(&mut self, now: Time, pkt: Packet) {
        match atp_header(&pkt) {
            Some(h) if h.job == self.cfg.atp.job && !h.has(AtpHeader::FLAG_ACK) => self.on_gradient(now, h, pkt),
            _ => self.rejected += 1,
        }
    }

    fn handle_timeout(&mut self, _now: Time) {}

    fn poll_transmit(&mut self, _now: Time) -> Option<Packet> {
        self.txq.pop_front()
    }

    fn poll_timeout(&self) -> Option<Time> {
        None
    }

    fn poll_event(&mut self) -> Option<HostEvent> {
        self.events.pop_front()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("fragments_completed", self.completed),
            ("duplicates", self.duplicates),
            ("rejected", self.rejected),
            ("rehashes", self.rehashes),
            ("overflows", self.overflows),
            ("params_resent", self.params_resent),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_levels_and_fan_ins() {
        // Racks: 10, 10, 20, 30 (the PS's), 10, 40 (no ATP).
        let l = atp_layout(&[10, 10, 20, 30, 10, 40], 30, |r| r != 40).unwrap();
        assert_eq!(l.contributors, vec![Contributor::Rack(vec![0, 1, 4]), Contributor::Rack(vec![2]), Contributor::Worker(3), Contributor::Worker(5)]);
        let p = &l.positions;
        assert_eq!(p[0], AtpPosition { esi: 0, bitmap0: 1, bitmap1: 1, fan_in0: 3, fan_in1: 4 });
        assert_eq!(p[4], AtpPosition { esi: 0, bitmap0: 4, bitmap1: 1, fan_in0: 3, fan_in1: 4 });
        assert_eq!(p[2], AtpPosition { esi: 0, bitmap0: 1, bitmap1: 2, fan_in0: 1, fan_in1: 4 });
        assert_eq!((p[3].esi, p[3].bitmap1), (1, 4), "beside the PS: level 2 only");
        assert_eq!((p[5].esi, p[5].bitmap1), (1, 8), "rack without ATP: level 2 only");
    }

    #[test]
    fn layout_limits() {
        let racks: Vec<u32> = (0..1024).map(|i| i / 32).collect();
        assert!(atp_layout(&racks, 999, |_| true).is_ok(), "32 racks of 32 = 1024 workers");
        assert!(atp_layout(&(0..33).map(|_| 0).collect::<Vec<u32>>(), 1, |_| true).unwrap_err().0.contains("32 workers in one rack"));
        assert!(atp_layout(&(0..33).collect::<Vec<u32>>(), 1, |_| true).unwrap_err().0.contains("32 level-2 contributors"));
        // 33 workers beside the PS are 33 contributors.
        assert!(atp_layout(&[5u32; 33], 5, |_| true).is_err());
    }

    #[test]
    fn slot_tables() {
        let cfg = |hashing, aggregators, slots| AtpConfig { job: 7, hashing, aggregators, slots, ..AtpConfig::default() };
        let t = cfg(Hashing::Hash, 1000, 512).slot_table();
        assert_eq!(t.len(), 512);
        assert_eq!(t.iter().collect::<BTreeSet<_>>().len(), 512, "distinct slots");
        assert!(t.iter().all(|&x| x < 1000));
        assert_ne!(t, cfg(Hashing::Hash, 1000, 512).slot_table().into_iter().rev().collect::<Vec<_>>());
        assert_ne!(t, AtpConfig { job: 8, ..cfg(Hashing::Hash, 1000, 512) }.slot_table(), "jobs hash differently");
        // A pool smaller than the slots: every aggregator once, then around again.
        let full = cfg(Hashing::Hash, 50, 120).slot_table();
        assert_eq!(full.len(), 120);
        assert_eq!(full[..50].iter().collect::<BTreeSet<_>>().len(), 50);
        assert_eq!(full[50..100], full[..50]);
        assert_eq!(cfg(Hashing::Linear, 1000, 4).slot_table(), vec![0, 1, 2, 3]);
        assert_eq!(cfg(Hashing::Linear, 3, 5).slot_table(), vec![0, 1, 2, 0, 1]);
        assert_eq!(cfg(Hashing::Static { offset: 100, size: 3 }, 1000, 512).slot_table(), vec![100, 101, 102], "a static job's window is its slice");
        assert_eq!(cfg(Hashing::Static { offset: 0, size: 0 }, 1000, 2).slot_table(), vec![1000, 1000], "no slice: beyond the pool");
        assert_eq!(cfg(Hashing::Hash, 0, 3).slot_table(), vec![0, 0, 0], "no pool: every packet goes to the PS");
    }

    #[test]
    fn rehasher_draws_each_unused_aggregator_once() {
        let cfg = AtpConfig { job: 3, aggregators: 40, slots: 10, ..AtpConfig::default() };
        let table: BTreeSet<u32> = cfg.slot_table().into_iter().collect();
        let mut r = Rehasher::new(&cfg);
        let mut got = BTreeSet::new();
        for old in 0..30 {
            let new = r.replace(old).expect("30 unused aggregators");
            assert!(!table.contains(&new) && new < 40 && got.insert(new), "{new} drawn twice or in use");
            assert_eq!(r.replace(old), Some(new), "the same index keeps its replacement");
        }
        assert_eq!(r.replace(99), None, "the pool is exhausted");
        assert_eq!(got.len() + table.len(), 40);
    }

    fn ep(h: u32, port: u16) -> Endpoint {
        Endpoint { host: h, port }
    }

    /// `n` workers beside the PS (host 100), no switch: the PS does everything, unicast.
    /// (Tests that move packets between them run on the test fabric: tests/atp.rs.)
    fn setup(n: usize, aggs: u32, hashing: Hashing) -> (Vec<AtpWorker>, AtpServer) {
        let layout = atp_layout(&vec![0u32; n], 0, |_| true).unwrap();
        let cfg = AtpConfig { aggregators: aggs, hashing, timeout_ps: 10_000, ..AtpConfig::default() };
        let wep: Vec<Endpoint> = (0..n as u32).map(|h| ep(h, 1)).collect();
        let ws = (0..n).map(|r| AtpWorker::new(wep[r], ep(100, 2), layout.positions[r], cfg.clone()).unwrap()).collect();
        let ps = AtpServer::new(ep(100, 2), AtpServerConfig { atp: cfg, layout, workers: wep, multicast: false, targets: vec![], resend_holdoff_ps: 5_000 }).unwrap();
        (ws, ps)
    }

    fn submit_all(ws: &mut [AtpWorker], id: u64, data: impl Fn(usize, usize) -> i32, len: usize) {
        for (r, w) in ws.iter_mut().enumerate() {
            let v: Vec<i32> = (0..len).map(|i| data(r, i)).collect();
            w.submit(0, AppRequest::allreduce(id, 4 * len as u64, Some(Payload::I32(v))));
        }
    }

    #[test]
    fn ps_drops_overlaps_and_answers_resends() {
        let (mut ws, mut ps) = setup(2, 4, Hashing::Linear);
        submit_all(&mut ws, 1, |r, _| r as i32 + 1, 62);
        let p0 = ws[0].poll_transmit(0).unwrap();
        let p1 = ws[1].poll_transmit(0).unwrap();
        ps.handle_packet(0, p0.clone());
        ps.handle_packet(1, p0.clone()); // duplicate
        assert!(ps.poll_transmit(1).is_none());
        ps.handle_packet(2, p1);
        let param = ps.poll_transmit(2).unwrap();
        assert!(matches!(param.payload.as_deref(), Some(Payload::I32(v)) if v == &vec![3; 62]));
        ps.poll_transmit(2).unwrap(); // the copy for worker 1
        // Unicast mode: every resend is answered at once, to the asking worker alone.
        for t in [3, 4] {
            ps.handle_packet(t, p0.clone());
            assert_eq!(ps.poll_transmit(t).map(|p| p.dst), Some(0), "the resend's answer goes to worker 0");
            assert!(ps.poll_transmit(t).is_none(), "and to nobody else");
        }
        let c: BTreeMap<_, _> = ps.counters().into_iter().collect();
        assert_eq!((c["duplicates"], c["fragments_completed"], c["params_resent"]), (1, 1, 2));
        // Multicast mode: one answer serves every worker, at most once per holdoff.
        let (mut ws, ps) = setup(2, 4, Hashing::Linear);
        let mut ps = AtpServer::new(ep(100, 2), AtpServerConfig { multicast: true, ..ps.cfg.clone() }).unwrap();
        submit_all(&mut ws, 1, |r, _| r as i32 + 1, 62);
        let p0 = ws[0].poll_transmit(0).unwrap();
        ps.handle_packet(0, p0.clone());
        ps.handle_packet(1, ws[1].poll_transmit(0).unwrap());
        assert!(ps.poll_transmit(1).is_some() && ps.poll_transmit(1).is_none(), "one parameter for the switch to copy");
        ps.handle_packet(3, p0.clone());
        assert!(ps.poll_transmit(3).is_some(), "the first resend right after the answer");
        ps.handle_packet(4, p0.clone());
        assert!(ps.poll_transmit(4).is_none(), "within the holdoff");
        ps.handle_packet(5_004, p0);
        assert!(ps.poll_transmit(5_004).is_some());
        assert_eq!((c["duplicates"], c["fragments_completed"], c["params_resent"]), (1, 1, 2));
    }

    /// Moves packets between workers and PS (no switch, no loss) until none is left.
    fn shuttle(ws: &mut [AtpWorker], ps: &mut AtpServer, now: Time) {
        loop {
            let mut moved = false;
            for w in ws.iter_mut() {
                while let Some(p) = w.poll_transmit(now) {
                    ps.handle_packet(now, p);
                    moved = true;
                }
            }
            while let Some(p) = ps.poll_transmit(now) {
                let w = ws.iter_mut().find(|w| w.local.host == p.dst).expect("a worker");
                w.handle_packet(now, p);
                moved = true;
            }
            if !moved {
                return;
            }
        }
    }

    #[test]
    fn parameters_of_another_lane_are_not_out_of_order() {
        // A sharded runtime switch (#41) handles even and odd fragments on two threads, so the
        // odd ones' parameters may all come before the even ones'. With one lane, three of
        // them make the worker resend every even fragment; with two lanes, none.
        for (lanes, resends_expected) in [(1u32, true), (2, false)] {
            let layout = atp_layout(&[0u32; 2], 0, |_| true).unwrap();
            let cfg = AtpConfig { aggregators: 64, hashing: Hashing::Linear, timeout_ps: 10_000, lanes, ..AtpConfig::default() };
            let wep: Vec<Endpoint> = (0..2).map(|h| ep(h, 1)).collect();
            let mut ws: Vec<AtpWorker> = (0..2).map(|r| AtpWorker::new(wep[r], ep(100, 2), layout.positions[r], cfg.clone()).unwrap()).collect();
            let mut ps = AtpServer::new(ep(100, 2), AtpServerConfig { atp: cfg, layout, workers: wep, multicast: false, targets: vec![], resend_holdoff_ps: 5_000 }).unwrap();
            submit_all(&mut ws, 1, |r, i| (r + i) as i32, 62 * 8);
            for w in ws.iter_mut() {
                while let Some(p) = w.poll_transmit(0) {
                    ps.handle_packet(0, p);
                }
            }
            let params: Vec<Packet> = std::iter::from_fn(|| ps.poll_transmit(0)).filter(|p| p.dst == 0).collect();
            let seq = |p: &Packet| match p.header { Header::Atp(h) => h.seq, _ => unreachable!() };
            let (odd, even): (Vec<Packet>, Vec<Packet>) = params.into_iter().partition(|p| seq(p) % 2 == 1);
            for p in odd {
                ws[0].handle_packet(0, p);
            }
            let resent = std::iter::from_fn(|| ws[0].poll_transmit(0)).count();
            assert_eq!(resent > 0, resends_expected, "lanes {lanes}: {resent} fragments resent");
            for p in even {
                ws[0].handle_packet(0, p);
            }
            assert!(matches!(ws[0].poll_event(), Some(HostEvent::Done { id: 1, .. })), "lanes {lanes}");
        }
    }

    #[test]
    fn the_ps_forgets_results_every_worker_has() {
        // Found in the real runtime (#36): the PS kept every completed result, +4.4 MiB per
        // 1 M-value allreduce. 300 allreduces of 40 fragments: what it holds stays within
        // 3 x slots seqs, and a late copy of a forgotten seq creates nothing.
        let layout = atp_layout(&[0u32; 3], 0, |_| true).unwrap();
        let cfg = AtpConfig { aggregators: 64, hashing: Hashing::Linear, slots: 16, timeout_ps: 10_000, ..AtpConfig::default() };
        let wep: Vec<Endpoint> = (0..3).map(|h| ep(h, 1)).collect();
        let mut ws: Vec<AtpWorker> = (0..3).map(|r| AtpWorker::new(wep[r], ep(100, 2), layout.positions[r], cfg.clone()).unwrap()).collect();
        let mut ps = AtpServer::new(ep(100, 2), AtpServerConfig { atp: cfg, layout, workers: wep, multicast: false, targets: vec![], resend_holdoff_ps: 5_000 }).unwrap();
        let mut first = None;
        for k in 0..300u64 {
            submit_all(&mut ws, k, |r, i| (r + i) as i32 + k as i32, 62 * 40);
            if k == 0 {
                first = ws[0].poll_transmit(0);
                ps.handle_packet(0, first.clone().unwrap());
            }
            shuttle(&mut ws, &mut ps, k as Time);
            for w in &mut ws {
                match w.poll_event() {
                    Some(HostEvent::Done { id, data: Some(Payload::I32(v)) }) => assert_eq!((id, v[1]), (k, 6 + 3 * k as i32)),
                    e => panic!("allreduce {k}: {e:?}"),
                }
            }
            assert!(ps.retained() <= 3 * 16, "allreduce {k}: {} seqs held", ps.retained());
        }
        let before = (ps.retained(), ps.duplicates);
        ps.handle_packet(1_000, first.unwrap());
        assert!(ps.poll_transmit(1_000).is_none(), "no answer: every worker has it");
        assert_eq!((ps.retained(), ps.duplicates), (before.0, before.1 + 1));
    }
}
