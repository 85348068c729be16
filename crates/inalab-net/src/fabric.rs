//! A static deployment: every switch's neighbours, routes and jobs fixed before it starts,
//! as `inalab emulate` derives them from a scenario's topology (the simulator's view), instead
//! of joins and attaches at run time. A worker then starts from its job's spec
//! ([`crate::client::Client::from_spec`]), a PS from [`HostFabric`].

use crate::control::JobSpec;
use inalab_core::NodeId;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// One neighbour of a switch, i.e. one port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricPort {
    pub node: NodeId,
    /// "worker", "ps" or "switch".
    pub kind: String,
    /// The neighbour's data-plane address.
    pub udp: SocketAddr,
    /// The link's rate, bits per second, where the link is shaped outside the switch (`tc`):
    /// the switch then estimates the port's egress queue from what it sent (a queue draining
    /// at this rate), which is what `SwitchCtx::queue_bytes` reports to programs (Canary's
    /// load balancer). Default none: 0 queued, unless the switch shapes the port itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_bps: Option<u64>,
    /// A worker's host that also runs a PS (co-located, sharing the host's link): the PS's
    /// data-plane address. Packets to [`crate::control::COLOCATED_SERVER_PORT`] go there, the
    /// rest to `udp`; the link needs shaping outside the switch (`tc`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ps_udp: Option<SocketAddr>,
}

/// The next hops toward `dst` (a node not adjacent to the switch): neighbours' node ids, one
/// chosen per flow (ECMP, by the simulator's hash). With `src`, the route of packets from
/// `src` only, and `via` holds the one next hop (the emulator pins each flow to the path the
/// simulator gives it); such routes take precedence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricRoute {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src: Option<NodeId>,
    pub dst: NodeId,
    pub via: Vec<NodeId>,
}

/// A switch's part of a static deployment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchFabric {
    pub ports: Vec<FabricPort>,
    pub routes: Vec<FabricRoute>,
    /// Jobs admitted at start (each switch installs its own part of each).
    pub jobs: Vec<JobSpec>,
    /// The switch's processing capacity (the simulator's `network.switch_capacity`). Default
    /// none: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processing: Option<Processing>,
    /// Which of a route's next hops a packet takes (the simulator's `network.default_port`),
    /// and the port Canary's switches send toward a leader with `ina.routing = "network"`.
    /// Default: a hash of the flow.
    #[serde(default)]
    pub default_port: inalab_topo::DefaultPort,
}

/// Processing capacity (GRID's C_s): the packets a switch program aggregates
/// (`SwitchProgram::processes`) wait in one FIFO served at `rate_bps`, charged their bytes on
/// the wire; a packet that finds more than `ecn_threshold_bytes` waiting is ECN-marked, one
/// that would take the queue past `buffer_bytes` is dropped. As the simulator's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Processing {
    /// Bits per second.
    pub rate_bps: u64,
    /// Bytes.
    pub buffer_bytes: u64,
    /// Bytes.
    pub ecn_threshold_bytes: u64,
}

/// A PS's part of a static deployment: its switch's data-plane address and its jobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostFabric {
    pub gateway: SocketAddr,
    pub jobs: Vec<JobSpec>,
}
