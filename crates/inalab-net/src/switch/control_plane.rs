//! The software switch's control plane: workers `join` with their job, rank, world size and
//! configuration; when all ranks are in, the switch assigns node ids, builds the [`JobSpec`]
//! and admits it (here, at the next switch and at the PS as needed: each asks the scheme
//! registry for its part of the plan), then answers every worker. A worker connection that
//! closes before `leave` fails the job: the other workers get a `failed` event and the job's
//! aggregators are freed at every switch and the PS. Protocol: [`crate::control`].

use super::{stats, PortKind, Shared, Tree};
use crate::control::{self, err, field, ok, plan_err, AuthRole, JobSpec, ServerAuth, ServerSpec, SwitchSpec, WorkerSpec, CONTROL_TIMEOUT};
use crate::NetError;
use inalab_core::{NodeId, PortId, SwitchProgram};
use inalab_scheme::{Role, Servers};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::BufReader;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

/// A worker waiting in the rendezvous or running in an admitted job.
struct Member {
    rank: usize,
    udp: SocketAddr,
    conn: TcpStream,
    node: NodeId,
    left: bool,
    /// Its connection dropped without a `leave` (the job went on without it).
    gone: bool,
}

struct JobState {
    /// The first joiner's configuration (with the switch's defaults filled in); every other
    /// joiner must send the same.
    config: Value,
    world: usize,
    /// The first joiner's rendezvous secret, hashed (`None`: it gave none); every other joiner
    /// must prove the same, so nobody without it can take a rank.
    secret: Option<[u8; 32]>,
    members: BTreeMap<usize, Member>,
    spec: Option<JobSpec>,
}

/// A rendezvous secret as the switch keeps it: keyed by the deployment secret.
fn secret_digest(s: &Shared, job_secret: &str) -> [u8; 32] {
    s.secret.role_key_for_label(&format!("rendezvous {job_secret}"))
}

#[derive(Default)]
pub(super) struct ControlState {
    jobs: BTreeMap<u32, JobState>,
    /// Attached PS: (node, control address).
    ps: Option<(NodeId, SocketAddr)>,
}

impl ControlState {
    /// The jobs joining or admitted here.
    pub(super) fn job_ids(&self) -> Vec<u32> {
        self.jobs.keys().copied().collect()
    }
}

/// Serves one control connection until it closes.
pub(super) fn serve(s: &Arc<Shared>, conn: TcpStream) {
    // A peer that does not read costs only its own connection, and at most this long a write.
    let _ = conn.set_write_timeout(Some(WRITE_TIMEOUT));
    let Ok(mut w) = conn.try_clone() else { return };
    let mut r = BufReader::new(conn);
    // A join turns this connection into a worker's: (job, rank).
    let mut member: Option<(u32, usize)> = None;
    // An attach as PS turns it into the PS's: it must ping at least every PS_LIVENESS.
    let mut ps_node: Option<NodeId> = None;
    let mut auth = ServerAuth::new(s.secret.clone());
    loop {
        let msg = match control::read_line(&mut r) {
            Ok(Some(m)) => m,
            Ok(None) | Err(NetError::Io(_)) => break,
            Err(e @ NetError::TooLong(_)) => {
                let _ = control::send_line(&mut w, &err(e));
                break;
            }
            Err(e) => {
                let _ = control::send_line(&mut w, &err(e));
                continue;
            }
        };
        let op = msg["op"].as_str().unwrap_or("");
        if let Some(r) = auth.handle(op, &msg) {
            let failed = r.is_err();
            if control::send_line(&mut w, &r.unwrap_or_else(err)).is_err() || failed {
                break; // a failed authentication closes the connection
            }
            continue;
        }
        if let Err(e) = allowed(op, &msg).map_or(Ok(()), |roles| auth.require(op, roles)) {
            if control::send_line(&mut w, &err(e)).is_err() {
                break;
            }
            continue;
        }
        let reply = match op {
            "join" if member.is_none() => match join(s, &msg, &w) {
                Ok(m) => {
                    member = Some(m);
                    // A worker's connection idles for its job's whole life.
                    let _ = r.get_ref().set_read_timeout(None);
                    continue; // answered when the rendezvous completes
                }
                Err(e) => err(e),
            },
            "leave" => match member {
                Some((job, rank)) => {
                    leave(s, job, rank);
                    ok(json!({}))
                }
                None => err("`leave` needs a `join` first on this connection"),
            },
            // A worker whose protocol cannot go on without a dead peer ends the job for all.
            "abort" => match member {
                Some((job, _)) => {
                    let reason = msg["reason"].as_str().unwrap_or("a worker aborted the job").to_string();
                    eprintln!("inalab switch: job {job} failed: {reason}");
                    release(s, job, Some(&reason));
                    ok(json!({}))
                }
                None => err("`abort` needs a `join` first on this connection"),
            },
            _ => handle(s, op, &msg, &w).unwrap_or_else(err),
        };
        if op == "attach" && msg["role"] == "ps" && reply["ok"] == true {
            ps_node = msg["node"].as_u64().map(|n| n as NodeId);
            let _ = r.get_ref().set_read_timeout(Some(PS_LIVENESS));
        }
        if control::send_line(&mut w, &reply).is_err() {
            break;
        }
    }
    if let Some((job, rank)) = member {
        disconnected(s, job, rank);
    }
    if let Some(node) = ps_node {
        ps_gone(s, node);
    }
}

