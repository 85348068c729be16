//! `inalab switch --pcap FILE`: every datagram the switch's data-plane socket receives and
//! sends, as pcapng (crate `inalab-pcap`, the simulator's captures' format), timestamped by the
//! wall clock (nanoseconds since the Unix epoch), on two interfaces, "ADDR in" and "ADDR out".
//! The datagrams are the real ones (frame and tag) inside Ethernet/IPv4/UDP headers with the
//! real socket addresses; a peer on IPv6 is counted, not captured.

use inalab_pcap::CaptureFile;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

const IN: u32 = 0;
const OUT: u32 = 1;

pub struct WireCapture {
    file: CaptureFile,
    path: PathBuf,
    local: SocketAddr,
    not_ipv4: u64,
    /// The first write error; capturing stops there (the switch goes on) and stats say why.
    error: Option<String>,
}

impl WireCapture {
    pub fn create(path: &Path, local: SocketAddr) -> std::io::Result<WireCapture> {
        let file = CaptureFile::create(path, &[format!("{local} in"), format!("{local} out")])?;
        Ok(WireCapture { file, path: path.to_path_buf(), local, not_ipv4: 0, error: None })
    }

    pub fn received(&mut self, from: SocketAddr, datagram: &[u8]) {
        self.write(IN, from, self.local, datagram);
    }

    pub fn sent(&mut self, to: SocketAddr, datagram: &[u8]) {
        self.write(OUT, self.local, to, datagram);
    }

    fn write(&mut self, iface: u32, src: SocketAddr, dst: SocketAddr, datagram: &[u8]) {
        if self.error.is_some() {
            return;
        }
        let (SocketAddr::V4(src), SocketAddr::V4(dst)) = (src, dst) else {
            self.not_ipv4 += 1;
            return;
        };
        let ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        if let Err(e) = self.file.write(iface, ns, src, dst, datagram, datagram.len()) {
            self.error = Some(format!("capture stopped: cannot write {}: {e}", self.path.display()));
        }
    }

    pub fn flush(&mut self) {
        if let Err(e) = self.file.flush() {
            self.error.get_or_insert(format!("capture: cannot write {}: {e}", self.path.display()));
        }
    }

    pub fn stats(&self) -> Value {
        json!({"path": self.path.display().to_string(), "packets": self.file.packets, "not_ipv4": self.not_ipv4, "error": self.error})
    }
}
