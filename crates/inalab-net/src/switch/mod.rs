//! The software switch: one UDP socket, a switch program, a port per neighbour, and the
//! control plane (see [`crate::control`]).
//!
//! # Data plane
//! A port is a neighbour's UDP address (a worker, the PS, another switch). A datagram from
//! an address that is not a port is counted (`unknown_source`) and dropped; so is a frame
//! that does not decode (`malformed`), one without a valid tag of the job its header names
//! (`forged`, by reason: [`crate::auth`]), one whose source node is not the host on that port
//! (`spoofed`), and an INA packet from a worker or PS port for a job not admitted on that
//! port (`unadmitted`). What passes goes to the program, whose actions the driver
//! carries out: `Forward`/`Multicast` on ports, `Route` by the node table (installed by the
//! control plane; packets for unknown nodes or for the switch itself are `no_route` /
//! `unadmitted` drops), `Drop` counted by reason, timers on a heap against the wall clock.
//! `drop_probability` drops that share of incoming packets at random (seeded), to test loss
//! recovery on a real network.
//!
//! # Fixed paths and multicast trees
//! Where a job's spec carries its network (names and links: a static fabric), a scheme's plan
//! may pin an endpoint's packets to a path (`Plan::paths`, GRID's policy) and replicate what an
//! endpoint sends to `inalab_core::GROUP` along a tree (`Plan::trees`, GRID's results). Each
//! switch installs its own part at admission: a path's visits here by (source, destination,
//! ingress port), so a path that passes a switch twice leaves it the right way each time
//! (these routes come before all others); a tree's children here, a copy to a host addressed
//! to it, one to a switch still to `GROUP` (counted in `multicast_copies`). The driver never
//! asks which scheme a path or tree is for.
//!
//! # Links
//! A port's link may be reported down ([`SwitchHandle::set_link`], the `link` control request:
//! what a switch's hardware learns from a lost carrier, or an operator). Routing then skips
//! it, as the simulator's does for a failed switch or link: the static fabric's next hops
//! and a flow pinned to that port fall back to the live next hops, `SwitchCtx::next_hops` lists
//! only live ports, and what a program still sends on it is lost (`link_down`). Programs read
//! each port's egress queue through `SwitchCtx::queue_bytes`: the switch's own shaped queue, or,
//! for a link shaped outside it (`tc`), the backlog of a queue draining at the link's rate
//! (the fabric's `rate_bps`), from what the switch sent on it.
//!
//! # Shards
//! [`SwitchOptions::threads`] data-plane threads, each a [`DataPlane`] of its own (socket,
//! programs, ports, keys, timers) behind its own lock: nothing is shared on the packet path.
//! The control plane places each job: on every shard when its scheme steers packets by a key
//! and only this switch serves it (workers and the PS then send each packet to the shard the
//! key picks), else on one; jobs that span switches on shard 0, whose socket the neighbours
//! know (docs/runtime.md, "Data-plane threads").
//!
//! # Control plane
//! In [`control_plane`]: the rendezvous, admission and release of jobs.

mod control_plane;

use crate::auth::{self, FrameMac};
use crate::capture::WireCapture;
use crate::clock::Clock;
use crate::control::{self, field, JobSpec, SwitchSpec, CONTROL_TIMEOUT};
use control_plane::{admit_here, serve, ControlState};
pub use control_plane::{DEFAULT_JOIN_WAIT, MAX_JOIN_WAIT, MAX_WORLD};
use crate::service::{accept_loop, shut_down};
use crate::fabric::{Processing, SwitchFabric};
use crate::pace::{Pacer, ShapedQueue, WIRE_OVERHEAD_BYTES};
use inalab_topo::DefaultPort;
use crate::udp::{wait, TxBatch, Udp};
use crate::NetError;
use inalab_core::{frame, NodeId, Packet, PortId, Programs, SwitchAction, SwitchCtx, SwitchProgram, Time, TimerToken, GROUP};
use inalab_scheme::Overrides;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use serde_json::{json, Value};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::net::SocketAddr;
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
    /// Aggregator memory of the switch, bytes, split equally among its programs (ATP: 272 B
    /// per aggregator; SwitchML: 280 B per slot). Default 5 MB, as in the simulator.
    pub memory_bytes: u64,
    /// Switch pool slots of a job that does not set its own (schemes with static per-job
    /// pools: SwitchML). Default 128: a pool of a few hundred packets in flight is what a
    /// software switch's socket buffers carry without loss.
    pub pool_slots: u32,
    /// Values per datagram of a job that sets no `ina.packet_bytes`, for the schemes that take
    /// any number (SwitchML, ATP); 0: the scheme's own default (a Tofino's: 32 and 62 values).
    /// Default 2048 (8 KiB of values): a datagram costs the kernel and the switch about the
    /// same whatever its size, so small ones cap a software switch at a tenth of what it moves
    /// with these. Bounded at start by the MTU of the switch's interfaces (the sockets set
    /// don't-fragment): 2048 fit loopback (64 KiB) and jumbo frames (9000 B), a 1500-B network
    /// gets 350.
    pub packet_values: u32,
    /// Share of incoming packets dropped at random (0 to 1). Default 0.
    pub drop_probability: f64,
    /// Seed of the drop decisions. Default 1.
    pub seed: u64,
    /// Control address of the next switch toward the PS (ATP chains). Default none.
    pub upstream: Option<SocketAddr>,
    /// Loss-recovery timeout of a job that does not set its own, microseconds. Default
    /// 20 000 (OS scheduling on shared cores delays packets by milliseconds).
    pub timeout_us: u64,
    /// The deployment secret control connections authenticate with. Default: loaded at start
    /// ([`crate::auth::Secret::load`]: `INALAB_SECRET`, or the secret file, created if absent).
    pub secret: Option<crate::auth::Secret>,
    /// Shape every port's egress in user space to this link (where `tc` cannot: `inalab
    /// emulate` without namespaces). Default none: datagrams leave as fast as the socket takes
    /// them.
    pub shaping: Option<PortShaping>,
    /// A static deployment: neighbours, routes and jobs fixed at start (`inalab emulate`).
    /// Default none: workers join and the PS and other switches attach at run time.
    pub fabric: Option<SwitchFabric>,
    /// Capture every datagram the data plane receives and sends to this pcapng file
    /// ([`crate::capture`]). Default none.
    pub pcap: Option<std::path::PathBuf>,
    /// Data-plane threads (shards), each with its own socket, programs and `memory_bytes` of
    /// aggregator memory; a job runs on one of them (see the module docs, "Shards"). 0, the
    /// default: [`default_threads`] (a quarter of the machine's cores, 1 to 8), and 1 where a
    /// static fabric, a capture or port shaping asks for one ordered stream.
    pub threads: usize,
}

/// Most data-plane threads a switch runs.
pub const MAX_THREADS: usize = 64;

/// Data-plane threads a switch runs by default: a quarter of the machine's cores, from 1 to
/// 8. The switch shares the machine with the workers it serves (on one machine) or with the
/// kernel's network stack, which spends about as much CPU per datagram as the switch; so 1
/// on 2 to 7 cores, 4 on 16.
pub fn default_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 4).clamp(1, 8)
}

/// A link's rate, delay and buffer, applied to a port's egress by [`crate::pace::ShapedQueue`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PortShaping {
    pub rate_bps: u64,
    pub delay_us: f64,
    pub buffer_bytes: u64,
}

impl SwitchOptions {
    pub fn new(programs: &[&str]) -> Self {
        SwitchOptions {
            node: 1,
            udp: "127.0.0.1:9000".parse().expect("valid"),
            control: crate::DEFAULT_CONTROL.parse().expect("valid"),
            programs: programs.iter().map(|p| p.to_string()).collect(),
            memory_bytes: 5_000_000,
            pool_slots: 128,
            packet_values: 2048,
            drop_probability: 0.0,
            seed: 1,
            upstream: None,
            timeout_us: 20_000,
            secret: None,
            shaping: None,
            fabric: None,
            pcap: None,
            threads: 0,
        }
    }

    /// The data-plane threads this switch runs ([`SwitchOptions::threads`]).
    fn shard_count(&self) -> usize {
        match self.threads {
            0 if self.fabric.is_some() || self.pcap.is_some() || self.shaping.is_some() => 1,
            0 => default_threads(),
            n => n,
        }
    }

