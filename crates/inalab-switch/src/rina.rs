//! Rina's ToR program (Chen et al., ICNP 2024, §IV-B; `../shared/specs/rina.md` §1.2-1.4): the
//! switch of an INA rack makes the rack one abstracted ring member.
//!
//! Per job it knows (control plane): the rack's members by port (member 0 is the agent), the
//! next group's receiver, and a contiguous region of slots (no hashing, §V). Regions of
//! different jobs never overlap: an admission whose planned region meets another job's is
//! placed at the first free range of its length (a driver that admits jobs one at a time, as
//! the UDP runtime does, plans every job at the same region), and slots are tagged with their
//! job, so two jobs' equal tags never meet. In the data plane:
//! - a TASK from the agent is copied as a PULL to every member;
//! - a member's DATA is summed in slot `first + q mod len` of the job's region, `q` the
//!   job-wide DATA index every member counts alike (a slot is tagged with it); when every
//!   member is in, the sum goes to the next group's receiver as an AGG that looks as if the
//!   agent sent it, so its ACK comes back through here;
//! - that ACK frees the slot and is copied to every member (each member clocks its window);
//! - a finished chunk (an AGG with FULL) or an AllGather packet addressed to the agent is
//!   copied to every member of the rack, so the agent never relays inside its rack.
//!
//! Loss: a member's re-sent DATA that is already summed is dropped while the slot collects,
//! answered with the AGG again once the slot is complete (the AGG or its ACK was lost), and
//! with an ACK once the slot was freed or moved on (only the ACK copy to it was lost). A DATA
//! whose slot still holds another live tag is dropped (`collisions`); the hosts' window keeps
//! live tags less than a region apart, so it does not happen in a correct run.

use inalab_core::wire::{Header, RinaHeader, RinaKind};
use inalab_core::{Admission, AdmitError, Endpoint, Packet, Payload, PortId, SwitchAction, SwitchCtx, SwitchProgram, Time};
use std::collections::BTreeMap;

/// Values per packet: ATP's 62, so the INA schemes aggregate alike (spec §1.4, A11).
pub const RINA_VALUES: usize = 62;
/// Switch memory per slot: the values, the tag (q), req, step, chunk, seq, bitmap and state.
pub const RINA_SLOT_BYTES: u64 = 4 * RINA_VALUES as u64 + 4 + 4 + 2 + 2 + 4 + 4 + 4;
/// Members a rack can have: a slot's bitmap is 32 bits (a 32-port Tofino, §VI-A-2).
pub const RINA_MAX_MEMBERS: usize = 32;

/// Slots that fit in `memory_bytes`.
pub fn rina_slots_for(memory_bytes: u64) -> u32 {
    (memory_bytes / RINA_SLOT_BYTES).min(u32::MAX as u64) as u32
}

/// A job's state at its rack's ToR, as the scheme plans it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RinaSwitchJob {
    /// The rack's members, by index: the port toward each and its endpoint. Member 0 is the
    /// agent.
    pub members: Vec<(PortId, Endpoint)>,
    /// The next group's receiver (an agent or an autonomous worker), where AGGs go.
    pub next: Endpoint,
    /// Every worker of the job by rank: after a failure the agent's TASKs name the next
    /// receiver by rank.
    pub ranks: Vec<Endpoint>,
    /// The job's region of the slot array: `(first, len)`.
    pub slots: (u32, u32),
}

#[derive(Debug)]
struct Tenant {
    members: Vec<(PortId, Endpoint)>,
    /// By port: the member's index, or `u8::MAX`.
    member_of: Vec<u8>,
    all: u32,
    /// The members that are alive (all but after a failure): a slot is complete with them.
    live_bits: u32,
    next: Endpoint,
    ranks: Vec<Endpoint>,
    first: u32,
    len: u32,
    /// The epoch of the agent's latest TASK (the top 8 bits of `req`).
    epoch: u8,
}

