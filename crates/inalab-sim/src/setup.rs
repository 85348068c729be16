//! Job set-up: each job's hosts resolved by name, its plan asked of the scheme registry with
//! the simulator's view of the network, and the switch programs the plans admit at.

use crate::spec::{NetSpec, SimSpec};
use crate::SimError;
use inalab_core::{NodeId, PortId, Programs};
use inalab_scheme::{JobSpec as SchemeJob, NetView, Plan, PlanError};
use inalab_topo::{ecmp_pick, Routes, Topology};
use std::collections::{BTreeMap, HashMap};

/// Port numbers: job j's workers listen on 10000 + 2j, its servers on 10001 + 2j; flow f
/// sends from 20000 + f to 40000 + f.
pub fn worker_port(job: u32) -> u16 {
    (10_000 + 2 * job) as u16
}
pub fn server_port(job: u32) -> u16 {
    (10_001 + 2 * job) as u16
}
pub(crate) fn flow_ports(flow: u32) -> (u16, u16) {
    ((20_000 + flow) as u16, (40_000 + flow) as u16)
}

/// The simulator's answers to a scheme's questions about the network.
pub struct SimView<'a> {
    topo: &'a Topology,
    /// Aggregator memory of every programmable switch.
    memory: BTreeMap<NodeId, u64>,
    /// Share name -> the jobs that asked for it, in job order.
    shares: BTreeMap<String, Vec<u32>>,
    /// Switches that run several INA programs -> how many: each gets an equal part of the
    /// switch's aggregator memory.
    programs: BTreeMap<NodeId, u64>,
    /// The scenario's seed, for a scheme's random set-up choices.
    seed: u64,
    /// Shortest-path routes, computed when a scheme first asks for a path.
    routes: std::cell::OnceCell<Routes>,
}

impl<'a> SimView<'a> {
    /// The view of `topo` with the aggregator memory `net` gives its programmable switches.
    pub fn new(topo: &'a Topology, net: &NetSpec) -> Self {
        let mut memory: BTreeMap<NodeId, u64> = BTreeMap::new();
        for s in topo.switches().filter(|&s| topo.nodes[s as usize].programmable) {
            memory.insert(s, net.aggregator_memory_bytes);
        }
        for sm in &net.switch_memory {
            if let Some(m) = topo.find(&sm.switch).and_then(|s| memory.get_mut(&s)) {
                *m = sm.value;
            }
        }
        SimView { topo, memory, shares: BTreeMap::new(), programs: BTreeMap::new(), seed: 0, routes: Default::default() }
    }

    /// The same view with the scenario's seed (0 otherwise).
    pub fn with_seed(self, seed: u64) -> Self {
        SimView { seed, ..self }
    }

    /// Records that `job` takes part in the shares its scheme names.
    pub fn join_shares(&mut self, job: &SchemeJob) -> Result<(), PlanError> {
        for key in job.scheme()?.shares(job, self) {
            self.shares.entry(key).or_default().push(job.id);
        }
        Ok(())
    }
}

