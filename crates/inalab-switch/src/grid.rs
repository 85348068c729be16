//! GRID's switch program (Fang et al., §3.4 steps 2-3, §5.1-5.2; `../shared/specs/grid.md` §1.4):
//! node-targeted aggregation. A gradient packet names the one node that may add it (`node`); a
//! switch aggregates only packets that name it and forwards everything else untouched, along
//! the packet's installed path.
//!
//! # Memory units
//! `units` units of 64 i32 values plus metadata (valid, job, frag, count, 64-bit bitmap, ECN,
//! saturation, timestamp): [`GRID_UNIT_BYTES`] = 256 + 24 B. A fragment's unit is
//! `(frag + splitmix64(job)) % units` with [`GridIndexing::Modulo`] (the scheme's default:
//! consecutive fragments on consecutive units, so a collision always meets an older fragment,
//! §5.1's "the larger id is throttled"; the job's offset keeps two jobs' equal ids apart), or
//! `splitmix64((job << 32 | frag) ^ splitmix64(switch)) % units` with [`GridIndexing::Hash`]
//! (the paper's Hash(fragment id) % M, salted by the switch; spec A1).
//!
//! # A gradient packet that names this switch (no `RESEND`)
//! - empty unit: store it; complete at once if its bits reach the fan-in;
//! - the unit holds the same (job, frag): a packet whose bits overlap is a duplicate (dropped,
//!   its ECN kept); otherwise add (saturating, `OVERFLOW` on saturation), OR the bitmap, count;
//! - the unit holds another fragment: a collision. If that fragment was last touched at least
//!   `stale_timeout_ps` ago it is evicted and the packet takes the unit (spec A14: a collision
//!   resend that arrives after its fragment completed by a timeout leaves a unit nobody
//!   completes). Otherwise the packet is dropped and a control packet (`CONTROL | COLLISION |
//!   ECN`, ECN-marked, `control_bytes` long) goes back to its sender: GRID's rate
//!   synchronization (§5.2), which halves the sender's window and makes it send the fragment
//!   again;
//! - complete (count == fan-in): the completing packet leaves with the unit's sum and bitmap
//!   (`ECN` if any contribution was marked), still naming this switch (so the PS knows whose
//!   group it covers), along the rest of its path to the PS, and the unit is freed.
//!
//! # A resend (`RESEND`, spec §1.4 step 4, after ATP's Fig. 17)
//! If the unit holds its fragment, the packet is merged (when its bit is new); a unit that is
//! then complete leaves as usual, one untouched for `stale_timeout_ps` leaves with its partial
//! sum and bitmap (a flush), and a live one keeps waiting (choice: the spec flushes at once,
//! which left the members still on their way a unit nobody completes: on Fig. 1 a worker slowed
//! by a shared link timed out, flushed, and every fragment then cost the others a timeout).
//! Otherwise it goes on unchanged to the PS as an individual contribution (`COLLISION` set if
//! another fragment held the unit). A resend never evicts, is never dropped for a collision
//! and never starts an aggregation, so loss recovery cannot livelock against collisions.
//!
//! # Everything else
//! Results, control packets, packets naming another node and packets of jobs not admitted here
//! are routed unchanged (no unit is read or written). A packet that names this switch with bits
//! outside the job's group or a fan-in other than the group's is forged or malformed: counted
//! (`rejected`) and dropped.

use crate::pool::Pool;
use inalab_core::rail::sticky_add;
use inalab_core::wire::{GridHeader, Header};
use inalab_core::{splitmix64, Admission, AdmitError, Packet, Payload, PortId, SwitchAction, SwitchCtx, SwitchProgram, Time};
use std::collections::BTreeMap;

/// Values per memory unit and per gradient packet (§6.2: 64 elements, one Tofino pipeline).
pub const GRID_VALUES: usize = 64;
/// Register bytes per unit: 256 B of values + 24 B of metadata.
pub const GRID_UNIT_BYTES: u64 = GRID_VALUES as u64 * 4 + 24;

/// How a fragment is given its memory unit (spec A1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GridIndexing {
    /// `splitmix64((job << 32 | frag) ^ splitmix64(switch)) % units`.
    #[default]
    Hash,
    /// `(frag + splitmix64(job)) % units`: consecutive fragments on consecutive units, so the
    /// larger id collides.
    Modulo,
}

