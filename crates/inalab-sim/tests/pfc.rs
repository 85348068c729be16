//! The lossless fabric (`network.flow_control = "pfc"`): per-ingress-port pause instead of
//! drops. An incast loses nothing and keeps each ingress port's bytes near xoff; pause spreads
//! upstream and slows a victim flow (head-of-line blocking); INA allreduces sum exactly over it
//! with background traffic; failures neither lose accounting nor leave a sender paused.

mod common;
use common::*;
use inalab_core::{NodeId, Packet, PortId, SwitchAction, SwitchCtx, SwitchProgram, Time};
use inalab_sim::{LinkResult, SimResult};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};

const XOFF: u64 = 64 << 10;
const XON: u64 = 32 << 10;
const MTU: u64 = 1500;
/// 667 packets of 1500 B.
const FLOW: u64 = 1_000_500;

fn pfc(mut s: Value) -> Value {
    s["network"]["flow_control"] = json!({"kind": "pfc", "xoff_bytes": XOFF, "xon_bytes": XON});
    s
}

fn flow(src: u32, dst: u32, bytes: u64) -> Value {
    json!({"src": format!("h{src}"), "dst": format!("h{dst}"), "bytes": bytes, "packet_bytes": MTU, "start_ps": 0})
}

fn link<'a>(r: &'a SimResult, src: &str, dst: &str) -> &'a LinkResult {
    r.links.iter().find(|l| l.src == src && l.dst == dst).unwrap_or_else(|| panic!("no link {src}->{dst}"))
}

fn drops_queue(r: &SimResult) -> u64 {
    r.links.iter().map(|l| l.drops_queue).sum()
}

/// What may sit at a switch from one ingress port: xoff, plus the packet that crossed it, plus
/// what the sender puts on the link before the PAUSE reaches it (one link delay each way at
/// the link rate) and the packet it is sending then (and one partly sent before).
fn ingress_bound(delay_ps: u64) -> u64 {
    XOFF + MTU + 2 * delay_ps * (G100 / 8) / 1_000_000_000_000 + 2 * MTU
}

/// h1..h16 each send 1 MB at line rate to h0 through one switch.
fn incast() -> Value {
    spec(star(17, US), vec![], (1..17).map(|i| flow(i, 0, FLOW)).collect())
}

#[test]
fn an_incast_loses_nothing_and_runs_at_the_bottleneck_rate() {
    let mut s = pfc(incast());
    s["network"]["ecn_threshold_bytes"] = json!(200_000);
    let r = simulate(&s);
    assert_eq!(r.outcome, "completed");
    assert_eq!(drops_queue(&r), 0, "nothing dropped for lack of buffer");
    assert_eq!(r.conservation.lost_packets, 0);
    for f in &r.flows {
        assert_eq!(f.bytes_received, FLOW, "flow {}", f.id);
    }
    // The senders together run at the bottleneck's rate: 16 MB through one 100 Gbps port.
    let total = 16 * FLOW;
    let first = r.flows.iter().map(|f| f.first_rx_s.expect("a packet arrived")).fold(f64::INFINITY, f64::min);
    let last = r.flows.iter().map(|f| f.last_rx_s.expect("a packet arrived")).fold(0.0, f64::max);
    let gbps = (total - MTU) as f64 * 8.0 / (last - first) / 1e9;
    assert!((gbps - 100.0).abs() < 0.5, "aggregate {gbps} Gbps");
    assert!(link(&r, "s0", "h0").utilization > 0.99);
    // Every sender was paused; each ingress port held about xoff, not more.
    let bound = ingress_bound(US);
    for i in 1..17 {
        let l = link(&r, &format!("h{i}"), "s0");
        assert!(l.pfc_pauses.unwrap() > 0 && l.pfc_paused_s.unwrap() > 0.0, "h{i} was paused: {l:?}");
        assert_eq!(l.pfc_pauses_sent, l.pfc_pauses, "every PAUSE reached h{i}");
        let held = l.pfc_max_ingress_bytes.unwrap();
        assert!(held > XOFF && held <= bound, "h{i}: {held} B held at s0 (bound {bound})");
    }
    // The egress queue is the sum over ingress ports, and ECN reads that real queue (the packet
    // in service alone would never reach the threshold).
    let out = link(&r, "s0", "h0");
    assert!(out.max_queue_bytes > 200_000 && out.max_queue_bytes <= 16 * bound, "{out:?}");
    assert!(out.ecn_marks > 0);
    assert_eq!(r.switches[0].counters["pfc_pauses_sent"], r.hosts.iter().map(|h| h.counters["pfc_pauses_received"]).sum::<u64>());
}

