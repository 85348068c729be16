use crate::bytes::{be16, be32, u8_at};
use crate::WireError;

/// Offsets within the header body (after the kind tag).
mod field {
    use core::ops::Range;
    pub const JOB: Range<usize> = 0..2;
    pub const PSN: Range<usize> = 2..6;
    pub const BITMAP: Range<usize> = 6..10;
    pub const PRIORITY: Range<usize> = 10..14;
    pub const FAN_IN: usize = 14;
    /// kind in the high nibble, flags in the low one.
    pub const KIND_FLAGS: usize = 15;
}

/// What a DSA packet is (DSA §III-B, §IV-D; the names are the spec's, `docs/dsa.md`).
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DsaKind {
    /// A worker's gradient fragment (first send or retransmission).
    #[default]
    Grad = 0,
    /// The aggregated result, multicast to the job's workers (by the switch or the PS).
    Ack = 1,
    /// A partial aggregate a higher-priority packet evicted, sent to its own job's PS.
    Evict = 2,
    /// The PS asks the switch for its partial of (job, psn) (reminder, §IV-D steps 5-6).
    RemindSw = 3,
    /// The switch's answer: its partial, freed, or `FLAG_EMPTY`.
    RemindSwResp = 4,
    /// A worker tells the PS a fragment is stuck (after 3 retransmissions), with its gradient.
    Notify = 5,
    /// The PS asks a worker for its gradient of a fragment.
    Fetch = 6,
    /// A worker's answer: its gradient, or the final sum with `FLAG_RESULT`.
    FetchResp = 7,
    /// The PS tells the switch to move the job's slot of `psn` to the aggregator whose index
    /// is in `bitmap` (ATP's PS-side move, §3.6 of ATP, as it announces one in `bitmap0`):
    /// the `move_slots` ablation; the paper's DSA never moves an address.
    Move = 8,
}

impl DsaKind {
    pub(crate) const ALL: [DsaKind; 9] = [DsaKind::Grad, DsaKind::Ack, DsaKind::Evict, DsaKind::RemindSw, DsaKind::RemindSwResp, DsaKind::Notify, DsaKind::Fetch, DsaKind::FetchResp, DsaKind::Move];
}

/// DSA's header (Wang et al., ICNP; `../shared/specs/dsa.md` §1.3, widths a choice: the paper
/// names the fields, not their sizes).
///
/// Layout (big endian), 16 bytes after the header-kind tag (offsets in `field`):
/// `job:u16 psn:u32 bitmap:u32 priority:u32 fan_in:u8 kind:u4 flags:u4`. With 42 B of
/// Ethernet, IPv4 and UDP that is 58 B, as ATP's, leaving 248 B (62 values) in a 306 B packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DsaHeader {
    pub job: u16,
    /// Packet sequence number: one stream per job, the same fragment has the same PSN at
    /// every worker.
    pub psn: u32,
    /// Contributors: one-hot bit `rank` on a gradient, the OR of contributors on an aggregate.
    pub bitmap: u32,
    /// Priority in 16.16 fixed point of P (1/ms): higher keeps or takes an aggregator.
    pub priority: u32,
    /// The job's worker count N (at most 32, the bitmap's width).
    pub fan_in: u8,
    pub kind: DsaKind,
    /// `FLAG_*` bits (4 of them).
    pub flags: u8,
}

impl DsaHeader {
    /// Congestion experienced on the way (echoed on the ACK).
    pub const FLAG_ECN: u8 = 1;
    /// A retransmission.
    pub const FLAG_RETX: u8 = 2;
    /// A reminder reply: the switch held nothing for this key.
    pub const FLAG_EMPTY: u8 = 4;
    /// The payload is the final sum (a fetch answered by a worker that already has it).
    pub const FLAG_RESULT: u8 = 8;
    const FLAGS_KNOWN: u8 = 0x0f;
    /// Encoded length without the kind tag.
    pub const LEN: usize = field::KIND_FLAGS + 1;
    /// Most workers a job can have: the bitmap's width.
    pub const MAX_FAN_IN: u8 = 32;

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// The bitmap with every one of the job's `fan_in` workers in.
    pub fn full_bitmap(fan_in: u8) -> u32 {
        if fan_in >= 32 {
            u32::MAX
        } else {
            (1u32 << fan_in) - 1
        }
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut b = [0; Self::LEN];
        b[field::JOB].copy_from_slice(&self.job.to_be_bytes());
        b[field::PSN].copy_from_slice(&self.psn.to_be_bytes());
        b[field::BITMAP].copy_from_slice(&self.bitmap.to_be_bytes());
        b[field::PRIORITY].copy_from_slice(&self.priority.to_be_bytes());
        b[field::FAN_IN] = self.fan_in;
        b[field::KIND_FLAGS] = (self.kind as u8) << 4 | (self.flags & Self::FLAGS_KNOWN);
        out.extend_from_slice(&b);
    }

