//! Workloads: training jobs (layer-by-layer compute overlapped with communication),
//! allreduce benchmarks, raw datagram flows and random-uniform background traffic. This is
//! the application side of the simulated hosts; it talks to protocols only through
//! `AppRequest`s and `HostEvent`s, as PyTorch does through the UDP runtime.

use crate::events::Ev;
use crate::setup::{flow_ports, host_named, set_up_jobs};
use crate::spec::{BackgroundPattern, JobSpec, PayloadValues, SimSpec, Workload};
use crate::world::{Call, Owner, World};
use crate::SimError;
use inalab_core::{splitmix64, AppRequest, Endpoint, HostEvent, NodeId, Payload, TensorAttrs, Time};
use inalab_host::{DatagramConfig, DatagramSender, DatagramSink, Quantization};
use inalab_scheme::Role;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use std::collections::HashMap;

const BG_SEND_PORT: u16 = 3000;
const BG_SINK_PORT: u16 = 3001;

#[derive(Default)]
pub struct Workloads {
    pub jobs: Vec<JobState>,
    pub flows: Vec<FlowState>,
    /// Boxed: the event loop moves `Workloads` out of the simulator and back on every call
    /// into it (2.6 M drop notices in the 64-to-1 incast benchmark), and a small struct moves
    /// in registers where this one, inline, took a `memcpy` each way.
    pub background: Option<Box<BackgroundState>>,
    /// Jobs and flows not finished yet; the run completes when both reach zero.
    open_jobs: usize,
    open_flows: usize,
}

/// One compute step of a worker: forward or backward of a layer.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    Fwd(usize),
    Bwd(usize),
    /// All iterations computed; waiting for the last results.
    Finished,
}

pub struct WorkerState {
    pub host: NodeId,
    pub ep: u16,
    iter: u32,
    step: Step,
    computing: bool,
    /// Results received so far for each layer (they arrive in iteration order).
    received: Vec<u32>,
    /// With a send order: layers of this iteration computed and not yet submitted, and how
    /// far along the order this iteration's submissions are.
    computed: Vec<bool>,
    sent_in_order: usize,
    /// Layers received per iteration.
    layers_in: Vec<u32>,
    /// Allreduces submitted and not yet done, since when some are, and the time so far with
    /// at least one outstanding (the job's communication time, DSA's Fig. 10).
    outstanding: u32,
    busy_since: Time,
    pub busy_ps: Time,
    rng: Xoshiro256PlusPlus,
    /// Its host failed: it computes and counts no more.
    pub dead: bool,
}

impl WorkerState {
    /// A worker of a job with `layers` layers and `iterations` iterations, about to compute
    /// its first forward pass; `seed` seeds its compute jitter.
    fn new(host: NodeId, ep: u16, layers: usize, iterations: u32, seed: u64) -> Self {
        WorkerState {
            host,
            ep,
            iter: 0,
            step: Step::Fwd(0),
            computing: false,
            received: vec![0; layers],
            computed: vec![false; layers],
            sent_in_order: 0,
            layers_in: vec![0; iterations as usize],
            outstanding: 0,
            busy_since: 0,
            busy_ps: 0,
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            dead: false,
        }
    }
}

pub struct JobState {
    pub spec: JobSpec,
    /// (bytes, forward ps, backward ps) per layer, in forward order.
    layers: Vec<(u64, Time, Time)>,
    pub iterations: u32,
    pub workers: Vec<WorkerState>,
    /// Live workers that have every result of iteration i, how many are live, and the dead
    /// ones' ranks in the order they died.
    iter_workers: Vec<u32>,
    live: u32,
    died: Vec<u32>,
    pub iter_end: Vec<Time>,
    pub tensors_done: u64,
    pub finished_at: Option<Time>,
    pub failures: Vec<String>,
    pub payload_checked: u64,
    pub payload_errors: u64,
    /// How the job's workers quantize floats (payload mode's float check).
    quantization: Quantization,
    /// Per layer entry, the 1-based model layer it is part of (partitions share one).
    groups: Vec<u32>,
    /// Layer indexes in the order their gradients are submitted (`None`: as computed).
    send_order: Option<Vec<usize>>,
    /// One iteration's communication time (all gradient bytes at the workers' link rate)
    /// over its computation time; 1 without compute.
    comm_over_comp: f64,
    /// The workers' link rate, for the time-left estimate.
    rate_bps: u64,
    /// The job's scheme and configuration, asked for each tensor's priority.
    scheme: Option<(&'static dyn inalab_scheme::Scheme, serde_json::Value)>,
    /// Payload mode: expected sums by tensor id, the ranks that checked them, and the first
    /// result's digest (every worker must get the same); dropped once every live worker checked.
    expected: HashMap<u64, (Expected, Vec<u32>, Option<u64>)>,
}

/// A result's fingerprint, to check that every worker got the same one.
fn payload_digest(p: &Payload) -> u64 {
    let bits: Box<dyn Iterator<Item = u32>> = match p {
        Payload::I32(v) => Box::new(v.iter().map(|&x| x as u32)),
        Payload::F32(v) => Box::new(v.iter().map(|x| x.to_bits())),
    };
    bits.fold(0x9E37_79B9_7F4A_7C15, |h, x| splitmix64(h ^ x as u64))
}

/// What a tensor's result must be.
enum Expected {
    /// Integer inputs: exactly this sum.
    Exact(Payload),
    /// Float inputs: these float64 sums, each within `bound`.
    Within { sums: Vec<f64>, bound: f64 },
}

impl Expected {
    /// The sum over the workers of rank `ranks`.
    fn new(job: u32, ranks: &[u32], tensor: u64, len: usize, values: PayloadValues, q: Quantization) -> Self {
        let workers = ranks.len() as u32;
        match values {
            PayloadValues::Int => {
                let mut sum = Payload::I32(vec![0; len]);
                ranks.iter().for_each(|&r| sum.add_at(0, &input(job, r, tensor, len, values)));
                Expected::Exact(sum)
            }
            PayloadValues::Float => {
                let (mut sums, mut max_abs) = (vec![0f64; len], 0f64);
                for &r in ranks {
                    let Payload::F32(v) = input(job, r, tensor, len, values) else { unreachable!("float inputs") };
                    for (s, &x) in sums.iter_mut().zip(&v) {
                        *s += x as f64;
                        max_abs = max_abs.max((x as f64).abs());
                    }
                }
                Expected::Within { sums, bound: q.error_bound(workers as usize, max_abs) }
            }
        }
    }

