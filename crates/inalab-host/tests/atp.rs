//! ATP's worker and PS end to end without an ATP switch: the PS does all the aggregation and
//! answers by unicast. Instant links (no delay, no serialization), so packets move at once
//! and time only advances on the workers' 10 ns loss-recovery timers.

use inalab_core::time::S;
use inalab_core::wire::{AtpHeader, Header};
use inalab_core::{splitmix64, AppRequest, Endpoint, HostEvent, Payload};
use inalab_host::{atp_layout, AtpConfig, AtpServer, AtpServerConfig, AtpWorker, Hashing};
use inalab_testkit::{Fabric, Link, Links, Rule};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

fn ep(h: u32, port: u16) -> Endpoint {
    Endpoint { host: h, port }
}

const PS: Endpoint = Endpoint { host: 100, port: 2 };

fn base() -> AtpConfig {
    AtpConfig { timeout_ps: 10_000, ..AtpConfig::default() }
}

/// `n` workers (hosts `0..n`) beside the PS (host 100) on one L3 switch.
fn setup(n: usize, aggs: u32, hashing: Hashing) -> (Fabric, Vec<Endpoint>) {
    setup_with(n, AtpConfig { aggregators: aggs, hashing, ..base() })
}

fn setup_with(n: usize, cfg: AtpConfig) -> (Fabric, Vec<Endpoint>) {
    let layout = atp_layout(&vec![0u32; n], 0, |_| true).unwrap();
    let wep: Vec<Endpoint> = (0..n as u32).map(|h| ep(h, 1)).collect();
    let mut f = Fabric::star(101, Link::INSTANT);
    for (r, &w) in wep.iter().enumerate() {
        f.add(Box::new(AtpWorker::new(w, PS, layout.positions[r], cfg.clone()).unwrap()));
    }
    let ps_cfg = AtpServerConfig { atp: cfg, layout, workers: wep.clone(), multicast: false, targets: vec![], resend_holdoff_ps: 5_000 };
    f.add(Box::new(AtpServer::new(PS, ps_cfg).unwrap()));
    (f, wep)
}

/// Runs until quiet: every packet moved, every timer fired.
fn run_to_quiet(f: &mut Fabric) {
    assert!(f.run(S), "no quiescence");
    f.check_conservation().unwrap();
}

/// The `i`-th event of worker `w`, which must be a `Done` with i32 values.
fn done(f: &Fabric, w: Endpoint, i: usize) -> Vec<i32> {
    match f.events(w).get(i) {
        Some(HostEvent::Done { data: Some(Payload::I32(v)), .. }) => v.clone(),
        e => panic!("expected Done, got {e:?}"),
    }
}

fn submit_all(f: &mut Fabric, ws: &[Endpoint], id: u64, data: impl Fn(usize, usize) -> i32, len: usize) {
    for (r, &w) in ws.iter().enumerate() {
        let v: Vec<i32> = (0..len).map(|i| data(r, i)).collect();
        f.submit(w, AppRequest::allreduce(id, 4 * len as u64, Some(Payload::I32(v))));
    }
}

#[test]
fn sums_exactly_under_heavy_loss() {
    let (mut f, ws) = setup(3, 16, Hashing::Hash);
    let mut k = 0u64;
    // 10 % loss.
    f.lose(
        Links::FromHosts,
        Rule::when(move |_| {
            k += 1;
            splitmix64(k) % 10 == 0
        }),
    );
    let len = 62 * 40 + 7;
    submit_all(&mut f, &ws, 9, |r, i| (r * 1000 + i) as i32 - 500, len);
    run_to_quiet(&mut f);
    let want: Vec<i32> = (0..len).map(|i| (0..3).map(|r| (r * 1000 + i) as i32 - 500).sum()).collect();
    for &w in &ws {
        assert_eq!(done(&f, w, 0), want);
        assert_eq!(f.counter(w, "fragments_sent"), 41);
        assert!(f.counter(w, "resends") > 0 && f.counter(w, "timeouts") > 0);
    }
}

#[test]
fn overflow_falls_back_to_floats() {
    let (mut f, ws) = setup(3, 16, Hashing::Hash);
    let floats = Rc::new(Cell::new(0));
    let count = floats.clone();
    f.tap(Links::FromHosts, move |_, p| {
        if let Header::Atp(h) = p.header {
            if h.has(AtpHeader::FLAG_FLOAT) && !h.has(AtpHeader::FLAG_ACK) {
                assert_eq!(h.seq, 0);
                assert!(matches!(p.payload.as_deref(), Some(Payload::F32(_))));
                count.set(count.get() + 1);
            }
        }
    });
    // Value 0 of fragment 0 overflows i32 in the sum; fragment 1 does not overflow.
    submit_all(&mut f, &ws, 1, |r, i| if i == 0 { 1_500_000_000 } else { (r + i) as i32 }, 100);
    run_to_quiet(&mut f);
    assert_eq!(floats.get(), 3, "every worker resent the overflowing fragment as floats");
    assert_eq!(f.counter(PS, "overflows"), 1);
    for &w in &ws {
        let v = done(&f, w, 0);
        assert_eq!(v[0], i32::MAX, "the float sum converts back saturated");
        assert_eq!(v[1..], (1..100).map(|i| 3 * i + 3).collect::<Vec<i32>>()[..]);
    }
}

