use crate::bytes::{be16, be32, u8_at};
use crate::WireError;

/// Offsets within the header body (after the kind tag): Canary §4.1's 19 bytes.
mod field {
    use core::ops::Range;
    pub const DST: Range<usize> = 0..4;
    pub const ID: Range<usize> = 4..8;
    pub const COUNTER: Range<usize> = 8..10;
    pub const HOSTS: Range<usize> = 10..12;
    pub const CHILDREN: Range<usize> = 12..16;
    pub const SWITCH: Range<usize> = 16..18;
    /// bypass:1 multicast:1 type:3 shard:2 spare:1, most significant first.
    pub const FLAGS: usize = 18;
}

/// What a Canary packet is: the paper's header has no type field, so three of its six padding
/// bits carry one (`../shared/specs/canary.md` §1.2, A10).
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CanaryType {
    /// A host's block or a switch's partial sum on its way up to the block's leader.
    #[default]
    Reduce = 0,
    /// The block's sum on its way down the recorded children (multicast).
    Result = 1,
    /// The leader's result for a subtree a collision cut off, addressed to the switch that
    /// collided, with the ports to multicast on in `children` (§3.2.1).
    Restore = 2,
    /// A host that timed out asks the block's leader (§3.3).
    RtxReq = 3,
    /// The leader tells every host to re-send a block under its next attempt (§3.3).
    Fail = 4,
    /// A block reduced by the hosts through its leader after repeated failures (§3.3).
    Fallback = 5,
}

impl CanaryType {
    pub(crate) const ALL: [CanaryType; 6] = [CanaryType::Reduce, CanaryType::Result, CanaryType::Restore, CanaryType::RtxReq, CanaryType::Fail, CanaryType::Fallback];
}

/// Canary's header (De Sensi et al., §4.1; `../shared/specs/canary.md` §1.2).
///
/// Layout (big endian), 19 bytes after the header-kind tag (offsets in `field`):
/// `dst:u32 id:u32 counter:u16 hosts:u16 children:u32 switch:u16 flags:u8`, where `flags` is
/// `bypass:1 multicast:1 type:3 shard:2 spare:1`. The id is `tenant:8 attempt:2 seq:22`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CanaryHeader {
    /// The block's leader host (where the reduction goes), or for `Restore` the switch that
    /// must multicast it.
    pub dst: u32,
    /// Block id: tenant (the job), attempt (re-issues) and sequence number.
    pub id: u32,
    /// Host contributions summed into this packet (1 when a host sends).
    pub counter: u16,
    /// Contributions the block needs at its leader (the job's hosts minus the leader).
    pub hosts: u16,
    /// On a collision, the colliding switch's ingress port; on `Restore`, the ports (bits of
    /// shard `shard`, 32 ports each) to multicast on.
    pub children: u32,
    /// On a collision, the colliding switch's address.
    pub switch: u16,
    /// Switches route the packet to `dst` without processing it.
    pub bypass: bool,
    /// A result: multicast it to the recorded children.
    pub multicast: bool,
    pub kind: CanaryType,
    /// Which 32 ports `children` covers on a `Restore` (0..=3: switches of up to 128 ports).
    pub shard: u8,
}

impl CanaryHeader {
    /// Encoded length without the kind tag (the paper's 19 bytes).
    pub const LEN: usize = field::FLAGS + 1;
    pub const TENANT_BITS: u32 = 8;
    pub const ATTEMPT_BITS: u32 = 2;
    pub const SEQ_BITS: u32 = 22;
    /// Shards of `children` a `Restore` can name.
    pub const SHARDS: u8 = 4;

    /// The id of block `seq` (modulo 2^22) of `tenant` at `attempt` (modulo 4).
    pub fn make_id(tenant: u8, attempt: u8, seq: u32) -> u32 {
        (tenant as u32) << (Self::ATTEMPT_BITS + Self::SEQ_BITS) | ((attempt as u32) & 3) << Self::SEQ_BITS | (seq & ((1 << Self::SEQ_BITS) - 1))
    }
    pub fn tenant(&self) -> u8 {
        (self.id >> (Self::ATTEMPT_BITS + Self::SEQ_BITS)) as u8
    }
    pub fn attempt(&self) -> u8 {
        ((self.id >> Self::SEQ_BITS) & 3) as u8
    }
    pub fn seq(&self) -> u32 {
        self.id & ((1 << Self::SEQ_BITS) - 1)
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut b = [0; Self::LEN];
        b[field::DST].copy_from_slice(&self.dst.to_be_bytes());
        b[field::ID].copy_from_slice(&self.id.to_be_bytes());
        b[field::COUNTER].copy_from_slice(&self.counter.to_be_bytes());
        b[field::HOSTS].copy_from_slice(&self.hosts.to_be_bytes());
        b[field::CHILDREN].copy_from_slice(&self.children.to_be_bytes());
        b[field::SWITCH].copy_from_slice(&self.switch.to_be_bytes());
        b[field::FLAGS] = (self.bypass as u8) << 7 | (self.multicast as u8) << 6 | (self.kind as u8) << 3 | (self.shard & 3) << 1;
        out.extend_from_slice(&b);
    }

