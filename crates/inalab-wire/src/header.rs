use crate::bytes::u8_at;
use crate::{AtpHeader, CanaryHeader, DsaHeader, GridHeader, RinaHeader, StaticTreeHeader, SwitchMlHeader, TransportHeader, WireError};

/// Offsets in an encoded header: a kind tag, then that kind's fixed-length body.
mod field {
    pub const KIND: usize = 0;
    pub const BODY: usize = 1;
}

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
    /// DSA gradients, results, evictions and reminder traffic.
    Dsa(DsaHeader),
    /// Canary blocks, results, restorations and the hosts' recovery messages.
    Canary(CanaryHeader),
    /// Static-tree allreduce blocks and results (Canary's baselines, its own kind so that
    /// Canary's program never claims them).
    StaticTree(StaticTreeHeader),
    /// Rina's rack aggregation, ring hops and AllGather copies.
    Rina(RinaHeader),
    /// GRID's node-targeted gradients, results and rate-synchronization control packets.
    Grid(GridHeader),
}

/// One byte that names the variant on the wire.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderKind {
    Raw = 0,
    Transport = 1,
    Atp = 2,
    SwitchMl = 3,
    Dsa = 4,
    Canary = 5,
    StaticTree = 6,
    Rina = 7,
    /// The spec proposed 4, which DSA took first.
    Grid = 8,
}

impl HeaderKind {
    /// Every kind, in the order of their tags.
    pub const ALL: [HeaderKind; 9] =
        [HeaderKind::Raw, HeaderKind::Transport, HeaderKind::Atp, HeaderKind::SwitchMl, HeaderKind::Dsa, HeaderKind::Canary, HeaderKind::StaticTree, HeaderKind::Rina, HeaderKind::Grid];

    /// Bytes of the kind's fixed-length body, after its one-byte tag.
    pub const fn body_len(self) -> usize {
        match self {
            HeaderKind::Raw => 0,
            HeaderKind::Transport => TransportHeader::LEN,
            HeaderKind::Atp => AtpHeader::LEN,
            HeaderKind::SwitchMl => SwitchMlHeader::LEN,
            HeaderKind::Dsa => DsaHeader::LEN,
            HeaderKind::Canary => CanaryHeader::LEN,
            HeaderKind::StaticTree => StaticTreeHeader::LEN,
            HeaderKind::Rina => RinaHeader::LEN,
            HeaderKind::Grid => GridHeader::LEN,
        }
    }
}

impl TryFrom<u8> for HeaderKind {
    type Error = WireError;
    fn try_from(v: u8) -> Result<Self, WireError> {
        HeaderKind::ALL.into_iter().find(|k| *k as u8 == v).ok_or(WireError::BadValue { what: "header kind", value: v as u64 })
    }
}

impl Header {
    pub fn kind(&self) -> HeaderKind {
        match self {
            Header::Raw => HeaderKind::Raw,
            Header::Transport(_) => HeaderKind::Transport,
            Header::Atp(_) => HeaderKind::Atp,
            Header::SwitchMl(_) => HeaderKind::SwitchMl,
            Header::Dsa(_) => HeaderKind::Dsa,
            Header::Canary(_) => HeaderKind::Canary,
            Header::StaticTree(_) => HeaderKind::StaticTree,
            Header::Rina(_) => HeaderKind::Rina,
            Header::Grid(_) => HeaderKind::Grid,
        }
    }

    /// The job a packet of an INA protocol belongs to (`None` for headers that carry no job).
    pub fn job(&self) -> Option<u32> {
        match self {
            Header::Atp(h) => Some(h.job),
            Header::SwitchMl(h) => Some(h.job),
            Header::Dsa(h) => Some(h.job as u32),
            // The tenant prefix of the block id is the job (Canary §3.4).
            Header::Canary(h) => Some(h.tenant() as u32),
            Header::StaticTree(h) => Some(h.job as u32),
            Header::Rina(h) => Some(h.job as u32),
            Header::Grid(h) => Some(h.job),
            Header::Raw | Header::Transport(_) => None,
        }
    }