    fn overrides(&self) -> Overrides {
        Overrides {
            timeout_ps: Some(self.timeout_us * inalab_core::time::US),
            pool_slots: Some(self.pool_slots),
            packet_values: (self.packet_values > 0).then_some(self.packet_values),
        }
    }

    /// This switch as a job's spec lists it, with the memory one of its programs gets. Each
    /// data-plane thread has that much: splitting it would refuse the runtime's default
    /// SwitchML job (128 slots of 2048 values, 2.3 MB) on a 4-thread switch; a Tofino's
    /// budget is one thread's.
    fn switch_spec(&self) -> SwitchSpec {
        SwitchSpec { node: self.node, memory_bytes: self.memory_bytes / self.programs.len().max(1) as u64 }
    }

    /// The programs named in `programs`, each sized for this switch.
    fn build_programs(&self) -> Result<Programs, NetError> {
        let me = JobSpec { job: 0, config: Value::Null, workers: vec![], servers: vec![], switches: vec![self.switch_spec()], key: String::new(), network: None, lanes: 1 };
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
        // They become jobs' values, which every job's configuration is checked against: a
        // switch default outside the schemes' bounds would refuse every job that sets none.
        let max_us = inalab_scheme::MAX_TIME_PS / inalab_core::time::US;
        if !(1..=max_us).contains(&self.timeout_us) {
            return Err(NetError::Config(format!("timeout_us must be in 1..={max_us} (60 s), got {}", self.timeout_us)));
        }
        if !(1..=inalab_scheme::MAX_SLOTS).contains(&(self.pool_slots as u64)) {
            return Err(NetError::Config(format!("pool_slots must be in 1..={}, got {}", inalab_scheme::MAX_SLOTS, self.pool_slots)));
        }
        if self.threads > MAX_THREADS {
            return Err(NetError::Config(format!("threads must be in 0..={MAX_THREADS} (0: the default from the machine's cores), got {}", self.threads)));
        }
        if self.threads > 1 {
            let one_stream = [(self.fabric.is_some(), "a static fabric"), (self.pcap.is_some(), "a capture (--pcap)"), (self.shaping.is_some(), "port shaping")];
            if let Some((_, what)) = one_stream.iter().find(|(on, _)| *on) {
                return Err(NetError::Config(format!("threads must be 0 or 1 with {what}: it needs one ordered stream of datagrams; got {}", self.threads)));
            }
        }
        if let Some(sh) = self.shaping {
            if sh.rate_bps == 0 || !(sh.delay_us >= 0.0 && sh.delay_us.is_finite()) || sh.buffer_bytes == 0 {
                return Err(NetError::Config(format!("shaping: rate_bps and buffer_bytes must be positive and delay_us >= 0, got {sh:?}")));
            }
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

#[derive(Debug)]
struct Port {
    addr: SocketAddr,
    /// A co-located PS's address on this host's link ([`FabricPort::ps_udp`]).
    ps_addr: Option<SocketAddr>,
    node: NodeId,
    kind: PortKind,
    live: bool,
    /// Jobs a worker port is admitted to, or a PS port serves.
    jobs: Vec<u32>,
    /// Datagrams and bytes on the wire (UDP payload + 42) sent on this port.
    sent: u64,
    sent_bytes: u64,
    /// The link's egress queue when the switch shapes its ports itself.
    shaper: Option<ShapedQueue>,
    /// A link shaped outside the switch (`tc`) at a known rate: the queue it would hold.
    queue_model: Option<Pacer>,
    /// The link is up (false: reported down, routing skips the port).
    link_up: bool,
    /// The sequence number of the last datagram sealed for this port ([`auth`]: replays).
    seq: u64,
}

impl Port {
    fn new(addr: SocketAddr, node: NodeId, kind: PortKind, shaper: Option<ShapedQueue>) -> Port {
        Port { addr, ps_addr: None, node, kind, live: true, jobs: vec![], sent: 0, sent_bytes: 0, shaper, queue_model: None, link_up: true, seq: auth::first_seq() }
    }

    /// The host end's identity in a [`auth::Link`]: its node, or its server
    /// ([`auth::SERVER_BIT`]) for a PS port and a co-located PS's address.
    fn host_identity(&self, server: bool) -> u32 {
        if server || self.kind == PortKind::Ps {
            self.node | auth::SERVER_BIT
        } else {
            self.node
        }
    }

    /// The link a datagram from `addr` on this port crossed, to switch `me`.
    fn link_from(&self, addr: SocketAddr, me: NodeId) -> auth::Link {
        match self.kind {
            PortKind::Switch => auth::Link { from: self.node, to: me },
            _ => auth::Link { from: self.host_identity(self.ps_addr == Some(addr)), to: auth::ANY },
        }
    }

    /// The link a datagram for endpoint port `dst_port` of this port's host (see
    /// [`Port::dest`]) crosses from switch `me`, and its sequence number.
    fn link_to(&mut self, dst_port: u16, me: NodeId) -> (auth::Link, u64) {
        let link = match self.kind {
            PortKind::Switch => auth::Link { from: me, to: self.node },
            _ => auth::Link { from: auth::ANY, to: self.host_identity(self.ps_addr.is_some() && dst_port == crate::control::COLOCATED_SERVER_PORT) },
        };
        self.seq += 1;
        (link, self.seq)
    }

    /// Where a datagram for endpoint port `dst_port` of this port's host goes.
    fn dest(&self, dst_port: u16) -> SocketAddr {
        match self.ps_addr {
            Some(ps) if dst_port == crate::control::COLOCATED_SERVER_PORT => ps,
            _ => self.addr,
        }
    }

    fn stats(&self) -> Value {
        json!({"node": self.node, "kind": format!("{:?}", self.kind).to_lowercase(), "live": self.live, "link_up": self.link_up,
               "sent": self.sent, "sent_bytes": self.sent_bytes, "queue_drops": self.shaper.as_ref().map_or(0, |q| q.drops)})
    }

    /// Bytes waiting in the port's egress queue at `now` (see the module docs).
    fn queue_bytes(&self, now: Time) -> u64 {
        match (&self.shaper, &self.queue_model) {
            (Some(q), _) => q.queued_bytes(),
            (None, Some(m)) => m.backlog_bytes(now),
            (None, None) => 0,
        }
    }

    /// Whether a packet of `job` may leave on this port: a worker or PS receives only its own
    /// jobs' packets (else a tenant could relay frames through the switch to any host); a
    /// neighbouring switch may carry any job.
    fn carries(&self, job: u32) -> bool {
        self.kind == PortKind::Switch || self.jobs.contains(&job)
    }
}

/// A job's multicast tree at this switch: the ports toward child switches (one encoding for
/// all of them, the copy still addressed to `GROUP`), and the child hosts with their ports.
/// Shared, so that a result takes a reference, not a copy of the lists.
#[derive(Debug, Default)]
struct Tree {
    switches: Vec<PortId>,
    hosts: Vec<(PortId, NodeId)>,
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
    /// Packets sent on a port whose link is down (lost, as on a failed link).
    link_down: u64,
    injected_drops: u64,
    ecn_marked: u64,
    /// Copies of packets to `GROUP` sent down their multicast tree.
    multicast_copies: u64,
    /// Packets a full processing queue refused ([`Processing`]).
    processing_drops: u64,
    /// The most bytes a packet admitted to the processing queue found waiting there (ECN
    /// marks come past the threshold, so this says whether none was due).
    processing_peak_bytes: u64,
    /// Packets the processing queue served, and their datagram bytes (what it was charged).
    processing_packets: u64,
    processing_bytes: u64,
    /// Datagrams without a valid tag, by reason: `short`, `no_key` (no admitted job's key for
    /// the job the header names, or no job at all), `bad_tag`; and well-tagged replays:
    /// `replayed`, `stale` ([`auth::ReplayWindow`]).
    forged: BTreeMap<&'static str, u64>,
    /// Packets the program sent for a job whose key is gone (released meanwhile).
    unsealed: u64,
    /// Packets the program sent to a worker or PS port outside the packet's job (dropped).
    outside_job: u64,
    /// Packets the program consumed into a sum (`*_aggregated`, not a loss) and those it
    /// discarded for another reason, each by reason.
    absorbed: BTreeMap<&'static str, u64>,
    program_drops: BTreeMap<&'static str, u64>,
    /// The last decode error, for the operator.
    last_malformed: Option<String>,
    /// Panics of the switch programs, caught (each refused a packet or a timer), and the last
    /// one's message.
    program_panics: u64,
    last_panic: Option<String>,
}

struct Ctx<'a> {
    node: NodeId,
    ports: &'a [Port],
    fwd: &'a Forwarding,
    now: Time,
}

impl SwitchCtx for Ctx<'_> {
    fn node(&self) -> NodeId {
        self.node
    }
    fn num_ports(&self) -> usize {
        self.ports.len()
    }
    fn queue_bytes(&self, port: PortId) -> u64 {
        self.ports.get(port as usize).map_or(0, |p| p.queue_bytes(self.now))
    }
    fn peer(&self, port: PortId) -> NodeId {
        self.ports.get(port as usize).map_or(NodeId::MAX, |p| p.node)
    }
    fn next_hops(&self, dst: NodeId) -> &[PortId] {
        self.fwd.next_hops(self.node, self.ports, dst)
    }
    fn faces_up(&self, port: PortId) -> bool {
        self.fwd.default_route == Some(port)
    }
    /// The fabric's default-port rule over the live next hops (listed in the order of the
    /// simulator's ports); no adaptive routing here (the emulation routes by ECMP).
    fn route_toward(&self, dst: NodeId) -> Option<(PortId, bool)> {
        let hops = self.next_hops(dst);
        (!hops.is_empty()).then(|| (self.fwd.default_port.pick_by_destination(hops, dst), false))
    }
}

/// The data plane: everything the packet loop touches, by concern.
struct DataPlane {
    node: NodeId,
    program: Programs,
    ports: Vec<Port>,
    by_addr: HashMap<SocketAddr, PortId>,
    /// Where packets go.
    fwd: Forwarding,
    /// Which datagrams are authentic and whose.
    guard: Guard,
    /// The socket and what goes out through it.
    io: Io,
    timers: Timers,
    /// Processing capacity and what waits for it.
    processing: ProcessingQueue,
    /// Drops injected for tests (`--drop-probability`).
    loss: InjectedLoss,
    /// The packet or timer being handled.
    at: Handling,
    c: Counters,
}

/// Where packets go: each kind of route this switch knows.
#[derive(Default)]
struct Forwarding {
    /// Attached nodes (workers, servers, neighbouring switches): node -> port.
    routes: HashMap<NodeId, PortId>,
    /// Next hops toward nodes further away (a static fabric's routes), one picked per flow:
    /// those whose link is up.
    ecmp: HashMap<NodeId, Vec<PortId>>,
    /// The same, every one, whatever its link's state.
    ecmp_all: HashMap<NodeId, Vec<PortId>>,
    /// Which next hop a packet takes ([`SwitchFabric::default_port`]).
    default_port: DefaultPort,
    /// A static fabric's pinned routes: (source, destination) -> port.
    pinned: HashMap<(NodeId, NodeId), PortId>,
    /// Admitted jobs' fixed paths (a scheme's plan pins an endpoint's packets to them), at this
    /// switch: (source, destination, ingress port) -> (job, egress port). The ingress port
    /// tells the visits of a path that passes here twice apart. They take precedence over
    /// every other route.
    paths: HashMap<(NodeId, NodeId, PortId), (u32, PortId)>,
    /// Admitted jobs' multicast trees at this switch: (job, sending host) -> the children, each
    /// a port and, for a host, the node a copy is addressed to (what goes to a switch stays
    /// addressed to `GROUP`).
    trees: HashMap<(u32, NodeId), Arc<Tree>>,
    /// Port toward the next switch (ATP chains): where unknown destinations go.
    default_route: Option<PortId>,
}

impl Forwarding {
    /// The port toward `pkt`'s destination at switch `node`, having come in on `in_port`
    /// (`None` in a timer), for a packet the program hands to the driver to route; in order of
    /// precedence (what a program itself may choose among is [`Forwarding::next_hops`]):
    /// 1. an admitted job's fixed path through this switch (a scheme's plan), if its link is up;
    /// 2. an attached node's port;
    /// 3. a static fabric's pinned route for the flow, if its link is up;
    /// 4. a static fabric's next hops toward the destination, one picked by the default-port
    ///    rule (by the flow's hash, as the simulator's ECMP; none if every link is down);
    /// 5. the upstream switch (ATP chains), for destinations this switch knows nothing of.
    fn lookup(&self, node: NodeId, ports: &[Port], in_port: Option<PortId>, pkt: &Packet) -> Option<PortId> {
        let up = |p: PortId| ports[p as usize].link_up;
        // (Most switches pin no path: skip the lookup on their hot path.)
        let fixed = in_port.filter(|_| !self.paths.is_empty()).and_then(|i| self.paths.get(&(pkt.src, pkt.dst, i)));
        if let Some(&(_, p)) = fixed.filter(|(_, p)| up(*p)) {
            return Some(p);
        }
        if let Some(&p) = self.routes.get(&pkt.dst) {
            return Some(p);
        }
        if let Some(&p) = self.pinned.get(&(pkt.src, pkt.dst)).filter(|&&p| up(p)) {
            return Some(p);
        }
        match self.ecmp.get(&pkt.dst) {
            Some(hops) if !hops.is_empty() => Some(self.default_port.pick(hops, pkt.flow, pkt.dst, node)),
            Some(_) => None,
            None => self.default_route,
        }
    }

