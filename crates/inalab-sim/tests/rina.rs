//! Rina driven by the simulator: exact sums with every mix of INA and plain racks, the hop
//! counts 2G-1 per chunk, loss on every link, a job of one rack, two jobs on shared ToRs,
//! determinism, and errors that name the field.

mod common;
use common::*;
use inalab_sim::SimResult;
use serde_json::{json, Value};

/// `RINA_SLOT_BYTES`: switch memory per slot.
const SLOT_BYTES: u64 = 272;

fn rina_job(id: u32, workers: Vec<String>, values: u64, iterations: u32, ina: Value) -> Value {
    let mut j = job(id, "rina", workers, vec![], json!({"kind": "allreduce", "bytes": 4 * values, "iterations": iterations}));
    j["ina"] = ina;
    j
}

fn rina_spec(topo: Value, jobs: Vec<Value>) -> Value {
    let mut s = spec(topo, jobs, vec![]);
    s["payload"] = json!(true);
    s["network"]["aggregator_memory_bytes"] = json!(4096 * SLOT_BYTES);
    s
}

/// Every job finished with exact sums and no slot is held.
fn assert_exact(r: &SimResult) {
    assert_jobs_exact(r);
    assert_eq!(counter(r, "collisions") + counter(r, "malformed") + host_counter(r, "malformed"), 0);
}

/// Two racks of 4 under a 2-leaf, 2-spine fabric; `programmable` picks the INA ToRs.
fn two_racks(programmable: Value) -> Value {
    let mut t = leaf_spine_100g(2, 2, 4);
    t["programmable"] = programmable;
    t
}

#[test]
fn every_mix_of_racks_sums_exactly_in_2g_minus_1_hops_per_chunk() {
    // Both racks INA: G = 2; one: G = 1 + 4 = 5; none: G = 8 (a plain ring of Rina hops).
    for (prog, g) in [(json!("tor"), 2u64), (json!({"names": ["leaf0"]}), 5), (json!({"names": ["leaf1"]}), 5), (json!("none"), 8)] {
        let iterations = 2;
        let r = simulate(&rina_spec(two_racks(prog.clone()), vec![rina_job(0, hosts(0..8), 50_000, iterations, json!({}))]));
        assert_exact(&r);
        let it = iterations as u64;
        // Each of the G chunks makes G ScatterReduce hops and G-1 AllGather hops.
        assert_eq!(host_counter(&r, "sr_hops"), g * g * it, "{prog}: ScatterReduce hops");
        assert_eq!(host_counter(&r, "ag_hops"), g * (g - 1) * it, "{prog}: AllGather hops");
        assert_eq!((host_counter(&r, "sr_hops") + host_counter(&r, "ag_hops")) / (g * it), 2 * g - 1, "{prog}");
        assert_eq!(host_counter(&r, "retransmits") + host_counter(&r, "task_resends"), 0, "{prog}: nothing lost");
        if g == 8 {
            assert_eq!(counter(&r, "tasks"), 0, "no INA rack, no TASK");
        } else {
            // Every INA rack's ToR got a TASK per step per iteration.
            let racks = if g == 2 { 2 } else { 1 };
            assert_eq!(counter(&r, "tasks"), racks * g * it, "{prog}");
        }
    }
}

#[test]
fn a_job_of_one_rack_is_summed_by_its_tor_alone() {
    let r = simulate(&rina_spec(star(5, US), vec![rina_job(0, hosts(0..5), 10_000, 3, json!({}))]));
    assert_exact(&r);
    assert_eq!((host_counter(&r, "sr_hops"), host_counter(&r, "ag_hops")), (3, 0), "G = 1: one hop, to itself");
    let packets = 10_000u64.div_ceil(62) * 3;
    assert_eq!(counter(&r, "aggregated"), 5 * packets, "every member's DATA summed once");
}

#[test]
fn loss_on_every_link_is_repaired_and_no_slot_is_held() {
    for prog in [json!("tor"), json!({"names": ["leaf0"]})] {
        let mut s = rina_spec(two_racks(prog.clone()), vec![rina_job(0, hosts(0..8), 40_000, 3, json!({"rto_ps": 50 * US, "repair_ps": 100 * US}))]);
        s["network"]["link_loss"] = loss_on_every_link(2, 2, 4, 0.01);
        let r = simulate(&s);
        assert_exact(&r);
        assert!(r.links.iter().map(|l| l.drops_loss).sum::<u64>() > 50, "{prog}: loss happened");
        assert!(host_counter(&r, "retransmits") > 0, "{prog}");
        // Lost copies of finished chunks inside an INA rack were asked for again (spec F5).
        assert!(host_counter(&r, "nacks") > 0 && host_counter(&r, "repairs") > 0, "{prog}");
    }
}

