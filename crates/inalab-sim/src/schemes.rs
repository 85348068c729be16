//! Builds the host protocol endpoints of a job from its scheme. This is configuration only:
//! the protocols themselves live in `inalab-host`.

use crate::spec::{JobSpec, Scheme};
use crate::workload::{server_port, worker_port, Owner};
use inalab_core::{Endpoint, HostProtocol, NodeId};
use inalab_host::{AimdConfig, HierarchicalAllreduce, PsConfig, PsServer, PsWorker, RingAllreduce, TransportConfig};
use inalab_topo::Topology;

/// (field, message) of a job that cannot be built.
pub struct BuildError(pub String, pub String);

type Endpoints = Vec<(NodeId, Box<dyn HostProtocol>, Owner)>;

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

pub fn build(js: &JobSpec, workers: &[NodeId], servers: &[NodeId], topo: &Topology) -> Result<Endpoints, BuildError> {
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
        Scheme::Atp | Scheme::SwitchMl => {
            return Err(BuildError(format!("{f}.scheme"), format!("scheme {:?} is not available in the simulator yet", js.scheme.name())));
        }
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
    Ok(out)
}
