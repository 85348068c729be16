use crate::Topology;
use inalab_core::{NodeId, PortId};
use std::collections::{HashMap, VecDeque};

/// Shortest-path routing tables: for every switch and destination node (hosts, and switches
/// for protocols that address them, such as Canary's restore packets), the set of egress
/// ports on shortest paths (the ECMP group). Lookups are two array indexings, so a hop costs
/// the same at 16 hosts as at 1024. Hosts never transit traffic.
#[derive(Debug, Clone)]
pub struct Routes {
    hosts: u32,
    nodes: u32,
    /// `table[(switch - hosts) * nodes + dst]` = index into `groups`.
    table: Vec<u32>,
    groups: Vec<Vec<PortId>>,
}

const UNREACHABLE: u32 = u32::MAX;

impl Routes {
    pub fn compute(t: &Topology) -> Routes {
        let n = t.nodes.len();
        let h = t.hosts as usize;
        let switches = n - h;
        let mut table = vec![UNREACHABLE; switches * n];
        let mut groups: Vec<Vec<PortId>> = vec![];
        let mut group_ids: HashMap<Vec<PortId>, u32> = HashMap::new();
        let mut dist = vec![u32::MAX; n];
        let mut queue = VecDeque::new();
        let mut cand = Vec::new();
        for dst in 0..n {
            dist.iter_mut().for_each(|d| *d = u32::MAX);
            dist[dst] = 0;
            queue.clear();
            queue.push_back(dst as NodeId);
            while let Some(u) = queue.pop_front() {
                // Only the destination host itself is expanded among hosts.
                if t.is_host(u) && u as usize != dst {
                    continue;
                }
                for p in &t.nodes[u as usize].ports {
                    if dist[p.peer as usize] == u32::MAX {
                        dist[p.peer as usize] = dist[u as usize] + 1;
                        queue.push_back(p.peer);
                    }
                }
            }
            for s in h..n {
                if dist[s] == u32::MAX {
                    continue;
                }
                cand.clear();
                for (pi, p) in t.nodes[s].ports.iter().enumerate() {
                    let q = p.peer as usize;
                    let transit_ok = q >= h || q == dst;
                    if transit_ok && dist[q] != u32::MAX && dist[q] + 1 == dist[s] {
                        cand.push(pi as PortId);
                    }
                }
                let gid = *group_ids.entry(cand.clone()).or_insert_with(|| {
                    groups.push(cand.clone());
                    (groups.len() - 1) as u32
                });
                table[(s - h) * n + dst] = gid;
            }
        }
        Routes { hosts: t.hosts, nodes: n as u32, table, groups }
    }

    /// Egress ports of `switch` on shortest paths to node `dst` (empty if unreachable, or
    /// if `dst` is `switch` itself).
    #[inline]
    pub fn next_hops(&self, switch: NodeId, dst: NodeId) -> &[PortId] {
        let h = self.hosts as usize;
        match self.table[(switch as usize - h) * self.nodes as usize + dst as usize] {
            UNREACHABLE => &[],
            g => &self.groups[g as usize],
        }
    }

    /// The path (node list, hosts included) a flow with hash `flow` takes from host `src` to
    /// host `dst` when every switch sends it on `rule`'s port, as the simulator does.
    pub fn ecmp_path(&self, t: &Topology, src: NodeId, dst: NodeId, flow: u64, rule: DefaultPort) -> Option<Vec<NodeId>> {
        let mut path = vec![src];
        let mut cur = t.host_switch(src);
        path.push(cur);
        while cur != dst {
            let hops = self.next_hops(cur, dst);
            if hops.is_empty() || path.len() > t.nodes.len() {
                return None;
            }
            let port = rule.pick(hops, flow, dst, cur);
            cur = t.nodes[cur as usize].ports[port as usize].peer;
            path.push(cur);
        }
        Some(path)
    }
}

/// Which of the equal-cost ports a packet takes when nothing (a pinned path, adaptive
/// rerouting) overrides it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DefaultPort {
    /// ECMP: a hash of the flow, salted per switch ([`ecmp_pick`]).
    #[default]
    FlowHash,
    /// The destination's node id modulo the number of ports, the same at every switch:
    /// merlin's fat-tree routing in SST, which Canary's evaluation uses (De Sensi et al.
    /// §5.1). A leaf's hosts spread exactly over its up ports, and every packet toward one
    /// host leaves a tier by the same port index.
    Destination,
}

impl DefaultPort {
    #[inline]
    pub fn pick(self, hops: &[PortId], flow: u64, dst: NodeId, at: NodeId) -> PortId {
        match self {
            DefaultPort::FlowHash => ecmp_pick(hops, flow, at),
            DefaultPort::Destination => hops[dst as usize % hops.len()],
        }
    }

    /// The port for a packet keyed by its destination alone, the same at every switch of a
    /// tier whatever the rule (unsalted), so packets toward one node from different switches
    /// meet above them (Canary's partial sums toward a block's leader).
    #[inline]
    pub fn pick_by_destination(self, hops: &[PortId], dst: NodeId) -> PortId {
        match self {
            DefaultPort::FlowHash => hops[(inalab_core::splitmix64(dst as u64) % hops.len() as u64) as usize],
            DefaultPort::Destination => hops[dst as usize % hops.len()],
        }
    }
}

/// ECMP choice among `hops` for a flow at switch `at`: the hash is salted per switch so
/// successive tiers do not make correlated choices (the polarization problem).
#[inline]
pub fn ecmp_pick(hops: &[PortId], flow: u64, at: NodeId) -> PortId {
    if hops.len() == 1 {
        return hops[0];
    }
    let h = inalab_core::splitmix64(flow ^ (at as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    hops[(h % hops.len() as u64) as usize]
}
