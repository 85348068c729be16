use crate::{EdgeNode, Link, Node, NodeKind, Port, Programmable, Shape, TopoError, Topology, TopologySpec};
use inalab_core::{NodeId, PortId};
use std::collections::HashMap;

/// Builds and validates a topology. Errors name the field (`topology.<field>`) and the rule.
pub fn build(spec: &TopologySpec) -> Result<Topology, TopoError> {
    let mut t = match &spec.shape {
        Shape::Star { hosts, switch_ports, link_rate_bps, link_delay_ps } => {
            positive("hosts", *hosts)?;
            fits("hosts", *hosts, "switch_ports", *switch_ports, "the switch's ports")?;
            rate("link_rate_bps", *link_rate_bps)?;
            let mut b = Builder::new(*hosts);
            let s = b.switch("s0".into(), 1);
            for h in 0..*hosts {
                b.link(h, s, *link_rate_bps, *link_delay_ps);
            }
            b.done()
        }
        Shape::LeafSpine { leaves, spines, hosts_per_leaf, switch_ports, host_rate_bps, fabric_rate_bps, link_delay_ps } => {
            positive("leaves", *leaves)?;
            positive("spines", *spines)?;
            positive("hosts_per_leaf", *hosts_per_leaf)?;
            rate("host_rate_bps", *host_rate_bps)?;
            rate("fabric_rate_bps", *fabric_rate_bps)?;
            fits("hosts_per_leaf + spines", hosts_per_leaf + spines, "switch_ports", *switch_ports, "a leaf's ports")?;
            fits("leaves", *leaves, "switch_ports", *switch_ports, "a spine's ports")?;
            let mut b = Builder::new(leaves * hosts_per_leaf);
            let leaf: Vec<_> = (0..*leaves).map(|i| b.switch(format!("leaf{i}"), 1)).collect();
            let spine: Vec<_> = (0..*spines).map(|i| b.switch(format!("spine{i}"), 2)).collect();
            for (l, &ls) in leaf.iter().enumerate() {
                for h in 0..*hosts_per_leaf {
                    b.link(l as u32 * hosts_per_leaf + h, ls, *host_rate_bps, *link_delay_ps);
                }
            }
            for &ls in &leaf {
                for &ss in &spine {
                    b.link(ls, ss, *fabric_rate_bps, *link_delay_ps);
                }
            }
            b.done()
        }
        Shape::FatTree { k, link_rate_bps, link_delay_ps } => {
            if *k < 2 || k % 2 != 0 {
                return Err(TopoError::new("topology.k", format!("must be an even number >= 2, got {k}")));
            }
            rate("link_rate_bps", *link_rate_bps)?;
            let half = k / 2;
            let mut b = Builder::new(k * half * half);
            let mut edge = vec![];
            let mut agg = vec![];
            for p in 0..*k {
                edge.push((0..half).map(|i| b.switch(format!("edge{p}_{i}"), 1)).collect::<Vec<_>>());
            }
            for p in 0..*k {
                agg.push((0..half).map(|i| b.switch(format!("agg{p}_{i}"), 2)).collect::<Vec<_>>());
            }
            let core: Vec<_> = (0..half * half).map(|i| b.switch(format!("core{i}"), 3)).collect();
            let (r, d) = (*link_rate_bps, *link_delay_ps);
            for p in 0..*k as usize {
                for (e, &es) in edge[p].iter().enumerate() {
                    for h in 0..half {
                        b.link((p as u32 * half + e as u32) * half + h, es, r, d);
                    }
                    for &a in &agg[p] {
                        b.link(es, a, r, d);
                    }
                }
                // Aggregation switch i of every pod reaches core switches i*k/2 .. (i+1)*k/2.
                for (i, &a) in agg[p].iter().enumerate() {
                    for j in 0..half as usize {
                        b.link(a, core[i * half as usize + j], r, d);
                    }
                }
            }
            b.done()
        }
        Shape::Dragonfly { a, g, h, p, link_rate_bps, global_rate_bps, link_delay_ps } => {
            positive("a", *a)?;
            positive("g", *g)?;
            positive("p", *p)?;
            rate("link_rate_bps", *link_rate_bps)?;
            rate("global_rate_bps", *global_rate_bps)?;
            if *g > a * h + 1 {
                return Err(TopoError::new(
                    "topology.g",
                    format!("a dragonfly with a={a} routers of h={h} global links joins at most a*h+1 = {} groups, got g={g}", a * h + 1),
                ));
            }
            if *g > 1 && *h == 0 {
                return Err(TopoError::new("topology.h", "must be >= 1 when there is more than one group"));
            }
            let mut b = Builder::new(g * a * p);
            let r: Vec<Vec<NodeId>> =
                (0..*g).map(|gi| (0..*a).map(|ri| b.switch(format!("r{gi}_{ri}"), 1)).collect()).collect();
            // Hosts are numbered router by router: router n of the flattened list has hosts n*p...
            for (n, &router) in r.iter().flatten().enumerate() {
                for k in 0..*p {
                    b.link(n as u32 * p + k, router, *link_rate_bps, *link_delay_ps);
                }
            }
            for grp in &r {
                for i in 0..grp.len() {
                    for j in i + 1..grp.len() {
                        b.link(grp[i], grp[j], *link_rate_bps, *link_delay_ps);
                    }
                }
            }
            // Consecutive global arrangement: group i's m-th other group hangs off router m / h.
            let router_for = |gi: u32, gj: u32| -> NodeId {
                let m = if gj < gi { gj } else { gj - 1 };
                r[gi as usize][(m / h) as usize]
            };
            for gi in 0..*g {
                for gj in gi + 1..*g {
                    b.link(router_for(gi, gj), router_for(gj, gi), *global_rate_bps, *link_delay_ps);
                }
            }
            b.done()
        }
        Shape::Edges { nodes, links } => edges(nodes, links)?,
    };
    mark_programmable(&mut t, &spec.programmable)?;
    Ok(t)
}

