//! The simulation world: nodes, ports, packets in flight, and the event loop that feeds the
//! sans-IO protocols their inputs and carries out their outputs.

mod pfc;

use crate::events::{Ev, EventQueue};
use crate::failures::{Failure, Liveness, Target, Why};
use crate::network::{Enqueued, PortState};
use crate::result::Conservation;
use crate::setup::host_named;
use crate::spec::{FlowControl, Routing, SimSpec};
use crate::workload::Workloads;
use crate::wires::Wires;
use crate::world::{Call, Owner, World};
use crate::{Progress, SimError};
use inalab_core::{Addressed, AppRequest, HostEvent, HostProtocol, NodeId, Packet, PortId, Programs, SwitchAction, SwitchCtx, SwitchProgram, Time, GROUP, NO_PATH};
use inalab_topo::{DefaultPort, Routes, Topology};
use pfc::{Mode, Pfc, NO_INGRESS};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use std::time::Instant;

pub(crate) struct Endpoint {
    pub proto: Box<dyn HostProtocol>,
    pub port: u16,
    pub owner: Owner,
    /// Fixed path installed for this endpoint's packets (`NO_PATH`: routing tables decide).
    pub path: u32,
    /// Multicast tree for its packets to `GROUP` (`NO_PATH`: none; they are dropped unrouted).
    pub tree: u32,
    /// Time of the pending `HostTimer` event, if any (later ones are stale).
    timer_armed: Option<Time>,
}

#[derive(Default)]
pub(crate) struct HostState {
    pub eps: Vec<Endpoint>,
    nic_busy: bool,
    /// PFC: its switch paused it (`pfc.rs` keeps the pause's statistics).
    nic_paused: bool,
    /// Credits: the packet its NIC took and waits to send for lack of credits.
    credit_held: Option<Packet>,
    /// Round-robin cursor over endpoints when the NIC polls.
    rr: usize,
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub drops_loss: u64,
    pub drops_no_endpoint: u64,
    /// Packets its NIC sent into a failed link.
    pub drops_link_failed: u64,
    /// Packets that reached it after it failed, and when it did.
    pub drops_host_failed: u64,
    pub failed_at: Option<Time>,
    pub loss: f64,
    /// Packets between endpoints of this host, delivered by an `Ev::Local` at the same time
    /// (not by a nested call, which would recurse once per packet).
    local: std::collections::VecDeque<Packet>,
    /// Its processing cost (`network.host_costs`); `None`: free.
    pub cpu: Option<Cpu>,
    /// Packets that arrived and wait for the CPU, in order, each delivered by an `Ev::CpuRx`.
    rx_wait: std::collections::VecDeque<Packet>,
}

/// A host's CPU as `network.host_costs` sets it: one packet at a time, sends and receives.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cpu {
    per_packet_ps: Time,
    /// 8e12 / copy rate: ps per byte copied (0: free).
    ps_per_byte: f64,
    /// When it has finished the packets given to it so far.
    free_at: Time,
    /// Time it spent on packets, ps.
    pub busy_ps: Time,
}

impl Cpu {
    fn cost(&self, size: u32) -> Time {
        self.per_packet_ps + (size as f64 * self.ps_per_byte).round() as Time
    }

    /// Takes a packet of `size` bytes at `now`: returns when it is done with it, and what the
    /// packet cost.
    fn take(&mut self, now: Time, size: u32) -> (Time, Time) {
        let start = self.free_at.max(now);
        let cost = self.cost(size);
        self.free_at = start + cost;
        self.busy_ps += cost;
        (self.free_at, cost)
    }
}

pub(crate) struct SwitchState {
    /// The program a test installed (plain forwarding by default).
    pub program: Box<dyn SwitchProgram>,
    /// The INA programs the jobs' schemes installed; when present they run instead of
    /// `program`.
    pub ina: Option<Programs>,
    /// Processing capacity (GRID): packets are processed one after another at this rate.
    pub capacity_bps: Option<u64>,
    proc_busy: Time,
    /// What its processing stage has not finished yet: (when it is done, out port, the
    /// switch's epoch then, the packet), in processing order. It joins the egress queue when
    /// done, so an egress queue holds, and is charged, only what was processed.
    processing: std::collections::VecDeque<(Time, PortId, u16, Packet)>,
    pub rx_packets: u64,
    /// Packets the program consumed into a sum, and those it discarded otherwise.
    pub absorbed: u64,
    pub drops_program: u64,
    pub drops_no_route: u64,
    /// Packets adaptive routing sent off their default port (reported under adaptive routing).
    pub rerouted: u64,
    /// Packets refused by a full processing queue (`capacity_bps`).
    pub drops_processing: u64,
    /// INA packets from a host port for a job that host is not part of (admission filtering,
    /// as the UDP switch does).
    pub drops_unadmitted: u64,
    /// Aggregators jobs still held when they ended, freed by their release.
    pub aggregators_released: u32,
    /// Host-facing port -> the jobs admitted on it (hosts that are a job's workers or servers).
    pub admitted: std::collections::HashMap<PortId, Vec<u32>>,
    pub agg_peak: u32,
    pub agg_series: Vec<(u32, u32)>,
    /// Packets that arrived while it was failed or were queued in it when it failed.
    pub drops_node_failed: u64,
    /// Packets it sent into a failed link, or that were on its outgoing links when they failed.
    pub drops_link_failed: u64,
    /// Times it came back from a failure with a fresh program.
    pub restarts: u64,
    /// Counters of the program instances that failures replaced, so totals survive restarts.
    pub carried: std::collections::BTreeMap<&'static str, u64>,
    /// Bumped at each failure: timers set before are stale.
    epoch: u16,
}

impl SwitchState {
    /// The program that handles this switch's packets.
    pub(crate) fn active(&mut self) -> &mut dyn SwitchProgram {
        match &mut self.ina {
            Some(p) => p,
            None => self.program.as_mut(),
        }
    }
    pub(crate) fn active_ref(&self) -> &dyn SwitchProgram {
        match &self.ina {
            Some(p) => p,
            None => self.program.as_ref(),
        }
    }
}

struct FixedPath {
    nodes: Vec<NodeId>,
    /// `ports[i]`: egress port of `nodes[i]` toward `nodes[i + 1]`.
    ports: Vec<PortId>,
}

/// `Packet::path` ids at or above this name a multicast tree (`trees[id - TREE_BASE]`).
const TREE_BASE: u32 = 1 << 31;

/// A multicast tree: each node's children as (egress port, child).
type Tree = std::collections::HashMap<NodeId, Vec<(PortId, NodeId)>>;

/// The simulator: one world of nodes, wires and workloads, advanced event by event. Split by
/// concern; the event loop (`run`, `handle`) only dispatches to them.
pub struct Sim {
    pub(crate) now: Time,
    pub(crate) q: EventQueue,
    /// Where everything is and how packets are routed.
    pub(crate) fabric: Fabric,
    /// The ports' queues, the wires and lossless mode.
    pub(crate) queues: Queues,
    /// Switches with their programs, hosts with their endpoints.
    pub(crate) nodes: Nodes,
    /// The run's own random stream (loss draws, adaptive routing's ties).
    rng: Xoshiro256PlusPlus,
    pub(crate) cons: Conservation,
    pub(crate) wl: Workloads,
    /// What the run is, how far it got and why it stopped.
    pub(crate) state: RunState,
    /// Scheduled failures and what is down now.
    faults: Faults,
    /// `--pcap`'s files; `None` (the usual case) costs one branch per packet on a wire.
    pub(crate) capture: Option<Box<crate::capture::Capture>>,
}

