//! SwitchML's switch program (Sapio et al., "Scaling Distributed Machine Learning with
//! In-Network Aggregation", NSDI '21, Algorithm 1 with shadow copies).
//!
//! Every admitted job owns a static partition of the switch's aggregator slots (its *pool*).
//! A worker sends a packet of [`VALUES_PER_SLOT`] i32 values naming a slot of its pool and a
//! shadow copy `ver` of that slot; the switch sums the workers' packets for `(slot, ver)` and,
//! when all `n` workers contributed, sends the result straight back to every worker (no
//! parameter server). Workers reuse a slot only after its result returned, alternating the
//! two copies, so the previous copy keeps the last result for answering retransmissions.
//!
//! # Memory model
//!
//! The switch's aggregator memory is cut into slots of [`SLOT_BYTES`] = 280 bytes:
//! two shadow copies, each holding 32 values x 4 B (128 B), a 4 B contribution count, a
//! 4 B "seen" bitmap register (one bit per worker, as SwitchML's 32-bit registers) and a 4 B
//! register for the maximum block exponent: `2 x (128 + 4 + 4 + 4) = 280 B`. A switch built
//! with `memory_bytes` has `memory_bytes / SLOT_BYTES` slots (10 MB -> 35 714 slots), and
//! [`SwitchMlSwitch::admit_job`] fails when the pools would exceed them.
//!
//! # Algorithm (per worker packet for `(slot, ver)` from worker `wid`)
//!
//! - not yet seen from `wid` on this copy: set `seen[ver][slot][wid]`, clear
//!   `seen[1-ver][slot][wid]`; the first contribution of a round overwrites the values, later
//!   ones add (saturating, see below); at the `n`-th contribution the copy is complete and the
//!   result (`FLAG_RESULT`, same slot/ver/chunk, `exp` = max over the contributions) is sent
//!   to every worker of the job as one `ForwardEach`: a copy per worker, addressed to it and
//!   carrying its `wid` (the runtime encodes and hashes the values once); otherwise the packet is consumed (`Drop`, reason "switchml_aggregated");
//! - already seen: if the copy is complete the stored result is sent back to the sender
//!   alone (a retransmission whose result was lost), else the packet is dropped as stale.
//!
//! Packets that are not SwitchML worker packets of an admitted job (other traffic, results
//! of other switches, jobs of other switches) are routed as plain traffic (`Route`).
//!
//! # Deviations from the paper
//!
//! - Sums saturate at the i32 range instead of wrapping, stickily (`inalab_core::rail`: a
//!   value at an end stays there through later adds), and every saturation is counted in
//!   `overflows` (SwitchML's block scaling makes overflow impossible; the counter shows when
//!   a host skipped it).
//! - Completion is an explicit flag instead of `count mod n == 0`, which also makes a
//!   one-worker job correct.
//! - The switch checks the `chunk` field: a worker packet whose chunk differs from the one a
//!   partial copy is aggregating, or is not newer than the copy's last round, is dropped as
//!   stale instead of corrupting the sum (the paper assumes no packet outlives a round), and
//!   a retransmission is answered only if it names the completed copy's chunk.
//! - A packet must come from the host its `wid` names and carry at most its job's
//!   `values_per_packet` i32 values; otherwise it is dropped and counted in `rejected`.
//! - A job whose packets carry more than [`VALUES_PER_SLOT`] values (a configuration wider
//!   than the Tofino's 180 B packet, e.g. for a software switch) is charged
//!   `ceil(values / 32)` slots per pool slot, as if its packets spanned that many register
//!   arrays.
//! - Jobs of more than 32 workers are accepted and still charged one slot per pool slot (the
//!   seen bitmap would need `ceil(n / 32)` registers on hardware).
//! - The result packet has the size of the round's first contribution; its `wid` field is
//!   the receiving worker's id.

use inalab_core::wire::{Header, SwitchMlHeader};
use inalab_core::{Addressed, Admission, AdmitError, Endpoint, Packet, Payload, PortId, SwitchAction, SwitchCtx, SwitchProgram, Time};
use std::collections::BTreeMap;
use std::fmt;

/// i32 values a slot copy holds (a 180 B SwitchML packet carries 128 B of payload).
pub const VALUES_PER_SLOT: usize = 32;

