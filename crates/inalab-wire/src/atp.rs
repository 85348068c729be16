use crate::bytes::Reader;
use crate::WireError;

/// ATP's gradient-fragment / parameter header (ATP §3.3, Fig. 5).
///
/// Layout (big endian), 24 bytes after the header-kind tag:
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
    pub const LEN: usize = 24;

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        for v in [self.job, self.seq, self.agg_index, self.bitmap0, self.bitmap1] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.extend_from_slice(&[self.fan_in0, self.fan_in1, self.esi, self.flags]);
    }

    pub(crate) fn decode_from(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let h = AtpHeader {
            job: r.u32("atp job")?,
            seq: r.u32("atp seq")?,
            agg_index: r.u32("atp agg_index")?,
            bitmap0: r.u32("atp bitmap0")?,
            bitmap1: r.u32("atp bitmap1")?,
            fan_in0: r.u8("atp fan_in0")?,
            fan_in1: r.u8("atp fan_in1")?,
            esi: r.u8("atp esi")?,
            flags: r.u8("atp flags")?,
        };
        if h.esi > 2 {
            return Err(WireError::BadValue { what: "atp esi", value: h.esi as u64 });
        }
        if h.flags & 0x80 != 0 {
            return Err(WireError::BadValue { what: "atp flags", value: h.flags as u64 });
        }
        Ok(h)
    }
}
