"""The Wireshark dissector (python/inalab/wireshark/inalab.lua), run by tshark over a pcap of
frames whose bytes are the Rust wire crate's test vectors (crates/inalab-wire/src/*.rs), and
the `inalab wireshark` command."""
from __future__ import annotations

import random
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inalab.cli import app

LUA = Path(__file__).resolve().parents[1] / "inalab" / "wireshark" / "inalab.lua"
TSHARK = shutil.which("tshark")
# Skipped without tshark, failed in CI without it (conftest's fixture).
needs_tshark = pytest.mark.usefixtures("tshark_required")

# --- Frames: the byte vectors of crates/inalab-wire's tests ---------------------------------

# frame.rs: ENV = src 0x0A0B0C0D, dst 0x01020304, ports 0x1234 -> 0x5678.
ENV = bytes([0x1A, 0xAB, 1, 0, 0x0A, 0x0B, 0x0C, 0x0D, 0x01, 0x02, 0x03, 0x04, 0x12, 0x34, 0x56, 0x78])
ENV_ECN = ENV[:3] + b"\x01" + ENV[4:]
# The runtime's trailer: sequence number (8 B, big endian), then the 16-byte tag.
SEQ = bytes([0, 0, 0, 0, 0, 0, 0x01, 0x02])
TAG_ONLY = bytes(range(0xA0, 0xB0))
TAG = SEQ + TAG_ONLY

# frame.rs raw_without_payload.
RAW = ENV + bytes([0, 0, 0, 0])
# frame.rs atp_with_i32_values.
ATP = ENV + bytes([
    2, 0, 0, 0, 5, 0x01, 0x02, 0x03, 0x04, 0, 0, 0x05, 0x06, 0, 0, 0, 1, 0x80, 0, 0, 0, 4, 2, 1, 1,
    1, 0, 3, 1, 0, 0, 0, 0xFE, 0xFF, 0xFF, 0xFF, 0x04, 0x03, 0x02, 0x01,
])
# frame.rs switchml_with_f32_values_and_ecn.
SWITCHML = ENV_ECN + bytes([
    3, 0, 0, 0, 7, 0, 0, 0, 9, 0x01, 0x02, 0x03, 0x04, 0, 3, 1, 2, 5,
    2, 0, 2, 0, 0, 0x80, 0x3F, 0, 0, 0x20, 0xC0,
])
# frame.rs transport_with_empty_i32_payload_and_ecn.
TRANSPORT_ACK = ENV_ECN + bytes([
    1, 1, 1, 0, 0, 0x01, 0x02, 0x03, 0x04, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4,
    1, 0, 0,
])
# Header vectors of transport.rs (data), dsa.rs, canary.rs, static_tree.rs (up), rina.rs (data),
# grid.rs, each after ENV and before a payload.
TRANSPORT_DATA_H = bytes([
    1, 0, 2, 0, 0, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C,
    0x0D, 0x0E, 0x0F, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18,
])
DSA_H = bytes([4, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x00, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 24, 0x29])
CANARY_H = bytes([
    5, 0x0A, 0x00, 0x00, 0x05, 0x07, 0x92, 0x34, 0x56, 0x00, 0x03, 0x01, 0x02, 0x80, 0x00, 0x00, 0x21,
    0x03, 0x04, 0b1101_0100,
])
STATIC_TREE_H = bytes([6, 0x01, 0x02, 0x03, 0b0010_0000, 0x80, 0x00, 0x00, 0x05, 0x00, 0x01])
RINA_H = bytes([
    7, 3, 0b10, 3, 0, 0x01, 0x02, 0x00, 0x01, 0x00, 0x02, 0x00, 62, 0x0A, 0x0B, 0x0C, 0x0D,
    0, 0, 0, 5, 0x80, 0, 0, 1, 0, 0, 0, 0,
])
GRID_H = bytes([
    8, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C,
    0x0D, 0x0E, 0x0F, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0, 0,
])
SWITCHML_H = SWITCHML[16:34]


def payload(kind: int, values=()) -> bytes:
    """Payload kind, big-endian count, little-endian values (i32 for kind 1, f32 for 2)."""
    fmt = "<%d%s" % (len(values), "f" if kind == 2 else "i")
    return struct.pack(">BH", kind, len(values)) + struct.pack(fmt, *values)