impl Tenant {
    fn member(&self, port: PortId) -> Option<u8> {
        self.member_of.get(port as usize).copied().filter(|&m| m != u8::MAX)
    }
    fn agent(&self) -> Endpoint {
        self.members[0].1
    }
    fn is_agent(&self, pkt: &Packet) -> bool {
        let a = self.agent();
        pkt.dst == a.host && pkt.dst_port == a.port
    }
}

#[derive(Debug, Clone, Default)]
struct Slot {
    used: bool,
    /// Claimed and not yet acknowledged by the next group.
    live: bool,
    job: u16,
    q: u32,
    bitmap: u32,
    /// The AGG this slot sends: the header of its first DATA, made an AGG.
    hdr: RinaHeader,
    size: u32,
    acc: Option<Vec<i32>>,
}

#[derive(Debug, Default, Clone)]
struct Counters {
    tasks: u64,
    pulls: u64,
    data: u64,
    aggregated: u64,
    aggs: u64,
    acks_freed: u64,
    ack_copies: u64,
    reemitted: u64,
    acks_answered: u64,
    duplicates: u64,
    collisions: u64,
    multicast_copies: u64,
    malformed: u64,
    epochs: u64,
    stale_epoch: u64,
}

/// Rina's program for the ToRs of INA racks (any number of jobs, each with its own region).
pub struct RinaSwitch {
    slots: Vec<Slot>,
    tenants: BTreeMap<u16, Tenant>,
    /// Slots claimed and not yet acknowledged (kept, not counted: drivers ask per packet).
    live: u32,
    c: Counters,
}

/// Whether `a` comes after `b` in the wrapping 32-bit space.
fn after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

fn i32s(pkt: &Packet) -> Option<&[i32]> {
    match pkt.payload.as_deref() {
        Some(Payload::I32(v)) => Some(v),
        _ => None,
    }
}

impl RinaSwitch {
    pub fn new(slots: u32) -> Self {
        RinaSwitch { slots: vec![Slot::default(); slots as usize], tenants: BTreeMap::new(), live: 0, c: Counters::default() }
    }

    /// Where job `id`'s region of `len` slots goes: at `first` if no other job's region meets
    /// it, else at the lowest free range of that length.
    fn place(&self, id: u16, first: u32, len: u32) -> Result<u32, AdmitError> {
        let mut taken: Vec<(u32, u32)> = self.tenants.iter().filter(|&(&j, _)| j != id).map(|(_, t)| (t.first, t.first + t.len)).collect();
        let free = |at: u32, taken: &[(u32, u32)]| taken.iter().all(|&(a, b)| at + len <= a || at >= b);
        if free(first, &taken) {
            return Ok(first);
        }
        taken.sort_unstable();
        let total = self.slots.len() as u64;
        let at = std::iter::once(0).chain(taken.iter().map(|&(_, b)| b)).find(|&at| at as u64 + len as u64 <= total && free(at, &taken));
        at.ok_or_else(|| {
            let held: Vec<String> = self.tenants.iter().map(|(j, t)| format!("job {j}: {}..{}", t.first, t.first + t.len)).collect();
            AdmitError(format!("no free region of {len} slots among the {total} of this switch (held: {}); lower ina.slots or end a Rina job", held.join(", ")))
        })
    }

    /// A copy of `pkt` to every member of the rack, each addressed to it.
    fn copy_to_members(&mut self, t: &Tenant, pkt: &Packet, out: &mut Vec<SwitchAction>) {
        for &(port, ep) in &t.members {
            let mut p = pkt.clone();
            p.dst = ep.host;
            p.dst_port = ep.port;
            self.c.multicast_copies += 1;
            out.push(SwitchAction::Forward { port, pkt: p });
        }
    }

    /// The complete slot's sum, to the next group's receiver (or, when the next group is
    /// this rack, a job of one group, to every member).
    fn emit(&mut self, job: u16, k: usize, out: &mut Vec<SwitchAction>) {
        let t = &self.tenants[&job];
        let s = &self.slots[k];
        let agent = t.agent();
        let mut p = Packet::new(agent.host, agent.port, t.next.host, t.next.port, s.size, Header::Rina(s.hdr));
        p.payload = s.acc.clone().map(|v| Box::new(Payload::I32(v)));
        self.c.aggs += 1;
        if t.members.iter().any(|&(_, ep)| ep == t.next) {
            let t = self.tenants.remove(&job).expect("admitted");
            self.copy_to_members(&t, &p, out);
            self.tenants.insert(job, t);
        } else {
            out.push(SwitchAction::Route { pkt: p });
        }
    }

