//! The control plane: a job description every party derives its set-up from, and the
//! JSON-lines-over-TCP protocol that carries it.
//!
//! # Protocol
//! One JSON object per line, each request answered by one line `{"ok": true, ...}` or
//! `{"ok": false, "error": "..."}`. Switches and the PS listen on their control address.
//!
//! | request | who sends it | effect |
//! |---|---|---|
//! | `{"op":"join","job":J,"rank":r,"world":n,"config":{"scheme":NAME,...},"udp":"ip:port"}` | a worker, to its switch | rendezvous: answered when all `n` ranks joined (with the same configuration), with `{"ok":true,"node":id,"spec":{JobSpec}}`; the connection then stays open |
//! | `{"op":"leave"}` | a worker, on the join connection | the worker is done; when every rank left, the job is released |
//! | `{"op":"attach","role":"ps"\|"switch","node":id,"udp":"ip:port","control":"ip:port"}` | the PS, or a downstream switch, to its switch | registers a neighbour |
//! | `{"op":"ps_info"}` | a downstream switch | `{"ok":true,"ps":id,"rack":id,"switches":[{"node":id,"memory_bytes":m},...]}` (the switches from here to the PS) |
//! | `{"op":"admit","spec":{JobSpec}}` | a switch, to the next switch and the PS | installs the job's part there |
//! | `{"op":"release","job":J}` | a switch, to the next switch and the PS | removes the job, frees its aggregators |
//! | `{"op":"stats"}` | anyone | counters as JSON |
//! | `{"op":"ping"}` | anyone (the PS, every second) | `{"ok":true}` |
//! | `{"op":"hello"}`, then `{"op":"auth","role":R,"nonce":N,"proof":P}` | every authenticated party, first | proves role `R`'s key ([`authenticate`], [`ServerAuth`]); `join`/`leave` need `worker`, `attach` as PS `ps`, the rest but `stats`/`ping` `switch` |
//!
//! Events the switch pushes on a join connection: `{"event":"peer_failed","job":J,"rank":R,
//! "reason":"..."}` when another worker of the job disconnected without `leave` (a worker
//! whose protocol cannot go on answers `{"op":"abort","job":J,"reason":"..."}`), and
//! `{"event":"failed","job":J,"reason":"..."}` when the job failed (its aggregators are freed
//! at once).
//!
//! A worker or switch that drops its connection is treated as gone: a worker that never said
//! `leave` fails its job.

pub use crate::auth::{Credential, Role as AuthRole, Secret};
use crate::NetError;
use inalab_core::{HostProtocol, NodeId, PortId};
use inalab_scheme::{scheme_of, JobSpec as SchemeJob, NetView, Plan, PlanError, Role, Scheme};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How long a switch or PS waits on another's control plane (connect and reply).
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// UDP-level "port" of every inalab protocol endpoint (the node id tells processes apart).
pub const PROTOCOL_PORT: u16 = 1;

/// The servers' endpoint port in a job whose server shares a host with one of its workers (a
/// co-located PS): the node id no longer tells the two processes apart, and a switch port
/// with a PS address beside its worker's sends the packets to this port there.
pub const COLOCATED_SERVER_PORT: u16 = 2;

/// Node ids of switches and PS are 1..=65535: workers get `switch node << 16 | n`, which then
/// never collides with them.
pub fn check_node(node: NodeId) -> Result<(), NetError> {
    if node == 0 || node > 0xFFFF {
        return Err(NetError::Config(format!("node must be in 1..=65535 (worker ids are switch node << 16 | n), got {node}")));
    }
    Ok(())
}

/// One worker of a job as the control plane knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerSpec {
    /// Node id the worker's switch assigned.
    pub node: NodeId,
    pub udp: SocketAddr,
    /// Node id of the switch the worker is attached to.
    pub rack: NodeId,
}

/// A server host of a job (the PS), and the switch it is attached to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerSpec {
    pub node: NodeId,
    pub rack: NodeId,
}

