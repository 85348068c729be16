//! Canary (De Sensi et al., FGCS): allreduce on dynamic trees that the switches build packet
//! by packet toward a per-block leader host (`../shared/specs/canary.md`, docs/canary.md).
//!
//! Set-up policy, the same in both drivers:
//! - the program runs on every switch, and every switch must be programmable: a Result
//!   comes back down only through switches that kept a descriptor (spec A32);
//! - the job is admitted at every switch with its window and, for `ina.table = "static"`, its
//!   slice of the descriptor table (an equal split among the static jobs of the network);
//! - block b is led by rank b mod N; the job id is the block ids' 8-bit tenant prefix.

use crate::plan::{Range, JobSpec, NetView, Param, Plan, PlanError, PlannedEndpoint, Quantization, Role, Servers, SwitchAdmission, TypedScheme};
use crate::noise;
use crate::ring::worker_endpoints;
use inalab_core::time::{MS, US};
use inalab_core::{Admission, NodeId, SwitchProgram};
use inalab_host::{CanaryConfig, CanaryHost, Quantized};
use inalab_switch::{CanarySwitch, CanarySwitchConfig, CanarySwitchJob};
use serde::{Deserialize, Serialize};

const PROGRAM: &str = "canary";
/// The share key of jobs that split the descriptor table statically.
const STATIC_SHARE: &str = "canary-table";

/// How a job's blocks find their descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TableMode {
    Hash,
    Static,
}

/// Who leads a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Leaders {
    /// Rank b mod N leads block b (Canary §3.1.4).
    RoundRobin,
    /// Rank 0 leads every block: the ablation of spec §3.3.
    Single,
}

/// How a switch picks the port toward a block's leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaderRouting {
    /// Canary's own balancer: a hash of the leader's address, left above
    /// `reroute_queue_bytes`.
    Canary,
    /// The network's routing, as for every other packet (the paper's SST: one adaptive
    /// routing for all traffic): `network.default_port`, `network.routing` and its threshold.
    Network,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CanaryIna {
    pub header_bytes: u32,
    pub aggregation_timeout_ps: u64,
    pub rtx_timeout_ps: u64,
    /// 0: [`LIFETIME_PER_RTX`] x `rtx_timeout_ps`.
    pub descriptor_lifetime_ps: u64,
    pub max_attempts: u8,
    pub window_blocks: u32,
    pub table: TableMode,
    pub leaders: Leaders,
    pub routing: LeaderRouting,
    pub reroute_queue_bytes: u64,
    pub noise_prob: f64,
    pub noise_ps: u64,
    pub noise_mode: noise::Mode,
    pub scale: f64,
}

