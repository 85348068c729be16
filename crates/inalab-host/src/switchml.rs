//! SwitchML's worker (Sapio et al., NSDI '21): streams a job's tensors through a static pool
//! of aggregator slots at the switch, which sums the workers' packets and sends every worker
//! the result (no parameter server). The switch side is `inalab_switch::SwitchMlSwitch`.
//!
//! # Stream
//!
//! Allreduce requests are cut into chunks of `(packet_bytes - header_bytes) / 4` i32 values
//! (32 with the defaults). The chunks of all requests form one stream, numbered from 0 in
//! submission order: a request's chunks follow the previous request's without a gap, so
//! the pool stays busy across requests. Stream chunk `g` goes on slot `g % pool_slots`
//! with shadow copy `ver = (g / pool_slots) % 2`: the first window sends chunk `k` on slot
//! `k` for `k < pool_slots`, and when the result of a slot arrives the worker sends the
//! slot's next chunk (`g + pool_slots`) on the other copy. Every worker of a job must
//! therefore submit the same requests (same sizes) in the same order. A request completes
//! (`Done`, in payload mode with the summed values) when the results of all its chunks
//! arrived; requests may complete out of submission order when a later one is shorter.
//!
//! # Loss recovery
//!
//! Each slot has one packet outstanding and one timer, started when the packet leaves the
//! NIC; at expiry the packet is sent again with `FLAG_RETRANSMIT` (the switch answers it from
//! the completed copy if only the result was lost). There is no retry limit, as in SwitchML.
//! The timer is RFC 6298's RTO ([`crate::RttEstimator`]) from the round trips of slots sent
//! once (Karn's rule), never below `timeout_ps`, backed off once per RTO (up to 64x) and
//! reset by progress. SwitchML's fixed 1 ms is the floor: where round trips stay below it
//! (a Tofino, the simulator's data centers) nothing changes; where a pool of large packets
//! queues for tens of milliseconds (software switches on shared cores) a fixed timeout
//! resent whole windows that were only waiting (22,049 spurious retransmissions in a run of
//! 60 allreduces of 4 MiB, 4 workers, 8 KiB datagrams).
//!
//! # Defaults
//!
//! - `pool_slots` = 128 slots;
//! - `timeout_ps` = 1 ms (SwitchML's value, used by ATP's comparison);
//! - `packet_bytes` = 180 B on the wire, `header_bytes` = 52 B (Ethernet, IP, UDP and
//!   SwitchML headers), so 128 B = 32 i32 values per packet.
//!
//! # Deviations from the paper
//!
//! - The values are i32 already: floats are converted by the quantization layer in front of
//!   this protocol ([`crate::Quantized`], which both drivers run), with one exponent agreed
//!   per tensor in an extra allreduce instead of SwitchML's per-packet exponents, so the
//!   header's `exp` is sent as 0 here.
//! - Every packet, the last of a request included, is charged `packet_bytes` on the wire
//!   (SwitchML pads to the switch's fixed payload), but carries only the request's values.
//! - The per-tensor exponent agreement is the quantization layer's extra allreduce (a
//!   `world`-long vector, one chunk for up to 32 workers) before the tensor's data.
//! - The chunk field is the stream chunk number modulo 2^32.

use crate::error::ensure;
use crate::rtt::{RttConfig, RttEstimator};
use crate::ConfigError;
use inalab_core::time::{Time, MS, US};
use inalab_core::wire::{Header, SwitchMlHeader};
use inalab_core::{AppRequest, Endpoint, HostEvent, HostProtocol, Packet, Payload, MAX_BACKOFF};
use std::collections::{BTreeMap, VecDeque};

/// SwitchML worker parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchMlConfig {
    /// The job id the switch admitted.
    pub job: u32,
    /// This worker's id in the job (its index in the switch's worker list).
    pub wid: u16,
    /// Where worker packets are addressed: the switch's node id and a UDP port. The switch
    /// program intercepts them; results come back to this worker's endpoint.
    pub switch: Endpoint,
    /// Slots of the job's pool (must equal the pool the switch admitted). Default 128.
    pub pool_slots: u32,
    /// Loss-recovery timeout per slot, in picoseconds. Default 1 ms.
    pub timeout_ps: Time,
    /// Bytes on the wire per packet, headers included. Default 180.
    pub packet_bytes: u32,
    /// Header bytes per packet; the rest carries i32 values. Default 52.
    pub header_bytes: u32,
}

