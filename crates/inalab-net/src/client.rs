//! The worker library: joins a job at its switch, then allreduces float32 arrays through the
//! job's protocol (the worker endpoint the scheme registry plans, the same code the simulator
//! runs) on an I/O thread of its own.
//!
//! # Quantization
//! Switches sum integers; the worker endpoint the registry plans is wrapped in
//! `inalab_host::Quantized`, which converts float32 tensors as the scheme says (SwitchML: an
//! exponent agreed per tensor with one extra allreduce; ATP: one fixed scale, `ina.scale`) and
//! converts the sums back, the same layer the simulator runs. A value that cannot be converted
//! fails its request with an error naming it ([`NetError::Config`]).
//!
//! Requests run in submission order; every worker of a job must submit the same sizes in the
//! same order (as with any allreduce). Results are handed to a completion thread, never run on
//! the I/O thread, so a slow callback (one waiting for Python's GIL) does not stall packets.
//!
//! # Failure
//! The join connection to the switch stays open. If the switch reports that another worker
//! of the job died, the protocol is told (`HostProtocol::peer_failed`): one that goes on
//! without it (Rina) keeps the job; any other aborts the job at the switch, and every
//! pending and later request fails with a [`NetError::JobFailed`] that says why, as when
//! the switch fails the job or the connection drops.

use crate::clock::Clock;
use crate::control::{self, field, JobSpec};
use crate::host::{counters_json, HostIo};
use crate::udp::{wait, Udp, Waker};
use crate::NetError;
use inalab_core::{AppRequest, HostEvent, HostProtocol, Payload, TensorAttrs};
use inalab_scheme::{Role, TensorContext};
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::io::{BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Control address of the worker's switch.
    pub switch: SocketAddr,
    pub job: u32,
    pub rank: usize,
    pub world: usize,
    /// The job's scheme configuration, `{"scheme": NAME, ...}`: every worker of a job sends
    /// the same; what it leaves out takes the scheme's defaults (and the switch's, see
    /// [`crate::switch::SwitchOptions`]).
    pub config: Value,
    /// How long to wait for the other workers to join. Default 60 s.
    pub join_timeout: Duration,
    /// The deployment secret (see [`crate::switch::SwitchOptions::secret`]). `None`: the
    /// worker key in `INALAB_WORKER_KEY`, else the loaded secret.
    pub secret: Option<crate::auth::Secret>,
    /// The job's rendezvous secret: every worker of the job gives the same, and a joiner
    /// without it cannot take a rank. `None`: `INALAB_JOB_SECRET` if set, else none (then
    /// any worker of the deployment may take a free rank).
    pub job_secret: Option<String>,
    /// The rate of this worker's link, bits per second: frames leave no faster (a NIC's
    /// pace, [`crate::pace`]). `None` (default): as fast as the socket takes them.
    pub link_rate_bps: Option<u64>,
}

/// Longest [`Client::close`] waits for its protocol to go quiet (peers to acknowledge its
/// last data) before it stops: 5 s.
pub const LINGER: Duration = Duration::from_secs(5);

/// Longest [`Client::close`] of a worker whose peers may still need it (a scheme whose
/// workers serve their peers, `inalab_scheme::Scheme::workers_serve_peers`: Canary) waits for
/// every worker of the job to leave: 30 s. (No shorter sign tells that the peers are done: a
/// peer missing a result asks again only when its backed-off timeout expires, seconds later
/// under load; a linger that ended after 2 s of silence failed 2 runs in 40.)
pub const PEER_LINGER: Duration = Duration::from_secs(30);

/// How long a blocking [`Client::allreduce`] waits for its sum by default: 30 s.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// What a finished request hands its callback.
pub type Completion = Box<dyn FnOnce(Result<Vec<f32>, NetError>) + Send>;

