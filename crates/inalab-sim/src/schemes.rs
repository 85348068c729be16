//! Builds the host protocol endpoints of a job from its scheme. This is configuration only:
//! the protocols themselves live in `inalab-host`.

use crate::spec::{Hashing as SpecHashing, InaSpec, JobSpec, Scheme};
use crate::workload::{server_port, worker_port, Owner};
use inalab_core::time::MS;
use inalab_core::{Endpoint, HostProtocol, NodeId};
use inalab_host::{
    atp_layout, AimdConfig, AtpConfig, AtpServer, AtpServerConfig, AtpWorker, Hashing, HierarchicalAllreduce, PsConfig, PsServer, PsWorker, RingAllreduce,
    SwitchMlConfig, SwitchMlWorker, TransportConfig,
};
use inalab_switch::{atp_admissions, AtpSwitchJob, SwitchMlJob};
use inalab_topo::Topology;

/// (field, message) of a job that cannot be built.
pub struct BuildError(pub String, pub String);

type Endpoints = Vec<(NodeId, Box<dyn HostProtocol>, Owner)>;

/// What a job needs from the network: host endpoints, and for INA schemes the switch-side
/// admissions (applied by `workload.rs`, which installs one shared program per switch).
#[derive(Default)]
pub struct Built {
    pub endpoints: Endpoints,
    /// ATP: (ToR switch, the job's configuration there).
    pub atp_admissions: Vec<(NodeId, AtpSwitchJob)>,
    /// ATP: the workers' loss-recovery timeout (switches derive their stale timeout from it).
    pub atp_timeout_ps: u64,
    /// SwitchML: (the workers' switch, the job's static pool there).
    pub switchml_admission: Option<(NodeId, SwitchMlJob)>,
}

/// The scheme's defaults when a job has no `ina` table: ATP's 306 B packets with a 58 B header,
/// hashed indexes, congestion control on, a 1 ms timeout; SwitchML's 180 B packets with 52 B
/// of headers and a 1 ms timeout.
pub fn ina_or_default(js: &JobSpec) -> InaSpec {
    js.ina.clone().unwrap_or(match js.scheme {
        Scheme::SwitchMl => InaSpec { packet_bytes: 180, header_bytes: 52, hashing: SpecHashing::Hash, congestion_control: false, timeout_ps: MS, pool_slots: 0 },
        _ => InaSpec { packet_bytes: 306, header_bytes: 58, hashing: SpecHashing::Hash, congestion_control: true, timeout_ps: MS, pool_slots: 0 },
    })
}

/// The one switch a SwitchML job aggregates at: its workers' shared ToR.
pub fn switchml_switch(js: &JobSpec, workers: &[NodeId], topo: &Topology) -> Result<NodeId, BuildError> {
    let tor = topo.host_switch(workers[0]);
    if let Some(w) = workers.iter().find(|&&w| topo.host_switch(w) != tor) {
        return Err(BuildError(
            format!("jobs[{}].workers", js.id),
            format!("SwitchML aggregates at one switch, so all workers must share a ToR; {} is not under {}", topo.nodes[*w as usize].name, topo.nodes[tor as usize].name),
        ));
    }
    Ok(tor)
}

pub fn transport_config(js: &JobSpec) -> TransportConfig {
    let t = &js.transport;
    TransportConfig {
        mss: t.mss_bytes,
        header_bytes: t.header_bytes,
        rto: t.rto_ps,
        rto_max: (t.rto_ps * 64).max(t.rto_ps),
        aimd: AimdConfig { initial_window_bytes: t.init_window_bytes, increment_bytes: t.increment_bytes, ..AimdConfig::default() },
        ..TransportConfig::default()
    }
}

