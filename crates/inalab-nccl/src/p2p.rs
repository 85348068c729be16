//! Point-to-point over TCP: NCCL takes a plugin's CollNet only with its point-to-point
//! network, which then carries the job's other traffic between nodes (rings, trees,
//! send/recv). One TCP connection per NCCL connection (they are one-way), messages framed
//! as a 12-byte header (size as u64, tag as i32, little-endian) and the bytes, sent and
//! received in the order posted, as NCCL matches them. Progress happens in `test`, on
//! non-blocking sockets: nothing here blocks but `connect`'s TCP handshake (10 s at most).
//!
//! A handle (128 bytes, opaque to NCCL) is `INAP`, the listener's nonce (8 bytes, which the
//! connecting side sends back first, so a stray connection is refused) and its address as
//! text, NUL-terminated. The address is `INALAB_NCCL_ADDR` if set, else the one this host
//! reaches the switch from (`INALAB_SWITCH`), else 127.0.0.1.

use crate::{entry, free, handle, log, put, result, settings, Level};
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

const MAGIC: &[u8; 4] = b"INAP";
const HEADER: usize = 12;
/// Longest a `connect` waits for the TCP handshake and an `accept` for the hello.
const HANDSHAKE: Duration = Duration::from_secs(10);

type Failure = (c_int, String);

fn sys(what: &str) -> impl Fn(std::io::Error) -> Failure + '_ {
    move |e| (result::SYSTEM_ERROR, format!("{what}: {e}"))
}

pub struct Listen {
    listener: TcpListener,
    nonce: u64,
}

/// One direction of one NCCL connection, and its requests in the order posted.
pub struct Conn {
    stream: TcpStream,
    pending: VecDeque<*mut Request>,
}

pub struct Request {
    conn: *mut Conn,
    kind: Kind,
    done: bool,
    error: Option<String>,
}

enum Kind {
    Send { data: *const u8, size: usize, header: [u8; HEADER], off: usize },
    Recv { data: *mut u8, cap: usize, header: [u8; HEADER], off: usize, size: Option<usize> },
}

#[no_mangle]
pub extern "C" fn inalab_nccl_listen(handle: *mut c_void, listen_comm: *mut *mut c_void) -> c_int {
    entry("listen", || {
        let listener = TcpListener::bind(SocketAddr::new(settings::advertised_ip().map_err(|e| (result::INVALID_ARGUMENT, e))?, 0)).map_err(sys("binding a TCP listener"))?;
        listener.set_nonblocking(true).map_err(sys("a non-blocking listener"))?;
        let nonce = handle::nonce();
        handle::write(handle, MAGIC, nonce, &listener.local_addr().map_err(sys("the listener's address"))?.to_string())?;
        put(listen_comm, Box::into_raw(Box::new(Listen { listener, nonce })).cast(), "listenComm")
    })
}

fn conn(stream: TcpStream) -> Result<*mut c_void, Failure> {
    stream.set_nodelay(true).map_err(sys("TCP_NODELAY"))?;
    stream.set_nonblocking(true).map_err(sys("a non-blocking connection"))?;
    Ok(Box::into_raw(Box::new(Conn { stream, pending: VecDeque::new() })).cast())
}

#[no_mangle]
pub extern "C" fn inalab_nccl_connect(handle: *const c_void, send_comm: *mut *mut c_void) -> c_int {
    entry("connect", || {
        let (nonce, text) = handle::read(handle, MAGIC)?;
        let addr: SocketAddr = text.parse().map_err(|_| (result::INVALID_ARGUMENT, format!("a handle's address {text:?}")))?;
        let mut s = TcpStream::connect_timeout(&addr, HANDSHAKE).map_err(sys(&format!("connecting to {addr}")))?;
        s.set_write_timeout(Some(HANDSHAKE)).map_err(sys("a write timeout"))?;
        let mut hello = MAGIC.to_vec();
        hello.extend_from_slice(&nonce.to_le_bytes());
        s.write_all(&hello).map_err(sys(&format!("greeting {addr}")))?;
        put(send_comm, conn(s)?, "sendComm")
    })
}

#[no_mangle]
pub extern "C" fn inalab_nccl_accept(listen_comm: *mut c_void, recv_comm: *mut *mut c_void) -> c_int {
    entry("accept", || {
        // SAFETY: made by `inalab_nccl_listen`, alive until closeListen.
        let l = unsafe { &*listen_comm.cast::<Listen>() };
        let mut s = match l.listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return put(recv_comm, std::ptr::null_mut(), "recvComm"),
            Err(e) => return Err(sys("accepting")(e)),
        };
        s.set_nonblocking(false).map_err(sys("a blocking hello"))?;
        s.set_read_timeout(Some(HANDSHAKE)).map_err(sys("a read timeout"))?;
        let mut hello = [0u8; 12];
        s.read_exact(&mut hello).map_err(sys("reading a connection's hello"))?;
        if &hello[..4] != MAGIC || u64::from_le_bytes(hello[4..].try_into().unwrap()) != l.nonce {
            // Not NCCL's peer: refuse it and wait for the right one.
            log(Level::Warn, "accept: a connection without this listener's nonce, closed");
            return put(recv_comm, std::ptr::null_mut(), "recvComm");
        }
        s.set_read_timeout(None).map_err(sys("clearing the read timeout"))?;
        put(recv_comm, conn(s)?, "recvComm")
    })
}

