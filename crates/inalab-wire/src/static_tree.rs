use crate::bytes::{be16, be32, u8_at};
use crate::WireError;

/// Offsets within the header body (after the kind tag).
mod field {
    use core::ops::Range;
    pub const JOB: Range<usize> = 0..2;
    pub const TREE: usize = 2;
    /// kind:2 rtx:1 spare:5, most significant first.
    pub const FLAGS: usize = 3;
    pub const SEQ: Range<usize> = 4..8;
    pub const COUNTER: Range<usize> = 8..10;
}

/// Which way a static-tree packet goes.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StaticTreeKind {
    /// A host's block or a switch's partial sum on its way up to the tree's parent.
    #[default]
    Reduce = 0,
    /// The block's sum on its way down the tree, from the root to every host.
    Result = 1,
}

impl StaticTreeKind {
    pub(crate) const ALL: [StaticTreeKind; 2] = [StaticTreeKind::Reduce, StaticTreeKind::Result];
}

/// The header of the static-tree in-network allreduce baselines of Canary's evaluation (one
/// static tree: SHARP/SwitchML/ATP-like; N trees, blocks round robin: PANAMA-like;
/// `../shared/specs/canary.md` A21). Block `seq` of job `job` travels up tree `tree` (= seq mod
/// N, chosen by the hosts) over fixed parent ports, and its sum comes back down the same tree.
///
/// Layout (big endian), 10 bytes after the header-kind tag (offsets in `field`):
/// `job:u16 tree:u8 flags:u8 seq:u32 counter:u16`, where `flags` is `kind:2 rtx:1 spare:5`.
/// The simulator charges a scheme's configured header bytes, not this encoding's length (the
/// scheme uses Canary's 57 B, so both send 1081-B packets, spec A20).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StaticTreeHeader {
    /// The tenant: switches keep each job's blocks apart by it.
    pub job: u16,
    /// Which of the job's trees the block uses.
    pub tree: u8,
    pub kind: StaticTreeKind,
    /// A host's re-send after a timeout, or a switch's re-send of a partial sum it was asked
    /// for again (the original or the answer was lost).
    pub rtx: bool,
    /// Block sequence number; it wraps (switches and hosts compare it modulo 2^32).
    pub seq: u32,
    /// Host contributions summed into this packet: 1 when a host sends, the hosts below a
    /// switch in its partial sum, all of the job's hosts in a Result. Never 0.
    pub counter: u16,
}

impl StaticTreeHeader {
    /// Encoded length without the kind tag.
    pub const LEN: usize = field::COUNTER.end;

    /// Whether `seq` comes after `other` in the wrapping sequence space (by less than half of
    /// it): a newer block.
    pub fn seq_after(seq: u32, other: u32) -> bool {
        (seq.wrapping_sub(other) as i32) > 0
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut b = [0; Self::LEN];
        b[field::JOB].copy_from_slice(&self.job.to_be_bytes());
        b[field::TREE] = self.tree;
        b[field::FLAGS] = (self.kind as u8) << 6 | (self.rtx as u8) << 5;
        b[field::SEQ].copy_from_slice(&self.seq.to_be_bytes());
        b[field::COUNTER].copy_from_slice(&self.counter.to_be_bytes());
        out.extend_from_slice(&b);
    }

    /// Decodes the header body (after the kind tag) from the front of `buf`.
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        let job = be16(buf, field::JOB, "static tree job")?;
        let tree = u8_at(buf, field::TREE, "static tree tree")?;
        let f = u8_at(buf, field::FLAGS, "static tree flags")?;
        let seq = be32(buf, field::SEQ, "static tree seq")?;
        let counter = be16(buf, field::COUNTER, "static tree counter")?;
        let k = f >> 6;
        let kind = StaticTreeKind::ALL.get(k as usize).copied().ok_or(WireError::BadValue { what: "static tree kind", value: k as u64 })?;
        if f & 0x1F != 0 {
            return Err(WireError::BadValue { what: "static tree spare bits", value: (f & 0x1F) as u64 });
        }
        // Every packet carries at least one host's contribution.
        if counter == 0 {
            return Err(WireError::BadValue { what: "static tree counter", value: 0 });
        }
        Ok(StaticTreeHeader { job, tree, kind, rtx: f & 0x20 != 0, seq, counter })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::tests::check_vector;
    use crate::Header;