/// Longest a write to one control connection may block.
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Sends each line on its connection, with no lock held (each write is bounded by
/// [`WRITE_TIMEOUT`]).
fn send_all(lines: Vec<(TcpStream, Value)>) {
    for (mut c, v) in lines {
        let _ = control::send_line(&mut c, &v);
    }
}

/// How long the attached PS may go without a word (it pings every second) before the switch
/// takes it for dead and fails its jobs.
pub(crate) const PS_LIVENESS: std::time::Duration = std::time::Duration::from_secs(5);

/// The PS's control connection closed or went silent: every job it serves fails, with the
/// reason on every worker, and another PS may attach.
fn ps_gone(s: &Arc<Shared>, node: NodeId) {
    let jobs: Vec<u32> = {
        let mut cp = s.cp.lock().expect("control lock");
        if cp.ps.is_some_and(|p| p.0 == node) {
            cp.ps = None;
        }
        cp.jobs.iter().filter(|(_, j)| j.spec.as_ref().is_some_and(|sp| sp.servers.iter().any(|v| v.node == node))).map(|(&id, _)| id).collect()
    };
    s.dp.lock().expect("data plane lock").remove_port(node);
    let reason = format!("the parameter server (node {node}) disconnected or stopped answering for {PS_LIVENESS:?}");
    if !jobs.is_empty() {
        eprintln!("inalab switch: {reason}; failing jobs {jobs:?}");
    }
    for job in jobs {
        release(s, job, Some(&reason));
    }
}

/// The roles that may send `op` (`None`: anyone, authenticated or not: `stats`, `ping`).
fn allowed(op: &str, msg: &Value) -> Option<&'static [AuthRole]> {
    match op {
        "join" | "leave" | "abort" => Some(&[AuthRole::Worker]),
        "attach" if msg["role"] == "ps" => Some(&[AuthRole::Ps]),
        "attach" | "ps_info" | "admit" | "release" | "link" => Some(&[AuthRole::Switch]),
        _ => None,
    }
}

