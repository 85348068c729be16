//! End-to-end allreduce correctness of every collective on the test fabric.

mod common;

use common::*;
use inalab_core::time::S;
use inalab_core::{AppRequest, Endpoint, HostEvent, HostProtocol, Payload};
use inalab_host::{
    ConfigError, HierarchicalAllreduce, PsConfig, PsServer, PsWorker, RingAllreduce, TransportConfig,
};
use inalab_testkit::{Fabric, Links, Rule};

#[derive(Debug, Clone, Copy)]
enum Algo {
    Ring,
    /// Hierarchical with this many racks.
    Hier(usize),
    /// Parameter server, one dedicated server host.
    PsOne,
    /// Parameter server, one server co-located with every worker.
    PsSharded,
}

struct Setup {
    fabric: Fabric,
    workers: Vec<Endpoint>,
    servers: Vec<Endpoint>,
}

/// Workers on hosts `0..n` (port 1), servers on port 2: PS `PsOne` on host `n`, `PsSharded`
/// beside every worker.
fn build(algo: Algo, n: usize, cfg: &TransportConfig, partition_bytes: u64) -> Setup {
    let mut fabric = star(n + 1);
    let eps = endpoints(n, 1);
    let ps_cfg = PsConfig { partition_bytes, transport: cfg.clone() };
    let mut servers = Vec::new();
    let workers: Vec<Box<dyn HostProtocol>> = match algo {
        Algo::Ring => (0..n).map(|r| boxed(RingAllreduce::new(eps.clone(), r, cfg.clone()))).collect(),
        Algo::Hier(racks) => {
            let grouped: Vec<Vec<Endpoint>> = eps.chunks(n / racks).map(|c| c.to_vec()).collect();
            (0..n).map(|r| boxed(HierarchicalAllreduce::new(grouped.clone(), r, cfg.clone()))).collect()
        }
        Algo::PsOne | Algo::PsSharded => {
            let server_eps = match algo {
                Algo::PsOne => vec![Endpoint { host: n as u32, port: 2 }],
                _ => endpoints(n, 2),
            };
            for &s in &server_eps {
                servers.push(fabric.add(boxed(PsServer::new(s, eps.clone(), cfg.clone()))));
            }
            eps.iter().map(|&w| boxed(PsWorker::new(w, server_eps.clone(), ps_cfg.clone()))).collect()
        }
    };
    let workers = workers.into_iter().map(|w| fabric.add(w)).collect();
    Setup { fabric, workers, servers }
}

fn boxed<P: HostProtocol + 'static>(p: Result<P, ConfigError>) -> Box<dyn HostProtocol> {
    Box::new(p.expect("valid config"))
}

/// Submits `requests` (id, per-rank tensors or None for metadata mode, bytes) back to back to
/// every worker, runs the fabric, and checks every worker got one `Done` per request, in
/// order, with the element-wise sum.
fn check(setup: &mut Setup, requests: &[(u64, Option<Vec<Payload>>, u64)]) {
    for (rank, &w) in setup.workers.iter().enumerate() {
        for (id, data, bytes) in requests {
            let data = data.as_ref().map(|d| d[rank].clone());
            setup.fabric.submit(w, AppRequest::allreduce(*id, *bytes, data));
        }
    }
    assert!(setup.fabric.run(10 * S), "fabric did not go quiet");
    setup.fabric.check_conservation().unwrap();
    for (rank, &w) in setup.workers.iter().enumerate() {
        let got = setup.fabric.events(w);
        assert_eq!(got.len(), requests.len(), "rank {rank}: {got:?}");
        for (e, (id, data, _)) in got.iter().zip(requests) {
            match e {
                HostEvent::Done { id: got_id, data: got_data } => {
                    assert_eq!(got_id, id, "rank {rank}");
                    assert_eq!(got_data, &data.as_ref().map(|d| sum(d)), "rank {rank} request {id}");
                }
                other => panic!("rank {rank}: unexpected {other:?}"),
            }
        }
    }
}

