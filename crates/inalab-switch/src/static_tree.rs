//! The static-tree in-network allreduce of Canary's evaluation (`../shared/specs/canary.md`
//! §3.1, A21): one static tree per job is SHARP/SwitchML/ATP-like, N trees with blocks
//! assigned round robin PANAMA-like. The same program runs on every switch of a job's trees.
//!
//! At plan time every switch learns, per tree it is on, its parent port (none at the root)
//! and its children's ports (job hosts below a leaf, child switches above). A block's Reduce
//! packets are summed in the block's slot until every child is in, with no timeout; then the
//! partial sum goes to the parent port, or, at the root, the sum comes back down as a Result
//! that every switch multicasts to its children. Nothing is learnt from traffic.
//!
//! Slots: each job has a static slice of the table and block `seq` uses slot `seq mod slice`
//! (one static slot per block). A slot keeps its block's partial sum, then its result, until
//! the slice's next block for that slot arrives. The hosts' window is at most half a slice
//! (the scheme ensures it), which is SwitchML's shadow copy: a host sends block b + slice
//! only after every host had block b's result, so a slot is never needed by two blocks at
//! once, and until then a host (or child switch) that lost the result can still be answered.
//!
//! Loss: a child's re-sent contribution that is already counted (a per-slot bitmap of the
//! children summed) is never summed twice: while the slot collects it is dropped; once the
//! partial sum went up, the switch sends it up again (the loss may have been above), once
//! per round of asking children rather than once per child; once the result came down, the
//! switch sends the result to that child again.

use crate::Pool;
use inalab_core::wire::{Header, StaticTreeHeader, StaticTreeKind};
use inalab_core::{Admission, AdmitError, NodeId, Packet, Payload, PortId, SwitchAction, SwitchCtx, SwitchProgram, Time};
use std::collections::BTreeMap;

/// Values per packet (the same 256 x 4 B blocks as Canary, §5.1).
pub const STATIC_TREE_VALUES: usize = 256;
/// Switch memory per slot, Canary's memory model (spec §1.13): 1024 B of values + block
/// sequence (4), tree (1), counter (2), bitmaps of up to 128 children counted and asking
/// again (16 + 16) and the slot's state (1).
pub const STATIC_TREE_SLOT_BYTES: u64 = 1024 + 4 + 1 + 2 + 16 + 16 + 1;
/// Children a switch can have in one tree (the width of a slot's bitmap).
pub const STATIC_TREE_MAX_CHILDREN: usize = 128;

/// Slots that fit in `memory_bytes`.
pub fn static_tree_slots_for(memory_bytes: u64) -> u32 {
    (memory_bytes / STATIC_TREE_SLOT_BYTES).min(u32::MAX as u64) as u32
}

/// A switch's place in one tree of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticTreeRole {
    /// The port toward the tree's parent; `None` at the root.
    pub parent: Option<PortId>,
    /// The ports toward the children whose contributions a block waits for (hosts or
    /// switches), which the Result is multicast to.
    pub children: Vec<PortId>,
}

/// A job's state at a switch, as the scheme plans it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticTreeSwitchJob {
    /// By tree index: this switch's role in the tree, or `None` when the tree does not pass
    /// here.
    pub trees: Vec<Option<StaticTreeRole>>,
    /// The job's static slice of the table: `(first, len)`.
    pub slots: (u32, u32),
}

/// A tree role with the per-port child lookup a packet needs.
#[derive(Debug)]
struct Role {
    parent: Option<PortId>,
    children: Vec<PortId>,
    /// By port: the child's index (its bit), `NOT_A_CHILD` for other ports.
    child_index: Vec<u8>,
    /// Every child's bit.
    all: u128,
}

const NOT_A_CHILD: u8 = u8::MAX;

impl Role {
    fn child(&self, port: PortId) -> Option<u32> {
        self.child_index.get(port as usize).copied().filter(|&c| c != NOT_A_CHILD).map(u32::from)
    }
}

#[derive(Debug)]
struct Tenant {
    first: u32,
    len: u32,
    trees: Vec<Option<Role>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Summing the children's contributions.
    Collecting,
    /// Every child is in and the partial sum went to the parent; waiting for the Result.
    Sent,
    /// The Result passed (or this is the root and the sum is complete): kept to answer a
    /// child that lost it, until the slot's next block.
    Done,
}