/// Switch memory one slot takes: two shadow copies of 32 x 4 B values plus a 4 B count, a
/// 4 B seen bitmap and a 4 B exponent register each.
pub const SLOT_BYTES: u64 = 2 * (VALUES_PER_SLOT as u64 * 4 + 4 + 4 + 4);

/// A job's members and its static pool, as the control plane installs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchMlJob {
    /// Worker `wid` is `workers[wid]`: its protocol endpoint (host and UDP port results are
    /// sent to) and the switch's egress port toward that host.
    pub workers: Vec<(Endpoint, PortId)>,
    /// Slots of the job's pool (the workers must use the same pool size).
    pub pool_slots: u32,
    /// Values a worker packet carries at most ([`VALUES_PER_SLOT`] for the hardware's packet).
    pub values_per_packet: u32,
}

/// Hardware slots one pool slot of `values_per_packet` values takes.
pub fn slot_units(values_per_packet: u32) -> u32 {
    values_per_packet.div_ceil(VALUES_PER_SLOT as u32).max(1)
}

/// Why `admit_job` refused a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwitchMlAdmitError {
    AlreadyAdmitted {
        job: u32,
    },
    NoWorkers,
    /// `wid` is 16 bits on the wire.
    TooManyWorkers {
        workers: usize,
    },
    DuplicateWorker {
        endpoint: Endpoint,
    },
    EmptyPool,
    /// A packet would carry no value.
    NoValues,
    /// The pool does not fit in the slots left.
    OutOfSlots {
        requested: u32,
        free: u32,
        total: u32,
    },
}

impl fmt::Display for SwitchMlAdmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SwitchMlAdmitError::AlreadyAdmitted { job } => write!(f, "SwitchML job {job} is already admitted"),
            SwitchMlAdmitError::NoWorkers => write!(f, "a SwitchML job needs at least one worker"),
            SwitchMlAdmitError::TooManyWorkers { workers } => write!(f, "{workers} workers exceed SwitchML's 65536"),
            SwitchMlAdmitError::DuplicateWorker { endpoint } => write!(f, "worker {endpoint:?} listed twice"),
            SwitchMlAdmitError::EmptyPool => write!(f, "a SwitchML pool needs at least one slot"),
            SwitchMlAdmitError::NoValues => write!(f, "a SwitchML packet must carry at least one value"),
            SwitchMlAdmitError::OutOfSlots { requested, free, total } => write!(
                f,
                "a pool of {requested} slots does not fit: {free} of the switch's {total} slots ({SLOT_BYTES} B each) are free"
            ),
        }
    }
}

impl std::error::Error for SwitchMlAdmitError {}

/// One shadow copy of one slot.
#[derive(Debug, Clone)]
struct SlotCopy {
    /// Values of the current round (from its first contribution); the values themselves are in
    /// the job's `values`.
    len: u32,
    /// Whether the round carries values (payload mode) or only sizes (metadata mode).
    payload: bool,
    /// Contributions of the current round.
    count: u32,
    complete: bool,
    /// Whether the copy has ever been used (its `chunk` is meaningful).
    used: bool,
    chunk: u32,
    exp: i8,
    /// Bytes of the round's first contribution (the size of the result packet).
    size: u32,
}

impl Default for SlotCopy {
    fn default() -> Self {
        SlotCopy {
            len: 0,
            payload: false,
            count: 0,
            complete: false,
            used: false,
            chunk: 0,
            exp: i8::MIN,
            size: 0,
        }
    }
}

struct Job {
    workers: Vec<(Endpoint, PortId)>,
    pool: u32,
    /// Hardware slots the pool takes (`pool x slot_units(width)`).
    units: u32,
    /// Values per packet: copy `c`'s values are `values[c * width..][..width]`.
    width: usize,
    values: Vec<i32>,
    /// `copies[2 * slot + ver]`.
    copies: Vec<SlotCopy>,
    /// Seen bits: `seen[(2 * slot + ver) * words + wid / 64]`.
    seen: Vec<u64>,
    words: usize,
}

impl Job {
    fn seen_idx(&self, slot: u32, ver: u8, wid: u16) -> (usize, u64) {
        let c = 2 * slot as usize + ver as usize;
        (c * self.words + wid as usize / 64, 1u64 << (wid % 64))
    }
}