    fn matches(&self, got: &Payload) -> bool {
        match (self, got) {
            (Expected::Exact(sum), got) => got == sum,
            (Expected::Within { sums, bound }, Payload::F32(v)) => {
                v.len() == sums.len() && v.iter().zip(sums).all(|(&g, &s)| (g as f64 - s).abs() <= *bound)
            }
            _ => false,
        }
    }
}

impl JobState {
    /// "training" or "allreduce" (`JobResult::kind`).
    pub fn kind(&self) -> &'static str {
        match self.spec.workload {
            Workload::Training { .. } => "training",
            Workload::Allreduce { .. } => "allreduce",
        }
    }

    pub fn bytes_per_iteration(&self) -> u64 {
        self.layers.iter().map(|l| l.0).sum()
    }
    fn total_tensors(&self) -> u64 {
        self.workers.len() as u64 * self.iterations as u64 * self.layers.len() as u64
    }
}

pub struct FlowState {
    /// All packets sent and each delivered or dropped.
    pub complete: bool,
    pub start: Time,
    /// When the flow completed: its last packet's arrival or drop.
    pub ended_at: Option<Time>,
    pub src: NodeId,
    pub dst: NodeId,
    pub bytes: u64,
    src_ep: u16,
    pub sent_done: bool,
    pub packets_sent: u64,
    pub packets_received: u64,
    pub packets_dropped: u64,
    pub bytes_received: u64,
    pub first_rx: Option<Time>,
    pub last_rx: Option<Time>,
}

pub struct BackgroundState {
    hosts: Vec<NodeId>,
    /// Open loop: message start to message start. Closed loop: the idle time after a message
    /// left the NIC.
    gap: Vec<Time>,
    closed_loop: bool,
    message_bytes: u64,
    rng: Xoshiro256PlusPlus,
    next_id: u64,
    pattern: BackgroundPattern,
    /// Permutation: each host's next round, and the rounds some host has still to send, with
    /// how many hosts sent theirs (dropped once all did).
    round_of: Vec<u64>,
    rounds: std::collections::BTreeMap<u64, (Vec<u32>, usize)>,
    seed: u64,
}

impl BackgroundState {
    /// The receiver (an index into `hosts`) of host `i`'s next message.
    fn next_peer(&mut self, i: usize) -> usize {
        let n = self.hosts.len();
        match self.pattern {
            BackgroundPattern::Uniform => {
                let k = self.rng.random_range(0..n - 1);
                if k >= i { k + 1 } else { k }
            }
            BackgroundPattern::Permutation => {
                let r = self.round_of[i];
                self.round_of[i] += 1;
                let seed = self.seed;
                let (perm, sent) = self.rounds.entry(r).or_insert_with(|| (derangement(n, splitmix64(seed ^ r.wrapping_mul(0x9E37_79B9_7F4A_7C15))), 0));
                let peer = perm[i] as usize;
                *sent += 1;
                if *sent == n {
                    self.rounds.remove(&r);
                }
                peer
            }
        }
    }
}

/// A uniformly drawn derangement of `0..n` (n >= 2): a shuffle, redrawn until no element
/// stays in place (about e = 2.7 draws on average).
fn derangement(n: usize, seed: u64) -> Vec<u32> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut p: Vec<u32> = (0..n as u32).collect();
    loop {
        for i in (1..n).rev() {
            p.swap(i, rng.random_range(0..=i));
        }
        if p.iter().enumerate().all(|(i, &v)| v as usize != i) {
            return p;
        }
    }
}

fn input_hash(job: u32, rank: u32, tensor: u64, i: usize) -> u64 {
    splitmix64(((job as u64) << 48) ^ ((rank as u64) << 32) ^ (tensor << 20) ^ i as u64)
}

/// Magnitude classes of float payloads: small, unit, around ATP's fixed-point range (+/-21.47
/// at scale 1e8, so sums of a few workers leave it), far beyond it, and near the top of
/// float32 (1024 workers x 1e35 still sums to a finite float32).
const FLOAT_MAGNITUDES: [f32; 5] = [1e-3, 1.0, 20.0, 1e4, 1e35];

