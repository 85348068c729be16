//! The quantization layer between an application and an integer-summing protocol: float sums
//! within the documented bound, SwitchML's exponent round before every tensor (with or without
//! values), rejected inputs named, and requests reaching the protocol in one order on every
//! worker.

use inalab_core::{AppRequest, Endpoint, HostEvent, HostProtocol, Packet, Payload, TensorAttrs, Time};
use inalab_host::{Quantization, Quantized};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// What a worker's inner protocol was asked, and the completions the test hands it.
#[derive(Default)]
struct Log {
    submitted: Vec<(u64, u64, Option<Payload>)>,
    attrs: Vec<TensorAttrs>,
    done: VecDeque<HostEvent>,
}

/// An inner protocol that records requests; the "network" is the test, which sums them.
struct Recorder(Arc<Mutex<Log>>);

impl HostProtocol for Recorder {
    fn endpoint(&self) -> Endpoint {
        Endpoint { host: 0, port: 0 }
    }
    fn submit(&mut self, _now: Time, req: AppRequest) {
        if let AppRequest::Allreduce { id, bytes, data, attrs } = req {
            let mut log = self.0.lock().unwrap();
            log.submitted.push((id, bytes, data));
            log.attrs.push(attrs);
        }
    }
    fn handle_packet(&mut self, _now: Time, _pkt: Packet) {}
    fn handle_timeout(&mut self, _now: Time) {}
    fn poll_transmit(&mut self, _now: Time) -> Option<Packet> {
        None
    }
    fn poll_timeout(&self) -> Option<Time> {
        None
    }
    fn poll_event(&mut self) -> Option<HostEvent> {
        self.0.lock().unwrap().done.pop_front()
    }
}

struct Job {
    workers: Vec<Quantized>,
    logs: Vec<Arc<Mutex<Log>>>,
}

impl Job {
    fn new(q: Quantization, world: usize) -> Job {
        let logs: Vec<_> = (0..world).map(|_| Arc::new(Mutex::new(Log::default()))).collect();
        let workers = logs.iter().enumerate().map(|(r, l)| Quantized::new(Box::new(Recorder(l.clone())), q, r, world)).collect();
        Job { workers, logs }
    }

    /// A job whose layer converts (the schemes without an overflow fallback).
    fn converting(scale: f64, world: usize) -> Job {
        let logs: Vec<_> = (0..world).map(|_| Arc::new(Mutex::new(Log::default()))).collect();
        let workers = logs.iter().enumerate().map(|(r, l)| Quantized::converting(Box::new(Recorder(l.clone())), scale, r, world)).collect();
        Job { workers, logs }
    }

    /// Completes every request all workers have submitted, in order, with the element-wise i32
    /// sum (what a switch computes), until none is left; returns each worker's events.
    fn run(&mut self) -> Vec<Vec<HostEvent>> {
        let mut answered = 0;
        loop {
            let n = self.logs.iter().map(|l| l.lock().unwrap().submitted.len()).min().unwrap();
            if answered == n {
                break;
            }
            let reqs: Vec<_> = self.logs.iter().map(|l| l.lock().unwrap().submitted[answered].clone()).collect();
            // What a switch (i32, saturating stickily) or a protocol carrying floats computes.
            let sum = reqs[0].2.as_ref().map(|first| {
                let mut s = first.zeros_like(first.len());
                for (_, _, d) in &reqs {
                    match (&mut s, d.as_ref().expect("every worker sends values")) {
                        (Payload::I32(acc), Payload::I32(v)) => _ = inalab_core::rail::sticky_add(acc, v),
                        // Tensors of different lengths (ranks that disagree) meet where they
                        // overlap, as fragments at a switch do.
                        (Payload::F32(acc), Payload::F32(v)) => acc.iter_mut().zip(v).for_each(|(a, b)| *a += b),
                        (s, d) => s.add_at(0, d),
                    }
                }
                s
            });
            for (w, (l, (id, _, _))) in self.logs.iter().zip(&reqs).enumerate() {
                l.lock().unwrap().done.push_back(HostEvent::Done { id: *id, data: sum.clone() });
                self.workers[w].handle_timeout(0);
            }
            answered += 1;
        }
        self.workers.iter_mut().map(|w| std::iter::from_fn(|| w.poll_event()).collect()).collect()
    }