    /// Decodes the header body (after the kind tag) from the front of `buf`.
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        let dst = be32(buf, field::DST, "canary dst")?;
        let id = be32(buf, field::ID, "canary id")?;
        let counter = be16(buf, field::COUNTER, "canary counter")?;
        let hosts = be16(buf, field::HOSTS, "canary hosts")?;
        let children = be32(buf, field::CHILDREN, "canary children")?;
        let switch = be16(buf, field::SWITCH, "canary switch")?;
        let f = u8_at(buf, field::FLAGS, "canary flags")?;
        let t = (f >> 3) & 7;
        let kind = CanaryType::ALL.get(t as usize).copied().ok_or(WireError::BadValue { what: "canary type", value: t as u64 })?;
        if f & 1 != 0 {
            return Err(WireError::BadValue { what: "canary spare bit", value: 1 });
        }
        if counter > hosts {
            return Err(WireError::BadValue { what: "canary counter", value: counter as u64 });
        }
        Ok(CanaryHeader { dst, id, counter, hosts, children, switch, bypass: f & 0x80 != 0, multicast: f & 0x40 != 0, kind, shard: (f >> 1) & 3 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::tests::check_vector;
    use crate::Header;
    use proptest::prelude::*;

    impl CanaryHeader {
        /// Any valid header of this kind (the round-trip property tests' generator).
        pub(crate) fn arbitrary() -> impl Strategy<Value = Self> {
            ((any::<u32>(), any::<u32>(), any::<u16>(), any::<u16>()), (any::<u32>(), any::<u16>(), any::<bool>(), any::<bool>(), 0usize..6, 0u8..4)).prop_map(
                |((dst, id, counter, hosts), (children, switch, bypass, multicast, kind, shard))| {
                    let counter = counter.min(hosts);
                    CanaryHeader { dst, id, counter, hosts, children, switch, bypass, multicast, kind: CanaryType::ALL[kind], shard }
                },
            )
        }
    }

    #[test]
    fn vector() {
        let h = CanaryHeader {
            dst: 0x0A00_0005,
            id: CanaryHeader::make_id(7, 2, 0x12_3456),
            counter: 3,
            hosts: 0x0102,
            children: 0x8000_0021,
            switch: 0x0304,
            bypass: true,
            multicast: true,
            kind: CanaryType::Restore,
            shard: 2,
        };
        assert_eq!((h.tenant(), h.attempt(), h.seq()), (7, 2, 0x12_3456));
        #[rustfmt::skip]
        let bytes = [
            5, // header kind: Canary
            0x0A, 0x00, 0x00, 0x05, // dst
            0x07, 0x92, 0x34, 0x56, // id: tenant 7, attempt 2, seq 0x123456
            0x00, 0x03, // counter
            0x01, 0x02, // hosts
            0x80, 0x00, 0x00, 0x21, // children
            0x03, 0x04, // switch
            0b1101_0100, // bypass, multicast, type Restore (2), shard 2, spare 0
        ];
        check_vector(Header::Canary(h), &bytes);
        assert_eq!(bytes.len(), 1 + 19, "the paper's 19 bytes");
    }

    #[test]
    fn unknown_values_rejected() {
        let mut b = vec![];
        CanaryHeader { counter: 1, hosts: 3, ..Default::default() }.encode(&mut b);
        assert!(CanaryHeader::decode(&b).is_ok());
        let mut t = b.clone();
        t[field::FLAGS] = 6 << 3;
        assert_eq!(CanaryHeader::decode(&t), Err(WireError::BadValue { what: "canary type", value: 6 }));
        let mut s = b.clone();
        s[field::FLAGS] |= 1;
        assert_eq!(CanaryHeader::decode(&s), Err(WireError::BadValue { what: "canary spare bit", value: 1 }));
        let mut c = b.clone();
        c[field::COUNTER.end - 1] = 4;
        assert_eq!(CanaryHeader::decode(&c), Err(WireError::BadValue { what: "canary counter", value: 4 }));
        assert_eq!(CanaryHeader::decode(&b[..9]), Err(WireError::Truncated { what: "canary counter" }));
    }

    #[test]
    fn ids_wrap_their_fields() {
        let id = CanaryHeader::make_id(255, 5, (1 << 22) + 9);
        let h = CanaryHeader { id, ..Default::default() };
        assert_eq!((h.tenant(), h.attempt(), h.seq()), (255, 1, 9));
    }
}
