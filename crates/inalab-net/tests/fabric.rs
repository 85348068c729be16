//! Static fabrics (what `inalab emulate` builds): two switches in a chain on localhost, workers
//! started from their job's spec. A ring allreduce crosses both switches (host-to-host
//! transport segments, keyed by their source's job), ATP aggregates at two levels with its PS
//! behind the second switch, and a fabric that names a route through a stranger is refused.

use inalab_net::client::Client;
use inalab_net::control::{JobSpec, ServerSpec, SwitchSpec, WorkerSpec};
use inalab_net::fabric::{FabricPort, FabricRoute, HostFabric, Processing, SwitchFabric};
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
        network: None,
        lanes: 1,
    };
    let port = |node: u32, kind: &str, udp: SocketAddr| FabricPort { node, kind: kind.into(), udp, rate_bps: None, ps_udp: None };
    let route = |dst: u32, via: u32| FabricRoute { src: None, dst, via: vec![via] };
    let mut f1 = SwitchFabric { ports: vec![port(101, "worker", a[2]), port(102, "worker", a[3]), port(2, "switch", a[1])], routes: vec![], jobs: vec![spec.clone()], processing: None, ..Default::default() };
    f1.routes = vec![route(103, 2), route(104, 2), route(105, 2)];
    let mut f2 = SwitchFabric { ports: vec![port(103, "worker", a[4]), port(104, "worker", a[5]), port(1, "switch", a[0])], routes: vec![], jobs: vec![spec.clone()], processing: None, ..Default::default() };
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
    let f = SwitchFabric { ports: vec![], routes: vec![FabricRoute { src: None, dst: 7, via: vec![9] }], jobs: vec![], processing: None, ..Default::default() };
    let opts = SwitchOptions { udp: "127.0.0.1:0".parse().unwrap(), control: "127.0.0.1:0".parse().unwrap(), fabric: Some(f), ..SwitchOptions::new(&["switchml"]) };
    let err = SwitchHandle::start(opts).err().expect("refused").to_string();
    assert!(err.contains("no neighbour"), "{err}");
    let pinned = SwitchFabric {
        ports: vec![FabricPort { node: 9, kind: "switch".into(), udp: "127.0.0.1:9".parse().unwrap(), rate_bps: None, ps_udp: None }],
        routes: vec![FabricRoute { src: Some(3), dst: 7, via: vec![9, 9] }],
        jobs: vec![],
        processing: None,
        ..Default::default()
    };
    let opts = SwitchOptions { udp: "127.0.0.1:0".parse().unwrap(), control: "127.0.0.1:0".parse().unwrap(), fabric: Some(pinned), ..SwitchOptions::new(&["switchml"]) };
    let err = SwitchHandle::start(opts).err().expect("refused").to_string();
    assert!(err.contains("exactly one next hop"), "{err}");
}

/// A 2-leaf, 2-spine leaf-spine on loopback, every switch running Canary: leaves 1 and 2,
/// spines 3 and 4, workers 101 and 102 on leaf 1, 103 and 104 on leaf 2. Leaves route to
/// the other rack's workers and leaf over both spines (`SwitchCtx::next_hops`).
fn canary_leaf_spine(ina: serde_json::Value) -> (Vec<SwitchHandle>, JobSpec) {
    let a = addrs(8); // switches 1..4, workers 101..104
    let spec = JobSpec {
        job: 1,
        config: json!({"scheme": "canary", "ina": ina}),
        workers: (0..4).map(|i| WorkerSpec { node: 101 + i as u32, udp: a[4 + i], rack: 1 + (i as u32) / 2 }).collect(),
        servers: vec![],
        switches: (1..=4).map(|node| SwitchSpec { node, memory_bytes: 1_000_000 }).collect(),
        key: "cd".repeat(32),
        network: None,
        lanes: 1,
    };
    let port = |node: u32, kind: &str| FabricPort { node, kind: kind.into(), udp: a[if node > 100 { 4 + node as usize - 101 } else { node as usize - 1 }], rate_bps: None, ps_udp: None };
    let via = |dst: u32, via: Vec<u32>| FabricRoute { src: None, dst, via };
    let leaf = |me: u32| {
        let (mine, other) = if me == 1 { ([101, 102], [103, 104]) } else { ([103, 104], [101, 102]) };
        SwitchFabric {
            ports: vec![port(mine[0], "worker"), port(mine[1], "worker"), port(3, "switch"), port(4, "switch")],
            routes: vec![via(other[0], vec![3, 4]), via(other[1], vec![3, 4]), via(3 - me, vec![3, 4])],
            jobs: vec![spec.clone()],
            processing: None,
            ..Default::default()
        }
    };
    let spine = || SwitchFabric {
        ports: vec![port(1, "switch"), port(2, "switch")],
        routes: vec![via(101, vec![1]), via(102, vec![1]), via(103, vec![2]), via(104, vec![2])],
        jobs: vec![spec.clone()],
        processing: None,
        ..Default::default()
    };
    let start = |node: u32, f: SwitchFabric| {
        let opts = SwitchOptions { node, udp: a[node as usize - 1], control: "127.0.0.1:0".parse().unwrap(), fabric: Some(f), memory_bytes: 1_000_000, ..SwitchOptions::new(&["canary"]) };
        SwitchHandle::start(opts).unwrap()
    };
    (vec![start(1, leaf(1)), start(2, leaf(2)), start(3, spine()), start(4, spine())], spec)
}

