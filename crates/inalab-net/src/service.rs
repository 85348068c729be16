//! What the switch and the PS processes share: a control listener that serves each connection
//! on its own thread, and the stop-and-join of a service's threads.

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Accepts control connections until `stop` is set (the listener is polled, non-blocking),
/// handing each to `serve` on a thread named `name`.
pub(crate) fn accept_loop(stop: &AtomicBool, listener: TcpListener, name: &str, serve: impl Fn(TcpStream) + Clone + Send + 'static) {
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((conn, _)) => {
                let _ = conn.set_nonblocking(false);
                let serve = serve.clone();
                let _ = std::thread::Builder::new().name(name.into()).spawn(move || serve(conn));
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