    /// The next hops toward `dst` a switch program may choose among ([`SwitchCtx::next_hops`]):
    /// live ports only. An attached node's port if its link is up; a static fabric's next
    /// hops (kept filtered to live links, [`DataPlane::set_link`]); the upstream port for any
    /// other node.
    fn next_hops<'a>(&'a self, node: NodeId, ports: &[Port], dst: NodeId) -> &'a [PortId] {
        match self.routes.get(&dst) {
            Some(p) if ports[*p as usize].link_up => std::slice::from_ref(p),
            Some(_) => &[],
            None => match self.ecmp.get(&dst) {
                Some(hops) => hops,
                None if dst != node => self.default_route.as_slice(),
                None => &[],
            },
        }
    }
}

/// Which datagrams are authentic, and whose.
#[derive(Default)]
struct Guard {
    /// Jobs of the nodes (a static fabric's workers and servers): the key of frames whose
    /// header names no job (host-to-host transport segments).
    node_jobs: HashMap<NodeId, u32>,
    /// Frame authenticators of the admitted jobs.
    keys: HashMap<u32, FrameMac>,
    /// Sequence numbers accepted per job and sending address ([`auth`]: replays).
    windows: HashMap<(u32, SocketAddr), auth::ReplayWindow>,
}

/// The socket and what goes out through it.
struct Io {
    /// Taken out while `poll` receives (so ingress can borrow the rest); always present
    /// between polls.
    udp: Option<Udp>,
    tx: TxBatch,
    /// A multicast's frame, encoded once.
    scratch: Vec<u8>,
    /// Ports shape their own egress ([`SwitchOptions::shaping`]).
    shaping: Option<PortShaping>,
    /// `--pcap`: every datagram in and out.
    capture: Option<WireCapture>,
}

/// The programs' timers, earliest first (ties in the order they were set).
#[derive(Default)]
struct Timers {
    heap: BinaryHeap<Reverse<(Time, u64, TimerToken)>>,
    seq: u64,
}

/// Processing capacity ([`SwitchFabric::processing`]).
#[derive(Default)]
struct ProcessingQueue {
    /// Its settings and its FIFO, served at its rate.
    fifo: Option<(Processing, Pacer)>,
    /// What the program did with each processed packet, held until the FIFO has served it:
    /// (when, ingress port, actions), in order of that time.
    held: VecDeque<(Time, PortId, Vec<SwitchAction>)>,
}

/// Drops injected for tests (`--drop-probability`), drawn from the shard's own stream.
struct InjectedLoss {
    probability: f64,
    rng: Xoshiro256PlusPlus,
}

/// The packet or timer being handled, and what handling it produced.
#[derive(Default)]
struct Handling {
    /// The clock at the packet or timer (when a shaped datagram is queued).
    now: Time,
    /// The port of the packet (`None` in timers).
    in_port: Option<PortId>,
    actions: Vec<SwitchAction>,
    /// Jobs a program panicked on, with why: the data loop has the control plane fail them.
    failed_jobs: Vec<(u32, String)>,
}

/// Bytes of a datagram besides its values, at most: envelope 16, the longest protocol header
/// (29), payload kind and count 3, the trailer (sequence number and tag, 24).
const FRAME_OVERHEAD_BYTES: usize = 16 + 29 + 3 + auth::TRAILER_BYTES;