    /// Decodes the header body (after the kind tag) from the front of `buf`.
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        let job = be16(buf, field::JOB, "dsa job")?;
        let psn = be32(buf, field::PSN, "dsa psn")?;
        let bitmap = be32(buf, field::BITMAP, "dsa bitmap")?;
        let priority = be32(buf, field::PRIORITY, "dsa priority")?;
        let fan_in = u8_at(buf, field::FAN_IN, "dsa fan_in")?;
        let kf = u8_at(buf, field::KIND_FLAGS, "dsa kind")?;
        let kind = DsaKind::ALL.get((kf >> 4) as usize).copied().ok_or(WireError::BadValue { what: "dsa kind", value: (kf >> 4) as u64 })?;
        let h = DsaHeader { job, psn, bitmap, priority, fan_in, kind, flags: kf & 0x0f };
        if h.fan_in == 0 || h.fan_in > Self::MAX_FAN_IN {
            return Err(WireError::BadValue { what: "dsa fan_in", value: h.fan_in as u64 });
        }
        // A move's bitmap is an aggregator index, not contributors.
        if h.kind != DsaKind::Move && h.bitmap & !Self::full_bitmap(h.fan_in) != 0 {
            return Err(WireError::BadValue { what: "dsa bitmap", value: h.bitmap as u64 });
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::tests::check_vector;
    use crate::Header;
    use proptest::prelude::*;

    impl DsaHeader {
        /// Any valid header of this kind (the round-trip property tests' generator).
        pub(crate) fn arbitrary() -> impl Strategy<Value = Self> {
            (any::<u16>(), any::<u32>(), any::<u32>(), 1u8..=32, 0usize..8, 0u8..16).prop_map(|(job, psn, priority, fan_in, kind, flags)| {
                let bitmap = psn & DsaHeader::full_bitmap(fan_in);
                DsaHeader { job, psn, bitmap, priority, fan_in, kind: DsaKind::ALL[kind], flags }
            })
        }
    }

    #[test]
    fn vector() {
        let h = DsaHeader { job: 0x0102, psn: 0x0304_0506, bitmap: 0x0007_0809, priority: 0x0A0B_0C0D, fan_in: 24, kind: DsaKind::Evict, flags: DsaHeader::FLAG_ECN | DsaHeader::FLAG_RESULT };
        #[rustfmt::skip]
        let bytes = [
            4, // header kind: Dsa
            0x01, 0x02, // job
            0x03, 0x04, 0x05, 0x06, // psn
            0x00, 0x07, 0x08, 0x09, // bitmap
            0x0A, 0x0B, 0x0C, 0x0D, // priority
            24, // fan_in
            0x29, // kind Evict (2) << 4 | flags ECN|RESULT
        ];
        check_vector(Header::Dsa(h), &bytes);
    }

    #[test]
    fn move_vector_carries_an_aggregator_index_in_the_bitmap() {
        let h = DsaHeader { job: 7, psn: 513, bitmap: 18_000, priority: 0, fan_in: 8, kind: DsaKind::Move, flags: 0 };
        #[rustfmt::skip]
        let bytes = [
            4, // header kind: Dsa
            0x00, 0x07, // job
            0x00, 0x00, 0x02, 0x01, // psn
            0x00, 0x00, 0x46, 0x50, // bitmap: the new aggregator, 18,000
            0x00, 0x00, 0x00, 0x00, // priority
            8, // fan_in
            0x80, // kind Move (8) << 4, no flags
        ];
        check_vector(Header::Dsa(h), &bytes);
    }

    #[test]
    fn unknown_values_rejected() {
        let mut b = vec![];
        DsaHeader { fan_in: 2, ..Default::default() }.encode(&mut b);
        assert!(DsaHeader::decode(&b).is_ok());
        let mut k = b.clone();
        k[field::KIND_FLAGS] = 9 << 4;
        assert_eq!(DsaHeader::decode(&k), Err(WireError::BadValue { what: "dsa kind", value: 9 }));
        let mut f = b.clone();
        f[field::FAN_IN] = 33;
        assert_eq!(DsaHeader::decode(&f), Err(WireError::BadValue { what: "dsa fan_in", value: 33 }));
        f[field::FAN_IN] = 0;
        assert_eq!(DsaHeader::decode(&f), Err(WireError::BadValue { what: "dsa fan_in", value: 0 }));
        // A contributor bit beyond the job's workers.
        let mut m = b.clone();
        m[field::BITMAP.end - 1] = 0b100;
        assert_eq!(DsaHeader::decode(&m), Err(WireError::BadValue { what: "dsa bitmap", value: 4 }));
        assert_eq!(DsaHeader::decode(&b[..10]), Err(WireError::Truncated { what: "dsa priority" }));
    }

    #[test]
    fn full_bitmaps() {
        assert_eq!(DsaHeader::full_bitmap(1), 1);
        assert_eq!(DsaHeader::full_bitmap(8), 0xff);
        assert_eq!(DsaHeader::full_bitmap(32), u32::MAX);
    }
}
