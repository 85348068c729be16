use crate::bytes::Reader;
use crate::WireError;

/// SwitchML's header (Sapio et al., NSDI '21): a worker's packet names its slot in the job's
/// static pool and the slot's shadow copy (`ver`); the switch answers with the aggregated
/// result on the same slot.
///
/// Layout (big endian), 17 bytes after the header-kind tag:
/// `job:u32 slot:u32 chunk:u32 wid:u16 ver:u8 flags:u8 exp:i8`. On the wire SwitchML packets are 180 B: 52 B of headers plus 128 B (32
/// values) of payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SwitchMlHeader {
    pub job: u32,
    /// Slot in the job's pool (0 .. pool size).
    pub slot: u32,
    /// Chunk of the job's stream this packet carries (offset in packets).
    pub chunk: u32,
    /// Worker id, 0-based (the switch keeps one "seen" bit per worker).
    pub wid: u16,
    /// Shadow copy of the slot, 0 or 1.
    pub ver: u8,
    pub flags: u8,
    /// Block exponent of the *next* chunk this worker will send on this slot (SwitchML's
    /// scaling: the switch keeps the maximum, which workers use one window ahead).
    pub exp: i8,
}

impl SwitchMlHeader {
    /// Switch to worker: the aggregated result.
    pub const FLAG_RESULT: u8 = 1;
    pub const FLAG_RETRANSMIT: u8 = 2;
    pub const LEN: usize = 17;

    pub fn encode(&self, out: &mut Vec<u8>) {
        for v in [self.job, self.slot, self.chunk] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.extend_from_slice(&self.wid.to_be_bytes());
        out.extend_from_slice(&[self.ver, self.flags, self.exp as u8]);
    }

    pub(crate) fn decode_from(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let h = SwitchMlHeader {
            job: r.u32("switchml job")?,
            slot: r.u32("switchml slot")?,
            chunk: r.u32("switchml chunk")?,
            wid: r.u16("switchml wid")?,
            ver: r.u8("switchml ver")?,
            flags: r.u8("switchml flags")?,
            exp: r.u8("switchml exp")? as i8,
        };
        if h.ver > 1 {
            return Err(WireError::BadValue { what: "switchml ver", value: h.ver as u64 });
        }
        if h.flags & !(Self::FLAG_RESULT | Self::FLAG_RETRANSMIT) != 0 {
            return Err(WireError::BadValue { what: "switchml flags", value: h.flags as u64 });
        }
        Ok(h)
    }
}
