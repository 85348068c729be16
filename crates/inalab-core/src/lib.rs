//! The sans-IO contract shared by every inalab protocol and every driver.
//!
//! Protocol code (switch programs in `inalab-switch`, host protocols in `inalab-host`) is a
//! pure state machine: it is handed the current time and an input (a packet, a fired timer, an
//! application request) and answers with outputs (packets, timers, completions). It owns no
//! clock, socket, thread or random number generator. Two drivers run it: the discrete-event
//! simulator (`inalab-sim`) and the UDP runtime (`inalab-net`), which puts packets on the wire
//! with [`frame`]. Anything random a protocol
//! needs (for example a hash seed) is passed in by the driver at construction.

pub mod frame;
mod host;
mod packet;
mod programs;
pub mod rail;
pub mod simd;
mod switch;
pub mod time;
mod timers;

pub use host::{AppRequest, Endpoint, HostEvent, HostProtocol, TensorAttrs};
pub use inalab_wire as wire;
pub use packet::{flow_key, splitmix64, Packet, Payload, GROUP, NO_PATH};
pub use programs::Programs;
pub use switch::{is_absorbed, Addressed, Admission, AdmitError, L3Forward, SwitchAction, SwitchCtx, SwitchProgram, TimerToken};
pub use time::Time;
pub use timers::{backed_off, TimerTable, MAX_BACKOFF};

/// Index of a node (host or switch) in a topology. Hosts and switches share one index space.
pub type NodeId = u32;
/// Index of a port on a switch (0-based, in the order the topology lists the switch's links).
pub type PortId = u16;
