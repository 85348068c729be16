//! The static-tree baselines of Canary's evaluation (one tree: SHARP/SwitchML/ATP-like; N
//! trees round robin: PANAMA-like) driven by the simulator: exact sums on a star and on a
//! leaf-spine with 1 and 4 trees, tenants kept apart, loss on every link, blocks spread over
//! the roots' spines, determinism, and errors that name the field.

mod common;
use common::*;
use inalab_sim::SimResult;
use serde_json::{json, Value};
use std::time::Instant;

/// `STATIC_TREE_SLOT_BYTES`: memory per slot.
const SLOT_BYTES: u64 = 1064;

fn tree_job(id: u32, workers: Vec<String>, values: u64, iterations: u32, ina: Value) -> Value {
    let mut j = job(id, "static_tree", workers, vec![], json!({"kind": "allreduce", "bytes": 4 * values, "iterations": iterations}));
    j["ina"] = ina;
    j
}

fn tree_spec(topo: Value, jobs: Vec<Value>, slots: u64) -> Value {
    let mut s = spec(topo, jobs, vec![]);
    s["payload"] = json!(true);
    s["network"]["aggregator_memory_bytes"] = json!(slots * SLOT_BYTES);
    s
}

/// Every job finished with exact sums, no slot holds a partial sum, and no block ever lost
/// its slot to another before it finished.
fn assert_exact(r: &SimResult) {
    assert_jobs_exact(r);
    assert_eq!(counter(r, "overwritten_unfinished") + counter(r, "malformed") + counter(r, "unexpected"), 0);
}

/// Bytes sent up from the leaves to each spine, by spine index.
fn up_bytes(r: &SimResult, spines: usize) -> Vec<u64> {
    (0..spines).map(|s| r.links.iter().filter(|l| l.src.starts_with("leaf") && l.dst == format!("spine{s}")).map(|l| l.tx_bytes).sum()).collect()
}

#[test]
fn one_switch_is_the_root() {
    let r = simulate(&tree_spec(star(5, US), vec![tree_job(0, hosts(0..5), 10_000, 2, json!({}))], 256));
    assert_exact(&r);
    let blocks = 10_000u64.div_ceil(256) * 2;
    assert_eq!(counter(&r, "roots_completed"), blocks);
    assert_eq!(counter(&r, "aggregated") + counter(&r, "allocated"), 5 * blocks, "every contribution summed once");
    assert_eq!(host_counter(&r, "resent"), 0);
}

#[test]
fn a_leaf_spine_sums_exactly_with_one_tree_and_with_four() {
    for trees in [1, 4] {
        let values = 100_000;
        let r = simulate(&tree_spec(leaf_spine_100g(4, 4, 4), vec![tree_job(0, hosts(0..16), values, 2, json!({"trees": trees}))], 1024));
        assert_exact(&r);
        let blocks = values.div_ceil(256) * 2;
        // Each block: 4 leaves send a partial sum up, its root sends the Result down.
        assert_eq!((counter(&r, "partials_sent"), counter(&r, "roots_completed"), counter(&r, "results")), (4 * blocks, blocks, 4 * blocks), "trees = {trees}");
        assert_eq!(host_counter(&r, "resent") + counter(&r, "duplicates"), 0, "trees = {trees}: nothing lost, nothing re-sent");
        assert!(r.jobs[0].goodput_gbps.expect("finished") > 50.0, "trees = {trees}: {} Gbps", r.jobs[0].goodput_gbps.expect("finished"));
    }
}

