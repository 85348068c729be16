//! What workloads may do to the simulated world, and what the world tells them: the narrow
//! interface between the event loop (`sim.rs`, which implements [`World`]) and the
//! applications on the hosts (`workload.rs`), so neither names the other's internals.

use crate::events::Ev;
use crate::SimError;
use inalab_core::{AppRequest, HostProtocol, NodeId, Programs, Time};
use inalab_topo::Topology;

/// Who owns an endpoint, so its events reach the right workload.
#[derive(Debug, Clone, Copy)]
pub enum Owner {
    Worker { job: u32, rank: u32 },
    Server { job: u32 },
    FlowSrc { flow: u32 },
    FlowDst { flow: u32 },
    Background,
}

/// The event loop as a workload sees it.
pub(crate) trait World {
    fn now(&self) -> Time;
    /// Payload mode's values (`None`: metadata mode, no values).
    fn payload(&self) -> Option<crate::spec::PayloadValues>;
    fn topology(&self) -> &Topology;
    /// Calls the workloads back with `ev` at `at`.
    fn schedule(&mut self, at: Time, ev: Ev);
    /// Hands an application request to endpoint `ep` of `host`.
    fn submit(&mut self, host: NodeId, ep: u16, req: AppRequest);
    /// Tells endpoint `ep` of `host` that worker `rank` of its job died; whether its protocol
    /// goes on without it.
    fn peer_failed(&mut self, host: NodeId, ep: u16, rank: u32) -> bool;
    /// Whether `host` has failed (it takes no more requests).
    fn host_failed(&self, host: NodeId) -> bool;
    /// Every job and flow is done: the run ends.
    fn complete(&mut self);
    /// A job ended: the control plane releases it at every switch (as the UDP switch does
    /// when its workers leave), freeing what it still holds.
    fn release_job(&mut self, job: u32);
    /// The index of `host`'s endpoint on protocol port `port`.
    fn endpoint_index(&self, host: NodeId, port: u16) -> Option<u16>;

    // Set-up, before the run.
    fn add_endpoint(&mut self, host: NodeId, proto: Box<dyn HostProtocol>, owner: Owner) -> u16;
    fn install_ina(&mut self, switch: NodeId, programs: Programs);
    /// Lets `host` send `job`'s packets into its switch (admission filtering).
    fn admit_host(&mut self, host: NodeId, job: u32);
    /// Installs a fixed path (nodes, host to host); errors name `field`.
    fn install_path(&mut self, field: &str, nodes: &[NodeId]) -> Result<u32, SimError>;
    fn set_endpoint_path(&mut self, host: NodeId, ep: u16, path: u32);
    /// Installs the multicast tree an endpoint's packets to `GROUP` follow.
    fn install_tree(&mut self, field: &str, host: NodeId, ep: u16, tree: &inalab_scheme::PlanTree) -> Result<(), SimError>;
}

/// What the world tells the workloads.
#[derive(Debug)]
pub(crate) enum Call {
    /// A workload event the workloads scheduled fell due.
    Event(Ev),
    /// An endpoint reported an event to its owner.
    Host { host: NodeId, owner: Owner, ev: inalab_core::HostEvent },
    /// A flow's packet of `size` bytes arrived.
    FlowReceived { flow: u32, size: u32 },
    /// A flow's packet was lost.
    FlowDropped { flow: u32 },
    /// The run starts: a scenario without work completes at once.
    Start,
}
