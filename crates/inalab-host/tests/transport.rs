//! The reliable transport: delivery guarantees under loss, loss recovery, ECN, scheduling.

mod common;

use common::*;
use inalab_core::time::{Time, MS, S};
use inalab_core::wire::{Header, SegKind, TransportHeader};
use inalab_core::{AppRequest, Endpoint, HostEvent, HostProtocol, Packet, Payload};
use inalab_host::{AimdConfig, Transport, TransportConfig};
use inalab_testkit::{Fabric, Links, Rule};
use proptest::prelude::*;
use std::cell::Cell;
use std::collections::VecDeque;
use std::rc::Rc;

/// The values message `id` carries in payload mode.
fn values(id: u64, bytes: u64) -> Payload {
    Payload::I32((0..bytes / 4).map(|i| (id as i32).wrapping_mul(1_000_003) ^ i as i32).collect())
}

/// A host protocol around a bare transport: `Send` requests become messages (id = msg id),
/// deliveries become `Received` events (`Failed` if the payload is not the one sent).
struct MsgEndpoint {
    tr: Transport,
    payload: bool,
    events: VecDeque<HostEvent>,
    peer: Option<Endpoint>,
}

impl MsgEndpoint {
    fn boxed(host: u32, cfg: &TransportConfig, payload: bool) -> Box<dyn HostProtocol> {
        let tr = Transport::new(Endpoint { host, port: 1 }, cfg.clone()).unwrap();
        Box::new(MsgEndpoint { tr, payload, events: VecDeque::new(), peer: None })
    }
}

impl HostProtocol for MsgEndpoint {
    fn endpoint(&self) -> Endpoint {
        self.tr.local()
    }
    fn submit(&mut self, now: Time, req: AppRequest) {
        let AppRequest::Send { id, dst, bytes } = req else { panic!("send only") };
        self.peer.get_or_insert(dst);
        self.tr.send_message(now, dst, id, bytes, self.payload.then(|| values(id, bytes)));
    }
    fn handle_packet(&mut self, now: Time, pkt: Packet) {
        self.tr.handle_packet(now, pkt);
        while let Some(d) = self.tr.poll_delivered() {
            if self.payload && d.payload != Some(values(d.msg_id, d.bytes)) {
                self.events.push_back(HostEvent::Failed { id: d.msg_id, reason: "payload".into() });
            } else {
                self.events.push_back(HostEvent::Received { id: d.msg_id, from: d.from, bytes: d.bytes });
            }
        }
    }
    fn handle_timeout(&mut self, now: Time) {
        self.tr.handle_timeout(now)
    }
    fn poll_transmit(&mut self, now: Time) -> Option<Packet> {
        self.tr.poll_transmit(now)
    }
    fn poll_timeout(&self) -> Option<Time> {
        self.tr.poll_timeout()
    }
    fn poll_event(&mut self) -> Option<HostEvent> {
        self.events.pop_front()
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut c = self.tr.counters();
        c.push(("window", self.peer.and_then(|p| self.tr.window(p)).unwrap_or(0)));
        c
    }
}

fn ep(host: u32) -> Endpoint {
    Endpoint { host, port: 1 }
}

fn small_mss() -> TransportConfig {
    TransportConfig { mss: 256, ..TransportConfig::default() }
}

/// (id, from, bytes) of the messages endpoint `at` received, in order.
fn received(f: &Fabric, at: Endpoint) -> Vec<(u64, Endpoint, u64)> {
    f.events(at)
        .into_iter()
        .map(|e| match e {
            HostEvent::Received { id, from, bytes } => (id, from, bytes),
            other => panic!("unexpected {other:?}"),
        })
        .collect()
}

/// A fabric with a sender on host 0 and a receiver on host 1.
fn pair(cfg: &TransportConfig, payload: bool) -> Fabric {
    let mut f = star(2);
    f.add(MsgEndpoint::boxed(0, cfg, payload));
    f.add(MsgEndpoint::boxed(1, cfg, payload));
    f
}