/// Routes every packet and says it processes all of them (charged to the switch's capacity);
/// counts the packets that reach it ECN-marked.
#[derive(Default)]
struct ProcessAll {
    marked: Arc<Mutex<u64>>,
}

impl SwitchProgram for ProcessAll {
    fn on_packet(&mut self, _now: Time, _ctx: &dyn SwitchCtx, _in_port: PortId, pkt: Packet, out: &mut Vec<SwitchAction>) {
        *self.marked.lock().unwrap() += pkt.ecn as u64;
        out.push(SwitchAction::Route { pkt });
    }
    fn processes(&self, _ctx: &dyn SwitchCtx, _in_port: PortId, _pkt: &Packet) -> bool {
        true
    }
}

fn capacity_run(spec: Value, program: Option<Box<dyn SwitchProgram>>) -> inalab_sim::SimResult {
    let spec = inalab_sim::parse_spec(&spec.to_string()).unwrap();
    let mut sim = inalab_sim::Sim::new(&spec).unwrap();
    if let Some(p) = program {
        let s0: NodeId = sim.topology().find("s0").unwrap();
        sim.set_program(s0, p);
    }
    sim.run(None);
    let r = sim.finish();
    check_invariants(&r);
    r
}

fn capacity_star(flow_control: bool) -> Value {
    let mut s = spec(star(5, US), vec![], (1..5).map(|i| flow(i, 0, FLOW)).collect());
    if flow_control {
        s = pfc(s);
    }
    s["network"]["switch_capacity"] = json!([{"switch": "s0", "value": G100 / 2}]);
    s
}

#[test]
fn a_capacity_limited_switch_pauses_its_senders_too() {
    // s0 processes 50 Gbps (GRID's limit): packets wait for processing before their egress
    // queue, charged to their ingress port all the while, so the backlog is paused, not lost.
    let r = capacity_run(capacity_star(true), Some(Box::new(ProcessAll::default())));
    assert_eq!(r.outcome, "completed");
    assert!(r.flows.iter().all(|f| f.bytes_received == FLOW));
    let last = r.flows.iter().map(|f| f.last_rx_s.expect("a packet arrived")).fold(0.0, f64::max);
    let gbps = (4 * FLOW) as f64 * 8.0 / last / 1e9;
    assert!((gbps - 50.0).abs() < 1.0, "{gbps} Gbps through a 50 Gbps switch");
    for i in 1..5 {
        let l = link(&r, &format!("h{i}"), "s0");
        assert!(l.pfc_pauses.unwrap() > 0 && l.pfc_max_ingress_bytes.unwrap() <= ingress_bound(US), "{l:?}");
    }
}

#[test]
fn processing_capacity_is_charged_only_to_what_the_program_processes() {
    // Plain forwarding is transit (spec A8): the same incast runs at the sink's 100 Gbps.
    let r = capacity_run(capacity_star(false), None);
    let last = r.flows.iter().map(|f| f.last_rx_s.expect("a packet arrived")).fold(0.0, f64::max);
    let gbps = (4 * FLOW) as f64 * 8.0 / last / 1e9;
    assert!(gbps > 95.0, "{gbps} Gbps: transit was charged");
    assert_eq!(r.switches[0].counters["drops_processing"], 0);
}

#[test]
fn a_drop_tail_processing_queue_marks_then_drops() {
    // Four 100 Gbps senders into a 50 Gbps processing stage: its queue passes the ECN
    // threshold (marks) and the buffer (drops), instead of growing without bound.
    let program = ProcessAll::default();
    let marked = program.marked.clone();
    let mut s = capacity_star(false);
    s["network"]["buffer_bytes"] = json!(256 << 10);
    s["network"]["ecn_threshold_bytes"] = json!(64 << 10);
    let r = capacity_run(s, Some(Box::new(program)));
    let drops = r.switches[0].counters["drops_processing"];
    assert!(drops > 100, "{drops} packets refused by the processing queue");
    assert!(*marked.lock().unwrap() > 100, "{} packets marked", marked.lock().unwrap());
}

