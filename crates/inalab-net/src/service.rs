//! What the switch and the PS processes share: a control listener that serves each connection
//! on its own thread, and the stop-and-join of a service's threads.

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Most control connections served at once (each is a thread); more are closed at accept.
pub const MAX_CONNECTIONS: usize = 256;
/// A control connection that sends nothing for this long is closed (the switch lifts this for
/// a worker's join connection, which idles for its job's life, and shortens it for the PS's).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Accepts control connections until `stop` is set (the listener is polled, non-blocking),
/// handing each to `serve` on a thread named `name`, at most [`MAX_CONNECTIONS`] at once.
pub(crate) fn accept_loop(stop: &AtomicBool, listener: TcpListener, name: &str, serve: impl Fn(TcpStream) + Clone + Send + 'static) {
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    let live = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((conn, peer)) => {
                if live.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
                    eprintln!("inalab: refused a control connection from {peer}: {MAX_CONNECTIONS} are open");
                    continue; // dropped: closed
                }
                let _ = conn.set_nonblocking(false);
                let _ = conn.set_read_timeout(Some(IDLE_TIMEOUT));
                let (serve, live) = (serve.clone(), live.clone());
                live.fetch_add(1, Ordering::SeqCst);
                let spawned = std::thread::Builder::new().name(name.into()).spawn({
                    let live = live.clone();
                    move || {
                        serve(conn);
                        live.fetch_sub(1, Ordering::SeqCst);
                    }
                });
                if spawned.is_err() {
                    live.fetch_sub(1, Ordering::SeqCst);
                }
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
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
