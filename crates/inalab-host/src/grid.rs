//! GRID's end hosts (Fang et al., §3.4 steps 2-5, §5.2; `../shared/specs/grid.md` §1.2, §1.5,
//! §1.6; with `inalab_switch::GridSwitch`).
//!
//! # Worker ([`GridWorker`])
//! Each allreduce is cut into fragments of 64 values; fragment ids run across the job's whole
//! stream. Every gradient packet is addressed to the PS and names the worker's aggregation node
//! (a switch, or the PS itself) with the worker's bit in that node's group and the group's size;
//! the path through the node is the driver's (a fixed path per worker endpoint).
//! - Window: [`AimdWindow`] in bytes on the wire (§5.2: +1 MTU per aggregated result while below
//!   the threshold, then +1 MTU per window; halve and set the threshold on a control packet or a
//!   result echoing ECN, once per window). Initial window and threshold are the scheme's.
//!   "Once per window" ends when a fragment sent after the cut is answered (results come out
//!   of order: waiting for the oldest kept a worker whose oldest waited on a slow group from
//!   ever cutting again).
//! - A control packet (a collision at the node) for a fragment not yet answered halves the window
//!   and, half a smoothed RTT later, sends the fragment again ahead of the window, *without*
//!   `RESEND`: it must be aggregated normally (§5.2, "to continue the aggregation"). Sent at
//!   once it met the same holder round trip after round trip (the holder waits for its group's
//!   slowest member), and each meeting cut the window again. A result first cancels it.
//! - Loss (spec A6; the paper has none): a fragment unanswered for an RTO is taken for lost and
//!   sent again with `RESEND` when the window has room for it (a switch holding it merges it;
//!   see `GridSwitch`). The RTO is RFC 6298's, from results of fragments sent once (Karn), at
//!   least `rto_ps`, backed off once per RTO up to 64 `rto_ps` until a sample; each timeout
//!   restarts the window from one packet (RFC 5681). On Fig. 1 with two workers sharing a link
//!   (1.5 Gbps each), a fixed 1 ms RTO, resends outside the window and halving on timeouts
//!   together made a resend storm that never drained (the other workers' fragments wait at the
//!   PS for that pair, and their RTT outgrew every RTO). The result of a fragment sent again
//!   after a timeout neither samples the RTT nor brings an ECN echo to the window (Karn's
//!   ambiguity: its marks are from copies the timeout already answered).
//! - Sending rate (§3.3, §4.3: the control plane gives each worker "the corresponding gradient
//!   sending rate" with its aggregation node): with [`GridWorker::with_rate`] every packet, new
//!   or sent again, waits until the previous one's bytes have left at that rate (idle time is
//!   not banked, so there is no burst after a pause); the window still caps what is in flight.
//!   Window alone (no rate), the windows of a plan that fills a link exactly grew until the
//!   marks of a fragment aggregated across racks came back, and the burst overflowed the
//!   fabric's buffers (#38: 1,112 drops and 3 ms without progress on a 192-host fat tree).
//! - A request is `Done` once every fragment's result arrived (requests finish in order).
//!
//! # PS ([`GridServer`])
//! Knows every node's group (which worker has which bit). Per fragment it keeps the workers
//! covered so far, the running sum and an ECN bit; a packet overlapping what is covered is
//! dropped whole (as ATP's PS, §3.6). When every worker is covered it keeps the result and sends
//! it (`RESULT`, `ECN` if any contribution was marked) to each of `deliver` (every worker by
//! default; the driver may name fewer for switches to copy). A packet for a finished fragment
//! is answered again to its sender alone (that worker lost its result). A result is kept only
//! while a worker may ask for it again: once every worker sent fragment `t`, every fragment
//! [`MAX_FRAGMENT_SPAN`] behind it is forgotten (each worker has its result), and a late packet
//! for one is dropped (counted in `overlaps`).

use crate::aimd::AimdConfig;
use crate::cc::{CongestionControl, WindowRules};
use crate::blocks::Blocks;
use crate::error::ensure;
use crate::rtt::{RttConfig, RttEstimator};
use crate::ConfigError;
use inalab_core::wire::{GridHeader, Header};
use inalab_core::time::{Time, MS, S as SECOND};
use inalab_core::{AppRequest, Endpoint, HostEvent, HostProtocol, NodeId, Packet, Payload, TimerTable, GROUP, MAX_BACKOFF};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Values per gradient packet (§6.2: 64, one Tofino pipeline).
pub const GRID_PACKET_VALUES: usize = 64;
/// A worker never sends a fragment this many past its oldest one without a result (32,768
/// fragments, 2 M values, 10 MB of 322-B packets in flight: above any window a fabric or a
/// loopback run has needed). So once every worker sent fragment `t`, each has the results of
/// every fragment up to `t - MAX_FRAGMENT_SPAN`, and the PS forgets them: what it holds stays
/// within about twice this many fragments (#36: it kept every result, 3.8 GiB after 500
/// allreduces of 1 M values). It was 2^30, the bound of the wire's 32-bit ids.
pub const MAX_FRAGMENT_SPAN: u64 = 1 << 15;

/// A worker's place in the policy: where it aggregates and with whom.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GridTarget {
    /// The aggregation node: a switch, or the PS host.
    pub node: NodeId,
    /// This worker's bit in the switch's group (0 when the node is the PS, which knows a
    /// direct worker by its address).
    pub position: u8,
    /// The group's size (1 when the node is the PS).
    pub fan_in: u8,
}

/// Settings shared by a GRID job's workers and PS.
#[derive(Debug, Clone, PartialEq)]
pub struct GridConfig {
    pub job: u32,
    /// Bytes on the wire besides the values. Default 66 (Ethernet, IPv4, UDP and the 24-B header).
    pub header_bytes: u32,
    pub aimd: AimdConfig,
    /// Loss-recovery timeout. Default 1 ms.
    pub rto_ps: Time,
}

