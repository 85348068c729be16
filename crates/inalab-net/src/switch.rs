//! The software switch: one UDP socket, a switch program, a port per neighbour, and the
//! control plane (see [`crate::control`]).
//!
//! # Data plane
//! A port is a neighbour's UDP address (a worker, the PS, another switch). A datagram from
//! an address that is not a port is counted (`unknown_source`) and dropped; so is a frame
//! that does not decode (`malformed`), one whose source node is not the host on that port
//! (`spoofed`), and an ATP or SwitchML packet from a worker port for a job that worker is not
//! admitted to (`unadmitted`). What passes goes to the program, whose actions the driver
//! carries out: `Forward`/`Multicast` on ports, `Route` by the node table (installed by the
//! control plane; packets for unknown nodes or for the switch itself are `no_route` /
//! `unadmitted` drops), `Drop` counted by reason, timers on a heap against the wall clock.
//! `drop_probability` drops that share of incoming packets at random (seeded), to test loss
//! recovery on a real network.
//!
//! # Control plane
//! Workers `join` with their job, rank and world size; when all ranks are in, the switch
//! assigns node ids, builds the [`JobSpec`] and admits it (here, at the next switch and at
//! the PS as needed), then answers every worker. A worker connection that closes before
//! `leave` fails the job: the other workers get a `failed` event and the job's aggregators
//! are freed at every switch and the PS.

use crate::clock::Clock;
use crate::control::{self, err, field, ok, plan_err, JobSpec, ServerSpec, SwitchSpec, WorkerSpec, CONTROL_TIMEOUT};
use crate::service::{accept_loop, shut_down};
use crate::udp::{wait, TxBatch, Udp};
use crate::NetError;
use inalab_core::{frame, NodeId, Packet, PortId, Programs, SwitchAction, SwitchCtx, SwitchProgram, Time, TimerToken};
use inalab_scheme::{Overrides, Servers};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use serde_json::{json, Value};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::io::BufReader;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Switch settings. Defaults in [`SwitchOptions::new`].
#[derive(Debug, Clone)]
pub struct SwitchOptions {
    /// Node id, unique among the switches and PS of a deployment. Default 1.
    pub node: NodeId,
    /// Data-plane UDP address. Default 127.0.0.1:9000.
    pub udp: SocketAddr,
    /// Control-plane TCP address. Default 127.0.0.1:9100.
    pub control: SocketAddr,
    /// The schemes whose switch programs run here (one program each, sharing the switch;
    /// a packet of another scheme is routed like any packet).
    pub programs: Vec<String>,
    /// Aggregator memory of each program, bytes (ATP: 272 B per aggregator; SwitchML: 280 B
    /// per slot). Default 5 MB, as in the simulator.
    pub memory_bytes: u64,
    /// Switch pool slots of a job that does not set its own (schemes with static per-job
    /// pools: SwitchML). Default 128: a pool of a few hundred packets in flight is what a
    /// software switch's socket buffers carry without loss.
    pub pool_slots: u32,
    /// Share of incoming packets dropped at random (0 to 1). Default 0.
    pub drop_probability: f64,
    /// Seed of the drop decisions. Default 1.
    pub seed: u64,
    /// Control address of the next switch toward the PS (ATP chains). Default none.
    pub upstream: Option<SocketAddr>,
    /// Loss-recovery timeout of a job that does not set its own, microseconds. Default
    /// 20 000 (OS scheduling on shared cores delays packets by milliseconds).
    pub timeout_us: u64,
}

impl SwitchOptions {
    pub fn new(programs: &[&str]) -> Self {
        SwitchOptions {
            node: 1,
            udp: "127.0.0.1:9000".parse().expect("valid"),
            control: "127.0.0.1:9100".parse().expect("valid"),
            programs: programs.iter().map(|p| p.to_string()).collect(),
            memory_bytes: 5_000_000,
            pool_slots: 128,
            drop_probability: 0.0,
            seed: 1,
            upstream: None,
            timeout_us: 20_000,
        }
    }

    fn overrides(&self) -> Overrides {
        Overrides { timeout_ps: Some(self.timeout_us * inalab_core::time::US), pool_slots: Some(self.pool_slots) }
    }

    /// This switch as a job's spec lists it.
    fn switch_spec(&self) -> SwitchSpec {
        SwitchSpec { node: self.node, memory_bytes: self.memory_bytes }
    }

