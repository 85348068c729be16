//! inalab's packet-level discrete-event simulator.
//!
//! It is a *driver*: the protocol logic it runs lives in `inalab-switch` (switch programs) and
//! `inalab-host` (host protocols) behind the sans-IO traits of `inalab-core`, and the UDP
//! runtime drives the very same code. What is here is the world around the protocols: time,
//! links and queues, routing, loss injection, workloads and metrics.
//!
//! Entry point: [`run`] takes a [`SimSpec`] and returns a [`SimResult`].

mod capture;
mod error;
mod events;
mod failures;
mod metrics;
mod network;
mod result;
pub mod setup;
mod sim;
pub mod spec;
mod workload;
mod wires;
mod world;

pub use error::SimError;
pub use result::*;
pub use sim::Sim;
pub use spec::SimSpec;

/// Called about every 0.2 s of wall time with (fraction done in [0, 1], events so far).
pub type Progress<'a> = &'a mut dyn FnMut(f64, u64);

/// Validates `spec`, simulates it and returns the result.
pub fn run(spec: &SimSpec, progress: Option<Progress<'_>>) -> Result<SimResult, SimError> {
    let mut sim = Sim::new(spec)?;
    sim.run(progress);
    Ok(sim.finish())
}

/// Parses a JSON spec (as the Python front sends it), naming the field on error.
pub fn parse_spec(json: &str) -> Result<SimSpec, SimError> {
    serde_json::from_str(json).map_err(|e| SimError::new("spec", e.to_string()))
}
