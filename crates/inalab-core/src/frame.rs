//! The byte form of a whole [`Packet`] as the UDP runtime puts it in one datagram. The layout
//! (envelope, protocol header, payload) and its checks are [`inalab_wire::frame`]'s; this
//! module maps a [`Frame`] to and from a [`Packet`]. Fields of [`Packet`] that do not travel
//! (`flow`, `path`, `hop`, `created`) are rebuilt by the receiver; `size` becomes the
//! datagram's length.

use crate::{flow_key, Packet, Payload, NO_PATH};
use inalab_wire::frame::{self as wire, Envelope, PayloadKind, Values};
use inalab_wire::WireError;

pub use inalab_wire::frame::{Frame, ENVELOPE_LEN, MAGIC, MAX_VALUES, VERSION};

/// Appends the frame of `pkt` to `out`. Panics if the payload has more than [`MAX_VALUES`]
/// values: protocols cut tensors into packets far smaller than that.
pub fn encode(pkt: &Packet, out: &mut Vec<u8>) {
    let envelope =
        Envelope { src: pkt.src, dst: pkt.dst, src_port: pkt.src_port, dst_port: pkt.dst_port, ecn: pkt.ecn };
    let values = pkt.payload.as_deref().map(|p| match p {
        Payload::I32(v) => Values::I32(v),
        Payload::F32(v) => Values::F32(v),
    });
    wire::emit(&envelope, &pkt.header, values, out);
}

/// Bytes [`encode`] writes for `pkt`.
pub fn encoded_len(pkt: &Packet) -> usize {
    wire::buffer_len(&pkt.header, pkt.payload.as_ref().map_or(0, |p| p.len()))
}

/// Decodes one frame; see [`Frame::new_checked`] for what is rejected.
pub fn decode(buf: &[u8]) -> Result<Packet, WireError> {
    Frame::new_checked(buf).map(|f| to_packet(&f))
}

/// The packet a checked frame carries.
pub fn to_packet<T: AsRef<[u8]>>(f: &Frame<T>) -> Packet {
    let Envelope { src, dst, src_port, dst_port, ecn } = f.envelope();
    let payload = match f.payload_kind() {
        PayloadKind::None => None,
        PayloadKind::I32 => Some(Box::new(Payload::I32(f.i32_vec()))),
        PayloadKind::F32 => Some(Box::new(Payload::F32(f.f32_vec()))),
    };
    Packet {
        src,
        dst,
        src_port,
        dst_port,
        size: f.as_bytes().len() as u32,
        ecn,
        flow: flow_key(src, src_port, dst, dst_port),
        path: NO_PATH,
        hop: 0,
        header: f.header().clone(),
        payload,
        created: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inalab_wire::{AtpHeader, Header, SwitchMlHeader};
    use proptest::prelude::*;

    fn header() -> impl Strategy<Value = Header> {
        prop_oneof![
            Just(Header::Raw),
            (any::<u32>(), any::<u32>(), 0u8..3, 0u8..128).prop_map(|(job, seq, esi, flags)| Header::Atp(AtpHeader {
                job,
                seq,
                esi,
                flags,
                ..AtpHeader::default()
            })),
            (any::<u32>(), any::<u32>(), any::<u16>(), 0u8..2).prop_map(|(job, slot, wid, ver)| Header::SwitchMl(
                SwitchMlHeader { job, slot, wid, ver, ..SwitchMlHeader::default() }
            )),
        ]
    }

    fn payload() -> impl Strategy<Value = Option<Payload>> {
        prop_oneof![
            Just(None),
            proptest::collection::vec(any::<i32>(), 0..80).prop_map(|v| Some(Payload::I32(v))),
            proptest::collection::vec(any::<f32>().prop_filter("NaN != NaN", |x| !x.is_nan()), 0..80)
                .prop_map(|v| Some(Payload::F32(v))),
        ]
    }

    proptest! {
        #[test]
        fn round_trip(src in any::<u32>(), dst in any::<u32>(), sp in any::<u16>(), dp in any::<u16>(), ecn in any::<bool>(),
                      header in header(), payload in payload()) {
            let mut p = Packet::new(src, sp, dst, dp, 0, header);
            p.ecn = ecn;
            p.payload = payload.map(Box::new);
            let mut b = vec![];
            encode(&p, &mut b);
            prop_assert_eq!(b.len(), encoded_len(&p));
            let q = decode(&b).unwrap();
            prop_assert_eq!((q.src, q.dst, q.src_port, q.dst_port, q.ecn, q.flow), (src, dst, sp, dp, ecn, p.flow));
            prop_assert_eq!(&q.header, &p.header);
            prop_assert_eq!(&q.payload, &p.payload);
            prop_assert_eq!(q.size as usize, b.len());
        }

        /// Fuzzing the parser: arbitrary bytes, and valid frames with bytes flipped, cut or
        /// appended, decode to a packet or an error and never panic.
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn mutated_frames_never_panic(header in header(), payload in payload(), at in any::<usize>(), byte in any::<u8>(),
                                      cut in any::<usize>(), extra in proptest::collection::vec(any::<u8>(), 0..4)) {
            let mut p = Packet::new(1, 2, 3, 4, 0, header);
            p.payload = payload.map(Box::new);
            let mut b = vec![];
            encode(&p, &mut b);
            let i = at % b.len();
            b[i] = byte;
            let _ = decode(&b);
            b.truncate(cut % (b.len() + 1));
            let _ = decode(&b);
            b.extend_from_slice(&extra);
            let _ = decode(&b);
        }
    }

    /// What a packet's fields become on the wire and back (the layout's own vectors are in
    /// `inalab_wire::frame`).
    #[test]
    fn packet_vector() {
        let mut p = Packet::new(1, 2, 3, 4, 0, Header::Raw);
        p.ecn = true;
        p.payload = Some(Box::new(Payload::I32(vec![-1])));
        #[rustfmt::skip]
        let bytes = [
            0x1A, 0xAB, 1, 1, 0, 0, 0, 1, 0, 0, 0, 3, 0, 2, 0, 4, // envelope: ECN, 1:2 -> 3:4
            0, // header kind: Raw
            1, 0, 1, 0xFF, 0xFF, 0xFF, 0xFF, // i32 x 1: -1
        ];
        let mut b = vec![];
        encode(&p, &mut b);
        assert_eq!(b, bytes);
        let q = decode(&bytes).unwrap();
        assert_eq!((q.src, q.src_port, q.dst, q.dst_port, q.ecn, q.flow), (1, 2, 3, 4, true, p.flow));
        assert_eq!((q.size as usize, q.path, q.hop, q.created), (bytes.len(), NO_PATH, 0, 0));
        assert_eq!((q.header, q.payload), (p.header, p.payload));
    }

    #[test]
    fn rejects_trailing_bytes_and_bad_magic() {
        let mut b = vec![];
        encode(&Packet::new(1, 2, 3, 4, 0, Header::Raw), &mut b);
        assert!(decode(&b).is_ok());
        b.push(0);
        assert_eq!(decode(&b).unwrap_err(), WireError::BadValue { what: "payload length", value: 1 });
        b.pop();
        b[0] = 0;
        assert!(matches!(decode(&b), Err(WireError::BadValue { what: "frame magic", .. })));
    }
}
