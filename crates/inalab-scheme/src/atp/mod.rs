//! ATP (NSDI '21): best-effort aggregation in a shared switch pool at two rack levels, the PS
//! completes what the switches could not.
//!
//! Set-up policy, the same in both drivers:
//! - every worker rack whose ToR is programmable aggregates at level 1, the PS's rack at
//!   level 2 and multicasts ([`atp_admissions`]);
//! - the aggregator index is taken modulo the smallest pool the job's packets meet;
//! - a switch frees an aggregator abandoned by a job after 4 x that job's loss-recovery
//!   timeout (a live fragment is resent within one);
//! - the window is AIMD from `transport.init_window_bytes` / `increment_bytes`, never below one
//!   packet.

mod tree;

use tree::atp_tree;
use crate::plan::{JobSpec, NetView, Param, Plan, PlanError, PlannedEndpoint, Quantization, Range, Role, Servers, SwitchAdmission, TypedScheme};
use crate::ring::worker_endpoints;
use crate::transport::{TransportParams, TRANSPORT_PARAMS};
use inalab_core::time::MS;
use inalab_core::{Admission, Endpoint, NodeId, SwitchProgram, Time};
use inalab_host::{atp_layout, AimdConfig, AtpConfig, AtpServer, AtpServerConfig, AtpWorker, Hashing, Quantized, WindowRules};
use inalab_core::PortId;
use inalab_switch::{AtpSwitch, AtpSwitchConfig, AtpSwitchJob};
use serde::{Deserialize, Serialize};

/// Stale-aggregator timeout as a multiple of the holding job's loss-recovery timeout.
pub const STALE_TIMEOUTS: u64 = 4;
/// The PS answers repeated resends of one fragment at most once per 10 us (capped at half the
/// timeout): long enough for one answer to serve the burst of every worker resending a lost
/// multicast, short enough that a worker whose answer was lost too is answered at its next
/// probe (a job waits for a missing fragment, see `inalab_host::atp`).
pub const RESEND_HOLDOFF_PS: Time = 10 * inalab_core::time::US;
const PROGRAM: &str = "atp";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AtpHashing {
    /// HASH(<job, seq>) % aggregators (ATP).
    Hash,
    /// seq % aggregators: every job starts at slot 0 (ATP Fig. 14's strawman).
    Linear,
    /// The pool split equally among the static jobs, each using seq % its slice (Figs. 13a, 14).
    Static,
}

/// Where a job's gradients are aggregated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AtpLevels {
    /// ATP (§3.4): the workers' top-of-rack switches, then the PS's.
    Tor,
    /// Every ATP switch on the job's routes to the PS ([`tree`]): Rina's BOM model.
    Tree,
    /// Each gradient once, at the first ATP switch on its way (GRID §4.2: "aggregated
    /// in-network once at most"; §6.1's ATP baseline): the workers' ToRs as in `Tor`, and the
    /// PS's ToR only for the workers no other switch summed (its own rack's, and those of
    /// racks without ATP); the racks' sums reach the PS apart.
    Once,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AtpIna {
    /// Bytes on the wire per gradient packet, headers included.
    pub packet_bytes: u32,
    /// Header bytes of a gradient packet.
    pub header_bytes: u32,
    pub hashing: AtpHashing,
    /// Slots of the job's aggregator table, and the most fragments in flight.
    pub slots: u32,
    /// ECN/loss-driven AIMD window (false: a fixed window of `transport.init_window_bytes`).
    pub congestion_control: bool,
    /// Worker loss-recovery timeout, ps.
    pub timeout_ps: u64,
    /// Fixed-point scale: values are multiplied by it before aggregation.
    pub scale: f64,
    /// Where gradients are aggregated.
    pub levels: AtpLevels,
}