fn post(comm: *mut c_void, kind: Kind, request: *mut *mut c_void) -> Result<(), Failure> {
    if comm.is_null() {
        return Err((result::INVALID_ARGUMENT, "comm is a null pointer".into()));
    }
    let c = comm.cast::<Conn>();
    let r = Box::into_raw(Box::new(Request { conn: c, kind, done: false, error: None }));
    // SAFETY: made by connect/accept, alive until closed; NCCL calls one comm from one thread.
    unsafe { (*c).pending.push_back(r) };
    put(request, r.cast(), "request")
}

#[no_mangle]
pub extern "C" fn inalab_nccl_isend(send_comm: *mut c_void, data: *const c_void, size: usize, tag: c_int, request: *mut *mut c_void) -> c_int {
    entry("isend", || {
        let mut header = [0u8; HEADER];
        header[..8].copy_from_slice(&(size as u64).to_le_bytes());
        header[8..].copy_from_slice(&tag.to_le_bytes());
        post(send_comm, Kind::Send { data: data.cast(), size, header, off: 0 }, request)
    })
}

#[no_mangle]
pub extern "C" fn inalab_nccl_irecv(recv_comm: *mut c_void, data: *mut c_void, size: usize, request: *mut *mut c_void) -> c_int {
    entry("irecv", || post(recv_comm, Kind::Recv { data: data.cast(), cap: size, header: [0; HEADER], off: 0, size: None }, request))
}

/// Moves a request's bytes as far as the socket lets: `Ok(true)` when it is complete.
fn step(s: &mut TcpStream, kind: &mut Kind) -> std::io::Result<bool> {
    loop {
        match kind {
            Kind::Send { data, size, header, off } => {
                let total = HEADER + *size;
                if *off == total {
                    return Ok(true);
                }
                let buf: &[u8] = if *off < HEADER {
                    &header[*off..]
                } else {
                    // SAFETY: NCCL keeps the buffer alive until `test` reports the send done.
                    unsafe { std::slice::from_raw_parts(data.add(*off - HEADER), total - *off) }
                };
                match s.write(buf) {
                    Ok(0) => return Err(ErrorKind::WriteZero.into()),
                    Ok(n) => *off += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            Kind::Recv { data, cap, header, off, size } => {
                if let Some(n) = *size {
                    if *off == HEADER + n {
                        return Ok(true);
                    }
                }
                let buf: &mut [u8] = match *size {
                    None => &mut header[*off..],
                    // SAFETY: NCCL keeps `cap` bytes writable until `test` reports the receive done.
                    Some(n) => unsafe { std::slice::from_raw_parts_mut(data.add(*off - HEADER), HEADER + n - *off) },
                };
                match s.read(buf) {
                    Ok(0) => return Err(std::io::Error::new(ErrorKind::UnexpectedEof, "the peer closed the connection")),
                    Ok(n) => *off += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
                if size.is_none() && *off == HEADER {
                    let n = u64::from_le_bytes(header[..8].try_into().unwrap()) as usize;
                    if n > *cap {
                        return Err(std::io::Error::new(ErrorKind::InvalidData, format!("a message of {n} bytes for a receive of {cap}")));
                    }
                    *size = Some(n);
                }
            }
        }
    }
}

fn progress(c: &mut Conn) {
    while let Some(&r) = c.pending.front() {
        // SAFETY: a pending request is alive: it is freed only by `test` once off the queue.
        let req = unsafe { &mut *r };
        match step(&mut c.stream, &mut req.kind) {
            Ok(true) => {
                req.done = true;
                c.pending.pop_front();
            }
            Ok(false) => return,
            Err(e) => {
                // The byte stream is lost: every request on the connection fails.
                for r in c.pending.drain(..) {
                    // SAFETY: as above.
                    unsafe { (*r).error = Some(e.to_string()) };
                }
                return;
            }
        }
    }
}

#[no_mangle]
pub extern "C" fn inalab_nccl_test(request: *mut c_void, done: *mut c_int, size: *mut c_int) -> c_int {
    entry("test", || {
        if request.is_null() {
            return Err((result::INVALID_ARGUMENT, "request is a null pointer".into()));
        }
        let r = request.cast::<Request>();
        // SAFETY: made by isend/irecv, not yet reported done; its connection is open.
        let req = unsafe { &mut *r };
        if !req.done && req.error.is_none() {
            progress(unsafe { &mut *req.conn });
        }
        if let Some(e) = req.error.take() {
            drop(unsafe { Box::from_raw(r) });
            return Err((result::SYSTEM_ERROR, e));
        }
        if !req.done {
            return put(done, 0, "done");
        }
        let n = match req.kind {
            Kind::Send { size, .. } => size,
            Kind::Recv { size, .. } => size.unwrap_or(0),
        };
        // SAFETY: reported done once, then freed.
        drop(unsafe { Box::from_raw(r) });
        if !size.is_null() {
            put(size, n.min(c_int::MAX as usize) as c_int, "size")?;
        }
        put(done, 1, "done")
    })
}

#[no_mangle]
pub extern "C" fn inalab_nccl_close(comm: *mut c_void) -> c_int {
    free::<Conn>(comm, "closeSend/closeRecv")
}

#[no_mangle]
pub extern "C" fn inalab_nccl_close_listen(listen_comm: *mut c_void) -> c_int {
    free::<Listen>(listen_comm, "closeListen")
}
