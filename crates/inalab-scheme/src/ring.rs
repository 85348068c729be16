//! Ring allreduce on hosts: reduce-scatter then all-gather, 2 (N - 1) steps.

use crate::plan::{check_servers, parse_config, JobSpec, NetView, Param, Plan, PlanError, PlannedEndpoint, Role, Scheme, Servers};
use crate::transport::{TransportParams, TRANSPORT_PARAMS};
use inalab_core::Endpoint;
use inalab_host::RingAllreduce;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RingConfig {
    pub transport: TransportParams,
}

pub struct Ring;

/// The workers' endpoints, by rank.
pub(crate) fn worker_endpoints(job: &JobSpec) -> Vec<Endpoint> {
    job.workers.iter().map(|&h| Endpoint { host: h, port: job.worker_port }).collect()
}

pub(crate) fn transport_error(e: inalab_host::ConfigError) -> PlanError {
    PlanError::new("transport", e.0)
}

impl Scheme for Ring {
    fn name(&self) -> &'static str {
        "ring"
    }
    fn doc(&self) -> &'static str {
        "ring allreduce on the hosts (reduce-scatter, then all-gather)"
    }
    fn params(&self) -> &'static [Param] {
        &TRANSPORT_PARAMS
    }
    fn servers(&self) -> Servers {
        Servers::None
    }
    fn normalize(&self, config: &Value) -> Result<Value, PlanError> {
        Ok(serde_json::json!({"scheme": self.name(), "transport": parse_config::<RingConfig>(config)?.transport}))
    }
    fn plan(&self, job: &JobSpec, _net: &dyn NetView) -> Result<Plan, PlanError> {
        check_servers(self, job)?;
        let cfg: RingConfig = parse_config(&job.config)?;
        let eps = worker_endpoints(job);
        let mut plan = Plan::default();
        for (r, &h) in job.workers.iter().enumerate() {
            let proto = RingAllreduce::new(eps.clone(), r, cfg.transport.config()).map_err(transport_error)?;
            plan.endpoints.push(PlannedEndpoint { host: h, role: Role::Worker { rank: r as u32 }, proto: Box::new(proto), config: format!("{:?}", cfg.transport) });
        }
        Ok(plan)
    }
}
