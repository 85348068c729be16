//! The parameter server process: the server endpoint of every admitted job whose scheme has
//! one (ATP's `AtpServer`), behind its switch, as the scheme registry plans it.
//! It attaches to its switch's control plane at start and keeps that connection, pinging every
//! second: the switch fails the PS's jobs when it closes or goes silent, and refuses a second
//! PS while it lives. Jobs are admitted and released by the switch (`admit` / `release` with
//! the job's [`JobSpec`]).
//!
//! # Recovery
//! A PS that loses its switch (the switch restarted, or either of them stalled past the
//! switch's liveness limit) says so and attaches again, every second until it succeeds, naming
//! the jobs it still runs; the switch answers with those it still serves, and the PS frees the
//! others (their workers were told they failed). Later jobs then find it as before.
//!
//! # Failure of one job
//! A server endpoint that panics (a bug in its protocol) is caught: that job is dropped here
//! and reported to the switch (`{"op": "fail"}` on the attach connection), which fails it on
//! every worker; the PS and its other jobs go on.

use crate::clock::Clock;
use crate::control::{self, err, field, ok, JobSpec, CONTROL_TIMEOUT};
use crate::service::{accept_loop, shut_down};
use crate::fabric::HostFabric;
use crate::host::{counters_json, HostIo};
use crate::udp::{wait, Udp};
use crate::NetError;
use inalab_core::{HostProtocol, NodeId};
use inalab_scheme::Role;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::BufReader;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// PS settings.
#[derive(Debug, Clone)]
pub struct PsOptions {
    /// Node id, unique in the deployment. Default 2.
    pub node: NodeId,
    /// Data-plane UDP address. Default 127.0.0.1:9200.
    pub udp: SocketAddr,
    /// Control-plane TCP address. Default 127.0.0.1:9300.
    pub control: SocketAddr,
    /// Control address of the ATP switch the PS is attached to. Default 127.0.0.1:9100.
    pub switch: SocketAddr,
    /// The deployment secret (see [`crate::switch::SwitchOptions::secret`]). Default: loaded.
    pub secret: Option<crate::auth::Secret>,
    /// The rate of the PS's link, bits per second: its datagrams leave no faster (see
    /// [`crate::pace`]). Default none.
    pub link_rate_bps: Option<u64>,
    /// A static deployment (`inalab emulate`): the switch's data-plane address and the jobs,
    /// admitted at start; the PS then attaches to no switch. Default none.
    pub fabric: Option<HostFabric>,
}

impl Default for PsOptions {
    fn default() -> Self {
        PsOptions {
            node: 2,
            udp: "127.0.0.1:9200".parse().expect("valid"),
            control: "127.0.0.1:9300".parse().expect("valid"),
            switch: crate::DEFAULT_CONTROL.parse().expect("valid"),
            secret: None,
            link_rate_bps: None,
            fabric: None,
        }
    }
}

struct PsState {
    io: HostIo,
    servers: BTreeMap<u32, Box<dyn HostProtocol>>,
    /// Packets for jobs not admitted here, dropped.
    unadmitted: u64,
    /// Jobs whose server endpoint panicked (dropped), with why, not yet reported to the switch.
    failed: Vec<(u32, String)>,
    /// Server endpoints that panicked, and times this PS attached to its switch.
    panics: u64,
    attaches: u64,
}

struct Shared {
    node: NodeId,
    secret: crate::auth::Secret,
    st: Mutex<PsState>,
    stop: AtomicBool,
    /// Why the data-plane thread stopped, if it did (then `stats` and every request say it).
    dead: Mutex<Option<String>>,
}

pub struct PsHandle {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    pub udp_addr: SocketAddr,
    pub control_addr: SocketAddr,
}

