//! DSA's Fig. 3 walk-through (spec T13) with the real switch program and parameter server,
//! packets carried by hand: job 1 has four workers, W3 and W4 the stragglers; job 2 has two
//! and a higher priority. Its g5 evicts g1 + g2 to PS1, g6 completes job 2 on the switch, g3
//! and g4 re-reserve the aggregator, PS1's reminder takes them out, and PS1's ACK carries
//! g1 + g2 + g3 + g4 to job 1's workers.

use inalab_core::time::MS;
use inalab_core::wire::{DsaHeader, DsaKind, Header};
use inalab_core::{Admission, Endpoint, HostProtocol, Packet, Payload, SwitchAction, SwitchProgram};
use inalab_host::{AimdConfig, DsaConfig, DsaServer};
use inalab_switch::{DsaIndex, DsaPolicy, DsaSwitch, DsaSwitchConfig, DsaSwitchJob};
use inalab_testkit::IdleCtx;

const CTX: IdleCtx = IdleCtx { node: 100, ports: 16 };

fn ep(host: u32) -> Endpoint {
    Endpoint { host, port: 1 }
}

#[allow(clippy::too_many_arguments)]
fn grad(job: u16, psn: u32, rank: u32, fan_in: u8, priority: u32, src: u32, ps: Endpoint, v: i32) -> Packet {
    let h = DsaHeader { job, psn, bitmap: 1 << rank, priority, fan_in, kind: DsaKind::Grad, flags: 0 };
    let mut p = Packet::new(src, 1, ps.host, ps.port, 306, Header::Dsa(h));
    p.payload = Some(Box::new(Payload::I32(vec![v; 62])));
    p
}

fn to_switch(s: &mut DsaSwitch, now: u64, p: Packet) -> Vec<Packet> {
    let mut out = vec![];
    s.on_packet(now, &CTX, 0, p, &mut out);
    out.into_iter()
        .filter_map(|a| match a {
            SwitchAction::Route { pkt } | SwitchAction::Forward { pkt, .. } => Some(pkt),
            _ => None,
        })
        .collect()
}

fn hdr(p: &Packet) -> DsaHeader {
    match p.header {
        Header::Dsa(h) => h,
        _ => panic!("not DSA"),
    }
}

fn value(p: &Packet) -> i32 {
    match p.payload.as_deref() {
        Some(Payload::I32(v)) => v[0],
        _ => panic!("no values"),
    }
}

#[test]
fn fig3_preemption_and_the_reminder() {
    let (mut sw, mut ps, ps1, ps2) = two_jobs();
    // One aggregator: every key shares it. (1) (2) g1, g2 reserve it for job 1.
    assert!(to_switch(&mut sw, 0, grad(1, 0, 0, 4, 100, 1, ps1, 1)).is_empty());
    assert!(to_switch(&mut sw, 1, grad(1, 0, 1, 4, 100, 2, ps1, 2)).is_empty());
    // (3) (4) g5 of job 2 has the higher priority: g1 + g2 go to PS1 as an eviction.
    let evicted = to_switch(&mut sw, 2, grad(2, 0, 0, 2, 300, 5, ps2, 50));
    assert_eq!(evicted.len(), 1);
    assert_eq!((evicted[0].dst, hdr(&evicted[0]).kind, hdr(&evicted[0]).bitmap, value(&evicted[0])), (ps1.host, DsaKind::Evict, 0b11, 3));
    ps.handle_packet(3, evicted.into_iter().next().unwrap());
    // (5) (6) g6 completes job 2 on the switch: multicast to W5 and W6, the aggregator freed.
    let acks = to_switch(&mut sw, 4, grad(2, 0, 1, 2, 300, 6, ps2, 60));
    assert_eq!(acks.iter().map(|p| (p.dst, hdr(p).kind, value(p))).collect::<Vec<_>>(), vec![(5, DsaKind::Ack, 110), (6, DsaKind::Ack, 110)]);
    assert_eq!(sw.aggregators_in_use(), 0);
    // (7) (8) the stragglers' g3, g4 re-reserve it: the task is split between switch and PS.
    assert!(to_switch(&mut sw, 5, grad(1, 0, 2, 4, 100, 3, ps1, 3)).is_empty());
    assert!(to_switch(&mut sw, 6, grad(1, 0, 3, 4, 100, 4, ps1, 4)).is_empty());
    assert_eq!(sw.aggregators_in_use(), 1);
    assert!(std::iter::from_fn(|| ps.poll_transmit(6)).next().is_none(), "PS1 waits for its timeout");
    // (9) PS1's entry times out: REMIND_SW (through the switch, which answers with g3 + g4)
    // and FETCHes to W3 and W4, which the test drops (the switch's answer suffices).
    let t = ps.poll_timeout().expect("the entry's timer");
    assert_eq!(t, 3 + MS);
    ps.handle_timeout(t);
    let sent: Vec<Packet> = std::iter::from_fn(|| ps.poll_transmit(t)).collect();
    assert_eq!(sent.iter().map(|p| hdr(p).kind).collect::<Vec<_>>(), vec![DsaKind::RemindSw, DsaKind::Fetch, DsaKind::Fetch]);
    let reply = to_switch(&mut sw, t + 1, sent.into_iter().next().unwrap());
    assert_eq!((reply[0].dst, hdr(&reply[0]).kind, hdr(&reply[0]).bitmap, value(&reply[0])), (ps1.host, DsaKind::RemindSwResp, 0b1100, 7));
    assert_eq!(sw.aggregators_in_use(), 0);
    ps.handle_packet(t + 2, reply.into_iter().next().unwrap());
    // (10) PS1 has all four: one ACK, which the switch multicasts to job 1's workers.
    let ack: Vec<Packet> = std::iter::from_fn(|| ps.poll_transmit(t + 2)).collect();
    assert_eq!(ack.len(), 1);
    let copies = to_switch(&mut sw, t + 3, ack.into_iter().next().unwrap());
    assert_eq!(copies.iter().map(|p| (p.dst, hdr(p).bitmap, value(p))).collect::<Vec<_>>(), (1..=4).map(|w| (w, 0b1111, 10)).collect::<Vec<_>>());
    assert_eq!(ps.pending(), 0);
    assert!(ps.poll_timeout().is_none(), "no timer left");
}

