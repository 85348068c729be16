//! Two INA schemes on one switch: ATP and SwitchML jobs share a ToR, each program gets an equal
//! part of its aggregator memory, and both jobs sum exactly.

mod common;
use common::*;
use serde_json::{json, Value};

const SLOT_BYTES: u64 = 280;

fn scenario(pool_slots: u32) -> Value {
    let mut sml = job(0, "switchml", hosts(0..4), vec![], json!({"kind": "allreduce", "bytes": 4 * 2000, "iterations": 2}));
    sml["ina"] = json!({"timeout_ps": 100 * US, "pool_slots": pool_slots});
    let mut atp = job(1, "atp", hosts(4..7), vec!["h7".into()], json!({"kind": "allreduce", "bytes": 4 * 2000, "iterations": 2}));
    atp["ina"] = json!({"timeout_ps": 200 * US});
    let mut s = spec(star(8, US), vec![sml, atp], vec![]);
    s["payload"] = json!(true);
    s["network"]["aggregator_memory_bytes"] = json!(64 * SLOT_BYTES);
    s
}

#[test]
fn atp_and_switchml_share_a_switch_and_its_memory() {
    let r = simulate(&scenario(32));
    for j in &r.jobs {
        assert!(j.finished, "{} did not finish: {:?}", j.scheme, j.failures);
        assert_eq!((j.payload_checked, j.payload_errors), (j.workers as u64 * 2, 0), "{} sums exactly", j.scheme);
    }
    let s0 = &r.switches[0];
    assert_eq!(s0.aggregators_end, 0);
    // Both programs worked on the one switch.
    assert!(s0.counters["completed"] > 0 && s0.counters.contains_key("collisions") && s0.counters.contains_key("retransmissions_answered"));
    // Half of the 64 slots is SwitchML's: a pool of all 64 does not fit.
    let e = inalab_sim::run(&inalab_sim::parse_spec(&scenario(64).to_string()).unwrap(), None).unwrap_err();
    assert_eq!(e.field, "jobs[0].ina.pool_slots");
    assert!(e.message.contains("32 of the switch's 32 slots"), "{}", e.message);
}
