//! DSA's worker and parameter server (Wang et al., ICNP; `../shared/specs/dsa.md` §1.7-1.9).
//!
//! Worker: tensors cut into 62-value fragments with one PSN stream per job (every worker
//! numbers the same fragment alike), sent over an ECN-driven AIMD window that counts
//! outstanding packets, each carrying the tensor's priority. An ACK (from the switch or the
//! PS) delivers a fragment's sum; a duplicate or late ACK changes nothing: no window change,
//! no fast retransmit (§III-D). A fragment unanswered for one RTO (RFC 6298 estimate, 1 ms
//! floor, doubled per expiry of the fragment: RFC 6298 §5.5, not in the spec) is resent, three
//! times, then the worker sends the PS a NOTIFY with its gradient at each expiry until the ACK
//! comes (§IV-B). Sent gradients are kept until acknowledged,
//! and results for the last [`COMPLETED_KEPT`] PSNs (as far back as the PS answers a late
//! NOTIFY from its own completed results), so a FETCH a worker can still need is answered.
//!
//! PS: a dictionary of partial sums per PSN fed by lost-preemption gradients, evicted
//! partials, reminder replies, NOTIFYs and fetch replies; a full bitmap sends one ACK that the
//! switch multicasts. An entry older than the PS's RTO (the EWMA of the lifetimes of entries
//! no reminder completed, 1 ms floor) triggers the reminder: REMIND_SW takes the switch's partial out and FETCH asks the
//! workers still missing; repeated every RTO.

use crate::{AimdConfig, CongestionControl, RttConfig, RttEstimator, WindowRules};
use inalab_core::time::MS;
use inalab_core::wire::{DsaHeader, DsaKind, Header};
use inalab_core::{AppRequest, Endpoint, HostEvent, HostProtocol, Packet, Payload, Time, TimerTable, backed_off};
use std::collections::{BTreeMap, VecDeque};

/// Values per DSA packet (248 B of int32 in a 306 B packet).
pub const DSA_VALUES: usize = 62;
/// Size of a packet carrying no values.
const EMPTY_BYTES: u32 = 64;
/// Reminders of one fragment without completing it before the PS gives it up. Far above the
/// spec's 16 (a diagnostic there): giving up discards the partial sum, and a slow worker (the
/// real runtime on a loaded machine) may not have sent its gradient for many timeouts; about a
/// second at the 1 ms floor bounds what a forged PSN costs.
const MAX_REMINDERS: u32 = 1024;
/// How many PSNs back from the newest it completed a PS remembers completed fragments (to drop
/// stale evictions and answer late NOTIFYs), and a worker keeps its results (to answer
/// FETCHes): 65,536 fragments, 16 MiB of values. The horizon is in PSNs, not in completions:
/// few fragments complete at the PS, and keeping its last 65,536 completions grew it for
/// thousands of allreduces (#36, 2.7 KB per allreduce of 1 M values over 2,000).
pub const COMPLETED_KEPT: usize = 1 << 16;

/// How far `psn` is behind `newest` in the wrapping PSN space (0 when it is ahead).
fn psns_behind(newest: u32, psn: u32) -> u32 {
    let d = newest.wrapping_sub(psn);
    if d < 1 << 31 { d } else { 0 }
}

/// Settings shared by a job's workers and PS.
#[derive(Debug, Clone, PartialEq)]
pub struct DsaConfig {
    pub job: u16,
    pub workers: Vec<Endpoint>,
    pub ps: Endpoint,
    /// Header bytes of a value-carrying packet (Ethernet, IP, UDP, DSA). Default 58.
    pub header_bytes: u32,
    pub aimd: AimdConfig,
    /// Floor (and initial value) of the worker's and the PS's RTO, ps. Default 1 ms (§VI).
    pub min_rto_ps: Time,
    /// Retransmissions before a worker notifies the PS. Default 3 (§IV-B).
    pub retx_before_notify: u32,
    /// The PS's ACKs are multicast by a DSA switch (false: the PS unicasts one per worker).
    pub multicast: bool,
    /// A worker never sends a PSN this many or more beyond its oldest unacknowledged one:
    /// the job's slot-table length when the switch addresses by slot table (ATP's rule: two
    /// PSNs in flight never share a slot). `None`: no span limit.
    pub max_psn_span: Option<u32>,
    /// The `move_slots` ablation: the PS moves a slot whose fragment met a collision, as
    /// ATP's PS does (`None`, the paper's DSA: addresses never move).
    pub moves: Option<SlotMoves>,
}

/// The slot table DSA addresses a job's aggregators by (§III-A, "by hashing as in statistical
/// INA"): the one ATP builds for the same job and pool (`AtpConfig::slot_table`, `slots` distinct
/// hashed aggregators of `pool`). The switch starts with it; the PS moves its entries under
/// `move_slots`.
pub fn dsa_pool_slot_table(job: u16, slots: u32, pool: u32) -> Vec<u32> {
    crate::AtpConfig { job: job as u32, aggregators: pool, slots, hashing: crate::Hashing::Hash, ..Default::default() }.slot_table()
}

/// What the PS needs to move slots: the job's slot table, [`dsa_pool_slot_table`] of `slots` entries
/// over a pool of `pool` aggregators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotMoves {
    pub pool: u32,
    pub slots: u32,
}

impl DsaConfig {
    fn fan_in(&self) -> u8 {
        self.workers.len() as u8
    }
    fn rtt(&self) -> RttEstimator {
        RttEstimator::new(RttConfig { initial_rto_ps: self.min_rto_ps, min_rto_ps: self.min_rto_ps, max_rto_ps: self.max_rto(), ..RttConfig::default() })
    }
    /// The RTO's ceiling, which a fragment's back-off does not pass either.
    fn max_rto(&self) -> Time {
        RttConfig::default().max_rto_ps.max(self.min_rto_ps)
    }
    fn header(&self, psn: u32, bitmap: u32, priority: u32, kind: DsaKind, flags: u8) -> Header {
        Header::Dsa(DsaHeader {
            job: self.job,
            psn,
            bitmap,
            priority,
            fan_in: self.fan_in(),
            kind,
            flags,
        })
    }
    fn packet(
        &self,
        from: Endpoint,
        to: Endpoint,
        header: Header,
        values: Option<&[i32]>,
        count: usize,
    ) -> Packet {
        let size = if count == 0 {
            EMPTY_BYTES
        } else {
            self.header_bytes + 4 * count as u32
        };
        let mut p = Packet::new(from.host, from.port, to.host, to.port, size, header);
        if let Some(v) = values {
            p.payload = Some(Box::new(Payload::I32(v.to_vec())));
        }
        p
    }
}

fn i32s(pkt: &Packet) -> Option<&[i32]> {
    match pkt.payload.as_deref() {
        Some(Payload::I32(v)) => Some(v),
        _ => None,
    }
}

struct Request {
    id: u64,
    first_psn: u32,
    values: usize,
    data: Option<Vec<i32>>,
    result: Option<Vec<i32>>,
    acked: Vec<bool>,
    left: usize,
    priority: u32,
}

struct Outstanding {
    /// When it was first sent.
    sent: Time,
    /// When it was last sent (a resend or a notify).
    last: Time,
    retx: u32,
}

#[derive(Default)]
struct WorkerCounters {
    sent: u64,
    retransmits: u64,
    notifies: u64,
    fetch_replies: u64,
    stale_acks: u64,
    timeouts: u64,
    /// ACKs whose values or bitmap do not fit the fragment (counted and dropped).
    malformed: u64,
}

