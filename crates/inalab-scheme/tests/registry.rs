//! The registry's promises: each scheme's documented parameters are exactly its
//! configuration's defaults, and bad configurations get errors naming the field.

use inalab_scheme::{by_name, schemes, Overrides};
use serde_json::{json, Value};

fn at<'a>(v: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(v, |v, k| v.get(k))
}

#[test]
fn documented_defaults_are_the_configurations_defaults() {
    for s in schemes() {
        let filled = s.normalize(&json!({"scheme": s.name()})).unwrap();
        let mut documented = vec![];
        for p in s.params() {
            let default: Value = serde_json::from_str(p.default).unwrap_or_else(|e| panic!("{}: {}: {e}", s.name(), p.name));
            assert_eq!(at(&filled, p.name), Some(&default), "{}: {}", s.name(), p.name);
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
    let atp = by_name("atp").unwrap().apply(&json!({"scheme": "atp", "ina": {"timeout_ps": 5}}), &o).unwrap();
    assert_eq!((atp["ina"]["timeout_ps"].as_u64(), atp["ina"].get("pool_slots")), (Some(5), None), "ATP has no pool parameter");
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
