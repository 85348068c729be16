//! Canary's switch program (De Sensi et al.; `../shared/specs/canary.md` §1.3-1.9), the same
//! on every switch. A table of soft-state descriptors, indexed by a hash of the block id (or a
//! static slice per tenant), sums the Reduce packets of a block that arrive within a window
//! from its first, records their ingress ports as the block's children, and sends the partial
//! sum on toward the block's leader when the window closes (or at once when every host is in).
//! The leader's Result comes back down the recorded children and frees the descriptors it
//! passes. A packet whose slot holds another id is a collision: it goes to the leader with
//! the bypass bit and this switch's address and port, so the leader can restore the subtree.

use inalab_core::wire::{CanaryHeader, CanaryType, Header};
use inalab_core::{splitmix64, Admission, AdmitError, Packet, Payload, PortId, SwitchAction, SwitchCtx, SwitchProgram, Time, TimerToken};
use crate::Pool;
use std::collections::BTreeMap;

/// Values per Canary packet in the simulations (§5.1: 256 x 4 B).
pub const CANARY_VALUES: usize = 256;
/// Switch memory per descriptor: 1024 B of values + id, leader, counter, hosts, a 128-port
/// children bitmap and a timestamp (spec §1.3).
pub const CANARY_DESCRIPTOR_BYTES: u64 = 1024 + 4 + 4 + 2 + 2 + 16 + 8;
/// Ports a descriptor's children bitmap covers (4 shards of 32 on a Restore).
pub const CANARY_MAX_PORTS: usize = 128;

#[derive(Debug, Clone, PartialEq)]
pub struct CanarySwitchConfig {
    pub descriptors: u32,
    /// Salt of the descriptor hash (the driver's, so a run is reproducible).
    pub seed: u64,
}

impl CanarySwitchConfig {
    /// Descriptors that fit in `memory_bytes`.
    pub fn descriptors_for(memory_bytes: u64) -> u32 {
        (memory_bytes / CANARY_DESCRIPTOR_BYTES).min(u32::MAX as u64) as u32
    }
}

/// A tenant's settings at a switch (its job id is the tenant prefix of its block ids).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanarySwitchJob {
    /// The aggregation window from a block's first packet, ps (§3.1.1).
    pub timeout_ps: Time,
    /// A flushed descriptor whose Result has not passed this long after its flush is freed
    /// (spec A12: its Result was lost or its block re-issued), and one this old may be taken
    /// over by another id, ps.
    pub stale_ps: Time,
    /// Static slice of the table `(first, len)` (§3.2.1, Fig. 10), or `None` to hash over it.
    pub slice: Option<(u32, u32)>,
    /// Canary's own load balancer: the up port toward a leader is chosen by its address, the
    /// same at every switch, unless that port has more than this queued; then the least
    /// queued (§5.2), bytes. None: the network's routing for every packet, as in the paper's
    /// SST network (`SwitchCtx::route_toward`: its default-port rule and adaptive threshold).
    pub reroute_bytes: Option<u64>,
}

#[derive(Debug, Clone)]
struct Descriptor {
    id: u32,
    /// Where its flush goes: the leader's host and protocol port.
    dst: u32,
    dst_port: u16,
    src_port: u16,
    acc: Option<Vec<i32>>,
    counter: u16,
    hosts: u16,
    children: u128,
    /// Timer generation: a timer whose token names an older one is stale.
    generation: u32,
    /// Its job's `stale_ps`.
    stale_ps: Time,
    flushed: bool,
    since: Time,
    size: u32,
}

#[derive(Debug, Default, Clone)]
struct Counters {
    reduces: u64,
    allocated: u64,
    aggregated: u64,
    flushed_by_timer: u64,
    flushed_early: u64,
    stragglers: u64,
    collisions: u64,
    stale_evictions: u64,
    stale_expired: u64,
    results: u64,
    result_no_descriptor: u64,
    restores: u64,
    multicast_copies: u64,
    rerouted: u64,
    malformed: u64,
    freed: u64,
    held_ps: u64,
}

pub struct CanarySwitch {
    table: Pool<Descriptor>,
    /// Per slot, the generation of its latest descriptor (kept when the slot is freed).
    generations: Vec<u32>,
    jobs: BTreeMap<u8, CanarySwitchJob>,
    seed: u64,
    c: Counters,
}

