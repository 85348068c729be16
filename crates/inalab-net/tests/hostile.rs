//! The switch under malformed and hostile traffic: random bytes, mutated frames and
//! well-formed frames with random header fields, from a registered neighbour without any job
//! key (they reach the parser and the tag check), from a tenant that joined a job of its own
//! and tags its garbage with that job's key (it reaches the program), and from strangers.
//! Every one must be counted and dropped or handled, the switch must keep serving, and a job
//! running meanwhile must get exact sums.

use inalab_core::frame;
use inalab_core::wire::{AtpHeader, Header, SwitchMlHeader};
use inalab_core::{Packet, Payload};
use inalab_net::client::{Client, ClientOptions};
use inalab_net::control;
use inalab_net::ps::{PsHandle, PsOptions};
use inalab_net::switch::{SwitchHandle, SwitchOptions};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use serde_json::json;
use inalab_net::auth::{self, FrameMac, Link};
use std::io::BufReader;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// A random frame; `tenant`: (its job, its node, its job's key) to name and tag with, `seq` its
/// sequence number.
fn random_frame(rng: &mut Xoshiro256PlusPlus, tenant: Option<(u32, u32, &FrameMac)>, seq: u64) -> Vec<u8> {
    let mut header = match rng.random_range(0..3) {
        0 => Header::Raw,
        1 => Header::Atp(AtpHeader {
            job: rng.random_range(2..6),
            seq: rng.random(),
            agg_index: rng.random_range(0..40_000),
            bitmap0: rng.random(),
            bitmap1: rng.random(),
            fan_in0: rng.random(),
            fan_in1: rng.random(),
            esi: rng.random_range(0..3),
            flags: rng.random_range(0..128),
        }),
        _ => Header::SwitchMl(SwitchMlHeader {
            job: rng.random_range(2..6),
            slot: rng.random_range(0..300),
            chunk: rng.random(),
            wid: rng.random_range(0..6),
            ver: rng.random_range(0..2),
            flags: rng.random_range(0..4),
            exp: rng.random(),
        }),
    };
    if let Some((job, _, _)) = tenant {
        match &mut header {
            Header::Atp(h) => h.job = job,
            Header::SwitchMl(h) => h.job = job,
            _ => {}
        }
    }
    let src = tenant.map_or_else(|| rng.random(), |t| t.1);
    let mut p = Packet::new(src, rng.random(), rng.random_range(0..4), 1, 0, header);
    let n = rng.random_range(0..80);
    p.payload = match rng.random_range(0..3) {
        0 => None,
        1 => Some(Box::new(Payload::I32((0..n).map(|_| rng.random()).collect()))),
        _ => Some(Box::new(Payload::F32((0..n).map(|_| rng.random()).collect()))),
    };
    let mut b = vec![];
    frame::encode(&p, &mut b);
    if let Some((_, node, mac)) = tenant {
        mac.seal(&mut b, 0, Link { from: node, to: auth::ANY }, seq);
    }
    match rng.random_range(0..4) {
        0 => {
            let i = rng.random_range(0..b.len());
            b[i] = rng.random();
        }
        1 => b.truncate(rng.random_range(0..b.len())),
        2 => b = (0..rng.random_range(0..200)).map(|_| rng.random()).collect(),
        _ => {}
    }
    b
}

/// The one worker of its own job 2 at `sw`, joined over the control plane: it learns the job's
/// key and its node id. The job lasts as long as `control` is open.
struct Tenant {
    udp: UdpSocket,
    control: (TcpStream, BufReader<TcpStream>),
    node: u32,
    mac: FrameMac,
}

