//! DSA's loss cases T2, T3, T4 and T8 (spec §2) with the real workers, switch program and
//! parameter server, on a hand-driven fabric: every packet crosses the switch, and a test
//! chooses which packet is lost on which hop. Each case checks the exact sums, the counters
//! that show the path the spec describes, and that nothing is left held.

use inalab_core::wire::{DsaHeader, DsaKind, Header};
use inalab_core::{Admission, AppRequest, Endpoint, HostEvent, HostProtocol, Packet, Payload, SwitchAction, SwitchProgram, TensorAttrs, Time};
use inalab_core::time::MS;
use inalab_host::{AimdConfig, DsaConfig, DsaServer, DsaWorker};
use inalab_switch::{DsaIndex, DsaPolicy, DsaSwitch, DsaSwitchConfig, DsaSwitchJob};
use inalab_testkit::IdleCtx;

const CTX: IdleCtx = IdleCtx { node: 100, ports: 16 };
const PS: Endpoint = Endpoint { host: 50, port: 9 };
const WORKERS: u32 = 4;
/// Job 2 exists only as packets a test injects (T8's preemptor): its workers are hosts 5, 6.
const PS2: Endpoint = Endpoint { host: 51, port: 9 };

/// Where a packet is when a test may lose it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hop {
    ToSwitch,
    FromSwitch,
}

struct Fabric {
    now: Time,
    sw: DsaSwitch,
    ps: DsaServer,
    workers: Vec<DsaWorker>,
    results: Vec<Option<Vec<i32>>>,
    /// Packets sent, by kind and hop, before any loss.
    seen: Vec<(DsaKind, Hop, u32)>,
    lost: u32,
}

fn kind(p: &Packet) -> DsaKind {
    match p.header {
        Header::Dsa(h) => h.kind,
        _ => panic!("not DSA"),
    }
}

impl Fabric {
    /// Job 1: four workers (hosts 1-4), fragments of 62 values each, on a switch of
    /// `aggregators` (consecutive index); job 2 admitted with a higher priority for T8.
    fn new(aggregators: u32) -> Fabric {
        let workers: Vec<Endpoint> = (1..=WORKERS).map(|host| Endpoint { host, port: 1 }).collect();
        let mut sw = DsaSwitch::new(DsaSwitchConfig { aggregators, seed: 1 });
        let job = |ps, workers| DsaSwitchJob { ps, workers, policy: DsaPolicy::Dsa, ps_ack_frees: true, index: DsaIndex::Consecutive };
        sw.admit(1, Admission::new(job(PS, workers.clone()))).unwrap();
        sw.admit(2, Admission::new(job(PS2, (5..=6).map(|host| Endpoint { host, port: 1 }).collect()))).unwrap();
        let cfg = DsaConfig { job: 1, workers, ps: PS, header_bytes: 58, aimd: AimdConfig::default(), min_rto_ps: MS, retx_before_notify: 3, multicast: true, max_psn_span: None, moves: None };
        Fabric {
            now: 0,
            sw,
            ps: DsaServer::new(cfg.clone()),
            workers: (0..WORKERS).map(|r| DsaWorker::new(cfg.clone(), r)).collect(),
            results: vec![None; WORKERS as usize],
            seen: vec![],
            lost: 0,
        }
    }

    /// Worker r's tensor: `fragments` x 62 values, value i = 1000 r + i.
    fn input(r: u32, fragments: usize) -> Vec<i32> {
        (0..fragments * 62).map(|i| 1000 * r as i32 + i as i32).collect()
    }