/// Builds a job. `aggregators(switch)` is the pool size of a programmable switch (`None` for
/// a switch that runs no INA program); `static_share` = (this job's index, count) among the
/// ATP jobs with static allocation.
pub fn build(
    js: &JobSpec,
    workers: &[NodeId],
    servers: &[NodeId],
    topo: &Topology,
    aggregators: &dyn Fn(NodeId) -> Option<u32>,
    static_share: (u32, u32),
) -> Result<Built, BuildError> {
    let f = format!("jobs[{}]", js.id);
    let cfg = transport_config(js);
    let err = |field: &str| {
        let f = f.clone();
        let field = field.to_string();
        move |e: inalab_host::ConfigError| BuildError(format!("{f}.{field}"), e.0)
    };
    let job = js.id;
    let wep: Vec<Endpoint> = workers.iter().map(|&h| Endpoint { host: h, port: worker_port(job) }).collect();
    let mut out: Endpoints = vec![];
    let worker = |rank: usize| Owner::Worker { job, rank: rank as u32 };
    match js.scheme {
        Scheme::Atp => return build_atp(js, workers, servers, topo, aggregators, static_share),
        Scheme::SwitchMl => return build_switchml(js, workers, servers, topo, aggregators),
        Scheme::Ring | Scheme::Hierarchical | Scheme::PsSharded if !servers.is_empty() => {
            return Err(BuildError(format!("{f}.servers"), format!("scheme {:?} uses no separate servers; remove `servers`", js.scheme.name())));
        }
        Scheme::Ring => {
            for (r, &h) in workers.iter().enumerate() {
                out.push((h, Box::new(RingAllreduce::new(wep.clone(), r, cfg.clone()).map_err(err("transport"))?), worker(r)));
            }
        }
        Scheme::Hierarchical => {
            // Racks are the workers' top-of-rack switches, in order of first appearance.
            let mut racks: Vec<(NodeId, Vec<Endpoint>)> = vec![];
            for ep in &wep {
                let tor = topo.host_switch(ep.host);
                match racks.iter_mut().find(|(t, _)| *t == tor) {
                    Some((_, v)) => v.push(*ep),
                    None => racks.push((tor, vec![*ep])),
                }
            }
            let racks: Vec<Vec<Endpoint>> = racks.into_iter().map(|(_, v)| v).collect();
            for (r, &h) in workers.iter().enumerate() {
                let proto = HierarchicalAllreduce::new(racks.clone(), r, cfg.clone()).map_err(err("workers"))?;
                out.push((h, Box::new(proto), worker(r)));
            }
        }
        Scheme::Ps | Scheme::PsSharded => {
            let server_hosts: Vec<NodeId> = if js.scheme == Scheme::Ps { servers.to_vec() } else { workers.to_vec() };
            if server_hosts.is_empty() {
                return Err(BuildError(format!("{f}.servers"), "scheme \"ps\" needs at least one server host".into()));
            }
            let sep: Vec<Endpoint> = server_hosts.iter().map(|&h| Endpoint { host: h, port: server_port(job) }).collect();
            let pcfg = PsConfig { partition_bytes: js.partition_bytes, transport: cfg.clone() };
            for (r, &h) in workers.iter().enumerate() {
                out.push((h, Box::new(PsWorker::new(wep[r], sep.clone(), pcfg.clone()).map_err(err("partition"))?), worker(r)));
            }
            for s in &sep {
                out.push((s.host, Box::new(PsServer::new(*s, wep.clone(), cfg.clone()).map_err(err("transport"))?), Owner::Server { job }));
            }
        }
    }
    Ok(Built { endpoints: out, ..Built::default() })
}

