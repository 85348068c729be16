//! ATP driven by the simulator in payload mode: every worker's result is the exact integer
//! sum, whatever is lost or collides, and no aggregator is left reserved at the end.

mod common;
use common::*;
use inalab_sim::SimResult;
use proptest::prelude::*;
use serde_json::{json, Value};

const AGG_BYTES: u64 = 272;

/// Three racks of `per_leaf` hosts over two spines.
fn leaf_spine(per_leaf: u32) -> Value {
    json!({"shape": {"kind": "leaf_spine", "leaves": 3, "spines": 2, "hosts_per_leaf": per_leaf, "switch_ports": 64,
                     "host_rate_bps": G100, "fabric_rate_bps": G100, "link_delay_ps": US}})
}

fn atp_job(id: u32, workers: Vec<String>, ps: &str, bytes: u64, iterations: u32) -> Value {
    let mut j = job(id, "atp", workers, vec![ps.into()], json!({"kind": "allreduce", "bytes": bytes, "iterations": iterations}));
    j["ina"] = json!({"packet_bytes": 306, "header_bytes": 58, "hashing": "hash", "congestion_control": true,
                      "timeout_ps": 200 * US});
    j
}

fn atp_spec(topo: Value, jobs: Vec<Value>, aggregators: u64) -> Value {
    let mut s = spec(topo, jobs, vec![]);
    s["payload"] = json!(true);
    s["network"]["aggregator_memory_bytes"] = json!(aggregators * AGG_BYTES);
    s
}

fn counter(r: &SimResult, switch: &str, name: &str) -> u64 {
    r.switches.iter().find(|s| s.name == switch).and_then(|s| s.counters.get(name).copied()).unwrap_or(0)
}

fn host_counter(r: &SimResult, name: &str) -> u64 {
    r.hosts.iter().map(|h| h.counters.get(name).copied().unwrap_or(0)).sum()
}

/// Every job finished, every worker's every tensor is the exact sum, and no aggregator is
/// left reserved anywhere.
fn assert_exact(r: &SimResult) {
    for j in &r.jobs {
        assert!(j.finished, "job {} did not finish: {:?} ({})", j.id, j.failures, r.stopped_by);
        assert!(j.failures.is_empty(), "{:?}", j.failures);
        assert_eq!(j.payload_checked, j.workers as u64 * j.iterations as u64, "job {}: every worker checked every tensor", j.id);
        assert_eq!(j.payload_errors, 0, "job {}: results equal the exact sums", j.id);
    }
    assert_eq!(r.outcome, "completed");
    for s in &r.switches {
        assert_eq!(s.aggregators_end, 0, "switch {} still holds aggregators: {:?}", s.name, s.counters);
    }
}

#[test]
fn one_rack_aggregates_in_the_switch() {
    // Linear indexes over a pool larger than the stream: no collision at all.
    let mut j = atp_job(0, hosts(0..8), "h8", 4 * 10_007, 3);
    j["ina"]["hashing"] = json!("linear");
    let r = simulate(&atp_spec(star(9, US), vec![j], 4096));
    assert_exact(&r);
    let frags = 10_007u64.div_ceil(62) * 3;
    // All workers are in the PS's rack: one level-2 aggregation per fragment, one packet per
    // fragment reaches the PS.
    assert_eq!(counter(&r, "s0", "completed"), frags);
    assert_eq!(counter(&r, "s0", "collisions"), 0);
    assert_eq!(counter(&r, "s0", "deallocs"), frags);
    let ps_rx = r.hosts.iter().find(|h| h.name == "h8").unwrap().rx_packets;
    assert_eq!(ps_rx, frags);
    assert_eq!(host_counter(&r, "fragments_sent"), frags * 8);
}

#[test]
fn two_worker_racks_and_a_ps_rack() {
    // Workers h0-h3 (leaf0) and h4-h7 (leaf1), PS h8 (leaf2): level 1 at leaf0/leaf1,
    // level 2 at leaf2; the spines only route.
    let mut j = atp_job(0, hosts(0..8), "h8", 4 * 5_000, 2);
    j["ina"]["hashing"] = json!("linear");
    let r = simulate(&atp_spec(leaf_spine(4), vec![j], 4096));
    assert_exact(&r);
    let frags = 5_000u64.div_ceil(62) * 2;
    assert_eq!(counter(&r, "leaf0", "completed"), frags);
    assert_eq!(counter(&r, "leaf1", "completed"), frags);
    assert_eq!(counter(&r, "leaf2", "completed"), frags);
    assert_eq!(counter(&r, "spine0", "completed") + counter(&r, "spine1", "completed"), 0);
    let ps_rx = r.hosts.iter().find(|h| h.name == "h8").unwrap().rx_packets;
    assert_eq!(ps_rx, frags, "one fully aggregated packet per fragment reaches the PS");
}

