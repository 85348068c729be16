use crate::bytes::Reader;
use crate::WireError;

/// Data segment or cumulative acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegKind {
    Data = 0,
    Ack = 1,
}

/// Header of the windowed host transport used by the host-based baselines (ring,
/// hierarchical allreduce, parameter server) and reused by INA end hosts.
///
/// Layout (big endian), 28 bytes after the header-kind tag:
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
    pub const LEN: usize = 28;

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.kind as u8);
        out.push(self.flags);
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.msg_id.to_be_bytes());
        out.extend_from_slice(&self.msg_offset.to_be_bytes());
        out.extend_from_slice(&self.msg_len.to_be_bytes());
        out.extend_from_slice(&self.seg_len.to_be_bytes());
    }

    pub(crate) fn decode_from(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let kind = match r.u8("transport kind")? {
            0 => SegKind::Data,
            1 => SegKind::Ack,
            v => return Err(WireError::BadValue { what: "transport kind", value: v as u64 }),
        };
        let flags = r.u8("transport flags")?;
        if flags & !(Self::FLAG_ECN_ECHO | Self::FLAG_RETRANSMIT) != 0 {
            return Err(WireError::BadValue { what: "transport flags", value: flags as u64 });
        }
        r.u16("transport pad")?;
        Ok(Self {
            kind,
            flags,
            seq: r.u32("transport seq")?,
            msg_id: r.u64("transport msg_id")?,
            msg_offset: r.u32("transport msg_offset")?,
            msg_len: r.u32("transport msg_len")?,
            seg_len: r.u32("transport seg_len")?,
        })
    }
}