/// Timer tokens: slot << 33 | kind << 32 | generation.
const WINDOW: u64 = 0;
const EXPIRY: u64 = 1;

fn token(slot: usize, kind: u64, generation: u32) -> TimerToken {
    (slot as u64) << 33 | kind << 32 | generation as u64
}

fn bits(children: u128) -> impl Iterator<Item = PortId> {
    (0..CANARY_MAX_PORTS as PortId).filter(move |&p| children >> p & 1 == 1)
}

impl CanarySwitch {
    pub fn new(cfg: CanarySwitchConfig) -> Self {
        CanarySwitch { table: Pool::new(cfg.descriptors), generations: vec![0; cfg.descriptors as usize], jobs: BTreeMap::new(), seed: cfg.seed, c: Counters::default() }
    }

    /// The slot of block `id` of tenant `job`.
    pub fn slot(&self, job: &CanarySwitchJob, h: &CanaryHeader) -> usize {
        match job.slice {
            Some((first, len)) => (first + h.seq() % len.max(1)) as usize,
            None => (splitmix64(h.id as u64 ^ self.seed) % self.table.len().max(1) as u64) as usize,
        }
    }

    fn free(&mut self, now: Time, i: usize) -> Option<Descriptor> {
        let d = self.table.take(i)?;
        self.c.freed += 1;
        self.c.held_ps += now.saturating_sub(d.since);
        Some(d)
    }

    /// Sends descriptor `i`'s partial sum on toward the leader and marks it flushed.
    fn flush(&mut self, now: Time, ctx: &dyn SwitchCtx, i: usize, out: &mut Vec<SwitchAction>) {
        let d = self.table.get_mut(i).expect("flushing a held descriptor");
        d.flushed = true;
        out.push(SwitchAction::SetTimer { at: now + d.stale_ps, token: token(i, EXPIRY, d.generation) });
        let h = CanaryHeader { dst: d.dst, id: d.id, counter: d.counter, hosts: d.hosts, kind: CanaryType::Reduce, ..Default::default() };
        let mut pkt = Packet::new(ctx.node(), d.src_port, d.dst, d.dst_port, d.size, Header::Canary(h));
        // The partial sum stays until the Result passes (stragglers and the broadcast need
        // the descriptor), so the packet carries a copy.
        pkt.payload = d.acc.clone().map(|v| Box::new(Payload::I32(v)));
        out.push(self.toward_leader(ctx, pkt));
    }

    /// Canary's load balancer (§5.2, spec A23): among the shortest-path ports toward the
    /// leader, the one its address picks, so a block's partial sums from different switches
    /// meet at one switch above them, unless that port's queue is above the job's threshold,
    /// then the least queued port; or, for a job that routes by the network's rule, the port
    /// the network gives (the same choice made with the network's rule and threshold). One
    /// port (or none known): the driver's routing.
    fn toward_leader(&mut self, ctx: &dyn SwitchCtx, pkt: Packet) -> SwitchAction {
        let hops = ctx.next_hops(pkt.dst);
        let reroute = match &pkt.header {
            Header::Canary(h) => self.jobs.get(&h.tenant()).map_or(Some(u64::MAX), |j| j.reroute_bytes),
            _ => Some(u64::MAX),
        };
        if hops.len() < 2 {
            return SwitchAction::Route { pkt };
        }
        let (port, moved) = match reroute.map_or_else(|| ctx.route_toward(pkt.dst), |_| None) {
            Some(routed) => routed,
            None => {
                let default = hops[(splitmix64(pkt.dst as u64) % hops.len() as u64) as usize];
                let limit = reroute.unwrap_or(u64::MAX);
                let port = if ctx.queue_bytes(default) <= limit { default } else { hops.iter().copied().min_by_key(|&p| ctx.queue_bytes(p)).unwrap_or(default) };
                (port, port != default)
            }
        };
        if moved {
            self.c.rerouted += 1;
        }
        SwitchAction::Forward { port, pkt }
    }

