//! Simulated times against closed forms.

mod common;
use common::*;
use serde_json::json;

const PS_PER_S: f64 = 1e12;

fn ser(bytes: u64, rate: u64) -> u64 {
    (bytes as u128 * 8 * 1_000_000_000_000u128).div_ceil(rate as u128) as u64
}

#[test]
fn one_flow_over_a_multi_hop_path_is_exact() {
    // h0 - leaf0 - spine0 - leaf1 - h2: four links, three store-and-forward switches.
    let delay = 700_000; // 0.7 us
    let topo = json!({"shape": {"kind": "leaf_spine", "leaves": 2, "spines": 1, "hosts_per_leaf": 2, "switch_ports": 64,
                                "host_rate_bps": G100, "fabric_rate_bps": 40_000_000_000u64, "link_delay_ps": delay}});
    let (pkt, n) = (1500u64, 100u64);
    let r = simulate(&spec(topo, vec![], vec![json!({"src": "h0", "dst": "h2", "bytes": pkt * n, "packet_bytes": pkt, "start_ps": 0})]));
    let f = &r.flows[0];
    assert_eq!(f.bytes_received, pkt * n);
    // The 40 Gbps fabric is the bottleneck: packets leave the host every ser(100G) but the
    // leaf's uplink drains one every ser(40G); the last packet finishes its uplink
    // serialization after the first packet's arrival at the leaf plus n x ser(40G).
    let first_at_leaf = ser(pkt, G100) + delay;
    let last_leaves_leaf0 = first_at_leaf + n * ser(pkt, 40_000_000_000);
    let expect = last_leaves_leaf0 + delay + ser(pkt, 40_000_000_000) + delay + ser(pkt, G100) + delay;
    assert_eq!((f.last_rx_s.expect("a packet arrived") * PS_PER_S).round() as u64, expect);
    assert_eq!(r.outcome, "completed");
}

#[test]
fn incast_is_limited_by_the_servers_link() {
    let (senders, bytes, pkt) = (16u32, 1_000_000u64, 1500u64);
    let flows: Vec<_> = (1..=senders)
        .map(|i| json!({"src": format!("h{i}"), "dst": "h0", "bytes": bytes, "packet_bytes": pkt, "start_ps": 0}))
        .collect();
    let mut s = spec(star(senders + 1, US), vec![], flows);
    s["network"]["buffer_bytes"] = json!(64u64 << 20); // no drops: the bound is the link
    let r = simulate(&s);
    let total = senders as u64 * bytes;
    assert_eq!(r.flows.iter().map(|f| f.bytes_received).sum::<u64>(), total);
    let last = r.flows.iter().map(|f| f.last_rx_s.expect("a packet arrived")).fold(0.0, f64::max);
    let bound = total as f64 * 8.0 / G100 as f64;
    // The sink's link is busy from the first arrival to the last: total/B plus latency terms.
    let lat = (2.0 * US as f64 + 2.0 * ser(pkt, G100) as f64) / PS_PER_S;
    assert!(last >= bound && last <= bound + lat + 1e-9, "last arrival {last} vs bound {bound}");
    let sink = r.links.iter().find(|l| l.src == "s0" && l.dst == "h0").unwrap();
    assert!(sink.utilization > 0.99, "the bottleneck stays busy: {}", sink.utilization);
}

#[test]
fn incast_with_a_small_buffer_drops_and_conserves() {
    let flows: Vec<_> = (1..=16).map(|i| json!({"src": format!("h{i}"), "dst": "h0", "bytes": 300_000, "packet_bytes": 1500, "start_ps": 0})).collect();
    let mut s = spec(star(17, US), vec![], flows);
    s["network"]["buffer_bytes"] = json!(100_000);
    let r = simulate(&s);
    let drops: u64 = r.links.iter().map(|l| l.drops_queue).sum();
    let rx: u64 = r.flows.iter().map(|f| f.packets_received).sum();
    assert!(drops > 0);
    assert_eq!(rx + drops, 16 * 200, "every packet is delivered or dropped");
}

#[test]
fn ring_allreduce_on_a_star_matches_the_closed_form() {
    let n = 8u64;
    let s_bytes = n * 1436 * 30; // 30 full segments per chunk, below the initial window
    let delay = US;
    let r = simulate(&spec(star(n as u32, delay), vec![job(0, "ring", hosts(0..n as u32), vec![], json!({"kind": "allreduce", "bytes": s_bytes, "iterations": 1}))], vec![]));
    let j = &r.jobs[0];
    assert!(j.finished);
    let chunk = s_bytes / n;
    let segs = chunk.div_ceil(1436);
    let data_wire = chunk + segs * 64;
    let ack_wire = segs * 64; // each host also acks its predecessor's segments on its NIC
    let step = ser(data_wire + ack_wire, G100) + ser(1436 + 64, G100) + 2 * delay;
    let expect = 2 * (n - 1) * step;
    let got = (j.jct_s.expect("finished") * PS_PER_S) as u64;
    let ideal = 2.0 * (n - 1) as f64 / n as f64 * s_bytes as f64 * 8.0 / G100 as f64;
    assert!(j.jct_s.expect("finished") > ideal, "never faster than 2(N-1)/N x S/B");
    let err = (got as f64 - expect as f64).abs() / expect as f64;
    assert!(err < 0.02, "ring JCT {got} ps vs closed form {expect} ps ({:.2}% off)", err * 100.0);
}