/// What the run is, how far it got and why it stopped.
pub(crate) struct RunState {
    pub(crate) name: String,
    pub(crate) seed: u64,
    /// Payload mode's values (`None`: metadata mode).
    pub(crate) payload: Option<crate::spec::PayloadValues>,
    pub(crate) stop: Time,
    /// Time the run goes on after the last job and flow finished.
    linger: Time,
    /// Every job and flow finished (the run may linger).
    completed: bool,
    pub(crate) bin: Time,
    pub(crate) events: u64,
    pub(crate) done: bool,
    pub(crate) wall_s: f64,
    pub(crate) stopped_by: &'static str,
    /// Whether `wl` is out, handling a call; calls the world makes meanwhile (an endpoint
    /// reporting during a `submit`) wait here and follow at once.
    wl_busy: bool,
    deferred: std::collections::VecDeque<Call>,
}

/// Where everything is and how packets are routed.
pub(crate) struct Fabric {
    pub(crate) topo: Topology,
    routes: Routes,
    pub(crate) routing: Routing,
    default_port: DefaultPort,
    /// Fixed paths (`Packet::path` ids below `TREE_BASE`).
    paths: Vec<FixedPath>,
    /// Multicast trees (ids from `TREE_BASE`).
    trees: Vec<Tree>,
}

/// Every port's egress queue and the wires they feed.
pub(crate) struct Queues {
    buffer: u64,
    ecn_threshold: u64,
    /// Each node's first port's index in `ports`.
    port_base: Vec<u32>,
    pub(crate) ports: Vec<PortState>,
    wires: Wires,
    /// Lossless mode's state (`network.flow_control = "pfc"`); `None`: drop-tail.
    pfc: Option<Box<Pfc>>,
    /// The global port through which the packet a switch program is handling came in
    /// (`NO_INGRESS` while a timer runs): PFC charges what the program sends to it. A field
    /// rather than an argument of `apply_actions` and `egress`, which cost drop-tail 0.3 %.
    ingress: u32,
}

/// Switches with their programs, hosts with their endpoints.
pub(crate) struct Nodes {
    pub(crate) switches: Vec<SwitchState>,
    pub(crate) hosts: Vec<HostState>,
    /// A switch program's actions, reused from packet to packet.
    actions: Vec<SwitchAction>,
}

/// Scheduled failures and what is down now.
struct Faults {
    failures: Vec<Failure>,
    live: Liveness,
    /// The spec, kept to plan a recovering switch's programs again (only with failures).
    restart_spec: Option<Box<SimSpec>>,
    /// Jobs released so far, released again at a restarted switch's fresh programs.
    released: Vec<u32>,
}

struct Ctx<'a> {
    node: NodeId,
    now: Time,
    ports: &'a [PortState],
    /// Under PFC the packets waiting at a port are not in `ports`' backlog; `base` is the
    /// node's first global port.
    pfc: Option<&'a Pfc>,
    base: usize,
    topo: &'a Topology,
    routes: &'a Routes,
    live: &'a Liveness,
    /// The network's routing, for programs that route by it (`route_toward`).
    default_port: DefaultPort,
    /// Adaptive routing's queue limit in bytes; None under ECMP.
    reroute_above: Option<f64>,
}

impl SwitchCtx for Ctx<'_> {
    fn node(&self) -> NodeId {
        self.node
    }
    fn num_ports(&self) -> usize {
        self.ports.len()
    }
    fn queue_bytes(&self, port: PortId) -> u64 {
        let in_service = self.ports[port as usize].backlog(self.now);
        match self.pfc {
            Some(pfc) => in_service + pfc.waiting(self.base + port as usize),
            None => in_service,
        }
    }
    fn peer(&self, port: PortId) -> NodeId {
        self.ports[port as usize].peer
    }
    fn next_hops(&self, dst: NodeId) -> &[PortId] {
        if dst as usize >= self.topo.nodes.len() {
            return &[];
        }
        self.live.next_hops(self.routes, self.node, dst)
    }
    fn faces_up(&self, port: PortId) -> bool {
        let peer = self.ports[port as usize].peer;
        self.topo.nodes[peer as usize].tier > self.topo.nodes[self.node as usize].tier
    }
    fn route_toward(&self, dst: NodeId) -> Option<(PortId, bool)> {
        let hops = self.next_hops(dst);
        if hops.is_empty() {
            return None;
        }
        let default = self.default_port.pick_by_destination(hops, dst);
        let port = match self.reroute_above {
            None => default,
            Some(limit) => adaptive_pick(default, hops, limit, |p| self.queue_bytes(p))?,
        };
        Some((port, port != default))
    }
}

/// Adaptive routing's choice: the flow's `default` port unless its queue `q` exceeds `limit`
/// bytes, then the least queued of `hops`.
#[inline(always)]
fn adaptive_pick(default: PortId, hops: &[PortId], limit: f64, q: impl Fn(PortId) -> u64) -> Option<PortId> {
    if (q(default) as f64) <= limit {
        Some(default)
    } else {
        hops.iter().copied().min_by_key(|&p| q(p))
    }
}

/// Every node's ports, in node order, and each node's first port's index, with
/// `network.link_loss` applied.
fn build_ports(topo: &Topology, net: &crate::spec::NetSpec) -> Result<(Vec<u32>, Vec<PortState>), SimError> {
    let mut port_base = Vec::with_capacity(topo.nodes.len());
    let mut ports = Vec::new();
    for node in &topo.nodes {
        port_base.push(ports.len() as u32);
        for p in &node.ports {
            let l = &topo.links[p.link as usize];
            ports.push(PortState {
                peer: p.peer,
                peer_port: p.peer_port,
                link: p.link,
                rate_bps: l.rate_bps,
                delay_ps: l.delay_ps,
                busy_until: 0,
                loss: 0.0,
                stats: Default::default(),
            });
        }
    }
    for (i, ll) in net.link_loss.iter().enumerate() {
        let field = format!("network.link_loss[{i}]");
        let p = check_prob(format!("{field}.prob"), ll.prob)?;
        let (a, b) = match (topo.find(&ll.a), topo.find(&ll.b)) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(SimError::new(field, format!("no link between {:?} and {:?}: unknown node", ll.a, ll.b))),
        };
        let (pa, pb) = match (topo.port_to(a, b), topo.port_to(b, a)) {
            (Some(pa), Some(pb)) => (pa, pb),
            _ => return Err(SimError::new(field, format!("{:?} and {:?} are not adjacent", ll.a, ll.b))),
        };
        ports[(port_base[a as usize] + pa as u32) as usize].loss = p;
        ports[(port_base[b as usize] + pb as u32) as usize].loss = p;
    }
    Ok((port_base, ports))
}

/// Every host's state, with `network.host_loss` and `network.host_costs` applied.
fn build_hosts(topo: &Topology, spec: &SimSpec) -> Result<Vec<HostState>, SimError> {
    let net = &spec.network;
    let mut hosts: Vec<HostState> = (0..topo.hosts).map(|_| HostState::default()).collect();
    for (i, hl) in net.host_loss.iter().enumerate() {
        let p = check_prob(format!("network.host_loss[{i}].prob"), hl.prob)?;
        let h = host_named(&topo, format!("network.host_loss[{i}].host"), &hl.host)?;
        hosts[h as usize].loss = p;
    }
    for (i, hc) in net.host_costs.iter().enumerate() {
        if !(hc.copy_bps.is_finite() && hc.copy_bps >= 0.0) {
            return Err(SimError::new(format!("network.host_costs[{i}].copy_bps"), format!("must be a rate >= 0 bits/s (0: free), got {}", hc.copy_bps)));
        }
        let role = |f: fn(&crate::spec::JobSpec) -> &Vec<String>| -> Vec<NodeId> {
            spec.jobs.iter().flat_map(f).filter_map(|n| topo.find(n)).collect()
        };
        let selected: Vec<NodeId> = match hc.hosts.as_str() {
            "all" => (0..topo.hosts).collect(),
            "workers" => role(|j| &j.workers),
            "servers" => role(|j| &j.servers),
            name => vec![host_named(&topo, format!("network.host_costs[{i}].hosts"), name)
                .map_err(|e| SimError::new(e.field, format!("{}; or one of \"all\", \"workers\", \"servers\"", e.message)))?],
        };
        let ps_per_byte = if hc.copy_bps > 0.0 { 8e12 / hc.copy_bps } else { 0.0 };
        for h in selected {
            hosts[h as usize].cpu = (hc.per_packet_ps > 0 || ps_per_byte > 0.0).then_some(Cpu { per_packet_ps: hc.per_packet_ps, ps_per_byte, ..Cpu::default() });
        }
    }
    Ok(hosts)
}