/// Requests that are answered at once.
fn handle(s: &Arc<Shared>, op: &str, msg: &Value, conn: &TcpStream) -> Result<Value, NetError> {
    match op {
        "attach" => {
            let role: String = field(msg, "role")?;
            let node: NodeId = field(msg, "node")?;
            let udp: SocketAddr = field(msg, "udp")?;
            let kind = match role.as_str() {
                "ps" => PortKind::Ps,
                "switch" => PortKind::Switch,
                r => return Err(NetError::Protocol(format!("field `role`: {r:?} is not one of \"ps\", \"switch\""))),
            };
            if kind == PortKind::Ps {
                let control: SocketAddr = field(msg, "control")?;
                let mut cp = s.cp.lock().expect("control lock");
                if let Some((other, _)) = cp.ps {
                    return Err(NetError::Config(format!("a parameter server (node {other}) is attached to this switch and alive; a second one is refused")));
                }
                cp.ps = Some((node, control));
            }
            let port = s.dp.lock().expect("data plane lock").add_port(udp, node, kind);
            let bound = s.dp.lock().expect("data plane lock").udp().local_addr()?;
            Ok(ok(json!({"port": port, "node": s.opts.node, "udp": seen_from(bound, conn)})))
        }
        "ps_info" => ps_info(s).map(ok),
        "admit" => {
            let spec: JobSpec = field(msg, "spec")?;
            admit(s, &spec)?;
            Ok(ok(json!({})))
        }
        "release" => {
            let job: u32 = field(msg, "job")?;
            release(s, job, Some("the job was released by a control request"));
            Ok(ok(json!({})))
        }
        "link" => {
            let peer: NodeId = field(msg, "peer")?;
            let up: bool = field(msg, "up")?;
            s.dp.lock().expect("data plane lock").set_link(peer, up)?;
            Ok(ok(json!({})))
        }
        "ping" => Ok(ok(json!({}))),
        "stats" => Ok(ok(stats(s))),
        "join" => Err(NetError::Protocol("this connection already joined a job".into())),
        other => Err(NetError::Protocol(format!(
            "field `op`: {other:?} is not one of \"join\", \"leave\", \"attach\", \"ps_info\", \"admit\", \"release\", \"link\", \"stats\""
        ))),
    }
}

/// The data-plane address as a peer reaches it: a socket bound to an unspecified address
/// (0.0.0.0) is reported with the local address of the peer's control connection, which is
/// also the source address of the switch's datagrams to that peer.
fn seen_from(bound: SocketAddr, conn: &TcpStream) -> SocketAddr {
    match conn.local_addr() {
        Ok(local) if bound.ip().is_unspecified() => SocketAddr::new(local.ip(), bound.port()),
        _ => bound,
    }
}

/// Where this switch's jobs find their PS (attached here, or behind the upstream switch), and
/// the switches from here to it.
fn ps_info(s: &Shared) -> Result<Value, NetError> {
    if let Some((ps, _)) = s.cp.lock().expect("control lock").ps {
        return Ok(json!({"ps": ps, "rack": s.opts.node, "switches": [s.opts.switch_spec()]}));
    }
    match s.opts.upstream {
        Some(up) => {
            let mut v = control::request(up, Some(&s.secret.credential(AuthRole::Switch)), &json!({"op": "ps_info"}), CONTROL_TIMEOUT)?;
            let mut switches: Vec<SwitchSpec> = field(&v, "switches")?;
            switches.insert(0, s.opts.switch_spec());
            v["switches"] = json!(switches);
            Ok(v)
        }
        None => Err(NetError::Config(
            "no parameter server: start `inalab ps --switch <this switch's control address>` or chain this switch with --upstream".into(),
        )),
    }
}

