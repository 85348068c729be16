//! Host-side I/O for host protocols: frames in from the host's switch, frames out to it.
//! A host has one neighbour (its switch, the "gateway"); datagrams from anyone else are
//! counted as `foreign` and dropped, undecodable ones as `malformed`.

use crate::udp::{TxBatch, Udp};
use inalab_core::{frame, HostProtocol, Packet, Time};
use serde_json::{json, Value};
use std::net::SocketAddr;

pub struct HostIo {
    pub udp: Udp,
    pub gateway: SocketAddr,
    tx: TxBatch,
    malformed: u64,
    foreign: u64,
    last_malformed: Option<String>,
}

impl HostIo {
    pub fn new(udp: Udp, gateway: SocketAddr) -> HostIo {
        HostIo { udp, gateway, tx: TxBatch::default(), malformed: 0, foreign: 0, last_malformed: None }
    }

    /// One batched receive; every decodable frame from the gateway goes to `deliver`.
    /// Returns the datagrams read (0: nothing was queued).
    pub fn recv(&mut self, mut deliver: impl FnMut(Packet)) -> std::io::Result<usize> {
        let (gw, mut malformed, mut foreign, mut last) = (self.gateway, 0, 0, None);
        let n = self.udp.recv_batch(|from, d| {
            if from != gw {
                foreign += 1;
                return;
            }
            match frame::decode(d) {
                Ok(p) => deliver(p),
                Err(e) => {
                    malformed += 1;
                    last = Some(e.to_string());
                }
            }
        })?;
        self.malformed += malformed;
        self.foreign += foreign;
        if last.is_some() {
            self.last_malformed = last;
        }
        Ok(n)
    }

    /// Takes every packet the protocol releases now (its window limits how many) into the
    /// send batch. Returns how many.
    pub fn transmit(&mut self, now: Time, proto: &mut dyn HostProtocol) -> usize {
        let mut n = 0;
        while let Some(p) = proto.poll_transmit(now) {
            self.tx.push(self.gateway, |b| frame::encode(&p, b));
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
            "malformed": self.malformed, "foreign": self.foreign, "last_malformed": self.last_malformed,
            "datagrams_sent": io.datagrams_sent, "datagrams_received": io.datagrams_received,
            "send_calls": io.send_calls, "recv_calls": io.recv_calls, "send_errors": io.send_errors,
        })
    }
}

/// Protocol counters as a JSON object.
pub fn counters_json(proto: &dyn HostProtocol) -> Value {
    Value::Object(proto.counters().into_iter().map(|(k, v)| (k.to_string(), json!(v))).collect())
}