/// Switch-wide settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GridSwitchConfig {
    /// Memory units (`aggregator memory / GRID_UNIT_BYTES`).
    pub units: u32,
}

impl GridSwitchConfig {
    /// Units for `memory_bytes` of aggregator memory.
    pub fn units_for(memory_bytes: u64) -> u32 {
        (memory_bytes / GRID_UNIT_BYTES).min(u32::MAX as u64) as u32
    }
}

/// A job's group at this switch: the workers that name it (by their bit) and their count, and
/// the job's settings here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GridSwitchJob {
    pub group: u64,
    pub fan_in: u8,
    pub indexing: GridIndexing,
    /// A unit of this job untouched this long is evicted by a colliding packet (spec A14: 2 x
    /// the workers' timeout).
    pub stale_timeout_ps: Time,
    /// Bytes on the wire of the control packet a collision sends its sender (66: headers, no
    /// payload); `None`: none is sent, the packet is only dropped and its sender recovers by
    /// its timeout (the rate-synchronization ablation).
    pub control_bytes: Option<u32>,
}

#[derive(Debug, Clone)]
struct Unit {
    job: u32,
    frag: u32,
    value: Vec<i32>,
    bitmap: u64,
    count: u8,
    ecn: bool,
    overflow: bool,
    ts: Time,
    /// A tombstone: the fragment left early (a flush, or a resend that found the unit empty)
    /// with `bitmap`'s members; the rest of its group passes on to the PS alone instead of
    /// waiting here for bits that will never come. Any other fragment may take the unit.
    left: bool,
}

impl Unit {
    fn left(job: u32, frag: u32, bitmap: u64, now: Time) -> Unit {
        Unit { job, frag, value: vec![], bitmap, count: 0, ecn: false, overflow: false, ts: now, left: true }
    }
}

#[derive(Debug, Default, Clone)]
struct Counters {
    agg_packets: u64,
    agg_bytes: u64,
    completions: u64,
    collisions: u64,
    control_sent: u64,
    duplicates: u64,
    stale_evictions: u64,
    resend_flushes: u64,
    resend_forwards: u64,
    passed_alone: u64,
    freed_by_result: u64,
    overflows: u64,
    rejected: u64,
}

/// GRID's data-plane program. See the module docs.
pub struct GridSwitch {
    cfg: GridSwitchConfig,
    pool: Pool<Unit>,
    /// Units holding a tombstone: free for any fragment, so not counted as in use.
    tombstones: u32,
    jobs: BTreeMap<u32, GridSwitchJob>,
    c: Counters,
}

fn values(pkt: &Packet) -> Option<&[i32]> {
    match pkt.payload.as_deref() {
        Some(Payload::I32(v)) => Some(v),
        _ => None,
    }
}

impl GridSwitch {
    pub fn new(cfg: GridSwitchConfig) -> Self {
        GridSwitch { pool: Pool::new(cfg.units), tombstones: 0, cfg, jobs: BTreeMap::new(), c: Counters::default() }
    }

    /// Installs (or replaces) a job's group here.
    pub fn admit_job(&mut self, job: u32, group: GridSwitchJob) {
        self.jobs.insert(job, group);
    }

    /// Removes a job and frees every unit it holds; returns how many (tombstones not counted).
    pub fn release_job(&mut self, job: u32) -> u32 {
        self.jobs.remove(&job);
        let before = self.aggregators_in_use();
        self.pool.free_where(|u| u.job == job);
        self.tombstones = self.pool.in_use() - self.held_live();
        before - self.aggregators_in_use()
    }

    fn held_live(&self) -> u32 {
        (0..self.cfg.units as usize).filter(|&i| self.pool.get(i).is_some_and(|u| !u.left)).count() as u32
    }

    fn take(&mut self, idx: usize) -> Option<Unit> {
        let u = self.pool.take(idx);
        self.tombstones -= u.as_ref().is_some_and(|u| u.left) as u32;
        u
    }

    fn put(&mut self, idx: usize, u: Unit) -> &mut Unit {
        self.tombstones += u.left as u32;
        self.pool.insert(idx, u)
    }

