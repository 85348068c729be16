//! SwitchML end to end: `SwitchMlWorker`s (inalab-host) through a `SwitchMlSwitch` on the
//! test fabric's star: host `h` hangs off switch port `h`; NICs and switch egress ports
//! serialize at `RATE` and links add `DELAY`; filters drop packets going up (worker packets)
//! or down (results).

use inalab_core::time::{Time, MS, S, US};
use inalab_core::wire::{Header, SwitchMlHeader};
use inalab_core::{splitmix64, AppRequest, Endpoint, HostEvent, HostProtocol, NodeId, Packet, Payload, PortId, SwitchProgram};
use inalab_host::{SwitchMlConfig, SwitchMlWorker};
use inalab_switch::{SwitchMlJob, SwitchMlSwitch};
use inalab_testkit::{Fabric, Filter, Link, Links, Rule};
use std::collections::BTreeMap;

const RATE: u64 = 100_000_000_000;
const DELAY: Time = US;
const SW_PORT: u16 = 9000;
const WORKER_PORT: u16 = 5;

const LINK: Link = Link { delay: DELAY, rate_bps: RATE };

/// The star's switch (it runs a `SwitchMlSwitch`).
fn switch(f: &Fabric) -> NodeId {
    f.tor(0)
}

fn sw_counter(f: &Fabric, name: &str) -> u64 {
    f.switch_counter(switch(f), name)
}

/// Drops worker packets going up and results going down with probabilities `up` and
/// `down` (per mille), from streams seeded by `seed`.
fn random_drop(f: &mut Fabric, seed: u64, up: u32, down: u32) -> (Filter, Filter) {
    f.seed(seed);
    let up = f.lose(Links::FromHosts, Rule::chance(up as f64 / 1000.0));
    (up, f.lose(Links::ToHosts, Rule::chance(down as f64 / 1000.0)))
}

fn worker(h: usize) -> Endpoint {
    Endpoint { host: h as u32, port: WORKER_PORT }
}

fn is_result(p: &Packet) -> bool {
    matches!(&p.header, Header::SwitchMl(h) if h.flags & SwitchMlHeader::FLAG_RESULT != 0)
}

/// Worker `rank`'s values: within ±2^20, so sums of up to 2^10 workers never saturate.
fn tensor(rank: usize, len: usize, salt: u64) -> Vec<i32> {
    (0..len).map(|i| (splitmix64(salt ^ (rank as u64) << 40 ^ i as u64) % (1 << 21)) as i32 - (1 << 20)).collect()
}

struct JobSetup {
    job: u32,
    /// Hosts of the job's workers, in wid order.
    hosts: Vec<usize>,
    pool: u32,
}

/// A star of the jobs' hosts (numbered 0.. in job order) around a `SwitchMlSwitch` that
/// admitted the jobs, with their workers. Every packet going down must be a result for the
/// host on the far side of its port.
fn build(jobs: &[JobSetup], slots: u32, timeout_ps: Time) -> Fabric {
    let mut program = SwitchMlSwitch::with_slots(slots);
    for j in jobs {
        let workers = j.hosts.iter().map(|&h| (worker(h), h as PortId)).collect();
        program.admit_job(j.job, SwitchMlJob { workers, pool_slots: j.pool, values_per_packet: 32 }).expect("admitted");
    }
    let mut f = Fabric::star(jobs.iter().map(|j| j.hosts.len()).sum(), LINK);
    let sw = switch(&f);
    f.install(sw, program);
    f.tap(Links::ToHosts, |hop, p| {
        assert!(is_result(p));
        assert_eq!(p.dst, hop.to, "forwarded toward the wrong port");
    });
    let sw_ep = Endpoint { host: sw, port: SW_PORT };
    for j in jobs {
        for (wid, &h) in j.hosts.iter().enumerate() {
            let cfg = SwitchMlConfig { pool_slots: j.pool, timeout_ps, ..SwitchMlConfig::new(j.job, wid as u16, sw_ep) };
            f.add(Box::new(SwitchMlWorker::new(worker(h), cfg).expect("valid")));
        }
    }
    f
}

