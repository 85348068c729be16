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

/// Where a run is, as [`Sim::run`] reports it to its driver.
#[derive(Debug, Clone, Copy)]
pub struct ProgressReport {
    /// Estimated share of the work done, in [0, 1]: completed allreduces, or simulated time
    /// against the jobs' expected ends (so that it moves within one long allreduce) or the
    /// stop time, whichever is further; 1 at the end.
    pub fraction: f64,
    pub events: u64,
    /// Simulated time, s.
    pub sim_time_s: f64,
}

/// Called about every [`REPORT_EVERY_MS`] of wall time and once at the end; returning
/// `ControlFlow::Break` stops the run there (its result says "interrupted"). A driver checks
/// for Ctrl-C here, so a run stops within a fraction of a second.
pub type Progress<'a> = &'a mut dyn FnMut(&ProgressReport) -> std::ops::ControlFlow<()>;

/// How often, at most, a run reports progress, ms of wall time.
pub const REPORT_EVERY_MS: u128 = 100;

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
