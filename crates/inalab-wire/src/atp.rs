use crate::bytes::{be32, u8_at};
use crate::WireError;

/// Offsets within the header body (after the kind tag).
mod field {
    use core::ops::Range;
    pub const JOB: Range<usize> = 0..4;
    pub const SEQ: Range<usize> = 4..8;
    pub const AGG_INDEX: Range<usize> = 8..12;
    pub const BITMAP0: Range<usize> = 12..16;
    pub const BITMAP1: Range<usize> = 16..20;
    pub const FAN_IN0: usize = 20;
    pub const FAN_IN1: usize = 21;
    pub const ESI: usize = 22;
    pub const FLAGS: usize = 23;
}

/// ATP's gradient-fragment / parameter header (ATP §3.3, Fig. 5).
///
/// Layout (big endian), 24 bytes after the header-kind tag (offsets in `field`):
/// `job:u32 seq:u32 agg_index:u32 bitmap0:u32 bitmap1:u32 fan_in0:u8 fan_in1:u8 esi:u8 flags:u8`.
/// On the wire ATP's packets are 306 B: 58 B of Ethernet, IP, UDP and ATP header plus 248 B
/// (62 i32 values) of payload; the simulator charges those sizes.
///
/// Worker limit: `bitmap0` holds one bit per worker inside a rack and `bitmap1` one bit per
/// level-2 contributor (a rack, or a worker in the PS's rack), so a job has at most
/// 32 x 32 = 1024 workers, ATP's n^2 scheme with n = 32-bit switch registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtpHeader {
    pub job: u32,
    /// Fragment sequence number within the job's stream.
    pub seq: u32,
    /// Aggregator slot at the switch: HASH(<job, seq>) % aggregators, or remapped by rehash.
    pub agg_index: u32,
    /// Level-1 bitmap: the sender's one-hot position in its rack, or the OR of aggregated
    /// positions. On parameter packets with `FLAG_REHASH`, the new aggregator index.
    pub bitmap0: u32,
    /// Level-2 bitmap: one bit per level-2 contributor.
    pub bitmap1: u32,
    /// Workers of the rack that aggregate at the first-level switch.
    pub fan_in0: u8,
    /// Contributors that aggregate at the second-level (PS rack) switch.
    pub fan_in1: u8,
    /// Edge switch identifier: 0 = heading to the level-1 switch, 1 = to the level-2 switch,
    /// 2 = aggregated at level 2, heading to the PS.
    pub esi: u8,
    pub flags: u8,
}

impl AtpHeader {
    pub const FLAG_RESEND: u8 = 1;
    pub const FLAG_ECN: u8 = 2;
    pub const FLAG_COLLISION: u8 = 4;
    /// Parameter packet (the aggregated result, which doubles as the ACK).
    pub const FLAG_ACK: u8 = 8;
    /// The aggregated value saturated; on a parameter packet: "send floats for this seq".
    pub const FLAG_OVERFLOW: u8 = 16;
    /// The payload holds f32 values (overflow fallback), not fixed-point i32.
    pub const FLAG_FLOAT: u8 = 32;
    /// Parameter packet carries a new aggregator index in `bitmap0` (dynamic rehashing).
    pub const FLAG_REHASH: u8 = 64;
    /// Every defined `FLAG_*` bit; others are rejected.
    const FLAGS_KNOWN: u8 = Self::FLAG_RESEND
        | Self::FLAG_ECN
        | Self::FLAG_COLLISION
        | Self::FLAG_ACK
        | Self::FLAG_OVERFLOW
        | Self::FLAG_FLOAT
        | Self::FLAG_REHASH;
    /// Encoded length without the kind tag.
    pub const LEN: usize = field::FLAGS + 1;

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut b = [0; Self::LEN];
        b[field::JOB].copy_from_slice(&self.job.to_be_bytes());
        b[field::SEQ].copy_from_slice(&self.seq.to_be_bytes());
        b[field::AGG_INDEX].copy_from_slice(&self.agg_index.to_be_bytes());
        b[field::BITMAP0].copy_from_slice(&self.bitmap0.to_be_bytes());
        b[field::BITMAP1].copy_from_slice(&self.bitmap1.to_be_bytes());
        b[field::FAN_IN0] = self.fan_in0;
        b[field::FAN_IN1] = self.fan_in1;
        b[field::ESI] = self.esi;
        b[field::FLAGS] = self.flags;
        out.extend_from_slice(&b);
    }

    /// Decodes the header body (after the kind tag) from the front of `buf`.
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        let h = AtpHeader {
            job: be32(buf, field::JOB, "atp job")?,
            seq: be32(buf, field::SEQ, "atp seq")?,
            agg_index: be32(buf, field::AGG_INDEX, "atp agg_index")?,
            bitmap0: be32(buf, field::BITMAP0, "atp bitmap0")?,
            bitmap1: be32(buf, field::BITMAP1, "atp bitmap1")?,
            fan_in0: u8_at(buf, field::FAN_IN0, "atp fan_in0")?,
            fan_in1: u8_at(buf, field::FAN_IN1, "atp fan_in1")?,
            esi: u8_at(buf, field::ESI, "atp esi")?,
            flags: u8_at(buf, field::FLAGS, "atp flags")?,
        };
        if h.esi > 2 {
            return Err(WireError::BadValue { what: "atp esi", value: h.esi as u64 });
        }
        if h.flags & !Self::FLAGS_KNOWN != 0 {
            return Err(WireError::BadValue { what: "atp flags", value: h.flags as u64 });
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

    impl AtpHeader {
        /// Any valid header of this kind (the round-trip property tests' generator).
        pub(crate) fn arbitrary() -> impl Strategy<Value = Self> {
            ((any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()), (any::<u8>(), any::<u8>(), 0u8..3, 0u8..128)).prop_map(
                |((job, seq, agg_index, bitmap0, bitmap1), (fan_in0, fan_in1, esi, flags))| AtpHeader {
                    job,
                    seq,
                    agg_index,
                    bitmap0,
                    bitmap1,
                    fan_in0,
                    fan_in1,
                    esi,
                    flags,
                },
            )
        }
    }

    #[test]
    fn vector() {
        let h = AtpHeader {
            job: 0x0102_0304,
            seq: 0x0506_0708,
            agg_index: 0x090A_0B0C,
            bitmap0: 0x0D0E_0F10,
            bitmap1: 0x1112_1314,
            fan_in0: 0x15,
            fan_in1: 0x16,
            esi: 2,
            flags: AtpHeader::FLAG_ACK | AtpHeader::FLAG_FLOAT,
        };
        #[rustfmt::skip]
        let bytes = [
            2, // header kind: Atp
            0x01, 0x02, 0x03, 0x04, // job
            0x05, 0x06, 0x07, 0x08, // seq
            0x09, 0x0A, 0x0B, 0x0C, // agg_index
            0x0D, 0x0E, 0x0F, 0x10, // bitmap0
            0x11, 0x12, 0x13, 0x14, // bitmap1
            0x15, 0x16, 2, 0x28, // fan_in0, fan_in1, esi, flags ACK|FLOAT
        ];
        check_vector(Header::Atp(h), &bytes);
    }

    #[test]
    fn unknown_values_rejected() {
        let mut b = vec![];
        AtpHeader::default().encode(&mut b);
        b[field::FLAGS] = 0x80;
        assert_eq!(AtpHeader::decode(&b), Err(WireError::BadValue { what: "atp flags", value: 0x80 }));
        b[field::ESI] = 3;
        assert_eq!(AtpHeader::decode(&b), Err(WireError::BadValue { what: "atp esi", value: 3 }));
    }
}
