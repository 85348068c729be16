//! Spec builders for the simulator's integration tests.
#![allow(dead_code)]

use inalab_sim::{parse_spec, run, SimResult};
use serde_json::{json, Value};

pub const G100: u64 = 100_000_000_000;
pub const US: u64 = 1_000_000;

pub fn star(hosts: u32, delay_ps: u64) -> Value {
    json!({"shape": {"kind": "star", "hosts": hosts, "switch_ports": 1024, "link_rate_bps": G100, "link_delay_ps": delay_ps}})
}

pub fn transport() -> Value {
    json!({"mss_bytes": 1436, "header_bytes": 64, "rto_ps": 1000 * US, "init_window_bytes": 60000, "increment_bytes": 1500})
}

/// A job with the transport and partition settings the scheme takes (per the registry).
pub fn job(id: u32, scheme: &str, workers: Vec<String>, servers: Vec<String>, workload: Value) -> Value {
    let mut j = json!({"id": id, "name": format!("job{id}"), "scheme": scheme, "workers": workers, "servers": servers,
                       "workload": workload, "start_ps": 0, "jitter_ps": 0});
    let params = inalab_scheme::by_name(scheme).expect("a registered scheme").params();
    if params.iter().any(|p| p.name.starts_with("transport.")) {
        j["transport"] = transport();
    }
    if params.iter().any(|p| p.name == "partition_bytes") {
        j["partition_bytes"] = json!(4 << 20);
    }
    j
}

pub fn hosts(r: std::ops::Range<u32>) -> Vec<String> {
    r.map(|i| format!("h{i}")).collect()
}

pub fn spec(topology: Value, jobs: Vec<Value>, flows: Vec<Value>) -> Value {
    json!({
        "name": "test", "seed": 7, "payload": false, "stop_ps": 10_000_000 * US,
        "topology": topology,
        "network": {"buffer_bytes": 4 << 20, "ecn_threshold_bytes": 1 << 20, "routing": {"kind": "ecmp"},
                    "aggregator_memory_bytes": 0},
        "jobs": jobs, "flows": flows,
        "metrics": {"bin_ps": 10 * US}
    })
}

/// Runs a spec and checks the invariants every run must keep.
pub fn simulate(spec: &Value) -> SimResult {
    let s = parse_spec(&spec.to_string()).expect("valid spec");
    let r = run(&s, None).expect("valid scenario");
    check_invariants(&r);
    r
}

pub fn check_invariants(r: &SimResult) {
    let c = &r.conservation;
    assert!(c.holds, "conservation violated: {c:?}");
    // Once every job ended (finished or failed), no switch holds an aggregator.
    if r.jobs.iter().all(|j| j.status != "unfinished") {
        for s in &r.switches {
            assert_eq!(s.aggregators_end, 0, "switch {} holds aggregators after every job ended", s.name);
        }
    }
    for l in &r.links {
        // Under PFC (its columns are present) nothing is dropped for lack of buffer.
        assert!(l.pfc_pauses.is_none() || l.drops_queue == 0, "link {}->{} dropped {} packets under PFC", l.src, l.dst, l.drops_queue);
        assert!(l.utilization <= 1.0 + 1e-9, "link {}->{} above 100%: {}", l.src, l.dst, l.utilization);
        // Each packet's serialization is split over the bins it covers: a bin is never more than full.
        assert!(l.peak_bin_utilization <= 1.0 + 1e-12, "link {}->{} bin above 100%: {}", l.src, l.dst, l.peak_bin_utilization);
    }
}

/// A switch counter summed over every switch.
/// Every job finished, every worker checked every tensor against its exact sum, and no switch
/// holds an aggregator (slot, descriptor) at the end: what every INA scheme's tests demand.
pub fn assert_jobs_exact(r: &SimResult) {
    for j in &r.jobs {
        assert!(j.finished, "job {} did not finish: {:?} ({})", j.id, j.failures, r.stopped_by);
        assert_eq!(j.payload_checked, j.workers as u64 * j.iterations as u64, "job {}: every worker checked every tensor", j.id);
        assert_eq!(j.payload_errors, 0, "job {}: results equal the exact sums", j.id);
    }
    for s in &r.switches {
        assert_eq!(s.aggregators_end, 0, "switch {} still holds aggregators: {:?}", s.name, s.counters);
    }
}

pub fn counter(r: &SimResult, name: &str) -> u64 {
    r.switches.iter().map(|s| s.counters.get(name).copied().unwrap_or(0)).sum()
}

/// A host-protocol counter summed over every host.
pub fn host_counter(r: &SimResult, name: &str) -> u64 {
    r.hosts.iter().map(|h| h.counters.get(name).copied().unwrap_or(0)).sum()
}

/// A leaf-spine of 64-port switches, every link 100 Gbps with 0.5 us of delay.
pub fn leaf_spine_100g(leaves: u32, spines: u32, hosts_per_leaf: u32) -> Value {
    json!({"shape": {"kind": "leaf_spine", "leaves": leaves, "spines": spines, "hosts_per_leaf": hosts_per_leaf, "switch_ports": 64,
                     "host_rate_bps": G100, "fabric_rate_bps": G100, "link_delay_ps": US / 2}})
}

/// `prob` loss on every link of a leaf-spine built by `leaf_spine_100g` (host links and
/// leaf-spine links), as `network.link_loss`.
pub fn loss_on_every_link(leaves: u32, spines: u32, hosts_per_leaf: u32, prob: f64) -> Value {
    let mut loss = vec![];
    for l in 0..leaves {
        for h in 0..hosts_per_leaf {
            loss.push(json!({"a": format!("h{}", hosts_per_leaf * l + h), "b": format!("leaf{l}"), "prob": prob}));
        }
        for sp in 0..spines {
            loss.push(json!({"a": format!("leaf{l}"), "b": format!("spine{sp}"), "prob": prob}));
        }
    }
    json!(loss)
}

/// Runs `spec` twice and checks the results are identical, wall time aside: same config and
/// seed, same result, bit for bit.
pub fn assert_deterministic(spec: &Value) {
    let run = || {
        let mut r = simulate(spec);
        r.wall_s = 0.0;
        serde_json::to_string(&r).unwrap()
    };
    assert_eq!(run(), run());
}