struct State {
    spec: JobSpec,
    rank: usize,
    proto: Box<dyn HostProtocol>,
    io: HostIo,
    /// The join connection to the switch (`None`: started from a static fabric's spec).
    control: Option<TcpStream>,
    control_buf: Vec<u8>,
    /// Requests not handed to the protocol yet, with what the application told of the tensor.
    queue: VecDeque<(Vec<f32>, Option<TensorContext>, Completion)>,
    /// Requests in the protocol, by protocol request id.
    active: BTreeMap<u64, Completion>,
    next_id: u64,
    failed: Option<String>,
    /// The job failed (switch event or lost connection) before `close`: no `leave` to send.
    failed_before_close: bool,
    finished: Vec<(Completion, Result<Vec<f32>, NetError>)>,
    completed: u64,
    /// Control lines not yet written (the connection is non-blocking).
    control_out: Vec<u8>,
    /// `close` asked the I/O thread to say `leave` (and it did), and the switch said that
    /// every worker of the job left.
    leaving: bool,
    leave_sent: bool,
    all_left: bool,
    /// The protocol panicked (caught): it is not called again.
    broken: bool,
}

struct Inner {
    st: Mutex<State>,
    waker: Waker,
    stop: AtomicBool,
    clock: Clock,
}

/// A worker's connection to its job. See the module docs.
pub struct Client {
    inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
    pub node: u32,
    pub spec: JobSpec,
}

impl Client {
    /// Binds a UDP socket on the address the switch is reached from, joins the job and waits
    /// until every rank joined and the job is admitted, at most `opts.join_timeout` from the
    /// first connect on.
    pub fn connect(opts: ClientOptions) -> Result<Client, NetError> {
        Client::connect_with(opts, || Ok(()))
    }