/// Every switch's state, forwarding plain L3 until the workloads install programs, with
/// `network.switch_capacity` applied and `network.switch_memory` checked.
fn build_switches(topo: &Topology, net: &crate::spec::NetSpec) -> Result<Vec<SwitchState>, SimError> {
    let switch_id = |field: String, name: &str| -> Result<NodeId, SimError> {
        match topo.find(name) {
            Some(n) if !topo.is_host(n) => Ok(n),
            _ => Err(SimError::new(field, format!("no switch named {name:?}"))),
        }
    };
    let mut switches: Vec<SwitchState> = topo
        .switches()
        .map(|_| SwitchState {
            program: Box::new(inalab_switch::L3Forward),
            ina: None,
            capacity_bps: None,
            proc_busy: 0,
            processing: Default::default(),
            rx_packets: 0,
            absorbed: 0,
            drops_program: 0,
            drops_no_route: 0,
            rerouted: 0,
            drops_processing: 0,
            drops_unadmitted: 0,
            aggregators_released: 0,
            admitted: std::collections::HashMap::new(),
            agg_peak: 0,
            agg_series: vec![],
            drops_node_failed: 0,
            drops_link_failed: 0,
            restarts: 0,
            carried: Default::default(),
            epoch: 0,
        })
        .collect();
    for (i, sc) in net.switch_capacity.iter().enumerate() {
        let s = switch_id(format!("network.switch_capacity[{i}].switch"), &sc.switch)?;
        if sc.value == 0 {
            return Err(SimError::new(format!("network.switch_capacity[{i}].value"), "must be a positive rate"));
        }
        switches[(s - topo.hosts) as usize].capacity_bps = Some(sc.value);
    }
    for (i, sm) in net.switch_memory.iter().enumerate() {
        // Memory budgets are read when INA programs are installed (workload setup).
        switch_id(format!("network.switch_memory[{i}].switch"), &sm.switch)?;
    }
    Ok(switches)
}

/// Lossless mode's state for `network.flow_control` (`None`: drop-tail).
fn flow_control(topo: &Topology, net: &crate::spec::NetSpec) -> Result<Option<Box<Pfc>>, SimError> {
    let mode = match net.flow_control {
        FlowControl::DropTail => None,
        FlowControl::Pfc { xoff_bytes, xon_bytes } => {
            if xoff_bytes == 0 {
                return Err(SimError::new("network.flow_control.xoff_bytes", "must be a positive size"));
            }
            if xon_bytes > xoff_bytes {
                return Err(SimError::new("network.flow_control.xon_bytes", format!("must be at most xoff_bytes ({xoff_bytes} B), got {xon_bytes} B")));
            }
            Some(Mode::Pause { xoff: xoff_bytes, xon: xon_bytes })
        }
        FlowControl::Credit { buffer_bytes } => {
            // Credits travel as u32 (an event stays 16 bytes).
            if buffer_bytes == 0 || buffer_bytes > u32::MAX as u64 {
                return Err(SimError::new("network.flow_control.buffer_bytes", format!("must be a size from 1 B to 4 GiB, got {buffer_bytes} B")));
            }
            Some(Mode::Credit { buffer: buffer_bytes })
        }
    };
    let pfc = mode.map(|mode| {
        let node_of_port = topo.nodes.iter().enumerate().flat_map(|(n, node)| std::iter::repeat_n(n as NodeId, node.ports.len())).collect();
        Box::new(Pfc::new(mode, node_of_port))
    });
    Ok(pfc)
}

fn check_prob(field: String, p: f64) -> Result<f64, SimError> {
    if !(0.0..=1.0).contains(&p) {
        return Err(SimError::new(field, format!("must be a probability in [0, 1], got {p}")));
    }
    Ok(p)
}

impl Sim {
    pub fn new(spec: &SimSpec) -> Result<Sim, SimError> {
        let topo = inalab_topo::build(&spec.topology)?;
        let routes = Routes::compute(&topo);
        let net = &spec.network;
        if let Routing::Adaptive { threshold } = net.routing {
            if !(0.0..=1.0).contains(&threshold) {
                return Err(SimError::new("network.adaptive_threshold", format!("must be a fraction in [0, 1], got {threshold}")));
            }
        }
        if spec.metrics.bin_ps == 0 {
            return Err(SimError::new("metrics.bin", "must be a positive duration"));
        }
        let (port_base, ports) = build_ports(&topo, net)?;
        let hosts = build_hosts(&topo, spec)?;
        let switches = build_switches(&topo, net)?;
        let pfc = flow_control(&topo, net)?;
        let failures = crate::failures::resolve(&spec.failures, &topo)?;
        let live = Liveness::new(&topo, ports.len(), !failures.is_empty());
        let first_switch = topo.hosts;
        let capture = match &spec.capture {
            Some(c) => Some(Box::new(crate::capture::Capture::new(c, &topo, &port_base, &ports)?)),
            None => None,
        };
        let restart_spec = failures.iter().any(|f| matches!(f.target, Target::Node(n) if n >= first_switch)).then(|| Box::new(spec.clone()));
        let mut sim = Sim {
            now: 0,
            q: EventQueue::default(),
            fabric: Fabric { topo, routes, routing: net.routing, default_port: net.default_port, paths: vec![], trees: vec![] },
            queues: Queues {
                buffer: net.buffer_bytes,
                ecn_threshold: net.ecn_threshold_bytes,
                port_base,
                wires: Wires::new(ports.len()),
                pfc,
                ingress: NO_INGRESS,
                ports,
            },
            nodes: Nodes { switches, hosts, actions: Vec::new() },
            rng: Xoshiro256PlusPlus::seed_from_u64(spec.seed),
            cons: Conservation::default(),
            wl: Workloads::default(),
            state: RunState {
                name: spec.name.clone(),
                seed: spec.seed,
                payload: spec.payload.then_some(spec.payload_values),
                stop: spec.stop_ps,
                linger: spec.linger_ps,
                completed: false,
                bin: spec.metrics.bin_ps,
                events: 0,
                done: false,
                wall_s: 0.0,
                stopped_by: "stop_time",
                wl_busy: false,
                deferred: std::collections::VecDeque::new(),
            },
            faults: Faults { failures, live, restart_spec, released: vec![] },
            capture,
        };
        // Queued before the workloads' events, so a failure at t wins over work starting at t.
        for (i, f) in sim.faults.failures.iter().enumerate() {
            sim.q.push(f.at, Ev::Fail { idx: i as u32 });
            if let Some(until) = f.until {
                sim.q.push(until, Ev::Recover { idx: i as u32 });
            }
        }
        let mut wl = Workloads::default();
        wl.set_up(spec, &mut sim)?;
        sim.wl = wl;
        Ok(sim)
    }

    /// Runs until every job and flow has ended, the queue drains, `stop` is reached, or
    /// `progress` asks it to stop.
    pub fn run(&mut self, mut progress: Option<Progress<'_>>) {
        let wall = Instant::now();
        let mut last_report = Instant::now();
        self.call_workloads(Call::Start);
        while !self.state.done {
            let Some(t) = self.q.peek_time() else {
                self.state.stopped_by = if self.state.completed { "work_ended" } else { "idle" };
                break;
            };
            if t > self.state.stop {
                self.now = self.state.stop;
                self.state.stopped_by = if self.state.completed { "work_ended" } else { "stop_time" };
                break;
            }
            let (t, ev) = self.q.pop().expect("peeked");
            self.now = t;
            self.state.events += 1;
            self.handle(ev);
            // The clock is read once per 16 Ki events (well under a millisecond of work).
            if self.state.events & 0x3fff == 0 {
                if let Some(cb) = progress.as_mut() {
                    if last_report.elapsed().as_millis() >= crate::REPORT_EVERY_MS {
                        last_report = Instant::now();
                        if cb(&self.report(self.wl.fraction_done(self.now, self.state.stop))).is_break() {
                            self.state.stopped_by = "interrupted";
                            break;
                        }
                    }
                }
            }
        }
        if let Some(cb) = progress.as_mut() {
            let _ = cb(&self.report(if self.state.stopped_by == "interrupted" { self.wl.fraction_done(self.now, self.state.stop) } else { 1.0 }));
        }
        self.state.wall_s = wall.elapsed().as_secs_f64();
    }

