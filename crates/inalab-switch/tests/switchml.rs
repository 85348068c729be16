//! SwitchML end to end: `SwitchMlWorker`s (inalab-host) through a `SwitchMlSwitch` on a
//! small star driver: host `h` hangs off switch port `h`; NICs and switch egress ports
//! serialize at `RATE` and links add `DELAY`; test closures drop packets going up (worker
//! packets) or down (results).

use inalab_core::time::{serialization, Time, MS, S, US};
use inalab_core::wire::{Header, SwitchMlHeader};
use inalab_core::{
    splitmix64, AppRequest, Endpoint, HostEvent, HostProtocol, NodeId, Packet, Payload, PortId, SwitchAction,
    SwitchCtx, SwitchProgram,
};
use inalab_host::{SwitchMlConfig, SwitchMlWorker};
use inalab_switch::{SwitchMlJob, SwitchMlSwitch};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

const RATE: u64 = 100_000_000_000;
const DELAY: Time = US;
const SW: NodeId = 1000;
const SW_EP: Endpoint = Endpoint { host: SW, port: 9000 };
const WORKER_PORT: u16 = 5;

type Filter = Box<dyn FnMut(&Packet) -> bool>;

enum Ev {
    NicFree(usize),
    AtSwitch(Packet),
    AtHost(Packet),
    Timer(usize, Time),
}

struct Ctx(usize);
impl SwitchCtx for Ctx {
    fn node(&self) -> NodeId {
        SW
    }
    fn num_ports(&self) -> usize {
        self.0
    }
    fn queue_bytes(&self, _port: PortId) -> u64 {
        0
    }
    fn peer(&self, port: PortId) -> NodeId {
        port as NodeId
    }
}

struct Net {
    now: Time,
    hosts: Vec<Box<dyn HostProtocol>>,
    armed: Vec<Option<Time>>,
    nic_busy: Vec<bool>,
    port_free: Vec<Time>,
    sw: SwitchMlSwitch,
    heap: BinaryHeap<Reverse<(Time, u64)>>,
    pending: BTreeMap<u64, Ev>,
    seq: u64,
    drop_up: Filter,
    drop_down: Filter,
    events: Vec<(usize, Time, HostEvent)>,
    lost: u64,
    /// Results lost on the way down.
    lost_down: u64,
}

impl Net {
    fn new(sw: SwitchMlSwitch) -> Self {
        Net {
            now: 0,
            hosts: Vec::new(),
            armed: Vec::new(),
            nic_busy: Vec::new(),
            port_free: Vec::new(),
            sw,
            heap: BinaryHeap::new(),
            pending: BTreeMap::new(),
            seq: 0,
            drop_up: Box::new(|_| false),
            drop_down: Box::new(|_| false),
            events: Vec::new(),
            lost: 0,
            lost_down: 0,
        }
    }

    /// Adds the protocol of host `hosts.len()`.
    fn add(&mut self, p: Box<dyn HostProtocol>) {
        assert_eq!(p.endpoint().host as usize, self.hosts.len());
        self.hosts.push(p);
        self.armed.push(None);
        self.nic_busy.push(false);
        self.port_free.push(0);
    }

