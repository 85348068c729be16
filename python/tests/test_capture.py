"""Packet captures: ``simulate --pcap`` and ``inalab switch --pcap`` write pcapng files whose
packets are the frames that were sent (checked against the runtime's own decoder and the
run's counters), and Wireshark's dissector decodes them to the same field values."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import inalab
from inalab import _core
from inalab.capture import Capture
from inalab.config import ConfigError

TAG_BYTES = 24  # the runtime's trailer after a frame: sequence number and tag (crates/inalab-net/src/auth.rs)
UDP_FRAMING = 42


def read_pcapng(path: Path) -> tuple[list[str], list[dict]]:
    """Interface names and packets (iface, ts_ns, data, orig_len) of a little-endian pcapng
    file with nanosecond timestamps (what inalab writes)."""
    b = path.read_bytes()
    names, packets, i = [], [], 0
    while i < len(b):
        kind, length = struct.unpack_from("<II", b, i)
        body = b[i + 8:i + length - 4]
        if kind == 1:  # interface description: linktype, reserved, snaplen, options
            j, name = 8, None
            while j + 4 <= len(body):
                code, n = struct.unpack_from("<HH", body, j)
                if code == 0:
                    break
                if code == 2:
                    name = body[j + 4:j + 4 + n].decode()
                j += 4 + ((n + 3) & ~3)
            names.append(name)
        elif kind == 6:  # enhanced packet
            iface, hi, lo, cap, orig = struct.unpack_from("<IIIII", body, 0)
            packets.append({"iface": iface, "ts_ns": hi << 32 | lo, "data": body[20:20 + cap], "orig_len": orig})
        i += length
    return names, packets


def frame_of(data: bytes) -> bytes:
    """The inalab frame inside a captured Ethernet/IPv4/UDP packet (without its trailer)."""
    return data[UDP_FRAMING:-TAG_BYTES]


def star(hosts: int = 4, payload: bool = True) -> dict:
    return {
        "name": "capture", "seed": 3, "payload": payload,
        "topology": {"kind": "star", "hosts": hosts, "link_rate": "10Gbps"},
        "jobs": [{"name": "sml", "scheme": "switchml", "allreduce": "64KiB", "iterations": 2, "workers": hosts}],
    }


def test_a_simulated_capture_holds_every_packet_of_its_links_as_sent(tmp_path):
    r = inalab.simulate(star(), pcap=Capture(tmp_path, at=("h1", "s0:2")))
    assert list(r.captures.point) == ["h1", "s0:2"]
    links = r.links.set_index(["src", "dst"])
    # A host's file: what it sends, then what it receives; a switch port's: out, then in.
    for point, host, dirs in (("h1", "h1", [("h1", "s0"), ("s0", "h1")]), ("s0:2", "h2", [("s0", "h2"), ("h2", "s0")])):
        names, pkts = read_pcapng(tmp_path / ("h1.pcapng" if point == "h1" else "s0_2.pcapng"))
        assert names == [f"{a}->{b}" for a, b in dirs]
        # Every packet each direction put on the wire, no more (the run loses none).
        for iface, (a, b) in enumerate(dirs):
            assert sum(p["iface"] == iface for p in pkts) == links.loc[(a, b), "tx_packets"] > 0
        for iface in (0, 1):
            t = [p["ts_ns"] for p in pkts if p["iface"] == iface]
            assert t == sorted(t) and t[-1] <= r.raw["sim_time_s"] * 1e9
        # The bytes are the runtime's frames: the decoder reads envelope, header and values.
        wid = int(host[1:])
        for p in pkts:
            f = json.loads(_core.decode_frame(frame_of(p["data"])))
            assert f["kind"] == "SwitchMl" and f["job"] == 0
            up = names[p["iface"]].startswith(host)
            assert (f["src"], f["dst"]) == ((wid, 4) if up else (4, wid))
            assert (f"wid: {wid}," in f["header"]) or not up
            assert len(f["values"]) > 0, "payload mode carries values"
            # The IPv4 addresses are the node ids', the UDP ports the endpoints'.
            src_ip, dst_ip = p["data"][26:30], p["data"][30:34]
            assert (src_ip[3], dst_ip[3]) == (f["src"], f["dst"])
            assert struct.unpack_from("!HH", p["data"], 34) == (f["src_port"], f["dst_port"])
            assert p["data"][-TAG_BYTES:] == bytes(TAG_BYTES)


def test_metadata_mode_captures_headers_with_the_simulated_size_filtered_by_job_and_window(tmp_path):
    sc = star(hosts=8, payload=False)
    sc["jobs"] = [{**sc["jobs"][0], "name": f"j{j}", "workers": 4} for j in range(2)]
    full = inalab.simulate(sc, pcap=Capture(tmp_path / "all", at=("s0",)))
    n_all = int(full.captures.packets[0])
    end = full.raw["sim_time_s"] / 2
    r = inalab.simulate(sc, pcap=Capture(tmp_path / "part", at=("s0",), job=1, start="0", end=f"{end * 1e6:.3f}us"))
    names, pkts = read_pcapng(tmp_path / "part" / "s0.pcapng")
    assert len(names) == 16, "every port of the switch, both directions"
    assert 0 < len(pkts) < n_all / 2
    assert all(p["ts_ns"] < end * 1e9 for p in pkts)
    for p in pkts:
        f = json.loads(_core.decode_frame(frame_of(p["data"])))
        assert f["job"] == 1 and f["values"] is None
        # No values in metadata mode: the original length is the simulated packet's size.
        assert p["orig_len"] > len(p["data"])
    assert r.jobs.finished.all()


def test_bad_capture_options_name_the_field(tmp_path):
    for cap, field in [
        (Capture(tmp_path, at=("nope",)), "capture.at"),
        (Capture(tmp_path, at=("s0:9",)), "capture.at"),
        (Capture(tmp_path, at=("h0-h1",)), "capture.at"),
        (Capture(tmp_path, start="2ms", end="1ms"), "capture.end"),
        (Capture(tmp_path, start="2 parsecs"), "capture.start"),
        (Capture(tmp_path, job=-1), "capture.job"),
    ]:
        with pytest.raises(ConfigError) as e:
            inalab.simulate(star(), pcap=cap)
        assert e.value.field == field, (cap, str(e.value))


def test_the_cli_writes_captures_and_refuses_options_without_pcap(tmp_path):
    sc = tmp_path / "s.toml"
    sc.write_text('name = "capture"\n[topology]\nkind = "star"\nhosts = 4\nlink_rate = "10Gbps"\n\n[[jobs]]\n'
                  'scheme = "switchml"\nallreduce = "64KiB"\nworkers = 4\n')
    p = subprocess.run([sys.executable, "-m", "inalab", "simulate", str(sc), "--pcap", str(tmp_path / "c"), "--pcap-at", "h0,s0-h3"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "h0.pcapng" in p.stderr and (tmp_path / "c" / "s0-h3.pcapng").exists()
    p = subprocess.run([sys.executable, "-m", "inalab", "simulate", str(sc), "--pcap-at", "h0"], capture_output=True, text=True)
    assert p.returncode == 2 and "need --pcap" in p.stderr
    p = subprocess.run([sys.executable, "-m", "inalab", "simulate", str(sc), "--pcap", str(tmp_path / "d"), "--pcap-window", "5ms"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "--pcap-window" in p.stderr


def test_a_real_switch_captures_every_datagram_in_and_out(tmp_path):
    path = tmp_path / "sw.pcapng"
    sw = inalab.Switch("switchml", udp="127.0.0.1:0", control="127.0.0.1:0", pcap=path)
    udp = sw.udp_addr
    try:
        world, n = 2, 5000
        rng = np.random.default_rng(1)
        data = [rng.uniform(-1, 1, n).astype(np.float32) for _ in range(world)]
        out = [None] * world

        def worker(r):
            c = inalab.Client(sw.control_addr, job=7, rank=r, world=world, scheme="switchml")
            try:
                out[r] = c.allreduce(data[r])
            finally:
                c.close()

        ts = [threading.Thread(target=worker, args=(r,)) for r in range(world)]
        [t.start() for t in ts]
        [t.join(60) for t in ts]
        assert all(o is not None for o in out)
        stats = sw.stats()
    finally:
        sw.stop()
    names, pkts = read_pcapng(path)
    assert names == [f"{udp} in", f"{udp} out"]
    ins = [p for p in pkts if p["iface"] == 0]
    outs = [p for p in pkts if p["iface"] == 1]
    assert (len(ins), len(outs)) == (stats["received"], stats["io"]["datagrams_sent"])
    assert stats["capture"]["packets"] == len(pkts) and stats["capture"]["error"] is None
    for p in ins:
        f = json.loads(_core.decode_frame(frame_of(p["data"])))
        assert f["kind"] == "SwitchMl" and f["job"] == 7
        # The real socket addresses: a worker's port in, the switch's out.
        assert struct.unpack_from("!H", p["data"], 36)[0] == int(udp.rsplit(":", 1)[1])


# ---- Wireshark's view of the same captures --------------------------------------------------

LUA = Path(inalab.__file__).parent / "wireshark" / "inalab.lua"
FIELDS = ["inalab.src", "inalab.dst", "inalab.srcport", "inalab.dstport", "inalab.switchml.job", "inalab.switchml.slot",
          "inalab.switchml.chunk", "inalab.switchml.wid", "inalab.switchml.ver", "inalab.payload.count"]


def dissected(path: Path) -> list[list[str]]:
    """tshark's decoding of every packet of a capture with inalab's dissector: FIELDS per packet."""
    from conftest import TSHARK

    args = [TSHARK, "-n", "-r", str(path), "-X", f"lua_script:{LUA}", "-T", "fields", "-E", "separator=,"]
    for f in FIELDS:
        args += ["-e", f]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Lua" not in r.stderr, r.stderr
    return [line.split(",") for line in r.stdout.splitlines()]


def sent(pkts: list[dict]) -> list[list[str]]:
    """The same fields as the runtime's decoder reads them from the captured frames."""
    rows = []
    for p in pkts:
        f = json.loads(_core.decode_frame(frame_of(p["data"])))
        h = dict(kv.split(": ") for kv in f["header"].split("{", 1)[1].rstrip(" })").split(", "))
        rows.append([str(f["src"]), str(f["dst"]), str(f["src_port"]), str(f["dst_port"]), str(f["job"]), h["slot"],
                     h["chunk"], h["wid"], h["ver"], str(len(f["values"] or []))])
    return rows