/// Datagrams handled per lock hold before timers and sends run.
const RECV_BUDGET: usize = 1024;
/// ECN: a software switch's queue is its socket's receive backlog. When more than this many
/// datagrams were waiting in one poll (about 75 kB of 300 B packets, a few windows), the rest of
/// that backlog is marked Congestion Experienced, as a Tofino marks above its queue threshold;
/// ATP's workers halve their windows on it.
const ECN_BACKLOG_DATAGRAMS: usize = 256;

impl DataPlane {
    /// A shard's data plane: its own socket, programs (sized by [`SwitchOptions::switch_spec`])
    /// and drop decisions (seeded `seed`).
    fn new(opts: &SwitchOptions, udp: Udp, seed: u64, capture: Option<WireCapture>) -> Result<DataPlane, NetError> {
        Ok(DataPlane {
            node: opts.node,
            program: opts.build_programs()?,
            ports: vec![],
            by_addr: HashMap::new(),
            fwd: Forwarding::default(),
            guard: Guard::default(),
            io: Io { udp: Some(udp), tx: TxBatch::default(), scratch: vec![], shaping: opts.shaping, capture },
            timers: Timers::default(),
            processing: ProcessingQueue::default(),
            loss: InjectedLoss { probability: opts.drop_probability, rng: Xoshiro256PlusPlus::seed_from_u64(seed) },
            at: Handling::default(),
            c: Counters::default(),
        })
    }

    fn add_port(&mut self, addr: SocketAddr, node: NodeId, kind: PortKind) -> PortId {
        if let Some(&p) = self.by_addr.get(&addr) {
            let port = &mut self.ports[p as usize];
            (port.addr, port.node, port.kind, port.live) = (addr, node, kind, true);
            self.fwd.routes.insert(node, p);
            return p;
        }
        let p = self.ports.len() as PortId;
        let shaper = self.io.shaping.map(|sh| ShapedQueue::new(sh.rate_bps, (sh.delay_us * 1e6) as Time, sh.buffer_bytes));
        self.ports.push(Port::new(addr, node, kind, shaper));
        self.by_addr.insert(addr, p);
        self.fwd.routes.insert(node, p);
        p
    }

    /// A static fabric's ports and routes, and which job each of its hosts belongs to.
    fn install(&mut self, f: &SwitchFabric) -> Result<(), NetError> {
        for p in &f.ports {
            let kind = match p.kind.as_str() {
                "worker" => PortKind::Worker,
                "ps" => PortKind::Ps,
                "switch" => PortKind::Switch,
                k => return Err(NetError::Config(format!("fabric: port kind {k:?} is not one of \"worker\", \"ps\", \"switch\""))),
            };
            let port = self.add_port(p.udp, p.node, kind) as usize;
            if let Some(ps) = p.ps_udp {
                if self.ports[port].shaper.is_some() {
                    return Err(NetError::Config(format!("fabric: the port to node {} has a co-located PS; its link must be shaped outside the switch (tc), where the two share it", p.node)));
                }
                self.ports[port].ps_addr = Some(ps);
                self.by_addr.insert(ps, port as PortId);
            }
            if let (Some(rate), None) = (p.rate_bps, &self.ports[port].shaper) {
                if rate == 0 {
                    return Err(NetError::Config(format!("fabric: the port to node {} has rate_bps 0", p.node)));
                }
                self.ports[port].queue_model = Some(Pacer::new(rate));
            }
        }
        for r in &f.routes {
            let via: Option<Vec<PortId>> = r.via.iter().map(|n| self.fwd.routes.get(n).copied()).collect();
            let via = via.ok_or_else(|| NetError::Config(format!("fabric: a route to node {} goes via a node that is no neighbour", r.dst)))?;
            match (r.src, via.as_slice()) {
                (Some(src), [port]) => {
                    self.fwd.pinned.insert((src, r.dst), *port);
                }
                (Some(src), _) => return Err(NetError::Config(format!("fabric: the route from {src} to {} needs exactly one next hop", r.dst))),
                (None, _) => {
                    self.fwd.ecmp.insert(r.dst, via.clone());
                    self.fwd.ecmp_all.insert(r.dst, via);
                }
            }
        }
        self.fwd.default_port = f.default_port;
        if let Some(p) = f.processing {
            if p.rate_bps == 0 || p.buffer_bytes == 0 {
                return Err(NetError::Config(format!("fabric: processing.rate_bps and processing.buffer_bytes must be positive, got {p:?}")));
            }
            self.processing.fifo = Some((p, Pacer::new(p.rate_bps)));
        }
        for spec in &f.jobs {
            for n in spec.workers.iter().map(|w| w.node).chain(spec.servers.iter().map(|s| s.node)) {
                self.guard.node_jobs.insert(n, spec.job);
            }
        }
        Ok(())
    }

    /// The link to neighbour `peer` is down (`up` false) or up again: routing and the
    /// programs' next hops skip it while it is down, and what is still sent on it is lost.
    fn set_link(&mut self, peer: NodeId, up: bool) -> Result<(), NetError> {
        let Some(port) = self.ports.iter().position(|p| p.live && p.node == peer) else {
            return Err(NetError::Config(format!("field `peer`: node {peer} is no neighbour of switch {}", self.node)));
        };
        let p = &mut self.ports[port];
        p.link_up = up;
        if let Some(m) = &mut p.queue_model {
            // Whatever it held is gone with the link.
            *m = Pacer::new(m.rate_bps());
        }
        let ports = &self.ports;
        self.fwd.ecmp = self.fwd.ecmp_all.iter().map(|(&dst, via)| (dst, via.iter().copied().filter(|&v| ports[v as usize].link_up).collect())).collect();
        Ok(())
    }

    /// Removes a worker's (or the PS's) port so its packets are dropped from now on.
    fn remove_port(&mut self, node: NodeId) {
        if let Some(p) = self.fwd.routes.remove(&node) {
            let port = &mut self.ports[p as usize];
            port.live = false;
            self.by_addr.remove(&port.addr);
            if let Some(ps) = port.ps_addr {
                self.by_addr.remove(&ps);
            }
        }
    }

    fn poll(&mut self, clock: &Clock) -> std::io::Result<()> {
        let mut udp = self.io.udp.take().expect("socket present between polls");
        let result = self.poll_with(&mut udp, clock);
        self.io.udp = Some(udp);
        result
    }

    fn poll_with(&mut self, udp: &mut Udp, clock: &Clock) -> std::io::Result<()> {
        let mut handled = 0;
        while handled < RECV_BUDGET {
            let now = clock.now();
            self.at.now = now;
            let congested = handled >= ECN_BACKLOG_DATAGRAMS;
            let n = udp.recv_batch(|addr, d| self.ingress(now, addr, d, congested))?;
            if n == 0 {
                break;
            }
            handled += n;
            if self.io.tx.len() >= 256 {
                self.send_batch(udp);
            }
        }
        let now = clock.now();
        self.at.now = now;
        self.release_processed(now);
        while let Some(&Reverse((at, _, token))) = self.timers.heap.peek() {
            if at > now {
                break;
            }
            self.timers.heap.pop();
            let ctx = Ctx { node: self.node, ports: &self.ports, fwd: &self.fwd, now };
            // A program's panic is caught here, so it never takes the data plane or its lock
            // with it; a timer names no job, so only the count and message say it happened.
            if let Err(msg) = crate::guarded(|| self.program.on_timer(now, &ctx, token, &mut self.at.actions)) {
                self.at.actions.clear();
                self.program_panicked(None, format!("in a timer: {msg}"));
                continue;
            }
            self.apply();
        }
        self.release_due(now);
        self.send_batch(udp);
        Ok(())
    }

    /// Sends the batch, captured first if asked.
    fn send_batch(&mut self, udp: &mut Udp) {
        if let Some(c) = self.io.capture.as_mut() {
            self.io.tx.iter().for_each(|(to, d)| c.sent(to, d));
        }
        udp.send_batch(&mut self.io.tx);
    }

    fn udp(&self) -> &Udp {
        self.io.udp.as_ref().expect("socket present between polls")
    }

