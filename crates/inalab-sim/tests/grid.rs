//! GRID driven by the simulator (issue 18): a policy names each worker's aggregation node and
//! path; packets are aggregated only at their named node (a spine reached through a detour, a
//! leaf, or the PS), with exact sums under loss and collisions, nothing held at the end, and
//! errors that name the policy's field.

mod common;
use common::*;
use inalab_sim::SimResult;
use serde_json::{json, Value};

/// Units of 280 B: GRID's `GRID_UNIT_BYTES`.
const UNIT_BYTES: u64 = 280;

fn topo() -> Value {
    let mut t = leaf_spine_100g(2, 2, 4);
    t["programmable"] = json!("all");
    t
}

fn path(nodes: &[&str]) -> Value {
    json!(nodes)
}

/// h0-h3 aggregate at leaf0 (on to the PS h7 over spine0), h4-h5 at spine1 (leaf1 -> spine1 ->
/// leaf1 -> PS: a node twice on one path), h6 sends to the PS.
fn policy() -> Value {
    let mut w = vec![];
    for h in 0..4 {
        w.push(json!({"target": "leaf0", "path": path(&[&format!("h{h}"), "leaf0", "spine0", "leaf1", "h7"])}));
    }
    for h in 4..6 {
        w.push(json!({"target": "spine1", "path": path(&[&format!("h{h}"), "leaf1", "spine1", "leaf1", "h7"])}));
    }
    w.push(json!({"target": "h7", "path": path(&["h6", "leaf1", "h7"])}));
    json!({"workers": w})
}

fn grid_spec(policy: Value, values: u64, iterations: u32, units: u64, ina: Value) -> Value {
    let mut j = job(0, "grid", hosts(0..7), vec!["h7".into()], json!({"kind": "allreduce", "bytes": 4 * values, "iterations": iterations}));
    j["policy"] = policy;
    j["ina"] = ina;
    let mut s = spec(topo(), vec![j], vec![]);
    s["payload"] = json!(true);
    s["network"]["aggregator_memory_bytes"] = json!(units * UNIT_BYTES);
    s
}

fn switch_counter(r: &SimResult, switch: &str, name: &str) -> u64 {
    r.switches.iter().find(|s| s.name == switch).and_then(|s| s.counters.get(name).copied()).unwrap_or(0)
}

#[test]
fn each_packet_is_aggregated_only_at_its_named_node() {
    let frags = 2000u64.div_ceil(64) * 2;
    let r = simulate(&grid_spec(policy(), 2000, 2, 4096, json!({})));
    assert_jobs_exact(&r);
    // leaf0 adds 4 workers' packets, spine1 2; leaf1 and spine0 carry them all but add none.
    assert_eq!(switch_counter(&r, "leaf0", "agg_packets"), 4 * frags);
    assert_eq!(switch_counter(&r, "spine1", "agg_packets"), 2 * frags);
    assert_eq!(switch_counter(&r, "leaf1", "agg_packets") + switch_counter(&r, "spine0", "agg_packets"), 0);
    assert_eq!(switch_counter(&r, "leaf0", "completions") + switch_counter(&r, "spine1", "completions"), 2 * frags);
    // The PS takes one aggregate per group and fragment, and h6's own packets.
    let ps_in: u64 = r.links.iter().filter(|l| l.dst == "h7").map(|l| l.tx_packets).sum();
    assert_eq!(ps_in, 3 * frags);
}

#[test]
fn results_are_multicast_once_on_the_ps_tree_unless_unicast_is_asked() {
    let frags = 2000u64.div_ceil(64) * 2;
    let ps_out = |r: &SimResult| r.links.iter().filter(|l| l.src == "h7").map(|l| l.tx_packets).sum::<u64>();
    let r = simulate(&grid_spec(policy(), 2000, 2, 4096, json!({})));
    assert_jobs_exact(&r);
    assert_eq!(ps_out(&r), frags, "one result per fragment leaves the PS");
    // Every worker's access link carries each result once: replicated at leaf1 and spine.
    for h in 0..7 {
        let down = r.links.iter().find(|l| l.dst == format!("h{h}")).unwrap();
        assert_eq!(down.tx_packets, frags + switch_counter(&r, "leaf0", "control_sent"), "h{h}");
    }
    let r = simulate(&grid_spec(policy(), 2000, 2, 4096, json!({"results": "unicast"})));
    assert_jobs_exact(&r);
    assert_eq!(ps_out(&r), 7 * frags);
}

