//! Static fabrics (what `inalab emulate` builds): two switches in a chain on localhost, workers
//! started from their job's spec. A ring allreduce crosses both switches (host-to-host
//! transport segments, keyed by their source's job), ATP aggregates at two levels with its PS
//! behind the second switch, and a fabric that names a route through a stranger is refused.

use inalab_net::client::Client;
use inalab_net::control::{JobSpec, ServerSpec, SwitchSpec, WorkerSpec};
use inalab_net::fabric::{FabricPort, FabricRoute, HostFabric, SwitchFabric};
use inalab_net::ps::{PsHandle, PsOptions};
use inalab_net::switch::{SwitchHandle, SwitchOptions};
use serde_json::json;
use std::net::{SocketAddr, UdpSocket};

/// Free loopback addresses (bound and released).
fn addrs(n: usize) -> Vec<SocketAddr> {
    let socks: Vec<UdpSocket> = (0..n).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    socks.iter().map(|s| s.local_addr().unwrap()).collect()
}

/// Switches 1 and 2 (linked), workers 101, 102 on switch 1 and 103, 104 (and PS 105 if
/// `ps`) on switch 2; returns the switches, the spec and the PS.
fn deploy(config: serde_json::Value, ps: bool) -> (Vec<SwitchHandle>, JobSpec, Option<PsHandle>) {
    let a = addrs(7); // switch 1, switch 2, workers 101..104, PS 105
    let rack = |i: usize| if i < 2 { 1 } else { 2 };
    let spec = JobSpec {
        job: 1,
        config,
        workers: (0..4).map(|i| WorkerSpec { node: 101 + i as u32, udp: a[2 + i], rack: rack(i) }).collect(),
        servers: if ps { vec![ServerSpec { node: 105, rack: 2 }] } else { vec![] },
        switches: vec![SwitchSpec { node: 1, memory_bytes: 1_000_000 }, SwitchSpec { node: 2, memory_bytes: 1_000_000 }],
        key: "ab".repeat(32),
    };
    let port = |node: u32, kind: &str, udp: SocketAddr| FabricPort { node, kind: kind.into(), udp };
    let route = |dst: u32, via: u32| FabricRoute { src: None, dst, via: vec![via] };
    let mut f1 = SwitchFabric { ports: vec![port(101, "worker", a[2]), port(102, "worker", a[3]), port(2, "switch", a[1])], routes: vec![], jobs: vec![spec.clone()] };
    f1.routes = vec![route(103, 2), route(104, 2), route(105, 2)];
    let mut f2 = SwitchFabric { ports: vec![port(103, "worker", a[4]), port(104, "worker", a[5]), port(1, "switch", a[0])], routes: vec![], jobs: vec![spec.clone()] };
    f2.routes = vec![route(101, 1), route(102, 1)];
    if ps {
        f2.ports.push(port(105, "ps", a[6]));
    }
    let program = spec.config["scheme"].as_str().unwrap().to_string();
    let programs: Vec<&str> = if program == "ring" { vec!["switchml"] } else { vec![program.as_str()] };
    let start = |node: u32, udp: SocketAddr, f: SwitchFabric| {
        let ctl = "127.0.0.1:0".parse().unwrap();
        SwitchHandle::start(SwitchOptions { node, udp, control: ctl, fabric: Some(f), ..SwitchOptions::new(&programs) }).unwrap()
    };
    let switches = vec![start(1, a[0], f1), start(2, a[1], f2)];
    let ps = ps.then(|| {
        let fabric = HostFabric { gateway: a[1], jobs: vec![spec.clone()] };
        PsHandle::start(PsOptions { node: 105, udp: a[6], control: "127.0.0.1:0".parse().unwrap(), fabric: Some(fabric), ..PsOptions::default() }).unwrap()
    });
    (switches, spec, ps)
}

fn run(spec: &JobSpec, gateways: [SocketAddr; 2]) -> Vec<Vec<f32>> {
    let workers: Vec<_> = (0..4)
        .map(|rank| {
            let spec = spec.clone();
            std::thread::spawn(move || {
                let c = Client::from_spec(spec, rank, gateways[rank / 2], None).unwrap();
                let out: Vec<Vec<f32>> = (0..3).map(|k| c.allreduce((0..5000).map(|i| ((i + rank + k) % 9) as f32).collect()).unwrap()).collect();
                c.close();
                out
            })
        })
        .collect();
    let outs: Vec<Vec<Vec<f32>>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    for out in &outs {
        for (k, v) in out.iter().enumerate() {
            for (i, x) in v.iter().enumerate() {
                let want: usize = (0..4).map(|r| (i + r + k) % 9).sum();
                assert_eq!(*x, want as f32, "allreduce {k}, value {i}");
            }
        }
    }
    outs.into_iter().next().unwrap()
}

#[test]
fn a_ring_crosses_two_switches_of_a_static_fabric() {
    let (switches, spec, _) = deploy(json!({"scheme": "ring"}), false);
    run(&spec, [switches[0].udp_addr, switches[1].udp_addr]);
    for sw in &switches {
        let st = sw.stats();
        assert_eq!((st["forged"].clone(), st["unadmitted"].as_u64(), st["no_route"].as_u64()), (json!({}), Some(0), Some(0)), "{st}");
        assert!(st["forwarded"].as_u64().unwrap() > 100, "{st}");
    }
}

#[test]
fn atp_aggregates_at_two_levels_of_a_static_fabric() {
    let (switches, spec, ps) = deploy(json!({"scheme": "atp"}), true);
    run(&spec, [switches[0].udp_addr, switches[1].udp_addr]);
    let (first, second) = (switches[0].stats(), switches[1].stats());
    // Switch 1 sums its two workers and passes one partial per fragment on: switch 2 sees
    // half the fragments from the first rack that a plain forwarder would pass.
    assert!(first["program"]["aggregated"].as_u64().unwrap() > 0, "{first}");
    assert!(second["program"]["aggregated"].as_u64().unwrap() > 0, "{second}");
    for st in [&first, &second] {
        assert_eq!(st["aggregators_in_use"].as_u64(), Some(0), "{st}");
        assert_eq!(st["forged"], json!({}), "{st}");
    }
    drop(ps);
}

#[test]
fn a_route_through_a_stranger_is_refused() {
    let f = SwitchFabric { ports: vec![], routes: vec![FabricRoute { src: None, dst: 7, via: vec![9] }], jobs: vec![] };
    let opts = SwitchOptions { udp: "127.0.0.1:0".parse().unwrap(), control: "127.0.0.1:0".parse().unwrap(), fabric: Some(f), ..SwitchOptions::new(&["switchml"]) };
    let err = SwitchHandle::start(opts).err().expect("refused").to_string();
    assert!(err.contains("no neighbour"), "{err}");
    let pinned = SwitchFabric {
        ports: vec![FabricPort { node: 9, kind: "switch".into(), udp: "127.0.0.1:9".parse().unwrap() }],
        routes: vec![FabricRoute { src: Some(3), dst: 7, via: vec![9, 9] }],
        jobs: vec![],
    };
    let opts = SwitchOptions { udp: "127.0.0.1:0".parse().unwrap(), control: "127.0.0.1:0".parse().unwrap(), fabric: Some(pinned), ..SwitchOptions::new(&["switchml"]) };
    let err = SwitchHandle::start(opts).err().expect("refused").to_string();
    assert!(err.contains("exactly one next hop"), "{err}");
}