pub struct DsaWorker {
    cfg: DsaConfig,
    rank: u32,
    me: Endpoint,
    /// Requests kept (results for FETCHes, module docs); `reqs[0]` is request number `base`.
    reqs: VecDeque<Request>,
    base: usize,
    /// PSN -> request number, for the kept requests; the job's next PSN.
    psn_req: BTreeMap<u32, usize>,
    next_psn: u32,
    /// Fragments not yet sent, in submission order. Not reordered by layer or priority: the
    /// point at which a worker would switch differs with its jitter, and a job whose workers
    /// send its fragments in different orders keeps many half-aggregated for longer than a
    /// timeout (measured: a lone job under 300 us jitter no longer finished). The paper's
    /// L2p1 -> L1 -> L2p2 is the order tensors are submitted in (the job's `send_order`).
    unsent: VecDeque<u32>,
    outstanding: BTreeMap<u32, Outstanding>,
    deadlines: TimerTable<u32>,
    /// Retransmissions, notifications and fetch replies, sent before new fragments.
    urgent: VecDeque<Packet>,
    window: Box<dyn CongestionControl>,
    rtt: RttEstimator,
    events: VecDeque<HostEvent>,
    c: WorkerCounters,
}

impl DsaWorker {
    pub fn new(cfg: DsaConfig, rank: u32) -> Self {
        let me = cfg.workers[rank as usize];
        DsaWorker {
            window: WindowRules::default().window(&cfg.aimd),
            rtt: cfg.rtt(),
            cfg,
            rank,
            me,
            reqs: VecDeque::new(),
            base: 0,
            psn_req: BTreeMap::new(),
            next_psn: 0,
            unsent: VecDeque::new(),
            outstanding: BTreeMap::new(),
            deadlines: TimerTable::new(),
            urgent: VecDeque::new(),
            events: VecDeque::new(),
            c: WorkerCounters::default(),
        }
    }

    /// The kept request number `r`.
    fn req(&self, r: usize) -> &Request {
        &self.reqs[r - self.base]
    }

    fn fragment(&self, psn: u32) -> (usize, usize, usize) {
        let r = self.psn_req[&psn];
        let q = self.req(r);
        let k = psn.wrapping_sub(q.first_psn) as usize;
        let start = k * DSA_VALUES;
        (r, start, (start + DSA_VALUES).min(q.values))
    }

    fn is_acked(&self, psn: u32) -> bool {
        let q = self.req(self.psn_req[&psn]);
        q.acked[psn.wrapping_sub(q.first_psn) as usize]
    }

    /// This worker's gradient of `psn` as `kind`.
    fn gradient(&self, psn: u32, kind: DsaKind, flags: u8) -> Packet {
        let (r, s, e) = self.fragment(psn);
        let q = self.req(r);
        let h = self
            .cfg
            .header(psn, 1 << self.rank, q.priority, kind, flags);
        self.cfg.packet(
            self.me,
            self.cfg.ps,
            h,
            q.data.as_ref().map(|d| &d[s..e]),
            e - s,
        )
    }

    fn arm(&mut self, psn: u32, at: Time) {
        debug_assert!(self.outstanding.contains_key(&psn), "outstanding");
        self.deadlines.set(psn, at);
    }

    /// Bytes of a full fragment, the window's unit.
    fn packet_bytes(&self) -> u64 {
        self.cfg.header_bytes as u64 + 4 * DSA_VALUES as u64
    }

    fn on_ack(&mut self, now: Time, h: DsaHeader, pkt: &Packet) {
        if !self.outstanding.contains_key(&h.psn) {
            self.c.stale_acks += 1;
            return;
        }
        // In payload mode an ACK must carry exactly the fragment's values.
        let (r, s, e) = self.fragment(h.psn);
        if self.req(r).result.is_some() && i32s(pkt).map(<[i32]>::len) != Some(e - s) || h.bitmap != DsaHeader::full_bitmap(self.cfg.fan_in()) {
            self.c.malformed += 1;
            return;
        }
        let o = self.outstanding.remove(&h.psn).expect("checked above");
        self.deadlines.cancel(h.psn);
        // Sampled from the first send also when the fragment was resent (not Karn's rule, the
        // spec's choice): a DSA ACK is the whole job's sum, so it can come no sooner than the
        // slowest peer's contribution whichever of this worker's copies counted. With Karn's
        // rule the only samples were the fragments that beat the timeout, so a worker whose
        // peer lagged over the 1 ms floor never raised its RTO (#36: a lone two-worker
        // real-runtime job resent 80 % of its fragments). A fragment that went through the PS
        // (more than `retx_before_notify` timeouts) is sampled from its latest notify instead:
        // a loss's recovery takes that path (its lost ACK freed the aggregator: three
        // backed-off resends, then the PS), and its time from the first send scales with the
        // RTO itself, so sampled whole it raised the RTO the next loss backed off from (with
        // 1 % loss at the hosts a 64 KB allreduce took seconds). Not sampled at all, a lag
        // over 15 RTOs (a switch's processing queue) was never learnt and every fragment went
        // through the PS: a 4-worker job behind a 30 Mbps switch took 30-60 s instead of 6.
        // From the notify, such a lag's remainder raises the RTO until the first send's time
        // is learnt. (From the latest send for every fragment, a lag L settled at an RTO of
        // L/2, resending every fragment; sampling every completion clamped at twice the RTO,
        // or leaving out those over twice the recent shortest, also took seconds under loss,
        // or halved the lossless bench's goodput.)
        let from = if o.retx <= self.cfg.retx_before_notify { o.sent } else { o.last };
        self.rtt.sample(now - from);
        let seq_base = self
            .outstanding
            .keys()
            .next()
            .copied()
            .unwrap_or(self.next_psn);
        self.window.on_ack(
            pkt.size as u64,
            h.has(DsaHeader::FLAG_ECN),
            seq_base as u64,
            self.next_psn as u64,
        );
        let q = &mut self.reqs[r - self.base];
        if let (Some(res), Some(v)) = (&mut q.result, i32s(pkt)) {
            res[s..e].copy_from_slice(v);
        }
        let k = h.psn.wrapping_sub(q.first_psn) as usize;
        if !q.acked[k] {
            q.acked[k] = true;
            q.left -= 1;
            if q.left == 0 {
                // The result stays too: a FETCH for a fragment the PS has not seen complete
                // is answered with it (spec §1.9 item 6).
                let data = q.result.as_ref().map(|v| Payload::I32(v.clone()));
                self.events.push_back(HostEvent::Done { id: q.id, data });
                q.data = None;
            }
        }
    }

    /// Forgets the oldest requests once they are done and [`COMPLETED_KEPT`] PSNs behind the
    /// job's next one: the PS answers a late NOTIFY from its own completed results that far
    /// back and no further, so a FETCH for an older fragment cannot help any worker. Kept for
    /// the run, a worker grew by a result per PSN (2.35 GiB after 500 allreduces of 1 M
    /// values, #36).
    fn forget_old_results(&mut self) {
        while let Some(q) = self.reqs.front() {
            let n = q.acked.len() as u32;
            let behind = self.next_psn.wrapping_sub(q.first_psn.wrapping_add(n)) as usize;
            if q.left > 0 || behind < COMPLETED_KEPT {
                return;
            }
            for k in 0..n {
                self.psn_req.remove(&q.first_psn.wrapping_add(k));
            }
            self.reqs.pop_front();
            self.base += 1;
        }
    }

    /// PSNs whose request (its result, for FETCHes) the worker keeps: at most
    /// [`COMPLETED_KEPT`] plus the requests not done and the newest one.
    pub fn retained(&self) -> usize {
        self.psn_req.len()
    }

