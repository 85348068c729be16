mod common;
use common::*;
use serde_json::json;
#[test]
fn scratch() {
    let flows: Vec<_> = (1..17).map(|i| json!({"src": format!("h{i}"), "dst": "h0", "bytes": 1_000_500, "packet_bytes": 1500, "start_ps": 0})).collect();
    let mut s = spec(star(17, US), vec![], flows);
    s["network"]["flow_control"] = json!({"kind": "pfc", "xoff_bytes": 65536, "xon_bytes": 32768});
    let r = simulate(&s);
    eprintln!("stopped {} t={} events={}", r.stopped_by, r.sim_time_s, r.events);
    for l in &r.links { eprintln!("{}->{} tx={} util={:.3} maxq={} pauses={:?} paused={:?} sent={:?} maxin={:?} ecn={}", l.src, l.dst, l.tx_packets, l.utilization, l.max_queue_bytes, l.pfc_pauses, l.pfc_paused_s, l.pfc_pauses_sent, l.pfc_max_ingress_bytes, l.ecn_marks); }
    for f in &r.flows { eprintln!("flow {} rx={} first={:.6} last={:.6}", f.id, f.bytes_received, f.first_rx_s, f.last_rx_s); }
    eprintln!("{:?}", r.switches[0].counters);
    eprintln!("{:?}", r.conservation);
}