    fn submit(&mut self, id: u64, data: impl Fn(usize) -> Option<Payload>, bytes: u64) {
        for (r, w) in self.workers.iter_mut().enumerate() {
            w.submit(0, AppRequest::allreduce(id, bytes, data(r)));
        }
    }

    fn submitted(&self, w: usize) -> Vec<(u64, Option<Payload>)> {
        self.logs[w].lock().unwrap().submitted.iter().map(|(_, b, d)| (*b, d.clone())).collect()
    }
}

fn floats(ev: &HostEvent) -> (u64, Vec<f32>) {
    match ev {
        HostEvent::Done { id, data: Some(Payload::F32(v)) } => (*id, v.clone()),
        e => panic!("expected a float result, got {e:?}"),
    }
}

/// Worker r's values: magnitudes from 1e-3 to 1e3, signs mixed.
fn values(r: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| ((i * 7 + r * 13) % 19) as f32 * 10f32.powi((i % 7) as i32 - 3) * if (i + r) % 3 == 0 { -1.0 } else { 1.0 }).collect()
}

#[test]
fn agreed_exponent_sums_within_bound_after_an_exponent_round() {
    let world = 5;
    let mut job = Job::new(Quantization::AgreedExponent, world);
    job.submit(7, |r| Some(Payload::F32(values(r, 100))), 400);
    let events = job.run();
    let exact: Vec<f64> = (0..100).map(|i| (0..world).map(|r| values(r, 100)[i] as f64).sum()).collect();
    let max_abs = (0..world).flat_map(|r| values(r, 100)).fold(0f32, |m, v| m.max(v.abs())) as f64;
    // max_abs < 2^e: the SwitchML bound n^2 2^e / (2^31 - 1), plus f32 rounding.
    let e = (max_abs.log2().floor() + 1.0) as i32;
    let bound = (world * world) as f64 * 2f64.powi(e) / i32::MAX as f64 + f32::EPSILON as f64 * world as f64 * max_abs;
    for evs in &events {
        assert_eq!(evs.len(), 1);
        let (id, got) = floats(&evs[0]);
        assert_eq!(id, 7);
        for (g, x) in got.iter().zip(&exact) {
            assert!((*g as f64 - x).abs() <= bound, "{g} vs {x} (bound {bound})");
        }
    }
    // The protocol saw the exponent vector (one slot per worker, then one per worker for the
    // tensor's length), then the data.
    let sub = job.submitted(2);
    assert_eq!(sub.len(), 2);
    assert_eq!(sub[0].0, 2 * world as u64 * 4);
    let Some(Payload::I32(exps)) = &sub[0].1 else { panic!("an exponent vector") };
    assert!(exps.iter().enumerate().all(|(i, &x)| (i % world == 2) == (x != 0)), "only worker 2's slots are set: {exps:?}");
    assert_eq!(exps[world + 2], 101, "its length, plus one (a 0 is a rank that left)");
    assert_eq!(sub[1].0, 400);
}

#[test]
fn exponent_rounds_keep_one_order_on_every_worker() {
    let mut job = Job::new(Quantization::AgreedExponent, 3);
    for t in 0..3 {
        job.submit(t, |r| Some(Payload::F32(values(r + t as usize, 40))), 160);
    }
    // Before any answer only the first exponent round is out: the next tensor's round waits
    // until the first tensor's data is submitted.
    assert_eq!(job.submitted(0).len(), 1);
    let events = job.run();
    let sizes: Vec<u64> = job.submitted(1).iter().map(|s| s.0).collect();
    assert_eq!(sizes, [24, 160, 24, 160, 24, 160]);
    let ids: Vec<u64> = events[0].iter().map(|e| floats(e).0).collect();
    assert_eq!(ids, [0, 1, 2]);
}

#[test]
fn integers_and_metadata_pass_through_but_still_take_the_exponent_round() {
    let mut job = Job::new(Quantization::AgreedExponent, 4);
    job.submit(1, |r| Some(Payload::I32(vec![r as i32, -5, 1 << 20])), 12);
    job.submit(2, |_| None, 4096);
    let events = job.run();
    match &events[3][0] {
        HostEvent::Done { id: 1, data: Some(Payload::I32(v)) } => assert_eq!(v, &vec![6, -20, 4 << 20]),
        e => panic!("{e:?}"),
    }
    assert!(matches!(events[3][1], HostEvent::Done { id: 2, data: None }));
    let sizes: Vec<(u64, bool)> = job.submitted(0).iter().map(|s| (s.0, s.1.is_some())).collect();
    assert_eq!(sizes, [(16, true), (12, true), (16, false), (4096, false)]);
}