impl SwitchMlConfig {
    /// The defaults for worker `wid` of `job` sending to `switch`.
    pub fn new(job: u32, wid: u16, switch: Endpoint) -> Self {
        SwitchMlConfig { job, wid, switch, pool_slots: 128, timeout_ps: MS, packet_bytes: 180, header_bytes: 52 }
    }

    /// Values per packet: `(packet_bytes - header_bytes) / 4`.
    pub fn values_per_packet(&self) -> u32 {
        self.packet_bytes.saturating_sub(self.header_bytes) / 4
    }
}

/// One slot of the pool.
#[derive(Debug, Clone, Default)]
struct Slot {
    /// The stream chunk outstanding on the slot (sent or waiting to be), if any.
    chunk: Option<u64>,
    /// The next stream chunk the slot will carry.
    next: u64,
    /// Times the outstanding chunk was sent.
    sends: u32,
    /// Whether the slot waits in the transmit queue.
    queued: bool,
    /// Bumped at every send; timer entries of older sends are stale.
    gen: u64,
    /// When the outstanding chunk was last sent.
    sent_at: Time,
}

struct Req {
    id: u64,
    /// Values of the request (payload mode) or bytes / 4 rounded up (metadata mode).
    values: u64,
    left: u64,
    data: Option<Payload>,
}

/// SwitchML worker: see the module docs.
pub struct SwitchMlWorker {
    local: Endpoint,
    cfg: SwitchMlConfig,
    vpp: u64,
    slots: Vec<Slot>,
    /// Stream chunks submitted so far.
    end: u64,
    /// Requests in flight by first stream chunk.
    reqs: BTreeMap<u64, Req>,
    /// Slots with a packet to send, FIFO.
    txq: VecDeque<u32>,
    /// (deadline, slot, gen) in send order; deadlines never decrease (a shorter RTO waits
    /// for the deadline before it). The front is kept valid (its gen current) after every input.
    timers: VecDeque<(Time, u32, u64)>,
    rtt: RttEstimator,
    events: VecDeque<HostEvent>,
    packets_sent: u64,
    retransmissions: u64,
    timeouts: u64,
    stale_results: u64,
}

impl SwitchMlWorker {
    /// Worker at `local`. Errors on an empty pool, a zero timeout, or a packet that carries
    /// no value.
    pub fn new(local: Endpoint, cfg: SwitchMlConfig) -> Result<Self, ConfigError> {
        ensure!(cfg.pool_slots > 0, "pool_slots must be positive");
        ensure!(cfg.timeout_ps > 0, "timeout_ps must be positive");
        ensure!(
            cfg.values_per_packet() > 0,
            "packet_bytes {} minus header_bytes {} must leave room for at least one 4-byte value",
            cfg.packet_bytes,
            cfg.header_bytes
        );
        let slots = (0..cfg.pool_slots as u64).map(|s| Slot { next: s, ..Slot::default() }).collect();
        let rtt = RttEstimator::new(RttConfig {
            initial_rto_ps: cfg.timeout_ps,
            min_rto_ps: cfg.timeout_ps,
            max_rto_ps: cfg.timeout_ps.saturating_mul(MAX_BACKOFF),
            granularity_ps: US.min(cfg.timeout_ps),
        });
        Ok(SwitchMlWorker {
            local,
            vpp: cfg.values_per_packet() as u64,
            cfg,
            slots,
            end: 0,
            reqs: BTreeMap::new(),
            txq: VecDeque::new(),
            timers: VecDeque::new(),
            rtt,
            events: VecDeque::new(),
            packets_sent: 0,
            retransmissions: 0,
            timeouts: 0,
            stale_results: 0,
        })
    }

    fn pool(&self) -> u64 {
        self.cfg.pool_slots as u64
    }

    /// Puts `g` on its slot (which must be idle and due for it) and queues the send.
    fn activate(&mut self, g: u64) {
        let s = (g % self.pool()) as u32;
        let slot = &mut self.slots[s as usize];
        debug_assert!(slot.chunk.is_none() && slot.next == g);
        slot.chunk = Some(g);
        slot.sends = 0;
        if !slot.queued {
            slot.queued = true;
            self.txq.push_back(s);
        }
    }

    /// Drops stale timers from the front so `poll_timeout` sees a live one.
    fn prune_timers(&mut self) {
        while let Some(&(_, s, gen)) = self.timers.front() {
            let slot = &self.slots[s as usize];
            if slot.chunk.is_some() && !slot.queued && slot.gen == gen {
                break;
            }
            self.timers.pop_front();
        }
    }

