//! GRID (Fang et al.; `../shared/specs/grid.md`): gradient routing with node-targeted
//! aggregation. The job's `policy` (from `inalab plan grid`, translated per worker by the Python
//! front end) names, for each worker rank, its aggregation node (a programmable switch or the
//! PS) and its host-to-PS path through that node.
//!
//! Set-up policy, the same in every driver:
//! - workers that name one switch form its group, ordered by rank (bit = position, fan-in =
//!   group size, at most 64); workers that name the PS (or no node) send to it directly;
//! - each group's switch admits the job with its group; the PS knows every group;
//! - a worker's path is installed for its packets where the driver can (the simulator);
//!   without a path a worker's packets follow the driver's routes, which must pass its node;
//! - results go from the PS to every worker once, replicated along the shortest-path tree
//!   from the PS (spec §1.6; `ina.results = "unicast"`: one copy per worker), each of its
//!   switches reached over the link the policy's gradients use least;
//! - each worker sends at most its policy's rate (`ina.pace`).

use crate::plan::{Range, shortest_path_tree, JobSpec, NetView, Param, Plan, PlanError, PlannedEndpoint, Quantization, Role, Servers, SwitchAdmission, TypedScheme};
use crate::ring::worker_endpoints;
use inalab_core::time::MS;
use inalab_core::wire::GridHeader;
use inalab_core::{Admission, Endpoint, NodeId, SwitchProgram};
use inalab_host::{AimdConfig, GridConfig, GridServer, GridServerConfig, GridTarget, GridWorker, Quantized, GRID_PACKET_VALUES};
use inalab_switch::{GridIndexing, GridSwitch, GridSwitchConfig, GridSwitchJob};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

const PROGRAM: &str = "grid";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Indexing {
    Hash,
    Modulo,
}