/// Job 1 (4 workers, PS1) and job 2 (2 workers, PS2) on a one-aggregator switch.
fn two_jobs() -> (DsaSwitch, DsaServer, Endpoint, Endpoint) {
    let (ps1, ps2) = (Endpoint { host: 50, port: 9 }, Endpoint { host: 51, port: 9 });
    let job1: Vec<Endpoint> = (1..=4).map(ep).collect();
    let mut sw = DsaSwitch::new(DsaSwitchConfig { aggregators: 1, seed: 1 });
    for (id, ps, workers) in [(1u32, ps1, job1.clone()), (2, ps2, (5..=6).map(ep).collect())] {
        sw.admit(id, Admission::new(DsaSwitchJob { ps, workers, policy: DsaPolicy::Dsa, ps_ack_frees: true, index: DsaIndex::Hash })).unwrap();
    }
    let cfg = DsaConfig { job: 1, workers: job1, ps: ps1, header_bytes: 58, aimd: AimdConfig::default(), min_rto_ps: MS, retx_before_notify: 3, multicast: true, max_psn_span: None, moves: None };
    (sw, DsaServer::new(cfg), ps1, ps2)
}

#[test]
fn t6_when_the_rest_also_loses_the_ps_completes_without_a_reminder() {
    let (mut sw, mut ps, ps1, ps2) = two_jobs();
    to_switch(&mut sw, 0, grad(1, 0, 0, 4, 100, 1, ps1, 1));
    let evicted = to_switch(&mut sw, 1, grad(2, 0, 0, 2, 1000, 5, ps2, 50));
    ps.handle_packet(2, evicted.into_iter().next().unwrap());
    // W2..W4 meet job 2's higher-priority aggregator and lose: each goes on to PS1.
    for (rank, v) in [(1, 2), (2, 3), (3, 4)] {
        let out = to_switch(&mut sw, 3, grad(1, 0, rank, 4, 100, rank + 1, ps1, v));
        assert_eq!((out[0].dst, hdr(&out[0]).kind), (ps1.host, DsaKind::Grad));
        ps.handle_packet(4, out.into_iter().next().unwrap());
    }
    let ack: Vec<Packet> = std::iter::from_fn(|| ps.poll_transmit(4)).collect();
    assert_eq!((ack.len(), hdr(&ack[0]).kind, value(&ack[0])), (1, DsaKind::Ack, 10));
    let c: std::collections::HashMap<_, _> = ps.counters().into_iter().collect();
    assert_eq!((c["reminders"], c["completed"], ps.pending()), (0, 1, 0));
}

#[test]
fn t11_a_leaked_aggregator_yields_after_downgrades_and_its_eviction_is_dropped() {
    // Job 1 finished PSN 0 on the switch; a late retransmission of W1 reserves the aggregator
    // again, where it can never fill (a leak). Job 2's low-priority packets lose and halve it
    // until one wins; the leak's eviction reaches PS1, which asks the workers (the RETX flag
    // travels with it), and their RESULT replies retire the entry.
    let (mut sw, mut ps, ps1, ps2) = two_jobs();
    for rank in 0..4 {
        to_switch(&mut sw, 0, grad(1, 0, rank, 4, 100, rank + 1, ps1, 1));
    }
    assert_eq!(sw.aggregators_in_use(), 0);
    let mut late = grad(1, 0, 0, 4, 100, 1, ps1, 1);
    if let Header::Dsa(h) = &mut late.header {
        h.flags |= DsaHeader::FLAG_RETX;
    }
    assert!(to_switch(&mut sw, 10, late).is_empty());
    assert_eq!(sw.aggregators_in_use(), 1, "the leak");
    // 100 -> 50 -> 25 -> 12 -> 6 -> 3: five losses at priority 5, the sixth wins.
    let mut losses = 0;
    let evicted = loop {
        let out = to_switch(&mut sw, 20, grad(2, 0, 0, 2, 5, 5, ps2, 7));
        if hdr(&out[0]).kind == DsaKind::Evict {
            break out.into_iter().next().unwrap();
        }
        losses += 1;
        assert!(losses < 32, "a leak yields after at most 32 halvings");
    };
    assert_eq!(losses, 5);
    assert!(hdr(&evicted).has(DsaHeader::FLAG_RETX));
    ps.handle_packet(21, evicted);
    let asked: Vec<Packet> = std::iter::from_fn(|| ps.poll_transmit(21)).collect();
    assert_eq!(asked.iter().filter(|p| hdr(p).kind == DsaKind::Fetch).count(), 3, "at once, not an RTO later");
    let full = DsaHeader { job: 1, psn: 0, bitmap: 0b1111, priority: 100, fan_in: 4, kind: DsaKind::FetchResp, flags: DsaHeader::FLAG_RESULT };
    let mut result = Packet::new(2, 1, ps1.host, ps1.port, 306, Header::Dsa(full));
    result.payload = Some(Box::new(Payload::I32(vec![4; 62])));
    ps.handle_packet(22, result);
    assert_eq!(ps.pending(), 0);
}
