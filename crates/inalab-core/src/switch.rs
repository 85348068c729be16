use crate::{flow_key, NodeId, Packet, PortId, Time};
use inalab_wire::Header;
use std::any::Any;
use std::fmt;

/// Opaque value a switch program attaches to a timer; handed back when it fires.
pub type TimerToken = u64;

/// What a switch program can do with a packet or a timer.
#[derive(Debug)]
pub enum SwitchAction {
    /// Send on one egress port.
    Forward { port: PortId, pkt: Packet },
    /// Send toward `pkt.dst` by the driver's routing (ECMP, adaptive, or the packet's fixed
    /// path): the default for traffic a program does not consume.
    Route { pkt: Packet },
    /// Send a copy on each port (the driver clones the packet).
    Multicast { ports: Vec<PortId>, pkt: Packet },
    /// One packet to several hosts, each copy on its own port, addressed to its own endpoint
    /// and carrying its own header (a SwitchML slot's result differs per worker only there):
    /// the UDP runtime encodes and hashes the values once for every copy.
    ForwardEach { pkt: Packet, to: Vec<Addressed> },
    /// Consume the packet; `reason` (`SCHEME_WHY`) is counted in the switch's drop counters.
    /// A reason ending in [`ABSORBED_SUFFIX`] says the packet went into a sum (aggregation's
    /// normal end of a packet, not a loss); drivers count those apart ([`is_absorbed`]).
    Drop { pkt: Packet, reason: &'static str },
    /// Call `on_timer(token)` at time `at` (>= now).
    SetTimer { at: Time, token: TimerToken },
}

/// The ending of the drop reasons of packets consumed into a sum (`atp_aggregated`).
pub const ABSORBED_SUFFIX: &str = "_aggregated";

/// Whether a [`SwitchAction::Drop`] reason is aggregation consuming the packet rather than a
/// discard: drivers report the two apart, so no one reads aggregation as loss.
pub fn is_absorbed(reason: &str) -> bool {
    reason.ends_with(ABSORBED_SUFFIX)
}

/// One copy of a [`SwitchAction::ForwardEach`]: where it goes and the header it carries.
#[derive(Debug, Clone)]
pub struct Addressed {
    pub port: PortId,
    pub dst: NodeId,
    pub dst_port: u16,
    pub header: Header,
}

impl Addressed {
    /// Makes `pkt` this copy: its destination (and the flow key that goes with it) and header.
    pub fn address(&self, pkt: &mut Packet) {
        pkt.dst = self.dst;
        pkt.dst_port = self.dst_port;
        pkt.flow = flow_key(pkt.src, pkt.src_port, pkt.dst, pkt.dst_port);
        pkt.header = self.header.clone();
    }