/// Switch counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SwitchMlCounters {
    /// Worker contributions added to a copy (first contributions included).
    pub aggregated: u64,
    /// Copies that reached `n` contributions (results multicast).
    pub completed: u64,
    /// Retransmissions answered from a completed copy.
    pub retransmissions_answered: u64,
    /// Worker packets dropped because the copy had already counted them and is not complete,
    /// or because their chunk is not the copy's.
    pub dropped_stale: u64,
    /// Values that saturated while summing.
    pub overflows: u64,
    /// Malformed worker packets: unknown wid, wrong source host, slot outside the pool,
    /// too many values, or a non-i32 payload.
    pub rejected: u64,
}

/// SwitchML's aggregation program for any number of jobs with static slot partitions.
pub struct SwitchMlSwitch {
    total_slots: u32,
    used_slots: u32,
    jobs: BTreeMap<u32, Job>,
    /// Copies with a partial aggregation (aggregators in use).
    partial: u32,
    c: SwitchMlCounters,
}

impl SwitchMlSwitch {
    /// A switch with `memory_bytes` of aggregator memory, i.e. `memory_bytes / SLOT_BYTES`
    /// slots (capped at `u32::MAX`), and no job.
    pub fn new(memory_bytes: u64) -> Self {
        SwitchMlSwitch::with_slots((memory_bytes / SLOT_BYTES).min(u32::MAX as u64) as u32)
    }

    /// A switch with exactly `slots` aggregator slots.
    pub fn with_slots(slots: u32) -> Self {
        SwitchMlSwitch {
            total_slots: slots,
            used_slots: 0,
            jobs: BTreeMap::new(),
            partial: 0,
            c: SwitchMlCounters::default(),
        }
    }

    pub fn total_slots(&self) -> u32 {
        self.total_slots
    }

    /// Slots not in any job's partition.
    pub fn free_slots(&self) -> u32 {
        self.total_slots - self.used_slots
    }

    pub fn stats(&self) -> SwitchMlCounters {
        self.c
    }

    /// Control plane: installs `job` with a static partition of `cfg.pool_slots` slots.
    pub fn admit_job(&mut self, job: u32, cfg: SwitchMlJob) -> Result<(), SwitchMlAdmitError> {
        if self.jobs.contains_key(&job) {
            return Err(SwitchMlAdmitError::AlreadyAdmitted { job });
        }
        let n = cfg.workers.len();
        if n == 0 {
            return Err(SwitchMlAdmitError::NoWorkers);
        }
        if n > u16::MAX as usize + 1 {
            return Err(SwitchMlAdmitError::TooManyWorkers { workers: n });
        }
        let mut eps: Vec<Endpoint> = cfg.workers.iter().map(|w| w.0).collect();
        eps.sort();
        if let Some(w) = eps.windows(2).find(|w| w[0] == w[1]) {
            return Err(SwitchMlAdmitError::DuplicateWorker { endpoint: w[0] });
        }
        if cfg.pool_slots == 0 {
            return Err(SwitchMlAdmitError::EmptyPool);
        }
        if cfg.values_per_packet == 0 {
            return Err(SwitchMlAdmitError::NoValues);
        }
        let units = cfg.pool_slots.saturating_mul(slot_units(cfg.values_per_packet));
        if units > self.free_slots() {
            return Err(SwitchMlAdmitError::OutOfSlots {
                requested: units,
                free: self.free_slots(),
                total: self.total_slots,
            });
        }
        let words = n.div_ceil(64);
        let copies = 2 * cfg.pool_slots as usize;
        let width = cfg.values_per_packet as usize;
        self.used_slots += units;
        self.jobs.insert(
            job,
            Job {
                workers: cfg.workers,
                pool: cfg.pool_slots,
                units,
                width,
                values: vec![0; copies * width],
                copies: vec![SlotCopy::default(); copies],
                seen: vec![0; copies * words],
                words,
            },
        );
        Ok(())
    }

    /// Control plane: removes `job` and frees its partition (its partial aggregations are
    /// lost). Returns whether the job was admitted.
    pub fn release_job(&mut self, job: u32) -> bool {
        let Some(j) = self.jobs.remove(&job) else { return false };
        self.used_slots -= j.units;
        self.partial -= j.copies.iter().filter(|c| c.count > 0 && !c.complete).count() as u32;
        true
    }