    fn on_fetch(&mut self, now: Time, h: DsaHeader) {
        if self.outstanding.contains_key(&h.psn) {
            self.c.fetch_replies += 1;
            let p = self.gradient(h.psn, DsaKind::FetchResp, 0);
            return self.urgent.push_back(p);
        }
        let Some(&r) = self.psn_req.get(&h.psn) else {
            return;
        };
        let k = h.psn.wrapping_sub(self.req(r).first_psn) as usize;
        if !self.req(r).acked[k] {
            // Not sent yet (the window holds it back) while the PS holds the peers' part:
            // send it now, outside the window. Waiting for the window made a worker whose
            // window had collapsed finish one split fragment per notify cycle (seconds per
            // allreduce in the real runtime).
            self.c.fetch_replies += 1;
            self.c.sent += 1;
            self.outstanding.insert(h.psn, Outstanding { sent: now, last: now, retx: 0 });
            self.deadlines.set(h.psn, now + self.rtt.rto());
            let p = self.gradient(h.psn, DsaKind::FetchResp, 0);
            return self.urgent.push_back(p);
        }
        // Already acknowledged: answer with the final sum, if this worker kept it.
        self.c.fetch_replies += 1;
        let (_, s, e) = self.fragment(h.psn);
        let q = self.req(r);
        let full = DsaHeader::full_bitmap(self.cfg.fan_in());
        let hdr = self.cfg.header(
            h.psn,
            full,
            q.priority,
            DsaKind::FetchResp,
            DsaHeader::FLAG_RESULT,
        );
        let p = self.cfg.packet(
            self.me,
            self.cfg.ps,
            hdr,
            q.result.as_ref().map(|d| &d[s..e]),
            e - s,
        );
        self.urgent.push_back(p);
    }
}

impl HostProtocol for DsaWorker {
    fn endpoint(&self) -> Endpoint {
        self.me
    }

    fn submit(&mut self, _now: Time, req: AppRequest) {
        let AppRequest::Allreduce {
            id,
            bytes,
            data,
            attrs,
        } = req
        else {
            return self.events.push_back(HostEvent::Rejected {
                id: 0,
                reason: "DSA workers only allreduce".into(),
            });
        };
        let data = match data {
            None => None,
            Some(Payload::I32(v)) => Some(v),
            // Floats are converted by `Quantized::converting` around this worker, which sends
            // a value out of range as a rail so that every worker fails the call on it (it
            // was 0 here, and [1, NaN] + [1, 2] gave [2, 2]).
            Some(Payload::F32(_)) => {
                return self.events.push_back(HostEvent::Rejected {
                    id,
                    reason: "DSA's worker sums int32: floats go through Quantized::converting".into(),
                })
            }
        };
        let values = data.as_ref().map_or(bytes.div_ceil(4) as usize, Vec::len);
        let n = values.div_ceil(DSA_VALUES).max(1);
        let first_psn = self.next_psn;
        self.next_psn = self.next_psn.wrapping_add(n as u32);
        self.forget_old_results();
        let r = self.base + self.reqs.len();
        for k in 0..n as u32 {
            self.psn_req.insert(first_psn.wrapping_add(k), r);
            self.unsent.push_back(first_psn.wrapping_add(k));
        }
        let result = data.as_ref().map(|_| vec![0; values]);
        // Priority 0 would never win; the spec clamps to at least 1.
        self.reqs.push_back(Request {
            id,
            first_psn,
            values,
            data,
            result,
            acked: vec![false; n],
            left: n,
            priority: attrs.priority.max(1),
        });
    }

    fn handle_packet(&mut self, now: Time, pkt: Packet) {
        let Header::Dsa(h) = pkt.header else { return };
        if h.job != self.cfg.job {
            return;
        }
        match h.kind {
            DsaKind::Ack => self.on_ack(now, h, &pkt),
            DsaKind::Fetch => self.on_fetch(now, h),
            _ => {}
        }
    }

    fn handle_timeout(&mut self, now: Time) {
        let mut fired = false;
        while let Some(psn) = self.deadlines.pop_expired(now) {
            fired = true;
            self.c.timeouts += 1;
            let o = self
                .outstanding
                .get_mut(&psn)
                .expect("armed fragments are outstanding");
            o.retx += 1;
            o.last = now;
            let retx = o.retx;
            let p = if retx <= self.cfg.retx_before_notify {
                self.c.retransmits += 1;
                self.gradient(psn, DsaKind::Grad, DsaHeader::FLAG_RETX)
            } else {
                self.c.notifies += 1;
                self.gradient(psn, DsaKind::Notify, 0)
            };
            self.urgent.push_back(p);
            // Exponential back-off per fragment (RFC 6298 §5.5), which the spec leaves out:
            // without it a worker whose peers start milliseconds later (a real job's threads)
            // resends and re-notifies its whole window every millisecond.
            let rto = backed_off(self.rtt.rto(), retx).min(self.cfg.max_rto());
            self.arm(psn, now + rto);
        }
        if fired {
            self.window.on_congestion(self.next_psn as u64);
        }
    }

    fn poll_transmit(&mut self, now: Time) -> Option<Packet> {
        if let Some(p) = self.urgent.pop_front() {
            return Some(p);
        }
        // Fragments a FETCH already sent are skipped.
        while let Some(&psn) = self.unsent.front() {
            if !self.outstanding.contains_key(&psn) && !self.is_acked(psn) {
                break;
            }
            self.unsent.pop_front();
        }
        let psn = *self.unsent.front()?;
        if !self.outstanding.is_empty()
            && (self.outstanding.len() as u64 + 1) * self.packet_bytes() > self.window.window()
        {
            return None;
        }
        if let (Some(span), Some(&oldest)) = (self.cfg.max_psn_span, self.outstanding.keys().next()) {
            if psn.wrapping_sub(oldest) >= span {
                return None;
            }
        }
        self.unsent.pop_front();
        self.outstanding.insert(psn, Outstanding { sent: now, last: now, retx: 0 });
        self.deadlines.set(psn, now + self.rtt.rto());
        self.c.sent += 1;
        Some(self.gradient(psn, DsaKind::Grad, 0))
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
            ("retransmits", c.retransmits),
            ("notifies", c.notifies),
            ("fetch_replies", c.fetch_replies),
            ("stale_acks", c.stale_acks),
            ("timeouts", c.timeouts),
            ("window_cuts", self.window.cuts()),
            ("malformed", c.malformed),
        ]
    }
}

struct Entry {
    values: Option<Vec<i32>>,
    count: usize,
    bitmap: u32,
    priority: u32,
    created: Time,
    reminders: u32,
    last_reminder: Option<Time>,
    ecn: bool,
    /// A losing gradient or an evicted partial contributed: the fragment met a collision.
    collided: bool,
}

#[cfg(test)]
mod priority_tests {
    use super::*;

    #[test]
    fn the_specs_examples() {
        // T = 1 ms, L = 2: A (Comm/Comp 2) layer 1 and 2, B (0.5) layer 1 and 2.
        assert_eq!(dsa_priority(1, 2, 2.0, MS), 262_144);
        assert_eq!(dsa_priority(2, 2, 2.0, MS), 131_072);
        assert_eq!(dsa_priority(1, 2, 0.5, MS), 65_536);
        assert_eq!(dsa_priority(2, 2, 0.5, MS), 32_768);
        // Less time left ranks higher; never 0.
        assert!(dsa_priority(1, 2, 2.0, MS / 2) > dsa_priority(1, 2, 2.0, MS));
        assert_eq!(dsa_priority(2, 2, 0.0, MS), 1);
    }
}

#[derive(Default)]
struct PsCounters {
    contributions: u64,
    duplicates: u64,
    overlaps: u64,
    completed: u64,
    stale: u64,
    reminders: u64,
    fetches: u64,
    /// Contributions with a bitmap or values that do not fit (counted and dropped).
    malformed: u64,
    /// Fragments given up after `MAX_REMINDERS` reminders.
    abandoned: u64,
    /// Slots moved (the `move_slots` ablation).
    moves: u64,
}

/// The job's slots as the switch holds them and the draws that move them (`move_slots`).
struct Mover {
    table: Vec<u32>,
    rehasher: crate::Rehasher,
}

pub struct DsaServer {
    cfg: DsaConfig,
    entries: BTreeMap<u32, Entry>,
    deadlines: TimerTable<u32>,
    /// Recently completed PSNs, oldest first, with the sum (payload mode).
    completed: BTreeMap<u32, Option<Vec<i32>>>,
    completed_order: VecDeque<u32>,
    /// The newest PSN completed here: the horizon counts back from it.
    newest: Option<u32>,
    out: VecDeque<Packet>,
    rtt: RttEstimator,
    events: VecDeque<HostEvent>,
    c: PsCounters,
    mover: Option<Mover>,
}