    fn ingress(&mut self, now: Time, addr: SocketAddr, bytes: &[u8], mut congested: bool) {
        self.c.received += 1;
        if let Some(c) = self.io.capture.as_mut() {
            c.received(addr, bytes);
        }
        let Some((port, mut pkt, job)) = self.checked_packet(addr, bytes) else { return };
        if self.loss.probability > 0.0 && self.loss.rng.random::<f64>() < self.loss.probability {
            self.c.injected_drops += 1;
            return;
        }
        let ctx = Ctx { node: self.node, ports: &self.ports, fwd: &self.fwd, now };
        // Processing capacity: the packet takes its turn in the FIFO, and what the program does
        // with it leaves when the FIFO has served it (as the simulator's `ready`).
        let mut ready = None;
        let processes = self.processing.fifo.is_some()
            && crate::guarded(|| self.program.processes(&ctx, port, &pkt)).unwrap_or_else(|_| {
                // (Counted; the packet is then handled as one the queue does not hold.)
                self.c.program_panics += 1;
                false
            });
        if let Some((cap, fifo)) = self.processing.fifo.as_mut().filter(|_| processes) {
            let backlog = fifo.backlog_bytes(now);
            if backlog + bytes.len() as u64 + WIRE_OVERHEAD_BYTES > cap.buffer_bytes {
                self.c.processing_drops += 1;
                return;
            }
            self.c.processing_peak_bytes = self.c.processing_peak_bytes.max(backlog);
            congested |= backlog > cap.ecn_threshold_bytes;
            self.c.processing_packets += 1;
            self.c.processing_bytes += bytes.len() as u64;
            ready = Some(fifo.admit(now, bytes.len()));
        }
        if congested {
            self.c.ecn_marked += 1;
            pkt.ecn = true;
        }
        let src = pkt.src;
        if let Err(msg) = crate::guarded(|| self.program.on_packet(now, &ctx, port, pkt, &mut self.at.actions)) {
            // The job whose packet it was fails (the control plane releases it); its partial
            // actions are dropped and every other job goes on.
            self.at.actions.clear();
            self.program_panicked(job, format!("handling a packet from node {src}: {msg}"));
            return;
        }
        match ready {
            Some(at) if at > now => {
                let actions = std::mem::take(&mut self.at.actions);
                self.processing.held.push_back((at, port, actions));
            }
            _ => self.apply_from(port),
        }
    }

    /// A datagram from `addr` as a packet of a job its sender may send for: from a known port,
    /// well formed, its tag and sequence number good, its source the port's node and its job
    /// one the port is admitted for. `None`: dropped, and counted by why.
    fn checked_packet(&mut self, addr: SocketAddr, bytes: &[u8]) -> Option<(PortId, Packet, Option<u32>)> {
        let Some(&port) = self.by_addr.get(&addr) else {
            self.c.unknown_source += 1;
            return None;
        };
        let Ok((frame_bytes, _, _)) = auth::split(bytes) else {
            *self.c.forged.entry("short").or_default() += 1;
            return None;
        };
        let view = match frame::Frame::new_checked(frame_bytes) {
            Ok(f) => f,
            Err(e) => {
                self.c.malformed += 1;
                self.c.last_malformed = Some(format!("from {addr}: {e}"));
                return None;
            }
        };
        // Nothing reads the frame further before its tag is checked.
        let Some((job, mac)) = self.frame_job(view.header(), view.src()).and_then(|j| Some((j, self.guard.keys.get(&j)?))) else {
            *self.c.forged.entry("no_key").or_default() += 1;
            return None;
        };
        let p = &self.ports[port as usize];
        let Ok((_, seq)) = mac.open(bytes, p.link_from(addr, self.node)) else {
            *self.c.forged.entry("bad_tag").or_default() += 1;
            return None;
        };
        if let Err(r) = self.guard.windows.entry((job, addr)).or_default().accept(seq) {
            *self.c.forged.entry(r.name()).or_default() += 1;
            return None;
        }
        // Checked on the view so a spoofed datagram's payload is never copied.
        if p.kind != PortKind::Switch && view.src() != p.node {
            self.c.spoofed += 1;
            return None;
        }
        let pkt = frame::to_packet(&view);
        let Ok(claimed) = crate::guarded(|| self.program.job_of(&pkt)) else {
            self.program_panicked(None, format!("deciding the job of a packet from node {}", pkt.src));
            return None;
        };
        let job = claimed.or_else(|| self.guard.node_jobs.get(&pkt.src).copied());
        // A worker may only send its jobs' INA packets; a PS only INA packets of jobs it serves.
        let admitted = job.is_some_and(|j| p.jobs.contains(&j));
        if (p.kind == PortKind::Worker && !admitted) || (p.kind == PortKind::Ps && job.is_some() && !admitted) {
            self.c.unadmitted += 1;
            return None;
        }
        Some((port, pkt, job))
    }

    /// A program panicked (caught): counted, said once on stderr, and the job it was handling,
    /// if known, is failed by the control plane after this poll.
    fn program_panicked(&mut self, job: Option<u32>, what: String) {
        self.c.program_panics += 1;
        let reason = match job {
            Some(j) => format!("the switch program panicked on job {j} {what}; the job is failed, the others go on"),
            None => format!("the switch program panicked {what}"),
        };
        eprintln!("inalab switch: {reason}");
        if let Some(j) = job.filter(|j| !self.at.failed_jobs.iter().any(|(f, _)| f == j)) {
            self.at.failed_jobs.push((j, reason.clone()));
        }
        self.c.last_panic = Some(reason);
    }

    /// Applies the program's actions on a packet that came in on `port`.
    fn apply_from(&mut self, port: PortId) {
        self.at.in_port = Some(port);
        self.apply();
        self.at.in_port = None;
    }

    /// Carries out the actions on every processed packet whose time has come.
    fn release_processed(&mut self, now: Time) {
        while self.processing.held.front().is_some_and(|(at, _, _)| *at <= now) {
            let (_, port, actions) = self.processing.held.pop_front().expect("front checked");
            let spare = std::mem::replace(&mut self.at.actions, actions);
            self.apply_from(port);
            // Keep the emptied vector with the larger capacity for the next packet.
            if spare.capacity() > self.at.actions.capacity() {
                self.at.actions = spare;
            }
        }
    }

    fn apply(&mut self) {
        let mut actions = std::mem::take(&mut self.at.actions);
        for a in actions.drain(..) {
            match a {
                SwitchAction::Forward { port, pkt } => self.egress(port, &pkt),
                SwitchAction::Route { pkt } if pkt.dst == GROUP => self.replicate(pkt),
                SwitchAction::Route { pkt } => {
                    if pkt.dst == self.node {
                        self.c.unadmitted += 1;
                    } else if let Some(port) = self.route(&pkt) {
                        self.egress(port, &pkt);
                    } else {
                        self.c.no_route += 1;
                    }
                }
                SwitchAction::Multicast { ports, pkt } => self.egress_many(&ports, &pkt),
                SwitchAction::ForwardEach { mut pkt, to } => {
                    let mut tail = None;
                    for a in &to {
                        a.address(&mut pkt);
                        self.egress_reusing(a.port, &pkt, &mut tail);
                    }
                }
                SwitchAction::Drop { reason, .. } => {
                    let by_reason = if inalab_core::is_absorbed(reason) { &mut self.c.absorbed } else { &mut self.c.program_drops };
                    *by_reason.entry(reason).or_default() += 1
                }
                SwitchAction::SetTimer { at, token } => {
                    self.timers.seq += 1;
                    self.timers.heap.push(Reverse((at, self.timers.seq, token)));
                }
            }
        }
        self.at.actions = actions;
    }

    fn egress(&mut self, port: PortId, pkt: &Packet) {
        self.egress_reusing(port, pkt, &mut None)
    }