impl NetView for SimView<'_> {
    fn tor(&self, host: NodeId) -> NodeId {
        self.topo.host_switch(host)
    }
    fn port_toward(&self, switch: NodeId, host: NodeId) -> Option<PortId> {
        self.topo.port_to(switch, host)
    }
    fn programmable(&self, switch: NodeId) -> bool {
        self.memory.contains_key(&switch)
    }
    /// The memory one program of the switch gets: an equal part when several share it.
    fn memory_bytes(&self, switch: NodeId) -> u64 {
        self.memory.get(&switch).copied().unwrap_or(0) / self.programs.get(&switch).copied().unwrap_or(1)
    }
    fn name(&self, node: NodeId) -> String {
        self.topo.nodes[node as usize].name.clone()
    }
    fn share(&self, job: u32, key: &str) -> (u32, u32) {
        let jobs = self.shares.get(key).map_or(&[][..], |v| v.as_slice());
        (jobs.iter().position(|&j| j == job).unwrap_or(0) as u32, jobs.len() as u32)
    }
    fn switches(&self) -> Vec<NodeId> {
        (0..self.topo.nodes.len() as NodeId).filter(|&n| self.topo.nodes[n as usize].kind == inalab_topo::NodeKind::Switch).collect()
    }
    fn links(&self, switch: NodeId) -> Vec<(PortId, NodeId)> {
        self.topo.nodes.get(switch as usize).map_or(vec![], |n| n.ports.iter().enumerate().map(|(p, port)| (p as PortId, port.peer)).collect())
    }
    fn tier(&self, switch: NodeId) -> u8 {
        self.topo.nodes.get(switch as usize).map_or(1, |n| n.tier)
    }
    fn seed(&self) -> u64 {
        self.seed
    }
    fn node_named(&self, name: &str) -> Option<NodeId> {
        self.topo.find(name)
    }
    fn route_path(&self, from: NodeId, dst: NodeId, flow: u64) -> Vec<NodeId> {
        let routes = self.routes.get_or_init(|| Routes::compute(self.topo));
        let t = self.topo;
        let mut path = vec![from];
        let mut cur = if t.is_host(from) { t.host_switch(from) } else { from };
        if cur != from {
            path.push(cur);
        }
        while cur != dst {
            let hops = routes.next_hops(cur, dst);
            if hops.is_empty() || path.len() > t.nodes.len() {
                return vec![];
            }
            cur = t.nodes[cur as usize].ports[ecmp_pick(hops, flow, cur) as usize].peer;
            path.push(cur);
        }
        path
    }
}

/// The host called `name`, or an error at `field` that says why not.
pub(crate) fn host_named(topo: &Topology, field: String, name: &str) -> Result<NodeId, SimError> {
    match topo.find(name) {
        Some(n) if topo.is_host(n) => Ok(n),
        Some(_) => Err(SimError::new(field, format!("{name:?} is a switch, not a host"))),
        None => Err(SimError::new(field, format!("no host named {name:?}; hosts are h0..h{}", topo.hosts.saturating_sub(1)))),
    }
}

/// A scheme's error about job `j`, with the field named from the scenario's root.
fn plan_error(j: usize, e: PlanError) -> SimError {
    let field = if e.field.is_empty() { format!("jobs[{j}]") } else { format!("jobs[{j}].{}", e.field) };
    SimError::new(field, e.message)
}

/// Every job with its plan (in job order), and the INA programs per switch with the jobs
/// admitted.
pub struct Setup {
    pub jobs: Vec<(SchemeJob, Plan)>,
    pub programs: BTreeMap<NodeId, Programs>,
}

/// The jobs of `spec` as the scheme registry describes them, in job order; a host used twice
/// or a name that is not a host is an error naming the field.
pub fn scheme_jobs(spec: &SimSpec, topo: &Topology) -> Result<Vec<SchemeJob>, SimError> {
    let parts = topo.parts();
    let mut used: HashMap<NodeId, usize> = HashMap::new();
    let mut jobs = vec![];
    for (j, js) in spec.jobs.iter().enumerate() {
        let field = format!("jobs[{j}]");
        if js.id as usize != j {
            return Err(SimError::new(format!("{field}.id"), format!("job ids must be 0, 1, ... in order; expected {j}, got {}", js.id)));
        }
        let host = |i: usize, name: &String, what: &str| host_named(topo, format!("{field}.{what}[{i}]"), name);
        let workers = js.workers.iter().enumerate().map(|(i, n)| host(i, n, "workers")).collect::<Result<Vec<_>, _>>()?;
        let servers = js.servers.iter().enumerate().map(|(i, n)| host(i, n, "servers")).collect::<Result<Vec<_>, _>>()?;
        if workers.is_empty() {
            return Err(SimError::new(format!("{field}.workers"), "a job needs at least one worker"));
        }
        for &w in &workers {
            if let Some(other) = used.insert(w, j) {
                let which = if other == j { "twice in this job".to_string() } else { format!("also by jobs[{other}]") };
                return Err(SimError::new(format!("{field}.workers"), format!("host {} is used {which}", topo.nodes[w as usize].name)));
            }
        }
        connected(topo, &parts, &field, workers.iter().chain(&servers))?;
        let config = serde_json::Value::Object(js.config.clone());
        jobs.push(SchemeJob { id: js.id, workers, servers, config, worker_port: worker_port(js.id), server_port: server_port(js.id) });
    }
    Ok(jobs)
}

