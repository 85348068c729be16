//! One job, two drivers: the simulator's and the UDP runtime's views of the same network give
//! the same plan through the scheme registry (the same host endpoints with the same
//! configurations, the same admissions at every switch, and programs sized alike).

use inalab_core::NodeId;
use inalab_net::control::{JobSpec, NetworkSpec, RuntimeView, ServerSpec, SwitchSpec, WorkerSpec, PROTOCOL_PORT};
use inalab_scheme::{JobSpec as SchemeJob, NetView, Plan};
use inalab_sim::setup::{scheme_jobs, SimView};
use serde_json::{json, Value};

const MEMORY: u64 = 272 * 1000;

/// Two racks of four hosts under one spine; `programmable` switches ("tor": the leaves).
fn sim_spec(jobs: Vec<Value>, programmable: &str) -> inalab_sim::SimSpec {
    let topology = json!({"shape": {"kind": "leaf_spine", "leaves": 2, "spines": 1, "hosts_per_leaf": 4, "switch_ports": 64,
                                    "host_rate_bps": 100_000_000_000u64, "fabric_rate_bps": 100_000_000_000u64, "link_delay_ps": 1_000_000},
                          "programmable": programmable});
    let spec = json!({
        "name": "parity", "seed": 1, "payload": false, "stop_ps": 1_000_000_000u64, "topology": topology,
        "network": {"buffer_bytes": 1 << 20, "ecn_threshold_bytes": 1 << 18, "routing": {"kind": "ecmp"}, "aggregator_memory_bytes": MEMORY},
        "jobs": jobs, "metrics": {"bin_ps": 1_000_000_000u64},
    });
    inalab_sim::parse_spec(&spec.to_string()).expect("valid spec")
}

fn job(scheme: Value, workers: &[&str], servers: &[&str]) -> Value {
    let mut j = json!({"id": 0, "name": "j", "workers": workers, "servers": servers,
                       "workload": {"kind": "allreduce", "bytes": 4096, "iterations": 1}, "start_ps": 0, "jitter_ps": 0});
    for (k, v) in scheme.as_object().expect("an object") {
        j[k] = v.clone();
    }
    j
}

/// Endpoints as (host, role, configuration), admissions as (switch, program, state, field).
fn describe(plan: &Plan) -> (Vec<String>, Vec<String>) {
    let eps = plan.endpoints.iter().map(|e| format!("{} {:?} {}", e.host, e.role, e.config)).collect();
    let adms = plan.admissions.iter().map(|a| format!("{} {} {} {}", a.switch, a.program, a.state.describe(), a.field)).collect();
    (eps, adms)
}

/// Plans job 0 of `jobs` with the simulator's view, and with the runtime's view from every
/// switch the plan admits at, and checks that they agree.
fn check(jobs: Vec<Value>) {
    check_on(jobs, "tor")
}