impl DsaServer {
    pub fn new(cfg: DsaConfig) -> Self {
        let mover = cfg.moves.map(|m| {
            let table = dsa_pool_slot_table(cfg.job, m.slots, m.pool);
            Mover { rehasher: crate::Rehasher::for_table(m.pool, cfg.job as u32, &table), table }
        });
        DsaServer {
            mover,
            rtt: cfg.rtt(),
            cfg,
            entries: BTreeMap::new(),
            deadlines: TimerTable::new(),
            completed: BTreeMap::new(),
            completed_order: VecDeque::new(),
            newest: None,
            out: VecDeque::new(),
            events: VecDeque::new(),
            c: PsCounters::default(),
        }
    }

    fn full(&self) -> u32 {
        DsaHeader::full_bitmap(self.cfg.fan_in())
    }

    /// How many PSNs back from the newest completed one the PS remembers completions. With
    /// the workers' PSN span capped at S (slot-table addressing) a worker that lacks q's ACK
    /// sends nothing from q + S on, so 2 S covers nearly every late NOTIFY; one from further
    /// back (a FETCH reply goes outside the window) opens an entry, and the workers' results
    /// answer its reminder: forgetting costs a round trip, never a result. Without a cap,
    /// [`COMPLETED_KEPT`]. Measured in the real runtime (#36): with the 65,536-PSN horizon a
    /// PS kept about 20,000 completions of a lone 2-worker job whose loaded workers'
    /// retransmissions sent a quarter of its fragments through the PS.
    fn horizon(&self) -> usize {
        self.cfg.max_psn_span.map_or(COMPLETED_KEPT, |s| (2 * s as usize).clamp(1, COMPLETED_KEPT))
    }

    /// The result of `psn` to every worker: one packet the switch multicasts, or one each.
    fn send_ack(
        &mut self,
        psn: u32,
        priority: u32,
        ecn: bool,
        values: Option<&[i32]>,
        count: usize,
    ) {
        let flags = if ecn { DsaHeader::FLAG_ECN } else { 0 };
        let h = self
            .cfg
            .header(psn, self.full(), priority, DsaKind::Ack, flags);
        let targets: Vec<Endpoint> = if self.cfg.multicast {
            vec![self.cfg.workers[0]]
        } else {
            self.cfg.workers.clone()
        };
        for w in targets {
            self.out
                .push_back(self.cfg.packet(self.cfg.ps, w, h.clone(), values, count));
        }
    }

    fn finish(&mut self, now: Time, psn: u32) {
        let e = self.entries.remove(&psn).expect("finishing an entry");
        self.deadlines.cancel(psn);
        // Karn's rule at the PS: an entry a reminder completed lived about one RTO_ps, so its
        // lifetime measures the timer, not the aggregation (§VI's "entry setup and its
        // aggregation completion"). Sampled, each RTO_ps became the next SRTT and RTO_ps
        // climbed to its 1 s ceiling, every split fragment then waited a second at the PS,
        // and the pending entries grew with it (#36: thousands in a lone real-runtime job).
        if e.reminders == 0 {
            self.rtt.sample(now - e.created);
        }
        self.c.completed += 1;
        if e.collided {
            self.move_slot(psn);
        }
        self.send_ack(psn, e.priority, e.ecn, e.values.as_deref(), e.count);
        self.completed.insert(psn, e.values);
        self.completed_order.push_back(psn);
        let newest = *self.newest.insert(self.newest.map_or(psn, |n| if psns_behind(n, psn) == 0 { psn } else { n }));
        let horizon = self.horizon();
        // Oldest completions first: nearly PSN order, so the front is the first to pass the
        // horizon; the count cap holds whatever the order.
        while let Some(&old) = self.completed_order.front() {
            if self.completed_order.len() <= horizon && (psns_behind(newest, old) as usize) < horizon {
                break;
            }
            self.completed_order.pop_front();
            self.completed.remove(&old);
        }

    }

    /// ATP's PS-side move (the `move_slots` ablation): the slot of a fragment that met a
    /// collision goes to an aggregator the job does not use, and the switch learns it before
    /// the ACK it forwards. No worker has the slot's next PSN in flight yet: it sends it only
    /// after this ACK (the PSN span is the table's length), so every packet of a fragment
    /// finds the same aggregator.
    fn move_slot(&mut self, psn: u32) {
        let Some(m) = &mut self.mover else { return };
        let slot = psn as usize % m.table.len();
        let Some(new) = m.rehasher.replace(m.table[slot]) else { return };
        m.table[slot] = new;
        self.c.moves += 1;
        // The switch on the way to any worker consumes MOVE, as REMIND_SW.
        let h = self.cfg.header(psn, new, 0, DsaKind::Move, 0);
        self.out.push_back(self.cfg.packet(self.cfg.ps, self.cfg.workers[0], h, None, 0));
    }

    fn reminder(&mut self, now: Time, psn: u32) {
        let (rto, full) = (self.rtt.rto(), self.full());
        let Some(e) = self.entries.get_mut(&psn) else {
            return;
        };
        self.deadlines.cancel(psn);
        if e.reminders >= MAX_REMINDERS {
            // No worker and no switch has this fragment (a PSN no worker sent, or a forged
            // one): give it up rather than remind forever (spec §1.8 item 2.4's diagnostic).
            self.entries.remove(&psn);
            self.c.abandoned += 1;
            return;
        }
        e.reminders += 1;
        e.last_reminder = Some(now);
        let (missing, priority) = (full & !e.bitmap, e.priority);
        self.deadlines.set(psn, now + rto);
        self.c.reminders += 1;
        // The switch on the way to any worker consumes REMIND_SW; worker 0 is the address.
        let h = self.cfg.header(psn, 0, priority, DsaKind::RemindSw, 0);
        self.out.push_back(
            self.cfg
                .packet(self.cfg.ps, self.cfg.workers[0], h, None, 0),
        );
        self.fetch(psn, missing, priority);
    }

    /// Asks the workers in `missing` for their own gradients of `psn`.
    fn fetch(&mut self, psn: u32, missing: u32, priority: u32) {
        for (rank, &w) in self.cfg.workers.iter().enumerate() {
            if missing & (1 << rank) != 0 {
                self.c.fetches += 1;
                let h = self.cfg.header(psn, 1 << rank, priority, DsaKind::Fetch, 0);
                self.out
                    .push_back(self.cfg.packet(self.cfg.ps, w, h, None, 0));
            }
        }
    }