/// Payload-mode input of worker `rank` for tensor `tensor` (`len` values). Integers: small
/// ones, whose sum over any number of workers the papers use stays far from overflow, so
/// results are exact. Floats: uniform in +/-m, m the `(tensor + job) % 5`-th of
/// [`FLOAT_MAGNITUDES`], so five tensors of a job cover every class.
fn input(job: u32, rank: u32, tensor: u64, len: usize, values: PayloadValues) -> Payload {
    match values {
        PayloadValues::Int => Payload::I32((0..len).map(|i| (input_hash(job, rank, tensor, i) % 2001) as i32 - 1000).collect()),
        PayloadValues::Float => {
            let m = FLOAT_MAGNITUDES[((tensor + job as u64) % FLOAT_MAGNITUDES.len() as u64) as usize];
            // 24 random bits: a uniform float32 in [-1, 1).
            let unit = |h: u64| ((h >> 40) as f32 / (1u64 << 23) as f32) - 1.0;
            Payload::F32((0..len).map(|i| m * unit(input_hash(job, rank, tensor, i))).collect())
        }
    }
}

/// A job's layers (bytes, forward and backward time), iterations, layer groups and send order.
type JobWorkload = (Vec<(u64, Time, Time)>, u32, Vec<u32>, Option<Vec<usize>>);

/// Every job's workload, its send order checked.
fn job_workloads(spec: &SimSpec) -> Result<Vec<JobWorkload>, SimError> {
    let mut workloads = vec![];
    for (j, js) in spec.jobs.iter().enumerate() {
        let field = format!("jobs[{j}]");
        let (layers, iterations, groups, send_order) = match &js.workload {
            Workload::Training { layers, iterations, send_order } => {
                let groups = layers.iter().enumerate().map(|(i, l)| l.group.unwrap_or(i as u32 + 1)).collect();
                (layers.iter().map(|l| (l.bytes, l.fwd_ps, l.bwd_ps)).collect::<Vec<_>>(), *iterations, groups, send_order.clone())
            }
            Workload::Allreduce { bytes, iterations } => (vec![(*bytes, 0, 0)], *iterations, vec![1], None),
        };
        if let Some(order) = &send_order {
            let mut sorted = order.clone();
            sorted.sort_unstable();
            if !sorted.iter().copied().eq(0..layers.len() as u32) {
                return Err(SimError::new(format!("{field}.workload.send_order"), format!("must list every layer index 0..{} once, got {order:?}", layers.len())));
            }
        }
        workloads.push((layers, iterations, groups, send_order.map(|o| o.into_iter().map(|i| i as usize).collect::<Vec<_>>())));
    }
    Ok(workloads)
}

impl Workloads {
    /// Sets every job, flow and background source of `spec` up in `w`.
    pub(crate) fn set_up(&mut self, spec: &SimSpec, world: &mut dyn World) -> Result<(), SimError> {
        let workloads = job_workloads(spec)?;
        let setup = set_up_jobs(spec, world.topology())?;
        for (j, ((job, plan), workload)) in setup.jobs.into_iter().zip(workloads).enumerate() {
            self.add_job(spec, j, job, plan, workload, world)?;
        }
        for (switch, programs) in setup.programs {
            world.install_ina(switch, programs);
        }
        let parts = world.topology().parts();
        self.add_flows(spec, &parts, world)?;
        self.add_background(spec, &parts, world)
    }

    /// Job `j`'s endpoints, fixed paths and trees from its plan, and its state.
    fn add_job(&mut self, spec: &SimSpec, j: usize, job: inalab_scheme::JobSpec, plan: inalab_scheme::Plan, workload: JobWorkload, world: &mut dyn World) -> Result<(), SimError> {
        let (layers, iterations, groups, send_order) = workload;
        let js = &spec.jobs[j];
        let mut worker_eps = vec![0u16; job.workers.len()];
        let mut eps_by_role = vec![];
        // The scheme's fixed paths (GRID's policy) and multicast trees for its endpoints'
        // packets, in the description the runtime switch forwards by too.
        let routes = inalab_scheme::PlanRoutes::of(&plan, |role| plan.endpoints.iter().find(|e| e.role == role).map(|e| e.host));
        for ep in plan.endpoints {
            let owner = match ep.role {
                Role::Worker { rank } => Owner::Worker { job: job.id, rank },
                Role::Server { .. } => Owner::Server { job: job.id },
            };
            world.admit_host(ep.host, job.id);
            let e = world.add_endpoint(ep.host, ep.proto, owner);
            if let Role::Worker { rank } = ep.role {
                worker_eps[rank as usize] = e;
            }
            eps_by_role.push((ep.role, ep.host, e));
        }
        let endpoint_of = |role: Role| eps_by_role.iter().find(|(r, _, _)| *r == role).map(|&(_, host, e)| (host, e));
        for (role, nodes) in &routes.paths {
            let (host, e) = endpoint_of(*role).expect("a route's role has an endpoint");
            let id = world.install_path(&format!("jobs[{j}].policy"), nodes)?;
            world.set_endpoint_path(host, e, id);
        }
        for tree in &routes.trees {
            let (host, e) = endpoint_of(tree.role).expect("a route's role has an endpoint");
            world.install_tree(&format!("jobs[{j}]"), host, e, tree)?;
        }
        let nl = layers.len();
        let config = serde_json::Value::Object(js.config.clone());
        let scheme = inalab_scheme::scheme_of(&config).ok();
        let topo = world.topology();
        let rate_bps = topo.links[topo.nodes[job.workers[0] as usize].ports[0].link as usize].rate_bps.max(1);
        let comm_ps = layers.iter().map(|l| l.0 as f64 * 8.0 * inalab_core::time::S as f64 / rate_bps as f64).sum::<f64>();
        let comp_ps = layers.iter().map(|l| (l.1 + l.2) as f64).sum::<f64>();
        let comm_over_comp = if comp_ps > 0.0 { comm_ps / comp_ps } else { 1.0 };
        let ws = job
            .workers
            .iter()
            .zip(worker_eps)
            .enumerate()
            .map(|(r, (&host, ep))| WorkerState::new(host, ep, nl, iterations, splitmix64(spec.seed ^ ((j as u64) << 32) ^ r as u64)))
            .collect();
        self.jobs.push(JobState {
            spec: js.clone(),
            layers,
            iterations,
            workers: ws,
            iter_workers: vec![0; iterations as usize],
            live: job.workers.len() as u32,
            died: vec![],
            iter_end: vec![],
            tensors_done: 0,
            finished_at: None,
            failures: vec![],
            payload_checked: 0,
            payload_errors: 0,
            quantization: scheme.map_or(Quantization::None, |s| s.quantization(&config)),
            comm_over_comp,
            rate_bps,
            groups,
            send_order,
            scheme: scheme.map(|s| (s, config)),
            expected: HashMap::new(),
        });
        if iterations == 0 {
            self.jobs[j].finished_at = Some(js.start_ps);
        } else {
            self.open_jobs += 1;
            world.schedule(js.start_ps, Ev::JobStart { job: j as u32 });
        }
        Ok(())
    }

