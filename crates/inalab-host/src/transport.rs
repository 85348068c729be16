//! A reliable, windowed message transport as a sans-IO component that host protocols embed.
//!
//! One connection per peer endpoint, created on first use in either direction. Messages are
//! cut into segments numbered per connection; the receiver acknowledges every data segment
//! with a cumulative ACK (next expected sequence) that echoes the segment's ECN mark, buffers
//! out-of-order segments and delivers each complete message once, in order. The sender keeps
//! an [`AimdWindow`] of on-wire bytes per connection, fast-retransmits after
//! `dup_ack_threshold` duplicate ACKs with NewReno partial-ACK recovery (each partial ACK
//! retransmits the next hole), and retransmits the oldest unacknowledged segment when its
//! retransmission timer fires, doubling the timeout up to `rto_max`.
//!
//! There is no receive window: out-of-order segments are buffered without bound (the
//! collectives consume every message they are sent).
//!
//! Limits: sequence numbers are 32 bits per connection (2^32 segments, about 6 TB at the
//! default MSS) and a message is at most `u32::MAX` bytes (the header's `msg_len`).

use crate::aimd::AimdConfig;
use crate::cc::{CongestionControl, WindowRules};
use crate::error::ensure;
use crate::ConfigError;
use inalab_core::time::{Time, MS};
use inalab_core::wire::{Header, SegKind, TransportHeader};
use inalab_core::{Endpoint, Packet, Payload};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Transport parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportConfig {
    /// Maximum payload bytes per data segment; a positive multiple of 4 so that segments
    /// split payloads on value boundaries. Default 1436 (1500 B MTU minus the 64 B header).
    pub mss: u32,
    /// On-wire bytes every packet adds to its payload (Ethernet, IP, UDP, transport header
    /// and FCS, rounded). A data packet is `seg_len + header_bytes` bytes, an ACK
    /// `header_bytes`. Default 64.
    pub header_bytes: u32,
    /// Initial retransmission timeout, picoseconds. Default 1 ms.
    pub rto: Time,
    /// Cap of the exponential timeout backoff, picoseconds: each timeout without progress
    /// doubles the timeout up to this value; a new ACK resets it to `rto`. Default 64 ms.
    pub rto_max: Time,
    /// Duplicate ACKs that trigger fast retransmit. Default 3 (ATP and TCP).
    pub dup_ack_threshold: u32,
    /// Congestion window of each connection (window in on-wire bytes).
    pub aimd: AimdConfig,
    /// The rules of each connection's window. Default ATP's AIMD.
    pub window_rules: WindowRules,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            mss: 1436,
            header_bytes: 64,
            rto: MS,
            rto_max: 64 * MS,
            dup_ack_threshold: 3,
            aimd: AimdConfig::default(),
            window_rules: WindowRules::Aimd,
        }
    }
}

impl TransportConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        ensure!(self.mss > 0 && self.mss % 4 == 0, "mss {} must be a positive multiple of 4", self.mss);
        ensure!(self.rto > 0 && self.rto <= self.rto_max, "need 0 < rto <= rto_max");
        ensure!(self.dup_ack_threshold > 0, "dup_ack_threshold must be positive");
        Ok(())
    }
}

/// A message delivered in full to the application.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivered {
    pub from: Endpoint,
    pub msg_id: u64,
    pub bytes: u64,
    /// The reassembled values in payload mode.
    pub payload: Option<Payload>,
}

/// Transport counters (summed over connections).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Data segments sent again (fast retransmit, partial ACK or timeout).
    pub retransmissions: u64,
    /// Retransmission timer expirations.
    pub timeouts: u64,
    /// ACKs received carrying an ECN echo.
    pub ecn_echoes: u64,
    /// Duplicate ACKs received.
    pub dup_acks: u64,
    /// Data segments sent, retransmissions included.
    pub data_packets_sent: u64,
    /// Message bytes delivered to the application.
    pub bytes_delivered: u64,
}

/// A queued message not yet fully cut into segments.
struct OutMsg {
    id: u64,
    bytes: u64,
    payload: Option<Payload>,
    /// Bytes already cut into segments.
    cut: u64,
}

