//! One home per scheme: the registry of every allreduce scheme inalab runs, each with its job
//! description (config struct, defaults, units) and its set-up (which host protocols run
//! where, which switch programs a job needs, what each switch admits).
//!
//! Both drivers call this crate and neither names a scheme: the simulator builds a [`NetView`]
//! from its topology, the UDP runtime from its control plane; each asks the registry for a
//! job's [`Plan`] and carries it out (runs the endpoints, installs the programs, admits the
//! job). Adding a scheme is a module here plus one line in [`registry`] (see
//! docs/architecture.md, "Adding a scheme").

mod atp;
mod canary;
mod dsa;
mod grid;
mod noise;
mod plan;
mod ps;
pub mod registry;
mod rina;
mod ring;
mod routes;
mod static_tree;
mod switchml;
mod transport;

pub use plan::{
    check_params, clip, parse_config, quote, JobSpec, NetView, Overrides, Param, Plan, PlanError, PlannedEndpoint, Quantization, Range, Role, Scheme, Servers, SwitchAdmission, TypedScheme,
    TensorContext, MAX_PACKET_BYTES, MAX_SLOTS, MAX_TIME_PS, MAX_WINDOW_BYTES,
};
pub use dsa::slot_table as dsa_slot_table;
pub use routes::{PlanRoutes, PlanTree};
pub use registry::{by_name, scheme_of, schemes};
pub use transport::TransportParams;