fn i32_request(id: u64, n: usize, len: usize) -> (u64, Option<Vec<Payload>>, u64) {
    let data = (0..n).map(|r| Payload::I32(i32_tensor(r, len, id))).collect();
    (id, Some(data), 4 * len as u64)
}

fn f32_request(id: u64, n: usize, len: usize) -> (u64, Option<Vec<Payload>>, u64) {
    let data = (0..n).map(|r| Payload::F32(f32_tensor(r, len, id))).collect();
    (id, Some(data), 4 * len as u64)
}

/// Every algorithm (and every rack layout) for a group of `n`.
fn algos(n: usize) -> Vec<Algo> {
    let mut v = vec![Algo::Ring, Algo::PsOne, Algo::PsSharded];
    v.extend((1..=n).filter(|r| n % r == 0).map(Algo::Hier));
    v
}

const SIZES: [usize; 5] = [1, 2, 3, 5, 8];

#[test]
fn every_algorithm_sums_i32_exactly() {
    for n in SIZES {
        for algo in algos(n) {
            // 1001 values: chunks of unequal odd lengths; 3 values: fewer values than members.
            for len in [1001, 3] {
                let mut s = build(algo, n, &TransportConfig::default(), 4 << 20);
                check(&mut s, &[i32_request(7, n, len)]);
            }
        }
    }
}

#[test]
fn every_algorithm_sums_f32_exactly() {
    for n in SIZES {
        for algo in algos(n) {
            let mut s = build(algo, n, &TransportConfig::default(), 4 << 20);
            check(&mut s, &[f32_request(3, n, 2047)]);
        }
    }
}

#[test]
fn back_to_back_requests_keep_their_ids() {
    for algo in algos(4) {
        // Small segments and partitions so that requests overlap on the wire.
        let cfg = TransportConfig { mss: 128, ..TransportConfig::default() };
        let mut s = build(algo, 4, &cfg, 1000);
        let reqs = [i32_request(1, 4, 777), f32_request(2, 4, 333), i32_request(1 << 40 | 9, 4, 1), i32_request(4, 4, 2000)];
        check(&mut s, &reqs);
    }
}

#[test]
fn metadata_mode_completes_without_values() {
    for algo in algos(6) {
        let mut s = build(algo, 6, &TransportConfig::default(), 1 << 14);
        // 10 007 bytes: not a multiple of 4, only possible in metadata mode.
        check(&mut s, &[(1, None, 10_007), (2, None, 0), (3, None, 100_000)]);
        let delivered = s.fabric.total("bytes_delivered");
        assert!(delivered >= 110_007, "{algo:?} moved only {delivered} B");
    }
}

#[test]
fn survives_dropped_data_and_acks() {
    let cfg = TransportConfig { mss: 256, ..TransportConfig::default() };
    for seed in 0..3 {
        for algo in [Algo::Ring, Algo::Hier(2), Algo::PsOne, Algo::PsSharded] {
            let mut s = build(algo, 4, &cfg, 2048);
            s.fabric.seed(seed);
            let loss = s.fabric.lose(Links::FromHosts, Rule::chance(0.03));
            check(&mut s, &[i32_request(1, 4, 3001), f32_request(2, 4, 1500)]);
            assert!(s.fabric.hits(loss) > 0, "{algo:?}: the pattern dropped nothing");
            assert!(s.fabric.total("retransmissions") > 0, "{algo:?}");
        }
    }
}

#[test]
fn survives_dropped_acks_only() {
    let cfg = TransportConfig { mss: 256, ..TransportConfig::default() };
    for algo in [Algo::Ring, Algo::Hier(2), Algo::PsOne, Algo::PsSharded] {
        let mut s = build(algo, 4, &cfg, 2048);
        // Losing every 3rd ACK is covered by later cumulative ACKs; losing a tail ACK needs a
        // timeout and a retransmission that the receiver must not deliver twice.
        s.fabric.seed(11);
        let loss = s.fabric.lose(Links::FromHosts, Rule::chance(0.2).only(is_ack));
        check(&mut s, &[i32_request(1, 4, 3001)]);
        assert!(s.fabric.hits(loss) > 0);
    }
}