    /// The result packet of `copy` for worker `wid` of `job`.
    /// `src` is the switch's endpoint (node, SwitchML port); `h` the worker packet's header.
    fn result(src: Endpoint, now: Time, h: &SwitchMlHeader, job: &Job, wid: u16) -> (PortId, Packet) {
        let ci = 2 * h.slot as usize + h.ver as usize;
        let copy = &job.copies[ci];
        let (ep, port) = job.workers[wid as usize];
        let mut pkt = Packet::new(src.host, src.port, ep.host, ep.port, copy.size, Self::result_header(h, copy, wid));
        pkt.created = now;
        if copy.payload {
            pkt.payload = Some(Box::new(Payload::I32(job.values[ci * job.width..][..copy.len as usize].to_vec())));
        }
        (port, pkt)
    }

    /// The result packet of a completed slot to every worker: one packet whose copies differ
    /// in their address and `wid`, so the runtime encodes its values once.
    fn results(src: Endpoint, now: Time, h: &SwitchMlHeader, job: &Job) -> SwitchAction {
        let (_, pkt) = Self::result(src, now, h, job, 0);
        let copy = &job.copies[2 * h.slot as usize + h.ver as usize];
        let to = (job.workers.iter().enumerate())
            .map(|(wid, &(ep, port))| Addressed {
                port,
                dst: ep.host,
                dst_port: ep.port,
                header: Self::result_header(h, copy, wid as u16),
            })
            .collect();
        SwitchAction::ForwardEach { pkt, to }
    }

    fn result_header(h: &SwitchMlHeader, copy: &SlotCopy, wid: u16) -> Header {
        Header::SwitchMl(SwitchMlHeader {
            job: h.job,
            slot: h.slot,
            chunk: copy.chunk,
            wid,
            ver: h.ver,
            flags: SwitchMlHeader::FLAG_RESULT,
            exp: copy.exp,
        })
    }
}

/// Serial-number comparison of 32-bit chunk ids: whether `a` comes before `b`.
fn chunk_before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

impl SwitchProgram for SwitchMlSwitch {
    fn on_packet(
        &mut self,
        now: Time,
        ctx: &dyn SwitchCtx,
        _in_port: PortId,
        pkt: Packet,
        out: &mut Vec<SwitchAction>,
    ) {
        let h = match &pkt.header {
            Header::SwitchMl(h) if h.flags & SwitchMlHeader::FLAG_RESULT == 0 => *h,
            _ => return out.push(SwitchAction::Route { pkt }),
        };
        let Some(job) = self.jobs.get_mut(&h.job) else {
            return out.push(SwitchAction::Route { pkt });
        };
        let n = job.workers.len() as u32;
        let values = match pkt.payload.as_deref() {
            None => None,
            Some(Payload::I32(v)) if v.len() <= job.width => Some(v.as_slice()),
            Some(_) => {
                self.c.rejected += 1;
                return out.push(SwitchAction::Drop { pkt, reason: "switchml_bad_payload" });
            }
        };
        if h.slot >= job.pool || h.wid as u32 >= n || job.workers[h.wid as usize].0.host != pkt.src {
            self.c.rejected += 1;
            return out.push(SwitchAction::Drop { pkt, reason: "switchml_bad_slot_or_worker" });
        }
        let ci = 2 * h.slot as usize + h.ver as usize;
        let (w, bit) = job.seen_idx(h.slot, h.ver, h.wid);
        let (ow, obit) = job.seen_idx(h.slot, 1 - h.ver, h.wid);
        let copy = &mut job.copies[ci];
        let stored = &mut job.values[ci * job.width..][..job.width];
        if job.seen[w] & bit != 0 {
            // A retransmission: answer it if its copy holds the result.
            if copy.complete && copy.chunk == h.chunk {
                self.c.retransmissions_answered += 1;
                let (port, res) = Self::result(Endpoint { host: ctx.node(), port: pkt.dst_port }, now, &h, job, h.wid);
                out.push(SwitchAction::Forward { port, pkt: res });
                return out.push(SwitchAction::Drop { pkt, reason: "switchml_answered" });
            }
            self.c.dropped_stale += 1;
            return out.push(SwitchAction::Drop { pkt, reason: "switchml_stale" });
        }
        let new_round = copy.count == 0 || copy.complete;
        let stale = match new_round {
            // A new round must carry a newer chunk than the copy's last one.
            true => copy.used && !chunk_before(copy.chunk, h.chunk),
            false => h.chunk != copy.chunk,
        };
        if stale {
            self.c.dropped_stale += 1;
            return out.push(SwitchAction::Drop { pkt, reason: "switchml_stale" });
        }
        job.seen[w] |= bit;
        job.seen[ow] &= !obit;
        self.c.aggregated += 1;
        if new_round {
            *copy =
                SlotCopy { used: true, chunk: h.chunk, exp: h.exp, size: pkt.size, count: 1, ..SlotCopy::default() };
            if let Some(v) = values {
                stored[..v.len()].copy_from_slice(v);
                copy.len = v.len() as u32;
                copy.payload = true;
            }
            self.partial += 1;
        } else {
            copy.count += 1;
            copy.exp = copy.exp.max(h.exp);
            if let Some(v) = values {
                if copy.payload {
                    self.c.overflows += inalab_core::rail::sticky_add(stored, v) as u64;
                    copy.len = copy.len.max(v.len() as u32);
                }
            }
        }
        if copy.count < n {
            return out.push(SwitchAction::Drop { pkt, reason: "switchml_aggregated" });
        }
        copy.complete = true;
        self.partial -= 1;
        self.c.completed += 1;
        out.push(Self::results(Endpoint { host: ctx.node(), port: pkt.dst_port }, now, &h, job));
        out.push(SwitchAction::Drop { pkt, reason: "switchml_aggregated" });
    }

