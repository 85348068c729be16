//! Turns the world's counters into the result rows.

use crate::result::*;
use crate::sim::Sim;
use inalab_core::time::to_secs;
use std::collections::BTreeMap;

impl Sim {
    pub fn finish(mut self) -> SimResult {
        let (captures, capture_error) = match self.capture.as_mut() {
            Some(c) => (c.finish(), c.error.clone()),
            None => (vec![], None),
        };
        let mut r = SimResult {
            scenario: self.state.name.clone(),
            seed: self.state.seed,
            sim_time_s: to_secs(self.now),
            wall_s: self.state.wall_s,
            events: self.state.events,
            stopped_by: self.state.stopped_by.to_string(),
            captures,
            capture_error,
            ..Default::default()
        };
        self.job_rows(&mut r);
        self.link_rows(&mut r);
        self.switch_rows(&mut r);
        self.host_rows(&mut r);
        self.flow_rows(&mut r);
        r.outcome = self.outcome(&r).to_string();
        r.conservation = self.conservation();
        r
    }

    /// A node's name in the result rows.
    fn node_name(&self, n: u32) -> String {
        self.fabric.topo.nodes[n as usize].name.clone()
    }

    /// Each job's row and its iterations'.
    fn job_rows(&self, r: &mut SimResult) {
        for j in &self.wl.jobs {
            let start = j.spec.start_ps;
            let iters = j.iter_end.len() as u32;
            let (status, reason) = job_status(&j.failures, j.payload_errors, j.payload_checked, iters == j.iterations)
                .unwrap_or_else(|| ("unfinished", Some(self.unfinished_reason(iters, j.iterations))));
            let finished = status == "finished";
            let jct = finished.then(|| to_secs(j.finished_at.unwrap_or(self.now).saturating_sub(start)));
            let bpi = j.bytes_per_iteration();
            let bits = (bpi * iters as u64) as f64 * 8.0;
            let n = j.workers.len() as f64;
            let goodput = jct.filter(|&t| t > 0.0).map(|t| bits / t / 1e9);
            // The first live worker's (a dead one's time stopped with it).
            let busy = j.workers.iter().find(|w| !w.dead).or(j.workers.first()).map_or(0.0, |w| to_secs(w.busy_ps));
            r.jobs.push(JobResult {
                id: j.spec.id,
                name: j.spec.name.clone(),
                scheme: j.spec.scheme_name().to_string(),
                workers: j.workers.len() as u32,
                kind: j.kind(),
                finished,
                status,
                start_s: to_secs(start),
                reason,
                jct_s: jct,
                iterations: iters,
                iterations_planned: j.iterations,
                // The completed iterations' own time.
                mean_iteration_s: j.iter_end.last().map(|&t| to_secs(t.saturating_sub(start)) / iters as f64),
                bytes_per_iteration: bpi,
                goodput_gbps: goodput,
                busbw_gbps: goodput.map(|g| if n > 1.0 { g * 2.0 * (n - 1.0) / n } else { 0.0 }),
                comm_busy_s: busy,
                aggregation_gbps: (finished && busy > 0.0).then(|| bits / busy / 1e9),
                payload_checked: j.payload_checked,
                payload_errors: j.payload_errors,
                failures: j.failures.clone(),
            });
            let mut prev = start;
            for (i, &t) in j.iter_end.iter().enumerate() {
                r.iterations.push(IterationRow { job: j.spec.id, iteration: i as u32, end_s: to_secs(t), duration_s: to_secs(t - prev) });
                prev = t;
            }
        }
    }