    fn on_result(&mut self, now: Time, h: &SwitchMlHeader, payload: Option<&Payload>) {
        let pool = self.pool();
        let Some(slot) = self.slots.get_mut(h.slot as usize) else {
            self.stale_results += 1;
            return;
        };
        let Some(g) = slot.chunk.filter(|&g| g as u32 == h.chunk && ((g / pool) % 2) as u8 == h.ver) else {
            self.stale_results += 1;
            return;
        };
        slot.chunk = None;
        slot.next = g + pool;
        if slot.sends == 1 {
            self.rtt.sample(now.saturating_sub(slot.sent_at));
        } else {
            self.rtt.on_progress();
        }
        let (&first, req) = self.reqs.range_mut(..=g).next_back().expect("a request owns every outstanding chunk");
        let start = ((g - first) * self.vpp) as usize;
        if let (Some(data), Some(p @ Payload::I32(v))) = (req.data.as_mut(), payload) {
            let want = (req.values as usize - start).min(self.vpp as usize).min(v.len());
            if want == v.len() {
                data.copy_at(start, p);
            } else {
                data.copy_at(start, &Payload::I32(v[..want].to_vec()));
            }
        }
        req.left -= 1;
        if req.left == 0 {
            let req = self.reqs.remove(&first).expect("present");
            self.events.push_back(HostEvent::Done { id: req.id, data: req.data });
        }
        if g + pool < self.end {
            self.activate(g + pool);
        }
        self.prune_timers();
    }
}

impl HostProtocol for SwitchMlWorker {
    fn endpoint(&self) -> Endpoint {
        self.local
    }

    /// Appends an allreduce request to the stream. Payload mode needs `Payload::I32` with
    /// `bytes / 4` values and `bytes` a multiple of 4 (convert floats with [`crate::quant`]).
    /// A zero-byte request is done at once; `Send` requests fail.
    fn submit(&mut self, _now: Time, req: AppRequest) {
        let (id, bytes, data) = match req {
            AppRequest::Allreduce { id, bytes, data, .. } => (id, bytes, data),
            AppRequest::Send { id, .. } => {
                return self.events.push_back(HostEvent::Failed {
                    id,
                    reason: "a SwitchML worker serves only Allreduce requests".into(),
                })
            }
        };
        if let Some(d) = &data {
            let ok = matches!(d, Payload::I32(_)) && bytes % 4 == 0 && d.len() as u64 == bytes / 4;
            if !ok {
                let reason =
                    format!("SwitchML needs an i32 payload of bytes / 4 values ({bytes} B, {} values)", d.len());
                return self.events.push_back(HostEvent::Failed { id, reason });
            }
        }
        let values = bytes.div_ceil(4);
        let chunks = values.div_ceil(self.vpp);
        if chunks == 0 {
            return self.events.push_back(HostEvent::Done { id, data });
        }
        let first = self.end;
        self.reqs.insert(first, Req { id, values, left: chunks, data });
        self.end += chunks;
        // Idle slots waiting for chunks of this range start now.
        for g in first..self.end.min(first + self.pool()) {
            let s = &self.slots[(g % self.pool()) as usize];
            if s.chunk.is_none() && s.next == g {
                self.activate(g);
            }
        }
    }

    fn handle_packet(&mut self, now: Time, pkt: Packet) {
        match &pkt.header {
            Header::SwitchMl(h) if h.job == self.cfg.job && h.flags & SwitchMlHeader::FLAG_RESULT != 0 => {
                let h = *h;
                self.on_result(now, &h, pkt.payload.as_deref());
            }
            _ => self.stale_results += 1,
        }
    }

    fn handle_timeout(&mut self, now: Time) {
        while let Some(&(at, s, gen)) = self.timers.front() {
            if at > now {
                break;
            }
            self.timers.pop_front();
            let slot = &mut self.slots[s as usize];
            if slot.chunk.is_some() && !slot.queued && slot.gen == gen {
                self.timeouts += 1;
                slot.queued = true;
                self.txq.push_back(s);
                self.rtt.on_timeout_of(slot.sent_at, now);
            }
        }
        self.prune_timers();
    }