    /// The programs named in `programs`, each sized for this switch.
    fn build_programs(&self) -> Result<Programs, NetError> {
        let me = JobSpec { job: 0, config: Value::Null, workers: vec![], servers: vec![], switches: vec![self.switch_spec()] };
        let view = control::RuntimeView::new(&me, Some(self.node), &|_| None);
        let mut programs = Programs::new();
        for name in &self.programs {
            let scheme = inalab_scheme::by_name(name).map_err(|e| NetError::Config(format!("program: {}", e.message)))?;
            let prog = scheme.program(self.node, &view).ok_or_else(|| {
                NetError::Config(format!("program: scheme {name:?} runs on hosts only and has no switch program; {}", with_programs()))
            })?;
            programs.install(scheme.name(), prog).map_err(|e| NetError::Config(format!("program: {e}")))?;
        }
        if programs.is_empty() {
            return Err(NetError::Config(format!("program: name at least one; {}", with_programs())));
        }
        Ok(programs)
    }

    fn check(&self) -> Result<(), NetError> {
        if !(0.0..=1.0).contains(&self.drop_probability) {
            return Err(NetError::Config(format!("drop_probability must be in [0, 1], got {}", self.drop_probability)));
        }
        control::check_node(self.node)?;
        if self.timeout_us == 0 {
            return Err(NetError::Config("timeout_us must be positive".into()));
        }
        Ok(())
    }
}

/// "the schemes with a switch program are ..." (from the registry).
fn with_programs() -> String {
    let names: Vec<String> = inalab_scheme::schemes().iter().filter(|s| s.has_program()).map(|s| format!("{:?}", s.name())).collect();
    format!("the schemes with a switch program are {}", names.join(", "))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortKind {
    Worker,
    Ps,
    Switch,
}

#[derive(Debug, Clone)]
struct Port {
    addr: SocketAddr,
    node: NodeId,
    kind: PortKind,
    live: bool,
    /// Jobs a worker port is admitted to.
    jobs: Vec<u32>,
}

/// Driver counters (the program keeps its own).
#[derive(Debug, Default, Clone)]
struct Counters {
    received: u64,
    forwarded: u64,
    malformed: u64,
    unknown_source: u64,
    spoofed: u64,
    unadmitted: u64,
    no_route: u64,
    dead_port: u64,
    injected_drops: u64,
    ecn_marked: u64,
    program_drops: BTreeMap<&'static str, u64>,
    /// The last decode error, for the operator.
    last_malformed: Option<String>,
}

struct Ctx<'a> {
    node: NodeId,
    ports: &'a [Port],
    routes: &'a HashMap<NodeId, PortId>,
    /// The port toward the upstream switch: the only one that leads up.
    up: Option<PortId>,
}

impl SwitchCtx for Ctx<'_> {
    fn node(&self) -> NodeId {
        self.node
    }
    fn num_ports(&self) -> usize {
        self.ports.len()
    }
    fn queue_bytes(&self, _port: PortId) -> u64 {
        0
    }
    fn peer(&self, port: PortId) -> NodeId {
        self.ports.get(port as usize).map_or(NodeId::MAX, |p| p.node)
    }
    fn next_hops(&self, dst: NodeId) -> &[PortId] {
        match self.routes.get(&dst) {
            Some(p) => std::slice::from_ref(p),
            None if dst != self.node => self.up.as_slice(),
            None => &[],
        }
    }
    fn faces_up(&self, port: PortId) -> bool {
        self.up == Some(port)
    }
}

/// The data plane: everything the packet loop touches.
struct DataPlane {
    node: NodeId,
    program: Programs,
    /// Taken out while `poll` receives (so ingress can borrow the rest); always present
    /// between polls.
    udp: Option<Udp>,
    ports: Vec<Port>,
    by_addr: HashMap<SocketAddr, PortId>,
    routes: HashMap<NodeId, PortId>,
    /// Port toward the next switch (ATP chains): where unknown destinations go.
    default_route: Option<PortId>,
    drop_probability: f64,
    rng: Xoshiro256PlusPlus,
    timers: BinaryHeap<Reverse<(Time, u64, TimerToken)>>,
    timer_seq: u64,
    actions: Vec<SwitchAction>,
    tx: TxBatch,
    c: Counters,
}

