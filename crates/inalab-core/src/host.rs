use crate::{NodeId, Packet, Payload, Time};

/// A protocol endpoint: a host and a port on it (like an IP address and UDP port).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    pub host: NodeId,
    pub port: u16,
}

/// What an application asks of its host protocol.
#[derive(Debug, Clone)]
pub enum AppRequest {
    /// Allreduce one tensor of `bytes` bytes with the other members of the protocol's group.
    /// `data` carries the values in payload mode (its length is `bytes / 4`); `attrs` says
    /// what a scheme may need to know of the tensor.
    Allreduce { id: u64, bytes: u64, data: Option<Payload>, attrs: TensorAttrs },
    /// Send one message of `bytes` bytes to `dst` (background traffic, benchmarks).
    Send { id: u64, dst: Endpoint, bytes: u64 },
}

/// What the application knows of a tensor that a scheme may use: DSA ranks tensors by
/// priority, Canary picks a block's leader, layer-wise schedulers order by layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TensorAttrs {
    /// The model layer the tensor belongs to, counted from the input (0 for a benchmark).
    pub layer: u32,
    /// Scheduling priority, higher first; 0 when the application gives none.
    pub priority: u32,
}

impl AppRequest {
    /// An allreduce with no attributes.
    pub fn allreduce(id: u64, bytes: u64, data: Option<Payload>) -> Self {
        AppRequest::Allreduce { id, bytes, data, attrs: TensorAttrs::default() }
    }
}

/// What a host protocol reports back to its application.
#[derive(Debug, Clone)]
pub enum HostEvent {
    /// The request `id` finished; for an allreduce in payload mode, `data` is the result.
    Done { id: u64, data: Option<Payload> },
    /// A message `id` arrived in full from `from` (receiver side of `AppRequest::Send`).
    Received { id: u64, from: Endpoint, bytes: u64 },
    /// The request `id` cannot complete; `reason` says why.
    Failed { id: u64, reason: String },
    /// The request `id` was refused for its input (a value the scheme cannot carry); the
    /// application's error, not the network's.
    Rejected { id: u64, reason: String },
}

/// A host-side protocol endpoint as a sans-IO state machine, in the style of `quinn-proto`.
///
/// The driver feeds it inputs (`submit`, `handle_packet`, `handle_timeout`) and then drains
/// its outputs:
/// - `poll_transmit` is called whenever the host's NIC is free, so a protocol is paced by its
///   NIC: it hands out one packet at a time and never floods an unbounded queue;
/// - `poll_timeout` says when `handle_timeout` must next be called (`None` = no timer);
/// - `poll_event` yields completions for the application.
///
/// Implementations must be deterministic functions of their inputs.
pub trait HostProtocol: Send {
    /// The endpoint this protocol instance is bound to.
    fn endpoint(&self) -> Endpoint;
    fn submit(&mut self, now: Time, req: AppRequest);
    fn handle_packet(&mut self, now: Time, pkt: Packet);
    fn handle_timeout(&mut self, now: Time);
    fn poll_transmit(&mut self, now: Time) -> Option<Packet>;
    fn poll_timeout(&self) -> Option<Time>;
    fn poll_event(&mut self) -> Option<HostEvent>;
    /// The driver's membership service says worker `rank` of this endpoint's job died.
    /// Returns whether the protocol goes on without it; the default, false, means the job
    /// cannot finish (the driver fails it, naming the worker).
    fn peer_failed(&mut self, _now: Time, _rank: u32) -> bool {
        false
    }
    /// Protocol counters for metrics (name, value), e.g. retransmissions.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}
