//! Host-side I/O for host protocols: frames in from the host's switch, frames out to it.
//! A host has one neighbour (its switch, the "gateway"; a job may name other addresses of it,
//! the data-plane threads that run the job: [`HostIo::add_job_via`]); datagrams from anyone
//! else are counted as `foreign` and dropped, undecodable ones as `malformed`, ones without a
//! valid tag of one of the host's jobs as `forged`, well-tagged ones seen before (or too old
//! to tell) as `replayed` ([`crate::auth`]). Outgoing frames are tagged.

use crate::auth::{self, FrameMac, ReplayWindow, TRAILER_BYTES};
use crate::pace::Pacer;
use crate::udp::{TxBatch, Udp};
use inalab_core::{frame, HostProtocol, Packet, Time};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::SocketAddr;

pub struct HostIo {
    pub udp: Udp,
    pub gateway: SocketAddr,
    tx: TxBatch,
    /// The switch's other addresses the jobs use (its threads: [`HostIo::add_job_via`]), each
    /// once: what a datagram not from `gateway` is checked against before it is decoded.
    peers: Vec<SocketAddr>,
    /// The jobs this host takes part in: their frame authenticators, who this host is in them,
    /// and what their switch sent.
    keys: HashMap<u32, JobAuth>,
    /// The sequence number of the last datagram sealed ([`auth`]: replays).
    seq: u64,
    malformed: u64,
    foreign: u64,
    forged: u64,
    replayed: u64,
    unsealed: u64,
    last_malformed: Option<String>,
    /// Sends at the host link's rate (`None`: as fast as the socket takes them).
    pacer: Option<Pacer>,
    /// The pacer held back a frame the protocol may have had.
    throttled: bool,
    /// Bytes sent on the wire (UDP payload + [`crate::pace::WIRE_OVERHEAD_BYTES`]).
    wire_bytes_sent: u64,
}

impl HostIo {
    pub fn new(udp: Udp, gateway: SocketAddr) -> HostIo {
        HostIo {
            udp,
            gateway,
            tx: TxBatch::default(),
            peers: vec![],
            keys: HashMap::new(),
            seq: auth::first_seq(),
            malformed: 0,
            foreign: 0,
            forged: 0,
            replayed: 0,
            unsealed: 0,
            last_malformed: None,
            pacer: None,
            throttled: false,
            wire_bytes_sent: 0,
        }
    }

    /// Sends no faster than a link of `rate_bps` carries (see [`crate::pace`]).
    pub fn pace(&mut self, rate_bps: u64) {
        self.pacer = Some(Pacer::new(rate_bps));
    }

    /// When to call [`HostIo::transmit`] again because the pacer held a frame back.
    pub fn wake_at(&self) -> Option<Time> {
        self.pacer.filter(|_| self.throttled).map(|p| p.next_ready())
    }

    /// From now on, frames of `job` are accepted and sent with `mac`'s tags, this host being
    /// `me` in them: its node id, with [`auth::SERVER_BIT`] for a parameter server.
    pub fn add_job(&mut self, job: u32, mac: FrameMac, me: u32) {
        self.keys.insert(job, JobAuth { mac, me, windows: vec![], via: None });
        self.refresh_peers();
    }

    /// As [`HostIo::add_job`], the job's frames going to and coming from `via` (the threads of
    /// a sharded switch that run it) instead of the host's gateway.
    pub fn add_job_via(&mut self, job: u32, mac: FrameMac, me: u32, via: Gateways) {
        self.keys.insert(job, JobAuth { mac, me, windows: vec![], via: Some(via) });
        self.refresh_peers();
    }

    pub fn remove_job(&mut self, job: u32) {
        self.keys.remove(&job);
        self.refresh_peers();
    }

    /// [`HostIo::peers`] from the jobs, when they change (not per datagram).
    fn refresh_peers(&mut self) {
        let mut peers: Vec<SocketAddr> = self.keys.values().filter_map(|k| k.via.as_ref()).flat_map(|v| v.addrs.iter().copied()).collect();
        peers.sort();
        peers.dedup();
        self.peers = peers;
    }

    /// One batched receive; every decodable frame from the gateway goes to `deliver`.
    /// Returns the datagrams read (0: nothing was queued).
    pub fn recv(&mut self, mut deliver: impl FnMut(Packet)) -> std::io::Result<usize> {
        let (gw, keys, peers) = (self.gateway, &mut self.keys, &self.peers);
        let (mut malformed, mut foreign, mut forged, mut replayed, mut last) = (0, 0, 0, 0, None);
        let n = self.udp.recv_batch(|from, d| {
            if from != gw && !peers.contains(&from) {
                foreign += 1;
                return;
            }
            let Ok((bytes, _, _)) = auth::split(d) else {
                forged += 1;
                return;
            };
            let view = match frame::Frame::new_checked(bytes) {
                Ok(v) => v,
                Err(e) => {
                    malformed += 1;
                    last = Some(e.to_string());
                    return;
                }
            };
            let Some(job) = frame_key(keys, view.header()) else {
                forged += 1;
                return;
            };
            if !job.via.as_ref().map_or(from == gw, |v| v.addrs.contains(&from)) {
                // From the switch, but not a thread that runs this job.
                foreign += 1;
                return;
            }
            match job.mac.open(d, auth::Link { from: auth::ANY, to: job.me }) {
                Ok((_, seq)) if job.window(from).accept(seq).is_ok() => deliver(frame::to_packet(&view)),
                Ok(_) => replayed += 1,
                Err(_) => forged += 1,
            }
        })?;
        self.malformed += malformed;
        self.foreign += foreign;
        self.forged += forged;
        self.replayed += replayed;
        if last.is_some() {
            self.last_malformed = last;
        }
        Ok(n)
    }

