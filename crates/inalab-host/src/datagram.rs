//! Unreliable raw datagrams for background traffic and benchmarks.

use crate::error::ensure;
use crate::ConfigError;
use inalab_core::time::Time;
use inalab_core::wire::Header;
use inalab_core::{AppRequest, Endpoint, HostEvent, HostProtocol, Packet};
use std::collections::VecDeque;

/// Datagram sender parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatagramConfig {
    /// On-wire bytes per packet (the last packet of a message carries the rest). Default
    /// 1500 (one MTU).
    pub packet_bytes: u32,
}

impl Default for DatagramConfig {
    fn default() -> Self {
        DatagramConfig { packet_bytes: 1500 }
    }
}

struct Outgoing {
    id: u64,
    dst: Endpoint,
    left: u64,
}

/// Cuts each `AppRequest::Send { id, dst, bytes }` into `Header::Raw` packets totalling
/// `bytes` on-wire bytes and hands them to the NIC whenever it polls (line rate, no window,
/// no retransmission). Messages go out FIFO; `Done` is reported when a message's last packet
/// left. A zero-byte message is done at once.
pub struct DatagramSender {
    local: Endpoint,
    cfg: DatagramConfig,
    queue: VecDeque<Outgoing>,
    events: VecDeque<HostEvent>,
    tx_packets: u64,
    tx_bytes: u64,
    /// Bytes submitted and not yet handed to the NIC, and the most there were at once.
    backlog: u64,
    max_backlog: u64,
}

impl DatagramSender {
    pub fn new(local: Endpoint, cfg: DatagramConfig) -> Result<Self, ConfigError> {
        ensure!(cfg.packet_bytes > 0, "packet_bytes must be positive");
        Ok(DatagramSender { local, cfg, queue: VecDeque::new(), events: VecDeque::new(), tx_packets: 0, tx_bytes: 0, backlog: 0, max_backlog: 0 })
    }
}

impl HostProtocol for DatagramSender {
    fn endpoint(&self) -> Endpoint {
        self.local
    }

    fn submit(&mut self, _now: Time, req: AppRequest) {
        match req {
            AppRequest::Send { id, bytes: 0, .. } => self.events.push_back(HostEvent::Done { id, data: None }),
            AppRequest::Send { id, dst, bytes } => {
                self.queue.push_back(Outgoing { id, dst, left: bytes });
                self.backlog += bytes;
                self.max_backlog = self.max_backlog.max(self.backlog);
            }
            AppRequest::Allreduce { id, .. } => self.events.push_back(HostEvent::Failed {
                id,
                reason: "a datagram sender serves only Send requests".into(),
            }),
        }
    }

    /// Incoming packets are not for a sender; they are ignored.
    fn handle_packet(&mut self, _now: Time, _pkt: Packet) {}

    fn handle_timeout(&mut self, _now: Time) {}

    fn poll_transmit(&mut self, now: Time) -> Option<Packet> {
        let m = self.queue.front_mut()?;
        let size = m.left.min(self.cfg.packet_bytes as u64) as u32;
        let l = self.local;
        let mut pkt = Packet::new(l.host, l.port, m.dst.host, m.dst.port, size, Header::Raw);
        pkt.created = now;
        m.left -= size as u64;
        self.backlog -= size as u64;
        if m.left == 0 {
            let id = m.id;
            self.queue.pop_front();
            self.events.push_back(HostEvent::Done { id, data: None });
        }
        self.tx_packets += 1;
        self.tx_bytes += size as u64;
        Some(pkt)
    }

    fn poll_timeout(&self) -> Option<Time> {
        None
    }

    fn poll_event(&mut self) -> Option<HostEvent> {
        self.events.pop_front()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![("tx_packets", self.tx_packets), ("tx_bytes", self.tx_bytes), ("max_backlog_bytes", self.max_backlog)]
    }
}

/// Counts the packets and on-wire bytes it receives. Raw packets carry no message
/// boundaries, so it reports no events; read its counters.
pub struct DatagramSink {
    local: Endpoint,
    rx_packets: u64,
    rx_bytes: u64,
    events: VecDeque<HostEvent>,
}

impl DatagramSink {
    pub fn new(local: Endpoint) -> Self {
        DatagramSink { local, rx_packets: 0, rx_bytes: 0, events: VecDeque::new() }
    }

    pub fn rx_packets(&self) -> u64 {
        self.rx_packets
    }

    pub fn rx_bytes(&self) -> u64 {
        self.rx_bytes
    }
}

impl HostProtocol for DatagramSink {
    fn endpoint(&self) -> Endpoint {
        self.local
    }

    fn submit(&mut self, _now: Time, req: AppRequest) {
        let (AppRequest::Allreduce { id, .. } | AppRequest::Send { id, .. }) = req;
        self.events.push_back(HostEvent::Failed { id, reason: "a datagram sink takes no requests".into() });
    }

    fn handle_packet(&mut self, _now: Time, pkt: Packet) {
        self.rx_packets += 1;
        self.rx_bytes += pkt.size as u64;
    }

    fn handle_timeout(&mut self, _now: Time) {}

    fn poll_transmit(&mut self, _now: Time) -> Option<Packet> {
        None
    }

    fn poll_timeout(&self) -> Option<Time> {
        None
    }

    fn poll_event(&mut self) -> Option<HostEvent> {
        self.events.pop_front()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![("rx_packets", self.rx_packets), ("rx_bytes", self.rx_bytes)]
    }
}