/// Submits the requests (values per request) to every worker of every job, runs to
/// quiescence and checks every worker got the exact sums. Returns the finish time.
fn run_exact(net: &mut Fabric, jobs: &[JobSetup], sizes: &[usize], salt: u64) -> Time {
    let mut want: BTreeMap<(u32, u64), Vec<i32>> = BTreeMap::new();
    for j in jobs {
        for (r, &len) in sizes.iter().enumerate() {
            let id = r as u64 + 10;
            let mut sum = vec![0i32; len];
            for (w, &h) in j.hosts.iter().enumerate() {
                let t = tensor(w, len, salt ^ (j.job as u64) << 20 ^ r as u64);
                sum.iter_mut().zip(&t).for_each(|(a, b)| *a += b);
                net.submit(worker(h), AppRequest::allreduce(id, 4 * len as u64, Some(Payload::I32(t))));
            }
            want.insert((j.job, id), sum);
        }
    }
    assert!(net.run(10 * S), "did not go quiet");
    net.check_conservation().unwrap();
    for j in jobs {
        for &h in &j.hosts {
            let mut got: Vec<u64> = Vec::new();
            for e in net.events(worker(h)) {
                match e {
                    HostEvent::Done { id, data } => {
                        assert_eq!(
                            data.as_ref(),
                            Some(&Payload::I32(want[&(j.job, id)].clone())),
                            "job {} host {h} request {id}",
                            j.job
                        );
                        got.push(id);
                    }
                    e => panic!("host {h}: {e:?}"),
                }
            }
            got.sort();
            assert_eq!(got, (10..10 + sizes.len() as u64).collect::<Vec<_>>(), "host {h}");
        }
    }
    let chunks: u64 = sizes.iter().map(|&s| s.div_ceil(32) as u64).sum::<u64>() * jobs.len() as u64;
    assert_eq!(sw_counter(net, "completed"), chunks);
    assert_eq!(sw_counter(net, "overflows"), 0);
    assert_eq!(sw_counter(net, "rejected"), 0);
    assert_eq!(net.program::<SwitchMlSwitch>(switch(net)).aggregators_in_use(), 0);
    let hosts = jobs.iter().flat_map(|j| &j.hosts);
    hosts.flat_map(|&h| net.timed_events(worker(h))).map(|e| e.0).max().unwrap_or(0)
}

fn one_job(n: usize, pool: u32) -> Vec<JobSetup> {
    vec![JobSetup { job: 7, hosts: (0..n).collect(), pool }]
}

#[test]
fn exact_sums_without_loss() {
    // 1000 values = 31.25 chunks; 33 = 1.03 chunks; 5 < one chunk; 64 = exactly 2.
    let sizes = [1000, 33, 5, 64];
    for n in [2, 3, 8] {
        for pool in [1, 4, 37, 64] {
            let jobs = one_job(n, pool);
            let mut net = build(&jobs, 128, MS);
            run_exact(&mut net, &jobs, &sizes, n as u64 * 100 + pool as u64);
            let chunks = 32 + 2 + 1 + 2;
            assert_eq!(net.total("packets_sent"), n as u64 * chunks, "n {n} pool {pool}: one packet per chunk");
            assert_eq!(net.total("timeouts") + net.total("retransmissions") + net.total("stale_results"), 0);
            assert_eq!(sw_counter(&net, "aggregated"), n as u64 * chunks);
        }
    }
}

#[test]
fn larger_pools_finish_faster() {
    let sizes = [32 * 200];
    let time = |pool| {
        let jobs = one_job(4, pool);
        let mut net = build(&jobs, 1024, MS);
        run_exact(&mut net, &jobs, &sizes, 1)
    };
    let (t1, t8, t300) = (time(1), time(8), time(300));
    // One slot: a round trip per chunk (> 2 us each).
    assert!(t1 > 200 * 2 * DELAY, "{t1}");
    assert!(t8 * 4 < t1, "{t8} vs {t1}");
    assert!(t300 <= t8, "{t300} vs {t8}");
}

#[test]
fn recovers_from_lost_worker_packets_and_results() {
    let sizes = [1000, 77];
    for (n, pool, seed) in [(2, 4, 1u64), (3, 16, 2), (8, 64, 3), (8, 3, 4)] {
        for (up, down) in [(50, 0), (0, 50), (30, 30)] {
            let jobs = one_job(n, pool);
            let timeout = 100 * US;
            let mut net = build(&jobs, 128, timeout);
            let (drop_up, drop_down) = random_drop(&mut net, seed, up, down);
            let t = run_exact(&mut net, &jobs, &sizes, seed);
            let ctx = format!("n {n} pool {pool} up {up} down {down}");
            let lost_down = net.hits(drop_down);
            assert!(net.hits(drop_up) + lost_down > 0, "{ctx}");
            assert!(net.total("timeouts") > 0 && net.total("retransmissions") > 0, "{ctx}");
            assert!(t > timeout, "{ctx}: recovery waits for the timeout");
            // A lost result is recovered by a retransmission the switch answers from the
            // completed copy (with up loss only, late retransmissions may be answered too).
            assert!(lost_down == 0 || sw_counter(&net, "retransmissions_answered") > 0, "{ctx}");
        }
    }
}