    /// Each link's row (by direction) and its time series.
    fn link_rows(&self, r: &mut SimResult) {
        let (t_end, bin) = (self.now.max(1), self.state.bin);
        let mut node_of_port = vec![];
        for (n, node) in self.fabric.topo.nodes.iter().enumerate() {
            node_of_port.extend(std::iter::repeat_n(n as u32, node.ports.len()));
        }
        for (pi, p) in self.queues.ports.iter().enumerate() {
            let src = node_of_port[pi];
            let s = &p.stats;
            // Bytes still queued when the run stopped were accepted but not yet sent.
            let busy = inalab_core::time::serialization(s.tx_bytes, p.rate_bps).saturating_sub(p.busy_until.saturating_sub(self.now));
            // The share of each bin the link spent serializing.
            let peak = s.tx_series().map(|(_, busy)| busy).max().unwrap_or(0) as f64 / bin as f64;
            let entity = r.timeseries.entity(format!("{}->{}", self.node_name(src), self.node_name(p.peer)));
            for (b, busy) in s.tx_series() {
                r.timeseries.push(entity, "link_utilization", to_secs(b as u64 * bin), busy as f64 / bin as f64);
            }
            for (b, q) in s.queue_series() {
                r.timeseries.push(entity, "queue_bytes_max", to_secs(b as u64 * bin), q as f64);
            }
            let pfc = self.pfc_link(pi);
            r.links.push(LinkResult {
                link: p.link,
                src: self.node_name(src),
                dst: self.node_name(p.peer),
                rate_gbps: p.rate_bps as f64 / 1e9,
                tx_bytes: s.tx_bytes,
                tx_packets: s.tx_packets,
                utilization: busy as f64 / t_end as f64,
                peak_bin_utilization: peak,
                drops_queue: s.drops_queue,
                drops_loss: s.drops_loss,
                ecn_marks: s.ecn_marks,
                max_queue_bytes: s.max_queue_bytes,
                pfc_pauses: pfc.as_ref().map(|p| p.pauses),
                pfc_paused_s: pfc.as_ref().map(|p| to_secs(p.paused_ps)),
                pfc_pauses_sent: pfc.as_ref().map(|p| p.pauses_sent),
                pfc_max_ingress_bytes: pfc.as_ref().map(|p| p.max_ingress_bytes),
            });
        }
    }

    /// Each switch's row, its program's counters with the network's, and its aggregator series.
    fn switch_rows(&self, r: &mut SimResult) {
        let bin = self.state.bin;
        let hosts = self.fabric.topo.hosts;
        for (si, sw) in self.nodes.switches.iter().enumerate() {
            let node = hosts + si as u32;
            let base = self.fabric.topo.nodes[..node as usize].iter().map(|n| n.ports.len()).sum::<usize>();
            let ports = &self.queues.ports[base..base + self.fabric.topo.nodes[node as usize].ports.len()];
            let mut counters: BTreeMap<String, u64> = sw.active_ref().counters().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            counters.insert("drops_no_route".into(), sw.drops_no_route);
            if matches!(self.fabric.routing, crate::spec::Routing::Adaptive { .. }) {
                // The network's own reroutes (a program's, Canary's `rerouted`, are its own).
                counters.insert("rerouted_network".into(), sw.rerouted);
            }
            if sw.capacity_bps.is_some() {
                counters.insert("drops_processing".into(), sw.drops_processing);
            }
            if sw.drops_unadmitted > 0 {
                // Only when it happened, so runs without hostile traffic keep their output.
                counters.insert("drops_unadmitted".into(), sw.drops_unadmitted);
            }
            // Failures (only when some happened): program counters of replaced instances add
            // up with the live one's, and the packets lost to the failure are counted.
            for (&k, &v) in &sw.carried {
                *counters.entry(k.to_string()).or_insert(0) += v;
            }
            for (k, v) in [("drops_node_failed", sw.drops_node_failed), ("drops_link_failed", sw.drops_link_failed), ("restarts", sw.restarts)] {
                if v > 0 {
                    counters.insert(k.into(), v);
                }
            }
            if let Some(f) = self.pfc_totals(base..base + ports.len()) {
                // Sent over its ingress ports; received on (and time paused of) its egress ports.
                counters.insert("pfc_pauses_sent".into(), f.pauses_sent);
                counters.insert("pfc_pauses_received".into(), f.pauses);
                counters.insert("pfc_paused_ns".into(), f.paused_ps / 1000);
                counters.insert("pfc_max_ingress_bytes".into(), f.max_ingress_bytes);
            }
            if !sw.agg_series.is_empty() {
                let entity = r.timeseries.entity(self.node_name(node));
                for &(b, v) in &sw.agg_series {
                    r.timeseries.push(entity, "aggregators_in_use", to_secs(b as u64 * bin), v as f64);
                }
            }
            r.switches.push(SwitchResult {
                name: self.node_name(node),
                programmable: self.fabric.topo.nodes[node as usize].programmable,
                rx_packets: sw.rx_packets,
                drops_queue: ports.iter().map(|p| p.stats.drops_queue).sum(),
                absorbed_packets: sw.absorbed,
                drops_program: sw.drops_program,
                ecn_marks: ports.iter().map(|p| p.stats.ecn_marks).sum(),
                max_queue_bytes: ports.iter().map(|p| p.stats.max_queue_bytes).max().unwrap_or(0),
                aggregators_peak: sw.agg_peak,
                aggregators_end: sw.active_ref().aggregators_in_use(),
                aggregators_released: sw.aggregators_released,
                counters,
            });
        }
    }