    fn report(&self, fraction: f64) -> crate::ProgressReport {
        crate::ProgressReport { fraction, events: self.state.events, sim_time_s: inalab_core::time::to_secs(self.now) }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Arrive { port } => {
                let ((), pkt, next) = self.queues.wires.pop(port as usize).expect("a packet on the wire");
                if let Some(next) = next {
                    self.q.push(next, Ev::Arrive { port });
                }
                if self.faults.live.any {
                    if let Some((at, why)) = self.faults.live.doomed(port as usize, self.now) {
                        return self.failure_drop(at, why, &pkt);
                    }
                }
                let p = &self.queues.ports[port as usize];
                let (node, in_port) = (p.peer, p.peer_port);
                if self.fabric.topo.is_host(node) {
                    self.host_rx(node, pkt)
                } else {
                    self.switch_rx(node, in_port, pkt)
                }
            }
            Ev::CpuRx { host } => {
                // A host that failed meanwhile got the packet and never handled it.
                let pkt = self.nodes.hosts[host as usize].rx_wait.pop_front().expect("a packet waits for each CpuRx");
                if !self.faults.live.node_is_down(host) {
                    self.deliver(host, pkt);
                }
            }
            Ev::NicFree { host } => {
                if self.faults.live.node_is_down(host) {
                    return; // a failed host sends nothing again
                }
                self.nodes.hosts[host as usize].nic_busy = false;
                self.try_transmit(host);
            }
            Ev::TxDone { port } => self.pfc_tx_done(port as usize),
            Ev::PortReady { port } => self.pfc_port_ready(port as usize),
            Ev::Pause { port, gen, on } => self.pfc_frame(port as usize, gen, on),
            Ev::Credit { port, gen, bytes } => self.credit_back(port as usize, gen, bytes),
            Ev::Local { host } => self.local_delivery(host),
            Ev::HostTimer { host, ep } => self.host_timer(host, ep),
            Ev::SwitchTimer { switch, token, epoch } => self.switch_timer(switch, token, epoch),
            Ev::Processed { switch } => self.processed(switch),
            Ev::Fail { idx } => self.set_failed(idx as usize, true),
            Ev::Recover { idx } => self.set_failed(idx as usize, false),
            Ev::PeerFailed { .. } | Ev::ComputeDone { .. } | Ev::JobStart { .. } | Ev::FlowStart { .. } | Ev::Background { .. } => self.call_workloads(Call::Event(ev)),
        }
    }

    /// Delivers what a host sent to itself (or loses it with the host).
    fn local_delivery(&mut self, host: NodeId) {
        if self.faults.live.node_is_down(host) {
            // Sent and never delivered: lost with the host.
            for pkt in std::mem::take(&mut self.nodes.hosts[host as usize].local) {
                self.failure_drop(host, Why::NodeFailed, &pkt);
            }
            return;
        }
        while let Some(pkt) = self.nodes.hosts[host as usize].local.pop_front() {
            self.cons.delivered_packets += 1;
            self.cons.delivered_bytes += pkt.size as u64;
            self.deliver(host, pkt);
        }
    }

    /// An endpoint's timer fired, unless the host failed or the timer was re-armed.
    fn host_timer(&mut self, host: NodeId, ep: u16) {
        if self.faults.live.node_is_down(host) {
            return;
        }
        let e = &mut self.nodes.hosts[host as usize].eps[ep as usize];
        if e.timer_armed != Some(self.now) {
            return; // superseded by an earlier arming
        }
        e.timer_armed = None;
        if e.proto.poll_timeout().is_some_and(|t| t <= self.now) {
            e.proto.handle_timeout(self.now);
        }
        self.service(host, ep);
    }

    /// A switch program's timer fired, unless the switch failed since it was set.
    fn switch_timer(&mut self, switch: NodeId, token: inalab_core::TimerToken, epoch: u16) {
        let si = (switch - self.fabric.topo.hosts) as usize;
        if epoch != self.nodes.switches[si].epoch || self.faults.live.node_is_down(switch) {
            return; // set before a failure: that program state is gone
        }
        let mut out = std::mem::take(&mut self.nodes.actions);
        let base = self.queues.port_base[switch as usize] as usize;
        let n = self.fabric.topo.nodes[switch as usize].ports.len();
        let ctx = Ctx { node: switch, now: self.now, ports: &self.queues.ports[base..base + n], pfc: self.queues.pfc.as_deref(), base, topo: &self.fabric.topo, routes: &self.fabric.routes, live: &self.faults.live, default_port: self.fabric.default_port, reroute_above: self.reroute_above() };
        self.nodes.switches[si].active().on_timer(self.now, &ctx, token, &mut out);
        self.queues.ingress = NO_INGRESS;
        self.apply_actions(switch, self.now, 0, &mut out);
        self.nodes.actions = out;
    }

    // ---- failures ----------------------------------------------------------------------

    /// Failure `idx` starts (`down`) or ends. Overlapping windows of one target count: it is
    /// down while any is in force.
    fn set_failed(&mut self, idx: usize, down: bool) {
        let target = self.faults.failures[idx].target;
        if !self.faults.live.set(target, down) {
            return;
        }
        let now = self.now;
        match target {
            // A host stops: the checks on its events do the rest; its jobs hear of it later.
            Target::Node(h) if self.fabric.topo.is_host(h) => {
                self.nodes.hosts[h as usize].failed_at = Some(now);
                self.q.push(now + self.faults.failures[idx].detect, Ev::PeerFailed { host: h, at: now });
            }
            Target::Node(n) => {
                let si = (n - self.fabric.topo.hosts) as usize;
                if down {
                    // Its timers die with it; what it queued is lost, what already left is not.
                    let sw = &mut self.nodes.switches[si];
                    sw.epoch = sw.epoch.wrapping_add(1);
                    let base = self.queues.port_base[n as usize] as usize;
                    for pi in base..base + self.fabric.topo.nodes[n as usize].ports.len() {
                        let p = &self.queues.ports[pi];
                        self.faults.live.doom(pi, now + p.delay_ps, p.busy_until + p.delay_ps, n, Why::NodeFailed);
                    }
                    // Its soft state is gone at once (a dead switch holds no aggregator).
                    self.reset_programs(n);
                } else {
                    self.nodes.switches[si].restarts += 1;
                }
            }
            Target::Link(l) => {
                if down {
                    // Everything on the link either way is lost, serializing or propagating.
                    let link = &self.fabric.topo.links[l as usize];
                    for (a, b) in [(link.a, link.b), (link.b, link.a)] {
                        let pi = (self.queues.port_base[a as usize] + self.fabric.topo.port_to(a, b).expect("a link's ends are adjacent") as u32) as usize;
                        let p = &self.queues.ports[pi];
                        self.faults.live.doom(pi, now, p.busy_until + p.delay_ps, a, Why::LinkFailed);
                    }
                }
            }
        }
        self.faults.live.recompute(&self.fabric.topo, &self.fabric.routes, &self.queues.port_base);
        if let Some(pfc) = &self.queues.pfc {
            if down || pfc.credit().is_some() {
                self.pfc_failed(target);
            }
        }
    }

    /// A failing switch loses its INA programs' state: it gets fresh programs (empty soft
    /// state) with the jobs' admissions, planned again exactly as at set-up, which it runs when
    /// it comes back; jobs that ended are released. A switch without INA programs keeps its
    /// own: plain forwarding has no state, and a program a test installed with `set_program`
    /// cannot be re-created here.
    fn reset_programs(&mut self, switch: NodeId) {
        let si = (switch - self.fabric.topo.hosts) as usize;
        if self.nodes.switches[si].ina.is_none() {
            return;
        }
        let spec = self.faults.restart_spec.as_ref().expect("kept for switch failures");
        let mut setup = crate::setup::set_up_jobs(spec, &self.fabric.topo).expect("the spec was planned once at set-up");
        let mut fresh = setup.programs.remove(&switch).unwrap_or_default();
        for &job in &self.faults.released {
            fresh.release(job);
        }
        let sw = &mut self.nodes.switches[si];
        for (k, v) in sw.active_ref().counters() {
            *sw.carried.entry(k).or_insert(0) += v;
        }
        sw.ina = Some(fresh);
    }

    /// Counts a packet lost to a failure at `node`, the switch that failed or the sender on
    /// a failed link.
    fn failure_drop(&mut self, node: NodeId, why: Why, pkt: &Packet) {
        if self.fabric.topo.is_host(node) {
            let h = &mut self.nodes.hosts[node as usize];
            match why {
                Why::NodeFailed => h.drops_host_failed += 1,
                Why::LinkFailed => h.drops_link_failed += 1,
            }
        } else {
            let sw = &mut self.nodes.switches[(node - self.fabric.topo.hosts) as usize];
            match why {
                Why::NodeFailed => sw.drops_node_failed += 1,
                Why::LinkFailed => sw.drops_link_failed += 1,
            }
        }
        self.dropped(pkt);
    }

    /// Replaces a switch's program (the INA designs install theirs through this).
    pub fn set_program(&mut self, switch: NodeId, program: Box<dyn SwitchProgram>) {
        self.nodes.switches[(switch - self.fabric.topo.hosts) as usize].program = program;
    }

    /// Installs the INA programs the jobs' schemes need on a switch.
    pub(crate) fn install_ina(&mut self, switch: NodeId, programs: Programs) {
        self.nodes.switches[(switch - self.fabric.topo.hosts) as usize].ina = Some(programs);
    }

    /// Admits `job` on the port of `host`'s switch that faces it.
    pub(crate) fn admit_host(&mut self, host: NodeId, job: u32) {
        let tor = self.fabric.topo.host_switch(host);
        let port = self.fabric.topo.port_to(tor, host).expect("a host's switch faces it");
        let jobs = self.nodes.switches[(tor - self.fabric.topo.hosts) as usize].admitted.entry(port).or_default();
        if !jobs.contains(&job) {
            jobs.push(job);
        }
    }

    /// Adds a protocol endpoint that no workload owns (its events are ignored) and lets it
    /// send: for tests that need a sender of their own, a rogue one for instance.
    pub fn add_host_protocol(&mut self, host: NodeId, proto: Box<dyn HostProtocol>) -> u16 {
        let ep = self.add_endpoint(host, proto, Owner::Background);
        self.service(host, ep);
        ep
    }

    pub fn topology(&self) -> &Topology {
        &self.fabric.topo
    }

    /// Installs a fixed path (nodes from a host to a host) and returns its id for `Packet::path`.
    pub(crate) fn install_path(&mut self, field: &str, nodes: &[NodeId]) -> Result<u32, SimError> {
        let topo = &self.fabric.topo;
        if nodes.len() < 2 || !topo.is_host(nodes[0]) || !topo.is_host(*nodes.last().unwrap()) {
            return Err(SimError::new(field, "a path lists node names from a host to a host"));
        }
        let ports = nodes.windows(2).map(|w| self.port_between(field, "are not adjacent", w[0], w[1])).collect::<Result<_, _>>()?;
        self.fabric.paths.push(FixedPath { nodes: nodes.to_vec(), ports });
        Ok((self.fabric.paths.len() - 1) as u32)
    }

    /// The port of `from` toward its neighbour `to`; `why` the error's words when they are not
    /// adjacent.
    fn port_between(&self, field: &str, why: &str, from: NodeId, to: NodeId) -> Result<PortId, SimError> {
        let topo = &self.fabric.topo;
        topo.port_to(from, to).ok_or_else(|| SimError::new(field, format!("{:?} and {:?} {why}", topo.nodes[from as usize].name, topo.nodes[to as usize].name)))
    }

    pub(crate) fn set_endpoint_path(&mut self, host: NodeId, ep: u16, path: u32) {
        self.nodes.hosts[host as usize].eps[ep as usize].path = path;
    }

    /// Installs a multicast tree (each node's children, in the order copies leave in) for an
    /// endpoint's packets to `GROUP`.
    pub(crate) fn install_tree(&mut self, field: &str, host: NodeId, ep: u16, tree: &inalab_scheme::PlanTree) -> Result<(), SimError> {
        let mut ports = Tree::new();
        for (&p, children) in &tree.children {
            let hops = children.iter().map(|&c| Ok((self.port_between(field, "are not linked (a multicast tree edge)", p, c)?, c))).collect::<Result<_, SimError>>()?;
            ports.insert(p, hops);
        }
        self.fabric.trees.push(ports);
        self.nodes.hosts[host as usize].eps[ep as usize].tree = TREE_BASE + (self.fabric.trees.len() - 1) as u32;
        Ok(())
    }

    // ---- hosts -------------------------------------------------------------------------

    pub(crate) fn add_endpoint(&mut self, host: NodeId, proto: Box<dyn HostProtocol>, owner: Owner) -> u16 {
        let port = proto.endpoint().port;
        let h = &mut self.nodes.hosts[host as usize];
        h.eps.push(Endpoint { proto, port, owner, path: NO_PATH, tree: NO_PATH, timer_armed: None });
        (h.eps.len() - 1) as u16
    }

    /// Hands an application request to an endpoint and carries out what follows.
    pub(crate) fn submit(&mut self, host: NodeId, ep: u16, req: AppRequest) {
        if self.faults.live.node_is_down(host) {
            return;
        }
        self.nodes.hosts[host as usize].eps[ep as usize].proto.submit(self.now, req);
        self.service(host, ep);
    }

    /// After any input to an endpoint: deliver its events, re-arm its timer, feed the NIC.
    fn service(&mut self, host: NodeId, ep: u16) {
        self.drain(host, ep);
        self.try_transmit(host);
    }

    /// Delivers an endpoint's events to its owner and (re-)arms its timer. Needed after every
    /// call into the protocol, `poll_transmit` included (sending arms retransmission timers).
    fn drain(&mut self, host: NodeId, ep: u16) {
        loop {
            let e = &mut self.nodes.hosts[host as usize].eps[ep as usize];
            let Some(ev) = e.proto.poll_event() else { break };
            let owner = e.owner;
            self.on_host_event(host, owner, ev);
        }
        self.arm(host, ep);
    }

    /// (Re-)arms an endpoint's timer at its `poll_timeout`, if that is earlier than the one
    /// armed.
    #[inline]
    fn arm(&mut self, host: NodeId, ep: u16) {
        let now = self.now;
        let e = &mut self.nodes.hosts[host as usize].eps[ep as usize];
        if let Some(t) = e.proto.poll_timeout() {
            let at = t.max(now);
            if e.timer_armed.is_none_or(|a| at < a) {
                e.timer_armed = Some(at);
                self.q.push(at, Ev::HostTimer { host, ep });
            }
        }
    }

    fn on_host_event(&mut self, host: NodeId, owner: Owner, ev: HostEvent) {
        self.call_workloads(Call::Host { host, owner, ev });
    }

    /// Hands a call to the workloads. A call made while they handle another (a protocol
    /// reporting during their `submit`) is queued and handled right after.
    fn call_workloads(&mut self, call: Call) {
        if self.state.wl_busy {
            return self.state.deferred.push_back(call);
        }
        let mut wl = std::mem::take(&mut self.wl);
        self.state.wl_busy = true;
        wl.call(call, self);
        while let Some(next) = self.state.deferred.pop_front() {
            wl.call(next, self);
        }
        self.state.wl_busy = false;
        self.wl = wl;
    }

    /// If the host's NIC is idle, takes the next packet from its endpoints (round robin).
    fn try_transmit(&mut self, host: NodeId) {
        loop {
            let now = self.now;
            let h = &mut self.nodes.hosts[host as usize];
            // A paused NIC takes no packet; the RESUME calls here again.
            if h.nic_busy || h.nic_paused || h.eps.is_empty() {
                return;
            }
            let n = h.eps.len();
            let mut got = None;
            for k in 0..n {
                let i = (h.rr + k) % n;
                if let Some(p) = h.eps[i].proto.poll_transmit(now) {
                    h.rr = (i + 1) % n;
                    got = Some((i as u16, p));
                    break;
                }
            }
            let Some((ep, mut pkt)) = got else {
                // A protocol may have taken a step without a packet to show for it (a noise
                // layer holding the packet it drew): its timer must follow.
                for i in 0..n {
                    self.arm(host, i as u16);
                }
                return;
            };
            if pkt.dst == GROUP {
                pkt.path = self.nodes.hosts[host as usize].eps[ep as usize].tree;
            } else if pkt.path == NO_PATH {
                pkt.path = self.nodes.hosts[host as usize].eps[ep as usize].path;
            }
            // Co-located endpoints (a BytePS server beside its worker) talk through host
            // memory, not the NIC. An INA protocol's packet always crosses the network, even to
            // a PS on its sender's host (the Rina paper's testbed co-locates ATP's PS with a
            // worker): it exists to meet the switch, and a kernel-bypass stack sends it out.
            let local = pkt.dst == host && matches!(pkt.header, inalab_core::wire::Header::Transport(_) | inalab_core::wire::Header::Raw);
            // Mark the NIC busy first: what `drain` triggers may call back into this host.
            self.nodes.hosts[host as usize].nic_busy = !local;
            self.drain(host, ep);
            self.cons.sent_packets += 1;
            self.cons.sent_bytes += pkt.size as u64;
            if local {
                let local = &mut self.nodes.hosts[host as usize].local;
                if local.is_empty() {
                    self.q.push(self.now, Ev::Local { host });
                }
                local.push_back(pkt);
                continue;
            }
            // Credits: a NIC without them holds the packet (and stays busy) until they come.
            if self.queues.pfc.as_ref().is_some_and(|p| p.credit().is_some()) {
                match self.credit_nic(host, pkt) {
                    Some(p) => pkt = p,
                    None => return,
                }
            }
            return self.nic_send(host, pkt);
        }
    }

    /// The NIC puts `pkt` on its link (a busy NIC's next poll comes with its `NicFree`).
    fn nic_send(&mut self, host: NodeId, mut pkt: Packet) {
        let now = self.now;
        pkt.hop = 0;
        let pi = self.queues.port_base[host as usize] as usize;
        // A failed link loses the packet anyway: no loss is drawn for it.
        let down = self.faults.live.link_is_down(self.queues.ports[pi].link);
        let lost = !down && (self.draw(self.nodes.hosts[host as usize].loss) || self.draw(self.queues.ports[pi].loss));
        let size = pkt.size;
        // A CPU with a cost prepares the packet first; the NIC starts it when both are done.
        let cpu = self.nodes.hosts[host as usize].cpu.as_mut();
        let (ready, cost) = cpu.map_or((now, 0), |c| c.take(now, size));
        match self.queues.ports[pi].enqueue(now, ready, size, None, 0, lost, self.state.bin) {
            // The NIC still serializes into a failed link, so a sender is not sped up.
            Enqueued::Sent { .. } if down => self.failure_drop(host, Why::LinkFailed, &pkt),
            Enqueued::Sent { arrival, .. } => self.put_on_wire(pi, arrival, pkt),
            _ => self.dropped(&pkt),
        }
        // The next packet is asked for when the CPU can prepare it by the time the NIC is
        // free (its cost taken as this one's), so CPU and NIC work side by side; free hosts
        // ask when the NIC is free.
        let busy_until = self.queues.ports[pi].busy_until;
        let free_at = match self.nodes.hosts[host as usize].cpu {
            Some(c) => c.free_at.max(busy_until.saturating_sub(cost)).max(now),
            None => busy_until,
        };
        self.q.push(free_at, Ev::NicFree { host });
    }

    fn host_rx(&mut self, host: NodeId, pkt: Packet) {
        if self.faults.live.node_is_down(host) {
            return self.failure_drop(host, Why::NodeFailed, &pkt);
        }
        if self.draw(self.nodes.hosts[host as usize].loss) {
            self.nodes.hosts[host as usize].drops_loss += 1;
            self.dropped(&pkt);
            return;
        }
        self.cons.delivered_packets += 1;
        self.cons.delivered_bytes += pkt.size as u64;
        let h = &mut self.nodes.hosts[host as usize];
        h.rx_packets += 1;
        h.rx_bytes += pkt.size as u64;
        if let Some(cpu) = h.cpu.as_mut() {
            let (done, _) = cpu.take(self.now, pkt.size);
            h.rx_wait.push_back(pkt);
            self.q.push(done, Ev::CpuRx { host });
            return;
        }
        self.deliver(host, pkt);
    }

    fn deliver(&mut self, host: NodeId, pkt: Packet) {
        let h = &mut self.nodes.hosts[host as usize];
        let Some(ep) = h.eps.iter().position(|e| e.port == pkt.dst_port) else {
            h.drops_no_endpoint += 1;
            return;
        };
        if let Owner::FlowDst { flow } = h.eps[ep].owner {
            self.call_workloads(Call::FlowReceived { flow, size: pkt.size });
        }
        let now = self.now;
        self.nodes.hosts[host as usize].eps[ep].proto.handle_packet(now, pkt);
        self.service(host, ep as u16);
    }

    // ---- switches ----------------------------------------------------------------------

    fn switch_rx(&mut self, node: NodeId, in_port: PortId, pkt: Packet) {
        // A failed switch returns no credits (its recovery resets them).
        if self.queues.pfc.as_ref().and_then(|p| p.credit()).is_none() || self.faults.live.node_is_down(node) {
            return self.switch_program(node, in_port, pkt);
        }
        // Credits: whatever the program makes of the packet, what it leaves uncharged to its
        // ingress port goes back to the sender now.
        let from = self.queues.port_base[node as usize] as usize + in_port as usize;
        self.credit_paid(from, pkt.size);
        self.switch_program(node, in_port, pkt);
        self.credit_settle(from);
    }

    /// A packet reaches switch `node`: admission, processing capacity, its program.
    fn switch_program(&mut self, node: NodeId, in_port: PortId, mut pkt: Packet) {
        let si = (node - self.fabric.topo.hosts) as usize;
        if self.faults.live.node_is_down(node) {
            return self.failure_drop(node, Why::NodeFailed, &pkt);
        }
        let sw = &mut self.nodes.switches[si];
        sw.rx_packets += 1;
        if pkt.path != NO_PATH {
            pkt.hop = pkt.hop.saturating_add(1);
        }
        let base = self.queues.port_base[node as usize] as usize;
        // Admission filtering: a host may only send packets of the jobs admitted on its port.
        if let Some(job) = sw.ina.as_ref().and_then(|p| p.job_of(&pkt)) {
            let from_host = self.fabric.topo.is_host(self.queues.ports[base + in_port as usize].peer);
            if from_host && !sw.admitted.get(&in_port).is_some_and(|jobs| jobs.contains(&job)) {
                sw.drops_unadmitted += 1;
                self.dropped(&pkt);
                return;
            }
        }
        let in_size = pkt.size as i64;
        let mut out = std::mem::take(&mut self.nodes.actions);
        let n = self.fabric.topo.nodes[node as usize].ports.len();
        let ctx = Ctx { node, now: self.now, ports: &self.queues.ports[base..base + n], pfc: self.queues.pfc.as_deref(), base, topo: &self.fabric.topo, routes: &self.fabric.routes, live: &self.faults.live, default_port: self.fabric.default_port, reroute_above: self.reroute_above() };
        let sw = &mut self.nodes.switches[si];
        // Processing capacity (GRID's C_s, spec A8): a FIFO server for the packets the program
        // aggregates, marking ECN past the ECN threshold and dropping past the buffer (drop-tail
        // only: under PFC the waiting packets stay charged to their ingress port instead).
        let mut ready = self.now;
        let mut refused = None;
        match sw.capacity_bps.filter(|_| sw.active().processes(&ctx, in_port, &pkt)) {
            Some(rate) => {
                let backlog = inalab_core::time::bytes_in(sw.proc_busy.saturating_sub(self.now), rate);
                if self.queues.pfc.is_none() && backlog + pkt.size as u64 > self.queues.buffer {
                    refused = Some(pkt);
                } else {
                    pkt.ecn |= backlog > self.queues.ecn_threshold;
                    sw.proc_busy = self.now.max(sw.proc_busy) + inalab_core::time::serialization(pkt.size as u64, rate);
                    ready = sw.proc_busy;
                    sw.active().on_packet(self.now, &ctx, in_port, pkt, &mut out);
                }
            }
            None => sw.active().on_packet(self.now, &ctx, in_port, pkt, &mut out),
        }
        if let Some(pkt) = refused {
            self.nodes.switches[si].drops_processing += 1;
            self.dropped(&pkt);
            self.nodes.actions = out;
            return;
        }
        if self.fabric.topo.nodes[node as usize].programmable {
            let used = sw.active().aggregators_in_use();
            sw.agg_peak = sw.agg_peak.max(used);
            let bin = (self.now / self.state.bin) as u32;
            match sw.agg_series.last_mut() {
                Some((b, v)) if *b == bin => *v = (*v).max(used),
                _ => sw.agg_series.push((bin, used)),
            }
        }
        self.queues.ingress = (base + in_port as usize) as u32;
        self.apply_actions(node, ready, in_size, &mut out);
        self.nodes.actions = out;
    }

    /// Carries out a program's actions. `in_size` is the size of the packet the program
    /// consumed (0 for timers), for byte conservation.
    fn apply_actions(&mut self, node: NodeId, ready: Time, in_size: i64, out: &mut Vec<SwitchAction>) {
        let si = (node - self.fabric.topo.hosts) as usize;
        let mut outs: i64 = 0;
        let mut out_bytes: i64 = 0;
        self.pfc_share_open();
        for a in out.drain(..) {
            match a {
                SwitchAction::Forward { port, pkt } => {
                    outs += 1;
                    out_bytes += pkt.size as i64;
                    self.egress(node, port, pkt, ready);
                }
                SwitchAction::ForwardEach { pkt, to } => {
                    for (port, pkt) in Addressed::copies(pkt, to) {
                        outs += 1;
                        out_bytes += pkt.size as i64;
                        self.egress(node, port, pkt, ready);
                    }
                }
                SwitchAction::Route { pkt } if pkt.dst == GROUP && pkt.path >= TREE_BASE && pkt.path != NO_PATH => {
                    let (k, bytes) = self.replicate(node, pkt, ready);
                    outs += k;
                    out_bytes += bytes;
                }
                SwitchAction::Route { pkt } => {
                    outs += 1;
                    out_bytes += pkt.size as i64;
                    match self.route(node, &pkt) {
                        Some((port, moved)) => {
                            self.nodes.switches[si].rerouted += moved as u64;
                            self.egress(node, port, pkt, ready)
                        }
                        None => {
                            self.nodes.switches[si].drops_no_route += 1;
                            self.dropped(&pkt);
                        }
                    }
                }
                SwitchAction::Multicast { ports, pkt } => {
                    let k = ports.len();
                    outs += k as i64;
                    out_bytes += (pkt.size as i64) * k as i64;
                    if let Some((&last, rest)) = ports.split_last() {
                        for &p in rest {
                            self.egress(node, p, pkt.clone(), ready);
                        }
                        self.egress(node, last, pkt, ready);
                    }
                }
                SwitchAction::Drop { pkt, reason } => {
                    outs += 1;
                    out_bytes += pkt.size as i64;
                    if inalab_core::is_absorbed(reason) {
                        self.nodes.switches[si].absorbed += 1;
                        self.cons.absorbed_packets += 1;
                        self.cons.absorbed_bytes += pkt.size as u64;
                    } else {
                        self.nodes.switches[si].drops_program += 1;
                        self.dropped(&pkt);
                    }
                }
                SwitchAction::SetTimer { at, token } => {
                    self.q.push(at.max(self.now), Ev::SwitchTimer { switch: node, token, epoch: self.nodes.switches[si].epoch })
                }
            }
        }
        self.pfc_share_close();
        let ins = if in_size > 0 { 1 } else { 0 };
        self.cons.created_packets += outs - ins;
        self.cons.created_bytes += out_bytes - in_size;
    }

    /// Sends a copy of a `GROUP` packet to each of this node's children on its tree (copies to
    /// hosts addressed to them); none where the node is not on it. Returns (copies, bytes).
    fn replicate(&mut self, node: NodeId, pkt: Packet, ready: Time) -> (i64, i64) {
        let t = (pkt.path - TREE_BASE) as usize;
        let k = self.fabric.trees.get(t).and_then(|tree| tree.get(&node)).map_or(0, Vec::len);
        if k == 0 {
            let si = (node - self.fabric.topo.hosts) as usize;
            self.nodes.switches[si].drops_no_route += 1;
            self.dropped(&pkt);
            return (1, pkt.size as i64);
        }
        let size = pkt.size as i64;
        let mut pkt = Some(pkt);
        for i in 0..k {
            let (port, child) = self.fabric.trees[t][&node][i];
            let mut copy = if i + 1 == k { pkt.take().expect("last copy") } else { pkt.clone().expect("copy") };
            if self.fabric.topo.is_host(child) {
                copy.dst = child;
            }
            self.egress(node, port, copy, ready);
        }
        (k as i64, size * k as i64)
    }

    /// Adaptive routing's queue limit in bytes (None under ECMP), as `route` applies it.
    fn reroute_above(&self) -> Option<f64> {
        match self.fabric.routing {
            Routing::Ecmp => None,
            Routing::Adaptive { threshold } => Some(threshold * self.queues.buffer as f64),
        }
    }

    /// The egress port toward `pkt.dst`: the packet's fixed path if it has one, else ECMP or
    /// adaptive choice among the shortest-path ports whose link and peer are up, and whether
    /// adaptive routing moved it off its default port. A flow keeps its ECMP port while that is
    /// up, so a failure moves only the flows it cuts.
    #[inline]
    fn route(&self, node: NodeId, pkt: &Packet) -> Option<(PortId, bool)> {
        if pkt.path != NO_PATH {
            if let Some(p) = self.fabric.paths.get(pkt.path as usize) {
                let hop = pkt.hop as usize;
                if p.nodes.get(hop) == Some(&node) && hop < p.ports.len() {
                    return Some((p.ports[hop], false));
                }
            }
        }
        if !self.fabric.topo.is_host(pkt.dst) {
            return None; // only hosts are destinations; a packet for a switch nobody consumed
        }
        let mut hops = self.fabric.routes.next_hops(node, pkt.dst);
        if hops.is_empty() {
            return None;
        }
        let mut default = self.fabric.default_port.pick(hops, pkt.flow, pkt.dst, node);
        let base = self.queues.port_base[node as usize] as usize;
        if self.faults.live.has_dead(node) {
            hops = self.faults.live.next_hops(&self.fabric.routes, node, pkt.dst);
            if hops.is_empty() {
                return None;
            }
            if self.faults.live.port_dead(base + default as usize) {
                default = self.fabric.default_port.pick(hops, pkt.flow, pkt.dst, node);
            }
        }
        let Some(limit) = self.reroute_above() else { return Some((default, false)) };
        // One instance per mode: a branch inside the queue read kept the drop-tail one from
        // being inlined (1 % more instructions on the Canary benchmark).
        let port = match &self.queues.pfc {
            None => adaptive_pick(default, hops, limit, |p| self.queues.ports[base + p as usize].backlog(self.now)),
            Some(pfc) => adaptive_pick(default, hops, limit, |p| {
                let pi = base + p as usize;
                self.queues.ports[pi].backlog(self.now) + pfc.waiting(pi)
            }),
        }?;
        Some((port, port != default))
    }

    fn egress(&mut self, node: NodeId, port: PortId, mut pkt: Packet, ready: Time) {
        let pi = (self.queues.port_base[node as usize] + port as u32) as usize;
        if self.queues.pfc.is_some() {
            return self.pfc_egress(pi, pkt, ready, self.queues.ingress);
        }
        if ready > self.now {
            // Still in a capacity-limited switch's processing stage. Queued at the egress now,
            // the egress would count the wait for processing as bytes it holds (its backlog is
            // its busy time at line rate): at 100 Gbps behind a 10 Gbps stage, 100 KB waiting
            // to be processed read as 1 MB queued, and results were dropped at egress links
            // carrying 0.03 % of their rate.
            let sw = &mut self.nodes.switches[(node - self.fabric.topo.hosts) as usize];
            if sw.processing.back().is_none_or(|&(at, ..)| at < ready) {
                self.q.push(ready, Ev::Processed { switch: node });
            }
            sw.processing.push_back((ready, port, sw.epoch, pkt));
            return;
        }
        let down = self.faults.live.link_is_down(self.queues.ports[pi].link);
        let lost = !down && self.draw(self.queues.ports[pi].loss);
        match self.queues.ports[pi].enqueue(self.now, ready, pkt.size, Some(self.queues.buffer), self.queues.ecn_threshold, lost, self.state.bin) {
            // Queued and serialized as usual (drop-tail still applies), then lost on the link.
            Enqueued::Sent { .. } if down => self.failure_drop(node, Why::LinkFailed, &pkt),
            Enqueued::Sent { arrival, ecn } => {
                pkt.ecn |= ecn;
                self.put_on_wire(pi, arrival, pkt);
            }
            Enqueued::DroppedQueue | Enqueued::DroppedLoss => self.dropped(&pkt),
        }
    }

    /// Switch `node`'s processing stage finished packets: they join their egress queues, in
    /// the order processed. A failure since lost them (its queues are lost with it).
    fn processed(&mut self, node: NodeId) {
        let si = (node - self.fabric.topo.hosts) as usize;
        while let Some(&(at, ..)) = self.nodes.switches[si].processing.front() {
            if at > self.now {
                break;
            }
            let (_, port, epoch, pkt) = self.nodes.switches[si].processing.pop_front().expect("checked");
            if epoch != self.nodes.switches[si].epoch || self.faults.live.node_is_down(node) {
                self.failure_drop(node, Why::NodeFailed, &pkt);
            } else {
                self.egress(node, port, pkt, self.now);
            }
        }
    }

    #[inline]
    fn put_on_wire(&mut self, pi: usize, arrival: Time, pkt: Packet) {
        if let Some(c) = self.capture.as_mut() {
            c.record(pi, arrival.saturating_sub(self.queues.ports[pi].delay_ps), &pkt);
        }
        if self.queues.wires.push(pi, arrival, (), pkt) {
            self.q.push(arrival, Ev::Arrive { port: pi as u32 });
        }
    }

    /// A packet lost before reaching a host (any end but delivery and aggregation).
    fn dropped(&mut self, pkt: &Packet) {
        self.cons.lost_packets += 1;
        self.cons.lost_bytes += pkt.size as u64;
        if let Some(Owner::FlowSrc { flow }) = self.owner_of(pkt.src, pkt.src_port) {
            self.call_workloads(Call::FlowDropped { flow });
        }
    }

    fn owner_of(&self, host: NodeId, port: u16) -> Option<Owner> {
        self.nodes.hosts.get(host as usize)?.eps.iter().find(|e| e.port == port).map(|e| e.owner)
    }

    /// Draws a loss decision; no random number is consumed when `p` is zero, so adding loss
    /// in one place does not reshuffle randomness elsewhere.
    #[inline]
    fn draw(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.random::<f64>() < p
    }

    pub(crate) fn schedule(&mut self, at: Time, ev: Ev) {
        self.q.push(at, ev);
    }

    /// Packets and bytes on wires (serializing or propagating), waiting in PFC queues, or
    /// between local endpoints.
    pub(crate) fn in_flight(&self) -> (u64, u64) {
        let (mut n, mut b) = self.queues.wires.in_flight();
        if let Some(pfc) = &self.queues.pfc {
            let (qn, qb) = pfc.in_flight();
            (n, b) = (n + qn, b + qb);
        }
        let processing = self.nodes.switches.iter().flat_map(|s| s.processing.iter().map(|(.., p)| p));
        self.nodes.hosts.iter().flat_map(|h| h.local.iter().chain(&h.credit_held)).chain(processing).fold((n, b), |(n, b), p| (n + 1, b + p.size as u64))
    }
}