    impl StaticTreeHeader {
        /// Any valid header of this kind (the round-trip property tests' generator).
        pub(crate) fn arbitrary() -> impl Strategy<Value = Self> {
            (any::<u16>(), any::<u8>(), 0usize..2, any::<bool>(), any::<u32>(), 1u16..).prop_map(|(job, tree, kind, rtx, seq, counter)| {
                StaticTreeHeader { job, tree, kind: StaticTreeKind::ALL[kind], rtx, seq, counter }
            })
        }
    }
    use proptest::prelude::*;

    #[test]
    fn vectors() {
        let up = StaticTreeHeader { job: 0x0102, tree: 3, kind: StaticTreeKind::Reduce, rtx: true, seq: 0x8000_0005, counter: 1 };
        #[rustfmt::skip]
        let bytes = [
            6, // header kind: static tree
            0x01, 0x02, // job
            0x03, // tree
            0b0010_0000, // kind Reduce (0), rtx, spare 0
            0x80, 0x00, 0x00, 0x05, // seq
            0x00, 0x01, // counter
        ];
        check_vector(Header::StaticTree(up), &bytes);
        let down = StaticTreeHeader { job: 7, tree: 0, kind: StaticTreeKind::Result, rtx: false, seq: 9, counter: 1024 };
        #[rustfmt::skip]
        let bytes = [
            6,
            0x00, 0x07,
            0x00,
            0b0100_0000, // kind Result (1)
            0x00, 0x00, 0x00, 0x09,
            0x04, 0x00,
        ];
        check_vector(Header::StaticTree(down), &bytes);
        assert_eq!(Header::StaticTree(down).job(), Some(7));
    }

    #[test]
    fn unknown_values_rejected() {
        let mut b = vec![];
        StaticTreeHeader { counter: 2, ..Default::default() }.encode(&mut b);
        assert!(StaticTreeHeader::decode(&b).is_ok());
        let mut k = b.clone();
        k[field::FLAGS] = 2 << 6;
        assert_eq!(StaticTreeHeader::decode(&k), Err(WireError::BadValue { what: "static tree kind", value: 2 }));
        let mut s = b.clone();
        s[field::FLAGS] |= 0b100;
        assert_eq!(StaticTreeHeader::decode(&s), Err(WireError::BadValue { what: "static tree spare bits", value: 0b100 }));
        let mut c = b.clone();
        c[field::COUNTER.end - 1] = 0;
        assert_eq!(StaticTreeHeader::decode(&c), Err(WireError::BadValue { what: "static tree counter", value: 0 }));
        assert_eq!(StaticTreeHeader::decode(&b[..5]), Err(WireError::Truncated { what: "static tree seq" }));
        assert_eq!(StaticTreeHeader::decode(&[]), Err(WireError::Truncated { what: "static tree job" }));
    }

    #[test]
    fn sequence_numbers_compare_across_the_wrap() {
        assert!(StaticTreeHeader::seq_after(5, 3));
        assert!(!StaticTreeHeader::seq_after(3, 5));
        assert!(!StaticTreeHeader::seq_after(3, 3));
        assert!(StaticTreeHeader::seq_after(2, u32::MAX - 1), "2 follows 2^32 - 2 after the wrap");
        assert!(!StaticTreeHeader::seq_after(u32::MAX - 1, 2));
    }

    proptest! {
        /// Garbage behind the static-tree kind tag (and short buffers) decodes to an error or a
        /// header, never a panic, and what decodes encodes back to the same bytes.
        #[test]
        fn random_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..24)) {
            let mut buf = vec![6u8];
            buf.extend_from_slice(&body);
            if let Ok((h, used)) = Header::decode(&buf) {
                let mut again = vec![];
                h.encode(&mut again);
                prop_assert_eq!(&again[..], &buf[..used]);
            }
            let _ = StaticTreeHeader::decode(&body);
        }
    }
}