#[test]
fn two_jobs_share_the_tors_without_mixing() {
    let even: Vec<String> = (0..8).step_by(2).map(|i| format!("h{i}")).collect();
    let odd: Vec<String> = (1..8).step_by(2).map(|i| format!("h{i}")).collect();
    let r = simulate(&rina_spec(two_racks(json!("tor")), vec![rina_job(0, even, 30_000, 2, json!({})), rina_job(1, odd, 30_000, 2, json!({}))]));
    assert_exact(&r);
    assert_eq!(host_counter(&r, "sr_hops"), 2 * (2 * 2 * 2), "each job: G = 2");
}

#[test]
fn runs_are_deterministic() {
    let mut s = rina_spec(two_racks(json!({"names": ["leaf0"]})), vec![rina_job(0, hosts(0..8), 20_000, 2, json!({"rto_ps": 50 * US}))]);
    s["network"]["host_loss"] = json!([{"host": "h2", "prob": 0.02}]);
    assert_deterministic(&s);
}

#[test]
fn bad_settings_name_the_field() {
    for (ina, field) in [
        (json!({"window_bytes": 10}), "ina.window_bytes"),
        (json!({"slots": 2}), "ina.slots"),
        (json!({"min_rack": 1}), "ina.min_rack"),
        (json!({"rto_ps": 0}), "ina.rto_ps"),
        (json!({"header_bytes": 3}), "ina.header_bytes"),
        (json!({"agent": 1}), "ina.agent"),
    ] {
        let e = inalab_scheme::by_name("rina").unwrap().normalize(&json!({"scheme": "rina", "ina": ina})).unwrap_err();
        assert_eq!(e.field, field, "{e}");
    }
}

#[test]
fn step_jitter_costs_more_in_a_longer_chain() {
    // Eq. (1): every step waits for its slowest host, so the same per-step jitter costs a ring
    // of 8 groups more than a ring of 2 racks.
    let jct = |prog: Value, ina: Value| {
        let r = simulate(&rina_spec(two_racks(prog), vec![rina_job(0, hosts(0..8), 20_000, 2, ina)]));
        assert_exact(&r);
        r.jobs[0].jct_s.expect("finished")
    };
    let jitter = json!({"step_overhead_ps": 2 * US, "step_jitter_ps": 20 * US});
    let (ring0, ring1) = (jct(json!("none"), json!({})), jct(json!("none"), jitter.clone()));
    let (rina0, rina1) = (jct(json!("tor"), json!({})), jct(json!("tor"), jitter));
    assert!(ring1 > ring0 && rina1 > rina0, "jitter costs time: ring {ring0} -> {ring1}, rina {rina0} -> {rina1}");
    // The ring's 8 steps per chunk wait for one host each (about O + 0.4 sigma); a rack's 2
    // wait for the slowest of 4 (about O + 1.03 sigma): measured +146 us against +107 us.
    assert!(ring1 - ring0 > 1.2 * (rina1 - rina0), "ring +{} s, rina +{} s", ring1 - ring0, rina1 - rina0);
}

#[test]
fn an_ina_tor_with_one_of_the_jobs_workers_leaves_it_autonomous() {
    // Spec F10: h0..h3 under leaf0, only h4 under leaf1: rack 0 is one group, h4 a ring member
    // of its own (G = 2), and leaf1 never sees a TASK.
    let r = simulate(&rina_spec(two_racks(json!("tor")), vec![rina_job(0, hosts(0..5), 20_000, 2, json!({}))]));
    assert_exact(&r);
    assert_eq!(host_counter(&r, "sr_hops"), 2 * 2 * 2);
    let leaf1 = r.switches.iter().find(|s| s.name == "leaf1").unwrap();
    assert_eq!(leaf1.counters.get("tasks").copied().unwrap_or(0), 0, "{:?}", leaf1.counters);
}

