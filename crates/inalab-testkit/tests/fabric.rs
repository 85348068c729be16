//! The fabric itself: numbering, routing, timing, filters, timers and conservation, with toy
//! protocols (a pinger, an alarm) and toy switch programs.

use inalab_core::time::{serialization, Time, MS, NS, US};
use inalab_core::wire::Header;
use inalab_core::{
    AppRequest, Endpoint, HostEvent, HostProtocol, NodeId, Packet, Payload, PortId, SwitchAction, SwitchCtx,
    SwitchProgram, TimerToken,
};
use inalab_testkit::{Fabric, Hop, Link, Links, Rule};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

const LINK: Link = Link { delay: US, rate_bps: 100_000_000_000 };

fn ser(bytes: u64) -> Time {
    serialization(bytes, LINK.rate_bps)
}

fn ep(host: NodeId) -> Endpoint {
    Endpoint { host, port: 1 }
}

/// `Send { id, dst, bytes }` becomes one raw packet of `bytes` bytes carrying `id` (done
/// as it leaves); an arriving packet becomes `Received { id, from, bytes }`.
struct Pinger {
    local: Endpoint,
    out: VecDeque<Packet>,
    events: VecDeque<HostEvent>,
}

impl Pinger {
    fn on(local: Endpoint) -> Box<dyn HostProtocol> {
        Box::new(Pinger { local, out: VecDeque::new(), events: VecDeque::new() })
    }
}

impl HostProtocol for Pinger {
    fn endpoint(&self) -> Endpoint {
        self.local
    }
    fn submit(&mut self, now: Time, req: AppRequest) {
        let AppRequest::Send { id, dst, bytes } = req else { panic!("send only") };
        let l = self.local;
        let mut pkt = Packet::new(l.host, l.port, dst.host, dst.port, bytes as u32, Header::Raw);
        pkt.payload = Some(Box::new(Payload::I32(vec![id as i32])));
        pkt.created = now;
        self.out.push_back(pkt);
    }
    fn handle_packet(&mut self, _now: Time, pkt: Packet) {
        let Some(Payload::I32(v)) = pkt.payload.as_deref() else { panic!("no id") };
        let from = Endpoint { host: pkt.src, port: pkt.src_port };
        self.events.push_back(HostEvent::Received { id: v[0] as u64, from, bytes: pkt.size as u64 });
    }
    fn handle_timeout(&mut self, _now: Time) {}
    fn poll_transmit(&mut self, _now: Time) -> Option<Packet> {
        let pkt = self.out.pop_front()?;
        let Some(Payload::I32(v)) = pkt.payload.as_deref() else { unreachable!() };
        self.events.push_back(HostEvent::Done { id: v[0] as u64, data: None });
        Some(pkt)
    }
    fn poll_timeout(&self) -> Option<Time> {
        None
    }
    fn poll_event(&mut self) -> Option<HostEvent> {
        self.events.pop_front()
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![("queued", self.out.len() as u64)]
    }
}

/// (id, time) of the `Received` events of `at`, in order.
fn arrivals(f: &Fabric, at: Endpoint) -> Vec<(u64, Time)> {
    f.timed_events(at)
        .iter()
        .filter_map(|(t, e)| match e {
            HostEvent::Received { id, .. } => Some((*id, *t)),
            _ => None,
        })
        .collect()
}

fn send(f: &mut Fabric, from: Endpoint, to: Endpoint, id: u64, bytes: u64) {
    f.submit(from, AppRequest::Send { id, dst: to, bytes });
}

/// A star of `n` pingers on port 1.
fn pingers(n: usize, link: Link) -> Fabric {
    let mut f = Fabric::star(n, link);
    for h in f.hosts() {
        f.add(Pinger::on(ep(h)));
    }
    f
}