/// Registers a joining worker; completes the rendezvous when it is the last rank.
fn join(s: &Arc<Shared>, msg: &Value, conn: &TcpStream) -> Result<(u32, usize), NetError> {
    let job: u32 = field(msg, "job")?;
    let rank: usize = field(msg, "rank")?;
    let world: usize = field(msg, "world")?;
    let asked: Value = field(msg, "config")?;
    let udp: SocketAddr = field(msg, "udp")?;
    let secret = msg.get("job_secret").and_then(Value::as_str).map(|j| secret_digest(s, j));
    let scheme = inalab_scheme::scheme_of(&asked).map_err(|e| NetError::Config(format!("field `config.scheme`: {}", e.message)))?;
    let config = scheme.apply(&asked, &s.opts.overrides()).map_err(|e| {
        let field = if e.field.is_empty() { "config".to_string() } else { format!("config.{}", e.field) };
        plan_err(inalab_scheme::PlanError::new(field, e.message))
    })?;
    if !s.dp.lock().expect("data plane lock").program.has(scheme.name()) {
        let runs = s.dp.lock().expect("data plane lock").program.names();
        return Err(NetError::Config(format!("field `config.scheme`: this switch runs {runs}, the worker asked for {}", scheme.name())));
    }
    if world == 0 || rank >= world {
        return Err(NetError::Config(format!("field `rank`: {rank} is not in 0..{world} (world)")));
    }
    let mut guard = s.cp.lock().expect("control lock");
    let cp = &mut *guard;
    let st = cp.jobs.entry(job).or_insert_with(|| JobState { config: config.clone(), world, secret, members: BTreeMap::new(), spec: None });
    let same = match (&st.secret, &secret) {
        (None, None) => true,
        (Some(a), Some(b)) => crate::auth::proofs_match(&crate::auth::key_to_hex(a), &crate::auth::key_to_hex(b)),
        _ => false,
    };
    if !same {
        return Err(NetError::Auth(format!("job {job}: the rendezvous secret differs from the first joiner's (field `job_secret`)")));
    }
    if st.spec.is_some() {
        return Err(NetError::Config(format!("job {job} is already running; pick another job id")));
    }
    if st.world != world || st.config != config {
        return Err(NetError::Config(format!("job {job}: world {world} / configuration {config} disagrees with the first joiner's {} / {}", st.world, st.config)));
    }
    if st.members.contains_key(&rank) {
        return Err(NetError::Config(format!("job {job}: rank {rank} already joined")));
    }
    st.members.insert(rank, Member { rank, udp, conn: conn.try_clone()?, node: 0, left: false, gone: false });
    if st.members.len() < world {
        return Ok((job, rank));
    }
    // Everyone is here: assign node ids and admit. Ids are drawn at random among the free
    // ones, so nobody learns a job's ids from the order jobs came in.
    let mut workers = vec![];
    let taken: std::collections::BTreeSet<NodeId> = {
        let dp = s.dp.lock().expect("data plane lock");
        dp.routes.keys().copied().chain(cp.jobs.values().flat_map(|j| j.members.values().map(|m| m.node))).collect()
    };
    let st = cp.jobs.get_mut(&job).expect("present");
    let mut used = taken;
    for m in st.members.values_mut() {
        m.node = loop {
            let mut r = [0u8; 2];
            getrandom::fill(&mut r).expect("the operating system's random source");
            let n = s.opts.node << 16 | u16::from_le_bytes(r).max(1) as NodeId;
            if used.insert(n) {
                break n;
            }
        };
        workers.push(WorkerSpec { node: m.node, udp: m.udp, rack: s.opts.node });
    }
    drop(guard);
    let result = build_spec(s, job, config, workers).and_then(|spec| {
        admit(s, &spec)?;
        Ok(spec)
    });
    let mut cp = s.cp.lock().expect("control lock");
    let st = cp.jobs.get_mut(&job).expect("present");
    let reply = match &result {
        Ok(spec) => {
            st.spec = Some(spec.clone());
            None
        }
        Err(e) => Some(err(e)),
    };
    let bound = s.dp.lock().expect("data plane lock").udp().local_addr()?;
    let mut lines = vec![];
    for m in st.members.values() {
        let switch_udp = seen_from(bound, &m.conn);
        let r = reply.clone().unwrap_or_else(|| ok(json!({"node": m.node, "rank": m.rank, "spec": st.spec, "switch_udp": switch_udp})));
        if let Ok(c) = m.conn.try_clone() {
            lines.push((c, r));
        }
    }
    if result.is_err() {
        cp.jobs.remove(&job);
    }
    drop(cp);
    send_all(lines);
    Ok((job, rank))
}

