//! Rina (Chen et al., ICNP 2024; `../shared/specs/rina.md`): ring-allreduce over groups, an
//! INA rack counting as one ring member.
//!
//! Set-up policy:
//! - the job's workers are grouped by ToR; a ToR that is programmable, has memory for the
//!   job's slots and `ina.min_rack` (default 2, spec A1) or more of the job's workers makes
//!   its workers one group (agent: the lowest rank); every other worker is a group of one;
//! - groups are in ring order by their lowest rank (spec A14);
//! - each INA ToR gives the job a contiguous region of `ina.slots` slots (no hashing, §V),
//!   the ToR's slots split equally among the network's Rina jobs at most.

use crate::plan::{Range, JobSpec, NetView, Param, Plan, PlanError, PlannedEndpoint, Quantization, Role, Servers, SwitchAdmission, TypedScheme};
use crate::ring::worker_endpoints;
use inalab_core::time::MS;
use inalab_core::{Admission, Endpoint, NodeId, SwitchProgram};
use inalab_host::{Quantized, RinaConfig, RinaGroup, RinaHost};
use inalab_switch::{rina_slots_for, RinaSwitch, RinaSwitchJob, RINA_MAX_MEMBERS};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

const PROGRAM: &str = "rina";
/// The share key of the jobs that split every INA ToR's slots.
const SLOTS_SHARE: &str = "rina-slots";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RinaIna {
    pub header_bytes: u32,
    pub window_bytes: u64,
    pub slots: u32,
    pub rto_ps: u64,
    pub repair_ps: u64,
    pub min_rack: u32,
    pub step_overhead_ps: u64,
    pub step_jitter_ps: u64,
    pub scale: f64,
}