#[test]
fn a_link_still_busy_at_the_stop_is_at_most_fully_utilized() {
    // 4 senders at line rate into one sink for 100 us: the sink's link is saturated and its
    // queue still full when the run stops; utilization counts only what was sent by then.
    let flows: Vec<_> = (1..=4).map(|i| json!({"src": format!("h{i}"), "dst": "h0", "bytes": 10_000_000, "packet_bytes": 1500, "start_ps": 0})).collect();
    let mut s = spec(star(5, US), vec![], flows);
    s["stop_ps"] = json!(100 * US);
    let r = simulate(&s);
    assert_eq!(r.stopped_by, "stop_time");
    let sink = r.links.iter().find(|l| l.src == "s0" && l.dst == "h0").unwrap();
    assert!(sink.utilization > 0.95 && sink.utilization <= 1.0, "{}", sink.utilization);
    assert!(sink.max_queue_bytes > 0);
}

#[test]
fn a_line_rate_flow_fills_its_bins_but_never_overfills_them() {
    // 1500 B at 100 Gbps take 120 ns: a 10 us bin holds 83.3 packets, so charging whole
    // packets at their start put 84 in some bins (100.8 %).
    let flow = json!({"src": "h0", "dst": "h1", "bytes": 1500 * 20_000, "packet_bytes": 1500, "start_ps": 0});
    let r = simulate(&spec(star(2, US), vec![], vec![flow]));
    let l = r.links.iter().find(|l| l.src == "h0").unwrap();
    assert!(l.peak_bin_utilization <= 1.0 && l.peak_bin_utilization > 0.999, "{}", l.peak_bin_utilization);
}

/// One flow of `n` packets of 1500 B from h0 to h1 over a 100 Gbps star (1 us links), with
/// `network.host_costs`; returns the last delivery, ps.
fn flow_with_costs(n: u64, costs: serde_json::Value) -> (u64, inalab_sim::SimResult) {
    let mut s = spec(star(2, US), vec![], vec![json!({"src": "h0", "dst": "h1", "bytes": 1500 * n, "packet_bytes": 1500, "start_ps": 0})]);
    s["network"]["host_costs"] = costs;
    let r = simulate(&s);
    assert_eq!(r.flows[0].bytes_received, 1500 * n);
    ((r.flows[0].last_rx_s.expect("delivered") * PS_PER_S).round() as u64, r)
}

#[test]
fn a_senders_cpu_slower_than_its_nic_paces_its_packets() {
    // #37 item 1: 1 us of CPU per packet against 120 ns on the wire: one packet per us.
    let (n, c, s) = (100, US, ser(1500, G100));
    let (last, r) = flow_with_costs(n, json!([{"hosts": "h0", "per_packet_ps": c}]));
    assert_eq!(last, n * c + s + US + s + US);
    let h0 = r.hosts.iter().find(|h| h.name == "h0").unwrap();
    assert_eq!(h0.counters.get("cpu_busy_ns"), Some(&(n * c / 1000)));
    // Free hosts (the default, and zero costs) keep the wire's time.
    let free = n * s + US + s + US;
    assert_eq!(flow_with_costs(n, json!([])).0, free);
    assert_eq!(flow_with_costs(n, json!([{"hosts": "all", "per_packet_ps": 0, "copy_bps": 0.0}])).0, free);
}

#[test]
fn a_cpu_faster_than_the_nic_prepares_the_next_packet_while_the_nic_sends() {
    // Half a packet time of CPU: it works beside the NIC, so only the first packet waits.
    let (n, s) = (100, ser(1500, G100));
    let (last, _) = flow_with_costs(n, json!([{"hosts": "h0", "per_packet_ps": s / 2}]));
    assert_eq!(last, s / 2 + n * s + US + s + US);
}

#[test]
fn a_receivers_cpu_and_copy_rate_delay_delivery_one_packet_at_a_time() {
    // 1 us per packet plus 1500 B copied at 12 Gbps (1 us): 2 us per packet received.
    let (n, s) = (50, ser(1500, G100));
    let (last, _) = flow_with_costs(n, json!([{"hosts": "h1", "per_packet_ps": US, "copy_bps": 12e9}]));
    let first_arrival = s + US + s + US;
    assert_eq!(last, first_arrival + n * 2 * US);
}

#[test]
fn host_costs_select_by_role_and_refuse_what_they_cannot_place() {
    // A PS job's server alone pays: the workers stay free.
    let jobs = vec![job(0, "ps", hosts(0..2), vec!["h2".into()], json!({"kind": "allreduce", "bytes": 100_000, "iterations": 1}))];
    let mut s = spec(star(3, US), jobs, vec![]);
    s["network"]["host_costs"] = json!([{"hosts": "servers", "per_packet_ps": US}]);
    let r = simulate(&s);
    let busy = |name: &str| r.hosts.iter().find(|h| h.name == name).unwrap().counters.get("cpu_busy_ns").copied();
    assert!(busy("h2").is_some_and(|b| b > 0) && busy("h0").is_none() && busy("h1").is_none());
    for (costs, field) in [(json!([{"hosts": "h9"}]), "network.host_costs[0].hosts"), (json!([{"hosts": "all", "copy_bps": -1.0}]), "network.host_costs[0].copy_bps")] {
        let mut s = spec(star(3, US), vec![], vec![]);
        s["network"]["host_costs"] = costs;
        let e = inalab_sim::run(&inalab_sim::parse_spec(&s.to_string()).unwrap(), None).unwrap_err();
        assert_eq!(e.field, field, "{e:?}");
    }
}
