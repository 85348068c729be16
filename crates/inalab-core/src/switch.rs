use crate::{NodeId, Packet, PortId, Time};

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
    /// Consume the packet; `reason` is counted in the switch's drop counters.
    Drop { pkt: Packet, reason: &'static str },
    /// Call `on_timer(token)` at time `at` (>= now).
    SetTimer { at: Time, token: TimerToken },
}

/// Read-only view of the switch a program runs on, provided by the driver.
pub trait SwitchCtx {
    fn node(&self) -> NodeId;
    fn num_ports(&self) -> usize;
    /// Bytes currently queued on an egress port (what adaptive routing and Canary read).
    fn queue_bytes(&self, port: PortId) -> u64;
    /// The node on the far side of a port.
    fn peer(&self, port: PortId) -> NodeId;
}

/// A switch data-plane program as a sans-IO state machine. It sees packets with their ingress
/// port and its own timers, and pushes actions to `out`. It must keep the limits of the
/// hardware it models (aggregator count, payload size, one register access per pass) unless
/// its config says otherwise.
pub trait SwitchProgram: Send {
    fn on_packet(&mut self, now: Time, ctx: &dyn SwitchCtx, in_port: PortId, pkt: Packet, out: &mut Vec<SwitchAction>);
    fn on_timer(&mut self, _now: Time, _ctx: &dyn SwitchCtx, _token: TimerToken, _out: &mut Vec<SwitchAction>) {}
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