/// ATP: one PS (`servers[0]`), a worker per host, and the ToR admissions: every worker rack
/// whose switch runs ATP aggregates at level 1, the PS's rack at level 2 and multicasts.
fn build_atp(
    js: &JobSpec,
    workers: &[NodeId],
    servers: &[NodeId],
    topo: &Topology,
    aggregators: &dyn Fn(NodeId) -> Option<u32>,
    (k, of): (u32, u32),
) -> Result<Built, BuildError> {
    let f = format!("jobs[{}]", js.id);
    let job = js.id;
    let ps_host = match servers {
        [h] => *h,
        [] => return Err(BuildError(format!("{f}.servers"), "scheme \"atp\" needs one parameter-server host".into())),
        _ => return Err(BuildError(format!("{f}.servers"), format!("scheme \"atp\" uses exactly one parameter server, got {}", servers.len()))),
    };
    if workers.contains(&ps_host) {
        return Err(BuildError(format!("{f}.servers"), "ATP's parameter server must be a host without a worker of the job".into()));
    }
    let ina = ina_or_default(js);
    let racks: Vec<NodeId> = workers.iter().map(|&w| topo.host_switch(w)).collect();
    let ps_rack = topo.host_switch(ps_host);
    let runs_atp = |s: NodeId| aggregators(s).is_some();
    let layout = atp_layout(&racks, ps_rack, runs_atp).map_err(|e| BuildError(format!("{f}.workers"), e.0))?;
    // The index is taken modulo the smallest pool the job's packets meet, so it is valid
    // at both levels.
    let mut used: Vec<NodeId> = racks.iter().copied().filter(|&r| r != ps_rack).chain([ps_rack]).filter(|&s| runs_atp(s)).collect();
    used.sort_unstable();
    used.dedup();
    let pool = used.iter().filter_map(|&s| aggregators(s)).min().unwrap_or(0);
    let t = &js.transport;
    let cfg = AtpConfig {
        job,
        packet_bytes: ina.packet_bytes,
        header_bytes: ina.header_bytes,
        hashing: match ina.hashing {
            SpecHashing::Hash => Hashing::Hash,
            SpecHashing::Linear => Hashing::Linear,
            SpecHashing::Static => {
                let size = pool / of.max(1);
                Hashing::Static { offset: k * size, size }
            }
        },
        aggregators: pool,
        congestion_control: ina.congestion_control,
        aimd: AimdConfig {
            initial_window_bytes: t.init_window_bytes,
            increment_bytes: t.increment_bytes,
            min_window_bytes: ina.packet_bytes as u64,
            initial_ssthresh_bytes: u64::MAX,
        },
        timeout_ps: ina.timeout_ps,
    };
    let err = |e: inalab_host::ConfigError| BuildError(format!("{f}.ina"), e.0);
    let ps = Endpoint { host: ps_host, port: server_port(job) };
    let wep: Vec<Endpoint> = workers.iter().map(|&h| Endpoint { host: h, port: worker_port(job) }).collect();
    let multicast = runs_atp(ps_rack);
    let mut out = Built { atp_timeout_ps: ina.timeout_ps, ..Built::default() };
    for (r, &h) in workers.iter().enumerate() {
        let proto = AtpWorker::new(wep[r], ps, layout.positions[r], cfg.clone()).map_err(err)?;
        out.endpoints.push((h, Box::new(proto), Owner::Worker { job, rank: r as u32 }));
    }
    let scfg = AtpServerConfig { atp: cfg.clone(), layout, workers: wep, multicast, resend_holdoff_ps: ina.timeout_ps / 2 };
    out.endpoints.push((ps_host, Box::new(AtpServer::new(ps, scfg).map_err(err)?), Owner::Server { job }));
    let port = |s: NodeId, h: NodeId| topo.port_to(s, h).expect("a host's ToR faces it");
    out.atp_admissions = atp_admissions(workers, &racks, ps_host, ps_rack, runs_atp, port);
    Ok(out)
}

/// SwitchML: workers stream to their ToR, which aggregates in the job's static slot pool and
/// multicasts results back; no parameter server. `pool_slots` has been resolved (> 0).
fn build_switchml(js: &JobSpec, workers: &[NodeId], servers: &[NodeId], topo: &Topology, aggregators: &dyn Fn(NodeId) -> Option<u32>) -> Result<Built, BuildError> {
    let f = format!("jobs[{}]", js.id);
    if !servers.is_empty() {
        return Err(BuildError(format!("{f}.servers"), "scheme \"switchml\" aggregates in the switch and uses no servers; remove `servers`".into()));
    }
    let tor = switchml_switch(js, workers, topo)?;
    if aggregators(tor).is_none() {
        return Err(BuildError(format!("{f}.workers"), format!("SwitchML needs the workers' switch {} to be programmable", topo.nodes[tor as usize].name)));
    }
    let ina = ina_or_default(js);
    let job = js.id;
    let switch = Endpoint { host: tor, port: worker_port(job) };
    let mut out = Built::default();
    let mut admitted = vec![];
    for (r, &h) in workers.iter().enumerate() {
        let local = Endpoint { host: h, port: worker_port(job) };
        let cfg = SwitchMlConfig {
            pool_slots: ina.pool_slots,
            timeout_ps: ina.timeout_ps,
            packet_bytes: ina.packet_bytes,
            header_bytes: ina.header_bytes,
            ..SwitchMlConfig::new(job, r as u16, switch)
        };
        let proto = SwitchMlWorker::new(local, cfg).map_err(|e| BuildError(format!("{f}.ina"), e.0))?;
        out.endpoints.push((h, Box::new(proto), Owner::Worker { job, rank: r as u32 }));
        admitted.push((local, topo.port_to(tor, h).expect("a host's ToR faces it")));
    }
    out.switchml_admission = Some((tor, SwitchMlJob { workers: admitted, pool_slots: ina.pool_slots }));
    Ok(out)
}
