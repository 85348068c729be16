//! Parameter server: workers push partitions of their tensor to servers, each server sums a
//! partition once every worker's copy arrived and sends the sum back to every worker.
//!
//! With one server this is N-to-1; with several (co-located with the workers, BytePS-like)
//! partition `p` goes to server `p mod S`, so the load is spread N-to-N. A host with a
//! co-located server runs a [`PsWorker`] and a [`PsServer`] on different ports.

use crate::collective::{
    check_group, host_protocol_via_runner, msg_id, phase_of, with_phase, Algorithm, Ctx, Request, Runner, MAX_INDEX,
};
use crate::error::ensure;
use crate::transport::{Transport, TransportConfig};
use crate::ConfigError;
use inalab_core::time::Time;
use inalab_core::{AppRequest, Endpoint, HostEvent, HostProtocol, Packet, Payload};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Message phase of a worker's partition push.
const PUSH: u8 = 0;
/// Message phase of a server's summed partition.
const PULL: u8 = 1;

/// Parameter-server worker parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PsConfig {
    /// Bytes per partition (the last one may be shorter), a positive multiple of 4. Default
    /// 4 MiB, as BytePS.
    pub partition_bytes: u64,
    pub transport: TransportConfig,
}

impl Default for PsConfig {
    fn default() -> Self {
        PsConfig { partition_bytes: 4 << 20, transport: TransportConfig::default() }
    }
}

struct PsWorkerAlgo {
    servers: Vec<Endpoint>,
    partition_bytes: u64,
    /// Partitions not yet returned by their server.
    waiting: BTreeSet<u64>,
    pushed: bool,
}

impl PsWorkerAlgo {
    fn partitions(&self, bytes: u64) -> u64 {
        bytes.div_ceil(self.partition_bytes).max(1)
    }

    fn range(&self, p: u64, bytes: u64) -> (u64, u64) {
        (p * self.partition_bytes, ((p + 1) * self.partition_bytes).min(bytes))
    }
}

impl Algorithm for PsWorkerAlgo {
    fn check(&self, bytes: u64) -> Result<(), String> {
        match self.partitions(bytes) <= MAX_INDEX {
            true => Ok(()),
            false => Err(format!("{bytes} B is more than {MAX_INDEX} partitions")),
        }
    }

    fn start(&mut self, req: &Request) {
        self.waiting = (0..self.partitions(req.bytes)).collect();
        self.pushed = false;
    }

    fn advance(&mut self, now: Time, ctx: &mut Ctx, req: &mut Request) -> bool {
        let s = self.servers.len() as u64;
        if !self.pushed {
            for p in 0..self.partitions(req.bytes) {
                let (a, b) = self.range(p, req.bytes);
                let payload = req.data.as_ref().map(|d| d.slice(a as usize / 4, b as usize / 4));
                ctx.tr.send_message(now, self.servers[(p % s) as usize], msg_id(req.id, PUSH, p), b - a, payload);
            }
            self.pushed = true;
        }
        let waiting = std::mem::take(&mut self.waiting);
        for p in waiting {
            match ctx.take(self.servers[(p % s) as usize], msg_id(req.id, PULL, p)) {
                Some(m) => {
                    if let (Some(d), Some(sum)) = (req.data.as_mut(), m.payload.as_ref()) {
                        d.copy_at((self.range(p, req.bytes).0 / 4) as usize, sum);
                    }
                }
                None => {
                    self.waiting.insert(p);
                }
            }
        }
        self.waiting.is_empty()
    }
}

/// Parameter-server worker: pushes every partition of a request to its server and completes
/// when every summed partition came back. Requests are served FIFO, one at a time; every
/// worker must submit the same requests in the same order. A request may have at most 2^28
/// partitions.
pub struct PsWorker {
    runner: Runner<PsWorkerAlgo>,
}

impl PsWorker {
    /// Worker at `local` using `servers` (one server: N-to-1; several: partition `p` goes to
    /// `servers[p % servers.len()]`). Every server must list this worker. Errors on no
    /// servers, a duplicate server, a bad partition size or a bad transport config.
    pub fn new(local: Endpoint, servers: Vec<Endpoint>, cfg: PsConfig) -> Result<Self, ConfigError> {
        check_group(&servers, 0)?;
        ensure!(
            cfg.partition_bytes > 0 && cfg.partition_bytes % 4 == 0 && cfg.partition_bytes <= u32::MAX as u64,
            "partition_bytes {} must be a positive multiple of 4 below 4 GiB",
            cfg.partition_bytes
        );
        let algo = PsWorkerAlgo { servers, partition_bytes: cfg.partition_bytes, waiting: BTreeSet::new(), pushed: false };
        Ok(PsWorker { runner: Runner::new(local, cfg.transport, algo)? })
    }