#[test]
fn star_timing_nic_pacing_and_switch_queues() {
    let mut f = pingers(3, LINK);
    assert_eq!((f.hosts(), f.switches(), f.tor(2)), (0..3, 3..4, 3));
    send(&mut f, ep(0), ep(2), 1, 1500);
    send(&mut f, ep(0), ep(2), 2, 1000);
    send(&mut f, ep(1), ep(2), 3, 1500);
    assert!(f.run(MS));
    // Host 0's NIC paces its two packets; the switch is cut-through, so 1 reaches host 2
    // after one serialization and two delays. Host 1's packet reaches the switch at the same
    // time as 1 and queues behind it, and 2 queues behind 3.
    let one = ser(1500) + 2 * US;
    assert_eq!(arrivals(&f, ep(2)), vec![(1, one), (3, one + ser(1500)), (2, one + ser(1500) + ser(1000))]);
    // Senders are done as their packets leave (at once: the NIC is free when polled).
    assert_eq!(f.timed_events(ep(0)).iter().map(|e| e.0).collect::<Vec<_>>(), vec![0, ser(1500)]);
    assert_eq!(f.now(), one + ser(1500) + ser(1000));
    let s = f.stats();
    assert_eq!((s.sent.packets, s.sent.bytes, s.delivered.packets, s.dropped.packets), (3, 4000, 3, 0));
    assert_eq!((s.into_programs.packets, s.out_of_programs.packets, s.consumed()), (3, 3, (0, 0)));
    f.check_conservation().unwrap();
}

#[test]
fn leaf_spine_numbering_and_shortest_paths() {
    let mut f = Fabric::leaf_spine(3, 2, 2, LINK);
    // Hosts 0..6, leaves 6, 7, 8, spines 9, 10.
    assert_eq!((f.hosts(), f.switches()), (0..6, 6..11));
    assert_eq!((0..6).map(|h| f.tor(h)).collect::<Vec<_>>(), vec![6, 6, 7, 7, 8, 8]);
    for h in f.hosts() {
        f.add(Pinger::on(ep(h)));
    }
    let hops = Rc::new(RefCell::new(Vec::new()));
    let log = hops.clone();
    let all = f.tap(Links::All, move |hop, p| {
        let Some(Payload::I32(v)) = p.payload.as_deref() else { unreachable!() };
        log.borrow_mut().push((v[0], hop));
    });
    send(&mut f, ep(0), ep(1), 1, 100); // same leaf
    assert!(f.run(MS));
    send(&mut f, ep(0), ep(5), 2, 100); // across a spine
    assert!(f.run(MS));
    let path = |id| hops.borrow().iter().filter(|(i, _)| *i == id).map(|(_, h)| (h.from, h.to)).collect::<Vec<_>>();
    assert_eq!(path(1), vec![(0, 6), (6, 1)]);
    let across = path(2);
    assert_eq!(across.len(), 4, "{across:?}");
    assert_eq!((across[0], across[1].0, across[2].1, across[3]), ((0, 6), 6, 8, (8, 5)));
    assert!([9, 10].contains(&across[1].1) && across[2].0 == across[1].1);
    assert_eq!(f.hits(all), 6);
    // Unloaded, four links: one serialization (cut-through) and four delays.
    let t0 = f.timed_events(ep(0))[1].0;
    assert_eq!(arrivals(&f, ep(5)), vec![(2, t0 + ser(100) + 4 * US)]);
    // Flows spread over both spines (one path per flow).
    hops.borrow_mut().clear();
    for src in 0..2 {
        for k in 0..8 {
            let port = 10 + 10 * src as u16 + k;
            let (from, to) = (Endpoint { host: src, port }, Endpoint { host: 4, port });
            f.add(Pinger::on(from));
            f.add(Pinger::on(to));
            send(&mut f, from, to, port as u64, 64);
        }
    }
    assert!(f.run(MS));
    let spines: std::collections::BTreeSet<NodeId> = hops.borrow().iter().filter(|(_, h)| h.from == 6).map(|(_, h)| h.to).collect();
    assert_eq!(spines.into_iter().collect::<Vec<_>>(), vec![9, 10]);
    f.check_conservation().unwrap();
}