impl Default for GridConfig {
    fn default() -> Self {
        let packet = 66 + 4 * GRID_PACKET_VALUES as u64;
        GridConfig { job: 0, header_bytes: 66, aimd: AimdConfig { min_window_bytes: packet, ..AimdConfig::default() }, rto_ps: MS }
    }
}

impl GridConfig {
    fn check(&self) -> Result<(), ConfigError> {
        ensure!(self.rto_ps > 0, "rto_ps must be positive");
        ensure!(self.aimd.min_window_bytes > 0, "the window's floor must be positive");
        Ok(())
    }
}

struct Flight {
    tensor: usize,
    expiries: u32,
    /// Queued again after a control packet (sent without `RESEND`).
    collided: bool,
    /// Dropped for a collision and waiting (its deadline) before it is sent again.
    parked: bool,
    /// When it was first sent: its result is an RTT sample if it was sent once (Karn).
    sent: Time,
    /// Its bytes count in the window's flight: not once it timed out (taken for lost) until it
    /// is sent again.
    counted: bool,
}

#[derive(Default)]
struct WorkerCounters {
    sent: u64,
    resent: u64,
    collision_resends: u64,
    controls: u64,
    results: u64,
    duplicates: u64,
    malformed: u64,
}

/// A GRID worker. See the module docs.
pub struct GridWorker {
    cfg: GridConfig,
    me: Endpoint,
    ps: Endpoint,
    target: GridTarget,
    window: Box<dyn CongestionControl>,
    /// RFC 6298 RTT estimate: queues on a policy's paths can hold milliseconds, which a fixed
    /// timeout would take for loss (a storm of resends).
    rtt: RttEstimator,
    /// When the RTO was last backed off.
    backed_off: Time,
    /// Submitted tensors; their fragments `next_send..blocks.next` are not sent yet.
    blocks: Blocks,
    next_send: u64,
    flights: BTreeMap<u64, Flight>,
    in_flight_bytes: u64,
    /// When each fragment in flight is sent again (none: queued).
    deadlines: TimerTable<u64>,
    /// Fragments a switch dropped for a collision, to send again first (without `RESEND`).
    again: VecDeque<u64>,
    /// Fragments that timed out, to send again with `RESEND`, oldest first (the one every other
    /// worker's window waits on) as the window has room.
    lost: BTreeSet<u64>,
    events: VecDeque<HostEvent>,
    c: WorkerCounters,
    /// The plan's sending rate in bits per second (0: the window alone).
    rate_bps: u64,
    /// When the next packet may leave at `rate_bps`.
    next_tx: Time,
    /// `next_tx` is ahead of the last wake: `poll_timeout` names it.
    paced: bool,
}

impl GridWorker {
    pub fn new(me: Endpoint, ps: Endpoint, target: GridTarget, cfg: GridConfig) -> Result<Self, ConfigError> {
        cfg.check()?;
        ensure!(target.fan_in >= 1 && target.fan_in <= GridHeader::MAX_FAN_IN, "fan_in {} is not in 1..=64", target.fan_in);
        ensure!(target.position < target.fan_in, "position {} is not below the fan-in {}", target.position, target.fan_in);
        let window = WindowRules::default().window(&cfg.aimd);
        let max_rto_ps = cfg.rto_ps.saturating_mul(MAX_BACKOFF);
        let rtt = RttEstimator::new(RttConfig { initial_rto_ps: cfg.rto_ps, min_rto_ps: cfg.rto_ps, max_rto_ps, ..RttConfig::default() });
        Ok(GridWorker {
            rtt,
            backed_off: 0,
            cfg,
            me,
            ps,
            target,
            window,
            blocks: Blocks::new(GRID_PACKET_VALUES),
            next_send: 0,
            flights: BTreeMap::new(),
            in_flight_bytes: 0,
            deadlines: TimerTable::new(),
            again: VecDeque::new(),
            lost: BTreeSet::new(),
            events: VecDeque::new(),
            c: WorkerCounters::default(),
            rate_bps: 0,
            next_tx: 0,
            paced: false,
        })
    }

    /// Sends at most `rate_bps` bits per second of wire bytes (0: no limit but the window).
    pub fn with_rate(mut self, rate_bps: u64) -> Self {
        self.rate_bps = rate_bps;
        self
    }

    /// Whether the rate holds a packet back at `now`; if not, books `bytes` of it.
    fn rate_holds(&mut self, now: Time, bytes: u64) -> bool {
        if self.rate_bps == 0 {
            return false;
        }
        if now < self.next_tx {
            return true;
        }
        let gap = (bytes as u128 * 8 * SECOND as u128).div_ceil(self.rate_bps as u128);
        self.next_tx = now + gap as Time;
        // A wake when the next packet may leave: a driver reads `poll_timeout` after a packet
        // went, not after `poll_transmit` came back empty.
        self.paced = true;
        false
    }

    fn size(&self, tensor: usize, frag: u64) -> u32 {
        let (s, e) = self.blocks.span(tensor, frag);
        self.cfg.header_bytes + 4 * (e - s) as u32
    }

    /// The oldest fragment in flight (the 32-bit ids on the wire are read relative to it).
    fn oldest(&self) -> u64 {
        self.flights.keys().next().copied().unwrap_or(self.next_send)
    }

    fn frag_of(&self, id: u32) -> u64 {
        let oldest = self.oldest();
        oldest + id.wrapping_sub(oldest as u32) as u64
    }

    fn gradient(&self, tensor: usize, frag: u64, resend: bool) -> Packet {
        let t = self.target;
        let flags = if resend { GridHeader::FLAG_RESEND } else { 0 };
        let h = GridHeader { job: self.cfg.job, frag: frag as u32, node: t.node, bitmap: 1 << t.position, fan_in: t.fan_in, flags };
        let mut p = Packet::new(self.me.host, self.me.port, self.ps.host, self.ps.port, self.size(tensor, frag), Header::Grid(h));
        p.payload = self.blocks.payload(tensor, frag);
        p
    }