#[test]
fn sharded_ps_spreads_partitions_over_servers() {
    let mut s = build(Algo::PsSharded, 3, &TransportConfig::default(), 400);
    check(&mut s, &[i32_request(5, 3, 1001)]);
    // 4004 B in 400 B partitions: 11 partitions, dealt 4/4/3 over the servers.
    let reduced: Vec<u64> = s.servers.iter().map(|&ep| s.fabric.counter(ep, "partitions_reduced")).collect();
    assert_eq!(reduced, vec![4, 4, 3]);
}

#[test]
fn ring_with_one_member_completes_at_once() {
    let mut s = build(Algo::Ring, 1, &TransportConfig::default(), 0);
    check(&mut s, &[i32_request(1, 1, 5)]);
    assert_eq!(s.fabric.stats().sent.packets, 0);
}

#[test]
fn ring_sends_two_n_minus_one_messages_per_member() {
    let n = 5;
    let mut s = build(Algo::Ring, n, &TransportConfig::default(), 0);
    check(&mut s, &[i32_request(1, n, 1001)]);
    // Chunks of at most 804 B fit one segment: 2 (N - 1) data packets per member.
    assert_eq!(s.fabric.total("data_packets_sent"), (n * 2 * (n - 1)) as u64);
}

#[test]
fn bad_requests_and_groups_are_rejected() {
    let eps = endpoints(4, 1);
    let racks = vec![eps[..3].to_vec(), eps[3..].to_vec()];
    assert!(HierarchicalAllreduce::new(racks, 0, TransportConfig::default()).is_err());
    assert!(RingAllreduce::new(eps.clone(), 4, TransportConfig::default()).is_err());
    assert!(RingAllreduce::new(vec![eps[0], eps[0]], 0, TransportConfig::default()).is_err());
    let bad_mss = TransportConfig { mss: 1437, ..TransportConfig::default() };
    assert!(RingAllreduce::new(eps.clone(), 0, bad_mss).is_err());
    let bad_part = PsConfig { partition_bytes: 6, ..PsConfig::default() };
    assert!(PsWorker::new(eps[0], vec![eps[1]], bad_part).is_err());

    let mut fabric = star(2);
    let w = fabric.add(Box::new(RingAllreduce::new(eps[..1].to_vec(), 0, TransportConfig::default()).unwrap()));
    fabric.submit(w, AppRequest::allreduce(9, 12, Some(Payload::I32(vec![1, 2]))));
    fabric.submit(w, AppRequest::Send { id: 10, dst: eps[1], bytes: 12 });
    let ev = fabric.events(w);
    assert!(matches!(ev[..], [HostEvent::Failed { id: 9, .. }, HostEvent::Failed { id: 10, .. }]), "{ev:?}");
}

#[test]
fn ecn_marks_slow_senders_but_keep_results_exact() {
    let cfg = TransportConfig { mss: 256, ..TransportConfig::default() };
    for algo in [Algo::Ring, Algo::Hier(2), Algo::PsOne, Algo::PsSharded] {
        let mut s = build(algo, 4, &cfg, 2048);
        s.fabric.seed(5);
        s.fabric.mark(Links::FromHosts, Rule::chance(0.3).only(is_data));
        check(&mut s, &[i32_request(1, 4, 3001)]);
        assert!(s.fabric.total("ecn_echoes") > 0, "{algo:?}");
    }
}

#[test]
fn large_metadata_allreduce_moves_the_expected_bytes() {
    // 64 MiB over 8 members: each member sends 2 (N - 1) / N of the tensor.
    let (n, bytes) = (8, 64u64 << 20);
    let mut s = build(Algo::Ring, n, &TransportConfig::default(), 0);
    check(&mut s, &[(1, None, bytes)]);
    assert_eq!(s.fabric.total("bytes_delivered"), n as u64 * 2 * (n as u64 - 1) * bytes / n as u64);
}