#[test]
fn the_same_incast_with_small_drop_tail_buffers_drops() {
    // The control: what PFC holds back, a drop-tail queue of xoff-size loses.
    let mut s = incast();
    s["network"]["buffer_bytes"] = json!(XOFF);
    let r = simulate(&s);
    assert!(drops_queue(&r) > 1000, "{}", drops_queue(&r));
    assert!(r.flows.iter().map(|f| f.bytes_received).sum::<u64>() < 16 * FLOW / 2);
    assert!(r.links.iter().all(|l| l.pfc_pauses.is_none()), "no PFC columns under drop-tail");
}

/// Records the largest `queue_bytes` its switch shows for port 0.
#[derive(Default)]
struct QueueProbe {
    seen: Arc<Mutex<u64>>,
}

impl SwitchProgram for QueueProbe {
    fn on_packet(&mut self, _now: Time, ctx: &dyn SwitchCtx, _in_port: PortId, pkt: Packet, out: &mut Vec<SwitchAction>) {
        let mut seen = self.seen.lock().unwrap();
        *seen = (*seen).max(ctx.queue_bytes(0));
        out.push(SwitchAction::Route { pkt });
    }
}

#[test]
fn programs_see_the_packets_waiting_behind_a_port() {
    let spec = inalab_sim::parse_spec(&pfc(incast()).to_string()).unwrap();
    let mut sim = inalab_sim::Sim::new(&spec).unwrap();
    let s0: NodeId = sim.topology().find("s0").unwrap();
    let probe = QueueProbe::default();
    let seen = probe.seen.clone();
    sim.set_program(s0, Box::new(probe));
    sim.run(None);
    let r = sim.finish();
    check_invariants(&r);
    // Port 0 faces h0, the incast's sink: its queue grows to many ingress ports' xoff.
    let seen = *seen.lock().unwrap();
    assert!(seen > 4 * XOFF, "a program saw at most {seen} B queued toward h0");
    assert!(seen <= link(&r, "s0", "h0").max_queue_bytes);
}

/// Sends what comes in from h1 to both h0 and h4; routes the rest.
struct Mirror;

impl SwitchProgram for Mirror {
    fn on_packet(&mut self, _now: Time, _ctx: &dyn SwitchCtx, in_port: PortId, pkt: Packet, out: &mut Vec<SwitchAction>) {
        out.push(match in_port {
            1 => SwitchAction::Multicast { ports: vec![0, 4], pkt },
            _ => SwitchAction::Route { pkt },
        });
    }
}

#[test]
fn a_multicast_is_charged_once_until_its_last_copy_left() {
    // h1's packets go to h0 and h4, each port shared with one other sender (h2 -> h0,
    // h3 -> h4). Charged once, h1 holds its xoff across both queues and every sender gets
    // half a port (50 Gbps); charged per copy, h1 would be paused at half that and get a
    // third, h2 and h3 two thirds.
    let flows = vec![flow(1, 0, FLOW), flow(2, 0, FLOW), flow(3, 4, FLOW)];
    let mut s = pfc(spec(star(5, US), vec![], flows));
    s["linger_ps"] = json!(10 * US);
    let spec = inalab_sim::parse_spec(&s.to_string()).unwrap();
    let mut sim = inalab_sim::Sim::new(&spec).unwrap();
    let s0: NodeId = sim.topology().find("s0").unwrap();
    sim.set_program(s0, Box::new(Mirror));
    sim.run(None);
    let r = sim.finish();
    check_invariants(&r);
    assert_eq!(r.outcome, "completed");
    for f in &r.flows {
        let gbps = f.bytes_received as f64 * 8.0 / (f.last_rx_s.expect("a packet arrived") - f.first_rx_s.expect("a packet arrived")) / 1e9;
        assert!((gbps - 50.0).abs() < 2.0, "flow {} got {gbps:.1} Gbps", f.id);
    }
    assert_eq!(r.hosts.iter().find(|h| h.name == "h4").unwrap().rx_packets, 2 * 667, "h4 got every copy and h3's flow");
    assert!(link(&r, "h1", "s0").pfc_max_ingress_bytes.unwrap() <= ingress_bound(US));
}