    fn index(&self, job: &GridSwitchJob, me: u32, id: u32, frag: u32) -> usize {
        let n = self.cfg.units.max(1) as u64;
        (match job.indexing {
            // Salted by the switch: unsalted, two fragments that share a unit share it at every
            // switch, and collide at all of a job's aggregation nodes at once.
            GridIndexing::Hash => splitmix64((id as u64) << 32 | frag as u64 ^ splitmix64(me as u64)) % n,
            // Offset by the job, so that two jobs' equal fragment ids do not meet at every unit.
            GridIndexing::Modulo => (frag as u64).wrapping_add(splitmix64(id as u64)) % n,
        }) as usize
    }

    /// A result on its way down: its fragment is complete at the PS, so what this switch still
    /// holds of it (a partial sum whose members went on alone, a tombstone) is freed. Not every
    /// node a fragment visited lies on the result tree (spec A14), so this is an addition to the
    /// stale eviction, not a replacement.
    fn on_result(&mut self, me: u32, h: &GridHeader) {
        let Some(job) = self.jobs.get(&h.job).copied() else { return };
        let idx = self.index(&job, me, h.job, h.frag);
        if self.pool.get(idx).is_some_and(|u| (u.job, u.frag) == (h.job, h.frag)) {
            self.take(idx);
            self.c.freed_by_result += 1;
        }
    }

    /// The completing (or flushing) packet leaves with unit `u`'s sum and bitmap.
    fn emit(&mut self, mut h: GridHeader, mut pkt: Packet, u: Unit, out: &mut Vec<SwitchAction>) {
        if pkt.payload.is_some() {
            pkt.payload = Some(Box::new(Payload::I32(u.value)));
        }
        h.bitmap = u.bitmap;
        h.flags &= !(GridHeader::FLAG_ECN | GridHeader::FLAG_OVERFLOW);
        if u.ecn {
            h.flags |= GridHeader::FLAG_ECN;
        }
        if u.overflow {
            h.flags |= GridHeader::FLAG_OVERFLOW;
            self.c.overflows += 1;
        }
        pkt.header = Header::Grid(h);
        out.push(SwitchAction::Route { pkt });
    }

    fn control(&mut self, now: Time, me: u32, job: &GridSwitchJob, h: &GridHeader, pkt: &Packet, out: &mut Vec<SwitchAction>) {
        let ch = GridHeader { flags: GridHeader::FLAG_CONTROL | GridHeader::FLAG_COLLISION | GridHeader::FLAG_ECN, node: me, ..*h };
        let Some(bytes) = job.control_bytes else { return };
        let mut p = Packet::new(me, 0, pkt.src, pkt.src_port, bytes, Header::Grid(ch));
        p.ecn = true;
        p.created = now;
        self.c.control_sent += 1;
        out.push(SwitchAction::Route { pkt: p });
    }

