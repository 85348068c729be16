//! Timed switch, host and link failures (Canary §1.11, Rina §1.8): which nodes and links are
//! down, the next hops that avoid them, and the packets a failure caught on a wire.

use crate::spec::FailureSpec;
use crate::SimError;
use inalab_core::{NodeId, PortId, Time};
use inalab_topo::{Routes, Topology};
use std::collections::{HashMap, VecDeque};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    Node(NodeId),
    Link(u32),
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Failure {
    pub target: Target,
    pub at: Time,
    pub until: Option<Time>,
    /// A host's failure: when, after `at`, its jobs' other workers are told.
    pub detect: Time,
}

/// A host's failure is told to its jobs' other workers after this long by default: 1 ms, a
/// few round trips of heartbeats in a data centre (the spec's "3 RTO" at Rina's 1 ms floor
/// would be 3 ms).
pub(crate) const DETECT_PS: Time = inalab_core::time::MS;

/// Why a packet on a wire is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// It was queued in a switch that failed.
    NodeFailed,
    /// It was on a link that failed.
    LinkFailed,
}

/// Packets of one wire arriving in (lo, hi] are lost, counted at `node` (the sending end).
#[derive(Debug, Clone, Copy)]
struct Doom {
    lo: Time,
    hi: Time,
    node: NodeId,
    why: Why,
}

fn describe_switches(topo: &Topology) -> String {
    let names: Vec<&str> = topo.switches().map(|s| topo.nodes[s as usize].name.as_str()).collect();
    match names.len() {
        0 => "this topology has no switch".into(),
        1..=8 => format!("switches are {}", names.join(", ")),
        n => format!("switches are {} .. {} ({n})", names[0], names[n - 1]),
    }
}

/// The spec's failures, checked against the topology; errors name the field.
pub(crate) fn resolve(specs: &[FailureSpec], topo: &Topology) -> Result<Vec<Failure>, SimError> {
    let mut out = vec![];
    for (i, f) in specs.iter().enumerate() {
        let field = format!("failures[{i}]");
        let target = match (&f.node, &f.link) {
            (Some(name), None) => {
                let field = format!("{field}.node");
                match topo.find(name) {
                    Some(n) if topo.is_host(n) && f.until_ps.is_some() => {
                        return Err(SimError::new(format!("failures[{i}].until_ps"), format!("{name:?} is a host, and a failed host does not come back (its processes' state is gone): leave it out")));
                    }
                    Some(n) => Target::Node(n),
                    None => return Err(SimError::new(field, format!("no switch or host named {name:?} ({})", describe_switches(topo)))),
                }
            }
            (None, Some([a, b])) => {
                let field = format!("{field}.link");
                let (na, nb) = match (topo.find(a), topo.find(b)) {
                    (Some(na), Some(nb)) => (na, nb),
                    _ => {
                        let unknown = if topo.find(a).is_none() { a } else { b };
                        return Err(SimError::new(field, format!("no node named {unknown:?}: a link is given by the names of its two ends")));
                    }
                };
                match topo.port_to(na, nb) {
                    Some(p) => Target::Link(topo.nodes[na as usize].ports[p as usize].link),
                    None => return Err(SimError::new(field, format!("{a:?} and {b:?} are not adjacent: no link between them"))),
                }
            }
            (Some(_), Some(_)) => return Err(SimError::new(field, "give exactly one of node (a switch or host name) or link (two node names), not both")),
            (None, None) => return Err(SimError::new(field, "give exactly one of node (a switch or host name) or link (two node names)")),
        };
        if let Some(until) = f.until_ps {
            if until <= f.at_ps {
                return Err(SimError::new(format!("{field}.until_ps"), format!("must be after at_ps ({} ps), got {until} ps; omit it for a permanent failure", f.at_ps)));
            }
        }
        let host = matches!(target, Target::Node(n) if topo.is_host(n));
        if f.detect_ps.is_some() && !host {
            return Err(SimError::new(format!("{field}.detect_ps"), "applies to a host's failure only (switches and links are routed around at once)"));
        }
        out.push(Failure { target, at: f.at_ps, until: f.until_ps, detect: f.detect_ps.unwrap_or(DETECT_PS) });
    }
    Ok(out)
}

