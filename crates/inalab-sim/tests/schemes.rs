//! Every host-based scheme, driven by the simulator, in payload mode: results are the exact
//! sums, with and without loss, and runs are deterministic.

mod common;
use common::*;
use serde_json::{json, Value};

fn leaf_spine() -> Value {
    json!({"shape": {"kind": "leaf_spine", "leaves": 2, "spines": 2, "hosts_per_leaf": 4, "switch_ports": 64,
                     "host_rate_bps": G100, "fabric_rate_bps": G100, "link_delay_ps": US}})
}

fn payload_run(scheme: &str, workers: Vec<String>, servers: Vec<String>, loss: f64) -> inalab_sim::SimResult {
    let workload = json!({"kind": "allreduce", "bytes": 4 * 10_007, "iterations": 3});
    let mut s = spec(leaf_spine(), vec![job(0, scheme, workers, servers, workload)], vec![]);
    s["payload"] = json!(true);
    if s["jobs"][0].get("partition_bytes").is_some() {
        s["jobs"][0]["partition_bytes"] = json!(4 * 3000);
    }
    if loss > 0.0 {
        s["network"]["link_loss"] = json!([{"a": "leaf0", "b": "spine0", "prob": loss}, {"a": "leaf0", "b": "spine1", "prob": loss}]);
        s["network"]["host_loss"] = json!([{"host": "h1", "prob": loss}]);
    }
    simulate(&s)
}

fn assert_exact(r: &inalab_sim::SimResult, workers: u64) {
    let j = &r.jobs[0];
    assert!(j.finished, "{} did not finish: {:?} ({})", j.scheme, j.failures, r.stopped_by);
    assert_eq!(j.payload_checked, workers * 3, "{}: every worker checked every iteration", j.scheme);
    assert_eq!(j.payload_errors, 0, "{}: results equal the exact sums", j.scheme);
}

#[test]
fn every_scheme_sums_exactly() {
    for loss in [0.0, 0.01] {
        assert_exact(&payload_run("ring", hosts(0..7), vec![], loss), 7);
        assert_exact(&payload_run("hierarchical", hosts(0..8), vec![], loss), 8);
        assert_exact(&payload_run("ps", hosts(0..7), vec!["h7".into()], loss), 7);
        assert_exact(&payload_run("ps_sharded", hosts(0..8), vec![], loss), 8);
    }
}

#[test]
fn loss_causes_retransmissions_not_errors() {
    let r = payload_run("ring", hosts(0..7), vec![], 0.01);
    let retx: u64 = r.hosts.iter().map(|h| h.counters.get("retransmissions").copied().unwrap_or(0)).sum();
    let lost: u64 = r.links.iter().map(|l| l.drops_loss).sum::<u64>() + r.hosts.iter().map(|h| h.drops_loss).sum::<u64>();
    assert!(lost > 0, "loss was injected");
    assert!(retx > 0, "and repaired by retransmission");
}

#[test]
fn same_seed_same_result_bit_for_bit() {
    let run = || {
        let mut r = payload_run("ps_sharded", hosts(0..8), vec![], 0.01);
        r.wall_s = 0.0;
        serde_json::to_string(&r).unwrap()
    };
    assert_eq!(run(), run());
}

#[test]
fn training_overlaps_backward_with_communication() {
    // Two layers; layer 1's gradient is sent while layer 0's backward computes.
    let layers = json!([{"name": "l0", "bytes": 1 << 20, "fwd_ps": 100 * US, "bwd_ps": 200 * US},
                        {"name": "l1", "bytes": 1 << 20, "fwd_ps": 100 * US, "bwd_ps": 200 * US}]);
    let workload = json!({"kind": "training", "layers": layers, "iterations": 4});
    let r = simulate(&spec(star(4, US), vec![job(0, "ring", hosts(0..4), vec![], workload)], vec![]));
    let j = &r.jobs[0];
    assert!(j.finished);
    assert_eq!(j.iterations, 4);
    assert_eq!(r.iterations.len(), 4);
    let compute = 600e-6;
    let comm_one_layer = 2.0 * 3.0 / 4.0 * (1u64 << 20) as f64 * 8.0 / 1e11;
    // An iteration costs at least its compute, and less than compute plus both layers'
    // communication back to back (layer 1's allreduce hides behind layer 0's backward).
    for it in &r.iterations[1..] {
        assert!(it.duration_s > compute, "{it:?}");
        assert!(it.duration_s < compute + 2.0 * comm_one_layer, "{it:?}");
    }
}