impl PsHandle {
    pub fn start(opts: PsOptions) -> Result<PsHandle, NetError> {
        control::check_node(opts.node)?;
        let secret = match &opts.secret {
            Some(s) => s.clone(),
            None => crate::auth::Secret::load().map_err(NetError::Config)?,
        };
        let udp = Udp::bind(opts.udp).map_err(|e| crate::bind_error(e, "--udp", opts.udp))?;
        let listener = crate::service::control_listener(opts.control).map_err(|e| crate::bind_error(e, "--control", opts.control))?;
        let (udp_addr, control_addr) = (udp.local_addr()?, listener.local_addr()?);
        if let Some(f) = &opts.fabric {
            let shared = Arc::new(Shared { node: opts.node, secret, st: Mutex::new(PsState::new(udp, f.gateway, opts.link_rate_bps)), stop: AtomicBool::new(false), dead: Mutex::new(None) });
            for spec in &f.jobs {
                admit(&shared, spec, None).map_err(|e| NetError::Config(format!("fabric: job {}: {e}", spec.job)))?;
            }
            let threads = spawn(&shared, listener)?;
            return Ok(PsHandle { shared, threads, udp_addr, control_addr });
        }
        let place = Place { node: opts.node, switch: opts.switch, udp: udp_addr, control: control_addr };
        let (attach, replies, reply) = attach(&place, &secret, &[]).map_err(|e| match e {
            NetError::Io(e) => crate::unreachable(
                e,
                crate::SWITCH_CONTROL,
                opts.switch,
                "Start the switch first (`inalab switch --program SCHEME`, the scheme of the jobs this PS serves), or give --switch its control address",
            ),
            e => e,
        })?;
        let gateway: SocketAddr = field(&reply, "udp")?;
        let shared = Arc::new(Shared { node: opts.node, secret, st: Mutex::new(PsState::new(udp, gateway, opts.link_rate_bps)), stop: AtomicBool::new(false), dead: Mutex::new(None) });
        crate::lock(&shared.st).attaches = 1;
        let mut threads = spawn(&shared, listener)?;
        let s = shared.clone();
        threads.push(std::thread::Builder::new().name("inalab-ps-ping".into()).spawn(move || heartbeat(&s, place, attach, replies))?);
        Ok(PsHandle { shared, threads, udp_addr, control_addr })
    }

    pub fn stats(&self) -> Value {
        stats(&self.shared)
    }

    /// `Ok` while the PS serves; an error saying why once its data plane stopped.
    pub fn health(&self) -> Result<(), NetError> {
        match crate::lock(&self.shared.dead).as_ref() {
            Some(why) => Err(NetError::Stopped(why.clone())),
            None => Ok(()),
        }
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        shut_down(&self.shared.stop, &mut self.threads);
    }
}

impl Drop for PsHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Where a PS is and which switch it attaches to.
#[derive(Debug, Clone, Copy)]
struct Place {
    node: NodeId,
    switch: SocketAddr,
    udp: SocketAddr,
    control: SocketAddr,
}

/// Attaches to the switch as its PS, naming the jobs it runs (`jobs`); returns the connection,
/// its reader and the switch's reply (its data-plane address `udp`, the `jobs` it still
/// serves here).
fn attach(p: &Place, secret: &crate::auth::Secret, jobs: &[u32]) -> Result<(TcpStream, BufReader<TcpStream>, Value), NetError> {
    let mut conn = TcpStream::connect_timeout(&p.switch, CONTROL_TIMEOUT)?;
    conn.set_read_timeout(Some(CONTROL_TIMEOUT))?;
    conn.set_write_timeout(Some(CONTROL_TIMEOUT))?;
    let msg = json!({"op": "attach", "role": "ps", "node": p.node, "jobs": jobs,
                     "udp": control::announce(p.udp, p.switch), "control": control::announce(p.control, p.switch)});
    let mut replies = BufReader::new(conn.try_clone()?);
    control::authenticate(&mut conn, &mut replies, &secret.credential(control::AuthRole::Ps))?;
    control::send_line(&mut conn, &msg)?;
    let reply = control::read_line(&mut replies)?.ok_or_else(|| NetError::Protocol(format!("{} closed the control connection", p.switch)))?;
    Ok((conn, replies, control::check_ok(reply)?))
}

/// Pings the switch every second on the attach connection until the PS stops, reporting jobs
/// whose server failed. When the switch is lost (no answer within [`CONTROL_TIMEOUT`], the
/// connection closed), it says so and attaches again every second until it can (see the
/// module docs, "Recovery").
fn heartbeat(s: &Shared, place: Place, mut conn: TcpStream, mut replies: BufReader<TcpStream>) {
    loop {
        if sleep_unless_stopped(s, Duration::from_secs(1)) {
            return;
        }
        let failed = std::mem::take(&mut crate::lock(&s.st).failed);
        let mut alive = true;
        for (job, reason) in &failed {
            alive &= exchange(&mut conn, &mut replies, &json!({"op": "fail", "job": job, "reason": reason})).is_ok();
        }
        alive = alive && exchange(&mut conn, &mut replies, &json!({"op": "ping"})).is_ok();
        if alive {
            continue;
        }
        let lost_at = std::time::Instant::now();
        eprintln!(
            "inalab ps: lost the switch's control plane at {}: the jobs it had here failed there. Attaching again every second \
             (if the switch is gone for good, start it again: `inalab switch ...`)",
            place.switch
        );
        let mut tries = 0u64;
        (conn, replies) = loop {
            if sleep_unless_stopped(s, if tries == 0 { Duration::ZERO } else { Duration::from_secs(1) }) {
                return;
            }
            tries += 1;
            let held: Vec<u32> = crate::lock(&s.st).servers.keys().copied().collect();
            match attach(&place, &s.secret, &held) {
                Ok((c, r, reply)) => {
                    reattached(s, &reply);
                    eprintln!("inalab ps: attached to the switch at {} again after {:.1} s", place.switch, lost_at.elapsed().as_secs_f64());
                    break (c, r);
                }
                Err(e) if tries % 30 == 1 => eprintln!("inalab ps: the switch at {} does not take this PS yet: {e}", place.switch),
                Err(_) => {}
            }
        };
    }
}

