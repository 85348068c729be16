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
use std::time::{Duration, Instant};

/// A worker waiting in the rendezvous or running in an admitted job.
struct Member {
    rank: usize,
    udp: SocketAddr,
    conn: TcpStream,
    node: NodeId,
    left: bool,
    /// Its connection dropped without a `leave` (the job went on without it).
    gone: bool,
    /// When it stops waiting for the other ranks (its join timeout, at most
    /// [`MAX_JOIN_WAIT`]): then it is told so and its connection closed, so that joins that
    /// never complete cannot hold the switch's connections.
    deadline: Instant,
}

/// The longest a joiner may wait in a rendezvous, whatever join timeout it asks for: 10 min.
pub const MAX_JOIN_WAIT: Duration = Duration::from_secs(600);
/// How long a joiner that names no join timeout waits: 60 s (the clients' default).
pub const DEFAULT_JOIN_WAIT: Duration = Duration::from_secs(60);

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
    /// The attached PS.
    ps: Option<PsAttachment>,
    /// Attachments so far, to tell a PS's current connection from one it replaced.
    attachments: u64,
}

/// The PS attached here: its node, control address, and which attachment this is (a PS that
/// comes back replaces its older connection, whose end must then fail nothing).
#[derive(Debug, Clone, Copy)]
struct PsAttachment {
    node: NodeId,
    udp: SocketAddr,
    control: SocketAddr,
    generation: u64,
}

impl ControlState {
    /// The jobs joining or admitted here.
    pub(super) fn job_ids(&self) -> Vec<u32> {
        self.jobs.keys().copied().collect()
    }

    /// The jobs still in their rendezvous (not admitted).
    pub(super) fn joining(&self) -> Vec<u32> {
        self.jobs.iter().filter(|(_, j)| j.spec.is_none()).map(|(&id, _)| id).collect()
    }

    /// Admitted jobs whose server is PS `node`.
    fn served_by(&self, node: NodeId) -> Vec<u32> {
        self.jobs.iter().filter(|(_, j)| j.spec.as_ref().is_some_and(|sp| sp.servers.iter().any(|v| v.node == node))).map(|(&id, _)| id).collect()
    }
}

/// Serves one control connection until it closes.
pub(super) fn serve(s: &Arc<Shared>, conn: TcpStream) {
    // (Writes give up after crate::service::WRITE_TIMEOUT: a peer that does not read costs
    // only its own connection.)
    let Ok(w) = conn.try_clone() else { return };
    let mut w = crate::service::Replies::new(w);
    let mut r = BufReader::new(conn);
    // A join turns this connection into a worker's: (job, rank).
    let mut member: Option<(u32, usize)> = None;
    // An attach as PS turns it into the PS's, (node, attachment): it must ping at least every
    // PS_LIVENESS.
    let mut ps: Option<(NodeId, u64)> = None;
    let mut auth = ServerAuth::new(s.secret.clone());
    loop {
        let msg = match next_request(&mut r, &mut w) {
            Some(Ok(m)) => m,
            Some(Err(())) => continue,
            None => break,
        };
        let op = msg["op"].as_str().unwrap_or("");
        if let Some((reply, close)) = gate(s, &mut auth, op, &msg) {
            if w.send(&reply).is_err() || close {
                break;
            }
            continue;
        }
        let reply = match op {
            "join" if member.is_none() => match join(s, &msg, &w.conn) {
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
                Some((job, _)) => abort(s, job, &msg),
                None => err("`abort` needs a `join` first on this connection"),
            },
            "attach" if msg["role"] == "ps" && ps.is_none() => match attach_ps(s, &msg, &w.conn) {
                Ok((reply, attached)) => {
                    ps = Some(attached);
                    let _ = r.get_ref().set_read_timeout(Some(PS_LIVENESS));
                    reply
                }
                Err(e) => err(e),
            },
            // The PS lost a job (its server endpoint panicked): the job fails everywhere.
            "fail" => match ps {
                Some((node, _)) => ps_failed_job(s, node, &msg).unwrap_or_else(err),
                None => err("`fail` is the attached PS's: attach first on this connection"),
            },
            _ => handle(s, op, &msg, &w.conn, auth.role()).unwrap_or_else(err),
        };
        if w.send(&reply).is_err() {
            break;
        }
    }
    if let Some((job, rank)) = member {
        disconnected(s, job, rank);
    }
    if let Some((node, attachment)) = ps {
        ps_gone(s, node, attachment);
    }
}