    /// The copies of a [`SwitchAction::ForwardEach`] as (port, packet), for a driver that
    /// sends them one by one (the last takes `pkt` itself).
    pub fn copies(pkt: Packet, to: Vec<Addressed>) -> impl Iterator<Item = (PortId, Packet)> {
        let n = to.len();
        let mut pkt = Some(pkt);
        to.into_iter().enumerate().map(move |(i, a)| {
            let mut copy = if i + 1 == n { pkt.take().expect("taken by the last copy only") } else { pkt.clone().expect("present") };
            a.address(&mut copy);
            (a.port, copy)
        })
    }
}

/// Read-only view of the switch a program runs on, provided by the driver.
pub trait SwitchCtx {
    fn node(&self) -> NodeId;
    fn num_ports(&self) -> usize;
    /// Bytes currently queued on an egress port (what adaptive routing and Canary read).
    fn queue_bytes(&self, port: PortId) -> u64;
    /// The node on the far side of a port.
    fn peer(&self, port: PortId) -> NodeId;
    /// Egress ports on shortest paths toward any node, switches included (what Canary's and
    /// GRID's programs route by); empty if the driver has no route.
    fn next_hops(&self, _dst: NodeId) -> &[PortId] {
        &[]
    }
    /// Whether a port leads up, toward the core (a switch of a higher tier), rather than down
    /// toward hosts.
    fn faces_up(&self, _port: PortId) -> bool {
        false
    }
    /// The port the network's own routing gives a packet toward `dst` keyed by its
    /// destination alone: the network's default-port rule, unsalted so that every switch of a
    /// tier picks the same port index, then its adaptive rerouting if it has one. None where
    /// the driver has no such routing (the program then routes by its own rule). The flag
    /// says whether adaptive routing moved the packet off the default port.
    fn route_toward(&self, _dst: NodeId) -> Option<(PortId, bool)> {
        None
    }
}

/// A job's state for one switch program, as a scheme's set-up computes it (for example
/// ATP's local workers and multicast targets, SwitchML's static pool). Opaque here so that
/// core names no scheme: the program it is meant for downcasts it in `admit`.
pub struct Admission {
    state: Box<dyn Any + Send>,
    /// The state's `Debug` form, for people and for comparing plans.
    described: String,
}

impl Admission {
    pub fn new<T: Any + Send + fmt::Debug>(state: T) -> Self {
        Admission { described: format!("{state:?}"), state: Box::new(state) }
    }
    /// The state as `T`, or an error naming the program that cannot use it.
    pub fn take<T: Any>(self, program: &str) -> Result<T, AdmitError> {
        self.state.downcast::<T>().map(|b| *b).map_err(|_| AdmitError(format!("an admission not meant for the {program} program")))
    }
    pub fn describe(&self) -> &str {
        &self.described
    }
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Admission({})", self.described)
    }
}

/// Why a program refused a job (it does not fit, or its description is inconsistent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmitError(pub String);

impl fmt::Display for AdmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AdmitError {}

/// A switch data-plane program as a sans-IO state machine. It sees packets with their ingress
/// port and its own timers, and pushes actions to `out`. It must keep the limits of the
/// hardware it models (aggregator count, payload size, one register access per pass) unless
/// its config says otherwise.
///
/// Its control-plane half (`admit`, `release`, `job_of`) is what both drivers call to set
/// jobs up and to filter packets: a port may only send packets of the jobs admitted on it.
pub trait SwitchProgram: Send {
    fn on_packet(&mut self, now: Time, ctx: &dyn SwitchCtx, in_port: PortId, pkt: Packet, out: &mut Vec<SwitchAction>);
    fn on_timer(&mut self, _now: Time, _ctx: &dyn SwitchCtx, _token: TimerToken, _out: &mut Vec<SwitchAction>) {}
    /// Control plane: installs a job's state. Errs when it does not fit or is not for this
    /// program; a refused job leaves the program unchanged.
    fn admit(&mut self, _job: u32, _adm: Admission) -> Result<(), AdmitError> {
        Err(AdmitError("this program admits no jobs".into()))
    }
    /// Control plane: removes a job and frees what it holds. Returns the aggregators freed.
    fn release(&mut self, _job: u32) -> u32 {
        0
    }
    /// The job a packet of this program's protocol belongs to; `None` for any other packet
    /// (which the program routes like any packet).
    fn job_of(&self, _pkt: &Packet) -> Option<u32> {
        None
    }
    /// Whether `pkt` goes through the switch's processing stage (it will be aggregated here),
    /// and so is charged to the switch's processing capacity where the driver models one
    /// (GRID's C_s). Transit traffic is not: a Tofino forwards at line rate. Default: none.
    fn processes(&self, _ctx: &dyn SwitchCtx, _in_port: PortId, _pkt: &Packet) -> bool {
        false
    }
    /// Aggregator slots in use (for occupancy metrics); 0 for programs without aggregators.
    fn aggregators_in_use(&self) -> u32 {
        0
    }
    /// Program counters for metrics (name, value).
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}

/// Plain L3 forwarding: every packet goes toward its destination by the routing table.
#[derive(Debug, Default)]
pub struct L3Forward;

impl SwitchProgram for L3Forward {
    #[inline]
    fn on_packet(&mut self, _now: Time, _ctx: &dyn SwitchCtx, _in_port: PortId, pkt: Packet, out: &mut Vec<SwitchAction>) {
        out.push(SwitchAction::Route { pkt });
    }
}
