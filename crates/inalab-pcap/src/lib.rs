//! Capture files of inalab traffic, as Wireshark and tshark read them: pcapng (the `pcap-file`
//! crate writes the blocks) with one interface per capture direction, nanosecond timestamps,
//! and each inalab datagram wrapped in the Ethernet, IPv4 and UDP headers it would cross a
//! real network in. The simulator (timestamps from its clock) and the UDP runtime's switch
//! (timestamps from the wall clock) write the same format, so captures of one scenario open
//! side by side; the dissector is `python/inalab/wireshark/inalab.lua`.
//!
//! Addresses: a real capture keeps the datagram's socket addresses. A simulated one has
//! none, so [`node_addr`] gives node `n` the IPv4 address `10.n` (the node id's three low
//! bytes) and the UDP port of the protocol endpoint. MAC addresses are `02:00` followed by
//! the IPv4 address (locally administered).

use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption};
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::DataLink;
use std::borrow::Cow;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;
use std::time::Duration;

/// Bytes of the Ethernet (14), IPv4 (20) and UDP (8) headers around a datagram.
pub const UDP_FRAMING_BYTES: usize = 42;
/// The snapshot length the interfaces declare: any UDP datagram fits.
const SNAPLEN: u32 = 65_535;

/// The simulated address of node `node`'s endpoint `port`: 10.x.y.z from the node id's low
/// three bytes (node ids above 2^24 wrap; no topology has that many nodes).
pub fn node_addr(node: u32, port: u16) -> SocketAddrV4 {
    let [_, a, b, c] = node.to_be_bytes();
    SocketAddrV4::new(Ipv4Addr::new(10, a, b, c), port)
}

/// Appends an Ethernet II / IPv4 / UDP packet from `src` to `dst` carrying `payload` to `out`.
/// The IPv4 header checksum is computed; the UDP checksum is 0 (allowed in IPv4: none).
/// `ip_len` is the IP datagram's length on the wire, at least the real one (a simulated packet
/// may be larger than the bytes a capture holds of it); it saturates at 65,535.
pub fn udp_frame(src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8], wire_payload: usize, out: &mut Vec<u8>) {
    let mac = |ip: &Ipv4Addr| {
        let o = ip.octets();
        [0x02, 0x00, o[0], o[1], o[2], o[3]]
    };
    out.extend_from_slice(&mac(dst.ip()));
    out.extend_from_slice(&mac(src.ip()));
    out.extend_from_slice(&0x0800u16.to_be_bytes());
    let udp_len = (8 + wire_payload.max(payload.len())).min(65_535 - 20) as u16;
    let ip_start = out.len();
    out.extend_from_slice(&[0x45, 0]);
    out.extend_from_slice(&(udp_len + 20).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]); // id 0, DF, TTL 64, UDP, checksum
    out.extend_from_slice(&src.ip().octets());
    out.extend_from_slice(&dst.ip().octets());
    let sum = checksum(&out[ip_start..ip_start + 20]);
    out[ip_start + 10..ip_start + 12].copy_from_slice(&sum.to_be_bytes());
    out.extend_from_slice(&src.port().to_be_bytes());
    out.extend_from_slice(&dst.port().to_be_bytes());
    out.extend_from_slice(&udp_len.to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(payload);
}

/// The Internet checksum (RFC 1071) of `bytes` (even length).
fn checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

/// One pcapng file with named interfaces (capture directions), written as packets come.
pub struct CaptureFile {
    writer: PcapNgWriter<BufWriter<File>>,
    interfaces: u32,
    scratch: Vec<u8>,
    /// Packets written.
    pub packets: u64,
}

impl CaptureFile {
    /// Creates `path` with one Ethernet interface per name in `interfaces` (nanosecond
    /// timestamps).
    pub fn create(path: &Path, interfaces: &[String]) -> io::Result<CaptureFile> {
        let file = BufWriter::with_capacity(1 << 16, File::create(path)?);
        let mut writer = PcapNgWriter::new(file).map_err(pcap_error)?;
        for name in interfaces {
            let idb = InterfaceDescriptionBlock {
                linktype: DataLink::ETHERNET,
                snaplen: SNAPLEN,
                options: vec![InterfaceDescriptionOption::IfName(Cow::Borrowed(name)), InterfaceDescriptionOption::IfTsResol(9)],
            };
            writer.write_pcapng_block(idb).map_err(pcap_error)?;
        }
        Ok(CaptureFile { writer, interfaces: interfaces.len() as u32, scratch: Vec::with_capacity(2048), packets: 0 })
    }