/// The answer to a request that authenticates, or that this connection may not make, and
/// whether the connection closes after it (a failed authentication closes it); `None` for a
/// request to serve.
fn gate(s: &Shared, auth: &mut ServerAuth, op: &str, msg: &Value) -> Option<(Value, bool)> {
    if let Some(r) = auth.handle(op, msg) {
        let failed = r.is_err();
        return Some((r.unwrap_or_else(err), failed));
    }
    // A switch whose data plane stopped serves nothing: it says why, and nothing else.
    let refused = super::health(s).and_then(|()| allowed(op, msg).map_or(Ok(()), |roles| auth.require(op, roles)));
    refused.err().map(|e| (err(e), false))
}

/// The next request on a control connection: `None` when the connection is over (closed, or
/// a line too long to read on from), `Some(Err(()))` for a bad line already answered.
fn next_request(r: &mut BufReader<TcpStream>, w: &mut crate::service::Replies) -> Option<Result<Value, ()>> {
    match control::read_line(r) {
        Ok(Some(m)) => Some(Ok(m)),
        Ok(None) | Err(NetError::Io(_)) => None,
        Err(e @ NetError::TooLong(_)) => {
            let _ = w.send(&err(e));
            None
        }
        Err(e) => {
            let _ = w.send(&err(e));
            Some(Err(()))
        }
    }
}

/// A worker whose protocol cannot go on without a dead peer ends its job for all.
fn abort(s: &Arc<Shared>, job: u32, msg: &Value) -> Value {
    let reason = msg["reason"].as_str().unwrap_or("a worker aborted the job").to_string();
    eprintln!("inalab switch: job {job} failed: {reason}");
    release(s, job, Some(&reason));
    ok(json!({}))
}

/// Sends each line on its connection, with no lock held (each write is bounded by
/// [`crate::service::WRITE_TIMEOUT`]).
fn send_all(lines: Vec<(TcpStream, Value)>) {
    for (mut c, v) in lines {
        let _ = control::send_line(&mut c, &v);
    }
}

/// How long the attached PS may go without a word (it pings every second) before the switch
/// takes it for dead and fails its jobs.
pub(crate) const PS_LIVENESS: std::time::Duration = std::time::Duration::from_secs(5);

/// The PS's control connection closed or went silent: every job it serves fails, with the
/// reason and what to do on every worker, and another PS may attach. Nothing happens if the
/// PS came back on a newer connection meanwhile (`attachment` is no longer the current one).
fn ps_gone(s: &Arc<Shared>, node: NodeId, attachment: u64) {
    let jobs: Vec<u32> = {
        let mut cp = crate::lock(&s.cp);
        if !cp.ps.is_some_and(|p| p.node == node && p.generation == attachment) {
            return;
        }
        cp.ps = None;
        cp.served_by(node)
    };
    s.each_shard(|dp| dp.remove_port(node));
    let reason = format!(
        "the parameter server (node {node}) disconnected or stopped answering for {PS_LIVENESS:?}: its jobs here failed. A PS that still runs \
         re-attaches by itself (then start the job again); else restart it (`inalab ps --switch <this switch's control address>`)"
    );
    if !jobs.is_empty() {
        eprintln!("inalab switch: {reason}; failing jobs {jobs:?}");
    }
    for job in jobs {
        release(s, job, Some(&reason));
    }
}

/// A PS attaches (`{"op": "attach", "role": "ps", "node", "udp", "control", "jobs"}`): one PS
/// at a time; the same node coming back (its switch restarted, or either stalled past the
/// liveness limit) replaces its older connection. `jobs` are the jobs it still runs: those
/// this switch serves with it and it lists are kept, the others fail here (the PS lost them);
/// the reply's `jobs` are the kept ones, so the PS frees the rest. Returns the reply and the
/// attachment (node, generation).
fn attach_ps(s: &Arc<Shared>, msg: &Value, conn: &TcpStream) -> Result<(Value, (NodeId, u64)), NetError> {
    let node: NodeId = field(msg, "node")?;
    let udp: SocketAddr = field(msg, "udp")?;
    let control: SocketAddr = field(msg, "control")?;
    let holds: Vec<u32> = if msg.get("jobs").is_some_and(|j| !j.is_null()) { field(msg, "jobs")? } else { vec![] };
    control::check_node(node)?;
    let (generation, kept, lost) = {
        let mut cp = crate::lock(&s.cp);
        match cp.ps {
            Some(other) if other.node != node => {
                return Err(NetError::Config(format!("a parameter server (node {}) is attached to this switch and alive; a second one is refused", other.node)))
            }
            _ => {}
        }
        // Its jobs survive only if it comes back at the same address (a new address is a new
        // process, whose servers start empty) and still runs them.
        let same_place = cp.ps.is_some_and(|p| p.udp == udp);
        cp.attachments += 1;
        let generation = cp.attachments;
        cp.ps = Some(PsAttachment { node, udp, control, generation });
        let (kept, lost): (Vec<u32>, Vec<u32>) = cp.served_by(node).into_iter().partition(|j| same_place && holds.contains(j));
        (generation, kept, lost)
    };
    for job in lost {
        release(s, job, Some(&format!("the parameter server (node {node}) came back without job {job} (it restarted or moved): the job's state there is lost")));
    }
    // Every shard may run a job it serves (the PS learns which at the job's admission).
    let port = {
        let _one_at_a_time = crate::lock(&s.admitting);
        let mut ports = vec![];
        s.each_shard(|dp| ports.push(dp.add_port(udp, node, PortKind::Ps)));
        ports[0]
    };
    let bound = s.dp().udp().local_addr()?;
    Ok((ok(json!({"port": port, "node": s.opts.node, "udp": seen_from(bound, conn), "jobs": kept})), (node, generation)))
}

