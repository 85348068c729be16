//! The registry's promises: each scheme's documented parameters are exactly its
//! configuration's defaults, and bad configurations get errors naming the field.

use inalab_scheme::{by_name, schemes, JobSpec, NetView, Overrides, Range};
use inalab_core::{NodeId, PortId};
use serde_json::{json, Value};

fn at<'a>(v: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(v, |v, k| v.get(k))
}

#[test]
fn every_parameter_of_the_configuration_is_documented_and_no_other() {
    for s in schemes() {
        let filled = s.defaults();
        assert_eq!(filled, s.normalize(&json!({"scheme": s.name()})).unwrap(), "{}", s.name());
        let mut documented = vec![];
        for p in s.params() {
            assert!(at(&filled, p.name).is_some(), "{}: {} is documented but not in the configuration", s.name(), p.name);
            documented.push(p.name.to_string());
        }
        // Every leaf of the filled configuration is documented.
        fn leaves(v: &Value, prefix: &str, out: &mut Vec<String>) {
            match v.as_object() {
                Some(m) => m.iter().for_each(|(k, v)| leaves(v, &if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") }, out)),
                None => out.push(prefix.to_string()),
            }
        }
        let mut all = vec![];
        leaves(&filled, "", &mut all);
        all.retain(|k| k != "scheme");
        all.sort();
        documented.sort();
        assert_eq!(all, documented, "{}", s.name());
    }
}

#[test]
fn errors_name_the_field_and_the_allowed_values() {
    let Err(e) = by_name("sharp") else { panic!("no scheme is called sharp") };
    assert_eq!(e.field, "scheme");
    assert!(e.message.contains("\"atp\"") && e.message.contains("\"switchml\""), "{}", e.message);
    let atp = by_name("atp").unwrap();
    let e = atp.normalize(&json!({"scheme": "atp", "ina": {"bogus": 1}})).unwrap_err();
    assert_eq!(e.field, "ina.bogus", "{e}");
    let e = atp.normalize(&json!({"scheme": "atp", "ina": {"hashing": "round_robin"}})).unwrap_err();
    assert_eq!(e.field, "ina.hashing", "{e}");
    assert!(e.message.contains("hash") && e.message.contains("linear") && e.message.contains("static"), "{}", e.message);
    let e = by_name("ring").unwrap().normalize(&json!({"scheme": "ring", "partition_bytes": 4})).unwrap_err();
    assert_eq!(e.field, "partition_bytes", "{e}");
}

#[test]
fn a_drivers_overrides_fill_only_what_the_job_left_out() {
    let sml = by_name("switchml").unwrap();
    let o = Overrides { timeout_ps: Some(20_000_000_000), pool_slots: Some(128), packet_values: None };
    let filled = sml.apply(&json!({"scheme": "switchml", "ina": {"pool_slots": 16}}), &o).unwrap();
    assert_eq!(filled["ina"]["pool_slots"], 16, "the job's own value stays");
    assert_eq!(filled["ina"]["timeout_ps"], 20_000_000_000u64, "the driver's fills the gap");
    let zero = sml.apply(&json!({"scheme": "switchml", "ina": {"pool_slots": 0}}), &o).unwrap();
    assert_eq!(zero["ina"]["pool_slots"], 128, "0 (an equal share) takes the driver's pool");
    let atp = by_name("atp").unwrap().apply(&json!({"scheme": "atp", "ina": {"timeout_ps": 5_000_000}}), &o).unwrap();
    assert_eq!((atp["ina"]["timeout_ps"].as_u64(), atp["ina"].get("pool_slots")), (Some(5_000_000), None), "ATP has no pool parameter");
    let ring = by_name("ring").unwrap().apply(&json!({"scheme": "ring"}), &o).unwrap();
    assert_eq!(ring, by_name("ring").unwrap().normalize(&json!({"scheme": "ring"})).unwrap(), "ring takes neither");
}

#[test]
fn a_drivers_values_per_packet_size_the_packets_of_schemes_that_take_any() {
    let o = Overrides { packet_values: Some(2048), ..Overrides::default() };
    let sml = by_name("switchml").unwrap();
    let filled = sml.apply(&json!({"scheme": "switchml"}), &o).unwrap();
    assert_eq!(filled["ina"]["packet_bytes"], 52 + 4 * 2048, "the default header plus 2,048 values");
    let own_header = sml.apply(&json!({"scheme": "switchml", "ina": {"header_bytes": 95}}), &o).unwrap();
    assert_eq!(own_header["ina"]["packet_bytes"], 95 + 4 * 2048, "the job's header");
    let own = sml.apply(&json!({"scheme": "switchml", "ina": {"packet_bytes": 180}}), &o).unwrap();
    assert_eq!(own["ina"]["packet_bytes"], 180, "the job's packet stays (a Tofino's, here)");
    let atp = by_name("atp").unwrap().apply(&json!({"scheme": "atp"}), &o).unwrap();
    assert_eq!(atp["ina"]["packet_bytes"], 58 + 4 * 2048);
    // DSA's aggregators hold a fixed number of values: its packets keep their size.
    let dsa = by_name("dsa").unwrap();
    assert_eq!(dsa.apply(&json!({"scheme": "dsa"}), &o).unwrap(), dsa.normalize(&json!({"scheme": "dsa"})).unwrap());
}

/// `config` with the dotted parameter `name` set to `v`.
fn with(scheme: &str, name: &str, v: Value) -> Value {
    let mut config = json!({"scheme": scheme});
    let mut at = &mut config;
    let keys: Vec<&str> = name.split('.').collect();
    for k in &keys[..keys.len() - 1] {
        at = at.as_object_mut().unwrap().entry(k.to_string()).or_insert(json!({}));
    }
    at[keys[keys.len() - 1]] = v;
    config
}

#[test]
fn every_parameter_has_bounds_that_hold_its_default() {
    for s in schemes() {
        let defaults = s.defaults();
        for p in s.params() {
            let default = at(&defaults, p.name).expect("documented parameters have defaults");
            assert!(p.range.allows(&default), "{}: {}'s default {default} is outside {:?}", s.name(), p.name, p.range);
            // Sizes, times and counts are integers with an upper bound; what else a parameter
            // takes is a fixed set of names, a boolean, a list or a bounded number.
            if matches!(p.unit, "ps" | "bytes") {
                assert!(matches!(p.range, Range::Int { .. }), "{}: {} is a size or time without integer bounds", s.name(), p.name);
            }
            let words = p.range.describe(p.unit);
            assert!(!words.is_empty() && words.len() < 200, "{}: {words}", p.name);
        }
    }
}

/// Issue #36, item 1: every parameter of every scheme at hostile values: each is either
/// allowed (inside the documented range) and accepted, or refused with an error that names the
/// parameter, quotes the value briefly and says what is allowed; never a panic or an overflow.
#[test]
fn hostile_values_of_every_parameter_are_refused_naming_the_field_and_the_range() {
    let huge = "x".repeat(100_000);
    let values = [
        json!(0), json!(-1), json!(1), json!(2_147_483_647), json!(1u64 << 63), json!(u64::MAX), json!(1e300), json!(-1e300), json!(0.5),
        json!(null), json!([1, 2]), json!({"a": 1}), json!(true), json!(huge),
    ];
    for s in schemes() {
        for p in s.params() {
            for v in &values {
                let config = with(s.name(), p.name, v.clone());
                // (A panic fails the test.)
                match s.normalize(&config) {
                    Ok(_) => assert!(p.range.allows(v), "{}: {} = {v} accepted outside {:?}", s.name(), p.name, p.range),
                    Err(e) => {
                        let shown = e.to_string();
                        let leaf = p.name.rsplit('.').next().unwrap();
                        assert!(e.field == p.name || shown.contains(leaf), "{}: {} = {}: the error names another field: {shown}", s.name(), p.name, inalab_scheme::quote(v));
                        assert!(shown.len() < 600, "{}: {}: a {}-byte error", s.name(), p.name, shown.len());
                        if !p.range.allows(v) {
                            assert_eq!(e.field, p.name, "{shown}");
                            assert!(e.message.contains("allowed: "), "{shown}");
                        }
                    }
                }
            }
        }
    }
    // The two configurations that took a shared switch down (issue #36): refused, with the range.
    let e = by_name("switchml").unwrap().normalize(&json!({"scheme": "switchml", "ina": {"pool_slots": 2_147_483_647}})).unwrap_err();
    assert_eq!(e.field, "ina.pool_slots");
    assert!(e.message.contains("2147483647") && e.message.contains("0..=16777216"), "{e}");
    let e = by_name("rina").unwrap().normalize(&json!({"scheme": "rina", "ina": {"rto_ps": 1u64 << 62}})).unwrap_err();
    assert_eq!(e.field, "ina.rto_ps");
    assert!(e.message.contains("1 us to 60 s"), "{e}");
}

/// One rack of `n` hosts under a programmable switch with `memory` bytes.
struct Rack {
    memory: u64,
}

impl NetView for Rack {
    fn tor(&self, _host: NodeId) -> NodeId {
        100
    }
    fn port_toward(&self, _switch: NodeId, host: NodeId) -> Option<PortId> {
        Some(host as PortId)
    }
    fn programmable(&self, switch: NodeId) -> bool {
        switch == 100
    }
    fn memory_bytes(&self, switch: NodeId) -> u64 {
        if switch == 100 {
            self.memory
        } else {
            0
        }
    }
    fn name(&self, node: NodeId) -> String {
        format!("n{node}")
    }
    fn share(&self, _job: u32, _key: &str) -> (u32, u32) {
        (0, 1)
    }
}

/// Issue #36, item 1: SwitchML's plan built every worker's per-slot state before the switch
/// checked the pool against its memory, so a job asking for 2^31 slots exhausted the shared
/// switch's process. The plan now refuses a pool that cannot fit first (the largest pool the
/// range allows, 2^24 slots, would take 800 MB of worker state for 16 workers).
#[test]
fn a_switchml_pool_beyond_the_switchs_memory_is_refused_before_anything_is_built() {
    let sml = by_name("switchml").unwrap();
    let config = sml.normalize(&json!({"scheme": "switchml", "ina": {"pool_slots": inalab_scheme::MAX_SLOTS}})).unwrap();
    let job = JobSpec { id: 1, workers: (0..16).collect(), servers: vec![], config, worker_port: 1, server_port: 1 };
    let Err(e) = sml.plan(&job, &Rack { memory: 5_000_000 }) else { panic!("a pool of 2^24 slots was planned on a 5 MB switch") };
    assert_eq!(e.field, "ina.pool_slots", "{e}");
    assert!(e.message.contains("5000000 B"), "{e}");
    // What fits is planned as before.
    let config = sml.normalize(&json!({"scheme": "switchml", "ina": {"pool_slots": 64}})).unwrap();
    assert!(sml.plan(&JobSpec { config, ..job }, &Rack { memory: 5_000_000 }).is_ok());
}

/// #37: DSA addresses its aggregators "by hashing as in statistical INA" (§III-A): the job's
/// PSN p goes to entry p mod slots of the slot table ATP builds for the same job and pool,
/// in both drivers (the switch is admitted with the plan's table).
#[test]
fn dsas_index_is_atps_slot_table_for_the_same_job_and_pool() {
    use inalab_core::SwitchProgram;
    let dsa = by_name("dsa").unwrap();
    let rack = Rack { memory: 5_000_000 };
    for (id, slots) in [(3u32, 512u32), (4, 100)] {
        let config = dsa.normalize(&json!({"scheme": "dsa", "ina": {"slots": slots}})).unwrap();
        let job = JobSpec { id, workers: (0..8).collect(), servers: vec![50], config, worker_port: 1, server_port: 2 };
        let plan = dsa.plan(&job, &rack).unwrap();
        let pool = inalab_switch::DsaSwitchConfig::aggregators_for(rack.memory);
        let mut sw = inalab_switch::DsaSwitch::new(inalab_switch::DsaSwitchConfig { aggregators: pool, seed: 1 });
        let adm = plan.admissions.into_iter().next().expect("the job is admitted at its PS's switch");
        sw.admit(id, adm.state).unwrap();
        let atp = inalab_host::AtpConfig { job: id, aggregators: pool, slots, hashing: inalab_host::Hashing::Hash, ..Default::default() }.slot_table();
        assert_eq!(atp.iter().collect::<std::collections::BTreeSet<_>>().len(), slots as usize, "distinct slots");
        for psn in (0..3 * slots).chain([u32::MAX - 1]) {
            assert_eq!(sw.index(id as u16, psn), atp[psn as usize % slots as usize] as usize, "job {id} psn {psn}");
        }
    }
}