/// A switch on the job's path and its aggregator memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchSpec {
    pub node: NodeId,
    pub memory_bytes: u64,
}

/// Everything about a job that switches, PS and workers need. Each derives its own part by
/// asking the scheme registry for the job's plan with a [`RuntimeView`] of this spec, so all
/// of them (and the simulator) set the job up with the same code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    pub job: u32,
    /// The scheme's configuration, `{"scheme": NAME, ...}`, every default filled in.
    pub config: Value,
    /// By rank.
    pub workers: Vec<WorkerSpec>,
    pub servers: Vec<ServerSpec>,
    /// The programmable switches the job may aggregate at.
    pub switches: Vec<SwitchSpec>,
    /// The job's frame key, hex ([`crate::auth`]): every datagram of the job carries a tag made
    /// with it, which every receiver checks.
    pub key: String,
    /// The deployment's network where the deployer knows it (a static fabric: `inalab
    /// emulate`): node names and links, which a scheme's set-up may read (a routing policy that
    /// names nodes, a multicast tree over the links). Default none: names and links unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkSpec>,
    /// The threads of a sharded switch that run the job, each packet sent to the one its
    /// scheme's steering key picks ([`Scheme::steering`]): packets of different keys may
    /// overtake each other, which a protocol that infers loss from order must know
    /// ([`inalab_scheme::NetView::lanes`]). Default 1.
    #[serde(default = "one_lane", skip_serializing_if = "is_one_lane")]
    pub lanes: u32,
}

fn one_lane() -> u32 {
    1
}

fn is_one_lane(n: &u32) -> bool {
    *n == 1
}

/// A deployment's nodes by name and its links, as a job's spec carries them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    /// Node ids by name (hosts and switches).
    pub names: BTreeMap<String, NodeId>,
    /// Links between two nodes, each once.
    pub links: Vec<[NodeId; 2]>,
}

impl JobSpec {
    /// The authenticator of the job's frames.
    pub fn frame_mac(&self) -> Result<crate::auth::FrameMac, NetError> {
        let key = crate::auth::key_from_hex(&self.key).map_err(|e| NetError::Protocol(format!("job {}: field `key`: {e}", self.job)))?;
        Ok(crate::auth::FrameMac::new(&key))
    }

    pub fn scheme(&self) -> Result<&'static dyn Scheme, NetError> {
        scheme_of(&self.config).map_err(plan_err)
    }

    /// The job's frames to and from `addrs`, the threads of a sharded switch that run it, each
    /// packet steered by the scheme's key ([`Scheme::steering`]).
    pub fn gateways(&self, addrs: Vec<SocketAddr>) -> Result<crate::host::Gateways, NetError> {
        Ok(crate::host::Gateways { addrs, steer: self.scheme()?.steering() })
    }

    /// The job as the registry takes it.
    pub fn scheme_job(&self) -> SchemeJob {
        SchemeJob {
            id: self.job,
            workers: self.workers.iter().map(|w| w.node).collect(),
            servers: self.servers.iter().map(|s| s.node).collect(),
            config: self.config.clone(),
            worker_port: PROTOCOL_PORT,
            server_port: if self.colocated() { COLOCATED_SERVER_PORT } else { PROTOCOL_PORT },
        }
    }

    /// Whether a server of the job runs on one of its workers' hosts.
    pub fn colocated(&self) -> bool {
        self.servers.iter().any(|s| self.workers.iter().any(|w| w.node == s.node))
    }

    /// The job's plan as seen from `switch` (`None`: from a host), whose ports toward
    /// attached hosts are `ports`.
    pub fn plan(&self, switch: Option<NodeId>, ports: &dyn Fn(NodeId) -> Option<PortId>) -> Result<Plan, NetError> {
        let view = RuntimeView::new(self, switch, ports);
        self.scheme()?.plan(&self.scheme_job(), &view).map_err(plan_err)
    }

    /// The host endpoint `host` runs in the job, in `role`.
    pub fn endpoint(&self, host: NodeId, role: Role) -> Result<Box<dyn HostProtocol>, NetError> {
        let plan = self.plan(None, &|_| None)?;
        plan.endpoints
            .into_iter()
            .find(|e| e.host == host && e.role == role)
            .map(|e| e.proto)
            .ok_or_else(|| NetError::Config(format!("job {}: the plan has no {role:?} on node {host}", self.job)))
    }
}

