//! Timed switch and link failures (Canary §1.11): a failed switch or link loses what it holds
//! and what reaches it, routing goes around it, and a switch that comes back starts empty.

mod common;
use common::*;
use inalab_core::{NodeId, Packet, PortId, SwitchAction, SwitchCtx, SwitchProgram, Time};
use inalab_sim::SimResult;
use serde_json::{json, Value};

/// Two leaves of four hosts (h0-h3 on leaf0, h4-h7 on leaf1) over two spines.
fn leaf_spine() -> Value {
    json!({"shape": {"kind": "leaf_spine", "leaves": 2, "spines": 2, "hosts_per_leaf": 4, "switch_ports": 64,
                     "host_rate_bps": G100, "fabric_rate_bps": G100, "link_delay_ps": US}})
}

fn flow(src: u32, dst: u32, bytes: u64) -> Value {
    json!({"src": format!("h{src}"), "dst": format!("h{dst}"), "bytes": bytes, "packet_bytes": 1500, "start_ps": 0})
}

fn switch<'a>(r: &'a SimResult, name: &str) -> &'a inalab_sim::SwitchResult {
    r.switches.iter().find(|s| s.name == name).unwrap()
}

fn counter(r: &SimResult, sw: &str, name: &str) -> u64 {
    switch(r, sw).counters.get(name).copied().unwrap_or(0)
}

fn link<'a>(r: &'a SimResult, src: &str, dst: &str) -> &'a inalab_sim::LinkResult {
    r.links.iter().find(|l| l.src == src && l.dst == dst).unwrap()
}

/// (bin start in us, utilization) of one link direction.
fn series(r: &SimResult, entity: &str) -> Vec<(f64, f64)> {
    r.timeseries.iter().filter(|s| s.metric == "link_utilization" && s.entity == entity).map(|s| (s.t_s * 1e6, s.value)).collect()
}

fn run_err(s: &Value) -> inalab_sim::SimError {
    inalab_sim::run(&inalab_sim::parse_spec(&s.to_string()).expect("parses"), None).unwrap_err()
}

#[test]
fn a_spine_down_from_the_start_carries_nothing() {
    // Both ways between the leaves: 8 flows of 200 packets.
    let flows: Vec<_> = (0..4).flat_map(|i| [flow(i, 4 + i, 300_000), flow(4 + i, i, 300_000)]).collect();
    let healthy = simulate(&spec(leaf_spine(), vec![], flows.clone()));
    // Fail the spine ECMP gave most flows to.
    let (dead, alive) = if switch(&healthy, "spine0").rx_packets >= switch(&healthy, "spine1").rx_packets { ("spine0", "spine1") } else { ("spine1", "spine0") };
    assert!(switch(&healthy, dead).rx_packets >= 4 * 200);

    let mut s = spec(leaf_spine(), vec![], flows);
    s["failures"] = json!([{"node": dead, "at_ps": 0}]);
    let r = simulate(&s);
    assert_eq!(r.outcome, "completed");
    for f in &r.flows {
        assert_eq!(f.bytes_received, 300_000, "flow {} lost nothing", f.id);
    }
    assert_eq!(switch(&r, dead).rx_packets, 0);
    assert_eq!(counter(&r, dead, "drops_node_failed"), 0, "nothing was even sent to it");
    for leaf in ["leaf0", "leaf1"] {
        assert_eq!(link(&r, leaf, dead).tx_packets, 0);
        assert_eq!(link(&r, leaf, alive).tx_packets, 4 * 200);
    }
    assert_eq!(switch(&r, alive).rx_packets, 8 * 200);
    assert_eq!(r.conservation.lost_packets, 0);
}

/// A payload-mode ring allreduce over both leaves (its transport retransmits), with spine0
/// failing for good at 50 us.
fn ring_with_spine_failure() -> Value {
    let workload = json!({"kind": "allreduce", "bytes": 4 * 250_000, "iterations": 2});
    let mut s = spec(leaf_spine(), vec![job(0, "ring", hosts(0..8), vec![], workload)], vec![]);
    s["payload"] = json!(true);
    s["failures"] = json!([{"node": "spine0", "at_ps": 50 * US}]);
    s
}

