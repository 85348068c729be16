//! Forwarding features the INA designs build on: fixed per-flow paths and switch programs
//! that multicast, consume packets and set timers.

mod common;
use common::*;
use inalab_core::{NodeId, Packet, PortId, SwitchAction, SwitchCtx, SwitchProgram, Time};
use serde_json::json;

/// h0 and h1 joined by a short path (via a) and a long one (via b, c).
fn two_paths() -> serde_json::Value {
    let l = |a: &str, b: &str| json!({"a": a, "b": b, "rate_bps": G100, "delay_ps": US});
    json!({"shape": {"kind": "edges",
        "nodes": [{"name": "h0", "kind": "host"}, {"name": "h1", "kind": "host"},
                  {"name": "sa", "kind": "switch"}, {"name": "sb", "kind": "switch"}, {"name": "sc", "kind": "switch"},
                  {"name": "s0", "kind": "switch"}, {"name": "s1", "kind": "switch"}],
        "links": [l("h0", "s0"), l("s0", "sa"), l("sa", "s1"), l("s0", "sb"), l("sb", "sc"), l("sc", "s1"), l("s1", "h1")]}})
}

#[test]
fn a_fixed_path_overrides_shortest_path_routing() {
    let flow = |path: Option<Vec<&str>>| {
        let mut f = json!({"src": "h0", "dst": "h1", "bytes": 150_000, "packet_bytes": 1500, "start_ps": 0});
        if let Some(p) = path {
            f["path"] = json!(p);
        }
        simulate(&spec(two_paths(), vec![], vec![f]))
    };
    let carried = |r: &inalab_sim::SimResult, src: &str, dst: &str| r.links.iter().find(|l| l.src == src && l.dst == dst).unwrap().tx_bytes;
    let ecmp = flow(None);
    assert_eq!(carried(&ecmp, "s0", "sa"), 150_000);
    assert_eq!(carried(&ecmp, "s0", "sb"), 0);
    let fixed = flow(Some(vec!["h0", "s0", "sb", "sc", "s1", "h1"]));
    assert_eq!(carried(&fixed, "s0", "sb"), 150_000);
    assert_eq!(carried(&fixed, "sc", "s1"), 150_000);
    assert_eq!(carried(&fixed, "s0", "sa"), 0);
    assert_eq!(fixed.flows[0].bytes_received, 150_000);
    // One more hop of propagation and serialization than the short path.
    assert!(fixed.flows[0].last_rx_s.expect("a packet arrived") > ecmp.flows[0].last_rx_s.expect("a packet arrived") + 1e-6);

    let mut bad = spec(two_paths(), vec![], vec![json!({"src": "h0", "dst": "h1", "bytes": 1500, "packet_bytes": 1500, "start_ps": 0, "path": ["h0", "sb", "h1"]})]);
    bad["name"] = json!("bad");
    let e = inalab_sim::run(&inalab_sim::parse_spec(&bad.to_string()).unwrap(), None).unwrap_err();
    assert_eq!(e.field, "flows[0].path");
}

/// Multicasts every packet from h0 to all other host ports, and holds each one back for a
/// timer first so timers and consumption are exercised too.
#[derive(Default)]
struct HoldAndMulticast {
    held: Vec<Packet>,
}

impl SwitchProgram for HoldAndMulticast {
    fn on_packet(&mut self, now: Time, _ctx: &dyn SwitchCtx, _in_port: PortId, pkt: Packet, out: &mut Vec<SwitchAction>) {
        self.held.push(pkt);
        out.push(SwitchAction::SetTimer { at: now + 5 * US, token: 0 });
    }
    fn on_timer(&mut self, _now: Time, ctx: &dyn SwitchCtx, _token: u64, out: &mut Vec<SwitchAction>) {
        let pkt = self.held.remove(0);
        let ports: Vec<PortId> = (0..ctx.num_ports() as PortId).filter(|&p| ctx.peer(p) != pkt.src).collect();
        out.push(SwitchAction::Multicast { ports, pkt });
    }
    fn aggregators_in_use(&self) -> u32 {
        self.held.len() as u32
    }
}