    /// As [`Self::egress`], for one of several copies of a packet sent one after another:
    /// `tail` carries the last copy's tail hash (see [`FrameMac::seal_reusing`]) between them.
    fn egress_reusing(&mut self, port: PortId, pkt: &Packet, tail: &mut Option<auth::TailHash>) {
        let Some((job, mac)) = self.frame_job(&pkt.header, pkt.src).and_then(|j| Some((j, self.guard.keys.get(&j)?))) else {
            self.c.unsealed += 1;
            return;
        };
        let me = self.node;
        match self.ports.get_mut(port as usize) {
            Some(p) if p.live && !p.carries(job) => self.c.outside_job += 1,
            Some(p) if p.live && !p.link_up => self.c.link_down += 1,
            // Unshaped (the usual case): encoded straight into the send batch, no copy.
            Some(p) if p.live && p.shaper.is_none() => {
                let (link, seq) = p.link_to(pkt.dst_port, me);
                let (addr, start) = (p.dest(pkt.dst_port), self.io.tx.bytes());
                self.io.tx.push(addr, |b| {
                    let start = b.len();
                    frame::encode(pkt, b);
                    mac.seal_reusing(b, start, link, seq, tail);
                });
                let len = self.io.tx.bytes() - start;
                self.count_sent(port, len);
            }
            Some(p) if p.live => {
                let (link, seq) = p.link_to(pkt.dst_port, me);
                let mut bytes = std::mem::take(&mut self.io.scratch);
                bytes.clear();
                frame::encode(pkt, &mut bytes);
                mac.seal(&mut bytes, 0, link, seq);
                self.send(port, &bytes, pkt.dst_port);
                self.io.scratch = bytes;
            }
            _ => self.c.dead_port += 1,
        }
    }

    /// A packet to `GROUP`: a copy to each of this switch's children on the tree of its job
    /// and sender (copies to hosts addressed to them); `no_route` where there is none.
    fn replicate(&mut self, pkt: Packet) {
        let tree = self.frame_job(&pkt.header, pkt.src).and_then(|j| self.fwd.trees.get(&(j, pkt.src)));
        let Some(tree) = tree.cloned() else {
            self.c.no_route += 1;
            return;
        };
        self.c.multicast_copies += (tree.switches.len() + tree.hosts.len()) as u64;
        if !tree.switches.is_empty() {
            self.egress_many(&tree.switches, &pkt);
        }
        let (mut copy, mut tail) = (pkt, None);
        for &(port, host) in &tree.hosts {
            copy.dst = host;
            self.egress_reusing(port, &copy, &mut tail);
        }
    }

    /// One packet to several ports: encoded once, then tagged for each port's link (a wide
    /// frame's values hashed once: [`FrameMac::seal_reusing`]).
    fn egress_many(&mut self, ports: &[PortId], pkt: &Packet) {
        let mut tail = None;
        for &port in ports {
            self.egress_reusing(port, pkt, &mut tail);
        }
    }

    /// The port toward `pkt`'s destination ([`Forwarding::lookup`]).
    fn route(&self, pkt: &Packet) -> Option<PortId> {
        self.fwd.lookup(self.node, &self.ports, self.at.in_port, pkt)
    }

    /// The job whose key tags a frame: the one its header names, else its source node's.
    fn frame_job(&self, header: &inalab_core::wire::Header, src: NodeId) -> Option<u32> {
        header.job().or_else(|| self.guard.node_jobs.get(&src).copied())
    }

    /// One datagram for endpoint port `dst_port` out of a live `port`: into the send batch, or
    /// its shaped queue (a shaped port has no co-located PS).
    fn send(&mut self, port: PortId, datagram: &[u8], dst_port: u16) {
        let p = &mut self.ports[port as usize];
        match &mut p.shaper {
            Some(q) => {
                if !q.push(self.at.now, datagram.to_vec()) {
                    return; // tail drop, counted by the queue
                }
            }
            None => self.io.tx.push(p.dest(dst_port), |b| b.extend_from_slice(datagram)),
        }
        self.count_sent(port, datagram.len());
    }

    fn count_sent(&mut self, port: PortId, len: usize) {
        let p = &mut self.ports[port as usize];
        if let Some(m) = &mut p.queue_model {
            m.admit(self.at.now, len);
        }
        self.c.forwarded += 1;
        p.sent += 1;
        p.sent_bytes += len as u64 + WIRE_OVERHEAD_BYTES;
    }

    /// Moves every shaped datagram whose time has come into the send batch.
    fn release_due(&mut self, now: Time) {
        for p in &mut self.ports {
            if let Some(q) = &mut p.shaper {
                while let Some(d) = q.pop_due(now) {
                    self.io.tx.push(p.addr, |b| b.extend_from_slice(&d));
                }
            }
        }
    }

    /// When the next shaped datagram or processed packet is due.
    fn next_due(&self) -> Option<Time> {
        let processed = self.processing.held.front().map(|(at, _, _)| *at);
        self.ports.iter().filter_map(|p| p.shaper.as_ref()?.next_due()).chain(processed).min()
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
            "no_route": c.no_route, "dead_port": c.dead_port, "link_down": c.link_down, "injected_drops": c.injected_drops, "ecn_marked": c.ecn_marked,
            "multicast_copies": c.multicast_copies, "processing_drops": c.processing_drops,
            "processing": self.processing.fifo.as_ref().map(|(cap, _)| json!({"rate_bps": cap.rate_bps, "buffer_bytes": cap.buffer_bytes,
                "ecn_threshold_bytes": cap.ecn_threshold_bytes, "peak_bytes": c.processing_peak_bytes,
                "packets": c.processing_packets, "bytes": c.processing_bytes})),
            "forged": c.forged, "unsealed": c.unsealed, "outside_job": c.outside_job,
            "absorbed": c.absorbed, "program_drops": c.program_drops, "last_malformed": c.last_malformed,
            "program_panics": c.program_panics, "last_panic": c.last_panic,
            "program": program,
            "ports": self.ports.iter().map(Port::stats).collect::<Vec<_>>(),
            "io": {"datagrams_sent": io.datagrams_sent, "datagrams_received": io.datagrams_received,
                   "send_calls": io.send_calls, "recv_calls": io.recv_calls, "send_errors": io.send_errors,
                   "gso_segments": self.udp().max_gso_segments(), "gro_segments": self.udp().gro_segments()},
            "capture": self.io.capture.as_ref().map(WireCapture::stats),
        })
    }
}

struct Shared {
    opts: SwitchOptions,
    secret: crate::auth::Secret,
    /// The data plane's shards, one thread each (see the module docs, "Shards"). Shard 0's
    /// socket is the switch's address: neighbours (PS, other switches) attach to it.
    shards: Vec<Mutex<DataPlane>>,
    cp: Mutex<ControlState>,
    stop: AtomicBool,
    /// Held while a job is admitted here (and a neighbour attaches): the ports an admission
    /// plans with, outside the data-plane lock, are the ones it then adds.
    admitting: Mutex<()>,
    /// Why the data-plane thread stopped, if it did while the switch was meant to serve: then
    /// every control request but the handshake is refused with it, and `stats` says it.
    dead: Mutex<Option<String>>,
}

impl Shared {
    /// Shard 0: the one neighbours know, and the only one where jobs that span switches run.
    fn dp(&self) -> std::sync::MutexGuard<'_, DataPlane> {
        crate::lock(&self.shards[0])
    }

    /// Runs `f` on every shard in turn, one lock at a time.
    fn each_shard(&self, mut f: impl FnMut(&mut DataPlane)) {
        for shard in &self.shards {
            f(&mut crate::lock(shard));
        }
    }

    /// A neighbour's link, in every shard that has a port to it.
    fn set_link(&self, peer: NodeId, up: bool) -> Result<(), NetError> {
        let mut result = Err(NetError::Config(format!("field `peer`: node {peer} is no neighbour of switch {}", self.opts.node)));
        self.each_shard(|dp| {
            if dp.set_link(peer, up).is_ok() {
                result = Ok(());
            }
        });
        result
    }
}

/// A running switch: its packet loop and control server threads.
pub struct SwitchHandle {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    pub udp_addr: SocketAddr,
    pub control_addr: SocketAddr,
}


/// Attaches to the upstream switch's control plane at `up` (whose address a job's packets
/// leave by when no route of this switch's covers them) and makes it the default route.
fn attach_upstream(dp: &mut DataPlane, up: SocketAddr, node: NodeId, secret: &crate::auth::Secret, udp_addr: SocketAddr, control_addr: SocketAddr) -> Result<(), NetError> {
    let reply = control::request(
        up,
        Some(&secret.credential(crate::auth::Role::Switch)),
        &json!({"op": "attach", "role": "switch", "node": node,
                "udp": control::announce(udp_addr, up), "control": control::announce(control_addr, up)}),
        CONTROL_TIMEOUT,
    )
    .map_err(|e| match e {
        NetError::Io(e) => crate::unreachable(e, "the upstream switch's control plane", up, "Start the upstream switch first, or give --upstream its control address"),
        e => e,
    })?;
    let up_udp: SocketAddr = field(&reply, "udp")?;
    let up_node: NodeId = field(&reply, "node")?;
    let p = dp.add_port(up_udp, up_node, PortKind::Switch);
    dp.fwd.default_route = Some(p);
    Ok(())
}

