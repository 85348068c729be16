use crate::bytes::{be16, be32, u8_at};
use crate::WireError;

/// Offsets within the header body (after the kind tag).
mod field {
    use core::ops::Range;
    pub const KIND: usize = 0;
    pub const FLAGS: usize = 1;
    pub const MEMBER: usize = 2;
    pub const HOP: usize = 3;
    pub const JOB: Range<usize> = 4..6;
    pub const STEP: Range<usize> = 6..8;
    pub const CHUNK: Range<usize> = 8..10;
    pub const COUNT: Range<usize> = 10..12;
    pub const REQ: Range<usize> = 12..16;
    pub const SEQ: Range<usize> = 16..20;
    pub const SLOT: Range<usize> = 20..24;
    pub const ARG: Range<usize> = 24..28;
}

/// What a Rina packet is (`../shared/specs/rina.md` §1.5).
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RinaKind {
    /// Agent to its ToR: pull the rack's part of chunk `chunk` for ScatterReduce step `step`
    /// (`arg` = packets in the chunk).
    #[default]
    Task = 1,
    /// ToR to every member of its rack: the TASK, copied.
    Pull = 2,
    /// Member to its ToR: its values of packet `seq` of the chunk, summed in slot `slot`.
    Data = 3,
    /// A rack's (the ToR's) or an autonomous worker's partial sum of packet `seq` of `chunk`,
    /// to the next group's receiver; with `FULL`, the finished sum.
    Agg = 4,
    /// The next group's receiver to the sender of an AGG (through the sender's ToR, which
    /// frees the slot and copies the ACK to every member).
    Ack = 5,
    /// AllGather: packet `seq` of the finished `chunk`, `hop` hops from where it finished.
    Ag = 6,
    /// The AG receiver to its sender.
    AgAck = 7,
    /// A rack member to its agent: send again packets `seq..arg` of `chunk` (AllGather copies
    /// it missed).
    Nack = 8,
}

impl RinaKind {
    pub const ALL: [RinaKind; 8] =
        [RinaKind::Task, RinaKind::Pull, RinaKind::Data, RinaKind::Agg, RinaKind::Ack, RinaKind::Ag, RinaKind::AgAck, RinaKind::Nack];
}

/// The header of Rina's packets (Chen et al., ICNP 2024; the paper gives no format, this is
/// `../shared/specs/rina.md` §1.5 with its 32-bit fields the runs need narrowed to 16 and
/// the job-wide DATA counter in `slot`).
///
/// Layout (big endian), 28 bytes after the header-kind tag (offsets in `field`):
/// `kind:u8 flags:u8 member:u8 hop:u8 job:u16 step:u16 chunk:u16 count:u16 req:u32 seq:u32
/// slot:u32 arg:u32`; `flags` = ECN_ECHO 1, RETX 2, FULL 4, REPAIR 8, the rest 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RinaHeader {
    pub kind: RinaKind,
    pub flags: u8,
    /// The sender's index in its rack (DATA), for the switch's bitmap.
    pub member: u8,
    /// AllGather hops this chunk has made.
    pub hop: u8,
    pub job: u16,
    /// ScatterReduce step (0..G-1).
    pub step: u16,
    pub chunk: u16,
    /// Values in the packet.
    pub count: u16,
    /// The job's allreduce request, in submission order.
    pub req: u32,
    /// Packet index within the chunk.
    pub seq: u32,
    /// The job-wide index of a DATA packet (every member counts the same): the switch sums
    /// it in slot `base + slot mod slots` of the job's region and tags the slot with it.
    pub slot: u32,
    /// TASK/PULL: packets in the chunk; NACK: the end of the missing range.
    pub arg: u32,
}

impl RinaHeader {
    pub const LEN: usize = field::ARG.end;
    pub const ECN_ECHO: u8 = 1;
    pub const RETX: u8 = 2;
    pub const FULL: u8 = 4;
    /// A packet an agent sends again inside its rack (the switch does not copy it on).
    pub const REPAIR: u8 = 8;
    const KNOWN_FLAGS: u8 = 0x0F;
    /// `req` holds the ring's epoch (it changes when a worker dies) in its top 8 bits and
    /// the request within the epoch below them.
    pub const EPOCH_SHIFT: u32 = 24;
    pub const REQ_MASK: u32 = (1 << Self::EPOCH_SHIFT) - 1;

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
    pub fn epoch(&self) -> u8 {
        (self.req >> Self::EPOCH_SHIFT) as u8
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut b = [0; Self::LEN];
        b[field::KIND] = self.kind as u8;
        b[field::FLAGS] = self.flags;
        b[field::MEMBER] = self.member;
        b[field::HOP] = self.hop;
        b[field::JOB].copy_from_slice(&self.job.to_be_bytes());
        b[field::STEP].copy_from_slice(&self.step.to_be_bytes());
        b[field::CHUNK].copy_from_slice(&self.chunk.to_be_bytes());
        b[field::COUNT].copy_from_slice(&self.count.to_be_bytes());
        b[field::REQ].copy_from_slice(&self.req.to_be_bytes());
        b[field::SEQ].copy_from_slice(&self.seq.to_be_bytes());
        b[field::SLOT].copy_from_slice(&self.slot.to_be_bytes());
        b[field::ARG].copy_from_slice(&self.arg.to_be_bytes());
        out.extend_from_slice(&b);
    }