/// Sends `n` packets from host 0 to host 1 under the given filters; returns the ids that
/// arrived, in order, and the fabric.
fn stream(n: u64, seed: u64, filters: impl FnOnce(&mut Fabric)) -> (Vec<u64>, Fabric) {
    let mut f = pingers(2, LINK);
    f.seed(seed);
    filters(&mut f);
    for id in 0..n {
        send(&mut f, ep(0), ep(1), id, 200 + id % 7);
    }
    assert!(f.run(MS));
    f.check_conservation().unwrap();
    (arrivals(&f, ep(1)).into_iter().map(|(id, _)| id).collect(), f)
}

#[test]
fn random_loss_is_seeded_and_deterministic() {
    let lossy = |f: &mut Fabric| {
        f.lose(Links::FromHosts, Rule::chance(0.3));
    };
    let (a, fa) = stream(1000, 1, lossy);
    let (b, _) = stream(1000, 1, lossy);
    let (c, _) = stream(1000, 2, lossy);
    assert_eq!(a, b, "same seed, same losses");
    assert_ne!(a, c, "another seed, other losses");
    let lost = 1000 - a.len() as u64;
    assert!((250..350).contains(&lost), "{lost} of 1000 at 30 %");
    assert_eq!(fa.stats().drops.get("loss"), Some(&lost));
    // A filter's stream does not depend on what the filters before it drew.
    let (d, _) = stream(1000, 1, |f| {
        f.mark(Links::All, Rule::chance(0.5));
        f.lose(Links::FromHosts, Rule::chance(0.3));
    });
    assert_ne!(a, d, "the loss filter moved to position 1: another stream");
    assert_eq!(stream(1000, 1, |f| {
        f.lose(Links::FromHosts, Rule::chance(0.3));
        f.mark(Links::All, Rule::chance(0.5));
    }).0, a, "a filter added behind it changes nothing");
    // Edge probabilities.
    assert_eq!(stream(50, 3, |f| {
        f.lose(Links::All, Rule::chance(0.0));
    }).0.len(), 50);
    assert!(stream(50, 3, |f| {
        f.lose(Links::ToHosts, Rule::chance(1.0));
    }).0.is_empty());
}

#[test]
fn nth_only_and_when_pick_exactly() {
    let small = |p: &Packet| p.size < 203;
    let (got, f) = stream(30, 0, |f| {
        // Sizes 200..207 repeat: "small" packets are ids 0, 1, 2, 7, 8, 9, 14, ...
        f.lose(Links::FromHosts, Rule::nth([0, 4]).only(small));
        f.lose(Links::ToHosts, Rule::when(|p| p.size == 206));
    });
    let lost: Vec<u64> = (0..30).filter(|id| !got.contains(id)).collect();
    assert_eq!(lost, vec![0, 6, 8, 13, 20, 27]);
    assert_eq!(f.stats().drops["loss"], 6);
}

#[test]
fn marks_and_taps_see_packets_once_per_link() {
    let marked = Rc::new(RefCell::new(Vec::new()));
    let seen = marked.clone();
    let (got, f) = stream(10, 0, |f| {
        f.mark(Links::FromHosts, Rule::when(|p| p.size % 2 == 0));
        f.tap(Links::ToHosts, move |hop: Hop, p| {
            assert_eq!(hop, Hop { from: 2, to: 1 });
            seen.borrow_mut().push(p.ecn);
        });
    });
    assert_eq!(got.len(), 10);
    let want: Vec<bool> = (0..10u64).map(|id| (200 + id % 7) % 2 == 0).collect();
    assert_eq!(*marked.borrow(), want);
    assert_eq!(f.stats().delivered.packets, 10);
}

#[test]
fn reorder_holds_packets_back() {
    let (got, f) = stream(6, 0, |f| {
        f.reorder(Links::FromHosts, Rule::nth([1]), 500 * NS);
    });
    // Packets leave every ~17 ns, so the held one arrives after all the others.
    assert_eq!(got, vec![0, 2, 3, 4, 5, 1]);
    assert_eq!(f.stats().sent.packets, 6);
}