# --- A pcap of Ethernet / IPv4 / UDP (or TCP) packets ----------------------------------------

def _ip_checksum(h: bytes) -> int:
    s = sum(struct.unpack(">10H", h))
    while s > 0xFFFF:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def _ipv4(proto: int, src: str, dst: str, body: bytes, wire_len: int | None = None) -> bytes:
    total = 20 + (wire_len if wire_len is not None else len(body))
    h = struct.pack(">BBHHHBBH4s4s", 0x45, 0, total, 0, 0x4000, 64, proto, 0,
                    bytes(map(int, src.split("."))), bytes(map(int, dst.split("."))))
    h = h[:10] + struct.pack(">H", _ip_checksum(h)) + h[12:]
    return b"\x02\x00\x00\x00\x00\x02" + b"\x02\x00\x00\x00\x00\x01" + b"\x08\x00" + h + body


def udp_packet(data: bytes, sport: int = 45001, dport: int = 45003, wire_len: int | None = None) -> tuple[bytes, int]:
    """(captured bytes, original length); `wire_len` is the datagram's length on the wire when
    the capture holds only its first bytes (a simulated packet's size)."""
    wire = wire_len if wire_len is not None else len(data)
    udp = struct.pack(">HHHH", sport, dport, 8 + wire, 0) + data
    pkt = _ipv4(17, "10.0.0.1", "10.0.0.2", udp, 8 + wire)
    return pkt, len(pkt) + (wire - len(data))


def tcp_packet(data: bytes, sport: int, dport: int, seq: int) -> tuple[bytes, int]:
    tcp = struct.pack(">HHIIBBHHH", sport, dport, seq, 1, 5 << 4, 0x18, 65535, 0, 0) + data
    a, b = ("10.0.0.1", "10.0.0.2") if dport == 9100 else ("10.0.0.2", "10.0.0.1")
    pkt = _ipv4(6, a, b, tcp)
    return pkt, len(pkt)


def write_pcap(path: Path, packets: list[tuple[bytes, int]]) -> None:
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)]
    for i, (pkt, orig) in enumerate(packets):
        out.append(struct.pack("<IIII", 1_700_000_000 + i, 0, len(pkt), orig) + pkt)
    path.write_bytes(b"".join(out))


CTL_REPLY = b'{"nonce":"ab","ok":true}\n{"event":"peer_failed","job":3,"rank":0,"reason":"worker rank 0 disconnected"}\n'
CTL_SPLIT = (b'{"error":"no such', b' job","ok":false}\n')

# Packet number (1-based) -> what it is. One per header kind, with and without the tag, on
# heuristic ports and on the default data port (9000), then the malformed ones.
PACKETS = [
    ("raw", udp_packet(RAW)),                                                        # 1, no tag
    ("atp", udp_packet(ATP + TAG)),                                                  # 2
    ("switchml", udp_packet(SWITCHML + TAG, 40001, 9000)),                           # 3
    ("transport_ack", udp_packet(TRANSPORT_ACK)),                                    # 4, no tag
    ("transport_data", udp_packet(ENV + TRANSPORT_DATA_H + payload(0) + TAG)),       # 5
    ("dsa", udp_packet(ENV + DSA_H + payload(1, [7]) + TAG, 9000, 40001)),           # 6
    ("canary", udp_packet(ENV + CANARY_H + payload(0) + TAG)),                       # 7
    ("static_tree", udp_packet(ENV + STATIC_TREE_H + payload(2, [0.5]))),            # 8, no tag
    ("rina", udp_packet(ENV + RINA_H + payload(1, [1, 2]) + TAG)),                   # 9
    ("grid", udp_packet(ENV + GRID_H + payload(1, [3]) + TAG)),                      # 10
    ("many_values", udp_packet(ENV + SWITCHML_H + payload(1, list(range(20))) + TAG)),  # 11
    ("gso_train", udp_packet(SWITCHML + TAG + SWITCHML + TAG)),                      # 12
    ("bad_kind", udp_packet(ENV + bytes([200, 0, 0, 0]) + TAG)),                     # 13
    ("short", udp_packet(ENV + ATP[16:27])),                                         # 14
    ("length", udp_packet(RAW + b"\x00" * 5)),                                       # 15
    ("bad_value", udp_packet(ENV + SWITCHML_H[:15] + bytes([2, 4, 5]) + payload(0) + TAG)),  # 16
    # A simulator capture (crates/inalab-sim/src/capture.rs): frame, 16 zero bytes, and an
    # original length of the simulated packet's size.
    ("simulated", udp_packet(ATP + bytes(24), wire_len=306 - 42)),                   # 17
    ("ctl_request", tcp_packet(b'{"op":"hello"}\n{"config":{"scheme":"switchml"},"job":3,"op":"join",'
                               b'"rank":1,"udp":"127.0.0.1:40000","world":2}\n', 40000, 9100, 1000)),  # 18
    ("ctl_reply", tcp_packet(CTL_REPLY, 9100, 40000, 5000)),                        # 19
    ("ctl_split_1", tcp_packet(CTL_SPLIT[0], 9100, 40000, 5000 + len(CTL_REPLY))),  # 20
    ("ctl_split_2", tcp_packet(CTL_SPLIT[1], 9100, 40000, 5000 + len(CTL_REPLY) + len(CTL_SPLIT[0]))),  # 21
]
N = {name: i + 1 for i, (name, _) in enumerate(PACKETS)}