    /// Decodes the header body (after the kind tag) from the front of `buf`.
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        let k = u8_at(buf, field::KIND, "rina kind")?;
        let flags = u8_at(buf, field::FLAGS, "rina flags")?;
        let member = u8_at(buf, field::MEMBER, "rina member")?;
        let hop = u8_at(buf, field::HOP, "rina hop")?;
        let h = RinaHeader {
            kind: RinaKind::ALL.iter().copied().find(|x| *x as u8 == k).ok_or(WireError::BadValue { what: "rina kind", value: k as u64 })?,
            flags,
            member,
            hop,
            job: be16(buf, field::JOB, "rina job")?,
            step: be16(buf, field::STEP, "rina step")?,
            chunk: be16(buf, field::CHUNK, "rina chunk")?,
            count: be16(buf, field::COUNT, "rina count")?,
            req: be32(buf, field::REQ, "rina req")?,
            seq: be32(buf, field::SEQ, "rina seq")?,
            slot: be32(buf, field::SLOT, "rina slot")?,
            arg: be32(buf, field::ARG, "rina arg")?,
        };
        if flags & !Self::KNOWN_FLAGS != 0 {
            return Err(WireError::BadValue { what: "rina spare flags", value: (flags & !Self::KNOWN_FLAGS) as u64 });
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::tests::check_vector;
    use crate::Header;

    impl RinaHeader {
        /// Any valid header of this kind (the round-trip property tests' generator).
        pub(crate) fn arbitrary() -> impl Strategy<Value = Self> {
            ((0usize..8, 0u8..16, any::<u8>(), any::<u8>(), any::<u16>(), any::<u16>()), (any::<u16>(), any::<u16>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>())).prop_map(
                |((kind, flags, member, hop, job, step), (chunk, count, req, seq, slot, arg))| RinaHeader {
                    kind: RinaKind::ALL[kind],
                    flags,
                    member,
                    hop,
                    job,
                    step,
                    chunk,
                    count,
                    req,
                    seq,
                    slot,
                    arg,
                },
            )
        }
    }
    use proptest::prelude::*;

    #[test]
    fn vectors() {
        let data = RinaHeader {
            kind: RinaKind::Data,
            flags: RinaHeader::RETX,
            member: 3,
            hop: 0,
            job: 0x0102,
            step: 1,
            chunk: 2,
            count: 62,
            req: 0x0A0B_0C0D,
            seq: 5,
            slot: 0x8000_0001,
            arg: 0,
        };
        #[rustfmt::skip]
        let bytes = [
            7, // header kind: rina
            3, 0b10, 3, 0, // DATA, RETX, member 3, hop 0
            0x01, 0x02, // job
            0x00, 0x01, // step
            0x00, 0x02, // chunk
            0x00, 62, // count
            0x0A, 0x0B, 0x0C, 0x0D, // req
            0, 0, 0, 5, // seq
            0x80, 0, 0, 1, // slot
            0, 0, 0, 0, // arg
        ];
        check_vector(Header::Rina(data), &bytes);
        assert_eq!(Header::Rina(data).job(), Some(0x0102));
        let nack = RinaHeader { kind: RinaKind::Nack, flags: 0, chunk: 9, seq: 10, arg: 20, ..Default::default() };
        #[rustfmt::skip]
        let bytes = [
            7, 8, 0, 0, 0,
            0, 0, 0, 0, 0, 9, 0, 0,
            0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 20,
        ];
        check_vector(Header::Rina(nack), &bytes);
    }

    #[test]
    fn unknown_values_rejected() {
        let mut b = vec![];
        RinaHeader::default().encode(&mut b);
        assert!(RinaHeader::decode(&b).is_ok());
        let mut k = b.clone();
        k[field::KIND] = 0;
        assert_eq!(RinaHeader::decode(&k), Err(WireError::BadValue { what: "rina kind", value: 0 }));
        k[field::KIND] = 9;
        assert_eq!(RinaHeader::decode(&k), Err(WireError::BadValue { what: "rina kind", value: 9 }));
        let mut f = b.clone();
        f[field::FLAGS] = 0x30;
        assert_eq!(RinaHeader::decode(&f), Err(WireError::BadValue { what: "rina spare flags", value: 0x30 }));
        assert_eq!(RinaHeader::decode(&b[..27]), Err(WireError::Truncated { what: "rina arg" }));
        assert_eq!(RinaHeader::decode(&[]), Err(WireError::Truncated { what: "rina kind" }));
    }

    proptest! {
        /// Garbage behind the Rina kind tag decodes to an error or a header, never a panic, and
        /// what decodes encodes back to the same bytes.
        #[test]
        fn random_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..40)) {
            let mut buf = vec![7u8];
            buf.extend_from_slice(&body);
            if let Ok((h, used)) = Header::decode(&buf) {
                let mut again = vec![];
                h.encode(&mut again);
                prop_assert_eq!(&again[..], &buf[..used]);
            }
            let _ = RinaHeader::decode(&body);
        }
    }
}
