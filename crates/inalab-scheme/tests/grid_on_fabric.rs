//! GRID's worker, PS and switch program together on the test fabric (issue 18, before the
//! scheme's set-up exists): a 2-leaf, 1-spine fabric of 4 hosts per leaf; workers 0-3 aggregate
//! at leaf 0, workers 4-5 at leaf 1, worker 6 sends to the PS (host 7) directly; the spine runs
//! GRID's program too and is nobody's target. Exact sums with and without loss and collisions,
//! every packet conserved, nothing held once the job is released.

use inalab_core::time::US;
use inalab_core::{AppRequest, Endpoint, HostEvent, NodeId, Payload};
use inalab_host::{GridConfig, GridServer, GridServerConfig, GridTarget, GridWorker};
use inalab_switch::{GridIndexing, GridSwitch, GridSwitchConfig, GridSwitchJob};
use inalab_testkit::{Fabric, Link, Links, Rule};

const PS: NodeId = 7;
const LEAF0: NodeId = 8;
const LEAF1: NodeId = 9;
const SPINE: NodeId = 10;
const RTO: u64 = 200 * US;

struct Run {
    loss: f64,
    /// Worker 0 submits this much later (a straggler: its group's units wait for it).
    late: u64,
    units: u32,
    tensors: u64,
    len: usize,
}

fn targets() -> Vec<GridTarget> {
    let at = |node, position, fan_in| GridTarget { node, position, fan_in };
    vec![at(LEAF0, 0, 4), at(LEAF0, 1, 4), at(LEAF0, 2, 4), at(LEAF0, 3, 4), at(LEAF1, 0, 2), at(LEAF1, 1, 2), at(PS, 0, 1)]
}

fn value(r: usize, t: u64, i: usize) -> i32 {
    ((i * 31 + r * 7 + t as usize) % 1001) as i32 - 500
}

/// Runs the job; returns the switches' (collisions, control packets sent, stale evictions).
fn run(cfg: Run) -> (u64, u64, u64) {
    let mut f = Fabric::leaf_spine(2, 1, 4, Link { delay: US, rate_bps: 10_000_000_000 });
    f.seed(3);
    if cfg.loss > 0.0 {
        f.lose(Links::All, Rule::chance(cfg.loss));
    }
    let switch = || GridSwitch::new(GridSwitchConfig { units: cfg.units });
    let job = |group, fan_in| GridSwitchJob { group, fan_in, indexing: GridIndexing::Hash, stale_timeout_ps: 2 * RTO, control_bytes: Some(66) };
    let mut leaf0 = switch();
    leaf0.admit_job(1, job(0b1111, 4));
    let mut leaf1 = switch();
    leaf1.admit_job(1, job(0b11, 2));
    f.install(LEAF0, leaf0);
    f.install(LEAF1, leaf1);
    f.install(SPINE, switch());
    let grid = GridConfig { job: 1, rto_ps: RTO, ..GridConfig::default() };
    let ep = |h: NodeId| Endpoint { host: h, port: 9 };
    let workers: Vec<Endpoint> = (0..7).map(ep).collect();
    let groups = vec![(LEAF0, vec![0, 1, 2, 3]), (LEAF1, vec![4, 5])];
    f.add(Box::new(GridServer::new(ep(PS), GridServerConfig { grid: grid.clone(), workers: workers.clone(), groups, deliver: vec![], multicast: false }).unwrap()));
    for (r, t) in targets().into_iter().enumerate() {
        f.add(Box::new(GridWorker::new(workers[r], ep(PS), t, grid.clone()).unwrap()));
    }
    let submit = |f: &mut Fabric, r: usize| {
        for t in 0..cfg.tensors {
            let v: Vec<i32> = (0..cfg.len).map(|i| value(r, t, i)).collect();
            f.submit(workers[r], AppRequest::allreduce(t, 4 * cfg.len as u64, Some(Payload::I32(v))));
        }
    };
    (1..7).for_each(|r| submit(&mut f, r));
    f.run(cfg.late);
    submit(&mut f, 0);
    assert!(f.run(1_000_000 * US), "the job ends");
    f.check_conservation().unwrap();
    for t in 0..cfg.tensors {
        let exact: Vec<i32> = (0..cfg.len).map(|i| (0..7).map(|r| value(r, t, i)).sum()).collect();
        for &w in &workers {
            let got = f.events(w).into_iter().find_map(|e| match e {
                HostEvent::Done { id, data: Some(Payload::I32(v)) } if id == t => Some(v),
                _ => None,
            });
            assert_eq!(got.as_ref(), Some(&exact), "worker {} tensor {t}", w.host);
        }
    }
    if cfg.loss > 0.0 {
        assert!(f.total("resent") > 0, "losses were recovered by resends");
    }
    let c = |s: NodeId, n: &str| f.switch_counter(s, n);
    assert_eq!(c(SPINE, "agg_packets"), 0, "nobody names the spine: it only forwards");
    assert!(c(LEAF0, "completions") + c(LEAF0, "resend_flushes") > 0 && c(LEAF1, "completions") + c(LEAF1, "resend_flushes") > 0);
    let counts = [LEAF0, LEAF1].iter().fold((0, 0, 0), |a, &s| (a.0 + c(s, "collisions"), a.1 + c(s, "control_sent"), a.2 + c(s, "stale_evictions")));
    for s in [LEAF0, LEAF1] {
        f.program_mut::<GridSwitch>(s).release_job(1);
        assert_eq!(inalab_core::SwitchProgram::aggregators_in_use(f.program::<GridSwitch>(s)), 0);
    }
    counts
}

#[test]
fn grid_sums_exactly_with_switch_and_ps_aggregation() {
    let (collisions, _, _) = run(Run { loss: 0.0, late: 0, units: 4096, tensors: 3, len: 5000 });
    assert_eq!(collisions, 0);
}

#[test]
fn grid_sums_exactly_under_loss() {
    run(Run { loss: 0.01, late: 0, units: 4096, tensors: 3, len: 5000 });
}

#[test]
fn collisions_slow_the_senders_down_and_every_sum_stays_exact() {
    let (collisions, controls, _) = run(Run { loss: 0.0, late: 20 * US, units: 16, tensors: 2, len: 20_000 });
    assert!(collisions > 0 && controls == collisions, "every collision tells its sender ({collisions}, {controls})");
}

#[test]
fn collisions_and_loss_together() {
    run(Run { loss: 0.005, late: 20 * US, units: 16, tensors: 2, len: 10_000 });
}