    fn on_reduce(&mut self, now: Time, ctx: &dyn SwitchCtx, in_port: PortId, h: CanaryHeader, mut pkt: Packet, out: &mut Vec<SwitchAction>) {
        self.c.reduces += 1;
        let Some(job) = self.jobs.get(&h.tenant()) else {
            return out.push(SwitchAction::Route { pkt });
        };
        let values = match pkt.payload.as_deref() {
            None => None,
            Some(Payload::I32(v)) if v.len() <= CANARY_VALUES => Some(v.len()),
            Some(_) => {
                self.c.malformed += 1;
                return out.push(SwitchAction::Drop { pkt, reason: "canary_malformed" });
            }
        };
        let (i, stale_ps, timeout_ps) = (self.slot(job, &h), job.stale_ps, job.timeout_ps);
        if in_port as usize >= CANARY_MAX_PORTS || i >= self.table.len() as usize {
            // No child bit for this port (or no table): pass it on unsummed, as a collision.
            return self.collide(ctx, in_port, h, pkt, out);
        }
        let stale = self.table.get(i).is_some_and(|d| d.id != h.id && d.flushed && now.saturating_sub(d.since) >= stale_ps);
        if stale {
            self.free(now, i);
            self.c.stale_evictions += 1;
        }
        match self.table.get_mut(i) {
            None => {
                self.c.allocated += 1;
                self.generations[i] = self.generations[i].wrapping_add(1);
                let generation = self.generations[i];
                let acc = match pkt.payload.take().map(|b| *b) {
                    Some(Payload::I32(v)) => Some(v),
                    _ => None,
                };
                self.table.insert(i, Descriptor { id: h.id, dst: h.dst, dst_port: pkt.dst_port, src_port: pkt.src_port, acc, counter: h.counter, hosts: h.hosts, children: 1 << in_port, generation, stale_ps, flushed: false, since: now, size: pkt.size });
                out.push(SwitchAction::SetTimer { at: now + timeout_ps, token: token(i, WINDOW, generation) });
            }
            Some(d) if d.id == h.id && !d.flushed => {
                let fits = d.hosts == h.hosts && d.counter as u32 + h.counter as u32 <= h.hosts as u32 && d.acc.as_ref().map(Vec::len) == values;
                if !fits {
                    self.c.malformed += 1;
                    return out.push(SwitchAction::Drop { pkt, reason: "canary_malformed" });
                }
                if let (Some(acc), Some(Payload::I32(v))) = (&mut d.acc, pkt.payload.as_deref()) {
                    // Sticky saturation: a sum beyond the range stays at a rail (inalab_core::rail).
                    inalab_core::rail::sticky_add(acc, v);
                }
                d.counter += h.counter;
                d.children |= 1 << in_port;
                self.c.aggregated += 1;
            }
            Some(d) if d.id == h.id => {
                // A straggler: the window closed. It goes on unsummed (§3.1.1), and its port
                // is a child, so the Result reaches it.
                d.children |= 1 << in_port;
                self.c.stragglers += 1;
                return out.push(self.toward_leader(ctx, pkt));
            }
            Some(_) => return self.collide(ctx, in_port, h, pkt, out),
        }
        if self.table.get(i).is_some_and(|d| d.counter == d.hosts) {
            self.c.flushed_early += 1;
            self.flush(now, ctx, i, out);
        }
        out.push(SwitchAction::Drop { pkt, reason: "canary_aggregated" });
    }

    /// The slot holds another block: bypass to the leader with this switch and port (§3.2.1).
    fn collide(&mut self, ctx: &dyn SwitchCtx, in_port: PortId, h: CanaryHeader, mut pkt: Packet, out: &mut Vec<SwitchAction>) {
        self.c.collisions += 1;
        pkt.header = Header::Canary(CanaryHeader { bypass: true, switch: ctx.node() as u16, children: in_port as u32, ..h });
        out.push(self.toward_leader(ctx, pkt));
    }

    fn on_result(&mut self, now: Time, h: CanaryHeader, pkt: Packet, out: &mut Vec<SwitchAction>) {
        let Some(job) = self.jobs.get(&h.tenant()) else {
            return out.push(SwitchAction::Route { pkt });
        };
        let i = self.slot(job, &h);
        if self.table.get(i).is_none_or(|d| d.id != h.id) {
            // Cut off by a collision (the leader restores that subtree) or a second copy that
            // came through another parent (spec A31).
            self.c.result_no_descriptor += 1;
            return out.push(SwitchAction::Drop { pkt, reason: "canary_result_no_descriptor" });
        }
        let d = self.free(now, i).expect("checked");
        self.c.results += 1;
        self.multicast(d.children, pkt, out);
    }

