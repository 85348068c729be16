//! End-to-end on localhost: a software switch (and PS), workers in threads, real UDP.

use inalab_net::client::{Client, ClientOptions};
use inalab_net::ps::{PsHandle, PsOptions};
use inalab_net::switch::{SwitchHandle, SwitchOptions};
use std::net::SocketAddr;
use std::time::Duration;

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn switch(program: &'static str, drop_probability: f64) -> SwitchHandle {
    let opts = SwitchOptions { udp: any_port(), control: any_port(), drop_probability, ..SwitchOptions::new(&[program]) };
    SwitchHandle::start(opts).unwrap()
}

fn ps(switch: &SwitchHandle) -> PsHandle {
    PsHandle::start(PsOptions { udp: any_port(), control: any_port(), switch: switch.control_addr, ..PsOptions::default() }).unwrap()
}

/// Runs `world` workers of `job`; worker r allreduces `sizes` arrays whose values depend on r.
fn run_job(sw: SocketAddr, scheme: &'static str, job: u32, world: usize, sizes: &[usize]) -> Vec<Vec<Vec<f32>>> {
    let threads: Vec<_> = (0..world)
        .map(|rank| {
            let sizes = sizes.to_vec();
            std::thread::spawn(move || {
                let opts = ClientOptions { switch: sw, job, rank, world, config: serde_json::json!({"scheme": scheme}), join_timeout: Duration::from_secs(20), secret: None, job_secret: None, link_rate_bps: None };
                let c = Client::connect(opts).unwrap();
                let out: Vec<Vec<f32>> = sizes.iter().map(|&n| c.allreduce(input(rank, n)).unwrap()).collect();
                c.close();
                out
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn input(rank: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 + rank * 13) % 101) as f32 / 50.0 - 1.0).collect()
}

fn check(results: &[Vec<Vec<f32>>], sizes: &[usize], tol: f32) {
    let world = results.len();
    for (k, &n) in sizes.iter().enumerate() {
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, n)).collect();
        let want: Vec<f32> = (0..n).map(|i| inputs.iter().map(|v| v[i]).sum()).collect();
        for r in results {
            assert_eq!(r[k].len(), n);
            for (a, b) in r[k].iter().zip(&want) {
                assert!((a - b).abs() <= tol, "size {n}: got {a}, want {b}");
            }
        }
    }
}

const SIZES: &[usize] = &[1, 31, 32, 33, 1000, 4097, 100_000];

#[test]
fn switchml_sums_match() {
    let sw = switch("switchml", 0.0);
    let res = run_job(sw.control_addr, "switchml", 7, 4, SIZES);
    check(&res, SIZES, 1e-5);
    let st = sw.stats();
    assert_eq!(st["aggregators_in_use"], 0, "{st}");
    assert_eq!(st["malformed"], 0);
}

#[test]
fn atp_sums_match() {
    let sw = switch("atp", 0.0);
    let _ps = ps(&sw);
    let res = run_job(sw.control_addr, "atp", 3, 4, SIZES);
    check(&res, SIZES, 1e-6);
}

#[test]
fn switchml_recovers_from_loss() {
    let sw = switch("switchml", 0.01);
    let sizes = [50_000, 3];
    let res = run_job(sw.control_addr, "switchml", 1, 3, &sizes);
    check(&res, &sizes, 1e-5);
    assert!(sw.stats()["injected_drops"].as_u64().unwrap() > 0);
}


/// ATP across two chained switches: workers on a rack switch (level 1), the PS behind a
/// second switch (level 2), as ATP's two-level deployment.
#[test]
fn atp_through_a_chain_of_two_switches() {
    let ps_rack = SwitchHandle::start(SwitchOptions { node: 2, udp: any_port(), control: any_port(), ..SwitchOptions::new(&["atp"]) }).unwrap();
    let _ps = PsHandle::start(PsOptions { node: 3, udp: any_port(), control: any_port(), switch: ps_rack.control_addr, secret: None, ..PsOptions::default() }).unwrap();
    let tor = SwitchHandle::start(SwitchOptions {
        node: 1,
        udp: any_port(),
        control: any_port(),
        upstream: Some(ps_rack.control_addr),
        ..SwitchOptions::new(&["atp"])
    })
    .unwrap();
    let sizes = [62, 63, 10_000];
    let res = run_job(tor.control_addr, "atp", 4, 3, &sizes);
    check(&res, &sizes, 1e-6);
    let (a, b) = (tor.stats(), ps_rack.stats());
    assert!(a["program"]["aggregated"].as_u64().unwrap() > 0, "{a}");
    assert!(b["program"]["aggregated"].as_u64().unwrap() > 0, "{b}");
    assert_eq!(a["aggregators_in_use"], 0);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(ps_rack.stats()["aggregators_in_use"], 0, "the release reached the upstream switch");
}