    fn on_data(&mut self, job: u16, member: u8, h: RinaHeader, pkt: Packet, out: &mut Vec<SwitchAction>) {
        self.c.data += 1;
        let t = &self.tenants[&job];
        let k = (t.first + h.slot % t.len) as usize;
        let bit = 1u32 << member;
        let all = t.live_bits;
        let s = &mut self.slots[k];
        let mine = s.used && s.job == job;
        if mine && s.q == h.slot {
            if s.bitmap & bit != 0 {
                if !s.live {
                    // Freed: only this member's ACK copy was lost.
                    return self.answer_with_ack(job, member, h, pkt, out);
                }
                if s.bitmap == all {
                    // Complete and not acknowledged: the AGG or its ACK was lost.
                    self.c.reemitted += 1;
                    return self.emit(job, k, out);
                }
                self.c.duplicates += 1;
                return out.push(SwitchAction::Drop { pkt, reason: "rina_duplicate" });
            }
        } else if mine && !after(h.slot, s.q) {
            // An older tag than the slot's: the slot moved on, so that DATA was acknowledged.
            return self.answer_with_ack(job, member, h, pkt, out);
        } else if s.used && s.live {
            self.c.collisions += 1;
            return out.push(SwitchAction::Drop { pkt, reason: "rina_slot_busy" });
        } else {
            let mut hdr = h;
            hdr.kind = RinaKind::Agg;
            hdr.flags &= RinaHeader::FULL;
            hdr.member = 0;
            *s = Slot { used: true, live: true, job, q: h.slot, bitmap: 0, hdr, size: pkt.size, acc: None };
            self.live += 1;
        }
        let values = i32s(&pkt);
        match (&mut s.acc, values) {
            // Sticky saturation: a sum beyond the range stays at a rail (inalab_core::rail).
            (Some(acc), Some(v)) if acc.len() == v.len() => _ = inalab_core::rail::sticky_add(acc, v),
            (None, v) if s.bitmap == 0 => s.acc = v.map(<[i32]>::to_vec),
            (None, None) => {}
            _ => {
                self.c.malformed += 1;
                return out.push(SwitchAction::Drop { pkt, reason: "rina_values_do_not_fit" });
            }
        }
        s.bitmap |= bit;
        self.c.aggregated += 1;
        if s.bitmap == all {
            self.emit(job, k, out);
        }
        out.push(SwitchAction::Drop { pkt, reason: "rina_aggregated" });
    }

    /// An ACK for `h`'s DATA straight back to the member that sent it again.
    fn answer_with_ack(&mut self, job: u16, member: u8, h: RinaHeader, pkt: Packet, out: &mut Vec<SwitchAction>) {
        let t = &self.tenants[&job];
        let (port, ep) = t.members[member as usize];
        let agent = t.agent();
        let hdr = RinaHeader { kind: RinaKind::Ack, flags: 0, member, count: 0, ..h };
        let ack = Packet::new(agent.host, agent.port, ep.host, ep.port, ack_bytes(pkt.size, h.count), Header::Rina(hdr));
        self.c.acks_answered += 1;
        out.push(SwitchAction::Drop { pkt, reason: "rina_already_acknowledged" });
        out.push(SwitchAction::Forward { port, pkt: ack });
    }

    /// The next group's ACK of one of this rack's AGGs: frees the slot, copied to every member.
    fn on_ack(&mut self, job: u16, h: RinaHeader, pkt: Packet, out: &mut Vec<SwitchAction>) {
        let t = self.tenants.remove(&job).expect("admitted");
        let k = (t.first + h.slot % t.len) as usize;
        let s = &mut self.slots[k];
        if s.used && s.live && s.job == job && s.q == h.slot {
            s.live = false;
            self.live -= 1;
            // The values are not needed any more: only the tag answers late re-sends.
            s.acc = None;
            self.c.acks_freed += 1;
        }
        self.c.ack_copies += 1;
        self.copy_to_members(&t, &pkt, out);
        self.tenants.insert(job, t);
    }
}