fn canary_input(rank: usize, k: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 + rank * 3 + k) % 1000) as f32 / 256.0 - 2.0).collect()
}

fn assert_canary_sum(out: &[f32], k: usize) {
    let inputs: Vec<Vec<f32>> = (0..4).map(|r| canary_input(r, k, out.len())).collect();
    for (i, x) in out.iter().enumerate() {
        let want: f32 = inputs.iter().map(|v| v[i]).sum();
        assert!((x - want).abs() <= 4.0 / 2e8 + 4.0 * f32::EPSILON * 4.0, "allreduce {k}, value {i}: {x} != {want}");
    }
}

#[test]
fn canary_sums_exactly_on_a_static_leaf_spine() {
    let (switches, spec) = canary_leaf_spine(json!({"aggregation_timeout_ps": 200_000_000u64, "rtx_timeout_ps": 50_000_000_000u64, "window_blocks": 64}));
    let gateways: Vec<SocketAddr> = switches.iter().map(|s| s.udp_addr).collect();
    let workers: Vec<_> = (0..4)
        .map(|rank| {
            let (spec, gw) = (spec.clone(), gateways[rank / 2]);
            std::thread::spawn(move || {
                let c = Client::from_spec(spec, rank, gw, None).unwrap();
                for k in 0..3 {
                    assert_canary_sum(&c.allreduce(canary_input(rank, k, 30_000)).unwrap(), k);
                }
                c.close();
            })
        })
        .collect();
    workers.into_iter().for_each(|w| w.join().unwrap());
    let leaves: Vec<_> = switches[..2].iter().map(|s| s.stats()).collect();
    for st in &leaves {
        // Both local workers' packets are summed at their leaf.
        assert!(st["program"]["aggregated"].as_u64().unwrap() > 0, "{st}");
        assert_eq!((st["no_route"].as_u64(), st["link_down"].as_u64()), (Some(0), Some(0)), "{st}");
    }
    // Partial sums cross the spines (whichever the leaders' addresses pick).
    let up: u64 = switches[2..].iter().map(|s| s.stats()["program"]["reduces"].as_u64().unwrap()).sum();
    assert!(up > 0);
}