    fn schedule(&mut self, at: Time, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq)));
        self.pending.insert(self.seq, ev);
    }

    fn submit(&mut self, h: usize, req: AppRequest) {
        self.hosts[h].submit(self.now, req);
        self.after_input(h);
    }

    fn after_input(&mut self, h: usize) {
        self.kick(h);
        let t = self.hosts[h].poll_timeout();
        if t != self.armed[h] {
            self.armed[h] = t;
            if let Some(t) = t {
                self.schedule(t.max(self.now), Ev::Timer(h, t));
            }
        }
        while let Some(e) = self.hosts[h].poll_event() {
            self.events.push((h, self.now, e));
        }
    }

    fn kick(&mut self, h: usize) {
        if self.nic_busy[h] {
            return;
        }
        let Some(pkt) = self.hosts[h].poll_transmit(self.now) else { return };
        self.nic_busy[h] = true;
        let done = self.now + serialization(pkt.size as u64, RATE);
        self.schedule(done, Ev::NicFree(h));
        if (self.drop_up)(&pkt) {
            self.lost += 1;
        } else {
            self.schedule(done + DELAY, Ev::AtSwitch(pkt));
        }
    }

    fn egress(&mut self, port: PortId, pkt: Packet) {
        if (self.drop_down)(&pkt) {
            assert!(is_result(&pkt));
            self.lost += 1;
            self.lost_down += 1;
            return;
        }
        assert_eq!(pkt.dst, port as NodeId, "forwarded toward the wrong port");
        let p = port as usize;
        let depart = self.now.max(self.port_free[p]) + serialization(pkt.size as u64, RATE);
        self.port_free[p] = depart;
        self.schedule(depart + DELAY, Ev::AtHost(pkt));
    }

    fn run(&mut self, until: Time) -> bool {
        while let Some(&Reverse((t, s))) = self.heap.peek() {
            if t > until {
                return false;
            }
            self.heap.pop();
            self.now = t;
            match self.pending.remove(&s).expect("scheduled") {
                Ev::NicFree(h) => {
                    self.nic_busy[h] = false;
                    self.after_input(h);
                }
                Ev::AtHost(pkt) => {
                    let h = pkt.dst as usize;
                    assert_eq!(pkt.dst_port, self.hosts[h].endpoint().port);
                    self.hosts[h].handle_packet(t, pkt);
                    self.after_input(h);
                }
                Ev::AtSwitch(pkt) => {
                    let mut out = Vec::new();
                    let in_port = pkt.src as PortId;
                    self.sw.on_packet(t, &Ctx(self.hosts.len()), in_port, pkt, &mut out);
                    for a in out {
                        match a {
                            SwitchAction::Forward { port, pkt } => self.egress(port, pkt),
                            SwitchAction::Route { pkt } => self.egress(pkt.dst as PortId, pkt),
                            SwitchAction::Multicast { ports, pkt } => {
                                ports.into_iter().for_each(|p| self.egress(p, pkt.clone()))
                            }
                            SwitchAction::Drop { .. } => {}
                            SwitchAction::SetTimer { .. } => panic!("SwitchML sets no timers"),
                        }
                    }
                }
                Ev::Timer(h, at) => {
                    if self.armed[h] == Some(at) {
                        self.armed[h] = None;
                        self.hosts[h].handle_timeout(t);
                        self.after_input(h);
                    }
                }
            }
        }
        true
    }

    fn counter(&self, h: usize, name: &str) -> u64 {
        self.hosts[h].counters().into_iter().find(|c| c.0 == name).map_or(0, |c| c.1)
    }

    fn total(&self, name: &str) -> u64 {
        (0..self.hosts.len()).map(|h| self.counter(h, name)).sum()
    }

    fn sw_counter(&self, name: &str) -> u64 {
        self.sw.counters().into_iter().find(|c| c.0 == name).expect("switch counter").1
    }
}

fn is_result(p: &Packet) -> bool {
    matches!(&p.header, Header::SwitchMl(h) if h.flags & SwitchMlHeader::FLAG_RESULT != 0)
}