/// Bytes of a packet without values, from a packet of `size` bytes carrying `count` values.
fn ack_bytes(size: u32, count: u16) -> u32 {
    size.saturating_sub(4 * count as u32).max(64)
}

impl SwitchProgram for RinaSwitch {
    fn on_packet(&mut self, now: Time, ctx: &dyn SwitchCtx, in_port: PortId, pkt: Packet, out: &mut Vec<SwitchAction>) {
        let Header::Rina(h) = pkt.header else {
            return out.push(SwitchAction::Route { pkt });
        };
        let Some(t) = self.tenants.get(&h.job) else {
            // Another rack's job, or one not admitted here: plain traffic.
            return out.push(SwitchAction::Route { pkt });
        };
        let member = t.member(in_port);
        let ahead = h.epoch().wrapping_sub(t.epoch) as i8;
        match h.kind {
            RinaKind::Task if member == Some(0) && ahead > 0 => {
                // A new epoch (a worker died): the rack's live members and the next receiver
                // come with it; the old epoch's slots are dropped.
                let full = t.all;
                let next = t.ranks.get(h.seq as usize).copied();
                let (Some(next), true) = (next, h.slot & !full == 0 && h.slot & 1 == 1) else {
                    self.c.malformed += 1;
                    return out.push(SwitchAction::Drop { pkt, reason: "rina_task_names_no_rank" });
                };
                let t = self.tenants.get_mut(&h.job).expect("admitted");
                t.epoch = h.epoch();
                t.live_bits = h.slot;
                t.next = next;
                let (first, len) = (t.first as usize, t.len as usize);
                let region = &mut self.slots[first..first + len];
                self.live -= region.iter().filter(|s| s.live).count() as u32;
                region.iter_mut().for_each(|s| *s = Slot::default());
                self.c.epochs += 1;
                self.on_packet(now, ctx, in_port, pkt, out)
            }
            _ if ahead != 0 && matches!(h.kind, RinaKind::Task | RinaKind::Data) && member.is_some() => {
                self.c.stale_epoch += 1;
                out.push(SwitchAction::Drop { pkt, reason: "rina_stale_epoch" })
            }
            RinaKind::Task if member == Some(0) => {
                self.c.tasks += 1;
                self.c.pulls += t.members.len() as u64;
                let t = self.tenants.remove(&h.job).expect("admitted");
                let pull = Packet { header: Header::Rina(RinaHeader { kind: RinaKind::Pull, ..h }), ..pkt };
                self.copy_to_members(&t, &pull, out);
                self.tenants.insert(h.job, t);
            }
            RinaKind::Data => match member {
                Some(m) if h.count as usize <= RINA_VALUES && i32s(&pkt).is_none_or(|v| v.len() == h.count as usize) => self.on_data(h.job, m, h, pkt, out),
                _ => {
                    self.c.malformed += 1;
                    out.push(SwitchAction::Drop { pkt, reason: "rina_data_not_from_a_member" });
                }
            },
            // To the agent, or (a job of one rack, whose agent acknowledges its own ToR's AGG)
            // to this switch.
            // An ACK of another epoch: its tag may equal a live slot's of this one (tags restart
            // with every epoch), so it must not free that slot.
            RinaKind::Ack if ahead != 0 && (t.is_agent(&pkt) || pkt.dst == ctx.node()) => {
                self.c.stale_epoch += 1;
                out.push(SwitchAction::Drop { pkt, reason: "rina_stale_epoch" })
            }
            RinaKind::Ack if t.is_agent(&pkt) || pkt.dst == ctx.node() => self.on_ack(h.job, h, pkt, out),
            // A finished chunk or an AllGather packet for this rack: every member gets it.
            RinaKind::Agg | RinaKind::Ag if t.is_agent(&pkt) && member.is_none() && (h.kind == RinaKind::Ag || h.has(RinaHeader::FULL)) && !h.has(RinaHeader::REPAIR) => {
                let t = self.tenants.remove(&h.job).expect("admitted");
                self.copy_to_members(&t, &pkt, out);
                self.tenants.insert(h.job, t);
            }
            _ => out.push(SwitchAction::Route { pkt }),
        }
    }