#[test]
fn processing_capacity_limits_what_a_switch_aggregates_not_what_it_carries() {
    let jct = |caps: Value| {
        let mut s = grid_spec(policy(), 500_000, 1, 4096, json!({}));
        s["network"]["switch_capacity"] = caps;
        let r = simulate(&s);
        assert_jobs_exact(&r);
        (r.jobs[0].jct_s.expect("finished"), switch_counter(&r, "leaf0", "agg_bytes"))
    };
    let (free, _) = jct(json!([]));
    // spine0 carries leaf0's aggregates and aggregates nothing: 1 Gbps of capacity costs nothing.
    let (transit, _) = jct(json!([{"switch": "spine0", "value": 1_000_000_000u64}]));
    assert_eq!(transit, free);
    // leaf0 aggregates four workers (400 Gbps offered; the PS link lets 33 per worker through):
    // at 50 Gbps the job takes about 3x longer,
    // and leaf0 aggregates no faster than its capacity.
    let (slow, bytes) = jct(json!([{"switch": "leaf0", "value": 50_000_000_000u64}]));
    assert!(slow > 2.5 * free, "{slow} s against {free} s");
    assert!(bytes as f64 * 8.0 / slow <= 50e9, "{} Gbps aggregated", bytes as f64 * 8.0 / slow / 1e9);
}

#[test]
fn without_a_policy_every_worker_sends_to_the_ps() {
    let r = simulate(&grid_spec(json!({}), 1000, 2, 4096, json!({})));
    assert_jobs_exact(&r);
    assert_eq!(counter(&r, "agg_packets"), 0);
}

#[test]
fn loss_on_every_link_is_recovered_exactly() {
    let mut s = grid_spec(policy(), 4000, 3, 4096, json!({"rto_ps": 100 * US}));
    s["network"]["link_loss"] = loss_on_every_link(2, 2, 4, 0.01);
    let r = simulate(&s);
    assert_jobs_exact(&r);
    assert!(host_counter(&r, "resent") > 0);
    assert!(counter(&r, "resend_flushes") + counter(&r, "resend_forwards") > 0);
}

#[test]
fn collisions_send_control_packets_and_sums_stay_exact() {
    // 8 units per switch for windows of 186 packets: fragments collide all the time.
    let mut s = grid_spec(policy(), 20_000, 2, 8, json!({"rto_ps": 100 * US}));
    s["network"]["host_loss"] = json!([{"host": "h1", "prob": 0.01}]);
    let r = simulate(&s);
    assert_jobs_exact(&r);
    assert!(counter(&r, "collisions") > 0 && counter(&r, "control_sent") == counter(&r, "collisions"));
    assert!(host_counter(&r, "controls") > 0 && host_counter(&r, "collision_resends") > 0);
}

#[test]
fn runs_are_deterministic() {
    let mut s = grid_spec(policy(), 3000, 2, 16, json!({"rto_ps": 100 * US}));
    s["network"]["host_loss"] = json!([{"host": "h2", "prob": 0.02}]);
    assert_deterministic(&s);
}

#[test]
fn policy_errors_name_the_field() {
    let bad = |p: Value| {
        let s = grid_spec(p, 100, 1, 64, json!({}));
        let e = inalab_sim::run(&inalab_sim::parse_spec(&s.to_string()).unwrap(), None).unwrap_err();
        e.to_string()
    };
    let mut p = policy();
    p["workers"][0]["path"] = path(&["h0", "leaf0", "spine1", "leaf1", "h7"]);
    p["workers"][0]["target"] = json!("spine0");
    assert!(bad(p).contains("policy.workers[0].path") , "a path that skips its target");
    let mut p = policy();
    p["workers"][1]["path"] = path(&["h1", "spine0", "leaf1", "h7"]);
    assert!(bad(p).contains("not adjacent"));
    let mut p = policy();
    p["workers"][2]["target"] = json!("leaf9");
    assert!(bad(p).contains("policy.workers[2].target"));
    let mut p = policy();
    p["workers"].as_array_mut().unwrap().pop();
    assert!(bad(p).contains("policy.workers"));
    let mut s = grid_spec(policy(), 100, 1, 64, json!({}));
    s["topology"]["programmable"] = json!("tor");
    let e = inalab_sim::run(&inalab_sim::parse_spec(&s.to_string()).unwrap(), None).unwrap_err().to_string();
    assert!(e.contains("policy.workers[4].target") && e.contains("not a programmable switch"), "{e}");
}