#[test]
fn a_spine_failing_mid_allreduce_loses_its_packets_and_the_ring_still_finishes() {
    let r = simulate(&ring_with_spine_failure());
    let j = &r.jobs[0];
    assert!(j.finished, "{:?} ({})", j.failures, r.stopped_by);
    assert_eq!(j.payload_checked, 8 * 2);
    assert_eq!(j.payload_errors, 0);
    let lost = counter(&r, "spine0", "drops_node_failed");
    assert!(lost > 0, "packets in or on the way to spine0 are lost: {:?}", switch(&r, "spine0").counters);
    assert!(r.conservation.lost_packets >= lost);
    let retx: u64 = r.hosts.iter().map(|h| h.counters.get("retransmissions").copied().unwrap_or(0)).sum();
    assert!(retx > 0, "and repaired by retransmission");
    // Once the queues in front of it drained, nothing goes toward spine0.
    for leaf in ["leaf0", "leaf1"] {
        for (t, u) in series(&r, &format!("{leaf}->spine0")) {
            assert!(t < 60.0 || u == 0.0, "{leaf}->spine0 busy {u} at {t} us");
        }
    }
    assert!(switch(&r, "spine1").rx_packets > switch(&r, "spine0").rx_packets);
}

#[test]
fn same_failures_same_result_bit_for_bit() {
    let run = || {
        let mut r = simulate(&ring_with_spine_failure());
        r.wall_s = 0.0;
        serde_json::to_string(&r).unwrap()
    };
    assert_eq!(run(), run());
}

#[test]
fn a_failed_link_comes_back_and_carries_traffic_again() {
    // 10 MB from h0 to h4 takes ~800 us; the link it uses is down from 200 to 400 us.
    let healthy = simulate(&spec(leaf_spine(), vec![], vec![flow(0, 4, 10_000_000)]));
    let (used, other) = if link(&healthy, "leaf0", "spine0").tx_packets > 0 { ("spine0", "spine1") } else { ("spine1", "spine0") };
    assert_eq!(link(&healthy, "leaf0", other).tx_packets, 0);

    let mut s = spec(leaf_spine(), vec![], vec![flow(0, 4, 10_000_000)]);
    s["failures"] = json!([{"link": ["leaf0", used], "at_ps": 200 * US, "until_ps": 400 * US}]);
    let r = simulate(&s);
    let up = series(&r, &format!("leaf0->{used}"));
    let detour = series(&r, &format!("leaf0->{other}"));
    let busy = |s: &[(f64, f64)], from: f64, to: f64| s.iter().filter(|&&(t, _)| t >= from && t < to).map(|x| x.1).sum::<f64>();
    assert!(busy(&up, 0.0, 200.0) > 15.0, "the flow's link before the failure");
    assert_eq!(busy(&up, 210.0, 400.0), 0.0, "nothing on the failed link");
    assert!(busy(&detour, 210.0, 400.0) > 15.0, "the other spine meanwhile: {detour:?}");
    assert!(busy(&up, 410.0, 1000.0) > 15.0, "the link again after it came back");
    assert_eq!(busy(&detour, 410.0, 1000.0), 0.0, "the flow returns to its ECMP port");
    // The packets on the link when it failed were lost, counted at their sender.
    let lost = counter(&r, "leaf0", "drops_link_failed");
    assert!(lost > 0);
    assert_eq!(r.conservation.lost_packets, lost);
    assert_eq!(r.flows[0].bytes_received, 10_000_000 - lost * 1500);
}