/// Datagrams handled per lock hold before timers and sends run.
const RECV_BUDGET: usize = 1024;
/// ECN: a software switch's queue is its socket's receive backlog. When more than this many
/// datagrams were waiting in one poll (about 75 kB of 300 B packets, a few windows), the rest of
/// that backlog is marked Congestion Experienced, as a Tofino marks above its queue threshold;
/// ATP's workers halve their windows on it.
const ECN_BACKLOG_DATAGRAMS: usize = 256;

impl DataPlane {
    fn add_port(&mut self, addr: SocketAddr, node: NodeId, kind: PortKind) -> PortId {
        if let Some(&p) = self.by_addr.get(&addr) {
            let port = &mut self.ports[p as usize];
            *port = Port { addr, node, kind, live: true, jobs: std::mem::take(&mut port.jobs) };
            self.routes.insert(node, p);
            return p;
        }
        let p = self.ports.len() as PortId;
        self.ports.push(Port { addr, node, kind, live: true, jobs: vec![] });
        self.by_addr.insert(addr, p);
        self.routes.insert(node, p);
        p
    }

    /// Removes a worker's port so its packets are dropped from now on.
    fn remove_worker(&mut self, node: NodeId) {
        if let Some(p) = self.routes.remove(&node) {
            let port = &mut self.ports[p as usize];
            port.live = false;
            self.by_addr.remove(&port.addr);
        }
    }

    fn poll(&mut self, clock: &Clock) -> std::io::Result<()> {
        let mut udp = self.udp.take().expect("socket present between polls");
        let result = self.poll_with(&mut udp, clock);
        self.udp = Some(udp);
        result
    }

    fn poll_with(&mut self, udp: &mut Udp, clock: &Clock) -> std::io::Result<()> {
        let mut handled = 0;
        while handled < RECV_BUDGET {
            let now = clock.now();
            let congested = handled >= ECN_BACKLOG_DATAGRAMS;
            let n = udp.recv_batch(|addr, d| self.ingress(now, addr, d, congested))?;
            if n == 0 {
                break;
            }
            handled += n;
            if self.tx.len() >= 256 {
                udp.send_batch(&mut self.tx);
            }
        }
        let now = clock.now();
        while let Some(&Reverse((at, _, token))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            let ctx = Ctx { node: self.node, ports: &self.ports, routes: &self.routes, up: self.default_route };
            self.program.on_timer(now, &ctx, token, &mut self.actions);
            self.apply();
        }
        udp.send_batch(&mut self.tx);
        Ok(())
    }

    fn udp(&self) -> &Udp {
        self.udp.as_ref().expect("socket present between polls")
    }

    fn ingress(&mut self, now: Time, addr: SocketAddr, bytes: &[u8], congested: bool) {
        self.c.received += 1;
        let Some(&port) = self.by_addr.get(&addr) else {
            self.c.unknown_source += 1;
            return;
        };
        let view = match frame::Frame::new_checked(bytes) {
            Ok(f) => f,
            Err(e) => {
                self.c.malformed += 1;
                self.c.last_malformed = Some(format!("from {addr}: {e}"));
                return;
            }
        };
        let p = &self.ports[port as usize];
        // Checked on the view so a spoofed datagram's payload is never copied.
        if p.kind != PortKind::Switch && view.src() != p.node {
            self.c.spoofed += 1;
            return;
        }
        let mut pkt = frame::to_packet(&view);
        let job = self.program.job_of(&pkt);
        if p.kind == PortKind::Worker && !job.is_some_and(|j| p.jobs.contains(&j)) {
            self.c.unadmitted += 1;
            return;
        }
        if self.drop_probability > 0.0 && self.rng.random::<f64>() < self.drop_probability {
            self.c.injected_drops += 1;
            return;
        }
        if congested {
            self.c.ecn_marked += 1;
            pkt.ecn = true;
        }
        let ctx = Ctx { node: self.node, ports: &self.ports, routes: &self.routes, up: self.default_route };
        self.program.on_packet(now, &ctx, port, pkt, &mut self.actions);
        self.apply();
    }