fn build_spec(s: &Shared, job: u32, config: Value, workers: Vec<WorkerSpec>) -> Result<JobSpec, NetError> {
    let key = crate::auth::key_to_hex(&crate::auth::random_key());
    let mut spec = JobSpec { job, config, workers, servers: vec![], switches: vec![s.opts.switch_spec()], key, network: None };
    if spec.scheme()?.servers() != Servers::None {
        let info = ps_info(s)?;
        spec.servers = vec![ServerSpec { node: field(&info, "ps")?, rack: field(&info, "rack")? }];
        spec.switches = field(&info, "switches")?;
    }
    Ok(spec)
}

/// Where a job's `admit` and `release` go next: the PS if it is attached here, else the
/// upstream switch toward it; `None` for jobs without servers.
fn next_hop(s: &Shared, spec: &JobSpec) -> Result<Option<SocketAddr>, NetError> {
    let Some(server) = spec.servers.first() else { return Ok(None) };
    if server.rack != s.opts.node {
        return Ok(s.opts.upstream);
    }
    let ps = s.cp.lock().expect("control lock").ps.filter(|p| p.0 == server.node).map(|p| p.1);
    ps.map(Some).ok_or_else(|| NetError::Config(format!("PS node {} is not attached to switch {}", server.node, s.opts.node)))
}

/// Installs this switch's part of `spec` and passes it on (upstream switch, PS).
fn admit(s: &Arc<Shared>, spec: &JobSpec) -> Result<(), NetError> {
    admit_here(s, spec)?;
    if let Some(next) = next_hop(s, spec)? {
        control::request(next, Some(&s.secret.credential(AuthRole::Switch)), &json!({"op": "admit", "spec": spec}), CONTROL_TIMEOUT)?;
    }
    Ok(())
}

/// Installs this switch's part of `spec`: worker ports and routes, the programs' admissions,
/// the job's key.
pub(super) fn admit_here(s: &Shared, spec: &JobSpec) -> Result<(), NetError> {
    let me = s.opts.node;
    let mac = spec.frame_mac()?;
    let mut dp = s.dp.lock().expect("data plane lock");
    // Everything is checked before anything changes: a refused admit leaves no trace.
    if dp.keys.contains_key(&spec.job) {
        return Err(NetError::Config(format!("job {} is already admitted at switch {me}", spec.job)));
    }
    for w in spec.workers.iter().filter(|w| w.rack == me) {
        if let Some(&p) = dp.by_addr.get(&w.udp) {
            let owner = dp.ports[p as usize].node;
            if owner != w.node {
                return Err(NetError::Config(format!("job {}: worker address {} belongs to node {owner}, not {}", spec.job, w.udp, w.node)));
            }
        }
    }
    // Worker ports (for workers attached here) and routes to the others via their switch.
    let mut local = vec![];
    for w in &spec.workers {
        if w.rack == me {
            let p = dp.add_port(w.udp, w.node, PortKind::Worker);
            dp.ports[p as usize].jobs.push(spec.job);
            local.push((w.node, p));
        } else if let Some(&p) = dp.routes.get(&w.rack) {
            dp.routes.insert(w.node, p);
        }
    }
    // A server attached here may send the job's packets too.
    for server in spec.servers.iter().filter(|sv| sv.rack == me) {
        if let Some(&p) = dp.routes.get(&server.node) {
            dp.ports[p as usize].jobs.push(spec.job);
        }
    }
    // A neighbour's port (a host attached here, or a switch).
    let neighbour = |node: NodeId| dp.routes.get(&node).copied().filter(|&p| dp.ports[p as usize].node == node && dp.ports[p as usize].live);
    let port_of = |node: NodeId| local.iter().find(|(n, _)| *n == node).map(|x| x.1).or_else(|| neighbour(node));
    let plan = spec.plan(Some(me), &port_of)?;
    let (paths, trees) = plan_routes(spec, &plan, me, &neighbour)?;
    for adm in plan.admissions.into_iter().filter(|a| a.switch == me) {
        dp.program.admit_at(adm.program, spec.job, adm.state).map_err(|e| NetError::Config(format!("field `config.{}`: {e}", adm.field)))?;
    }
    dp.paths.extend(paths.into_iter().map(|(k, p)| (k, (spec.job, p))));
    dp.trees.extend(trees.into_iter().map(|(src, t)| ((spec.job, src), Arc::new(t))));
    dp.keys.insert(spec.job, mac);
    Ok(())
}

