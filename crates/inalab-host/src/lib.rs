//! Host protocols as sans-IO state machines (see `inalab_core::HostProtocol`).
//!
//! Protocols:
//! - [`RingAllreduce`]: ring allreduce (reduce-scatter + all-gather, `2 (N - 1)` steps);
//! - [`HierarchicalAllreduce`]: reduce-scatter in the rack, ring allreduce across racks,
//!   all-gather in the rack;
//! - [`PsWorker`] and [`PsServer`]: parameter server, N-to-1 (one server) or sharded N-to-N
//!   (BytePS-like, servers co-located with workers);
//! - [`DatagramSender`] and [`DatagramSink`]: unreliable line-rate raw traffic.
//!
//! Building blocks:
//! - [`Transport`]: reliable windowed message transport (a component the collectives embed);
//! - [`AimdWindow`]: ATP's AIMD congestion window (§3.7), shared with ATP's INA workers.
//!
//! The collectives serve `AppRequest::Allreduce` requests FIFO, one at a time per instance,
//! and sum real values in payload mode (i32 wrapping, f32 IEEE) or only move bytes in
//! metadata mode.

mod aimd;
mod collective;
mod datagram;
mod error;
mod hierarchical;
mod ps;
mod ring;
mod transport;

pub use aimd::{AimdConfig, AimdWindow};
pub use datagram::{DatagramConfig, DatagramSender, DatagramSink};
pub use error::ConfigError;
pub use hierarchical::HierarchicalAllreduce;
pub use ps::{PsConfig, PsServer, PsWorker};
pub use ring::RingAllreduce;
pub use transport::{Delivered, Transport, TransportConfig, TransportStats};
