//! ATP's switch program (Lao et al., NSDI '21, §3.3-3.7, Fig. 7 and Fig. 17).
//!
//! # Aggregator pool
//! Every ATP switch carves one pool of fixed-size *aggregators* out of its register memory
//! and shares it among all ATP jobs: `aggregators = memory_bytes / AGGREGATOR_BYTES`. An
//! aggregator is (Fig. 6) the value (62 x i32 = 248 B, one 306 B packet's payload) plus
//! metadata kept in 32-bit register arrays as on Tofino: bitmap (4 B), counter (4 B),
//! ECN (4 B; bit 0 = ECN, bit 1 = "value saturated", see overflow below), timestamp (4 B),
//! job id (4 B) and sequence number (4 B): [`AGGREGATOR_BYTES`] = 248 + 6 x 4 = 272 B.
//! (The simulator keeps the timestamp as a full `Time`; the hardware would keep 32 bits of
//! nanoseconds, which wrap after 4.3 s and are compared modulo 2^32.)
//! The index comes in the packet (`agg_index`, chosen by the workers); allocation is
//! first come, first served, with no preemption.
//!
//! # Levels
//! ATP aggregates only at top-of-rack switches, at most at two levels (§3.4):
//! - level 1: a gradient packet with `esi == 0` that arrived on a port facing one of the
//!   job's worker hosts on this switch (uses `bitmap0` / `fan_in0`);
//! - level 2: a gradient packet with `esi == 1` whose destination is the job's PS and the PS
//!   is attached to this switch (uses `bitmap1` / `fan_in1`).
//!
//! Everything else (other jobs' or non-admitted traffic, float packets, packets at a spine)
//! is routed unchanged, so a programmable spine only routes. Which ports face which workers
//! and where the PS is come from the control plane ([`AtpSwitch::admit_job`]), as ATP's
//! per-job setup (§3.2) does with IGMP for the multicast tree.
//!
//! # Gradient packets (Fig. 7, no resend flag)
//! - the aggregator at `agg_index` is empty: reserve it for `<job, seq>`, copy value and
//!   bitmap, counter = 1;
//! - it holds another `<job, seq>` (collision): forward downstream with `FLAG_RESEND |
//!   FLAG_COLLISION` and the edge switch identifier advanced (see deviations);
//! - bitmap overlap (already aggregated): OR the ECN into the aggregator and drop;
//! - otherwise add the values (saturating i32), OR the bitmap, counter += 1, refresh the
//!   timestamp; if counter < fan-in drop (the ECN is OR'd), if counter == fan-in the packet
//!   leaves carrying the aggregated value and bitmap, `FLAG_ECN` if any aggregated packet was
//!   marked, `FLAG_OVERFLOW` if the value saturated, and `esi` = 1 (level 1) or 2 (level 2).
//!   The aggregator stays reserved until the parameter packet deallocates it.
//!
//! # Resent gradient packets (Fig. 17)
//! - level 1, matching aggregator: merge the packet if its bit is not yet set, copy the
//!   aggregator's value and bitmap into the packet, deallocate, forward (`esi` = 1);
//! - level 2, matching aggregator: discard the state (deallocate) and forward the packet;
//! - no matching aggregator: forward (a level-1 switch sets `esi` = 1).
//!
//! # Parameter packets (`FLAG_ACK`)
//! Deallocate the aggregator at `agg_index` if it holds `<job, seq>`; otherwise free it if
//! it is occupied and its timestamp is older than the holding job's `stale_timeout_ps` (§3.7,
//! abandoned aggregators; the switch-wide one for a job not admitted here). Then, for an admitted job in multicast mode: at the PS's switch (packet from
//! the PS) one copy to every local worker and one copy routed toward every remote target
//! (a representative worker of each remote ATP rack, or each worker of a remote rack without
//! ATP); at a worker rack (packet addressed to a local worker) one copy to every local
//! worker. Copies get `dst` rewritten to their worker. Without multicast the packet is routed.
//! No periodic timer sweep is used: stale aggregators are freed by parameter packets only,
//! as in the paper.
//!
//! # Deviations and choices
//! - "Flip the edge switch identifier" on a collision is implemented as *advance to the next
//!   level*: 0 -> 1 at level 1, 1 -> 2 at level 2 (the header defines `esi = 2` as "heading
//!   to the PS"), so the PS can always tell complete contributors (`esi == 2`) from packets
//!   scoped to one contributor (`esi < 2`).
//! - Overflow: sums saturate stickily (`inalab_core::rail`: a value at an end of the i32
//!   range stays there, so no later contribution pulls it back into range); the saturation
//!   bit lives in the ECN register (bit 1); completion and level-1 resend copies set
//!   `FLAG_OVERFLOW` on the packet; an incoming `FLAG_OVERFLOW` marks the aggregator
//!   saturated too (a level-1 overflow is carried through level 2).
//! - Packets with `FLAG_FLOAT` (the overflow fallback) are never aggregated.
//! - An `agg_index` beyond the pool (pool smaller than the job assumed) takes the collision
//!   path.

use inalab_core::wire::{AtpHeader, Header};
use inalab_core::{flow_key, Admission, AdmitError, NodeId, Packet, Payload, PortId, SwitchAction, SwitchCtx, SwitchProgram, Time};
use crate::pool::Pool;
use inalab_core::rail::sticky_add;
use std::collections::BTreeMap;