/// What a worker's sending rate is held to besides its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pace {
    /// The policy's per-worker `rate_gbps`.
    Policy,
    /// Nothing: the window alone.
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Results {
    Multicast,
    Unicast,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GridIna {
    pub header_bytes: u32,
    pub rto_ps: u64,
    pub window_bytes: u64,
    pub increment_bytes: u64,
    pub indexing: Indexing,
    pub stale_timeout_ps: u64,
    pub scale: f64,
    pub results: Results,
    pub control_packets: bool,
    pub pace: Pace,
}

impl Default for GridIna {
    fn default() -> Self {
        GridIna {
            header_bytes: 66,
            rto_ps: MS,
            window_bytes: 60_000,
            increment_bytes: 1500,
            // Modulo, not the paper's hash (spec A1 chose hash): measured on Fig. 1's wiring at
            // 100 Gbps, a hashed unit held by a younger fragment stalls an older one whose
            // members wait on it (0.5 against 39 Gbps of goodput); see docs/grid.md.
            indexing: Indexing::Modulo,
            stale_timeout_ps: 2 * MS,
            scale: inalab_host::quant::ATP_SCALE,
            results: Results::Multicast,
            control_packets: true,
            // The spec's choice (§1.5 7) was "none", reading §5.2's windows as the only rate
            // control; §3.3 has the control plane give each worker its sending rate with its
            // aggregation node, and on a plan that fills a link exactly the window alone bursts
            // past the buffers (#38: 0.53 of the feasible rate on a 192-host fat tree).
            pace: Pace::Policy,
        }
    }
}

/// One worker's part of the policy, by rank.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GridWorkerPolicy {
    /// The aggregation node's name: a programmable switch, or the PS host ("" = the PS).
    pub target: String,
    /// Node names from the worker's host to the PS host, through the target ([] = routed).
    pub path: Vec<String>,
    /// The plan's sending rate for this worker, in Gbps of wire bytes (0 = none: the window
    /// alone).
    pub rate_gbps: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GridPolicy {
    /// Per worker rank; [] = every worker sends to the PS directly.
    pub workers: Vec<GridWorkerPolicy>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GridParams {
    pub ina: GridIna,
    pub policy: GridPolicy,
}

const PARAMS: [Param; 11] = [
    Param { name: "ina.header_bytes", unit: "bytes", doc: "Bytes on the wire per GRID packet besides its 64 values: Ethernet 14, IPv4 20, UDP 8 and the 24-B GRID header; a full packet is 322 B.", range: Range::HEADER },
    Param { name: "ina.rto_ps", unit: "ps", doc: "A fragment without its result this long is sent again with RESEND (doubling per expiry up to 64x); the paper has no loss recovery (spec A6).", range: Range::TIME },
    Param { name: "ina.window_bytes", unit: "bytes", doc: "Initial window (GRID §5.2 gives none; inalab's ATP default). It grows by ina.increment per result while below the threshold, then per window, and halves on a control packet or an ECN echo.", range: Range::WINDOW },
    Param { name: "ina.increment_bytes", unit: "bytes", doc: "Window increase per result (one MTU, §5.2).", range: Range::WINDOW },
    Param { name: "ina.indexing", unit: "", doc: "A fragment's memory unit at its switch: \"modulo\" = fragment mod units (consecutive fragments on consecutive units, so a collision always meets an older fragment: §5.1's 'the larger id is throttled'); \"hash\" = splitmix64(job, fragment, switch) mod units (the paper's Hash(fragment id); a younger holder can stall an older fragment, see docs/grid.md).", range: Range::Choice(&["hash", "modulo"]) },
    Param { name: "ina.stale_timeout_ps", unit: "ps", doc: "A unit untouched this long is taken by a colliding fragment (spec A14: 2 x ina.rto).", range: Range::TIME },
    Param { name: "ina.scale", unit: "", doc: "Fixed-point scale of the workers' float32 values (switches and PS sum int32): error at most workers / (2 scale) per value.", range: Range::SCALE },
    Param { name: "ina.results", unit: "", doc: "How the PS returns a result: \"multicast\" = once, replicated by every switch on the shortest-path tree from the PS to the workers, each switch reached over the link that carries the fewest of the policy's gradient streams (spec §1.6; where the driver knows no links, as the UDP runtime, unicast); \"unicast\" = one copy per worker, which caps each worker at B/N on the PS's link.", range: Range::Choice(&["multicast", "unicast"]) },
    Param { name: "ina.control_packets", unit: "", doc: "A switch whose unit is held by another fragment drops the packet and sends its sender a control packet (GRID §5.2's rate synchronization: halve, send again); false: it only drops, and the sender recovers by its timeout (the ablation).", range: Range::Bool },
    Param { name: "ina.pace", unit: "", doc: "\"policy\" = each worker sends at most its policy's rate_gbps (GRID §3.3: the control plane gives every worker its aggregation node and sending rate), a token bucket one packet deep, besides its window; \"none\" = the window alone (the ablation: windows grow until ECN marks return, and a plan that fills a link exactly bursts past its buffers).", range: Range::Choice(&["policy", "none"]) },
    Param { name: "policy.workers", unit: "", doc: "Per worker rank: {target = aggregation node name (a programmable switch, or the PS), path = node names from the worker to the PS through the target, rate_gbps = its sending rate in Gbps of wire bytes, 0 = none}; from `inalab plan grid` through the scenario's policy. [] = every worker sends to the PS.", range: Range::List },
];

pub struct Grid;

/// Per rank: its aggregation node (None: the PS) and its path (empty: routed).
type Resolved = Vec<(Option<NodeId>, Vec<NodeId>)>;

/// The gradient streams the policy's paths put on each link (`from -> to`): one per worker up
/// to its node, one per node on from there (what it aggregated).
fn gradient_streams(resolved: &Resolved) -> BTreeMap<(NodeId, NodeId), u64> {
    let mut load = BTreeMap::new();
    let mut onward = std::collections::BTreeSet::new();
    for (target, path) in resolved {
        let at = target.and_then(|t| path.iter().position(|&n| n == t)).unwrap_or(path.len());
        for (i, hop) in path.windows(2).enumerate() {
            if i < at || onward.insert((*target, hop[0], hop[1])) {
                *load.entry((hop[0], hop[1])).or_insert(0) += 1;
            }
        }
    }
    load
}

/// Each rank's aggregation node and path, checked.
fn resolve(job: &JobSpec, net: &dyn NetView, policy: &GridPolicy, ps: NodeId) -> Result<Resolved, PlanError> {
    if policy.workers.is_empty() {
        return Ok(vec![(None, vec![]); job.workers.len()]);
    }
    if policy.workers.len() != job.workers.len() {
        return Err(PlanError::new("policy.workers", format!("{} entries for {} workers; one per worker, by rank", policy.workers.len(), job.workers.len())));
    }
    let named = |field: String, name: &str| net.node_named(name).ok_or_else(|| PlanError::new(field, format!("no node named {name:?} (or the driver cannot resolve names)")));
    let mut out = vec![];
    for (r, (w, &host)) in policy.workers.iter().zip(&job.workers).enumerate() {
        let field = |f: &str| format!("policy.workers[{r}].{f}");
        if !(w.rate_gbps.is_finite() && w.rate_gbps >= 0.0) {
            return Err(PlanError::new(field("rate_gbps"), format!("{}; a rate in Gbps, >= 0 (0 = none)", w.rate_gbps)));
        }
        let target = match w.target.as_str() {
            "" => None,
            name => Some(named(field("target"), name)?).filter(|&t| t != ps),
        };
        if let Some(t) = target {
            if !net.programmable(t) {
                return Err(PlanError::new(field("target"), format!("{:?} is not a programmable switch nor the PS", w.target)));
            }
        }
        let path = w.path.iter().map(|n| named(field("path"), n)).collect::<Result<Vec<_>, _>>()?;
        if !path.is_empty() {
            if path.first() != Some(&host) || path.last() != Some(&ps) {
                return Err(PlanError::new(field("path"), format!("runs from {:?} to {:?}; it must run from the worker {:?} to the PS {:?}", w.path[0], w.path[w.path.len() - 1], net.name(host), net.name(ps))));
            }
            for (i, hop) in path.windows(2).enumerate() {
                let adjacent = if i == 0 { net.tor(hop[0]) == hop[1] } else { net.links(hop[0]).iter().any(|&(_, n)| n == hop[1]) };
                if !adjacent {
                    return Err(PlanError::new(field("path"), format!("{:?} and {:?} are not adjacent", w.path[i], w.path[i + 1])));
                }
            }
            if let Some(t) = target.filter(|t| !path.contains(t)) {
                return Err(PlanError::new(field("path"), format!("does not pass its target {:?}", net.name(t))));
            }
        }
        out.push((target, path));
    }
    Ok(out)
}

impl TypedScheme for Grid {
    type Config = GridParams;
    fn name(&self) -> &'static str {
        PROGRAM
    }
    fn doc(&self) -> &'static str {
        "GRID: gradient routing, each worker's gradients aggregated at the one node its policy names (a switch or the PS) on its policy's path (Fang et al.)"
    }
    fn params(&self) -> Vec<Param> {
        PARAMS.to_vec()
    }
    fn servers(&self) -> Servers {
        Servers::ExactlyOne
    }
    /// What the ranges and serde cannot check.
    fn check(&self, c: &GridParams) -> Result<(), PlanError> {
        let i = &c.ina;
        let least = 1 + GridHeader::LEN as u32;
        if i.header_bytes < least {
            return Err(PlanError::new("ina.header_bytes", format!("{} bytes; the GRID header alone is {least}", i.header_bytes)));
        }
        for (v, name) in [(i.rto_ps, "ina.rto_ps"), (i.stale_timeout_ps, "ina.stale_timeout_ps"), (i.window_bytes, "ina.window_bytes"), (i.increment_bytes, "ina.increment_bytes")] {
            if v == 0 {
                return Err(PlanError::new(name, "must be positive"));
            }
        }
        Ok(())
    }
    fn quantization(&self, c: &GridParams) -> Quantization {
        Quantization::FixedPoint { scale: c.ina.scale }
    }
    fn program(&self, switch: NodeId, net: &dyn NetView) -> Option<Box<dyn SwitchProgram>> {
        Some(Box::new(GridSwitch::new(GridSwitchConfig { units: GridSwitchConfig::units_for(net.memory_bytes(switch)) })))
    }
    fn plan(&self, job: &JobSpec, c: GridParams, net: &dyn NetView) -> Result<Plan, PlanError> {
        let i = &c.ina;
        let ps_host = job.servers[0];
        let resolved = resolve(job, net, &c.policy, ps_host)?;
        let mut groups: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
        for (r, (t, _)) in resolved.iter().enumerate() {
            if let Some(t) = t {
                groups.entry(*t).or_default().push(r);
            }
        }
        if let Some((&s, g)) = groups.iter().find(|(_, g)| g.len() > GridHeader::MAX_FAN_IN as usize) {
            return Err(PlanError::new("policy.workers", format!("{} workers aggregate at {:?}; at most 64 per node", g.len(), net.name(s))));
        }
        let packet = i.header_bytes as u64 + 4 * GRID_PACKET_VALUES as u64;
        let grid = GridConfig {
            job: job.id,
            header_bytes: i.header_bytes,
            aimd: AimdConfig { initial_window_bytes: i.window_bytes, increment_bytes: i.increment_bytes, min_window_bytes: packet, initial_ssthresh_bytes: u64::MAX, max_window_bytes: u64::MAX },
            rto_ps: i.rto_ps,
        };
        let eps = worker_endpoints(job);
        let ps = Endpoint { host: ps_host, port: job.server_port };
        let err = |e: inalab_host::ConfigError| PlanError::new("policy.workers", e.0);
        let mut plan = Plan::default();
        for (r, (t, path)) in resolved.iter().enumerate() {
            let target = match t {
                Some(t) => GridTarget { node: *t, position: groups[t].iter().position(|&x| x == r).expect("grouped") as u8, fan_in: groups[t].len() as u8 },
                None => GridTarget { node: ps_host, position: 0, fan_in: 1 },
            };
            let rate = c.policy.workers.get(r).map_or(0.0, |w| w.rate_gbps);
            let rate_bps = if i.pace == Pace::Policy { (rate * 1e9).round() as u64 } else { 0 };
            let worker = GridWorker::new(eps[r], ps, target, grid.clone()).map_err(err)?.with_rate(rate_bps);
            let proto = Quantized::converting(Box::new(worker), i.scale, r, job.workers.len());
            plan.endpoints.push(PlannedEndpoint { host: job.workers[r], role: Role::Worker { rank: r as u32 }, proto: Box::new(proto), config: format!("{grid:?} {target:?} rate_bps={rate_bps}") });
            if !path.is_empty() {
                plan.paths.push((Role::Worker { rank: r as u32 }, path.clone()));
            }
        }
        let tree = match i.results {
            Results::Multicast => shortest_path_tree(net, ps_host, &job.workers, &gradient_streams(&resolved)),
            Results::Unicast => vec![],
        };
        let multicast = !tree.is_empty();
        if multicast {
            plan.trees.push((Role::Server { index: 0 }, tree));
        }
        let scfg = GridServerConfig { grid: grid.clone(), workers: eps, groups: groups.iter().map(|(&s, g)| (s, g.clone())).collect(), deliver: vec![], multicast };
        let config = format!("{scfg:?}");
        plan.endpoints.push(PlannedEndpoint { host: ps_host, role: Role::Server { index: 0 }, proto: Box::new(GridServer::new(ps, scfg).map_err(err)?), config });
        for (s, g) in groups {
            let group = if g.len() == 64 { u64::MAX } else { (1u64 << g.len()) - 1 };
            let indexing = match i.indexing {
                Indexing::Hash => GridIndexing::Hash,
                Indexing::Modulo => GridIndexing::Modulo,
            };
            let state = Admission::new(GridSwitchJob { group, fan_in: g.len() as u8, indexing, stale_timeout_ps: i.stale_timeout_ps, control_bytes: i.control_packets.then_some(i.header_bytes) });
            plan.admissions.push(SwitchAdmission { switch: s, program: PROGRAM, state, field: "policy.workers" });
        }
        Ok(plan)
    }
}