    fn contribute(&mut self, now: Time, h: DsaHeader, pkt: &Packet) {
        self.c.contributions += 1;
        let full = self.full();
        // A worker's own gradient names one worker; a result names all; an aggregate some.
        let bits_ok = match h.kind {
            DsaKind::FetchResp if h.has(DsaHeader::FLAG_RESULT) => h.bitmap == full,
            DsaKind::Grad | DsaKind::Notify | DsaKind::FetchResp => h.bitmap.count_ones() == 1,
            _ => h.bitmap != 0,
        };
        // Values must match the entry's (payload mode) or be absent as its are (metadata).
        let fits = self.entries.get(&h.psn).map_or(true, |e| match (&e.values, i32s(pkt)) {
            (None, None) => true,
            (Some(a), Some(v)) => a.len() == v.len(),
            _ => false,
        });
        if h.bitmap & !full != 0 || !bits_ok || !fits {
            self.c.malformed += 1;
            return;
        }
        // Values the packet's size accounts for (its count in metadata mode).
        let n = pkt.size.saturating_sub(self.cfg.header_bytes) as usize / 4;
        if let Some(done) = self.completed.get(&h.psn) {
            if h.kind == DsaKind::Notify {
                let v = done.clone();
                self.send_ack(h.psn, h.priority, false, v.as_deref(), n);
            } else {
                self.c.stale += 1;
            }
            return;
        }
        if h.kind == DsaKind::FetchResp && h.has(DsaHeader::FLAG_RESULT) {
            let e = self.entry(now, h, n);
            e.values = i32s(pkt).map(<[i32]>::to_vec);
            e.bitmap = full;
            return self.finish(now, h.psn);
        }
        let e = self.entry(now, h, n);
        e.ecn |= h.has(DsaHeader::FLAG_ECN) || pkt.ecn;
        e.collided |= matches!(h.kind, DsaKind::Grad | DsaKind::Evict);
        if e.bitmap & h.bitmap == 0 {
            if let (Some(acc), Some(v)) = (&mut e.values, i32s(pkt)) {
                // Sticky saturation, as at the switch (inalab_core::rail): a sum beyond the
                // range stays at a rail, and every worker fails the call on it.
                inalab_core::rail::sticky_add(acc, v);
            } else if e.values.is_none() {
                e.values = i32s(pkt).map(<[i32]>::to_vec);
            }
            e.bitmap |= h.bitmap;
        } else if h.bitmap & !e.bitmap == 0 {
            self.c.duplicates += 1;
        } else {
            // A partial overlapping what is here cannot be merged: ask for the missing
            // workers' own gradients instead (spec §1.7 item 2.3).
            let (missing, priority) = (h.bitmap & !e.bitmap, e.priority);
            self.c.overlaps += 1;
            self.fetch(h.psn, missing, priority);
        }
        if self.entries[&h.psn].bitmap == full {
            self.finish(now, h.psn);
        } else if (h.kind == DsaKind::Notify || h.has(DsaHeader::FLAG_RETX))
            && self.entries[&h.psn]
                .last_reminder
                .map_or(true, |t| now >= t + self.cfg.min_rto_ps)
        {
            // A worker is stuck, or a retransmission got here: the switch lost its copy or
            // already finished the fragment (then the workers answer with the result). Remind
            // now rather than an RTO later, so no entry outlives its job. At most one per RTO
            // floor, not one per RTO_ps as the spec chose: RTO_ps estimates entry lifetimes,
            // which reach seconds in a real job whose workers drift apart, and notifies are
            // already backed off by the worker.
            self.reminder(now, h.psn);
        }
    }

    fn entry(&mut self, now: Time, h: DsaHeader, count: usize) -> &mut Entry {
        let rto = self.rtt.rto();
        let deadlines = &mut self.deadlines;
        self.entries.entry(h.psn).or_insert_with(|| {
            deadlines.set(h.psn, now + rto);
            Entry {
                values: None,
                count,
                bitmap: 0,
                priority: h.priority,
                created: now,
                reminders: 0,
                last_reminder: None,
                ecn: false,
                collided: false,
            }
        })
    }

    /// PSNs with a partial sum waiting (empty once every fragment completed).
    pub fn pending(&self) -> usize {
        self.entries.len()
    }

    /// Completed fragments remembered.
    pub fn completed_kept(&self) -> usize {
        self.completed.len()
    }
}

impl HostProtocol for DsaServer {
    fn endpoint(&self) -> Endpoint {
        self.cfg.ps
    }

    /// The PS takes no application requests: it only reacts to packets.
    fn submit(&mut self, _now: Time, req: AppRequest) {
        let (AppRequest::Allreduce { id, .. } | AppRequest::Send { id, .. }) = req;
        self.events.push_back(HostEvent::Failed {
            id,
            reason: "a DSA parameter server takes no requests".into(),
        });
    }

    fn handle_packet(&mut self, now: Time, pkt: Packet) {
        let Header::Dsa(h) = pkt.header else { return };
        if h.job != self.cfg.job {
            return;
        }
        match h.kind {
            DsaKind::Grad | DsaKind::Evict | DsaKind::Notify | DsaKind::FetchResp => {
                self.contribute(now, h, &pkt)
            }
            DsaKind::RemindSwResp if !h.has(DsaHeader::FLAG_EMPTY) => self.contribute(now, h, &pkt),
            _ => {}
        }
    }

    fn handle_timeout(&mut self, now: Time) {
        // Taken out as it fires, so a deadline can never outlive its entry and spin this loop.
        while let Some(psn) = self.deadlines.pop_expired(now) {
            self.reminder(now, psn);
        }
    }

    fn poll_transmit(&mut self, _now: Time) -> Option<Packet> {
        self.out.pop_front()
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
            ("contributions", c.contributions),
            ("duplicates", c.duplicates),
            ("overlaps", c.overlaps),
            ("completed", c.completed),
            ("stale", c.stale),
            ("reminders", c.reminders),
            ("fetches", c.fetches),
            ("pending", self.entries.len() as u64),
            ("completed_kept", self.completed.len() as u64),
            ("malformed", c.malformed),
            ("abandoned", c.abandoned),
            ("slot_moves", c.moves),
        ]
    }
}

/// Default RTO floor (§VI).
pub const DSA_MIN_RTO_PS: Time = MS;

/// DSA's priority of a tensor (§V, Table I): P = (1/T) (L/l) (Comm/Comp), T the time left in
/// the job's iteration in ms, l the tensor's 1-based layer of L, Comm/Comp the job's
/// communication over computation time. Encoded as 16.16 fixed point, at least 1 (a priority
/// downgraded to 0 always yields) and T at least 1 us (spec §1.10, §4 item 4).
pub fn dsa_priority(layer: u32, layers: u32, comm_over_comp: f64, remaining_ps: Time) -> u32 {
    let t_ms = remaining_ps.max(inalab_core::time::US) as f64 / MS as f64;
    let p = (1.0 / t_ms) * (layers.max(1) as f64 / layer.max(1) as f64) * comm_over_comp.max(0.0);
    (p * 65536.0).round().clamp(1.0, u32::MAX as f64) as u32
}

/// The spec's host-side cases (§2): T10, T16, T17, T19, and the PS's reminder (T7, T12, T18).
#[cfg(test)]
mod tests {
    use super::*;
    use inalab_core::TensorAttrs;
    use std::collections::BTreeSet;

    const PS: Endpoint = Endpoint { host: 9, port: 2 };

    fn cfg(n: u32) -> DsaConfig {
        DsaConfig {
            job: 3,
            workers: (0..n).map(|h| Endpoint { host: h, port: 1 }).collect(),
            ps: PS,
            header_bytes: 58,
            aimd: AimdConfig::default(),
            min_rto_ps: MS,
            retx_before_notify: 3,
            multicast: true,
            max_psn_span: None,
            moves: None,
        }
    }

    fn submit(w: &mut DsaWorker, values: usize) {
        let data = Some(Payload::I32((0..values as i32).collect()));
        w.submit(0, AppRequest::Allreduce { id: 7, bytes: 4 * values as u64, data, attrs: TensorAttrs::default() });
    }

    fn drain(p: &mut dyn HostProtocol, now: Time) -> Vec<Packet> {
        std::iter::from_fn(|| p.poll_transmit(now)).collect()
    }

    fn hdr(p: &Packet) -> DsaHeader {
        match p.header {
            Header::Dsa(h) => h,
            _ => panic!("not DSA"),
        }
    }

    fn packet(from: Endpoint, to: Endpoint, h: DsaHeader, values: Option<Vec<i32>>) -> Packet {
        let mut p = Packet::new(from.host, from.port, to.host, to.port, 306, Header::Dsa(h));
        p.payload = values.map(|v| Box::new(Payload::I32(v)));
        p
    }

    fn ack(psn: u32, n: u8, v: i32) -> Packet {
        let h = DsaHeader { job: 3, psn, bitmap: DsaHeader::full_bitmap(n), priority: 1, fan_in: n, kind: DsaKind::Ack, flags: 0 };
        packet(PS, Endpoint { host: 0, port: 1 }, h, Some(vec![v; 62]))
    }

    fn counter(p: &dyn HostProtocol, name: &str) -> u64 {
        p.counters().into_iter().find(|(n, _)| *n == name).unwrap().1
    }