// ---- worker failures (spec §1.8, cases F6-F8) ------------------------------------------

/// A job of 8 workers on two racks of 4, `iterations` allreduces of 20,000 values, and host
/// `dead` failing at `at_ps`, its peers told 20 us later.
fn failure_run(programmable: Value, dead: &str, at_ps: u64, iterations: u32) -> SimResult {
    let mut s = rina_spec(two_racks(programmable), vec![rina_job(0, hosts(0..8), 20_000, iterations, json!({}))]);
    s["failures"] = json!([{"node": dead, "at_ps": at_ps, "detect_ps": 20 * US}]);
    simulate(&s)
}

/// The job finished over its 7 survivors, every result any worker got equals the sum over
/// all 8 or over the survivors (the same at every worker), and nothing is held.
fn assert_survived(r: &SimResult, iterations: u32) {
    let j = &r.jobs[0];
    assert!(j.finished && j.failures.is_empty(), "{:?} ({})", j.failures, r.stopped_by);
    assert!(j.payload_checked >= 7 * iterations as u64, "{} results checked", j.payload_checked);
    assert_eq!(j.payload_errors, 0, "every result is one of the two sums, the same at every worker");
    assert_eq!(host_counter(r, "failures"), 7, "every survivor rebuilt its ring once");
    for s in &r.switches {
        assert_eq!(s.aggregators_end, 0, "switch {} still holds slots: {:?}", s.name, s.counters);
    }
}

fn switch_counter(r: &SimResult, switch: &str, name: &str) -> u64 {
    r.switches.iter().find(|s| s.name == switch).and_then(|s| s.counters.get(name).copied()).unwrap_or(0)
}

#[test]
fn a_failure_at_any_moment_is_survived_by_agents_members_and_autonomous_workers() {
    // Every 10 us through the run (it takes 148 us without a failure): before, during
    // and between allreduces, in ScatterReduce and AllGather. Both recovery paths run: a
    // request some survivor finished is repaired, the others run again.
    let (mut repaired, mut rerun) = (0, 0);
    for (prog, dead) in [(json!("tor"), "h0"), (json!("tor"), "h2"), (json!({"names": ["leaf0"]}), "h5")] {
        for at in (0..14).map(|i| i * 10 * US + 1) {
            let r = failure_run(prog.clone(), dead, at, 6);
            assert_survived(&r, 6);
            repaired += host_counter(&r, "repaired");
            rerun += host_counter(&r, "rerun");
        }
    }
    assert!(repaired > 0 && rerun > 0, "repaired {repaired}, rerun {rerun}");
}

#[test]
fn f6_an_agent_dies_and_its_rack_falls_back_to_autonomous_workers() {
    let r = failure_run(json!("tor"), "h0", 15 * US, 6);
    assert_survived(&r, 6);
    assert!(r.jobs[0].comm_busy_s > 0.0, "rank 0 died: the job's time is a live worker's");
    // Rack 0 dissolved: its ToR sees no TASK of the new epoch; rack 1's agent's TASK tells
    // leaf1 its next receiver (h1, now autonomous).
    assert_eq!((switch_counter(&r, "leaf0", "epochs"), switch_counter(&r, "leaf1", "epochs")), (0, 1));
    assert!(host_counter(&r, "repaired") + host_counter(&r, "rerun") > 0, "the allreduce in flight was recovered");
}

#[test]
fn f7_a_rack_member_dies_and_its_agent_goes_on_without_it() {
    let r = failure_run(json!("tor"), "h2", 15 * US, 6);
    assert_survived(&r, 6);
    assert_eq!((switch_counter(&r, "leaf0", "epochs"), switch_counter(&r, "leaf1", "epochs")), (1, 1));
}

#[test]
fn f8_an_autonomous_worker_dies_and_the_ring_goes_around_it() {
    let r = failure_run(json!({"names": ["leaf0"]}), "h5", 15 * US, 6);
    assert_survived(&r, 6);
    assert_eq!(switch_counter(&r, "leaf0", "epochs"), 1);
}

#[test]
fn a_failure_under_loss_and_between_allreduces_still_sums_alike() {
    for at in [1, 40 * US, 100 * US] {
        let mut s = rina_spec(two_racks(json!("tor")), vec![rina_job(0, hosts(0..8), 20_000, 6, json!({}))]);
        s["failures"] = json!([{"node": "h4", "at_ps": at, "detect_ps": 20 * US}]);
        s["network"]["link_loss"] = loss_on_every_link(2, 2, 4, 0.001);
        let r = simulate(&s);
        assert_survived(&r, 6);
    }
}