    /// Each host's row: its NIC's bytes and its endpoints' counters.
    fn host_rows(&self, r: &mut SimResult) {
        for (h, hs) in self.nodes.hosts.iter().enumerate() {
            let nic_pi = self.fabric.topo.nodes[..h].iter().map(|n| n.ports.len()).sum::<usize>();
            let nic = &self.queues.ports[nic_pi].stats;
            let mut counters = BTreeMap::new();
            if let Some(f) = self.pfc_link(nic_pi) {
                counters.insert("pfc_pauses_received".to_string(), f.pauses);
                counters.insert("pfc_paused_ns".to_string(), f.paused_ps / 1000);
            }
            for e in &hs.eps {
                for (k, v) in e.proto.counters() {
                    *counters.entry(k.to_string()).or_insert(0) += v;
                }
            }
            if hs.drops_link_failed > 0 {
                counters.insert("drops_link_failed".to_string(), hs.drops_link_failed);
            }
            if let Some(at) = hs.failed_at {
                counters.insert("drops_host_failed".to_string(), hs.drops_host_failed);
                counters.insert("failed_at_ns".to_string(), at / 1000);
            }
            if let Some(cpu) = hs.cpu {
                counters.insert("cpu_busy_ns".to_string(), cpu.busy_ps / 1000);
            }
            r.hosts.push(HostResult {
                name: self.node_name(h as u32),
                tx_bytes: nic.tx_bytes,
                tx_packets: nic.tx_packets,
                rx_bytes: hs.rx_bytes,
                rx_packets: hs.rx_packets,
                drops_loss: hs.drops_loss + nic.drops_loss,
                drops_no_endpoint: hs.drops_no_endpoint,
                counters,
            });
        }
    }

    /// Each background flow's row.
    fn flow_rows(&self, r: &mut SimResult) {
        for (i, f) in self.wl.flows.iter().enumerate() {
            let status = match (f.complete, f.packets_dropped) {
                (false, _) => "unfinished",
                (true, 0) => "delivered",
                (true, _) => "lossy",
            };
            r.flows.push(FlowResult {
                id: i as u32,
                src: self.node_name(f.src),
                dst: self.node_name(f.dst),
                bytes: f.bytes,
                bytes_received: f.bytes_received,
                delivered_fraction: if f.bytes > 0 { f.bytes_received as f64 / f.bytes as f64 } else { 1.0 },
                packets: f.packets_sent,
                packets_received: f.packets_received,
                packets_dropped: f.packets_dropped,
                status,
                finished: f.complete,
                start_s: to_secs(f.start),
                fct_s: f.ended_at.map(|t| to_secs(t.saturating_sub(f.start))),
                first_rx_s: f.first_rx.map(to_secs),
                last_rx_s: f.last_rx.map(to_secs),
            });
        }
    }