fn positive(field: &str, v: u32) -> Result<(), TopoError> {
    if v == 0 {
        return Err(TopoError::new(format!("topology.{field}"), "must be >= 1"));
    }
    Ok(())
}

fn rate(field: &str, v: u64) -> Result<(), TopoError> {
    if v == 0 {
        return Err(TopoError::new(format!("topology.{field}"), "must be a positive rate in bits per second"));
    }
    Ok(())
}

fn fits(field: &str, need: u32, limit_field: &str, limit: u32, what: &str) -> Result<(), TopoError> {
    if need > limit {
        return Err(TopoError::new(
            format!("topology.{field}"),
            format!("needs {need} ports but {what} number {limit} (topology.{limit_field}); use at most {limit} or raise {limit_field}"),
        ));
    }
    Ok(())
}

fn edges(nodes: &[EdgeNode], links: &[crate::EdgeLink]) -> Result<Topology, TopoError> {
    // Hosts first (stable), then switches, so host ids are 0..hosts.
    let mut order: Vec<&EdgeNode> = nodes.iter().filter(|n| n.kind == "host").collect();
    let hosts = order.len() as u32;
    order.extend(nodes.iter().filter(|n| n.kind == "switch"));
    if let Some(bad) = nodes.iter().find(|n| n.kind != "host" && n.kind != "switch") {
        return Err(TopoError::new(
            format!("topology.nodes[{}].kind", bad.name),
            format!("must be \"host\" or \"switch\", got {:?}", bad.kind),
        ));
    }
    let mut b = Builder::new(hosts);
    let mut id = HashMap::new();
    for (i, n) in order.iter().enumerate() {
        let nid = if n.kind == "host" { i as NodeId } else { b.switch(n.name.clone(), n.tier.unwrap_or(1)) };
        if n.kind == "host" {
            b.nodes[i].name = n.name.clone();
        }
        if id.insert(n.name.as_str(), nid).is_some() {
            return Err(TopoError::new("topology.nodes", format!("node name {:?} appears twice", n.name)));
        }
    }
    for (i, l) in links.iter().enumerate() {
        let end = |name: &str, which: &str| {
            id.get(name).copied().ok_or_else(|| {
                TopoError::new(format!("topology.links[{i}].{which}"), format!("no node named {name:?}"))
            })
        };
        let (a, bb) = (end(&l.a, "a")?, end(&l.b, "b")?);
        if a == bb {
            return Err(TopoError::new(format!("topology.links[{i}]"), "a link must join two different nodes"));
        }
        rate(&format!("links[{i}].rate_bps"), l.rate_bps)?;
        b.link(a, bb, l.rate_bps, l.delay_ps);
    }
    let t = b.done();
    for h in 0..hosts {
        let n = &t.nodes[h as usize];
        if n.ports.len() != 1 {
            return Err(TopoError::new(
                format!("topology.nodes[{}]", n.name),
                format!("a host must have exactly one link, it has {}", n.ports.len()),
            ));
        }
    }
    Ok(t)
}

fn mark_programmable(t: &mut Topology, sel: &Programmable) -> Result<(), TopoError> {
    let hosts = t.hosts as usize;
    match sel {
        Programmable::All => t.nodes[hosts..].iter_mut().for_each(|n| n.programmable = true),
        Programmable::None => {}
        Programmable::Tor => t.nodes[hosts..].iter_mut().for_each(|n| n.programmable = n.tier == 1),
        Programmable::Names(names) => {
            for name in names {
                match t.nodes[hosts..].iter_mut().find(|n| &n.name == name) {
                    Some(n) => n.programmable = true,
                    None => {
                        return Err(TopoError::new(
                            "topology.programmable",
                            format!("no switch named {name:?}; switches are named like {:?}", t.nodes.get(hosts).map(|n| &n.name)),
                        ))
                    }
                }
            }
        }
    }
    Ok(())
}

struct Builder {
    nodes: Vec<Node>,
    links: Vec<Link>,
    hosts: u32,
}

impl Builder {
    fn new(hosts: u32) -> Self {
        let nodes = (0..hosts)
            .map(|i| Node { name: format!("h{i}"), kind: NodeKind::Host, tier: 0, programmable: false, ports: vec![] })
            .collect();
        Builder { nodes, links: vec![], hosts }
    }
    fn switch(&mut self, name: String, tier: u8) -> NodeId {
        self.nodes.push(Node { name, kind: NodeKind::Switch, tier, programmable: false, ports: vec![] });
        (self.nodes.len() - 1) as NodeId
    }
    fn link(&mut self, a: NodeId, b: NodeId, rate_bps: u64, delay_ps: u64) {
        let li = self.links.len() as u32;
        let pa = self.nodes[a as usize].ports.len() as PortId;
        let pb = self.nodes[b as usize].ports.len() as PortId;
        self.nodes[a as usize].ports.push(Port { link: li, peer: b, peer_port: pb });
        self.nodes[b as usize].ports.push(Port { link: li, peer: a, peer_port: pa });
        self.links.push(Link { a, b, rate_bps, delay_ps });
    }
    fn done(self) -> Topology {
        Topology { nodes: self.nodes, links: self.links, hosts: self.hosts }
    }
}
