//! What the switch and the PS processes share: a control listener that serves each connection
//! on its own thread, and the stop-and-join of a service's threads.

use std::collections::HashMap;
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Most control connections served at once (each is a thread); more are closed at accept.
pub const MAX_CONNECTIONS: usize = 256;
/// Most control connections from one source address at once: half the cap, so that one host
/// (a tenant, or an off-path attacker) cannot take every connection; a host may still run up
/// to this many workers (each holds its join connection). More are closed at accept.
pub const MAX_PER_SOURCE: usize = 128;
/// A control connection that sends nothing for this long is closed (the switch lifts this for
/// a worker's join connection, which idles for its job's life, and shortens it for the PS's).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Kernel send buffer of a control connection: the longest line (see
/// `crate::control::MAX_LINE_BYTES`).
const SEND_BUFFER_BYTES: usize = 256 << 10;
/// Longest a write to one control connection may block: a peer that does not read costs only
/// its own connection, which is closed when a write gives up.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Pending connections the kernel queues for the accept loop. Past the queue a SYN is dropped
/// and its client waits a whole retransmission timeout (1 s) to try again: a burst of
/// connections from one host (an attacker's, or a 128-worker job joining at once) must not
/// delay everyone else's `stats` (issue #36; found in CI with the platform's default of 128).
const ACCEPT_BACKLOG: i32 = 1024;

/// A control listener bound to `addr`, with [`ACCEPT_BACKLOG`] (capped by the kernel's
/// `net.core.somaxconn`) and the address reusable at once after a restart.
pub(crate) fn control_listener(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(ACCEPT_BACKLOG)?;
    Ok(socket.into())
}

/// Accepts control connections until `stop` is set (the listener is polled, non-blocking),
/// handing each to `serve` on a thread named `name`, at most [`MAX_CONNECTIONS`] at once and
/// [`MAX_PER_SOURCE`] from one address; each reads with [`IDLE_TIMEOUT`] and writes with
/// [`WRITE_TIMEOUT`]. When `stop` is set, every connection still open is shut down: a stopped
/// switch or PS answers nobody (a PS attached to it sees it gone and attaches again).
pub(crate) fn accept_loop(stop: &AtomicBool, listener: TcpListener, name: &str, serve: impl Fn(TcpStream) + Clone + Send + 'static) {
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    let live = Arc::new(AtomicUsize::new(0));
    let per_source: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    let open: Arc<Mutex<HashMap<u64, TcpStream>>> = Arc::default();
    let mut next_id = 0u64;
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((conn, peer)) => {
                if live.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
                    eprintln!("inalab: refused a control connection from {peer}: {MAX_CONNECTIONS} are open");
                    continue; // dropped: closed
                }
                {
                    let mut by_source = crate::lock(&per_source);
                    let n = by_source.entry(peer.ip()).or_default();
                    if *n >= MAX_PER_SOURCE {
                        eprintln!("inalab: refused a control connection from {peer}: {MAX_PER_SOURCE} from {} are open", peer.ip());
                        continue;
                    }
                    *n += 1;
                }
                let _ = conn.set_nonblocking(false);
                let _ = conn.set_read_timeout(Some(IDLE_TIMEOUT));
                let _ = conn.set_write_timeout(Some(WRITE_TIMEOUT));
                // A control line is at most 256 KiB: more kernel buffer only lets a peer that
                // reads nothing queue more replies (loopback autotunes to 4 MiB a connection).
                let _ = socket2::SockRef::from(&conn).set_send_buffer_size(SEND_BUFFER_BYTES);
                live.fetch_add(1, Ordering::SeqCst);
                // Counted until the connection's thread ends (or fails to start).
                next_id += 1;
                if let Ok(c) = conn.try_clone() {
                    crate::lock(&open).insert(next_id, c);
                }
                let slot = Slot { live: live.clone(), per_source: per_source.clone(), ip: peer.ip(), open: open.clone(), id: next_id };
                let serve = serve.clone();
                let _ = std::thread::Builder::new().name(name.into()).spawn(move || {
                    let _slot = slot;
                    // (A panic in serving one connection ends that connection only.)
                    let _ = crate::guarded(|| serve(conn));
                });
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    for (_, c) in crate::lock(&open).drain() {
        let _ = c.shutdown(std::net::Shutdown::Both);
    }
}

/// A served connection's replies, and how long writing them has blocked in all. A peer that
/// reads nothing can still have the kernel take its replies a few bytes at a time (its
/// receive queue collapsed under memory pressure), each line finishing within
/// [`WRITE_TIMEOUT`], and so hold its connection as long as it pipelines requests (issue #36:
/// 256 such connections held a PS for as long as they liked). Once writes have blocked for
/// [`WRITE_TIMEOUT`] in all, the connection is closed. A peer that reads never blocks a write
/// (a millisecond per line is not counted).
pub(crate) struct Replies {
    pub(crate) conn: TcpStream,
    blocked: Duration,
}

impl Replies {
    pub(crate) fn new(conn: TcpStream) -> Replies {
        Replies { conn, blocked: Duration::ZERO }
    }

    /// Writes one line; an error once the connection's writes blocked too long in all.
    pub(crate) fn send(&mut self, v: &serde_json::Value) -> std::io::Result<()> {
        let started = std::time::Instant::now();
        let sent = crate::control::send_line(&mut self.conn, v);
        self.blocked += started.elapsed().saturating_sub(Duration::from_millis(1));
        if sent.is_ok() && self.blocked > WRITE_TIMEOUT {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the peer does not read its replies"));
        }
        sent
    }
}

/// A served connection's place in the counts, given back when dropped.
struct Slot {
    live: Arc<AtomicUsize>,
    per_source: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
    open: Arc<Mutex<HashMap<u64, TcpStream>>>,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        crate::lock(&self.open).remove(&self.id);
        self.live.fetch_sub(1, Ordering::SeqCst);
        let mut by_source = crate::lock(&self.per_source);
        if let Some(n) = by_source.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                by_source.remove(&self.ip);
            }
        }
    }
}

/// Sets `stop` and waits for `threads` (a no-op the second time).
pub(crate) fn shut_down(stop: &AtomicBool, threads: &mut Vec<JoinHandle<()>>) {
    stop.store(true, Ordering::SeqCst);
    for t in threads.drain(..) {
        let _ = t.join();
    }
}
