use inalab_core::{NodeId, PortId};
use inalab_topo::*;

fn spec(json: &str) -> TopologySpec {
    serde_json::from_str(json).unwrap()
}

const G100: u64 = 100_000_000_000;

/// Canary's 1024-host leaf-spine: 32 leaves of 32 hosts, 32 spines, 64-port switches.
fn canary_leaf_spine() -> Topology {
    build(&spec(&format!(
        r#"{{"shape":{{"kind":"leaf_spine","leaves":32,"spines":32,"hosts_per_leaf":32,"switch_ports":64,
        "host_rate_bps":{G100},"fabric_rate_bps":{G100},"link_delay_ps":500000}}}}"#
    )))
    .unwrap()
}

#[test]
fn star_counts_and_routes() {
    let t = build(&spec(r#"{"shape":{"kind":"star","hosts":16,"switch_ports":64,"link_rate_bps":100000000000,"link_delay_ps":1000000}}"#)).unwrap();
    assert_eq!(t.hosts, 16);
    assert_eq!(t.nodes.len(), 17);
    assert_eq!(t.links.len(), 16);
    let r = Routes::compute(&t);
    for d in 0..16 {
        assert_eq!(r.next_hops(16, d), &[d as u16]);
    }
}

#[test]
fn star_with_more_hosts_than_ports_names_the_field() {
    let e = build(&spec(r#"{"shape":{"kind":"star","hosts":70,"switch_ports":64,"link_rate_bps":1,"link_delay_ps":0}}"#)).unwrap_err();
    assert_eq!(e.field, "topology.hosts");
    assert!(e.message.contains("64"), "{e}");
}

#[test]
fn canary_fat_tree_has_1024_hosts_and_32_way_ecmp() {
    let t = canary_leaf_spine();
    assert_eq!(t.hosts, 1024);
    assert_eq!(t.nodes.len(), 1024 + 64);
    let r = Routes::compute(&t);
    let leaf0 = t.find("leaf0").unwrap();
    // To a host on another leaf: all 32 up ports; to a local host: its one down port.
    assert_eq!(r.next_hops(leaf0, 1000).len(), 32);
    assert_eq!(r.next_hops(leaf0, 5).len(), 1);
    let spine = t.find("spine3").unwrap();
    assert_eq!(r.next_hops(spine, 1000).len(), 1);
    let p = r.ecmp_path(&t, 0, 1000, 12345, DefaultPort::FlowHash).unwrap();
    assert_eq!(p.len(), 5, "host-leaf-spine-leaf-host");
}

/// Canary's SST network (merlin's fat tree): the default up port is the destination modulo
/// the up ports. On the paper's 1024-host leaf-spine the 32 hosts of a leaf then take 32
/// different up ports from any other leaf (a flow hash put up to 6 of them on one), and the
/// port toward a host is the same at every leaf, so partial sums toward it meet at one spine.
#[test]
fn destination_rule_spreads_a_leafs_hosts_over_every_up_port() {
    let t = canary_leaf_spine();
    let r = Routes::compute(&t);
    let leaf = |i: u32| t.find(&format!("leaf{i}")).unwrap();
    for target in [1u32, 17, 31] {
        let dsts: Vec<NodeId> = (0..32).map(|k| target * 32 + k).collect();
        for from in [0u32, 5, 30] {
            let mut used: Vec<PortId> = dsts.iter().map(|&d| DefaultPort::Destination.pick(r.next_hops(leaf(from), d), 0, d, leaf(from))).collect();
            used.sort_unstable();
            used.dedup();
            assert_eq!(used.len(), 32, "leaf{target}'s 32 hosts over leaf{from}'s 32 up ports");
        }
        // The same spine from every leaf, whatever the flow.
        let d = dsts[7];
        let spines: Vec<NodeId> = [0u32, 5, 30].iter().map(|&l| r.ecmp_path(&t, l * 32, d, 99 + l as u64, DefaultPort::Destination).unwrap()[2]).collect();
        assert!(spines.windows(2).all(|w| w[0] == w[1]), "{spines:?}");
    }
    // The flow hash does not spread them (the reason for the rule), as the issue measured.
    let hashed: std::collections::HashSet<PortId> = (32..64).map(|d| DefaultPort::FlowHash.pick(r.next_hops(leaf(0), d), d as u64, d, leaf(0))).collect();
    assert!(hashed.len() < 32);
}

#[test]
fn fat_tree_k4_matches_al_fares() {
    let t = build(&spec(r#"{"shape":{"kind":"fat_tree","k":4,"link_rate_bps":1000,"link_delay_ps":0}}"#)).unwrap();
    assert_eq!(t.hosts, 16);
    assert_eq!(t.nodes.len() - 16, 20, "k^2/2 edge+agg plus k^2/4 core");
    for s in t.switches() {
        assert_eq!(t.nodes[s as usize].ports.len(), 4, "every switch has k ports");
    }
    let r = Routes::compute(&t);
    // Inter-pod: 4 equal-cost paths = 2 up choices at edge x 2 at aggregation.
    let e = t.find("edge0_0").unwrap();
    assert_eq!(r.next_hops(e, 15).len(), 2);
    assert_eq!(r.ecmp_path(&t, 0, 15, 7, DefaultPort::FlowHash).unwrap().len(), 7);
    let odd = build(&spec(r#"{"shape":{"kind":"fat_tree","k":5,"link_rate_bps":1,"link_delay_ps":0}}"#)).unwrap_err();
    assert_eq!(odd.field, "topology.k");
}

#[test]
fn dragonfly_is_fully_connected_between_groups() {
    let t = build(&spec(r#"{"shape":{"kind":"dragonfly","a":4,"g":9,"h":2,"p":2,"link_rate_bps":1,"global_rate_bps":1,"link_delay_ps":0}}"#)).unwrap();
    assert_eq!(t.hosts, 72);
    for s in t.switches() {
        assert_eq!(t.nodes[s as usize].ports.len(), 2 + 3 + 2, "p + (a-1) + h");
    }
    let r = Routes::compute(&t);
    for d in 0..t.hosts {
        for s in t.switches() {
            assert!(!r.next_hops(s, d).is_empty());
        }
    }
    // Minimal route between groups: at most local, global, local hops between routers.
    assert!(r.ecmp_path(&t, 0, 71, 1, DefaultPort::FlowHash).unwrap().len() <= 6);
    let too_many = build(&spec(r#"{"shape":{"kind":"dragonfly","a":4,"g":10,"h":2,"p":2,"link_rate_bps":1,"global_rate_bps":1,"link_delay_ps":0}}"#)).unwrap_err();
    assert_eq!(too_many.field, "topology.g");
}

#[test]
fn edges_put_hosts_first_and_check_names() {
    let t = build(&spec(
        r#"{"shape":{"kind":"edges","nodes":[{"name":"sw","kind":"switch"},{"name":"a","kind":"host"},{"name":"b","kind":"host"}],
        "links":[{"a":"a","b":"sw","rate_bps":3,"delay_ps":0},{"a":"sw","b":"b","rate_bps":3,"delay_ps":0}]},
        "programmable":{"names":["sw"]}}"#,
    ))
    .unwrap();
    assert_eq!(t.find("a"), Some(0));
    assert_eq!(t.find("b"), Some(1));
    assert!(t.nodes[2].programmable);
    let e = build(&spec(
        r#"{"shape":{"kind":"edges","nodes":[{"name":"a","kind":"host"}],"links":[{"a":"a","b":"zz","rate_bps":3,"delay_ps":0}]}}"#,
    ))
    .unwrap_err();
    assert_eq!(e.field, "topology.links[0].b");
}

#[test]
fn programmable_selection() {
    let t = build(&spec(r#"{"shape":{"kind":"fat_tree","k":4,"link_rate_bps":1,"link_delay_ps":0},"programmable":"tor"}"#)).unwrap();
    assert_eq!(t.switches().filter(|&s| t.nodes[s as usize].programmable).count(), 8);
    let e = build(&spec(r#"{"shape":{"kind":"fat_tree","k":4,"link_rate_bps":1,"link_delay_ps":0},"programmable":{"names":["nope"]}}"#)).unwrap_err();
    assert_eq!(e.field, "topology.programmable");
}