    /// Takes every packet the protocol releases now (its window limits how many) into the
    /// send batch. Returns how many.
    pub fn transmit(&mut self, now: Time, proto: &mut dyn HostProtocol) -> usize {
        let mut n = 0;
        self.throttled = false;
        loop {
            if self.pacer.is_some_and(|p| !p.ready(now)) {
                self.throttled = true;
                break;
            }
            let Some(p) = proto.poll_transmit(now) else { break };
            let Some(job) = frame_key(&mut self.keys, &p.header) else {
                self.unsealed += 1;
                continue;
            };
            self.seq += 1;
            let (link, seq) = (auth::Link { from: job.me, to: auth::ANY }, self.seq);
            let to = job.via.as_ref().map_or(self.gateway, |v| v.to(&p.header));
            self.tx.push(to, |b| {
                let start = b.len();
                frame::encode(&p, b);
                job.mac.seal(b, start, link, seq);
            });
            let bytes = frame::encoded_len(&p) + TRAILER_BYTES;
            self.wire_bytes_sent += (bytes as u64) + crate::pace::WIRE_OVERHEAD_BYTES;
            if let Some(pacer) = &mut self.pacer {
                pacer.charge(now, bytes);
            }
            n += 1;
        }
        n
    }

    pub fn flush(&mut self) {
        if !self.tx.is_empty() {
            self.udp.send_batch(&mut self.tx);
        }
    }

    pub fn stats(&self) -> Value {
        let io = self.udp.stats;
        json!({
            "malformed": self.malformed, "foreign": self.foreign, "forged": self.forged, "replayed": self.replayed, "unsealed": self.unsealed,
            "last_malformed": self.last_malformed,
            "datagrams_sent": io.datagrams_sent, "wire_bytes_sent": self.wire_bytes_sent, "datagrams_received": io.datagrams_received,
            "send_calls": io.send_calls, "recv_calls": io.recv_calls, "send_errors": io.send_errors,
        })
    }
}

/// One job's frame authentication at a host.
struct JobAuth {
    mac: FrameMac,
    /// This host's identity in the job's [`auth::Link`]s.
    me: u32,
    /// Sequence numbers accepted from the switch, per address: each thread of a sharded
    /// switch numbers its own datagrams.
    windows: Vec<(SocketAddr, ReplayWindow)>,
    /// Where the job's frames go and come from, if not the host's gateway.
    via: Option<Gateways>,
}

impl JobAuth {
    /// The replay window of datagrams from `from` (one of the job's gateways).
    fn window(&mut self, from: SocketAddr) -> &mut ReplayWindow {
        let i = match self.windows.iter().position(|(a, _)| *a == from) {
            Some(i) => i,
            None => {
                self.windows.push((from, ReplayWindow::default()));
                self.windows.len() - 1
            }
        };
        &mut self.windows[i].1
    }
}

/// The addresses of a sharded switch's threads that run a job: one, or several, each packet
/// going to the one its scheme's steering key picks (`inalab_scheme::Scheme::steering`), so
/// every packet of one aggregator meets the others at the same thread.
#[derive(Debug, Clone)]
pub struct Gateways {
    pub addrs: Vec<SocketAddr>,
    pub steer: Option<fn(&inalab_core::wire::Header) -> u32>,
}

impl Gateways {
    /// Where a packet with `header` goes.
    fn to(&self, header: &inalab_core::wire::Header) -> SocketAddr {
        match (self.addrs.len(), self.steer) {
            (n, Some(steer)) if n > 1 => self.addrs[steer(header) as usize % n],
            _ => self.addrs[0],
        }
    }
}

/// The job of a frame: its header's, or, for a frame whose header names no job (a transport
/// segment between hosts), the host's only job.
fn frame_key<'a>(keys: &'a mut HashMap<u32, JobAuth>, header: &inalab_core::wire::Header) -> Option<&'a mut JobAuth> {
    match header.job() {
        Some(j) => keys.get_mut(&j),
        None if keys.len() == 1 => keys.values_mut().next(),
        None => None,
    }
}

/// Protocol counters as a JSON object.
pub fn counters_json(proto: &dyn HostProtocol) -> Value {
    Value::Object(proto.counters().into_iter().map(|(k, v)| (k.to_string(), json!(v))).collect())
}
