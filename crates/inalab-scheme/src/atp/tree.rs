//! ATP's tree mode (`ina.levels = "tree"`): every ATP switch on a job's routes to its PS
//! aggregates, as the PS-based INA of Rina's BOM model (Rina §III-B, Fig. 4) assumes; ATP
//! itself aggregates at the workers' and the PS's top-of-rack switches only (§3.4).
//!
//! Set-up (a choice: neither paper gives a mechanism):
//! - Every gradient packet of the job carries one ECMP key. Routing picks a next hop from the
//!   node, the destination and the key alone, so the job's routes to the PS form one tree.
//! - Level 1 is ATP's: each worker rack whose ToR runs ATP (other than the PS's) is one
//!   level-2 contributor, every other worker one on its own ([`inalab_host::atp_layout`]).
//! - Above the contributors, each ATP switch on the tree is a node of the job's aggregation
//!   tree: its children are the nearest contributors and ATP switches below it. A switch with a
//!   single child is skipped (it would aggregate nothing). A node adds the complete level-2
//!   contributions of its children (`bitmap1` within its subtree, counted to its fan-in) and
//!   sends one on; the PS's ToR, when it runs ATP, is the root and completes as ATP's level 2.
//! - Results go down the same tree: a node copies a parameter packet addressed to its
//!   subtree's first worker to the first worker of each child's subtree, routed by an ECMP key
//!   chosen here so that the copy passes through that child. Without ATP at the PS's ToR the
//!   PS sends one copy per child of the root.
//!
//! The 32-bit `bitmap1` still bounds a job to 32 level-2 contributors.

use crate::plan::{NetView, PlanError};
use inalab_core::{splitmix64, NodeId, PortId, Time};
use inalab_host::{AtpLayout, Contributor};
use inalab_switch::AtpSwitchJob;
use std::collections::BTreeMap;

/// Keys tried per child when looking for a route through it.
const KEY_TRIES: u64 = 4096;

/// A unit of the aggregation tree: a level-2 contributor (by `bitmap1` bit) or an ATP switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Unit {
    Contributor(usize),
    Switch(NodeId),
}

/// A job's tree-mode set-up: the ECMP key of its gradient packets, the admissions per switch
/// and, when the PS's ToR does not run ATP, the PS's parameter copies (worker rank, key).
pub struct AtpTree {
    pub flow: u64,
    pub admissions: Vec<(NodeId, AtpSwitchJob)>,
    pub ps_targets: Vec<(usize, u64)>,
}

