//! The datagram the UDP runtime sends: a fixed envelope that carries what IP/UDP headers
//! carry in the simulator's model (node ids, ports, the ECN mark), then the protocol header
//! ([`Header::encode`]), then the payload. [`Frame`] is a checked zero-copy view of one,
//! [`emit`] writes one. Mapping frames to and from `inalab_core::Packet` is `inalab_core::frame`'s.
//!
//! Layout (envelope and header big endian, values little endian because both ends of a
//! software data plane are x86/ARM little-endian machines and the values are the bulk):
//!
//! ```text
//! 0..2    magic:u16 = 0x1AAB
//! 2       version:u8 = 1
//! 3       flags:u8 (bit 0 = ECN CE)
//! 4..8    src:u32
//! 8..12   dst:u32
//! 12..14  src_port:u16
//! 14..16  dst_port:u16                          -- 16 B envelope, offsets in `field`
//! 16..h   header (1 B kind + the kind's fixed length)
//! h       payload kind:u8 (0 none, 1 i32, 2 f32) -- offsets from h in `field::payload`
//! h+1..   count:u16
//! h+3..   count x 4 B values
//! ```
//!
//! [`Frame::new_checked`] accepts nothing but an exact fit: trailing bytes, a count that
//! disagrees with the length, unknown kinds or flags are errors the driver counts and drops.

use crate::bytes::read;
use crate::{Header, WireError};
use core::ops::Range;

/// Byte offsets in a frame.
pub mod field {
    use core::ops::Range;
    pub const MAGIC: Range<usize> = 0..2;
    pub const VERSION: usize = 2;
    pub const FLAGS: usize = 3;
    pub const SRC: Range<usize> = 4..8;
    pub const DST: Range<usize> = 8..12;
    pub const SRC_PORT: Range<usize> = 12..14;
    pub const DST_PORT: Range<usize> = 14..16;
    /// Start of the header: its kind tag, then its body.
    pub const HEADER: usize = 16;

    /// Offsets from the end of the header, whose length depends on its kind.
    pub mod payload {
        use core::ops::Range;
        pub const KIND: usize = 0;
        pub const COUNT: Range<usize> = 1..3;
        pub const VALUES: usize = 3;
    }
}

pub const MAGIC: u16 = 0x1AAB;
pub const VERSION: u8 = 1;
pub const ENVELOPE_LEN: usize = field::HEADER;
/// The packet was marked Congestion Experienced on its way.
pub const FLAG_ECN: u8 = 1;
/// Most values one frame carries (the count is 16 bits).
pub const MAX_VALUES: usize = u16::MAX as usize;
/// Bytes per value.
pub const VALUE_LEN: usize = 4;

/// What the values are.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadKind {
    /// No payload (and a count of 0).
    None = 0,
    I32 = 1,
    F32 = 2,
}

/// The envelope's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Envelope {
    pub src: u32,
    pub dst: u32,
    pub src_port: u16,
    pub dst_port: u16,
    /// Congestion Experienced.
    pub ecn: bool,
}

/// Values to [`emit`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Values<'a> {
    I32(&'a [i32]),
    F32(&'a [f32]),
}

impl Values<'_> {
    fn kind(&self) -> PayloadKind {
        match self {
            Values::I32(_) => PayloadKind::I32,
            Values::F32(_) => PayloadKind::F32,
        }
    }
    fn len(&self) -> usize {
        match self {
            Values::I32(v) => v.len(),
            Values::F32(v) => v.len(),
        }
    }
}

/// Bytes of a frame with `header` and `values` values (a payload of none takes as many as an
/// empty one).
pub fn buffer_len(header: &Header, values: usize) -> usize {
    ENVELOPE_LEN + header.encoded_len() + field::payload::VALUES + values * VALUE_LEN
}

