//! The static-tree in-network allreduce baselines of Canary's evaluation (De Sensi et al.
//! §5.2; `../shared/specs/canary.md` §3.1, A21): with `ina.trees = 1`, one static tree
//! (SHARP/SwitchML/ATP-like); with N > 1, N trees and block b on tree b mod N (PANAMA-like).
//!
//! Set-up policy:
//! - tree k is rooted at a top-tier switch (a spine of a leaf-spine, the one switch of a
//!   star); the N roots are distinct and drawn at random from the run's seed and the job id;
//! - each tree is the shortest-path tree from its root over the switches, cut to the paths
//!   that lead to the job's hosts: a switch's children are the job's hosts attached to it
//!   and the switches below it with job hosts under them, its parent the next switch toward
//!   the root. Every switch on a tree must be programmable;
//! - each job gets an equal static slice of every switch's slots, the slots split among the
//!   network's static-tree jobs, block seq using slot seq mod slice; a host's window is at
//!   most half the smallest slice (so a slot never serves two blocks, see the switch program).

use crate::noise;
use crate::plan::{Range, JobSpec, NetView, Param, Plan, PlanError, PlannedEndpoint, Quantization, Role, Servers, SwitchAdmission, TypedScheme};
use crate::ring::worker_endpoints;
use inalab_core::time::MS;
use inalab_core::wire::StaticTreeHeader;
use inalab_core::{splitmix64, Admission, NodeId, PortId, SwitchProgram};
use inalab_host::{Quantized, StaticTreeConfig, StaticTreeHost};
use inalab_switch::{static_tree_slots_for, StaticTreeRole, StaticTreeSwitch, StaticTreeSwitchJob, STATIC_TREE_MAX_CHILDREN, STATIC_TREE_SLOT_BYTES};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

const PROGRAM: &str = "static_tree";
/// The share key of the jobs that split every switch's slots equally.
const SLOTS_SHARE: &str = "static_tree-slots";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StaticTreeIna {
    pub trees: u32,
    pub header_bytes: u32,
    pub rtx_timeout_ps: u64,
    pub window_blocks: u32,
    pub scale: f64,
    pub noise_prob: f64,
    pub noise_ps: u64,
    pub noise_mode: noise::Mode,
}