/// What is down now. Empty (and never consulted on hot paths) when the spec has no failures.
#[derive(Default)]
pub(crate) struct Liveness {
    /// The spec declares failures: the event loop checks the rest only then.
    pub any: bool,
    /// Per node and per link: failure windows in force (they may overlap).
    node_down: Vec<u32>,
    link_down: Vec<u32>,
    /// Per global port: its link is down or its peer is a switch that is down.
    port_dead: Vec<bool>,
    /// Per node: some port is dead, so `hops` may hold its live next hops.
    has_dead: Vec<bool>,
    /// `node * nodes + dst` -> the live next hops, where they differ from the routes'.
    hops: HashMap<u64, Vec<PortId>>,
    /// Per global port: windows of arrival times whose packets a failure lost, oldest first.
    doomed: Vec<VecDeque<Doom>>,
}

impl Liveness {
    pub fn new(topo: &Topology, ports: usize, any: bool) -> Self {
        if !any {
            return Liveness::default();
        }
        let n = topo.nodes.len();
        Liveness {
            any,
            node_down: vec![0; n],
            link_down: vec![0; topo.links.len()],
            port_dead: vec![false; ports],
            has_dead: vec![false; n],
            hops: HashMap::new(),
            doomed: (0..ports).map(|_| VecDeque::new()).collect(),
        }
    }

    #[inline]
    pub fn node_is_down(&self, n: NodeId) -> bool {
        self.any && self.node_down[n as usize] > 0
    }

    #[inline]
    pub fn link_is_down(&self, l: u32) -> bool {
        self.any && self.link_down[l as usize] > 0
    }

    #[inline]
    pub fn port_dead(&self, pi: usize) -> bool {
        self.any && self.port_dead[pi]
    }

    #[inline]
    pub fn has_dead(&self, n: NodeId) -> bool {
        self.any && self.has_dead[n as usize]
    }

    /// Counts a window starting (`down`) or ending; true if the target's state changed.
    pub fn set(&mut self, target: Target, down: bool) -> bool {
        let c = match target {
            Target::Node(n) => &mut self.node_down[n as usize],
            Target::Link(l) => &mut self.link_down[l as usize],
        };
        if down {
            *c += 1;
            *c == 1
        } else {
            *c -= 1;
            *c == 0
        }
    }

    /// Loses the packets of wire `pi` arriving in (lo, hi].
    pub fn doom(&mut self, pi: usize, lo: Time, hi: Time, node: NodeId, why: Why) {
        if hi > lo {
            self.doomed[pi].push_back(Doom { lo, hi, node, why });
        }
    }

    /// Whether the packet arriving now at the end of wire `pi` was lost to a failure, and
    /// where to count it. Arrivals on a wire are in time order, so passed windows go.
    #[inline]
    pub fn doomed(&mut self, pi: usize, now: Time) -> Option<(NodeId, Why)> {
        let d = &mut self.doomed[pi];
        while d.front().is_some_and(|w| w.hi < now) {
            d.pop_front();
        }
        d.front().filter(|w| w.lo < now).map(|w| (w.node, w.why))
    }

    /// Recomputes dead ports and live next hops after a change.
    pub fn recompute(&mut self, topo: &Topology, routes: &Routes, port_base: &[u32]) {
        let mut pi = 0;
        for (n, node) in topo.nodes.iter().enumerate() {
            let mut any = false;
            for p in &node.ports {
                let dead = self.link_down[p.link as usize] > 0 || self.node_down[p.peer as usize] > 0;
                self.port_dead[pi] = dead;
                any |= dead;
                pi += 1;
            }
            self.has_dead[n] = any;
        }
        self.hops.clear();
        let nodes = topo.nodes.len() as u64;
        for s in topo.switches() {
            if !self.has_dead[s as usize] {
                continue;
            }
            let base = port_base[s as usize] as usize;
            for dst in 0..nodes as NodeId {
                let all = routes.next_hops(s, dst);
                if all.iter().any(|&p| self.port_dead[base + p as usize]) {
                    let live = all.iter().copied().filter(|&p| !self.port_dead[base + p as usize]).collect();
                    self.hops.insert(s as u64 * nodes + dst as u64, live);
                }
            }
        }
    }

    /// The next hops of `node` toward `dst` that avoid dead links and switches.
    #[inline]
    pub fn next_hops<'a>(&'a self, routes: &'a Routes, node: NodeId, dst: NodeId) -> &'a [PortId] {
        let all = routes.next_hops(node, dst);
        if !self.has_dead(node) {
            return all;
        }
        match self.hops.get(&(node as u64 * self.has_dead.len() as u64 + dst as u64)) {
            Some(live) => live,
            None => all,
        }
    }
}