/// Values per aggregator: one 306 B ATP packet carries 62 x 4 B.
pub const AGGREGATOR_VALUES: usize = 62;
/// Register bytes per aggregator: 248 B of values + 6 x 4 B metadata (bitmap, counter, ECN
/// and saturation bits, timestamp, job id, sequence number).
pub const AGGREGATOR_BYTES: u64 = AGGREGATOR_VALUES as u64 * 4 + 6 * 4;

/// Switch-wide settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtpSwitchConfig {
    /// Aggregators in the shared pool (`memory_bytes / AGGREGATOR_BYTES`).
    pub aggregators: u32,
    /// A parameter packet frees a non-matching occupied aggregator whose timestamp is older
    /// than this (§3.7), when the holding job is not admitted here (else its own
    /// `AtpSwitchJob::stale_timeout_ps` applies).
    pub stale_timeout_ps: Time,
}

impl AtpSwitchConfig {
    /// Pool size for `memory_bytes` of aggregator memory.
    pub fn aggregators_for(memory_bytes: u64) -> u32 {
        (memory_bytes / AGGREGATOR_BYTES).min(u32::MAX as u64) as u32
    }
}

/// A job's control-plane configuration at one switch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AtpSwitchJob {
    /// The job's workers attached to this switch, as (port facing the worker, worker host).
    /// At a worker rack these aggregate at level 1 and receive multicast copies; at the PS's
    /// rack they are level-2 contributors and receive copies.
    pub local_workers: Vec<(PortId, NodeId)>,
    /// The job's PS host if it is attached to this switch (then this switch is the job's
    /// level-2 switch).
    pub ps: Option<NodeId>,
    /// At the PS's switch (and, in tree mode, at an intermediate node): hosts outside this
    /// rack that get one routed copy of every parameter packet (one representative worker
    /// per remote ATP rack or subtree, which multicasts further, and every worker of a remote
    /// rack without ATP), each with the ECMP key its copy is routed by (`None`: the packet's).
    pub remote_targets: Vec<(NodeId, Option<u64>)>,
    /// The PS sends one parameter packet per fragment for the switches to multicast (true) or
    /// one unicast per worker (false: switches only deallocate and route).
    pub multicast: bool,
    /// An aggregator this job holds is freed by another job's parameter packet once it is
    /// older than this (abandoned, §3.7): a multiple of the job's loss-recovery timeout.
    pub stale_timeout_ps: Time,
    /// Tree mode (see the module docs): the level-2 contributors (`bitmap1` bits) this switch
    /// aggregates as an intermediate node of the job's tree; 0 = not an intermediate node.
    pub subtree: u32,
    /// The level-2 fan-in set by the control plane (tree mode: this switch's children in the
    /// job's tree); `None`: the packet's `fan_in1`, as in ATP.
    pub fan_in2: Option<u8>,
    /// Tree mode, at an intermediate node: a parameter packet addressed to this host (its
    /// subtree's first worker) is this switch's to copy to `remote_targets`.
    pub rep: Option<NodeId>,
    /// At the PS's switch, GRID's ATP (each gradient aggregated once): what another switch
    /// summed passes on to the PS; only the contributors in `subtree` (single workers) are
    /// summed here, `fan_in2` of them, and their sum goes on as one more contribution.
    pub once: bool,
}

/// Where a gradient packet is aggregated here: `level` 1 or 2; `fan_in2` overrides the
/// packet's level-2 fan-in; `intermediate`: a tree-mode intermediate node, whose complete
/// aggregate goes on as a level-2 contribution (`esi` 1).
#[derive(Debug, Clone, Copy)]
struct Level {
    level: u8,
    fan_in2: Option<u8>,
    intermediate: bool,
}

#[derive(Debug, Clone)]
struct Aggregator {
    job: u32,
    seq: u32,
    value: Vec<i32>,
    bitmap: u32,
    counter: u32,
    ecn: bool,
    overflow: bool,
    timestamp: Time,
}

impl Aggregator {
    /// Adds one contribution (box 5 of Fig. 7): values with saturation, bitmap, counter,
    /// timestamp. Returns whether a value saturated with this packet (and stays at its rail
    /// from then on: `inalab_core::rail`).
    fn absorb(&mut self, values: Option<&[i32]>, bitmap: u32, now: Time) -> bool {
        let saturated = values.is_some_and(|v| sticky_add(&mut self.value, v) > 0);
        self.overflow |= saturated;
        self.bitmap |= bitmap;
        self.counter += 1;
        self.timestamp = now;
        saturated
    }
}

impl Counters {
    fn count_aggregation(&mut self, saturated: bool) {
        self.aggregated += 1;
        self.overflows += saturated as u64;
    }
}

#[derive(Debug, Default, Clone)]
struct Counters {
    aggregated: u64,
    completed: u64,
    collisions: u64,
    resends: u64,
    overflows: u64,
    deallocs: u64,
    stale_frees: u64,
    forwarded_to_ps: u64,
    duplicates: u64,
    multicast_copies: u64,
}

/// ATP's data-plane program with a shared aggregator pool. See the module docs.
pub struct AtpSwitch {
    cfg: AtpSwitchConfig,
    pool: Pool<Aggregator>,
    jobs: BTreeMap<u32, AtpSwitchJob>,
    c: Counters,
}


fn values(pkt: &Packet) -> Option<&[i32]> {
    match pkt.payload.as_deref() {
        Some(Payload::I32(v)) => Some(v),
        _ => None,
    }
}

impl AtpSwitch {