    fn poll_transmit(&mut self, now: Time) -> Option<Packet> {
        while let Some(s) = self.txq.pop_front() {
            let pool = self.pool();
            let slot = &mut self.slots[s as usize];
            slot.queued = false;
            let Some(g) = slot.chunk else { continue };
            let retransmit = slot.sends > 0;
            slot.sends += 1;
            slot.gen += 1;
            slot.sent_at = now;
            let gen = slot.gen;
            let h = SwitchMlHeader {
                job: self.cfg.job,
                slot: s,
                chunk: g as u32,
                wid: self.cfg.wid,
                ver: ((g / pool) % 2) as u8,
                flags: if retransmit { SwitchMlHeader::FLAG_RETRANSMIT } else { 0 },
                exp: 0,
            };
            let (l, sw) = (self.local, self.cfg.switch);
            let mut pkt = Packet::new(l.host, l.port, sw.host, sw.port, self.cfg.packet_bytes, Header::SwitchMl(h));
            pkt.created = now;
            let (&first, req) = self.reqs.range(..=g).next_back().expect("a request owns every outstanding chunk");
            if let Some(d) = &req.data {
                let start = ((g - first) * self.vpp) as usize;
                let end = (start + self.vpp as usize).min(d.len());
                pkt.payload = Some(Box::new(d.slice(start, end)));
            }
            let deadline = (now + self.rtt.rto()).max(self.timers.back().map_or(0, |t| t.0));
            self.timers.push_back((deadline, s, gen));
            self.packets_sent += 1;
            self.retransmissions += retransmit as u64;
            self.prune_timers();
            return Some(pkt);
        }
        self.prune_timers();
        None
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.timers.front().map(|t| t.0)
    }

    fn poll_event(&mut self) -> Option<HostEvent> {
        self.events.pop_front()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("packets_sent", self.packets_sent),
            ("retransmissions", self.retransmissions),
            ("timeouts", self.timeouts),
            ("stale_results", self.stale_results),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SW: Endpoint = Endpoint { host: 9, port: 1 };

    fn worker(pool: u32) -> SwitchMlWorker {
        let cfg = SwitchMlConfig { pool_slots: pool, timeout_ps: MS, ..SwitchMlConfig::new(1, 0, SW) };
        let mut w = SwitchMlWorker::new(Endpoint { host: 0, port: 1 }, cfg).unwrap();
        w.submit(0, AppRequest::Allreduce { id: 1, bytes: 4 * 32 * 8, data: None, attrs: Default::default() });
        w
    }

    fn send_all(w: &mut SwitchMlWorker, now: Time) -> Vec<SwitchMlHeader> {
        std::iter::from_fn(|| w.poll_transmit(now))
            .map(|p| match p.header {
                Header::SwitchMl(h) => h,
                h => panic!("{h:?}"),
            })
            .collect()
    }

    fn answer(w: &mut SwitchMlWorker, now: Time, h: SwitchMlHeader) {
        let h = SwitchMlHeader { flags: SwitchMlHeader::FLAG_RESULT, ..h };
        w.handle_packet(now, Packet::new(SW.host, SW.port, 0, 1, 180, Header::SwitchMl(h)));
    }

    #[test]
    fn the_timeout_follows_measured_round_trips_above_its_floor() {
        let mut w = worker(2);
        let sent = send_all(&mut w, 0);
        assert_eq!((sent.len(), w.poll_timeout()), (2, Some(MS)), "the first RTO is timeout_ps");
        // Two round trips of 0.8 ms: SRTT 0.8, RTTVAR 0.4 then 0.3, RTO = 0.8 + 4 x 0.3 = 2 ms.
        for h in sent {
            answer(&mut w, 800 * US, h);
        }
        let sent = send_all(&mut w, 800 * US);
        assert_eq!(w.poll_timeout(), Some(800 * US + 2000 * US));
        // 1.7 ms later the results come: a fixed 1 ms would have resent both.
        w.handle_timeout(2500 * US);
        for h in sent {
            answer(&mut w, 2500 * US, h);
        }
        assert_eq!((w.timeouts, w.retransmissions), (0, 0));
    }

    #[test]
    fn slots_timing_out_together_back_off_once() {
        let mut w = worker(4);
        assert_eq!(send_all(&mut w, 0).len(), 4);
        w.handle_timeout(MS);
        assert_eq!(w.timeouts, 4);
        let resent = send_all(&mut w, MS);
        assert!(resent.iter().all(|h| h.flags & SwitchMlHeader::FLAG_RETRANSMIT != 0));
        // One back-off for the four: 2 ms, not 16.
        assert_eq!(w.poll_timeout(), Some(MS + 2 * MS));
        // Their next timeout is a new loss: backed off again.
        w.handle_timeout(3 * MS);
        send_all(&mut w, 3 * MS);
        assert_eq!(w.poll_timeout(), Some(3 * MS + 4 * MS));
        // A result from a retransmission ends the back-off (no sample, by Karn's rule).
        answer(&mut w, 4 * MS, resent[0]);
        let next = send_all(&mut w, 4 * MS);
        assert_eq!(next.len(), 1);
        assert_eq!(w.timers.back().map(|t| t.0), Some((4 * MS + MS).max(3 * MS + 4 * MS)));
    }
}