#[test]
fn a_send_order_holds_gradients_back_and_keeps_sums_exact() {
    // Three layers; backward computes l2, l1, l0. Sending in forward order (l0 first) holds
    // every gradient until the whole backward pass ran, so no communication hides behind it.
    let layers = json!([{"name": "l0", "bytes": 1 << 20, "fwd_ps": 100 * US, "bwd_ps": 200 * US},
                        {"name": "l1", "bytes": 1 << 20, "fwd_ps": 100 * US, "bwd_ps": 200 * US},
                        {"name": "l2", "bytes": 1 << 20, "fwd_ps": 100 * US, "bwd_ps": 200 * US}]);
    let run = |order: Option<Value>| {
        let mut workload = json!({"kind": "training", "layers": layers, "iterations": 3});
        if let Some(o) = order {
            workload["send_order"] = o;
        }
        let mut s = spec(star(4, US), vec![job(0, "atp", hosts(0..3), vec!["h3".into()], workload)], vec![]);
        s["payload"] = json!(true);
        let r = simulate(&s);
        let j = &r.jobs[0];
        assert!(j.finished && j.payload_errors == 0 && j.payload_checked == 3 * 3 * 3, "{j:?}");
        r.iterations[1..].iter().map(|it| it.duration_s).sum::<f64>()
    };
    let (natural, held) = (run(None), run(Some(json!([0, 1, 2]))));
    assert_eq!(run(Some(json!([2, 1, 0]))), natural, "the backward order is the default");
    let comm_one_layer = 2.0 * (1u64 << 20) as f64 * 8.0 / 1e11;
    assert!(held > natural + comm_one_layer, "held {held} natural {natural}");
    let bad = |o: Value| {
        let mut s = spec(star(4, US), vec![job(0, "ring", hosts(0..3), vec![], json!({"kind": "training", "layers": layers, "iterations": 1, "send_order": o}))], vec![]);
        s["seed"] = json!(1);
        inalab_sim::run(&inalab_sim::parse_spec(&s.to_string()).unwrap(), None).unwrap_err()
    };
    for o in [json!([0, 1]), json!([0, 1, 1]), json!([0, 1, 3])] {
        assert_eq!(bad(o).field, "jobs[0].workload.send_order");
    }
}

#[test]
fn bad_placements_name_the_field() {
    let workload = json!({"kind": "allreduce", "bytes": 4096, "iterations": 1});
    let bad = |s: Value| inalab_sim::run(&inalab_sim::parse_spec(&s.to_string()).unwrap(), None).unwrap_err();
    let e = bad(spec(star(4, US), vec![job(0, "ring", vec!["h0".into(), "h9".into()], vec![], workload.clone())], vec![]));
    assert_eq!(e.field, "jobs[0].workers[1]");
    let e = bad(spec(star(4, US), vec![job(0, "ring", vec!["h0".into(), "s0".into()], vec![], workload.clone())], vec![]));
    assert!(e.message.contains("switch"), "{e}");
    let e = bad(spec(star(4, US), vec![job(0, "ps", hosts(0..2), vec![], workload.clone())], vec![]));
    assert_eq!(e.field, "jobs[0].servers");
    let two = vec![job(0, "ring", hosts(0..2), vec![], workload.clone()), job(1, "ring", hosts(1..3), vec![], workload)];
    let e = bad(spec(star(4, US), two, vec![]));
    assert!(e.field == "jobs[1].workers" && e.message.contains("jobs[0]"), "{e}");
}