    /// The point-to-point flows of `spec.flows`.
    fn add_flows(&mut self, spec: &SimSpec, parts: &[u32], world: &mut dyn World) -> Result<(), SimError> {
        for (f, fs) in spec.flows.iter().enumerate() {
            let field = format!("flows[{f}]");
            let host = |name: &String, what: &str| host_named(world.topology(), format!("{field}.{what}"), name);
            let (src, dst) = (host(&fs.src, "src")?, host(&fs.dst, "dst")?);
            if src == dst {
                return Err(SimError::new(format!("{field}.dst"), "a flow needs two different hosts"));
            }
            crate::setup::connected(world.topology(), &parts, &field, [src, dst].iter())?;
            let (sp, dp) = flow_ports(f as u32);
            let src_ep = world.add_endpoint(
                src,
                Box::new(DatagramSender::new(Endpoint { host: src, port: sp }, DatagramConfig { packet_bytes: fs.packet_bytes }).map_err(|e| SimError::new(format!("{field}.packet"), e.0))?),
                Owner::FlowSrc { flow: f as u32 },
            );
            world.add_endpoint(dst, Box::new(DatagramSink::new(Endpoint { host: dst, port: dp })), Owner::FlowDst { flow: f as u32 });
            if let Some(names) = &fs.path {
                if names.first() != Some(&fs.src) || names.last() != Some(&fs.dst) {
                    return Err(SimError::new(format!("{field}.path"), "must start at the flow's src and end at its dst"));
                }
                let nodes = names.iter().map(|n| world.topology().find(n).ok_or_else(|| SimError::new(format!("{field}.path"), format!("no node named {n:?}")))).collect::<Result<Vec<_>, _>>()?;
                let id = world.install_path(&format!("{field}.path"), &nodes)?;
                world.set_endpoint_path(src, src_ep, id);
            }
            self.flows.push(FlowState {
                complete: false,
                start: fs.start_ps,
                ended_at: None,
                src,
                dst,
                bytes: fs.bytes,
                src_ep,
                sent_done: false,
                packets_sent: fs.bytes.div_ceil(fs.packet_bytes as u64),
                packets_received: 0,
                packets_dropped: 0,
                bytes_received: 0,
                first_rx: None,
                last_rx: None,
            });
            self.open_flows += 1;
            world.schedule(fs.start_ps, Ev::FlowStart { flow: f as u32 });
        }
        Ok(())
    }

    /// The background traffic of `spec.background`, if any.
    fn add_background(&mut self, spec: &SimSpec, parts: &[u32], world: &mut dyn World) -> Result<(), SimError> {
    let Some(bg) = &spec.background else { return Ok(()) };
        if !(bg.load > 0.0 && bg.load <= 1.0) {
            return Err(SimError::new("background.load", format!("must be a fraction of line rate in (0, 1], got {}", bg.load)));
        }
        if bg.message_bytes == 0 {
            return Err(SimError::new("background.message", "must be a positive size"));
        }
        let hosts = bg.hosts.iter().enumerate().map(|(i, name)| host_named(world.topology(), format!("background.hosts[{i}]"), name)).collect::<Result<Vec<_>, _>>()?;
        if hosts.len() < 2 {
            return Err(SimError::new("background.hosts", "background traffic needs at least two hosts"));
        }
        crate::setup::connected(world.topology(), &parts, "background.hosts", hosts.iter())?;
        let mut gap = vec![];
        for &h in &hosts {
            let send = DatagramSender::new(Endpoint { host: h, port: BG_SEND_PORT }, DatagramConfig { packet_bytes: bg.packet_bytes }).map_err(|e| SimError::new("background.packet", e.0))?;
            world.add_endpoint(h, Box::new(send), Owner::Background);
            world.add_endpoint(h, Box::new(DatagramSink::new(Endpoint { host: h, port: BG_SINK_PORT })), Owner::Background);
            let rate = world.topology().links[world.topology().nodes[h as usize].ports[0].link as usize].rate_bps;
            // Message start to message start, so the offered load is `load` x line rate;
            // closed loop, the time left idle after each message for the same duty cycle.
            let busy = inalab_core::time::serialization(bg.message_bytes, rate) as f64;
            gap.push(if bg.closed_loop { busy / bg.load - busy } else { busy / bg.load });
            world.schedule(bg.start_ps, Ev::Background { host: h });
        }
        self.background = Some(Box::new(BackgroundState {
            round_of: vec![0; hosts.len()],
            hosts,
            gap: gap.into_iter().map(|g| g.round() as Time).collect(),
            closed_loop: bg.closed_loop,
            message_bytes: bg.message_bytes,
            rng: Xoshiro256PlusPlus::seed_from_u64(splitmix64(spec.seed ^ 0xB6)),
            next_id: 0,
            pattern: bg.pattern,
            rounds: Default::default(),
            seed: splitmix64(spec.seed ^ 0xB7),
        }));
        Ok(())
    }