    /// Runs every worker's allreduce of `fragments` fragments to the end (at most 100 ms of
    /// simulated time). `lose(packet, hop, n)` says whether to lose it (`n`: how many of this
    /// kind crossed this hop before); `inject(switch, now, packet, out)` runs before a packet
    /// reaches the switch, and what it makes the switch send goes out as the switch's own.
    fn run(&mut self, fragments: usize, mut lose: impl FnMut(&Packet, Hop, u32) -> bool, mut inject: impl FnMut(&mut DsaSwitch, Time, &Packet, &mut Vec<SwitchAction>)) {
        for (r, w) in self.workers.iter_mut().enumerate() {
            let data = Some(Payload::I32(Self::input(r as u32, fragments)));
            w.submit(0, AppRequest::Allreduce { id: 7, bytes: fragments as u64 * 248, data, attrs: TensorAttrs { layer: 0, priority: 100 } });
        }
        while self.now < 100 * MS {
            let mut sent: Vec<Packet> = vec![];
            for w in &mut self.workers {
                sent.extend(std::iter::from_fn(|| w.poll_transmit(self.now)));
            }
            sent.extend(std::iter::from_fn(|| self.ps.poll_transmit(self.now)));
            if sent.is_empty() {
                let next = self.workers.iter().filter_map(|w| w.poll_timeout()).chain(self.ps.poll_timeout()).min();
                let Some(t) = next else { break };
                self.now = t.max(self.now);
                for w in &mut self.workers {
                    if w.poll_timeout().is_some_and(|d| d <= self.now) {
                        w.handle_timeout(self.now);
                    }
                }
                if self.ps.poll_timeout().is_some_and(|d| d <= self.now) {
                    self.ps.handle_timeout(self.now);
                }
                continue;
            }
            for p in sent {
                if self.lost_on(&p, Hop::ToSwitch, &mut lose) {
                    continue;
                }
                let mut out = vec![];
                inject(&mut self.sw, self.now, &p, &mut out);
                self.sw.on_packet(self.now, &CTX, 0, p, &mut out);
                for a in out {
                    let (SwitchAction::Route { pkt } | SwitchAction::Forward { pkt, .. }) = a else { continue };
                    if self.lost_on(&pkt, Hop::FromSwitch, &mut lose) {
                        continue;
                    }
                    self.deliver(pkt);
                }
            }
            self.now += 1_000_000; // 1 us per round
            for (r, w) in self.workers.iter_mut().enumerate() {
                while let Some(ev) = w.poll_event() {
                    if let HostEvent::Done { data: Some(Payload::I32(v)), .. } = ev {
                        self.results[r] = Some(v);
                    }
                }
            }
        }
    }

    fn lost_on(&mut self, p: &Packet, hop: Hop, lose: &mut impl FnMut(&Packet, Hop, u32) -> bool) -> bool {
        let k = kind(p);
        let i = match self.seen.iter().position(|s| s.0 == k && s.1 == hop) {
            Some(i) => i,
            None => {
                self.seen.push((k, hop, 0));
                self.seen.len() - 1
            }
        };
        let gone = lose(p, hop, self.seen[i].2);
        self.seen[i].2 += 1;
        self.lost += gone as u32;
        gone
    }

    fn deliver(&mut self, p: Packet) {
        let now = self.now;
        if p.dst == PS.host {
            self.ps.handle_packet(now, p);
        } else if (1..=WORKERS).contains(&p.dst) {
            self.workers[p.dst as usize - 1].handle_packet(now, p);
        } // job 2's hosts and PS2: nobody listens
    }

    /// Every worker has the exact sum; the switch and the PS hold nothing.
    fn assert_exact(&self, fragments: usize) {
        let want: Vec<i32> = (0..fragments * 62).map(|i| (0..WORKERS).map(|r| 1000 * r as i32 + i as i32).sum()).collect();
        for (r, got) in self.results.iter().enumerate() {
            assert_eq!(got.as_ref(), Some(&want), "worker {r}");
        }
        assert_eq!(self.sw.aggregators_in_use(), 0, "no aggregator held: {:?}", self.sw.counters());
        assert_eq!(self.ps.pending(), 0, "no PS entry left");
    }

    fn switch(&self, name: &str) -> u64 {
        self.sw.counters().into_iter().find(|c| c.0 == name).map_or(0, |c| c.1)
    }

    fn hosts(&self, name: &str) -> u64 {
        let ps = self.ps.counters().into_iter().find(|c| c.0 == name).map_or(0, |c| c.1);
        ps + self.workers.iter().map(|w| w.counters().into_iter().find(|c| c.0 == name).map_or(0, |c| c.1)).sum::<u64>()
    }
}

fn header(p: &Packet) -> DsaHeader {
    match p.header {
        Header::Dsa(h) => h,
        _ => panic!("not DSA"),
    }
}