    fn admit(&mut self, job: u32, adm: Admission) -> Result<(), AdmitError> {
        let j = adm.take::<RinaSwitchJob>("rina")?;
        let id = u16::try_from(job).map_err(|_| AdmitError(format!("job id {job} does not fit Rina's 16-bit job (0..=65535)")))?;
        let (first, len) = j.slots;
        if len == 0 || first as u64 + len as u64 > self.slots.len() as u64 {
            return Err(AdmitError(format!("slots {first}..{} are not within the {} slots of this switch", first as u64 + len as u64, self.slots.len())));
        }
        if j.members.len() < 2 || j.members.len() > RINA_MAX_MEMBERS {
            return Err(AdmitError(format!("{} members; a Rina rack has 2..={RINA_MAX_MEMBERS}", j.members.len())));
        }
        let top = j.members.iter().map(|&(p, _)| p as usize).max().unwrap_or(0);
        let mut member_of = vec![u8::MAX; top + 1];
        for (m, &(p, _)) in j.members.iter().enumerate() {
            if member_of[p as usize] != u8::MAX {
                return Err(AdmitError(format!("port {p} is named for two members")));
            }
            member_of[p as usize] = m as u8;
        }
        let all = if j.members.len() == 32 { u32::MAX } else { (1u32 << j.members.len()) - 1 };
        let first = self.place(id, first, len)?;
        if j.ranks.len() < j.members.len() || !j.members.iter().all(|(_, m)| j.ranks.contains(m)) || !j.ranks.contains(&j.next) {
            return Err(AdmitError("the ranks must list every member and the next receiver".into()));
        }
        self.tenants.insert(id, Tenant { members: j.members, member_of, all, live_bits: all, next: j.next, ranks: j.ranks, first, len, epoch: 0 });
        Ok(())
    }

    fn release(&mut self, job: u32) -> u32 {
        let Ok(id) = u16::try_from(job) else { return 0 };
        let Some(t) = self.tenants.remove(&id) else { return 0 };
        let region = &mut self.slots[t.first as usize..(t.first + t.len) as usize];
        let live = region.iter().filter(|s| s.live).count() as u32;
        self.live -= live;
        region.iter_mut().for_each(|s| *s = Slot::default());
        live
    }

    /// A member's data packet of the current epoch is summed into the rack's slot; tasks,
    /// ACKs and the AllGather copies go through the multicast engine at line rate.
    fn processes(&self, _ctx: &dyn SwitchCtx, in_port: PortId, pkt: &Packet) -> bool {
        let Header::Rina(h) = pkt.header else { return false };
        h.kind == RinaKind::Data && self.tenants.get(&h.job).is_some_and(|t| t.member(in_port).is_some() && h.epoch() == t.epoch)
    }

    fn job_of(&self, pkt: &Packet) -> Option<u32> {
        match pkt.header {
            Header::Rina(h) => Some(h.job as u32),
            _ => None,
        }
    }