/// Appends a frame to `out`. Panics with more than [`MAX_VALUES`] values: protocols cut
/// tensors into packets far smaller than that.
pub fn emit(envelope: &Envelope, header: &Header, values: Option<Values<'_>>, out: &mut Vec<u8>) {
    let kind = values.map_or(PayloadKind::None, |v| v.kind());
    let count = values.map_or(0, |v| v.len());
    assert!(count <= MAX_VALUES, "payload of {count} values exceeds a frame's {MAX_VALUES}");
    out.reserve(buffer_len(header, count));

    let mut env = [0; ENVELOPE_LEN];
    env[field::MAGIC].copy_from_slice(&MAGIC.to_be_bytes());
    env[field::VERSION] = VERSION;
    env[field::FLAGS] = if envelope.ecn { FLAG_ECN } else { 0 };
    env[field::SRC].copy_from_slice(&envelope.src.to_be_bytes());
    env[field::DST].copy_from_slice(&envelope.dst.to_be_bytes());
    env[field::SRC_PORT].copy_from_slice(&envelope.src_port.to_be_bytes());
    env[field::DST_PORT].copy_from_slice(&envelope.dst_port.to_be_bytes());
    out.extend_from_slice(&env);

    header.encode(out);

    let mut prefix = [0; field::payload::VALUES];
    prefix[field::payload::KIND] = kind as u8;
    prefix[field::payload::COUNT].copy_from_slice(&(count as u16).to_be_bytes());
    out.extend_from_slice(&prefix);
    match values {
        None => {}
        Some(Values::I32(v)) => put_le(out, v, |x| x.to_le_bytes()),
        Some(Values::F32(v)) => put_le(out, v, |x| x.to_le_bytes()),
    }
}

/// Appends 4-byte values little-endian: one copy of their memory on a little-endian machine
/// (pushing value by value checked the capacity 2,048 times per datagram), value by value
/// elsewhere. `T` is `i32` or `f32`.
fn put_le<T: Copy>(out: &mut Vec<u8>, v: &[T], le: impl Fn(T) -> [u8; VALUE_LEN]) {
    debug_assert_eq!(std::mem::size_of::<T>(), VALUE_LEN);
    if cfg!(target_endian = "little") {
        // SAFETY: i32 and f32 have no padding and no invalid bit patterns as bytes; the slice
        // covers exactly `v`'s memory, borrowed for this call.
        out.extend_from_slice(unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) });
    } else {
        v.iter().for_each(|&x| out.extend_from_slice(&le(x)));
    }
}

