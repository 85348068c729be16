//! Multi-tenant isolation in simulation: a host may only send the INA packets of jobs it takes
//! part in. A rogue endpoint on a host of one SwitchML job forges packets of the other job
//! sharing the switch; the switch drops and counts them, and both jobs still sum exactly.

mod common;
use common::*;
use inalab_core::wire::{Header, SwitchMlHeader};
use inalab_core::{AppRequest, Endpoint, HostEvent, HostProtocol, NodeId, Packet, Payload, Time};
use serde_json::json;

/// Sends `left` SwitchML packets of `job` from `at`'s host, spoofing `victim` (worker 0 of
/// that job) as their source, values 1000 each.
struct Forger {
    at: Endpoint,
    victim: Endpoint,
    switch: Endpoint,
    job: u32,
    left: u32,
}

impl HostProtocol for Forger {
    fn endpoint(&self) -> Endpoint {
        self.at
    }
    fn submit(&mut self, _now: Time, _req: AppRequest) {}
    fn handle_packet(&mut self, _now: Time, _pkt: Packet) {}
    fn handle_timeout(&mut self, _now: Time) {}
    fn poll_transmit(&mut self, _now: Time) -> Option<Packet> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let h = SwitchMlHeader { job: self.job, slot: self.left % 4, chunk: self.left % 4, wid: 0, ver: 0, flags: 0, exp: 0 };
        let mut p = Packet::new(self.victim.host, self.victim.port, self.switch.host, self.switch.port, 180, Header::SwitchMl(h));
        p.payload = Some(Box::new(Payload::I32(vec![1000; 32])));
        Some(p)
    }
    fn poll_timeout(&self) -> Option<Time> {
        None
    }
    fn poll_event(&mut self) -> Option<HostEvent> {
        None
    }
}

fn switchml_job(id: u32, workers: Vec<String>) -> serde_json::Value {
    let mut j = job(id, "switchml", workers, vec![], json!({"kind": "allreduce", "bytes": 4 * 512, "iterations": 3}));
    j["ina"] = json!({"timeout_ps": 100 * US, "pool_slots": 8});
    j
}

#[test]
fn a_host_cannot_inject_packets_of_another_job() {
    let mut s = spec(star(8, US), vec![switchml_job(0, hosts(0..4)), switchml_job(1, hosts(4..8))], vec![]);
    s["payload"] = json!(true);
    s["network"]["aggregator_memory_bytes"] = json!(64 * 280);
    let spec = inalab_sim::parse_spec(&s.to_string()).unwrap();
    let mut sim = inalab_sim::Sim::new(&spec).unwrap();
    let s0: NodeId = sim.topology().find("s0").unwrap();
    // h0 (job 0) forges job 1's packets as if from h4, job 1's worker 0.
    let port = inalab_sim::setup::worker_port(1);
    let (switch, victim) = (Endpoint { host: s0, port }, Endpoint { host: 4, port });
    sim.add_host_protocol(0, Box::new(Forger { at: Endpoint { host: 0, port: 9 }, victim, switch, job: 1, left: 40 }));
    sim.run(None);
    let r = sim.finish();
    check_invariants(&r);
    for j in &r.jobs {
        assert!(j.finished, "job {} did not finish: {:?}", j.id, j.failures);
        assert_eq!((j.payload_checked, j.payload_errors), (4 * 3, 0), "job {} sums exactly", j.id);
    }
    let sw = &r.switches[0];
    assert_eq!(sw.counters.get("drops_unadmitted"), Some(&40), "{:?}", sw.counters);
    assert_eq!(sw.aggregators_end, 0);
}