#[test]
fn mixed_racks_with_workers_beside_the_ps() {
    // h0-h2 on leaf0, h6-h7 beside the PS h8 on leaf2 (level-2 contributors themselves).
    let workers = vec!["h0", "h1", "h2", "h6", "h7"].into_iter().map(String::from).collect();
    let r = simulate(&atp_spec(leaf_spine(3), vec![atp_job(0, workers, "h8", 4 * 3_000, 2)], 1000));
    assert_exact(&r);
}

#[test]
fn losses_are_repaired_exactly() {
    for loss in [0.00001, 0.001, 0.01] {
        let mut s = atp_spec(leaf_spine(4), vec![atp_job(0, hosts(0..8), "h8", 4 * 5_000, 3)], 1000);
        s["network"]["link_loss"] = json!([
            {"a": "leaf0", "b": "spine0", "prob": loss}, {"a": "leaf0", "b": "spine1", "prob": loss},
            {"a": "h5", "b": "leaf1", "prob": loss}, {"a": "h8", "b": "leaf2", "prob": loss}]);
        let r = simulate(&s);
        assert_exact(&r);
        if loss >= 0.001 {
            let lost: u64 = r.links.iter().map(|l| l.drops_loss).sum();
            assert!(lost > 0, "loss {loss} was injected");
            assert!(host_counter(&r, "resends") > 0, "loss {loss} was repaired by resends");
        }
    }
}

#[test]
fn scarce_aggregators_collide_and_still_sum_exactly() {
    // Two jobs of 16 slots hashed into a shared pool of 48: they meet on some aggregators, the
    // PS moves the later job's slots to unused ones, and every sum stays exact.
    let jobs: Vec<Value> = (0..2)
        .map(|j| {
            let mut job = atp_job(j, hosts(4 * j..4 * j + 3), &format!("h{}", 4 * j + 3), 4 * 62 * 400, 3);
            job["ina"]["slots"] = json!(16);
            job
        })
        .collect();
    let r = simulate(&atp_spec(star(8, US), jobs, 48));
    assert_exact(&r);
    assert!(counter(&r, "s0", "collisions") > 0, "two jobs' tables of 16 in a pool of 48 meet");
    assert!(host_counter(&r, "rehashes") > 0, "collisions make the PS move slots");
}

#[test]
fn two_jobs_share_the_switches() {
    // Job 0: h0, h1 (leaf0) + h4, h5 (leaf1), PS h8. Job 1: h2, h3 (leaf0) + h6 (leaf1), PS h9.
    let j0 = atp_job(0, vec!["h0".into(), "h1".into(), "h4".into(), "h5".into()], "h8", 4 * 6_000, 2);
    let j1 = atp_job(1, vec!["h2".into(), "h3".into(), "h6".into()], "h9", 4 * 4_000, 3);
    for aggs in [1000, 16] {
        let r = simulate(&atp_spec(leaf_spine(4), vec![j0.clone(), j1.clone()], aggs));
        assert_exact(&r);
        if aggs == 16 {
            let collisions: u64 = ["leaf0", "leaf1", "leaf2"].iter().map(|s| counter(&r, s, "collisions")).sum();
            assert!(collisions > 0);
        }
    }
}

#[test]
fn without_aggregator_memory_the_ps_does_it_all() {
    let r = simulate(&atp_spec(leaf_spine(4), vec![atp_job(0, hosts(0..8), "h8", 4 * 2_000, 2)], 0));
    assert_exact(&r);
    assert_eq!(counter(&r, "leaf0", "completed"), 0);
}

#[test]
fn deterministic() {
    let mut s = atp_spec(leaf_spine(4), vec![atp_job(0, hosts(0..8), "h8", 4 * 3_000, 2)], 8);
    s["network"]["link_loss"] = json!([{"a": "leaf0", "b": "spine0", "prob": 0.01}]);
    assert_deterministic(&s);
}