/// Where a segment sits in its message, and its values in payload mode.
#[derive(Clone)]
struct Segment {
    msg_id: u64,
    msg_offset: u32,
    msg_len: u32,
    seg_len: u32,
    payload: Option<Payload>,
}

/// A message being reassembled from in-order segments.
struct Assembly {
    msg_id: u64,
    msg_len: u32,
    got: u32,
    payload: Option<Payload>,
}

struct Conn {
    // Sender.
    pending: VecDeque<OutMsg>,
    snd_una: u32,
    snd_nxt: u32,
    /// Segments `snd_una..snd_nxt`.
    unacked: VecDeque<Segment>,
    /// On-wire bytes of `unacked`.
    in_flight: u64,
    /// Sequences waiting to be retransmitted.
    retx: BTreeSet<u32>,
    dup_acks: u32,
    /// NewReno recovery point: `snd_nxt` when loss was detected; ACKs below it are partial.
    recover: Option<u32>,
    rto_cur: Time,
    rto_at: Option<Time>,
    aimd: Box<dyn CongestionControl>,
    // Receiver.
    rcv_nxt: u32,
    out_of_order: BTreeMap<u32, Segment>,
    assembly: Option<Assembly>,
}

impl Conn {
    fn new(cfg: &TransportConfig) -> Self {
        Conn {
            pending: VecDeque::new(),
            snd_una: 0,
            snd_nxt: 0,
            unacked: VecDeque::new(),
            in_flight: 0,
            retx: BTreeSet::new(),
            dup_acks: 0,
            recover: None,
            rto_cur: cfg.rto,
            rto_at: None,
            aimd: cfg.window_rules.window(&cfg.aimd),
            rcv_nxt: 0,
            out_of_order: BTreeMap::new(),
            assembly: None,
        }
    }

    /// Whether the next new segment fits the window. One segment may always be in flight,
    /// so a window smaller than a segment still makes progress.
    fn can_send_new(&self, cfg: &TransportConfig) -> bool {
        let Some(m) = self.pending.front() else { return false };
        let wire = (m.bytes - m.cut).min(cfg.mss as u64) + cfg.header_bytes as u64;
        self.in_flight == 0 || self.in_flight + wire <= self.aimd.window()
    }

    fn ready(&self, cfg: &TransportConfig) -> bool {
        !self.retx.is_empty() || self.can_send_new(cfg)
    }

    /// Cuts the next segment off the front message.
    fn cut_segment(&mut self, mss: u32) -> Segment {
        let m = self.pending.front_mut().expect("checked by can_send_new");
        let seg_len = (m.bytes - m.cut).min(mss as u64);
        let (start, end) = (m.cut as usize / Payload::VALUE_BYTES, (m.cut + seg_len) as usize / Payload::VALUE_BYTES);
        let seg = Segment {
            msg_id: m.id,
            msg_offset: m.cut as u32,
            msg_len: m.bytes as u32,
            seg_len: seg_len as u32,
            payload: m.payload.as_ref().map(|p| p.slice(start, end)),
        };
        m.cut += seg_len;
        if m.cut == m.bytes {
            self.pending.pop_front();
        }
        seg
    }
}

/// The connections of one endpoint, by peer, in one vector sorted by peer: the order round
/// robin and the timers walk them in. An endpoint has a few (two in a ring); a `BTreeMap`'s
/// range navigation in `poll_transmit` was a tenth of a 1024-host ring's run (issue #39).
#[derive(Default)]
struct Conns(Vec<(Endpoint, Conn)>);