fn send(f: &mut Fabric, from: u32, to: u32, id: u64, bytes: u64) {
    f.submit(ep(from), AppRequest::Send { id, dst: ep(to), bytes });
}

#[test]
fn delivers_in_order_once_without_loss() {
    let cfg = TransportConfig::default();
    let mut f = pair(&cfg, false);
    let sizes = [0u64, 1, 4, 1436, 1437, 5000, 100_001];
    for (id, &b) in sizes.iter().enumerate() {
        send(&mut f, 0, 1, id as u64, b);
    }
    assert!(f.run(S));
    let want: Vec<_> = sizes.iter().enumerate().map(|(id, &b)| (id as u64, ep(0), b)).collect();
    assert_eq!(received(&f, ep(1)), want);
    let segments: u64 = sizes.iter().map(|&b| b.div_ceil(1436).max(1)).sum();
    assert_eq!(f.counter(ep(0), "data_packets_sent"), segments);
    assert_eq!(f.counter(ep(0), "retransmissions"), 0);
    assert_eq!(f.counter(ep(1), "bytes_delivered"), sizes.iter().sum::<u64>());
    // Every data segment is acknowledged: as many packets back as forward.
    assert_eq!(f.stats().sent.packets, 2 * segments);
    f.check_conservation().unwrap();
}

#[test]
fn fast_retransmit_repairs_a_loss_without_timeout() {
    let mut f = pair(&small_mss(), true);
    f.lose(Links::FromHosts, Rule::nth([5]).only(is_data));
    // Counts the retransmissions that got through (the tap comes after the loss).
    let flagged = Rc::new(Cell::new(0));
    let seen = flagged.clone();
    f.tap(Links::FromHosts, move |_, p| {
        if matches!(&p.header, Header::Transport(h) if h.flags & TransportHeader::FLAG_RETRANSMIT != 0) {
            seen.set(seen.get() + 1);
        }
    });
    send(&mut f, 0, 1, 1, 40 * 256);
    assert!(f.run(S));
    assert_eq!(received(&f, ep(1)), vec![(1, ep(0), 40 * 256)]);
    assert_eq!(f.counter(ep(0), "retransmissions"), 1);
    assert_eq!(flagged.get(), 1);
    assert_eq!(f.counter(ep(0), "timeouts"), 0);
    assert!(f.counter(ep(0), "dup_acks") >= 3);
    // The loss halved the window once.
    assert!(f.counter(ep(0), "window") < 60_000);
}

#[test]
fn partial_ack_retransmits_the_next_hole() {
    let mut f = pair(&small_mss(), true);
    f.lose(Links::FromHosts, Rule::nth([5, 9, 20]).only(is_data));
    send(&mut f, 0, 1, 1, 40 * 256);
    assert!(f.run(S));
    assert_eq!(received(&f, ep(1)), vec![(1, ep(0), 40 * 256)]);
    assert_eq!(f.counter(ep(0), "retransmissions"), 3);
    assert_eq!(f.counter(ep(0), "timeouts"), 0);
}

#[test]
fn tail_loss_times_out_with_exponential_backoff() {
    let mut f = pair(&TransportConfig::default(), true);
    // The only segment and its first two retransmissions are lost.
    f.lose(Links::FromHosts, Rule::nth([0, 1, 2]).only(is_data));
    send(&mut f, 0, 1, 1, 400);
    assert!(f.run(S));
    assert_eq!(received(&f, ep(1)), vec![(1, ep(0), 400)]);
    assert_eq!(f.counter(ep(0), "timeouts"), 3);
    assert_eq!(f.counter(ep(0), "retransmissions"), 3);
    let at = f.timed_events(ep(1))[0].0;
    // Timeouts after 1, 2 and 4 ms.
    assert!((7 * MS..7 * MS + 10_000_000).contains(&at), "delivered at {at} ps");
}