    fn apply(&mut self) {
        let mut actions = std::mem::take(&mut self.actions);
        for a in actions.drain(..) {
            match a {
                SwitchAction::Forward { port, pkt } => self.egress(port, &pkt),
                SwitchAction::Route { pkt } => {
                    if pkt.dst == self.node {
                        self.c.unadmitted += 1;
                    } else if let Some(port) = self.routes.get(&pkt.dst).copied().or(self.default_route) {
                        self.egress(port, &pkt);
                    } else {
                        self.c.no_route += 1;
                    }
                }
                SwitchAction::Multicast { ports, pkt } => ports.iter().for_each(|&p| self.egress(p, &pkt)),
                SwitchAction::Drop { reason, .. } => *self.c.program_drops.entry(reason).or_default() += 1,
                SwitchAction::SetTimer { at, token } => {
                    self.timer_seq += 1;
                    self.timers.push(Reverse((at, self.timer_seq, token)));
                }
            }
        }
        self.actions = actions;
    }

    fn egress(&mut self, port: PortId, pkt: &Packet) {
        match self.ports.get(port as usize) {
            Some(p) if p.live => {
                self.c.forwarded += 1;
                self.tx.push(p.addr, |b| frame::encode(pkt, b));
            }
            _ => self.c.dead_port += 1,
        }
    }

    fn stats(&self) -> Value {
        let c = &self.c;
        let program: serde_json::Map<String, Value> = self.program.counters().into_iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
        let io = self.udp().stats;
        json!({
            "node": self.node,
            "programs": self.program.names(),
            "aggregators_in_use": self.program.aggregators_in_use(),
            "received": c.received, "forwarded": c.forwarded, "malformed": c.malformed,
            "unknown_source": c.unknown_source, "spoofed": c.spoofed, "unadmitted": c.unadmitted,
            "no_route": c.no_route, "dead_port": c.dead_port, "injected_drops": c.injected_drops, "ecn_marked": c.ecn_marked,
            "program_drops": c.program_drops, "last_malformed": c.last_malformed,
            "program": program,
            "io": {"datagrams_sent": io.datagrams_sent, "datagrams_received": io.datagrams_received,
                   "send_calls": io.send_calls, "recv_calls": io.recv_calls, "send_errors": io.send_errors,
                   "gso_segments": self.udp().max_gso_segments(), "gro_segments": self.udp().gro_segments()},
        })
    }
}

/// A worker waiting in the rendezvous or running in an admitted job.
struct Member {
    rank: usize,
    udp: SocketAddr,
    conn: TcpStream,
    node: NodeId,
    left: bool,
}

struct JobState {
    /// The first joiner's configuration (with the switch's defaults filled in); every other
    /// joiner must send the same.
    config: Value,
    world: usize,
    members: BTreeMap<usize, Member>,
    spec: Option<JobSpec>,
}

struct ControlState {
    jobs: BTreeMap<u32, JobState>,
    /// Attached PS: (node, control address).
    ps: Option<(NodeId, SocketAddr)>,
    next_worker: u32,
}

struct Shared {
    opts: SwitchOptions,
    dp: Mutex<DataPlane>,
    cp: Mutex<ControlState>,
    stop: AtomicBool,
}

/// A running switch: its packet loop and control server threads.
pub struct SwitchHandle {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    pub udp_addr: SocketAddr,
    pub control_addr: SocketAddr,
}