/// Lays the tree out. `workers[r]` is rank r's host and `racks[r]` its ToR.
#[allow(clippy::too_many_arguments)]
pub fn atp_tree(
    net: &dyn NetView,
    job: u32,
    workers: &[NodeId],
    racks: &[NodeId],
    ps: NodeId,
    ps_rack: NodeId,
    layout: &AtpLayout,
    stale_timeout_ps: Time,
) -> Result<AtpTree, PlanError> {
    let err = |why: String| PlanError::new("ina.levels", why);
    let flow = splitmix64(0xA7B0_7EE5 ^ job as u64);
    let runs_atp = |n: NodeId| net.programmable(n);
    // The routing tree toward the PS under the job's key: node -> next node.
    let mut up: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    for &w in workers {
        let path = net.route_path(w, ps, flow);
        if path.is_empty() {
            return Err(err("\"tree\" needs the driver's routes: only the simulator has them (use \"tor\")".into()));
        }
        for hop in path.windows(2) {
            up.insert(hop[0], hop[1]);
        }
    }
    // Where each contributor enters level 2, and its first worker (by rank).
    let entry = |c: usize| match &layout.contributors[c] {
        Contributor::Rack(m) => racks[m[0]],
        Contributor::Worker(r) => workers[*r],
    };
    let first_rank = |c: usize| match &layout.contributors[c] {
        Contributor::Rack(m) => m[0],
        Contributor::Worker(r) => *r,
    };
    // The nearest ATP switch above a node on the tree (the PS when there is none).
    let above = |mut n: NodeId| loop {
        n = up[&n];
        if n == ps || runs_atp(n) {
            return n;
        }
    };
    // Children of every ATP switch (and of the PS), before skipping single-child switches.
    let mut children: BTreeMap<NodeId, Vec<Unit>> = BTreeMap::new();
    let mut linked = std::collections::BTreeSet::new();
    for c in 0..layout.contributors.len() {
        let mut node = above(entry(c));
        children.entry(node).or_default().push(Unit::Contributor(c));
        while node != ps && linked.insert(node) {
            let parent = above(node);
            children.entry(parent).or_default().push(Unit::Switch(node));
            node = parent;
        }
    }
    let root = if runs_atp(ps_rack) { ps_rack } else { ps };
    // Units below a node with single-child switches skipped.
    fn effective(children: &BTreeMap<NodeId, Vec<Unit>>, n: NodeId) -> Vec<Unit> {
        let mut out = vec![];
        for &u in &children[&n] {
            match u {
                Unit::Switch(s) if children[&s].len() == 1 => out.extend(effective(children, s)),
                u => out.push(u),
            }
        }
        out
    }
    // Per node of the final tree: its children, subtree mask and first rank.
    struct Node {
        kids: Vec<Unit>,
        mask: u32,
        first: usize,
    }
    let mut nodes: BTreeMap<NodeId, Node> = BTreeMap::new();
    fn walk(children: &BTreeMap<NodeId, Vec<Unit>>, n: NodeId, first_rank: &dyn Fn(usize) -> usize, nodes: &mut BTreeMap<NodeId, Node>) -> (u32, usize) {
        let kids = effective(children, n);
        let (mut mask, mut first) = (0u32, usize::MAX);
        for &u in &kids {
            let (m, f) = match u {
                Unit::Contributor(c) => (1u32 << c, first_rank(c)),
                Unit::Switch(s) => walk(children, s, first_rank, nodes),
            };
            mask |= m;
            first = first.min(f);
        }
        nodes.insert(n, Node { kids, mask, first });
        (mask, first)
    }
    // The root's own children: `children[root]` when the PS's ToR runs ATP; without it, the
    // PS's (the tree then ends at the PS).
    if !children.contains_key(&root) {
        return Err(err("the job's routes do not reach its PS".into()));
    }
    walk(&children, root, &first_rank, &mut nodes);
    let unit_first = |u: Unit| match u {
        Unit::Contributor(c) => first_rank(c),
        Unit::Switch(s) => nodes[&s].first,
    };
    // A key routing `from` -> `to`'s first worker through `to` (any key reaches a contributor).
    let down_key = |from: NodeId, u: Unit| -> Result<u64, PlanError> {
        let dst = workers[unit_first(u)];
        let Unit::Switch(through) = u else { return Ok(splitmix64(flow)) };
        (0..KEY_TRIES)
            .map(|i| splitmix64(flow ^ (i + 1).wrapping_mul(0x9E37_79B9)))
            .find(|&k| net.route_path(from, dst, k).contains(&through))
            .ok_or_else(|| err(format!("no route from {} to {} passes through {}", net.name(from), net.name(dst), net.name(through))))
    };
    let targets = |n: NodeId| -> Result<Vec<(usize, u64)>, PlanError> { nodes[&n].kids.iter().map(|&u| Ok((unit_first(u), down_key(n, u)?))).collect() };
    let port = |s: NodeId, h: NodeId| net.port_toward(s, h).unwrap_or(PortId::MAX);
    let mut adm: BTreeMap<NodeId, AtpSwitchJob> = BTreeMap::new();
    let base = AtpSwitchJob { multicast: true, stale_timeout_ps, ..Default::default() };
    // Level 1: ATP's worker racks.
    for c in &layout.contributors {
        if let Contributor::Rack(m) = c {
            let tor = racks[m[0]];
            adm.insert(tor, AtpSwitchJob { local_workers: m.iter().map(|&r| (port(tor, workers[r]), workers[r])).collect(), ..base.clone() });
        }
    }
    let mut ps_targets = vec![];
    for (&n, node) in &nodes {
        let t = targets(n)?;
        if n == ps {
            ps_targets = t;
            continue;
        }
        let fan_in = u8::try_from(node.kids.len()).map_err(|_| err(format!("{} children at {}", node.kids.len(), net.name(n))))?;
        let a = adm.entry(n).or_insert_with(|| base.clone());
        a.fan_in2 = Some(fan_in);
        if n == ps_rack {
            // The root: ATP's level 2, copying to its own workers (each a contributor) and
            // to each other child.
            a.ps = Some(ps);
            for (r, k) in t {
                match racks[r] == ps_rack {
                    true => a.local_workers.push((port(n, workers[r]), workers[r])),
                    false => a.remote_targets.push((workers[r], Some(k))),
                }
            }
        } else {
            a.subtree = node.mask;
            a.rep = Some(workers[node.first]);
            a.remote_targets = t.into_iter().map(|(r, k)| (workers[r], Some(k))).collect();
        }
    }
    Ok(AtpTree { flow, admissions: adm.into_iter().collect(), ps_targets })
}