/// A zero-copy view of a frame in `buffer`, checked once by [`Frame::new_checked`]; no
/// accessor panics after that. The header is decoded by the check and kept.
#[derive(Debug, Clone)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
    header: Header,
    payload_kind: PayloadKind,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Checks that `buffer` holds exactly one well-formed frame.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let buf = buffer.as_ref();
        if buf.len() < ENVELOPE_LEN {
            return Err(WireError::Truncated { what: "frame envelope" });
        }
        let magic = u16::from_be_bytes(read(buf, field::MAGIC));
        if magic != MAGIC {
            return Err(WireError::BadValue { what: "frame magic", value: magic as u64 });
        }
        if buf[field::VERSION] != VERSION {
            return Err(WireError::BadValue { what: "frame version", value: buf[field::VERSION] as u64 });
        }
        let flags = buf[field::FLAGS];
        if flags & !FLAG_ECN != 0 {
            return Err(WireError::BadValue { what: "frame flags", value: flags as u64 });
        }
        let (header, used) = Header::decode(&buf[field::HEADER..])?;
        let payload = &buf[field::HEADER + used..];
        if payload.len() < field::payload::VALUES {
            return Err(WireError::Truncated { what: "payload kind and count" });
        }
        let kind = payload[field::payload::KIND];
        let count = u16::from_be_bytes(read(payload, field::payload::COUNT)) as usize;
        let values = payload.len() - field::payload::VALUES;
        if values != count * VALUE_LEN {
            return Err(WireError::BadValue { what: "payload length", value: values as u64 });
        }
        // "None" carries no values.
        let payload_kind = [PayloadKind::None, PayloadKind::I32, PayloadKind::F32]
            .into_iter()
            .find(|k| *k as u8 == kind && (*k != PayloadKind::None || count == 0))
            .ok_or(WireError::BadValue { what: "payload kind", value: kind as u64 })?;
        Ok(Frame { buffer, header, payload_kind })
    }

    fn be16(&self, at: Range<usize>) -> u16 {
        u16::from_be_bytes(read(self.buffer.as_ref(), at))
    }
    fn be32(&self, at: Range<usize>) -> u32 {
        u32::from_be_bytes(read(self.buffer.as_ref(), at))
    }

    pub fn src(&self) -> u32 {
        self.be32(field::SRC)
    }
    pub fn dst(&self) -> u32 {
        self.be32(field::DST)
    }
    pub fn src_port(&self) -> u16 {
        self.be16(field::SRC_PORT)
    }
    pub fn dst_port(&self) -> u16 {
        self.be16(field::DST_PORT)
    }
    pub fn ecn(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & FLAG_ECN != 0
    }
    pub fn envelope(&self) -> Envelope {
        Envelope { src: self.src(), dst: self.dst(), src_port: self.src_port(), dst_port: self.dst_port(), ecn: self.ecn() }
    }

    pub fn header(&self) -> &Header {
        &self.header
    }
    /// The encoded header: kind tag and body.
    pub fn header_bytes(&self) -> &[u8] {
        &self.buffer.as_ref()[field::HEADER..self.payload_start()]
    }

    fn payload_start(&self) -> usize {
        field::HEADER + self.header.encoded_len()
    }
    pub fn payload_kind(&self) -> PayloadKind {
        self.payload_kind
    }
    pub fn value_count(&self) -> usize {
        self.value_bytes().len() / VALUE_LEN
    }
    /// The values' bytes, little endian, [`VALUE_LEN`] each.
    pub fn value_bytes(&self) -> &[u8] {
        &self.buffer.as_ref()[self.payload_start() + field::payload::VALUES..]
    }
    fn words(&self) -> impl ExactSizeIterator<Item = [u8; VALUE_LEN]> + '_ {
        self.value_bytes().chunks_exact(VALUE_LEN).map(|c| read(c, 0..VALUE_LEN))
    }
    /// The values read as i32, whatever [`Frame::payload_kind`] says.
    pub fn i32_values(&self) -> impl ExactSizeIterator<Item = i32> + '_ {
        self.words().map(i32::from_le_bytes)
    }
    /// The values read as f32, whatever [`Frame::payload_kind`] says.
    pub fn f32_values(&self) -> impl ExactSizeIterator<Item = f32> + '_ {
        self.words().map(f32::from_le_bytes)
    }
    /// [`Frame::i32_values`] as a vector, in a loop the compiler turns into a block copy on
    /// little-endian machines (collecting the iterator kept a branch per value).
    pub fn i32_vec(&self) -> Vec<i32> {
        let bytes = self.value_bytes();
        let mut out = vec![0i32; bytes.len() / VALUE_LEN];
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(VALUE_LEN)) {
            *o = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        out
    }
    /// [`Frame::f32_values`] as a vector (see [`Frame::i32_vec`]).
    pub fn f32_vec(&self) -> Vec<f32> {
        self.i32_vec().into_iter().map(|x| f32::from_bits(x as u32)).collect()
    }

    /// The whole frame.
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::any_header;
    use crate::{AtpHeader, SegKind, SwitchMlHeader, TransportHeader};
    use proptest::prelude::*;

    const ENV: Envelope = Envelope { src: 0x0A0B_0C0D, dst: 0x0102_0304, src_port: 0x1234, dst_port: 0x5678, ecn: false };

    /// `emit` writes exactly `bytes`, and the view of `bytes` reads every field back.
    fn check_vector(env: Envelope, header: Header, values: Option<Values<'_>>, bytes: &[u8]) {
        let mut b = vec![];
        emit(&env, &header, values, &mut b);
        assert_eq!(b, bytes);
        let n = values.map_or(0, |v| v.len());
        assert_eq!(buffer_len(&header, n), bytes.len());
        let f = Frame::new_checked(bytes).unwrap();
        assert_eq!(f.envelope(), env);
        assert_eq!(f.header(), &header);
        let mut h = vec![];
        header.encode(&mut h);
        assert_eq!(f.header_bytes(), h);
        assert_eq!(f.value_count(), n);
        match (values, f.payload_kind()) {
            (None, PayloadKind::None) => {}
            (Some(Values::I32(v)), PayloadKind::I32) => assert!(f.i32_values().eq(v.iter().copied()) && f.i32_vec() == v),
            (Some(Values::F32(v)), PayloadKind::F32) => {
                assert!(f.f32_values().eq(v.iter().copied()));
                assert!(f.f32_vec().iter().map(|x| x.to_bits()).eq(v.iter().map(|x| x.to_bits())));
            }
            other => panic!("payload kind {other:?}"),
        }
        assert_eq!(f.as_bytes(), bytes);
    }

    #[test]
    fn raw_without_payload() {
        #[rustfmt::skip]
        let bytes = [
            0x1A, 0xAB, 1, 0, // magic, version, flags
            0x0A, 0x0B, 0x0C, 0x0D, // src
            0x01, 0x02, 0x03, 0x04, // dst
            0x12, 0x34, 0x56, 0x78, // src_port, dst_port
            0, // header kind: Raw
            0, 0, 0, // payload kind: none, count 0
        ];
        check_vector(ENV, Header::Raw, None, &bytes);
    }

    #[test]
    fn atp_with_i32_values() {
        let header = Header::Atp(AtpHeader {
            job: 5,
            seq: 0x0102_0304,
            agg_index: 0x0506,
            bitmap0: 1,
            bitmap1: 0x8000_0000,
            fan_in0: 4,
            fan_in1: 2,
            esi: 1,
            flags: AtpHeader::FLAG_RESEND,
        });
        #[rustfmt::skip]
        let bytes = [
            0x1A, 0xAB, 1, 0,
            0x0A, 0x0B, 0x0C, 0x0D,
            0x01, 0x02, 0x03, 0x04,
            0x12, 0x34, 0x56, 0x78,
            2, // header kind: Atp
            0, 0, 0, 5, // job
            0x01, 0x02, 0x03, 0x04, // seq
            0, 0, 0x05, 0x06, // agg_index
            0, 0, 0, 1, // bitmap0
            0x80, 0, 0, 0, // bitmap1
            4, 2, 1, 1, // fan_in0, fan_in1, esi, flags RESEND
            1, 0, 3, // payload kind: i32, count 3
            1, 0, 0, 0, // 1
            0xFE, 0xFF, 0xFF, 0xFF, // -2
            0x04, 0x03, 0x02, 0x01, // 0x01020304
        ];
        check_vector(ENV, header, Some(Values::I32(&[1, -2, 0x0102_0304])), &bytes);
    }

    #[test]
    fn switchml_with_f32_values_and_ecn() {
        let header = Header::SwitchMl(SwitchMlHeader {
            job: 7,
            slot: 9,
            chunk: 0x0102_0304,
            wid: 3,
            ver: 1,
            flags: SwitchMlHeader::FLAG_RETRANSMIT,
            exp: 5,
        });
        #[rustfmt::skip]
        let bytes = [
            0x1A, 0xAB, 1, 1, // flags: ECN
            0x0A, 0x0B, 0x0C, 0x0D,
            0x01, 0x02, 0x03, 0x04,
            0x12, 0x34, 0x56, 0x78,
            3, // header kind: SwitchMl
            0, 0, 0, 7, // job
            0, 0, 0, 9, // slot
            0x01, 0x02, 0x03, 0x04, // chunk
            0, 3, // wid
            1, 2, 5, // ver, flags RETRANSMIT, exp
            2, 0, 2, // payload kind: f32, count 2
            0, 0, 0x80, 0x3F, // 1.0
            0, 0, 0x20, 0xC0, // -2.5
        ];
        check_vector(Envelope { ecn: true, ..ENV }, header, Some(Values::F32(&[1.0, -2.5])), &bytes);
    }

    /// An empty payload is kind i32 with count 0, not "none".
    #[test]
    fn transport_with_empty_i32_payload_and_ecn() {
        let header = Header::Transport(TransportHeader {
            kind: SegKind::Ack,
            flags: TransportHeader::FLAG_ECN_ECHO,
            seq: 0x0102_0304,
            msg_id: 1,
            msg_offset: 2,
            msg_len: 3,
            seg_len: 4,
        });
        #[rustfmt::skip]
        let bytes = [
            0x1A, 0xAB, 1, 1,
            0x0A, 0x0B, 0x0C, 0x0D,
            0x01, 0x02, 0x03, 0x04,
            0x12, 0x34, 0x56, 0x78,
            1, // header kind: Transport
            1, 1, 0, 0, // kind Ack, flags ECN_ECHO, pad
            0x01, 0x02, 0x03, 0x04, // seq
            0, 0, 0, 0, 0, 0, 0, 1, // msg_id
            0, 0, 0, 2, // msg_offset
            0, 0, 0, 3, // msg_len
            0, 0, 0, 4, // seg_len
            1, 0, 0, // payload kind: i32, count 0
        ];
        check_vector(Envelope { ecn: true, ..ENV }, header, Some(Values::I32(&[])), &bytes);
    }

    #[test]
    fn rejects_what_does_not_fit_exactly() {
        let mut b = vec![];
        emit(&ENV, &Header::Raw, None, &mut b);
        let err = |b: &[u8]| Frame::new_checked(b).unwrap_err();
        assert_eq!(err(&b[..ENVELOPE_LEN - 1]), WireError::Truncated { what: "frame envelope" });
        assert_eq!(err(&b[..b.len() - 1]), WireError::Truncated { what: "payload kind and count" });
        let mut long = b.clone();
        long.push(0);
        assert_eq!(err(&long), WireError::BadValue { what: "payload length", value: 1 });
        let mut bad = b.clone();
        bad[field::VERSION] = 2;
        assert_eq!(err(&bad), WireError::BadValue { what: "frame version", value: 2 });
        let mut bad = b.clone();
        bad[field::FLAGS] = 2;
        assert_eq!(err(&bad), WireError::BadValue { what: "frame flags", value: 2 });
        let mut bad = b.clone();
        bad[field::MAGIC.start] = 0;
        assert_eq!(err(&bad), WireError::BadValue { what: "frame magic", value: 0xAB });
        // Kind "none" with values, and an unknown kind.
        let mut bad = b.clone();
        bad.extend_from_slice(&[0; VALUE_LEN]);
        let at = ENVELOPE_LEN + Header::Raw.encoded_len();
        bad[at + field::payload::COUNT.end - 1] = 1;
        assert_eq!(err(&bad), WireError::BadValue { what: "payload kind", value: 0 });
        bad[at + field::payload::KIND] = 3;
        assert_eq!(err(&bad), WireError::BadValue { what: "payload kind", value: 3 });
    }

    fn any_values() -> impl Strategy<Value = Option<(bool, Vec<u32>)>> {
        proptest::option::of((any::<bool>(), proptest::collection::vec(any::<u32>(), 0..20)))
    }

    /// Every accessor of an accepted view, and that they agree with each other.
    fn read_all(f: &Frame<&[u8]>) {
        let _ = (f.envelope(), f.header(), f.payload_kind(), f.i32_values().last(), f.f32_values().last());
        let (n, h) = (f.value_count(), f.header_bytes());
        assert_eq!(Header::decode(h), Ok((f.header().clone(), h.len())));
        assert_eq!(buffer_len(f.header(), n), f.as_bytes().len());
        assert_eq!((f.i32_values().len(), f.f32_values().len(), f.value_bytes().len()), (n, n, n * VALUE_LEN));
    }

    proptest! {
        /// Valid frames, with bytes flipped, cut or appended, and arbitrary bytes: the check
        /// never panics, nor does any accessor of a view it accepts.
        #[test]
        fn new_checked_never_panics(env in any::<(u32, u32, u16, u16, bool)>(), header in any_header(), values in any_values(),
                                    at in any::<usize>(), byte in any::<u8>(), cut in any::<usize>(),
                                    extra in proptest::collection::vec(any::<u8>(), 0..8),
                                    noise in proptest::collection::vec(any::<u8>(), 0..120)) {
            let env = Envelope { src: env.0, dst: env.1, src_port: env.2, dst_port: env.3, ecn: env.4 };
            let (ints, floats): (Vec<i32>, Vec<f32>) = match &values {
                Some((_, v)) => (v.iter().map(|&x| x as i32).collect(), v.iter().map(|&x| f32::from_bits(x)).collect()),
                None => (vec![], vec![]),
            };
            let values = values.as_ref().map(|(float, _)| if *float { Values::F32(&floats) } else { Values::I32(&ints) });
            let mut b = vec![];
            emit(&env, &header, values, &mut b);
            let f = Frame::new_checked(&b[..]).unwrap();
            read_all(&f);
            prop_assert_eq!((f.envelope(), f.header()), (env, &header));
            prop_assert_eq!(f.value_bytes().len(), ints.len() * VALUE_LEN);

            let i = at % b.len();
            b[i] = byte;
            if let Ok(f) = Frame::new_checked(&b[..]) { read_all(&f) }
            b.truncate(cut % (b.len() + 1));
            if let Ok(f) = Frame::new_checked(&b[..]) { read_all(&f) }
            b.extend_from_slice(&extra);
            if let Ok(f) = Frame::new_checked(&b[..]) { read_all(&f) }
            if let Ok(f) = Frame::new_checked(&noise[..]) { read_all(&f) }
        }
    }
}