def tshark(pcap: Path, *args: str) -> str:
    if TSHARK is None:
        pytest.fail("tshark is not installed: `make tools` installs Debian's tshark package (these tests need it)")
    r = subprocess.run([TSHARK, "-n", "-r", str(pcap), "-X", f"lua_script:{LUA}", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Lua" not in r.stderr and "rror" not in r.stderr.replace("Running as user", ""), r.stderr
    return r.stdout


def pdml_fields(text: str) -> list[dict[str, list[str]]]:
    """Per packet: field name -> every `show` value, in order."""
    packets = []
    for pkt in ET.fromstring(text).iter("packet"):
        fields: dict[str, list[str]] = {}
        for f in pkt.iter():
            if f.tag in ("proto", "field") and f.get("name"):
                fields.setdefault(f.get("name"), []).append(f.get("show"))
        packets.append(fields)
    return packets


@pytest.fixture(scope="module")
def decoded(tmp_path_factory):
    """PDML fields and (protocol, info) columns of every packet, and the -V text."""
    pcap = tmp_path_factory.mktemp("ws") / "inalab.pcap"
    write_pcap(pcap, [p for _, p in PACKETS])
    pdml = tshark(pcap, "-T", "pdml")
    cols = tshark(pcap, "-T", "fields", "-E", "separator=\t", "-e", "frame.number", "-e", "_ws.col.Protocol",
                  "-e", "_ws.col.Info")
    rows = {int(r.split("\t")[0]): r.split("\t")[1:] for r in cols.splitlines() if r}
    return pdml_fields(pdml), rows, pdml


def fields(decoded, name: str) -> dict[str, list[str]]:
    return decoded[0][N[name] - 1]


def one(decoded, name: str, field: str) -> str:
    values = fields(decoded, name).get(field)
    assert values is not None and len(values) == 1, f"{name}: {field} = {values}"
    return values[0]


def info(decoded, name: str) -> str:
    return decoded[1][N[name]][1]


@needs_tshark
def test_no_lua_errors(decoded):
    assert "Lua Error" not in decoded[2] and "_ws.lua.error" not in decoded[2]


@needs_tshark
def test_envelope_and_protocol_column(decoded):
    for name in ["raw", "atp", "switchml", "dsa", "canary", "static_tree", "rina", "grid", "bad_kind"]:
        assert decoded[1][N[name]][0] == "INALAB", name
    assert one(decoded, "raw", "inalab.magic") == "0x1aab"
    assert one(decoded, "raw", "inalab.src") == str(0x0A0B0C0D)
    assert one(decoded, "raw", "inalab.dst") == str(0x01020304)
    assert one(decoded, "raw", "inalab.srcport") == str(0x1234)
    assert one(decoded, "raw", "inalab.dstport") == str(0x5678)
    assert one(decoded, "raw", "inalab.flags.ecn") == "0"
    assert one(decoded, "switchml", "inalab.flags.ecn") == "1"
    assert one(decoded, "raw", "inalab.kind") == "0"
    assert sorted(fields(decoded, "raw")["inalab.node"]) == sorted([str(0x0A0B0C0D), str(0x01020304)])


@needs_tshark
def test_tag_or_no_tag(decoded):
    for name in ["raw", "transport_ack", "static_tree"]:
        assert one(decoded, name, "inalab.tagged") == "0", name
        assert "inalab.tag" not in fields(decoded, name)
    for name in ["atp", "switchml", "transport_data", "dsa", "canary", "rina", "grid"]:
        assert one(decoded, name, "inalab.tagged") == "1", name
        assert one(decoded, name, "inalab.tag").replace(":", "") == TAG_ONLY.hex(), name
        assert one(decoded, name, "inalab.seq") == "258", name
    assert one(decoded, "atp", "inalab.frame_len") == str(len(ATP))


@needs_tshark
def test_atp(decoded):
    f = lambda k: one(decoded, "atp", "inalab.atp." + k)  # noqa: E731
    assert (f("job"), f("seq"), f("agg_index")) == ("5", str(0x01020304), str(0x0506))
    assert (f("bitmap0"), f("bitmap1")) == ("0x00000001", "0x80000000")
    assert (f("fan_in0"), f("fan_in1"), f("esi")) == ("4", "2", "1")
    assert (f("flags"), f("flags.resend"), f("flags.ack")) == ("0x01", "1", "0")
    assert one(decoded, "atp", "inalab.payload.kind") == "1"
    assert one(decoded, "atp", "inalab.payload.count") == "3"
    assert fields(decoded, "atp")["inalab.value"] == ["1", "-2", str(0x01020304)]
    assert one(decoded, "atp", "inalab.job") == "5"
    assert info(decoded, "atp").startswith("ATP job=5 seq=16909060 agg=1286 esi=1 ")
    assert "resend, 3 i32" in info(decoded, "atp")


@needs_tshark
def test_switchml(decoded):
    f = lambda k: one(decoded, "switchml", "inalab.switchml." + k)  # noqa: E731
    assert (f("job"), f("slot"), f("chunk"), f("wid"), f("ver"), f("exp")) == ("7", "9", str(0x01020304), "3", "1", "5")
    assert (f("flags.retransmit"), f("flags.result")) == ("1", "0")
    assert fields(decoded, "switchml")["inalab.value"] == ["1", "-2.5"]
    assert one(decoded, "switchml", "inalab.payload.kind") == "2"
    i = info(decoded, "switchml")
    assert i.startswith("SwitchML job=7 slot=9 chunk=16909060 wid=3 ver=1 exp=5 retransmit, 2 f32, ")
    assert i.endswith(" CE")


@needs_tshark
def test_transport(decoded):
    f = lambda n, k: one(decoded, n, "inalab.transport." + k)  # noqa: E731
    assert (f("transport_ack", "kind"), f("transport_ack", "flags.ecn_echo"), f("transport_ack", "seq")) == ("1", "1", str(0x01020304))
    assert (f("transport_ack", "msg_id"), f("transport_ack", "msg_offset"), f("transport_ack", "msg_len"), f("transport_ack", "seg_len")) == ("1", "2", "3", "4")
    assert one(decoded, "transport_ack", "inalab.payload.count") == "0"
    assert "inalab.value" not in fields(decoded, "transport_ack")
    assert (f("transport_data", "kind"), f("transport_data", "flags.retransmit")) == ("0", "1")
    assert f("transport_data", "msg_id") == str(0x05060708090A0B0C)
    assert (f("transport_data", "msg_offset"), f("transport_data", "msg_len"), f("transport_data", "seg_len")) == (
        str(0x0D0E0F10), str(0x11121314), str(0x15161718))
    assert info(decoded, "transport_data").startswith("Transport Data seq=16909060 ")


@needs_tshark
def test_dsa(decoded):
    f = lambda k: one(decoded, "dsa", "inalab.dsa." + k)  # noqa: E731
    assert (f("job"), f("psn"), f("bitmap"), f("priority"), f("fan_in")) == (str(0x0102), str(0x03040506), "0x00070809", str(0x0A0B0C0D), "24")
    assert (f("kind"), f("flags.ecn"), f("flags.retx"), f("flags.empty"), f("flags.result")) == ("2", "1", "0", "0", "1")
    assert fields(decoded, "dsa")["inalab.value"] == ["7"]
    assert info(decoded, "dsa").startswith("DSA Evict job=258 ")


@needs_tshark
def test_canary(decoded):
    f = lambda k: one(decoded, "canary", "inalab.canary." + k)  # noqa: E731
    assert (f("dst"), f("tenant"), f("attempt"), f("seq")) == (str(0x0A000005), "7", "2", str(0x123456))
    assert (f("counter"), f("hosts"), f("children"), f("switch")) == ("3", str(0x0102), "0x80000021", str(0x0304))
    assert (f("bypass"), f("multicast"), f("type"), f("shard"), f("spare")) == ("1", "1", "2", "2", "0")
    assert one(decoded, "canary", "inalab.payload.kind") == "0"
    assert info(decoded, "canary").startswith("Canary Restore tenant=7 attempt=2 seq=1193046 ")


@needs_tshark
def test_static_tree(decoded):
    f = lambda k: one(decoded, "static_tree", "inalab.static_tree." + k)  # noqa: E731
    assert (f("job"), f("tree"), f("kind"), f("rtx"), f("spare"), f("seq"), f("counter")) == (
        str(0x0102), "3", "0", "1", "0x00", str(0x80000005), "1")
    assert fields(decoded, "static_tree")["inalab.value"] == ["0.5"]


@needs_tshark
def test_rina(decoded):
    f = lambda k: one(decoded, "rina", "inalab.rina." + k)  # noqa: E731
    assert (f("kind"), f("flags.retx"), f("flags.full"), f("member"), f("hop")) == ("3", "1", "0", "3", "0")
    assert (f("job"), f("step"), f("chunk"), f("count")) == (str(0x0102), "1", "2", "62")
    assert (f("req"), f("req.epoch"), f("req.request"), f("seq"), f("slot"), f("arg")) == (
        "0x0a0b0c0d", "10", str(0x0B0C0D), "5", str(0x80000001), "0")
    assert fields(decoded, "rina")["inalab.value"] == ["1", "2"]


@needs_tshark
def test_grid(decoded):
    f = lambda k: one(decoded, "grid", "inalab.grid." + k)  # noqa: E731
    assert (f("job"), f("frag"), f("node"), f("bitmap"), f("fan_in")) == (
        str(0x01020304), str(0x05060708), str(0x090A0B0C), "0x0d0e0f1011121314", str(0x15))
    assert (f("flags.control"), f("flags.collision"), f("flags.ecn"), f("flags.result"), f("reserved")) == (
        "1", "1", "1", "0", "0x0000")
    assert info(decoded, "grid").startswith("GRID job=16909060 frag=84281096 ")
    assert "control collision" in info(decoded, "grid") or "ecn control collision" in info(decoded, "grid")


@needs_tshark
def test_values_as_fields_stop_at_the_preference(decoded):
    assert one(decoded, "many_values", "inalab.payload.count") == "20"
    assert fields(decoded, "many_values")["inalab.value"] == [str(i) for i in range(16)]


@needs_tshark
def test_gso_train_is_two_frames(decoded):
    f = fields(decoded, "gso_train")
    assert f["inalab.switchml.slot"] == ["9", "9"] and f["inalab.tagged"] == ["1", "1"]
    assert "inalab.expert.length" not in f
    assert info(decoded, "gso_train").endswith("(+1 frames in this datagram)")


@needs_tshark
def test_malformed_frames_get_expert_info(decoded):
    assert "inalab.expert.bad_kind" in fields(decoded, "bad_kind")
    assert "header kind 200" in info(decoded, "bad_kind")
    assert "inalab.expert.short" in fields(decoded, "short")
    assert "Malformed" in info(decoded, "short")
    assert "inalab.expert.length" in fields(decoded, "length")
    f = fields(decoded, "bad_value")
    assert len(f["inalab.expert.bad_value"]) == 2  # ver 2, unknown flag bit
    assert one(decoded, "bad_value", "inalab.switchml.ver") == "2"
    for name in ["raw", "atp", "switchml", "dsa", "canary", "static_tree", "rina", "grid", "gso_train", "simulated"]:
        f = fields(decoded, name)
        assert not any(k.startswith("inalab.expert.") and k != "inalab.expert.uncaptured" for k in f), name
        assert "_ws.malformed" not in f, name
    for name in ["bad_kind", "short", "length", "bad_value"]:
        assert "_ws.malformed" in fields(decoded, name), name


@needs_tshark
def test_simulated_capture_is_not_malformed(decoded):
    f = fields(decoded, "simulated")
    assert one(decoded, "simulated", "inalab.atp.job") == "5" and f["inalab.tagged"] == ["1"]
    assert "inalab.expert.uncaptured" in f
    assert "Malformed" not in info(decoded, "simulated")


@needs_tshark
def test_control_plane(decoded):
    req = fields(decoded, "ctl_request")
    assert req["inalab.ctl.op"] == ["hello", "join"]
    assert req["inalab.ctl.job"] == ["3"] and req["inalab.ctl.rank"] == ["1"] and req["inalab.ctl.world"] == ["2"]
    assert req["inalab.ctl.scheme"] == ["switchml"]
    assert decoded[1][N["ctl_request"]][0] == "INALAB-CTL"
    assert info(decoded, "ctl_request") == "hello; join job=3 rank=1 world=2 scheme=switchml"
    rep = fields(decoded, "ctl_reply")
    assert rep["inalab.ctl.ok"] == ["1"] and rep["inalab.ctl.event"] == ["peer_failed"]
    assert rep["inalab.ctl.reason"] == ["worker rank 0 disconnected"]
    assert "inalab.ctl.expert.event" in rep
    # The line split over two segments is reassembled and dissected with the second.
    assert "inalab.ctl.line" not in fields(decoded, "ctl_split_1")
    end = fields(decoded, "ctl_split_2")
    assert end["inalab.ctl.ok"] == ["0"] and end["inalab.ctl.error"] == ["no such job"]
    assert "inalab.ctl.expert.refused" in end


@needs_tshark
def test_udp_port_preference(tmp_path):
    """The heuristic takes only datagrams that start with the magic and version; on the ports of
    the preference (default 9000 and 9200) everything is inalab, a foreign datagram a malformed
    frame."""
    pcap = tmp_path / "ports.pcap"
    foreign = b"\x00" * 24
    write_pcap(pcap, [udp_packet(foreign, 40001, 9000), udp_packet(foreign, 45001, 45003),
                      udp_packet(foreign, 45001, 45005), udp_packet(RAW, 45001, 45003)])
    fields = ["-T", "fields", "-E", "separator=,", "-e", "_ws.col.Protocol", "-e", "inalab.kind"]
    assert tshark(pcap, *fields).splitlines() == ["INALAB,", "UDP,", "UDP,", "INALAB,0"]
    out = tshark(pcap, "-o", "inalab.udp_ports:45005", "-Y", "inalab.expert.bad_magic", *fields)
    assert out.splitlines() == ["INALAB,"]
    out = tshark(pcap, "-o", "inalab.udp_ports:45005", *fields)
    assert out.splitlines() == ["UDP,", "UDP,", "INALAB,", "INALAB,0"]


@needs_tshark
def test_mutated_frames_never_raise_lua_errors(tmp_path):
    """Frames with bytes flipped, cut or appended, random bytes behind the magic, and cut or
    garbled control lines: dissected (mostly as malformed), never a Lua error."""
    rng = random.Random(20)
    bases = [p[0][42:] for name, p in PACKETS if not name.startswith("ctl")]
    packets, expect = [], []
    for _ in range(600):
        b = bytearray(rng.choice(bases))
        what = rng.randrange(4)
        if what == 0:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif what == 1:
            del b[rng.randrange(3, len(b)):]
        elif what == 2:
            b += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 24)))
        else:
            b = bytearray(b[:3] + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 80))))
        b[16:17] = bytes([rng.randrange(10)]) if len(b) > 16 and rng.random() < 0.3 else b[16:17]
        port = rng.choice([45003, 9000])
        packets.append(udp_packet(bytes(b), 45001, port))
        expect.append("INALAB" if port == 9000 or (len(b) >= 16 and b[:3] == b"\x1a\xab\x01") else "UDP")
    lines = [b'{"op":"join","job":1,"config":{"scheme":"atp","ina":{"x":[1,2,{"y":"\\u00e9\\""}]}}}\n',
             b'{"ok":false,"error":"\\ud800"}\n', b'[1,2]\n', b'{"job":-1,"rank":1.5,"world":1e99}\n']
    for i in range(200):
        line = bytearray(rng.choice(lines))
        if rng.random() < 0.7:
            line[rng.randrange(len(line))] = rng.choice(b'{}[]":,\\ \nabc01')
        packets.append(tcp_packet(bytes(line), 40000 + i, 9100, 1))
        expect.append("INALAB-CTL" if b"\n" in line else "TCP")  # TCP: waits for the line's end
    pcap = tmp_path / "mutated.pcap"
    write_pcap(pcap, packets)
    assert "Lua Error" not in tshark(pcap, "-V")
    assert tshark(pcap, "-T", "fields", "-e", "_ws.col.Protocol").splitlines() == expect


