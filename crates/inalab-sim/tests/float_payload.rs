//! Float payloads through the simulator: every scheme's workers hand float32 tensors to the
//! same quantization layer the UDP runtime uses, with magnitudes from 1e-3 to 1e35 (inside,
//! around and far beyond ATP's fixed-point range of +/-21.47), and every result must equal the
//! float64 sum within the scheme's documented bound (`Quantization::error_bound`), under loss,
//! scarce aggregators and concurrent jobs; no aggregator is left held.

mod common;
use common::*;
use inalab_sim::SimResult;
use proptest::prelude::*;
use serde_json::{json, Value};

/// ATP's aggregator (272 B) and SwitchML's slot (280 B): memory for `n` of either.
fn memory_for(n: u64) -> u64 {
    n * 280
}

fn float_spec(topo: Value, jobs: Vec<Value>, aggregators: u64, loss: f64) -> Value {
    let mut s = spec(topo, jobs, vec![]);
    s["payload"] = json!(true);
    s["payload_values"] = json!("float");
    s["network"]["aggregator_memory_bytes"] = json!(memory_for(aggregators));
    if loss > 0.0 {
        s["network"]["host_loss"] = json!([{"host": "h0", "prob": loss}, {"host": "h5", "prob": loss}]);
    }
    s
}

/// A job of `scheme` on `workers` (and `server` where the scheme has one), `iterations`
/// allreduces of `values` floats: five iterations cover every magnitude class.
fn float_job(id: u32, scheme: &str, workers: Vec<String>, server: &str, values: u64, iterations: u32) -> Value {
    let servers = if scheme == "atp" || scheme == "ps" { vec![server.to_string()] } else { vec![] };
    let mut j = job(id, scheme, workers, servers, json!({"kind": "allreduce", "bytes": 4 * values, "iterations": iterations}));
    match scheme {
        "atp" => j["ina"] = json!({"timeout_ps": 200 * US}),
        // 4 slots per job: two jobs fit the smallest pool the tests draw (8).
        "switchml" => j["ina"] = json!({"timeout_ps": 100 * US, "pool_slots": 4}),
        _ => {}
    }
    j
}

fn assert_within_bounds(r: &SimResult) {
    for j in &r.jobs {
        assert!(j.finished, "job {} did not finish: {:?} ({})", j.id, j.failures, r.stopped_by);
        assert!(j.failures.is_empty(), "{:?}", j.failures);
        assert_eq!(j.payload_checked, j.workers as u64 * j.iterations as u64, "job {}: every result checked", j.id);
        assert_eq!(j.payload_errors, 0, "job {} ({}): every result within the bound", j.id, j.scheme);
    }
    for s in &r.switches {
        assert_eq!(s.aggregators_end, 0, "switch {} still holds aggregators", s.name);
    }
}

#[test]
fn atp_sums_beyond_its_fixed_point_range_through_the_fallback() {
    // Tensors of magnitude 20, 1e4 and 1e35 leave +/-21.47: their fragments are summed by the
    // PS from the workers' floats (§3.8), and the results still meet the bound.
    let r = simulate(&float_spec(star(5, US), vec![float_job(0, "atp", hosts(0..4), "h4", 3_001, 5)], 4096, 0.0));
    assert_within_bounds(&r);
    let ps = r.hosts.iter().find(|h| h.name == "h4").expect("the PS");
    assert!(ps.counters["overflows"] > 0, "the fallback ran: {:?}", ps.counters);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]
    #[test]
    fn every_scheme_meets_its_bound(scheme in prop::sample::select(vec!["atp", "switchml", "ring", "ps"]),
                                    n in prop::sample::select(vec![2u32, 3, 8, 31]), values in 1u64..6_000,
                                    loss in 0.0f64..0.01, aggregators in prop::sample::select(vec![8u64, 64, 4096]),
                                    two in any::<bool>()) {
        let mut jobs = vec![float_job(0, scheme, hosts(0..n), &format!("h{}", 2 * n), values, 5)];
        if two {
            jobs.push(float_job(1, scheme, hosts(n..2 * n), &format!("h{}", 2 * n + 1), values / 2 + 1, 5));
        }
        let r = simulate(&float_spec(star(2 * n + 2, US), jobs, aggregators, loss));
        assert_within_bounds(&r);
    }
}

/// The schemes that sum int32 without an overflow fallback, in payload mode (#36, the runtime's
/// numeric contract, `crates/inalab-net/tests/numeric.rs`): tensors of magnitude 1e-3 and 1
/// (tensors 0 and 1) sum within the bound; tensor 2's (magnitude 20: sums of two or more
/// workers leave +/-21.47) fails the job with a range error, and no wrong sum is ever taken
/// as a result. Before sticky saturation DSA's and others' sums wrapped there.
#[test]
fn schemes_without_a_fallback_sum_in_range_and_fail_beyond_it() {
    let n = 4;
    for scheme in ["dsa", "canary", "static_tree", "rina", "grid"] {
        for iterations in [2, 3] {
            let server = format!("h{n}");
            let servers = if matches!(scheme, "dsa" | "grid") { vec![server] } else { vec![] };
            let j = job(0, scheme, hosts(0..n), servers, json!({"kind": "allreduce", "bytes": 4 * 700, "iterations": iterations}));
            let r = simulate(&float_spec(star(n + 1, US), vec![j], 4096, 0.0));
            let job = &r.jobs[0];
            assert_eq!(job.payload_errors, 0, "{scheme}: no wrong sum taken");
            if iterations == 2 {
                assert_within_bounds(&r);
            } else {
                assert!(!job.finished, "{scheme}: tensor 2's sums leave the range");
                let why = job.failures.join("; ");
                assert!(why.contains("out of the fixed-point range") || why.contains("beyond the fixed-point range"), "{scheme}: {why}");
                assert_eq!(job.payload_checked, 2 * n as u64, "{scheme}: tensors 0 and 1 checked on every worker");
            }
        }
    }
}