    /// The level at which this switch aggregates a gradient packet, or `None` to forward it.
    fn level(&self, in_port: PortId, h: &AtpHeader, dst: NodeId) -> Option<Level> {
        let at = |level, fan_in2, intermediate| Some(Level { level, fan_in2, intermediate });
        match self.jobs.get(&h.job) {
            _ if h.has(AtpHeader::FLAG_FLOAT) => None,
            Some(j) if h.esi == 0 && j.ps.is_none() && j.local_workers.iter().any(|&(p, _)| p == in_port) => at(1, None, false),
            Some(j) if h.esi == 1 && j.ps == Some(dst) && !j.once => at(2, j.fan_in2, false),
            // Tree mode (and `once` at the PS's switch): a level-2 contribution from this
            // intermediate node's subtree.
            Some(j) if h.esi == 1 && j.subtree != 0 && h.bitmap1 != 0 && h.bitmap1 & !j.subtree == 0 => at(2, j.fan_in2, true),
            _ => None,
        }
    }
    pub fn new(cfg: AtpSwitchConfig) -> Self {
        AtpSwitch { pool: Pool::new(cfg.aggregators), cfg, jobs: BTreeMap::new(), c: Counters::default() }
    }

    /// Installs (or replaces) a job's configuration: which local ports face its workers,
    /// whether its PS is here, and where parameter copies go.
    pub fn admit_job(&mut self, job: u32, cfg: AtpSwitchJob) {
        self.jobs.insert(job, cfg);
    }

    /// Removes a job's configuration; its aggregators are left to parameter packets and the
    /// stale timeout.
    pub fn remove_job(&mut self, job: u32) {
        self.jobs.remove(&job);
    }

    /// Control plane, when a job ends or fails: removes its configuration and frees every
    /// aggregator it holds (a register reset from the control plane). Returns the number
    /// of aggregators freed.
    pub fn release_job(&mut self, job: u32) -> u32 {
        self.jobs.remove(&job);
        self.pool.free_where(|a| a.job == job)
    }

    pub fn aggregators(&self) -> u32 {
        self.cfg.aggregators
    }

    fn on_gradient(&mut self, now: Time, at: Level, mut h: AtpHeader, mut pkt: Packet, out: &mut Vec<SwitchAction>) {
        let Level { level, fan_in2, intermediate } = at;
        let pkt_ecn = pkt.ecn || h.has(AtpHeader::FLAG_ECN);
        let (bm, fan_in) = if level == 1 { (h.bitmap0, h.fan_in0 as u32) } else { (h.bitmap1, fan_in2.unwrap_or(h.fan_in1) as u32) };
        let idx = h.agg_index as usize;
        let resend = h.has(AtpHeader::FLAG_RESEND);
        let mine = self.pool.get(idx).map(|a| a.job == h.job && a.seq == h.seq);
        if !resend && (!self.pool.contains(idx) || mine == Some(false)) {
            // Collision (box 1/2 of Fig. 7): leave it to the PS, tell it, skip the next level.
            self.c.collisions += 1;
            h.flags |= AtpHeader::FLAG_RESEND | AtpHeader::FLAG_COLLISION;
            h.esi = level;
            return self.forward(h, pkt, out);
        }
        if resend {
            self.c.resends += 1;
            if mine == Some(true) {
                if level == 1 {
                    let a = self.pool.get_mut(idx).expect("matched");
                    if a.bitmap & bm == 0 {
                        let saturated = a.absorb(values(&pkt), bm, now);
                        self.c.count_aggregation(saturated);
                    }
                    a.ecn |= pkt_ecn;
                    a.overflow |= h.has(AtpHeader::FLAG_OVERFLOW);
                    let a = self.pool.take(idx).expect("matched");
                    self.c.deallocs += 1;
                    if pkt.payload.is_some() {
                        pkt.payload = Some(Box::new(Payload::I32(a.value)));
                    }
                    h.bitmap0 = a.bitmap;
                    if a.ecn {
                        h.flags |= AtpHeader::FLAG_ECN;
                    }
                    if a.overflow {
                        h.flags |= AtpHeader::FLAG_OVERFLOW;
                    }
                } else {
                    // Level 2 cannot merge partial results: discard the state (Fig. 17, 3).
                    self.pool.take(idx);
                    self.c.deallocs += 1;
                }
            }
            h.esi = h.esi.max(1);
            return self.forward(h, pkt, out);
        }
        let pkt_overflow = h.has(AtpHeader::FLAG_OVERFLOW);
        // Not a collision: the slot is free or holds this fragment.
        let a = if mine.is_none() {
            self.c.aggregated += 1;
            self.pool.insert(
                idx,
                Aggregator {
                    job: h.job,
                    seq: h.seq,
                    value: values(&pkt).map(|v| v.to_vec()).unwrap_or_default(),
                    bitmap: bm,
                    counter: 1,
                    ecn: pkt_ecn,
                    overflow: pkt_overflow,
                    timestamp: now,
                },
            )
        } else {
            let a = self.pool.get_mut(idx).expect("holds this fragment");
            if a.bitmap & bm != 0 {
                // Already aggregated (box 4/7): keep its congestion mark, drop it.
                a.ecn |= pkt_ecn;
                self.c.duplicates += 1;
                return out.push(SwitchAction::Drop { pkt, reason: "atp_duplicate" });
            }
            let saturated = a.absorb(values(&pkt), bm, now);
            self.c.count_aggregation(saturated);
            a.ecn |= pkt_ecn;
            a.overflow |= pkt_overflow;
            a
        };
        if a.counter < fan_in {
            return out.push(SwitchAction::Drop { pkt, reason: "atp_aggregated" });
        }
        // Complete at this level: the packet carries the aggregate downstream.
        self.c.completed += 1;
        if pkt.payload.is_some() {
            pkt.payload = Some(Box::new(Payload::I32(a.value.clone())));
        }
        if level == 1 {
            h.bitmap0 = a.bitmap;
        } else {
            h.bitmap1 = a.bitmap;
        }
        h.flags &= !(AtpHeader::FLAG_ECN | AtpHeader::FLAG_OVERFLOW);
        if a.ecn {
            h.flags |= AtpHeader::FLAG_ECN;
        }
        if a.overflow {
            h.flags |= AtpHeader::FLAG_OVERFLOW;
        }
        h.esi = if intermediate { 1 } else { level };
        self.forward(h, pkt, out)
    }