    fn admit(&mut self, job: u32, adm: Admission) -> Result<(), AdmitError> {
        self.admit_job(job, adm.take::<SwitchMlJob>("switchml")?).map_err(|e| AdmitError(e.to_string()))
    }

    /// Frees the job's partition; returns the slots that still held a partial sum.
    fn release(&mut self, job: u32) -> u32 {
        let partial = self.jobs.get(&job).map_or(0, |j| j.copies.iter().filter(|c| c.count > 0 && !c.complete).count() as u32);
        self.release_job(job);
        partial
    }

    /// A worker's update of an admitted job is what uses the switch's aggregation rate (GRID's
    /// C_s; the Rina paper's footnote 1 puts a Tofino-1's at about 20 Gbps); results leave
    /// through the multicast engine at line rate.
    fn processes(&self, _ctx: &dyn SwitchCtx, _in_port: PortId, pkt: &Packet) -> bool {
        matches!(&pkt.header, Header::SwitchMl(h) if h.flags & SwitchMlHeader::FLAG_RESULT == 0 && self.jobs.contains_key(&h.job))
    }

    fn job_of(&self, pkt: &Packet) -> Option<u32> {
        match &pkt.header {
            Header::SwitchMl(h) => Some(h.job),
            _ => None,
        }
    }

