//! DSA (Wang et al., ICNP): preemptive sharing of switch aggregators by priority, with a PS
//! per job that completes what the switch could not and drives the reminder mechanism.
//!
//! Set-up policy, the same in both drivers:
//! - the job aggregates at its PS's top-of-rack switch (every gradient passes it on its way
//!   to the PS; the paper has one switch), which holds the job's PS and workers for
//!   eviction and multicast; when that switch is not programmable, everything goes to the PS,
//!   which unicasts results;
//! - priorities come from the application (`TensorAttrs::priority`, 16.16 fixed point of
//!   DSA's P in 1/ms; the simulator's workload computes them, `inalab.dsa.priority` too);
//! - the window is AIMD from `transport.init_window_bytes` / `increment_bytes`, at least one
//!   packet.

use crate::plan::{
    JobSpec, NetView, Param, Plan, PlanError, PlannedEndpoint,
    Quantization, Range, Role, Servers, SwitchAdmission, TensorContext, TypedScheme,
};
use crate::ring::worker_endpoints;
use crate::transport::{TransportParams, TRANSPORT_PARAMS};
use inalab_core::time::MS;
use inalab_core::wire::DsaHeader;
use inalab_core::{Admission, Endpoint, NodeId, SwitchProgram};
use inalab_host::{AimdConfig, DsaConfig, DsaServer, DsaWorker, Quantized, SlotMoves};
use inalab_switch::{DsaIndex, DsaPolicy, DsaSwitch, DsaSwitchConfig, DsaSwitchJob};
use serde::{Deserialize, Serialize};

const PROGRAM: &str = "dsa";

/// Who wins a collision on the switch (DSA §V, §VII-C).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DsaPolicyName {
    Dsa,
    AlwaysPreempt,
    PreemptHalf,
    Fcfs,
}

/// How the switch addresses a fragment to an aggregator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DsaIndexName {
    Slots,
    Hash,
    Consecutive,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DsaIna {
    pub packet_bytes: u32,
    pub header_bytes: u32,
    pub policy: DsaPolicyName,
    pub index: DsaIndexName,
    pub slots: u32,
    pub min_rto_ps: u64,
    pub retx_before_notify: u32,
    pub ps_ack_frees: bool,
    pub scale: f64,
    pub max_window_packets: u32,
    pub move_slots: bool,
}