    /// Writes one UDP datagram seen on `interface` at `ts_ns` (nanoseconds since the epoch
    /// of the capture: the simulation's start, or the Unix epoch for real traffic).
    /// `wire_payload` is the datagram's length on the wire when it is longer than `payload`
    /// (the capture then holds its first bytes only, as a snapshot length would).
    pub fn write(&mut self, interface: u32, ts_ns: u64, src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8], wire_payload: usize) -> io::Result<()> {
        debug_assert!(interface < self.interfaces, "interface {interface} was not declared");
        self.scratch.clear();
        udp_frame(src, dst, payload, wire_payload, &mut self.scratch);
        let original_len = (UDP_FRAMING_BYTES + wire_payload.max(payload.len())) as u32;
        let epb = EnhancedPacketBlock {
            interface_id: interface,
            timestamp: Duration::from_nanos(ts_ns),
            original_len,
            data: Cow::Borrowed(&self.scratch),
            options: vec![],
        };
        self.writer.write_pcapng_block(epb).map_err(pcap_error)?;
        self.packets += 1;
        Ok(())
    }

    /// Flushes the file (also done on drop, errors then ignored).
    pub fn flush(&mut self) -> io::Result<()> {
        self.writer.get_mut().flush()
    }
}

impl Drop for CaptureFile {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

fn pcap_error(e: pcap_file::PcapError) -> io::Error {
    match e {
        pcap_file::PcapError::IoError(e) => e,
        other => io::Error::other(other.to_string()),
    }
}

/// A file name for a capture point: its characters other than letters, digits, `-`, `_`
/// and `.` become `_`.
pub fn file_name(point: &str) -> String {
    let s: String = point.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect();
    format!("{s}.pcapng")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The framing's bytes, pinned: MACs from the addresses, a valid IPv4 header checksum,
    /// lengths that count the payload on the wire.
    #[test]
    fn udp_framing_vector() {
        let (src, dst) = (node_addr(3, 7), node_addr(0x01_0203, 9000));
        assert_eq!((src.to_string(), dst.to_string()), ("10.0.0.3:7".to_string(), "10.1.2.3:9000".to_string()));
        let mut b = vec![];
        udp_frame(src, dst, &[0xAA, 0xBB], 2, &mut b);
        #[rustfmt::skip]
        let want = [
            0x02, 0x00, 10, 1, 2, 3, 0x02, 0x00, 10, 0, 0, 3, 0x08, 0x00, // Ethernet
            0x45, 0, 0, 30, 0, 0, 0x40, 0, 64, 17, 0x24, 0xC9, 10, 0, 0, 3, 10, 1, 2, 3, // IPv4
            0, 7, 0x23, 0x28, 0, 10, 0, 0, // UDP 7 -> 9000, length 10
            0xAA, 0xBB,
        ];
        assert_eq!(b, want);
        assert_eq!(checksum(&b[14..34]), 0, "a header with its checksum sums to zero");
        // A datagram longer on the wire than captured: the lengths say so.
        b.clear();
        udp_frame(src, dst, &[1], 100, &mut b);
        assert_eq!((u16::from_be_bytes([b[16], b[17]]), u16::from_be_bytes([b[38], b[39]])), (128, 108));
    }

    #[test]
    fn a_capture_file_is_pcapng_with_its_interfaces_and_packets() {
        let dir = std::env::temp_dir().join(format!("inalab-pcap-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(file_name("s0:2"));
        assert!(path.ends_with("s0_2.pcapng"));
        let mut f = CaptureFile::create(&path, &["h0->s0".into(), "s0->h0".into()]).unwrap();
        f.write(1, 1_500, node_addr(4, 1), node_addr(0, 2), b"frame", 300).unwrap();
        f.write(0, 2_000, node_addr(0, 2), node_addr(4, 1), b"x", 1).unwrap();
        assert_eq!(f.packets, 2);
        drop(f);
        let mut r = pcap_file::pcapng::PcapNgReader::new(File::open(&path).unwrap()).unwrap();
        let mut seen = vec![];
        while let Some(b) = r.next_block() {
            if let pcap_file::pcapng::Block::EnhancedPacket(p) = b.unwrap() {
                seen.push((p.interface_id, p.timestamp.as_nanos(), p.original_len, p.data.len()));
            }
        }
        assert_eq!(seen, vec![(1, 1_500, 342, 47), (0, 2_000, 43, 43)]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