#[test]
fn backoff_is_capped() {
    let cfg = TransportConfig { rto: MS, rto_max: 2 * MS, ..TransportConfig::default() };
    let mut f = pair(&cfg, false);
    f.lose(Links::FromHosts, Rule::nth([0, 1, 2, 3]).only(is_data));
    send(&mut f, 0, 1, 1, 400);
    assert!(f.run(S));
    let at = f.timed_events(ep(1))[0].0;
    // 1 + 2 + 2 + 2 ms.
    assert!((7 * MS..7 * MS + 10_000_000).contains(&at), "delivered at {at} ps");
}

#[test]
fn lost_acks_do_not_duplicate_messages() {
    let mut f = pair(&small_mss(), true);
    // Lose the last ACKs so the sender times out and resends data the receiver already has.
    f.lose(Links::FromHosts, Rule::nth(30..40).only(is_ack));
    send(&mut f, 0, 1, 1, 20 * 256);
    send(&mut f, 0, 1, 2, 20 * 256);
    assert!(f.run(S));
    assert_eq!(received(&f, ep(1)), vec![(1, ep(0), 5120), (2, ep(0), 5120)]);
    assert!(f.counter(ep(0), "timeouts") >= 1);
}

#[test]
fn ecn_echo_shrinks_the_window_and_clean_acks_grow_it() {
    let cfg = small_mss();
    let mut f = pair(&cfg, false);
    f.mark(Links::FromHosts, Rule::when(is_data));
    send(&mut f, 0, 1, 1, 400 * 256);
    assert!(f.run(S));
    assert_eq!(f.counter(ep(0), "ecn_echoes"), 400);
    assert!(f.counter(ep(0), "window") < 60_000 / 4, "window {}", f.counter(ep(0), "window"));

    let mut f = pair(&cfg, false);
    send(&mut f, 0, 1, 1, 400 * 256);
    assert!(f.run(S));
    assert_eq!(f.counter(ep(0), "ecn_echoes"), 0);
    // Slow start: one MTU per ACK.
    assert_eq!(f.counter(ep(0), "window"), 60_000 + 400 * 1500);
}

#[test]
fn window_limits_bytes_in_flight() {
    let aimd = AimdConfig { initial_window_bytes: 3_000, ..AimdConfig::default() };
    let mut a = Transport::new(ep(0), TransportConfig { aimd, ..TransportConfig::default() }).unwrap();
    let mut b = Transport::new(ep(1), TransportConfig::default()).unwrap();
    a.send_message(0, ep(1), 1, 10 * 1436, None);
    // Two 1500 B packets fill the 3000 B window.
    let sent: Vec<Packet> = std::iter::from_fn(|| a.poll_transmit(0)).collect();
    assert_eq!(sent.len(), 2);
    // One ACK frees one packet's room and grows the window by one MTU: two more fit.
    b.handle_packet(1, sent[0].clone());
    a.handle_packet(2, b.poll_transmit(1).unwrap());
    assert_eq!(std::iter::from_fn(|| a.poll_transmit(2)).count(), 2);
    assert_eq!(a.window(ep(1)), Some(4_500));
}

#[test]
fn acks_go_before_data_and_duplicates_are_reacked_not_redelivered() {
    let cfg = TransportConfig::default();
    let mut a = Transport::new(ep(0), cfg.clone()).unwrap();
    let mut b = Transport::new(ep(1), cfg).unwrap();
    a.send_message(0, ep(1), 7, 100, None);
    b.send_message(0, ep(0), 8, 100, None);
    let data = a.poll_transmit(0).unwrap();
    b.handle_packet(1, data.clone());
    b.handle_packet(2, data);
    let kinds: Vec<(SegKind, u32)> = std::iter::from_fn(|| b.poll_transmit(3))
        .map(|p| match p.header {
            Header::Transport(h) => (h.kind, h.seq),
            _ => panic!("raw"),
        })
        .collect();
    assert_eq!(kinds, vec![(SegKind::Ack, 1), (SegKind::Ack, 1), (SegKind::Data, 0)]);
    assert_eq!(b.poll_delivered().map(|d| d.msg_id), Some(7));
    assert_eq!(b.poll_delivered(), None);
}