impl Default for AtpIna {
    fn default() -> Self {
        AtpIna { packet_bytes: 306, header_bytes: 58, hashing: AtpHashing::Hash, slots: inalab_host::ATP_DEFAULT_SLOTS, congestion_control: true, timeout_ps: MS, scale: inalab_host::quant::ATP_SCALE, levels: AtpLevels::Tor }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AtpParams {
    pub transport: TransportParams,
    pub ina: AtpIna,
}

/// ATP's own parameters, after the transport's.
const INA_PARAMS: [Param; 8] = [
    Param { name: "ina.packet_bytes", unit: "bytes", doc: "Bytes on the wire per gradient packet, headers included.", range: Range::PACKET },
    Param { name: "ina.header_bytes", unit: "bytes", doc: "Header bytes of a gradient packet; the rest (a multiple of 4 B) carries 32-bit values.", range: Range::HEADER },
    Param {
        name: "ina.hashing",
        unit: "",
        doc: "How a job's slot table is filled (fragment seq uses slot seq % slots): \"hash\" = HASH(<job, slot>) % aggregators, distinct, and the PS moves a colliding slot to an aggregator the job has not used (ATP); \"linear\" = slot i is aggregator i, so every job starts at 0, and nothing moves (ATP Fig. 14's strawman); \"static\" = the pool is split equally among the scenario's static jobs, each job's slots are its slice, so its window is the slice (the static baseline of Figs. 13a, 14).",
        range: Range::Choice(&["hash", "linear", "static"]),
    },
    Param {
        name: "ina.slots",
        unit: "aggregators",
        doc: "Slots of a job's aggregator table: the aggregators it uses per switch and the most fragments a worker has in flight, so a job never collides with itself. A pool smaller than this is used more than once (the surplus falls back to the PS); a static job has at most its slice. At most 2^20.",
        range: Range::Int { min: 1, max: inalab_host::ATP_MAX_SLOTS as u64 },
    },
    Param {
        name: "ina.congestion_control",
        unit: "",
        doc: "ECN/loss-driven AIMD window starting at transport.init_window, +1 MTU (transport.increment) per parameter in slow start; false: a fixed window of transport.init_window.",
        range: Range::Bool,
    },
    Param { name: "ina.timeout_ps", unit: "ps", doc: "Worker loss-recovery timeout: a fragment (ATP) or a slot's packet (SwitchML) is resent after this long without progress.", range: Range::TIME },
    Param { name: "ina.scale", unit: "", doc: "Fixed-point scale of the workers' float32 values (value x scale, rounded, as i32): error at most workers / (2 scale) per value, sums limited to (2^31 - 1) / scale.", range: Range::SCALE },
    Param {
        name: "ina.levels",
        unit: "",
        doc: "Where gradients are aggregated: \"tor\" = ATP's two levels, the workers' top-of-rack switches and the PS's (§3.4); \"tree\" = every programmable switch on the job's routes to the PS, which all carry one ECMP key so they form a tree, with results copied down it (the PS-based INA of Rina's BOM model, §III-B; simulator only); \"once\" = each gradient at the first ATP switch on its way only, the racks' sums going to the PS apart (the ATP GRID compares with, GRID §4.2, §6.1). Each way at most 32 level-2 contributors.",
        range: Range::Choice(&["tor", "tree", "once"]),
    },
];

pub struct Atp;

impl TypedScheme for Atp {
    type Config = AtpParams;
    fn name(&self) -> &'static str {
        PROGRAM
    }
    fn doc(&self) -> &'static str {
        "ATP: best-effort in-network aggregation in the workers' and the PS's top-of-rack switches, the PS completes the rest"
    }
    fn params(&self) -> Vec<Param> {
        TRANSPORT_PARAMS.iter().chain(&INA_PARAMS).copied().collect()
    }
    fn any_packet_values(&self) -> bool {
        true
    }
    /// By fragment: every packet of a fragment (its gradients, the parameter packet, a
    /// re-hash to another aggregator) reaches the thread that holds its aggregator.
    fn steering(&self) -> Option<fn(&inalab_core::wire::Header) -> u32> {
        Some(|h| match h {
            inalab_core::wire::Header::Atp(h) => h.seq,
            _ => 0,
        })
    }
    fn servers(&self) -> Servers {
        Servers::ExactlyOne
    }
    /// The slots' range, which serde cannot check.
    fn check(&self, c: &AtpParams) -> Result<(), PlanError> {
        if !(1..=inalab_host::ATP_MAX_SLOTS).contains(&c.ina.slots) {
            return Err(PlanError::new("ina.slots", format!("{} slots; allowed: 1..={}", c.ina.slots, inalab_host::ATP_MAX_SLOTS)));
        }
        Ok(())
    }
    fn quantization(&self, c: &AtpParams) -> Quantization {
        Quantization::FixedPoint { scale: c.ina.scale }
    }
    fn program(&self, switch: NodeId, net: &dyn NetView) -> Option<Box<dyn SwitchProgram>> {
        let cfg = AtpSwitchConfig { aggregators: AtpSwitchConfig::aggregators_for(net.memory_bytes(switch)), stale_timeout_ps: STALE_TIMEOUTS * MS };
        Some(Box::new(AtpSwitch::new(cfg)))
    }
    fn shares(&self, _job: &JobSpec, c: &AtpParams, _net: &dyn NetView) -> Vec<String> {
        if c.ina.hashing == AtpHashing::Static {
            vec!["atp/static".into()]
        } else {
            vec![]
        }
    }
    fn plan(&self, job: &JobSpec, c: AtpParams, net: &dyn NetView) -> Result<Plan, PlanError> {
        let ps_host = job.servers[0];
        let ina = &c.ina;
        let racks: Vec<NodeId> = job.workers.iter().map(|&w| net.tor(w)).collect();
        let ps_rack = net.tor(ps_host);
        let runs_atp = |s: NodeId| net.programmable(s);
        let layout = atp_layout(&racks, ps_rack, runs_atp).map_err(|e| PlanError::new("workers", e.0))?;
        let stale: Time = ina.timeout_ps.saturating_mul(STALE_TIMEOUTS);
        let port = |s: NodeId, h: NodeId| net.port_toward(s, h).unwrap_or(inalab_core::PortId::MAX);
        let (admissions, flow, ps_targets) = match ina.levels {
            AtpLevels::Tor => (atp_admissions(&job.workers, &racks, ps_host, ps_rack, runs_atp, port, stale), None, vec![]),
            AtpLevels::Once => {
                let mut admissions = atp_admissions(&job.workers, &racks, ps_host, ps_rack, runs_atp, port, stale);
                // The PS's switch sums only the contributors that are single workers.
                let single: Vec<u32> = layout.positions.iter().filter(|p| p.esi == 1).map(|p| p.bitmap1).collect();
                for (_, adm) in admissions.iter_mut().filter(|(s, _)| *s == ps_rack) {
                    adm.once = true;
                    adm.subtree = single.iter().fold(0, |m, b| m | b);
                    adm.fan_in2 = Some(single.len() as u8);
                }
                (admissions, None, vec![])
            }
            AtpLevels::Tree => {
                let t = atp_tree(net, job.id, &job.workers, &racks, ps_host, ps_rack, &layout, stale)?;
                (t.admissions, Some(t.flow), t.ps_targets)
            }
        };
        // The index is taken modulo the smallest pool the job's packets meet, so it is valid
        // at every level.
        let pool = admissions.iter().map(|&(s, _)| AtpSwitchConfig::aggregators_for(net.memory_bytes(s))).min().unwrap_or(0);
        let t = &c.transport;
        let cfg = AtpConfig {
            job: job.id,
            packet_bytes: ina.packet_bytes,
            header_bytes: ina.header_bytes,
            hashing: match ina.hashing {
                AtpHashing::Hash => Hashing::Hash,
                AtpHashing::Linear => Hashing::Linear,
                AtpHashing::Static => {
                    let (k, of) = net.share(job.id, "atp/static");
                    let size = pool / of.max(1);
                    Hashing::Static { offset: k * size, size }
                }
            },
            aggregators: pool,
            slots: ina.slots,
            congestion_control: ina.congestion_control,
            aimd: AimdConfig {
                initial_window_bytes: t.init_window_bytes,
                increment_bytes: t.increment_bytes,
                min_window_bytes: ina.packet_bytes as u64,
                initial_ssthresh_bytes: u64::MAX,
                max_window_bytes: u64::MAX,
            },
            window_rules: WindowRules::Aimd,
            timeout_ps: ina.timeout_ps,
            scale: ina.scale,
            flow,
            lanes: net.lanes(),
        };
        let err = |e: inalab_host::ConfigError| PlanError::new("ina", e.0);
        let ps = Endpoint { host: ps_host, port: job.server_port };
        let wep = worker_endpoints(job);
        let mut plan = Plan::default();
        for (r, &h) in job.workers.iter().enumerate() {
            let worker = AtpWorker::new(wep[r], ps, layout.positions[r], cfg.clone()).map_err(err)?;
            let proto = Quantized::new(Box::new(worker), self.quantization(&c), r, job.workers.len());
            let config = format!("{cfg:?} {:?} ps {ps:?} scale {}", layout.positions[r], ina.scale);
            plan.endpoints.push(PlannedEndpoint { host: h, role: Role::Worker { rank: r as u32 }, proto: Box::new(proto), config });
        }
        let multicast = runs_atp(ps_rack);
        let scfg = AtpServerConfig { atp: cfg.clone(), layout, workers: wep, multicast, targets: ps_targets, resend_holdoff_ps: RESEND_HOLDOFF_PS.min(ina.timeout_ps / 2) };
        let config = format!("{scfg:?}");
        plan.endpoints.push(PlannedEndpoint { host: ps_host, role: Role::Server { index: 0 }, proto: Box::new(AtpServer::new(ps, scfg).map_err(err)?), config });
        for (switch, adm) in admissions {
            plan.admissions.push(SwitchAdmission { switch, program: PROGRAM, state: Admission::new(adm), field: "workers" });
        }
        Ok(plan)
    }
}