    fn multicast(&mut self, children: u128, pkt: Packet, out: &mut Vec<SwitchAction>) {
        let ports: Vec<PortId> = bits(children).collect();
        self.c.multicast_copies += ports.len() as u64;
        out.push(SwitchAction::Multicast { ports, pkt });
    }
}

impl SwitchProgram for CanarySwitch {
    fn on_packet(&mut self, now: Time, ctx: &dyn SwitchCtx, in_port: PortId, mut pkt: Packet, out: &mut Vec<SwitchAction>) {
        let Header::Canary(h) = pkt.header else {
            return out.push(SwitchAction::Route { pkt });
        };
        match h.kind {
            // A restoration for this switch: multicast on the ports it names (§3.2.1).
            CanaryType::Restore if h.bypass && h.dst == ctx.node() && h.shard < CanaryHeader::SHARDS => {
                self.c.restores += 1;
                // Only ports this switch has (a forged bitmap names others).
                let ports = ctx.num_ports().min(CANARY_MAX_PORTS);
                let mask = if ports == CANARY_MAX_PORTS { u128::MAX } else { (1u128 << ports) - 1 };
                let children = ((h.children as u128) << (32 * h.shard as u32)) & mask;
                pkt.header = Header::Canary(CanaryHeader { bypass: false, kind: CanaryType::Result, ..h });
                self.multicast(children, pkt, out)
            }
            CanaryType::Restore if h.bypass && h.dst == ctx.node() => {
                self.c.malformed += 1;
                out.push(SwitchAction::Drop { pkt, reason: "canary_malformed" })
            }
            // A restoration for another switch: hosts route by host addresses only, so the
            // program steers it toward the switch, on the least loaded shortest-path port.
            CanaryType::Restore if h.bypass => match ctx.next_hops(h.dst).iter().copied().min_by_key(|&p| ctx.queue_bytes(p)) {
                Some(port) => out.push(SwitchAction::Forward { port, pkt }),
                None => out.push(SwitchAction::Drop { pkt, reason: "canary_no_route_to_switch" }),
            },
            _ if h.bypass => out.push(SwitchAction::Route { pkt }),
            CanaryType::Result if h.multicast => self.on_result(now, h, pkt, out),
            CanaryType::Reduce if !h.multicast && h.counter >= 1 => self.on_reduce(now, ctx, in_port, h, pkt, out),
            CanaryType::Reduce | CanaryType::Result => {
                self.c.malformed += 1;
                out.push(SwitchAction::Drop { pkt, reason: "canary_malformed" })
            }
            _ => out.push(SwitchAction::Route { pkt }),
        }
    }

    fn on_timer(&mut self, now: Time, ctx: &dyn SwitchCtx, token: TimerToken, out: &mut Vec<SwitchAction>) {
        let (i, kind, generation) = ((token >> 33) as usize, token >> 32 & 1, token as u32);
        let Some(d) = self.table.get(i).filter(|d| d.generation == generation) else { return };
        match (kind, d.flushed) {
            (WINDOW, false) => {
                self.c.flushed_by_timer += 1;
                self.flush(now, ctx, i, out);
            }
            (EXPIRY, true) => {
                self.c.stale_expired += 1;
                self.free(now, i);
            }
            _ => {}
        }
    }

    fn admit(&mut self, job: u32, adm: Admission) -> Result<(), AdmitError> {
        let j = adm.take::<CanarySwitchJob>("canary")?;
        let tenant = u8::try_from(job).map_err(|_| AdmitError(format!("job id {job} does not fit Canary's 8-bit tenant prefix (0..=255)")))?;
        if let Some((first, len)) = j.slice {
            if len == 0 || first as u64 + len as u64 > self.table.len() as u64 {
                return Err(AdmitError(format!("slice {first}..{} is not within the {} descriptors", first as u64 + len as u64, self.table.len())));
            }
        }
        self.jobs.insert(tenant, j);
        Ok(())
    }

    fn release(&mut self, job: u32) -> u32 {
        let Ok(tenant) = u8::try_from(job) else { return 0 };
        self.jobs.remove(&tenant);
        self.table.free_where(|d| (d.id >> (CanaryHeader::ATTEMPT_BITS + CanaryHeader::SEQ_BITS)) as u8 == tenant)
    }

