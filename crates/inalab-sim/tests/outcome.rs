//! What a run says about itself: each job's status and why, the run's outcome, flows'
//! completion, aggregation apart from loss, hosts no path joins, and a driver's stop.

mod common;
use common::*;
use inalab_sim::{parse_spec, ProgressReport, Sim};
use serde_json::json;
use std::ops::ControlFlow;

fn allreduce(bytes: u64, iterations: u32) -> serde_json::Value {
    json!({"kind": "allreduce", "bytes": bytes, "iterations": iterations})
}

#[test]
fn a_finished_job_has_its_jct_and_rates_and_the_run_completes() {
    let r = simulate(&spec(star(4, US), vec![job(0, "ring", hosts(0..4), vec![], allreduce(1 << 20, 2))], vec![]));
    let j = &r.jobs[0];
    assert_eq!((j.status, j.kind, j.iterations, j.iterations_planned), ("finished", "allreduce", 2, 2));
    assert_eq!((r.stopped_by.as_str(), r.outcome.as_str()), ("work_ended", "completed"));
    assert!(j.reason.is_none());
    let (jct, algbw) = (j.jct_s.expect("a JCT"), j.goodput_gbps.expect("a rate"));
    assert!((algbw - 2.0 * (1u64 << 20) as f64 * 8.0 / jct / 1e9).abs() < 1e-9);
    // NCCL's bus bandwidth: algbw x 2(n-1)/n, n = 4.
    assert!((j.busbw_gbps.unwrap() - algbw * 1.5).abs() < 1e-9);
}

#[test]
fn a_job_cut_by_the_stop_time_is_unfinished_without_a_jct() {
    let mut s = spec(star(4, US), vec![job(0, "ring", hosts(0..4), vec![], allreduce(64 << 20, 1))], vec![]);
    s["stop_ps"] = json!(50 * US);
    let r = simulate(&s);
    let j = &r.jobs[0];
    assert_eq!((j.status, r.stopped_by.as_str(), r.outcome.as_str()), ("unfinished", "stop_time", "unfinished"));
    assert_eq!((j.jct_s, j.goodput_gbps, j.mean_iteration_s), (None, None, None), "nothing measured of an unfinished job");
    assert!(j.reason.as_deref().is_some_and(|w| w.contains("0 of 1 iterations") && w.contains("at the stop time, 50 us")), "{:?}", j.reason);
}

#[test]
fn a_failed_host_fails_the_run_and_names_the_worker() {
    let mut s = spec(star(4, US), vec![job(0, "ring", hosts(0..4), vec![], allreduce(4 << 20, 3))], vec![]);
    s["failures"] = json!([{"node": "h1", "at_ps": 100 * US}]);
    let r = simulate(&s);
    let j = &r.jobs[0];
    assert_eq!((j.status, r.outcome.as_str()), ("failed", "failed"));
    assert!(j.reason.as_deref().is_some_and(|w| w.contains("worker 1 on h1 failed")), "{:?}", j.reason);
    assert_eq!(j.jct_s, None);
}

#[test]
fn hosts_no_path_joins_are_refused_before_the_run_naming_them() {
    let topo = json!({"shape": {"kind": "edges",
        "nodes": [{"name": "a", "kind": "host"}, {"name": "b", "kind": "host"}, {"name": "c", "kind": "host"},
                  {"name": "s1", "kind": "switch"}, {"name": "s2", "kind": "switch"}],
        "links": [{"a": "a", "b": "s1", "rate_bps": G100, "delay_ps": US}, {"a": "b", "b": "s1", "rate_bps": G100, "delay_ps": US},
                  {"a": "c", "b": "s2", "rate_bps": G100, "delay_ps": US}]},
        "programmable": "none"});
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let refused = |s: serde_json::Value| Sim::new(&parse_spec(&s.to_string()).unwrap()).err().expect("refused").to_string();
    let e = refused(spec(topo.clone(), vec![job(0, "ring", names(&["a", "b", "c"]), vec![], allreduce(1 << 20, 1))], vec![]));
    assert!(e.starts_with("jobs[0]: no path in the topology from a to c"), "{e}");
    let e = refused(spec(topo.clone(), vec![], vec![json!({"src": "b", "dst": "c", "bytes": 1500, "packet_bytes": 1500, "start_ps": 0})]));
    assert!(e.starts_with("flows[0]: no path in the topology from b to c"), "{e}");
    // Hosts in one part run.
    let r = simulate(&spec(topo, vec![job(0, "ring", names(&["a", "b"]), vec![], allreduce(1 << 20, 1))], vec![]));
    assert_eq!(r.outcome, "completed");
}