impl SwitchHandle {
    /// Binds the sockets, attaches to the upstream switch if any, and starts serving.
    pub fn start(mut opts: SwitchOptions) -> Result<SwitchHandle, NetError> {
        opts.check()?;
        let secret = match &opts.secret {
            Some(s) => s.clone(),
            None => crate::auth::Secret::load().map_err(NetError::Config)?,
        };
        let udp = Udp::bind(opts.udp).map_err(|e| crate::bind_error(e, "--udp", opts.udp))?;
        let listener = crate::service::control_listener(opts.control).map_err(|e| crate::bind_error(e, "--control", opts.control))?;
        let (udp_addr, control_addr) = (udp.local_addr()?, listener.local_addr()?);
        // Datagrams must fit the MTU unfragmented (the sockets set don't-fragment).
        let fits = (crate::udp::max_payload_bytes(udp_addr).saturating_sub(FRAME_OVERHEAD_BYTES) / 4) as u32;
        if opts.packet_values > fits {
            opts.packet_values = fits;
        }
        let capture = match &opts.pcap {
            Some(path) => Some(WireCapture::create(path, udp_addr).map_err(|e| NetError::Config(format!("pcap: cannot write {}: {e}", path.display())))?),
            None => None,
        };
        let mut dp = DataPlane::new(&opts, udp, opts.seed, capture)?;
        // The other shards' sockets: the same address, ports the kernel picks (their workers
        // learn them at admission).
        let mut more = vec![];
        for k in 1..opts.shard_count() {
            let udp = Udp::bind(SocketAddr::new(udp_addr.ip(), 0)).map_err(|e| crate::bind_error(e, "--udp (another shard's socket)", udp_addr))?;
            more.push(DataPlane::new(&opts, udp, opts.seed.wrapping_add(k as u64), None)?);
        }
        if let Some(up) = opts.upstream {
            attach_upstream(&mut dp, up, opts.node, &secret, udp_addr, control_addr)?;
        }
        if let Some(f) = &opts.fabric {
            dp.install(f)?;
        }
        let shared = Arc::new(Shared {
            opts,
            secret,
            shards: std::iter::once(dp).chain(more).map(Mutex::new).collect(),
            cp: Mutex::new(ControlState::default()),
            stop: AtomicBool::new(false),
            admitting: Mutex::new(()),
            dead: Mutex::new(None),
        });
        for spec in shared.opts.fabric.iter().flat_map(|f| &f.jobs) {
            admit_here(&shared, spec).map_err(|e| NetError::Config(format!("fabric: job {}: {e}", spec.job)))?;
        }
        let mut threads = vec![];
        for k in 0..shared.shards.len() {
            let s = shared.clone();
            threads.push(std::thread::Builder::new().name(format!("inalab-switch-dp{k}")).spawn(move || {
                // A panic here is the driver's (the programs' are caught per packet): the switch
                // then says so at every request and in `health`, rather than live on serving
                // nothing.
                if let Err(msg) = crate::guarded(|| data_loop(&s, k)) {
                    let why = format!("the switch's data plane stopped (thread {k}): {msg}");
                    eprintln!("inalab switch: {why}");
                    *crate::lock(&s.dead) = Some(why);
                }
            })?);
        }
        let s = shared.clone();
        let ctl = std::thread::Builder::new().name("inalab-switch-cp".into()).spawn(move || {
            let conn_shared = s.clone();
            accept_loop(&s.stop, listener, "inalab-switch-conn", move |conn| serve(&conn_shared, conn))
        })?;
        let s = shared.clone();
        let reaper = std::thread::Builder::new().name("inalab-switch-reap".into()).spawn(move || {
            while !s.stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                control_plane::reap_rendezvous(&s);
            }
        })?;
        threads.extend([ctl, reaper]);
        Ok(SwitchHandle { shared, threads, udp_addr, control_addr })
    }

    /// Reports the link to neighbour `peer` down (`up` false) or up again (see the module
    /// docs, "Links"). An error if `peer` is no neighbour.
    pub fn set_link(&self, peer: NodeId, up: bool) -> Result<(), NetError> {
        self.shared.set_link(peer, up)
    }

    /// Removes `job`'s state here alone (its programs' aggregators, key, paths, trees), as its
    /// end does: a static fabric's jobs stay admitted until whoever started them says they
    /// ended (`inalab emulate`, once every worker is done). Returns the aggregators it still
    /// held (the simulator's `aggregators_released`).
    pub fn release_job(&self, job: u32) -> u32 {
        control_plane::release_here(&self.shared, job, None)
    }

    /// Driver and program counters, aggregators in use, I/O batching, admitted jobs.
    pub fn stats(&self) -> Value {
        stats(&self.shared, true)
    }

    /// `Ok` while the switch serves; an error saying why once its data plane stopped (it then
    /// refuses every control request): what `inalab.Switch.stats()` raises and the `inalab
    /// switch` command exits with.
    pub fn health(&self) -> Result<(), NetError> {
        health(&self.shared)
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

fn health(s: &Shared) -> Result<(), NetError> {
    match crate::lock(&s.dead).as_ref() {
        Some(why) => Err(NetError::Stopped(why.clone())),
        None => Ok(()),
    }
}

/// Counters; `jobs` lists the jobs the data plane holds and, `with_rendezvous` (the operator,
/// another switch), the jobs still in their rendezvous, whose ids anyone else could use to take
/// a free rank.
fn stats(s: &Shared, with_rendezvous: bool) -> Value {
    let (mut v, mut admitted, mut shards) = (Value::Null, vec![], vec![]);
    s.each_shard(|dp| {
        let one = dp.stats();
        shards.push(json!({"udp": dp.udp().local_addr().ok().map(|a| a.to_string()), "jobs": dp.guard.keys.keys().collect::<std::collections::BTreeSet<_>>(),
                           "received": one["received"], "forwarded": one["forwarded"]}));
        admitted.extend(dp.guard.keys.keys().copied());
        merge_counts(&mut v, one);
    });
    v["shards"] = json!(shards);
    // Jobs the data plane still holds (their keys go in the same step as their aggregators, so
    // `jobs: []` means nothing is held), static fabrics' too.
    let mut jobs: std::collections::BTreeSet<u32> = admitted.into_iter().collect();
    let cp = crate::lock(&s.cp);
    if with_rendezvous {
        jobs.extend(cp.job_ids());
    } else {
        let joining = cp.joining();
        jobs.extend(cp.job_ids().into_iter().filter(|j| !joining.contains(j)));
    }
    drop(cp);
    v["data_plane"] = match crate::lock(&s.dead).as_ref() {
        Some(why) => json!({"stopped": why}),
        None => json!("running"),
    };
    v["jobs"] = json!(jobs);
    // What jobs that set no packet size get (after the MTU's bound).
    v["packet_values"] = json!(s.opts.packet_values);
    v
}

/// Adds shard `b`'s stats into `a`: counts add up, objects merge by key, ports merge by the
/// neighbour they lead to; anything else (names, ids, the last error) is the first shard's
/// unless it has none.
fn merge_counts(a: &mut Value, b: Value) {
    const IDENTITIES: [&str; 3] = ["node", "gso_segments", "gro_segments"];
    match (a, b) {
        (a @ Value::Null, b) => *a = b,
        (Value::Number(x), Value::Number(y)) => {
            if let (Some(x0), Some(y0)) = (x.as_u64(), y.as_u64()) {
                *x = (x0 + y0).into();
            }
        }
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in y {
                // Numbers that are not counts: the same in every shard.
                if !IDENTITIES.contains(&k.as_str()) {
                    merge_counts(x.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.iter().chain(&y).all(|p| p.get("node").is_some() && p.get("sent").is_some()) => {
            for port in y {
                match x.iter_mut().find(|q| q["node"] == port["node"] && q["kind"] == port["kind"]) {
                    Some(q) => {
                        for k in ["sent", "sent_bytes", "queue_drops"] {
                            merge_counts(&mut q[k], port[k].clone());
                        }
                    }
                    None => x.push(port),
                }
            }
        }
        _ => {}
    }
}

fn data_loop(s: &Arc<Shared>, shard: usize) {
    let clock = Clock::new();
    let fd = crate::lock(&s.shards[shard]).udp().fd();
    let mut last_flush = std::time::Instant::now();
    while !s.stop.load(Ordering::Relaxed) {
        let next = {
            let dp = crate::lock(&s.shards[shard]);
            [dp.timers.heap.peek().map(|Reverse((at, _, _))| *at), dp.next_due()].into_iter().flatten().min()
        };
        let timeout = next.map_or(Duration::from_millis(10), |at| clock.until(at).min(Duration::from_millis(10)));
        if wait(&[(fd, libc::POLLIN)], Some(timeout)).is_err() {
            continue;
        }
        let mut dp = crate::lock(&s.shards[shard]);
        if let Err(e) = dp.poll(&clock) {
            eprintln!("inalab switch: receive error: {e}");
        }
        // Jobs a program panicked on fail, off this thread: a release talks to the PS and the
        // next switch, which must not stall packets.
        let failed = std::mem::take(&mut dp.at.failed_jobs);
        if !failed.is_empty() {
            let s = s.clone();
            let _ = std::thread::Builder::new().name("inalab-switch-fail".into()).spawn(move || {
                for (job, reason) in failed {
                    control_plane::release(&s, job, Some(&reason));
                }
            });
        }
        // A capture reaches its file within CAPTURE_FLUSH, so a switch that is killed leaves
        // a readable file with all but that last stretch.
        if let Some(c) = dp.io.capture.as_mut().filter(|_| last_flush.elapsed() >= CAPTURE_FLUSH) {
            c.flush();
            last_flush = std::time::Instant::now();
        }
    }
    if let Some(c) = crate::lock(&s.shards[shard]).io.capture.as_mut() {
        c.flush();
    }
}

/// How often a capture's buffered packets are written out.
const CAPTURE_FLUSH: Duration = Duration::from_millis(200);

#[cfg(test)]
mod tests {
    //! Issue #36, item 1: a panic in one job's set-up or packet handling takes neither the data
    //! plane, its lock nor another tenant with it; a switch whose data plane stopped says so.
    use super::*;
    use crate::client::{Client, ClientOptions};
    use inalab_core::{Admission, AdmitError};
    use std::sync::atomic::AtomicU64;

    fn any_port() -> SocketAddr {
        "127.0.0.1:0".parse().unwrap()
    }

    /// Rina's switch program, broken: it panics admitting a job (while `on_admit`) and on
    /// every packet.
    struct Broken {
        inner: Box<dyn SwitchProgram>,
        on_admit: Arc<AtomicBool>,
    }

    impl SwitchProgram for Broken {
        fn on_packet(&mut self, _now: Time, _ctx: &dyn SwitchCtx, _in_port: PortId, _pkt: Packet, _out: &mut Vec<SwitchAction>) {
            panic!("a broken program's packet handling");
        }
        fn admit(&mut self, job: u32, adm: Admission) -> Result<(), AdmitError> {
            if self.on_admit.load(Ordering::SeqCst) {
                panic!("a broken program's admission");
            }
            self.inner.admit(job, adm)
        }
        fn release(&mut self, job: u32) -> u32 {
            self.inner.release(job)
        }
        fn job_of(&self, pkt: &Packet) -> Option<u32> {
            self.inner.job_of(pkt)
        }
    }

    fn opts(sw: &SwitchHandle, scheme: &str, job: u32, rank: usize) -> ClientOptions {
        ClientOptions {
            switch: sw.control_addr,
            job,
            rank,
            world: 2,
            config: json!({"scheme": scheme, "ina": {"pool_slots": 8}}),
            join_timeout: Duration::from_secs(20),
            secret: None,
            job_secret: None,
            link_rate_bps: None,
        }
    }

    /// Both workers of a 2-worker job, or the first error.
    fn pair(sw: &SwitchHandle, scheme: &str, job: u32) -> Result<(Client, Client), NetError> {
        let mut config = opts(sw, scheme, job, 1);
        if scheme != "switchml" {
            config.config = json!({"scheme": scheme});
        }
        let mut first = config.clone();
        first.rank = 0;
        let other = std::thread::spawn(move || Client::connect(config));
        let a = Client::connect(first);
        let b = other.join().unwrap();
        Ok((a?, b?))
    }

    #[test]
    fn a_panicking_program_refuses_or_fails_its_own_job_and_the_switch_serves_on() {
        let sw = SwitchHandle::start(SwitchOptions { udp: any_port(), control: any_port(), ..SwitchOptions::new(&["switchml", "rina"]) }).unwrap();
        let on_admit = Arc::new(AtomicBool::new(true));
        {
            // Rina's program is swapped for the broken one (what a bug in it would do).
            let me = JobSpec { job: 0, config: Value::Null, workers: vec![], servers: vec![], switches: vec![sw.shared.opts.switch_spec()], key: String::new(), network: None, lanes: 1 };
            let view = control::RuntimeView::new(&me, Some(1), &|_| None);
            let program = |name: &str| inalab_scheme::by_name(name).unwrap().program(1, &view).unwrap();
            let mut programs = Programs::new();
            programs.install("switchml", program("switchml")).unwrap();
            programs.install("rina", Box::new(Broken { inner: program("rina"), on_admit: on_admit.clone() })).unwrap();
            sw.shared.dp().program = programs;
        }
        // The honest tenant: a SwitchML job whose integer sums must stay exact throughout.
        let (a, b) = pair(&sw, "switchml", 1).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let tenant = {
            let (stop, done) = (stop.clone(), done.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let t = std::thread::scope(|sc| {
                        let h = sc.spawn(|| b.allreduce(vec![2.0; 1000]));
                        (a.allreduce(vec![1.0; 1000]), h.join().unwrap())
                    });
                    assert_eq!(t.0.unwrap(), vec![3.0; 1000]);
                    assert_eq!(t.1.unwrap(), vec![3.0; 1000]);
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        // A job whose admission panics is refused, naming the cause.
        let e = pair(&sw, "rina", 2).err().expect("refused").to_string();
        assert!(e.contains("panicked admitting") && e.contains("a broken program's admission"), "{e}");
        assert!(sw.health().is_ok());
        // A job whose packets make the program panic fails, alone, naming the cause.
        on_admit.store(false, Ordering::SeqCst);
        let (c, d) = pair(&sw, "rina", 3).unwrap();
        let t = std::thread::spawn(move || d.allreduce_within(vec![2.0; 100], None, Duration::from_secs(20), || Ok(())));
        let e = c.allreduce_within(vec![1.0; 100], None, Duration::from_secs(20), || Ok(())).unwrap_err().to_string();
        assert!(e.contains("panicked on job 3") && e.contains("a broken program's packet handling"), "{e}");
        assert!(t.join().unwrap().is_err());
        let before = done.load(Ordering::Relaxed);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while done.load(Ordering::Relaxed) < before + 5 {
            assert!(std::time::Instant::now() < deadline, "the honest job stopped");
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::Relaxed);
        tenant.join().expect("the honest job stayed exact");
        let st = sw.stats();
        assert!(st["program_panics"].as_u64().unwrap() >= 1, "{st}");
        assert!(st["last_panic"].as_str().unwrap().contains("job 3"), "{st}");
        assert!(sw.health().is_ok());
    }

    #[test]
    fn a_data_plane_that_stops_is_reported_and_every_request_says_why() {
        // A bug in the driver itself (here: its socket gone) stops the data-plane thread. The
        // switch must not live on serving nothing: `health` says why, and so does every
        // control request (`inalab switch` exits with it; `inalab.Switch.stats()` raises it).
        let sw = SwitchHandle::start(SwitchOptions { udp: any_port(), control: any_port(), ..SwitchOptions::new(&["switchml"]) }).unwrap();
        assert!(sw.health().is_ok());
        sw.shared.dp().io.udp = None;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let why = loop {
            match sw.health() {
                Err(e) => break e.to_string(),
                Ok(()) => assert!(std::time::Instant::now() < deadline, "the stopped data plane is not reported"),
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(why.contains("data plane stopped") && why.contains("socket present"), "{why}");
        let e = control::request(sw.control_addr, None, &json!({"op": "stats"}), Duration::from_secs(5)).unwrap_err().to_string();
        assert!(e.contains("data plane stopped"), "{e}");
        let opts = ClientOptions { world: 1, ..opts(&sw, "switchml", 1, 0) };
        let e = Client::connect(opts).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("data plane stopped"), "{e}");
    }
}