@pytest.mark.usefixtures("tshark_required")
def test_wireshark_decodes_a_simulated_and_a_real_capture_to_what_was_sent(tmp_path):
    # Simulated: a SwitchML job in payload mode, captured at a worker.
    inalab.simulate(star(), pcap=Capture(tmp_path / "sim", at=("h1",)))
    _, pkts = read_pcapng(tmp_path / "sim" / "h1.pcapng")
    assert dissected(tmp_path / "sim" / "h1.pcapng") == sent(pkts)
    # Real: the software switch's own capture of a 2-worker job.
    path = tmp_path / "real.pcapng"
    sw = inalab.Switch("switchml", udp="127.0.0.1:0", control="127.0.0.1:0", pcap=path)
    try:
        def worker(r):
            with_client = inalab.Client(sw.control_addr, job=9, rank=r, world=2, scheme="switchml")
            try:
                with_client.allreduce(np.full(3000, r + 0.5, dtype=np.float32))
            finally:
                with_client.close()

        ts = [threading.Thread(target=worker, args=(r,)) for r in range(2)]
        [t.start() for t in ts]
        [t.join(60) for t in ts]
    finally:
        sw.stop()
    _, pkts = read_pcapng(path)
    assert len(pkts) > 4
    assert dissected(path) == sent(pkts)