impl World for Sim {
    fn now(&self) -> Time {
        self.now
    }
    fn payload(&self) -> Option<crate::spec::PayloadValues> {
        self.state.payload
    }
    fn topology(&self) -> &Topology {
        &self.fabric.topo
    }
    fn schedule(&mut self, at: Time, ev: Ev) {
        Sim::schedule(self, at, ev)
    }
    fn submit(&mut self, host: NodeId, ep: u16, req: AppRequest) {
        Sim::submit(self, host, ep, req)
    }
    fn peer_failed(&mut self, host: NodeId, ep: u16, rank: u32) -> bool {
        if self.faults.live.node_is_down(host) {
            return true;
        }
        let now = self.now;
        let goes_on = self.nodes.hosts[host as usize].eps[ep as usize].proto.peer_failed(now, rank);
        self.service(host, ep);
        goes_on
    }
    fn host_failed(&self, host: NodeId) -> bool {
        self.faults.live.node_is_down(host)
    }
    fn complete(&mut self) {
        self.state.completed = true;
        self.state.stopped_by = "work_ended";
        if self.state.linger == 0 {
            self.state.done = true;
        } else {
            self.state.stop = self.state.stop.min(self.now.saturating_add(self.state.linger));
        }
    }
    fn release_job(&mut self, job: u32) {
        self.faults.released.push(job);
        for sw in &mut self.nodes.switches {
            if let Some(programs) = &mut sw.ina {
                sw.aggregators_released += programs.release(job);
            }
        }
    }
    fn endpoint_index(&self, host: NodeId, port: u16) -> Option<u16> {
        self.nodes.hosts[host as usize].eps.iter().position(|e| e.port == port).map(|i| i as u16)
    }
    fn add_endpoint(&mut self, host: NodeId, proto: Box<dyn HostProtocol>, owner: Owner) -> u16 {
        Sim::add_endpoint(self, host, proto, owner)
    }
    fn install_ina(&mut self, switch: NodeId, programs: Programs) {
        Sim::install_ina(self, switch, programs)
    }
    fn admit_host(&mut self, host: NodeId, job: u32) {
        Sim::admit_host(self, host, job)
    }
    fn install_path(&mut self, field: &str, nodes: &[NodeId]) -> Result<u32, SimError> {
        Sim::install_path(self, field, nodes)
    }
    fn set_endpoint_path(&mut self, host: NodeId, ep: u16, path: u32) {
        Sim::set_endpoint_path(self, host, ep, path)
    }
    fn install_tree(&mut self, field: &str, host: NodeId, ep: u16, tree: &inalab_scheme::PlanTree) -> Result<(), SimError> {
        Sim::install_tree(self, field, host, ep, tree)
    }
}