#[test]
fn flows_report_what_arrived_and_when_they_ended() {
    let flow = |src: &str, bytes: u64, start: u64| json!({"src": src, "dst": "h0", "bytes": bytes, "packet_bytes": 1500, "start_ps": start});
    // An incast into a small buffer loses packets (flows do not retransmit); a flow that starts
    // after the stop never ends.
    let mut s = spec(star(5, US), vec![], vec![flow("h1", 300_000, 0), flow("h2", 300_000, 0), flow("h3", 300_000, 0), flow("h4", 1500, 20_000 * US)]);
    s["network"]["buffer_bytes"] = json!(30_000);
    s["stop_ps"] = json!(10_000 * US);
    let r = simulate(&s);
    let lossy: Vec<_> = r.flows[..3].iter().filter(|f| f.status == "lossy").collect();
    assert!(!lossy.is_empty(), "{:?}", r.flows);
    for f in &r.flows[..3] {
        assert!(f.finished && f.fct_s.is_some());
        assert_eq!(f.packets_received + f.packets_dropped, f.packets);
        assert!((f.delivered_fraction - f.bytes_received as f64 / f.bytes as f64).abs() < 1e-12);
        assert_eq!(f.status == "delivered", f.packets_dropped == 0);
        assert!(f.fct_s.unwrap() >= f.last_rx_s.unwrap() - f.start_s - 1e-15);
    }
    let late = &r.flows[3];
    assert_eq!((late.status, late.finished, late.fct_s, late.first_rx_s), ("unfinished", false, None, None));
    assert_eq!(r.outcome, "unfinished", "a flow that did not end leaves the run unfinished");
}

#[test]
fn aggregation_is_absorbed_not_lost() {
    // SwitchML on a lossless star: every gradient packet ends in a sum at the switch.
    let mut j = job(0, "switchml", hosts(0..4), vec![], allreduce(1 << 20, 1));
    j["ina"] = json!({"packet_bytes": 180, "header_bytes": 52, "timeout_ps": 100 * US, "pool_slots": 64});
    let mut s = spec(star(4, US), vec![j], vec![]);
    s["network"]["aggregator_memory_bytes"] = json!(64 * 280);
    let r = simulate(&s);
    assert_eq!(r.outcome, "completed");
    let c = &r.conservation;
    assert_eq!(c.lost_packets, 0, "nothing is lost without loss: {c:?}");
    assert!(c.absorbed_packets > 0);
    assert_eq!(c.absorbed_packets, r.switches.iter().map(|s| s.absorbed_packets).sum::<u64>());
    assert_eq!(c.absorbed_packets, counter(&r, "aggregated"), "absorbed: every packet the program summed (its results are new packets)");
    assert_eq!(r.switches.iter().map(|s| s.drops_program).sum::<u64>(), 0);
}

#[test]
fn a_driver_stops_a_run_from_its_progress_callback_and_gets_what_was_done() {
    let spec = spec(star(16, US), vec![job(0, "ring", hosts(0..16), vec![], allreduce(1 << 30, 1))], vec![]);
    let mut sim = Sim::new(&parse_spec(&spec.to_string()).unwrap()).unwrap();
    let mut seen: Vec<ProgressReport> = vec![];
    // Stop at the first report (about 0.1 s of wall time in).
    let mut cb = |r: &ProgressReport| {
        seen.push(*r);
        ControlFlow::Break(())
    };
    sim.run(Some(&mut cb));
    let r = sim.finish();
    check_invariants(&r);
    assert_eq!((r.stopped_by.as_str(), r.outcome.as_str(), r.jobs[0].status), ("interrupted", "interrupted", "unfinished"));
    assert!(r.jobs[0].reason.as_deref().is_some_and(|w| w.starts_with("interrupted at")), "{:?}", r.jobs[0].reason);
    // The stop report, then the final one; the fraction of one unfinished allreduce moved off 0.
    assert_eq!(seen.len(), 2);
    assert!(seen[0].fraction > 0.0 && seen[0].fraction < 1.0, "{:?}", seen[0]);
    assert!(seen[0].sim_time_s > 0.0 && seen[1].events == r.events);
}