#[test]
fn a_switch_back_from_failure_restarts_empty_with_its_jobs_admitted() {
    // ATP aggregates at the leaves: leaf1 (workers h4-h7) fails for 100 us mid-run and comes
    // back with a fresh program; the job's timeouts resend what its old one held.
    let topo = json!({"shape": {"kind": "leaf_spine", "leaves": 3, "spines": 2, "hosts_per_leaf": 4, "switch_ports": 64,
                                "host_rate_bps": G100, "fabric_rate_bps": G100, "link_delay_ps": US}});
    let mut j = job(0, "atp", hosts(0..8), vec!["h8".into()], json!({"kind": "allreduce", "bytes": 4 * 100_000, "iterations": 3}));
    j["ina"] = json!({"packet_bytes": 306, "header_bytes": 58, "hashing": "hash", "congestion_control": true, "timeout_ps": 200 * US});
    let mut s = spec(topo, vec![j], vec![]);
    s["payload"] = json!(true);
    s["network"]["aggregator_memory_bytes"] = json!(1024 * 272);
    let healthy = simulate(&s);
    s["failures"] = json!([{"node": "leaf1", "at_ps": 20 * US, "until_ps": 120 * US}]);
    let r = simulate(&s);
    let j = &r.jobs[0];
    assert!(j.finished, "{:?} ({})", j.failures, r.stopped_by);
    assert_eq!(j.payload_errors, 0);
    assert_eq!(j.payload_checked, 8 * 3);
    assert_eq!(counter(&r, "leaf1", "restarts"), 1);
    assert!(counter(&r, "leaf1", "drops_node_failed") > 0);
    assert!(counter(&r, "leaf1", "resends") > counter(&healthy, "leaf1", "resends"), "the lost fragments were resent");
    // The fresh instance aggregates again, so the job is admitted there.
    let agg_after = r.timeseries.iter().any(|s| s.metric == "aggregators_in_use" && s.entity == "leaf1" && s.t_s >= 120e-6 && s.value > 0.0);
    assert!(agg_after);
    assert!(r.jobs[0].jct_s.expect("finished") > healthy.jobs[0].jct_s.expect("finished"));
}

/// (time, next hops offered), per packet.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<(Time, Vec<PortId>)>>>;

/// Records the next hops leaf0's program is offered toward each packet's destination.
#[derive(Default)]
struct CountHops {
    seen: Seen,
}

impl SwitchProgram for CountHops {
    fn on_packet(&mut self, now: Time, ctx: &dyn SwitchCtx, _in_port: PortId, pkt: Packet, out: &mut Vec<SwitchAction>) {
        self.seen.lock().unwrap().push((now, ctx.next_hops(pkt.dst).to_vec()));
        out.push(SwitchAction::Route { pkt });
    }
}

#[test]
fn the_switch_context_leaves_dead_ports_out() {
    let mut s = spec(leaf_spine(), vec![], vec![flow(0, 4, 3_000_000)]);
    // spine1 is down from 30 to 90 us, the link leaf0-spine0 from 60 to 120 us: between 60
    // and 90 us leaf0 has no next hop toward leaf1.
    s["failures"] = json!([{"node": "spine1", "at_ps": 30 * US, "until_ps": 90 * US},
                           {"link": ["leaf0", "spine0"], "at_ps": 60 * US, "until_ps": 120 * US}]);
    let spec = inalab_sim::parse_spec(&s.to_string()).unwrap();
    let mut sim = inalab_sim::Sim::new(&spec).unwrap();
    let leaf0: NodeId = sim.topology().find("leaf0").unwrap();
    let program = CountHops::default();
    let seen = program.seen.clone();
    sim.set_program(leaf0, Box::new(program));
    sim.run(None);
    let r = sim.finish();
    check_invariants(&r);
    let seen = seen.lock().unwrap();
    // leaf0's ports: h0..h3, then spine0 (4) and spine1 (5).
    for (t, hops) in seen.iter() {
        let want: &[PortId] = match *t {
            t if t < 30 * US => &[4, 5],
            t if t < 60 * US => &[4],
            t if t < 90 * US => &[],
            t if t < 120 * US => &[5],
            _ => &[4, 5],
        };
        assert_eq!(hops, want, "at {t} ps");
    }
    assert!(seen.iter().any(|(t, _)| *t > 120 * US));
    // With no next hop left the packets are dropped as unroutable.
    assert!(counter(&r, "leaf0", "drops_no_route") > 0);
    assert_eq!(counter(&r, "spine1", "restarts"), 1);
}

/// Sets two timers per packet, 25 and 50 us on, and records when timers fire.
#[derive(Default)]
struct Timers {
    fired: std::sync::Arc<std::sync::Mutex<Vec<Time>>>,
}