/// A switch's part of a plan's routes: fixed-path visits ((source, destination, ingress port) ->
/// egress port) and multicast trees by sending host.
type PlanRoutes = (Vec<((NodeId, NodeId, PortId), PortId)>, Vec<(NodeId, Tree)>);

/// This switch's part of a plan's fixed paths and multicast trees (a scheme's routing, e.g.
/// GRID's policy and result tree): for each visit of a path here, (source, destination,
/// ingress port) -> egress port; for each tree through here, its sender -> the children (a
/// host's copy addressed to it). A path or tree that leads here from, or on to, a node that is
/// no neighbour is an error.
fn plan_routes(spec: &JobSpec, plan: &inalab_scheme::Plan, me: NodeId, neighbour: &dyn Fn(NodeId) -> Option<PortId>) -> Result<PlanRoutes, NetError> {
    let host_of = |role: Role| match role {
        Role::Worker { rank } => spec.workers.get(rank as usize).map(|w| w.node),
        Role::Server { index } => spec.servers.get(index as usize).map(|s| s.node),
    };
    let port = |what: &str, n: NodeId| {
        neighbour(n).ok_or_else(|| NetError::Config(format!("job {}: {what} passes switch {me} next to node {n}, which is not its neighbour", spec.job)))
    };
    let mut paths: BTreeMap<(NodeId, NodeId, PortId), PortId> = BTreeMap::new();
    for (role, nodes) in &plan.paths {
        let (Some(&src), Some(&dst)) = (nodes.first(), nodes.last()) else { continue };
        let what = format!("the fixed path of {role:?}");
        for (i, w) in nodes.windows(3).enumerate() {
            if w[1] != me {
                continue;
            }
            let (from, to) = (port(&what, w[0])?, port(&what, w[2])?);
            if paths.insert((src, dst, from), to).is_some_and(|old| old != to) {
                return Err(NetError::Config(format!("job {}: {what} enters switch {me} from node {} twice and leaves it differently (hop {})", spec.job, w[0], i + 1)));
            }
        }
    }
    let mut trees = vec![];
    for (role, edges) in &plan.trees {
        let Some(src) = host_of(*role) else { continue };
        let what = format!("the multicast tree of {role:?}");
        let mut tree = Tree::default();
        for &(_, c) in edges.iter().filter(|(p, _)| *p == me) {
            let p = port(&what, c)?;
            if spec.workers.iter().any(|w| w.node == c) || spec.servers.iter().any(|s| s.node == c) {
                tree.hosts.push((p, c));
            } else {
                tree.switches.push(p);
            }
        }
        if !tree.switches.is_empty() || !tree.hosts.is_empty() {
            trees.push((src, tree));
        }
    }
    Ok((paths.into_iter().collect(), trees))
}