/// The control plane's admissions of one ATP job: an [`AtpSwitchJob`] per switch that
/// aggregates it, in order (worker racks by first appearance, then the PS's rack). Both drivers
/// set jobs up through it (ATP's whole set-up lives in this module and [`tree`]).
///
/// `workers[r]` is worker r's host and `racks[r]` its switch; `ps` the PS host behind
/// `ps_rack`; `runs_atp(rack)` whether a switch runs ATP; `port(rack, host)` the switch's port
/// facing a host attached to it. Every worker rack with ATP other than the PS's aggregates at
/// level 1 and gets one routed parameter copy (to its first worker, which it multicasts on);
/// workers in the PS's rack or in racks without ATP are level-2 contributors. When the PS's
/// rack does not run ATP the PS unicasts to every worker and no level-2 admission is made.
pub fn atp_admissions<R: PartialEq + Copy>(
    workers: &[NodeId],
    racks: &[R],
    ps: NodeId,
    ps_rack: R,
    runs_atp: impl Fn(R) -> bool,
    port: impl Fn(R, NodeId) -> PortId,
    stale_timeout_ps: Time,
) -> Vec<(R, AtpSwitchJob)> {
    let multicast = runs_atp(ps_rack);
    let mut rack_order: Vec<R> = vec![];
    for &r in racks {
        if !rack_order.contains(&r) {
            rack_order.push(r);
        }
    }
    let mut out = vec![];
    let mut remote_targets = vec![];
    for &rack in rack_order.iter().filter(|&&r| r != ps_rack) {
        let local: Vec<NodeId> = workers.iter().zip(racks).filter(|(_, &r)| r == rack).map(|(&w, _)| w).collect();
        if runs_atp(rack) {
            remote_targets.push((local[0], None));
            let local_workers = local.iter().map(|&w| (port(rack, w), w)).collect();
            out.push((rack, AtpSwitchJob { local_workers, ps: None, multicast, stale_timeout_ps, ..Default::default() }));
        } else {
            remote_targets.extend(local.iter().map(|&w| (w, None)));
        }
    }
    if multicast {
        let local_workers = workers.iter().zip(racks).filter(|(_, &r)| r == ps_rack).map(|(&w, _)| (port(ps_rack, w), w)).collect();
        out.push((ps_rack, AtpSwitchJob { local_workers, ps: Some(ps), remote_targets, multicast, stale_timeout_ps, ..Default::default() }));
    }
    out
}
