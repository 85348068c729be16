//! The simulator's output: plain rows that the Python front turns into DataFrames and JSON.
//! Times are seconds (float) and rates Gbps here, for people; the simulation itself is exact.

use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Serialize, Default)]
pub struct SimResult {
    pub scenario: String,
    pub seed: u64,
    pub sim_time_s: f64,
    pub wall_s: f64,
    pub events: u64,
    /// What ended the simulation: "work_ended" (every job and flow ended: finished, failed or
    /// delivered what it could), "stop_time" (`stop_ps` reached first), "idle" (no event left
    /// while work was unfinished: a protocol waits for ever) or "interrupted" (the driver asked
    /// it to stop, as on Ctrl-C).
    pub stopped_by: String,
    /// How the run went, the one word to check: "completed" (every job finished and every flow
    /// ended), "failed" (a job failed), "unfinished" (none failed, but a job or flow had not
    /// ended when the run stopped) or "interrupted".
    pub outcome: String,
    pub jobs: Vec<JobResult>,
    pub iterations: Vec<IterationRow>,
    pub links: Vec<LinkResult>,
    pub switches: Vec<SwitchResult>,
    pub hosts: Vec<HostResult>,
    pub flows: Vec<FlowResult>,
    pub timeseries: Series,
    pub conservation: Conservation,
    /// Capture files written (`--pcap`), and why capturing stopped early, if it did.
    pub captures: Vec<crate::capture::CaptureRow>,
    pub capture_error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct JobResult {
    pub id: u32,
    pub name: String,
    pub scheme: String,
    pub workers: u32,
    /// "training" (a model's layers, computed and communicated) or "allreduce" (a benchmark of
    /// back-to-back allreduces, no compute).
    pub kind: &'static str,
    /// `status == "finished"`.
    pub finished: bool,
    /// "finished", "failed" or "unfinished" (not ended when the run stopped).
    pub status: &'static str,
    /// When the job started, s (its `start`).
    pub start_s: f64,
    /// Why a job did not finish (the first failure, naming the worker, link or cause; or what
    /// it had done when the run stopped); `None` for a finished job.
    pub reason: Option<String>,
    /// Job completion time: from the job's start to the last worker holding the last result;
    /// `None` unless finished.
    pub jct_s: Option<f64>,
    /// Iterations every live worker completed.
    pub iterations: u32,
    /// Iterations the job was to run.
    pub iterations_planned: u32,
    /// Mean time of the completed iterations, s; `None` when none completed.
    pub mean_iteration_s: Option<f64>,
    /// Tensor bytes allreduced per worker per iteration.
    pub bytes_per_iteration: u64,
    /// Algorithm bandwidth: allreduced tensor bytes per worker per second of JCT, in Gbps
    /// (compute time included for training jobs); `None` unless finished.
    pub goodput_gbps: Option<f64>,
    /// Bus bandwidth, NCCL's: `goodput_gbps * 2 (n - 1) / n` for n workers, the rate each
    /// worker's link would carry in a ring allreduce; `None` unless finished.
    pub busbw_gbps: Option<f64>,
    /// Time worker 0 had at least one allreduce outstanding, s (its communication time).
    pub comm_busy_s: f64,
    /// Allreduced bytes per worker per second of `comm_busy_s`, in Gbps: the rate the
    /// aggregation delivered while the job waited on it (DSA's Fig. 10 metric over the link
    /// rate); `None` unless finished.
    pub aggregation_gbps: Option<f64>,
    /// Payload mode: tensors whose result was compared with the exact sum, and mismatches.
    pub payload_checked: u64,
    pub payload_errors: u64,
    /// Failures reported by the protocol (`HostEvent::Failed`).
    pub failures: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct IterationRow {
    pub job: u32,
    pub iteration: u32,
    /// When the last worker received the iteration's last result.
    pub end_s: f64,
    pub duration_s: f64,
}

/// One direction of a link.
#[derive(Debug, Clone, Serialize)]
pub struct LinkResult {
    pub link: u32,
    pub src: String,
    pub dst: String,
    pub rate_gbps: f64,
    /// Bytes and packets the port accepted for transmission (those still queued when the run
    /// stopped included).
    pub tx_bytes: u64,
    pub tx_packets: u64,
    /// Time the link spent transmitting / simulated time.
    pub utilization: f64,
    /// Highest utilization of any time-series bin.
    pub peak_bin_utilization: f64,
    pub drops_queue: u64,
    pub drops_loss: u64,
    pub ecn_marks: u64,
    pub max_queue_bytes: u64,
    /// PFC only (absent under drop-tail, so those results are unchanged): times the sender was
    /// paused by the receiver, and for how long in all, s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pfc_pauses: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pfc_paused_s: Option<f64>,
    /// PFC only: PAUSE frames the receiving switch sent over this link, and the most bytes
    /// that came over it held at the receiver at once (0 at a host).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pfc_pauses_sent: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pfc_max_ingress_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SwitchResult {
    pub name: String,
    pub programmable: bool,
    pub rx_packets: u64,
    pub drops_queue: u64,
    /// Packets the switch program consumed into a sum (`*_aggregated`): how aggregation works,
    /// not a loss.
    pub absorbed_packets: u64,
    /// Packets the switch program discarded for any other reason (duplicates, stale or
    /// malformed packets, no receiver), by `counters`' `drop_*` entries.
    pub drops_program: u64,
    pub ecn_marks: u64,
    pub max_queue_bytes: u64,
    pub aggregators_peak: u32,
    /// Aggregators held when the run stopped: 0 once every job ended, since an ended job is
    /// released at every switch.
    pub aggregators_end: u32,
    /// Aggregators jobs still held when they ended (a protocol that frees its aggregators
    /// itself leaves 0), freed by the release.
    pub aggregators_released: u32,
    pub counters: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct HostResult {
    pub name: String,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub drops_loss: u64,
    /// Packets for a port no endpoint listens on.
    pub drops_no_endpoint: u64,
    pub counters: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FlowResult {
    pub id: u32,
    pub src: String,
    pub dst: String,
    /// The flow's size, bytes.
    pub bytes: u64,
    pub bytes_received: u64,
    /// `bytes_received / bytes`.
    pub delivered_fraction: f64,
    pub packets: u64,
    pub packets_received: u64,
    /// Packets lost on the way (queues, loss, failures); flows do not retransmit.
    pub packets_dropped: u64,
    /// "delivered" (every byte arrived), "lossy" (every packet arrived or was dropped, some
    /// were dropped) or "unfinished" (packets still to send or in flight when the run stopped).
    pub status: &'static str,
    /// `status != "unfinished"`.
    pub finished: bool,
    pub start_s: f64,
    /// Flow completion time: from its start to its last packet's arrival (or drop); `None`
    /// when unfinished.
    pub fct_s: Option<f64>,
    /// First and last packet arrivals, s; `None` when none arrived.
    pub first_rx_s: Option<f64>,
    pub last_rx_s: Option<f64>,
}

/// Long-form time series: `metric` in {"link_utilization", "queue_bytes_max",
/// "aggregators_in_use"}, `entity` a link "a->b" or a switch name. Serialized as one row per
/// point (`{t_s, metric, entity, value}`, [`SeriesRow`]); held as 24-byte points that name
/// their entity by index, because at 1024 hosts a run has about 5 x 10^5 points and a row
/// with its own entity string doubled the result's memory beside its JSON.
#[derive(Debug, Clone, Default)]
pub struct Series {
    entities: Vec<String>,
    points: Vec<Point>,
}

#[derive(Debug, Clone, Copy)]
struct Point {
    t_s: f64,
    value: f64,
    entity: u32,
    metric: &'static str,
}

/// One point of a [`Series`], as it is serialized.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SeriesRow<'a> {
    pub t_s: f64,
    pub metric: &'static str,
    pub entity: &'a str,
    pub value: f64,
}

impl Series {
    /// Names an entity; the points pushed after it belong to it.
    pub(crate) fn entity(&mut self, name: String) -> u32 {
        self.entities.push(name);
        self.entities.len() as u32 - 1
    }

    pub(crate) fn push(&mut self, entity: u32, metric: &'static str, t_s: f64, value: f64) {
        self.points.push(Point { t_s, value, entity, metric });
    }

    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The points in the order they were recorded (by entity, then metric, then time).
    pub fn iter(&self) -> impl Iterator<Item = SeriesRow<'_>> {
        self.points.iter().map(|p| SeriesRow { t_s: p.t_s, metric: p.metric, entity: &self.entities[p.entity as usize], value: p.value })
    }
}

impl Serialize for Series {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

/// Packet and byte conservation: sent + created = delivered + absorbed + lost + in flight,
/// where "created" counts what switch programs emit beyond what they take in (results,
/// multicast copies; a program hands every packet it takes in on, or ends it as absorbed or
/// lost), "absorbed" what they consume into sums (`SwitchResult::absorbed_packets`, not a
/// loss) and "lost" every other packet that ended before a host: queue drops, link loss,
/// failures, no route, and packets programs discarded (duplicates, stale, malformed).
#[derive(Debug, Clone, Serialize, Default)]
pub struct Conservation {
    pub sent_packets: u64,
    pub created_packets: i64,
    pub delivered_packets: u64,
    pub absorbed_packets: u64,
    pub lost_packets: u64,
    pub in_flight_packets: u64,
    pub sent_bytes: u64,
    pub created_bytes: i64,
    pub delivered_bytes: u64,
    pub absorbed_bytes: u64,
    pub lost_bytes: u64,
    pub in_flight_bytes: u64,
    pub holds: bool,
}