    pub fn transport_stats(&self) -> crate::TransportStats {
        self.runner.transport().stats()
    }
}

host_protocol_via_runner!(PsWorker);

/// A partition being summed at the server.
struct Partial {
    bytes: u64,
    from: BTreeSet<Endpoint>,
    sum: Option<Payload>,
}

/// Parameter server: sums each partition once all its workers' copies arrived, then sends
/// the sum to every worker. It serves any number of requests at once (partitions are keyed
/// by message id, which carries the request id).
pub struct PsServer {
    tr: Transport,
    workers: Vec<Endpoint>,
    partials: BTreeMap<u64, Partial>,
    reduced: u64,
    /// Pushes dropped: from a non-worker, a second copy from one worker, or a size mismatch.
    rejected: u64,
    events: VecDeque<HostEvent>,
}

impl PsServer {
    /// Server at `local` for `workers`. Errors on no workers, a duplicate worker or a bad
    /// transport config.
    pub fn new(local: Endpoint, workers: Vec<Endpoint>, cfg: TransportConfig) -> Result<Self, ConfigError> {
        check_group(&workers, 0)?;
        Ok(PsServer { tr: Transport::new(local, cfg)?, workers, partials: BTreeMap::new(), reduced: 0, rejected: 0, events: VecDeque::new() })
    }

    /// Partitions summed and sent back.
    pub fn partitions_reduced(&self) -> u64 {
        self.reduced
    }

    pub fn transport_stats(&self) -> crate::TransportStats {
        self.tr.stats()
    }

    fn on_push(&mut self, now: Time, from: Endpoint, id: u64, bytes: u64, payload: Option<Payload>) {
        let known = self.workers.contains(&from);
        let is_push = phase_of(id) == PUSH;
        let part = self.partials.entry(id).or_insert_with(|| Partial { bytes, from: BTreeSet::new(), sum: None });
        // A stranger, a second copy from one worker or a size mismatch would corrupt the sum.
        if !known || !is_push || part.bytes != bytes || !part.from.insert(from) {
            self.rejected += 1;
            if part.from.is_empty() {
                self.partials.remove(&id);
            }
            return;
        }
        match (&mut part.sum, payload) {
            (Some(sum), Some(p)) => sum.add_at(0, &p),
            (sum @ None, p) => *sum = p,
            (Some(_), None) => {}
        }
        if part.from.len() == self.workers.len() {
            let part = self.partials.remove(&id).expect("present");
            let pull = with_phase(id, PULL);
            for &w in &self.workers {
                self.tr.send_message(now, w, pull, part.bytes, part.sum.clone());
            }
            self.reduced += 1;
        }
    }
}

impl HostProtocol for PsServer {
    fn endpoint(&self) -> Endpoint {
        self.tr.local()
    }

    /// The server takes no application requests: it only reacts to pushes.
    fn submit(&mut self, _now: Time, req: AppRequest) {
        let (AppRequest::Allreduce { id, .. } | AppRequest::Send { id, .. }) = req;
        self.events.push_back(HostEvent::Failed { id, reason: "a parameter server takes no requests".into() });
    }

    fn handle_packet(&mut self, now: Time, pkt: Packet) {
        self.tr.handle_packet(now, pkt);
        while let Some(d) = self.tr.poll_delivered() {
            self.on_push(now, d.from, d.msg_id, d.bytes, d.payload);
        }
    }

    fn handle_timeout(&mut self, now: Time) {
        self.tr.handle_timeout(now);
    }

    fn poll_transmit(&mut self, now: Time) -> Option<Packet> {
        self.tr.poll_transmit(now)
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.tr.poll_timeout()
    }

    fn poll_event(&mut self) -> Option<HostEvent> {
        self.events.pop_front()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut c = self.tr.counters();
        c.push(("partitions_reduced", self.reduced));
        c.push(("rejected", self.rejected));
        c
    }
}