#[test]
fn two_jobs_share_the_switch_with_separate_partitions() {
    let jobs = vec![
        JobSetup { job: 1, hosts: vec![0, 1, 2], pool: 5 },
        JobSetup { job: 2, hosts: vec![3, 4, 5, 6], pool: 11 },
    ];
    let mut net = build(&jobs, 16, MS);
    assert_eq!(net.program::<SwitchMlSwitch>(switch(&net)).free_slots(), 0);
    run_exact(&mut net, &jobs, &[700, 40], 9);
    // The same under loss: the jobs' retransmissions never touch each other's slots.
    let mut net = build(&jobs, 16, 50 * US);
    random_drop(&mut net, 5, 40, 40);
    run_exact(&mut net, &jobs, &[700, 40], 10);
    assert!(net.total("timeouts") > 0);
}

#[test]
fn metadata_mode_moves_full_packets() {
    let jobs = one_job(3, 8);
    let mut net = build(&jobs, 8, MS);
    for h in 0..3 {
        net.submit(worker(h), AppRequest::allreduce(1, 1001, None));
        net.submit(worker(h), AppRequest::allreduce(2, 0, None));
    }
    assert!(net.run(S));
    for h in 0..3 {
        let ids: Vec<u64> = net
            .events(worker(h))
            .into_iter()
            .map(|e| match e {
                HostEvent::Done { id, data: None } => id,
                e => panic!("{e:?}"),
            })
            .collect();
        assert_eq!(ids, vec![2, 1], "zero-byte request done at once");
    }
    // 1001 B = 251 values = 8 chunks of 32.
    assert_eq!(net.total("packets_sent"), 3 * 8);
    assert_eq!(sw_counter(&net, "completed"), 8);
}

#[test]
fn bad_requests_and_configs_are_refused() {
    let cfg = SwitchMlConfig::new(1, 0, Endpoint { host: 1000, port: SW_PORT });
    assert_eq!(
        (cfg.pool_slots, cfg.timeout_ps, cfg.packet_bytes, cfg.header_bytes, cfg.values_per_packet()),
        (128, MS, 180, 52, 32)
    );
    let ep = Endpoint { host: 0, port: 1 };
    assert!(SwitchMlWorker::new(ep, SwitchMlConfig { pool_slots: 0, ..cfg.clone() }).is_err());
    assert!(SwitchMlWorker::new(ep, SwitchMlConfig { timeout_ps: 0, ..cfg.clone() }).is_err());
    assert!(SwitchMlWorker::new(ep, SwitchMlConfig { header_bytes: 178, ..cfg.clone() }).is_err());
    let mut w = SwitchMlWorker::new(ep, cfg).unwrap();
    w.submit(0, AppRequest::allreduce(1, 8, Some(Payload::F32(vec![1.0, 2.0]))));
    w.submit(0, AppRequest::allreduce(2, 12, Some(Payload::I32(vec![1, 2]))));
    w.submit(0, AppRequest::Send { id: 3, dst: ep, bytes: 10 });
    for id in 1..=3 {
        assert!(matches!(w.poll_event(), Some(HostEvent::Failed { id: i, .. }) if i == id));
    }
    assert!(w.poll_transmit(0).is_none());
    assert_eq!(w.poll_timeout(), None);
}

#[test]
fn a_lost_result_is_answered_from_the_shadow_copy_after_one_timeout() {
    let jobs = one_job(3, 2);
    let mut net = build(&jobs, 2, MS);
    // Lose the result of chunk 0 on its way to worker 1, once.
    let mut lost = false;
    let drop_down = net.lose(
        Links::ToHosts,
        Rule::when(move |p| {
            let hit = !lost && p.dst == 1 && matches!(&p.header, Header::SwitchMl(h) if h.chunk == 0);
            lost |= hit;
            hit
        }),
    );
    let t = run_exact(&mut net, &jobs, &[32 * 5], 3);
    assert_eq!(net.hits(drop_down), 1);
    assert_eq!((net.counter(worker(1), "timeouts"), net.counter(worker(1), "retransmissions")), (1, 1));
    // Slot 0 stalls until worker 1 recovers, so the others' next chunk on it times out too
    // (SwitchML's cost of a lost result); those retransmissions are answered or dropped as
    // stale, never aggregated twice.
    let rtx = net.total("retransmissions");
    assert_eq!(rtx, 3);
    assert!(sw_counter(&net, "retransmissions_answered") >= 1);
    assert_eq!(sw_counter(&net, "retransmissions_answered") + sw_counter(&net, "dropped_stale"), rtx);
    assert_eq!(sw_counter(&net, "aggregated"), 3 * 5, "the retransmission is not aggregated again");
    assert!(t > MS && t < MS + 100 * US, "one timeout of 1 ms: {t}");
}