    fn aggregators_in_use(&self) -> u32 {
        self.live
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = &self.c;
        vec![
            ("tasks", c.tasks),
            ("pulls", c.pulls),
            ("data", c.data),
            ("aggregated", c.aggregated),
            ("aggs", c.aggs),
            ("acks_freed", c.acks_freed),
            ("ack_copies", c.ack_copies),
            ("reemitted", c.reemitted),
            ("acks_answered", c.acks_answered),
            ("duplicates", c.duplicates),
            ("collisions", c.collisions),
            ("multicast_copies", c.multicast_copies),
            ("malformed", c.malformed),
            ("epochs", c.epochs),
            ("stale_epoch", c.stale_epoch),
            ("slots_in_use", self.aggregators_in_use() as u64),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inalab_testkit::IdleCtx;

    fn switch() -> RinaSwitch {
        let mut sw = RinaSwitch::new(64);
        let ep = |h| Endpoint { host: h, port: 1 };
        let job = RinaSwitchJob { members: vec![(0, ep(0)), (1, ep(1)), (2, ep(2))], next: ep(5), ranks: (0..6).map(ep).collect(), slots: (8, 16) };
        sw.admit(3, Admission::new(job)).unwrap();
        sw
    }

    fn data(member: u8, slot: u32, values: Vec<i32>) -> Packet {
        let h = RinaHeader { kind: RinaKind::Data, member, job: 3, count: values.len() as u16, slot, ..Default::default() };
        let mut p = Packet::new(member as u32, 1, 9, 1, 300, Header::Rina(h));
        p.payload = Some(Box::new(Payload::I32(values)));
        p
    }

    #[test]
    fn a_rack_is_summed_once_and_acknowledged_back_to_every_member() {
        let (mut sw, ctx, mut out) = (switch(), IdleCtx { node: 9, ports: 4 }, vec![]);
        for m in 0..3u8 {
            sw.on_packet(0, &ctx, m as PortId, data(m, 100, vec![m as i32 + 1; 62]), &mut out);
        }
        let agg: Vec<&Packet> = out.iter().filter_map(|a| match a { SwitchAction::Route { pkt } => Some(pkt), _ => None }).collect();
        assert_eq!(agg.len(), 1);
        assert_eq!((agg[0].dst, agg[0].src), (5, 0), "to the next group, as if from the agent");
        assert_eq!(agg[0].payload.as_deref(), Some(&Payload::I32(vec![6; 62])));
        assert_eq!(sw.aggregators_in_use(), 1);
        // A member's re-send while the AGG is unacknowledged: the AGG again.
        out.clear();
        sw.on_packet(1, &ctx, 1, data(1, 100, vec![2; 62]), &mut out);
        assert!(out.iter().any(|a| matches!(a, SwitchAction::Route { pkt } if pkt.dst == 5)));
        // The next group's ACK frees the slot and reaches every member.
        out.clear();
        let ack = Packet::new(5, 1, 0, 1, 71, Header::Rina(RinaHeader { kind: RinaKind::Ack, job: 3, slot: 100, ..Default::default() }));
        sw.on_packet(2, &ctx, 3, ack, &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(sw.aggregators_in_use(), 0);
        // A member that lost its copy and sends again is answered with an ACK, not summed.
        out.clear();
        sw.on_packet(3, &ctx, 2, data(2, 100, vec![3; 62]), &mut out);
        assert!(out.iter().any(|a| matches!(a, SwitchAction::Forward { port: 2, pkt } if matches!(pkt.header, Header::Rina(h) if h.kind == RinaKind::Ack))));
        assert_eq!((sw.aggregators_in_use(), sw.c.aggregated), (0, 3));
    }

    /// Two jobs planned at the same region (as the runtime plans every job): the second is
    /// placed beside the first, equal tags are summed apart, and a third finds no room.
    #[test]
    fn jobs_planned_at_one_region_are_placed_apart_and_never_summed_together() {
        let (mut sw, ctx, mut out) = (switch(), IdleCtx { node: 9, ports: 4 }, vec![]);
        let ep = |h| Endpoint { host: h, port: 2 };
        let other = RinaSwitchJob { members: vec![(0, ep(0)), (1, ep(1)), (2, ep(2))], next: ep(6), ranks: (0..7).map(ep).collect(), slots: (8, 16) };
        sw.admit(4, Admission::new(other.clone())).unwrap();
        assert_eq!((sw.tenants[&3].first, sw.tenants[&4].first), (8, 24), "the lowest free range");
        for m in 0..3u8 {
            for job in [3u16, 4] {
                let mut p = data(m, 7, vec![job as i32 * 10 + m as i32; 62]);
                let Header::Rina(h) = &mut p.header else { unreachable!() };
                h.job = job;
                sw.on_packet(0, &ctx, m as PortId, p, &mut out);
            }
        }
        let sums: Vec<(u32, Option<&Payload>)> = out.iter().filter_map(|a| match a { SwitchAction::Route { pkt } => Some((pkt.dst, pkt.payload.as_deref())), _ => None }).collect();
        assert_eq!(sums, vec![(5, Some(&Payload::I32(vec![93; 62]))), (6, Some(&Payload::I32(vec![123; 62])))]);
        assert_eq!((sw.aggregators_in_use(), sw.c.collisions), (2, 0));
        let err = sw.admit(5, Admission::new(RinaSwitchJob { slots: (0, 48), ..other })).unwrap_err();
        assert!(err.0.contains("no free region of 48 slots among the 64") && err.0.contains("job 4: 24..40"), "{}", err.0);
        // A released job's region is free again.
        sw.release(4);
        assert_eq!(sw.aggregators_in_use(), 1);
        sw.admit(5, Admission::new(RinaSwitchJob { members: vec![(0, ep(0)), (1, ep(1))], next: ep(6), ranks: (0..7).map(ep).collect(), slots: (8, 8) })).unwrap();
        assert_eq!(sw.tenants[&5].first, 0);
    }

    /// After a failure (a new epoch) tags restart at 0: a late ACK of the old epoch must not
    /// free a slot of the new one that is still collecting.
    #[test]
    fn an_old_epoch_ack_does_not_free_a_new_epoch_slot() {
        let (mut sw, ctx, mut out) = (switch(), IdleCtx { node: 9, ports: 4 }, vec![]);
        let epoch1 = 1 << RinaHeader::EPOCH_SHIFT;
        let task = RinaHeader { kind: RinaKind::Task, job: 3, req: epoch1, slot: 0b111, seq: 5, arg: 1, ..Default::default() };
        sw.on_packet(0, &ctx, 0, Packet::new(0, 1, 9, 1, 71, Header::Rina(task)), &mut out);
        assert_eq!(sw.c.epochs, 1);
        let mut d = data(0, 0, vec![1; 62]);
        let Header::Rina(h) = &mut d.header else { unreachable!() };
        h.req = epoch1;
        sw.on_packet(1, &ctx, 0, d, &mut out);
        assert_eq!(sw.aggregators_in_use(), 1);
        let stale = Packet::new(5, 1, 0, 1, 71, Header::Rina(RinaHeader { kind: RinaKind::Ack, job: 3, slot: 0, ..Default::default() }));
        sw.on_packet(2, &ctx, 3, stale, &mut out);
        assert_eq!((sw.aggregators_in_use(), sw.c.acks_freed, sw.c.stale_epoch), (1, 0, 1));
    }

    /// Forged and garbled packets from every port: counted or routed, never a panic. (A member
    /// port that forges DATA tags can hold slots; the real runtime authenticates its hosts.)
    #[test]
    fn hostile_packets_never_panic() {
        let (mut sw, ctx, mut out) = (switch(), IdleCtx { node: 9, ports: 8 }, vec![]);
        let mut x = 7u64;
        for t in 0..50_000u64 {
            x = inalab_core::splitmix64(x);
            let h = RinaHeader {
                kind: RinaKind::ALL[(x % 8) as usize],
                flags: (x >> 3) as u8 & 0x0F,
                member: (x >> 7) as u8,
                job: if x >> 15 & 3 == 0 { 4 } else { 3 },
                count: (x >> 17) as u16 % 80,
                slot: (x >> 24) as u32,
                ..Default::default()
            };
            let mut p = Packet::new((x >> 56) as u32 % 8, 1, (x >> 60) as u32 % 10, 1, 300, Header::Rina(h));
            if x >> 40 & 1 == 0 {
                p.payload = Some(Box::new(Payload::I32(vec![1; (x >> 41) as usize % 80])));
            }
            sw.on_packet(t, &ctx, (x >> 50) as PortId % 8, p, &mut out);
            out.clear();
        }
        assert!(sw.c.malformed > 0);
    }
}
