//! The byte form of a whole [`Packet`] as the UDP runtime puts it in one datagram: a fixed
//! envelope that carries what IP/UDP headers carry in the simulator's model (node ids, ports,
//! the ECN mark), then the protocol header ([`Header::encode`]), then the payload.
//!
//! Layout (envelope and header big endian, values little endian because both ends of a
//! software data plane are x86/ARM little-endian machines and the values are the bulk):
//!
//! ```text
//! magic:u16 = 0x1AAB  version:u8 = 1  flags:u8 (bit 0 = ECN CE)
//! src:u32  dst:u32  src_port:u16  dst_port:u16            -- 16 B envelope
//! header (1 B kind + the kind's fixed length)
//! payload kind:u8 (0 none, 1 i32, 2 f32)  count:u16  count x 4 B values
//! ```
//!
//! Decoding never panics and rejects anything but an exact fit: trailing bytes, a count that
//! disagrees with the length, unknown kinds or flags are errors the driver counts and drops.
//! Fields of [`Packet`] that do not travel (`flow`, `path`, `hop`, `created`) are rebuilt by
//! the receiver; `size` becomes the datagram's length.

use crate::{flow_key, Packet, Payload, NO_PATH};
use inalab_wire::{Header, WireError};

pub const MAGIC: u16 = 0x1AAB;
pub const VERSION: u8 = 1;
pub const ENVELOPE_LEN: usize = 16;
const FLAG_ECN: u8 = 1;
/// Most values one frame carries (the count is 16 bits).
pub const MAX_VALUES: usize = u16::MAX as usize;

/// Appends the frame of `pkt` to `out`. Panics if the payload has more than [`MAX_VALUES`]
/// values: protocols cut tensors into packets far smaller than that.
pub fn encode(pkt: &Packet, out: &mut Vec<u8>) {
    out.extend_from_slice(&MAGIC.to_be_bytes());
    out.push(VERSION);
    out.push(if pkt.ecn { FLAG_ECN } else { 0 });
    out.extend_from_slice(&pkt.src.to_be_bytes());
    out.extend_from_slice(&pkt.dst.to_be_bytes());
    out.extend_from_slice(&pkt.src_port.to_be_bytes());
    out.extend_from_slice(&pkt.dst_port.to_be_bytes());
    pkt.header.encode(out);
    match pkt.payload.as_deref() {
        None => out.extend_from_slice(&[0, 0, 0]),
        Some(p) => {
            assert!(p.len() <= MAX_VALUES, "payload of {} values exceeds a frame's {MAX_VALUES}", p.len());
            let (kind, count) = match p {
                Payload::I32(v) => (1u8, v.len()),
                Payload::F32(v) => (2u8, v.len()),
            };
            out.push(kind);
            out.extend_from_slice(&(count as u16).to_be_bytes());
            out.reserve(count * 4);
            match p {
                Payload::I32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
                Payload::F32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            }
        }
    }
}

/// Bytes [`encode`] writes for `pkt`.
pub fn encoded_len(pkt: &Packet) -> usize {
    ENVELOPE_LEN + pkt.header.encoded_len() + 3 + pkt.payload.as_ref().map_or(0, |p| p.len() * 4)
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Decodes one frame; see the module docs for what is rejected.
pub fn decode(buf: &[u8]) -> Result<Packet, WireError> {
    if buf.len() < ENVELOPE_LEN {
        return Err(WireError::Truncated { what: "frame envelope" });
    }
    let magic = be16(buf, 0);
    if magic != MAGIC {
        return Err(WireError::BadValue { what: "frame magic", value: magic as u64 });
    }
    if buf[2] != VERSION {
        return Err(WireError::BadValue { what: "frame version", value: buf[2] as u64 });
    }
    let flags = buf[3];
    if flags & !FLAG_ECN != 0 {
        return Err(WireError::BadValue { what: "frame flags", value: flags as u64 });
    }
    let (src, dst) = (be32(buf, 4), be32(buf, 8));
    let (src_port, dst_port) = (be16(buf, 12), be16(buf, 14));
    let (header, used) = Header::decode(&buf[ENVELOPE_LEN..])?;
    let rest = &buf[ENVELOPE_LEN + used..];
    if rest.len() < 3 {
        return Err(WireError::Truncated { what: "payload kind and count" });
    }
    let (kind, count) = (rest[0], be16(rest, 1) as usize);
    let values = &rest[3..];
    if values.len() != count * 4 {
        return Err(WireError::BadValue { what: "payload length", value: values.len() as u64 });
    }
    let words = values.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
    let payload = match kind {
        0 if count == 0 => None,
        1 => Some(Box::new(Payload::I32(words.map(i32::from_le_bytes).collect()))),
        2 => Some(Box::new(Payload::F32(words.map(f32::from_le_bytes).collect()))),
        _ => return Err(WireError::BadValue { what: "payload kind", value: kind as u64 }),
    };
    Ok(Packet {
        src,
        dst,
        src_port,
        dst_port,
        size: buf.len() as u32,
        ecn: flags & FLAG_ECN != 0,
        flow: flow_key(src, src_port, dst, dst_port),
        path: NO_PATH,
        hop: 0,
        header,
        payload,
        created: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use inalab_wire::{AtpHeader, SwitchMlHeader};
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
