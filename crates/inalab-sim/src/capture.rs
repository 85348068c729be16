//! Packet captures of simulated traffic (`inalab simulate --pcap DIR`): every packet that
//! crosses a chosen capture point, as pcapng (crate `inalab-pcap`), timestamped by the
//! simulated clock when its last bit leaves the sending port. Each point is a file with one
//! interface per direction (`h3->s0`, `s0->h3`); a packet's bytes are its real frame
//! (`inalab_core::frame`, the UDP runtime's datagram) and 16 zero bytes where the runtime
//! puts its tag (a simulation has no keys), inside Ethernet/IPv4/UDP headers addressed by
//! node id ([`inalab_pcap::node_addr`]). A metadata-mode packet carries no values: its
//! capture holds the headers and its original length is the simulated size.

use crate::error::SimError;
use crate::network::PortState;
use inalab_core::{frame, NodeId, Packet, Time};
use inalab_pcap::{node_addr, CaptureFile, UDP_FRAMING_BYTES};
use inalab_topo::Topology;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Bytes of the runtime's trailer after each frame, its sequence number and tag
/// (`inalab_net::auth::TRAILER_BYTES`), zeros here.
const TRAILER_BYTES: usize = 24;
/// At most this many capture points (files) in one run: the default, every host, of a large
/// topology needs `at` to narrow it.
pub const MAX_POINTS: usize = 1024;

/// What `--pcap` asks for. Defaults: every host, every job, the whole run.
#[derive(Debug, Clone, Deserialize)]
pub struct CaptureSpec {
    /// Directory the files go to (created if missing).
    pub dir: String,
    /// Capture points: a node's name (every link of that host or switch), `NODE:PORT` (one
    /// port of a node, 0-based in its topology order), or `A-B` (the link or links between two
    /// adjacent nodes). Empty: every host.
    #[serde(default)]
    pub at: Vec<String>,
    /// Only packets of this job (by the job id its header carries); `None`: every packet.
    #[serde(default)]
    pub job: Option<u32>,
    /// Only packets leaving their port in `[start_ps, end_ps)`; `end_ps` `None`: to the end.
    #[serde(default)]
    pub start_ps: Time,
    #[serde(default)]
    pub end_ps: Option<Time>,
}

/// One file written, as the result reports it.
#[derive(Debug, Clone, Serialize)]
pub struct CaptureRow {
    pub point: String,
    pub path: String,
    pub packets: u64,
}

pub(crate) struct Capture {
    files: Vec<(String, PathBuf, CaptureFile)>,
    /// Per global port: (file, interface) pairs that see what the port sends.
    by_port: Vec<Vec<(u32, u32)>>,
    job: Option<u32>,
    start: Time,
    end: Time,
    frame: Vec<u8>,
    /// The first write error; capturing stops there and the run reports it.
    pub(crate) error: Option<String>,
}

impl Capture {
    pub(crate) fn new(spec: &CaptureSpec, topo: &Topology, port_base: &[u32], ports: &[PortState]) -> Result<Capture, SimError> {
        let points: Vec<String> = match spec.at.is_empty() {
            true => (0..topo.hosts).map(|h| topo.nodes[h as usize].name.clone()).collect(),
            false => spec.at.clone(),
        };
        if points.len() > MAX_POINTS {
            return Err(SimError::new("capture.at", format!("{} capture points, at most {MAX_POINTS}: name the hosts, ports or links to capture", points.len())));
        }
        if let Some(end) = spec.end_ps.filter(|&e| e <= spec.start_ps) {
            return Err(SimError::new("capture.end", format!("must be after capture.start ({} ps), got {end} ps", spec.start_ps)));
        }
        let dir = PathBuf::from(&spec.dir);
        std::fs::create_dir_all(&dir).map_err(|e| SimError::new("capture.dir", format!("cannot create {}: {e}", dir.display())))?;
        let mut by_port = vec![vec![]; ports.len()];
        let mut files = vec![];
        for point in points {
            // (sending node, its port) for each direction the point sees.
            let dirs = resolve(&point, topo)?;
            let names: Vec<String> = dirs.iter().map(|&(n, p)| {
                let peer = topo.nodes[n as usize].ports[p as usize].peer;
                format!("{}->{}", topo.nodes[n as usize].name, topo.nodes[peer as usize].name)
            }).collect();
            let path = dir.join(inalab_pcap::file_name(&point));
            let file = CaptureFile::create(&path, &names).map_err(|e| SimError::new("capture.dir", format!("cannot write {}: {e}", path.display())))?;
            let fi = files.len() as u32;
            for (iface, &(n, p)) in dirs.iter().enumerate() {
                by_port[(port_base[n as usize] + p as u32) as usize].push((fi, iface as u32));
            }
            files.push((point, path, file));
        }
        Ok(Capture { files, by_port, job: spec.job, start: spec.start_ps, end: spec.end_ps.unwrap_or(Time::MAX), frame: Vec::with_capacity(2048), error: None })
    }