impl Default for StaticTreeIna {
    fn default() -> Self {
        StaticTreeIna { trees: 1, header_bytes: 57, rtx_timeout_ps: MS, window_blocks: 4096, scale: inalab_host::quant::ATP_SCALE, noise_prob: 0.0, noise_ps: inalab_core::time::US, noise_mode: noise::Mode::Stall }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StaticTreeParams {
    pub ina: StaticTreeIna,
}

const PARAMS: [Param; 5] = [
    Param { name: "ina.trees", unit: "trees", doc: "Static trees of a static_tree job, each rooted at a distinct top-tier switch (a spine) drawn from the run's seed; block b uses tree b mod trees (1: SHARP/SwitchML/ATP-like, 4: PANAMA-like, Canary §5.2). At most the number of top-tier switches.", range: Range::Int { min: 1, max: 256 } },
    Param { name: "ina.header_bytes", unit: "bytes", doc: "Bytes on the wire per packet besides its values (Canary §5.1: 19 B header + 14 B Ethernet + 24 B preamble, gap and FCS); a block is 256 values (1024 B), so a full packet is 1081 B.", range: Range::HEADER },
    Param { name: "ina.rtx_timeout_ps", unit: "ps", doc: "A static_tree host sends a block again when its result is this late, doubling per expiry up to 64 times (switches never sum it twice; 1 ms where no loss is expected, Canary spec A13).", range: Range::TIME },
    Param { name: "ina.window_blocks", unit: "blocks", doc: "Blocks a static_tree host sends ahead of its oldest unfinished one; at most half the job's slice of the smallest switch table (a slot keeps a result until every host had it).", range: Range::SLOTS },
    Param { name: "ina.scale", unit: "", doc: "Fixed-point scale of the hosts' float32 values (switches sum int32): error at most workers / (2 scale) per value.", range: Range::SCALE },
];

pub struct StaticTree;

/// A job's trees: each tree's root and every switch's role in each tree.
#[derive(Debug)]
struct Trees {
    roots: Vec<NodeId>,
    roles: BTreeMap<NodeId, Vec<Option<StaticTreeRole>>>,
}

/// The first port of `from` toward `to` (a host's port as the driver knows it).
fn port(net: &dyn NetView, links: &BTreeMap<NodeId, Vec<(PortId, NodeId)>>, from: NodeId, to: NodeId) -> Option<PortId> {
    links.get(&from).and_then(|l| l.iter().find(|&&(_, peer)| peer == to).map(|&(p, _)| p)).or_else(|| net.port_toward(from, to))
}

/// `count` distinct roots among the top-tier switches, shuffled by `seed`.
fn draw_roots(net: &dyn NetView, switches: &[NodeId], count: usize, seed: u64) -> Result<Vec<NodeId>, PlanError> {
    let top = switches.iter().map(|&s| net.tier(s)).max().unwrap_or(1);
    let mut candidates: Vec<NodeId> = switches.iter().copied().filter(|&s| net.tier(s) == top).collect();
    if count > candidates.len() {
        return Err(PlanError::new("ina.trees", format!("{count} trees need {count} distinct roots; this network has {} top-tier switches", candidates.len())));
    }
    // Fisher-Yates over a splitmix64 stream.
    let mut x = seed;
    for i in (1..candidates.len()).rev() {
        x = splitmix64(x);
        candidates.swap(i, (x % (i as u64 + 1)) as usize);
    }
    candidates.truncate(count);
    Ok(candidates)
}

/// Lays out the job's trees on the network.
fn lay_out(job: &JobSpec, net: &dyn NetView, trees: usize) -> Result<Trees, PlanError> {
    let switches = net.switches();
    if switches.is_empty() {
        return Err(PlanError::new("scheme", "static trees are laid out over the network's switches, and this driver lists none"));
    }
    let links: BTreeMap<NodeId, Vec<(PortId, NodeId)>> = switches.iter().map(|&s| (s, net.links(s))).collect();
    if switches.len() > 1 && links.values().all(Vec::is_empty) {
        return Err(PlanError::new("scheme", "static trees are laid out over the links between switches, which this driver does not know"));
    }
    let is_switch: BTreeSet<NodeId> = switches.iter().copied().collect();
    let seed = splitmix64(net.seed() ^ splitmix64(0x5747_0000 ^ job.id as u64));
    let roots = draw_roots(net, &switches, trees, seed)?;
    let mut roles: BTreeMap<NodeId, Vec<Option<StaticTreeRole>>> = BTreeMap::new();
    for (k, &root) in roots.iter().enumerate() {
        // Shortest-path tree from the root (each switch's parent: the switch it was first
        // reached from, links in port order), then cut to the job's hosts.
        let mut parent: BTreeMap<NodeId, NodeId> = BTreeMap::new();
        let mut queue = VecDeque::from([root]);
        let mut seen = BTreeSet::from([root]);
        while let Some(s) = queue.pop_front() {
            for &(_, peer) in &links[&s] {
                if is_switch.contains(&peer) && seen.insert(peer) {
                    parent.insert(peer, s);
                    queue.push_back(peer);
                }
            }
        }
        fn at(roles: &mut BTreeMap<NodeId, Vec<Option<StaticTreeRole>>>, s: NodeId, k: usize, trees: usize) -> &mut StaticTreeRole {
            let v = roles.entry(s).or_insert_with(|| vec![None; trees]);
            v[k].get_or_insert_with(|| StaticTreeRole { parent: None, children: vec![] })
        }
        let mut on_tree = BTreeSet::from([root]);
        at(&mut roles, root, k, trees);
        for &h in &job.workers {
            let tor = net.tor(h);
            if !seen.contains(&tor) {
                return Err(PlanError::new("workers", format!("{}'s switch {} has no path to tree {k}'s root {}", net.name(h), net.name(tor), net.name(root))));
            }
            let p = port(net, &links, tor, h).unwrap_or(PortId::MAX);
            at(&mut roles, tor, k, trees).children.push(p);
            // Up to the root, or to a switch already on the tree.
            let mut s = tor;
            while on_tree.insert(s) {
                let up = parent[&s];
                let (Some(out), Some(back)) = (port(net, &links, s, up), port(net, &links, up, s)) else {
                    return Err(PlanError::new("scheme", format!("no link between {} and {}", net.name(s), net.name(up))));
                };
                at(&mut roles, s, k, trees).parent = Some(out);
                at(&mut roles, up, k, trees).children.push(back);
                s = up;
            }
        }
    }
    for (&s, per_tree) in &mut roles {
        if !net.programmable(s) || net.memory_bytes(s) < STATIC_TREE_SLOT_BYTES {
            return Err(PlanError::new("scheme", format!("static trees need every switch on them programmable with memory for slots; {} is not (set network.programmable = \"all\" and aggregator memory)", net.name(s))));
        }
        for r in per_tree.iter_mut().flatten() {
            r.children.sort_unstable();
            if r.children.len() > STATIC_TREE_MAX_CHILDREN {
                return Err(PlanError::new("workers", format!("{} has {} children in a tree; a switch sums at most {STATIC_TREE_MAX_CHILDREN}", net.name(s), r.children.len())));
            }
        }
    }
    Ok(Trees { roots, roles })
}

impl TypedScheme for StaticTree {
    type Config = StaticTreeParams;
    fn name(&self) -> &'static str {
        PROGRAM
    }
    fn doc(&self) -> &'static str {
        "Static-tree in-network allreduce (Canary's baselines): blocks summed up fixed trees rooted at random spines, round robin over ina.trees trees, results multicast down the same tree"
    }
    fn params(&self) -> Vec<Param> {
        PARAMS.iter().chain(&noise::PARAMS).cloned().collect()
    }
    fn servers(&self) -> Servers {
        Servers::None
    }
    /// What the ranges and serde cannot check.
    fn check(&self, c: &StaticTreeParams) -> Result<(), PlanError> {
        let i = &c.ina;
        if !(1..=256).contains(&i.trees) {
            return Err(PlanError::new("ina.trees", format!("{} trees; 1 or more (the header names up to 256), each with a root of its own", i.trees)));
        }
        let least = 1 + StaticTreeHeader::LEN as u32;
        if i.header_bytes < least {
            return Err(PlanError::new("ina.header_bytes", format!("{} bytes; the static-tree header alone is {least}", i.header_bytes)));
        }
        if i.rtx_timeout_ps == 0 {
            return Err(PlanError::new("ina.rtx_timeout_ps", "must be a positive duration"));
        }
        if i.window_blocks == 0 {
            return Err(PlanError::new("ina.window_blocks", "must be at least 1 block"));
        }
        Ok(())
    }
    fn quantization(&self, c: &StaticTreeParams) -> Quantization {
        Quantization::FixedPoint { scale: c.ina.scale }
    }
    fn program(&self, switch: NodeId, net: &dyn NetView) -> Option<Box<dyn SwitchProgram>> {
        Some(Box::new(StaticTreeSwitch::new(static_tree_slots_for(net.memory_bytes(switch)))))
    }
    fn shares(&self, _job: &JobSpec, _config: &StaticTreeParams, _net: &dyn NetView) -> Vec<String> {
        vec![SLOTS_SHARE.into()]
    }
    fn plan(&self, job: &JobSpec, c: StaticTreeParams, net: &dyn NetView) -> Result<Plan, PlanError> {
        let id = u16::try_from(job.id).map_err(|_| PlanError::new("id", format!("job id {}; the static-tree header's job allows 0..=65535", job.id)))?;
        let trees = lay_out(job, net, c.ina.trees as usize)?;
        let (index, of) = net.share(job.id, SLOTS_SHARE);
        let slice = |s: NodeId| static_tree_slots_for(net.memory_bytes(s)) / of.max(1);
        // A slot keeps its block's result until the slice's next block for it: half a slice
        // in flight at most (see the switch program).
        let smallest = trees.roles.keys().map(|&s| slice(s)).min().unwrap_or(0);
        let window_blocks = c.ina.window_blocks.min(smallest / 2);
        if window_blocks == 0 {
            return Err(PlanError::new("scheme", format!("{smallest} slots per job at the smallest switch of the trees ({of} static-tree jobs share them); a job needs at least 2 (more aggregator memory)")));
        }
        let cfg = StaticTreeConfig {
            job: id,
            workers: worker_endpoints(job),
            roots: trees.roots.clone(),
            header_bytes: c.ina.header_bytes,
            rtx_timeout_ps: c.ina.rtx_timeout_ps,
            window_blocks,
        };
        let mut plan = Plan::default();
        for (r, &h) in job.workers.iter().enumerate() {
            let host = StaticTreeHost::new(cfg.clone(), r).map_err(|e| PlanError::new("workers", e.0))?;
            let noisy = noise::wrap(Box::new(host), c.ina.noise_prob, c.ina.noise_ps, c.ina.noise_mode, job.id, r);
            let proto = Quantized::converting(noisy, c.ina.scale, r, job.workers.len());
            plan.endpoints.push(PlannedEndpoint { host: h, role: Role::Worker { rank: r as u32 }, proto: Box::new(proto), config: format!("{cfg:?} rank {r}") });
        }
        for (s, roles) in trees.roles {
            let len = slice(s);
            let state = Admission::new(StaticTreeSwitchJob { trees: roles, slots: (index * len, len) });
            plan.admissions.push(SwitchAdmission { switch: s, program: PROGRAM, state, field: "ina.trees" });
        }
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Scheme;

    /// A leaf-spine as a scheme sees it: hosts 0..leaves*per, then leaves, then spines; a
    /// leaf's ports are its hosts then the spines, a spine's the leaves.
    struct LeafSpine {
        leaves: u32,
        spines: u32,
        per: u32,
        programmable: bool,
    }

    impl LeafSpine {
        fn hosts(&self) -> u32 {
            self.leaves * self.per
        }
        fn leaf(&self, l: u32) -> NodeId {
            self.hosts() + l
        }
        fn spine(&self, s: u32) -> NodeId {
            self.hosts() + self.leaves + s
        }
    }

    impl NetView for LeafSpine {
        fn tor(&self, host: NodeId) -> NodeId {
            self.leaf(host / self.per)
        }
        fn port_toward(&self, switch: NodeId, host: NodeId) -> Option<PortId> {
            self.links(switch).into_iter().find(|l| l.1 == host).map(|l| l.0)
        }
        fn programmable(&self, _switch: NodeId) -> bool {
            self.programmable
        }
        fn memory_bytes(&self, _switch: NodeId) -> u64 {
            if self.programmable { 100 * STATIC_TREE_SLOT_BYTES } else { 0 }
        }
        fn name(&self, node: NodeId) -> String {
            format!("n{node}")
        }
        fn share(&self, _job: u32, _key: &str) -> (u32, u32) {
            (0, 1)
        }
        fn switches(&self) -> Vec<NodeId> {
            (self.hosts()..self.spine(self.spines)).collect()
        }
        fn links(&self, switch: NodeId) -> Vec<(PortId, NodeId)> {
            let peers: Vec<NodeId> = if switch < self.spine(0) {
                let l = switch - self.hosts();
                (l * self.per..(l + 1) * self.per).chain((0..self.spines).map(|s| self.spine(s))).collect()
            } else {
                (0..self.leaves).map(|l| self.leaf(l)).collect()
            };
            peers.into_iter().enumerate().map(|(p, n)| (p as PortId, n)).collect()
        }
        fn tier(&self, switch: NodeId) -> u8 {
            if switch >= self.spine(0) { 2 } else { 1 }
        }
        fn seed(&self) -> u64 {
            7
        }
    }

    fn job(workers: Vec<NodeId>, trees: u32) -> JobSpec {
        JobSpec { id: 0, workers, servers: vec![], config: serde_json::json!({"scheme": PROGRAM, "ina": {"trees": trees}}), worker_port: 9, server_port: 9 }
    }

    #[test]
    fn trees_are_rooted_at_distinct_spines_over_the_leaves_with_job_hosts() {
        let net = LeafSpine { leaves: 3, spines: 4, per: 2, programmable: true };
        // Hosts 0, 1 under leaf 0 and host 4 under leaf 2; leaf 1 has none.
        let t = lay_out(&job(vec![0, 1, 4], 4), &net, 4).unwrap();
        let spines: BTreeSet<NodeId> = (0..4).map(|s| net.spine(s)).collect();
        assert_eq!(t.roots.iter().copied().collect::<BTreeSet<_>>(), spines, "4 distinct spine roots");
        assert!(!t.roles.contains_key(&net.leaf(1)), "a leaf without job hosts is on no tree");
        for (k, &root) in t.roots.iter().enumerate() {
            let r = t.roles[&root][k].as_ref().unwrap();
            assert_eq!((r.parent, r.children.clone()), (None, vec![0, 2]), "the root's children: leaves 0 and 2");
            let leaf0 = t.roles[&net.leaf(0)][k].as_ref().unwrap();
            let up = 2 + (root - net.spine(0)) as PortId;
            assert_eq!((leaf0.parent, leaf0.children.clone()), (Some(up), vec![0, 1]));
            let leaf2 = t.roles[&net.leaf(2)][k].as_ref().unwrap();
            assert_eq!((leaf2.parent, leaf2.children.clone()), (Some(up), vec![0]));
            for other in spines.iter().filter(|&&s| s != root) {
                assert!(t.roles.get(other).is_none_or(|v| v[k].is_none()), "tree {k} passes only its root spine");
            }
        }
        // Another job draws its own roots; the same job the same ones.
        let again = lay_out(&job(vec![0, 1, 4], 4), &net, 4).unwrap();
        assert_eq!(again.roots, t.roots);
        let one: Vec<NodeId> = (0..8).map(|id| lay_out(&JobSpec { id, ..job(vec![0, 4], 1) }, &net, 1).unwrap().roots[0]).collect();
        assert!(one.iter().collect::<BTreeSet<_>>().len() > 1, "roots are drawn, not always the first spine: {one:?}");
    }

    #[test]
    fn bad_settings_name_the_field() {
        let net = LeafSpine { leaves: 2, spines: 2, per: 2, programmable: true };
        let e = Scheme::plan(&StaticTree, &job(vec![0, 2], 3), &net).err().unwrap();
        assert_eq!(e.field, "ina.trees", "{e}");
        assert!(e.message.contains("2 top-tier"), "{e}");
        for (ina, field) in [(serde_json::json!({"trees": 0}), "ina.trees"), (serde_json::json!({"window_blocks": 0}), "ina.window_blocks"), (serde_json::json!({"header_bytes": 4}), "ina.header_bytes"), (serde_json::json!({"rtx_timeout_ps": 0}), "ina.rtx_timeout_ps"), (serde_json::json!({"tree": 2}), "ina.tree")] {
            let e = Scheme::normalize(&StaticTree, &serde_json::json!({"scheme": PROGRAM, "ina": ina})).unwrap_err();
            assert_eq!(e.field, field, "{e}");
        }
        let fixed = LeafSpine { programmable: false, ..net };
        let e = Scheme::plan(&StaticTree, &job(vec![0, 2], 1), &fixed).err().unwrap();
        assert!(e.field == "scheme" && e.message.contains("programmable"), "{e}");
    }

    #[test]
    fn the_window_is_half_the_slice() {
        let net = LeafSpine { leaves: 2, spines: 2, per: 2, programmable: true };
        let plan = Scheme::plan(&StaticTree, &job(vec![0, 2], 2), &net).unwrap();
        assert!(plan.endpoints[0].config.contains("window_blocks: 50"), "{}", plan.endpoints[0].config);
        assert_eq!(plan.admissions.len(), 4, "both leaves and both spines");
    }
}