    fn arm(&mut self, frag: u64, now: Time) {
        // The worker's one backed-off RTO (RFC 6298), not a per-fragment doubling on top of it.
        debug_assert!(self.flights.contains_key(&frag), "in flight");
        self.deadlines.set(frag, now + self.rtt.rto());
    }

    fn disarm(&mut self, frag: u64) {
        self.deadlines.cancel(frag);
    }

    fn on_result(&mut self, now: Time, h: GridHeader, pkt: &Packet) {
        let frag = self.frag_of(h.frag);
        let Some(f) = self.flights.get(&frag) else {
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
        if !self.blocks.fits(tensor, frag, values) {
            self.c.malformed += 1;
            return;
        }
        self.disarm(frag);
        let f = self.flights.remove(&frag).expect("in flight");
        // Karn: a fragment sent again after a timeout gives no sample (which copy is this the
        // answer to?); one a switch dropped for a collision does, from its resend.
        if f.expiries == 0 {
            self.rtt.sample(now.saturating_sub(f.sent));
        } else {
            self.rtt.on_progress();
        }
        self.again.retain(|&g| g != frag);
        self.lost.remove(&frag);
        let size = self.size(tensor, frag) as u64;
        if f.counted {
            self.in_flight_bytes -= size;
        }
        // Once per window means: until a fragment sent after the cut is answered. Not until
        // the oldest is: results come out of order, and a worker whose oldest fragment waits
        // for a slow group would never cut again (its window kept the marked queue full while
        // the others, cut every round trip, fell to one packet).
        // Karn for ECN too: the result of a fragment sent again after a timeout carries the marks
        // of every copy, the first ones from before the timeout that already restarted the
        // window. Taken as congestion, they kept the window at one packet through a whole
        // recovery (#38: a fat-tree burst lost 787 fragments per worker, which then went one per
        // round trip for 12.5 ms, every result marked by the burst).
        let ecn = h.has(GridHeader::FLAG_ECN) && f.expiries == 0;
        self.window.on_ack(size, ecn, frag + 1, self.next_send);
        self.c.results += 1;
        self.events.extend(self.blocks.finish(tensor, frag, values));
    }

    fn on_control(&mut self, now: Time, h: GridHeader) {
        let frag = self.frag_of(h.frag);
        // A control packet for a fragment already answered, queued again or waiting changes
        // nothing.
        let armed = self.deadlines.get(frag).is_some();
        let Some(f) = self.flights.get_mut(&frag).filter(|f| armed && !f.parked) else { return };
        f.collided = true;
        self.c.controls += 1;
        self.window.on_congestion(self.next_send);
        self.disarm(frag);
        // The unit stays held until its fragment's slowest member arrives: sent again at once,
        // the fragment met the same holder round trip after round trip (and halved the window
        // each time, down to one packet). It waits half a smoothed RTT (a result's wait for the
        // slowest contribution) first.
        let wait = self.rtt.srtt().map_or(self.cfg.rto_ps, |s| s / 2).max(1);
        self.flights.get_mut(&frag).expect("in flight").parked = true;
        self.deadlines.set(frag, now + wait);
    }

    pub fn window_bytes(&self) -> u64 {
        self.window.window()
    }
}

impl HostProtocol for GridWorker {
    fn endpoint(&self) -> Endpoint {
        self.me
    }

    fn submit(&mut self, _now: Time, req: AppRequest) {
        if let Err(e) = self.blocks.submit(req, "GRID workers") {
            self.events.push_back(e);
        }
    }

    fn handle_packet(&mut self, now: Time, pkt: Packet) {
        let Header::Grid(h) = pkt.header else { return };
        if h.job != self.cfg.job {
            return;
        }
        if h.has(GridHeader::FLAG_CONTROL) {
            self.on_control(now, h);
        } else if h.has(GridHeader::FLAG_RESULT) {
            self.on_result(now, h, &pkt);
        } else {
            self.c.malformed += 1;
        }
    }

    fn handle_timeout(&mut self, now: Time) {
        if now >= self.next_tx {
            self.paced = false;
        }
        let mut expired = false;
        while let Some(frag) = self.deadlines.pop_expired(now) {
            let f = self.flights.get_mut(&frag).expect("a deadline is a fragment in flight");
            if std::mem::take(&mut f.parked) {
                self.again.push_back(frag);
                continue;
            }
            expired = true;
            f.expiries += 1;
            let (tensor, counted) = (f.tensor, std::mem::take(&mut f.counted));
            if counted {
                self.in_flight_bytes -= self.size(tensor, frag) as u64;
            }
            self.lost.insert(frag);
        }
        if expired && now >= self.backed_off + self.rtt.rto() {
            // Once per RTO, as the back-off below: the window restarts from one packet (TCP's
            // rule). Halving it left a worker whose window waited on a slow group resending
            // the whole window every RTO into the path that slowed that group.
            self.window.on_timeout(self.next_send);
            // RFC 6298 5.5, once per RTO (a window's fragments expire one by one): fragments
            // sent from now on wait the backed-off RTO as well, until a fragment sent once is
            // answered. Without it no sample ever came again once the RTT (the wait at the PS
            // for the slowest group) outgrew the RTO: every fragment timed out, and Karn's rule
            // discarded every answer.
            self.backed_off = now;
            self.rtt.on_timeout();
        }
    }

