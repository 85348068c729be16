//! Batched UDP I/O: `recvmmsg` with UDP GRO on receive and `sendmsg` with UDP GSO on send
//! (through `quinn-udp`, which falls back to one datagram per call where the kernel lacks
//! them), plus `ppoll` to wait on several descriptors with a sub-millisecond timeout.

use quinn_udp::{RecvMeta, Transmit, UdpSocketState, BATCH_SIZE};
use std::io::{self, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// Socket buffer size asked for (bytes); the kernel may cap it at `net.core.rmem_max`.
pub const SOCKET_BUFFER_BYTES: usize = 8 << 20;
/// Largest datagram (or GRO-coalesced train) one receive buffer holds.
const RECV_BUF_BYTES: usize = 64 * 1024;
/// A GSO train stays below this many bytes (the IP datagram limit).
const MAX_TRAIN_BYTES: usize = 60_000;

/// I/O counters: syscalls against datagrams show the batching.
#[derive(Debug, Default, Clone, Copy)]
pub struct IoStats {
    pub datagrams_sent: u64,
    pub datagrams_received: u64,
    pub send_calls: u64,
    pub recv_calls: u64,
    pub send_errors: u64,
}

/// Frames waiting to be sent: one buffer, with (destination, byte range) per datagram.
#[derive(Default)]
pub struct TxBatch {
    buf: Vec<u8>,
    items: Vec<(SocketAddr, Range<usize>)>,
}

impl TxBatch {
    /// Appends one datagram for `dst`, written by `write` into the shared buffer.
    pub fn push(&mut self, dst: SocketAddr, write: impl FnOnce(&mut Vec<u8>)) {
        let start = self.buf.len();
        write(&mut self.buf);
        self.items.push((dst, start..self.buf.len()));
    }
    pub fn len(&self) -> usize {
        self.items.len()
    }
    /// The datagrams queued, in order: (destination, bytes).
    pub fn iter(&self) -> impl Iterator<Item = (SocketAddr, &[u8])> + '_ {
        self.items.iter().map(|(dst, r)| (*dst, &self.buf[r.clone()]))
    }
    /// Bytes queued in the batch.
    pub fn bytes(&self) -> usize {
        self.buf.len()
    }
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// A non-blocking UDP socket with batched send and receive.
pub struct Udp {
    sock: UdpSocket,
    state: UdpSocketState,
    bufs: Vec<Vec<u8>>,
    metas: Vec<RecvMeta>,
    /// Gathers a GSO train whose datagrams are not adjacent in the send buffer.
    scratch: Vec<u8>,
    pub stats: IoStats,
}

impl Udp {
    pub fn bind(addr: SocketAddr) -> io::Result<Udp> {
        let sock = UdpSocket::bind(addr)?;
        let state = UdpSocketState::new((&sock).into())?;
        let s2 = socket2::SockRef::from(&sock);
        // Ask for big buffers; as root the FORCE variants pass the sysctl caps.
        let _ = s2.set_recv_buffer_size(SOCKET_BUFFER_BYTES);
        let _ = s2.set_send_buffer_size(SOCKET_BUFFER_BYTES);
        force_buffer(sock.as_raw_fd(), libc::SO_RCVBUFFORCE);
        force_buffer(sock.as_raw_fd(), libc::SO_SNDBUFFORCE);
        Ok(Udp {
            sock,
            state,
            bufs: vec![vec![0u8; RECV_BUF_BYTES]; BATCH_SIZE],
            metas: vec![RecvMeta::default(); BATCH_SIZE],
            scratch: Vec::with_capacity(MAX_TRAIN_BYTES),
            stats: IoStats::default(),
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Segments one send may carry (1 without GSO).
    pub fn max_gso_segments(&self) -> usize {
        self.state.max_gso_segments()
    }

    /// Datagrams the kernel may coalesce into one receive (1 without GRO).
    pub fn gro_segments(&self) -> usize {
        self.state.gro_segments()
    }

    /// One `recvmmsg`: calls `f(source, datagram)` for every datagram queued (GRO trains
    /// split into their datagrams). Returns how many; 0 when nothing was queued.
    pub fn recv_batch(&mut self, mut f: impl FnMut(SocketAddr, &[u8])) -> io::Result<usize> {
        let mut slices: Vec<IoSliceMut<'_>> = self.bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
        self.stats.recv_calls += 1;
        let n = match self.state.recv((&self.sock).into(), &mut slices, &mut self.metas) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
            // ICMP port unreachable from an earlier send to a closed peer: not ours to fail on.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return Ok(0),
            Err(e) => return Err(e),
        };
        let mut count = 0;
        for (meta, buf) in self.metas[..n].iter().zip(&slices) {
            let stride = meta.stride.max(1);
            for seg in buf[..meta.len].chunks(stride) {
                f(meta.addr, seg);
                count += 1;
            }
        }
        self.stats.datagrams_received += count as u64;
        Ok(count)
    }

    /// Sends every datagram of `tx` and empties it, in order per destination. Datagrams to one
    /// destination of one size (the last may be shorter) go out as one GSO train. A full
    /// socket buffer waits for room; other errors are counted and the datagram dropped
    /// (UDP offers no more, and the protocols recover lost packets).
    pub fn send_batch(&mut self, tx: &mut TxBatch) {
        let max_segs = self.max_gso_segments().max(1);
        if max_segs > 1 {
            // Group by destination (stable: each destination's order is kept) so a switch's
            // interleaved copies to N workers become N trains instead of single datagrams.
            tx.items.sort_by_key(|(dst, _)| *dst);
        }
        let mut i = 0;
        while i < tx.items.len() {
            let (dst, ref first) = tx.items[i];
            let seg = first.len();
            let mut j = i + 1;
            while j < tx.items.len() && j - i < max_segs {
                let (d, ref r) = tx.items[j];
                if d != dst || r.len() > seg || (j - i + 1) * seg > MAX_TRAIN_BYTES {
                    break;
                }
                j += 1;
                if r.len() < seg {
                    break;
                }
            }
            // After grouping, a train's datagrams may lie apart in the buffer: gather them.
            let contiguous = tx.items[i..j].windows(2).all(|w| w[0].1.end == w[1].1.start);
            let contents = if contiguous {
                &tx.buf[first.start..tx.items[j - 1].1.end]
            } else {
                self.scratch.clear();
                tx.items[i..j].iter().for_each(|(_, r)| self.scratch.extend_from_slice(&tx.buf[r.clone()]));
                &self.scratch[..]
            };
            let transmit = Transmit {
                destination: dst,
                ecn: None,
                contents,
                segment_size: (j - i > 1).then_some(seg),
                src_ip: None,
            };
            loop {
                self.stats.send_calls += 1;
                match self.state.try_send((&self.sock).into(), &transmit) {
                    Ok(()) => {
                        self.stats.datagrams_sent += (j - i) as u64;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        let _ = wait(&[(self.fd(), libc::POLLOUT)], Some(Duration::from_millis(1)));
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        self.stats.send_errors += 1;
                        break;
                    }
                }
            }
            i = j;
        }
        tx.items.clear();
        tx.buf.clear();
    }
}

fn force_buffer(fd: RawFd, opt: libc::c_int) {
    let v = SOCKET_BUFFER_BYTES as libc::c_int;
    // SAFETY: setsockopt with a valid fd and a pointer to an int of the given length.
    unsafe {
        libc::setsockopt(fd, libc::SOL_SOCKET, opt, &v as *const _ as *const libc::c_void, std::mem::size_of::<libc::c_int>() as u32);
    }
}

/// Waits until one of `fds` (descriptor, poll events) is ready or `timeout` passes (`None`:
/// forever). Returns the ready flags per descriptor.
pub fn wait(fds: &[(RawFd, libc::c_short)], timeout: Option<Duration>) -> io::Result<Vec<bool>> {
    let mut p: Vec<libc::pollfd> = fds.iter().map(|&(fd, events)| libc::pollfd { fd, events, revents: 0 }).collect();
    let ts = timeout.map(|t| libc::timespec { tv_sec: t.as_secs() as libc::time_t, tv_nsec: t.subsec_nanos() as libc::c_long });
    let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `p` is a valid array of pollfd for the call's duration; `tsp` null or valid.
    let r = unsafe { libc::ppoll(p.as_mut_ptr(), p.len() as libc::nfds_t, tsp, std::ptr::null()) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(e);
    }
    Ok(p.iter().map(|x| x.revents != 0).collect())
}

/// An eventfd another thread writes to wake a thread blocked in [`wait`].
pub struct Waker(RawFd);

impl Waker {
    pub fn new() -> io::Result<Waker> {
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Waker(fd))
    }
    pub fn fd(&self) -> RawFd {
        self.0
    }
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd.
        unsafe { libc::write(self.0, &one as *const u64 as *const libc::c_void, 8) };
    }
    /// Clears pending wake-ups.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our non-blocking eventfd.
        unsafe { libc::read(self.0, &mut v as *mut u64 as *mut libc::c_void, 8) };
    }
}