    /// Slot copies holding a partial aggregation. Under SwitchML's protocol a slot has at
    /// most one partial copy, so this is the number of slots in use.
    fn aggregators_in_use(&self) -> u32 {
        self.partial
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = self.c;
        vec![
            ("aggregated", c.aggregated),
            ("completed", c.completed),
            ("retransmissions_answered", c.retransmissions_answered),
            ("dropped_stale", c.dropped_stale),
            ("overflows", c.overflows),
            ("rejected", c.rejected),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inalab_core::NodeId;
    use inalab_testkit::IdleCtx;

    const SW: NodeId = 100;
    const SW_PORT: u16 = 9000;

    const CTX: IdleCtx = IdleCtx { node: SW, ports: 16 };

    /// Worker `w` is host `w`, UDP port 7 + w, behind switch port `w`.
    fn job(n: u16, pool: u32) -> SwitchMlJob {
        SwitchMlJob {
            workers: (0..n).map(|w| (Endpoint { host: w as u32, port: 7 + w }, w)).collect(),
            pool_slots: pool,
            values_per_packet: VALUES_PER_SLOT as u32,
        }
    }

    fn pkt(job: u32, wid: u16, slot: u32, ver: u8, chunk: u32, values: Vec<i32>) -> Packet {
        let h = SwitchMlHeader { job, slot, chunk, wid, ver, flags: 0, exp: wid as i8 - 3 };
        let mut p = Packet::new(wid as u32, 7 + wid, SW, SW_PORT, 180, Header::SwitchMl(h));
        p.payload = Some(Box::new(Payload::I32(values)));
        p
    }

    fn run(sw: &mut SwitchMlSwitch, p: Packet) -> Vec<SwitchAction> {
        let mut out = Vec::new();
        sw.on_packet(0, &CTX, p.src as PortId, p, &mut out);
        out
    }

    /// The results among `out`: (egress port, packet).
    fn results(out: &[SwitchAction]) -> Vec<(PortId, Packet)> {
        out.iter()
            .flat_map(|a| match a {
                SwitchAction::Forward { port, pkt } => vec![(*port, pkt.clone())],
                SwitchAction::ForwardEach { pkt, to } => Addressed::copies(pkt.clone(), to.clone()).collect(),
                SwitchAction::Drop { .. } => vec![],
                a => panic!("unexpected action {a:?}"),
            })
            .collect()
    }

    fn values(p: &Packet) -> Vec<i32> {
        match p.payload.as_deref() {
            Some(Payload::I32(v)) => v.clone(),
            other => panic!("no i32 payload: {other:?}"),
        }
    }

    fn hdr(p: &Packet) -> SwitchMlHeader {
        match p.header {
            Header::SwitchMl(h) => h,
            _ => panic!("not SwitchML"),
        }
    }

    fn dropped(out: &[SwitchAction], why: &str) -> bool {
        out.len() == 1 && matches!(&out[0], SwitchAction::Drop { reason, .. } if reason.contains(&why.replace(' ', "_")))
    }

    #[test]
    fn completes_at_n_and_multicasts_with_rewritten_destinations() {
        let mut sw = SwitchMlSwitch::with_slots(8);
        sw.admit_job(1, job(3, 4)).unwrap();
        assert!(dropped(&run(&mut sw, pkt(1, 0, 2, 0, 2, vec![1, 2, 3])), "aggregated"));
        assert_eq!(sw.aggregators_in_use(), 1);
        assert!(dropped(&run(&mut sw, pkt(1, 2, 2, 0, 2, vec![10, 20, 30])), "aggregated"));
        assert_eq!(sw.aggregators_in_use(), 1);
        let out = run(&mut sw, pkt(1, 1, 2, 0, 2, vec![100, 200, 300]));
        let res = results(&out);
        assert_eq!(res.len(), 3, "{out:?}");
        assert_eq!(sw.aggregators_in_use(), 0);
        for (w, (port, p)) in res.iter().enumerate() {
            assert_eq!(*port, w as PortId);
            assert_eq!((p.src, p.src_port, p.dst, p.dst_port, p.size), (SW, SW_PORT, w as u32, 7 + w as u16, 180));
            let h = hdr(p);
            assert_eq!(
                (h.job, h.slot, h.ver, h.chunk, h.flags, h.wid),
                (1, 2, 0, 2, SwitchMlHeader::FLAG_RESULT, w as u16)
            );
            assert_eq!(h.exp, -1, "max exp of -3, -1, -2");
            assert_eq!(values(p), vec![111, 222, 333]);
        }
        assert_eq!(sw.stats(), SwitchMlCounters { aggregated: 3, completed: 1, ..Default::default() });
    }

    #[test]
    fn shadow_copies_alternate_and_answer_retransmissions() {
        let mut sw = SwitchMlSwitch::with_slots(8);
        sw.admit_job(1, job(2, 1)).unwrap();
        // Round on ver 0 (chunk 0) completes.
        run(&mut sw, pkt(1, 0, 0, 0, 0, vec![1]));
        assert_eq!(results(&run(&mut sw, pkt(1, 1, 0, 0, 0, vec![2]))).len(), 2);
        // Worker 0 got its result and moves on to ver 1 (chunk 1); worker 1's result was
        // lost and it retransmits chunk 0: answered from ver 0, to worker 1 alone.
        assert!(dropped(&run(&mut sw, pkt(1, 0, 0, 1, 1, vec![5])), "aggregated"));
        let out = run(&mut sw, pkt(1, 1, 0, 0, 0, vec![2]));
        let res = results(&out);
        assert_eq!(res.len(), 1);
        assert_eq!((res[0].0, res[0].1.dst, res[0].1.dst_port), (1, 1, 8));
        assert_eq!(values(&res[0].1), vec![3]);
        assert_eq!(hdr(&res[0].1).chunk, 0);
        assert_eq!(sw.stats().retransmissions_answered, 1);
        // Worker 0 retransmits chunk 1 while ver 1 is partial: stale, dropped.
        assert!(dropped(&run(&mut sw, pkt(1, 0, 0, 1, 1, vec![5])), "stale"));
        assert_eq!(sw.stats().dropped_stale, 1);
        // Worker 1 sends chunk 1: ver 1 completes with the sum of this round only.
        let res = results(&run(&mut sw, pkt(1, 1, 0, 1, 1, vec![6])));
        assert_eq!(res.len(), 2);
        assert_eq!(values(&res[0].1), vec![11]);
        // Ver 0 is reused for chunk 2 (both workers' seen bits were cleared by their ver-1
        // packets): its first contribution overwrites the old result.
        assert!(dropped(&run(&mut sw, pkt(1, 1, 0, 0, 2, vec![7])), "aggregated"));
        // A late duplicate of worker 1's chunk 0 would now be stale.
        assert!(dropped(&run(&mut sw, pkt(1, 1, 0, 0, 0, vec![2])), "stale"));
        let res = results(&run(&mut sw, pkt(1, 0, 0, 0, 2, vec![8])));
        assert_eq!(values(&res[1].1), vec![15]);
        assert_eq!(sw.stats().completed, 3);
        assert_eq!(sw.stats().dropped_stale, 2);
        assert_eq!(sw.aggregators_in_use(), 0);
    }

    #[test]
    fn a_retransmission_after_the_copy_moved_on_is_dropped() {
        let mut sw = SwitchMlSwitch::with_slots(8);
        sw.admit_job(1, job(2, 1)).unwrap();
        run(&mut sw, pkt(1, 0, 0, 0, 0, vec![1]));
        run(&mut sw, pkt(1, 1, 0, 0, 0, vec![1]));
        run(&mut sw, pkt(1, 0, 0, 1, 1, vec![1]));
        // Worker 0 retransmits chunk 1 again: ver 1 is partial, its bit is set: stale.
        assert!(dropped(&run(&mut sw, pkt(1, 0, 0, 1, 1, vec![1])), "stale"));
        // A worker-0 duplicate of chunk 0 after its ver-0 bit was cleared must not start a
        // round with an old chunk.
        assert!(dropped(&run(&mut sw, pkt(1, 0, 0, 0, 0, vec![1])), "stale"));
        assert_eq!(sw.stats().dropped_stale, 2);
        assert_eq!(sw.stats().aggregated, 3);
    }

    #[test]
    fn partitions_are_static_and_capacity_is_checked() {
        assert_eq!(SLOT_BYTES, 280);
        let mut sw = SwitchMlSwitch::new(10 * SLOT_BYTES + 279);
        assert_eq!(sw.total_slots(), 10);
        sw.admit_job(1, job(2, 6)).unwrap();
        assert_eq!(
            sw.admit_job(2, job(2, 5)),
            Err(SwitchMlAdmitError::OutOfSlots { requested: 5, free: 4, total: 10 })
        );
        assert_eq!(sw.admit_job(1, job(2, 1)), Err(SwitchMlAdmitError::AlreadyAdmitted { job: 1 }));
        assert_eq!(sw.admit_job(3, job(2, 0)), Err(SwitchMlAdmitError::EmptyPool));
        assert_eq!(sw.admit_job(3, job(0, 1)), Err(SwitchMlAdmitError::NoWorkers));
        let mut dup = job(2, 1);
        dup.workers[1].0 = dup.workers[0].0;
        assert!(matches!(sw.admit_job(3, dup), Err(SwitchMlAdmitError::DuplicateWorker { .. })));
        sw.admit_job(2, job(3, 4)).unwrap();
        assert_eq!(sw.free_slots(), 0);
        // Job 1's slot 5 and job 2's slot 0..4 are separate aggregators.
        run(&mut sw, pkt(1, 0, 5, 0, 5, vec![1]));
        assert!(dropped(&run(&mut sw, pkt(2, 0, 6, 0, 6, vec![1])), "bad slot"));
        run(&mut sw, pkt(2, 0, 1, 0, 1, vec![40]));
        assert_eq!(sw.aggregators_in_use(), 2);
        assert_eq!(values(&results(&run(&mut sw, pkt(1, 1, 5, 0, 5, vec![2])))[0].1), vec![3]);
        assert_eq!(sw.aggregators_in_use(), 1);
        assert!(sw.release_job(2));
        assert_eq!((sw.free_slots(), sw.aggregators_in_use()), (4, 0));
        assert!(!sw.release_job(2));
    }

    #[test]
    fn other_traffic_is_routed_and_bad_packets_rejected() {
        let mut sw = SwitchMlSwitch::with_slots(8);
        sw.admit_job(1, job(2, 2)).unwrap();
        let raw = Packet::new(0, 1, 1, 1, 100, Header::Raw);
        assert!(matches!(run(&mut sw, raw)[..], [SwitchAction::Route { .. }]));
        assert!(matches!(run(&mut sw, pkt(9, 0, 0, 0, 0, vec![1]))[..], [SwitchAction::Route { .. }]), "unknown job");
        let mut res = pkt(1, 0, 0, 0, 0, vec![1]);
        res.header = Header::SwitchMl(SwitchMlHeader { flags: SwitchMlHeader::FLAG_RESULT, ..hdr(&res) });
        assert!(matches!(run(&mut sw, res)[..], [SwitchAction::Route { .. }]), "results pass through");
        let mut spoofed = pkt(1, 1, 0, 0, 0, vec![1]);
        spoofed.src = 0;
        assert!(dropped(&run(&mut sw, spoofed), "bad slot or worker"));
        assert!(dropped(&run(&mut sw, pkt(1, 0, 0, 0, 0, vec![1; 33])), "bad payload"));
        let mut f = pkt(1, 0, 0, 0, 0, vec![]);
        f.payload = Some(Box::new(Payload::F32(vec![1.0])));
        assert!(dropped(&run(&mut sw, f), "bad payload"));
        assert_eq!(sw.stats().rejected, 3);
        assert_eq!(sw.stats().aggregated, 0);
    }

    #[test]
    fn sums_saturate_and_count_overflows() {
        let mut sw = SwitchMlSwitch::with_slots(1);
        sw.admit_job(1, job(3, 1)).unwrap();
        run(&mut sw, pkt(1, 0, 0, 0, 0, vec![i32::MAX - 1, -5, i32::MIN + 1]));
        run(&mut sw, pkt(1, 1, 0, 0, 0, vec![1, 5, -1]));
        // Sticky: the saturated values stay at their rails against later contributions.
        let res = results(&run(&mut sw, pkt(1, 2, 0, 0, 0, vec![-1, 1, 5])));
        assert_eq!(values(&res[0].1), vec![i32::MAX, 1, i32::MIN]);
        assert_eq!(sw.stats().overflows, 2);
    }

    #[test]
    fn metadata_mode_and_single_worker_jobs() {
        let mut sw = SwitchMlSwitch::with_slots(4);
        sw.admit_job(1, job(1, 1)).unwrap();
        let mut p = pkt(1, 0, 0, 0, 0, vec![]);
        p.payload = None;
        p.size = 120;
        let res = results(&run(&mut sw, p));
        assert_eq!(res.len(), 1);
        assert!(res[0].1.payload.is_none());
        assert_eq!(res[0].1.size, 120);
        assert_eq!(sw.stats().completed, 1);
        let names: Vec<_> = sw.counters().into_iter().map(|c| c.0).collect();
        assert_eq!(
            names,
            ["aggregated", "completed", "retransmissions_answered", "dropped_stale", "overflows", "rejected"]
        );
    }

    /// A job configured with packets wider than the hardware's (a software switch) sums them
    /// whole, is charged `ceil(width / 32)` slots per pool slot, and still rejects a packet
    /// wider than its own.
    #[test]
    fn wide_packets_take_several_slots_and_sum_whole() {
        let mut sw = SwitchMlSwitch::with_slots(100);
        let wide = SwitchMlJob { values_per_packet: 256, ..job(2, 10) };
        assert_eq!(sw.admit_job(1, wide.clone()), Ok(()));
        assert_eq!(sw.free_slots(), 20, "10 pool slots x 8 units");
        assert!(matches!(sw.admit_job(2, SwitchMlJob { pool_slots: 3, ..wide }), Err(SwitchMlAdmitError::OutOfSlots { requested: 24, free: 20, .. })));
        run(&mut sw, pkt(1, 0, 4, 0, 4, (0..256).collect()));
        let out = run(&mut sw, pkt(1, 1, 4, 0, 4, vec![1; 256]));
        assert_eq!(values(&results(&out)[0].1), (1..257).collect::<Vec<i32>>());
        assert!(dropped(&run(&mut sw, pkt(1, 0, 5, 0, 5, vec![1; 257])), "bad payload"));
        assert!(sw.release_job(1));
        assert_eq!(sw.free_slots(), 100);
    }
}
