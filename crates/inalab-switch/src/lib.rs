//! Switch data-plane programs as sans-IO state machines (see `inalab_core::SwitchProgram`).
//! Plain L3 forwarding lives in `inalab-core` as the default program; the INA programs of
//! DSA, Canary, GRID and Rina are added here by later issues.
//!
//! Programs:
//! - [`AtpSwitch`]: ATP's shared aggregator pool with two-level best-effort aggregation;
//! - [`SwitchMlSwitch`]: SwitchML's static per-job slot pools with shadow copies;
//! - [`DsaSwitch`]: DSA's shared array with preemption by priority and downgrading;
//! - [`CanarySwitch`]: Canary's descriptors of dynamic trees;
//! - [`StaticTreeSwitch`]: the static-tree allreduce baselines of Canary's evaluation (fixed
//!   parents and children per tree, a static slot per block);
//! - [`RinaSwitch`]: Rina's rack aggregation for the ring over groups;
//! - [`GridSwitch`]: GRID's node-targeted aggregation with rate-synchronization control packets.
//!
//! Shared parts: [`Pool`], a fixed array of aggregator slots (ATP's pool; DSA, Canary and GRID
//! keep theirs in one too).

mod atp;
mod canary;
mod dsa;
mod grid;
mod pool;
mod rina;
mod static_tree;
mod switchml;

pub use atp::{AtpSwitch, AtpSwitchConfig, AtpSwitchJob, AGGREGATOR_BYTES, AGGREGATOR_VALUES};
pub use canary::{CanarySwitch, CanarySwitchConfig, CanarySwitchJob, CANARY_DESCRIPTOR_BYTES, CANARY_MAX_PORTS, CANARY_VALUES};
pub use dsa::{DsaIndex, DsaPolicy, DsaSwitch, DsaSwitchConfig, DsaSwitchJob, DSA_AGGREGATOR_BYTES, DSA_AGGREGATOR_VALUES, DSA_EMPTY_PACKET_BYTES};
pub use grid::{GridIndexing, GridSwitch, GridSwitchConfig, GridSwitchJob, GRID_UNIT_BYTES, GRID_VALUES};
pub use inalab_core::L3Forward;
pub use pool::Pool;
pub use rina::{rina_slots_for, RinaSwitch, RinaSwitchJob, RINA_MAX_MEMBERS, RINA_SLOT_BYTES, RINA_VALUES};
pub use static_tree::{static_tree_slots_for, StaticTreeRole, StaticTreeSwitch, StaticTreeSwitchJob, STATIC_TREE_MAX_CHILDREN, STATIC_TREE_SLOT_BYTES, STATIC_TREE_VALUES};
pub use switchml::{slot_units, SwitchMlAdmitError, SwitchMlCounters, SwitchMlJob, SwitchMlSwitch, SLOT_BYTES, VALUES_PER_SLOT};
