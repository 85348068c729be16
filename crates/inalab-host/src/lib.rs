//! Host protocols as sans-IO state machines (see `inalab_core::HostProtocol`).
//!
//! Protocols:
//! - [`RingAllreduce`]: ring allreduce (reduce-scatter + all-gather, `2 (N - 1)` steps);
//! - [`HierarchicalAllreduce`]: reduce-scatter in the rack, ring allreduce across racks,
//!   all-gather in the rack;
//! - [`PsWorker`] and [`PsServer`]: parameter server, N-to-1 (one server) or sharded N-to-N
//!   (BytePS-like, servers co-located with workers);
//! - [`AtpWorker`] and [`AtpServer`]: ATP's in-network-aggregation hosts (with `inalab_switch::AtpSwitch`);
//! - [`SwitchMlWorker`]: SwitchML's worker (with `inalab_switch::SwitchMlSwitch`);
//! - [`DsaWorker`] and [`DsaServer`]: DSA's hosts (with `inalab_switch::DsaSwitch`);
//! - [`CanaryHost`]: Canary's sender and per-block leader (with `inalab_switch::CanarySwitch`);
//! - [`StaticTreeHost`]: the static-tree baselines' sender of blocks up fixed trees, round
//!   robin over N trees (with `inalab_switch::StaticTreeSwitch`);
//! - [`quant`]: fixed-point conversion (ATP's fixed scale, SwitchML's block exponents), and
//!   [`Quantized`], the layer that applies it between an application and an INA protocol.
//! - [`DatagramSender`] and [`DatagramSink`]: unreliable line-rate raw traffic;
//! - [`Noisy`]: host noise (a NIC stall or a delayed packet) around any of them.
//!
//! Building blocks:
//! - [`Transport`]: reliable windowed message transport (a component the collectives embed);
//! - [`CongestionControl`]: a congestion window as a trait; [`AimdWindow`], ATP's AIMD (§3.7),
//!   is the one the transport and ATP's INA workers use;
//! - [`RttEstimator`]: RFC 6298 smoothed RTT and retransmission timeout with back-off.
//!
//! The collectives serve `AppRequest::Allreduce` requests FIFO, one at a time per instance,
//! and sum real values in payload mode (i32 wrapping, f32 IEEE) or only move bytes in
//! metadata mode.

mod aimd;
mod atp;
mod blocks;
mod canary;
mod cc;
mod collective;
mod datagram;
mod dsa;
mod error;
mod grid;
mod hierarchical;
mod noise;
mod ps;
mod rina;
mod ring;
mod rtt;
pub mod quant;
mod quantize;
mod static_tree;
mod switchml;
mod transport;

pub use aimd::{AimdConfig, AimdWindow};
pub use cc::{CongestionControl, WindowRules};
pub use rtt::{RttConfig, RttEstimator};
pub use grid::{GridConfig, GridServer, GridServerConfig, GridTarget, GridWorker, GRID_PACKET_VALUES};
pub use atp::{atp_layout, AtpConfig, AtpLayout, AtpPosition, AtpServer, AtpServerConfig, AtpWorker, Contributor, Hashing, Rehasher, ATP_MAX_WORKERS, DEFAULT_SLOTS as ATP_DEFAULT_SLOTS, MAX_SLOTS as ATP_MAX_SLOTS};
pub use canary::{CanaryConfig, CanaryHost, CANARY_BLOCK_VALUES};
pub use dsa::{dsa_priority, dsa_pool_slot_table, DsaConfig, DsaServer, DsaWorker, SlotMoves, DSA_MIN_RTO_PS, DSA_VALUES};
pub use datagram::{DatagramConfig, DatagramSender, DatagramSink};
pub use error::ConfigError;
pub use hierarchical::HierarchicalAllreduce;
pub use noise::{NoiseConfig, NoiseMode, Noisy};
pub use ps::{PsConfig, PsServer, PsWorker};
pub use quantize::{Quantization, Quantized};
pub use static_tree::{StaticTreeConfig, StaticTreeHost, STATIC_TREE_BLOCK_VALUES};
pub use rina::{RinaConfig, RinaGroup, RinaHost, RINA_PACKET_VALUES};
pub use collective::StepCost;
pub use ring::RingAllreduce;
pub use switchml::{SwitchMlConfig, SwitchMlWorker};
pub use transport::{Delivered, Transport, TransportConfig, TransportStats};