#[derive(Debug, Clone)]
struct Slot {
    job: u16,
    seq: u32,
    tree: u8,
    state: State,
    /// Children (bits by index in the role) whose contribution is summed.
    counted: u128,
    /// Children that asked again since the partial sum was last re-sent up: one re-send
    /// answers them all, and a child asking twice means it was lost too.
    asked: u128,
    counter: u16,
    /// The partial sum while collecting and sent, then the result (payload mode).
    acc: Option<Vec<i32>>,
    /// The packets this slot sends look like its first contribution: size, destination
    /// (the root) and protocol ports.
    size: u32,
    dst: NodeId,
    src_port: u16,
    dst_port: u16,
}

#[derive(Debug, Default, Clone)]
struct Counters {
    reduces: u64,
    allocated: u64,
    aggregated: u64,
    partials_sent: u64,
    roots_completed: u64,
    results: u64,
    multicast_copies: u64,
    duplicates: u64,
    resent_partials: u64,
    resent_results: u64,
    duplicate_results: u64,
    stale: u64,
    reused: u64,
    overwritten_unfinished: u64,
    unexpected: u64,
    malformed: u64,
}

pub struct StaticTreeSwitch {
    table: Pool<Slot>,
    jobs: BTreeMap<u16, Tenant>,
    /// Slots holding a partial sum (collecting or sent): "aggregators in use".
    partial: u32,
    c: Counters,
}

impl StaticTreeSwitch {
    pub fn new(slots: u32) -> Self {
        StaticTreeSwitch { table: Pool::new(slots), jobs: BTreeMap::new(), partial: 0, c: Counters::default() }
    }