    /// Handles what the world tells the workloads.
    pub(crate) fn call(&mut self, call: Call, world: &mut dyn World) {
        match call {
            Call::Event(Ev::ComputeDone { job, rank }) => self.compute_done(job, rank, world),
            Call::Event(Ev::PeerFailed { host, at }) => self.host_failed(host, at, world),
            Call::Event(Ev::JobStart { job }) => self.job_start(job, world),
            Call::Event(Ev::FlowStart { flow }) => self.flow_start(flow, world),
            Call::Event(Ev::Background { host }) => self.background_next(host, world),
            Call::Event(ev) => unreachable!("{ev:?} is the network's"),
            Call::Host { host, owner, ev } => self.host_event(host, owner, ev, world),
            Call::FlowReceived { flow, size } => self.flow_received(flow, size, world),
            Call::FlowDropped { flow } => self.flow_dropped(flow, world),
            Call::Start => self.check_done(world),
        }
    }

    fn host_event(&mut self, host: NodeId, owner: Owner, ev: HostEvent, world: &mut dyn World) {
        match owner {
            Owner::Worker { job, rank } => self.worker_event(job, rank, ev, world),
            Owner::Server { job } => {
                if let HostEvent::Failed { reason, .. } | HostEvent::Rejected { reason, .. } = ev {
                    let name = world.topology().nodes[host as usize].name.clone();
                    self.job_failed(job, format!("server on {name}: {reason}"), world);
                }
            }
            Owner::FlowSrc { flow } => {
                if let HostEvent::Done { .. } = ev {
                    self.flow_sent(flow, world);
                }
            }
            // Closed loop: the sender finished a message (the sink reports `Received`).
            Owner::Background => {
                if let (HostEvent::Done { .. }, Some(bg)) = (&ev, self.background.as_ref().filter(|b| b.closed_loop)) {
                    let i = bg.hosts.iter().position(|&h| h == host).expect("background host");
                    world.schedule(world.now() + bg.gap[i], Ev::Background { host });
                }
            }
            Owner::FlowDst { .. } => {}
        }
    }

    // ---- training jobs -----------------------------------------------------------------

    fn job_start(&mut self, job: u32, world: &mut dyn World) {
        for rank in 0..self.jobs[job as usize].workers.len() as u32 {
            self.advance(job, rank, world);
        }
    }

    /// Starts the worker's next compute step if it is not computing and its inputs are in.
    fn advance(&mut self, job: u32, rank: u32, world: &mut dyn World) {
        let now = world.now();
        let j = &mut self.jobs[job as usize];
        let w = &mut j.workers[rank as usize];
        if w.computing {
            return;
        }
        let dur = match w.step {
            Step::Finished => return,
            Step::Fwd(l) => {
                // The forward pass of layer l needs layer l's result of the previous iteration.
                if w.received[l] < w.iter {
                    return;
                }
                j.layers[l].1
            }
            Step::Bwd(l) => {
                let jitter = j.spec.jitter_ps;
                j.layers[l].2 + if jitter > 0 { w.rng.random_range(0..=jitter) } else { 0 }
            }
        };
        w.computing = true;
        world.schedule(now + dur, Ev::ComputeDone { job, rank });
    }