#[test]
fn run_stops_at_the_limit_and_resumes() {
    let mut f = pingers(2, LINK);
    for id in 0..3 {
        send(&mut f, ep(0), ep(1), id, 1500);
    }
    assert!(!f.run(US), "the first packet arrives after 2 us");
    assert!(f.now() <= US);
    // Mid-run: packets in flight balance the books.
    assert_eq!(f.in_flight().packets, 3);
    f.check_conservation().unwrap();
    assert!(f.run(MS));
    assert_eq!(f.in_flight().packets, 0);
    assert_eq!(arrivals(&f, ep(1)).len(), 3);
}

#[test]
fn co_located_endpoints_skip_nic_and_filters_and_unknown_ports_are_dropped() {
    let mut f = pingers(2, LINK);
    let side = f.add(Pinger::on(Endpoint { host: 0, port: 2 }));
    let loss = f.lose(Links::All, Rule::chance(1.0));
    send(&mut f, ep(0), side, 1, 1500);
    assert!(f.run(MS));
    assert_eq!(arrivals(&f, side), vec![(1, 0)]);
    assert_eq!(f.hits(loss), 0);
    let mut f = pingers(2, LINK);
    send(&mut f, ep(0), Endpoint { host: 1, port: 7 }, 1, 100);
    send(&mut f, ep(0), Endpoint { host: 99, port: 1 }, 2, 100);
    assert!(f.run(MS));
    let drops: Vec<_> = f.stats().drops.iter().map(|(r, n)| (*r, *n)).collect();
    assert_eq!(drops, vec![("no endpoint", 1), ("no route", 1)]);
    f.check_conservation().unwrap();
}

/// `Allreduce { id, bytes }` sets an alarm `bytes` ps from now (a later request replaces
/// it); `Done { id }` when it rings.
struct Alarm {
    local: Endpoint,
    at: Option<(Time, u64)>,
    events: VecDeque<HostEvent>,
}

impl HostProtocol for Alarm {
    fn endpoint(&self) -> Endpoint {
        self.local
    }
    fn submit(&mut self, now: Time, req: AppRequest) {
        let AppRequest::Allreduce { id, bytes, .. } = req else { panic!() };
        self.at = Some((now + bytes, id));
    }
    fn handle_packet(&mut self, _now: Time, _pkt: Packet) {}
    fn handle_timeout(&mut self, now: Time) {
        let (at, id) = self.at.take().expect("armed");
        assert!(now >= at, "woken at {now} for {at}");
        self.events.push_back(HostEvent::Done { id, data: None });
    }
    fn poll_transmit(&mut self, _now: Time) -> Option<Packet> {
        None
    }
    fn poll_timeout(&self) -> Option<Time> {
        self.at.map(|(t, _)| t)
    }
    fn poll_event(&mut self) -> Option<HostEvent> {
        self.events.pop_front()
    }
}

#[test]
fn host_timers_fire_once_and_rearming_replaces_them() {
    let mut f = Fabric::star(1, LINK);
    let a = f.add(Box::new(Alarm { local: ep(0), at: None, events: VecDeque::new() }));
    f.submit(a, AppRequest::allreduce(1, 5 * US, None));
    f.submit(a, AppRequest::allreduce(2, 3 * US, None));
    assert!(f.run(MS));
    // The replaced deadline left no stale event: the fabric went quiet when 2 rang.
    assert_eq!(f.now(), 3 * US);
    assert!(matches!(f.timed_events(a), [(t, HostEvent::Done { id: 2, .. })] if *t == 3 * US));
}

/// What a program saw of its `SwitchCtx`: (node, ports, ingress port, peer on that port).
type CtxLog = Arc<Mutex<Vec<(NodeId, usize, PortId, NodeId)>>>;

/// Sums the `I32` payloads of packets for host `sink` in pairs: the first is held, the
/// second triggers a timer `wait` later that multicasts the sum to ports `to`. Odd-sized
/// packets are dropped. Records what `ctx` shows.
struct PairSum {
    sink: NodeId,
    to: Vec<PortId>,
    wait: Time,
    held: Option<Packet>,
    ready: Vec<Packet>,
    seen: CtxLog,
}