#[test]
fn bad_atp_jobs_name_the_field() {
    let bad = |s: Value| inalab_sim::run(&inalab_sim::parse_spec(&s.to_string()).unwrap(), None).unwrap_err();
    let mut j = atp_job(0, hosts(0..2), "h3", 4096, 1);
    j["servers"] = json!([]);
    assert_eq!(bad(atp_spec(star(4, US), vec![j], 10)).field, "jobs[0].servers");
    // (A PS on one of the job's workers' hosts is co-location, not an error: #38, and
    // python/tests/test_colocated_server.py.)
    let mut j = atp_job(0, hosts(0..2), "h3", 4096, 1);
    j["ina"]["header_bytes"] = json!(400);
    assert_eq!(bad(atp_spec(star(4, US), vec![j], 10)).field, "jobs[0].ina");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]
    #[test]
    fn random_loss_pools_and_jobs_sum_exactly(loss in 0.0f64..0.02, aggs in prop::sample::select(vec![0u64, 1, 3, 8, 64, 1000]),
                                              two in any::<bool>(), linear in any::<bool>()) {
        let mut jobs = vec![atp_job(0, vec!["h0".into(), "h1".into(), "h4".into()], "h8", 4 * 1_500, 2)];
        if two {
            jobs.push(atp_job(1, vec!["h2".into(), "h5".into(), "h6".into(), "h7".into()], "h9", 4 * 1_000, 2));
        }
        if linear {
            jobs[0]["ina"]["hashing"] = json!("linear");
        }
        let mut s = atp_spec(leaf_spine(4), jobs, aggs);
        s["network"]["link_loss"] = json!([{"a": "leaf0", "b": "spine0", "prob": loss}, {"a": "h6", "b": "leaf1", "prob": loss},
                                           {"a": "leaf2", "b": "spine1", "prob": loss}]);
        let r = simulate(&s);
        assert_exact(&r);
    }
}


#[test]
fn metadata_mode_finishes_and_frees_every_aggregator() {
    let mut s = atp_spec(leaf_spine(4), vec![atp_job(0, hosts(0..8), "h8", 4 * 20_000, 2)], 64);
    s["payload"] = json!(false);
    s["network"]["link_loss"] = json!([{"a": "leaf0", "b": "spine0", "prob": 0.001}]);
    let r = simulate(&s);
    assert!(r.jobs[0].finished && r.jobs[0].failures.is_empty());
    assert_eq!(r.jobs[0].payload_checked, 0);
    assert!(r.switches.iter().all(|s| s.aggregators_end == 0));
    assert!(counter(&r, "leaf0", "completed") > 0);
}

#[test]
fn static_allocation_splits_the_pool_without_collisions() {
    // Three jobs on one switch with 30 aggregators: each owns 10 and never meets another job;
    // a fixed window of 10 packets keeps a job inside its own slice too.
    let jobs: Vec<Value> = (0..3)
        .map(|j| {
            let mut job = atp_job(j, hosts(4 * j..4 * j + 3), &format!("h{}", 4 * j + 3), 4 * 3000, 2);
            job["ina"]["hashing"] = json!("static");
            job["ina"]["congestion_control"] = json!(false);
            job["transport"]["init_window_bytes"] = json!(10 * 306);
            job
        })
        .collect();
    let r = simulate(&atp_spec(star(12, US), jobs, 30));
    assert_exact(&r);
    assert_eq!(counter(&r, "s0", "collisions"), 0, "static slices never collide");
    assert!(counter(&r, "s0", "completed") > 0);
}

#[test]
fn losses_are_repaired_by_fast_resends_not_timeouts() {
    // 1 % loss at one worker: each lost gradient or parameter is found missing when three
    // later parameters arrive and resent at once; timeouts stay rare.
    let mut j = atp_job(0, hosts(0..4), "h4", 4 * 62 * 4000, 1);
    j["ina"]["timeout_ps"] = json!(1000 * US);
    let mut s = atp_spec(star(5, US), vec![j], 4096);
    s["network"]["host_loss"] = json!([{"host": "h0", "prob": 0.01}]);
    let r = simulate(&s);
    assert_exact(&r);
    let h0 = r.hosts.iter().find(|h| h.name == "h0").unwrap();
    let lost = h0.drops_loss;
    let timeouts = h0.counters["timeouts"];
    assert!(lost > 20, "loss was injected: {lost}");
    assert!(timeouts * 10 <= lost, "timeouts {timeouts} for {lost} losses");
    // 4000 fragments take about 4000 x 306 B x 8 / 100 Gbps = 0.1 ms plus repairs. The window
    // may not run a slot table past a hole, so a hole waiting for the 1 ms timeout would stall
    // the job for it; a lost resend is probed again within an RTO instead, so the whole run
    // stays below one timeout (before the probe: 2.4 ms here).
    assert!(r.jobs[0].jct_s.expect("finished") < 0.001, "jct {} with {timeouts} timeouts", r.jobs[0].jct_s.expect("finished"));
}