    fn poll_transmit(&mut self, now: Time) -> Option<Packet> {
        // Fragments to send again go first. One a switch dropped for a collision is still
        // counted in flight and goes at once (a halved window would hold back the very fragment
        // its group waits for); one that timed out waits for room in the window like a new one,
        // so that a queue that delays every fragment past its RTO (the fast workers' wait at
        // the PS for a congested group) does not double its own load with resends.
        if let Some(&frag) = self.again.front() {
            let tensor = self.flights[&frag].tensor;
            if self.rate_holds(now, self.size(tensor, frag) as u64) {
                return None;
            }
            self.again.pop_front();
            let f = self.flights.get_mut(&frag).expect("in flight");
            f.sent = now;
            let tensor = f.tensor;
            self.arm(frag, now);
            self.c.collision_resends += 1;
            return Some(self.gradient(tensor, frag, false));
        }
        if let Some(&frag) = self.lost.first() {
            let tensor = self.flights[&frag].tensor;
            let size = self.size(tensor, frag) as u64;
            if self.in_flight_bytes + size > self.window.window() || self.rate_holds(now, size) {
                return None;
            }
            self.lost.pop_first();
            self.in_flight_bytes += size;
            self.flights.get_mut(&frag).expect("in flight").counted = true;
            self.arm(frag, now);
            self.c.resent += 1;
            return Some(self.gradient(tensor, frag, true));
        }
        let frag = self.next_send;
        if frag == self.blocks.next {
            return None;
        }
        let tensor = self.blocks.tensor_of(frag);
        let size = self.size(tensor, frag) as u64;
        // The wire's 32-bit ids are read relative to the oldest fragment in flight, and the
        // PS forgets results MAX_FRAGMENT_SPAN behind what every worker sent.
        if self.in_flight_bytes + size > self.window.window() || frag - self.oldest() >= MAX_FRAGMENT_SPAN || self.rate_holds(now, size) {
            return None;
        }
        self.next_send += 1;
        self.in_flight_bytes += size;
        self.flights.insert(frag, Flight { tensor, expiries: 0, collided: false, parked: false, sent: now, counted: true });
        self.arm(frag, now);
        self.c.sent += 1;
        Some(self.gradient(tensor, frag, false))
    }

    fn poll_timeout(&self) -> Option<Time> {
        let paced = self.paced.then_some(self.next_tx);
        self.deadlines.next().into_iter().chain(paced).min()
    }

    fn poll_event(&mut self) -> Option<HostEvent> {
        self.events.pop_front()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = &self.c;
        vec![
            ("sent", c.sent),
            ("resent", c.resent),
            ("collision_resends", c.collision_resends),
            ("controls", c.controls),
            ("results", c.results),
            ("duplicate_results", c.duplicates),
            ("malformed", c.malformed),
            ("window_cuts", self.window.cuts()),
            ("collided_in_flight", self.flights.values().filter(|f| f.collided).count() as u64),
        ]
    }
}

/// The PS's settings beyond [`GridConfig`].
#[derive(Debug, Clone, PartialEq)]
pub struct GridServerConfig {
    pub grid: GridConfig,
    /// Workers by rank.
    pub workers: Vec<Endpoint>,
    /// Every aggregating switch's group: its workers (ranks) by bit position. Workers in no
    /// group send to the PS directly (their packets name the PS; it knows them by address).
    pub groups: Vec<(NodeId, Vec<usize>)>,
    /// Where each result goes (ranks); empty: every worker.
    pub deliver: Vec<usize>,
    /// Send a result for every worker once, to `GROUP` (the driver's multicast tree, spec
    /// §1.6), instead of one copy per worker (which caps each worker at B/N on the PS's link).
    pub multicast: bool,
}

struct Frag {
    /// Values per packet of this fragment (from the first packet).
    len: usize,
    covered: Vec<u64>,
    count: usize,
    sum: Option<Vec<i32>>,
    ecn: bool,
    result: Option<Option<Vec<i32>>>,
}

#[derive(Default)]
struct ServerCounters {
    completed: u64,
    overlaps: u64,
    rejected: u64,
    answered_again: u64,
}

/// GRID's PS. See the module docs.
pub struct GridServer {
    cfg: GridServerConfig,
    me: Endpoint,
    groups: BTreeMap<NodeId, Vec<usize>>,
    /// Rank by host, for the workers that send to the PS directly (looked up per packet).
    direct: BTreeMap<NodeId, usize>,
    /// Rank by host, for answering a late packet's sender.
    rank_of: BTreeMap<NodeId, usize>,
    frags: BTreeMap<u32, Frag>,
    /// Fragments behind it (32-bit serial order: ids wrap after 2^32 fragments) have their
    /// results at every worker: forgotten.
    floor: u32,
    txq: VecDeque<Packet>,
    c: ServerCounters,
}

impl GridServer {
    pub fn new(me: Endpoint, cfg: GridServerConfig) -> Result<Self, ConfigError> {
        cfg.grid.check()?;
        let n = cfg.workers.len();
        ensure!(n > 0, "a GRID PS needs workers");
        let mut seen = vec![false; n];
        let mut groups = BTreeMap::new();
        for (node, ranks) in &cfg.groups {
            ensure!(!ranks.is_empty() && ranks.len() <= GridHeader::MAX_FAN_IN as usize, "node {node}'s group has {} workers; allowed 1..=64", ranks.len());
            for &r in ranks {
                ensure!(r < n && !seen[r], "worker {r} is not a worker or is in two groups");
                seen[r] = true;
            }
            ensure!(groups.insert(*node, ranks.clone()).is_none(), "node {node} has two groups");
        }
        ensure!(!groups.contains_key(&me.host), "the PS's own direct workers are not a group");
        ensure!(cfg.deliver.iter().all(|&r| r < n), "a delivery target is not a worker");
        ensure!(!cfg.multicast || cfg.workers.iter().all(|w| w.port == cfg.workers[0].port), "multicast results need every worker on one port");
        let rank_of: BTreeMap<NodeId, usize> = cfg.workers.iter().enumerate().map(|(r, w)| (w.host, r)).collect();
        let direct = rank_of.iter().filter(|&(_, &r)| !seen[r]).map(|(&h, &r)| (h, r)).collect();
        Ok(GridServer { cfg, me, groups, direct, rank_of, frags: BTreeMap::new(), floor: 0, txq: VecDeque::new(), c: ServerCounters::default() })
    }

