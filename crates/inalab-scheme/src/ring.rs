//! Ring allreduce on hosts: `ring` (reduce-scatter then all-gather, 2 (N - 1) steps) and
//! `hierarchical` (reduce-scatter in each rack, ring allreduce across racks, all-gather in the
//! rack; racks are the workers' top-of-rack switches, in order of first appearance).

use crate::plan::{JobSpec, NetView, Param, Plan, PlanError, PlannedEndpoint, Range, Role, Servers, TypedScheme};
use crate::transport::{TransportParams, TRANSPORT_PARAMS};
use inalab_core::{Endpoint, HostProtocol, NodeId};
use inalab_host::{HierarchicalAllreduce, RingAllreduce, StepCost};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RingConfig {
    pub transport: TransportParams,
    pub ina: RingSteps,
}

/// The per-step costs of the Rina paper's eq. (1), under `ina.` with Rina's own names so that
/// one setting charges a ring, a hierarchical allreduce and Rina alike (a ring has no INA).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RingSteps {
    pub step_overhead_ps: u64,
    pub step_jitter_ps: u64,
    pub step_barrier: bool,
}

const STEP_PARAMS: [Param; 3] = [
    Param { name: "ina.step_overhead_ps", unit: "ps", doc: "O of the dependency chain (Rina §III-A, eq. 1), as Rina's: a fixed wait of every worker before its chunk of each reduce-scatter step.", range: Range::TIME_OR_ZERO },
    Param { name: "ina.step_jitter_ps", unit: "ps", doc: "sigma of the dependency chain (eq. 1), as Rina's: each worker also waits max(0, sigma Z), Z standard normal drawn per worker and step from the run's seed.", range: Range::TIME_OR_ZERO },
    Param { name: "ina.step_barrier", unit: "", doc: "A global barrier per reduce-scatter step (NCCL's, as the Rina paper reads it, §III-A): every worker waits the step's slowest draw, O + the max over the step's members of max(0, sigma Z) (the members draw alike from the job's seed), eq. 1's Max; false: each its own draw.", range: Range::Bool },
];

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

impl TypedScheme for Ring {
    type Config = RingConfig;
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
        TRANSPORT_PARAMS.iter().chain(&STEP_PARAMS).cloned().collect()
    }
    fn servers(&self) -> Servers {
        Servers::None
    }
    fn plan(&self, job: &JobSpec, cfg: RingConfig, net: &dyn NetView) -> Result<Plan, PlanError> {
        let (eps, racks) = if self.hierarchical { (vec![], racks(job, net)) } else { (worker_endpoints(job), vec![]) };
        let mut plan = Plan::default();
        let st = cfg.ina;
        let job_seed = inalab_core::splitmix64(net.seed() ^ (job.id as u64) << 32);
        for (r, &h) in job.workers.iter().enumerate() {
            // With a barrier the members draw alike (one seed); otherwise each its own.
            let seed = if st.step_barrier { job_seed } else { job_seed ^ h as u64 };
            let cost = StepCost { overhead_ps: st.step_overhead_ps, jitter_ps: st.step_jitter_ps, barrier: st.step_barrier, seed };
            let (proto, config): (Box<dyn HostProtocol>, String) = if self.hierarchical {
                let p = HierarchicalAllreduce::new(racks.clone(), r, cfg.transport.config()).map_err(|e| PlanError::new("workers", e.0))?;
                (Box::new(p.with_step_cost(cost)), format!("{:?} {st:?} racks {racks:?}", cfg.transport))
            } else {
                let p = RingAllreduce::new(eps.clone(), r, cfg.transport.config()).map_err(transport_error)?;
                (Box::new(p.with_step_cost(cost)), format!("{:?} {st:?}", cfg.transport))
            };
            plan.endpoints.push(PlannedEndpoint { host: h, role: Role::Worker { rank: r as u32 }, proto, config });
        }
        Ok(plan)
    }
}
