//! Several programs on one switch: each packet reaches the program of its protocol, a frame of
//! a scheme the switch does not run is routed like any packet, timers come back to their
//! program, and release frees at every program.

use inalab_core::wire::{AtpHeader, Header, SwitchMlHeader};
use inalab_core::{Admission, Endpoint, NodeId, Packet, PortId, Programs, SwitchAction, SwitchCtx, SwitchProgram, Time, TimerToken};
use inalab_testkit::IdleCtx;
use inalab_switch::{AtpSwitch, AtpSwitchConfig, AtpSwitchJob, SwitchMlJob, SwitchMlSwitch};

const CTX: IdleCtx = IdleCtx { node: 100, ports: 8 };

fn atp() -> Box<AtpSwitch> {
    Box::new(AtpSwitch::new(AtpSwitchConfig { aggregators: 8, stale_timeout_ps: 1000 }))
}

fn atp_job() -> Admission {
    Admission::new(AtpSwitchJob { local_workers: vec![(0, 0), (1, 1)], ps: None, remote_targets: vec![], multicast: true, stale_timeout_ps: 1000, ..Default::default() })
}

fn switchml_job() -> Admission {
    let ep = |h| Endpoint { host: h, port: 5 };
    Admission::new(SwitchMlJob { workers: vec![(ep(2), 2), (ep(3), 3)], pool_slots: 4, values_per_packet: 32 })
}

fn atp_gradient(job: u32, from: NodeId) -> Packet {
    let h = AtpHeader { job, seq: 1, agg_index: 1, bitmap0: 1 << from, bitmap1: 1, fan_in0: 2, fan_in1: 1, ..AtpHeader::default() };
    Packet::new(from, 5, 9, 6, 306, Header::Atp(h))
}

fn switchml_packet(job: u32, wid: u16) -> Packet {
    let h = SwitchMlHeader { job, slot: 0, chunk: 0, wid, ver: 0, flags: 0, exp: 0 };
    Packet::new(2 + wid as NodeId, 5, 100, 5, 180, Header::SwitchMl(h))
}

fn run(p: &mut Programs, port: PortId, pkt: Packet) -> Vec<SwitchAction> {
    let mut out = vec![];
    p.on_packet(0, &CTX, port, pkt, &mut out);
    out
}

#[test]
fn a_frame_of_a_scheme_not_run_here_is_routed() {
    let mut p = Programs::new();
    p.install("atp", atp()).unwrap();
    let out = run(&mut p, 2, switchml_packet(3, 0));
    assert!(matches!(&out[..], [SwitchAction::Route { .. }]), "{out:?}");
    assert_eq!(p.job_of(&switchml_packet(3, 0)), None);
    let err = p.admit_at("switchml", 3, switchml_job()).unwrap_err();
    assert!(err.0.contains("does not run the switchml program"), "{err}");
}

#[test]
fn each_packet_reaches_its_own_program() {
    let mut p = Programs::new();
    p.install("atp", atp()).unwrap();
    p.install("switchml", Box::new(SwitchMlSwitch::with_slots(16))).unwrap();
    assert!(p.install("atp", atp()).is_err(), "a program is installed once");
    assert_eq!(p.names(), "atp+switchml");
    p.admit_at("atp", 1, atp_job()).unwrap();
    p.admit_at("switchml", 3, switchml_job()).unwrap();
    // ATP holds one aggregator for job 1; SwitchML a partial copy for job 3.
    run(&mut p, 0, atp_gradient(1, 0));
    let out = run(&mut p, 2, switchml_packet(3, 0));
    assert!(matches!(&out[..], [SwitchAction::Drop { .. }]), "SwitchML consumed its packet: {out:?}");
    assert_eq!(p.aggregators_in_use(), 2);
    // Both programs count "aggregated": the composite reports their sum, once.
    let aggregated: Vec<u64> = p.counters().iter().filter(|c| c.0 == "aggregated").map(|c| c.1).collect();
    assert_eq!(aggregated, [2]);
    assert_eq!(p.job_of(&atp_gradient(1, 0)), Some(1));
    assert_eq!(p.job_of(&switchml_packet(3, 0)), Some(3));
    // Releasing frees at every program what the job still held: ATP's aggregator, SwitchML's
    // partial slot.
    assert_eq!(p.release(1), 1);
    assert_eq!(p.release(3), 1);
    assert_eq!(p.aggregators_in_use(), 0);
}

/// Sets a timer with its own token on every packet and counts the tokens it gets back.
#[derive(Default)]
struct Ticker {
    fired: Vec<TimerToken>,
}

impl SwitchProgram for Ticker {
    fn on_packet(&mut self, now: Time, _ctx: &dyn SwitchCtx, _in_port: PortId, pkt: Packet, out: &mut Vec<SwitchAction>) {
        out.push(SwitchAction::SetTimer { at: now + 10, token: 42 });
        out.push(SwitchAction::Drop { pkt, reason: "ticker" });
    }
    fn on_timer(&mut self, _now: Time, _ctx: &dyn SwitchCtx, token: TimerToken, _out: &mut Vec<SwitchAction>) {
        self.fired.push(token);
    }
    fn job_of(&self, pkt: &Packet) -> Option<u32> {
        matches!(pkt.header, Header::Raw).then_some(0)
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![("fired", self.fired.len() as u64)]
    }
}

#[test]
fn timers_come_back_to_the_program_that_set_them() {
    let mut p = Programs::new();
    p.install("atp", atp()).unwrap();
    p.install("ticker", Box::<Ticker>::default()).unwrap();
    let out = run(&mut p, 0, Packet::new(0, 1, 2, 3, 64, Header::Raw));
    let token = out.iter().find_map(|a| match a {
        SwitchAction::SetTimer { token, .. } => Some(*token),
        _ => None,
    });
    let token = token.expect("the ticker set a timer");
    assert_ne!(token, 42, "the composite tags the token with the program");
    let mut out = vec![];
    p.on_timer(10, &CTX, token, &mut out);
    assert!(p.counters().contains(&("fired", 1)), "{:?}", p.counters());
    // A token naming no program is ignored.
    p.on_timer(10, &CTX, u64::MAX, &mut out);
    assert!(p.counters().contains(&("fired", 1)));
}