#[test]
fn a_scheme_without_failure_handling_fails_the_job_naming_the_worker() {
    let mut s = spec(leaf_spine_100g(2, 2, 4), vec![job(0, "ring", hosts(0..8), vec![], json!({"kind": "allreduce", "bytes": 400_000, "iterations": 4}))], vec![]);
    s["failures"] = json!([{"node": "h3", "at_ps": 10 * US}]);
    let r = simulate(&s);
    let j = &r.jobs[0];
    assert!(!j.finished, "{:?}", j.failures);
    assert!(j.failures.iter().any(|f| f.contains("worker 3 on h3 failed at 10000 ns; ring does not go on without a worker")), "{:?}", j.failures);
    assert_eq!(r.stopped_by, "work_ended", "the failed job does not hold the run to its stop time");
    assert_eq!((j.status, r.outcome.as_str()), ("failed", "failed"));
    assert_eq!(j.reason.as_deref(), j.failures.first().map(String::as_str), "the reason is the first failure");
    assert_eq!(j.jct_s, None, "a failed job has no completion time");
}

#[test]
fn a_host_failure_names_its_bad_fields() {
    let run = |f: Value| {
        let mut s = rina_spec(two_racks(json!("tor")), vec![rina_job(0, hosts(0..8), 1_000, 1, json!({}))]);
        s["failures"] = json!([f]);
        inalab_sim::run(&inalab_sim::parse_spec(&s.to_string()).unwrap(), None).err().map(|e| e.to_string()).unwrap_or_default()
    };
    let e = run(json!({"node": "h1", "at_ps": 5, "until_ps": 9}));
    assert!(e.contains("failures[0].until_ps") && e.contains("does not come back"), "{e}");
    let e = run(json!({"node": "leaf0", "at_ps": 5, "detect_ps": 9}));
    assert!(e.contains("failures[0].detect_ps") && e.contains("host's failure only"), "{e}");
}

#[test]
fn two_failures_in_turn_give_every_survivor_the_same_sums() {
    // A request run again over the first survivors and repaired after the second failure sums
    // the first survivors: neither all workers nor the last survivors (found in review).
    for (prog, first, second) in [(json!("none"), "h5", "h6"), (json!("tor"), "h0", "h1"), (json!("tor"), "h2", "h6")] {
        for gap in [10 * US, 30 * US, 65 * US] {
            let mut s = rina_spec(two_racks(prog.clone()), vec![rina_job(0, hosts(0..8), 20_000, 6, json!({}))]);
            s["failures"] = json!([{"node": first, "at_ps": 15 * US, "detect_ps": 10 * US},
                                   {"node": second, "at_ps": 15 * US + gap, "detect_ps": 10 * US}]);
            let r = simulate(&s);
            let j = &r.jobs[0];
            assert!(j.finished && j.failures.is_empty(), "{prog} {first} {second} {gap}: {:?}", j.failures);
            assert_eq!(j.payload_errors, 0, "{prog} {first} then {second}, {gap} ps apart");
            // Each of the 6 survivors told twice; the second victim once if it lived to hear.
            assert!((12..=13).contains(&host_counter(&r, "failures")), "{}", host_counter(&r, "failures"));
            assert!(r.switches.iter().all(|s| s.aggregators_end == 0));
        }
    }
}

#[test]
fn a_failed_server_fails_its_job_at_once() {
    let mut s = spec(leaf_spine_100g(2, 2, 4), vec![job(0, "atp", hosts(0..7), vec!["h7".into()], json!({"kind": "allreduce", "bytes": 400_000, "iterations": 4}))], vec![]);
    s["network"]["aggregator_memory_bytes"] = json!(1 << 20);
    s["failures"] = json!([{"node": "h7", "at_ps": 20 * US}]);
    let r = simulate(&s);
    let j = &r.jobs[0];
    assert!(!j.finished && j.failures.iter().any(|f| f.contains("its server on h7 failed at 20000 ns")), "{:?}", j.failures);
    assert_eq!((r.stopped_by.as_str(), r.outcome.as_str()), ("work_ended", "failed"));
}