/// Two leaves of four hosts under one spine: h1-h3 (local) and h4-h6 (through the spine) send
/// 4 MB each to h0, and the victim h7 sends 1 MB to h1, whose own link is nearly idle. Returns
/// the victim's rate in Gbps.
fn victim_run(lossless: bool) -> (SimResult, f64) {
    let mut flows: Vec<Value> = (1..7).map(|i| flow(i, 0, 4 * FLOW)).collect();
    flows.push(flow(7, 1, FLOW));
    let mut s = spec(leaf_spine_100g(2, 1, 4), vec![], flows);
    if lossless {
        s = pfc(s);
    }
    let r = simulate(&s);
    let v = &r.flows[6];
    let gbps = v.bytes_received as f64 * 8.0 / v.last_rx_s.expect("a packet arrived") / 1e9;
    (r, gbps)
}

#[test]
fn pause_spreads_upstream_and_slows_a_victim_flow() {
    let (r, victim) = victim_run(true);
    assert_eq!(drops_queue(&r), 0);
    assert_eq!(r.flows[6].bytes_received, FLOW);
    // leaf0 pauses the spine (its ingress from the spine feeds the incast), the spine pauses
    // leaf1, and leaf1 pauses its hosts, the victim among them.
    for (a, b) in [("spine0", "leaf0"), ("leaf1", "spine0"), ("h7", "leaf1")] {
        let l = link(&r, a, b);
        assert!(l.pfc_pauses.unwrap() > 0, "{a}->{b} paused: {l:?}");
    }
    let spine = r.switches.iter().find(|s| s.name == "spine0").unwrap();
    assert!(spine.counters["pfc_pauses_sent"] > 0 && spine.counters["pfc_pauses_received"] > 0);
    // Head-of-line blocking: the victim waits behind the incast's packets although its own
    // destination link stays mostly idle; drop-tail (deep buffers) only shares the links.
    let (dt, victim_dt) = victim_run(false);
    assert!(dt.flows[6].bytes_received > 0);
    assert!(victim < 0.5 * victim_dt, "victim {victim:.1} Gbps under PFC, {victim_dt:.1} under drop-tail");
    assert!(link(&r, "leaf0", "h1").utilization < 0.2);
}

/// A leaf-spine of 4 x 4 hosts: an allreduce on two hosts of every leaf, line-rate background
/// traffic between the other two of every leaf.
fn with_background(job: Value) -> Value {
    let workers = json!(["h0", "h1", "h4", "h5", "h8", "h9", "h12", "h13"]);
    let mut job = job;
    job["workers"] = workers;
    let mut s = pfc(spec(leaf_spine_100g(4, 2, 4), vec![job], vec![]));
    s["payload"] = json!(true);
    s["background"] = json!({"hosts": ["h2", "h3", "h6", "h7", "h10", "h11", "h14", "h15"], "load": 1.0,
                             "message_bytes": 256 << 10, "packet_bytes": 1500, "start_ps": 0});
    s
}

fn assert_exact_over_pfc(r: &SimResult) {
    for j in &r.jobs {
        assert!(j.finished, "job {} did not finish: {:?} ({})", j.id, j.failures, r.stopped_by);
        assert_eq!(j.payload_checked, j.workers as u64 * j.iterations as u64);
        assert_eq!(j.payload_errors, 0, "results equal the exact sums");
    }
    assert!(r.switches.iter().all(|s| s.aggregators_end == 0));
    assert_eq!(drops_queue(r), 0);
    assert!(counter(r, "pfc_pauses_sent") > 0, "the background made switches pause");
}

#[test]
fn canary_sums_exactly_over_pfc_with_background() {
    let mut j = job(0, "canary", vec![], vec![], json!({"kind": "allreduce", "bytes": 4 * 50_000, "iterations": 2}));
    j["ina"] = json!({});
    let mut s = with_background(j);
    s["linger_ps"] = json!(1000 * US);
    s["network"]["aggregator_memory_bytes"] = json!(4096 * 1060);
    assert_exact_over_pfc(&simulate(&s));
}

#[test]
fn atp_sums_exactly_over_pfc_with_background() {
    let mut j = job(0, "atp", vec![], vec!["h15".into()], json!({"kind": "allreduce", "bytes": 4 * 50_000, "iterations": 2}));
    j["ina"] = json!({"packet_bytes": 306, "header_bytes": 58, "hashing": "hash", "congestion_control": true, "timeout_ps": 200 * US});
    let mut s = with_background(j);
    // The PS takes h15 from the background.
    s["background"]["hosts"] = json!(["h2", "h3", "h6", "h7", "h10", "h11", "h14"]);
    s["network"]["aggregator_memory_bytes"] = json!(1024 * 272);
    assert_exact_over_pfc(&simulate(&s));
}