    fn compute_done(&mut self, job: u32, rank: u32, world: &mut dyn World) {
        let payload = world.payload();
        let j = &mut self.jobs[job as usize];
        if j.workers[rank as usize].dead {
            return;
        }
        let nl = j.layers.len();
        let iters = j.iterations;
        let w = &mut j.workers[rank as usize];
        w.computing = false;
        let mut submits = vec![];
        match w.step {
            Step::Fwd(l) => w.step = if l + 1 < nl { Step::Fwd(l + 1) } else { Step::Bwd(nl - 1) },
            Step::Bwd(l) => {
                // The gradients that go now: this one, or with a send order every computed
                // one next in the order.
                let ready = match &j.send_order {
                    None => vec![l],
                    Some(order) => {
                        w.computed[l] = true;
                        let mut ready = vec![];
                        while let Some(&m) = order.get(w.sent_in_order).filter(|&&m| w.computed[m]) {
                            w.computed[m] = false;
                            w.sent_in_order += 1;
                            ready.push(m);
                        }
                        if w.sent_in_order == nl {
                            w.sent_in_order = 0;
                        }
                        ready
                    }
                };
                for m in ready {
                    let tensor = w.iter as u64 * nl as u64 + m as u64;
                    let bytes = j.layers[m].0;
                    let data = payload.map(|values| input(job, rank, tensor, (bytes / 4) as usize, values));
                    let priority = j.scheme.as_ref().map_or(0, |(s, config)| {
                        // Time left in this iteration: gradients whose result is not in yet at
                        // the link rate, plus the backward passes still to run (DSA spec §1.10).
                        let left_bytes: u64 = (0..nl).filter(|&k| w.received[k] <= w.iter).map(|k| j.layers[k].0).sum();
                        let left_compute: Time = j.layers[..l].iter().map(|x| x.2).sum();
                        let remaining_ps = (left_bytes as u128 * 8 * inalab_core::time::S as u128 / j.rate_bps as u128) as Time + left_compute;
                        let layers = j.groups.iter().copied().max().unwrap_or(1);
                        s.priority(config, &inalab_scheme::TensorContext { layer: j.groups[m], layers, comm_over_comp: j.comm_over_comp, remaining_ps })
                    });
                    // The model layer, counted from the input (partitions share their layer's).
                    let layer = j.groups[m].saturating_sub(1);
                    submits.push((w.host, w.ep, AppRequest::Allreduce { id: tensor, bytes, data, attrs: TensorAttrs { layer, priority } }));
                    if w.outstanding == 0 {
                        w.busy_since = world.now();
                    }
                    w.outstanding += 1;
                }
                if l > 0 {
                    w.step = Step::Bwd(l - 1);
                } else {
                    w.iter += 1;
                    w.step = if w.iter < iters { Step::Fwd(0) } else { Step::Finished };
                }
            }
            Step::Finished => {}
        }
        for (host, ep, req) in submits {
            world.submit(host, ep, req);
        }
        self.advance(job, rank, world);
    }

    fn worker_event(&mut self, job: u32, rank: u32, ev: HostEvent, world: &mut dyn World) {
        match ev {
            HostEvent::Done { id, data } => self.tensor_done(job, rank, id, data, world),
            HostEvent::Failed { id, reason } | HostEvent::Rejected { id, reason } => self.job_failed(job, format!("worker {rank}, tensor {id}: {reason}"), world),
            HostEvent::Received { .. } => {}
        }
    }

    fn tensor_done(&mut self, job: u32, rank: u32, tensor: u64, data: Option<Payload>, world: &mut dyn World) {
        let now = world.now();
        let j = &mut self.jobs[job as usize];
        let nl = j.layers.len() as u64;
        let (iter, layer) = ((tensor / nl) as u32, (tensor % nl) as usize);
        if let (Some(got), Some(values)) = (data, world.payload()) {
            let all: Vec<u32> = (0..j.workers.len() as u32).collect();
            let len = (j.layers[layer].0 / 4) as usize;
            let q = j.quantization;
            let entry = j.expected.entry(tensor).or_insert_with(|| (Expected::new(job, &all, tensor, len, values, q), vec![], None));
            j.payload_checked += 1;
            // After failures a result may sum the survivors of any of them (a request run again
            // over a rebuilt ring, and repaired after a later failure), but every worker must
            // get the same one.
            let survivors = |k: usize| -> Vec<u32> { all.iter().copied().filter(|r| !j.died[..k].contains(r)).collect() };
            let ok = entry.0.matches(&got) || (1..=j.died.len()).any(|k| Expected::new(job, &survivors(k), tensor, len, values, q).matches(&got));
            let digest = payload_digest(&got);
            if !ok || *entry.2.get_or_insert(digest) != digest {
                j.payload_errors += 1;
            }
            entry.1.push(rank);
            if entry.1.iter().filter(|&&r| !j.workers[r as usize].dead).count() as u32 >= j.live {
                j.expected.remove(&tensor);
            }
        }
        j.tensors_done += 1;
        let w = &mut j.workers[rank as usize];
        w.outstanding = w.outstanding.saturating_sub(1);
        if w.outstanding == 0 {
            w.busy_ps += now - w.busy_since;
        }
        w.received[layer] += 1;
        w.layers_in[iter as usize] += 1;
        if w.layers_in[iter as usize] == nl as u32 && !w.dead {
            j.iter_workers[iter as usize] += 1;
            self.iterations_done(job, world);
        }
        self.advance(job, rank, world);
    }

    /// Ends the iterations every live worker has all results of, in order, and the job with
    /// its last.
    fn iterations_done(&mut self, job: u32, world: &mut dyn World) {
        let now = world.now();
        let j = &mut self.jobs[job as usize];
        if j.finished_at.is_some() {
            return;
        }
        while j.iter_end.len() < j.iter_workers.len() && j.iter_workers[j.iter_end.len()] >= j.live {
            j.iter_end.push(now);
        }
        if j.iter_end.len() as u32 == j.iterations {
            j.finished_at = Some(now);
            self.open_jobs -= 1;
            world.release_job(job);
            self.check_done(world);
        }
    }