    #[test]
    fn t16_duplicate_and_late_acks_change_nothing() {
        let mut w = DsaWorker::new(cfg(2), 0);
        submit(&mut w, 62 * 4);
        assert_eq!(drain(&mut w, 0).len(), 4);
        w.handle_packet(10, ack(0, 2, 5));
        let window = w.window.window();
        w.handle_packet(11, ack(0, 2, 5));
        w.handle_packet(12, ack(0, 2, 5));
        assert_eq!(w.window.window(), window, "no window change on a duplicate ACK");
        assert_eq!(counter(&w, "stale_acks"), 2);
        assert!(drain(&mut w, 12).is_empty(), "no fast retransmit");
    }

    #[test]
    fn t17_notify_only_after_the_third_retransmission_backing_off() {
        let mut w = DsaWorker::new(cfg(2), 1);
        submit(&mut w, 62);
        assert_eq!(drain(&mut w, 0).len(), 1);
        let mut kinds = vec![];
        // One RTO (the 1 ms floor) after the send, then doubling: 1, 3, 7, 15, 31, 63, 127,
        // and 64 RTOs apart from then on.
        for (k, want) in [1, 3, 7, 15, 31, 63, 127, 191].into_iter().enumerate() {
            let t = w.poll_timeout().expect("armed");
            assert_eq!(t, want * MS, "expiry {k}");
            w.handle_timeout(t);
            let out = drain(&mut w, t);
            kinds.extend(out.iter().map(|p| (hdr(p).kind, hdr(p).has(DsaHeader::FLAG_RETX))));
        }
        use DsaKind::*;
        assert_eq!(kinds, [[(Grad, true); 3].as_slice(), &[(Notify, false); 5]].concat());
    }

    #[test]
    fn t19_a_fetch_for_an_acknowledged_fragment_is_answered_with_the_result() {
        let mut w = DsaWorker::new(cfg(2), 0);
        submit(&mut w, 62);
        drain(&mut w, 0);
        let fetch = |psn| packet(PS, Endpoint { host: 0, port: 1 }, DsaHeader { job: 3, psn, bitmap: 1, priority: 1, fan_in: 2, kind: DsaKind::Fetch, flags: 0 }, None);
        // Outstanding: its own gradient.
        w.handle_packet(5, fetch(0));
        let out = drain(&mut w, 5);
        assert_eq!((hdr(&out[0]).kind, hdr(&out[0]).bitmap, hdr(&out[0]).flags), (DsaKind::FetchResp, 1, 0));
        w.handle_packet(10, ack(0, 2, 42));
        assert!(matches!(w.poll_event(), Some(HostEvent::Done { id: 7, .. })));
        // Acknowledged: the final sum, full bitmap.
        w.handle_packet(20, fetch(0));
        let out = drain(&mut w, 20);
        assert_eq!((hdr(&out[0]).bitmap, hdr(&out[0]).flags), (0b11, DsaHeader::FLAG_RESULT));
        assert_eq!(out[0].payload.as_deref(), Some(&Payload::I32(vec![42; 62])));
        // Never sent: ignored (the PS asks again).
        w.handle_packet(30, fetch(99));
        assert!(drain(&mut w, 30).is_empty());
    }

    #[test]
    fn a_fetch_for_a_fragment_the_window_holds_back_is_answered_at_once() {
        // Found in the real runtime: a worker whose window had collapsed ignored FETCHes for
        // fragments not sent yet, and finished one split fragment per notify cycle.
        let mut w = DsaWorker::new(cfg(2), 0);
        submit(&mut w, 62 * 2000);
        let first = drain(&mut w, 0);
        let held = first.len() as u32 + 5;
        assert!(held < 2000, "the window holds fragments back");
        let fetch = packet(PS, Endpoint { host: 0, port: 1 }, DsaHeader { job: 3, psn: held, bitmap: 1, priority: 1, fan_in: 2, kind: DsaKind::Fetch, flags: 0 }, None);
        w.handle_packet(5, fetch);
        let out = drain(&mut w, 5);
        assert_eq!(out.len(), 1);
        assert_eq!((hdr(&out[0]).kind, hdr(&out[0]).psn, hdr(&out[0]).bitmap), (DsaKind::FetchResp, held, 1));
        assert_eq!(out[0].payload.as_deref(), Some(&Payload::I32((held as i32 * 62..held as i32 * 62 + 62).collect())));
        // Every fragment completes; the fetched one is never sent again as a gradient.
        let mut t = 10;
        let mut pending: Vec<u32> = first.iter().map(|p| hdr(p).psn).chain([held]).collect();
        while let Some(psn) = pending.pop() {
            w.handle_packet(t, ack(psn, 2, 1));
            for p in drain(&mut w, t) {
                assert_ne!(hdr(&p).psn, held, "sent twice");
                pending.push(hdr(&p).psn);
            }
            t += 1;
        }
        assert!(matches!(w.poll_event(), Some(HostEvent::Done { id: 7, .. })));
    }

    #[test]
    fn a_notify_reminds_again_after_the_rto_floor_however_long_rto_ps_grew() {
        // Found in the real runtime: RTO_ps estimates entry lifetimes, which grew to its 1 s
        // ceiling when workers drifted apart; stuck workers' NOTIFYs then waited for it.
        let mut ps = DsaServer::new(cfg(2));
        for psn in 0..20 {
            let t = psn as Time * 1000 * MS;
            ps.handle_packet(t, contribution2(DsaKind::Grad, psn, 0b01));
            ps.handle_packet(t + 500 * MS, contribution2(DsaKind::Grad, psn, 0b10));
        }
        assert!(ps.rtt.rto() > 100 * MS, "RTO_ps follows entry lifetimes");
        let t = 100_000 * MS;
        ps.handle_packet(t, contribution2(DsaKind::Notify, 50, 0b10));
        assert_eq!(counter(&ps, "reminders"), 1);
        ps.handle_packet(t + MS / 2, contribution2(DsaKind::Notify, 50, 0b10));
        assert_eq!(counter(&ps, "reminders"), 1, "at most one per RTO floor");
        drain(&mut ps, t + MS / 2);
        ps.handle_packet(t + 2 * MS, contribution2(DsaKind::Notify, 50, 0b10));
        assert_eq!(counter(&ps, "reminders"), 2);
        let fetched: Vec<u32> = drain(&mut ps, t + 2 * MS).iter().filter(|p| hdr(p).kind == DsaKind::Fetch).map(|p| p.dst).collect();
        assert_eq!(fetched, vec![0], "the missing worker is asked again");
    }

    #[test]
    fn with_move_slots_a_fragment_that_collided_moves_its_slot_before_its_ack() {
        let mut c = cfg(2);
        c.moves = Some(SlotMoves { pool: 1000, slots: 4 });
        let table = dsa_pool_slot_table(3, 4, 1000);
        let mut ps = DsaServer::new(c);
        // PSN 6 (slot 2): an evicted partial and a losing gradient, a collision; PSN 5: two
        // notifies (lost packets, no collision) move nothing.
        ps.handle_packet(0, contribution2(DsaKind::Notify, 5, 0b01));
        ps.handle_packet(0, contribution2(DsaKind::Notify, 5, 0b10));
        ps.handle_packet(0, contribution2(DsaKind::Evict, 6, 0b01));
        ps.handle_packet(0, contribution2(DsaKind::Grad, 6, 0b10));
        let out: Vec<(DsaKind, u32, u32)> = drain(&mut ps, 0).iter().map(|p| (hdr(p).kind, hdr(p).psn, hdr(p).bitmap)).filter(|k| k.0 != DsaKind::RemindSw && k.0 != DsaKind::Fetch).collect();
        assert_eq!(out.len(), 3, "{out:?}");
        assert_eq!((out[0].0, out[0].1), (DsaKind::Ack, 5));
        assert_eq!((out[1].0, out[1].1, out[2].0, out[2].1), (DsaKind::Move, 6, DsaKind::Ack, 6), "the move goes first");
        let new = out[1].2;
        assert!(new < 1000 && !table.contains(&new), "{new} is one of the job's own slots {table:?}");
        assert_eq!(counter(&ps, "slot_moves"), 1);
        // Without the ablation (the paper's DSA) nothing moves.
        let mut plain = DsaServer::new(cfg(2));
        plain.handle_packet(0, contribution2(DsaKind::Evict, 6, 0b01));
        plain.handle_packet(0, contribution2(DsaKind::Grad, 6, 0b10));
        assert!(drain(&mut plain, 0).iter().all(|p| hdr(p).kind != DsaKind::Move));
    }