impl SwitchProgram for Timers {
    fn on_packet(&mut self, now: Time, _ctx: &dyn SwitchCtx, _in_port: PortId, pkt: Packet, out: &mut Vec<SwitchAction>) {
        out.push(SwitchAction::SetTimer { at: now + 25 * US, token: 0 });
        out.push(SwitchAction::SetTimer { at: now + 50 * US, token: 0 });
        out.push(SwitchAction::Route { pkt });
    }
    fn on_timer(&mut self, now: Time, _ctx: &dyn SwitchCtx, _token: u64, _out: &mut Vec<SwitchAction>) {
        self.fired.lock().unwrap().push(now);
    }
}

#[test]
fn a_failed_switchs_timers_never_fire() {
    // leaf0 is down from 20 to 40 us: timers its packets of the first flow set (due during
    // and after the failure) are gone; those of the second flow, after it, fire.
    let mut s = spec(leaf_spine(), vec![], vec![flow(0, 4, 15_000), flow(1, 5, 15_000)]);
    s["flows"][1]["start_ps"] = json!(45 * US);
    s["linger_ps"] = json!(200 * US);
    s["failures"] = json!([{"node": "leaf0", "at_ps": 20 * US, "until_ps": 40 * US}]);
    let spec = inalab_sim::parse_spec(&s.to_string()).unwrap();
    let mut sim = inalab_sim::Sim::new(&spec).unwrap();
    let leaf0: NodeId = sim.topology().find("leaf0").unwrap();
    let program = Timers::default();
    let fired = program.fired.clone();
    sim.set_program(leaf0, Box::new(program));
    sim.run(None);
    let r = sim.finish();
    check_invariants(&r);
    assert!(r.flows.iter().all(|f| f.bytes_received == 15_000));
    let fired = fired.lock().unwrap();
    assert_eq!(fired.len(), 2 * 10, "{fired:?}");
    assert!(fired.iter().all(|&t| t > 45 * US + 25 * US));
    assert_eq!(counter(&r, "leaf0", "restarts"), 1);
}

#[test]
fn bad_failures_name_their_field() {
    let with = |f: Value| {
        let mut s = spec(leaf_spine(), vec![], vec![flow(0, 4, 1500)]);
        s["failures"] = json!([f]);
        run_err(&s)
    };
    let e = with(json!({"node": "h0", "at_ps": 0, "until_ps": 9}));
    assert_eq!(e.field, "failures[0].until_ps");
    assert!(e.message.contains("host") && e.message.contains("does not come back"), "{e}");
    let e = with(json!({"node": "spine9", "at_ps": 0}));
    assert_eq!(e.field, "failures[0].node");
    assert!(e.message.contains("spine9") && e.message.contains("leaf0"), "{e}");
    let e = with(json!({"link": ["leaf0", "nowhere"], "at_ps": 0}));
    assert_eq!(e.field, "failures[0].link");
    assert!(e.message.contains("nowhere"), "{e}");
    let e = with(json!({"link": ["leaf0", "leaf1"], "at_ps": 0}));
    assert_eq!(e.field, "failures[0].link");
    assert!(e.message.contains("not adjacent"), "{e}");
    let e = with(json!({"node": "spine0", "link": ["leaf0", "spine0"], "at_ps": 0}));
    assert_eq!(e.field, "failures[0]");
    assert!(e.message.contains("exactly one of node") && e.message.contains("link"), "{e}");
    let e = with(json!({"at_ps": 0}));
    assert_eq!(e.field, "failures[0]");
    for until in [5 * US, 4 * US] {
        let e = with(json!({"node": "spine0", "at_ps": 5 * US, "until_ps": until}));
        assert_eq!(e.field, "failures[0].until_ps");
        assert!(e.message.contains("after at_ps"), "{e}");
    }
    // Unknown keys are refused, naming the key.
    let mut s = spec(leaf_spine(), vec![], vec![flow(0, 4, 1500)]);
    s["failures"] = json!([{"switch": "spine0", "at_ps": 0}]);
    let e = inalab_sim::parse_spec(&s.to_string()).unwrap_err();
    assert!(e.message.contains("switch"), "{e}");
}