#[test]
fn collision_moves_the_slot_for_good() {
    // 4 slots hashed into a pool of 64: seq 0 collides once, and its slot (also seq 4's and
    // seq 8's) moves to an aggregator the job did not use, in every later fragment.
    let (mut f, ws) = setup_with(2, AtpConfig { aggregators: 64, slots: 4, hashing: Hashing::Hash, ..base() });
    let table = AtpConfig { aggregators: 64, slots: 4, ..base() }.slot_table();
    let round = Rc::new(Cell::new(1));
    let idx = Rc::new(RefCell::new(BTreeMap::new()));
    let moved = Rc::new(Cell::new(None));
    let (r, seen, m) = (round.clone(), idx.clone(), moved.clone());
    f.tap(Links::FromHosts, move |_, p| {
        if let Header::Atp(ref mut h) = p.header {
            match (r.get(), h.has(AtpHeader::FLAG_ACK)) {
                (1, false) => h.flags |= AtpHeader::FLAG_COLLISION | AtpHeader::FLAG_RESEND,
                (1, true) => {
                    assert!(h.has(AtpHeader::FLAG_REHASH));
                    m.set(Some(h.bitmap0));
                }
                (_, false) => {
                    seen.borrow_mut().insert(h.seq, h.agg_index);
                }
                (_, true) => assert!(!h.has(AtpHeader::FLAG_REHASH), "no collision, no move"),
            }
        }
    });
    submit_all(&mut f, &ws, 1, |_, _| 1, 62);
    run_to_quiet(&mut f);
    ws.iter().for_each(|&w| assert_eq!(done(&f, w, 0), vec![2; 62]));
    let new = moved.get().expect("the PS moved the slot");
    assert!(new < 64 && !table.contains(&new), "{new} is a pool aggregator the job did not use: {table:?}");
    round.set(2);
    submit_all(&mut f, &ws, 2, |_, _| 1, 62 * 8);
    run_to_quiet(&mut f);
    let want: Vec<(u32, u32)> = (1..=8).map(|seq| (seq, if seq % 4 == 0 { new } else { table[seq as usize % 4] })).collect();
    assert_eq!(idx.take().into_iter().collect::<Vec<_>>(), want);
}

#[test]
fn a_job_never_has_two_fragments_on_one_aggregator() {
    // 8 slots, a generous window: whatever is in flight at any moment uses distinct indexes.
    let (mut f, ws) = setup_with(3, AtpConfig { aggregators: 1000, slots: 8, ..base() });
    let inflight = Rc::new(RefCell::new(BTreeMap::<u32, u32>::new()));
    let worst = Rc::new(Cell::new(0usize));
    let (fl, wo) = (inflight.clone(), worst.clone());
    f.tap(Links::FromHosts, move |_, p| {
        if let Header::Atp(h) = p.header {
            let mut fl = fl.borrow_mut();
            if h.has(AtpHeader::FLAG_ACK) {
                fl.remove(&h.seq);
            } else if p.src == 0 {
                if let Some((&other, _)) = fl.iter().find(|(&s, &i)| i == h.agg_index && s != h.seq) {
                    panic!("seq {} on aggregator {} while seq {other} is in flight there", h.seq, h.agg_index);
                }
                fl.insert(h.seq, h.agg_index);
                wo.set(wo.get().max(fl.len()));
            }
        }
    });
    submit_all(&mut f, &ws, 1, |r, i| (r * i) as i32, 62 * 50);
    run_to_quiet(&mut f);
    assert!(worst.get() <= 8, "at most 8 fragments in flight, got {}", worst.get());
}

/// The loss timeout follows measured round trips (ATP's module docs): after parameters that
/// came back in 0-0.9 timeouts, a round of parameters that each take 1.5 timeouts (workers
/// waiting on each other, busy hosts) is waited for, not resent. With the fixed timeout every
/// fragment of that round timed out and was resent.
#[test]
fn round_trips_longer_than_the_timeout_are_waited_for_once_measured() {
    let t = base().timeout_ps;
    let (mut f, ws) = setup(2, 16, Hashing::Hash);
    let phase = Rc::new(Cell::new(1));
    let is_param = |p: &inalab_core::Packet| matches!(p.header, Header::Atp(h) if h.has(AtpHeader::FLAG_ACK));
    let (p1, p2) = (phase.clone(), phase.clone());
    // Round 1: every other parameter held 0.9 timeouts (spread: a large RTTVAR).
    f.reorder(Links::ToHosts, Rule::when(move |p| p1.get() == 1 && is_param(p) && matches!(p.header, Header::Atp(h) if h.seq % 2 == 0)), t * 9 / 10);
    // Round 2: every parameter held 1.5 timeouts.
    f.reorder(Links::ToHosts, Rule::when(move |p| p2.get() == 2 && is_param(p)), t * 3 / 2);
    let len = 62 * 40;
    submit_all(&mut f, &ws, 1, |r, i| (r + i) as i32, len);
    run_to_quiet(&mut f);
    let timeouts: Vec<u64> = ws.iter().map(|&w| f.counter(w, "timeouts")).collect();
    assert_eq!(timeouts, vec![0, 0], "round 1's round trips are all below the timeout");
    // (Round 1's held parameters arrive behind later ones: some fragments are resent as
    // holes, which is no timeout.)
    let resends: Vec<u64> = ws.iter().map(|&w| f.counter(w, "resends")).collect();
    phase.set(2);
    submit_all(&mut f, &ws, 2, |r, i| (r * i) as i32, len);
    run_to_quiet(&mut f);
    for (&w, r1) in ws.iter().zip(resends) {
        assert_eq!(done(&f, w, 1), (0..len).map(|i| i as i32).collect::<Vec<_>>());
        assert_eq!((f.counter(w, "timeouts"), f.counter(w, "resends") - r1), (0, 0), "round 2 waited for its parameters");
    }
}