/// The attached PS `node` reports that it lost `job` (`{"op": "fail", "job", "reason"}`): the
/// job fails on every worker with the PS's reason.
fn ps_failed_job(s: &Arc<Shared>, node: NodeId, msg: &Value) -> Result<Value, NetError> {
    let job: u32 = field(msg, "job")?;
    let reason: String = field(msg, "reason")?;
    if crate::lock(&s.cp).served_by(node).contains(&job) {
        let reason = format!("the parameter server (node {node}): {}", inalab_scheme::clip(&reason, 400));
        eprintln!("inalab switch: job {job} failed: {reason}");
        release(s, job, Some(&reason));
    }
    Ok(ok(json!({})))
}

/// The roles that may send `op` (`None`: anyone, authenticated or not: `stats`, `ping`).
fn allowed(op: &str, msg: &Value) -> Option<&'static [AuthRole]> {
    match op {
        "join" | "leave" | "abort" => Some(&[AuthRole::Worker]),
        "attach" if msg["role"] == "ps" => Some(&[AuthRole::Ps]),
        "fail" => Some(&[AuthRole::Ps]),
        "attach" | "ps_info" | "admit" | "release" | "link" => Some(&[AuthRole::Switch]),
        _ => None,
    }
}

/// Requests that are answered at once. `role`: what the connection authenticated as.
fn handle(s: &Arc<Shared>, op: &str, msg: &Value, conn: &TcpStream, role: Option<AuthRole>) -> Result<Value, NetError> {
    match op {
        "attach" => {
            let role: String = field(msg, "role")?;
            let node: NodeId = field(msg, "node")?;
            let udp: SocketAddr = field(msg, "udp")?;
            match role.as_str() {
                "switch" => {}
                "ps" => return Err(NetError::Protocol("this connection is attached already".into())),
                r => return Err(NetError::Protocol(format!("field `role`: {:?} is not one of \"ps\", \"switch\"", inalab_scheme::clip(r, 64)))),
            }
            // Jobs that span switches run on shard 0 (see `shards_for`).
            let port = {
                let _one_at_a_time = crate::lock(&s.admitting);
                s.dp().add_port(udp, node, PortKind::Switch)
            };
            let bound = s.dp().udp().local_addr()?;
            Ok(ok(json!({"port": port, "node": s.opts.node, "udp": seen_from(bound, conn)})))
        }
        "ps_info" => ps_info(s).map(ok),
        "admit" => {
            let mut spec: JobSpec = field(msg, "spec")?;
            admit(s, &mut spec)?;
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
            s.set_link(peer, up)?;
            Ok(ok(json!({})))
        }
        "ping" => Ok(ok(json!({}))),
        // Only switches see the jobs still in their rendezvous: a tenant that learns a waiting
        // job's id could take one of its free ranks (docs/runtime.md, "Threat model").
        "stats" => Ok(ok(stats(s, role == Some(AuthRole::Switch)))),
        "join" => Err(NetError::Protocol("this connection already joined a job".into())),
        other => Err(NetError::Protocol(format!(
            "field `op`: {:?} is not one of \"join\", \"leave\", \"attach\", \"ps_info\", \"admit\", \"release\", \"link\", \"stats\"",
            inalab_scheme::clip(other, 64)
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
    if let Some(ps) = crate::lock(&s.cp).ps {
        return Ok(json!({"ps": ps.node, "rack": s.opts.node, "switches": [s.opts.switch_spec()]}));
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

/// What a joining worker asked for, checked.
struct Joiner {
    job: u32,
    rank: usize,
    world: usize,
    /// The job's configuration with this switch's defaults.
    config: Value,
    udp: SocketAddr,
    secret: Option<[u8; 32]>,
    wait: Duration,
}

/// A `join` request's fields, each checked against what this switch runs and allows.
fn joiner(s: &Arc<Shared>, msg: &Value) -> Result<Joiner, NetError> {
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
    if !s.dp().program.has(scheme.name()) {
        let runs = s.dp().program.names();
        return Err(NetError::Config(format!("field `config.scheme`: this switch runs {runs}, the worker asked for {}", scheme.name())));
    }
    if !(1..=MAX_WORLD).contains(&world) {
        return Err(NetError::Config(format!("field `world`: {world} workers; allowed: 1..={MAX_WORLD}")));
    }
    if rank >= world {
        return Err(NetError::Config(format!("field `rank`: {rank} is not in 0..{world} (world)")));
    }
    let wait = join_wait(msg)?;
    Ok(Joiner { job, rank, world, config, udp, secret, wait })
}

/// Registers a joining worker; completes the rendezvous when it is the last rank.
fn join(s: &Arc<Shared>, msg: &Value, conn: &TcpStream) -> Result<(u32, usize), NetError> {
    let Joiner { job, rank, world, config, udp, secret, wait } = joiner(s, msg)?;
    let mut guard = crate::lock(&s.cp);
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
        // The first joiner's configuration is not quoted: it is what a joiner would need to
        // pass for one of its ranks.
        return Err(NetError::Config(format!(
            "job {job}: world {world} and configuration {} (with this switch's defaults) differ from the first joiner's; every worker of a job gives the same",
            inalab_scheme::clip(&config.to_string(), 200)
        )));
    }
    if st.members.contains_key(&rank) {
        return Err(NetError::Config(format!("job {job}: rank {rank} already joined")));
    }
    st.members.insert(rank, Member { rank, udp, conn: conn.try_clone()?, node: 0, left: false, gone: false, deadline: Instant::now() + wait });
    if st.members.len() < world {
        return Ok((job, rank));
    }
    // Everyone is here: assign node ids and admit.
    let workers = assign_nodes(s, cp, job);
    drop(guard);
    admit_joined(s, job, config, workers)?;
    Ok((job, rank))
}

/// Every member of `job` gets a node id, drawn at random among the free ones so that nobody
/// learns a job's ids from the order jobs came in.
fn assign_nodes(s: &Shared, cp: &mut ControlState, job: u32) -> Vec<WorkerSpec> {
    let mut workers = vec![];
    let mut taken: std::collections::BTreeSet<NodeId> = cp.jobs.values().flat_map(|j| j.members.values().map(|m| m.node)).collect();
    s.each_shard(|dp| taken.extend(dp.fwd.routes.keys().copied()));
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
    workers
}

/// Admits a job whose ranks all joined and answers each of them (the spec and the switch
/// threads to send to, or why the admission failed).
fn admit_joined(s: &Arc<Shared>, job: u32, config: Value, workers: Vec<WorkerSpec>) -> Result<(), NetError> {
    let result = build_spec(s, job, config, workers).and_then(|mut spec| {
        let shards = admit(s, &mut spec)?;
        Ok((spec, shards))
    });
    let mut cp = crate::lock(&s.cp);
    let Some(st) = cp.jobs.get_mut(&job) else {
        // Every rank's connection closed while the job was admitted: nobody runs it.
        drop(cp);
        if let Ok((spec, _)) = &result {
            release_here(s, job, Some(spec));
            if let Ok(Some(addr)) = next_hop(s, spec) {
                let _ = control::request(addr, Some(&s.secret.credential(AuthRole::Switch)), &json!({"op": "release", "job": job}), CONTROL_TIMEOUT);
            }
        }
        return Err(NetError::JobFailed(format!("job {job}: every worker left during its admission")));
    };
    let (reply, shards) = match &result {
        Ok((spec, shards)) => {
            st.spec = Some(spec.clone());
            (None, shards.clone())
        }
        Err(e) => (Some(err(e)), vec![0]),
    };
    // The job's workers send to the threads that run it.
    let bound: Vec<SocketAddr> = shards.iter().map(|&k| crate::lock(&s.shards[k]).udp().local_addr()).collect::<Result<_, _>>()?;
    let mut lines = vec![];
    for m in st.members.values() {
        let seen: Vec<SocketAddr> = bound.iter().map(|&b| seen_from(b, &m.conn)).collect();
        let mut r = json!({"node": m.node, "rank": m.rank, "spec": st.spec, "switch_udp": seen[0]});
        if seen.len() > 1 {
            r["switch_threads"] = json!(seen);
        }
        let r = reply.clone().unwrap_or_else(|| ok(r));
        if let Ok(c) = m.conn.try_clone() {
            lines.push((c, r));
        }
    }
    if result.is_err() {
        cp.jobs.remove(&job);
    }
    drop(cp);
    send_all(lines);
    Ok(())
}

/// The most workers a job may have: a control line (an `admit` of the job's spec) holds about
/// 1,024 workers' worth (see [`crate::control::MAX_LINE_BYTES`]).
pub const MAX_WORLD: usize = 1024;

/// How long a joiner waits for the other ranks: the `timeout_s` it sends (its own join
/// timeout), at most [`MAX_JOIN_WAIT`]; [`DEFAULT_JOIN_WAIT`] if it sends none.
fn join_wait(msg: &Value) -> Result<Duration, NetError> {
    match msg.get("timeout_s") {
        None | Some(Value::Null) => Ok(DEFAULT_JOIN_WAIT),
        Some(v) => match v.as_f64().filter(|t| t.is_finite() && *t > 0.0) {
            Some(t) => Ok(Duration::from_secs_f64(t.min(MAX_JOIN_WAIT.as_secs_f64()))),
            None => Err(NetError::Config(format!("field `timeout_s`: {} is not a positive number of seconds", inalab_scheme::quote(v)))),
        },
    }
}

/// Ends the waits of joiners past their deadline: each is told, and its connection closed, so
/// joins that never complete hold no connection longer than their join timeout (at most
/// [`MAX_JOIN_WAIT`]). The rendezvous goes on for those still waiting.
pub(super) fn reap_rendezvous(s: &Shared) {
    let now = Instant::now();
    let mut late = vec![];
    {
        let mut cp = crate::lock(&s.cp);
        // (A job whose ranks are all in is being admitted: its replies come from there.)
        for (&job, st) in cp.jobs.iter_mut().filter(|(_, st)| st.spec.is_none() && st.members.len() < st.world) {
            let ranks: Vec<usize> = st.members.values().filter(|m| m.deadline <= now).map(|m| m.rank).collect();
            for r in ranks {
                let m = st.members.remove(&r).expect("listed");
                let reason = format!("job {job}: not every one of its {} workers joined in time ({} of them are here); the switch ends rank {r}'s wait", st.world, st.members.len() + 1);
                late.push((m.conn, reason));
            }
        }
        cp.jobs.retain(|_, st| st.spec.is_some() || !st.members.is_empty());
    }
    for (conn, reason) in late {
        if let Ok(mut c) = conn.try_clone() {
            let _ = control::send_line(&mut c, &err(reason));
        }
        // Its serving thread sees the end of the stream and exits, freeing the connection.
        let _ = conn.shutdown(std::net::Shutdown::Both);
    }
}

fn build_spec(s: &Shared, job: u32, config: Value, workers: Vec<WorkerSpec>) -> Result<JobSpec, NetError> {
    let key = crate::auth::key_to_hex(&crate::auth::random_key());
    let mut spec = JobSpec { job, config, workers, servers: vec![], switches: vec![s.opts.switch_spec()], key, network: None, lanes: 1 };
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
    let ps = crate::lock(&s.cp).ps.filter(|p| p.node == server.node).map(|p| p.control);
    ps.map(Some).ok_or_else(|| NetError::Config(format!("PS node {} is not attached to switch {}", server.node, s.opts.node)))
}

/// Installs this switch's part of `spec` and passes it on (upstream switch, PS). Returns the
/// shards that run it.
///
/// A job spread over several shards gets `lanes` set to their number before it goes on, so
/// the PS and the workers (the join reply's spec) plan for packets that overtake each other.
fn admit(s: &Arc<Shared>, spec: &mut JobSpec) -> Result<Vec<usize>, NetError> {
    let shards = admit_here(s, spec)?;
    spec.lanes = shards.len() as u32;
    let spec = &*spec;
    let passed_on = next_hop(s, spec).and_then(|next| {
        let Some(next) = next else { return Ok(()) };
        let mut msg = json!({"op": "admit", "spec": spec});
        if shards != [0] {
            // Only a PS attached here is the next hop of a job on other shards than 0: it
            // sends the job's frames to those shards' sockets.
            let bound: Vec<SocketAddr> = shards.iter().map(|&k| crate::lock(&s.shards[k]).udp().local_addr()).collect::<Result<_, _>>()?;
            msg["gateways"] = json!(bound.into_iter().map(|b| control::announce(b, next)).collect::<Vec<_>>());
        }
        control::request(next, Some(&s.secret.credential(AuthRole::Switch)), &msg, CONTROL_TIMEOUT).map(drop)
    });
    if passed_on.is_err() {
        // Refused further on (or the next hop is gone): nothing of it may stay here, or
        // refused jobs would hold this switch's aggregators for ever.
        release_here(s, spec.job, Some(spec));
    }
    passed_on.map(|()| shards)
}

/// Whether all of `spec`'s datagrams at this switch come from its own workers and a PS
/// attached here, so that it may run on any shard (the PS is told which: `admit`'s
/// `gateways`); a job that spans switches or a static fabric runs on shard 0, whose socket
/// is the one the other switches know.
fn here_only(s: &Shared, spec: &JobSpec) -> bool {
    let me = s.opts.node;
    spec.network.is_none()
        && spec.switches.iter().all(|sw| sw.node == me)
        && spec.workers.iter().all(|w| w.rack == me)
        && spec.servers.iter().all(|sv| sv.rack == me)
}

/// The shards that may run `spec` alone, in the order to try them: shard 0 for a job that
/// is not [`here_only`], else the least busy first (fewest jobs, then the lowest index).
fn shards_for(s: &Shared, spec: &JobSpec) -> Vec<usize> {
    if !here_only(s, spec) {
        return vec![0];
    }
    let mut load: Vec<(usize, usize)> = s.shards.iter().enumerate().map(|(k, sh)| (crate::lock(sh).guard.keys.len(), k)).collect();
    load.sort();
    load.into_iter().map(|(_, k)| k).collect()
}

/// Installs this switch's part of `spec`: worker ports and routes, the programs' admissions,
/// the job's key.
///
/// The scheme's plan (its own code, sized by the job's configuration) runs with no lock held,
/// from a snapshot of the ports it may name, and its panics are caught: a plan that is slow,
/// large or broken refuses its own job and never holds up packets or another tenant's
/// admission. [`Shared::admitting`] keeps the port table as the snapshot saw it meanwhile.
///
/// A job whose scheme steers its packets by a key ([`inalab_scheme::Scheme::steering`]) and
/// that is [`here_only`] is admitted on every shard: its workers and PS send each packet to
/// the shard its key picks, so one job uses every thread. Any other job is tried on each
/// shard [`shards_for`] names until one admits it (each has its own aggregator memory, which
/// other jobs may fill). Returns the shards, or the (last) refusal.
pub(super) fn admit_here(s: &Shared, spec: &JobSpec) -> Result<Vec<usize>, NetError> {
    let _one_at_a_time = crate::lock(&s.admitting);
    for k in 0..s.shards.len() {
        check_admit(&crate::lock(&s.shards[k]), spec, s.opts.node)?;
    }
    if s.shards.len() > 1 && here_only(s, spec) && spec.scheme()?.steering().is_some() {
        for k in 0..s.shards.len() {
            if let Err(e) = admit_on(s, k, spec) {
                for done in 0..k {
                    release_on(s, done, spec.job, Some(spec));
                }
                return Err(e);
            }
        }
        return Ok((0..s.shards.len()).collect());
    }
    let mut refused = None;
    for shard in shards_for(s, spec) {
        match admit_on(s, shard, spec) {
            Ok(()) => return Ok(vec![shard]),
            Err(e) => refused = Some(e),
        }
    }
    Err(refused.expect("at least shard 0 is tried"))
}

/// [`admit_here`] on one shard, [`Shared::admitting`] held.
fn admit_on(s: &Shared, shard: usize, spec: &JobSpec) -> Result<(), NetError> {
    let me = s.opts.node;
    let mac = spec.frame_mac()?;
    let view = {
        let dp = crate::lock(&s.shards[shard]);
        check_admit(&dp, spec, me)?;
        PortsView::of(&dp, spec, me)
    };
    let planned = crate::guarded(|| -> Result<_, NetError> {
        let plan = spec.plan(Some(me), &|n| view.port_of(n))?;
        let routes = plan_routes(spec, &plan, me, &|n| view.neighbour(n))?;
        // Only what this switch admits is kept; the endpoints the plan built are dropped here,
        // outside the lock.
        let admissions: Vec<_> = plan.admissions.into_iter().filter(|a| a.switch == me).collect();
        Ok((admissions, routes))
    });
    let (admissions, (paths, trees)) = planned.map_err(|p| NetError::Config(format!("job {}: refused: setting it up panicked ({p})", spec.job)))??;
    let mut dp = crate::lock(&s.shards[shard]);
    check_admit(&dp, spec, me)?;
    if !view.still_holds(&dp) {
        return Err(NetError::Config(format!("job {}: the switch's ports changed while it was set up; join again", spec.job)));
    }
    // The programs first, the only step that may refuse: a refused job leaves no port, route
    // or key behind. A program's panic refuses the job and releases what it admitted.
    for adm in admissions {
        let (program, field) = (adm.program, adm.field);
        let admitted = crate::guarded(|| dp.program.admit_at(program, spec.job, adm.state));
        let refusal = match admitted {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => format!("field `config.{field}`: {e}"),
            Err(p) => format!("job {}: refused: the {program} program panicked admitting it ({p})", spec.job),
        };
        let _ = crate::guarded(|| dp.program.release(spec.job));
        return Err(NetError::Config(refusal));
    }
    // Worker ports (for workers attached here) and routes to the others via their switch.
    for w in &spec.workers {
        if w.rack == me {
            let p = dp.add_port(w.udp, w.node, PortKind::Worker);
            debug_assert_eq!(Some(p), view.port_of(w.node), "the port the plan was made with");
            dp.ports[p as usize].jobs.push(spec.job);
        } else if let Some(&p) = dp.fwd.routes.get(&w.rack) {
            dp.fwd.routes.insert(w.node, p);
        }
    }
    // A server attached here may send the job's packets too.
    for server in spec.servers.iter().filter(|sv| sv.rack == me) {
        if let Some(&p) = dp.fwd.routes.get(&server.node) {
            dp.ports[p as usize].jobs.push(spec.job);
        }
    }
    dp.fwd.paths.extend(paths.into_iter().map(|(k, p)| (k, (spec.job, p))));
    dp.fwd.trees.extend(trees.into_iter().map(|(src, t)| ((spec.job, src), Arc::new(t))));
    dp.guard.keys.insert(spec.job, mac);
    Ok(())
}

/// What an admission is checked for before anything changes: a job already admitted, or a
/// worker address that belongs to another node, is refused.
fn check_admit(dp: &super::DataPlane, spec: &JobSpec, me: NodeId) -> Result<(), NetError> {
    if dp.guard.keys.contains_key(&spec.job) {
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
    Ok(())
}

/// The ports a job's plan may name at this switch, taken under the data-plane lock and read
/// without it: the port each local worker will get (an existing one for its address, else the
/// next free index) and every live neighbour's.
struct PortsView {
    local: Vec<(NodeId, SocketAddr, PortId)>,
    /// The existing port of each local worker's address, as seen (to check nothing moved).
    seen: Vec<(SocketAddr, Option<PortId>)>,
    neighbours: std::collections::HashMap<NodeId, PortId>,
    ports_len: usize,
}

impl PortsView {
    fn of(dp: &super::DataPlane, spec: &JobSpec, me: NodeId) -> PortsView {
        let mut local: Vec<(NodeId, SocketAddr, PortId)> = vec![];
        let mut seen = vec![];
        let mut next = dp.ports.len() as PortId;
        for w in spec.workers.iter().filter(|w| w.rack == me) {
            let existing = dp.by_addr.get(&w.udp).copied();
            seen.push((w.udp, existing));
            let p = existing.or_else(|| local.iter().find(|l| l.1 == w.udp).map(|l| l.2)).unwrap_or_else(|| {
                next += 1;
                next - 1
            });
            local.push((w.node, w.udp, p));
        }
        let neighbours = dp.fwd.routes.iter().filter(|(&n, &p)| dp.ports[p as usize].node == n && dp.ports[p as usize].live).map(|(&n, &p)| (n, p)).collect();
        PortsView { local, seen, neighbours, ports_len: dp.ports.len() }
    }

    /// A neighbour's port (a host attached here, or a switch).
    fn neighbour(&self, node: NodeId) -> Option<PortId> {
        self.neighbours.get(&node).copied()
    }

    fn port_of(&self, node: NodeId) -> Option<PortId> {
        self.local.iter().find(|l| l.0 == node).map(|l| l.2).or_else(|| self.neighbour(node))
    }

    /// Whether the ports are still as seen (only an admission or an attach adds one, and
    /// [`Shared::admitting`] holds those off; a release may have removed an address).
    fn still_holds(&self, dp: &super::DataPlane) -> bool {
        dp.ports.len() == self.ports_len && self.seen.iter().all(|(addr, p)| dp.by_addr.get(addr).copied() == *p)
    }
}

/// A switch's part of a plan's routes: fixed-path visits ((source, destination, ingress port) ->
/// egress port) and multicast trees by sending host.
type SwitchRoutes = (Vec<((NodeId, NodeId, PortId), PortId)>, Vec<(NodeId, Tree)>);

/// This switch's part of a plan's fixed paths and multicast trees ([`inalab_scheme::PlanRoutes`],
/// the description the simulator forwards by too) in its own ports; a tree's children that
/// are the job's hosts get copies addressed to them. A path or tree that leads here from, or
/// on to, a node that is no neighbour is an error.
fn plan_routes(spec: &JobSpec, plan: &inalab_scheme::Plan, me: NodeId, neighbour: &dyn Fn(NodeId) -> Option<PortId>) -> Result<SwitchRoutes, NetError> {
    let routes = inalab_scheme::PlanRoutes::of(plan, |role| match role {
        Role::Worker { rank } => spec.workers.get(rank as usize).map(|w| w.node),
        Role::Server { index } => spec.servers.get(index as usize).map(|s| s.node),
    });
    let port = |what: &str, n: NodeId| {
        neighbour(n).ok_or_else(|| NetError::Config(format!("job {}: {what} passes switch {me} next to node {n}, which is not its neighbour", spec.job)))
    };
    let visits = routes.visits_at(me).map_err(|e| NetError::Config(format!("job {}: {e}", spec.job)))?;
    let paths = visits
        .into_iter()
        .map(|((src, dst, from), to)| {
            let what = format!("the fixed path from node {src} to node {dst}");
            Ok(((src, dst, port(&what, from)?), port(&what, to)?))
        })
        .collect::<Result<_, NetError>>()?;
    let mut trees = vec![];
    for (t, children) in routes.trees_at(me) {
        let what = format!("the multicast tree of {:?}", t.role);
        let mut tree = Tree::default();
        for &c in children {
            let p = port(&what, c)?;
            if spec.workers.iter().any(|w| w.node == c) || spec.servers.iter().any(|s| s.node == c) {
                tree.hosts.push((p, c));
            } else {
                tree.switches.push(p);
            }
        }
        trees.push((t.sender, tree));
    }
    Ok((paths, trees))
}

/// Removes a job here and at the switches and PS it was passed to. `reason`: the job failed.
pub(super) fn release(s: &Shared, job: u32, reason: Option<&str>) {
    let (spec, lines) = {
        let mut cp = crate::lock(&s.cp);
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
    release_here(s, job, spec.as_ref());
    let Some(spec) = spec else { return };
    if let Ok(Some(addr)) = next_hop(s, &spec) {
        if let Err(e) = control::request(addr, Some(&s.secret.credential(AuthRole::Switch)), &json!({"op": "release", "job": job}), CONTROL_TIMEOUT) {
            eprintln!("inalab switch: releasing job {job} at {addr}: {e}");
        }
    }
}

/// Removes a job's state from this switch's data plane: its programs' aggregators (a program's
/// panic here is caught: the job is gone either way), key, paths, trees, and, with its spec,
/// its workers' ports and routes. Returns the aggregators the job still held.
pub(super) fn release_here(s: &Shared, job: u32, spec: Option<&JobSpec>) -> u32 {
    let holding: Vec<usize> = (0..s.shards.len()).filter(|&k| crate::lock(&s.shards[k]).guard.keys.contains_key(&job)).collect();
    // (Held nowhere: shard 0, where a job's ports were before it had a key.)
    let holding = if holding.is_empty() { vec![0] } else { holding };
    holding.into_iter().map(|k| release_on(s, k, job, spec)).sum()
}

/// [`release_here`] on one shard.
fn release_on(s: &Shared, shard: usize, job: u32, spec: Option<&JobSpec>) -> u32 {
    let mut dp = crate::lock(&s.shards[shard]);
    let held = match crate::guarded(|| dp.program.release(job)) {
        Ok(n) => n,
        Err(p) => {
            eprintln!("inalab switch: releasing job {job}: a program panicked ({p})");
            0
        }
    };
    dp.guard.keys.remove(&job);
    dp.guard.windows.retain(|(j, _), _| *j != job);
    dp.fwd.paths.retain(|_, (j, _)| *j != job);
    dp.fwd.trees.retain(|(j, _), _| *j != job);
    dp.ports.iter_mut().for_each(|p| p.jobs.retain(|&j| j != job));
    let Some(spec) = spec else { return held };
    for w in &spec.workers {
        if w.rack == s.opts.node {
            dp.remove_port(w.node);
        } else {
            dp.fwd.routes.remove(&w.node);
        }
    }
    held
}

/// A worker is done. When every worker of the job left (or is gone), each one that left is
/// told (`{"event": "all_left"}`): a worker keeps serving its peers until then, so that a
/// fast worker's close does not strand a slower peer's last allreduce (Canary's leaders
/// answer their blocks' stragglers), and the job is released.
fn leave(s: &Shared, job: u32, rank: usize) {
    let lines = {
        let mut cp = crate::lock(&s.cp);
        let Some(st) = cp.jobs.get_mut(&job) else { return };
        if let Some(m) = st.members.get_mut(&rank) {
            m.left = true;
        }
        if !(st.spec.is_some() && st.members.values().all(|m| m.left || m.gone)) {
            return;
        }
        let event = json!({"event": "all_left", "job": job});
        st.members.values().filter(|m| m.left).filter_map(|m| m.conn.try_clone().ok().map(|c| (c, event.clone()))).collect::<Vec<_>>()
    };
    release(s, job, None);
    send_all(lines);
}

fn disconnected(s: &Shared, job: u32, rank: usize) {
    let (reason, lines, all_gone, here_only) = {
        let mut cp = crate::lock(&s.cp);
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