impl Conns {
    fn find(&self, peer: &Endpoint) -> Result<usize, usize> {
        self.0.binary_search_by(|(p, _)| p.cmp(peer))
    }
    fn get(&self, peer: &Endpoint) -> Option<&Conn> {
        self.find(peer).ok().map(|i| &self.0[i].1)
    }
    fn get_mut(&mut self, peer: &Endpoint) -> Option<&mut Conn> {
        self.find(peer).ok().map(|i| &mut self.0[i].1)
    }
    /// `peer`'s connection, opened with `cfg` if there is none yet.
    fn open(&mut self, peer: Endpoint, cfg: &TransportConfig) -> &mut Conn {
        let i = match self.find(&peer) {
            Ok(i) => i,
            Err(i) => {
                self.0.insert(i, (peer, Conn::new(cfg)));
                i
            }
        };
        &mut self.0[i].1
    }
    fn values(&self) -> impl Iterator<Item = &Conn> {
        self.0.iter().map(|(_, c)| c)
    }
    fn values_mut(&mut self) -> impl Iterator<Item = &mut Conn> {
        self.0.iter_mut().map(|(_, c)| c)
    }
}

/// The transport of one local endpoint. See the module docs.
pub struct Transport {
    local: Endpoint,
    cfg: TransportConfig,
    conns: Conns,
    acks: VecDeque<Packet>,
    delivered: VecDeque<Delivered>,
    /// Peer served last by `poll_transmit`, for round-robin.
    last_served: Option<Endpoint>,
    stats: TransportStats,
}

impl Transport {
    pub fn new(local: Endpoint, cfg: TransportConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(Transport {
            local,
            cfg,
            conns: Conns::default(),
            acks: VecDeque::new(),
            delivered: VecDeque::new(),
            last_served: None,
            stats: TransportStats::default(),
        })
    }

    pub fn local(&self) -> Endpoint {
        self.local
    }

    pub fn config(&self) -> &TransportConfig {
        &self.cfg
    }

    pub fn stats(&self) -> TransportStats {
        self.stats
    }

