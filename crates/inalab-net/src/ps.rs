//! The parameter server process: the server endpoint of every admitted job whose scheme has
//! one (ATP's `AtpServer`), behind its switch, as the scheme registry plans it.
//! It attaches to its switch's control plane at start and keeps that connection, pinging every
//! second: the switch fails the PS's jobs when it closes or goes silent, and refuses a second
//! PS while it lives. Jobs are admitted and released by the switch (`admit` / `release` with
//! the job's [`JobSpec`]).

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
            switch: "127.0.0.1:9100".parse().expect("valid"),
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
}

struct Shared {
    node: NodeId,
    secret: crate::auth::Secret,
    st: Mutex<PsState>,
    stop: AtomicBool,
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
        let listener = TcpListener::bind(opts.control).map_err(|e| crate::bind_error(e, "--control", opts.control))?;
        let (udp_addr, control_addr) = (udp.local_addr()?, listener.local_addr()?);
        if let Some(f) = &opts.fabric {
            let shared = Arc::new(Shared { node: opts.node, secret, st: Mutex::new(PsState::new(udp, f.gateway, opts.link_rate_bps)), stop: AtomicBool::new(false) });
            for spec in &f.jobs {
                admit(&shared, spec).map_err(|e| NetError::Config(format!("fabric: job {}: {e}", spec.job)))?;
            }
            let threads = spawn(&shared, listener)?;
            return Ok(PsHandle { shared, threads, udp_addr, control_addr });
        }
        let mut attach = TcpStream::connect_timeout(&opts.switch, CONTROL_TIMEOUT).map_err(|e| {
            crate::unreachable(e, crate::SWITCH_CONTROL, opts.switch, "Start the switch first (`inalab switch --program SCHEME`, the scheme of the jobs this PS serves), or give --switch its control address")
        })?;
        attach.set_read_timeout(Some(CONTROL_TIMEOUT))?;
        attach.set_write_timeout(Some(CONTROL_TIMEOUT))?;
        let msg = json!({"op": "attach", "role": "ps", "node": opts.node,
                         "udp": control::announce(udp_addr, opts.switch), "control": control::announce(control_addr, opts.switch)});
        let mut replies = BufReader::new(attach.try_clone()?);
        control::authenticate(&mut attach, &mut replies, &secret.credential(control::AuthRole::Ps))?;
        control::send_line(&mut attach, &msg)?;
        let reply = control::read_line(&mut replies)?.ok_or_else(|| NetError::Protocol(format!("{} closed the control connection", opts.switch)))?;
        let reply = control::check_ok(reply)?;
        let gateway: SocketAddr = field(&reply, "udp")?;
        let shared = Arc::new(Shared { node: opts.node, secret, st: Mutex::new(PsState::new(udp, gateway, opts.link_rate_bps)), stop: AtomicBool::new(false) });
        let mut threads = spawn(&shared, listener)?;
        let s = shared.clone();
        threads.push(std::thread::Builder::new().name("inalab-ps-ping".into()).spawn(move || heartbeat(&s, attach, replies))?);
        Ok(PsHandle { shared, threads, udp_addr, control_addr })
    }

    pub fn stats(&self) -> Value {
        stats(&self.shared)
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

/// Pings the switch every second on the attach connection until the PS stops or the switch is
/// gone (then says so once: the switch has failed the PS's jobs meanwhile).
fn heartbeat(s: &Shared, mut conn: TcpStream, mut replies: BufReader<TcpStream>) {
    loop {
        for _ in 0..20 {
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let alive = control::send_line(&mut conn, &json!({"op": "ping"})).is_ok() && matches!(control::read_line(&mut replies), Ok(Some(_)));
        if !alive {
            eprintln!("inalab ps: lost the switch's control plane; its jobs have failed there");
            return;
        }
    }
}

fn stats(s: &Shared) -> Value {
    let st = s.st.lock().expect("ps lock");
    let jobs: serde_json::Map<String, Value> = st.servers.iter().map(|(j, p)| (j.to_string(), counters_json(p.as_ref()))).collect();
    json!({"node": s.node, "io": st.io.stats(), "unadmitted": st.unadmitted, "jobs": jobs})
}

fn data_loop(s: &Shared) {
    let clock = Clock::new();
    let fd = s.st.lock().expect("ps lock").io.udp.fd();
    while !s.stop.load(Ordering::Relaxed) {
        let next = {
            let st = s.st.lock().expect("ps lock");
            st.servers.values().filter_map(|p| p.poll_timeout()).chain(st.io.wake_at()).min()
        };
        let timeout = next.map_or(Duration::from_millis(10), |at| clock.until(at).min(Duration::from_millis(10)));
        let _ = wait(&[(fd, libc::POLLIN)], Some(timeout));
        let mut guard = s.st.lock().expect("ps lock");
        let st = &mut *guard;
        for _ in 0..32 {
            let now = clock.now();
            let (servers, unadmitted) = (&mut st.servers, &mut st.unadmitted);
            let n = st.io.recv(|pkt| {
                let server = pkt.header.job().and_then(|j| servers.get_mut(&j));
                match server {
                    Some(p) => p.handle_packet(now, pkt),
                    None => *unadmitted += 1,
                }
            });
            let now = clock.now();
            for p in st.servers.values_mut() {
                if p.poll_timeout().is_some_and(|t| t <= now) {
                    p.handle_timeout(now);
                }
                st.io.transmit(now, p.as_mut());
                while p.poll_event().is_some() {}
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
        PsState { io, servers: BTreeMap::new(), unadmitted: 0 }
    }
}

/// The data-plane thread and the control listener.
fn spawn(shared: &Arc<Shared>, listener: TcpListener) -> Result<Vec<JoinHandle<()>>, NetError> {
    let s = shared.clone();
    let data = std::thread::Builder::new().name("inalab-ps-dp".into()).spawn(move || data_loop(&s))?;
    let s = shared.clone();
    let ctl = std::thread::Builder::new().name("inalab-ps-cp".into()).spawn(move || {
        let conn_shared = s.clone();
        accept_loop(&s.stop, listener, "inalab-ps-conn", move |conn| serve(&conn_shared, conn))
    })?;
    Ok(vec![data, ctl])
}

/// Runs the PS's part of `spec`.
fn admit(s: &Shared, spec: &JobSpec) -> Result<(), NetError> {
    let index = spec.servers.iter().position(|p| p.node == s.node).ok_or_else(|| NetError::Config(format!("job {}: node {} is not one of its servers", spec.job, s.node)))?;
    let server = spec.endpoint(s.node, Role::Server { index: index as u32 })?;
    let mac = spec.frame_mac()?;
    let mut st = s.st.lock().expect("ps lock");
    if st.servers.contains_key(&spec.job) {
        return Err(NetError::Config(format!("job {} is already admitted at the PS", spec.job)));
    }
    st.servers.insert(spec.job, server);
    st.io.add_job(spec.job, mac);
    Ok(())
}

fn serve(s: &Shared, conn: TcpStream) {
    let Ok(mut w) = conn.try_clone() else { return };
    let mut r = BufReader::new(conn);
    let mut auth = control::ServerAuth::new(s.secret.clone());
    while let Ok(Some(msg)) = control::read_line(&mut r) {
        let op = msg["op"].as_str().unwrap_or("");
        let reply = match auth.handle(op, &msg) {
            Some(r) => r,
            // Only the switch admits and releases jobs here.
            None if matches!(op, "admit" | "release") => auth.require(op, &[control::AuthRole::Switch]).and_then(|_| handle(s, &msg)),
            None => handle(s, &msg),
        };
        if control::send_line(&mut w, &reply.unwrap_or_else(err)).is_err() {
            break;
        }
    }
}

fn handle(s: &Shared, msg: &Value) -> Result<Value, NetError> {
    match msg["op"].as_str().unwrap_or("") {
        "admit" => {
            let spec: JobSpec = field(msg, "spec")?;
            admit(s, &spec)?;
            Ok(ok(json!({})))
        }
        "release" => {
            let job: u32 = field(msg, "job")?;
            let mut st = s.st.lock().expect("ps lock");
            st.servers.remove(&job);
            st.io.remove_job(job);
            Ok(ok(json!({})))
        }
        "stats" => Ok(ok(stats(s))),
        other => Err(NetError::Protocol(format!("field `op`: {other:?} is not one of \"admit\", \"release\", \"stats\""))),
    }
}
