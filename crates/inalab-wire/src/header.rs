use crate::bytes::u8_at;
use crate::{AtpHeader, CanaryHeader, DsaHeader, GridHeader, RinaHeader, StaticTreeHeader, SwitchMlHeader, TransportHeader, WireError};

/// Offsets in an encoded header: a kind tag, then that kind's fixed-length body.
mod field {
    pub const KIND: usize = 0;
    pub const BODY: usize = 1;
}

/// Declares every header kind from one table: the [`Header`] enum, its one-byte
/// [`HeaderKind`] tag and every match over the kinds (body length, job, encode, decode, the
/// property tests' generator). Each entry names the variant, its body type (with `LEN`,
/// `encode`, `decode` and, under test, `arbitrary`), its tag and how to read its job; a new
/// protocol adds one entry.
macro_rules! headers {
    ($($(#[$doc:meta])* $var:ident($ty:ty) = $tag:literal, job: $job:expr;)*) => {
        /// The typed header a packet carries. Switch programs match on the variant they serve
        /// and treat every other one as plain traffic.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Header {
            /// No protocol header: background or benchmark datagrams.
            Raw,
            $($(#[$doc])* $var($ty),)*
        }

        /// One byte that names the variant on the wire.
        #[repr(u8)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum HeaderKind {
            Raw = 0,
            $($var = $tag,)*
        }

        impl HeaderKind {
            /// Every kind, in the order of their tags.
            pub const ALL: [HeaderKind; 1 + [$(HeaderKind::$var),*].len()] = [HeaderKind::Raw, $(HeaderKind::$var),*];

            /// Bytes of the kind's fixed-length body, after its one-byte tag.
            pub const fn body_len(self) -> usize {
                match self {
                    HeaderKind::Raw => 0,
                    $(HeaderKind::$var => <$ty>::LEN,)*
                }
            }
        }

        impl Header {
            pub fn kind(&self) -> HeaderKind {
                match self {
                    Header::Raw => HeaderKind::Raw,
                    $(Header::$var(_) => HeaderKind::$var,)*
                }
            }

            /// The job a packet of an INA protocol belongs to (`None` for headers that carry no job).
            pub fn job(&self) -> Option<u32> {
                match self {
                    Header::Raw => None,
                    $(Header::$var(h) => {
                        let job: fn(&$ty) -> Option<u32> = $job;
                        job(h)
                    })*
                }
            }

            pub fn encode(&self, out: &mut Vec<u8>) {
                out.push(self.kind() as u8);
                match self {
                    Header::Raw => {}
                    $(Header::$var(h) => h.encode(out),)*
                }
            }

            fn decode_body(kind: HeaderKind, body: &[u8]) -> Result<Header, WireError> {
                Ok(match kind {
                    HeaderKind::Raw => Header::Raw,
                    $(HeaderKind::$var => Header::$var(<$ty>::decode(body)?),)*
                })
            }
        }

        /// Any valid header of any kind.
        #[cfg(test)]
        pub(crate) fn any_header() -> impl proptest::strategy::Strategy<Value = Header> {
            use proptest::prelude::*;
            prop_oneof![Just(Header::Raw), $(<$ty>::arbitrary().prop_map(Header::$var)),*]
        }
    };
}

headers! {
    /// The windowed reliable host transport (data segments and ACKs).
    Transport(TransportHeader) = 1, job: |_| None;
    /// ATP gradient fragments and parameter packets.
    Atp(AtpHeader) = 2, job: |h| Some(h.job);
    /// SwitchML worker packets and results.
    SwitchMl(SwitchMlHeader) = 3, job: |h| Some(h.job);
    /// DSA gradients, results, evictions and reminder traffic.
    Dsa(DsaHeader) = 4, job: |h| Some(h.job as u32);
    /// Canary blocks, results, restorations and the hosts' recovery messages (the tenant
    /// prefix of the block id is the job, Canary §3.4).
    Canary(CanaryHeader) = 5, job: |h| Some(h.tenant() as u32);
    /// Static-tree allreduce blocks and results (Canary's baselines, its own kind so that
    /// Canary's program never claims them).
    StaticTree(StaticTreeHeader) = 6, job: |h| Some(h.job as u32);
    /// Rina's rack aggregation, ring hops and AllGather copies.
    Rina(RinaHeader) = 7, job: |h| Some(h.job as u32);
    /// GRID's node-targeted gradients, results and rate-synchronization control packets (tag 8:
    /// the spec proposed 4, which DSA took first).
    Grid(GridHeader) = 8, job: |h| Some(h.job);
}

impl TryFrom<u8> for HeaderKind {
    type Error = WireError;
    fn try_from(v: u8) -> Result<Self, WireError> {
        HeaderKind::ALL.into_iter().find(|k| *k as u8 == v).ok_or(WireError::BadValue { what: "header kind", value: v as u64 })
    }
}

impl Header {
    /// Bytes of the encoded header including its one-byte kind tag.
    pub fn encoded_len(&self) -> usize {
        field::BODY + self.kind().body_len()
    }

    /// Decodes a header from the front of `buf`; returns it with the number of bytes used.
    pub fn decode(buf: &[u8]) -> Result<(Header, usize), WireError> {
        let kind = HeaderKind::try_from(u8_at(buf, field::KIND, "header kind")?)?;
        let h = Header::decode_body(kind, &buf[field::BODY..])?;
        let used = h.encoded_len();
        Ok((h, used))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
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

    #[test]
    fn raw_vector() {
        check_vector(Header::Raw, &[0]);
    }

    #[test]
    fn the_kinds_are_listed_in_the_order_of_their_tags() {
        for (i, k) in HeaderKind::ALL.into_iter().enumerate() {
            assert_eq!(k as u8 as usize, i, "{k:?}");
            assert_eq!(HeaderKind::try_from(i as u8), Ok(k));
        }
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
