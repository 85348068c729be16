//! SwitchML driven by the simulator: exact sums from the workers' switch, static pools that
//! share a switch, and clear errors where SwitchML cannot run.

mod common;
use common::*;
use inalab_sim::SimResult;
use serde_json::{json, Value};

const SLOT_BYTES: u64 = 280;

fn switchml_job(id: u32, workers: Vec<String>, bytes: u64, pool: u32) -> Value {
    let mut j = job(id, "switchml", workers, vec![], json!({"kind": "allreduce", "bytes": bytes, "iterations": 3}));
    j["ina"] = json!({"packet_bytes": 180, "header_bytes": 52,
                      "timeout_ps": 100 * US, "pool_slots": pool});
    j
}

fn run(topo: Value, jobs: Vec<Value>, slots: u64, loss: f64) -> SimResult {
    let mut s = spec(topo, jobs, vec![]);
    s["payload"] = json!(true);
    s["network"]["aggregator_memory_bytes"] = json!(slots * SLOT_BYTES);
    if loss > 0.0 {
        s["network"]["host_loss"] = json!([{"host": "h0", "prob": loss}, {"host": "h5", "prob": loss}]);
    }
    simulate(&s)
}

fn assert_exact(r: &SimResult) {
    for j in &r.jobs {
        assert!(j.finished, "job {} did not finish: {:?} ({})", j.id, j.failures, r.stopped_by);
        assert_eq!(j.payload_checked, j.workers as u64 * 3);
        assert_eq!(j.payload_errors, 0, "job {}: results equal the exact sums", j.id);
    }
    for s in &r.switches {
        assert_eq!(s.aggregators_end, 0, "switch {} holds partial aggregations", s.name);
    }
}

#[test]
fn sums_exactly_with_and_without_loss() {
    for loss in [0.0, 0.01] {
        let r = run(star(8, US), vec![switchml_job(0, hosts(0..8), 4 * 1001, 16)], 1024, loss);
        assert_exact(&r);
        let sw = &r.switches[0];
        // One completion per chunk of data, plus each tensor's exponent round (8 workers' exponents
        // fit one chunk).
        assert_eq!(sw.counters["completed"], (1001u64.div_ceil(32) + 1) * 3, "one completion per chunk");
        if loss > 0.0 {
            let retx: u64 = r.hosts.iter().map(|h| h.counters.get("retransmissions").copied().unwrap_or(0)).sum();
            assert!(retx > 0, "loss is repaired by timeouts");
        }
    }
}

/// A packet wider than the hardware's (here 256 values, as `inalab emulate`'s scenarios use for
/// a software switch) sums exactly in payload mode. It did not: the switch program held 32
/// values per slot whatever the job's packet size, and rejected every wider packet.
#[test]
fn wide_packets_sum_exactly() {
    let mut j = switchml_job(0, hosts(0..4), 4 * 3000, 4);
    j["ina"]["packet_bytes"] = json!(95 + 4 * 256);
    j["ina"]["header_bytes"] = json!(95);
    let r = run(star(4, US), vec![j], 64, 0.0);
    assert_exact(&r);
    assert_eq!(r.switches[0].counters["completed"], (3000u64.div_ceil(256) + 1) * 3, "one completion per 256-value chunk");
}

#[test]
fn jobs_share_a_switch_in_static_partitions() {
    // pool_slots 0: each job gets half of the switch's 64 slots.
    let jobs = vec![switchml_job(0, hosts(0..4), 4 * 3000, 0), switchml_job(1, hosts(4..8), 4 * 3000, 0)];
    let r = run(star(8, US), jobs, 64, 0.0);
    assert_exact(&r);
    // A larger pool than the switch has is refused, naming the field.
    let e = inalab_sim::run(
        &inalab_sim::parse_spec(&{
            let mut s = spec(star(8, US), vec![switchml_job(0, hosts(0..4), 4096, 100)], vec![]);
            s["network"]["aggregator_memory_bytes"] = json!(64 * SLOT_BYTES);
            s
        }
        .to_string())
        .unwrap(),
        None,
    )
    .unwrap_err();
    assert_eq!(e.field, "jobs[0].ina.pool_slots");
}

#[test]
fn more_slots_stream_faster() {
    let jct = |pool| run(star(4, US), vec![switchml_job(0, hosts(0..4), 4 << 20, pool)], 4096, 0.0).jobs[0].jct_s.expect("finished");
    // One slot is stop-and-wait per worker; 256 slots cover the bandwidth-delay product.
    assert!(jct(256) * 5.0 < jct(1), "pool 256: {} s, pool 1: {} s", jct(256), jct(1));
}

#[test]
fn workers_across_racks_are_refused() {
    let topo = json!({"shape": {"kind": "leaf_spine", "leaves": 2, "spines": 1, "hosts_per_leaf": 2, "switch_ports": 64,
                                "host_rate_bps": G100, "fabric_rate_bps": G100, "link_delay_ps": US}});
    let s = spec(topo, vec![switchml_job(0, hosts(0..4), 4096, 8)], vec![]);
    let e = inalab_sim::run(&inalab_sim::parse_spec(&s.to_string()).unwrap(), None).unwrap_err();
    assert_eq!(e.field, "jobs[0].workers");
    assert!(e.message.contains("ToR"), "{e}");
}