impl SwitchHandle {
    /// Binds the sockets, attaches to the upstream switch if any, and starts serving.
    pub fn start(opts: SwitchOptions) -> Result<SwitchHandle, NetError> {
        opts.check()?;
        let udp = Udp::bind(opts.udp)?;
        let listener = TcpListener::bind(opts.control)?;
        let (udp_addr, control_addr) = (udp.local_addr()?, listener.local_addr()?);
        let program = opts.build_programs()?;
        let mut dp = DataPlane {
            node: opts.node,
            program,
            udp: Some(udp),
            ports: vec![],
            by_addr: HashMap::new(),
            routes: HashMap::new(),
            default_route: None,
            drop_probability: opts.drop_probability,
            rng: Xoshiro256PlusPlus::seed_from_u64(opts.seed),
            timers: BinaryHeap::new(),
            timer_seq: 0,
            actions: vec![],
            tx: TxBatch::default(),
            c: Counters::default(),
        };
        if let Some(up) = opts.upstream {
            let reply = control::request(
                up,
                &json!({"op": "attach", "role": "switch", "node": opts.node,
                        "udp": control::announce(udp_addr, up), "control": control::announce(control_addr, up)}),
                CONTROL_TIMEOUT,
            )?;
            let up_udp: SocketAddr = field(&reply, "udp")?;
            let up_node: NodeId = field(&reply, "node")?;
            let p = dp.add_port(up_udp, up_node, PortKind::Switch);
            dp.default_route = Some(p);
        }
        let shared = Arc::new(Shared {
            opts,
            dp: Mutex::new(dp),
            cp: Mutex::new(ControlState { jobs: BTreeMap::new(), ps: None, next_worker: 0 }),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let data = std::thread::Builder::new().name("inalab-switch-dp".into()).spawn(move || data_loop(&s))?;
        let s = shared.clone();
        let ctl = std::thread::Builder::new().name("inalab-switch-cp".into()).spawn(move || {
            let conn_shared = s.clone();
            accept_loop(&s.stop, listener, "inalab-switch-conn", move |conn| serve(&conn_shared, conn))
        })?;
        Ok(SwitchHandle { shared, threads: vec![data, ctl], udp_addr, control_addr })
    }

    /// Driver and program counters, aggregators in use, I/O batching, admitted jobs.
    pub fn stats(&self) -> Value {
        stats(&self.shared)
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        shut_down(&self.shared.stop, &mut self.threads);
    }
}

impl Drop for SwitchHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn stats(s: &Shared) -> Value {
    let mut v = s.dp.lock().expect("data plane lock").stats();
    v["jobs"] = json!(s.cp.lock().expect("control lock").jobs.keys().collect::<Vec<_>>());
    v
}

fn data_loop(s: &Shared) {
    let clock = Clock::new();
    let fd = s.dp.lock().expect("data plane lock").udp().fd();
    while !s.stop.load(Ordering::Relaxed) {
        let next = s.dp.lock().expect("data plane lock").timers.peek().map(|Reverse((at, _, _))| *at);
        let timeout = next.map_or(Duration::from_millis(10), |at| clock.until(at).min(Duration::from_millis(10)));
        if wait(&[(fd, libc::POLLIN)], Some(timeout)).is_err() {
            continue;
        }
        let mut dp = s.dp.lock().expect("data plane lock");
        if let Err(e) = dp.poll(&clock) {
            eprintln!("inalab switch: receive error: {e}");
        }
    }
}

/// Serves one control connection until it closes.
fn serve(s: &Arc<Shared>, conn: TcpStream) {
    let Ok(mut w) = conn.try_clone() else { return };
    let mut r = BufReader::new(conn);
    // A join turns this connection into a worker's: (job, rank).
    let mut member: Option<(u32, usize)> = None;
    loop {
        let msg = match control::read_line(&mut r) {
            Ok(Some(m)) => m,
            Ok(None) | Err(NetError::Io(_)) => break,
            Err(e) => {
                let _ = control::send_line(&mut w, &err(e));
                continue;
            }
        };
        let op = msg["op"].as_str().unwrap_or("");
        let reply = match op {
            "join" if member.is_none() => match join(s, &msg, &w) {
                Ok(m) => {
                    member = Some(m);
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
            _ => handle(s, op, &msg, &w).unwrap_or_else(err),
        };
        if control::send_line(&mut w, &reply).is_err() {
            break;
        }
    }
    if let Some((job, rank)) = member {
        disconnected(s, job, rank);
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
            let port = s.dp.lock().expect("data plane lock").add_port(udp, node, kind);
            if kind == PortKind::Ps {
                let control: SocketAddr = field(msg, "control")?;
                s.cp.lock().expect("control lock").ps = Some((node, control));
            }
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
            release(s, job, None);
            Ok(ok(json!({})))
        }
        "stats" => Ok(ok(stats(s))),
        "join" => Err(NetError::Protocol("this connection already joined a job".into())),
        other => Err(NetError::Protocol(format!(
            "field `op`: {other:?} is not one of \"join\", \"leave\", \"attach\", \"ps_info\", \"admit\", \"release\", \"stats\""
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
            let mut v = control::request(up, &json!({"op": "ps_info"}), CONTROL_TIMEOUT)?;
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
    let scheme = inalab_scheme::scheme_of(&asked).map_err(|e| NetError::Config(format!("field `config.scheme`: {}", e.message)))?;
    let config = scheme.apply(&asked, &s.opts.overrides()).map_err(|e| plan_err(inalab_scheme::PlanError::new(format!("config.{}", e.field), e.message)))?;
    if !s.dp.lock().expect("data plane lock").program.has(scheme.name()) {
        let runs = s.dp.lock().expect("data plane lock").program.names();
        return Err(NetError::Config(format!("field `config.scheme`: this switch runs {runs}, the worker asked for {}", scheme.name())));
    }
    if world == 0 || rank >= world {
        return Err(NetError::Config(format!("field `rank`: {rank} is not in 0..{world} (world)")));
    }
    let mut guard = s.cp.lock().expect("control lock");
    let cp = &mut *guard;
    let st = cp.jobs.entry(job).or_insert_with(|| JobState { config: config.clone(), world, members: BTreeMap::new(), spec: None });
    if st.spec.is_some() {
        return Err(NetError::Config(format!("job {job} is already running; pick another job id")));
    }
    if st.world != world || st.config != config {
        return Err(NetError::Config(format!("job {job}: world {world} / configuration {config} disagrees with the first joiner's {} / {}", st.world, st.config)));
    }
    if st.members.contains_key(&rank) {
        return Err(NetError::Config(format!("job {job}: rank {rank} already joined")));
    }
    st.members.insert(rank, Member { rank, udp, conn: conn.try_clone()?, node: 0, left: false });
    if st.members.len() < world {
        return Ok((job, rank));
    }
    // Everyone is here: assign node ids and admit.
    let mut workers = vec![];
    for m in st.members.values_mut() {
        cp.next_worker += 1;
        m.node = s.opts.node << 16 | (cp.next_worker & 0xFFFF);
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
    for m in st.members.values_mut() {
        let switch_udp = seen_from(bound, &m.conn);
        let r = reply.clone().unwrap_or_else(|| ok(json!({"node": m.node, "rank": m.rank, "spec": st.spec, "switch_udp": switch_udp})));
        let _ = control::send_line(&mut m.conn, &r);
    }
    if result.is_err() {
        cp.jobs.remove(&job);
    }
    Ok((job, rank))
}

fn build_spec(s: &Shared, job: u32, config: Value, workers: Vec<WorkerSpec>) -> Result<JobSpec, NetError> {
    let mut spec = JobSpec { job, config, workers, servers: vec![], switches: vec![s.opts.switch_spec()] };
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
    let me = s.opts.node;
    let mut dp = s.dp.lock().expect("data plane lock");
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
    let port_of = |node: NodeId| local.iter().find(|(n, _)| *n == node).map(|x| x.1);
    let plan = spec.plan(Some(me), &port_of)?;
    for adm in plan.admissions.into_iter().filter(|a| a.switch == me) {
        dp.program.admit_at(adm.program, spec.job, adm.state).map_err(|e| NetError::Config(format!("field `config.{}`: {e}", adm.field)))?;
    }
    drop(dp);
    if let Some(next) = next_hop(s, spec)? {
        control::request(next, &json!({"op": "admit", "spec": spec}), CONTROL_TIMEOUT)?;
    }
    Ok(())
}

/// Removes a job here and at the switches and PS it was passed to. `reason`: the job failed.
fn release(s: &Shared, job: u32, reason: Option<&str>) {
    let spec = {
        let mut cp = s.cp.lock().expect("control lock");
        let st = cp.jobs.remove(&job);
        if let (Some(st), Some(reason)) = (&st, reason) {
            for m in st.members.values() {
                if let Ok(mut c) = m.conn.try_clone() {
                    let _ = control::send_line(&mut c, &json!({"event": "failed", "job": job, "reason": reason}));
                }
            }
        }
        st.and_then(|st| st.spec)
    };
    let mut dp = s.dp.lock().expect("data plane lock");
    dp.program.release(job);
    let Some(spec) = spec else { return };
    for w in &spec.workers {
        if w.rack == s.opts.node {
            dp.remove_worker(w.node);
        } else {
            dp.routes.remove(&w.node);
        }
    }
    drop(dp);
    if let Ok(Some(addr)) = next_hop(s, &spec) {
        if let Err(e) = control::request(addr, &json!({"op": "release", "job": job}), CONTROL_TIMEOUT) {
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
        st.spec.is_some() && st.members.values().all(|m| m.left)
    };
    if done {
        release(s, job, None);
    }
}

fn disconnected(s: &Shared, job: u32, rank: usize) {
    let reason = {
        let mut cp = s.cp.lock().expect("control lock");
        let Some(st) = cp.jobs.get_mut(&job) else { return };
        match st.members.get(&rank) {
            Some(m) if m.left => return,
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
        }
    };
    eprintln!("inalab switch: job {job} failed: {reason}");
    release(s, job, Some(&reason));
}
