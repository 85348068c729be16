//! Topologies from parameters, validated, with shortest-path routing tables.
//!
//! This crate is the single definition of inalab's topologies: the packet simulator builds its
//! network from it and the Python flow-level models read the same graph through the bindings.
//! Hosts always take node ids `0..hosts`, numbered rack by rack, then switches follow.

mod build;
mod error;
mod routing;
mod spec;

pub use build::build;
pub use error::TopoError;
pub use routing::{ecmp_pick, DefaultPort, Routes};
pub use spec::{EdgeLink, EdgeNode, Programmable, Shape, TopologySpec};

use inalab_core::{NodeId, PortId};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    Host,
    Switch,
}

/// One end of a full-duplex link as seen from a node.
#[derive(Debug, Clone, Serialize)]
pub struct Port {
    pub link: u32,
    pub peer: NodeId,
    /// The port index of this link on the peer.
    pub peer_port: PortId,
}

#[derive(Debug, Clone, Serialize)]
pub struct Node {
    pub name: String,
    pub kind: NodeKind,
    /// 0 for hosts, 1 for the switches hosts attach to (ToR/leaf/edge), upward from there.
    pub tier: u8,
    pub programmable: bool,
    pub ports: Vec<Port>,
}

/// A full-duplex link; each direction has this rate and propagation delay.
#[derive(Debug, Clone, Serialize)]
pub struct Link {
    pub a: NodeId,
    pub b: NodeId,
    pub rate_bps: u64,
    pub delay_ps: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Topology {
    pub nodes: Vec<Node>,
    pub links: Vec<Link>,
    /// Number of hosts; hosts are nodes `0..hosts`.
    pub hosts: u32,
}

impl Topology {
    pub fn is_host(&self, n: NodeId) -> bool {
        n < self.hosts
    }
    pub fn switches(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.hosts..self.nodes.len() as NodeId
    }
    pub fn find(&self, name: &str) -> Option<NodeId> {
        self.nodes.iter().position(|n| n.name == name).map(|i| i as NodeId)
    }
    /// The port of `from` whose link leads to `to`, if they are adjacent.
    pub fn port_to(&self, from: NodeId, to: NodeId) -> Option<PortId> {
        self.nodes[from as usize].ports.iter().position(|p| p.peer == to).map(|i| i as PortId)
    }
    /// The switch a host is attached to (hosts have exactly one link).
    pub fn host_switch(&self, host: NodeId) -> NodeId {
        self.nodes[host as usize].ports[0].peer
    }

    /// The connected part of the network each node is in: `parts[n]` is the smallest node id
    /// of `n`'s part, so two nodes have a path between them iff their entries are equal.
    pub fn parts(&self) -> Vec<NodeId> {
        let mut part: Vec<NodeId> = (0..self.nodes.len() as NodeId).collect();
        fn root(part: &mut [NodeId], mut n: NodeId) -> NodeId {
            while part[n as usize] != n {
                part[n as usize] = part[part[n as usize] as usize];
                n = part[n as usize];
            }
            n
        }
        for l in &self.links {
            let (a, b) = (root(&mut part, l.a), root(&mut part, l.b));
            let (lo, hi) = (a.min(b), a.max(b));
            part[hi as usize] = lo;
        }
        (0..self.nodes.len() as NodeId).map(|n| root(&mut part, n)).collect()
    }
}