    fn contribution2(kind: DsaKind, psn: u32, bitmap: u32) -> Packet {
        let h = DsaHeader { job: 3, psn, bitmap, priority: 1, fan_in: 2, kind, flags: 0 };
        packet(Endpoint { host: 0, port: 1 }, PS, h, Some(vec![1; 62]))
    }

    fn contribution(kind: DsaKind, psn: u32, bitmap: u32, v: i32, flags: u8) -> Packet {
        let h = DsaHeader { job: 3, psn, bitmap, priority: 1, fan_in: 4, kind, flags };
        packet(Endpoint { host: 0, port: 1 }, PS, h, Some(vec![v; 62]))
    }

    #[test]
    fn t7_t12_the_ps_reminds_after_its_timeout_and_merges_the_switchs_partial() {
        let mut ps = DsaServer::new(cfg(4));
        ps.handle_packet(0, contribution(DsaKind::Evict, 5, 0b0011, 3, 0));
        assert!(drain(&mut ps, 0).is_empty(), "no reminder before the timeout");
        assert_eq!(ps.poll_timeout(), Some(MS));
        ps.handle_timeout(MS);
        let out = drain(&mut ps, MS);
        let kinds: Vec<(DsaKind, u32)> = out.iter().map(|p| (hdr(p).kind, p.dst)).collect();
        assert_eq!(kinds, vec![(DsaKind::RemindSw, 0), (DsaKind::Fetch, 2), (DsaKind::Fetch, 3)], "the switch, then the missing workers");
        ps.handle_packet(MS + 5, contribution(DsaKind::RemindSwResp, 5, 0b1100, 4, 0));
        let out = drain(&mut ps, MS + 5);
        assert_eq!((hdr(&out[0]).kind, hdr(&out[0]).bitmap), (DsaKind::Ack, 0b1111));
        assert_eq!(out[0].payload.as_deref(), Some(&Payload::I32(vec![7; 62])));
        assert_eq!(ps.pending(), 0);
        // A late duplicate of the finished fragment creates nothing.
        ps.handle_packet(MS + 9, contribution(DsaKind::FetchResp, 5, 0b0100, 2, 0));
        assert_eq!((ps.pending(), counter(&ps, "stale")), (0, 1));
    }

    #[test]
    fn entries_a_reminder_completed_do_not_raise_the_ps_timeout() {
        // #36: each reminder-completed entry lived one RTO_ps; sampled, RTO_ps fed itself up to
        // its 1 s ceiling and a lone real-runtime job held thousands of pending entries.
        let mut ps = DsaServer::new(cfg(4));
        let mut t = 0;
        for psn in 0..50 {
            ps.handle_packet(t, contribution(DsaKind::Evict, psn, 0b0011, 3, 0));
            let at = ps.poll_timeout().expect("the entry's timer");
            ps.handle_timeout(at);
            drain(&mut ps, at);
            ps.handle_packet(at + 5, contribution(DsaKind::RemindSwResp, psn, 0b1100, 4, 0));
            drain(&mut ps, at + 5);
            t = at + 10;
        }
        assert_eq!((counter(&ps, "completed"), ps.pending()), (50, 0));
        assert_eq!(ps.rtt.rto(), MS, "RTO_ps stays at its floor");
        // An entry its own contributions complete is a sample.
        for psn in 100..110 {
            ps.handle_packet(t, contribution(DsaKind::Evict, psn, 0b0011, 3, 0));
            ps.handle_packet(t + 3 * MS / 2, contribution(DsaKind::Evict, psn, 0b1100, 4, 0));
            t += 2 * MS;
        }
        assert!(ps.rtt.rto() > MS, "entry lifetimes are measured");
    }

    #[test]
    fn a_worker_whose_peer_lags_past_the_floor_raises_its_timeout() {
        // #36: with Karn's rule every sample was a fragment that beat the 1 ms floor, so a
        // worker whose peer lagged 3 ms resent every fragment, for the whole job. Each
        // fragment's ACK comes `lag` after its first send (the peer's contribution): once the
        // worker has learnt the lag, it resends nothing. (Sampled from the latest send, a lag
        // of 3.5 to 20 ms settled at an RTO of half of it and resent every fragment. A lag
        // over 15 RTOs reaches the PS, and is learnt from the notify on.)
        for lag in [3 * MS, 3 * MS + MS / 2, 10 * MS, 20 * MS, 60 * MS] {
            let (late, rto) = lagged(lag, 400);
            assert!(rto > lag, "lag {lag}: the completion time is measured: RTO {rto}");
            assert_eq!(late, 0, "lag {lag}: timeouts in the second half of the fragments");
        }
    }

    /// One worker of two whose every fragment is acknowledged `lag` after its first send:
    /// (timeouts once half the fragments were acknowledged, the RTO at the end).
    fn lagged(lag: Time, fragments: u32) -> (u64, Time) {
        let mut w = DsaWorker::new(cfg(2), 0);
        submit(&mut w, 62 * fragments as usize);
        let mut first_sent: BTreeMap<u32, Time> = BTreeMap::new();
        let (mut t, mut acked, mut late) = (0, BTreeSet::new(), 0);
        while acked.len() < fragments as usize {
            for p in drain(&mut w, t) {
                first_sent.entry(hdr(&p).psn).or_insert(t);
            }
            let next_ack = first_sent.iter().filter(|(psn, _)| !acked.contains(*psn)).map(|(&psn, &at)| (at + lag, psn)).min().expect("a fragment in flight");
            match w.poll_timeout() {
                Some(at) if at < next_ack.0 => {
                    t = at;
                    let before = counter(&w, "timeouts");
                    w.handle_timeout(t);
                    if acked.len() >= fragments as usize / 2 {
                        late += counter(&w, "timeouts") - before;
                    }
                }
                _ => {
                    t = next_ack.0;
                    w.handle_packet(t, ack(next_ack.1, 2, 1));
                    acked.insert(next_ack.1);
                }
            }
        }
        (late, w.rtt.rto())
    }

    #[test]
    fn t10_an_overlapping_partial_is_dropped_and_the_missing_workers_fetched() {
        let mut ps = DsaServer::new(cfg(4));
        ps.handle_packet(0, contribution(DsaKind::Grad, 8, 0b0001, 1, 0));
        ps.handle_packet(1, contribution(DsaKind::Evict, 8, 0b0011, 3, 0));
        let out = drain(&mut ps, 1);
        assert_eq!(out.iter().map(|p| (hdr(p).kind, p.dst)).collect::<Vec<_>>(), vec![(DsaKind::Fetch, 1)]);
        assert_eq!(counter(&ps, "overlaps"), 1);
        for (rank, v) in [(1u32, 2), (2, 3), (3, 4)] {
            ps.handle_packet(2, contribution(DsaKind::FetchResp, 8, 1 << rank, v, 0));
        }
        let out = drain(&mut ps, 2);
        assert_eq!(out[0].payload.as_deref(), Some(&Payload::I32(vec![10; 62])), "each worker counted once");
    }

    #[test]
    fn a_forged_fragment_is_given_up_and_forged_results_are_dropped() {
        // Found in review: an entry for a PSN no worker sent was reminded forever, and a
        // RESULT naming only some workers finished an entry with its values.
        let mut ps = DsaServer::new(cfg(4));
        ps.handle_packet(0, contribution(DsaKind::Grad, 0xFFFF_FFF0, 0b0001, 1, 0));
        ps.handle_packet(1, contribution(DsaKind::FetchResp, 0xFFFF_FFF0, 0b0011, 9, DsaHeader::FLAG_RESULT));
        ps.handle_packet(2, contribution(DsaKind::Grad, 0xFFFF_FFF0, 0b0110, 9, 0));
        assert_eq!((counter(&ps, "malformed"), ps.pending()), (2, 1));
        let mut t = 0;
        while let Some(at) = ps.poll_timeout() {
            assert!(at > t && at < 10_000 * MS, "reminders end");
            t = at;
            ps.handle_timeout(t);
            drain(&mut ps, t);
        }
        assert_eq!((ps.pending(), counter(&ps, "abandoned"), counter(&ps, "reminders")), (0, 1, MAX_REMINDERS as u64));
    }