#[test]
fn four_trees_spread_the_blocks_over_four_spines_and_one_tree_uses_one() {
    let values = 256 * 400;
    let run = |trees: u32| simulate(&tree_spec(leaf_spine_100g(4, 4, 4), vec![tree_job(0, hosts(0..16), values, 1, json!({"trees": trees}))], 1024));
    let one = run(1);
    assert_exact(&one);
    let bytes = up_bytes(&one, 4);
    assert_eq!(bytes.iter().filter(|&&b| b > 0).count(), 1, "one tree: every block through one spine: {bytes:?}");
    let four = run(4);
    assert_exact(&four);
    let spread = up_bytes(&four, 4);
    let total: u64 = spread.iter().sum();
    assert_eq!(total, bytes.iter().sum::<u64>(), "the same bytes go up, spread differently");
    for b in &spread {
        assert_eq!(*b * 4, total, "400 blocks round robin over 4 roots: a quarter each: {spread:?}");
    }
    // Down the same trees: each root's links to the leaves carry a quarter of the Results.
    let down: Vec<u64> = (0..4).map(|s| four.links.iter().filter(|l| l.src == format!("spine{s}")).map(|l| l.tx_bytes).sum()).collect();
    assert!(down.iter().all(|&d| d * 4 == total), "{down:?}");
}

#[test]
fn two_tenants_with_equal_sequence_numbers_never_mix() {
    // Interleaved hosts: both jobs have hosts under every leaf, so their blocks 0, 1, ... meet
    // in the same switches (on up to 4 shared roots).
    let even: Vec<String> = (0..16).step_by(2).map(|i| format!("h{i}")).collect();
    let odd: Vec<String> = (1..16).step_by(2).map(|i| format!("h{i}")).collect();
    let jobs = vec![tree_job(0, even, 30_000, 2, json!({"trees": 4})), tree_job(1, odd, 30_000, 2, json!({"trees": 2}))];
    let r = simulate(&tree_spec(leaf_spine_100g(4, 4, 4), jobs, 512));
    assert_exact(&r);
    assert!(r.switches.iter().any(|s| s.counters.get("allocated").copied().unwrap_or(0) > 0 && s.name.starts_with("leaf")));
}

#[test]
fn loss_on_every_link_is_repaired_and_no_slot_is_held() {
    let mut s = tree_spec(leaf_spine_100g(4, 4, 4), vec![tree_job(0, hosts(0..16), 50_000, 3, json!({"trees": 4, "rtx_timeout_ps": 20 * US}))], 1024);
    s["network"]["link_loss"] = loss_on_every_link(4, 4, 4, 0.01);
    let r = simulate(&s);
    assert_exact(&r);
    assert!(r.links.iter().map(|l| l.drops_loss).sum::<u64>() > 100);
    // Re-sends were summed never twice, and answered from where each block was.
    assert!(host_counter(&r, "resent") > 0);
    assert!(counter(&r, "duplicates") > 0 && counter(&r, "resent_partials") > 0 && counter(&r, "resent_results") > 0, "{:?}", r.switches[0].counters);
}

#[test]
fn deterministic() {
    let mut s = tree_spec(leaf_spine_100g(4, 4, 4), vec![tree_job(0, hosts(0..16), 20_000, 2, json!({"trees": 4, "rtx_timeout_ps": 20 * US}))], 64);
    s["network"]["host_loss"] = json!([{"host": "h2", "prob": 0.02}]);
    assert_deterministic(&s);
}

#[test]
fn the_roots_follow_the_seed() {
    // Which spine is the one tree's root changes with the scenario's seed (and is the same
    // for the same seed).
    let root = |seed: u64| {
        let mut s = tree_spec(leaf_spine_100g(2, 4, 2), vec![tree_job(0, hosts(0..4), 2_560, 1, json!({}))], 64);
        s["seed"] = json!(seed);
        let r = simulate(&s);
        assert_exact(&r);
        up_bytes(&r, 4).iter().position(|&b| b > 0).unwrap()
    };
    let roots: Vec<usize> = (0..8).map(root).collect();
    assert!(roots.iter().any(|&r| r != roots[0]), "{roots:?}");
    assert_eq!(root(3), roots[3]);
}

