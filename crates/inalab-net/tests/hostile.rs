//! The switch under malformed and hostile traffic: random bytes, mutated frames and
//! well-formed frames with random header fields, from a registered neighbour (so they reach
//! the parser and the program) and from strangers. Every one must be counted and dropped or
//! handled, the switch must keep serving, and a job running meanwhile must get exact sums.
//! Hostile headers name other jobs than the live one: a neighbour switch is trusted with the
//! live job's packets, as in the papers.

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
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn random_frame(rng: &mut Xoshiro256PlusPlus) -> Vec<u8> {
    let header = match rng.random_range(0..3) {
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
    let mut p = Packet::new(rng.random(), rng.random(), rng.random_range(0..4), 1, 0, header);
    let n = rng.random_range(0..80);
    p.payload = match rng.random_range(0..3) {
        0 => None,
        1 => Some(Box::new(Payload::I32((0..n).map(|_| rng.random()).collect()))),
        _ => Some(Box::new(Payload::F32((0..n).map(|_| rng.random()).collect()))),
    };
    let mut b = vec![];
    frame::encode(&p, &mut b);
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

fn attack(program: &'static str, scheme: &'static str) {
    let sw = SwitchHandle::start(SwitchOptions { udp: any_port(), control: any_port(), ..SwitchOptions::new(&[program]) }).unwrap();
    let _ps = (program == "atp").then(|| {
        PsHandle::start(PsOptions { udp: any_port(), control: any_port(), switch: sw.control_addr, ..PsOptions::default() }).unwrap()
    });
    // A registered neighbour (attached as a switch, so its frames reach the program) and a stranger.
    let insider = UdpSocket::bind(any_port()).unwrap();
    let msg = json!({"op": "attach", "role": "switch", "node": 900, "udp": insider.local_addr().unwrap(), "control": "127.0.0.1:1"});
    control::request(sw.control_addr, &msg, Duration::from_secs(5)).unwrap();
    let stranger = UdpSocket::bind(any_port()).unwrap();
    // A job runs while the attack goes on.
    let addr = sw.control_addr;
    let job = std::thread::spawn(move || {
        let workers: Vec<_> = (0..2)
            .map(|rank| {
                std::thread::spawn(move || {
                    let opts = ClientOptions { switch: addr, job: 1, rank, world: 2, config: json!({"scheme": scheme}), join_timeout: Duration::from_secs(20) };
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
        let b = random_frame(&mut rng);
        malformed_sent += frame::decode(&b).is_err() as u64;
        let from = if i % 10 == 0 { &stranger } else { &insider };
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
}

#[test]
fn switchml_switch_survives_hostile_packets() {
    attack("switchml", "switchml");
}

#[test]
fn atp_switch_survives_hostile_packets() {
    attack("atp", "atp");
}
