//! Ring allreduce on hosts: `ring` (reduce-scatter then all-gather, 2 (N - 1) steps) and
//! `hierarchical` (reduce-scatter in each rack, ring allreduce across racks, all-gather in the
//! rack; racks are the workers' top-of-rack switches, in order of first appearance).

use crate::plan::{check_servers, parse_config, JobSpec, NetView, Param, Plan, PlanError, PlannedEndpoint, Role, Scheme, Servers};
use crate::transport::{TransportParams, TRANSPORT_PARAMS};
use inalab_core::{Endpoint, HostProtocol, NodeId};
use inalab_host::{HierarchicalAllreduce, RingAllreduce};
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RingConfig {
    pub transport: TransportParams,
}

/// `ring` (hierarchical: false) and `hierarchical` (true).
pub struct Ring {
    pub hierarchical: bool,
}

/// The workers' endpoints, by rank.
pub(crate) fn worker_endpoints(job: &JobSpec) -> Vec<Endpoint> {
    job.workers.iter().map(|&h| Endpoint { host: h, port: job.worker_port }).collect()
}

pub(crate) fn transport_error(e: inalab_host::ConfigError) -> PlanError {
    PlanError::new("transport", e.0)
}

/// The workers' endpoints grouped by rack, racks in order of first appearance.
fn racks(job: &JobSpec, net: &dyn NetView) -> Vec<Vec<Endpoint>> {
    let mut racks: Vec<(NodeId, Vec<Endpoint>)> = vec![];
    for ep in worker_endpoints(job) {
        let tor = net.tor(ep.host);
        match racks.iter_mut().find(|(t, _)| *t == tor) {
            Some((_, v)) => v.push(ep),
            None => racks.push((tor, vec![ep])),
        }
    }
    racks.into_iter().map(|(_, v)| v).collect()
}

impl Scheme for Ring {
    fn name(&self) -> &'static str {
        if self.hierarchical {
            "hierarchical"
        } else {
            "ring"
        }
    }
    fn doc(&self) -> &'static str {
        if self.hierarchical {
            "ring inside each rack, then across racks (hierarchical allreduce)"
        } else {
            "ring allreduce on the hosts (reduce-scatter, then all-gather)"
        }
    }
    fn params(&self) -> Vec<Param> {
        TRANSPORT_PARAMS.to_vec()
    }
    fn servers(&self) -> Servers {
        Servers::None
    }
    fn normalize(&self, config: &Value) -> Result<Value, PlanError> {
        Ok(serde_json::json!({"scheme": self.name(), "transport": parse_config::<RingConfig>(config, &self.params())?.transport}))
    }
    fn plan(&self, job: &JobSpec, net: &dyn NetView) -> Result<Plan, PlanError> {
        check_servers(self, job)?;
        let cfg: RingConfig = parse_config(&job.config, &self.params())?;
        let (eps, racks) = if self.hierarchical { (vec![], racks(job, net)) } else { (worker_endpoints(job), vec![]) };
        let mut plan = Plan::default();
        for (r, &h) in job.workers.iter().enumerate() {
            let (proto, config): (Box<dyn HostProtocol>, String) = if self.hierarchical {
                let p = HierarchicalAllreduce::new(racks.clone(), r, cfg.transport.config()).map_err(|e| PlanError::new("workers", e.0))?;
                (Box::new(p), format!("{:?} racks {racks:?}", cfg.transport))
            } else {
                (Box::new(RingAllreduce::new(eps.clone(), r, cfg.transport.config()).map_err(transport_error)?), format!("{:?}", cfg.transport))
            };
            plan.endpoints.push(PlannedEndpoint { host: h, role: Role::Worker { rank: r as u32 }, proto, config });
        }
        Ok(plan)
    }
}
