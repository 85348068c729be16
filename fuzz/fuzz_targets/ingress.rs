//! A switch's ingress past the tag check: frames from the fuzzer go, decoded, to the switch
//! programs (SwitchML and ATP, sharing one switch) with a job of each admitted as the runtime
//! admits it; the programs must count and drop or handle whatever comes, never panic.
#![no_main]
use inalab_core::{frame, Programs, SwitchProgram};
use inalab_net::control::{JobSpec, RuntimeView, ServerSpec, SwitchSpec, WorkerSpec};
use inalab_testkit::IdleCtx;
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fn programs() -> Programs {
    let switch = SwitchSpec { node: 1, memory_bytes: 20_000 };
    let mut progs = Programs::new();
    for name in ["switchml", "atp"] {
        let me = JobSpec { job: 0, config: serde_json::Value::Null, workers: vec![], servers: vec![], switches: vec![switch.clone()], key: String::new(), network: None };
        let view = RuntimeView::new(&me, Some(1), &|_| None);
        let scheme = inalab_scheme::by_name(name).unwrap();
        progs.install(scheme.name(), scheme.program(1, &view).unwrap()).unwrap();
    }
    for (job, name) in [(1u32, "switchml"), (2, "atp")] {
        let scheme = inalab_scheme::by_name(name).unwrap();
        let config = scheme.normalize(&json!({"scheme": name, "ina": {"timeout_ps": 1_000_000_000u64, "pool_slots": 8}})).or_else(|_| scheme.normalize(&json!({"scheme": name}))).unwrap();
        let workers = (0..3).map(|r| WorkerSpec { node: 65537 + r, udp: "127.0.0.1:1".parse().unwrap(), rack: 1 }).collect();
        let servers = if name == "atp" { vec![ServerSpec { node: 2, rack: 1 }] } else { vec![] };
        let spec = JobSpec { job, config, workers, servers, switches: vec![switch.clone()], key: String::new(), network: None };
        let plan = spec.plan(Some(1), &|n| (n >= 65537).then(|| (n - 65537) as u16)).unwrap();
        for adm in plan.admissions.into_iter().filter(|a| a.switch == 1) {
            progs.admit_at(adm.program, job, adm.state).unwrap();
        }
    }
    progs
}

fuzz_target!(|data: &[u8]| {
    let mut progs = programs();
    let ctx = IdleCtx { node: 1, ports: 4 };
    let mut actions = vec![];
    // Frames separated by a 2-byte length, each from one of the first ports.
    let mut rest = data;
    let mut now = 0u64;
    while rest.len() > 3 {
        let port = (rest[0] % 4) as u16;
        let len = (rest[1] as usize) | ((rest[2] as usize) << 8);
        let body = &rest[3..];
        let (f, r) = body.split_at(len.min(body.len()));
        rest = r;
        now += 1_000;
        if let Ok(pkt) = frame::decode(f) {
            progs.on_packet(now, &ctx, port, pkt, &mut actions);
            actions.clear();
        }
    }
    let _ = progs.aggregators_in_use();
});