impl Tenant {
    fn join(sw: &SwitchHandle, secret: &control::Secret, scheme: &str) -> Tenant {
        let udp = UdpSocket::bind(any_port()).unwrap();
        let mut ctl = TcpStream::connect(sw.control_addr).unwrap();
        let mut replies = BufReader::new(ctl.try_clone().unwrap());
        control::authenticate(&mut ctl, &mut replies, &secret.credential(control::AuthRole::Worker)).unwrap();
        let join = json!({"op": "join", "job": 2, "rank": 0, "world": 1, "config": {"scheme": scheme}, "udp": udp.local_addr().unwrap()});
        control::send_line(&mut ctl, &join).unwrap();
        let reply = control::read_line(&mut replies).unwrap().unwrap();
        let spec: control::JobSpec = serde_json::from_value(reply["spec"].clone()).unwrap();
        let (node, mac) = (reply["node"].as_u64().unwrap() as u32, spec.frame_mac().unwrap());
        Tenant { udp, control: (ctl, replies), node, mac }
    }
}

fn attack(program: &'static str, scheme: &'static str) {
    let sw = SwitchHandle::start(SwitchOptions { udp: any_port(), control: any_port(), ..SwitchOptions::new(&[program]) }).unwrap();
    let _ps = (program == "atp").then(|| {
        PsHandle::start(PsOptions { udp: any_port(), control: any_port(), switch: sw.control_addr, ..PsOptions::default() }).unwrap()
    });
    // A registered neighbour (attached as a switch, so its frames reach the program) and a stranger.
    let insider = UdpSocket::bind(any_port()).unwrap();
    let msg = json!({"op": "attach", "role": "switch", "node": 900, "udp": insider.local_addr().unwrap(), "control": "127.0.0.1:1"});
    let secret = control::Secret::load().unwrap();
    control::request(sw.control_addr, Some(&secret.credential(control::AuthRole::Switch)), &msg, Duration::from_secs(5)).unwrap();
    let stranger = UdpSocket::bind(any_port()).unwrap();
    // A tenant: a worker of its own one-worker job 2, which learns that job's key and node.
    let Tenant { udp: tenant, control: tenant_ctl, node: tenant_node, mac: tenant_mac } = Tenant::join(&sw, &secret, scheme);
    // A job runs while the attack goes on.
    let addr = sw.control_addr;
    let job = std::thread::spawn(move || {
        let workers: Vec<_> = (0..2)
            .map(|rank| {
                std::thread::spawn(move || {
                    let opts = ClientOptions { switch: addr, job: 1, rank, world: 2, config: json!({"scheme": scheme}), join_timeout: Duration::from_secs(20), secret: None, job_secret: None, link_rate_bps: None };
                    let c = Client::connect(opts).unwrap();
                    let v: Vec<f32> = (0..5000).map(|i| (i % 17) as f32 * 0.25 + rank as f32).collect();
                    let mut out = vec![];
                    for _ in 0..5 {
                        out = c.allreduce(v.clone()).unwrap();
                    }
                    c.close();
                    out
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect::<Vec<_>>()
    });
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
    let mut malformed_sent = 0;
    for i in 0..20_000 {
        let (from, key) = match i % 10 {
            0 => (&stranger, None),
            1..=4 => (&tenant, Some((2, tenant_node, &tenant_mac))),
            _ => (&insider, None),
        };
        let b = random_frame(&mut rng, key, i + 1);
        malformed_sent += frame::decode(&b).is_err() as u64;
        let _ = from.send_to(&b, sw.udp_addr);
        if i % 500 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let results = job.join().unwrap();
    for r in &results {
        for (i, x) in r.iter().enumerate() {
            let want = 2.0 * (i % 17) as f32 * 0.25 + 1.0;
            assert!((x - want).abs() < 1e-5, "value {i}: {x} != {want}");
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let st = sw.stats();
    assert!(st["malformed"].as_u64().unwrap() > 0, "{st}");
    assert!(st["malformed"].as_u64().unwrap() <= malformed_sent, "{st}");
    assert!(st["unknown_source"].as_u64().unwrap() > 0, "{st}");
    assert!(st["last_malformed"].is_string(), "{st}");
    // Untagged garbage never gets past the tag check; some of the tenant's tagged frames do
    // and reach the program (which drops or handles them), nothing else.
    let forged = &st["forged"];
    assert!(forged["no_key"].as_u64().unwrap_or(0) + forged["bad_tag"].as_u64().unwrap_or(0) > 1000, "{st}");
    assert!(st["unadmitted"].as_u64().unwrap() + st["no_route"].as_u64().unwrap() > 0, "tagged tenant frames reached the checks after the tag: {st}");
    // The tenant leaves without `leave`: its job is released and nothing stays held.
    drop(tenant_ctl);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while sw.stats()["jobs"] != json!([]) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = sw.stats();
    assert_eq!((st["jobs"].clone(), st["aggregators_in_use"].as_u64()), (json!([]), Some(0)), "{st}");
}

#[test]
fn switchml_switch_survives_hostile_packets() {
    attack("switchml", "switchml");
}

#[test]
fn atp_switch_survives_hostile_packets() {
    attack("atp", "atp");
}

/// Issue #12, finding 1: a party attached to the switch (or spoofing a worker's address) sent
/// SwitchML contributions as rank 1 (its node id guessed, zero values): 3 of 4 allreduces came
/// back wrong, and no counter moved. Here the forger even knows rank 1's node id (as an
/// on-path observer would); without the job's key its frames are counted as forged and
/// dropped, and every sum is exact.
#[test]
fn forged_contributions_for_a_live_job_are_dropped() {
    let sw = SwitchHandle::start(SwitchOptions { udp: any_port(), control: any_port(), ..SwitchOptions::new(&["switchml"]) }).unwrap();
    let forger = UdpSocket::bind(any_port()).unwrap();
    let msg = json!({"op": "attach", "role": "switch", "node": 900, "udp": forger.local_addr().unwrap(), "control": "127.0.0.1:1"});
    let secret = control::Secret::load().unwrap();
    control::request(sw.control_addr, Some(&secret.credential(control::AuthRole::Switch)), &msg, Duration::from_secs(5)).unwrap();
    let addr = sw.control_addr;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (node_tx, node_rx) = std::sync::mpsc::channel();
    let workers: Vec<_> = (0..2)
        .map(|rank| {
            let node_tx = node_tx.clone();
            std::thread::spawn(move || {
                let opts = ClientOptions { switch: addr, job: 1, rank, world: 2, config: json!({"scheme": "switchml"}), join_timeout: Duration::from_secs(20), secret: None, job_secret: None, link_rate_bps: None };
                let c = Client::connect(opts).unwrap();
                node_tx.send(c.spec.workers[1].node).unwrap();
                let v: Vec<f32> = (0..20_000).map(|i| (i % 13) as f32 + rank as f32).collect();
                let outs: Vec<Vec<f32>> = (0..8).map(|_| c.allreduce(v.clone()).unwrap()).collect();
                c.close();
                outs
            })
        })
        .collect();
    let victim = node_rx.recv().unwrap();
    // Forge rank 1's contributions (zeros) for every slot, chunk and version, until the job ends.
    let flood = {
        let (done, to) = (done.clone(), sw.udp_addr);
        std::thread::spawn(move || {
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(3);
            let mut sent = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let h = SwitchMlHeader { job: 1, slot: rng.random_range(0..128), chunk: rng.random_range(0..2000), wid: 1, ver: rng.random_range(0..2), flags: 0, exp: 0 };
                let mut p = Packet::new(victim, 1, 1, 1, 0, Header::SwitchMl(h));
                p.payload = Some(Box::new(Payload::I32(vec![0; 32])));
                let mut b = vec![];
                frame::encode(&p, &mut b);
                b.extend((0..auth::TRAILER_BYTES).map(|_| rng.random::<u8>()));
                let _ = forger.send_to(&b, to);
                sent += 1;
            }
            sent
        })
    };
    let results: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = flood.join().unwrap();
    assert!(sent > 100, "{sent} forged frames sent");
    for outs in &results {
        for out in outs {
            for (i, x) in out.iter().enumerate() {
                assert_eq!(*x, 2.0 * (i % 13) as f32 + 1.0, "value {i}");
            }
        }
    }
    let st = sw.stats();
    assert!(st["forged"]["bad_tag"].as_u64().unwrap() > 100, "forged frames counted: {st}");
}

/// Finding 6: a worker sent result-flagged packets of its own job, addressed to any node, and
/// the switch relayed them. The switch now sends a job's packets only to that job's workers and
/// PS (or to other switches): the tenant's relayed frames are counted and dropped, and the
/// victim's host never sees them.
#[test]
fn a_tenant_cannot_relay_through_the_switch() {
    let sw = SwitchHandle::start(SwitchOptions { udp: any_port(), control: any_port(), ..SwitchOptions::new(&["switchml"]) }).unwrap();
    let secret = control::Secret::load().unwrap();
    let connect = |job: u32, rank: usize, world: usize| {
        let opts = ClientOptions { switch: sw.control_addr, job, rank, world, config: json!({"scheme": "switchml"}), join_timeout: Duration::from_secs(20), secret: None, job_secret: None, link_rate_bps: None };
        std::thread::spawn(move || Client::connect(opts).unwrap())
    };
    let victims: Vec<_> = [connect(1, 0, 2), connect(1, 1, 2)].into_iter().map(|h| h.join().unwrap()).collect();
    // The tenant: the only worker of job 2, holding job 2's key.
    let Tenant { udp: tenant, node, mac, control: _job } = Tenant::join(&sw, &secret, "switchml");
    const SENT: u64 = 200;
    for i in 0..SENT {
        let h = SwitchMlHeader { job: 2, slot: 0, chunk: i as u32, wid: 0, ver: 0, flags: SwitchMlHeader::FLAG_RESULT, exp: 0 };
        let mut p = Packet::new(node, 1, victims[(i % 2) as usize].node, 1, 0, Header::SwitchMl(h));
        p.payload = Some(Box::new(Payload::I32(vec![7; 32])));
        let mut b = vec![];
        frame::encode(&p, &mut b);
        mac.seal(&mut b, 0, Link { from: node, to: auth::ANY }, i + 1);
        tenant.send_to(&b, sw.udp_addr).unwrap();
    }
    // Job 1 still works, and its hosts never saw a frame of job 2.
    let v: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    std::thread::scope(|s| {
        let runs: Vec<_> = victims.iter().map(|c| s.spawn(|| c.allreduce(v.clone()).unwrap())).collect();
        for r in runs {
            let out = r.join().unwrap();
            assert!(out.iter().enumerate().all(|(i, &x)| x == 2.0 * i as f32), "job 1's sum");
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while sw.stats()["outside_job"].as_u64() < Some(SENT) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = sw.stats();
    assert_eq!(st["outside_job"].as_u64(), Some(SENT), "{st}");
    for c in &victims {
        let io = &c.stats()["io"];
        assert_eq!((io["forged"].as_u64(), io["foreign"].as_u64()), (Some(0), Some(0)), "{io}");
    }
}

/// Issue #41 item 4: a replayed frame of an earlier iteration is counted and dropped. A tenant
/// (the one worker of job 2, holding its key) sends well-tagged SwitchML result frames to
/// itself, which the switch relays back; the same bytes sent again, a frame far behind the
/// newest, and a frame offered as another host's are each counted and never relayed.
#[test]
fn a_replayed_frame_is_counted_and_dropped_at_the_switch() {
    let sw = SwitchHandle::start(SwitchOptions { udp: any_port(), control: any_port(), ..SwitchOptions::new(&["switchml"]) }).unwrap();
    let Tenant { udp: tenant, node, mac, control: _job } = Tenant::join(&sw, &control::Secret::load().unwrap(), "switchml");
    tenant.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let frame = |iteration: u32, from: u32, seq: u64| {
        let h = SwitchMlHeader { job: 2, slot: 0, chunk: iteration, wid: 0, ver: (iteration % 2) as u8, flags: SwitchMlHeader::FLAG_RESULT, exp: 0 };
        let mut p = Packet::new(node, 1, node, 1, 0, Header::SwitchMl(h));
        p.payload = Some(Box::new(Payload::I32(vec![iteration as i32; 32])));
        let mut b = vec![];
        frame::encode(&p, &mut b);
        mac.seal(&mut b, 0, Link { from, to: auth::ANY }, seq);
        b
    };
    // What comes back to the tenant: the chunk (iteration) of each relayed frame, opened as
    // the switch sealed it for this host.
    let mut buf = [0u8; 2048];
    let mut relayed = || -> Option<u32> {
        let n = tenant.recv(&mut buf).ok()?;
        let (f, _) = mac.open(&buf[..n], Link { from: auth::ANY, to: node }).expect("the switch seals for this host");
        match frame::decode(f).unwrap().header {
            Header::SwitchMl(h) => Some(h.chunk),
            h => panic!("{h:?}"),
        }
    };
    let start = auth::first_seq();
    let first = frame(0, node, start);
    tenant.send_to(&first, sw.udp_addr).unwrap();
    assert_eq!(relayed(), Some(0));
    tenant.send_to(&frame(1, node, start + 1), sw.udp_addr).unwrap();
    assert_eq!(relayed(), Some(1));
    // Iteration 0's datagram again, byte for byte.
    tenant.send_to(&first, sw.udp_addr).unwrap();
    assert_eq!(relayed(), None, "a replay is not relayed");
    // A frame from far ahead moves the window; one never seen but now behind it is stale.
    tenant.send_to(&frame(2, node, start + 2 * auth::REPLAY_WINDOW), sw.udp_addr).unwrap();
    assert_eq!(relayed(), Some(2));
    tenant.send_to(&frame(3, node, start + 2), sw.udp_addr).unwrap();
    assert_eq!(relayed(), None, "a frame behind the window is not relayed");
    // Sealed as another host (node + 1) and sent from the tenant's address: the tag binds the sealer.
    tenant.send_to(&frame(4, node + 1, start + 3 * auth::REPLAY_WINDOW), sw.udp_addr).unwrap();
    assert_eq!(relayed(), None);
    let st = sw.stats();
    assert_eq!((st["forged"]["replayed"].as_u64(), st["forged"]["stale"].as_u64(), st["forged"]["bad_tag"].as_u64()), (Some(1), Some(1), Some(1)), "{st}");
}

/// The same at a host: a datagram from its switch accepted once, a copy counted as `replayed`,
/// and one sealed for another host counted as `forged`.
#[test]
fn a_replayed_frame_is_counted_and_dropped_at_a_host() {
    let gateway = UdpSocket::bind(any_port()).unwrap();
    let udp = inalab_net::udp::Udp::bind(any_port()).unwrap();
    let me_addr = udp.local_addr().unwrap();
    let mut io = inalab_net::host::HostIo::new(udp, gateway.local_addr().unwrap());
    let mac = FrameMac::new(&auth::random_key());
    io.add_job(5, mac.clone(), 3);
    let sealed = |to: u32, seq: u64| {
        let h = SwitchMlHeader { job: 5, slot: 1, chunk: seq as u32, wid: 0, ver: 0, flags: SwitchMlHeader::FLAG_RESULT, exp: 0 };
        let mut b = vec![];
        frame::encode(&Packet::new(0, 1, 3, 1, 0, Header::SwitchMl(h)), &mut b);
        mac.seal(&mut b, 0, Link { from: auth::ANY, to }, seq);
        b
    };
    let once = sealed(3, 10);
    for d in [&once, &once, &sealed(4, 11), &sealed(3, 12)] {
        gateway.send_to(d, me_addr).unwrap();
    }
    let mut got = vec![];
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while got.len() < 2 && std::time::Instant::now() < deadline {
        io.recv(|p| got.push(p.header)).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    io.recv(|p| got.push(p.header)).unwrap();
    let chunks: Vec<u32> = got.iter().map(|h| if let Header::SwitchMl(h) = h { h.chunk } else { panic!() }).collect();
    assert_eq!(chunks, [10, 12]);
    let st = io.stats();
    assert_eq!((st["replayed"].as_u64(), st["forged"].as_u64()), (Some(1), Some(1)), "{st}");
}