#[test]
fn adaptive_routing_spreads_load_on_congested_uplinks() {
    // 8 senders on leaf0 to 8 receivers on leaf1 over 4 spines; ECMP may collide flows on
    // one uplink, adaptive routing moves packets off a queue above half the buffer.
    let topo = json!({"shape": {"kind": "leaf_spine", "leaves": 2, "spines": 4, "hosts_per_leaf": 8, "switch_ports": 64,
                                "host_rate_bps": G100, "fabric_rate_bps": G100, "link_delay_ps": US}});
    let flows: Vec<_> = (0..8).map(|i| json!({"src": format!("h{i}"), "dst": format!("h{}", 8 + i), "bytes": 2_000_000, "packet_bytes": 1500, "start_ps": 0})).collect();
    let run = |routing: Value| {
        let mut s = spec(topo.clone(), vec![], flows.clone());
        s["network"]["routing"] = routing;
        s["network"]["buffer_bytes"] = json!(200_000);
        simulate(&s)
    };
    let ecmp = run(json!({"kind": "ecmp"}));
    let adaptive = run(json!({"kind": "adaptive", "threshold": 0.5}));
    let finish = |r: &inalab_sim::SimResult| r.flows.iter().map(|f| f.last_rx_s.expect("a packet arrived")).fold(0.0, f64::max);
    let drops = |r: &inalab_sim::SimResult| r.links.iter().map(|l| l.drops_queue).sum::<u64>();
    assert!(drops(&adaptive) <= drops(&ecmp));
    assert!(finish(&adaptive) <= finish(&ecmp) * 1.001, "adaptive {} vs ecmp {}", finish(&adaptive), finish(&ecmp));
    let up = |r: &inalab_sim::SimResult| r.links.iter().filter(|l| l.src == "leaf0" && l.dst.starts_with("spine") && l.tx_bytes > 0).count();
    assert_eq!(up(&adaptive), 4, "adaptive routing uses every uplink");
    // The network's own reroutes are counted at the switch that made them (adaptive only).
    let leaf0 = |r: &inalab_sim::SimResult| r.switches.iter().find(|s| s.name == "leaf0").unwrap().counters.clone();
    assert!(leaf0(&adaptive)["rerouted_network"] > 0);
    assert!(!leaf0(&ecmp).contains_key("rerouted_network"));
    // The destination rule: h8..h15 modulo 4 up ports, two flows on each, equal bytes.
    let mut s = spec(topo.clone(), vec![], flows.clone());
    s["network"]["default_port"] = json!("destination");
    let r = simulate(&s);
    let bytes: Vec<u64> = r.links.iter().filter(|l| l.src == "leaf0" && l.dst.starts_with("spine")).map(|l| l.tx_bytes).collect();
    assert_eq!(bytes.len(), 4);
    assert!(bytes.iter().all(|&b| b == bytes[0] && b >= 4_000_000), "{bytes:?}");
}

#[test]
fn co_located_servers_deliver_without_deep_recursion() {
    // Sharded PS: a quarter of each worker's 64 MiB goes to its own host's server, tens of
    // thousands of host-local packets; delivering them by nested calls overflowed the stack.
    let workload = json!({"kind": "allreduce", "bytes": 64u64 << 20, "iterations": 1});
    let r = simulate(&spec(star(4, US), vec![job(0, "ps_sharded", hosts(0..4), vec![], workload)], vec![]));
    assert!(r.jobs[0].finished);
}

#[test]
fn an_unfinished_jobs_mean_iteration_is_its_completed_iterations_own_time() {
    let workload = json!({"kind": "allreduce", "bytes": 4 << 20, "iterations": 2});
    let mut s = spec(leaf_spine(), vec![job(0, "ring", hosts(0..4), vec![], workload)], vec![]);
    let full = simulate(&s);
    let first = full.iterations[0].duration_s;
    assert!(full.jobs[0].finished && full.iterations.len() == 2);
    // Stop halfway through the second iteration.
    let stop = (full.iterations[0].end_s + full.iterations[1].duration_s / 2.0) * 1e12;
    s["stop_ps"] = json!(stop as u64);
    let r = simulate(&s);
    let j = &r.jobs[0];
    assert!(!j.finished && j.iterations == 1);
    assert!((j.mean_iteration_s.expect("an iteration") - first).abs() < 1e-12, "{} vs the first iteration's {first}", j.mean_iteration_s.expect("an iteration"));
    assert_eq!(j.jct_s, None, "an unfinished job has no JCT (it used to be the stop time)");
    assert_eq!((j.status, r.stopped_by.as_str(), r.outcome.as_str()), ("unfinished", "stop_time", "unfinished"));
    assert!(j.reason.as_deref().is_some_and(|w| w.contains("1 of 2 iterations done") && w.contains("stop")), "{:?}", j.reason);
    assert_eq!((j.goodput_gbps, j.busbw_gbps, j.aggregation_gbps), (None, None, None), "no rate without a JCT");
}