    /// A reduce packet is aggregated here (or starts a descriptor); results are replicated by
    /// the multicast engine and bypass packets are transit, both at line rate.
    fn processes(&self, _ctx: &dyn SwitchCtx, _in_port: PortId, pkt: &Packet) -> bool {
        matches!(&pkt.header, Header::Canary(h) if h.kind == CanaryType::Reduce && !h.bypass && !h.multicast && h.counter >= 1)
    }

    fn job_of(&self, pkt: &Packet) -> Option<u32> {
        match &pkt.header {
            Header::Canary(h) => Some(h.tenant() as u32),
            _ => None,
        }
    }

    fn aggregators_in_use(&self) -> u32 {
        self.table.in_use()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = &self.c;
        vec![
            ("reduces", c.reduces),
            ("allocated", c.allocated),
            ("aggregated", c.aggregated),
            ("flushed_by_timer", c.flushed_by_timer),
            ("flushed_early", c.flushed_early),
            ("stragglers", c.stragglers),
            ("collisions", c.collisions),
            ("stale_evictions", c.stale_evictions),
            ("stale_expired", c.stale_expired),
            ("results", c.results),
            ("result_no_descriptor", c.result_no_descriptor),
            ("restores", c.restores),
            ("multicast_copies", c.multicast_copies),
            ("rerouted", c.rerouted),
            ("malformed", c.malformed),
            ("descriptors_freed", c.freed),
            ("occupation_ps_total", c.held_ps),
        ]
    }
}

/// Spec §2 cases at one switch: 1 (happy path), 3 (straggler), 4 (early flush), 5 (second
/// Result), 6 (collision bypass), 13 (tenants apart), 14 (stale descriptor), Restore.
#[cfg(test)]
mod tests {
    use super::*;
    use inalab_testkit::IdleCtx;

    const CTX: IdleCtx = IdleCtx { node: 100, ports: 8 };
    const LEADER: u32 = 9;
    const T: Time = 1_000_000;

    fn switch(descriptors: u32, slice: Option<(u32, u32)>) -> CanarySwitch {
        let mut s = CanarySwitch::new(CanarySwitchConfig { descriptors, seed: 3 });
        for tenant in [1, 2] {
            s.admit(tenant, Admission::new(CanarySwitchJob { timeout_ps: T, stale_ps: 100 * T, slice, reroute_bytes: Some(1 << 19) })).unwrap();
        }
        s
    }

    fn reduce(tenant: u8, seq: u32, counter: u16, hosts: u16, v: i32) -> Packet {
        let h = CanaryHeader { dst: LEADER, id: CanaryHeader::make_id(tenant, 0, seq), counter, hosts, ..Default::default() };
        let mut p = Packet::new(1, 7, LEADER, 7, 1081, Header::Canary(h));
        p.payload = Some(Box::new(Payload::I32(vec![v; 4])));
        p
    }

    fn result(tenant: u8, seq: u32) -> Packet {
        let h = CanaryHeader { dst: LEADER, id: CanaryHeader::make_id(tenant, 0, seq), counter: 3, hosts: 3, multicast: true, kind: CanaryType::Result, ..Default::default() };
        Packet::new(LEADER, 7, 100, 7, 1081, Header::Canary(h))
    }

    fn run(s: &mut CanarySwitch, now: Time, port: PortId, p: Packet) -> Vec<SwitchAction> {
        let mut out = vec![];
        s.on_packet(now, &CTX, port, p, &mut out);
        out
    }

    fn timer(out: &[SwitchAction]) -> TimerToken {
        out.iter().find_map(|a| if let SwitchAction::SetTimer { token, .. } = a { Some(*token) } else { None }).expect("a timer")
    }