#[test]
fn a_spine_dying_mid_allreduce_is_routed_around_and_canary_sums_exactly() {
    // A 100 ms retransmission timeout: what the dead spine held is asked for, re-issued. Its
    // 3 re-issues span the time between the spine's death and the leaves marking its links
    // down: with 20 ms a loaded CI machine took longer than 60 ms there, re-issued blocks still
    // went to the dead spine, and 11 blocks fell back to their leaders.
    let (mut switches, spec) = canary_leaf_spine(json!({"aggregation_timeout_ps": 200_000_000u64, "rtx_timeout_ps": 100_000_000_000u64, "window_blocks": 32}));
    let gateways: Vec<SocketAddr> = switches.iter().map(|s| s.udp_addr).collect();
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(5));
    let workers: Vec<_> = (0..4)
        .map(|rank| {
            let (spec, gw, barrier) = (spec.clone(), gateways[rank / 2], barrier.clone());
            std::thread::spawn(move || {
                let c = Client::from_spec(spec, rank, gw, None).unwrap();
                assert_canary_sum(&c.allreduce(canary_input(rank, 0, 5_000)).unwrap(), 0);
                barrier.wait();
                for k in 1..4 {
                    assert_canary_sum(&c.allreduce(canary_input(rank, k, 200_000)).unwrap(), k);
                }
                let st = c.stats();
                c.close();
                st
            })
        })
        .collect();
    barrier.wait();
    // The spine the leaders' addresses picked more often dies while blocks are in flight.
    let busy = |s: &SwitchHandle| s.stats()["program"]["reduces"].as_u64().unwrap();
    let dead = if busy(&switches[2]) >= busy(&switches[3]) { 2 } else { 3 };
    std::thread::sleep(std::time::Duration::from_millis(20));
    let held = switches[dead].stats()["aggregators_in_use"].as_u64().unwrap();
    switches.remove(dead).stop();
    let dead_node = dead as u32 + 1;
    let mut trees = vec![];
    for leaf in &switches[..2] {
        leaf.set_link(dead_node, false).unwrap();
        trees.push(leaf.stats()["aggregators_in_use"].as_u64().unwrap());
    }
    let stats: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let count = |k: &str| stats.iter().map(|s| s["protocol"][k].as_u64().unwrap()).sum::<u64>();
    for (leaf, trees) in switches[..2].iter().zip(trees) {
        let st = leaf.stats();
        // Toward the dead spine went only Results down trees recorded before it died (a
        // descriptor's children), at most one per descriptor held then: partial sums and
        // routed packets took the live spine (the program's next hops and the driver's routes
        // skip the port; thousands of blocks crossed after the failure).
        assert!(st["link_down"].as_u64().unwrap() <= trees, "{trees} descriptors held at the failure: {st}");
        assert_eq!(st["no_route"].as_u64(), Some(0), "{st}");
        let port = st["ports"].as_array().unwrap().iter().find(|p| p["node"] == dead_node).unwrap().clone();
        assert_eq!(port["link_up"], json!(false), "{st}");
    }
    assert_eq!(count("fallback_blocks"), 0, "{stats:?}");
    if held > 0 {
        // The blocks it held were lost with it: their hosts asked their leaders.
        assert!(count("rtx_requests") > 0, "{held} held, {stats:?}");
    }
    // The link state is a control request too (a switch's role), for a neighbour only.
    let secret = inalab_net::control::Secret::load().unwrap();
    let cred = secret.credential(inalab_net::control::AuthRole::Switch);
    let t = std::time::Duration::from_secs(5);
    let ask = |v: serde_json::Value, c: Option<&inalab_net::control::Credential>| inalab_net::control::request(switches[0].control_addr, c, &v, t);
    ask(json!({"op": "link", "peer": dead_node, "up": true}), Some(&cred)).unwrap();
    let st = switches[0].stats();
    assert!(st["ports"].as_array().unwrap().iter().any(|p| p["node"] == dead_node && p["link_up"] == json!(true)), "{st}");
    let err = ask(json!({"op": "link", "peer": 77, "up": false}), Some(&cred)).unwrap_err().to_string();
    assert!(err.contains("no neighbour"), "{err}");
    let err = ask(json!({"op": "link", "peer": dead_node, "up": false}), None).unwrap_err().to_string();
    assert!(err.contains("switch"), "{err}");
}