    /// The counters as `HostProtocol::counters` reports them.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = self.stats;
        vec![
            ("retransmissions", s.retransmissions),
            ("timeouts", s.timeouts),
            ("ecn_echoes", s.ecn_echoes),
            ("dup_acks", s.dup_acks),
            ("data_packets_sent", s.data_packets_sent),
            ("bytes_delivered", s.bytes_delivered),
        ]
    }

    /// Congestion window toward `peer`, bytes (`None` before any traffic with it).
    pub fn window(&self, peer: Endpoint) -> Option<u64> {
        self.conns.get(&peer).map(|c| c.aimd.window())
    }

    /// Whether every queued message was sent and acknowledged and no ACK waits to be sent.
    pub fn is_idle(&self) -> bool {
        self.acks.is_empty() && self.conns.values().all(|c| c.pending.is_empty() && c.unacked.is_empty())
    }

    /// Queues message `msg_id` of `bytes` bytes to `peer` (a zero-byte message is one empty
    /// segment). In payload mode `payload` holds its `bytes / 4` values. The transport starts
    /// timers only when it transmits, so `now` is not needed yet; it is taken like every
    /// sans-IO input. Panics if the payload length does not match `bytes` or the message
    /// exceeds `u32::MAX` bytes: both are caller bugs.
    pub fn send_message(&mut self, _now: Time, peer: Endpoint, msg_id: u64, bytes: u64, payload: Option<Payload>) {
        assert!(bytes <= u32::MAX as u64, "message of {bytes} B exceeds the 32-bit msg_len");
        if let Some(p) = &payload {
            assert_eq!(p.len() as u64 * Payload::VALUE_BYTES as u64, bytes, "payload length must match bytes");
        }
        let cfg = &self.cfg;
        let conn = self.conns.open(peer, cfg);
        conn.pending.push_back(OutMsg { id: msg_id, bytes, payload, cut: 0 });
    }

    /// Handles a packet addressed to this endpoint. Packets without a transport header are
    /// ignored (the embedding protocol handles its own headers before calling this).
    pub fn handle_packet(&mut self, now: Time, pkt: Packet) {
        let Header::Transport(h) = pkt.header else { return };
        let peer = Endpoint { host: pkt.src, port: pkt.src_port };
        match h.kind {
            SegKind::Data => self.on_data(now, peer, &h, pkt.ecn, pkt.payload.map(|p| *p)),
            SegKind::Ack => self.on_ack(now, peer, &h),
        }
    }

    fn on_data(&mut self, now: Time, peer: Endpoint, h: &TransportHeader, ecn: bool, payload: Option<Payload>) {
        let cfg = &self.cfg;
        let conn = self.conns.open(peer, cfg);
        let seg = Segment {
            msg_id: h.msg_id,
            msg_offset: h.msg_offset,
            msg_len: h.msg_len,
            seg_len: h.seg_len,
            payload,
        };
        if h.seq == conn.rcv_nxt {
            accept(conn, peer, seg, &mut self.delivered, &mut self.stats);
            conn.rcv_nxt += 1;
            while let Some(next) = conn.out_of_order.remove(&conn.rcv_nxt) {
                accept(conn, peer, next, &mut self.delivered, &mut self.stats);
                conn.rcv_nxt += 1;
            }
        } else if h.seq > conn.rcv_nxt {
            conn.out_of_order.entry(h.seq).or_insert(seg);
        }
        // In order, out of order or duplicate: every data segment is acknowledged.
        let ack = TransportHeader {
            kind: SegKind::Ack,
            flags: if ecn { TransportHeader::FLAG_ECN_ECHO } else { 0 },
            seq: conn.rcv_nxt,
            msg_id: 0,
            msg_offset: 0,
            msg_len: 0,
            seg_len: 0,
        };
        let l = self.local;
        let mut pkt = Packet::new(l.host, l.port, peer.host, peer.port, self.cfg.header_bytes, Header::Transport(ack));
        pkt.created = now;
        self.acks.push_back(pkt);
    }

    fn on_ack(&mut self, now: Time, peer: Endpoint, h: &TransportHeader) {
        let Some(conn) = self.conns.get_mut(&peer) else { return };
        let ecn = h.flags & TransportHeader::FLAG_ECN_ECHO != 0;
        if ecn {
            self.stats.ecn_echoes += 1;
        }
        let ack = h.seq;
        if ack > conn.snd_nxt || ack < conn.snd_una {
            return; // Stale or bogus.
        }
        if ack > conn.snd_una {
            let mut acked_bytes = 0;
            for _ in conn.snd_una..ack {
                let seg = conn.unacked.pop_front().expect("ack <= snd_nxt");
                acked_bytes += (seg.seg_len + self.cfg.header_bytes) as u64;
            }
            conn.in_flight -= acked_bytes;
            conn.snd_una = ack;
            conn.retx = conn.retx.split_off(&ack);
            conn.dup_acks = 0;
            conn.aimd.on_ack(acked_bytes, ecn, ack as u64, conn.snd_nxt as u64);
            match conn.recover {
                Some(r) if ack < r => {
                    conn.retx.insert(ack);
                }
                Some(_) => conn.recover = None,
                None => {}
            }
            conn.rto_cur = self.cfg.rto;
            conn.rto_at = (!conn.unacked.is_empty()).then_some(now + conn.rto_cur);
        } else if !conn.unacked.is_empty() {
            self.stats.dup_acks += 1;
            conn.dup_acks += 1;
            conn.aimd.on_ack(0, ecn, ack as u64, conn.snd_nxt as u64);
            if conn.dup_acks == self.cfg.dup_ack_threshold && conn.recover.is_none() {
                conn.recover = Some(conn.snd_nxt);
                conn.retx.insert(conn.snd_una);
                conn.aimd.on_congestion(conn.snd_nxt as u64);
            }
        }
    }

    /// Fires the retransmission timers due at `now`.
    pub fn handle_timeout(&mut self, now: Time) {
        for conn in self.conns.values_mut() {
            if conn.rto_at.is_some_and(|t| t <= now) {
                self.stats.timeouts += 1;
                conn.retx.insert(conn.snd_una);
                conn.aimd.on_congestion(conn.snd_nxt as u64);
                conn.dup_acks = 0;
                conn.recover = Some(conn.snd_nxt);
                conn.rto_cur = (conn.rto_cur * 2).min(self.cfg.rto_max);
                conn.rto_at = Some(now + conn.rto_cur);
            }
        }
    }

    /// Earliest retransmission deadline.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.conns.values().filter_map(|c| c.rto_at).min()
    }

    /// Next delivered message.
    pub fn poll_delivered(&mut self) -> Option<Delivered> {
        self.delivered.pop_front()
    }

    /// The next packet for the NIC: pending ACKs first, then one data segment (a
    /// retransmission before new data) from the next connection, in round-robin order of
    /// peer endpoints, that has one ready.
    pub fn poll_transmit(&mut self, now: Time) -> Option<Packet> {
        if let Some(ack) = self.acks.pop_front() {
            return Some(ack);
        }
        let cfg = &self.cfg;
        // The peers after the one served last, then from the first on (round robin).
        let n = self.conns.0.len();
        let start = self.last_served.map_or(0, |l| self.conns.0.partition_point(|(p, _)| *p <= l));
        let i = (start..n).chain(0..start).find(|&i| self.conns.0[i].1.ready(cfg))?;
        let (peer, conn) = &mut self.conns.0[i];
        let peer = *peer;
        self.last_served = Some(peer);
        let (seq, seg, flags) = match conn.retx.pop_first() {
            Some(seq) => {
                self.stats.retransmissions += 1;
                let seg = conn.unacked[(seq - conn.snd_una) as usize].clone();
                (seq, seg, TransportHeader::FLAG_RETRANSMIT)
            }
            None => {
                let seg = conn.cut_segment(cfg.mss);
                let seq = conn.snd_nxt;
                conn.snd_nxt += 1;
                conn.in_flight += (seg.seg_len + cfg.header_bytes) as u64;
                conn.unacked.push_back(seg.clone());
                (seq, seg, 0)
            }
        };
        if conn.rto_at.is_none() {
            conn.rto_at = Some(now + conn.rto_cur);
        }
        self.stats.data_packets_sent += 1;
        let h = TransportHeader {
            kind: SegKind::Data,
            flags,
            seq,
            msg_id: seg.msg_id,
            msg_offset: seg.msg_offset,
            msg_len: seg.msg_len,
            seg_len: seg.seg_len,
        };
        let l = self.local;
        let size = seg.seg_len + cfg.header_bytes;
        let mut pkt = Packet::new(l.host, l.port, peer.host, peer.port, size, Header::Transport(h));
        pkt.created = now;
        pkt.payload = seg.payload.map(Box::new);
        Some(pkt)
    }
}

