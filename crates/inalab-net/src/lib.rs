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
use std::sync::{Mutex, MutexGuard};

/// A switch's control-plane address when none is given (`inalab switch`'s, the PS's and the
/// workers' default).
pub const DEFAULT_CONTROL: &str = "127.0.0.1:9100";

/// Locks `m`, taking over a lock poisoned by a panic. Every place where a scheme's or job's own
/// code runs under a lock catches its panics ([`guarded`]), so a poisoned lock means a panic in
/// the driver between two consistent states; serving on is better than a switch or PS that
/// panics at every later request while its process lives on (issue #36).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `f`, turning a panic into an error holding its message: the boundary around a scheme's
/// or job's own code (a plan, a program's admission, a packet's handling), so that one job's
/// panic refuses or fails that job alone and never takes the data plane or its lock with it.
pub fn guarded<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| panic_message(p.as_ref()))
}

/// The message of a caught panic.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    let text = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
    inalab_scheme::clip(&text.unwrap_or_else(|| "a panic without a message".into()), 300)
}

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
    /// A control plane could not be reached: the message names the address, the cause and
    /// what to start (Python: `ConnectionError`).
    Unreachable(String),
    /// A switch or PS whose data plane stopped (a bug, caught): it serves nothing any more,
    /// and says why at every request.
    Stopped(String),
}

/// What a peer at `addr` is, for messages: "the switch's control plane (inalab switch
/// --control)".
pub const SWITCH_CONTROL: &str = "the switch's control plane";

/// A failed connection to the control plane `what` at `addr`, naming the cause and the fix.
pub fn unreachable(e: std::io::Error, what: &str, addr: std::net::SocketAddr, start: &str) -> NetError {
    use std::io::ErrorKind::*;
    let cause = match e.kind() {
        ConnectionRefused => "connection refused: nothing listens there".to_string(),
        TimedOut | WouldBlock => "no answer in time: the machine is down, unreachable or firewalled".to_string(),
        _ => e.to_string(),
    };
    NetError::Unreachable(format!("cannot reach {what} at {addr}: {cause}. {start}"))
}

/// A socket that could not be bound to `addr`, the address given as `option`, naming the
/// cause and the fix.
pub fn bind_error(e: std::io::Error, option: &str, addr: std::net::SocketAddr) -> NetError {
    use std::io::ErrorKind::*;
    let why = match e.kind() {
        AddrInUse => format!(
            "port {} is already in use (another inalab switch or PS, or another program, listens there): stop it, or give {option} another port",
            addr.port()
        ),
        AddrNotAvailable => format!("{} is not an address of this machine: give {option} one of its addresses, or 0.0.0.0 for all", addr.ip()),
        PermissionDenied => format!("not allowed to bind port {} (ports below 1024 need root): give {option} a port from 1024 up", addr.port()),
        _ => e.to_string(),
    };
    NetError::Config(format!("{option} {addr}: {why}"))
}

impl fmt::Display for NetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetError::Io(e) => write!(f, "I/O error: {e}"),
            NetError::Config(m) | NetError::Protocol(m) | NetError::Remote(m) | NetError::TooLong(m) | NetError::Auth(m) => f.write_str(m),
            NetError::JobFailed(m) => write!(f, "job failed: {m}"),
            NetError::Unreachable(m) | NetError::Stopped(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for NetError {}

impl From<std::io::Error> for NetError {
    fn from(e: std::io::Error) -> Self {
        NetError::Io(e)
    }
}
