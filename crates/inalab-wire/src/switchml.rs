use crate::bytes::{be16, be32, u8_at};
use crate::WireError;

/// Offsets within the header body (after the kind tag).
mod field {
    use core::ops::Range;
    pub const JOB: Range<usize> = 0..4;
    pub const SLOT: Range<usize> = 4..8;
    pub const CHUNK: Range<usize> = 8..12;
    pub const WID: Range<usize> = 12..14;
    pub const VER: usize = 14;
    pub const FLAGS: usize = 15;
    pub const EXP: usize = 16;
}

/// SwitchML's header (Sapio et al., NSDI '21): a worker's packet names its slot in the job's
/// static pool and the slot's shadow copy (`ver`); the switch answers with the aggregated
/// result on the same slot.
///
/// Layout (big endian), 17 bytes after the header-kind tag (offsets in `field`):
/// `job:u32 slot:u32 chunk:u32 wid:u16 ver:u8 flags:u8 exp:i8`. On the wire SwitchML packets
/// are 180 B: 52 B of headers plus 128 B (32 values) of payload.
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
    /// Encoded length without the kind tag.
    pub const LEN: usize = field::EXP + 1;

    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut b = [0; Self::LEN];
        b[field::JOB].copy_from_slice(&self.job.to_be_bytes());
        b[field::SLOT].copy_from_slice(&self.slot.to_be_bytes());
        b[field::CHUNK].copy_from_slice(&self.chunk.to_be_bytes());
        b[field::WID].copy_from_slice(&self.wid.to_be_bytes());
        b[field::VER] = self.ver;
        b[field::FLAGS] = self.flags;
        b[field::EXP] = self.exp as u8;
        out.extend_from_slice(&b);
    }

    /// Decodes the header body (after the kind tag) from the front of `buf`.
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        let h = SwitchMlHeader {
            job: be32(buf, field::JOB, "switchml job")?,
            slot: be32(buf, field::SLOT, "switchml slot")?,
            chunk: be32(buf, field::CHUNK, "switchml chunk")?,
            wid: be16(buf, field::WID, "switchml wid")?,
            ver: u8_at(buf, field::VER, "switchml ver")?,
            flags: u8_at(buf, field::FLAGS, "switchml flags")?,
            exp: u8_at(buf, field::EXP, "switchml exp")? as i8,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::tests::check_vector;
    use crate::Header;
    use proptest::prelude::*;

    impl SwitchMlHeader {
        /// Any valid header of this kind (the round-trip property tests' generator).
        pub(crate) fn arbitrary() -> impl Strategy<Value = Self> {
            (any::<u32>(), any::<u32>(), any::<u32>(), any::<u16>(), 0u8..2, 0u8..4, any::<i8>())
                .prop_map(|(job, slot, chunk, wid, ver, flags, exp)| SwitchMlHeader { job, slot, chunk, wid, ver, flags, exp })
        }
    }

    #[test]
    fn vector() {
        let h = SwitchMlHeader {
            job: 0x0102_0304,
            slot: 0x0506_0708,
            chunk: 0x090A_0B0C,
            wid: 0x0D0E,
            ver: 1,
            flags: SwitchMlHeader::FLAG_RESULT,
            exp: -3,
        };
        #[rustfmt::skip]
        let bytes = [
            3, // header kind: SwitchMl
            0x01, 0x02, 0x03, 0x04, // job
            0x05, 0x06, 0x07, 0x08, // slot
            0x09, 0x0A, 0x0B, 0x0C, // chunk
            0x0D, 0x0E, // wid
            1, 1, 0xFD, // ver, flags RESULT, exp -3
        ];
        check_vector(Header::SwitchMl(h), &bytes);
    }

    #[test]
    fn unknown_values_rejected() {
        let mut b = vec![];
        SwitchMlHeader::default().encode(&mut b);
        b[field::FLAGS] = 4;
        assert_eq!(SwitchMlHeader::decode(&b), Err(WireError::BadValue { what: "switchml flags", value: 4 }));
        b[field::VER] = 2;
        assert_eq!(SwitchMlHeader::decode(&b), Err(WireError::BadValue { what: "switchml ver", value: 2 }));
    }
}