impl Drop for Waker {
    fn drop(&mut self) {
        // SAFETY: we own the descriptor.
        unsafe { libc::close(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_round_trip_with_trains_and_a_short_tail() {
        let mut a = Udp::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut b = Udp::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let dst = b.local_addr().unwrap();
        let mut tx = TxBatch::default();
        for i in 0..100u32 {
            let len = if i == 99 { 7 } else { 100 };
            tx.push(dst, |buf| buf.extend((0..len).map(|k| (i as u8).wrapping_add(k as u8))));
        }
        a.send_batch(&mut tx);
        assert!(tx.is_empty());
        let mut got = vec![];
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while got.len() < 100 && std::time::Instant::now() < deadline {
            wait(&[(b.fd(), libc::POLLIN)], Some(Duration::from_millis(50))).unwrap();
            b.recv_batch(|_, d| got.push(d.to_vec())).unwrap();
        }
        assert_eq!(got.len(), 100);
        for (i, d) in got.iter().enumerate() {
            assert_eq!(d.len(), if i == 99 { 7 } else { 100 });
            assert_eq!(d[0], i as u8);
        }
        assert!(a.stats.send_calls < 100 || a.max_gso_segments() == 1, "GSO batches trains: {:?}", a.stats);
    }

    #[test]
    fn interleaved_destinations_arrive_intact_and_in_order() {
        let mut a = Udp::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut rx: Vec<Udp> = (0..3).map(|_| Udp::bind("127.0.0.1:0".parse().unwrap()).unwrap()).collect();
        let dsts: Vec<SocketAddr> = rx.iter().map(|u| u.local_addr().unwrap()).collect();
        let mut tx = TxBatch::default();
        for i in 0..90u8 {
            tx.push(dsts[i as usize % 3], |b| b.extend([i; 50]));
        }
        a.send_batch(&mut tx);
        for (k, u) in rx.iter_mut().enumerate() {
            let mut got = vec![];
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while got.len() < 30 && std::time::Instant::now() < deadline {
                wait(&[(u.fd(), libc::POLLIN)], Some(Duration::from_millis(50))).unwrap();
                u.recv_batch(|_, d| got.push(d.to_vec())).unwrap();
            }
            let want: Vec<Vec<u8>> = (0..90u8).filter(|i| *i as usize % 3 == k).map(|i| vec![i; 50]).collect();
            assert_eq!(got, want, "receiver {k}");
        }
    }
}

/// The largest UDP payload a socket bound to `local` sends without IP fragmentation: the
/// smallest MTU among the interfaces that hold `local`'s address (every interface that is up,
/// for an unspecified address), less the IP and UDP headers. The sockets set don't-fragment
/// (quinn-udp, for GSO), so a larger datagram would fail to send. 1500-B Ethernet where an
/// interface's MTU cannot be read.
pub fn max_payload_bytes(local: SocketAddr) -> usize {
    let ip_udp = if local.is_ipv4() { 20 + 8 } else { 40 + 8 };
    interface_mtu(local.ip()).unwrap_or(1500).saturating_sub(ip_udp)
}

/// The smallest MTU of the interfaces holding `ip` (all that are up, for an unspecified one).
fn interface_mtu(ip: std::net::IpAddr) -> Option<usize> {
    let mut names = vec![];
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `ifap` with a list we only read and then free once.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return None;
    }
    let mut cur = ifap;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr of the family it names.
        let addr = unsafe {
            match (*ifa.ifa_addr).sa_family as i32 {
                libc::AF_INET => {
                    let sa = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    Some(std::net::IpAddr::from(u32::from_be(sa.sin_addr.s_addr).to_be_bytes()))
                }
                libc::AF_INET6 => Some(std::net::IpAddr::from((*(ifa.ifa_addr as *const libc::sockaddr_in6)).sin6_addr.s6_addr)),
                _ => None,
            }
        };
        if addr.is_some_and(|a| ip.is_unspecified() || a == ip) {
            // SAFETY: ifa_name is a NUL-terminated string owned by the list.
            names.push(unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned());
        }
    }
    // SAFETY: the list from getifaddrs above, freed once.
    unsafe { libc::freeifaddrs(ifap) };
    names.iter().filter_map(|n| std::fs::read_to_string(format!("/sys/class/net/{n}/mtu")).ok()?.trim().parse().ok()).min()
}

#[cfg(test)]
mod mtu_tests {
    use super::*;

    #[test]
    fn loopback_takes_large_datagrams_and_a_bound_address_is_its_interfaces() {
        // Linux's loopback MTU is 65536 (64 KiB, less IP and UDP headers).
        let lo = std::fs::read_to_string("/sys/class/net/lo/mtu").unwrap().trim().parse::<usize>().unwrap();
        assert_eq!(max_payload_bytes("127.0.0.1:0".parse().unwrap()), lo - 28);
        // Every interface that is up, loopback among them, bounds an unspecified address.
        assert!(max_payload_bytes("0.0.0.0:0".parse().unwrap()) <= lo - 28);
        // An address no interface holds: the 1500-B default.
        assert_eq!(max_payload_bytes("192.0.2.77:0".parse().unwrap()), 1472);
    }
}