/// GRID on a static fabric that carries its network (names and links): switches S1 (1) and S2
/// (2) linked, W1 (101) and W2 (102) on S1, W3 (103), W4 (104) and the PS (105) on S2. W1 and
/// W2 aggregate at S1; W3 aggregates at S1 too, over a path that passes S2 twice (W3 S2 S1 S2
/// PS: S2 tells the two visits apart by the port they come in on); W4 sends to the PS. The PS
/// multicasts each result once down the shortest-path tree (S2 copies to S1, W3 and W4; S1 to
/// W1 and W2). `memory_bytes` per switch: few units make fragments collide at S1, whose control
/// packets go back to their senders (W3's across S2).
/// S1 with `processing` capacity, if any.
fn grid_fabric(memory_bytes: u64, processing: Option<Processing>) -> (Vec<SwitchHandle>, JobSpec, PsHandle) {
    let a = addrs(7); // S1, S2, W1..W4, PS
    let names: std::collections::BTreeMap<String, u32> =
        [("S1", 1), ("S2", 2), ("W1", 101), ("W2", 102), ("W3", 103), ("W4", 104), ("PS", 105)].into_iter().map(|(n, id)| (n.to_string(), id)).collect();
    let path = |target: &str, p: &[&str]| json!({"target": target, "path": p});
    let config = json!({"scheme": "grid", "ina": {"rto_ps": 20_000_000_000u64, "stale_timeout_ps": 40_000_000_000u64},
        "policy": {"workers": [path("S1", &["W1", "S1", "S2", "PS"]), path("S1", &["W2", "S1", "S2", "PS"]),
                               path("S1", &["W3", "S2", "S1", "S2", "PS"]), path("PS", &["W4", "S2", "PS"])]}});
    let spec = JobSpec {
        job: 1,
        config,
        workers: (0..4).map(|i| WorkerSpec { node: 101 + i as u32, udp: a[2 + i], rack: if i < 2 { 1 } else { 2 } }).collect(),
        servers: vec![ServerSpec { node: 105, rack: 2 }],
        switches: vec![SwitchSpec { node: 1, memory_bytes }, SwitchSpec { node: 2, memory_bytes }],
        key: "ef".repeat(32),
        network: Some(inalab_net::control::NetworkSpec { names, links: vec![[1, 2], [101, 1], [102, 1], [103, 2], [104, 2], [105, 2]] }),
        lanes: 1,
    };
    let port = |node: u32, kind: &str, udp: SocketAddr| FabricPort { node, kind: kind.into(), udp, rate_bps: None, ps_udp: None };
    let route = |dst: u32, via: u32| FabricRoute { src: None, dst, via: vec![via] };
    let f1 = SwitchFabric {
        ports: vec![port(101, "worker", a[2]), port(102, "worker", a[3]), port(2, "switch", a[1])],
        routes: vec![route(103, 2), route(104, 2), route(105, 2)],
        jobs: vec![spec.clone()],
        processing,
        ..Default::default()
    };
    let f2 = SwitchFabric {
        ports: vec![port(103, "worker", a[4]), port(104, "worker", a[5]), port(1, "switch", a[0]), port(105, "ps", a[6])],
        routes: vec![route(101, 1), route(102, 1)],
        jobs: vec![spec.clone()],
        processing: None,
        ..Default::default()
    };
    let start = |node: u32, udp: SocketAddr, f: SwitchFabric| {
        let opts = SwitchOptions { node, udp, control: "127.0.0.1:0".parse().unwrap(), fabric: Some(f), memory_bytes, ..SwitchOptions::new(&["grid"]) };
        SwitchHandle::start(opts).unwrap()
    };
    let switches = vec![start(1, a[0], f1), start(2, a[1], f2)];
    let fabric = HostFabric { gateway: a[1], jobs: vec![spec.clone()] };
    let ps = PsHandle::start(PsOptions { node: 105, udp: a[6], control: "127.0.0.1:0".parse().unwrap(), fabric: Some(fabric), ..PsOptions::default() }).unwrap();
    (switches, spec, ps)
}

/// Runs 3 allreduces of `n` values on the GRID fabric, checks the sums; the workers' stats.
fn grid_run(switches: &[SwitchHandle], spec: &JobSpec, n: usize) -> Vec<serde_json::Value> {
    let gateways = [switches[0].udp_addr, switches[1].udp_addr];
    let workers: Vec<_> = (0..4)
        .map(|rank| {
            let spec = spec.clone();
            std::thread::spawn(move || {
                let c = Client::from_spec(spec, rank, gateways[rank / 2], None).unwrap();
                for k in 0..3 {
                    let out = c.allreduce((0..n).map(|i| ((i + rank + k) % 5) as f32).collect()).unwrap();
                    for (i, x) in out.iter().enumerate() {
                        // At most 16: GRID's fixed point (scale 1e8) holds +/-21.47.
                        let want: usize = (0..4).map(|r| (i + r + k) % 5).sum();
                        assert!((x - want as f32).abs() < 1e-6, "allreduce {k}, value {i}: {x} != {want}");
                    }
                }
                let st = c.stats();
                c.close();
                st
            })
        })
        .collect();
    workers.into_iter().map(|w| w.join().unwrap()).collect()
}