def test_the_dissectors_tables_match_the_wire_crate():
    # Issue #42 item 5: the dissector copies the frame layout by hand; this reads its tables
    # and compares them with the wire crate's own (`_core.wire_layout`), so a header that
    # changes length, or a new kind, fails here until the dissector follows.
    import json
    import re

    from inalab import _core

    layout = json.loads(_core.wire_layout())
    lua = LUA.read_text()

    def const(name):
        m = re.search(rf"^local {name} = (\d+)$", lua, re.M)
        assert m, f"{name} not found in the dissector"
        return int(m.group(1))

    assert (const("ENVELOPE_LEN"), const("SEQ_LEN"), const("TAG_LEN")) == (layout["envelope_len"], layout["seq_len"], layout["tag_len"])
    lens = {int(k): int(n) for k, n in re.findall(r"^KINDS\[(\d+)\] = \{ len = (\d+),", lua, re.M)}
    names_src = re.search(r"local HEADER_KINDS = \{(.*?)\}", lua, re.S).group(1)
    names = {int(k): n for k, n in re.findall(r'\[(\d+)\] = "([^"]+)"', names_src)}
    want_lens = {k["tag"]: k["body_len"] for k in layout["kinds"]}
    want_names = {k["tag"]: k["name"].lower() for k in layout["kinds"]}
    assert lens == want_lens, "header body lengths: dissector vs wire crate"
    assert {k: n.lower() for k, n in names.items()} == want_names, "header kinds: dissector vs wire crate"