    fn forward(&mut self, h: AtpHeader, mut pkt: Packet, out: &mut Vec<SwitchAction>) {
        self.c.forwarded_to_ps += 1;
        pkt.header = Header::Atp(h);
        out.push(SwitchAction::Route { pkt });
    }

    fn on_parameter(&mut self, now: Time, h: AtpHeader, pkt: Packet, out: &mut Vec<SwitchAction>) {
        let idx = h.agg_index as usize;
        if let Some(a) = self.pool.get(idx) {
            let stale = self.jobs.get(&a.job).map_or(self.cfg.stale_timeout_ps, |j| j.stale_timeout_ps);
            if a.job == h.job && a.seq == h.seq {
                self.pool.take(idx);
                self.c.deallocs += 1;
            } else if now.saturating_sub(a.timestamp) > stale {
                self.pool.take(idx);
                self.c.stale_frees += 1;
            }
        }
        let Some(job) = self.jobs.get(&h.job).filter(|j| j.multicast) else {
            return out.push(SwitchAction::Route { pkt });
        };
        let from_ps = job.ps.is_some_and(|ps| ps == pkt.src);
        let to_local = job.local_workers.iter().any(|&(_, w)| w == pkt.dst);
        // Tree mode: the copy for this intermediate node's subtree.
        let to_subtree = job.rep == Some(pkt.dst);
        if !from_ps && !to_local && !to_subtree {
            return out.push(SwitchAction::Route { pkt });
        }
        let mut copies = 0;
        if from_ps || to_local {
            for &(port, w) in &job.local_workers {
                let mut p = pkt.clone();
                p.dst = w;
                out.push(SwitchAction::Forward { port, pkt: p });
                copies += 1;
            }
        }
        if from_ps || to_subtree {
            for &(w, flow) in &job.remote_targets {
                let mut p = pkt.clone();
                p.dst = w;
                // A copy readdressed is a new flow to ECMP, as a switch hashing the rewritten
                // header sees it: with the parameter's own key every copy to the job's other
                // racks took one uplink (8 jobs of 15 workers over 8 racks: 23 of a leaf's
                // 37 MB on one of its 8 spines, ATP 1.8x slower than ring; #37 item 6).
                p.flow = flow.unwrap_or_else(|| flow_key(p.src, p.src_port, w, p.dst_port));
                out.push(SwitchAction::Route { pkt: p });
                copies += 1;
            }
        }
        self.c.multicast_copies += copies;
        if copies == 0 {
            out.push(SwitchAction::Drop { pkt, reason: "atp_no_receivers" });
        }
    }
}

impl SwitchProgram for AtpSwitch {
    fn on_packet(&mut self, now: Time, _ctx: &dyn SwitchCtx, in_port: PortId, pkt: Packet, out: &mut Vec<SwitchAction>) {
        let Header::Atp(h) = pkt.header else {
            return out.push(SwitchAction::Route { pkt });
        };
        if h.has(AtpHeader::FLAG_ACK) {
            return self.on_parameter(now, h, pkt, out);
        }
        match self.level(in_port, &h, pkt.dst) {
            Some(at) => self.on_gradient(now, at, h, pkt, out),
            None => out.push(SwitchAction::Route { pkt }),
        }
    }

    /// ATP's aggregation is what uses a switch's processing capacity (the flow model's C_s).
    fn processes(&self, _ctx: &dyn SwitchCtx, in_port: PortId, pkt: &Packet) -> bool {
        matches!(&pkt.header, Header::Atp(h) if !h.has(AtpHeader::FLAG_ACK) && self.level(in_port, h, pkt.dst).is_some())
    }

    fn admit(&mut self, job: u32, adm: Admission) -> Result<(), AdmitError> {
        self.admit_job(job, adm.take::<AtpSwitchJob>("atp")?);
        Ok(())
    }

    fn release(&mut self, job: u32) -> u32 {
        self.release_job(job)
    }

    fn job_of(&self, pkt: &Packet) -> Option<u32> {
        match &pkt.header {
            Header::Atp(h) => Some(h.job),
            _ => None,
        }
    }

