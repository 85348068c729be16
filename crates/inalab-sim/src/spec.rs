//! The simulator's input, as the Python front sends it: every value explicit, in integer
//! base units (picoseconds, bits per second, bytes). User-facing defaults, units and
//! documentation live in the Python config schema (`inalab.config`); this struct rejects
//! unknown fields so nothing a user wrote is silently ignored.

use inalab_topo::TopologySpec;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimSpec {
    pub name: String,
    pub seed: u64,
    /// Payload mode: packets carry real values, which are summed and checked.
    pub payload: bool,
    /// Hard stop of simulated time.
    pub stop_ps: u64,
    pub topology: TopologySpec,
    pub network: NetSpec,
    #[serde(default)]
    pub jobs: Vec<JobSpec>,
    #[serde(default)]
    pub background: Option<BackgroundSpec>,
    #[serde(default)]
    pub flows: Vec<FlowSpec>,
    pub metrics: MetricsSpec,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetSpec {
    /// Per egress-port buffer of every switch, bytes (drop-tail).
    pub buffer_bytes: u64,
    /// Queue length above which a packet is ECN-marked on enqueue, bytes.
    pub ecn_threshold_bytes: u64,
    pub routing: Routing,
    #[serde(default)]
    pub link_loss: Vec<LinkLoss>,
    #[serde(default)]
    pub host_loss: Vec<HostLoss>,
    /// Per-switch processing-capacity limits (GRID); unlisted switches are unlimited.
    #[serde(default)]
    pub switch_capacity: Vec<SwitchValue>,
    /// Aggregator memory of every programmable switch, bytes.
    pub aggregator_memory_bytes: u64,
    /// Per-switch overrides of `aggregator_memory_bytes`.
    #[serde(default)]
    pub switch_memory: Vec<SwitchValue>,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Routing {
    /// Shortest paths, one of the equal-cost ports by flow hash.
    Ecmp,
    /// Up/down adaptive (Canary §5.2): the flow's default port unless its queue exceeds
    /// `threshold` x buffer, then the equal-cost port with the fewest queued bytes.
    Adaptive { threshold: f64 },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkLoss {
    pub a: String,
    pub b: String,
    /// Probability that a packet crossing the link (either direction) is lost.
    pub prob: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostLoss {
    pub host: String,
    /// Probability that a packet the host sends or receives is lost.
    pub prob: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchValue {
    pub switch: String,
    pub value: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub id: u32,
    pub name: String,
    pub scheme: Scheme,
    /// Worker hosts by name, in rank order.
    pub workers: Vec<String>,
    /// Parameter-server hosts by name (schemes with servers only).
    #[serde(default)]
    pub servers: Vec<String>,
    pub workload: Workload,
    pub start_ps: u64,
    /// Each backward layer's compute is stretched by U(0, jitter_ps) (DSA §VII-B).
    pub jitter_ps: u64,
    pub transport: TransportSpec,
    /// Tensor partition size for parameter servers (BytePS uses 4 MiB).
    pub partition_bytes: u64,
    /// In-network aggregation settings (schemes `atp` and `switchml` only).
    #[serde(default)]
    pub ina: Option<InaSpec>,
}

/// Settings of an in-network aggregation job. The switch side (aggregator memory) is in
/// `NetSpec`; this is what the job's hosts do.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InaSpec {
    /// Bytes on the wire per gradient packet, headers included (ATP 306, SwitchML 180).
    pub packet_bytes: u32,
    /// Header bytes of a gradient packet (ATP 58, SwitchML 52); the rest carries i32 values.
    pub header_bytes: u32,
    /// ATP aggregator indexing.
    pub hashing: Hashing,
    /// ATP: ECN/loss-driven AIMD window (false: a fixed window of `init_window_bytes`).
    pub congestion_control: bool,
    /// Loss-recovery timeout of workers (ATP and SwitchML).
    pub timeout_ps: u64,
    /// SwitchML: slots of the job's static pool at the switch (0 = an equal share of the
    /// switch's aggregators among the SwitchML jobs on it).
    pub pool_slots: u32,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Hashing {
    /// HASH(<job, seq>) % aggregators (ATP).
    Hash,
    /// seq % aggregators: every job starts at slot 0 (ATP Fig. 14's strawman).
    Linear,
    /// Static allocation: the pool is split equally among the scenario's `static` ATP jobs
    /// and each uses seq % its slice (ATP Figs. 13a and 14's baseline).
    Static,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Scheme {
    Ring,
    Hierarchical,
    /// N-to-1 parameter server.
    Ps,
    /// Sharded N-to-N parameter servers co-located with the workers (BytePS-like).
    PsSharded,
    /// ATP: best-effort aggregation in a shared switch pool at two rack levels, PS fallback.
    Atp,
    /// SwitchML: a static per-job slot pool at the workers' switch, results multicast back.
    #[serde(rename = "switchml")]
    SwitchMl,
}

impl Scheme {
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Ring => "ring",
            Scheme::Hierarchical => "hierarchical",
            Scheme::Ps => "ps",
            Scheme::PsSharded => "ps_sharded",
            Scheme::Atp => "atp",
            Scheme::SwitchMl => "switchml",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportSpec {
    pub mss_bytes: u32,
    pub header_bytes: u32,
    pub rto_ps: u64,
    pub init_window_bytes: u64,
    pub increment_bytes: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Workload {
    /// A training job: layers in forward order; communication of a layer's gradient starts
    /// when its backward pass ends, and the next forward pass of a layer waits for its result.
    Training { layers: Vec<Layer>, iterations: u32 },
    /// Each worker repeatedly allreduces one tensor of `bytes`, with no compute.
    Allreduce { bytes: u64, iterations: u32 },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layer {
    pub name: String,
    pub bytes: u64,
    pub fwd_ps: u64,
    pub bwd_ps: u64,
}

/// Random-uniform background traffic (Canary §5.2): every listed host sends messages of
/// `message_bytes` at line rate to a peer drawn uniformly among the others, message after
/// message, with gaps that make its offered load `load` x its link rate.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackgroundSpec {
    pub hosts: Vec<String>,
    pub load: f64,
    pub message_bytes: u64,
    pub packet_bytes: u32,
    pub start_ps: u64,
}

/// A raw datagram flow at line rate (benchmarks, validation against closed forms).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowSpec {
    pub src: String,
    pub dst: String,
    pub bytes: u64,
    pub packet_bytes: u32,
    pub start_ps: u64,
    /// A fixed path (node names from `src` to `dst`) installed for this flow instead of ECMP.
    #[serde(default)]
    pub path: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSpec {
    /// Width of a time-series bin.
    pub bin_ps: u64,
}