    /// `pkt` left global port `pi` at `at`: written to every file that watches the port.
    pub(crate) fn record(&mut self, pi: usize, at: Time, pkt: &Packet) {
        let watchers = &self.by_port[pi];
        if watchers.is_empty() || self.error.is_some() || at < self.start || at >= self.end {
            return;
        }
        if self.job.is_some() && pkt.header.job() != self.job {
            return;
        }
        self.frame.clear();
        frame::encode(pkt, &mut self.frame);
        self.frame.resize(self.frame.len() + TRAILER_BYTES, 0);
        let (src, dst) = (node_addr(pkt.src, pkt.src_port), node_addr(pkt.dst, pkt.dst_port));
        let wire = (pkt.size as usize).saturating_sub(UDP_FRAMING_BYTES);
        // Nanoseconds: a pcapng interface's finest common resolution (the simulator counts ps).
        let ns = at / 1_000;
        for &(fi, iface) in watchers {
            let (_, path, file) = &mut self.files[fi as usize];
            if let Err(e) = file.write(iface, ns, src, dst, &self.frame, wire) {
                self.error = Some(format!("capture stopped: cannot write {}: {e}", path.display()));
                return;
            }
        }
    }

    /// Flushes every file; the rows for the result.
    pub(crate) fn finish(&mut self) -> Vec<CaptureRow> {
        let mut rows = vec![];
        for (point, path, file) in &mut self.files {
            if let Err(e) = file.flush() {
                self.error.get_or_insert(format!("capture: cannot write {}: {e}", path.display()));
            }
            rows.push(CaptureRow { point: point.clone(), path: path.display().to_string(), packets: file.packets });
        }
        rows
    }
}

/// The directions a capture point sees, as (sending node, its port).
fn resolve(point: &str, topo: &Topology) -> Result<Vec<(NodeId, u16)>, SimError> {
    let node = |name: &str| {
        topo.find(name).ok_or_else(|| {
            let examples: Vec<&str> = topo.nodes.iter().take(3).map(|n| n.name.as_str()).collect();
            SimError::new("capture.at", format!("no node named {name:?} in {point:?} (node names are like {})", examples.join(", ")))
        })
    };
    // Both directions of port `p` of node `n`.
    let both = |n: NodeId, p: usize| {
        let port = &topo.nodes[n as usize].ports[p];
        [(n, p as u16), (port.peer, port.peer_port)]
    };
    if let Some((a, b)) = point.split_once('-').filter(|_| topo.find(point).is_none()) {
        let (a, b) = (node(a)?, node(b)?);
        let ports: Vec<usize> = (0..topo.nodes[a as usize].ports.len()).filter(|&p| topo.nodes[a as usize].ports[p].peer == b).collect();
        if ports.is_empty() {
            return Err(SimError::new("capture.at", format!("{point:?}: {} and {} are not adjacent", topo.nodes[a as usize].name, topo.nodes[b as usize].name)));
        }
        return Ok(ports.into_iter().flat_map(|p| both(a, p)).collect());
    }
    if let Some((n, p)) = point.rsplit_once(':') {
        let n = node(n)?;
        let count = topo.nodes[n as usize].ports.len();
        let p: usize = p.parse().ok().filter(|&p| p < count).ok_or_else(|| {
            SimError::new("capture.at", format!("{point:?}: the port must be a number in 0..{count} (the node's ports)"))
        })?;
        return Ok(both(n, p).to_vec());
    }
    let n = node(point)?;
    Ok((0..topo.nodes[n as usize].ports.len()).flat_map(|p| both(n, p)).collect())
}