impl Default for RinaIna {
    fn default() -> Self {
        RinaIna { header_bytes: 71, window_bytes: 256_000, slots: 1024, rto_ps: MS, repair_ps: 2 * MS, min_rack: 2, step_overhead_ps: 0, step_jitter_ps: 0, scale: inalab_host::quant::ATP_SCALE }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RinaParams {
    pub ina: RinaIna,
}

const PARAMS: [Param; 9] = [
    Param { name: "ina.header_bytes", unit: "bytes", doc: "Bytes on the wire per Rina packet besides its 62 values: the 29-B Rina header (kind tag included) and 42 B of Ethernet, IP and UDP; a full packet is 319 B.", range: Range::HEADER },
    Param { name: "ina.window_bytes", unit: "bytes", doc: "Rina's \"full speed\" window (§IV-C-1, spec: link rate x base RTT): ScatterReduce starts at it and never grows above it; AllGather starts at one packet and slow-starts up to it. The default is one bandwidth-delay product at 100 Gbps over a 20 us round trip (a 3-tier fat tree with 1 us links); ATP's 60,000 B capped a k=4 fat tree's ring at 16 Gbps.", range: Range::WINDOW },
    Param { name: "ina.slots", unit: "slots", doc: "Slots of a Rina job's contiguous region at each INA ToR (at most the ToR's slots over the number of Rina jobs); a member's DATA in flight span fewer, so live tags never share a slot. At least the window in packets.", range: Range::SLOTS },
    Param { name: "ina.rto_ps", unit: "ps", doc: "Floor and initial value of a Rina host's retransmission timeout (RFC 6298 estimate above it, doubling per expiry of a packet up to 64 times; spec §1.7: 1 ms).", range: Range::TIME },
    Param { name: "ina.repair_ps", unit: "ps", doc: "A rack member that heard nothing of an unfinished allreduce for this long asks its agent again for the finished-chunk packets it misses (spec §1.3 item 5: 2 x RTO).", range: Range::TIME },
    Param { name: "ina.min_rack", unit: "workers", doc: "Workers of the job an INA ToR needs to make its rack one abstracted ring member (spec A1: the paper says more than two, which would leave its own simulated fat-tree without Rina); racks with fewer run as autonomous ring members.", range: Range::Int { min: 2, max: inalab_switch::RINA_MAX_MEMBERS as u64 } },
    Param { name: "ina.step_overhead_ps", unit: "ps", doc: "O of the dependency chain (Rina §III-A, eq. 1): a fixed wait of every host before its part of each ScatterReduce step (a rack member before its DATA, an autonomous worker before its AGGs).", range: Range::TIME_OR_ZERO },
    Param { name: "ina.step_jitter_ps", unit: "ps", doc: "sigma of the dependency chain (eq. 1): each host also waits max(0, sigma Z), Z standard normal drawn per host and step from the run's seed, so a step waits for its slowest host.", range: Range::TIME_OR_ZERO },
    Param { name: "ina.scale", unit: "", doc: "Fixed-point scale of the hosts' float32 values (switches and hosts sum int32): error at most workers / (2 scale) per value.", range: Range::SCALE },
];

pub struct Rina;

/// The job's groups in ring order, each with its ranks.
fn groups(job: &JobSpec, net: &dyn NetView, c: &RinaIna, slots_at: impl Fn(NodeId) -> u32) -> Vec<(Option<NodeId>, Vec<usize>)> {
    let mut by_tor: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
    for (r, &h) in job.workers.iter().enumerate() {
        by_tor.entry(net.tor(h)).or_default().push(r);
    }
    let mut groups = vec![];
    for (tor, ranks) in by_tor {
        let ina = net.programmable(tor) && ranks.len() >= c.min_rack as usize && ranks.len() <= RINA_MAX_MEMBERS && slots_at(tor) >= c.slots;
        if ina {
            groups.push((Some(tor), ranks));
        } else {
            groups.extend(ranks.into_iter().map(|r| (None, vec![r])));
        }
    }
    groups.sort_by_key(|(_, ranks)| ranks[0]);
    groups
}

impl TypedScheme for Rina {
    type Config = RinaParams;
    fn name(&self) -> &'static str {
        PROGRAM
    }
    fn doc(&self) -> &'static str {
        "Rina: ring-allreduce over groups, each INA rack one abstracted worker whose ToR sums the rack's chunk and sends it to the next group (Chen et al., ICNP 2024)"
    }
    fn params(&self) -> Vec<Param> {
        PARAMS.to_vec()
    }
    fn servers(&self) -> Servers {
        Servers::None
    }
    /// What the ranges and serde cannot check.
    fn check(&self, c: &RinaParams) -> Result<(), PlanError> {
        let i = &c.ina;
        let least = 1 + inalab_core::wire::RinaHeader::LEN as u32;
        if i.header_bytes < least {
            return Err(PlanError::new("ina.header_bytes", format!("{} bytes; the Rina header alone is {least}", i.header_bytes)));
        }
        let packet = i.header_bytes as u64 + 4 * inalab_host::RINA_PACKET_VALUES as u64;
        if i.window_bytes < packet {
            return Err(PlanError::new("ina.window_bytes", format!("{} bytes; at least one full packet ({packet} B)", i.window_bytes)));
        }
        if (i.slots as u64) < i.window_bytes / packet {
            return Err(PlanError::new("ina.slots", format!("{} slots; at least the window in packets ({})", i.slots, i.window_bytes / packet)));
        }
        for (v, name) in [(i.rto_ps, "ina.rto_ps"), (i.repair_ps, "ina.repair_ps")] {
            if v == 0 {
                return Err(PlanError::new(name, "must be a positive duration"));
            }
        }
        if !(2..=RINA_MAX_MEMBERS as u32).contains(&i.min_rack) {
            return Err(PlanError::new("ina.min_rack", format!("{}; a rack group has 2..={RINA_MAX_MEMBERS} workers", i.min_rack)));
        }
        Ok(())
    }
    fn quantization(&self, c: &RinaParams) -> Quantization {
        Quantization::FixedPoint { scale: c.ina.scale }
    }
    fn program(&self, switch: NodeId, net: &dyn NetView) -> Option<Box<dyn SwitchProgram>> {
        Some(Box::new(RinaSwitch::new(rina_slots_for(net.memory_bytes(switch)))))
    }
    fn shares(&self, _job: &JobSpec, _config: &RinaParams, _net: &dyn NetView) -> Vec<String> {
        vec![SLOTS_SHARE.into()]
    }
    fn plan(&self, job: &JobSpec, c: RinaParams, net: &dyn NetView) -> Result<Plan, PlanError> {
        let c = c.ina;
        let id = u16::try_from(job.id).map_err(|_| PlanError::new("id", format!("job id {}; Rina's header holds 0..=65535", job.id)))?;
        let (index, of) = net.share(job.id, SLOTS_SHARE);
        let slice = |s: NodeId| rina_slots_for(net.memory_bytes(s)) / of.max(1);
        let eps = worker_endpoints(job);
        let layout = groups(job, net, &c, slice);
        let cfg = RinaConfig {
            job: id,
            groups: layout.iter().map(|(tor, ranks)| RinaGroup { members: ranks.iter().map(|&r| eps[r]).collect(), tor: *tor }).collect(),
            ranks: eps.clone(),
            header_bytes: c.header_bytes,
            rto_ps: c.rto_ps,
            window_bytes: c.window_bytes,
            slots: c.slots,
            repair_ps: c.repair_ps,
            step_overhead_ps: c.step_overhead_ps,
            step_jitter_ps: c.step_jitter_ps,
            seed: inalab_core::splitmix64(net.seed() ^ (job.id as u64) << 32),
        };
        let mut plan = Plan::default();
        for (r, &h) in job.workers.iter().enumerate() {
            let host = RinaHost::new(cfg.clone(), eps[r]).map_err(|e| PlanError::new("workers", e.0))?;
            // Rina sums i32 only, with no overflow fallback: floats are converted around it.
            let proto = Quantized::converting(Box::new(host), c.scale, r, job.workers.len());
            plan.endpoints.push(PlannedEndpoint { host: h, role: Role::Worker { rank: r as u32 }, proto: Box::new(proto), config: format!("{cfg:?} rank {r}") });
        }
        let gs = layout.len();
        for (g, (tor, ranks)) in layout.iter().enumerate() {
            let Some(tor) = *tor else { continue };
            // A driver that knows a switch's ports only at that switch (the UDP runtime plans
            // once per switch and once per host) gets the admissions it can fill.
            let Some(ports) = ranks.iter().map(|&r| net.port_toward(tor, job.workers[r])).collect::<Option<Vec<_>>>() else { continue };
            let members = ports.into_iter().zip(ranks).map(|(p, &r)| (p, eps[r])).collect();
            let next: Endpoint = eps[layout[(g + 1) % gs].1[0]];
            let state = Admission::new(RinaSwitchJob { members, next, ranks: eps.clone(), slots: (index * slice(tor), c.slots) });
            plan.admissions.push(SwitchAdmission { switch: tor, program: PROGRAM, state, field: "ina.slots" });
        }
        Ok(plan)
    }
}
