use crate::bytes::{be16, be32, be64, u8_at};
use crate::WireError;

/// Offsets within the header body (after the kind tag).
mod field {
    use core::ops::Range;
    pub const JOB: Range<usize> = 0..4;
    pub const FRAG: Range<usize> = 4..8;
    pub const NODE: Range<usize> = 8..12;
    pub const BITMAP: Range<usize> = 12..20;
    pub const FAN_IN: usize = 20;
    pub const FLAGS: usize = 21;
    pub const RESERVED: Range<usize> = 22..24;
}

/// GRID's gradient, result and control header (Fang et al., §3.4 and §5;
/// `../shared/specs/grid.md` §1.3): node-targeted aggregation names the one node that may add a
/// fragment, a programmable switch or the PS; every other switch only forwards it.
///
/// Layout (big endian), 24 bytes after the header-kind tag (offsets in `field`):
/// `job:u32 frag:u32 node:u32 bitmap:u64 fan_in:u8 flags:u8 reserved:u16` (reserved is 0).
/// Widths are the spec's choice: the authors' P4 header (`ngaa_h`) has an 8-bit switch id and a
/// 32-bit bitmap, too small for the paper's 500-host leaf-spine. On the wire a packet is 66 B
/// of Ethernet, IPv4, UDP and this header plus 64 i32 values (322 B); the simulator charges the
/// scheme's configured sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GridHeader {
    pub job: u32,
    /// Fragment id: a per-job sequence number over the whole stream of tensors.
    pub frag: u32,
    /// The aggregation node (a switch's or the PS host's node id); in a control packet, the
    /// switch that sent it.
    pub node: u32,
    /// Contributors: the sender's one-hot position in its node's worker group, or the OR of
    /// those aggregated. At most 64 workers per node.
    pub bitmap: u64,
    /// Workers the node aggregates for this packet's group (1 when the node is the PS).
    pub fan_in: u8,
    pub flags: u8,
}

impl GridHeader {
    /// A worker's re-send after a timeout: flushed by a switch holding its fragment, never
    /// dropped for a collision.
    pub const FLAG_RESEND: u8 = 0x01;
    /// Congestion seen (an echo of ECN marks, or a control packet's signal).
    pub const FLAG_ECN: u8 = 0x02;
    /// Rate synchronization: a switch tells a sender its fragment collided (§5.2).
    pub const FLAG_CONTROL: u8 = 0x04;
    /// The PS's aggregated result (doubles as the ACK).
    pub const FLAG_RESULT: u8 = 0x08;
    /// The fragment met another fragment's memory unit.
    pub const FLAG_COLLISION: u8 = 0x10;
    /// A value saturated while being added.
    pub const FLAG_OVERFLOW: u8 = 0x20;
    /// Every defined `FLAG_*` bit; others are rejected.
    const FLAGS_KNOWN: u8 = Self::FLAG_RESEND | Self::FLAG_ECN | Self::FLAG_CONTROL | Self::FLAG_RESULT | Self::FLAG_COLLISION | Self::FLAG_OVERFLOW;
    /// Encoded length without the kind tag.
    pub const LEN: usize = field::RESERVED.end;
    /// Most workers one node aggregates: the bitmap's width.
    pub const MAX_FAN_IN: u8 = 64;

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut b = [0; Self::LEN];
        b[field::JOB].copy_from_slice(&self.job.to_be_bytes());
        b[field::FRAG].copy_from_slice(&self.frag.to_be_bytes());
        b[field::NODE].copy_from_slice(&self.node.to_be_bytes());
        b[field::BITMAP].copy_from_slice(&self.bitmap.to_be_bytes());
        b[field::FAN_IN] = self.fan_in;
        b[field::FLAGS] = self.flags;
        out.extend_from_slice(&b);
    }

    /// Decodes the header body (after the kind tag) from the front of `buf`. Rejects unknown
    /// flags, a non-zero reserved field and a fan-in above 64.
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        let h = GridHeader {
            job: be32(buf, field::JOB, "grid job")?,
            frag: be32(buf, field::FRAG, "grid frag")?,
            node: be32(buf, field::NODE, "grid node")?,
            bitmap: be64(buf, field::BITMAP, "grid bitmap")?,
            fan_in: u8_at(buf, field::FAN_IN, "grid fan_in")?,
            flags: u8_at(buf, field::FLAGS, "grid flags")?,
        };
        let reserved = be16(buf, field::RESERVED, "grid reserved")?;
        if h.flags & !Self::FLAGS_KNOWN != 0 {
            return Err(WireError::BadValue { what: "grid flags", value: h.flags as u64 });
        }
        if reserved != 0 {
            return Err(WireError::BadValue { what: "grid reserved", value: reserved as u64 });
        }
        if h.fan_in > Self::MAX_FAN_IN {
            return Err(WireError::BadValue { what: "grid fan_in", value: h.fan_in as u64 });
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

    impl GridHeader {
        /// Any valid header of this kind (the round-trip property tests' generator).
        pub(crate) fn arbitrary() -> impl Strategy<Value = Self> {
            (any::<u32>(), any::<u32>(), any::<u32>(), any::<u64>(), 0u8..=64, 0u8..64)
                .prop_map(|(job, frag, node, bitmap, fan_in, flags)| GridHeader { job, frag, node, bitmap, fan_in, flags })
        }
    }

    #[test]
    fn vector() {
        let h = GridHeader {
            job: 0x0102_0304,
            frag: 0x0506_0708,
            node: 0x090A_0B0C,
            bitmap: 0x0D0E_0F10_1112_1314,
            fan_in: 0x15,
            flags: GridHeader::FLAG_CONTROL | GridHeader::FLAG_COLLISION | GridHeader::FLAG_ECN,
        };
        #[rustfmt::skip]
        let bytes = [
            8, // header kind: Grid
            0x01, 0x02, 0x03, 0x04, // job
            0x05, 0x06, 0x07, 0x08, // frag
            0x09, 0x0A, 0x0B, 0x0C, // node
            0x0D, 0x0E, 0x0F, 0x10, 0x11, 0x12, 0x13, 0x14, // bitmap
            0x15, 0x16, // fan_in, flags CONTROL|COLLISION|ECN
            0, 0, // reserved
        ];
        check_vector(Header::Grid(h), &bytes);
    }

    #[test]
    fn hostile_values_are_rejected() {
        let mut b = vec![];
        GridHeader::default().encode(&mut b);
        let bad = |i: usize, v: u8| {
            let mut c = b.clone();
            c[i] = v;
            GridHeader::decode(&c)
        };
        assert_eq!(bad(field::FLAGS, 0x40), Err(WireError::BadValue { what: "grid flags", value: 0x40 }));
        assert_eq!(bad(field::FLAGS, 0x80), Err(WireError::BadValue { what: "grid flags", value: 0x80 }));
        assert_eq!(bad(field::RESERVED.start, 1), Err(WireError::BadValue { what: "grid reserved", value: 256 }));
        assert_eq!(bad(field::FAN_IN, 65), Err(WireError::BadValue { what: "grid fan_in", value: 65 }));
        assert!(bad(field::FAN_IN, 64).is_ok());
        for n in 0..GridHeader::LEN {
            assert!(matches!(GridHeader::decode(&b[..n]), Err(WireError::Truncated { .. })), "cut at {n}");
        }
    }
}