    fn aggregators_in_use(&self) -> u32 {
        self.pool.in_use()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = &self.c;
        vec![
            ("aggregated", c.aggregated),
            ("completed", c.completed),
            ("collisions", c.collisions),
            ("resends", c.resends),
            ("overflows", c.overflows),
            ("deallocs", c.deallocs),
            ("stale_frees", c.stale_frees),
            ("forwarded_to_ps", c.forwarded_to_ps),
            ("duplicates", c.duplicates),
            ("multicast_copies", c.multicast_copies),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inalab_core::wire::AtpHeader as H;
    use inalab_testkit::IdleCtx;

    const CTX: IdleCtx = IdleCtx { node: 100, ports: 8 };

    const PS: NodeId = 7;

    /// A worker-rack switch for job 1 (workers 0, 1, 2 on ports 0, 1, 2) and, for job 2, the
    /// PS rack (PS host 7 on port 7, local worker 3 on port 3, remote target host 50).
    fn switch(aggs: u32) -> AtpSwitch {
        let mut s = AtpSwitch::new(AtpSwitchConfig { aggregators: aggs, stale_timeout_ps: 1000 });
        s.admit_job(1, AtpSwitchJob { local_workers: vec![(0, 0), (1, 1), (2, 2)], ps: None, remote_targets: vec![], multicast: true, stale_timeout_ps: 1000, ..Default::default() });
        s.admit_job(2, AtpSwitchJob { local_workers: vec![(3, 3)], ps: Some(PS), remote_targets: vec![(50, None)], multicast: true, stale_timeout_ps: 1000, ..Default::default() });
        s
    }

    fn grad(job: u32, seq: u32, idx: u32, src: NodeId, h: H, vals: Vec<i32>) -> Packet {
        let h = H { job, seq, agg_index: idx, ..h };
        let mut p = Packet::new(src, 1, PS, 2, 306, Header::Atp(h));
        p.payload = Some(Box::new(Payload::I32(vals)));
        p
    }

    /// Level-1 gradient of job 1 from worker `w` (bit w, fan-in 3).
    fn l1(seq: u32, idx: u32, w: u32, vals: Vec<i32>) -> Packet {
        grad(1, seq, idx, w, H { bitmap0: 1 << w, bitmap1: 1, fan_in0: 3, fan_in1: 2, esi: 0, ..H::default() }, vals)
    }

    fn run(s: &mut AtpSwitch, now: Time, port: PortId, p: Packet) -> Vec<SwitchAction> {
        let mut out = vec![];
        s.on_packet(now, &CTX, port, p, &mut out);
        out
    }

    fn hdr(p: &Packet) -> H {
        match p.header {
            Header::Atp(h) => h,
            _ => panic!("not atp"),
        }
    }

    fn vals(p: &Packet) -> Vec<i32> {
        match p.payload.as_deref() {
            Some(Payload::I32(v)) => v.clone(),
            _ => panic!("no i32 payload"),
        }
    }

    fn routed(out: &[SwitchAction]) -> &Packet {
        match out {
            [SwitchAction::Route { pkt }] => pkt,
            _ => panic!("expected one Route, got {out:?}"),
        }
    }

    fn dropped(out: &[SwitchAction]) -> &'static str {
        match out {
            [SwitchAction::Drop { reason, .. }] => reason,
            _ => panic!("expected one Drop, got {out:?}"),
        }
    }

    fn counter(s: &AtpSwitch, name: &str) -> u64 {
        s.counters().into_iter().find(|c| c.0 == name).unwrap().1
    }

    #[test]
    fn aggregator_bytes_are_documented() {
        assert_eq!(AGGREGATOR_BYTES, 272);
        assert_eq!(AtpSwitchConfig::aggregators_for(272 * 10 + 271), 10);
    }

    #[test]
    fn completes_at_fan_in_and_holds_until_parameter() {
        let mut s = switch(4);
        assert_eq!(dropped(&run(&mut s, 0, 0, l1(5, 2, 0, vec![1, 2]))), "atp_aggregated");
        assert_eq!(s.aggregators_in_use(), 1);
        assert_eq!(dropped(&run(&mut s, 1, 1, l1(5, 2, 1, vec![10, 20]))), "atp_aggregated");
        let out = run(&mut s, 2, 2, l1(5, 2, 2, vec![100, 200]));
        let p = routed(&out);
        assert_eq!(vals(p), vec![111, 222]);
        let h = hdr(p);
        assert_eq!((h.bitmap0, h.esi, h.flags), (0b111, 1, 0));
        assert_eq!(counter(&s, "completed"), 1);
        // Still reserved until the parameter packet comes back.
        assert_eq!(s.aggregators_in_use(), 1);
    }

    #[test]
    fn first_come_first_served_and_collision_path() {
        let mut s = switch(4);
        run(&mut s, 0, 0, l1(5, 2, 0, vec![1]));
        // Job 1's seq 9 hashes to the same aggregator: collision, no preemption.
        let out = run(&mut s, 1, 1, l1(9, 2, 1, vec![7]));
        let p = routed(&out);
        let h = hdr(p);
        assert!(h.has(H::FLAG_RESEND) && h.has(H::FLAG_COLLISION));
        assert_eq!(h.esi, 1, "the level is advanced so the next switch does not aggregate it");
        assert_eq!((h.bitmap0, vals(p)), (0b10, vec![7]), "forwarded unchanged");
        assert_eq!(counter(&s, "collisions"), 1);
        // The first reservation is untouched: the other two workers complete it.
        run(&mut s, 2, 1, l1(5, 2, 1, vec![1]));
        assert_eq!(vals(routed(&run(&mut s, 3, 2, l1(5, 2, 2, vec![1])))), vec![3]);
        // Another aggregator is free for seq 9.
        assert_eq!(dropped(&run(&mut s, 4, 0, l1(9, 3, 0, vec![1]))), "atp_aggregated");
        assert_eq!(s.aggregators_in_use(), 2);
    }

    #[test]
    fn duplicate_bitmap_is_dropped_and_its_ecn_merged() {
        let mut s = switch(4);
        run(&mut s, 0, 0, l1(5, 0, 0, vec![1]));
        let mut dup = l1(5, 0, 0, vec![1]);
        dup.ecn = true;
        assert_eq!(dropped(&run(&mut s, 1, 0, dup)), "atp_duplicate");
        run(&mut s, 2, 1, l1(5, 0, 1, vec![1]));
        let out = run(&mut s, 3, 2, l1(5, 0, 2, vec![1]));
        let p = routed(&out);
        assert_eq!(vals(p), vec![3], "the duplicate was not added");
        assert!(hdr(p).has(H::FLAG_ECN), "the duplicate's mark reached the aggregate");
    }

    #[test]
    fn level1_resend_merges_copies_and_deallocates() {
        let mut s = switch(4);
        run(&mut s, 0, 0, l1(5, 1, 0, vec![1, 1]));
        let mut r = l1(5, 1, 1, vec![10, 10]);
        if let Header::Atp(ref mut h) = r.header {
            h.flags |= H::FLAG_RESEND;
        }
        let out = run(&mut s, 1, 1, r);
        let p = routed(&out);
        assert_eq!(vals(p), vec![11, 11]);
        let h = hdr(p);
        assert_eq!((h.bitmap0, h.esi), (0b11, 1));
        assert!(h.has(H::FLAG_RESEND) && !h.has(H::FLAG_COLLISION));
        assert_eq!(s.aggregators_in_use(), 0);
        // Later resends find no aggregator and pass through, heading to level 2.
        let mut r = l1(5, 1, 2, vec![100, 100]);
        if let Header::Atp(ref mut h) = r.header {
            h.flags |= H::FLAG_RESEND;
        }
        let out = run(&mut s, 2, 2, r);
        let p = routed(&out);
        assert_eq!((vals(p), hdr(p).bitmap0, hdr(p).esi), (vec![100, 100], 0b100, 1));
        assert_eq!(s.aggregators_in_use(), 0, "a resend never reserves");
        // A resend whose bit is already in: nothing added, the aggregate is copied out.
        run(&mut s, 3, 0, l1(6, 1, 0, vec![5]));
        let mut r = l1(6, 1, 0, vec![5]);
        if let Header::Atp(ref mut h) = r.header {
            h.flags |= H::FLAG_RESEND;
        }
        assert_eq!(vals(routed(&run(&mut s, 4, 0, r))), vec![5]);
    }

    /// Level-2 gradient of job 2: contributor `c` (bit c, fan-in 2), headed to the local PS.
    fn l2(seq: u32, idx: u32, c: u32, flags: u8, vals: Vec<i32>) -> Packet {
        grad(2, seq, idx, 40 + c, H { bitmap0: 0b11, bitmap1: 1 << c, fan_in0: 2, fan_in1: 2, esi: 1, flags, ..H::default() }, vals)
    }

    #[test]
    fn level2_aggregates_and_resend_discards_state() {
        let mut s = switch(4);
        run(&mut s, 0, 6, l2(1, 0, 0, 0, vec![1]));
        let out = run(&mut s, 1, 6, l2(1, 0, 1, 0, vec![2]));
        let p = routed(&out);
        assert_eq!((vals(p), hdr(p).bitmap1, hdr(p).esi), (vec![3], 0b11, 2));
        // Seq 2: one contributor in, then a resend from the other: state discarded, the resend
        // is forwarded as is.
        run(&mut s, 2, 6, l2(2, 1, 0, 0, vec![1]));
        assert_eq!(s.aggregators_in_use(), 2);
        let out = run(&mut s, 3, 6, l2(2, 1, 1, H::FLAG_RESEND, vec![5]));
        let p = routed(&out);
        assert_eq!((vals(p), hdr(p).bitmap1, hdr(p).esi), (vec![5], 0b10, 1));
        assert_eq!(s.aggregators_in_use(), 1);
        // A level-2 collision advances esi to 2.
        let out = run(&mut s, 4, 6, l2(3, 0, 0, 0, vec![1]));
        let h = hdr(routed(&out));
        assert!(h.has(H::FLAG_COLLISION) && h.has(H::FLAG_RESEND));
        assert_eq!(h.esi, 2);
        // esi 1 toward a PS elsewhere, or esi 0 from a non-worker port: routed, untouched.
        let mut p = l2(4, 2, 0, 0, vec![1]);
        p.dst = 99;
        routed(&run(&mut s, 5, 6, p));
        routed(&run(&mut s, 5, 6, l1(4, 2, 0, vec![1])));
        assert_eq!(s.aggregators_in_use(), 1);
    }

    fn param(job: u32, seq: u32, idx: u32, src: NodeId, dst: NodeId) -> Packet {
        let h = H { job, seq, agg_index: idx, flags: H::FLAG_ACK, ..H::default() };
        Packet::new(src, 2, dst, 1, 306, Header::Atp(h))
    }

    #[test]
    fn parameter_deallocates_and_multicasts_with_rewritten_dst() {
        let mut s = switch(4);
        run(&mut s, 0, 0, l1(5, 2, 0, vec![1]));
        // Worker rack: addressed to the representative worker 0, copied to all three.
        let out = run(&mut s, 1, 5, param(1, 5, 2, PS, 0));
        assert_eq!(s.aggregators_in_use(), 0);
        let mut got: Vec<(PortId, NodeId)> = out
            .iter()
            .map(|a| match a {
                SwitchAction::Forward { port, pkt } => (*port, pkt.dst),
                _ => panic!("{a:?}"),
            })
            .collect();
        got.sort();
        assert_eq!(got, vec![(0, 0), (1, 1), (2, 2)]);
        // PS rack: from the PS, one copy to the local worker, one routed to the remote rack.
        run(&mut s, 2, 6, l2(9, 3, 0, 0, vec![1]));
        let out = run(&mut s, 3, 7, param(2, 9, 3, PS, 3));
        assert_eq!(s.aggregators_in_use(), 0);
        assert_eq!(out.len(), 2);
        assert!(matches!(&out[0], SwitchAction::Forward { port: 3, pkt } if pkt.dst == 3));
        assert!(matches!(&out[1], SwitchAction::Route { pkt } if pkt.dst == 50));
        // A parameter for another seq does not free a fresh aggregator.
        run(&mut s, 4, 0, l1(6, 1, 0, vec![1]));
        run(&mut s, 5, 5, param(1, 77, 1, PS, 0));
        assert_eq!(s.aggregators_in_use(), 1);
        assert_eq!(counter(&s, "deallocs"), 2);
    }

    #[test]
    fn copies_to_other_racks_are_flows_of_their_own_addresses() {
        // #37 item 6: every copy kept the parameter's flow key, so ECMP sent all the copies to a
        // job's other racks over one uplink of the PS's leaf.
        let mut s = AtpSwitch::new(AtpSwitchConfig { aggregators: 4, stale_timeout_ps: 1000 });
        let remote_targets = vec![(50, None), (60, None), (70, Some(0xABC))];
        s.admit_job(2, AtpSwitchJob { local_workers: vec![(3, 3)], ps: Some(PS), remote_targets, multicast: true, stale_timeout_ps: 1000, ..Default::default() });
        let p = param(2, 9, 3, PS, 3);
        let out = run(&mut s, 0, 7, p.clone());
        let flows: Vec<(NodeId, u64)> = out
            .iter()
            .filter_map(|a| match a {
                SwitchAction::Route { pkt } => Some((pkt.dst, pkt.flow)),
                _ => None,
            })
            .collect();
        let key = |dst| flow_key(PS, p.src_port, dst, p.dst_port);
        assert_eq!(flows, vec![(50, key(50)), (60, key(60)), (70, 0xABC)], "a pinned flow is kept");
        assert!(flows.iter().all(|&(_, f)| f != p.flow));
    }

    #[test]
    fn the_holding_jobs_stale_timeout_applies() {
        let mut s = switch(4);
        s.admit_job(1, AtpSwitchJob { stale_timeout_ps: 5000, ..s.jobs[&1].clone() });
        run(&mut s, 0, 0, l1(5, 1, 0, vec![1]));
        // Older than the switch-wide 1000 ps but not than job 1's own 5000 ps.
        run(&mut s, 3000, 5, param(2, 77, 1, PS, 0));
        assert_eq!(s.aggregators_in_use(), 1);
        run(&mut s, 5001, 5, param(2, 77, 1, PS, 0));
        assert_eq!(s.aggregators_in_use(), 0);
        assert_eq!(counter(&s, "stale_frees"), 1);
    }

    #[test]
    fn control_plane_half_admits_releases_and_claims_its_packets() {
        let mut s = AtpSwitch::new(AtpSwitchConfig { aggregators: 4, stale_timeout_ps: 1000 });
        let job = AtpSwitchJob { local_workers: vec![(0, 0), (1, 1), (2, 2)], ps: None, remote_targets: vec![], multicast: true, stale_timeout_ps: 1000, ..Default::default() };
        SwitchProgram::admit(&mut s, 1, Admission::new(job)).unwrap();
        let err = SwitchProgram::admit(&mut s, 2, Admission::new(7u32)).unwrap_err();
        assert!(err.0.contains("atp"), "{err}");
        run(&mut s, 0, 0, l1(5, 1, 0, vec![1]));
        assert_eq!(s.job_of(&l1(5, 1, 0, vec![1])), Some(1));
        assert_eq!(s.job_of(&Packet::new(0, 1, 2, 3, 64, Header::Raw)), None);
        assert_eq!(SwitchProgram::release(&mut s, 1), 1);
        assert_eq!(s.aggregators_in_use(), 0);
    }

    #[test]
    fn stale_aggregator_is_freed_by_any_parameter_on_its_index() {
        let mut s = switch(4);
        run(&mut s, 0, 0, l1(5, 1, 0, vec![1]));
        // Not yet stale (timeout 1000 ps).
        run(&mut s, 1000, 5, param(1, 77, 1, PS, 0));
        assert_eq!(s.aggregators_in_use(), 1);
        run(&mut s, 1001, 5, param(1, 77, 1, PS, 0));
        assert_eq!(s.aggregators_in_use(), 0);
        assert_eq!(counter(&s, "stale_frees"), 1);
        // Non-admitted job: still deallocates, then routed.
        run(&mut s, 2000, 0, l1(5, 1, 0, vec![1]));
        let out = run(&mut s, 5000, 5, param(33, 1, 1, PS, 0));
        routed(&out);
        assert_eq!(s.aggregators_in_use(), 0);
    }

    #[test]
    fn saturation_sets_the_overflow_flag() {
        let mut s = switch(4);
        run(&mut s, 0, 0, l1(5, 0, 0, vec![i32::MAX - 1, -5]));
        run(&mut s, 0, 1, l1(5, 0, 1, vec![10, 1]));
        let out = run(&mut s, 0, 2, l1(5, 0, 2, vec![-3, 1]));
        let p = routed(&out);
        // Saturated values stay saturated: a later negative contribution does not pull the
        // sum back into range (it did before sticky saturation: MAX - 3).
        assert_eq!(vals(p), vec![i32::MAX, -3]);
        assert!(hdr(p).has(H::FLAG_OVERFLOW));
        assert_eq!(counter(&s, "overflows"), 1);
    }

    #[test]
    fn without_a_pool_packets_pass_on_scoped_to_their_contributor() {
        let mut s = switch(0);
        let out = run(&mut s, 0, 0, l1(5, 3, 0, vec![1]));
        let h = hdr(routed(&out));
        assert!(h.has(H::FLAG_RESEND) && h.has(H::FLAG_COLLISION));
        assert_eq!(h.esi, 1);
        // At level 2 the resent packet stays scoped to one contributor (esi 1, not 2).
        let out = run(&mut s, 1, 6, l2(5, 3, 0, H::FLAG_RESEND | H::FLAG_COLLISION, vec![1]));
        assert_eq!(hdr(routed(&out)).esi, 1);
    }

    #[test]
    fn float_and_foreign_packets_are_routed() {
        let mut s = switch(4);
        let mut p = l1(5, 0, 0, vec![1]);
        if let Header::Atp(ref mut h) = p.header {
            h.flags |= H::FLAG_FLOAT;
        }
        routed(&run(&mut s, 0, 0, p));
        routed(&run(&mut s, 0, 0, Packet::new(0, 1, 7, 2, 100, Header::Raw)));
        // Unknown job.
        routed(&run(&mut s, 0, 0, grad(9, 1, 0, 0, H { bitmap0: 1, fan_in0: 2, ..H::default() }, vec![1])));
        assert_eq!(s.aggregators_in_use(), 0);
    }

    /// Tree mode: an intermediate node of job 3 over contributors 0 and 2 (fan-in 2), whose
    /// subtree's first worker is host 20; its children's first workers are 20 and 30.
    fn intermediate() -> AtpSwitch {
        let mut s = AtpSwitch::new(AtpSwitchConfig { aggregators: 16, stale_timeout_ps: 1000 });
        let job = AtpSwitchJob { multicast: true, stale_timeout_ps: 1000, subtree: 0b101, fan_in2: Some(2), rep: Some(20), remote_targets: vec![(20, Some(11)), (30, Some(12))], ..Default::default() };
        s.admit_job(3, job);
        s
    }

    fn contribution(bitmap1: u32, flags: u8, vals: Vec<i32>) -> Packet {
        grad(3, 9, 4, 40, H { bitmap0: 0b11, bitmap1, fan_in0: 2, fan_in1: 3, esi: 1, flags, ..H::default() }, vals)
    }

    #[test]
    fn an_intermediate_node_adds_its_subtree_and_sends_one_contribution_on() {
        let mut s = intermediate();
        // Contributor 1 is not below this node: routed unchanged.
        assert_eq!(hdr(routed(&run(&mut s, 0, 0, contribution(0b010, 0, vec![5])))).bitmap1, 0b010);
        assert_eq!(dropped(&run(&mut s, 1, 0, contribution(0b001, 0, vec![1, 2]))), "atp_aggregated");
        assert_eq!(dropped(&run(&mut s, 2, 0, contribution(0b001, 0, vec![1, 2]))), "atp_duplicate");
        let out = run(&mut s, 3, 1, contribution(0b100, 0, vec![10, 20]));
        let p = routed(&out);
        // Still a level-2 contribution (for the next node or the PS's ToR), of both children.
        assert_eq!((hdr(p).esi, hdr(p).bitmap1, vals(p)), (1, 0b101, vec![11, 22]));
        assert_eq!(s.aggregators_in_use(), 1, "held until the parameter passes");
        // A resend (possibly partial) is never added: the node's state is discarded.
        let out = run(&mut s, 4, 0, contribution(0b001, H::FLAG_RESEND, vec![1, 2]));
        assert_eq!(hdr(routed(&out)).esi, 1);
        assert_eq!(s.aggregators_in_use(), 0);
    }

    #[test]
    fn an_intermediate_node_copies_the_parameter_addressed_to_its_subtree_to_each_child() {
        let mut s = intermediate();
        run(&mut s, 0, 0, contribution(0b001, 0, vec![1]));
        let param = |dst: NodeId| {
            let mut p = Packet::new(PS, 2, dst, 1, 306, Header::Atp(H { job: 3, seq: 9, agg_index: 4, flags: H::FLAG_ACK, ..H::default() }));
            p.flow = 99;
            p
        };
        let out = run(&mut s, 1, 4, param(20));
        let copies: Vec<(NodeId, u64)> = out
            .iter()
            .map(|a| match a {
                SwitchAction::Route { pkt } => (pkt.dst, pkt.flow),
                _ => panic!("{a:?}"),
            })
            .collect();
        assert_eq!(copies, vec![(20, 11), (30, 12)], "one copy per child, each by its key");
        assert_eq!(s.aggregators_in_use(), 0, "the parameter freed the aggregator");
        // A parameter for another subtree passes by.
        assert_eq!(routed(&run(&mut s, 2, 4, param(30))).flow, 99);
    }
}