    /// Every worker sent fragment `done`: forgets the fragments MAX_FRAGMENT_SPAN behind it.
    fn forget_behind(&mut self, done: u32) {
        let floor = done.wrapping_add(1).wrapping_sub(MAX_FRAGMENT_SPAN as u32);
        // Only forward, in serial order (the first fragments' floor lies "behind" 0).
        if (floor.wrapping_sub(self.floor) as i32) <= 0 {
            return;
        }
        let old = std::mem::replace(&mut self.floor, floor);
        let gone: Vec<u32> = if old <= floor {
            self.frags.range(old..floor).map(|(&k, _)| k).collect()
        } else {
            self.frags.range(old..).chain(self.frags.range(..floor)).map(|(&k, _)| k).collect()
        };
        for k in gone {
            self.frags.remove(&k);
        }
    }

    /// Fragments the PS holds state for (partial sums and kept results): at most about
    /// `2 x MAX_FRAGMENT_SPAN` while the job progresses.
    pub fn retained(&self) -> usize {
        self.frags.len()
    }

    /// The ranks a packet covers, or `None` if it names no group or bits outside it. A packet
    /// naming the PS covers its sender, a worker in no switch's group.
    fn coverage(&self, h: &GridHeader, src: NodeId) -> Option<Vec<usize>> {
        if h.node == self.me.host {
            return self.direct.get(&src).filter(|_| h.bitmap == 1).map(|&r| vec![r]);
        }
        let g = self.groups.get(&h.node)?;
        if h.bitmap == 0 || (g.len() < 64 && h.bitmap >> g.len() != 0) {
            return None;
        }
        Some((0..g.len()).filter(|&i| h.bitmap >> i & 1 == 1).map(|i| g[i]).collect())
    }

    fn answer(&mut self, frag: u32, to: &[usize]) {
        let f = &self.frags[&frag];
        let Some(result) = &f.result else { return };
        let mut flags = GridHeader::FLAG_RESULT;
        if f.ecn {
            flags |= GridHeader::FLAG_ECN;
        }
        let h = GridHeader { job: self.cfg.grid.job, frag, node: self.me.host, bitmap: 0, fan_in: 0, flags };
        let size = self.cfg.grid.header_bytes + 4 * f.len as u32;
        let payload = result.clone().map(|v| Box::new(Payload::I32(v)));
        let packet = |dst: Endpoint| Packet { payload: payload.clone(), ..Packet::new(self.me.host, self.me.port, dst.host, dst.port, size, Header::Grid(h)) };
        if self.cfg.multicast && to.len() == self.cfg.workers.len() {
            let group = Endpoint { host: GROUP, port: self.cfg.workers[0].port };
            return self.txq.push_back(packet(group));
        }
        for &r in to {
            self.txq.push_back(packet(self.cfg.workers[r]));
        }
    }
}

impl HostProtocol for GridServer {
    fn endpoint(&self) -> Endpoint {
        self.me
    }

    fn submit(&mut self, _now: Time, req: AppRequest) {
        // The PS serves; it submits nothing of its own.
        let _ = req;
    }

    fn handle_packet(&mut self, _now: Time, pkt: Packet) {
        let Header::Grid(h) = pkt.header else { return };
        if h.job != self.cfg.grid.job || h.has(GridHeader::FLAG_RESULT | GridHeader::FLAG_CONTROL) {
            return;
        }
        let values = match pkt.payload.as_deref() {
            None => None,
            Some(Payload::I32(v)) if v.len() <= GRID_PACKET_VALUES => Some(v.as_slice()),
            Some(_) => {
                self.c.rejected += 1;
                return;
            }
        };
        let Some(cov) = self.coverage(&h, pkt.src) else {
            self.c.rejected += 1;
            return;
        };
        if (self.floor.wrapping_sub(h.frag) as i32) > 0 {
            // Every worker has this fragment's result: a late copy.
            self.c.overlaps += 1;
            return;
        }
        let n = self.cfg.workers.len();
        let len = values.map_or((pkt.size.saturating_sub(self.cfg.grid.header_bytes) / 4) as usize, <[i32]>::len);
        let f = self.frags.entry(h.frag).or_insert_with(|| Frag { len, covered: vec![0; n.div_ceil(64)], count: 0, sum: None, ecn: false, result: None });
        if f.result.is_some() {
            // Its worker lost the result: answer that worker alone.
            let asker = self.rank_of.get(&pkt.src).copied();
            self.c.answered_again += 1;
            if let Some(r) = asker {
                self.answer(h.frag, &[r]);
            }
            return;
        }
        if cov.iter().any(|&r| f.covered[r / 64] >> (r % 64) & 1 == 1) {
            self.c.overlaps += 1;
            return;
        }
        if len != f.len {
            self.c.rejected += 1;
            return;
        }
        for &r in &cov {
            f.covered[r / 64] |= 1 << (r % 64);
        }
        f.count += cov.len();
        f.ecn |= pkt.ecn || h.has(GridHeader::FLAG_ECN);
        if let Some(v) = values {
            match &mut f.sum {
                // Sticky saturation, as at the switches (inalab_core::rail): a sum beyond the
                // range stays at a rail, and every worker fails the call on it.
                Some(s) => _ = inalab_core::rail::sticky_add(s, v),
                None => f.sum = Some(v.to_vec()),
            }
        }
        if f.count == n {
            f.result = Some(f.sum.take());
            self.c.completed += 1;
            let to: Vec<usize> = if self.cfg.deliver.is_empty() { (0..n).collect() } else { self.cfg.deliver.clone() };
            self.answer(h.frag, &to);
            self.forget_behind(h.frag);
        }
    }

    fn handle_timeout(&mut self, _now: Time) {}

