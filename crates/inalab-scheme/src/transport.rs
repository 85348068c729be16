//! The windowed transport's parameters, shared by the host-only collectives and by ATP's
//! window.

use crate::{Param, Range};
use inalab_core::time::MS;
use inalab_host::{AimdConfig, TransportConfig};
use serde::{Deserialize, Serialize};

/// Each default is written once, in `Default` below (docs/config.md is generated from it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TransportParams {
    /// Maximum segment (payload) size, bytes.
    pub mss_bytes: u32,
    /// Header bytes added to every packet, bytes.
    pub header_bytes: u32,
    /// Retransmission timeout, ps.
    pub rto_ps: u64,
    /// Initial congestion window, bytes.
    pub init_window_bytes: u64,
    /// Additive increase per round trip, bytes.
    pub increment_bytes: u64,
}

impl Default for TransportParams {
    fn default() -> Self {
        TransportParams { mss_bytes: 1436, header_bytes: 64, rto_ps: MS, init_window_bytes: 60_000, increment_bytes: 1500 }
    }
}

pub(crate) const TRANSPORT_PARAMS: [Param; 5] = [
    Param { name: "transport.mss_bytes", unit: "bytes", doc: "Maximum segment (payload) size of a packet.", range: Range::PACKET },
    Param { name: "transport.header_bytes", unit: "bytes", doc: "Header bytes added to every packet on the wire.", range: Range::HEADER },
    Param { name: "transport.rto_ps", unit: "ps", doc: "Retransmission timeout.", range: Range::TIME },
    Param { name: "transport.init_window_bytes", unit: "bytes", doc: "Initial congestion window.", range: Range::WINDOW },
    Param { name: "transport.increment_bytes", unit: "bytes", doc: "Additive increase of the window per round trip.", range: Range::Int { min: 0, max: crate::plan::MAX_WINDOW_BYTES } },
];

impl TransportParams {
    pub fn config(&self) -> TransportConfig {
        TransportConfig {
            mss: self.mss_bytes,
            header_bytes: self.header_bytes,
            rto: self.rto_ps,
            rto_max: (self.rto_ps * 64).max(self.rto_ps),
            aimd: AimdConfig { initial_window_bytes: self.init_window_bytes, increment_bytes: self.increment_bytes, ..AimdConfig::default() },
            ..TransportConfig::default()
        }
    }
}