/// A scheme's error as a runtime configuration error.
pub fn plan_err(e: PlanError) -> NetError {
    NetError::Config(if e.field.is_empty() { e.message } else { format!("field `{}`: {}", e.field, e.message) })
}

/// The network as a job's spec describes it: every switch in it is programmable, hosts are
/// known by their rack, and ports only at the switch that asks; node names and links where the
/// spec carries its network ([`NetworkSpec`]).
pub struct RuntimeView<'a> {
    spec: &'a JobSpec,
    me: Option<NodeId>,
    ports: &'a dyn Fn(NodeId) -> Option<PortId>,
}

impl<'a> RuntimeView<'a> {
    pub fn new(spec: &'a JobSpec, me: Option<NodeId>, ports: &'a dyn Fn(NodeId) -> Option<PortId>) -> Self {
        RuntimeView { spec, me, ports }
    }
}

impl NetView for RuntimeView<'_> {
    fn tor(&self, host: NodeId) -> NodeId {
        let w = self.spec.workers.iter().find(|w| w.node == host).map(|w| w.rack);
        w.or_else(|| self.spec.servers.iter().find(|s| s.node == host).map(|s| s.rack)).unwrap_or(host)
    }
    fn port_toward(&self, switch: NodeId, host: NodeId) -> Option<PortId> {
        (self.me == Some(switch)).then(|| (self.ports)(host)).flatten()
    }
    fn programmable(&self, switch: NodeId) -> bool {
        self.spec.switches.iter().any(|s| s.node == switch)
    }
    fn memory_bytes(&self, switch: NodeId) -> u64 {
        self.spec.switches.iter().find(|s| s.node == switch).map_or(0, |s| s.memory_bytes)
    }
    fn name(&self, node: NodeId) -> String {
        let named = self.spec.network.as_ref().and_then(|n| n.names.iter().find(|(_, &id)| id == node));
        named.map_or_else(|| format!("node {node}"), |(name, _)| name.clone())
    }
    fn node_named(&self, name: &str) -> Option<NodeId> {
        self.spec.network.as_ref()?.names.get(name).copied()
    }
    /// The spec's links of `switch`: at the switch that asks, with its ports toward its
    /// neighbours; elsewhere the port is the link's place among the switch's links.
    fn links(&self, switch: NodeId) -> Vec<(PortId, NodeId)> {
        let Some(net) = &self.spec.network else { return vec![] };
        let peers = net.links.iter().filter_map(|&[a, b]| if a == switch { Some(b) } else if b == switch { Some(a) } else { None });
        peers.enumerate().map(|(k, peer)| (self.port_toward(switch, peer).unwrap_or(k as PortId), peer)).collect()
    }
    fn lanes(&self) -> u32 {
        self.spec.lanes
    }
    /// A runtime switch admits jobs one at a time, so nothing is split among future jobs.
    fn share(&self, _job: u32, _key: &str) -> (u32, u32) {
        (0, 1)
    }
    fn switches(&self) -> Vec<NodeId> {
        self.spec.switches.iter().map(|s| s.node).collect()
    }
}

/// The address to announce for a socket bound to `bound` to a peer at `peer`: a wildcard
/// bind (0.0.0.0) is replaced by the local address the kernel routes toward the peer (found by
/// connecting a throwaway UDP socket, which sends nothing).
pub fn announce(bound: SocketAddr, peer: SocketAddr) -> SocketAddr {
    if !bound.ip().is_unspecified() {
        return bound;
    }
    let local = std::net::UdpSocket::bind(SocketAddr::new(bound.ip(), 0))
        .and_then(|s| s.connect(peer).and_then(|_| s.local_addr()));
    local.map_or(bound, |l| SocketAddr::new(l.ip(), bound.port()))
}