#[test]
fn bad_static_tree_jobs_name_the_field() {
    let bad = |s: Value| inalab_sim::run(&inalab_sim::parse_spec(&s.to_string()).unwrap(), None).unwrap_err();
    let e = bad(tree_spec(leaf_spine_100g(2, 4, 2), vec![tree_job(0, hosts(0..4), 1000, 1, json!({"trees": 5}))], 64));
    assert_eq!(e.field, "jobs[0].ina.trees", "{e}");
    assert!(e.message.contains("4 top-tier"), "{e}");
    for (ina, field) in [(json!({"trees": 0}), "ina.trees"), (json!({"window_blocks": 0}), "ina.window_blocks"), (json!({"rtx_timeout_ps": 0}), "ina.rtx_timeout_ps")] {
        let e = bad(tree_spec(star(4, US), vec![tree_job(0, hosts(0..4), 1000, 1, ina)], 64));
        assert_eq!(e.field, format!("jobs[0].{field}"), "{e}");
    }
    let mut fixed = tree_spec(leaf_spine_100g(2, 2, 2), vec![tree_job(0, hosts(0..4), 1000, 1, json!({}))], 64);
    fixed["topology"]["programmable"] = json!("tor");
    let e = bad(fixed);
    assert!(e.field == "jobs[0].scheme" && e.message.contains("programmable"), "{e}");
    let e = bad(tree_spec(star(4, US), vec![tree_job(0, hosts(0..4), 1000, 1, json!({}))], 1));
    assert!(e.field == "jobs[0].scheme" && e.message.contains("at least 2"), "{e}");
}

/// Canary's 1024-host two-level fat tree (32 leaves x 32 hosts, 32 spines, 100 G, 300 ns
/// links, spec A19), 512 workers allreducing 4 MiB in metadata mode, with 1 and 4 trees.
/// Slow in debug builds: `cargo test --release -p inalab-sim --test static_tree -- --ignored
/// --nocapture` prints wall times and goodputs.
#[test]
#[ignore]
fn canary_fat_tree_512_workers_4_mib() {
    let topo = json!({"shape": {"kind": "leaf_spine", "leaves": 32, "spines": 32, "hosts_per_leaf": 32, "switch_ports": 64,
                                "host_rate_bps": G100, "fabric_rate_bps": G100, "link_delay_ps": 300_000}});
    for trees in [1, 4] {
        // Every other host, so the job spans all 32 leaves.
        let workers: Vec<String> = (0..1024).step_by(2).map(|i| format!("h{i}")).collect();
        let mut s = spec(topo.clone(), vec![tree_job(0, workers, (4 << 20) / 4, 1, json!({"trees": trees}))], vec![]);
        s["network"]["aggregator_memory_bytes"] = json!(5_000_000);
        s["network"]["buffer_bytes"] = json!(1 << 20);
        let start = Instant::now();
        let r = simulate(&s);
        let wall = start.elapsed().as_secs_f64();
        let j = &r.jobs[0];
        assert!(j.finished, "trees = {trees}: {}", r.stopped_by);
        assert_eq!(counter(&r, "overwritten_unfinished") + host_counter(&r, "resent"), 0);
        println!("trees = {trees}: {:.1} Gbps goodput, JCT {:.1} us, {} events, wall {wall:.2} s", j.goodput_gbps.expect("finished"), j.jct_s.expect("finished") * 1e6, r.events);
    }
}

/// The static trees get Canary's noise (Fig. 11 compares them under the same noise): the same
/// parameters, draws and modes, and sums stay exact.
#[test]
fn static_trees_take_the_same_host_noise() {
    let run = |mode: &str, prob: f64| {
        let ina = json!({"trees": 2, "noise_prob": prob, "noise_mode": mode, "noise_ps": 10 * US});
        let r = simulate(&tree_spec(leaf_spine_100g(2, 2, 4), vec![tree_job(0, hosts(0..8), 256 * 40, 1, ina)], 4096));
        assert_exact(&r);
        assert_eq!(host_counter(&r, "noise_held"), 0);
        (r.jobs[0].jct_s.expect("finished"), host_counter(&r, "noise_delayed") + host_counter(&r, "noise_stalls"))
    };
    let (quiet, none) = run("stall", 0.0);
    let (stall, stalls) = run("stall", 0.5);
    let (packet, delayed) = run("packet", 0.5);
    assert_eq!(none, 0);
    assert!(stalls > 100 && delayed > 100, "{stalls} {delayed}");
    assert!(stall > quiet + 100e-6 && packet < quiet + 25e-6, "quiet {quiet}, stall {stall}, packet {packet}");
}