#[test]
fn programs_multicast_hold_and_report_occupancy() {
    let s = spec(star(4, US), vec![], vec![json!({"src": "h0", "dst": "h1", "bytes": 15_000, "packet_bytes": 1500, "start_ps": 0})]);
    let spec = inalab_sim::parse_spec(&s.to_string()).unwrap();
    let mut sim = inalab_sim::Sim::new(&spec).unwrap();
    let switch: NodeId = sim.topology().find("s0").unwrap();
    sim.set_program(switch, Box::<HoldAndMulticast>::default());
    sim.run(None);
    let r = sim.finish();
    check_invariants(&r);
    // 10 packets, each copied to h1, h2 and h3: 20 copies created beyond what came in.
    assert_eq!(r.conservation.created_packets, 20);
    let rx = |h: &str| r.hosts.iter().find(|x| x.name == h).unwrap();
    assert_eq!(rx("h1").rx_packets, 10);
    // The run ends when the flow to h1 is complete; copies still on the way to h2 and h3
    // are in flight, not lost.
    assert_eq!(rx("h2").rx_packets + rx("h3").rx_packets + r.conservation.in_flight_packets, 20);
    // Packets to h2 and h3 have no listener there: counted, not dropped silently.
    assert_eq!(rx("h2").drops_no_endpoint, rx("h2").rx_packets);
    let sw = r.switches.iter().find(|x| x.name == "s0").unwrap();
    assert!(sw.aggregators_peak >= 1);
    assert_eq!(sw.aggregators_end, 0);
    // Held 5 us at the switch: the last copy arrives after serialization, 2 delays and the hold.
    assert!(r.flows[0].last_rx_s.expect("a packet arrived") > 7e-6);
}

/// Records what the switch context tells a program: routes toward switches, and which ports
/// lead up.
/// (next hops toward spine0, whether each port faces up), per packet.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<(Vec<PortId>, Vec<bool>)>>>;

#[derive(Default)]
struct Looker {
    seen: Seen,
}

impl SwitchProgram for Looker {
    fn on_packet(&mut self, _now: Time, ctx: &dyn SwitchCtx, _in_port: PortId, pkt: Packet, out: &mut Vec<SwitchAction>) {
        let spine: Vec<PortId> = ctx.next_hops(pkt.dst + 1_000_000).to_vec(); // no such node: no route
        assert!(spine.is_empty());
        let up: Vec<bool> = (0..ctx.num_ports() as PortId).map(|p| ctx.faces_up(p)).collect();
        let to_spine0 = ctx.next_hops(SPINE0).to_vec();
        self.seen.lock().unwrap().push((to_spine0, up));
        out.push(SwitchAction::Route { pkt });
    }
}

/// Node id of spine0 in a leaf-spine of 2 leaves x 2 hosts: hosts 0..4, leaves 4 and 5.
const SPINE0: NodeId = 6;

#[test]
fn the_switch_context_routes_toward_switches_and_knows_up_from_down() {
    let topo = json!({"shape": {"kind": "leaf_spine", "leaves": 2, "spines": 2, "hosts_per_leaf": 2, "switch_ports": 8,
                                "host_rate_bps": G100, "fabric_rate_bps": G100, "link_delay_ps": US}});
    let s = spec(topo, vec![], vec![json!({"src": "h0", "dst": "h3", "bytes": 1500, "packet_bytes": 1500, "start_ps": 0})]);
    let spec = inalab_sim::parse_spec(&s.to_string()).unwrap();
    let mut sim = inalab_sim::Sim::new(&spec).unwrap();
    let leaf0 = sim.topology().find("leaf0").unwrap();
    assert_eq!(sim.topology().find("spine0"), Some(SPINE0));
    let looker = Looker::default();
    let seen = looker.seen.clone();
    sim.set_program(leaf0, Box::new(looker));
    sim.run(None);
    let seen = seen.lock().unwrap();
    let (to_spine0, up) = &seen[0];
    // leaf0's ports: h0, h1, then spine0, spine1.
    assert_eq!(to_spine0, &vec![2]);
    assert_eq!(up, &vec![false, false, true, true]);
}