#[test]
fn fixed_point_hands_every_float_to_the_protocol_and_fails_non_finite_sums_on_every_worker() {
    // ATP converts floats itself (its overflow fallback needs them): the layer passes them on,
    // values beyond the fixed-point range included. A NaN or infinity on one worker goes out
    // too (a worker that kept it back would leave the others waiting for ever): the sum is not
    // finite, and every worker's call fails, the culprit's naming its value.
    let mut job = Job::new(Quantization::FixedPoint { scale: 1e8 }, 2);
    job.submit(1, |r| Some(Payload::F32(vec![1.5 + r as f32, 30.0])), 8);
    job.submit(2, |r| Some(Payload::F32(vec![if r == 0 { f32::NAN } else { 1.0 }])), 4);
    job.submit(3, |r| Some(Payload::F32(vec![if r == 1 { f32::INFINITY } else { 1.0 }])), 4);
    let events = job.run();
    for (rank, evs) in events.iter().enumerate() {
        let reason = |id: u64| {
            evs.iter()
                .find_map(|e| match e {
                    HostEvent::Rejected { id: i, reason } if *i == id => Some(reason.clone()),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("worker {rank}: request {id} not rejected: {evs:?}"))
        };
        let (nan, inf) = (reason(2), reason(3));
        assert!(nan.contains("no fixed-point form"), "{nan}");
        assert_eq!(nan.contains("value 0 is NaN"), rank == 0, "{nan}");
        assert_eq!(inf.contains("value 0 is inf"), rank == 1, "{inf}");
        let done = evs.iter().find(|e| matches!(e, HostEvent::Done { id: 1, .. })).expect("request 1 done");
        assert_eq!(floats(done), (1, vec![4.0, 60.0]));
    }
    let sub = job.submitted(0);
    assert_eq!(sub.len(), 6, "every request reaches the protocol, each after its size round");
    assert_eq!(sub[0].1, Some(Payload::I32(vec![3, 0])), "the size round: this rank's length plus one in its slot");
    assert_eq!(sub[1].1, Some(Payload::F32(vec![1.5, 30.0])), "floats reach the protocol unchanged");
}

#[test]
fn nan_is_rejected_and_the_next_tensor_goes_on() {
    let mut job = Job::new(Quantization::AgreedExponent, 2);
    job.submit(1, |_| Some(Payload::F32(vec![1.0, f32::NAN])), 8);
    job.submit(2, |_| Some(Payload::F32(vec![2.0])), 4);
    let events = job.run();
    match &events[1][0] {
        HostEvent::Rejected { id: 1, reason } => assert!(reason.contains("no fixed-point form"), "{reason}"),
        e => panic!("{e:?}"),
    }
    let (id, got) = floats(&events[1][1]);
    assert_eq!((id, got.len()), (2, 1));
    assert!((got[0] - 4.0).abs() < 1e-6);
}

#[test]
fn tensor_attributes_reach_the_protocol_in_every_round() {
    for q in [Quantization::AgreedExponent, Quantization::FixedPoint { scale: 1e8 }, Quantization::None] {
        let mut job = Job::new(q, 2);
        let attrs = TensorAttrs { layer: 7, priority: 3 };
        for w in &mut job.workers {
            w.submit(0, AppRequest::Allreduce { id: 1, bytes: 8, data: Some(Payload::I32(vec![1, 2])), attrs });
        }
        job.run();
        let seen = job.logs[0].lock().unwrap().attrs.clone();
        assert!(!seen.is_empty() && seen.iter().all(|a| *a == attrs), "{q:?}: {seen:?}");
    }
}

#[test]
fn a_failed_exponent_round_fails_its_tensor_and_the_next_one_still_starts() {
    let mut job = Job::new(Quantization::AgreedExponent, 2);
    job.submit(1, |_| Some(Payload::F32(vec![1.0])), 4);
    job.submit(2, |_| Some(Payload::F32(vec![2.0])), 4);
    // The protocol gives up on the first exponent round (its only request so far).
    for (w, l) in job.logs.iter().enumerate() {
        let id = l.lock().unwrap().submitted[0].0;
        l.lock().unwrap().done.push_back(HostEvent::Failed { id, reason: "gave up".into() });
        job.workers[w].handle_timeout(0);
    }
    let events = job.run();
    match &events[0][..] {
        [HostEvent::Failed { id: 1, reason }, done] => {
            assert_eq!(reason, "gave up");
            let (id, got) = floats(done);
            assert_eq!((id, got.len()), (2, 1));
            assert!((got[0] - 4.0).abs() < 1e-6);
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn agreed_exponent_covers_every_finite_float32() {
    // The values near the top of float32, and a sum over three workers that stays finite.
    for (world, values) in [
        (1, vec![1.6e38f32, 1.8e38, 2.5e38, -3e38, 3.4e38, 1.0]),
        (3, vec![1.1e38f32, -1.0e38, 5e37, 1.0, -3e-30, f32::MIN_POSITIVE]),
        (2, vec![1e-45f32, -3e-44, 0.0]),
    ] {
        let mut job = Job::new(Quantization::AgreedExponent, world);
        job.submit(1, |_| Some(Payload::F32(values.clone())), 4 * values.len() as u64);
        let events = job.run();
        let (_, got) = floats(&events[0][0]);
        let max_abs = values.iter().fold(0f64, |m, v| m.max(v.abs() as f64)) * world as f64;
        // The documented bound relative to the sum's largest magnitude: n^2 2 max / (2^31 - 1),
        // plus the float32 rounding of the result.
        let n = world as f64;
        let bound = n * n * 2.0 * max_abs / i32::MAX as f64 + f32::EPSILON as f64 * max_abs;
        for (g, v) in got.iter().zip(&values) {
            let exact = *v as f64 * n;
            assert!(g.is_finite() && (*g as f64 - exact).abs() <= bound, "{world} workers: {g} vs {exact} (bound {bound:e})");
        }
    }
}

#[test]
fn a_value_one_worker_cannot_carry_fails_the_tensor_on_every_worker() {
    // Only worker 0 has a NaN: its mark in the exponent round makes every worker drop the
    // tensor, so no one sends its data and the next tensor pairs up right on all of them.
    let mut job = Job::new(Quantization::AgreedExponent, 3);
    job.submit(1, |r| Some(Payload::F32(if r == 0 { vec![1.0, f32::INFINITY] } else { vec![1.0, 2.0] })), 8);
    job.submit(2, |r| Some(Payload::F32(vec![r as f32 + 1.0])), 4);
    let events = job.run();
    for (w, evs) in events.iter().enumerate() {
        match &evs[..] {
            [HostEvent::Rejected { id: 1, reason }, done] => {
                let named = if w == 0 { "rank 0's value 1 is inf" } else { "rank 0's tensor" };
                assert!(reason.contains(named), "worker {w}: {reason}");
                let (id, got) = floats(done);
                assert_eq!(id, 2);
                assert!((got[0] - 6.0).abs() < 1e-6, "worker {w}: {got:?}");
            }
            e => panic!("worker {w}: {e:?}"),
        }
        // The exponent rounds of both tensors and only the second tensor's data.
        assert_eq!(job.submitted(w).iter().map(|s| s.0).collect::<Vec<_>>(), [24, 24, 4], "worker {w}");
    }
}

/// The numeric cases through the layer of the schemes without an overflow fallback
/// (DSA, Canary, static trees, Rina, GRID), over a switch that saturates stickily: each an
/// exact sum on every worker or an error on every worker, the culprit's naming its rank,
/// index and value (#36: DSA gave [1, NaN] + [1, 2] = [2, 2] and [15, -15] + [15, -15] =
/// [-12.95, 12.95]; the others failed only the culprit and the rest took a wrong sum).
#[test]
fn without_a_fallback_a_value_or_sum_out_of_range_fails_every_worker() {
    let top = (i32::MAX as f64 - 1.5) / 1e8;
    let cases: Vec<(&str, [Vec<f32>; 2], Option<(Option<usize>, usize)>)> = vec![
        ("NaN on rank 0", [vec![1.0, f32::NAN], vec![1.0, 2.0]], Some((Some(0), 1))),
        ("sum beyond +21.47", [vec![15.0, -15.0], vec![15.0, -15.0]], Some((None, 0))),
        ("value beyond +21.47 on rank 0", [vec![25.0, 1.0], vec![1.0, 1.0]], Some((Some(0), 0))),
        ("inf on rank 1", [vec![1.0, 1.0], vec![f32::INFINITY, 1.0]], Some((Some(1), 0))),
        ("-inf on rank 1", [vec![1.0, 1.0], vec![1.0, f32::NEG_INFINITY]], Some((Some(1), 1))),
        ("the top of float32", [vec![f32::MAX], vec![0.0]], Some((Some(0), 0))),
        ("values and sum inside the range", [vec![20.0, -0.5], vec![-10.0, 1e-8]], None),
        ("values at the range's edge, sum inside", [vec![top as f32 * 0.99, -(top as f32) * 0.99], vec![-1.0, 1.0]], None),
        ("values at the edge summing beyond it", [vec![-(top as f32) * 0.99], vec![-(top as f32) * 0.99]], Some((None, 0))),
    ];
    for (what, inputs, fails) in cases {
        let mut job = Job::converting(1e8, 2);
        job.submit(1, |r| Some(Payload::F32(inputs[r].clone())), 4 * inputs[0].len() as u64);
        // The next tensor pairs up on every worker.
        job.submit(2, |r| Some(Payload::F32(vec![r as f32 + 0.5])), 4);
        let events = job.run();
        for (rank, evs) in events.iter().enumerate() {
            match (&evs[..], fails) {
                ([HostEvent::Rejected { id: 1, reason }, next], Some((culprit, i))) => {
                    if culprit == Some(rank) {
                        let v = inputs[rank][i];
                        assert!(reason.contains(&format!("rank {rank}'s value {i} is {v:?}")), "{what}, rank {rank}: {reason}");
                    } else {
                        assert!(reason.starts_with(&format!("value {i} of the sum is out of the fixed-point range")), "{what}, rank {rank}: {reason}");
                    }
                    assert_eq!(floats(next), (2, vec![2.0]), "{what}");
                }
                ([done, next], None) => {
                    let (id, got) = floats(done);
                    assert_eq!(id, 1);
                    let bound = Quantization::FixedPoint { scale: 1e8 }.error_bound(2, top);
                    for (k, g) in got.iter().enumerate() {
                        let exact = inputs[0][k] as f64 + inputs[1][k] as f64;
                        assert!((*g as f64 - exact).abs() <= bound, "{what}, rank {rank}: {g} vs {exact}");
                    }
                    assert_eq!(floats(next), (2, vec![2.0]), "{what}");
                }
                (e, _) => panic!("{what}, rank {rank}: {e:?}"),
            }
        }
    }
}

/// Ranks that pass tensors of different sizes, or in different orders, all fail the call with
/// the sizes named (#36 item 7: SwitchML and ATP returned wrong sums, one of them inf, and the
/// other schemes timed out): SwitchML in its exponent round, before any data goes (the next
/// tensor pairs up), the fixed-point schemes in a size round that goes with the data (their
/// protocols are then out of step, so every later call fails too, saying why).
#[test]
fn ranks_that_disagree_on_a_tensors_size_all_fail_naming_the_sizes() {
    for (what, mut job, in_step) in [
        ("agreed exponent", Job::new(Quantization::AgreedExponent, 3), true),
        ("fixed point", Job::new(Quantization::FixedPoint { scale: 1e8 }, 3), false),
        ("converting", Job::converting(1e8, 3), false),
    ] {
        job.submit(1, |r| Some(Payload::F32(vec![1.0; if r == 1 { 6 } else { 5 }])), 20);
        job.submit(2, |_| Some(Payload::F32(vec![2.0; 4])), 16);
        let events = job.run();
        for (rank, evs) in events.iter().enumerate() {
            match &evs[..] {
                [HostEvent::Rejected { id: 1, reason }, next] => {
                    let mine = if rank == 1 { 6 } else { 5 };
                    assert!(reason.starts_with("the ranks disagree on this tensor's size (values per rank: rank 0 5, rank 1 6, rank 2 5)"), "{what}, rank {rank}: {reason}");
                    assert!(reason.contains(&format!("rank {rank} {mine}")));
                    match (next, in_step) {
                        (done @ HostEvent::Done { .. }, true) => assert_eq!(floats(done), (2, vec![6.0; 4]), "{what}"),
                        (HostEvent::Rejected { id: 2, reason }, false) => assert!(reason.contains("out of step"), "{what}: {reason}"),
                        (e, _) => panic!("{what}, rank {rank}: {e:?}"),
                    }
                }
                e => panic!("{what}, rank {rank}: {e:?}"),
            }
        }
    }
}