    /// The membership service says `host` failed: its workers stop counting, and the other
    /// workers of each of its jobs are told; the job goes on over the survivors if every
    /// survivor's protocol does, and fails naming the worker otherwise.
    fn host_failed(&mut self, host: NodeId, at: Time, world: &mut dyn World) {
        let name = world.topology().nodes[host as usize].name.clone();
        for job in 0..self.jobs.len() as u32 {
            let j = &mut self.jobs[job as usize];
            if j.finished_at.is_some() {
                continue;
            }
            let nl = j.layers.len() as u32;
            let mut told = vec![];
            for rank in 0..j.workers.len() {
                let w = &mut j.workers[rank];
                if w.host != host || w.dead {
                    continue;
                }
                w.dead = true;
                j.live -= 1;
                j.died.push(rank as u32);
                for (i, &got) in w.layers_in.iter().enumerate() {
                    j.iter_workers[i] -= (got == nl) as u32;
                }
                told.push(rank as u32);
            }
            let survivors: Vec<(NodeId, u16)> = j.workers.iter().filter(|w| !w.dead && !world.host_failed(w.host)).map(|w| (w.host, w.ep)).collect();
            let mut goes_on = true;
            for &dead in &told {
                for &(h, ep) in &survivors {
                    goes_on &= world.peer_failed(h, ep, dead);
                }
            }
            let j = &self.jobs[job as usize];
            // A server (a PS) of the job: no scheme goes on without it.
            if j.spec.servers.contains(&name) {
                let why = format!("its server on {name} failed at {} ns", at / 1000);
                self.job_failed(job, why, world);
                continue;
            }
            if told.is_empty() {
                continue;
            }
            if j.live == 0 {
                let why = format!("every worker failed (the last, {} on {name}, at {} ns)", told[0], at / 1000);
                self.job_failed(job, why, world);
            } else if !goes_on {
                let scheme = j.scheme.as_ref().map_or("this scheme", |(s, _)| s.name());
                let why = format!("worker {} on {name} failed at {} ns; {scheme} does not go on without a worker", told[0], at / 1000);
                self.job_failed(job, why, world);
            } else {
                self.iterations_done(job, world);
            }
        }
    }

    fn job_failed(&mut self, job: u32, reason: String, world: &mut dyn World) {
        let j = &mut self.jobs[job as usize];
        j.failures.push(reason);
        // A failed job will not finish; stop waiting for it.
        if j.finished_at.is_none() {
            j.finished_at = Some(world.now());
            self.open_jobs -= 1;
            world.release_job(job);
        }
        self.check_done(world);
    }

    // ---- flows and background ------------------------------------------------------------

    fn flow_start(&mut self, flow: u32, world: &mut dyn World) {
        let f = &self.flows[flow as usize];
        let (src, ep, bytes) = (f.src, f.src_ep, f.bytes);
        let dst = Endpoint { host: f.dst, port: flow_ports(flow).1 };
        world.submit(src, ep, AppRequest::Send { id: flow as u64, dst, bytes });
    }

    fn flow_sent(&mut self, flow: u32, world: &mut dyn World) {
        self.flows[flow as usize].sent_done = true;
        self.flow_progress(flow, world);
    }

    fn flow_received(&mut self, flow: u32, size: u32, world: &mut dyn World) {
        let now = world.now();
        let f = &mut self.flows[flow as usize];
        f.packets_received += 1;
        f.bytes_received += size as u64;
        f.first_rx.get_or_insert(now);
        f.last_rx = Some(now);
        self.flow_progress(flow, world);
    }

    fn flow_dropped(&mut self, flow: u32, world: &mut dyn World) {
        self.flows[flow as usize].packets_dropped += 1;
        self.flow_progress(flow, world);
    }

    fn flow_progress(&mut self, flow: u32, world: &mut dyn World) {
        let f = &mut self.flows[flow as usize];
        if !f.complete && f.sent_done && f.packets_received + f.packets_dropped >= f.packets_sent {
            f.complete = true;
            f.ended_at = Some(world.now());
            self.open_flows -= 1;
            self.check_done(world);
        }
    }

    fn background_next(&mut self, host: NodeId, world: &mut dyn World) {
        let Some(bg) = self.background.as_mut() else { return };
        let i = bg.hosts.iter().position(|&h| h == host).expect("background host");
        let peer = bg.next_peer(i);
        let dst = bg.hosts[peer];
        let (id, bytes, gap) = (bg.next_id, bg.message_bytes, bg.gap[i]);
        bg.next_id += 1;
        let ep = world.endpoint_index(host, BG_SEND_PORT).expect("background sender");
        let closed = bg.closed_loop;
        world.submit(host, ep, AppRequest::Send { id, dst: Endpoint { host: dst, port: BG_SINK_PORT }, bytes });
        if !closed {
            world.schedule(world.now() + gap, Ev::Background { host });
        }
    }

    // ---- completion -------------------------------------------------------------------------

    /// Ends the run once every job finished and every flow's packets were delivered or
    /// dropped. Background traffic alone never ends a run (it stops at `stop`).
    fn check_done(&mut self, world: &mut dyn World) {
        let work = !self.jobs.is_empty() || !self.flows.is_empty();
        if work && self.open_jobs == 0 && self.open_flows == 0 {
            world.complete();
        }
    }