    /// The routed packets' (counter, first value, bypass).
    fn routed(out: &[SwitchAction]) -> Vec<(u16, i32, bool)> {
        out.iter()
            .filter_map(|a| match a {
                SwitchAction::Route { pkt } => match (&pkt.header, pkt.payload.as_deref()) {
                    (Header::Canary(h), Some(Payload::I32(v))) => Some((h.counter, v[0], h.bypass)),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    fn multicast_ports(out: &[SwitchAction]) -> Vec<PortId> {
        out.iter().find_map(|a| if let SwitchAction::Multicast { ports, .. } = a { Some(ports.clone()) } else { None }).unwrap_or_default()
    }

    fn counter(s: &CanarySwitch, name: &str) -> u64 {
        s.counters().into_iter().find(|c| c.0 == name).expect(name).1
    }

    #[test]
    fn sums_within_the_window_flushes_early_and_multicasts_the_result() {
        let mut s = switch(64, None);
        let out = run(&mut s, 0, 0, reduce(1, 5, 1, 3, 10));
        let token = timer(&out);
        assert!(routed(&out).is_empty());
        assert!(routed(&run(&mut s, 10, 2, reduce(1, 5, 1, 3, 20))).is_empty());
        // The third completes the count: flushed at once, before the window ends (case 4).
        assert_eq!(routed(&run(&mut s, 20, 3, reduce(1, 5, 1, 3, 30))), vec![(3, 60, false)]);
        assert_eq!(counter(&s, "flushed_early"), 1);
        // The window's timer then finds it flushed and does nothing.
        let mut out = vec![];
        s.on_timer(T, &CTX, token, &mut out);
        assert!(out.is_empty());
        // The Result goes down the three children and frees the descriptor (case 1).
        assert_eq!(multicast_ports(&run(&mut s, 50, 7, result(1, 5))), vec![0, 2, 3]);
        assert_eq!(s.aggregators_in_use(), 0);
        // A second copy through another parent finds none and is dropped (case 5).
        assert!(multicast_ports(&run(&mut s, 60, 6, result(1, 5))).is_empty());
        assert_eq!(counter(&s, "result_no_descriptor"), 1);
    }

    #[test]
    fn the_window_closes_and_a_straggler_passes_unsummed_but_is_a_child() {
        let mut s = switch(64, None);
        let token = timer(&run(&mut s, 0, 0, reduce(1, 5, 1, 3, 10)));
        run(&mut s, 10, 1, reduce(1, 5, 1, 3, 20));
        let mut out = vec![];
        s.on_timer(T, &CTX, token, &mut out);
        assert_eq!(routed(&out), vec![(2, 30, false)]);
        // Case 3: the late one goes on as it came, and its port joins the children.
        assert_eq!(routed(&run(&mut s, T + 5, 4, reduce(1, 5, 1, 3, 40))), vec![(1, 40, false)]);
        assert_eq!(counter(&s, "stragglers"), 1);
        assert_eq!(multicast_ports(&run(&mut s, 2 * T, 7, result(1, 5))), vec![0, 1, 4]);
    }

    #[test]
    fn a_collision_bypasses_to_the_leader_with_switch_and_port_and_a_restore_multicasts() {
        let mut s = switch(1, None);
        run(&mut s, 0, 0, reduce(1, 5, 1, 3, 10));
        let out = run(&mut s, 1, 6, reduce(1, 6, 1, 3, 20));
        let Some(SwitchAction::Route { pkt }) = out.first() else { panic!("{out:?}") };
        let Header::Canary(h) = pkt.header else { panic!() };
        assert!(h.bypass && h.switch == 100 && h.children == 6 && h.counter == 1);
        assert_eq!(counter(&s, "collisions"), 1);
        // Later switches pass a bypassed packet on untouched.
        let mut other = switch(1, None);
        assert_eq!(routed(&run(&mut other, 2, 0, pkt.clone())), vec![(1, 20, true)]);
        assert_eq!(other.aggregators_in_use(), 0);
        // The leader's Restore for this switch multicasts on the ports it names, as a Result.
        let rh = CanaryHeader { dst: 100, id: CanaryHeader::make_id(1, 0, 6), kind: CanaryType::Restore, bypass: true, multicast: true, children: 1 << 6, shard: 0, ..Default::default() };
        let out = run(&mut s, 3, 7, Packet::new(LEADER, 7, 100, 7, 1081, Header::Canary(rh)));
        assert_eq!(multicast_ports(&out), vec![6]);
        assert_eq!(counter(&s, "restores"), 1);
        assert_eq!(s.aggregators_in_use(), 1, "the other block's descriptor is untouched");
    }

    #[test]
    fn tenants_never_mix_and_static_slices_never_collide() {
        // Same sequence number, different tenants: different ids, never summed together.
        let mut s = switch(4, Some((0, 2)));
        s.jobs.get_mut(&2).unwrap().slice = Some((2, 2));
        run(&mut s, 0, 0, reduce(1, 5, 1, 2, 10));
        run(&mut s, 0, 1, reduce(2, 5, 1, 2, 20));
        assert_eq!(routed(&run(&mut s, 1, 2, reduce(1, 5, 1, 2, 1))), vec![(2, 11, false)]);
        assert_eq!(routed(&run(&mut s, 1, 3, reduce(2, 5, 1, 2, 2))), vec![(2, 22, false)]);
        assert_eq!(counter(&s, "collisions"), 0);
        assert!(s.admit(3, Admission::new(CanarySwitchJob { timeout_ps: T, stale_ps: T, slice: Some((3, 2)), reroute_bytes: Some(0) })).is_err(), "beyond the table");
        assert!(s.admit(300, Admission::new(CanarySwitchJob { timeout_ps: T, stale_ps: T, slice: None, reroute_bytes: Some(0) })).is_err(), "beyond 8 bits");
    }

    #[test]
    fn a_stale_flushed_descriptor_is_taken_over() {
        let mut s = switch(1, None);
        let token = timer(&run(&mut s, 0, 0, reduce(1, 5, 1, 3, 10)));
        let mut out = vec![];
        s.on_timer(T, &CTX, token, &mut out);
        // Its Result never comes (re-issued elsewhere): after stale_ps another id takes it.
        assert!(routed(&run(&mut s, 50 * T, 1, reduce(1, 6, 1, 3, 1)))[0].2, "still a collision before");
        assert!(routed(&run(&mut s, 101 * T, 1, reduce(1, 6, 1, 3, 1))).is_empty());
        assert_eq!(counter(&s, "stale_evictions"), 1);
        // Flushed and never answered, a descriptor expires by itself.
        let mut s2 = switch(1, None);
        let flush = run(&mut s2, 0, 0, reduce(1, 5, 1, 1, 10));
        let at = flush.iter().find_map(|a| match a {
            SwitchAction::SetTimer { at, token } if *at > T => Some((*at, *token)),
            _ => None,
        });
        let (at, tok) = at.expect("an expiry timer at the flush");
        s2.on_timer(at, &CTX, tok, &mut vec![]);
        assert_eq!((s2.aggregators_in_use(), counter(&s2, "stale_expired")), (0, 1));
    }

    #[test]
    fn malformed_packets_are_counted_and_dropped() {
        let mut s = switch(8, None);
        run(&mut s, 0, 0, reduce(1, 5, 1, 3, 10));
        let mut wrong_len = reduce(1, 5, 1, 3, 10);
        wrong_len.payload = Some(Box::new(Payload::I32(vec![1; 3])));
        let mut too_many = reduce(1, 5, 3, 3, 10);
        too_many.header = Header::Canary(CanaryHeader { counter: 3, ..match too_many.header { Header::Canary(h) => h, _ => unreachable!() } });
        let zero = reduce(1, 7, 0, 3, 10);
        for p in [wrong_len, too_many, zero] {
            let out = run(&mut s, 1, 1, p);
            assert!(matches!(out.as_slice(), [SwitchAction::Drop { reason: "canary_malformed", .. }]), "{out:?}");
        }
        assert_eq!(counter(&s, "malformed"), 3);
        // A Restore naming ports this 8-port switch lacks multicasts on none of them; one
        // naming a shard beyond the header's four is dropped (found in review: a shift past
        // 128 bits).
        let restore = |children: u32, shard: u8| {
            let h = CanaryHeader { dst: 100, id: CanaryHeader::make_id(1, 0, 9), kind: CanaryType::Restore, bypass: true, multicast: true, children, shard, ..Default::default() };
            Packet::new(LEADER, 7, 100, 7, 1081, Header::Canary(h))
        };
        assert_eq!(multicast_ports(&run(&mut s, 2, 7, restore(1 << 3 | 1 << 20, 0))), vec![3]);
        assert!(multicast_ports(&run(&mut s, 2, 7, restore(1, 1))).is_empty());
        assert!(matches!(run(&mut s, 2, 7, restore(1, 5)).as_slice(), [SwitchAction::Drop { reason: "canary_malformed", .. }]));
    }
}