impl SwitchProgram for PairSum {
    fn on_packet(&mut self, now: Time, ctx: &dyn SwitchCtx, in_port: PortId, pkt: Packet, out: &mut Vec<SwitchAction>) {
        self.seen.lock().unwrap().push((ctx.node(), ctx.num_ports(), in_port, ctx.peer(in_port)));
        if pkt.dst != self.sink {
            return out.push(SwitchAction::Route { pkt });
        }
        if pkt.size % 2 == 1 {
            return out.push(SwitchAction::Drop { pkt, reason: "odd" });
        }
        match self.held.take() {
            None => self.held = Some(pkt),
            Some(mut first) => {
                first.payload.as_mut().unwrap().add_at(0, pkt.payload.as_deref().unwrap());
                self.ready.push(first);
                out.push(SwitchAction::SetTimer { at: now + self.wait, token: self.ready.len() as TimerToken - 1 });
            }
        }
    }
    fn on_timer(&mut self, _now: Time, _ctx: &dyn SwitchCtx, token: TimerToken, out: &mut Vec<SwitchAction>) {
        let pkt = self.ready[token as usize].clone();
        out.push(SwitchAction::Multicast { ports: self.to.clone(), pkt });
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![("sums", self.ready.len() as u64)]
    }
}

#[test]
fn programs_timers_multicast_and_conservation() {
    let mut f = pingers(4, LINK);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sw = f.tor(0);
    f.install(sw, PairSum { sink: 3, to: vec![1, 2], wait: 10 * US, held: None, ready: Vec::new(), seen: seen.clone() });
    send(&mut f, ep(0), ep(3), 5, 100);
    send(&mut f, ep(1), ep(3), 7, 100);
    send(&mut f, ep(2), ep(3), 9, 101); // dropped by the program
    send(&mut f, ep(2), ep(0), 11, 100); // routed
    assert!(!f.run(5 * US));
    // Two packets consumed so far, the sum not yet sent.
    assert_eq!(f.stats().consumed(), (2, 200));
    f.check_conservation().unwrap();
    assert!(f.run(MS));
    let sum = 5 + 7;
    // Up one link, the wait, down one link.
    assert_eq!(arrivals(&f, ep(1)), vec![(sum, US + ser(100) + 10 * US + US)]);
    assert_eq!(arrivals(&f, ep(2)).len(), 1);
    assert!(arrivals(&f, ep(3)).is_empty());
    assert_eq!(arrivals(&f, ep(0)).into_iter().map(|a| a.0).collect::<Vec<_>>(), vec![11]);
    assert_eq!(f.switch_counter(sw, "sums"), 1);
    assert_eq!(f.program::<PairSum>(sw).ready.len(), 1);
    f.program_mut::<PairSum>(sw).wait = 0;
    let s = f.stats();
    assert_eq!((s.sent.packets, s.into_programs.packets, s.out_of_programs.packets, s.delivered.packets), (4, 4, 4, 3));
    assert_eq!(s.drops.get("odd"), Some(&1));
    // Taken in: 100 + 100 + 101 + 100; put out: 101 (dropped) + 100 (routed) + 2 x 100.
    assert_eq!(s.consumed(), (0, 0));
    f.check_conservation().unwrap();
    let ctx = seen.lock().unwrap();
    assert_eq!(ctx[0], (4, 4, 0, 0), "node 4, ports facing hosts 0..4");
    assert!(ctx.iter().all(|&(_, _, port, peer)| port as NodeId == peer));
}

#[test]
#[should_panic(expected = "does not run a")]
fn programs_are_handed_back_by_type_only() {
    let f = Fabric::star(1, LINK);
    f.program::<PairSum>(1);
}

#[test]
fn instant_links_take_no_time() {
    let mut f = pingers(2, Link::INSTANT);
    for id in 0..100 {
        send(&mut f, ep(0), ep(1), id, 1500);
    }
    assert!(f.run(0));
    assert_eq!(arrivals(&f, ep(1)).len(), 100);
    assert_eq!(f.now(), 0);
    assert_eq!(f.total("queued"), 0);
    assert_eq!(f.counter(ep(0), "queued"), 0);
}
