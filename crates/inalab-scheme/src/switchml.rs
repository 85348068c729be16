//! SwitchML (NSDI '21): workers stream to their shared ToR, which aggregates in the job's
//! static slot pool and multicasts results back; no parameter server.
//!
//! Pool policy, the same in both drivers: `ina.pool_slots` slots, or when it is 0 an equal
//! share of the switch's slots among the SwitchML jobs the driver sets up there.

use crate::plan::{JobSpec, NetView, Param, Plan, PlanError, PlannedEndpoint, Quantization, Range, Role, Servers, SwitchAdmission, TypedScheme};
use inalab_core::time::MS;
use inalab_core::{Admission, Endpoint, NodeId, PortId, SwitchProgram};
use inalab_host::{Quantized, SwitchMlConfig, SwitchMlWorker};
use inalab_switch::{slot_units, SwitchMlJob, SwitchMlSwitch, SLOT_BYTES};
use serde::{Deserialize, Serialize};

const PROGRAM: &str = "switchml";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SwitchMlIna {
    /// Bytes on the wire per packet, headers included.
    pub packet_bytes: u32,
    /// Header bytes per packet.
    pub header_bytes: u32,
    /// Loss-recovery timeout per slot, ps.
    pub timeout_ps: u64,
    /// Slots of the job's static pool; 0 = an equal share.
    pub pool_slots: u32,
}

impl Default for SwitchMlIna {
    fn default() -> Self {
        SwitchMlIna { packet_bytes: 180, header_bytes: 52, timeout_ps: MS, pool_slots: 0 }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SwitchMlParams {
    pub ina: SwitchMlIna,
}

const PARAMS: [Param; 4] = [
    Param { name: "ina.packet_bytes", unit: "bytes", doc: "Bytes on the wire per gradient packet, headers included.", range: Range::PACKET },
    Param { name: "ina.header_bytes", unit: "bytes", doc: "Header bytes of a gradient packet; the rest (a multiple of 4 B) carries 32-bit values.", range: Range::HEADER },
    Param { name: "ina.timeout_ps", unit: "ps", doc: "Worker loss-recovery timeout: a slot's packet is resent after this long without its result, until round trips are measured; then the RTO follows them (RFC 6298, this value its floor) and backs off up to 64x.", range: Range::TIME },
    Param { name: "ina.pool_slots", unit: "slots", doc: "Slots of the job's static switch pool, 0 = an equal share of the switch among the jobs of the scheme there.", range: Range::Int { min: 0, max: crate::plan::MAX_SLOTS } },
];

pub struct SwitchMl;

fn share_key(tor: NodeId) -> String {
    format!("{PROGRAM}@{tor}")
}

impl TypedScheme for SwitchMl {
    type Config = SwitchMlParams;
    fn name(&self) -> &'static str {
        PROGRAM
    }
    fn doc(&self) -> &'static str {
        "SwitchML: a static slot pool in the workers' shared top-of-rack switch, results multicast back, no PS"
    }
    fn params(&self) -> Vec<Param> {
        PARAMS.to_vec()
    }
    fn any_packet_values(&self) -> bool {
        true
    }
    /// By slot: the switch keeps each slot's sum and bitmaps apart from every other slot's.
    fn steering(&self) -> Option<fn(&inalab_core::wire::Header) -> u32> {
        Some(|h| match h {
            inalab_core::wire::Header::SwitchMl(h) => h.slot,
            _ => 0,
        })
    }
    fn servers(&self) -> Servers {
        Servers::None
    }
    fn quantization(&self, _config: &SwitchMlParams) -> Quantization {
        Quantization::AgreedExponent
    }
    fn program(&self, switch: NodeId, net: &dyn NetView) -> Option<Box<dyn SwitchProgram>> {
        Some(Box::new(SwitchMlSwitch::new(net.memory_bytes(switch))))
    }
    fn shares(&self, job: &JobSpec, _config: &SwitchMlParams, net: &dyn NetView) -> Vec<String> {
        job.workers.first().map(|&w| vec![share_key(net.tor(w))]).unwrap_or_default()
    }
    fn plan(&self, job: &JobSpec, c: SwitchMlParams, net: &dyn NetView) -> Result<Plan, PlanError> {
        let first = *job.workers.first().ok_or_else(|| PlanError::new("workers", "a job needs at least one worker"))?;
        let tor = net.tor(first);
        if let Some(&w) = job.workers.iter().find(|&&w| net.tor(w) != tor) {
            return Err(PlanError::new(
                "workers",
                format!("SwitchML aggregates at one switch, so all workers must share a ToR; {} is not under {}", net.name(w), net.name(tor)),
            ));
        }
        if !net.programmable(tor) {
            return Err(PlanError::new("workers", format!("SwitchML needs the workers' switch {} to be programmable", net.name(tor))));
        }
        let mut ina = c.ina;
        // Values per packet; a packet wider than the hardware's takes several slots.
        let width = ina.packet_bytes.saturating_sub(ina.header_bytes) / 4;
        if ina.pool_slots == 0 {
            let slots = net.memory_bytes(tor) / SLOT_BYTES / slot_units(width) as u64;
            let (_, of) = net.share(job.id, &share_key(tor));
            ina.pool_slots = (slots / of.max(1) as u64).min(u32::MAX as u64) as u32;
        }
        // The pool must fit the switch's memory before anything is built for it: each worker
        // keeps state per slot, so a pool the switch would refuse must not be allocated first
        // (2^31 slots took a shared switch's process down before its admission said no).
        let (units, memory) = (slot_units(width) as u64, net.memory_bytes(tor));
        let total = memory / SLOT_BYTES;
        if ina.pool_slots as u64 * units > total {
            // (Worded as the program's own refusal, which counts the free slots.)
            return Err(PlanError::new(
                "ina.pool_slots",
                format!(
                    "a pool of {} slots of {width} values ({units} hardware slot(s) each) does not fit: at most {total} of the switch's {total} slots ({SLOT_BYTES} B each, {memory} B at {}) could be free",
                    ina.pool_slots,
                    net.name(tor)
                ),
            ));
        }
        let port = job.worker_port;
        let switch = Endpoint { host: tor, port };
        let mut plan = Plan::default();
        let mut admitted = vec![];
        for (r, &h) in job.workers.iter().enumerate() {
            let local = Endpoint { host: h, port };
            let cfg = SwitchMlConfig {
                pool_slots: ina.pool_slots,
                timeout_ps: ina.timeout_ps,
                packet_bytes: ina.packet_bytes,
                header_bytes: ina.header_bytes,
                ..SwitchMlConfig::new(job.id, r as u16, switch)
            };
            let config = format!("{cfg:?}");
            let worker = SwitchMlWorker::new(local, cfg).map_err(|e| PlanError::new("ina", e.0))?;
            let proto = Quantized::new(Box::new(worker), Quantization::AgreedExponent, r, job.workers.len());
            plan.endpoints.push(PlannedEndpoint { host: h, role: Role::Worker { rank: r as u32 }, proto: Box::new(proto), config });
            admitted.push((local, net.port_toward(tor, h).unwrap_or(PortId::MAX)));
        }
        let state = Admission::new(SwitchMlJob { workers: admitted, pool_slots: ina.pool_slots, values_per_packet: width });
        plan.admissions.push(SwitchAdmission { switch: tor, program: PROGRAM, state, field: "ina.pool_slots" });
        Ok(plan)
    }
}
