//! The control plane: a job description every party derives its set-up from, and the
//! JSON-lines-over-TCP protocol that carries it.
//!
//! # Protocol
//! One JSON object per line, each request answered by one line `{"ok": true, ...}` or
//! `{"ok": false, "error": "..."}`. Switches and the PS listen on their control address.
//!
//! | request | who sends it | effect |
//! |---|---|---|
//! | `{"op":"join","job":J,"rank":r,"world":n,"scheme":"switchml"\|"atp","udp":"ip:port"}` | a worker, to its switch | rendezvous: answered when all `n` ranks joined, with `{"ok":true,"node":id,"spec":{JobSpec}}`; the connection then stays open |
//! | `{"op":"leave"}` | a worker, on the join connection | the worker is done; when every rank left, the job is released |
//! | `{"op":"attach","role":"ps"\|"switch","node":id,"udp":"ip:port","control":"ip:port"}` | the PS, or a downstream switch, to its switch | registers a neighbour |
//! | `{"op":"ps_info"}` | a downstream switch | `{"ok":true,"ps":id,"rack":id,"aggregators":k}` |
//! | `{"op":"admit","spec":{JobSpec}}` | a switch, to the next switch and the PS | installs the job's part there |
//! | `{"op":"release","job":J}` | a switch, to the next switch and the PS | removes the job, frees its aggregators |
//! | `{"op":"stats"}` | anyone | counters as JSON |
//!
//! Events the switch pushes on a join connection: `{"event":"failed","job":J,"reason":"..."}`
//! when another worker of the job disconnected without `leave` (the job's aggregators are
//! freed at once).
//!
//! A worker or switch that drops its connection is treated as gone: a worker that never said
//! `leave` fails its job.

use crate::NetError;
use inalab_core::time::US;
use inalab_core::{Endpoint, NodeId, Time};
use inalab_host::{atp_layout, AimdConfig, AtpConfig, AtpLayout, AtpServerConfig, Hashing, SwitchMlConfig};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How long a switch or PS waits on another's control plane (connect and reply).
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// UDP-level "port" of every inalab protocol endpoint (the node id tells processes apart).
pub const PROTOCOL_PORT: u16 = 1;

/// Node ids of switches and PS are 1..=65535: workers get `switch node << 16 | n`, which then
/// never collides with them.
pub fn check_node(node: NodeId) -> Result<(), NetError> {
    if node == 0 || node > 0xFFFF {
        return Err(NetError::Config(format!("node must be in 1..=65535 (worker ids are switch node << 16 | n), got {node}")));
    }
    Ok(())
}

/// The in-network aggregation schemes the runtime serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    Switchml,
    Atp,
}

impl std::fmt::Display for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Scheme::Switchml => "switchml",
            Scheme::Atp => "atp",
        })
    }
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

/// Everything about a job that switches, PS and workers need; each derives its own part
/// with the protocol crates' functions (`atp_layout`, `atp_admissions`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    pub job: u32,
    pub scheme: Scheme,
    /// By rank.
    pub workers: Vec<WorkerSpec>,
    /// SwitchML: the job's static pool, slots.
    pub pool_slots: u32,
    /// ATP: the PS node and the node of the switch it is attached to.
    pub ps: Option<NodeId>,
    pub ps_rack: Option<NodeId>,
    /// ATP: aggregators indexes are taken modulo (the smallest pool on the path).
    pub aggregators: u32,
    /// Loss-recovery timeout of workers, microseconds.
    pub timeout_us: u64,
    /// ATP fixed-point scale (values are multiplied by it before aggregation).
    pub atp_scale: f64,
}

impl JobSpec {
    fn timeout_ps(&self) -> Time {
        self.timeout_us * US
    }

    pub fn worker_endpoint(&self, rank: usize) -> Endpoint {
        Endpoint { host: self.workers[rank].node, port: PROTOCOL_PORT }
    }

    pub fn racks(&self) -> Vec<NodeId> {
        self.workers.iter().map(|w| w.rack).collect()
    }

    pub fn ps_endpoint(&self) -> Result<(Endpoint, NodeId), NetError> {
        match (self.ps, self.ps_rack) {
            (Some(ps), Some(rack)) => Ok((Endpoint { host: ps, port: PROTOCOL_PORT }, rack)),
            _ => Err(NetError::Config("an ATP job needs a parameter server; start `inalab ps` attached to a switch".into())),
        }
    }

    /// ATP's layout (every switch of the runtime runs ATP).
    pub fn atp_layout(&self) -> Result<AtpLayout, NetError> {
        let (_, ps_rack) = self.ps_endpoint()?;
        atp_layout(&self.racks(), ps_rack, |_| true).map_err(|e| NetError::Config(e.0))
    }

    pub fn atp_config(&self) -> AtpConfig {
        let d = AtpConfig::default();
        AtpConfig {
            job: self.job,
            hashing: Hashing::Hash,
            aggregators: self.aggregators,
            timeout_ps: self.timeout_ps(),
            aimd: AimdConfig { min_window_bytes: d.packet_bytes as u64, ..d.aimd.clone() },
            ..d
        }
    }

    pub fn atp_server_config(&self) -> Result<AtpServerConfig, NetError> {
        Ok(AtpServerConfig {
            atp: self.atp_config(),
            layout: self.atp_layout()?,
            workers: (0..self.workers.len()).map(|r| self.worker_endpoint(r)).collect(),
            multicast: true,
            resend_holdoff_ps: self.timeout_ps() / 2,
        })
    }

    pub fn switchml_config(&self, rank: usize) -> SwitchMlConfig {
        let switch = Endpoint { host: self.workers[rank].rack, port: PROTOCOL_PORT };
        SwitchMlConfig {
            pool_slots: self.pool_slots,
            timeout_ps: self.timeout_ps(),
            ..SwitchMlConfig::new(self.job, rank as u16, switch)
        }
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

/// Writes one JSON line.
pub fn send_line(stream: &mut TcpStream, v: &Value) -> std::io::Result<()> {
    let mut s = serde_json::to_string(v).expect("JSON values serialize");
    s.push('\n');
    stream.write_all(s.as_bytes())
}

/// Reads one JSON line; `Ok(None)` at end of stream.
pub fn read_line(reader: &mut BufReader<TcpStream>) -> Result<Option<Value>, NetError> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    serde_json::from_str(&line).map(Some).map_err(|e| NetError::Protocol(format!("bad control line {line:?}: {e}")))
}

/// One request/response exchange on a fresh connection (switch to switch, switch to PS).
pub fn request(addr: SocketAddr, v: &Value, timeout: Duration) -> Result<Value, NetError> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    send_line(&mut s, v)?;
    let mut r = BufReader::new(s);
    let reply = read_line(&mut r)?.ok_or_else(|| NetError::Protocol(format!("{addr} closed the control connection")))?;
    check_ok(reply)
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