    fn poll_transmit(&mut self, now: Time) -> Option<Packet> {
        self.txq.pop_front().map(|mut p| {
            p.created = now;
            p
        })
    }

    fn poll_timeout(&self) -> Option<Time> {
        None
    }

    fn poll_event(&mut self) -> Option<HostEvent> {
        None
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = &self.c;
        vec![("fragments_completed", c.completed), ("ps_overlaps", c.overlaps), ("rejected", c.rejected), ("answered_again", c.answered_again)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inalab_core::time::US;

    const PS: NodeId = 50;
    const S: NodeId = 100;

    fn ep(h: NodeId) -> Endpoint {
        Endpoint { host: h, port: 9 }
    }

    fn worker(rank: NodeId, target: GridTarget) -> GridWorker {
        GridWorker::new(ep(rank), ep(PS), target, GridConfig { job: 1, rto_ps: 1000, ..GridConfig::default() }).unwrap()
    }

    fn direct() -> GridTarget {
        GridTarget { node: PS, position: 0, fan_in: 1 }
    }

    /// Workers 0 and 1 aggregate at switch S, worker 2 sends to the PS.
    fn server() -> GridServer {
        let cfg = GridServerConfig { grid: GridConfig { job: 1, ..GridConfig::default() }, workers: (0..3).map(ep).collect(), groups: vec![(S, vec![0, 1])], deliver: vec![], multicast: false };
        GridServer::new(ep(PS), cfg).unwrap()
    }

    fn header(p: &Packet) -> GridHeader {
        match p.header {
            Header::Grid(h) => h,
            _ => panic!("not grid"),
        }
    }

    fn drain<P: HostProtocol>(h: &mut P, now: Time) -> Vec<Packet> {
        std::iter::from_fn(|| h.poll_transmit(now)).collect()
    }

    fn done(w: &mut GridWorker) -> Option<Vec<i32>> {
        std::iter::from_fn(|| w.poll_event()).find_map(|e| match e {
            HostEvent::Done { data: Some(Payload::I32(v)), .. } => Some(v),
            _ => None,
        })
    }

    fn submit(w: &mut GridWorker, v: Vec<i32>) {
        w.submit(0, AppRequest::allreduce(1, 4 * v.len() as u64, Some(Payload::I32(v))));
    }

    #[test]
    fn a_paced_worker_sends_at_its_plan_s_rate_and_wakes_for_the_next_packet() {
        // 322-B packets at 2.576 Gbps: one per 1 us, whatever the (initial 60 kB) window allows.
        let cfg = GridConfig { job: 1, ..GridConfig::default() }; // a 1 ms RTO: no deadline before the pace's
        let mut w = GridWorker::new(ep(0), ep(PS), direct(), cfg).unwrap().with_rate(2_576_000_000);
        submit(&mut w, vec![1; 64 * 10]);
        assert_eq!(drain(&mut w, 0).len(), 1, "the rate holds the rest back");
        assert_eq!(w.poll_timeout(), Some(US), "a wake when the next may leave");
        assert!(drain(&mut w, US - 1).is_empty());
        w.handle_timeout(US);
        assert_eq!(drain(&mut w, US).len(), 1);
        // Idle time is not banked: ten microseconds later, still one packet.
        assert_eq!(drain(&mut w, 12 * US).len(), 1);
        let mut unpaced = worker(0, direct());
        submit(&mut unpaced, vec![1; 64 * 10]);
        assert_eq!(drain(&mut unpaced, 0).len(), 10, "without a rate, the window alone");
    }

    /// Adds packets' values as switch S would (the PS sees one aggregate).
    fn aggregate(a: &Packet, b: &Packet) -> Packet {
        let mut p = a.clone();
        let (ha, hb) = (header(a), header(b));
        p.header = Header::Grid(GridHeader { bitmap: ha.bitmap | hb.bitmap, ..ha });
        let (Some(Payload::I32(x)), Some(Payload::I32(y))) = (a.payload.as_deref(), b.payload.as_deref()) else { panic!() };
        p.payload = Some(Box::new(Payload::I32(x.iter().zip(y).map(|(a, b)| a + b).collect())));
        p
    }

    #[test]
    fn a_switch_aggregate_and_a_direct_worker_complete_every_fragment() {
        let t = GridTarget { node: S, position: 0, fan_in: 2 };
        let mut ws = [worker(0, t), worker(1, GridTarget { position: 1, ..t }), worker(2, direct())];
        let values = 200; // 4 fragments, the last of 8 values
        for (r, w) in ws.iter_mut().enumerate() {
            submit(w, (0..values).map(|i| (i * 10 + r) as i32).collect());
        }
        let mut ps = server();
        let sent: Vec<Vec<Packet>> = ws.iter_mut().map(|w| drain(w, 0)).collect();
        assert_eq!(sent[0].len(), 4);
        assert_eq!((header(&sent[0][0]).node, header(&sent[0][0]).bitmap, header(&sent[2][0]).node), (S, 1, PS));
        assert_eq!(sent[0][3].size, 66 + 4 * 8);
        for ((a, b), c) in sent[0].iter().zip(&sent[1]).zip(&sent[2]) {
            ps.handle_packet(1, aggregate(a, b));
            ps.handle_packet(1, c.clone());
        }
        let results = drain(&mut ps, 2);
        assert_eq!(results.len(), 4 * 3, "each result to each worker");
        for p in results {
            ws[p.dst as usize].handle_packet(3, p);
        }
        let want: Vec<i32> = (0..values).map(|i| (30 * i + 3) as i32).collect();
        for w in &mut ws {
            assert_eq!(done(w), Some(want.clone()));
        }
    }

    #[test]
    fn the_ps_drops_overlaps_and_answers_a_late_packet_to_its_sender_alone() {
        let mut ws = [worker(0, GridTarget { node: S, position: 0, fan_in: 2 }), worker(1, GridTarget { node: S, position: 1, fan_in: 2 }), worker(2, direct())];
        for w in ws.iter_mut() {
            submit(w, vec![1; 64]);
        }
        let p: Vec<Packet> = ws.iter_mut().map(|w| drain(w, 0).remove(0)).collect();
        let mut ps = server();
        ps.handle_packet(0, p[0].clone());
        ps.handle_packet(0, aggregate(&p[0], &p[1])); // overlaps worker 0: dropped whole
        ps.handle_packet(0, p[1].clone());
        ps.handle_packet(0, p[2].clone());
        let r = drain(&mut ps, 0);
        assert_eq!(r.len(), 3);
        assert!(r.iter().all(|q| matches!(q.payload.as_deref(), Some(Payload::I32(v)) if v == &vec![3; 64])));
        // Worker 1 lost its result and re-sends: only worker 1 is answered.
        let mut again = p[1].clone();
        again.header = Header::Grid(GridHeader { flags: GridHeader::FLAG_RESEND, ..header(&p[1]) });
        ps.handle_packet(5, again);
        assert_eq!(drain(&mut ps, 5).iter().map(|q| q.dst).collect::<Vec<_>>(), vec![1]);
        let c: BTreeMap<_, _> = ps.counters().into_iter().collect();
        assert_eq!((c["ps_overlaps"], c["fragments_completed"], c["answered_again"]), (1, 1, 1));
    }

    #[test]
    fn t5_t6_a_control_packet_halves_the_window_once_and_sends_the_fragment_again_unflagged() {
        let mut w = worker(0, GridTarget { node: S, position: 0, fan_in: 2 });
        submit(&mut w, vec![1; 64 * 400]);
        let sent = drain(&mut w, 0);
        let w0 = w.window_bytes();
        assert_eq!(sent.len() as u64, w0 / 322, "a window of full packets");
        let control = |frag: u32| {
            let h = GridHeader { job: 1, frag, node: S, bitmap: 1, fan_in: 2, flags: GridHeader::FLAG_CONTROL | GridHeader::FLAG_COLLISION | GridHeader::FLAG_ECN };
            Packet::new(S, 0, 0, 9, 66, Header::Grid(h))
        };
        let result = |frag: u32| {
            let mut r = Packet::new(PS, 9, 0, 9, 322, Header::Grid(GridHeader { job: 1, frag, node: PS, flags: GridHeader::FLAG_RESULT, ..GridHeader::default() }));
            r.payload = Some(Box::new(Payload::I32(vec![2; 64])));
            r
        };
        w.handle_packet(100, result(0)); // an RTT sample of 100 ps
        let w0 = w0 + 1500;
        w.handle_packet(101, control(3));
        w.handle_packet(101, control(4)); // same window: no second cut
        assert_eq!(w.window_bytes(), w0 / 2);
        assert!(drain(&mut w, 102).is_empty(), "parked for half the smoothed RTT");
        assert_eq!(w.poll_timeout(), Some(151));
        w.handle_timeout(151);
        let again = drain(&mut w, 151);
        assert_eq!(again.iter().map(|p| (header(p).frag, header(p).flags)).collect::<Vec<_>>(), vec![(3, 0), (4, 0)], "first, without RESEND");
        // A result for fragment 5, then a control packet for it: ignored.
        w.handle_packet(160, result(5));
        let before = w.counters();
        w.handle_packet(161, control(5));
        assert_eq!(w.counters(), before);
        assert!(drain(&mut w, 161).iter().all(|p| header(p).frag != 5));
    }

    #[test]
    fn a_lost_fragment_is_sent_again_with_resend_after_the_timeout() {
        let mut w = worker(0, direct());
        submit(&mut w, vec![1; 64]);
        assert_eq!(drain(&mut w, 0).len(), 1);
        assert_eq!(w.poll_timeout(), Some(1000));
        w.handle_timeout(1000);
        let again = drain(&mut w, 1000);
        assert_eq!(again.len(), 1);
        assert!(header(&again[0]).has(GridHeader::FLAG_RESEND));
        assert_eq!(w.poll_timeout(), Some(3000), "the timeout doubled");
    }

    #[test]
    fn ecn_marks_on_the_result_of_a_fragment_sent_again_do_not_hold_the_window_at_one_packet() {
        // #38: the marks of a burst reach the results of the fragments it lost, after the timeout
        // already restarted the window; taken as congestion they kept it at one packet.
        let mut w = worker(0, direct());
        submit(&mut w, vec![1; 64 * 40]);
        assert_eq!(drain(&mut w, 0).len(), 40);
        w.handle_timeout(1000);
        let first = drain(&mut w, 1000);
        assert_eq!(first.len(), 1, "the window restarts from one packet");
        let h = GridHeader { flags: GridHeader::FLAG_RESULT | GridHeader::FLAG_ECN, ..header(&first[0]) };
        let mut res = Packet::new(PS, 9, 0, 9, 322, Header::Grid(h));
        res.payload = Some(Box::new(Payload::I32(vec![1; 64])));
        w.handle_packet(1100, res);
        assert!(drain(&mut w, 1100).len() >= 2, "the window grew from its one packet");
        // A marked result of a fragment sent once still counts: no growth.
        let mut v = worker(0, direct());
        submit(&mut v, vec![1; 64 * 400]);
        let sent = drain(&mut v, 0);
        let before = v.window_bytes();
        let h = GridHeader { flags: GridHeader::FLAG_RESULT | GridHeader::FLAG_ECN, ..header(&sent[0]) };
        let mut res = Packet::new(PS, 9, 0, 9, 322, Header::Grid(h));
        res.payload = Some(Box::new(Payload::I32(vec![1; 64])));
        v.handle_packet(10, res);
        assert!(v.window_bytes() < before, "{} -> {}", before, v.window_bytes());
    }

    #[test]
    fn bad_configurations_are_refused() {
        let bad = |groups: Vec<(NodeId, Vec<usize>)>| {
            GridServer::new(ep(PS), GridServerConfig { grid: GridConfig::default(), workers: (0..3).map(ep).collect(), groups, deliver: vec![], multicast: false }).is_err()
        };
        assert!(bad(vec![(S, vec![0, 0])]), "a worker twice");
        assert!(bad(vec![(S, vec![0, 5])]), "not a worker");
        assert!(bad(vec![(PS, vec![0])]), "the PS as a group");
        assert!(bad(vec![(S, (0..65).collect())]), "more than 64");
        assert!(GridWorker::new(ep(0), ep(PS), GridTarget { node: S, position: 2, fan_in: 2 }, GridConfig::default()).is_err());
    }

    #[test]
    fn hostile_packets_never_panic() {
        let mut ps = server();
        let mut w = worker(0, GridTarget { node: S, position: 0, fan_in: 2 });
        submit(&mut w, vec![1; 64 * 20]);
        drain(&mut w, 0);
        let mut x = 5u64;
        for t in 0..30_000u64 {
            x = inalab_core::splitmix64(x);
            let h = GridHeader { job: (x % 2) as u32, frag: (x >> 4) as u32 % 30, node: [S, PS, 7][(x >> 10) as usize % 3], bitmap: x >> 12 & 0xF, fan_in: (x >> 20) as u8 % 4, flags: (x >> 24) as u8 & 0x3F };
            let mut p = Packet::new((x >> 32) as u32 % 5, 9, PS, 9, (x >> 36) as u32 % 400, Header::Grid(h));
            if x >> 48 & 1 == 0 {
                p.payload = Some(Box::new(Payload::I32(vec![1; (x >> 49) as usize % 80])));
            }
            ps.handle_packet(t, p.clone());
            w.handle_packet(t, p);
            drain(&mut ps, t);
            w.handle_timeout(t);
            drain(&mut w, t);
        }
        assert!(ps.counters().iter().any(|&(n, v)| n == "rejected" && v > 0));
    }

    fn two_direct_workers() -> (Vec<GridWorker>, GridServer) {
        let cfg = GridServerConfig { grid: GridConfig { job: 1, ..GridConfig::default() }, workers: (0..2).map(ep).collect(), groups: vec![], deliver: vec![], multicast: false };
        ((0..2).map(|r| worker(r, direct())).collect(), GridServer::new(ep(PS), cfg).unwrap())
    }

    /// Moves packets between direct workers and the PS (no loss) until none is left.
    fn shuttle(ws: &mut [GridWorker], ps: &mut GridServer, now: Time) {
        loop {
            let mut moved = false;
            for w in ws.iter_mut() {
                for p in drain(w, now) {
                    ps.handle_packet(now, p);
                    moved = true;
                }
            }
            for p in drain(ps, now) {
                ws[p.dst as usize].handle_packet(now, p);
                moved = true;
            }
            if !moved {
                return;
            }
        }
    }

    #[test]
    fn the_ps_forgets_results_every_worker_has() {
        // Found in the real runtime (#36): the PS kept every fragment, 3.8 GiB after 500
        // allreduces of 1 M values. 40 allreduces of 4,096 fragments (five times the span):
        // the PS holds at most twice the span, every sum is exact, and a late copy of a
        // forgotten fragment gets no answer and creates nothing.
        let (mut ws, mut ps) = two_direct_workers();
        let len = GRID_PACKET_VALUES * 4096;
        let mut first = None;
        for k in 0..40i32 {
            for (r, w) in ws.iter_mut().enumerate() {
                submit(w, (0..len as i32).map(|i| i % 1000 + r as i32 + k).collect());
            }
            if k == 0 {
                first = ws[0].poll_transmit(0);
                ps.handle_packet(0, first.clone().unwrap());
            }
            shuttle(&mut ws, &mut ps, k as Time);
            for w in &mut ws {
                let v = done(w).expect("done");
                assert_eq!((v[0], v[len - 1]), (1 + 2 * k, 2 * ((len as i32 - 1) % 1000) + 1 + 2 * k));
            }
            assert!(ps.retained() as u64 <= 2 * MAX_FRAGMENT_SPAN, "allreduce {k}: {} fragments held", ps.retained());
        }
        assert!(ps.retained() as u64 >= MAX_FRAGMENT_SPAN / 2, "results within the span are kept");
        let before = ps.retained();
        ps.handle_packet(100, first.unwrap());
        assert!(drain(&mut ps, 100).is_empty(), "no answer: every worker has it");
        assert_eq!(ps.retained(), before);
    }

    #[test]
    fn forgetting_follows_the_ids_around_their_wrap() {
        // Wire ids wrap after 2^32 fragments: the floor and what it forgets go around too.
        let (_, mut ps) = two_direct_workers();
        let span = MAX_FRAGMENT_SPAN as u32;
        ps.floor = u32::MAX - 2 * span;
        let first = u32::MAX - span - 10;
        for id in first..=u32::MAX {
            ps.frags.insert(id, Frag { len: 0, covered: vec![0], count: 0, sum: None, ecn: false, result: None });
        }
        for id in 0..20 {
            ps.frags.insert(id, Frag { len: 0, covered: vec![0], count: 0, sum: None, ecn: false, result: None });
        }
        ps.forget_behind(15);
        // Everything more than the span behind fragment 15, across the wrap, is gone.
        assert_eq!(ps.floor, 16u32.wrapping_sub(span));
        assert_eq!(ps.frags.keys().next(), Some(&0));
        assert_eq!(ps.frags.range(u32::MAX / 2..).next().map(|(&k, _)| k), Some(16u32.wrapping_sub(span)));
        assert_eq!(ps.retained(), 20 + (span as usize - 16));
        // A floor behind the current one changes nothing.
        ps.forget_behind(3);
        assert_eq!(ps.floor, 16u32.wrapping_sub(span));
    }
}
