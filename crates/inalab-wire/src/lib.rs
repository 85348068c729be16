//! Wire formats. Every header that crosses a network has a typed struct here and a byte
//! encoding with `encode`/`decode`, laid out by named field offsets; [`frame`] owns the
//! datagram the UDP runtime (`inalab-net`) sends: envelope, header and payload. The simulator
//! passes the typed structs. Decoding never panics: malformed input is an `Err(WireError)`
//! that the caller counts and drops.

mod atp;
mod canary;
mod dsa;
mod error;
pub mod frame;
mod grid;
mod header;
mod rina;
mod static_tree;
mod switchml;
mod transport;

pub use atp::AtpHeader;
pub use canary::{CanaryHeader, CanaryType};
pub use dsa::{DsaHeader, DsaKind};
pub use error::WireError;
pub use grid::GridHeader;
pub use header::{Header, HeaderKind};
pub use rina::{RinaHeader, RinaKind};
pub use static_tree::{StaticTreeHeader, StaticTreeKind};
pub use switchml::SwitchMlHeader;
pub use transport::{SegKind, TransportHeader};

/// Field reads by offset for the codecs.
pub(crate) mod bytes {
    use crate::WireError;
    use core::ops::Range;

    /// The bytes at `at`, or `Truncated { what }` if the buffer ends before them.
    pub fn get<const N: usize>(buf: &[u8], at: Range<usize>, what: &'static str) -> Result<[u8; N], WireError> {
        buf.get(at).and_then(|s| s.try_into().ok()).ok_or(WireError::Truncated { what })
    }
    pub fn u8_at(buf: &[u8], at: usize, what: &'static str) -> Result<u8, WireError> {
        buf.get(at).copied().ok_or(WireError::Truncated { what })
    }
    pub fn be16(buf: &[u8], at: Range<usize>, what: &'static str) -> Result<u16, WireError> {
        get(buf, at, what).map(u16::from_be_bytes)
    }
    pub fn be32(buf: &[u8], at: Range<usize>, what: &'static str) -> Result<u32, WireError> {
        get(buf, at, what).map(u32::from_be_bytes)
    }
    pub fn be64(buf: &[u8], at: Range<usize>, what: &'static str) -> Result<u64, WireError> {
        get(buf, at, what).map(u64::from_be_bytes)
    }

    /// The bytes at `at` of a buffer already checked to hold them (panics otherwise).
    pub fn read<const N: usize>(buf: &[u8], at: Range<usize>) -> [u8; N] {
        let mut a = [0; N];
        a.copy_from_slice(&buf[at]);
        a
    }
}