#[test]
fn grid_follows_its_policy_paths_and_multicasts_each_result_once() {
    let (switches, spec, ps) = grid_fabric(1_000_000, None);
    let n = 5_000;
    let stats = grid_run(&switches, &spec, n);
    let (s1, s2, pst) = (switches[0].stats(), switches[1].stats(), ps.stats());
    // S1 sums W1, W2 and W3 (which reached it through S2); S2 sums nothing.
    assert!(s1["program"]["agg_packets"].as_u64().unwrap() >= 3 * 3 * (n as u64).div_ceil(64), "{s1}");
    assert_eq!(s2["program"]["agg_packets"].as_u64(), Some(0), "{s2}");
    for st in [&s1, &s2] {
        assert_eq!((st["no_route"].as_u64(), st["unadmitted"].as_u64(), st["forged"].clone()), (Some(0), Some(0), json!({})), "{st}");
        assert_eq!(st["aggregators_in_use"].as_u64(), Some(0), "{st}");
    }
    // One result per fragment leaves the PS (unicast would be 4); the switches copy it. Each
    // allreduce is its data's fragments and one for the ranks' tensor sizes (a world-long
    // vector submitted with the data, so that ranks that disagree on a size fail naming it).
    let frags = 3 * ((n as u64).div_ceil(64) + 1);
    let completed = pst["jobs"]["1"]["fragments_completed"].as_u64().unwrap();
    let again = pst["jobs"]["1"]["answered_again"].as_u64().unwrap();
    assert_eq!(completed, frags, "{pst}");
    assert_eq!(pst["io"]["datagrams_sent"].as_u64().unwrap(), completed + again, "{pst}");
    assert_eq!(s2["multicast_copies"].as_u64(), Some(3 * frags), "{s2}");
    assert_eq!(s1["multicast_copies"].as_u64(), Some(2 * frags), "{s1}");
    for st in &stats {
        assert!(st["protocol"]["results"].as_u64().unwrap() >= frags, "{st}");
    }
}

#[test]
fn grid_collisions_send_control_packets_back_to_their_senders_across_switches() {
    // 8 units at S1 (280 B each): the windows' fragments collide there.
    let (switches, spec, _ps) = grid_fabric(8 * 280, None);
    let stats = grid_run(&switches, &spec, 20_000);
    let s1 = switches[0].stats();
    assert!(s1["program"]["control_sent"].as_u64().unwrap() > 0, "{s1}");
    // W3's control packets came back over S2.
    let controls: Vec<u64> = stats.iter().map(|s| s["protocol"]["controls"].as_u64().unwrap()).collect();
    assert!(controls[2] > 0 && controls[..3].iter().sum::<u64>() > 0, "{controls:?}");
    assert_eq!(controls[3], 0, "W4 aggregates at the PS: {controls:?}");
    for sw in &switches {
        let st = sw.stats();
        assert_eq!((st["no_route"].as_u64(), st["aggregators_in_use"].as_u64()), (Some(0), Some(0)), "{st}");
    }
}

#[test]
fn processing_capacity_paces_what_a_switch_aggregates_and_marks_its_queue() {
    // S1 aggregates W1-W3 through a 4 Mbps FIFO that marks ECN past 8 kB and drops past 32 kB.
    let rate_bps = 4_000_000;
    let cap = Processing { rate_bps, buffer_bytes: 32_000, ecn_threshold_bytes: 8_000 };
    let (switches, spec, _ps) = grid_fabric(1_000_000, Some(cap));
    let t = std::time::Instant::now();
    grid_run(&switches, &spec, 5_000);
    let elapsed = t.elapsed().as_secs_f64();
    let s1 = switches[0].stats();
    // Every aggregated packet (64 values, 256 B, plus headers) took its turn in the FIFO: the
    // run cannot be shorter than serving them back to back.
    let aggregated = s1["program"]["agg_packets"].as_u64().unwrap();
    let floor = aggregated as f64 * (256 + 42) as f64 * 8.0 / rate_bps as f64;
    assert!(elapsed >= floor, "{elapsed:.3} s for {aggregated} packets at {rate_bps} b/s (at least {floor:.3} s): {s1}");
    assert!(s1["ecn_marked"].as_u64().unwrap() > 0, "{s1}");
    let peak = s1["processing"]["peak_bytes"].as_u64().unwrap();
    assert!(peak > 8_000 && peak <= 32_000, "the queue passed its threshold, within its buffer: {s1}");
    // S2 has no capacity set.
    let s2 = switches[1].stats();
    assert_eq!(s2["processing_drops"].as_u64(), Some(0), "{s2}");
    assert!(s2["processing"].is_null(), "{s2}");
    for st in [&s1, &s2] {
        assert_eq!(st["aggregators_in_use"].as_u64(), Some(0), "{st}");
    }
}
