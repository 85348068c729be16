use crate::bytes::Reader;
use crate::{AtpHeader, SwitchMlHeader, TransportHeader, WireError};

/// The typed header a packet carries. Each protocol family adds its variant here (ATP,
/// SwitchML, Canary, ... in later issues); switch programs match on the variant they serve
/// and treat every other one as plain traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Header {
    /// No protocol header: background or benchmark datagrams.
    Raw,
    /// The windowed reliable host transport (data segments and ACKs).
    Transport(TransportHeader),
    /// ATP gradient fragments and parameter packets.
    Atp(AtpHeader),
    /// SwitchML worker packets and results.
    SwitchMl(SwitchMlHeader),
}

/// One byte that names the variant on the wire.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderKind {
    Raw = 0,
    Transport = 1,
    Atp = 2,
    SwitchMl = 3,
}

impl Header {
    pub fn kind(&self) -> HeaderKind {
        match self {
            Header::Raw => HeaderKind::Raw,
            Header::Transport(_) => HeaderKind::Transport,
            Header::Atp(_) => HeaderKind::Atp,
            Header::SwitchMl(_) => HeaderKind::SwitchMl,
        }
    }

    /// The job a packet of an INA protocol belongs to (`None` for headers that carry no job).
    pub fn job(&self) -> Option<u32> {
        match self {
            Header::Atp(h) => Some(h.job),
            Header::SwitchMl(h) => Some(h.job),
            Header::Raw | Header::Transport(_) => None,
        }
    }

    /// Bytes of the encoded header including its one-byte kind tag.
    pub fn encoded_len(&self) -> usize {
        1 + match self {
            Header::Raw => 0,
            Header::Transport(_) => TransportHeader::LEN,
            Header::Atp(_) => AtpHeader::LEN,
            Header::SwitchMl(_) => SwitchMlHeader::LEN,
        }
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.kind() as u8);
        match self {
            Header::Raw => {}
            Header::Transport(h) => h.encode(out),
            Header::Atp(h) => h.encode(out),
            Header::SwitchMl(h) => h.encode(out),
        }
    }

    /// Decodes a header from the front of `buf`; returns it with the number of bytes used.
    pub fn decode(buf: &[u8]) -> Result<(Header, usize), WireError> {
        let mut r = Reader::new(buf);
        let kind = r.u8("header kind")?;
        let h = match kind {
            0 => Header::Raw,
            1 => Header::Transport(TransportHeader::decode_from(&mut r)?),
            2 => Header::Atp(AtpHeader::decode_from(&mut r)?),
            3 => Header::SwitchMl(SwitchMlHeader::decode_from(&mut r)?),
            v => return Err(WireError::BadValue { what: "header kind", value: v as u64 }),
        };
        Ok((h, r.pos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SegKind;
    use proptest::prelude::*;

    #[test]
    fn raw_round_trip() {
        let mut b = vec![];
        Header::Raw.encode(&mut b);
        assert_eq!(Header::decode(&b).unwrap(), (Header::Raw, 1));
    }

    #[test]
    fn unknown_kind_is_an_error() {
        assert_eq!(
            Header::decode(&[200]).unwrap_err(),
            WireError::BadValue { what: "header kind", value: 200 }
        );
        assert!(matches!(Header::decode(&[]), Err(WireError::Truncated { .. })));
    }

    proptest! {
        #[test]
        fn transport_round_trip(ack in any::<bool>(), flags in 0u8..4, seq in any::<u32>(), msg in any::<u64>(),
                                off in any::<u32>(), len in any::<u32>(), seg in any::<u32>()) {
            let h = Header::Transport(TransportHeader {
                kind: if ack { SegKind::Ack } else { SegKind::Data },
                flags, seq, msg_id: msg, msg_offset: off, msg_len: len, seg_len: seg,
            });
            let mut b = vec![];
            h.encode(&mut b);
            prop_assert_eq!(b.len(), h.encoded_len());
            prop_assert_eq!(Header::decode(&b).unwrap(), (h, b.len()));
        }

        #[test]
        fn atp_round_trip(job in any::<u32>(), seq in any::<u32>(), idx in any::<u32>(), b0 in any::<u32>(), b1 in any::<u32>(),
                          f0 in any::<u8>(), f1 in any::<u8>(), esi in 0u8..3, flags in 0u8..128) {
            let h = Header::Atp(AtpHeader { job, seq, agg_index: idx, bitmap0: b0, bitmap1: b1, fan_in0: f0, fan_in1: f1, esi, flags });
            let mut b = vec![];
            h.encode(&mut b);
            prop_assert_eq!(b.len(), h.encoded_len());
            prop_assert_eq!(Header::decode(&b).unwrap(), (h, b.len()));
        }

        #[test]
        fn switchml_round_trip(job in any::<u32>(), slot in any::<u32>(), chunk in any::<u32>(), wid in any::<u16>(),
                               ver in 0u8..2, flags in 0u8..4, exp in any::<i8>()) {
            let h = Header::SwitchMl(SwitchMlHeader { job, slot, chunk, wid, ver, flags, exp });
            let mut b = vec![];
            h.encode(&mut b);
            prop_assert_eq!(b.len(), h.encoded_len());
            prop_assert_eq!(Header::decode(&b).unwrap(), (h, b.len()));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Header::decode(&bytes);
        }
    }
}