    #[test]
    fn a_worker_never_sends_a_psn_a_slot_table_or_more_beyond_its_oldest_unacked() {
        // ATP's rule for a slot table of 4: PSN p and p + 4 share a slot, so p + 4 waits for
        // p's ACK however large the window.
        let mut c = cfg(2);
        c.max_psn_span = Some(4);
        c.aimd.initial_window_bytes = 1 << 30;
        let mut w = DsaWorker::new(c, 0);
        submit(&mut w, 62 * 10);
        let psns = |w: &mut DsaWorker, t| drain(w, t).iter().map(|p| hdr(p).psn).collect::<Vec<_>>();
        assert_eq!(psns(&mut w, 0), vec![0, 1, 2, 3]);
        w.handle_packet(1, ack(1, 2, 5));
        assert_eq!(psns(&mut w, 1), Vec::<u32>::new(), "PSN 0 is still unacknowledged");
        w.handle_packet(2, ack(0, 2, 5));
        assert_eq!(psns(&mut w, 2), vec![4, 5]);
    }

    #[test]
    fn an_ack_with_the_wrong_number_of_values_is_dropped() {
        let mut w = DsaWorker::new(cfg(2), 0);
        submit(&mut w, 62);
        drain(&mut w, 0);
        let mut short = ack(0, 2, 5);
        short.payload = Some(Box::new(Payload::I32(vec![5; 10])));
        w.handle_packet(10, short);
        assert!(w.poll_event().is_none());
        assert_eq!(counter(&w, "malformed"), 1);
        w.handle_packet(11, ack(0, 2, 5));
        assert!(matches!(w.poll_event(), Some(HostEvent::Done { id: 7, .. })));
    }

    #[test]
    fn a_ps_forgets_completions_beyond_the_psn_horizon_and_refetches_what_is_asked_from_there() {
        // Found with benchmarks/memory_slope.py (#36): 15 of a 1 M-value allreduce's 16,913
        // fragments complete at the PS (the rest at the switch), and the PS kept its last
        // 65,536 completions, 2.7 KB more per allreduce over 2,000. Here one fragment in 1,000
        // completes at the PS over 2^20 PSNs: it keeps those within the horizon only.
        let mut ps = DsaServer::new(cfg(2));
        let step = 1000u32;
        for psn in (0..1u32 << 20).step_by(step as usize) {
            ps.handle_packet(0, contribution2(DsaKind::Grad, psn, 0b01));
            ps.handle_packet(0, contribution2(DsaKind::Grad, psn, 0b10));
            drain(&mut ps, 0);
        }
        let newest = ((1u32 << 20) - 1) / step * step;
        assert_eq!(ps.pending(), 0);
        assert!(ps.completed_kept() <= COMPLETED_KEPT / step as usize + 1, "{} completions kept", ps.completed_kept());
        // A late NOTIFY within the horizon is answered with the sum; one beyond it opens an
        // entry whose reminder asks the switch and the worker that has not notified.
        ps.handle_packet(1, contribution2(DsaKind::Notify, newest - 10 * step, 0b01));
        let out = drain(&mut ps, 1);
        assert_eq!((out.len(), hdr(&out[0]).kind, out[0].payload.as_deref()), (1, DsaKind::Ack, Some(&Payload::I32(vec![2; 62]))));
        ps.handle_packet(2, contribution2(DsaKind::Notify, newest - 100 * step, 0b01));
        let kinds: Vec<(DsaKind, u32)> = drain(&mut ps, 2).iter().map(|p| (hdr(p).kind, hdr(p).bitmap)).collect();
        assert_eq!(kinds, vec![(DsaKind::RemindSw, 0), (DsaKind::Fetch, 0b10)]);
        assert_eq!(ps.pending(), 1);
    }

    #[test]
    fn with_a_capped_psn_span_the_ps_remembers_twice_the_span() {
        // Slot-table addressing caps a worker's PSNs in flight at S = 4.
        let mut c = cfg(2);
        c.max_psn_span = Some(4);
        let mut ps = DsaServer::new(c);
        for psn in 0..100u32 {
            ps.handle_packet(0, contribution2(DsaKind::Grad, psn, 0b01));
            ps.handle_packet(0, contribution2(DsaKind::Grad, psn, 0b10));
            drain(&mut ps, 0);
        }
        assert!(ps.completed_kept() <= 8, "{} completions kept", ps.completed_kept());
    }

    #[test]
    fn a_worker_keeps_results_only_as_far_back_as_a_fetch_can_need_them() {
        // Found in the real runtime (#36): a worker kept every result and its PSN map for the
        // run, 2.35 GiB after 500 allreduces of 1 M values. 60 allreduces of 4,096 fragments
        // (nearly four times the span), each acknowledged: what it keeps stays within the
        // span and one allreduce, a FETCH within it is still answered with the result, and
        // one beyond it is ignored.
        let mut w = DsaWorker::new(cfg(2), 0);
        let frags = 4096u32;
        for k in 0..60u32 {
            w.submit(0, AppRequest::Allreduce { id: k as u64, bytes: 0, data: Some(Payload::I32(vec![1; 62 * frags as usize])), attrs: TensorAttrs::default() });
            let mut pending: Vec<u32> = drain(&mut w, 0).iter().map(|p| hdr(p).psn).collect();
            while let Some(psn) = pending.pop() {
                w.handle_packet(1, ack(psn, 2, psn as i32));
                pending.extend(drain(&mut w, 1).iter().map(|p| hdr(p).psn));
            }
            assert!(matches!(w.poll_event(), Some(HostEvent::Done { .. })), "allreduce {k}");
            assert!(w.retained() <= COMPLETED_KEPT + 2 * frags as usize, "allreduce {k}: {} PSNs kept", w.retained());
        }
        let fetch = |psn| packet(PS, Endpoint { host: 0, port: 1 }, DsaHeader { job: 3, psn, bitmap: 1, priority: 1, fan_in: 2, kind: DsaKind::Fetch, flags: 0 }, None);
        let recent = 60 * frags - 100;
        w.handle_packet(2, fetch(recent));
        let out = drain(&mut w, 2);
        assert_eq!(out.len(), 1);
        assert_eq!((hdr(&out[0]).flags, out[0].payload.as_deref()), (DsaHeader::FLAG_RESULT, Some(&Payload::I32(vec![recent as i32; 62]))));
        w.handle_packet(3, fetch(5));
        assert!(drain(&mut w, 3).is_empty(), "PSN 5 is long forgotten");
    }

    #[test]
    fn t18_an_empty_reminder_reply_and_a_result_from_a_worker_finish_the_entry() {
        let mut ps = DsaServer::new(cfg(4));
        ps.handle_packet(0, contribution(DsaKind::Grad, 2, 0b0001, 1, DsaHeader::FLAG_RETX));
        // A retransmission reached the PS: it reminds at once.
        assert_eq!(counter(&ps, "reminders"), 1);
        drain(&mut ps, 0);
        let mut empty = contribution(DsaKind::RemindSwResp, 2, 0, 0, DsaHeader::FLAG_EMPTY);
        empty.payload = None;
        ps.handle_packet(3, empty);
        ps.handle_packet(4, contribution(DsaKind::FetchResp, 2, 0b1111, 9, DsaHeader::FLAG_RESULT));
        let out = drain(&mut ps, 4);
        assert_eq!((hdr(&out[0]).kind, out[0].payload.as_deref()), (DsaKind::Ack, Some(&Payload::I32(vec![9; 62]))));
        assert_eq!(ps.pending(), 0);
    }
}