    fn on_gradient(&mut self, now: Time, me: u32, job: GridSwitchJob, h: GridHeader, pkt: Packet, out: &mut Vec<SwitchAction>) {
        self.c.agg_packets += 1;
        self.c.agg_bytes += pkt.size as u64;
        let idx = self.index(&job, me, h.job, h.frag);
        let ecn = pkt.ecn || h.has(GridHeader::FLAG_ECN);
        let overflow = h.has(GridHeader::FLAG_OVERFLOW);
        if self.pool.get(idx).is_some_and(|u| u.left && (u.job, u.frag) != (h.job, h.frag)) {
            self.take(idx);
        }
        if let Some(u) = self.pool.get_mut(idx).filter(|u| u.left) {
            let first = u.bitmap & h.bitmap == 0;
            if !first && !h.has(GridHeader::FLAG_RESEND) {
                self.c.duplicates += 1;
                return out.push(SwitchAction::Drop { pkt, reason: "grid_duplicate" });
            }
            // (A resend goes on even when its bit left before: the flush may have been lost.)
            u.bitmap |= h.bitmap;
            if u.bitmap == job.group {
                self.take(idx);
            }
            self.c.passed_alone += 1;
            return out.push(SwitchAction::Route { pkt });
        }
        let mine = self.pool.get(idx).map(|u| (u.job, u.frag) == (h.job, h.frag));
        let len = values(&pkt).map_or(0, |v| v.len());
        if mine == Some(true) && self.pool.get(idx).is_some_and(|u| u.value.len() != len) {
            // Another length for the same fragment: forged or malformed.
            self.c.rejected += 1;
            return out.push(SwitchAction::Drop { pkt, reason: "grid_rejected" });
        }
        if h.has(GridHeader::FLAG_RESEND) {
            return match mine {
                Some(true) => {
                    let u = self.pool.get_mut(idx).expect("held");
                    let stale = now.saturating_sub(u.ts) >= job.stale_timeout_ps;
                    let new = u.bitmap & h.bitmap == 0;
                    if new {
                        u.overflow |= values(&pkt).is_some_and(|v| sticky_add(&mut u.value, v) > 0) || overflow;
                        u.bitmap |= h.bitmap;
                        u.count = u.bitmap.count_ones() as u8;
                        u.ts = now;
                    }
                    u.ecn |= ecn;
                    let complete = u.count >= h.fan_in;
                    if !complete && !stale {
                        // The unit is alive: the members it lacks are on their way (or will
                        // resend). Flushing it now would leave them a unit nobody completes.
                        return out.push(SwitchAction::Drop { pkt, reason: if new { "grid_aggregated" } else { "grid_duplicate" } });
                    }
                    let u = self.take(idx).expect("held");
                    if complete {
                        self.c.completions += 1;
                    } else {
                        self.c.resend_flushes += 1;
                        self.put(idx, Unit::left(h.job, h.frag, u.bitmap, now));
                    }
                    self.emit(h, pkt, u, out)
                }
                other => {
                    let mut h = h;
                    match other {
                        Some(_) => h.flags |= GridHeader::FLAG_COLLISION,
                        // Its group may gather here later: they must not wait for this bit.
                        None => _ = self.put(idx, Unit::left(h.job, h.frag, h.bitmap, now)),
                    }
                    self.c.resend_forwards += 1;
                    let mut pkt = pkt;
                    pkt.header = Header::Grid(h);
                    out.push(SwitchAction::Route { pkt })
                }
            };
        }
        if mine == Some(false) {
            // The holder's own job says when its unit is abandoned.
            let stale = self.pool.get(idx).is_some_and(|u| {
                let timeout = self.jobs.get(&u.job).map_or(job.stale_timeout_ps, |j| j.stale_timeout_ps);
                now.saturating_sub(u.ts) >= timeout
            });
            if !stale {
                self.c.collisions += 1;
                self.control(now, me, &job, &h, &pkt, out);
                return out.push(SwitchAction::Drop { pkt, reason: "grid_collision" });
            }
            self.take(idx);
            self.c.stale_evictions += 1;
        }
        let u = match self.pool.get_mut(idx) {
            Some(u) => {
                if u.bitmap & h.bitmap != 0 {
                    u.ecn |= ecn;
                    self.c.duplicates += 1;
                    return out.push(SwitchAction::Drop { pkt, reason: "grid_duplicate" });
                }
                let sat = values(&pkt).is_some_and(|v| sticky_add(&mut u.value, v) > 0);
                u.overflow |= sat || overflow;
                u.bitmap |= h.bitmap;
                u.count = u.bitmap.count_ones() as u8;
                u.ecn |= ecn;
                u.ts = now;
                u
            }
            None => {
                let value = values(&pkt).map(|v| v.to_vec()).unwrap_or_default();
                let count = h.bitmap.count_ones() as u8;
                self.put(idx, Unit { job: h.job, frag: h.frag, value, bitmap: h.bitmap, count, ecn, overflow, ts: now, left: false })
            }
        };
        if u.count < h.fan_in {
            // (A packet's bits never exceed the group's, so the count never passes the fan-in.)
            return out.push(SwitchAction::Drop { pkt, reason: "grid_aggregated" });
        }
        let u = self.take(idx).expect("held");
        self.c.completions += 1;
        self.emit(h, pkt, u, out)
    }
}

impl SwitchProgram for GridSwitch {
    fn on_packet(&mut self, now: Time, ctx: &dyn SwitchCtx, _in_port: PortId, pkt: Packet, out: &mut Vec<SwitchAction>) {
        let me = ctx.node();
        let Header::Grid(h) = pkt.header else {
            return out.push(SwitchAction::Route { pkt });
        };
        if h.has(GridHeader::FLAG_RESULT) {
            self.on_result(me, &h);
        }
        let passing = h.has(GridHeader::FLAG_RESULT | GridHeader::FLAG_CONTROL) || h.node != me;
        let Some(job) = self.jobs.get(&h.job).copied().filter(|_| !passing) else {
            return out.push(SwitchAction::Route { pkt });
        };
        let bad_payload = match pkt.payload.as_deref() {
            None => false,
            Some(Payload::I32(v)) => v.len() > GRID_VALUES,
            Some(_) => true,
        };
        if h.bitmap == 0 || h.bitmap & !job.group != 0 || h.fan_in != job.fan_in || bad_payload {
            self.c.rejected += 1;
            return out.push(SwitchAction::Drop { pkt, reason: "grid_rejected" });
        }
        self.on_gradient(now, me, job, h, pkt, out)
    }

