//! ATP's tree mode (`ina.levels = "tree"`): every ATP switch on the job's routes to the PS
//! aggregates. Exact sums and no aggregator held with any set of ATP switches, under loss;
//! aggregation really happens above the ToRs; the PS then gets one packet per fragment; the
//! tree lifts the convergence at the PS's ToR that caps ATP's two levels; errors.

mod common;
use common::*;
use inalab_sim::SimResult;
use serde_json::{json, Value};

const FT_HOSTS: u32 = 16;

/// Fat tree k=4 (16 hosts): h0 is the PS, h1..h15 the workers.
fn fat_tree(programmable: Value) -> Value {
    json!({"shape": {"kind": "fat_tree", "k": 4, "link_rate_bps": G100, "link_delay_ps": US}, "programmable": programmable})
}

fn atp_spec(topo: Value, values: u64, iterations: u32, ina: Value) -> Value {
    let mut j = job(0, "atp", hosts(1..FT_HOSTS), vec!["h0".into()], json!({"kind": "allreduce", "bytes": 4 * values, "iterations": iterations}));
    j["ina"] = ina;
    let mut s = spec(topo, vec![j], vec![]);
    s["payload"] = json!(true);
    s["network"]["aggregator_memory_bytes"] = json!(64 << 20);
    s
}

/// `prob` loss on every link of the k=4 fat tree (hosts, edge-agg, agg-core).
fn fat_tree_links(prob: f64) -> Value {
    let mut loss = vec![];
    for p in 0..4 {
        for e in 0..2 {
            for i in 0..2 {
                loss.push(json!({"a": format!("h{}", 4 * p + 2 * e + i), "b": format!("edge{p}_{e}"), "prob": prob}));
            }
            for a in 0..2 {
                loss.push(json!({"a": format!("edge{p}_{e}"), "b": format!("agg{p}_{a}"), "prob": prob}));
            }
        }
        for a in 0..2 {
            for j in 0..2 {
                loss.push(json!({"a": format!("agg{p}_{a}"), "b": format!("core{}", 2 * a + j), "prob": prob}));
            }
        }
    }
    json!(loss)
}

fn tree() -> Value {
    json!({"levels": "tree"})
}

fn switch_counter(r: &SimResult, prefix: &str, name: &str) -> u64 {
    r.switches.iter().filter(|s| s.name.starts_with(prefix)).map(|s| s.counters.get(name).copied().unwrap_or(0)).sum()
}

fn ps_received(r: &SimResult) -> u64 {
    r.links.iter().filter(|l| l.dst == "h0").map(|l| l.tx_packets).sum()
}

#[test]
fn every_atp_switch_on_the_tree_aggregates_and_the_ps_gets_one_packet_per_fragment() {
    let values = 62 * 500;
    let r = simulate(&atp_spec(fat_tree(json!("all")), values, 2, tree()));
    assert_jobs_exact(&r);
    let frags = 500 * 2;
    // 7 racks of 2 workers complete at their edge switch, the PS's rack at its own.
    assert!(switch_counter(&r, "edge", "completed") >= 8 * frags);
    assert!(switch_counter(&r, "agg", "completed") > 0 && switch_counter(&r, "core", "completed") > 0, "aggregation above the ToRs");
    assert_eq!(counter(&r, "collisions"), 0);
    assert_eq!(ps_received(&r), frags, "one complete aggregate per fragment reaches the PS");
    // Two levels: the PS's ToR adds 8 contributions per fragment and nothing above it.
    let two = simulate(&atp_spec(fat_tree(json!("all")), values, 2, json!({})));
    assert_jobs_exact(&two);
    assert_eq!(switch_counter(&two, "agg", "completed") + switch_counter(&two, "core", "completed"), 0);
}

#[test]
fn any_set_of_atp_switches_sums_exactly() {
    for prog in [
        json!("none"),
        json!("tor"),
        json!({"names": ["core0", "core1", "core2", "core3"]}),
        json!({"names": ["agg0_0", "agg1_1", "core2", "edge2_0"]}),
        json!({"names": ["edge0_0", "agg0_0", "agg0_1"]}),
        json!({"names": ["agg3_0", "agg3_1", "core0", "core3", "edge1_1", "edge3_1"]}),
    ] {
        let r = simulate(&atp_spec(fat_tree(prog.clone()), 62 * 300, 2, tree()));
        assert_jobs_exact(&r);
        assert_eq!(host_counter(&r, "rejected"), 0, "{prog}: every packet's coverage understood");
    }
}

#[test]
fn loss_on_every_link_is_recovered_with_no_aggregator_held() {
    for prog in [json!("all"), json!({"names": ["agg0_0", "agg0_1", "core1", "edge3_0"]})] {
        let mut s = atp_spec(fat_tree(prog.clone()), 62 * 400, 3, json!({"levels": "tree", "timeout_ps": 100 * US}));
        s["network"]["link_loss"] = fat_tree_links(0.01);
        let r = simulate(&s);
        assert_jobs_exact(&r);
        assert!(r.links.iter().map(|l| l.drops_loss).sum::<u64>() > 50, "{prog}: loss happened");
        assert!(counter(&r, "resends") > 0, "{prog}: resends crossed the switches");
    }
}

#[test]
fn the_tree_lifts_the_cap_at_the_ps_rack() {
    let goodput = |ina: Value| {
        let r = simulate(&atp_spec(fat_tree(json!("all")), 1 << 20, 1, ina));
        assert_jobs_exact(&r);
        r.jobs[0].goodput_gbps.expect("finished")
    };
    let (two, tree) = (goodput(json!({})), goodput(tree()));
    // Two levels: 7 rack aggregates meet on the PS ToR's two uplinks; the tree sends one.
    assert!(tree > 2.0 * two, "tree {tree:.1} Gbps vs two levels {two:.1}");
}

#[test]
fn runs_are_deterministic() {
    let mut s = atp_spec(fat_tree(json!({"names": ["agg1_0", "core2", "edge0_1"]})), 62 * 200, 2, json!({"levels": "tree", "timeout_ps": 100 * US}));
    s["network"]["host_loss"] = json!([{"host": "h5", "prob": 0.02}]);
    assert_deterministic(&s);
}

#[test]
fn a_bad_level_names_the_field() {
    let e = inalab_scheme::by_name("atp").unwrap().normalize(&json!({"scheme": "atp", "ina": {"levels": "core"}})).unwrap_err();
    assert_eq!(e.field, "ina.levels", "{e}");
}

#[test]
fn two_jobs_colliding_in_a_small_pool_sum_exactly() {
    let job_of = |id: u32, ps: &str, workers: Vec<String>| {
        let mut j = job(id, "atp", workers, vec![ps.into()], json!({"kind": "allreduce", "bytes": 4 * 62 * 300, "iterations": 2}));
        j["ina"] = json!({"levels": "tree", "slots": 64, "timeout_ps": 100 * US});
        j
    };
    let mut s = spec(fat_tree(json!("all")), vec![job_of(0, "h0", hosts(1..8)), job_of(1, "h8", hosts(9..16))], vec![]);
    s["payload"] = json!(true);
    // 40 aggregators per switch for two jobs of 64 slots.
    s["network"]["aggregator_memory_bytes"] = json!(40 * 272);
    let r = simulate(&s);
    assert_jobs_exact(&r);
    assert!(counter(&r, "collisions") > 0, "the pool was contended");
}
