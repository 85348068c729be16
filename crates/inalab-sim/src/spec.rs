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
    /// What payload mode's workers send. Default `int`.
    #[serde(default)]
    pub payload_values: PayloadValues,
    /// Hard stop of simulated time.
    pub stop_ps: u64,
    /// How long the run goes on after every job and flow finished, ps (bounded by `stop_ps`).
    /// Default 0: it stops at once. Tests use it to let protocols retire state that outlives
    /// a job (a PS's entry for a fragment the switch finished) and check nothing is left.
    #[serde(default)]
    pub linger_ps: u64,
    pub topology: TopologySpec,
    pub network: NetSpec,
    #[serde(default)]
    pub jobs: Vec<JobSpec>,
    #[serde(default)]
    pub background: Option<BackgroundSpec>,
    #[serde(default)]
    pub flows: Vec<FlowSpec>,
    /// Timed switch and link failures (Canary §1.11).
    #[serde(default)]
    pub failures: Vec<FailureSpec>,
    pub metrics: MetricsSpec,
    /// Packet captures of the run (`--pcap`); `None`: none.
    #[serde(default)]
    pub capture: Option<crate::capture::CaptureSpec>,
}

/// Values of payload mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PayloadValues {
    /// Small integers (-1000..=1000) that every scheme carries exactly: results must equal
    /// the exact sums.
    #[default]
    Int,
    /// Float32 tensors of one magnitude class each (1e-3, 1, 20, 1e4, 1e35), near and beyond
    /// the fixed-point ranges of the schemes that quantize: results must equal the float64
    /// sums within the scheme's quantization bound (`Quantization::error_bound`).
    Float,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetSpec {
    /// Per egress-port buffer of every switch, bytes (drop-tail; under PFC only the base of
    /// the adaptive-routing threshold).
    pub buffer_bytes: u64,
    /// What a switch does when traffic outruns a port: drop (default) or pause its upstream.
    #[serde(default, deserialize_with = "flow_control")]
    pub flow_control: FlowControl,
    /// Queue length above which a packet is ECN-marked on enqueue, bytes.
    pub ecn_threshold_bytes: u64,
    pub routing: Routing,
    /// Which equal-cost port a packet takes by default (flow hash, or the destination modulo
    /// the ports as Canary's SST network); adaptive routing leaves it above its threshold.
    #[serde(default)]
    pub default_port: inalab_topo::DefaultPort,
    #[serde(default)]
    pub link_loss: Vec<LinkLoss>,
    #[serde(default)]
    pub host_loss: Vec<HostLoss>,
    /// Hosts' processing costs (default: none, every host is free).
    #[serde(default)]
    pub host_costs: Vec<HostCost>,
    /// Per-switch processing-capacity limits (GRID's C_s), bits/s of the wire bytes of the
    /// packets a switch's program aggregates (`SwitchProgram::processes`); transit is not
    /// charged. Its queue marks ECN above `ecn_threshold_bytes` and, under drop-tail, drops
    /// above `buffer_bytes`. Unlisted switches are unlimited.
    #[serde(default)]
    pub switch_capacity: Vec<SwitchValue>,
    /// Aggregator memory of every programmable switch, bytes (split equally among the INA
    /// programs its jobs use there).
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

/// How the fabric copes with more traffic than a port can send.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum FlowControl {
    /// Each switch egress port queues up to `buffer_bytes` and drops what does not fit.
    #[default]
    DropTail,
    /// 802.1Qbb-style per-ingress-port pause, one traffic class (`pfc.rs`): once more than
    /// `xoff_bytes` that came in through one port wait at a switch, it pauses the sender at
    /// the other end of that port's link, and resumes it when they fall to `xon_bytes`.
    /// Nothing is dropped for lack of buffer.
    Pfc { xoff_bytes: u64, xon_bytes: u64 },
    /// Credit-based, as SST's merlin routers (`pfc.rs`): a port sends into a switch only while
    /// that switch holds less than `buffer_bytes` that came in through the link, credits coming
    /// back one link delay after the bytes leave it. Nothing is dropped for lack of buffer.
    Credit { buffer_bytes: u64 },
}

/// `FlowControl` with errors that name the field (serde's alone do not).
fn flow_control<'de, D: serde::Deserializer<'de>>(d: D) -> Result<FlowControl, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    FlowControl::deserialize(v).map_err(|e| serde::de::Error::custom(format!("network.flow_control: {e}")))
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

