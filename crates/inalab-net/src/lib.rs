//! The UDP runtime: real processes that run inalab's sans-IO protocol code over UDP.
//!
//! - [`switch`]: the software switch, the switch programs of the schemes it is started with
//!   (`inalab_core::Programs`) between UDP neighbours, with its control plane.
//! - [`host`]: the host-side driver of [`inalab_core::HostProtocol`]s, used by the parameter
//!   server ([`ps`]) and the worker [`client`].
//! - [`control`]: the control-plane protocol (JSON lines over TCP) and the job description
//!   every party plans its part from through the scheme registry (`inalab_scheme`).
//! - [`udp`]: batched socket I/O (recvmmsg + GRO, sendmsg + GSO).
//! - [`auth`]: the per-job keys and tags that authenticate every data frame.
//!
//! Packets travel as [`inalab_core::frame`]s, one per datagram, each followed by its job's tag. None of the modules here
//! decides anything a protocol decides: they move frames, keep time and run timers.

pub mod auth;
pub mod capture;
pub mod clock;
pub mod udp;
pub mod control;
pub mod switch;
pub mod fabric;
pub mod host;
pub mod pace;
pub mod ps;
pub mod client;
mod service;

use std::fmt;

/// Errors of the runtime, each with a message a user can act on.
#[derive(Debug)]
pub enum NetError {
    Io(std::io::Error),
    /// A setting or job description that cannot work.
    Config(String),
    /// A malformed control message.
    Protocol(String),
    /// A control line over the length limit: the connection is closed.
    TooLong(String),
    /// Authentication failed or is missing.
    Auth(String),
    /// The other side refused (its message).
    Remote(String),
    /// The job failed (a worker died, the switch went away).
    JobFailed(String),
}

impl fmt::Display for NetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetError::Io(e) => write!(f, "I/O error: {e}"),
            NetError::Config(m) | NetError::Protocol(m) | NetError::Remote(m) | NetError::TooLong(m) | NetError::Auth(m) => f.write_str(m),
            NetError::JobFailed(m) => write!(f, "job failed: {m}"),
        }
    }
}

impl std::error::Error for NetError {}

impl From<std::io::Error> for NetError {
    fn from(e: std::io::Error) -> Self {
        NetError::Io(e)
    }
}