    /// The share of the work done, for progress reports ([`crate::ProgressReport::fraction`]):
    /// the mean over jobs and flows, a job counting its completed allreduces or, while they
    /// lag, `1 - exp(-elapsed / expected)` with `expected` its iterations' compute plus their
    /// bytes at line rate (so the estimate moves within one long allreduce and never reaches 1
    /// before the job ends), a flow its packets accounted for; or simulated time over `stop`
    /// where that is further.
    pub(crate) fn fraction_done(&self, now: Time, stop: Time) -> f64 {
        let mut sum = 0.0;
        for j in &self.jobs {
            sum += if j.finished_at.is_some() {
                1.0
            } else {
                let tensors = j.tensors_done as f64 / j.total_tensors().max(1) as f64;
                let expected = j.iterations as f64
                    * j.layers.iter().map(|&(bytes, f, b)| bytes as f64 * 8.0 * inalab_core::time::S as f64 / j.rate_bps as f64 + (f + b) as f64).sum::<f64>();
                let elapsed = now.saturating_sub(j.spec.start_ps) as f64;
                tensors.max(if expected > 0.0 { 1.0 - (-elapsed / expected).exp() } else { 0.0 })
            };
        }
        for f in &self.flows {
            sum += if f.complete { 1.0 } else { (f.packets_received + f.packets_dropped) as f64 / f.packets_sent.max(1) as f64 };
        }
        let n = self.jobs.len() + self.flows.len();
        let work = if n > 0 { sum / n as f64 } else { 0.0 };
        work.max(now as f64 / stop.max(1) as f64).min(1.0)
    }
}

#[cfg(test)]
mod payload_tests {
    use super::*;

    #[test]
    fn float_results_are_checked_against_the_bound() {
        let q = Quantization::FixedPoint { scale: 1e8 };
        let e = Expected::new(0, &[0, 1, 2, 3], 2, 100, PayloadValues::Float, q);
        let Expected::Within { sums, bound } = &e else { panic!("float inputs") };
        // Tensor 2 of job 0 has magnitude 20: the bound is 4 / 2e8 plus float32 rounding.
        assert!(*bound > 4.0 / 2e8 && *bound < 1e-4, "{bound}");
        let exact = Payload::F32(sums.iter().map(|&s| s as f32).collect());
        assert!(e.matches(&exact));
        let mut off = sums.iter().map(|&s| s as f32).collect::<Vec<_>>();
        off[7] += 1e-3;
        assert!(!e.matches(&Payload::F32(off)), "an error of 1e-3 is far beyond the bound");
        assert!(!e.matches(&Payload::F32(vec![0.0; 99])), "a short result");
        assert!(!e.matches(&Payload::I32(vec![0; 100])), "integers where floats were sent");
    }

    #[test]
    fn five_tensors_cover_every_magnitude() {
        let max = |t| match input(3, 0, t, 1000, PayloadValues::Float) {
            Payload::F32(v) => v.iter().fold(0f32, |m, x| m.max(x.abs())),
            _ => unreachable!(),
        };
        let mut seen: Vec<f32> = (0..5).map(max).collect();
        seen.sort_by(f32::total_cmp);
        for (m, class) in seen.iter().zip(FLOAT_MAGNITUDES) {
            assert!(*m <= class && *m > 0.9 * class, "{m} in class {class}");
        }
    }
}

#[cfg(test)]
mod background_tests {
    use super::*;

    fn state(n: usize, pattern: BackgroundPattern) -> BackgroundState {
        BackgroundState {
            hosts: (0..n as NodeId).collect(),
            gap: vec![1; n],
            closed_loop: false,
            message_bytes: 1,
            rng: Xoshiro256PlusPlus::seed_from_u64(1),
            next_id: 0,
            pattern,
            round_of: vec![0; n],
            rounds: Default::default(),
            seed: 7,
        }
    }

    #[test]
    fn a_permutation_gives_every_receiver_exactly_one_sender_per_round() {
        // 64 hosts send 50 rounds each, interleaved unevenly (host i sends its messages in
        // bursts of i % 5 + 1, as hosts at different rates would): round by round, every host
        // receives from exactly one other.
        let (n, rounds) = (64, 50);
        let mut bg = state(n, BackgroundPattern::Permutation);
        let mut by_round = vec![vec![]; rounds];
        let mut sent = vec![0; n];
        while sent.iter().any(|&s| s < rounds) {
            for i in 0..n {
                for _ in 0..(i % 5 + 1) {
                    if sent[i] < rounds {
                        by_round[sent[i]].push((i, bg.next_peer(i)));
                        sent[i] += 1;
                    }
                }
            }
        }
        let mut distinct = std::collections::BTreeSet::new();
        for pairs in &by_round {
            let mut receivers: Vec<usize> = pairs.iter().map(|&(_, d)| d).collect();
            receivers.sort();
            assert_eq!(receivers, (0..n).collect::<Vec<_>>(), "every host receives exactly once per round");
            assert!(pairs.iter().all(|&(s, d)| s != d), "nobody sends to itself");
            let mut perm = pairs.clone();
            perm.sort();
            distinct.insert(perm);
        }
        assert_eq!(distinct.len(), rounds, "a new permutation every round");
        assert!(bg.rounds.is_empty(), "rounds every host sent are forgotten");
    }

    #[test]
    fn uniform_peers_give_some_receivers_several_senders() {
        // The contrast (and what #40 measured): with a fresh uniform peer per message, a round
        // of 64 messages leaves about a third of the hosts without a sender.
        let n = 64;
        let mut bg = state(n, BackgroundPattern::Uniform);
        let mut receivers: Vec<usize> = (0..n).map(|i| bg.next_peer(i)).collect();
        assert!((0..n).all(|i| receivers[i] != i));
        receivers.sort();
        receivers.dedup();
        assert!(receivers.len() < n - 10, "{} distinct receivers of {n}", receivers.len());
    }
}