    fn on_reduce(&mut self, ctx: &dyn SwitchCtx, in_port: PortId, h: StaticTreeHeader, mut pkt: Packet, out: &mut Vec<SwitchAction>) {
        // Split borrows: the job's tree roles are read while the table changes.
        let StaticTreeSwitch { table, jobs, partial, c } = self;
        c.reduces += 1;
        let t = &jobs[&h.job];
        let role = t.trees[h.tree as usize].as_ref().expect("checked by on_packet");
        let Some(child) = role.child(in_port) else {
            // Not from a child of this tree: a misrouted or forged packet.
            c.unexpected += 1;
            return out.push(SwitchAction::Drop { pkt, reason: "static_tree_not_a_child" });
        };
        let values = match pkt.payload.as_deref() {
            None => None,
            Some(Payload::I32(v)) if !v.is_empty() && v.len() <= STATIC_TREE_VALUES => Some(v.len()),
            Some(_) => {
                c.malformed += 1;
                return out.push(SwitchAction::Drop { pkt, reason: "static_tree_malformed" });
            }
        };
        let i = (t.first + h.seq % t.len) as usize;
        match table.get(i) {
            Some(s) if s.job == h.job && s.seq == h.seq => {}
            Some(s) if s.job != h.job => {
                // Slices are disjoint: only a forged packet (or a wrong plan) gets here.
                c.unexpected += 1;
                return out.push(SwitchAction::Drop { pkt, reason: "static_tree_slot_of_another_job" });
            }
            Some(s) if StaticTreeHeader::seq_after(s.seq, h.seq) => {
                // An older block than the slot's: every host had its result already.
                c.stale += 1;
                return out.push(SwitchAction::Drop { pkt, reason: "static_tree_stale" });
            }
            held => {
                // Free, or the slice's previous block for this slot: by the window every host
                // has that block's result, so the slot is taken over.
                if let Some(old) = held {
                    c.reused += 1;
                    if old.state != State::Done {
                        c.overwritten_unfinished += 1;
                        *partial -= 1;
                    }
                    table.take(i);
                }
                c.allocated += 1;
                *partial += 1;
                let acc = match pkt.payload.take().map(|b| *b) {
                    Some(Payload::I32(v)) => Some(v),
                    _ => None,
                };
                let slot = Slot { job: h.job, seq: h.seq, tree: h.tree, state: State::Collecting, counted: 1 << child, asked: 0, counter: h.counter, acc, size: pkt.size, dst: pkt.dst, src_port: pkt.src_port, dst_port: pkt.dst_port };
                let s = table.insert(i, slot);
                if s.counted == role.all {
                    complete(ctx, s, role, partial, c, out);
                }
                return out.push(SwitchAction::Drop { pkt, reason: "static_tree_aggregated" });
            }
        }
        let s = table.get_mut(i).expect("matched above");
        if s.tree != h.tree {
            c.malformed += 1;
            return out.push(SwitchAction::Drop { pkt, reason: "static_tree_malformed" });
        }
        if s.counted >> child & 1 == 1 {
            // This child's contribution is summed already: a re-send after a loss.
            match (s.state, role.parent) {
                // (A root goes from collecting to done, never sent.)
                (State::Collecting, _) | (State::Sent, None) => c.duplicates += 1,
                (State::Sent, Some(parent)) if s.asked == 0 || s.asked >> child & 1 == 1 => {
                    // The partial sum or its Result was lost above: to the parent again. A new
                    // round of asking starts with this child.
                    s.asked = 1 << child;
                    c.resent_partials += 1;
                    out.push(SwitchAction::Forward { port: parent, pkt: packet(ctx, s, StaticTreeKind::Reduce, true) });
                }
                (State::Sent, Some(_)) => {
                    // The re-send of this round is on its way: its answer reaches this child.
                    s.asked |= 1 << child;
                    c.duplicates += 1;
                }
                (State::Done, _) => {
                    // The Result to this child was lost: it again, to that child only.
                    c.resent_results += 1;
                    out.push(SwitchAction::Forward { port: in_port, pkt: packet(ctx, s, StaticTreeKind::Result, true) });
                }
            }
            return out.push(SwitchAction::Drop { pkt, reason: "static_tree_duplicate" });
        }
        let fits = s.state == State::Collecting && s.acc.as_ref().map(Vec::len) == values && s.counter.checked_add(h.counter).is_some();
        if !fits {
            c.malformed += 1;
            return out.push(SwitchAction::Drop { pkt, reason: "static_tree_malformed" });
        }
        if let (Some(acc), Some(Payload::I32(v))) = (&mut s.acc, pkt.payload.as_deref()) {
            // Sticky saturation: a sum beyond the range stays at a rail (inalab_core::rail).
            inalab_core::rail::sticky_add(acc, v);
        }
        s.counter += h.counter;
        s.counted |= 1 << child;
        c.aggregated += 1;
        if s.counted == role.all {
            complete(ctx, s, role, partial, c, out);
        }
        out.push(SwitchAction::Drop { pkt, reason: "static_tree_aggregated" });
    }

    fn on_result(&mut self, in_port: PortId, h: StaticTreeHeader, mut pkt: Packet, out: &mut Vec<SwitchAction>) {
        let StaticTreeSwitch { table, jobs, partial, c } = self;
        let t = &jobs[&h.job];
        let role = t.trees[h.tree as usize].as_ref().expect("checked by on_packet");
        if role.parent != Some(in_port) {
            c.unexpected += 1;
            return out.push(SwitchAction::Drop { pkt, reason: "static_tree_not_from_parent" });
        }
        let i = (t.first + h.seq % t.len) as usize;
        let Some(s) = table.get_mut(i).filter(|s| s.job == h.job && s.seq == h.seq) else {
            // The slot moved on to a later block: every host had this one.
            c.stale += 1;
            return out.push(SwitchAction::Drop { pkt, reason: "static_tree_stale" });
        };
        let values = match pkt.payload.as_deref() {
            None => Some(None),
            Some(Payload::I32(v)) => Some(Some(v.len())),
            Some(_) => None,
        };
        match s.state {
            State::Sent if s.tree == h.tree && values == Some(s.acc.as_ref().map(Vec::len)) => {
                s.state = State::Done;
                s.counter = h.counter;
                if let (Some(acc), Some(Payload::I32(v))) = (&mut s.acc, pkt.payload.as_deref()) {
                    acc.copy_from_slice(v);
                }
                *partial -= 1;
                c.results += 1;
                c.multicast_copies += role.children.len() as u64;
                pkt.header = Header::StaticTree(StaticTreeHeader { rtx: false, ..h });
                out.push(SwitchAction::Multicast { ports: role.children.clone(), pkt });
            }
            State::Done => {
                // A second answer to re-sent partial sums: the children had the first.
                c.duplicate_results += 1;
                out.push(SwitchAction::Drop { pkt, reason: "static_tree_duplicate_result" });
            }
            _ => {
                c.malformed += 1;
                out.push(SwitchAction::Drop { pkt, reason: "static_tree_malformed" });
            }
        }
    }
}