    /// Bytes of the encoded header including its one-byte kind tag.
    pub fn encoded_len(&self) -> usize {
        field::BODY + self.kind().body_len()
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.kind() as u8);
        match self {
            Header::Raw => {}
            Header::Transport(h) => h.encode(out),
            Header::Atp(h) => h.encode(out),
            Header::SwitchMl(h) => h.encode(out),
            Header::Dsa(h) => h.encode(out),
            Header::Canary(h) => h.encode(out),
            Header::StaticTree(h) => h.encode(out),
            Header::Rina(h) => h.encode(out),
            Header::Grid(h) => h.encode(out),
        }
    }

    /// Decodes a header from the front of `buf`; returns it with the number of bytes used.
    pub fn decode(buf: &[u8]) -> Result<(Header, usize), WireError> {
        let kind = HeaderKind::try_from(u8_at(buf, field::KIND, "header kind")?)?;
        let body = &buf[field::BODY..];
        let h = match kind {
            HeaderKind::Raw => Header::Raw,
            HeaderKind::Transport => Header::Transport(TransportHeader::decode(body)?),
            HeaderKind::Atp => Header::Atp(AtpHeader::decode(body)?),
            HeaderKind::SwitchMl => Header::SwitchMl(SwitchMlHeader::decode(body)?),
            HeaderKind::Dsa => Header::Dsa(DsaHeader::decode(body)?),
            HeaderKind::Canary => Header::Canary(CanaryHeader::decode(body)?),
            HeaderKind::StaticTree => Header::StaticTree(StaticTreeHeader::decode(body)?),
            HeaderKind::Rina => Header::Rina(RinaHeader::decode(body)?),
            HeaderKind::Grid => Header::Grid(GridHeader::decode(body)?),
        };
        let used = h.encoded_len();
        Ok((h, used))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{CanaryType, DsaKind, RinaKind, SegKind, StaticTreeKind};
    use proptest::prelude::*;

    /// `h` encodes to exactly `bytes`, which decode back to `h`, and cut by one byte are
    /// truncated: a test vector pinning the format.
    pub(crate) fn check_vector(h: Header, bytes: &[u8]) {
        let mut b = vec![];
        h.encode(&mut b);
        assert_eq!(b, bytes, "encoding of {h:?}");
        assert_eq!(h.encoded_len(), bytes.len());
        assert_eq!(Header::decode(bytes), Ok((h, bytes.len())));
        assert!(matches!(Header::decode(&bytes[..bytes.len() - 1]), Err(WireError::Truncated { .. })));
    }

    /// Any valid header of any kind.
    pub(crate) fn any_header() -> impl Strategy<Value = Header> {
        prop_oneof![
            Just(Header::Raw),
            (any::<bool>(), 0u8..4, any::<u32>(), any::<u64>(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(
                |(ack, flags, seq, msg_id, msg_offset, msg_len, seg_len)| Header::Transport(TransportHeader {
                    kind: if ack { SegKind::Ack } else { SegKind::Data },
                    flags,
                    seq,
                    msg_id,
                    msg_offset,
                    msg_len,
                    seg_len,
                })
            ),
            (
                (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()),
                (any::<u8>(), any::<u8>(), 0u8..3, 0u8..128)
            )
                .prop_map(|((job, seq, agg_index, bitmap0, bitmap1), (fan_in0, fan_in1, esi, flags))| {
                    Header::Atp(AtpHeader { job, seq, agg_index, bitmap0, bitmap1, fan_in0, fan_in1, esi, flags })
                }),
            (any::<u32>(), any::<u32>(), any::<u32>(), any::<u16>(), 0u8..2, 0u8..4, any::<i8>()).prop_map(
                |(job, slot, chunk, wid, ver, flags, exp)| Header::SwitchMl(SwitchMlHeader {
                    job,
                    slot,
                    chunk,
                    wid,
                    ver,
                    flags,
                    exp
                })
            ),
            (any::<u16>(), any::<u32>(), any::<u32>(), 1u8..=32, 0usize..8, 0u8..16).prop_map(|(job, psn, priority, fan_in, kind, flags)| {
                let bitmap = psn & DsaHeader::full_bitmap(fan_in);
                Header::Dsa(DsaHeader { job, psn, bitmap, priority, fan_in, kind: DsaKind::ALL[kind], flags })
            }),
            ((any::<u32>(), any::<u32>(), any::<u16>(), any::<u16>()), (any::<u32>(), any::<u16>(), any::<bool>(), any::<bool>(), 0usize..6, 0u8..4)).prop_map(
                |((dst, id, counter, hosts), (children, switch, bypass, multicast, kind, shard))| {
                    let counter = counter.min(hosts);
                    Header::Canary(CanaryHeader { dst, id, counter, hosts, children, switch, bypass, multicast, kind: CanaryType::ALL[kind], shard })
                }
            ),
            (any::<u16>(), any::<u8>(), 0usize..2, any::<bool>(), any::<u32>(), 1u16..).prop_map(|(job, tree, kind, rtx, seq, counter)| {
                Header::StaticTree(StaticTreeHeader { job, tree, kind: StaticTreeKind::ALL[kind], rtx, seq, counter })
            }),
            ((0usize..8, 0u8..16, any::<u8>(), any::<u8>(), any::<u16>(), any::<u16>()), (any::<u16>(), any::<u16>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>())).prop_map(
                |((kind, flags, member, hop, job, step), (chunk, count, req, seq, slot, arg))| {
                    Header::Rina(RinaHeader { kind: RinaKind::ALL[kind], flags, member, hop, job, step, chunk, count, req, seq, slot, arg })
                }
            ),
            (any::<u32>(), any::<u32>(), any::<u32>(), any::<u64>(), 0u8..=64, 0u8..64)
                .prop_map(|(job, frag, node, bitmap, fan_in, flags)| Header::Grid(GridHeader { job, frag, node, bitmap, fan_in, flags })),
        ]
    }

    #[test]
    fn raw_vector() {
        check_vector(Header::Raw, &[0]);
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
        fn round_trip(h in any_header(), extra in proptest::collection::vec(any::<u8>(), 0..4)) {
            let mut b = vec![];
            h.encode(&mut b);
            prop_assert_eq!(b.len(), h.encoded_len());
            let used = b.len();
            b.extend_from_slice(&extra);
            prop_assert_eq!(Header::decode(&b).unwrap(), (h, used));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Header::decode(&bytes);
        }
    }
}