impl Default for DsaIna {
    fn default() -> Self {
        DsaIna {
            packet_bytes: 306,
            header_bytes: 58,
            policy: DsaPolicyName::Dsa,
            index: DsaIndexName::Slots,
            slots: inalab_host::ATP_DEFAULT_SLOTS,
            min_rto_ps: MS,
            retx_before_notify: 3,
            ps_ack_frees: true,
            scale: inalab_host::quant::ATP_SCALE,
            max_window_packets: crate::MAX_SLOTS as u32,
            move_slots: false,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DsaParams {
    pub transport: TransportParams,
    pub ina: DsaIna,
}

const INA_PARAMS: [Param; 11] = [
    Param { name: "ina.packet_bytes", unit: "bytes", doc: "Bytes on the wire per gradient packet, headers included (DSA §VII-B: 306, as ATP).", range: Range::PACKET },
    Param { name: "ina.header_bytes", unit: "bytes", doc: "Header bytes of a gradient packet (42 B Ethernet/IPv4/UDP + 16 B DSA); the rest carries 32-bit values.", range: Range::HEADER },
    Param {
        name: "ina.policy",
        unit: "",
        doc: "Who wins a collision on the switch: \"dsa\" = the packet if its priority is strictly higher, a loser halves the aggregator's priority; \"always-preempt\" and \"preempt-half\" = the paper's two strawmen (every collision, or one in two by a seeded coin, no downgrading); \"fcfs\" = never (an ablation that keeps completion on the switch).",
        range: Range::Choice(&["dsa", "always-preempt", "preempt-half", "fcfs"]),
    },
    Param {
        name: "ina.index",
        unit: "",
        doc: "How the switch addresses a fragment to an aggregator: \"slots\" = ATP's per-job slot table (DSA §III-A: \"by hashing as in statistical INA\"): PSN p on entry p mod `ina.slots` of the same table of distinct hashed aggregators ATP builds for the job and pool, and a worker never sends a PSN `ina.slots` or more beyond its oldest unacknowledged one, so a job never collides with itself; \"consecutive\" = a hashed offset per job and consecutive PSNs on consecutive aggregators (an ablation: jobs' ranges overlap in runs); \"hash\" = Hash(job, PSN) per fragment (spec §1.4), so a job's fragments in flight also collide with each other (a lone 8-worker job under the paper's send jitter: 1.45x slower, docs/dsa.md).",
        range: Range::Choice(&["slots", "hash", "consecutive"]),
    },
    Param {
        name: "ina.slots",
        unit: "aggregators",
        doc: "Length of a job's slot table with `ina.index = \"slots\"` (ATP's, 512 by default): the aggregators it uses, and the most PSNs a worker has in flight counted from its oldest unacknowledged one. A pool smaller than this is used more than once, as ATP's. At most 2^20.",
        range: Range::Int { min: 1, max: inalab_host::ATP_MAX_SLOTS as u64 },
    },
    Param { name: "ina.min_rto_ps", unit: "ps", doc: "Floor and initial value of the workers' and the PS's timeouts (DSA §VI: 1 ms): RFC 6298 estimates of the RTT (a fragment's completion time from its first send, also when resent, or from its latest NOTIFY when the PS recovered it) and of the lifetimes of PS entries no reminder completed; a worker doubles a fragment's timeout at each of its expiries (RFC 6298 §5.5).", range: Range::TIME },
    Param { name: "ina.retx_before_notify", unit: "", doc: "Retransmissions of a fragment before the worker sends the PS a NOTIFY with its gradient, repeated every timeout (DSA §IV-B: 3).", range: Range::Int { min: 0, max: 1000 } },
    Param { name: "ina.ps_ack_frees", unit: "", doc: "An ACK from the PS frees a switch aggregator still holding its fragment (a leak guard not in the paper).", range: Range::Bool },
    Param { name: "ina.scale", unit: "", doc: "Fixed-point scale of the workers' float32 values (value x scale, rounded, as i32): error at most workers / (2 scale) per value.", range: Range::SCALE },
    Param {
        name: "ina.max_window_packets",
        unit: "packets",
        doc: "Ceiling of a worker's AIMD window, none in practice by default (the paper gives none, #37): with `ina.index = \"slots\"` the slot table already bounds a worker's PSNs in flight, as ATP's does. Set one for the `hash` and `consecutive` ablations, where nothing else stops a worker ahead of its job's slowest from holding thousands of half-aggregated fragments (512 was the default before the slot table).",
        range: Range::SLOTS,
    },
    Param {
        name: "ina.move_slots",
        unit: "",
        doc: "An ablation, not the paper's DSA (which never moves an address): the PS moves the slot of a fragment that met a collision to an aggregator the job does not use, as ATP's PS does (ATP §3.6), and tells the switch with a MOVE before the fragment's ACK. Needs `ina.index = \"slots\"`. Two 8-worker jobs at 5 MB: 381 collisions without, 51 with, ATP 62 (docs/dsa.md).",
        range: Range::Bool,
    },
];

pub struct Dsa;

/// Job `id`'s slot table (`inalab_host::dsa_pool_slot_table`) over the pool a switch of
/// `memory_bytes` holds.
pub fn slot_table(id: u16, slots: u32, memory_bytes: u64) -> Vec<u32> {
    let aggregators = DsaSwitchConfig::aggregators_for(memory_bytes);
    inalab_host::dsa_pool_slot_table(id, slots, aggregators)
}

impl TypedScheme for Dsa {
    type Config = DsaParams;
    fn name(&self) -> &'static str {
        PROGRAM
    }
    fn doc(&self) -> &'static str {
        "DSA: a switch aggregator array shared by all jobs with preemption by priority; evicted and losing packets go to the job's PS, which reminds the switch and the workers"
    }
    fn params(&self) -> Vec<Param> {
        TRANSPORT_PARAMS
            .iter()
            .chain(&INA_PARAMS)
            .copied()
            .collect()
    }
    fn servers(&self) -> Servers {
        Servers::ExactlyOne
    }
    /// What the ranges and serde cannot check.
    fn check(&self, c: &DsaParams) -> Result<(), PlanError> {
        let i = &c.ina;
        if i.header_bytes < 17
            || i.packet_bytes < i.header_bytes + 4
            || (i.packet_bytes - i.header_bytes) / 4 != inalab_host::DSA_VALUES as u32
        {
            return Err(PlanError::new(
                "ina.packet_bytes",
                format!("{} bytes with a {}-byte header; DSA's aggregators hold {} values, so packet_bytes - header_bytes must be {} (or {} + 3)", i.packet_bytes, i.header_bytes, inalab_host::DSA_VALUES, 4 * inalab_host::DSA_VALUES, 4 * inalab_host::DSA_VALUES),
            ));
        }
        if i.move_slots && i.index != DsaIndexName::Slots {
            return Err(PlanError::new("ina.move_slots", "moves slots of a slot table: needs ina.index = \"slots\""));
        }
        if i.max_window_packets == 0 {
            return Err(PlanError::new("ina.max_window_packets", "must be at least 1 packet"));
        }
        if i.min_rto_ps == 0 {
            return Err(PlanError::new(
                "ina.min_rto_ps",
                "must be a positive duration",
            ));
        }
        Ok(())
    }
    fn quantization(&self, c: &DsaParams) -> Quantization {
        Quantization::FixedPoint { scale: c.ina.scale }
    }
    fn program(&self, switch: NodeId, net: &dyn NetView) -> Option<Box<dyn SwitchProgram>> {
        let cfg = DsaSwitchConfig {
            aggregators: DsaSwitchConfig::aggregators_for(net.memory_bytes(switch)),
            seed: switch as u64,
        };
        Some(Box::new(DsaSwitch::new(cfg)))
    }
    fn plan(&self, job: &JobSpec, c: DsaParams, net: &dyn NetView) -> Result<Plan, PlanError> {
        let ps_host = job.servers[0];
        if job.workers.len() > DsaHeader::MAX_FAN_IN as usize {
            return Err(PlanError::new(
                "workers",
                format!(
                    "{} workers; DSA's contributor bitmap allows 1..=32",
                    job.workers.len()
                ),
            ));
        }
        let id = u16::try_from(job.id).map_err(|_| {
            PlanError::new(
                "id",
                format!("job id {}; DSA's job field allows 0..=65535", job.id),
            )
        })?;
        let ps_rack = net.tor(ps_host);
        let multicast = net.programmable(ps_rack)
            && net.memory_bytes(ps_rack) >= inalab_switch::DSA_AGGREGATOR_BYTES;
        let t = &c.transport;
        let ps = Endpoint {
            host: ps_host,
            port: job.server_port,
        };
        let workers = worker_endpoints(job);
        let cfg = DsaConfig {
            job: id,
            workers: workers.clone(),
            ps,
            header_bytes: c.ina.header_bytes,
            aimd: AimdConfig {
                initial_window_bytes: t.init_window_bytes,
                increment_bytes: t.increment_bytes,
                min_window_bytes: c.ina.packet_bytes as u64,
                initial_ssthresh_bytes: u64::MAX,
                max_window_bytes: c.ina.max_window_packets as u64 * c.ina.packet_bytes as u64,
            },
            min_rto_ps: c.ina.min_rto_ps,
            retx_before_notify: c.ina.retx_before_notify,
            multicast,
            max_psn_span: (multicast && c.ina.index == DsaIndexName::Slots).then_some(c.ina.slots),
            moves: (multicast && c.ina.move_slots).then(|| SlotMoves { pool: DsaSwitchConfig::aggregators_for(net.memory_bytes(ps_rack)), slots: c.ina.slots }),
        };
        let mut plan = Plan::default();
        for (r, &h) in job.workers.iter().enumerate() {
            let worker = DsaWorker::new(cfg.clone(), r as u32);
            // DSA has no overflow fallback: the layer converts, and a value or sum out of
            // range reaches every worker as a rail (inalab_core::rail).
            let proto = Quantized::converting(Box::new(worker), c.ina.scale, r, job.workers.len());
            plan.endpoints.push(PlannedEndpoint {
                host: h,
                role: Role::Worker { rank: r as u32 },
                proto: Box::new(proto),
                config: format!("{cfg:?} rank {r}"),
            });
        }
        plan.endpoints.push(PlannedEndpoint {
            host: ps_host,
            role: Role::Server { index: 0 },
            proto: Box::new(DsaServer::new(cfg.clone())),
            config: format!("{cfg:?}"),
        });
        if multicast {
            let policy = match c.ina.policy {
                DsaPolicyName::Dsa => DsaPolicy::Dsa,
                DsaPolicyName::AlwaysPreempt => DsaPolicy::AlwaysPreempt,
                DsaPolicyName::PreemptHalf => DsaPolicy::PreemptHalf,
                DsaPolicyName::Fcfs => DsaPolicy::Fcfs,
            };
            let adm = DsaSwitchJob {
                ps,
                workers,
                policy,
                ps_ack_frees: c.ina.ps_ack_frees,
                index: match c.ina.index {
                    DsaIndexName::Slots => DsaIndex::Slots(slot_table(id, c.ina.slots, net.memory_bytes(ps_rack))),
                    DsaIndexName::Hash => DsaIndex::Hash,
                    DsaIndexName::Consecutive => DsaIndex::Consecutive,
                },
            };
            plan.admissions.push(SwitchAdmission {
                switch: ps_rack,
                program: PROGRAM,
                state: Admission::new(adm),
                field: "servers",
            });
        }
        Ok(plan)
    }
    fn priority(&self, _config: &DsaParams, t: &TensorContext) -> u32 {
        inalab_host::dsa_priority(t.layer, t.layers, t.comm_over_comp, t.remaining_ps)
    }
}
