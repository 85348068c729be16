use crate::{NodeId, Time};
use inalab_wire::Header;

/// `Packet::path` value meaning "route by the routing table".
pub const NO_PATH: u32 = u32::MAX;

/// `Packet::dst` of a packet for every receiver of its sender's multicast tree (GRID's results,
/// spec §1.6): the driver replicates it at each node of the tree the job's set-up laid out for
/// the sending endpoint, and every copy that reaches a host carries that host as `dst`.
pub const GROUP: NodeId = NodeId::MAX;

/// Values a packet carries in payload mode. In metadata mode packets carry none and only
/// their sizes matter.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    I32(Vec<i32>),
    F32(Vec<f32>),
}

impl Payload {
    pub fn len(&self) -> usize {
        match self {
            Payload::I32(v) => v.len(),
            Payload::F32(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Values `[start, end)` as a new payload of the same type.
    pub fn slice(&self, start: usize, end: usize) -> Payload {
        match self {
            Payload::I32(v) => Payload::I32(v[start..end].to_vec()),
            Payload::F32(v) => Payload::F32(v[start..end].to_vec()),
        }
    }
    /// An all-zero payload of the same type and the given length.
    pub fn zeros_like(&self, len: usize) -> Payload {
        match self {
            Payload::I32(_) => Payload::I32(vec![0; len]),
            Payload::F32(_) => Payload::F32(vec![0.0; len]),
        }
    }
    /// Element-wise `self[offset..] += other` (wrapping for integers, IEEE for floats).
    /// Panics if the types differ or `other` does not fit: callers check at the boundary.
    pub fn add_at(&mut self, offset: usize, other: &Payload) {
        match (self, other) {
            (Payload::I32(a), Payload::I32(b)) => {
                for (x, y) in a[offset..offset + b.len()].iter_mut().zip(b) {
                    *x = x.wrapping_add(*y);
                }
            }
            (Payload::F32(a), Payload::F32(b)) => {
                for (x, y) in a[offset..offset + b.len()].iter_mut().zip(b) {
                    *x += *y;
                }
            }
            _ => panic!("payload type mismatch"),
        }
    }
    /// Element-wise copy of `other` into `self[offset..]`.
    pub fn copy_at(&mut self, offset: usize, other: &Payload) {
        match (self, other) {
            (Payload::I32(a), Payload::I32(b)) => a[offset..offset + b.len()].copy_from_slice(b),
            (Payload::F32(a), Payload::F32(b)) => a[offset..offset + b.len()].copy_from_slice(b),
            _ => panic!("payload type mismatch"),
        }
    }
    /// Bytes per value (both types are 4 bytes wide).
    pub const VALUE_BYTES: usize = 4;
}

/// A packet as protocols and drivers exchange it.
///
/// `src`/`dst` are host node ids and `src_port`/`dst_port` name the protocol endpoint on that
/// host (like UDP ports). `size` is the number of bytes the packet occupies on the wire
/// (headers included) and is what links serialize; it is set by the protocol that builds the
/// packet, so metadata-mode runs need no payload.
#[derive(Debug, Clone)]
pub struct Packet {
    pub src: NodeId,
    pub dst: NodeId,
    pub src_port: u16,
    pub dst_port: u16,
    /// Bytes on the wire.
    pub size: u32,
    /// Congestion Experienced mark, set by a switch queue above its ECN threshold.
    pub ecn: bool,
    /// Key hashed by ECMP; packets of one flow share a path under ECMP.
    pub flow: u64,
    /// Fixed path id (`NO_PATH` = use the routing table). Fixed paths are configured in the
    /// driver; `hop` is advanced by the driver at every switch.
    pub path: u32,
    pub hop: u8,
    pub header: Header,
    pub payload: Option<Box<Payload>>,
    /// When the packet was created by its protocol (drivers use it for latency metrics).
    pub created: Time,
}

impl Packet {
    /// A unicast packet with no fixed path.
    pub fn new(src: NodeId, src_port: u16, dst: NodeId, dst_port: u16, size: u32, header: Header) -> Self {
        Packet {
            src,
            dst,
            src_port,
            dst_port,
            size,
            ecn: false,
            flow: flow_key(src, src_port, dst, dst_port),
            path: NO_PATH,
            hop: 0,
            header,
            payload: None,
            created: 0,
        }
    }
}

/// The 5-tuple-like flow key ECMP hashes: a bijective mix of (src, dst, ports), so distinct
/// flows never share a key.
#[inline]
pub fn flow_key(src: NodeId, src_port: u16, dst: NodeId, dst_port: u16) -> u64 {
    let hosts = (src as u64) << 32 | dst as u64;
    let ports = (src_port as u64) << 16 | dst_port as u64;
    splitmix64(hosts ^ ports.rotate_left(47))
}

/// SplitMix64 finalizer: a fast bijective 64-bit mixer (Steele et al.).
#[inline]
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