/// Every child of slot `s` is in: the partial sum goes to the parent, or at the root the
/// Result goes down to every child.
fn complete(ctx: &dyn SwitchCtx, s: &mut Slot, role: &Role, partial: &mut u32, c: &mut Counters, out: &mut Vec<SwitchAction>) {
    match role.parent {
        Some(parent) => {
            s.state = State::Sent;
            c.partials_sent += 1;
            out.push(SwitchAction::Forward { port: parent, pkt: packet(ctx, s, StaticTreeKind::Reduce, false) });
        }
        None => {
            s.state = State::Done;
            *partial -= 1;
            c.roots_completed += 1;
            c.multicast_copies += role.children.len() as u64;
            out.push(SwitchAction::Multicast { ports: role.children.clone(), pkt: packet(ctx, s, StaticTreeKind::Result, false) });
        }
    }
}

/// A packet of slot `s`'s block: its partial sum up, or its result down.
fn packet(ctx: &dyn SwitchCtx, s: &Slot, kind: StaticTreeKind, rtx: bool) -> Packet {
    let h = StaticTreeHeader { job: s.job, tree: s.tree, kind, rtx, seq: s.seq, counter: s.counter };
    let mut p = Packet::new(ctx.node(), s.src_port, s.dst, s.dst_port, s.size, Header::StaticTree(h));
    // The slot keeps its values (to answer re-sends), so the packet carries a copy.
    p.payload = s.acc.clone().map(|v| Box::new(Payload::I32(v)));
    p
}

impl SwitchProgram for StaticTreeSwitch {
    fn on_packet(&mut self, _now: Time, ctx: &dyn SwitchCtx, in_port: PortId, pkt: Packet, out: &mut Vec<SwitchAction>) {
        let Header::StaticTree(h) = pkt.header else {
            return out.push(SwitchAction::Route { pkt });
        };
        let on_tree = self.jobs.get(&h.job).is_some_and(|t| t.trees.get(h.tree as usize).is_some_and(Option::is_some));
        if !on_tree {
            // A job not admitted here (or released), or a tree that does not pass here.
            self.c.unexpected += 1;
            return out.push(SwitchAction::Drop { pkt, reason: "static_tree_not_on_tree" });
        }
        if h.counter == 0 {
            self.c.malformed += 1;
            return out.push(SwitchAction::Drop { pkt, reason: "static_tree_malformed" });
        }
        match h.kind {
            StaticTreeKind::Reduce => self.on_reduce(ctx, in_port, h, pkt, out),
            StaticTreeKind::Result => self.on_result(in_port, h, pkt, out),
        }
    }

    fn admit(&mut self, job: u32, adm: Admission) -> Result<(), AdmitError> {
        let j = adm.take::<StaticTreeSwitchJob>("static_tree")?;
        let id = u16::try_from(job).map_err(|_| AdmitError(format!("job id {job} does not fit the static-tree header's 16-bit job (0..=65535)")))?;
        let (first, len) = j.slots;
        if len == 0 || first as u64 + len as u64 > self.table.len() as u64 {
            return Err(AdmitError(format!("slots {first}..{} are not within the {} slots of this switch", first as u64 + len as u64, self.table.len())));
        }
        if j.trees.len() > u8::MAX as usize + 1 {
            return Err(AdmitError(format!("{} trees; the header names at most 256", j.trees.len())));
        }
        let mut trees = vec![];
        for (k, role) in j.trees.into_iter().enumerate() {
            let Some(r) = role else {
                trees.push(None);
                continue;
            };
            if r.children.is_empty() || r.children.len() > STATIC_TREE_MAX_CHILDREN {
                return Err(AdmitError(format!("tree {k}: {} children; a switch has 1..={STATIC_TREE_MAX_CHILDREN} in a tree", r.children.len())));
            }
            let top = r.children.iter().copied().chain(r.parent).max().unwrap_or(0) as usize;
            let mut child_index = vec![NOT_A_CHILD; top + 1];
            for (c, &p) in r.children.iter().enumerate() {
                if child_index[p as usize] != NOT_A_CHILD || Some(p) == r.parent {
                    return Err(AdmitError(format!("tree {k}: port {p} is named twice")));
                }
                child_index[p as usize] = c as u8;
            }
            let all = if r.children.len() == 128 { u128::MAX } else { (1u128 << r.children.len()) - 1 };
            trees.push(Some(Role { parent: r.parent, children: r.children, child_index, all }));
        }
        self.jobs.insert(id, Tenant { first, len, trees });
        Ok(())
    }