    /// As [`Client::connect`]; `interrupted` is asked every 100 ms or so whether to give up
    /// (Python checks for Ctrl-C there), from the first connect to the end of the rendezvous.
    /// The join timeout bounds every step: connecting, the handshake (against a stalled or
    /// slow switch too) and the wait for the other ranks.
    pub fn connect_with(opts: ClientOptions, mut interrupted: impl FnMut() -> Result<(), NetError>) -> Result<Client, NetError> {
        if opts.world == 0 || opts.rank >= opts.world {
            return Err(NetError::Config(format!("rank must be in 0..world ({}), got {}", opts.world, opts.rank)));
        }
        let deadline = Instant::now() + opts.join_timeout;
        let stalled = |step: &str| {
            NetError::JobFailed(format!(
                "job {}: {step} the switch's control plane at {} within the join timeout ({:?}): the switch is stalled or overloaded, \
                 or that address is not an inalab switch",
                opts.job, opts.switch, opts.join_timeout
            ))
        };
        let mut conn = connect_by(opts.switch, deadline, &mut interrupted).map_err(|e| match e {
            ConnectError::Interrupted(e) => e,
            ConnectError::TimedOut => stalled("no connection to"),
            ConnectError::Io(e) => crate::unreachable(e, crate::SWITCH_CONTROL, opts.switch, "Start it first (`inalab switch`), or set INALAB_SWITCH (switch=) to its control address"),
        })?;
        let udp = Udp::bind(SocketAddr::new(conn.local_addr()?.ip(), 0))?;
        let cred = match &opts.secret {
            Some(s) => s.credential(control::AuthRole::Worker),
            None => crate::auth::Credential::worker().map_err(NetError::Config)?,
        };
        // Every read below waits at most until the deadline, in slices that ask `interrupted`.
        let mut reader = BufReader::new(Paced { conn: conn.try_clone()?, deadline, interrupted: &mut interrupted, why: None });
        let finish = |reader: &mut BufReader<Paced<'_>>, e: NetError, timed_out: NetError| match reader.get_mut().why.take() {
            Some(why) => why,
            None if matches!(&e, NetError::Io(io) if matches!(io.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)) => timed_out,
            None => e,
        };
        conn.set_write_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))))?;
        if let Err(e) = control::authenticate(&mut conn, &mut reader, &cred) {
            return Err(finish(&mut reader, e, stalled("no answer from")));
        }
        let mut msg = json!({"op": "join", "job": opts.job, "rank": opts.rank, "world": opts.world, "config": opts.config, "udp": udp.local_addr()?,
                             "timeout_s": opts.join_timeout.as_secs_f64()});
        if let Some(j) = opts.job_secret.clone().or_else(|| std::env::var("INALAB_JOB_SECRET").ok()) {
            msg["job_secret"] = json!(j);
        }
        control::send_line(&mut conn, &msg)?;
        let waited = NetError::JobFailed(format!("job {}: not every one of the {} workers joined within {:?}", opts.job, opts.world, opts.join_timeout));
        // Events may come before the reply (a peer's connection dropped while the switch was
        // still writing the replies) and after it: they are the job's, handled once it runs.
        let mut events = vec![];
        let reply = loop {
            match control::read_line(&mut reader) {
                Ok(Some(v)) if v.get("event").is_some() && v.get("ok").is_none() => events.push(v),
                Ok(Some(v)) => break control::check_ok(v)?,
                Ok(None) => return Err(NetError::JobFailed("the switch closed the control connection during the rendezvous".into())),
                Err(e) => return Err(finish(&mut reader, e, waited)),
            }
        };
        let mut leftover: Vec<u8> = events.iter().flat_map(|v| format!("{v}\n").into_bytes()).collect();
        leftover.extend_from_slice(reader.buffer());
        drop(reader);
        let spec: JobSpec = field(&reply, "spec")?;
        let node: u32 = field(&reply, "node")?;
        // The switch's data-plane address: the only source the worker accepts packets from;
        // a sharded switch that spreads the job over its threads lists each one's.
        let gateway: SocketAddr = field(&reply, "switch_udp")?;
        let threads: Vec<SocketAddr> = if reply.get("switch_threads").is_some() { field(&reply, "switch_threads")? } else { vec![] };
        conn.set_read_timeout(None)?;
        conn.set_write_timeout(None)?;
        conn.set_nonblocking(true)?;
        Client::start(spec, opts.rank, node, udp, gateway, threads, opts.link_rate_bps, Some(conn), leftover)
    }

    /// A worker of a static deployment (`inalab emulate`): rank `rank` of `spec`, with the
    /// UDP address the spec gives it, sending to its switch at `gateway`; no rendezvous and no
    /// control connection (nobody sends it `failed` events: calls time out instead).
    pub fn from_spec(spec: JobSpec, rank: usize, gateway: SocketAddr, link_rate_bps: Option<u64>) -> Result<Client, NetError> {
        let w = spec.workers.get(rank).ok_or_else(|| NetError::Config(format!("rank {rank} is not in 0..{} (the spec's workers)", spec.workers.len())))?;
        let (node, udp) = (w.node, Udp::bind(w.udp)?);
        Client::start(spec, rank, node, udp, gateway, vec![], link_rate_bps, None, vec![])
    }

    #[allow(clippy::too_many_arguments)]
    fn start(
        spec: JobSpec,
        rank: usize,
        node: u32,
        udp: Udp,
        gateway: SocketAddr,
        threads: Vec<SocketAddr>,
        link_rate_bps: Option<u64>,
        control: Option<TcpStream>,
        leftover: Vec<u8>,
    ) -> Result<Client, NetError> {
        let proto = spec.endpoint(node, Role::Worker { rank: rank as u32 })?;
        let mut io = HostIo::new(udp, gateway);
        if threads.len() > 1 {
            io.add_job_via(spec.job, spec.frame_mac()?, node, spec.gateways(threads)?);
        } else {
            io.add_job(spec.job, spec.frame_mac()?, node);
        }
        if let Some(rate) = link_rate_bps {
            io.pace(rate);
        }
        let inner = Arc::new(Inner {
            st: Mutex::new(State {
                spec: spec.clone(),
                rank,
                proto,
                io,
                control,
                control_buf: leftover,
                queue: VecDeque::new(),
                active: BTreeMap::new(),
                next_id: 0,
                failed: None,
                failed_before_close: false,
                finished: vec![],
                completed: 0,
                control_out: vec![],
                leaving: false,
                leave_sent: false,
                all_left: false,
                broken: false,
            }),
            waker: Waker::new()?,
            stop: AtomicBool::new(false),
            clock: Clock::new(),
        });
        crate::lock(&inner.st).parse_control(inner.clock.now());
        let (tx, rx) = mpsc::channel::<(Completion, Result<Vec<f32>, NetError>)>();
        let i = inner.clone();
        let io = std::thread::Builder::new().name("inalab-client-io".into()).spawn(move || io_loop(&i, tx))?;
        let done = std::thread::Builder::new().name("inalab-client-done".into()).spawn(move || {
            for (f, r) in rx {
                f(r);
            }
        })?;
        Ok(Client { inner, threads: vec![io, done], node, spec })
    }

    /// Starts an allreduce of `values`; `done` gets the element-wise sum over the job's
    /// workers (or why it failed) on the client's completion thread.
    pub fn allreduce_with(&self, values: Vec<f32>, done: Completion) {
        self.allreduce_about(values, None, done)
    }

    /// As [`Client::allreduce_with`], telling the scheme where the tensor stands in the
    /// model's iteration (`ctx`): a scheme that schedules by it (DSA's priority) computes its
    /// priority from it, the others ignore it.
    pub fn allreduce_about(&self, values: Vec<f32>, ctx: Option<TensorContext>, done: Completion) {
        let mut st = crate::lock(&self.inner.st);
        if let Some(reason) = &st.failed {
            let reason = reason.clone();
            drop(st);
            return done(Err(NetError::JobFailed(reason)));
        }
        st.queue.push_back((values, ctx, done));
        drop(st);
        self.inner.waker.wake();
    }

    /// Allreduce, blocking until the sum is back or [`CALL_TIMEOUT`] passed.
    pub fn allreduce(&self, values: Vec<f32>) -> Result<Vec<f32>, NetError> {
        self.allreduce_within(values, None, CALL_TIMEOUT, || Ok(()))
    }

    /// Allreduce, blocking until the sum is back, at most `timeout`; `interrupted` is asked
    /// every 100 ms whether to give up (Python checks for Ctrl-C there). A call that times out
    /// or is interrupted leaves its request in flight, so this worker is out of step with the
    /// others: the client is failed, and every later call says why.
    pub fn allreduce_within(
        &self,
        values: Vec<f32>,
        ctx: Option<TensorContext>,
        timeout: Duration,
        mut interrupted: impl FnMut() -> Result<(), NetError>,
    ) -> Result<Vec<f32>, NetError> {
        let (tx, rx) = mpsc::channel();
        self.allreduce_about(values, ctx, Box::new(move |r| drop(tx.send(r))));
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left.min(Duration::from_millis(100))) {
                Ok(r) => return r,
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(NetError::JobFailed("the client stopped".into())),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Err(e) = interrupted() {
                        self.give_up(format!("an allreduce was interrupted ({e})"));
                        return Err(e);
                    }
                    if left.is_zero() {
                        let reason = format!(
                            "no result within {timeout:?}: another rank stalled or never made this call, or the network loses every packet \
                             (the job's workers are now out of step)"
                        );
                        self.give_up(reason.clone());
                        return Err(NetError::JobFailed(reason));
                    }
                }
            }
        }
    }

    /// Fails this client's job here: pending and later calls end with `reason`.
    fn give_up(&self, reason: String) {
        crate::lock(&self.inner.st).fail(reason);
        self.inner.waker.wake();
    }

    /// Worker `rank` of the job died (a deployment without a switch control plane, such as
    /// an emulation's static fabric, learns it from its orchestrator): the protocol goes on
    /// without it, or every pending and later request fails. Returns whether it goes on.
    pub fn peer_failed(&self, rank: u32) -> bool {
        let now = self.inner.clock.now();
        let mut st = crate::lock(&self.inner.st);
        let goes_on = st.proto.peer_failed(now, rank);
        if !goes_on {
            st.fail(format!("worker rank {rank} of the job failed, and its protocol does not go on without it"));
        }
        drop(st);
        self.inner.waker.wake();
        goes_on
    }

    /// Protocol and I/O counters.
    pub fn stats(&self) -> Value {
        let st = crate::lock(&self.inner.st);
        json!({"node": self.node, "rank": st.rank, "job": st.spec.job, "completed": st.completed,
               "failed": st.failed, "protocol": counters_json(st.proto.as_ref()), "io": st.io.stats()})
    }

    /// Tells the switch this worker is done (the job is released when all are) and stops.
    pub fn close(mut self) {
        self.shutdown(&mut || Ok(()));
    }

    /// As [`Client::close`]; `interrupted` is asked every few milliseconds whether to stop
    /// lingering (Python checks for Ctrl-C there).
    pub fn close_with(mut self, mut interrupted: impl FnMut() -> Result<(), NetError>) {
        self.shutdown(&mut interrupted);
    }

    /// Waits, at most `longest`, until `done` holds, the job failed or its protocol broke, or
    /// `interrupted` says to stop.
    fn linger(&self, longest: Duration, interrupted: &mut dyn FnMut() -> Result<(), NetError>, done: impl Fn(&State) -> bool) {
        let deadline = Instant::now() + longest;
        while Instant::now() < deadline {
            let st = crate::lock(&self.inner.st);
            if st.failed.is_some() || st.broken || done(&st) {
                break;
            }
            drop(st);
            if interrupted().is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn shutdown(&mut self, interrupted: &mut dyn FnMut() -> Result<(), NetError>) {
        if self.threads.is_empty() {
            return;
        }
        let serves_peers = self.spec.scheme().is_ok_and(|s| s.workers_serve_peers());
        let has_control = crate::lock(&self.inner.st).control.is_some();
        if serves_peers && has_control {
            // Say `leave` now and keep serving the peers (a Canary leader restores a result a
            // slower peer lost) until the switch says every worker left or the job failed; at
            // most PEER_LINGER.
            crate::lock(&self.inner.st).leaving = true;
            self.inner.waker.wake();
            self.linger(PEER_LINGER, interrupted, |st| st.all_left);
        } else {
            // Linger while the protocol still has a timer armed (data a peer has not
            // acknowledged: in a ring, this worker's last chunk may still be on its way to its
            // successor, whose allreduce would never finish if we stopped resending it), at
            // most LINGER.
            self.linger(LINGER, interrupted, |st| st.active.is_empty() && st.proto.poll_timeout().is_none());
        }
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.waker.wake();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // With the I/O thread gone, say `leave` (unless it did) and wait for the switch to
        // record it, so that once every worker's close returned the job is released (its
        // aggregators free).
        let st = crate::lock(&self.inner.st);
        if st.failed_before_close || st.leave_sent {
            return;
        }
        let Some(Ok(mut conn)) = st.control.as_ref().map(TcpStream::try_clone) else { return };
        let _ = conn.set_nonblocking(false);
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = conn.set_write_timeout(Some(Duration::from_secs(5)));
        if control::send_line(&mut conn, &json!({"op": "leave"})).is_err() {
            return;
        }
        let mut r = BufReader::new(conn);
        while let Ok(Some(v)) = control::read_line(&mut r) {
            if v.get("ok").is_some() {
                break;
            }
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.shutdown(&mut || Ok(()));
    }
}

fn io_loop(inner: &Inner, done_tx: mpsc::Sender<(Completion, Result<Vec<f32>, NetError>)>) {
    let (udp_fd, ctl_fd) = {
        let st = crate::lock(&inner.st);
        // A negative descriptor is ignored by ppoll: no control connection, nothing to read.
        (st.io.udp.fd(), st.control.as_ref().map_or(-1, |c| c.as_raw_fd()))
    };
    loop {
        let stopping = inner.stop.load(Ordering::SeqCst);
        let finished = {
            let mut st = crate::lock(&inner.st);
            std::mem::take(&mut st.finished)
        };
        for f in finished {
            let _ = done_tx.send(f);
        }
        if stopping {
            let mut st = crate::lock(&inner.st);
            st.failed_before_close = st.failed.is_some();
            st.fail("the client was closed".into());
            for f in std::mem::take(&mut st.finished) {
                let _ = done_tx.send(f);
            }
            return;
        }
        let next = {
            let st = crate::lock(&inner.st);
            [st.proto.as_ref().poll_timeout(), st.io.wake_at()].into_iter().flatten().min()
        };
        let timeout = next.map_or(Duration::from_millis(50), |at| inner.clock.until(at).min(Duration::from_millis(50)));
        let ready = wait(&[(udp_fd, libc::POLLIN), (inner.waker.fd(), libc::POLLIN), (ctl_fd, libc::POLLIN)], Some(timeout))
            .unwrap_or_else(|_| vec![false; 3]);
        let mut st = crate::lock(&inner.st);
        if ready[1] {
            inner.waker.drain();
        }
        if st.leaving && !st.leave_sent && st.failed.is_none() {
            st.leave_sent = true;
            st.queue_control(&json!({"op": "leave"}));
        }
        st.flush_control();
        // The protocol's own code runs here: a panic fails this worker's calls with its
        // message, rather than leave them waiting on a dead thread.
        let served = crate::guarded(|| {
            if ready[2] {
                st.read_control(inner.clock.now());
            }
            st.pump(&inner.clock);
        });
        if let Err(m) = served {
            st.broken = true;
            st.fail(format!("the job's protocol failed on this worker (a bug): {m}"));
        }
    }
}

impl State {
    /// Drains the socket (answering every batch with what the window then releases), and only
    /// then fires due timers: a timer must not fire for a packet that already waits in the
    /// socket.
    fn pump(&mut self, clock: &Clock) {
        if self.broken {
            // Nothing is handed to a protocol that panicked; the socket is drained.
            while self.io.recv(|_| {}).unwrap_or(0) > 0 {}
            return;
        }
        for _ in 0..64 {
            let now = clock.now();
            let proto = self.proto.as_mut();
            let n = self.io.recv(|pkt| proto.handle_packet(now, pkt)).unwrap_or(0);
            self.step(now);
            if n == 0 {
                break;
            }
        }
        let now = clock.now();
        if self.proto.poll_timeout().is_some_and(|t| t <= now) {
            self.proto.handle_timeout(now);
            self.step(now);
        }
    }

    /// Completions, new requests, and the packets the window releases.
    fn step(&mut self, now: u64) {
        self.start_queued(now);
        self.collect_events();
        self.io.transmit(now, self.proto.as_mut());
        self.io.flush();
    }

    fn start_queued(&mut self, now: u64) {
        if self.failed.is_some() {
            return;
        }
        while let Some((values, ctx, done)) = self.queue.pop_front() {
            if values.is_empty() {
                self.finished.push((done, Ok(vec![])));
                continue;
            }
            self.next_id += 1;
            let id = self.next_id;
            let bytes = values.len() as u64 * 4;
            let attrs = match (ctx, self.spec.scheme()) {
                (Some(c), Ok(scheme)) => TensorAttrs { layer: c.layer.saturating_sub(1), priority: scheme.priority(&self.spec.config, &c) },
                _ => TensorAttrs::default(),
            };
            self.active.insert(id, done);
            self.proto.submit(now, AppRequest::Allreduce { id, bytes, data: Some(Payload::F32(values)), attrs });
        }
    }

    fn collect_events(&mut self) {
        while let Some(ev) = self.proto.poll_event() {
            let (id, result) = match ev {
                HostEvent::Done { id, data: Some(Payload::F32(v)) } => {
                    self.completed += 1;
                    (id, Ok(v))
                }
                HostEvent::Done { id, .. } => (id, Err(NetError::Protocol("a result without float values".into()))),
                HostEvent::Failed { id, reason } => (id, Err(NetError::Protocol(reason))),
                HostEvent::Rejected { id, reason } => (id, Err(NetError::Config(reason))),
                HostEvent::Received { .. } => continue,
            };
            if let Some(done) = self.active.remove(&id) {
                self.finished.push((done, result));
            }
        }
    }

    /// Reads control events (non-blocking); a `failed` event or a closed connection fails
    /// the job.
    fn read_control(&mut self, now: u64) {
        let mut buf = [0u8; 4096];
        loop {
            let Some(control) = self.control.as_mut() else { return };
            match control.read(&mut buf) {
                Ok(0) => return self.fail("the switch closed the control connection".into()),
                Ok(n) => self.control_buf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return self.fail(format!("control connection to the switch failed: {e}")),
            }
        }
        self.parse_control(now);
    }

    /// Handles the complete control lines received so far.
    fn parse_control(&mut self, now: u64) {
        while let Some(i) = self.control_buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.control_buf.drain(..=i).collect();
            let Ok(v) = serde_json::from_slice::<Value>(&line) else { continue };
            let reason = v["reason"].as_str().unwrap_or("unknown").to_string();
            if v["event"] == "failed" {
                self.fail(reason);
            } else if v["event"] == "all_left" {
                self.all_left = true;
            } else if v["event"] == "peer_failed" {
                // Another worker died: the protocol goes on without it (Rina rebuilds its
                // ring) or the job ends for every worker.
                let rank = v["rank"].as_u64().and_then(|r| u32::try_from(r).ok());
                if rank.is_some_and(|r| self.proto.peer_failed(now, r)) {
                    self.step(now);
                } else {
                    self.queue_control(&json!({"op": "abort", "job": self.spec.job, "reason": reason}));
                    self.fail(reason);
                }
            }
        }
    }

    /// Queues a control line and writes what the (non-blocking) connection takes.
    fn queue_control(&mut self, v: &Value) {
        if self.control.is_none() {
            return;
        }
        self.control_out.extend_from_slice(serde_json::to_string(v).expect("JSON values serialize").as_bytes());
        self.control_out.push(b'\n');
        self.flush_control();
    }

    fn flush_control(&mut self) {
        while !self.control_out.is_empty() {
            let Some(c) = self.control.as_mut() else { return };
            match c.write(&self.control_out) {
                Ok(0) => return,
                Ok(n) => drop(self.control_out.drain(..n)),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(_) => {
                    // The connection is gone; read_control says so.
                    self.control_out.clear();
                    return;
                }
            }
        }
    }

    fn fail(&mut self, reason: String) {
        if self.failed.is_none() {
            self.failed = Some(reason.clone());
        }
        let reason = self.failed.clone().expect("set");
        for (_, done) in std::mem::take(&mut self.active) {
            self.finished.push((done, Err(NetError::JobFailed(reason.clone()))));
        }
        for (_, _, done) in std::mem::take(&mut self.queue) {
            self.finished.push((done, Err(NetError::JobFailed(reason.clone()))));
        }
    }
}

/// How often a blocking wait of the client asks whether to give up (Ctrl-C).
const POLL_SLICE: Duration = Duration::from_millis(100);

enum ConnectError {
    Interrupted(NetError),
    TimedOut,
    Io(std::io::Error),
}

/// Connects to `addr` by `deadline`, in slices that ask `interrupted` between them (a refused
/// connection fails at once).
fn connect_by(addr: SocketAddr, deadline: Instant, interrupted: &mut dyn FnMut() -> Result<(), NetError>) -> Result<TcpStream, ConnectError> {
    loop {
        interrupted().map_err(ConnectError::Interrupted)?;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ConnectError::TimedOut);
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(1))) {
            Ok(c) => return Ok(c),
            Err(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => continue,
            Err(e) => return Err(ConnectError::Io(e)),
        }
    }
}

/// A control connection read with a deadline, in slices of [`POLL_SLICE`] that ask
/// `interrupted` between them: a switch that stalls, or trickles its answer, cannot hold a
/// worker past its timeout, and Ctrl-C ends the wait. An interruption is kept in `why`.
struct Paced<'a> {
    conn: TcpStream,
    deadline: Instant,
    interrupted: &'a mut dyn FnMut() -> Result<(), NetError>,
    why: Option<NetError>,
}

impl Read for Paced<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if let Err(e) = (self.interrupted)() {
                self.why = Some(e);
                return Err(std::io::Error::other("interrupted"));
            }
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ErrorKind::TimedOut.into());
            }
            self.conn.set_read_timeout(Some(left.min(POLL_SLICE)))?;
            match self.conn.read(buf) {
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
                r => return r,
            }
        }
    }
}
