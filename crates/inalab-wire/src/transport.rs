use crate::bytes::{be16, be32, be64, u8_at};
use crate::WireError;

/// Offsets within the header body (after the kind tag).
mod field {
    use core::ops::Range;
    pub const KIND: usize = 0;
    pub const FLAGS: usize = 1;
    /// Written as zero, ignored on decode.
    pub const PAD: Range<usize> = 2..4;
    pub const SEQ: Range<usize> = 4..8;
    pub const MSG_ID: Range<usize> = 8..16;
    pub const MSG_OFFSET: Range<usize> = 16..20;
    pub const MSG_LEN: Range<usize> = 20..24;
    pub const SEG_LEN: Range<usize> = 24..28;
}

/// Data segment or cumulative acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegKind {
    Data = 0,
    Ack = 1,
}

/// Header of the windowed host transport used by the host-based baselines (ring,
/// hierarchical allreduce, parameter server) and reused by INA end hosts.
///
/// Layout (big endian), 28 bytes after the header-kind tag (offsets in `field`):
/// `kind:u8 flags:u8 pad:u16 seq:u32 msg_id:u64 msg_offset:u32 msg_len:u32 seg_len:u32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportHeader {
    pub kind: SegKind,
    /// `FLAG_*` bits.
    pub flags: u8,
    /// Data: this segment's sequence number on its connection. Ack: next expected sequence.
    pub seq: u32,
    /// Application message this segment belongs to.
    pub msg_id: u64,
    /// Byte offset of this segment within its message.
    pub msg_offset: u32,
    /// Total length of the message in bytes.
    pub msg_len: u32,
    /// Payload bytes carried by this segment.
    pub seg_len: u32,
}

impl TransportHeader {
    /// The ACK echoes a CE mark seen on the data segment it acknowledges.
    pub const FLAG_ECN_ECHO: u8 = 1;
    /// The data segment is a retransmission.
    pub const FLAG_RETRANSMIT: u8 = 2;
    /// Encoded length without the kind tag.
    pub const LEN: usize = field::SEG_LEN.end;

    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut b = [0; Self::LEN];
        b[field::KIND] = self.kind as u8;
        b[field::FLAGS] = self.flags;
        b[field::SEQ].copy_from_slice(&self.seq.to_be_bytes());
        b[field::MSG_ID].copy_from_slice(&self.msg_id.to_be_bytes());
        b[field::MSG_OFFSET].copy_from_slice(&self.msg_offset.to_be_bytes());
        b[field::MSG_LEN].copy_from_slice(&self.msg_len.to_be_bytes());
        b[field::SEG_LEN].copy_from_slice(&self.seg_len.to_be_bytes());
        out.extend_from_slice(&b);
    }

    /// Decodes the header body (after the kind tag) from the front of `buf`.
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        let kind = match u8_at(buf, field::KIND, "transport kind")? {
            0 => SegKind::Data,
            1 => SegKind::Ack,
            v => return Err(WireError::BadValue { what: "transport kind", value: v as u64 }),
        };
        let flags = u8_at(buf, field::FLAGS, "transport flags")?;
        if flags & !(Self::FLAG_ECN_ECHO | Self::FLAG_RETRANSMIT) != 0 {
            return Err(WireError::BadValue { what: "transport flags", value: flags as u64 });
        }
        // Fields are checked in order so a cut names the first missing one.
        be16(buf, field::PAD, "transport pad")?;
        Ok(Self {
            kind,
            flags,
            seq: be32(buf, field::SEQ, "transport seq")?,
            msg_id: be64(buf, field::MSG_ID, "transport msg_id")?,
            msg_offset: be32(buf, field::MSG_OFFSET, "transport msg_offset")?,
            msg_len: be32(buf, field::MSG_LEN, "transport msg_len")?,
            seg_len: be32(buf, field::SEG_LEN, "transport seg_len")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::tests::check_vector;
    use crate::Header;
    use proptest::prelude::*;

    impl TransportHeader {
        /// Any valid header of this kind (the round-trip property tests' generator).
        pub(crate) fn arbitrary() -> impl Strategy<Value = Self> {
            (any::<bool>(), 0u8..4, any::<u32>(), any::<u64>(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(
                |(ack, flags, seq, msg_id, msg_offset, msg_len, seg_len)| TransportHeader {
                    kind: if ack { SegKind::Ack } else { SegKind::Data },
                    flags,
                    seq,
                    msg_id,
                    msg_offset,
                    msg_len,
                    seg_len,
                },
            )
        }
    }

    #[test]
    fn data_vector() {
        let h = TransportHeader {
            kind: SegKind::Data,
            flags: TransportHeader::FLAG_RETRANSMIT,
            seq: 0x0102_0304,
            msg_id: 0x0506_0708_090A_0B0C,
            msg_offset: 0x0D0E_0F10,
            msg_len: 0x1112_1314,
            seg_len: 0x1516_1718,
        };
        #[rustfmt::skip]
        let bytes = [
            1, // header kind: Transport
            0, 2, 0, 0, // kind Data, flags RETRANSMIT, pad
            0x01, 0x02, 0x03, 0x04, // seq
            0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, // msg_id
            0x0D, 0x0E, 0x0F, 0x10, // msg_offset
            0x11, 0x12, 0x13, 0x14, // msg_len
            0x15, 0x16, 0x17, 0x18, // seg_len
        ];
        check_vector(Header::Transport(h), &bytes);
    }

    #[test]
    fn ack_vector() {
        let h = TransportHeader {
            kind: SegKind::Ack,
            flags: TransportHeader::FLAG_ECN_ECHO,
            seq: 7,
            msg_id: u64::MAX,
            msg_offset: 0,
            msg_len: 1500,
            seg_len: 0,
        };
        #[rustfmt::skip]
        let bytes = [
            1,
            1, 1, 0, 0,
            0, 0, 0, 7,
            0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
            0, 0, 0, 0,
            0, 0, 0x05, 0xDC,
            0, 0, 0, 0,
        ];
        check_vector(Header::Transport(h), &bytes);
    }

    #[test]
    fn pad_is_ignored_and_unknown_values_rejected() {
        let h = TransportHeader { kind: SegKind::Ack, flags: 0, seq: 1, msg_id: 2, msg_offset: 3, msg_len: 4, seg_len: 5 };
        let mut b = vec![];
        h.encode(&mut b);
        b[field::PAD].copy_from_slice(&[0xAB, 0xCD]);
        assert_eq!(TransportHeader::decode(&b), Ok(h));
        b[field::FLAGS] = 4;
        assert_eq!(TransportHeader::decode(&b), Err(WireError::BadValue { what: "transport flags", value: 4 }));
        b[field::KIND] = 2;
        assert_eq!(TransportHeader::decode(&b), Err(WireError::BadValue { what: "transport kind", value: 2 }));
    }
}
