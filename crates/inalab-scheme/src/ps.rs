//! Parameter servers: N-to-1 (`ps`, separate server hosts) and sharded N-to-N (`ps_sharded`,
//! BytePS-like, a server on every worker host).

use crate::plan::{JobSpec, NetView, Param, Plan, PlanError, PlannedEndpoint, Range, Role, Servers, TypedScheme};
use crate::ring::{transport_error, worker_endpoints};
use crate::transport::{TransportParams, TRANSPORT_PARAMS};
use inalab_core::Endpoint;
use inalab_host::{PsConfig, PsServer, PsWorker};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PsParams {
    pub transport: TransportParams,
    /// Tensor partition size, bytes.
    pub partition_bytes: u64,
}

impl Default for PsParams {
    fn default() -> Self {
        PsParams { transport: TransportParams::default(), partition_bytes: 4 << 20 }
    }
}

const PARTITION: Param = Param { name: "partition_bytes", unit: "bytes", doc: "Tensor partition size for parameter servers.", range: Range::Int { min: 1, max: 1 << 40 } };

/// `ps` (sharded: false) and `ps_sharded` (true).
pub struct Ps {
    pub sharded: bool,
}

impl TypedScheme for Ps {
    type Config = PsParams;
    fn name(&self) -> &'static str {
        if self.sharded {
            "ps_sharded"
        } else {
            "ps"
        }
    }
    fn doc(&self) -> &'static str {
        if self.sharded {
            "parameter servers sharded over the workers' hosts (BytePS-like, N-to-N)"
        } else {
            "N-to-1 parameter server on separate hosts"
        }
    }
    fn params(&self) -> Vec<Param> {
        TRANSPORT_PARAMS.iter().chain([&PARTITION]).copied().collect()
    }
    fn servers(&self) -> Servers {
        if self.sharded {
            Servers::None
        } else {
            Servers::AtLeastOne
        }
    }
    fn plan(&self, job: &JobSpec, c: PsParams, _net: &dyn NetView) -> Result<Plan, PlanError> {
        let cfg = c.transport.config();
        let server_hosts = if self.sharded { &job.workers } else { &job.servers };
        let sep: Vec<Endpoint> = server_hosts.iter().map(|&h| Endpoint { host: h, port: job.server_port }).collect();
        let wep = worker_endpoints(job);
        let pcfg = PsConfig { partition_bytes: c.partition_bytes, transport: cfg.clone() };
        let mut plan = Plan::default();
        for (r, &h) in job.workers.iter().enumerate() {
            let proto = PsWorker::new(wep[r], sep.clone(), pcfg.clone()).map_err(|e| PlanError::new("partition", e.0))?;
            plan.endpoints.push(PlannedEndpoint { host: h, role: Role::Worker { rank: r as u32 }, proto: Box::new(proto), config: format!("{pcfg:?} servers {sep:?}") });
        }
        for (i, s) in sep.iter().enumerate() {
            let proto = PsServer::new(*s, wep.clone(), cfg.clone()).map_err(transport_error)?;
            plan.endpoints.push(PlannedEndpoint { host: s.host, role: Role::Server { index: i as u32 }, proto: Box::new(proto), config: format!("{:?}", c.transport) });
        }
        Ok(plan)
    }
}