/// Feeds the next in-order segment to the connection's reassembly; delivers the message when
/// it is complete.
fn accept(conn: &mut Conn, from: Endpoint, seg: Segment, out: &mut VecDeque<Delivered>, stats: &mut TransportStats) {
    if seg.msg_offset == 0 {
        debug_assert!(conn.assembly.is_none(), "previous message incomplete");
        let payload = match seg.payload {
            // A single-segment message needs no copy.
            Some(p) if seg.seg_len == seg.msg_len => Some(p),
            Some(p) => {
                let mut whole = p.zeros_like(seg.msg_len as usize / Payload::VALUE_BYTES);
                whole.copy_at(0, &p);
                Some(whole)
            }
            None => None,
        };
        conn.assembly = Some(Assembly { msg_id: seg.msg_id, msg_len: seg.msg_len, got: seg.seg_len, payload });
    } else {
        let a = conn.assembly.as_mut().expect("in-order segments start at offset 0");
        debug_assert_eq!((a.msg_id, a.got), (seg.msg_id, seg.msg_offset));
        if let (Some(whole), Some(p)) = (a.payload.as_mut(), seg.payload.as_ref()) {
            whole.copy_at(seg.msg_offset as usize / Payload::VALUE_BYTES, p);
        }
        a.got += seg.seg_len;
    }
    let a = conn.assembly.as_ref().expect("set above");
    if a.got == a.msg_len {
        let a = conn.assembly.take().expect("set above");
        stats.bytes_delivered += a.msg_len as u64;
        out.push_back(Delivered { from, msg_id: a.msg_id, bytes: a.msg_len as u64, payload: a.payload });
    }
}