def test_the_dissector_ships_in_the_wheel():
    """maturin packs every file of python/inalab that git does not ignore."""
    git = shutil.which("git")
    if git is None or not (LUA.parents[3] / ".git").exists():
        pytest.skip("not a git checkout")
    r = subprocess.run([git, "check-ignore", "-q", str(LUA)], cwd=LUA.parent)
    assert r.returncode == 1, "inalab.lua is ignored by git, so maturin would leave it out of the wheel"


def test_cli_path_and_install(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["wireshark", "--path"])
    assert r.exit_code == 0, r.output
    assert Path(r.stdout.strip()) == LUA and LUA.is_file()
    r = runner.invoke(app, ["wireshark", "--install", "--dir", str(tmp_path / "plugins")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "plugins" / "inalab.lua").read_bytes() == LUA.read_bytes()
    assert str(tmp_path / "plugins" / "inalab.lua") in r.stdout


def test_cli_installs_into_the_personal_plugin_folder(tmp_path, monkeypatch):
    """Without --dir: ~/.local/lib/wireshark/plugins/, where Wireshark 4 looks for personal Lua
    plugins (`tshark -G folders`); tshark then loads it with no -X option."""
    monkeypatch.setenv("HOME", str(tmp_path))
    r = CliRunner().invoke(app, ["wireshark", "--install"])
    assert r.exit_code == 0, r.output
    installed = tmp_path / ".local" / "lib" / "wireshark" / "plugins" / "inalab.lua"
    assert r.stdout.strip() == str(installed) and installed.is_file()
    if TSHARK is not None:
        out = subprocess.run([TSHARK, "-G", "plugins"], capture_output=True, text=True, timeout=60,
                             env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}).stdout
        assert str(installed) in out
