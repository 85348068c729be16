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
    /// "completed" when every job and flow finished, "stop_time" when `stop_ps` was reached.
    pub stopped_by: String,
    pub jobs: Vec<JobResult>,
    pub iterations: Vec<IterationRow>,
    pub links: Vec<LinkResult>,
    pub switches: Vec<SwitchResult>,
    pub hosts: Vec<HostResult>,
    pub flows: Vec<FlowResult>,
    pub timeseries: Vec<SeriesRow>,
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
    pub finished: bool,
    /// Job completion time: from the job's start to the last worker holding the last result.
    pub jct_s: f64,
    pub iterations: u32,
    pub mean_iteration_s: f64,
    /// Tensor bytes allreduced per worker per iteration.
    pub bytes_per_iteration: u64,
    /// Allreduced tensor bytes per worker per second of JCT, in Gbps.
    pub goodput_gbps: f64,
    /// Time worker 0 had at least one allreduce outstanding, s (its communication time).
    pub comm_busy_s: f64,
    /// Allreduced bytes per worker per second of `comm_busy_s`, in Gbps: the rate the
    /// aggregation delivered while the job waited on it (DSA's Fig. 10 metric over the link rate).
    pub aggregation_gbps: f64,
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
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub packets_received: u64,
    pub first_rx_s: f64,
    pub last_rx_s: f64,
}

/// Long-form time series: `metric` in {"link_tx_bytes", "link_utilization",
/// "queue_bytes_max", "aggregators_in_use"}, `entity` a link "a->b" or a switch name.
#[derive(Debug, Clone, Serialize)]
pub struct SeriesRow {
    pub t_s: f64,
    pub metric: &'static str,
    pub entity: String,
    pub value: f64,
}

/// Packet and byte conservation: sent + created = delivered + dropped + in flight, where
/// "created" counts what switch programs emit beyond what they receive (negative when they
/// consume packets, as aggregation does).
#[derive(Debug, Clone, Serialize, Default)]
pub struct Conservation {
    pub sent_packets: u64,
    pub created_packets: i64,
    pub delivered_packets: u64,
    pub dropped_packets: u64,
    pub in_flight_packets: u64,
    pub sent_bytes: u64,
    pub created_bytes: i64,
    pub delivered_bytes: u64,
    pub dropped_bytes: u64,
    pub in_flight_bytes: u64,
    pub holds: bool,
}
