use serde::Deserialize;

/// Which switches run an INA program. Hosts are never programmable.
#[derive(Debug, Clone, Deserialize, Default, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Programmable {
    /// Every switch (the default).
    #[default]
    All,
    None,
    /// Only the switches attached to hosts (ToR / leaf / edge).
    Tor,
    /// Exactly these switches, by name.
    Names(Vec<String>),
}

/// A topology request: a shape with its parameters plus the programmable-switch selection.
/// All rates are bits per second and all delays picoseconds (the Python front converts units).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologySpec {
    pub shape: Shape,
    #[serde(default)]
    pub programmable: Programmable,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Shape {
    /// One switch with `hosts` hosts.
    Star { hosts: u32, switch_ports: u32, link_rate_bps: u64, link_delay_ps: u64 },
    /// Two tiers: every leaf links to every spine. The Canary paper's 1024-host two-level
    /// fat-tree is `leaves = 32, spines = 32, hosts_per_leaf = 32, switch_ports = 64`.
    LeafSpine {
        leaves: u32,
        spines: u32,
        hosts_per_leaf: u32,
        switch_ports: u32,
        host_rate_bps: u64,
        fabric_rate_bps: u64,
        link_delay_ps: u64,
    },
    /// The k-ary three-tier fat-tree (Al-Fares et al.): k pods of k/2 edge and k/2
    /// aggregation switches, (k/2)^2 core switches, k^3/4 hosts, all switches k ports.
    FatTree { k: u32, link_rate_bps: u64, link_delay_ps: u64 },
    /// Dragonfly (Kim et al.): `g` groups of `a` routers, all-to-all inside a group, `h`
    /// global links per router, `p` hosts per router. Needs g <= a*h + 1.
    Dragonfly { a: u32, g: u32, h: u32, p: u32, link_rate_bps: u64, global_rate_bps: u64, link_delay_ps: u64 },
    /// An explicit graph for the papers' small examples.
    Edges { nodes: Vec<EdgeNode>, links: Vec<EdgeLink> },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeNode {
    pub name: String,
    /// "host" or "switch".
    pub kind: String,
    /// Tier for up/down routing and ToR selection; default 0 for hosts, 1 for switches.
    #[serde(default)]
    pub tier: Option<u8>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeLink {
    pub a: String,
    pub b: String,
    pub rate_bps: u64,
    pub delay_ps: u64,
}