/// Writes one JSON line. A socket with a write timeout gets the whole line written within it,
/// not each `send` call: a peer that reads nothing but lets the kernel take a few bytes now
/// and then (its receive queue collapsed under memory pressure) would otherwise hold a writer
/// for ever, one partial write at a time (issue #36: connections that never read held a PS).
pub fn send_line(stream: &mut TcpStream, v: &Value) -> std::io::Result<()> {
    let mut s = serde_json::to_string(v).expect("JSON values serialize");
    s.push('\n');
    let Some(limit) = stream.write_timeout()? else { return stream.write_all(s.as_bytes()) };
    let deadline = std::time::Instant::now() + limit;
    let mut rest = s.as_bytes();
    let result = loop {
        if rest.is_empty() {
            break Ok(());
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break Err(std::io::ErrorKind::TimedOut.into());
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(rest) {
            Ok(0) => break Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    let _ = stream.set_write_timeout(Some(limit));
    result
}

/// Longest control line read, bytes (newline included): 256 KiB. The longest legitimate line,
/// an `admit` (or join reply) of a 1,024-worker job, is about 63 KiB; the 64 KiB would
/// leave it no headroom. A switch reading lines holds at most this per connection.
pub const MAX_LINE_BYTES: u64 = 256 << 10;

/// Characters of a bad line quoted back in an error.
const QUOTE_CHARS: usize = 64;

/// Reads one JSON line of at most [`MAX_LINE_BYTES`]; `Ok(None)` at end of stream. A longer
/// line is an error ([`NetError::TooLong`]) after which the stream cannot be resynchronised.
pub fn read_line<R: BufRead>(reader: &mut R) -> Result<Option<Value>, NetError> {
    let mut line = Vec::new();
    let n = (&mut *reader).take(MAX_LINE_BYTES).read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') && n as u64 == MAX_LINE_BYTES {
        return Err(NetError::TooLong(format!("a control line is at most {MAX_LINE_BYTES} bytes")));
    }
    serde_json::from_slice(&line).map(Some).map_err(|e| {
        let text = String::from_utf8_lossy(&line);
        let quoted: String = text.chars().take(QUOTE_CHARS).collect();
        let more = if text.chars().count() > QUOTE_CHARS { "..." } else { "" };
        NetError::Protocol(format!("bad control line ({} bytes) {quoted:?}{more}: {e}", line.len()))
    })
}

/// One request/response exchange on a fresh connection (switch to switch, switch to PS),
/// authenticated as `role` first if given.
pub fn request(addr: SocketAddr, auth: Option<&Credential>, v: &Value, timeout: Duration) -> Result<Value, NetError> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut r = BufReader::new(s.try_clone()?);
    if let Some(c) = auth {
        authenticate(&mut s, &mut r, c)?;
    }
    send_line(&mut s, v)?;
    exchange_reply(&mut r, addr)
}

fn exchange_reply<R: BufRead>(r: &mut R, addr: SocketAddr) -> Result<Value, NetError> {
    let reply = read_line(r)?.ok_or_else(|| NetError::Protocol(format!("{addr} closed the control connection")))?;
    check_ok(reply)
}

/// Proves `role`'s key to the server on `conn` and checks the server's proof of the same
/// secret (mutual: a worker then trusts the job key the switch hands it).
pub fn authenticate<R: BufRead>(conn: &mut TcpStream, r: &mut R, cred: &Credential) -> Result<(), NetError> {
    let (role, key) = (cred.role, cred.key);
    let peer = conn.peer_addr()?;
    send_line(conn, &serde_json::json!({"op": "hello"}))?;
    let hello = exchange_reply(r, peer)?;
    let server_nonce: String = field(&hello, "nonce")?;
    let mine = crate::auth::nonce();
    let p = crate::auth::proof(&key, "client", &server_nonce, &mine, role);
    send_line(conn, &serde_json::json!({"op": "auth", "role": role.name(), "nonce": mine, "proof": p}))?;
    let reply = exchange_reply(r, peer).map_err(|e| NetError::Auth(format!("{peer} refused our credentials as {}: {e}", role.name())))?;
    let theirs: String = field(&reply, "proof")?;
    if !crate::auth::proofs_match(&theirs, &crate::auth::proof(&key, "server", &server_nonce, &mine, role)) {
        return Err(NetError::Auth(format!("{peer} could not prove the deployment secret: another deployment, or not an inalab switch/PS")));
    }
    Ok(())
}

/// A control connection's authentication, server side: `hello` gives a nonce, `auth` checks
/// the client's proof for its role and answers with the server's.
pub struct ServerAuth {
    secret: Secret,
    nonce: Option<String>,
    role: Option<AuthRole>,
}

impl ServerAuth {
    pub fn new(secret: Secret) -> Self {
        ServerAuth { secret, nonce: None, role: None }
    }

    /// The role this connection proved, if any.
    pub fn role(&self) -> Option<AuthRole> {
        self.role
    }

    /// Answers `hello` and `auth`; `None` for any other request.
    pub fn handle(&mut self, op: &str, msg: &Value) -> Option<Result<Value, NetError>> {
        match op {
            "hello" => {
                let n = crate::auth::nonce();
                self.nonce = Some(n.clone());
                Some(Ok(ok(serde_json::json!({"nonce": n}))))
            }
            "auth" => Some(self.auth(msg)),
            _ => None,
        }
    }

    fn auth(&mut self, msg: &Value) -> Result<Value, NetError> {
        let server_nonce = self.nonce.take().ok_or_else(|| NetError::Auth("`auth` needs a `hello` first on this connection".into()))?;
        let name: String = field(msg, "role")?;
        let role = AuthRole::from_name(&name).ok_or_else(|| NetError::Protocol(format!("field `role`: {name:?} is not one of \"worker\", \"ps\", \"switch\"")))?;
        let theirs: String = field(msg, "nonce")?;
        let p: String = field(msg, "proof")?;
        let key = self.secret.role_key(role);
        if theirs.len() > 64 || !crate::auth::proofs_match(&p, &crate::auth::proof(&key, "client", &server_nonce, &theirs, role)) {
            return Err(NetError::Auth(format!("authentication as {name} failed: not this deployment's secret")));
        }
        self.role = Some(role);
        Ok(ok(serde_json::json!({"proof": crate::auth::proof(&key, "server", &server_nonce, &theirs, role)})))
    }

    /// `Ok` if the connection proved one of `roles`, else an error naming what `op` needs.
    pub fn require(&self, op: &str, roles: &[AuthRole]) -> Result<(), NetError> {
        match self.role {
            Some(r) if roles.contains(&r) => Ok(()),
            _ => {
                let names: Vec<&str> = roles.iter().map(|r| r.name()).collect();
                Err(NetError::Auth(format!("`{op}` needs a connection authenticated as {} (send `hello`, then `auth`)", names.join(" or "))))
            }
        }
    }
}

/// `Ok(reply)` if it says `"ok": true`, else its error.
pub fn check_ok(reply: Value) -> Result<Value, NetError> {
    if reply["ok"] == Value::Bool(true) {
        Ok(reply)
    } else {
        Err(NetError::Remote(reply["error"].as_str().unwrap_or("request refused").to_string()))
    }
}

pub fn ok(mut extra: Value) -> Value {
    if !extra.is_object() {
        extra = serde_json::json!({});
    }
    extra["ok"] = Value::Bool(true);
    extra
}

pub fn err(msg: impl std::fmt::Display) -> Value {
    serde_json::json!({"ok": false, "error": msg.to_string()})
}

/// Field `key` of a request as `T`, or an error naming the field.
pub fn field<T: serde::de::DeserializeOwned>(v: &Value, key: &str) -> Result<T, NetError> {
    serde_json::from_value(v.get(key).cloned().unwrap_or(Value::Null))
        .map_err(|e| NetError::Protocol(format!("field `{key}`: {e}")))
}