/// Drops each packet with probability `per_mille / 1000`, from a seeded sequence.
fn random_drop(seed: u64, per_mille: u64) -> Filter {
    let mut n = seed.wrapping_mul(0x9E37_79B9);
    Box::new(move |_| {
        n += 1;
        splitmix64(n) % 1000 < per_mille
    })
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

/// Admits the jobs and adds their workers (hosts must be numbered 0.. in job order).
fn build(jobs: &[JobSetup], slots: u32, timeout_ps: Time) -> Net {
    let mut sw = SwitchMlSwitch::with_slots(slots);
    for j in jobs {
        let workers = j.hosts.iter().map(|&h| (Endpoint { host: h as u32, port: WORKER_PORT }, h as PortId)).collect();
        sw.admit_job(j.job, SwitchMlJob { workers, pool_slots: j.pool }).expect("admitted");
    }
    let mut net = Net::new(sw);
    let mut all: Vec<(usize, u32, u16, u32)> = Vec::new();
    for j in jobs {
        all.extend(j.hosts.iter().enumerate().map(|(w, &h)| (h, j.job, w as u16, j.pool)));
    }
    all.sort();
    for (h, job, wid, pool) in all {
        let cfg = SwitchMlConfig { pool_slots: pool, timeout_ps, ..SwitchMlConfig::new(job, wid, SW_EP) };
        net.add(Box::new(SwitchMlWorker::new(Endpoint { host: h as u32, port: WORKER_PORT }, cfg).expect("valid")));
    }
    net
}

/// Submits the requests (values per request) to every worker of every job, runs to
/// quiescence and checks every worker got the exact sums. Returns the finish time.
fn run_exact(net: &mut Net, jobs: &[JobSetup], sizes: &[usize], salt: u64) -> Time {
    let mut want: BTreeMap<(u32, u64), Vec<i32>> = BTreeMap::new();
    for j in jobs {
        for (r, &len) in sizes.iter().enumerate() {
            let id = r as u64 + 10;
            let mut sum = vec![0i32; len];
            for (w, &h) in j.hosts.iter().enumerate() {
                let t = tensor(w, len, salt ^ (j.job as u64) << 20 ^ r as u64);
                sum.iter_mut().zip(&t).for_each(|(a, b)| *a += b);
                net.submit(h, AppRequest::Allreduce { id, bytes: 4 * len as u64, data: Some(Payload::I32(t)) });
            }
            want.insert((j.job, id), sum);
        }
    }
    assert!(net.run(10 * S), "did not go quiet");
    for j in jobs {
        for &h in &j.hosts {
            let mut got: Vec<u64> = Vec::new();
            for (_, _, e) in net.events.iter().filter(|e| e.0 == h) {
                match e {
                    HostEvent::Done { id, data } => {
                        assert_eq!(
                            data.as_ref(),
                            Some(&Payload::I32(want[&(j.job, *id)].clone())),
                            "job {} host {h} request {id}",
                            j.job
                        );
                        got.push(*id);
                    }
                    e => panic!("host {h}: {e:?}"),
                }
            }
            got.sort();
            assert_eq!(got, (10..10 + sizes.len() as u64).collect::<Vec<_>>(), "host {h}");
        }
    }
    let chunks: u64 = sizes.iter().map(|&s| s.div_ceil(32) as u64).sum::<u64>() * jobs.len() as u64;
    assert_eq!(net.sw_counter("completed"), chunks);
    assert_eq!(net.sw_counter("overflows"), 0);
    assert_eq!(net.sw_counter("rejected"), 0);
    assert_eq!(net.sw.aggregators_in_use(), 0);
    net.events.iter().map(|e| e.1).max().unwrap_or(0)
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
            assert_eq!(net.sw_counter("aggregated"), n as u64 * chunks);
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
            net.drop_up = random_drop(seed, up);
            net.drop_down = random_drop(seed + 1000, down);
            let t = run_exact(&mut net, &jobs, &sizes, seed);
            let ctx = format!("n {n} pool {pool} up {up} down {down}");
            assert!(net.lost > 0, "{ctx}");
            assert!(net.total("timeouts") > 0 && net.total("retransmissions") > 0, "{ctx}");
            assert!(t > timeout, "{ctx}: recovery waits for the timeout");
            // A lost result is recovered by a retransmission the switch answers from the
            // completed copy (with up loss only, late retransmissions may be answered too).
            assert!(net.lost_down == 0 || net.sw_counter("retransmissions_answered") > 0, "{ctx}");
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
    assert_eq!(net.sw.free_slots(), 0);
    run_exact(&mut net, &jobs, &[700, 40], 9);
    // The same under loss: the jobs' retransmissions never touch each other's slots.
    let mut net = build(&jobs, 16, 50 * US);
    net.drop_up = random_drop(5, 40);
    net.drop_down = random_drop(6, 40);
    run_exact(&mut net, &jobs, &[700, 40], 10);
    assert!(net.total("timeouts") > 0);
}

#[test]
fn metadata_mode_moves_full_packets() {
    let jobs = one_job(3, 8);
    let mut net = build(&jobs, 8, MS);
    for h in 0..3 {
        net.submit(h, AppRequest::Allreduce { id: 1, bytes: 1001, data: None });
        net.submit(h, AppRequest::Allreduce { id: 2, bytes: 0, data: None });
    }
    assert!(net.run(S));
    for h in 0..3 {
        let ids: Vec<u64> = net
            .events
            .iter()
            .filter(|e| e.0 == h)
            .map(|e| match &e.2 {
                HostEvent::Done { id, data: None } => *id,
                e => panic!("{e:?}"),
            })
            .collect();
        assert_eq!(ids, vec![2, 1], "zero-byte request done at once");
    }
    // 1001 B = 251 values = 8 chunks of 32.
    assert_eq!(net.total("packets_sent"), 3 * 8);
    assert_eq!(net.sw_counter("completed"), 8);
}

#[test]
fn bad_requests_and_configs_are_refused() {
    let cfg = SwitchMlConfig::new(1, 0, SW_EP);
    assert_eq!(
        (cfg.pool_slots, cfg.timeout_ps, cfg.packet_bytes, cfg.header_bytes, cfg.values_per_packet()),
        (128, MS, 180, 52, 32)
    );
    let ep = Endpoint { host: 0, port: 1 };
    assert!(SwitchMlWorker::new(ep, SwitchMlConfig { pool_slots: 0, ..cfg.clone() }).is_err());
    assert!(SwitchMlWorker::new(ep, SwitchMlConfig { timeout_ps: 0, ..cfg.clone() }).is_err());
    assert!(SwitchMlWorker::new(ep, SwitchMlConfig { header_bytes: 178, ..cfg.clone() }).is_err());
    let mut w = SwitchMlWorker::new(ep, cfg).unwrap();
    w.submit(0, AppRequest::Allreduce { id: 1, bytes: 8, data: Some(Payload::F32(vec![1.0, 2.0])) });
    w.submit(0, AppRequest::Allreduce { id: 2, bytes: 12, data: Some(Payload::I32(vec![1, 2])) });
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
    net.drop_down = Box::new(move |p| {
        let hit = !lost && p.dst == 1 && matches!(&p.header, Header::SwitchMl(h) if h.chunk == 0);
        lost |= hit;
        hit
    });
    let t = run_exact(&mut net, &jobs, &[32 * 5], 3);
    assert_eq!(net.lost_down, 1);
    assert_eq!((net.counter(1, "timeouts"), net.counter(1, "retransmissions")), (1, 1));
    // Slot 0 stalls until worker 1 recovers, so the others' next chunk on it times out too
    // (SwitchML's cost of a lost result); those retransmissions are answered or dropped as
    // stale, never aggregated twice.
    let rtx = net.total("retransmissions");
    assert_eq!(rtx, 3);
    assert!(net.sw_counter("retransmissions_answered") >= 1);
    assert_eq!(net.sw_counter("retransmissions_answered") + net.sw_counter("dropped_stale"), rtx);
    assert_eq!(net.sw_counter("aggregated"), 3 * 5, "the retransmission is not aggregated again");
    assert!(t > MS && t < MS + 100 * US, "one timeout of 1 ms: {t}");
}
