//! Wire formats. Every header that crosses a network has a typed struct here and a byte
//! encoding with `encode`/`decode`. The simulator passes the typed structs; the UDP runtime
//! (`inalab-net`) puts the bytes on the wire inside `inalab_core::frame`s. Decoding never panics: malformed input is an
//! `Err(WireError)` that the caller counts and drops.

mod atp;
mod error;
mod header;
mod switchml;
mod transport;

pub use atp::AtpHeader;
pub use error::WireError;
pub use header::{Header, HeaderKind};
pub use switchml::SwitchMlHeader;
pub use transport::{SegKind, TransportHeader};

/// Little helpers shared by the header codecs.
pub(crate) mod bytes {
    use crate::WireError;

    pub struct Reader<'a> {
        pub buf: &'a [u8],
        pub pos: usize,
    }

    impl<'a> Reader<'a> {
        pub fn new(buf: &'a [u8]) -> Self {
            Self { buf, pos: 0 }
        }
        pub fn take<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], WireError> {
            let end = self.pos + N;
            let s = self.buf.get(self.pos..end).ok_or(WireError::Truncated { what })?;
            self.pos = end;
            Ok(s.try_into().expect("length checked"))
        }
        pub fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
            Ok(self.take::<1>(what)?[0])
        }
        pub fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
            Ok(u16::from_be_bytes(self.take(what)?))
        }
        pub fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
            Ok(u32::from_be_bytes(self.take(what)?))
        }
        pub fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
            Ok(u64::from_be_bytes(self.take(what)?))
        }
    }
}