    /// The conservation check: every packet and byte sent or created was delivered, absorbed,
    /// lost or is still in flight.
    fn conservation(&self) -> crate::result::Conservation {
        let mut c = self.cons.clone();
        let (live, live_bytes) = self.in_flight();
        c.in_flight_packets = live;
        c.in_flight_bytes = live_bytes;
        c.holds = c.sent_packets as i64 + c.created_packets == (c.delivered_packets + c.absorbed_packets + c.lost_packets + c.in_flight_packets) as i64
            && c.sent_bytes as i64 + c.created_bytes == (c.delivered_bytes + c.absorbed_bytes + c.lost_bytes + c.in_flight_bytes) as i64;
        c
    }

    /// What an unfinished job had done and why it stopped short.
    fn unfinished_reason(&self, done: u32, planned: u32) -> String {
        let at = human_time(self.now);
        let progress = format!("{done} of {planned} iterations done");
        match self.state.stopped_by {
            "idle" => format!("stalled: no event was left at {at} with the job waiting ({progress}); a protocol waits for a packet that never comes"),
            "interrupted" => format!("interrupted at {at} of simulated time ({progress})"),
            _ => format!("not finished at the stop time, {at} ({progress}); raise `stop` to let it finish"),
        }
    }

    /// The run's outcome word ([`SimResult::outcome`]).
    fn outcome(&self, r: &SimResult) -> &'static str {
        if self.state.stopped_by == "interrupted" {
            "interrupted"
        } else if r.jobs.iter().any(|j| j.status == "failed") {
            "failed"
        } else if r.jobs.iter().any(|j| !j.finished) || r.flows.iter().any(|f| !f.finished) {
            "unfinished"
        } else {
            "completed"
        }
    }
}

/// A job's status and why, from its failures, its payload check and whether every iteration
/// completed; `None` for a job that had not ended (the caller says why it stopped short). A
/// wrong sum is a failure: a job whose results differ from the exact sums never looks finished.
fn job_status(failures: &[String], payload_errors: u64, payload_checked: u64, all_iterations: bool) -> Option<(&'static str, Option<String>)> {
    if let Some(first) = failures.first() {
        let more = if failures.len() > 1 { format!(" (and {} more failures)", failures.len() - 1) } else { String::new() };
        return Some(("failed", Some(format!("{first}{more}"))));
    }
    if payload_errors > 0 {
        return Some(("failed", Some(format!("wrong sums: {payload_errors} of {payload_checked} results differ from the exact sums (payload mode)"))));
    }
    all_iterations.then_some(("finished", None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_finished_only_with_every_iteration_no_failure_and_no_wrong_sum() {
        assert_eq!(job_status(&[], 0, 12, true), Some(("finished", None)));
        assert_eq!(job_status(&[], 0, 4, false), None, "not ended: the caller says why");
        let (status, reason) = job_status(&[], 3, 12, true).unwrap();
        assert_eq!((status, reason.as_deref()), ("failed", Some("wrong sums: 3 of 12 results differ from the exact sums (payload mode)")));
        let two = ["worker 1 on h1 failed".to_string(), "worker 2 on h2 failed".to_string()];
        assert_eq!(job_status(&two, 3, 12, false).unwrap().1.as_deref(), Some("worker 1 on h1 failed (and 1 more failures)"));
    }

    #[test]
    fn simulated_times_read_as_people_write_them() {
        assert_eq!(human_time(50_000_000), "50 us");
        assert_eq!(human_time(1_250_000_000), "1.25 ms");
        assert_eq!(human_time(2_000_000_000_000), "2 s");
        assert_eq!(human_time(123_456_789_000), "123.5 ms");
    }
}

/// A simulated time for people: "50 us", "1.25 ms", "2 s" (4 significant digits at most).
fn human_time(t: inalab_core::Time) -> String {
    let s = to_secs(t);
    let (v, unit) = if s >= 1.0 { (s, "s") } else if s >= 1e-3 { (s * 1e3, "ms") } else if s >= 1e-6 { (s * 1e6, "us") } else { (s * 1e9, "ns") };
    let digits = 3usize.saturating_sub(v.abs().log10().floor().max(0.0) as usize);
    let text = format!("{v:.digits$}");
    let text = if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.') } else { &text };
    format!("{text} {unit}")
}