/// Sleeps `d` in short steps; true if the PS is stopping.
fn sleep_unless_stopped(s: &Shared, d: Duration) -> bool {
    let until = std::time::Instant::now() + d;
    loop {
        if s.stop.load(Ordering::Relaxed) {
            return true;
        }
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

/// One request on the attach connection and its answer.
fn exchange(conn: &mut TcpStream, replies: &mut BufReader<TcpStream>, v: &Value) -> Result<Value, NetError> {
    control::send_line(conn, v)?;
    let reply = control::read_line(replies)?.ok_or_else(|| NetError::Protocol("the switch closed the connection".into()))?;
    control::check_ok(reply)
}

/// The switch took this PS back: its data plane may be at a new address, and only the jobs it
/// lists are still served; the others' servers are freed.
fn reattached(s: &Shared, reply: &Value) {
    let kept: Vec<u32> = field(reply, "jobs").unwrap_or_default();
    let mut st = crate::lock(&s.st);
    st.attaches += 1;
    if let Ok(gateway) = field::<SocketAddr>(reply, "udp") {
        st.io.gateway = gateway;
    }
    let dropped: Vec<u32> = st.servers.keys().copied().filter(|j| !kept.contains(j)).collect();
    for job in dropped {
        st.servers.remove(&job);
        st.io.remove_job(job);
    }
}

fn stats(s: &Shared) -> Value {
    let st = crate::lock(&s.st);
    let jobs: serde_json::Map<String, Value> = st.servers.iter().map(|(j, p)| (j.to_string(), counters_json(p.as_ref()))).collect();
    let data_plane = match crate::lock(&s.dead).as_ref() {
        Some(why) => json!({"stopped": why}),
        None => json!("running"),
    };
    json!({"node": s.node, "io": st.io.stats(), "unadmitted": st.unadmitted, "jobs": jobs, "server_panics": st.panics, "attaches": st.attaches, "data_plane": data_plane})
}

fn data_loop(s: &Shared) {
    let clock = Clock::new();
    let fd = crate::lock(&s.st).io.udp.fd();
    while !s.stop.load(Ordering::Relaxed) {
        let next = {
            let st = crate::lock(&s.st);
            st.servers.values().filter_map(|p| p.poll_timeout()).chain(st.io.wake_at()).min()
        };
        let timeout = next.map_or(Duration::from_millis(10), |at| clock.until(at).min(Duration::from_millis(10)));
        let _ = wait(&[(fd, libc::POLLIN)], Some(timeout));
        let mut guard = crate::lock(&s.st);
        let st = &mut *guard;
        for _ in 0..32 {
            let now = clock.now();
            let (servers, unadmitted) = (&mut st.servers, &mut st.unadmitted);
            // A server's panic is caught (see the module docs): its job is dropped, the rest
            // go on.
            let mut panicked: Vec<(u32, String)> = vec![];
            let n = st.io.recv(|pkt| {
                let job = pkt.header.job();
                match job.and_then(|j| servers.get_mut(&j).map(|p| (j, p))) {
                    Some((j, p)) => {
                        if let Err(m) = crate::guarded(|| p.handle_packet(now, pkt)) {
                            panicked.push((j, format!("its server endpoint panicked handling a packet: {m}")));
                        }
                    }
                    None => *unadmitted += 1,
                }
            });
            let now = clock.now();
            for (&j, p) in st.servers.iter_mut() {
                let io = &mut st.io;
                let served = crate::guarded(|| {
                    if p.poll_timeout().is_some_and(|t| t <= now) {
                        p.handle_timeout(now);
                    }
                    io.transmit(now, p.as_mut());
                    while p.poll_event().is_some() {}
                });
                if let Err(m) = served {
                    panicked.push((j, format!("its server endpoint panicked: {m}")));
                }
            }
            for (job, reason) in panicked {
                if st.servers.remove(&job).is_some() {
                    eprintln!("inalab ps: job {job}: {reason}; the job is dropped here and failed at the switch, the others go on");
                    st.io.remove_job(job);
                    st.panics += 1;
                    st.failed.push((job, reason));
                }
            }
            st.io.flush();
            if !matches!(n, Ok(k) if k > 0) {
                break;
            }
        }
    }
}

impl PsState {
    fn new(udp: Udp, gateway: SocketAddr, link_rate_bps: Option<u64>) -> PsState {
        let mut io = HostIo::new(udp, gateway);
        if let Some(rate) = link_rate_bps {
            io.pace(rate);
        }
        PsState { io, servers: BTreeMap::new(), unadmitted: 0, failed: vec![], panics: 0, attaches: 0 }
    }
}

/// The data-plane thread and the control listener.
fn spawn(shared: &Arc<Shared>, listener: TcpListener) -> Result<Vec<JoinHandle<()>>, NetError> {
    let s = shared.clone();
    let data = std::thread::Builder::new().name("inalab-ps-dp".into()).spawn(move || {
        if let Err(msg) = crate::guarded(|| data_loop(&s)) {
            let why = format!("the parameter server's data plane stopped: {msg}");
            eprintln!("inalab ps: {why}");
            *crate::lock(&s.dead) = Some(why);
        }
    })?;
    let s = shared.clone();
    let ctl = std::thread::Builder::new().name("inalab-ps-cp".into()).spawn(move || {
        let conn_shared = s.clone();
        accept_loop(&s.stop, listener, "inalab-ps-conn", move |conn| serve(&conn_shared, conn))
    })?;
    Ok(vec![data, ctl])
}

/// Runs the PS's part of `spec`.
fn admit(s: &Shared, spec: &JobSpec, via: Option<Vec<SocketAddr>>) -> Result<(), NetError> {
    let index = spec.servers.iter().position(|p| p.node == s.node).ok_or_else(|| NetError::Config(format!("job {}: node {} is not one of its servers", spec.job, s.node)))?;
    // The scheme's own code: a panic refuses this job alone.
    let server = crate::guarded(|| spec.endpoint(s.node, Role::Server { index: index as u32 }))
        .map_err(|p| NetError::Config(format!("job {}: refused: setting up its server panicked ({p})", spec.job)))??;
    let mac = spec.frame_mac()?;
    let via = via.map(|addrs| spec.gateways(addrs)).transpose()?;
    let mut st = crate::lock(&s.st);
    if st.servers.contains_key(&spec.job) {
        return Err(NetError::Config(format!("job {} is already admitted at the PS", spec.job)));
    }
    st.servers.insert(spec.job, server);
    let me = s.node | crate::auth::SERVER_BIT;
    match via {
        Some(via) => st.io.add_job_via(spec.job, mac, me, via),
        None => st.io.add_job(spec.job, mac, me),
    }
    Ok(())
}

fn serve(s: &Shared, conn: TcpStream) {
    let Ok(w) = conn.try_clone() else { return };
    let mut w = crate::service::Replies::new(w);
    let mut r = BufReader::new(conn);
    let mut auth = control::ServerAuth::new(s.secret.clone());
    while let Ok(Some(msg)) = control::read_line(&mut r) {
        let op = msg["op"].as_str().unwrap_or("");
        if let Some(r) = auth.handle(op, &msg) {
            let failed = r.is_err();
            if w.send(&r.unwrap_or_else(err)).is_err() || failed {
                break; // a failed authentication closes the connection (as at the switch)
            }
            continue;
        }
        let dead = crate::lock(&s.dead).clone();
        let reply = match dead {
            // A PS whose data plane stopped serves nothing: it says why.
            Some(why) => Err(NetError::Stopped(why)),
            // Only the switch admits and releases jobs here.
            None if matches!(op, "admit" | "release") => auth.require(op, &[control::AuthRole::Switch]).and_then(|_| handle(s, &msg)),
            None => handle(s, &msg),
        };
        if w.send(&reply.unwrap_or_else(err)).is_err() {
            break;
        }
    }
}

fn handle(s: &Shared, msg: &Value) -> Result<Value, NetError> {
    match msg["op"].as_str().unwrap_or("") {
        "admit" => {
            let spec: JobSpec = field(msg, "spec")?;
            // A sharded switch runs the job on threads of their own addresses.
            let via: Option<Vec<SocketAddr>> = msg.get("gateways").filter(|g| !g.is_null()).map(|_| field(msg, "gateways")).transpose()?;
            admit(s, &spec, via)?;
            Ok(ok(json!({})))
        }
        "release" => {
            let job: u32 = field(msg, "job")?;
            let mut st = crate::lock(&s.st);
            st.servers.remove(&job);
            st.io.remove_job(job);
            Ok(ok(json!({})))
        }
        "stats" => Ok(ok(stats(s))),
        other => Err(NetError::Protocol(format!("field `op`: {:?} is not one of \"admit\", \"release\", \"stats\"", inalab_scheme::clip(other, 64)))),
    }
}

#[cfg(test)]
mod tests {
    //! Issue #36: a server endpoint that panics fails its own job, alone; the PS serves on.
    use super::*;
    use crate::client::{Client, ClientOptions};
    use crate::switch::{SwitchHandle, SwitchOptions};
    use inalab_core::{AppRequest, Endpoint, HostEvent, Packet, Time};
    use std::time::Duration;

    fn any_port() -> SocketAddr {
        "127.0.0.1:0".parse().unwrap()
    }

    /// A job's server endpoint with a bug: it panics on every packet.
    struct Broken(Box<dyn HostProtocol>);

    impl HostProtocol for Broken {
        fn endpoint(&self) -> Endpoint {
            self.0.endpoint()
        }
        fn submit(&mut self, now: Time, req: AppRequest) {
            self.0.submit(now, req)
        }
        fn handle_packet(&mut self, _now: Time, _pkt: Packet) {
            panic!("a broken server's packet handling");
        }
        fn handle_timeout(&mut self, now: Time) {
            self.0.handle_timeout(now)
        }
        fn poll_transmit(&mut self, now: Time) -> Option<Packet> {
            self.0.poll_transmit(now)
        }
        fn poll_timeout(&self) -> Option<Time> {
            self.0.poll_timeout()
        }
        fn poll_event(&mut self) -> Option<HostEvent> {
            self.0.poll_event()
        }
    }

    fn pair(sw: &SwitchHandle, job: u32) -> (Client, Client) {
        let switch = sw.control_addr;
        let opts = move |rank| ClientOptions {
            switch,
            job,
            rank,
            world: 2,
            config: serde_json::json!({"scheme": "atp"}),
            join_timeout: Duration::from_secs(20),
            secret: None,
            job_secret: None,
            link_rate_bps: None,
        };
        let other = std::thread::spawn(move || Client::connect(opts(1)));
        let a = Client::connect(opts(0)).unwrap();
        (a, other.join().unwrap().unwrap())
    }

    fn allreduce(a: &Client, b: &Client, x: f32, y: f32) -> (Result<Vec<f32>, NetError>, Result<Vec<f32>, NetError>) {
        let t = Duration::from_secs(20);
        std::thread::scope(|sc| {
            let h = sc.spawn(|| b.allreduce_within(vec![y; 1000], None, t, || Ok(())));
            (a.allreduce_within(vec![x; 1000], None, t, || Ok(())), h.join().unwrap())
        })
    }

    #[test]
    fn a_panicking_server_endpoint_fails_its_own_job_and_the_ps_serves_on() {
        let sw = SwitchHandle::start(SwitchOptions { udp: any_port(), control: any_port(), ..SwitchOptions::new(&["atp"]) }).unwrap();
        let ps = PsHandle::start(PsOptions { udp: any_port(), control: any_port(), switch: sw.control_addr, ..PsOptions::default() }).unwrap();
        let (a, b) = pair(&sw, 1);
        let (c, d) = pair(&sw, 2);
        // Job 2's server endpoint is swapped for the broken one (what a bug in it would do).
        {
            let mut st = crate::lock(&ps.shared.st);
            let inner = st.servers.remove(&2).expect("job 2 admitted at the PS");
            st.servers.insert(2, Box::new(Broken(inner)));
        }
        let (e, f) = allreduce(&c, &d, 1.0, 2.0);
        let e = e.unwrap_err().to_string();
        assert!(e.contains("a broken server's packet handling"), "{e}");
        assert!(f.is_err());
        // The other job, on the same PS, stays exact.
        for _ in 0..5 {
            let (x, y) = allreduce(&a, &b, 1.0, 2.0);
            assert_eq!((x.unwrap(), y.unwrap()), (vec![3.0; 1000], vec![3.0; 1000]));
        }
        let st = ps.stats();
        assert_eq!(st["server_panics"], 1, "{st}");
    }
}