#[test]
fn same_seed_same_result() {
    let a = victim_run(true).0;
    let b = victim_run(true).0;
    let bits = |r: &SimResult| serde_json::to_string(&SimResult { wall_s: 0.0, ..r.clone() }).unwrap();
    assert_eq!(bits(&a), bits(&b));
}

#[test]
fn bad_values_name_the_field_and_the_allowed_ones() {
    let mut s = incast();
    s["network"]["flow_control"] = json!({"kind": "credits"});
    let e = inalab_sim::parse_spec(&s.to_string()).unwrap_err().to_string();
    assert!(e.contains("network.flow_control") && e.contains("drop_tail") && e.contains("pfc") && e.contains("credit"), "{e}");

    let run_err = |fc: Value| {
        let mut s = incast();
        s["network"]["flow_control"] = fc;
        inalab_sim::run(&inalab_sim::parse_spec(&s.to_string()).expect("parses"), None).unwrap_err().to_string()
    };
    let e = run_err(json!({"kind": "pfc", "xoff_bytes": 1000, "xon_bytes": 2000}));
    assert!(e.contains("network.flow_control.xon_bytes") && e.contains("at most xoff_bytes"), "{e}");
    let e = run_err(json!({"kind": "pfc", "xoff_bytes": 0, "xon_bytes": 0}));
    assert!(e.contains("network.flow_control.xoff_bytes"), "{e}");
}

// ---- failures ------------------------------------------------------------------------------

#[test]
fn a_sender_paused_when_its_link_fails_is_resumed() {
    // h1's link goes down for 30 us while s0 is pausing it (the incast pauses every sender
    // most of the time). The RESUME s0 would send is lost with the link: unless the failure
    // lifts the pause, h1 never sends again and its flow never ends.
    let mut s = pfc(spec(star(9, US), vec![], (1..9).map(|i| flow(i, 0, FLOW)).collect()));
    s["failures"] = json!([{"link": ["h1", "s0"], "at_ps": 100 * US, "until_ps": 130 * US}]);
    let r = simulate(&s);
    assert_eq!(r.outcome, "completed", "every flow ended");
    let c = &r.conservation;
    assert_eq!((c.in_flight_packets, c.in_flight_bytes), (0, 0), "nothing held at the end");
    let h1 = r.hosts.iter().find(|h| h.name == "h1").unwrap();
    assert!(h1.counters["drops_link_failed"] > 0, "h1 sent into the dead link: {:?}", h1.counters);
    assert!(r.flows[0].bytes_received < FLOW);
    assert!(r.flows[1..].iter().all(|f| f.bytes_received == FLOW));
    assert_eq!(drops_queue(&r), 0);
}

#[test]
fn a_pause_on_its_way_when_the_link_fails_is_stale() {
    // 10 us links: s0's first PAUSE to h1 leaves at about 16 us and lands at about 26 us. The
    // link fails at 20 us, which lifts h1's pause; the frame still on its way must not pause
    // h1 again, or nothing would ever resume it (s0 no longer counts itself as pausing).
    let mut s = pfc(spec(star(17, 10 * US), vec![], (1..17).map(|i| flow(i, 0, FLOW)).collect()));
    s["failures"] = json!([{"link": ["h1", "s0"], "at_ps": 20 * US, "until_ps": 200 * US}]);
    let r = simulate(&s);
    assert_eq!(r.outcome, "completed", "every flow ended");
    let h1 = link(&r, "h1", "s0");
    assert_eq!(h1.pfc_pauses, Some(0), "h1 was never paused: the only PAUSE sent to it was stale");
    assert_eq!(h1.pfc_pauses_sent, Some(1));
    assert!(r.flows[0].bytes_received > 0 && r.flows[0].bytes_received < FLOW);
    assert_eq!(r.conservation.in_flight_packets, 0);
}

