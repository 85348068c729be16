//! Hierarchical allreduce: reduce-scatter in each rack, ring allreduce across racks,
//! all-gather in the rack. Racks are the workers' top-of-rack switches.

use crate::plan::{check_servers, parse_config, JobSpec, NetView, Param, Plan, PlanError, PlannedEndpoint, Role, Scheme, Servers};
use crate::ring::{worker_endpoints, RingConfig};
use crate::transport::TRANSPORT_PARAMS;
use inalab_core::{Endpoint, NodeId};
use inalab_host::HierarchicalAllreduce;
use serde_json::Value;

pub struct Hierarchical;

impl Scheme for Hierarchical {
    fn name(&self) -> &'static str {
        "hierarchical"
    }
    fn doc(&self) -> &'static str {
        "ring inside each rack, then across racks (hierarchical allreduce)"
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
    fn plan(&self, job: &JobSpec, net: &dyn NetView) -> Result<Plan, PlanError> {
        check_servers(self, job)?;
        let cfg: RingConfig = parse_config(&job.config)?;
        // Racks in order of first appearance.
        let mut racks: Vec<(NodeId, Vec<Endpoint>)> = vec![];
        for ep in worker_endpoints(job) {
            let tor = net.tor(ep.host);
            match racks.iter_mut().find(|(t, _)| *t == tor) {
                Some((_, v)) => v.push(ep),
                None => racks.push((tor, vec![ep])),
            }
        }
        let racks: Vec<Vec<Endpoint>> = racks.into_iter().map(|(_, v)| v).collect();
        let mut plan = Plan::default();
        for (r, &h) in job.workers.iter().enumerate() {
            let proto = HierarchicalAllreduce::new(racks.clone(), r, cfg.transport.config()).map_err(|e| PlanError::new("workers", e.0))?;
            plan.endpoints.push(PlannedEndpoint { host: h, role: Role::Worker { rank: r as u32 }, proto: Box::new(proto), config: format!("{:?} racks {racks:?}", cfg.transport) });
        }
        Ok(plan)
    }
}