/// Removes a job here and at the switches and PS it was passed to. `reason`: the job failed.
fn release(s: &Shared, job: u32, reason: Option<&str>) {
    let (spec, lines) = {
        let mut cp = s.cp.lock().expect("control lock");
        let st = cp.jobs.remove(&job);
        let mut lines = vec![];
        if let (Some(st), Some(reason)) = (&st, reason) {
            for m in st.members.values() {
                if let Ok(c) = m.conn.try_clone() {
                    lines.push((c, json!({"event": "failed", "job": job, "reason": reason})));
                }
            }
        }
        (st.and_then(|st| st.spec), lines)
    };
    send_all(lines);
    let mut dp = s.dp.lock().expect("data plane lock");
    dp.program.release(job);
    dp.keys.remove(&job);
    dp.paths.retain(|_, (j, _)| *j != job);
    dp.trees.retain(|(j, _), _| *j != job);
    dp.ports.iter_mut().for_each(|p| p.jobs.retain(|&j| j != job));
    let Some(spec) = spec else { return };
    for w in &spec.workers {
        if w.rack == s.opts.node {
            dp.remove_port(w.node);
        } else {
            dp.routes.remove(&w.node);
        }
    }
    drop(dp);
    if let Ok(Some(addr)) = next_hop(s, &spec) {
        if let Err(e) = control::request(addr, Some(&s.secret.credential(AuthRole::Switch)), &json!({"op": "release", "job": job}), CONTROL_TIMEOUT) {
            eprintln!("inalab switch: releasing job {job} at {addr}: {e}");
        }
    }
}

fn leave(s: &Shared, job: u32, rank: usize) {
    let done = {
        let mut cp = s.cp.lock().expect("control lock");
        let Some(st) = cp.jobs.get_mut(&job) else { return };
        if let Some(m) = st.members.get_mut(&rank) {
            m.left = true;
        }
        st.spec.is_some() && st.members.values().all(|m| m.left || m.gone)
    };
    if done {
        release(s, job, None);
    }
}

fn disconnected(s: &Shared, job: u32, rank: usize) {
    let (reason, lines, all_gone, here_only) = {
        let mut cp = s.cp.lock().expect("control lock");
        let Some(st) = cp.jobs.get_mut(&job) else { return };
        let reason = match st.members.get(&rank) {
            Some(m) if m.left || m.gone => return,
            Some(m) if st.spec.is_some() => {
                format!("worker rank {rank} (node {}, {}) disconnected from the switch's control plane without leaving", m.node, m.udp)
            }
            Some(_) => {
                // Still in the rendezvous: forget it; the others keep waiting.
                st.members.remove(&rank);
                if st.members.is_empty() {
                    cp.jobs.remove(&job);
                }
                return;
            }
            None => return,
        };
        st.members.get_mut(&rank).expect("checked").gone = true;
        // The other workers are told; each one's protocol goes on without the dead one or
        // aborts the job (`abort`). Across switches only this switch's workers would hear of
        // it, so a job spanning switches fails as before.
        let here_only = st.spec.as_ref().is_some_and(|sp| sp.workers.iter().all(|w| w.rack == s.opts.node));
        // Workers that left (finished) are named too, first: a survivor's recovery must not
        // wait for them (a protocol told twice of a rank ignores the second).
        let mut ranks: Vec<usize> = st.members.values().filter(|m| m.left).map(|m| m.rank).collect();
        ranks.push(rank);
        let events: Vec<Value> = ranks.iter().map(|&r| json!({"event": "peer_failed", "job": job, "rank": r, "reason": reason})).collect();
        let lines: Vec<(TcpStream, Value)> = st
            .members
            .values()
            .filter(|m| !m.left && !m.gone)
            .flat_map(|m| events.iter().filter_map(|e| m.conn.try_clone().ok().map(|c| (c, e.clone()))))
            .collect();
        let all_gone = st.members.values().all(|m| m.left || m.gone);
        (reason, lines, all_gone, here_only)
    };
    if !here_only || all_gone {
        eprintln!("inalab switch: job {job} failed: {reason}");
        return release(s, job, Some(&reason));
    }
    eprintln!("inalab switch: job {job}: {reason}; its other workers are told");
    send_all(lines);
}