#[test]
fn a_spine_failing_under_pause_loses_its_queue_and_nothing_stalls() {
    // Both leaves' hosts send across to the other leaf and into h0: spine queues build and
    // pause the leaves. spine0 fails for good at 50 us; what it held is lost and counted.
    let mut flows: Vec<Value> = (4..8).map(|i| flow(i, 0, 2 * FLOW)).collect();
    flows.extend((1..4).map(|i| flow(i, 4 + i, 2 * FLOW)));
    let mut s = pfc(spec(leaf_spine_100g(2, 2, 4), vec![], flows));
    s["failures"] = json!([{"node": "spine0", "at_ps": 50 * US}]);
    let r = simulate(&s);
    assert_eq!(r.outcome, "completed");
    let c = &r.conservation;
    assert_eq!((c.in_flight_packets, c.in_flight_bytes), (0, 0));
    assert!(counter(&r, "drops_node_failed") > 0);
    assert_eq!(c.lost_packets, counter(&r, "drops_node_failed") + counter(&r, "drops_link_failed"), "every loss is the failure's");
    assert_eq!(drops_queue(&r), 0);
    // After the failure everything goes through spine1, which keeps pausing.
    assert!(link(&r, "leaf1", "spine1").pfc_pauses.unwrap() > 0);
}

// ---- credits (`network.flow_control = "credit"`) -----------------------------------------

/// SST ember's default per-port buffer (`defaultParams.py`: 14 KB).
const CREDITS: u64 = 14_000;

fn credit(mut s: Value, buffer: u64) -> Value {
    s["network"]["flow_control"] = json!({"kind": "credit", "buffer_bytes": buffer});
    s
}

/// No link into a switch ever has more than `buffer` bytes held at the switch.
fn assert_bounded(r: &SimResult, buffer: u64) {
    assert_eq!(drops_queue(r), 0, "nothing dropped for lack of buffer");
    for l in r.links.iter().filter(|l| l.dst.starts_with('s') || l.dst.starts_with("leaf") || l.dst.starts_with("spine")) {
        let held = l.pfc_max_ingress_bytes.expect("credit columns present");
        assert!(held <= buffer, "{}->{}: {held} B held, buffer {buffer}", l.src, l.dst);
    }
}

#[test]
fn credits_never_drop_and_bound_every_ingress_by_its_buffer() {
    let r = simulate(&credit(incast(), CREDITS));
    assert_eq!(r.outcome, "completed");
    assert_eq!(r.conservation.lost_packets, 0);
    assert!(r.flows.iter().all(|f| f.bytes_received == FLOW));
    assert_bounded(&r, CREDITS);
    // The bound is reached: the senders wait for credits, the bottleneck stays busy.
    for i in 1..17 {
        let l = link(&r, &format!("h{i}"), "s0");
        assert!(l.pfc_max_ingress_bytes.unwrap() > CREDITS / 2, "h{i}: {l:?}");
        assert!(l.pfc_pauses.unwrap() > 0 && l.pfc_paused_s.unwrap() > 0.0, "h{i} waited for credits: {l:?}");
    }
    assert!(link(&r, "s0", "h0").utilization > 0.99);
}

/// One 1 MB flow h1 -> h0 through one switch with 1 us links and `buffer` bytes of credits:
/// its rate in Gbps.
fn one_flow_rate(buffer: u64) -> f64 {
    let r = simulate(&credit(spec(star(2, US), vec![], vec![flow(1, 0, FLOW)]), buffer));
    assert_bounded(&r, buffer);
    let f = &r.flows[0];
    assert_eq!(f.bytes_received, FLOW);
    (FLOW - MTU) as f64 * 8.0 / (f.last_rx_s.unwrap() - f.first_rx_s.unwrap()) / 1e9
}

#[test]
fn a_buffer_below_the_credit_loop_caps_a_flow_at_buffer_per_round_trip() {
    // Credits come back one link delay after a packet leaves the switch, which it does one
    // serialization after it arrived: the loop is 2 us + 2 x 120 ns. 14 KB per loop is 50
    // Gbps; 64 KiB covers it (the flow runs at line rate).
    let small = one_flow_rate(CREDITS);
    let lp = 2e-6 + 2.0 * MTU as f64 * 8.0 / 1e11;
    let want = (CREDITS / MTU * MTU) as f64 * 8.0 / lp / 1e9;
    assert!((small - want).abs() < 0.05 * want, "{small:.1} Gbps, buffer / loop = {want:.1}");
    let big = one_flow_rate(64 << 10);
    assert!(big > 99.0, "{big:.1} Gbps");
}