#[test]
fn data_round_robins_over_peers() {
    let mut a = Transport::new(ep(0), small_mss()).unwrap();
    for peer in [3, 1, 2] {
        a.send_message(0, ep(peer), 1, 3 * 256, None);
    }
    let order: Vec<u32> = std::iter::from_fn(|| a.poll_transmit(0)).map(|p| p.dst).collect();
    assert_eq!(order, vec![1, 2, 3, 1, 2, 3, 1, 2, 3]);
    assert_eq!(a.poll_timeout(), Some(MS));
}

#[test]
fn round_robin_skips_peers_with_nothing_to_send_and_takes_new_peers_in_order() {
    let mut a = Transport::new(ep(0), small_mss()).unwrap();
    for (peer, segments) in [(5, 1), (2, 3), (9, 2)] {
        a.send_message(0, ep(peer), 1, segments * 256, None);
    }
    let mut order: Vec<u32> = (0..2).filter_map(|_| a.poll_transmit(0)).map(|p| p.dst).collect();
    // A peer that sorts before the one served last joins the round after the wrap.
    a.send_message(0, ep(1), 1, 2 * 256, None);
    order.extend(std::iter::from_fn(|| a.poll_transmit(0)).map(|p| p.dst));
    assert_eq!(order, vec![2, 5, 9, 1, 2, 9, 1, 2]);
}

#[test]
fn ecn_mark_is_echoed_and_packets_have_wire_sizes() {
    let cfg = TransportConfig::default();
    let mut a = Transport::new(ep(0), cfg.clone()).unwrap();
    let mut b = Transport::new(ep(1), cfg).unwrap();
    a.send_message(0, ep(1), 1, 2000, None);
    let mut p = a.poll_transmit(0).unwrap();
    assert_eq!(p.size, 1436 + 64);
    assert_eq!(a.poll_transmit(0).unwrap().size, 564 + 64);
    p.ecn = true;
    b.handle_packet(1, p);
    let ack = b.poll_transmit(1).unwrap();
    assert_eq!(ack.size, 64);
    assert!(matches!(ack.header, Header::Transport(h) if h.flags == TransportHeader::FLAG_ECN_ECHO));
    a.handle_packet(2, ack);
    assert_eq!(a.stats().ecn_echoes, 1);
    assert_eq!(a.window(ep(1)), Some(30_000));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Two senders to one receiver and one reverse flow, random data and ACK losses: every
    /// receiver gets every message exactly once, per connection in send order, intact.
    #[test]
    fn exactly_once_in_order_under_loss(
        sizes in proptest::collection::vec(0u64..3000, 1..6),
        drop_data in proptest::collection::vec(0u64..80, 0..12),
        drop_acks in proptest::collection::vec(0u64..80, 0..12),
    ) {
        let cfg = small_mss();
        let mut f = star(3);
        for h in 0..3 {
            f.add(MsgEndpoint::boxed(h, &cfg, true));
        }
        f.lose(Links::FromHosts, Rule::nth(drop_data).only(is_data));
        f.lose(Links::FromHosts, Rule::nth(drop_acks).only(is_ack));
        let sizes: Vec<u64> = sizes.iter().map(|s| s * 4).collect();
        for (id, &b) in sizes.iter().enumerate() {
            send(&mut f, 0, 2, id as u64, b);
            send(&mut f, 1, 2, 100 + id as u64, b);
            send(&mut f, 2, 0, 200 + id as u64, b);
        }
        prop_assert!(f.run(10 * S));
        let at2 = received(&f, ep(2));
        for (from, base) in [(ep(0), 0), (ep(1), 100)] {
            let got: Vec<_> = at2.iter().filter(|m| m.1 == from).map(|m| (m.0, m.2)).collect();
            let want: Vec<_> = sizes.iter().enumerate().map(|(i, &b)| (base + i as u64, b)).collect();
            prop_assert_eq!(got, want);
        }
        let want: Vec<_> = sizes.iter().enumerate().map(|(i, &b)| (200 + i as u64, ep(2), b)).collect();
        prop_assert_eq!(received(&f, ep(0)), want);
        prop_assert!(received(&f, ep(1)).is_empty());
        prop_assert_eq!(f.check_conservation(), Ok(()));
    }
}
