//! Helpers the host tests share: the fabric they run on (`inalab_testkit`), packet
//! predicates and test tensors.
#![allow(dead_code)] // Each test binary uses a different part of this module.

use inalab_core::time::US;
use inalab_core::wire::{Header, SegKind};
use inalab_core::{splitmix64, Endpoint, Packet, Payload};
use inalab_testkit::{Fabric, Link};

/// 100 Gb/s NICs and 1 us from host to host (two links of 0.5 us through the switch).
pub const LINK: Link = Link { delay: US / 2, rate_bps: 100_000_000_000 };

/// Hosts `0..hosts` on one L3 switch, linked by [`LINK`].
pub fn star(hosts: usize) -> Fabric {
    Fabric::star(hosts, LINK)
}

pub fn is_data(p: &Packet) -> bool {
    matches!(&p.header, Header::Transport(h) if h.kind == SegKind::Data)
}

pub fn is_ack(p: &Packet) -> bool {
    matches!(&p.header, Header::Transport(h) if h.kind == SegKind::Ack)
}

/// Endpoints `port` on hosts `0..n`.
pub fn endpoints(n: usize, port: u16) -> Vec<Endpoint> {
    (0..n as u32).map(|host| Endpoint { host, port }).collect()
}

/// Rank `rank`'s i32 tensor: arbitrary values (sums wrap, exactly like the protocols').
pub fn i32_tensor(rank: usize, len: usize, salt: u64) -> Vec<i32> {
    (0..len).map(|i| splitmix64(salt ^ (rank as u64) << 40 ^ i as u64) as i32).collect()
}

/// Rank `rank`'s f32 tensor: integers below 2^12, so sums of up to 4096 of them are exact
/// in any order.
pub fn f32_tensor(rank: usize, len: usize, salt: u64) -> Vec<f32> {
    (0..len).map(|i| (splitmix64(salt ^ (rank as u64) << 40 ^ i as u64) % 4096) as f32 - 2048.0).collect()
}

/// Element-wise sum of tensors (wrapping for i32).
pub fn sum(tensors: &[Payload]) -> Payload {
    let mut acc = tensors[0].zeros_like(tensors[0].len());
    for t in tensors {
        acc.add_at(0, t);
    }
    acc
}