/// What a host's CPU spends on each packet it sends or receives (#37: the ATP paper's testbed
/// was host-bound, §D.1): `per_packet_ps` plus the packet's bytes copied at `copy_bps`, one
/// packet at a time, sends and receives alike. A packet to send is prepared while the NIC
/// serializes the one before, so a host sends at the lower of its NIC's and its CPU's rates.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostCost {
    /// A host's name, or `workers` / `servers` (every host with a worker / a server of a
    /// job), or `all`. A later entry overrides an earlier one for the same host.
    pub hosts: String,
    /// CPU time per packet, ps. Default 0.
    #[serde(default)]
    pub per_packet_ps: u64,
    /// Rate at which the host copies a packet's bytes, bits/s. Default 0: free.
    #[serde(default)]
    pub copy_bps: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchValue {
    pub switch: String,
    pub value: u64,
}

/// A job: where it runs, what it computes, and its scheme's configuration (every other key:
/// `scheme` and the scheme's parameters, checked by `inalab_scheme`, which rejects keys the
/// scheme does not take).
#[derive(Debug, Clone, Deserialize)]
pub struct JobSpec {
    pub id: u32,
    pub name: String,
    /// Worker hosts by name, in rank order.
    pub workers: Vec<String>,
    /// Server hosts by name (schemes with servers only).
    #[serde(default)]
    pub servers: Vec<String>,
    pub workload: Workload,
    pub start_ps: u64,
    /// Each backward layer's compute is stretched by U(0, jitter_ps) (DSA §VII-B).
    pub jitter_ps: u64,
    /// `{"scheme": NAME, ...}` as `inalab_scheme` reads it.
    #[serde(flatten)]
    pub config: serde_json::Map<String, serde_json::Value>,
}

impl JobSpec {
    /// The scheme's name as the job gave it ("" if missing; set-up reports that).
    pub fn scheme_name(&self) -> &str {
        self.config.get("scheme").and_then(|v| v.as_str()).unwrap_or("")
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Workload {
    /// A training job: layers in forward order; communication of a layer's gradient starts
    /// when its backward pass ends, and the next forward pass of a layer waits for its result.
    Training {
        layers: Vec<Layer>,
        iterations: u32,
        /// Layer indexes in the order their gradients go to the allreduce: each waits until
        /// its backward pass ran and every one before it went (DSA §VII-B). Default: the
        /// backward pass's order, each as soon as it is computed.
        #[serde(default)]
        send_order: Option<Vec<u32>>,
    },
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
    /// The 1-based model layer this entry is part of (entries that partition one layer share
    /// it). Default: the entry's own position.
    #[serde(default)]
    pub group: Option<u32>,
}

/// Background traffic (Canary §5.2): every listed host sends messages of `message_bytes` at
/// line rate, message after message, with gaps that make its offered load `load` x its link
/// rate, each to a peer chosen by `pattern`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackgroundSpec {
    pub hosts: Vec<String>,
    pub load: f64,
    pub message_bytes: u64,
    pub packet_bytes: u32,
    pub start_ps: u64,
    #[serde(default)]
    pub pattern: BackgroundPattern,
    /// A host starts its next message when its last one has left its NIC (after the idle time
    /// `load` leaves), instead of every message time / `load` whatever happened to the last.
    #[serde(default)]
    pub closed_loop: bool,
}

/// How a background message's receiver is chosen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackgroundPattern {
    /// A peer drawn uniformly among the other hosts, afresh for every message: a receiver may
    /// have several senders at once.
    #[default]
    Uniform,
    /// Round r (every host's r-th message) follows a derangement of the hosts drawn for that
    /// round: each host sends to one peer and receives from exactly one ("each host sends to
    /// one random host and receives from another", Canary §5.2).
    Permutation,
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

/// A switch, a host or a link that fails at `at_ps` and comes back at `until_ps` (never if
/// `None`; a host never comes back). Exactly one of `node` and `link` is given.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureSpec {
    /// A switch name: it drops every packet it holds or receives, its timers stop, and it comes
    /// back with a fresh switch program (soft state lost). A host name: it stops for good (its
    /// protocols get no packet, timer or request again; what it sent already arrives), and
    /// `detect_ps` later the other workers of its jobs are told (a membership service): a
    /// scheme that goes on without it rebuilds, any other fails the job, naming the worker.
    #[serde(default)]
    pub node: Option<String>,
    /// A host's failure: how long until its jobs' other workers are told.
    #[serde(default)]
    pub detect_ps: Option<u64>,
    /// The two end nodes of a link: packets on it either way, and sent while it is down, are lost.
    #[serde(default)]
    pub link: Option<[String; 2]>,
    pub at_ps: u64,
    #[serde(default)]
    pub until_ps: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSpec {
    /// Width of a time-series bin.
    pub bin_ps: u64,
}