    fn release(&mut self, job: u32) -> u32 {
        let Ok(id) = u16::try_from(job) else { return 0 };
        self.jobs.remove(&id);
        // Slots holding a partial sum are what is counted in use; results kept for re-sends go too.
        let partial = std::cell::Cell::new(0);
        self.table.free_where(|s| {
            partial.set(partial.get() + (s.job == id && s.state != State::Done) as u32);
            s.job == id
        });
        self.partial -= partial.get();
        partial.get()
    }

    /// A reduce packet on one of the job's trees through here is aggregated; results are
    /// replicated down the tree at line rate.
    fn processes(&self, _ctx: &dyn SwitchCtx, _in_port: PortId, pkt: &Packet) -> bool {
        let Header::StaticTree(h) = &pkt.header else { return false };
        h.kind == StaticTreeKind::Reduce && h.counter > 0 && self.jobs.get(&h.job).is_some_and(|t| t.trees.get(h.tree as usize).is_some_and(Option::is_some))
    }

    fn job_of(&self, pkt: &Packet) -> Option<u32> {
        match &pkt.header {
            Header::StaticTree(h) => Some(h.job as u32),
            _ => None,
        }
    }

    fn aggregators_in_use(&self) -> u32 {
        self.partial
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = &self.c;
        vec![
            ("reduces", c.reduces),
            ("allocated", c.allocated),
            ("aggregated", c.aggregated),
            ("partials_sent", c.partials_sent),
            ("roots_completed", c.roots_completed),
            ("results", c.results),
            ("multicast_copies", c.multicast_copies),
            ("duplicates", c.duplicates),
            ("resent_partials", c.resent_partials),
            ("resent_results", c.resent_results),
            ("duplicate_results", c.duplicate_results),
            ("stale", c.stale),
            ("reused", c.reused),
            ("overwritten_unfinished", c.overwritten_unfinished),
            ("unexpected", c.unexpected),
            ("malformed", c.malformed),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inalab_testkit::IdleCtx;

    const CTX: IdleCtx = IdleCtx { node: 100, ports: 16 };
    const ROOT: NodeId = 200;
    const UP: PortId = 7;

    /// Job 1 is a leaf of tree 0 (children ports 0, 1, 2; parent 7) and the root of tree 1
    /// (children 3, 4); job 2 is the same leaf of its tree 0. Four slots each.
    fn switch() -> StaticTreeSwitch {
        let mut s = StaticTreeSwitch::new(8);
        let leaf = StaticTreeRole { parent: Some(UP), children: vec![0, 1, 2] };
        let root = StaticTreeRole { parent: None, children: vec![3, 4] };
        s.admit(1, Admission::new(StaticTreeSwitchJob { trees: vec![Some(leaf.clone()), Some(root)], slots: (0, 4) })).unwrap();
        s.admit(2, Admission::new(StaticTreeSwitchJob { trees: vec![Some(leaf)], slots: (4, 4) })).unwrap();
        s
    }

    fn pkt(job: u16, tree: u8, kind: StaticTreeKind, seq: u32, counter: u16, v: i32) -> Packet {
        let h = StaticTreeHeader { job, tree, kind, rtx: false, seq, counter };
        let mut p = Packet::new(1, 9, ROOT, 9, 1081, Header::StaticTree(h));
        p.payload = Some(Box::new(Payload::I32(vec![v; 4])));
        p
    }

    fn reduce(job: u16, tree: u8, seq: u32, v: i32) -> Packet {
        pkt(job, tree, StaticTreeKind::Reduce, seq, 1, v)
    }

    fn run(s: &mut StaticTreeSwitch, port: PortId, p: Packet) -> Vec<SwitchAction> {
        let mut out = vec![];
        s.on_packet(0, &CTX, port, p, &mut out);
        out
    }

    /// The packets sent: (ports, kind, counter, first value, rtx).
    fn sent(out: &[SwitchAction]) -> Vec<(Vec<PortId>, StaticTreeKind, u16, i32, bool)> {
        out.iter()
            .filter_map(|a| {
                let (ports, pkt) = match a {
                    SwitchAction::Forward { port, pkt } => (vec![*port], pkt),
                    SwitchAction::Multicast { ports, pkt } => (ports.clone(), pkt),
                    _ => return None,
                };
                let Header::StaticTree(h) = pkt.header else { return None };
                let v = match pkt.payload.as_deref() {
                    Some(Payload::I32(v)) => v[0],
                    _ => i32::MIN,
                };
                Some((ports, h.kind, h.counter, v, h.rtx))
            })
            .collect()
    }

    fn drops(out: &[SwitchAction]) -> Vec<&'static str> {
        out.iter().filter_map(|a| if let SwitchAction::Drop { reason, .. } = a { Some(*reason) } else { None }).collect()
    }

    fn counter(s: &StaticTreeSwitch, name: &str) -> u64 {
        s.counters().into_iter().find(|c| c.0 == name).expect(name).1
    }

    #[test]
    fn a_leaf_waits_for_every_child_then_sends_up_and_multicasts_the_result_down() {
        let mut s = switch();
        assert!(sent(&run(&mut s, 0, reduce(1, 0, 5, 10))).is_empty());
        assert!(sent(&run(&mut s, 2, reduce(1, 0, 5, 20))).is_empty(), "no timeout: it waits for child 1");
        assert_eq!(s.aggregators_in_use(), 1);
        assert_eq!(sent(&run(&mut s, 1, reduce(1, 0, 5, 30))), vec![(vec![UP], StaticTreeKind::Reduce, 3, 60, false)]);
        assert_eq!(s.aggregators_in_use(), 1, "the partial sum is held until the result passes");
        let down = run(&mut s, UP, pkt(1, 0, StaticTreeKind::Result, 5, 9, 99));
        assert_eq!(sent(&down), vec![(vec![0, 1, 2], StaticTreeKind::Result, 9, 99, false)]);
        assert_eq!(s.aggregators_in_use(), 0);
        assert_eq!((counter(&s, "aggregated"), counter(&s, "partials_sent"), counter(&s, "results")), (2, 1, 1));
    }

    #[test]
    fn the_root_multicasts_the_sum_as_the_result() {
        let mut s = switch();
        run(&mut s, 3, pkt(1, 1, StaticTreeKind::Reduce, 6, 4, 1));
        let out = run(&mut s, 4, pkt(1, 1, StaticTreeKind::Reduce, 6, 5, 2));
        assert_eq!(sent(&out), vec![(vec![3, 4], StaticTreeKind::Result, 9, 3, false)]);
        assert_eq!((s.aggregators_in_use(), counter(&s, "roots_completed")), (0, 1));
    }

    #[test]
    fn re_sends_are_never_summed_twice_and_are_answered_from_where_the_block_is() {
        let mut s = switch();
        run(&mut s, 0, reduce(1, 0, 5, 10));
        // Collecting: child 0 again is dropped, not summed.
        assert_eq!(drops(&run(&mut s, 0, reduce(1, 0, 5, 10))), vec!["static_tree_duplicate"]);
        run(&mut s, 1, reduce(1, 0, 5, 20));
        assert_eq!(sent(&run(&mut s, 2, reduce(1, 0, 5, 30))), vec![(vec![UP], StaticTreeKind::Reduce, 3, 60, false)]);
        // Sent: the partial sum (or its result) was lost above; the same sum goes up again,
        // once for the children asking in the same round (0 after 1), again when one of them
        // asks a second time (that re-send was lost too).
        assert_eq!(sent(&run(&mut s, 1, reduce(1, 0, 5, 20))), vec![(vec![UP], StaticTreeKind::Reduce, 3, 60, true)]);
        assert!(sent(&run(&mut s, 0, reduce(1, 0, 5, 10))).is_empty());
        assert_eq!(sent(&run(&mut s, 0, reduce(1, 0, 5, 10))), vec![(vec![UP], StaticTreeKind::Reduce, 3, 60, true)]);
        run(&mut s, UP, pkt(1, 0, StaticTreeKind::Result, 5, 9, 99));
        // Done: the result again, to the child that asked only.
        assert_eq!(sent(&run(&mut s, 2, reduce(1, 0, 5, 30))), vec![(vec![2], StaticTreeKind::Result, 9, 99, true)]);
        // The parent's second answer to the re-sent partial is dropped.
        assert_eq!(drops(&run(&mut s, UP, pkt(1, 0, StaticTreeKind::Result, 5, 9, 99))), vec!["static_tree_duplicate_result"]);
        assert_eq!((counter(&s, "duplicates"), counter(&s, "resent_partials"), counter(&s, "resent_results"), counter(&s, "duplicate_results")), (2, 2, 1, 1));
        assert_eq!(s.aggregators_in_use(), 0);
    }

    #[test]
    fn tenants_with_equal_sequence_numbers_never_mix() {
        let mut s = switch();
        for (port, v) in [(0, 1), (1, 2)] {
            run(&mut s, port, reduce(1, 0, 5, v));
            run(&mut s, port, reduce(2, 0, 5, 100 * v));
        }
        assert_eq!(sent(&run(&mut s, 2, reduce(1, 0, 5, 3))), vec![(vec![UP], StaticTreeKind::Reduce, 3, 6, false)]);
        assert_eq!(sent(&run(&mut s, 2, reduce(2, 0, 5, 300))), vec![(vec![UP], StaticTreeKind::Reduce, 3, 600, false)]);
    }

    #[test]
    fn a_slot_passes_to_the_slices_next_block_and_older_blocks_are_stale() {
        let mut s = switch();
        let finish = |s: &mut StaticTreeSwitch, seq: u32| {
            for port in 0..3 {
                run(s, port, reduce(1, 0, seq, 1));
            }
            run(s, UP, pkt(1, 0, StaticTreeKind::Result, seq, 9, 9));
        };
        finish(&mut s, 1);
        // Block 5 uses block 1's slot (4 slots): it takes over the finished block's result.
        run(&mut s, 0, reduce(1, 0, 5, 1));
        assert_eq!((counter(&s, "reused"), counter(&s, "overwritten_unfinished")), (1, 0));
        assert_eq!(drops(&run(&mut s, 1, reduce(1, 0, 1, 1))), vec!["static_tree_stale"]);
        assert_eq!(drops(&run(&mut s, UP, pkt(1, 0, StaticTreeKind::Result, 1, 9, 9))), vec!["static_tree_stale"]);
        // Across the 32-bit wrap: 2^32 - 3 then 1 share slot 1, and 1 is the newer.
        let mut s = switch();
        finish(&mut s, u32::MAX - 2);
        run(&mut s, 0, reduce(1, 0, 1, 1));
        assert_eq!((counter(&s, "reused"), counter(&s, "stale")), (1, 0));
        assert_eq!(drops(&run(&mut s, 0, reduce(1, 0, u32::MAX - 2, 1))), vec!["static_tree_stale"]);
    }

    #[test]
    fn malformed_and_unexpected_packets_are_counted_and_dropped() {
        let mut s = switch();
        run(&mut s, 0, reduce(1, 0, 5, 10));
        let mut wrong_len = reduce(1, 0, 5, 1);
        wrong_len.payload = Some(Box::new(Payload::I32(vec![1; 3])));
        let mut floats = reduce(1, 0, 6, 1);
        floats.payload = Some(Box::new(Payload::F32(vec![1.0; 4])));
        let mut too_long = reduce(1, 0, 7, 1);
        too_long.payload = Some(Box::new(Payload::I32(vec![1; STATIC_TREE_VALUES + 1])));
        let mut no_values = reduce(1, 0, 5, 1);
        no_values.payload = None;
        let zero = pkt(1, 0, StaticTreeKind::Reduce, 8, 0, 1);
        let result_while_collecting = pkt(1, 0, StaticTreeKind::Result, 5, 3, 1);
        for (port, p) in [(1, wrong_len), (1, floats), (1, too_long), (1, no_values), (1, zero), (UP, result_while_collecting)] {
            assert_eq!(drops(&run(&mut s, port, p)), vec!["static_tree_malformed"]);
        }
        assert_eq!(counter(&s, "malformed"), 6);
        let unexpected = [
            (9, reduce(1, 0, 5, 1)),                           // not a child port
            (0, pkt(1, 0, StaticTreeKind::Result, 5, 3, 1)),   // a Result from a child
            (3, pkt(1, 1, StaticTreeKind::Result, 5, 3, 1)),   // a Result at the root
            (0, reduce(3, 0, 5, 1)),                           // a job not admitted
            (0, reduce(2, 1, 5, 1)),                           // a tree that does not pass here
        ];
        for (port, p) in unexpected {
            let out = run(&mut s, port, p);
            assert!(sent(&out).is_empty() && drops(&out).len() == 1, "{out:?}");
        }
        assert_eq!(counter(&s, "unexpected"), 5);
        assert_eq!(s.aggregators_in_use(), 1, "only block 5's slot");
        // Other headers are routed as plain traffic.
        let plain = Packet::new(1, 1, 2, 2, 100, Header::Raw);
        assert!(matches!(run(&mut s, 0, plain).as_slice(), [SwitchAction::Route { .. }]));
    }

    #[test]
    fn random_packets_never_panic_and_release_frees_everything() {
        let mut s = switch();
        let mut x = 1u64;
        let mut next = |m: u64| {
            x = inalab_core::splitmix64(x);
            x % m
        };
        for _ in 0..20_000 {
            let kind = if next(4) == 0 { StaticTreeKind::Result } else { StaticTreeKind::Reduce };
            let mut p = pkt(next(4) as u16, next(3) as u8, kind, next(12) as u32, next(5) as u16, 1);
            p.payload = match next(4) {
                0 => None,
                1 => Some(Box::new(Payload::I32(vec![1; next(300) as usize]))),
                _ => Some(Box::new(Payload::I32(vec![1; 4]))),
            };
            run(&mut s, next(10) as PortId, p);
            assert!(s.aggregators_in_use() <= 8);
        }
        assert!(counter(&s, "aggregated") > 0 && counter(&s, "malformed") > 0);
        s.release(1);
        s.release(2);
        assert_eq!((s.aggregators_in_use(), s.table.in_use()), (0, 0));
    }

    #[test]
    fn admission_checks_the_plan() {
        let mut s = StaticTreeSwitch::new(8);
        let role = |parent: Option<PortId>, children: Vec<PortId>| StaticTreeSwitchJob { trees: vec![Some(StaticTreeRole { parent, children })], slots: (0, 4) };
        assert!(s.admit(1, Admission::new(StaticTreeSwitchJob { slots: (6, 4), ..role(None, vec![1]) })).is_err(), "beyond the table");
        assert!(s.admit(1, Admission::new(StaticTreeSwitchJob { slots: (0, 0), ..role(None, vec![1]) })).is_err(), "no slots");
        assert!(s.admit(1, Admission::new(role(None, vec![]))).is_err(), "no children");
        assert!(s.admit(1, Admission::new(role(None, vec![1, 1]))).is_err(), "a port twice");
        assert!(s.admit(1, Admission::new(role(Some(2), vec![1, 2]))).is_err(), "the parent as a child");
        assert!(s.admit(1, Admission::new(role(None, (0..129).collect()))).is_err(), "more children than bits");
        assert!(s.admit(70_000, Admission::new(role(None, vec![1]))).is_err(), "beyond 16 bits");
        assert!(s.admit(1, Admission::new(5u32)).is_err(), "not this program's admission");
        s.admit(1, Admission::new(role(None, (0..128).collect()))).unwrap();
        // With 128 children, every bit counts.
        for port in 0..128 {
            let out = run(&mut s, port, reduce(1, 0, 0, 1));
            assert_eq!(sent(&out).len(), (port == 127) as usize);
        }
        assert_eq!(s.release(1), 0);
    }
}
