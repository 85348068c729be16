//! Jobs planned by the registry, run on the test fabric with the real switch programs and
//! float32 tensors: every worker gets the sum within its scheme's quantization bound, with
//! and without loss, and the switches hold no aggregator once the job is released.

use inalab_core::time::US;
use inalab_core::{AppRequest, Endpoint, HostEvent, NodeId, Payload, PortId, Programs, SwitchProgram};
use inalab_scheme::{by_name, JobSpec, NetView, Quantization};
use inalab_testkit::{Fabric, Link, Links, Rule};
use serde_json::{json, Value};

const PER_LEAF: u32 = 4;
const LEAVES: u32 = 2;
const MEMORY: u64 = 2_000_000;

/// A run's network and traffic: loss on every link, aggregator memory of each leaf.
#[derive(Clone, Copy)]
struct Net {
    loss: f64,
    memory: u64,
}

/// The fabric's leaf-spine as a scheme sees it: leaves are programmable.
struct View {
    memory: u64,
}

impl NetView for View {
    fn tor(&self, host: NodeId) -> NodeId {
        PER_LEAF * LEAVES + host / PER_LEAF
    }
    fn port_toward(&self, switch: NodeId, host: NodeId) -> Option<PortId> {
        (self.tor(host) == switch).then_some((host % PER_LEAF) as PortId)
    }
    fn programmable(&self, switch: NodeId) -> bool {
        (PER_LEAF * LEAVES..PER_LEAF * LEAVES + LEAVES).contains(&switch)
    }
    fn memory_bytes(&self, switch: NodeId) -> u64 {
        if self.programmable(switch) {
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

/// Worker r's tensor t: magnitudes from 1e-3 to 10, signs mixed (ATP's scale 1e8 carries sums
/// below 21.47).
fn values(r: usize, t: u64, len: usize) -> Vec<f32> {
    (0..len).map(|i| ((i * 7 + r * 13 + t as usize) % 11) as f32 * 10f32.powi((i % 4) as i32 - 3) * if (i + r) % 3 == 0 { -1.0 } else { 1.0 }).collect()
}

/// Plans `config` for `workers` (and `servers`), runs `tensors` allreduces of `len` values on a
/// 2 x 4 leaf-spine with `loss` on every link, and checks every result.
fn run(config: Value, workers: &[NodeId], servers: &[NodeId], tensors: u64, len: usize, loss: f64) {
    let completed = run_values(config, workers, servers, tensors, len, Net { loss, memory: MEMORY }, &values);
    assert!(completed.iter().all(|&c| c > 0), "every switch the job admits at aggregated: {completed:?}");
}

/// Returns the completions counted at each switch the job admitted at.
fn run_values(config: Value, workers: &[NodeId], servers: &[NodeId], tensors: u64, len: usize, net: Net, values: &dyn Fn(usize, u64, usize) -> Vec<f32>) -> Vec<u64> {
    let (loss, view) = (net.loss, View { memory: net.memory });
    let job = JobSpec { id: 3, workers: workers.to_vec(), servers: servers.to_vec(), config, worker_port: 7, server_port: 8 };
    let scheme = job.scheme().unwrap();
    let plan = scheme.plan(&job, &view).unwrap_or_else(|e| panic!("{}: {e}", scheme.name()));
    let mut f = Fabric::leaf_spine(LEAVES as usize, 1, PER_LEAF as usize, Link::default());
    f.seed(11);
    if loss > 0.0 {
        f.lose(Links::All, Rule::chance(loss));
    }
    let mut switches: Vec<(NodeId, Programs)> = vec![];
    for adm in plan.admissions {
        let at = match switches.iter().position(|(s, _)| *s == adm.switch) {
            Some(i) => i,
            None => {
                let mut p = Programs::new();
                p.install(adm.program, by_name(adm.program).unwrap().program(adm.switch, &view).unwrap()).unwrap();
                switches.push((adm.switch, p));
                switches.len() - 1
            }
        };
        switches[at].1.admit_at(adm.program, job.id, adm.state).unwrap();
    }
    let switch_nodes: Vec<NodeId> = switches.iter().map(|s| s.0).collect();
    for (s, p) in switches {
        f.install(s, p);
    }
    let mut eps: Vec<Endpoint> = vec![];
    for ep in plan.endpoints {
        let e = f.add(ep.proto);
        if matches!(ep.role, inalab_scheme::Role::Worker { .. }) {
            eps.push(e);
        }
    }
    for t in 0..tensors {
        for (r, &ep) in eps.iter().enumerate() {
            f.submit(ep, AppRequest::allreduce(t, 4 * len as u64, Some(Payload::F32(values(r, t, len)))));
        }
    }
    assert!(f.run(10_000_000 * US), "{}: the job ends", scheme.name());
    f.check_conservation().unwrap();
    let n = eps.len();
    for t in 0..tensors {
        let exact: Vec<f64> = (0..len).map(|i| (0..n).map(|r| values(r, t, len)[i] as f64).sum()).collect();
        // Per value: the float32 rounding of a sum of n terms of its own size, plus the
        // quantization error (per value for a fixed point, from the tensor's largest value for
        // an agreed exponent).
        let col_max: Vec<f64> = (0..len).map(|i| (0..n).map(|r| values(r, t, len)[i].abs() as f64).fold(0.0, f64::max)).collect();
        let max_abs = col_max.iter().copied().fold(0.0, f64::max);
        let e = max_abs.log2().floor() as i32 + 1;
        let quantization = match scheme.quantization(&job.config) {
            Quantization::None => 0.0,
            Quantization::FixedPoint { scale } => n as f64 / (2.0 * scale),
            Quantization::AgreedExponent => (n * n) as f64 * 2f64.powi(e) / i32::MAX as f64,
        };
        let bound = |i: usize| quantization + 2.0 * f32::EPSILON as f64 * n as f64 * col_max[i];
        for &ep in &eps {
            let got = f.events(ep).into_iter().find_map(|ev| match ev {
                HostEvent::Done { id, data: Some(Payload::F32(v)) } if id == t => Some(v),
                HostEvent::Done { id, .. } if id == t => panic!("{}: tensor {t} came back without floats", scheme.name()),
                HostEvent::Failed { id, reason } | HostEvent::Rejected { id, reason } if id == t => panic!("{}: tensor {t}: {reason}", scheme.name()),
                _ => None,
            });
            let got = got.unwrap_or_else(|| panic!("{}: {ep:?} has no result for tensor {t}", scheme.name()));
            for (i, (g, x)) in got.iter().zip(&exact).enumerate() {
                assert!((*g as f64 - x).abs() <= bound(i), "{}: value {i}: {g} vs {x} (bound {:e})", scheme.name(), bound(i));
            }
        }
    }
    let mut completed = vec![];
    for s in switch_nodes {
        completed.push(f.switch_counter(s, "completed"));
        let p = f.program_mut::<Programs>(s);
        p.release(job.id);
        assert_eq!(p.aggregators_in_use(), 0, "{}: switch {s} holds aggregators after release", scheme.name());
    }
    completed
}

#[test]
fn atp_over_two_racks_sums_floats() {
    for loss in [0.0, 0.01] {
        run(json!({"scheme": "atp", "ina": {"timeout_ps": 200 * US}}), &[0, 1, 4, 5], &[6], 3, 300, loss);
    }
}

#[test]
fn switchml_sums_floats() {
    for loss in [0.0, 0.01] {
        run(json!({"scheme": "switchml", "ina": {"timeout_ps": 100 * US, "pool_slots": 32}}), &[0, 1, 2, 3], &[], 3, 1000, loss);
    }
}

#[test]
fn host_collectives_sum_floats() {
    for scheme in ["ring", "hierarchical", "ps_sharded"] {
        run(json!({"scheme": scheme}), &[0, 1, 4, 5], &[], 2, 2000, 0.0);
    }
    run(json!({"scheme": "ps", "partition_bytes": 4000}), &[0, 1, 4], &[6], 2, 2000, 0.0);
}

/// Values beyond ATP's fixed-point range (|x| > 21.47 at scale 1e8), and sums beyond it from
/// values within: every one comes back as the float sum through ATP's fallback (§3.8), with and
/// without loss, across both racks.
#[test]
fn atp_sums_beyond_the_fixed_point_range_through_its_float_fallback() {
    fn large(r: usize, t: u64, len: usize) -> Vec<f32> {
        (0..len).map(|i| match (i + t as usize) % 5 {
            0 => [15.0, -15.0, 10.0, 1.5][r % 4],
            1 => 21.4748,
            2 => 1e6 * (r as f32 + 1.0),
            3 => -3.5e30,
            _ => 0.25,
        }).collect()
    }
    for loss in [0.0, 0.01] {
        let completed = run_values(json!({"scheme": "atp", "ina": {"timeout_ps": 200 * US}}), &[0, 1, 4, 5], &[6], 2, 300, Net { loss, memory: MEMORY }, &large);
        assert!(completed.iter().all(|&c| c > 0), "{completed:?}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, failure_persistence: None, ..Default::default() })]

    /// Random sizes, values from tiny to far beyond ATP's fixed-point range, loss from 0 to
    /// 1 %, pools from scarce to ample: every result is the float64 sum within the scheme's
    /// documented bound, and no aggregator is held after the job.
    #[test]
    fn every_scheme_sums_random_tensors_within_its_bound(
        scheme in 0usize..4,
        len in 1usize..700,
        magnitude in -6i32..32,
        seed in 0u64..1000,
        loss in proptest::sample::select(vec![0.0, 0.002, 0.01]),
        slots in proptest::sample::select(vec![4u64, 64, 4096]),
    ) {
        let value = move |r: usize, t: u64, len: usize| -> Vec<f32> {
            (0..len).map(|i| {
                let h = (seed ^ (r as u64) << 40 ^ t << 20 ^ i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
                let unit = (h % 2001) as f32 / 1000.0 - 1.0;
                unit * 10f32.powi(magnitude.min(30) * (i % 3) as i32 / 2)
            }).collect()
        };
        let (config, servers): (Value, &[NodeId]) = match scheme {
            0 => (json!({"scheme": "atp", "ina": {"timeout_ps": 200 * US}}), &[6]),
            1 => (json!({"scheme": "switchml", "ina": {"timeout_ps": 100 * US, "pool_slots": slots.min(64)}}), &[]),
            2 => (json!({"scheme": "ring"}), &[]),
            _ => (json!({"scheme": "ps", "partition_bytes": 1024}), &[6]),
        };
        let workers: &[NodeId] = if scheme == 1 { &[0, 1, 2, 3] } else { &[0, 1, 4, 5] };
        // ATP's pool: 272 B an aggregator; SwitchML's slots: 280 B.
        run_values(config, workers, servers, 2, len, Net { loss, memory: slots * 280 }, &value);
    }
}

#[test]
fn atp_tree_mode_needs_a_driver_that_knows_its_routes() {
    // This view, like the UDP runtime's, has no `route_path`: the error names the field.
    let job = JobSpec { id: 1, workers: vec![0, 1, 4], servers: vec![7], config: json!({"scheme": "atp", "ina": {"levels": "tree"}}), worker_port: 7, server_port: 8 };
    let e = job.scheme().unwrap().plan(&job, &View { memory: MEMORY }).err().expect("refused");
    assert_eq!(e.field, "ina.levels", "{e}");
}