    fn admit(&mut self, job: u32, adm: Admission) -> Result<(), AdmitError> {
        self.admit_job(job, adm.take::<GridSwitchJob>("grid")?);
        Ok(())
    }

    fn release(&mut self, job: u32) -> u32 {
        self.release_job(job)
    }

    /// Only packets this switch aggregates (they name it and their job is admitted) use C_s
    /// (spec A8): transit, results and control packets pass at line rate.
    fn processes(&self, ctx: &dyn SwitchCtx, _in_port: PortId, pkt: &Packet) -> bool {
        match &pkt.header {
            Header::Grid(h) => {
                h.node == ctx.node() && !h.has(GridHeader::FLAG_RESULT | GridHeader::FLAG_CONTROL) && self.jobs.contains_key(&h.job)
            }
            _ => false,
        }
    }

    fn job_of(&self, pkt: &Packet) -> Option<u32> {
        match &pkt.header {
            Header::Grid(h) => Some(h.job),
            _ => None,
        }
    }

    fn aggregators_in_use(&self) -> u32 {
        self.pool.in_use() - self.tombstones
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = &self.c;
        vec![
            ("agg_packets", c.agg_packets),
            ("agg_bytes", c.agg_bytes),
            ("completions", c.completions),
            ("collisions", c.collisions),
            ("control_sent", c.control_sent),
            ("duplicates", c.duplicates),
            ("stale_evictions", c.stale_evictions),
            ("resend_flushes", c.resend_flushes),
            ("resend_forwards", c.resend_forwards),
            ("passed_alone", c.passed_alone),
            ("freed_by_result", c.freed_by_result),
            ("overflows", c.overflows),
            ("rejected", c.rejected),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inalab_core::wire::GridHeader as H;
    use inalab_core::NodeId;
    use inalab_testkit::IdleCtx;

    const ME: NodeId = 100;
    const CTX: IdleCtx = IdleCtx { node: ME, ports: 8 };
    const PS: NodeId = 50;

    /// Job 1: workers 0, 1, 2 (bits 0-2) name this switch.
    fn switch(units: u32) -> GridSwitch {
        let mut s = GridSwitch::new(GridSwitchConfig { units });
        s.admit_job(1, job(0b111, 3));
        s
    }

    fn job(group: u64, fan_in: u8) -> GridSwitchJob {
        GridSwitchJob { group, fan_in, indexing: GridIndexing::Modulo, stale_timeout_ps: 1000, control_bytes: Some(66) }
    }

    fn grad(job: u32, frag: u32, w: u32, node: NodeId, flags: u8, vals: Vec<i32>) -> Packet {
        let h = H { job, frag, node, bitmap: 1 << w, fan_in: 3, flags };
        let mut p = Packet::new(w, 7, PS, 2, 322, Header::Grid(h));
        p.payload = Some(Box::new(Payload::I32(vals)));
        p
    }

    fn run(s: &mut GridSwitch, now: Time, p: Packet) -> Vec<SwitchAction> {
        let mut out = vec![];
        s.on_packet(now, &CTX, 0, p, &mut out);
        out
    }

    fn routed(out: &[SwitchAction]) -> (&Packet, H) {
        match out {
            [SwitchAction::Route { pkt }] => match pkt.header {
                Header::Grid(h) => (pkt, h),
                _ => panic!("not grid"),
            },
            _ => panic!("expected one Route, got {out:?}"),
        }
    }

    fn dropped(out: &[SwitchAction]) -> &'static str {
        match out.last() {
            Some(SwitchAction::Drop { reason, .. }) => reason,
            _ => panic!("expected a Drop, got {out:?}"),
        }
    }

    fn vals(p: &Packet) -> Vec<i32> {
        match p.payload.as_deref() {
            Some(Payload::I32(v)) => v.clone(),
            _ => panic!("no payload"),
        }
    }

    fn counter(s: &GridSwitch, name: &str) -> u64 {
        s.counters().into_iter().find(|(n, _)| *n == name).unwrap().1
    }

    #[test]
    fn t1_a_packet_for_another_node_passes_untouched() {
        let mut s = switch(8);
        let p = grad(1, 0, 0, 200, 0, vec![1; 64]);
        let out = run(&mut s, 0, p.clone());
        let (q, h) = routed(&out);
        assert_eq!((q.header.clone(), q.src, q.dst, vals(q), h.node), (p.header.clone(), p.src, p.dst, vals(&p), 200));
        assert_eq!((counter(&s, "agg_packets"), s.aggregators_in_use()), (0, 0));
    }

    #[test]
    fn t2_the_last_of_three_leaves_with_the_sum_and_frees_the_unit() {
        let mut s = switch(8);
        assert_eq!(dropped(&run(&mut s, 0, grad(1, 5, 0, ME, 0, vec![1, 2]))), "grid_aggregated");
        assert_eq!(dropped(&run(&mut s, 1, grad(1, 5, 1, ME, 0, vec![10, 20]))), "grid_aggregated");
        let out = run(&mut s, 2, grad(1, 5, 2, ME, 0, vec![100, 200]));
        let (p, h) = routed(&out);
        assert_eq!((vals(p), h.bitmap, h.node, p.dst), (vec![111, 222], 0b111, ME, PS));
        assert_eq!((s.aggregators_in_use(), counter(&s, "completions"), counter(&s, "agg_packets")), (0, 1, 3));
    }

    #[test]
    fn t3_a_group_of_one_completes_at_once() {
        let mut s = switch(8);
        s.admit_job(2, job(0b1, 1));
        let mut p = grad(2, 0, 0, ME, 0, vec![4]);
        if let Header::Grid(h) = &mut p.header {
            h.fan_in = 1;
        }
        assert_eq!(vals(routed(&run(&mut s, 0, p)).0), vec![4]);
        assert_eq!(s.aggregators_in_use(), 0);
    }

    #[test]
    fn t4_a_collision_drops_the_packet_and_tells_its_sender() {
        let mut s = switch(1);
        run(&mut s, 0, grad(1, 0, 0, ME, 0, vec![1]));
        let out = run(&mut s, 10, grad(1, 1, 1, ME, 0, vec![2]));
        assert_eq!(dropped(&out), "grid_collision");
        let SwitchAction::Route { pkt: c } = &out[0] else { panic!("{out:?}") };
        let Header::Grid(ch) = c.header else { panic!() };
        assert_eq!((c.src, c.dst, c.dst_port, c.size, c.ecn), (ME, 1, 7, 66, true));
        assert_eq!((ch.frag, ch.node, ch.flags), (1, ME, H::FLAG_CONTROL | H::FLAG_COLLISION | H::FLAG_ECN));
        assert_eq!((counter(&s, "collisions"), counter(&s, "control_sent"), s.aggregators_in_use()), (1, 1, 1));
        // The unit is unchanged: fragment 0 still completes with its own values.
        run(&mut s, 11, grad(1, 0, 1, ME, 0, vec![1]));
        assert_eq!(vals(routed(&run(&mut s, 12, grad(1, 0, 2, ME, 0, vec![1]))).0), vec![3]);
    }

    #[test]
    fn hashed_units_are_salted_by_the_switch() {
        // Unsalted, a pair of fragments that shared a unit at one switch shared it at every
        // switch (at 100 Gbps, 7 aggregation nodes of a fat tree stalled together).
        let s = switch(64);
        let j = GridSwitchJob { indexing: GridIndexing::Hash, ..job(0b111, 3) };
        let (mut here, mut both) = (0, 0);
        for f in 0..400u32 {
            for g in f + 1..400 {
                if s.index(&j, 1, 1, f) == s.index(&j, 1, 1, g) {
                    here += 1;
                    both += (s.index(&j, 2, 1, f) == s.index(&j, 2, 1, g)) as u32;
                }
            }
        }
        assert!(here > 1000 && both * 16 < here, "{both} of {here} pairs collide at both switches");
    }

    #[test]
    fn a_result_passing_by_frees_what_is_left_of_its_fragment() {
        let mut s = switch(8);
        run(&mut s, 0, grad(1, 0, 0, ME, 0, vec![1]));
        assert_eq!(s.aggregators_in_use(), 1);
        // Another fragment's result changes nothing; fragment 0's frees its partial unit.
        let result = |frag| {
            let h = H { job: 1, frag, node: PS, bitmap: 0, fan_in: 0, flags: H::FLAG_RESULT };
            Packet::new(PS, 2, 0, 7, 322, Header::Grid(h))
        };
        assert!(matches!(run(&mut s, 1, result(1))[..], [SwitchAction::Route { .. }]));
        assert_eq!(s.aggregators_in_use(), 1);
        assert!(matches!(run(&mut s, 2, result(0))[..], [SwitchAction::Route { .. }]));
        assert_eq!((s.aggregators_in_use(), counter(&s, "freed_by_result")), (0, 1));
        assert_eq!(s.release_job(1), 0);
    }

    #[test]
    fn without_control_packets_a_collision_only_drops() {
        let mut s = GridSwitch::new(GridSwitchConfig { units: 1 });
        s.admit_job(1, GridSwitchJob { control_bytes: None, ..job(0b111, 3) });
        run(&mut s, 0, grad(1, 0, 0, ME, 0, vec![1]));
        let out = run(&mut s, 1, grad(1, 1, 0, ME, 0, vec![1]));
        assert_eq!((out.len(), dropped(&out)), (1, "grid_collision"));
        assert_eq!((counter(&s, "collisions"), counter(&s, "control_sent")), (1, 0));
    }

    #[test]
    fn t7_a_duplicate_is_dropped_and_changes_nothing() {
        let mut s = switch(8);
        run(&mut s, 0, grad(1, 0, 0, ME, 0, vec![1]));
        assert_eq!(dropped(&run(&mut s, 1, grad(1, 0, 0, ME, 0, vec![1]))), "grid_duplicate");
        run(&mut s, 2, grad(1, 0, 1, ME, 0, vec![1]));
        assert_eq!(vals(routed(&run(&mut s, 3, grad(1, 0, 2, ME, 0, vec![1]))).0), vec![3]);
    }

    #[test]
    fn t8_t9_resends_join_a_live_unit_flush_a_stale_one_then_go_on_alone() {
        let mut s = switch(8);
        run(&mut s, 0, grad(1, 0, 0, ME, 0, vec![1]));
        // A live unit (touched 5 ps ago; stale after 1000): merged, or a duplicate, and kept.
        assert_eq!(dropped(&run(&mut s, 5, grad(1, 0, 1, ME, H::FLAG_RESEND, vec![10]))), "grid_aggregated");
        assert_eq!(dropped(&run(&mut s, 6, grad(1, 0, 0, ME, H::FLAG_RESEND, vec![1]))), "grid_duplicate");
        assert_eq!(s.aggregators_in_use(), 1);
        // Untouched for the stale timeout: a resend flushes the partial sum.
        let out = run(&mut s, 1005, grad(1, 0, 1, ME, H::FLAG_RESEND, vec![10]));
        let (p, h) = routed(&out);
        assert_eq!((vals(p), h.bitmap), (vec![11], 0b011), "the partial sum, the resend not added twice");
        // The unit keeps a tombstone (free for any fragment: not in use): the member still
        // missing passes on alone.
        assert_eq!(s.aggregators_in_use(), 0);
        let out = run(&mut s, 1006, grad(1, 0, 2, ME, 0, vec![100]));
        let (p, h) = routed(&out);
        assert_eq!((vals(p), h.bitmap), (vec![100], 0b100), "alone: its group left");
        assert_eq!(s.aggregators_in_use(), 0);
        assert_eq!((counter(&s, "resend_flushes"), counter(&s, "passed_alone")), (1, 1));
        // A resend that finds the unit empty goes on alone and leaves a tombstone; a new
        // fragment takes that unit at once.
        let out = run(&mut s, 1500, grad(1, 0, 2, ME, H::FLAG_RESEND, vec![7]));
        let (p, h) = routed(&out);
        assert_eq!((vals(p), h.bitmap, counter(&s, "resend_forwards")), (vec![7], 0b100, 1));
        assert_eq!(dropped(&run(&mut s, 1501, grad(1, 8, 0, ME, 0, vec![1]))), "grid_aggregated");
        // A resend that completes a unit completes it.
        run(&mut s, 2000, grad(1, 1, 0, ME, 0, vec![1]));
        run(&mut s, 2001, grad(1, 1, 1, ME, 0, vec![1]));
        let out = run(&mut s, 2002, grad(1, 1, 2, ME, H::FLAG_RESEND, vec![1]));
        let (p, h) = routed(&out);
        assert_eq!((vals(p), h.bitmap, counter(&s, "completions")), (vec![3], 0b111, 1));
    }

    #[test]
    fn t12_t16_a_stale_unit_is_evicted_by_a_new_fragment_never_by_a_resend() {
        let mut s = switch(1);
        run(&mut s, 0, grad(1, 0, 0, ME, 0, vec![1]));
        // A resend of another fragment, however late: forwarded with COLLISION, no eviction.
        let (_, h) = routed(&run(&mut s, 5_000, grad(1, 1, 0, ME, H::FLAG_RESEND, vec![1])));
        assert!(h.has(H::FLAG_COLLISION));
        assert_eq!((s.aggregators_in_use(), counter(&s, "stale_evictions")), (1, 0));
        // A new fragment 1000 ps after the unit's last touch takes it.
        assert_eq!(dropped(&run(&mut s, 5_001, grad(1, 1, 0, ME, 0, vec![1]))), "grid_aggregated");
        assert_eq!(counter(&s, "stale_evictions"), 1);
    }

    #[test]
    fn t14_t17_unadmitted_jobs_pass_and_jobs_never_merge() {
        let mut s = switch(1);
        let p = grad(9, 0, 0, ME, 0, vec![1]);
        assert_eq!(routed(&run(&mut s, 0, p.clone())).0.header, p.header);
        assert_eq!(s.aggregators_in_use(), 0);
        s.admit_job(2, job(0b111, 3));
        run(&mut s, 0, grad(1, 0, 0, ME, 0, vec![1]));
        assert_eq!(dropped(&run(&mut s, 1, grad(2, 0, 1, ME, 0, vec![1]))), "grid_collision", "same frag, other job");
    }

    #[test]
    fn t18_saturation_sets_overflow() {
        let mut s = switch(8);
        run(&mut s, 0, grad(1, 0, 0, ME, 0, vec![i32::MAX - 1]));
        run(&mut s, 1, grad(1, 0, 1, ME, 0, vec![1]));
        // Sticky: the saturated sum stays at the rail (a wrapping or plain saturating add
        // would give MAX - 5, a plausible wrong number).
        let out = run(&mut s, 2, grad(1, 0, 2, ME, 0, vec![-5]));
        let (p, h) = routed(&out);
        assert!(h.has(H::FLAG_OVERFLOW));
        assert_eq!((vals(p), counter(&s, "overflows")), (vec![i32::MAX], 1));
    }

    #[test]
    fn forged_packets_are_counted_and_dropped() {
        let mut s = switch(8);
        let mut p = grad(1, 0, 5, ME, 0, vec![1]); // bit 5: not in the group
        assert_eq!(dropped(&run(&mut s, 0, p.clone())), "grid_rejected");
        p = grad(1, 0, 0, ME, 0, vec![1; 65]); // more values than a unit holds
        assert_eq!(dropped(&run(&mut s, 0, p)), "grid_rejected");
        run(&mut s, 0, grad(1, 1, 0, ME, 0, vec![1; 4]));
        assert_eq!(dropped(&run(&mut s, 0, grad(1, 1, 1, ME, 0, vec![1; 3]))), "grid_rejected", "another length");
        assert_eq!(counter(&s, "rejected"), 3);
    }

    #[test]
    fn hostile_packets_never_panic_and_release_frees_everything() {
        let mut s = switch(16);
        let (mut out, mut x) = (vec![], 11u64);
        for t in 0..50_000u64 {
            x = splitmix64(x);
            let h = H { job: (x % 3) as u32, frag: (x >> 8) as u32 % 40, node: if x >> 20 & 3 == 0 { 7 } else { ME }, bitmap: x >> 24 & 0xF, fan_in: (x >> 30) as u8 % 5, flags: (x >> 33) as u8 & 0x3F };
            let mut p = Packet::new((x >> 40) as u32 % 8, 1, PS, 2, 322, Header::Grid(h));
            if x >> 44 & 1 == 0 {
                p.payload = Some(Box::new(Payload::I32(vec![1; (x >> 45) as usize % 70])));
            }
            s.on_packet(t, &CTX, 0, p, &mut out);
            out.clear();
        }
        assert!(counter(&s, "rejected") > 0 && counter(&s, "completions") > 0);
        s.release_job(1);
        assert_eq!(s.aggregators_in_use(), 0);
    }
}