#[test]
fn waiting_for_credits_spreads_upstream_and_keeps_every_switch_within_its_buffer() {
    let mut flows: Vec<Value> = (1..7).map(|i| flow(i, 0, 4 * FLOW)).collect();
    flows.push(flow(7, 1, FLOW));
    let r = simulate(&credit(spec(leaf_spine_100g(2, 1, 4), vec![], flows), CREDITS));
    assert_eq!(r.outcome, "completed");
    assert!(r.flows.iter().all(|f| f.bytes_received == f.bytes));
    assert_bounded(&r, CREDITS);
    for (a, b) in [("spine0", "leaf0"), ("leaf1", "spine0"), ("h4", "leaf1")] {
        assert!(link(&r, a, b).pfc_pauses.unwrap() > 0, "{a}->{b} waited for credits: {:?}", link(&r, a, b));
    }
}

#[test]
fn canary_and_atp_sum_exactly_over_credits_with_background() {
    let mut j = job(0, "canary", vec![], vec![], json!({"kind": "allreduce", "bytes": 4 * 50_000, "iterations": 2}));
    j["ina"] = json!({});
    let mut s = credit(with_background(j), CREDITS);
    s["linger_ps"] = json!(1000 * US);
    s["network"]["aggregator_memory_bytes"] = json!(4096 * 1060);
    let r = simulate(&s);
    assert_jobs_exact(&r);
    assert_bounded(&r, CREDITS);
    assert!(r.links.iter().any(|l| l.pfc_pauses.unwrap() > 0), "the background made ports wait");

    let mut j = job(0, "atp", vec![], vec!["h15".into()], json!({"kind": "allreduce", "bytes": 4 * 50_000, "iterations": 2}));
    j["ina"] = json!({"packet_bytes": 306, "header_bytes": 58, "hashing": "hash", "congestion_control": true, "timeout_ps": 200 * US});
    let mut s = credit(with_background(j), CREDITS);
    s["background"]["hosts"] = json!(["h2", "h3", "h6", "h7", "h10", "h11", "h14"]);
    s["network"]["aggregator_memory_bytes"] = json!(1024 * 272);
    let r = simulate(&s);
    assert_jobs_exact(&r);
    assert_bounded(&r, CREDITS);
}

#[test]
fn credits_come_back_after_a_link_or_a_spine_fails() {
    // h1's link fails for 30 us while it waits for credits: the credits in flight are lost,
    // so unless the failure gives them back h1 never sends again.
    let mut s = credit(spec(star(9, US), vec![], (1..9).map(|i| flow(i, 0, FLOW)).collect()), CREDITS);
    s["failures"] = json!([{"link": ["h1", "s0"], "at_ps": 100 * US, "until_ps": 130 * US}]);
    let r = simulate(&s);
    assert_eq!(r.outcome, "completed", "every flow ended");
    assert_eq!((r.conservation.in_flight_packets, r.conservation.in_flight_bytes), (0, 0));
    assert!(r.flows[0].bytes_received > 0 && r.flows[0].bytes_received < FLOW);
    assert!(r.flows[1..].iter().all(|f| f.bytes_received == FLOW));

    let mut flows: Vec<Value> = (4..8).map(|i| flow(i, 0, 2 * FLOW)).collect();
    flows.extend((1..4).map(|i| flow(i, 4 + i, 2 * FLOW)));
    let mut s = credit(spec(leaf_spine_100g(2, 2, 4), vec![], flows), CREDITS);
    s["failures"] = json!([{"node": "spine0", "at_ps": 50 * US, "until_ps": 80 * US}]);
    let r = simulate(&s);
    assert_eq!(r.outcome, "completed");
    assert_eq!(r.conservation.in_flight_packets, 0);
    assert_eq!(r.conservation.lost_packets, counter(&r, "drops_node_failed") + counter(&r, "drops_link_failed"), "every loss is the failure's");
    assert_eq!(drops_queue(&r), 0);
}

#[test]
fn a_bad_credit_buffer_names_the_field() {
    for bad in [0u64, 1 << 33] {
        let s = credit(incast(), bad);
        let e = inalab_sim::run(&inalab_sim::parse_spec(&s.to_string()).expect("parses"), None).unwrap_err().to_string();
        assert!(e.contains("network.flow_control.buffer_bytes") && e.contains("1 B to 4 GiB"), "{e}");
    }
    let a = simulate(&credit(incast(), CREDITS));
    let b = simulate(&credit(incast(), CREDITS));
    let bits = |r: &SimResult| serde_json::to_string(&SimResult { wall_s: 0.0, ..r.clone() }).unwrap();
    assert_eq!(bits(&a), bits(&b), "same seed, same result");
}