#[test]
fn collision_stalls_are_resent_without_cutting_the_window() {
    // Eight jobs of three workers whose tables of 64 slots share a pool of 512, no loss and
    // buffers that never mark ECN: some fragments collide for part of their workers and stall
    // in a partial aggregation until a resend frees it. Those resends are no congestion
    // signal, so no window is cut (with a cut per stall, as before, there were dozens).
    let jobs: Vec<Value> = (0..8)
        .map(|j| {
            let mut job = atp_job(j, hosts(4 * j..4 * j + 3), &format!("h{}", 4 * j + 3), 4 * 62 * 2000, 2);
            job["ina"]["slots"] = json!(64);
            job
        })
        .collect();
    let mut s = atp_spec(leaf_spine(11), jobs, 512);
    s["network"]["ecn_threshold_bytes"] = json!(u32::MAX);
    let r = simulate(&s);
    assert_exact(&r);
    let collisions: u64 = ["leaf0", "leaf1", "leaf2"].iter().map(|s| counter(&r, s, "collisions")).sum();
    assert!(collisions > 0 && host_counter(&r, "resends") > 0, "stalls happened: {collisions} collisions");
    assert_eq!(host_counter(&r, "timeouts"), 0);
    assert_eq!(host_counter(&r, "window_cuts"), 0, "no loss, no ECN: no cut");
}

#[test]
fn probes_repair_lost_resends_without_cutting_the_window() {
    // 5 % loss at one worker and no ECN marks: some resends are lost too and the probe
    // repeats them within an RTO. Neither a fast resend nor a probe is a congestion signal, so
    // only timeouts may cut the window, and there are none.
    let mut j = atp_job(0, hosts(0..4), "h4", 4 * 62 * 4000, 1);
    j["ina"]["timeout_ps"] = json!(1000 * US);
    let mut s = atp_spec(star(5, US), vec![j], 4096);
    s["network"]["host_loss"] = json!([{"host": "h0", "prob": 0.05}]);
    s["network"]["ecn_threshold_bytes"] = json!(u32::MAX);
    let r = simulate(&s);
    assert_exact(&r);
    assert!(host_counter(&r, "probes") > 0, "a resend was lost and probed again");
    assert_eq!(host_counter(&r, "timeouts"), 0);
    assert_eq!(host_counter(&r, "window_cuts"), 0);
}

#[test]
fn a_unicast_ps_answers_a_resend_to_the_asking_worker_only() {
    // Rina's testbed at 50 Mbps: only rack 0's ToR runs ATP, the PS sits in rack 1 and sends
    // each parameter to all 7 workers, so its link is the bottleneck (7 x 350 B per fragment).
    // Answering every resend to all 7 workers made that link carry 60x the job's bytes: 200 s
    // for what takes under 4.
    let topo = json!({"shape": {"kind": "leaf_spine", "leaves": 2, "spines": 1, "hosts_per_leaf": 4, "switch_ports": 64,
                                "host_rate_bps": 50_000_000u64, "fabric_rate_bps": 50_000_000u64, "link_delay_ps": US},
                      "programmable": {"names": ["leaf0"]}});
    let mut j = atp_job(0, hosts(0..7), "h7", 1 << 20, 2);
    j["ina"] = json!({"packet_bytes": 350, "header_bytes": 102, "timeout_ps": 100_000 * US});
    let mut s = atp_spec(topo, vec![j], 4096);
    s["network"]["buffer_bytes"] = json!(1 << 20);
    let r = simulate(&s);
    assert_exact(&r);
    // The PS's link: 2 MiB x 7 copies x 350 / 248 B at 50 Mbps = 3.3 s.
    let jct = r.jobs[0].jct_s.expect("finished");
    assert!(jct < 5.0, "JCT {jct:.2} s");
}