/// Refuses hosts of one job (or flow) that no path joins, before anything runs: the job could
/// only fail. Names the first host and those it cannot reach.
pub(crate) fn connected<'a>(topo: &Topology, parts: &[NodeId], field: &str, hosts: impl Iterator<Item = &'a NodeId>) -> Result<(), SimError> {
    let hosts: Vec<NodeId> = hosts.copied().collect();
    let Some(&first) = hosts.first() else { return Ok(()) };
    let cut: Vec<&str> = hosts.iter().filter(|&&h| parts[h as usize] != parts[first as usize]).map(|&h| topo.nodes[h as usize].name.as_str()).collect();
    if cut.is_empty() {
        return Ok(());
    }
    let shown = if cut.len() > 8 { format!("{}, ... ({} hosts)", cut[..8].join(", "), cut.len()) } else { cut.join(", ") };
    Err(SimError::new(
        field.to_string(),
        format!("no path in the topology from {} to {shown}: the network is in separate parts (check topology.links)", topo.nodes[first as usize].name),
    ))
}

/// Plans every job of `spec` on `topo` and installs the programs their plans admit at.
pub fn set_up_jobs(spec: &SimSpec, topo: &Topology) -> Result<Setup, SimError> {
    let jobs = scheme_jobs(spec, topo)?;
    let mut view = SimView::new(topo, &spec.network).with_seed(spec.seed);
    // Shares (equal splits of a switch among jobs) are known before any job is planned.
    for (j, job) in jobs.iter().enumerate() {
        view.join_shares(job).map_err(|e| plan_error(j, e))?;
    }
    let plan_all = |view: &SimView| -> Result<Vec<Plan>, SimError> {
        jobs.iter().enumerate().map(|(j, job)| job.scheme().and_then(|s| s.plan(job, view)).map_err(|e| plan_error(j, e))).collect()
    };
    let mut plans = plan_all(&view)?;
    // A switch where jobs admit at several programs splits its memory among them, and every
    // job is planned again with the smaller pools.
    let mut on_switch: BTreeMap<NodeId, Vec<&str>> = BTreeMap::new();
    for adm in plans.iter().flat_map(|p| &p.admissions) {
        let names = on_switch.entry(adm.switch).or_default();
        if !names.contains(&adm.program) {
            names.push(adm.program);
        }
    }
    view.programs = on_switch.into_iter().filter(|(_, n)| n.len() > 1).map(|(s, n)| (s, n.len() as u64)).collect();
    if !view.programs.is_empty() {
        plans = plan_all(&view)?;
    }
    let mut programs: BTreeMap<NodeId, Programs> = BTreeMap::new();
    let mut planned = vec![];
    for (j, (job, mut plan)) in jobs.into_iter().zip(plans).enumerate() {
        // Admissions move their state into the programs; the plan keeps its endpoints.
        for adm in std::mem::take(&mut plan.admissions) {
            let on_switch = programs.entry(adm.switch).or_default();
            if !on_switch.has(adm.program) {
                let maker = inalab_scheme::by_name(adm.program).map_err(|e| plan_error(j, e))?;
                let prog = maker.program(adm.switch, &view).expect("a scheme that admits at switches has a program");
                on_switch.install(adm.program, prog).map_err(|e| SimError::new(format!("jobs[{j}].scheme"), e.0))?;
            }
            on_switch.admit_at(adm.program, job.id, adm.state).map_err(|e| SimError::new(format!("jobs[{j}].{}", adm.field), e.0))?;
        }
        planned.push((job, plan));
    }
    Ok(Setup { jobs: planned, programs })
}
