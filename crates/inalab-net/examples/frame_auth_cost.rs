//! What authenticating frames costs per datagram (issue #12), measured side by side in one
//! run: the work the switch does per received and sent frame without tags (decode, encode)
//! against the same work plus checking and making the tag, for SwitchML's and ATP's frames.
//!
//!     cargo run --release -p inalab-net --example frame_auth_cost
//!
//! Interleaved rounds; the median of 9 rounds per variant is printed, in ns per frame, with the
//! ratio. Compare with the switch's whole CPU cost per datagram (about 770 ns, docs/performance.md).

use inalab_core::frame;
use inalab_core::wire::{AtpHeader, Header, SwitchMlHeader};
use inalab_core::{Packet, Payload};
use inalab_net::auth::{random_key, FrameMac, Link, ANY};
use std::hint::black_box;
use std::time::Instant;

fn packet(header: Header, values: usize) -> Packet {
    let mut p = Packet::new(65537, 1, 1, 1, 0, header);
    p.payload = Some(Box::new(Payload::I32((0..values as i32).collect())));
    p
}

/// ns per frame of `n` rounds of receive (decode) and send (encode), tagged or not.
fn round(p: &Packet, mac: Option<&FrameMac>, n: usize) -> f64 {
    let mut wire = vec![];
    frame::encode(p, &mut wire);
    let link = Link { from: 1, to: ANY };
    if let Some(m) = mac {
        m.seal(&mut wire, 0, link, 1);
    }
    let mut out = Vec::with_capacity(512);
    let t = Instant::now();
    for _ in 0..n {
        let bytes = match mac {
            Some(m) => m.open(black_box(&wire), link).expect("a good tag").0,
            None => black_box(&wire[..]),
        };
        let pkt = frame::decode(bytes).expect("a good frame");
        out.clear();
        frame::encode(&pkt, &mut out);
        if let Some(m) = mac {
            m.seal(&mut out, 0, link, 2);
        }
        black_box(&out);
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    let mac = FrameMac::new(&random_key());
    let sml = SwitchMlHeader { job: 1, slot: 3, chunk: 7, wid: 1, ver: 0, flags: 0, exp: 0 };
    let atp = AtpHeader { job: 1, seq: 9, agg_index: 4, bitmap0: 1, bitmap1: 1, fan_in0: 2, fan_in1: 1, esi: 0, flags: 0 };
    for (name, p) in [("switchml (32 values)", packet(Header::SwitchMl(sml), 32)), ("atp (62 values)", packet(Header::Atp(atp), 62))] {
        let (mut plain, mut tagged) = (vec![], vec![]);
        for _ in 0..9 {
            plain.push(round(&p, None, 200_000));
            tagged.push(round(&p, Some(&mac), 200_000));
        }
        plain.sort_by(f64::total_cmp);
        tagged.sort_by(f64::total_cmp);
        let (a, b) = (plain[4], tagged[4]);
        println!("{name}: decode+encode {a:.0} ns, with tag check and tag {b:.0} ns, ratio {:.2}, tags add {:.0} ns per frame", b / a, b - a);
    }
}