#[test]
fn t2_a_lost_gradient_is_resent_and_the_rest_deduplicated() {
    let mut f = Fabric::new(64);
    // W4's first gradient of PSN 1 is lost before the switch.
    f.run(3, |p, hop, _| hop == Hop::ToSwitch && p.src == 4 && header(p).psn == 1 && header(p).flags & DsaHeader::FLAG_RETX == 0, |_, _, _, _| {});
    f.assert_exact(3);
    assert_eq!(f.lost, 1);
    // One round of resends: the three others' copies are deduplicated, W4's completes it on
    // the switch; the PS never takes part.
    assert_eq!(f.switch("completed"), 3);
    assert_eq!(f.switch("duplicates"), 3);
    assert_eq!(f.hosts("completed"), 0);
    assert_eq!(f.hosts("notifies"), 0);
}

#[test]
fn t3_when_every_ack_copy_is_lost_the_resends_aggregate_again() {
    let mut f = Fabric::new(64);
    // Every copy of PSN 0's first ACK is lost on its way to the workers.
    f.run(2, |p, hop, n| hop == Hop::FromSwitch && kind(p) == DsaKind::Ack && header(p).psn == 0 && n < WORKERS, |_, _, _, _| {});
    f.assert_exact(2);
    assert_eq!(f.lost, WORKERS);
    // The aggregator was freed at completion: the resends reserve it again and complete PSN 0
    // a second time, on the switch.
    assert_eq!(f.switch("completed"), 3);
    assert_eq!(f.hosts("completed"), 0);
}

#[test]
fn t4_when_some_ack_copies_are_lost_the_ps_reminder_finishes_it() {
    let mut f = Fabric::new(64);
    // The first ACK of PSN 0 reaches W1 and W2 only.
    f.run(2, |p, hop, n| hop == Hop::FromSwitch && kind(p) == DsaKind::Ack && header(p).psn == 0 && n < WORKERS && p.dst >= 3, |_, _, _, _| {});
    assert_eq!(f.lost, 2);
    f.assert_exact(2);
    // W3's and W4's resends reserve an aggregator that can never fill; after three of them
    // they notify the PS, whose reminder frees the stray aggregator and whose fetch gets the
    // result from W1 or W2; its ACK reaches everyone, and the duplicates change nothing.
    assert!(f.hosts("notifies") >= 2, "{:?}", f.workers[2].counters());
    assert!(f.hosts("reminders") >= 1);
    assert_eq!(f.hosts("completed"), 1, "the PS finished PSN 0 once");
    assert!(f.switch("reminders") >= 1);
}

#[test]
fn t8_a_lost_eviction_is_recovered_from_the_workers_gradients() {
    // One aggregator. W1 and W2 reserve PSN 0; job 2's higher-priority packet evicts their
    // partial sum, and that EVICT is lost on its way to the PS; W3's first gradient is lost
    // before the switch, and W1's first copy of the final ACK too. The workers' stored
    // gradients (resends) finish it.
    let mut f = Fabric::new(1);
    let mut injected = false;
    f.run(
        1,
        |p, hop, n| match (kind(p), hop) {
            (DsaKind::Evict, Hop::FromSwitch) => n == 0,
            (DsaKind::Grad, Hop::ToSwitch) => p.src == 3 && header(p).flags & DsaHeader::FLAG_RETX == 0,
            (DsaKind::Ack, Hop::FromSwitch) => p.dst == 1 && n < WORKERS,
            _ => false,
        },
        |sw, now, p, out| {
            // Job 2's pair arrives once W1 and W2 hold the aggregator: the first evicts,
            // the second completes job 2 and frees it.
            if !injected && p.src == 4 && kind(p) == DsaKind::Grad {
                injected = true;
                for rank in 0..2u32 {
                    let h = DsaHeader { job: 2, psn: 0, bitmap: 1 << rank, priority: 1_000_000, fan_in: 2, kind: DsaKind::Grad, flags: 0 };
                    let mut g = Packet::new(5 + rank, 1, PS2.host, PS2.port, 306, Header::Dsa(h));
                    g.payload = Some(Box::new(Payload::I32(vec![9; 62])));
                    sw.on_packet(now, &CTX, 0, g, out);
                }
            }
        },
    );
    assert!(injected);
    f.assert_exact(1);
    assert_eq!(f.switch("preemptions"), 1);
    assert!(f.seen.contains(&(DsaKind::Evict, Hop::FromSwitch, 1)), "one eviction: {:?}", f.seen);
    assert_eq!(f.lost, 3);
}