impl Default for CanaryIna {
    fn default() -> Self {
        CanaryIna { header_bytes: 57, aggregation_timeout_ps: US, rtx_timeout_ps: MS, descriptor_lifetime_ps: 0, max_attempts: 3, window_blocks: 4096, table: TableMode::Hash, leaders: Leaders::RoundRobin, routing: LeaderRouting::Canary, reroute_queue_bytes: 512 * 1024, noise_prob: 0.0, noise_ps: US, noise_mode: noise::Mode::Stall, scale: inalab_host::quant::ATP_SCALE }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CanaryParams {
    pub ina: CanaryIna,
}

/// A flushed descriptor lives this many host retransmission timeouts by default: the host's
/// timeout follows the measured RTT above its floor `rtx_timeout_ps`, and a Result that comes
/// after the descriptors of its tree expired cannot go down it (each host then asks the leader
/// for it: one unicast per host instead of a multicast).
pub const LIFETIME_PER_RTX: u64 = 20;

const PARAMS: [Param; 11] = [
    Param { name: "ina.header_bytes", unit: "bytes", doc: "Bytes on the wire per packet besides its values (Canary §5.1: 19 B header + 14 B Ethernet + 24 B preamble, gap and FCS); a block is 256 values (1024 B), so a full packet is 1081 B.", range: Range::HEADER },
    Param { name: "ina.aggregation_timeout_ps", unit: "ps", doc: "Aggregation window of a switch from a block's first packet; at its end the partial sum goes on toward the leader (Canary §3.1.1; 1 us, the memory model's value, spec A1).", range: Range::Int { min: inalab_core::time::NS, max: crate::plan::MAX_TIME_PS } },
    Param { name: "ina.rtx_timeout_ps", unit: "ps", doc: "A host asks a block's leader when the block's result is this late (Canary §6 suggests 2 RTTs; 1 ms where no loss is expected, spec A13): the least and the first timeout; it then follows the measured RTT (RFC 6298, up to 1000 x this) and doubles per expiry of a block (up to 64 x).", range: Range::TIME },
    Param { name: "ina.descriptor_lifetime_ps", unit: "ps", doc: "A switch frees a flushed descriptor whose result has not passed for this long (its result was lost or its block re-issued), and another block may take its slot (spec A12). 0 = 20 x ina.rtx_timeout (20 ms at the defaults): the host's timeout grows with the measured RTT, and a result later than the lifetime finds no tree to go down.", range: Range::TIME_OR_ZERO },
    Param { name: "ina.max_attempts", unit: "", doc: "Re-issues of a block under a new id before the hosts fall back to reducing it through its leader (Canary §3.3; at most 3, the id's 2-bit attempt field).", range: Range::Int { min: 0, max: 3 } },
    Param { name: "ina.window_blocks", unit: "blocks", doc: "Blocks a host has in flight at most (spec A8: 4 MiB of blocks; the paper sends at line rate); with table = \"static\" at most half the job's slice of the smallest table (a margin: a switch may still hold a block when its result reached a host).", range: Range::SLOTS },
    Param { name: "ina.table", unit: "", doc: "How a block finds its descriptor: \"hash\" = a hash of its id over the whole table (collisions are bypassed to the leader, which restores the subtree); \"static\" = an equal slice of the table per static job, no collisions (Canary §3.2.1, Fig. 10).", range: Range::Choice(&["hash", "static"]) },
    Param { name: "ina.leaders", unit: "", doc: "Who leads a block: \"round_robin\" = rank b mod N leads block b (Canary §3.1.4), spreading the leaders' links and the trees' roots; \"single\" = rank 0 leads every block (an ablation the paper lacks: its downlink then carries every block's partial sums).", range: Range::Choice(&["round_robin", "single"]) },
    Param { name: "ina.routing", unit: "", doc: "How a switch picks the port toward a block's leader: \"canary\" = Canary's own load balancer (ina.reroute_queue); \"network\" = the network's routing, as every other packet (network.default_port, network.routing and network.adaptive_threshold; the paper's SST network routes all traffic by one adaptive rule, §5.1). Either way the default port depends on the leader alone, the same at every switch, so partial sums meet.", range: Range::Choice(&["canary", "network"]) },
    Param { name: "ina.reroute_queue_bytes", unit: "bytes", doc: "With ina.routing = \"canary\", Canary's load balancer: a switch sends a block toward its leader on the up port the leader's address picks (the same at every switch, so partial sums meet), unless that port has more than this queued, then on the least queued (Canary §5.2: half the buffer; half of 1 MiB here, spec A17).", range: Range::Int { min: 0, max: 1 << 50 } },
    Param { name: "ina.scale", unit: "", doc: "Fixed-point scale of the hosts' float32 values (switches sum int32, Canary §6): error at most workers / (2 scale) per value.", range: Range::SCALE },
];

pub struct Canary;

impl TypedScheme for Canary {
    type Config = CanaryParams;
    fn name(&self) -> &'static str {
        PROGRAM
    }
    fn doc(&self) -> &'static str {
        "Canary: allreduce on dynamic trees the switches build per block toward a per-block leader host, with timeouts, stragglers and collision restoration"
    }
    fn params(&self) -> Vec<Param> {
        PARAMS.iter().chain(&noise::PARAMS).cloned().collect()
    }
    fn servers(&self) -> Servers {
        Servers::None
    }
    /// What the ranges and serde cannot check.
    fn check(&self, c: &CanaryParams) -> Result<(), PlanError> {
        let i = &c.ina;
        if i.header_bytes < 20 {
            return Err(PlanError::new("ina.header_bytes", format!("{} bytes; Canary's header alone is 19 (plus 1 for the kind)", i.header_bytes)));
        }
        if i.aggregation_timeout_ps == 0 || i.rtx_timeout_ps == 0 {
            return Err(PlanError::new(if i.aggregation_timeout_ps == 0 { "ina.aggregation_timeout_ps" } else { "ina.rtx_timeout_ps" }, "must be a positive duration"));
        }
        if i.max_attempts > 3 {
            return Err(PlanError::new("ina.max_attempts", format!("{}; the id's attempt field allows 0..=3", i.max_attempts)));
        }
        if i.window_blocks == 0 {
            return Err(PlanError::new("ina.window_blocks", "must be at least 1 block"));
        }
        Ok(())
    }
    /// A block's leader answers its peers' requests for a result they lost (§3.3), also after
    /// its own last allreduce finished.
    fn workers_serve_peers(&self) -> bool {
        true
    }
    fn quantization(&self, c: &CanaryParams) -> Quantization {
        Quantization::FixedPoint { scale: c.ina.scale }
    }
    fn program(&self, switch: NodeId, net: &dyn NetView) -> Option<Box<dyn SwitchProgram>> {
        let cfg = CanarySwitchConfig { descriptors: CanarySwitchConfig::descriptors_for(net.memory_bytes(switch)), seed: inalab_core::splitmix64(switch as u64) };
        Some(Box::new(CanarySwitch::new(cfg)))
    }
    fn shares(&self, _job: &JobSpec, c: &CanaryParams, _net: &dyn NetView) -> Vec<String> {
        if c.ina.table == TableMode::Static {
            vec![STATIC_SHARE.into()]
        } else {
            vec![]
        }
    }
    fn plan(&self, job: &JobSpec, c: CanaryParams, net: &dyn NetView) -> Result<Plan, PlanError> {
        let tenant = u8::try_from(job.id).map_err(|_| PlanError::new("id", format!("job id {}; Canary's tenant prefix allows 0..=255", job.id)))?;
        let switches = net.switches();
        if switches.is_empty() {
            return Err(PlanError::new("scheme", "Canary runs on every switch, and this driver lists none"));
        }
        if let Some(&s) = switches.iter().find(|&&s| s > u16::MAX as NodeId) {
            return Err(PlanError::new("scheme", format!("{} has node id {s}; Canary's header names a switch in 16 bits", net.name(s))));
        }
        if let Some(&s) = switches.iter().find(|&&s| !net.programmable(s) || net.memory_bytes(s) < inalab_switch::CANARY_DESCRIPTOR_BYTES) {
            return Err(PlanError::new("scheme", format!("Canary needs every switch programmable with memory for descriptors; {} is not (set network.programmable = \"all\" and aggregator memory)", net.name(s))));
        }
        let (index, of) = net.share(job.id, STATIC_SHARE);
        // A static slice holds one block per slot, and block b + len may leave a host (b's
        // result reached it) while a switch on another path still holds b: a host's window is
        // at most half the smallest slice, as the static tree's (spec A8 says the slice; with
        // all of it 4 jobs of 16 hosts on 64-descriptor slices collided 15,098 times, 23 Gbps
        // against 54; three quarters still collided in the test that checks this).
        let slice_len = |s: NodeId| CanarySwitchConfig::descriptors_for(net.memory_bytes(s)) / of.max(1);
        let window_blocks = match c.ina.table {
            TableMode::Hash => c.ina.window_blocks,
            TableMode::Static => switches.iter().map(|&s| slice_len(s) / 2).min().unwrap_or(0).min(c.ina.window_blocks),
        };
        if window_blocks == 0 {
            return Err(PlanError::new("ina.table", format!("the descriptor tables cannot be split among {of} static jobs")));
        }
        let cfg = CanaryConfig {
            tenant,
            workers: worker_endpoints(job),
            tors: job.workers.iter().map(|&h| net.tor(h)).collect(),
            header_bytes: c.ina.header_bytes,
            rtx_timeout_ps: c.ina.rtx_timeout_ps,
            max_attempts: c.ina.max_attempts,
            window_blocks,
            single_leader: c.ina.leaders == Leaders::Single,
        };
        let err = |e: inalab_host::ConfigError| PlanError::new("workers", e.0);
        let mut plan = Plan::default();
        for (r, &h) in job.workers.iter().enumerate() {
            let host = CanaryHost::new(cfg.clone(), r).map_err(err)?;
            let noisy = noise::wrap(Box::new(host), c.ina.noise_prob, c.ina.noise_ps, c.ina.noise_mode, job.id, r);
            let proto = Quantized::converting(noisy, c.ina.scale, r, job.workers.len());
            plan.endpoints.push(PlannedEndpoint { host: h, role: Role::Worker { rank: r as u32 }, proto: Box::new(proto), config: format!("{cfg:?} rank {r}") });
        }
        let lifetime = match c.ina.descriptor_lifetime_ps {
            0 => LIFETIME_PER_RTX.saturating_mul(c.ina.rtx_timeout_ps),
            l => l,
        };
        for s in switches {
            let slice = match c.ina.table {
                TableMode::Hash => None,
                TableMode::Static => Some((index * slice_len(s), slice_len(s))),
            };
            let adm = CanarySwitchJob { timeout_ps: c.ina.aggregation_timeout_ps, stale_ps: lifetime, slice, reroute_bytes: (c.ina.routing == LeaderRouting::Canary).then_some(c.ina.reroute_queue_bytes) };
            plan.admissions.push(SwitchAdmission { switch: s, program: PROGRAM, state: Admission::new(adm), field: "ina" });
        }
        Ok(plan)
    }
}