fn check_on(jobs: Vec<Value>, programmable: &str) {
    let spec = sim_spec(jobs, programmable);
    let topo = inalab_topo::build(&spec.topology).expect("valid topology");
    let mut job: SchemeJob = scheme_jobs(&spec, &topo).expect("valid jobs").remove(0);
    // Ports are each driver's choice (the simulator's differ per job, the runtime's are one
    // UDP-level port): compare plans under the runtime's, everything else as each driver has it.
    (job.worker_port, job.server_port) = (PROTOCOL_PORT, PROTOCOL_PORT);
    let scheme = job.scheme().expect("a registered scheme");
    let mut sim_view = SimView::new(&topo, &spec.network);
    sim_view.join_shares(&job).expect("shares");
    let sim_plan = scheme.plan(&job, &sim_view).expect("the simulator plans the job");
    let (sim_eps, sim_adms) = describe(&sim_plan);

    // The runtime's spec of the same job: racks are the hosts' switches, every switch the
    // simulator may aggregate at is listed with its memory.
    let rack = |h: NodeId| topo.host_switch(h);
    let switches: Vec<SwitchSpec> = topo.switches().filter(|&s| sim_view.programmable(s)).map(|s| SwitchSpec { node: s, memory_bytes: MEMORY }).collect();
    let rt = JobSpec {
        job: job.id,
        config: scheme.normalize(&job.config).expect("a valid configuration"),
        workers: job.workers.iter().map(|&w| WorkerSpec { node: w, udp: "127.0.0.1:1".parse().unwrap(), rack: rack(w) }).collect(),
        servers: job.servers.iter().map(|&s| ServerSpec { node: s, rack: rack(s) }).collect(),
        switches,
        key: String::new(),
        // The deployment's names and links, as `inalab emulate` gives them.
        network: Some(NetworkSpec {
            names: topo.nodes.iter().enumerate().map(|(i, n)| (n.name.clone(), i as NodeId)).collect(),
            links: topo.links.iter().map(|l| [l.a, l.b]).collect(),
        }),
        lanes: 1,
    };
    let rt_job = rt.scheme_job();
    assert_eq!((&rt_job.workers, &rt_job.servers), (&job.workers, &job.servers));
    // The runtime's own path: a host (worker, PS) plans with no ports, a switch with its own.
    let host_plan = rt.plan(None, &|_| None).expect("the runtime plans the job");
    assert_eq!(describe(&host_plan).0, sim_eps, "host endpoints and their configurations");
    assert_eq!(host_plan.paths, sim_plan.paths, "fixed paths");
    assert_eq!(host_plan.trees, sim_plan.trees, "multicast trees");
    assert!(!sim_eps.is_empty());
    let mut rt_adms = vec![];
    for s in topo.switches() {
        let ports = |h: NodeId| topo.port_to(s, h);
        let view = RuntimeView::new(&rt, Some(s), &ports);
        assert_eq!(view.memory_bytes(s), sim_view.memory_bytes(s), "programs are sized alike at switch {s}");
        assert_eq!(view.programmable(s), sim_view.programmable(s), "switch {s}");
        let plan = rt.plan(Some(s), &ports).expect("the runtime plans the job at a switch");
        rt_adms.extend(describe(&plan).1.into_iter().filter(|a| a.starts_with(&format!("{s} "))));
    }
    rt_adms.sort();
    let mut sim_adms = sim_adms;
    sim_adms.sort();
    assert_eq!(rt_adms, sim_adms, "admissions at every switch");
}

#[test]
fn atp_across_two_racks_plans_alike() {
    // Workers in both racks, the PS in rack 1: level 1 at leaf0, level 2 and multicast at leaf1.
    check(vec![job(json!({"scheme": "atp", "ina": {"timeout_ps": 5_000_000}}), &["h0", "h1", "h4"], &["h5"])]);
}

#[test]
fn dsa_with_its_ps_in_another_rack_plans_alike() {
    // The job aggregates at the PS's switch (leaf1), which every gradient passes.
    check(vec![job(json!({"scheme": "dsa", "ina": {"policy": "preempt-half"}}), &["h0", "h1", "h4"], &["h5"])]);
}

#[test]
fn canary_on_every_switch_plans_alike() {
    check_on(vec![job(json!({"scheme": "canary", "ina": {"table": "static"}}), &["h0", "h1", "h4", "h6"], &[])], "all");
}

#[test]
fn grid_with_its_policy_paths_and_result_tree_plans_alike() {
    // h0 and h1 aggregate at leaf0; h4 at leaf0 too, over a path that passes leaf1 and spine0
    // twice; the PS h5 multicasts its results (the tree needs the network's links).
    let path = |target: &str, p: &[&str]| json!({"target": target, "path": p});
    let policy = json!({"workers": [path("leaf0", &["h0", "leaf0", "spine0", "leaf1", "h5"]), path("leaf0", &["h1", "leaf0", "spine0", "leaf1", "h5"]),
                                    path("leaf0", &["h4", "leaf1", "spine0", "leaf0", "spine0", "leaf1", "h5"])]});
    check(vec![job(json!({"scheme": "grid", "policy": policy}), &["h0", "h1", "h4"], &["h5"])]);
}

#[test]
fn switchml_plans_alike() {
    check(vec![job(json!({"scheme": "switchml", "ina": {"pool_slots": 64}}), &["h0", "h1", "h2"], &[])]);
}

#[test]
fn host_only_schemes_plan_alike() {
    check(vec![job(json!({"scheme": "ring"}), &["h0", "h1", "h4"], &[])]);
    check(vec![job(json!({"scheme": "hierarchical"}), &["h0", "h1", "h4", "h5"], &[])]);
    check(vec![job(json!({"scheme": "ps", "partition_bytes": 1024}), &["h0", "h4"], &["h5"])]);
    check(vec![job(json!({"scheme": "ps_sharded"}), &["h0", "h4"], &[])]);
}
