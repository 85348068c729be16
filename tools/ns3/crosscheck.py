"""Cross-check inalab's packet simulator against ns-3 on small scenarios.

    .venv/bin/pip install ns3                 # once; ns-3.44 with cppyy bindings (not for CI)
    .venv/bin/python tools/ns3/crosscheck.py  # prints the tables of docs/validation.md

Scenarios (see docs/validation.md for the modelling on each side):

1. line:  h0 - s0 - s1 - s2 - h1, 1 us per link, one UDP flow of N x 1500-byte packets sent
   back to back at line rate. (1a) all links 100 Gbps, (1b) s1-s2 at 40 Gbps (bottleneck).
   Closed form for a store-and-forward tandem of FIFO links (rates r_i, delays d_i):
       first arrival = sum_i (S / r_i + d_i)
       last arrival  = first arrival + (N - 1) * S / min_i r_i
2. incast: 16 senders -> 1 sink through one 100 Gbps switch, 1 us links, each sender
   667 x 1500 B (1,000,500 B) at line rate from t = 0, switch egress buffer B bytes,
   drop-tail. (2a) B = 200,000 B, (2b) B = 1 MiB, (2c) B = 200,000 B with 306-byte packets,
   (2d) as 2a but sender i starts at (i-1) x 7.5 ns, so arrivals no longer coincide with the
   end of a transmission at the switch (probes how the packet in service is counted).
   Closed form for the sink link (busy from the first arrival on): with D packets delivered,
       last arrival = (S/r + d) + D * S/r + d
   and, when all senders start together (2a-2c), D = (n - 1) + floor(B / S).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import inalab._core as core  # noqa: E402
import ns3_scenarios as ns3  # noqa: E402

G = 100_000_000_000
US = 1_000_000  # ps
PS_PER_S = 10**12


def ser_ps(size, rate):
    return size * 8 * PS_PER_S // rate


# ---- inalab side ----------------------------------------------------------------------


def inalab_run(nodes, links, flows, buffer_bytes, stop_ps):
    """nodes: [(name, kind)], links: (a, b, rate, delay) by index, flows: (src, dst, n, size, start)."""
    topo = {
        "shape": {
            "kind": "edges",
            "nodes": [{"name": n, "kind": k} for n, k in nodes],
            "links": [{"a": nodes[a][0], "b": nodes[b][0], "rate_bps": r, "delay_ps": d} for a, b, r, d in links],
        },
        "programmable": "none",
    }
    spec = {
        "name": "crosscheck",
        "seed": 1,
        "payload": False,
        "stop_ps": stop_ps,
        "topology": topo,
        "network": {"buffer_bytes": buffer_bytes, "ecn_threshold_bytes": 1 << 40, "routing": {"kind": "ecmp"}, "aggregator_memory_bytes": 0},
        "jobs": [],
        "flows": [{"src": nodes[s][0], "dst": nodes[d][0], "bytes": n * size, "packet_bytes": size, "start_ps": st} for s, d, n, size, st in flows],
        "background": None,
        "metrics": {"bin_ps": 10 * US},
    }
    r = json.loads(core.simulate(json.dumps(spec)))
    fl = r["flows"]
    rx_pk = sum(f["packets_received"] for f in fl)
    return {
        "rx_packets": rx_pk,
        "rx_bytes": sum(f["bytes_received"] for f in fl),
        "first_rx_ps": round(min(f["first_rx_s"] for f in fl if f["packets_received"]) * PS_PER_S),
        "last_rx_ps": round(max(f["last_rx_s"] for f in fl if f["packets_received"]) * PS_PER_S),
        "drops": sum(l["drops_queue"] for l in r["links"]),
        "per_flow_rx": [f["packets_received"] for f in fl],
        "stopped_by": r["stopped_by"],
        "conservation_holds": r["conservation"]["holds"],
    }


def ns3_run(nodes, links, flows, buffer_bytes, stop_ps):
    r = ns3.run([k for _, k in nodes], links, flows, buffer_bytes, stop_ps)
    r["drops"] = r["switch_drops"] + r["host_queue_drops"] + r["tc_drops"]
    # ns-3's MacRx sees the PPP frame; bytes on the wire are what inalab counts too.
    return r


# ---- scenarios ------------------------------------------------------------------------


def line(mid_rate, n=100, size=1500):
    nodes = [("h0", "host"), ("s0", "switch"), ("s1", "switch"), ("s2", "switch"), ("h1", "host")]
    rates = [G, G, mid_rate, G]
    links = [(i, i + 1, rates[i], US) for i in range(4)]
    flows = [(0, 4, n, size, 0)]
    first = sum(ser_ps(size, r) + US for r in rates)
    last = first + (n - 1) * ser_ps(size, min(rates))
    closed = {"rx_packets": n, "rx_bytes": n * size, "drops": 0, "first_rx_ps": first, "last_rx_ps": last}
    return nodes, links, flows, 1 << 20, closed


def incast(buffer_bytes, senders=16, n=667, size=1500, stagger_ps=0):
    nodes = [("h0", "host")] + [(f"h{i}", "host") for i in range(1, senders + 1)] + [("sw", "switch")]
    sw = senders + 1
    links = [(h, sw, G, US) for h in range(senders + 1)]
    flows = [(h, 0, n, size, (h - 1) * stagger_ps) for h in range(1, senders + 1)]
    t = ser_ps(size, G)
    closed = {"first_rx_ps": 2 * (t + US)}
    if stagger_ps == 0:
        # Arrivals coincide with the ends of transmissions at the switch; once the buffer is
        # full, one packet is admitted per transmission time and floor(B / S) packets are in
        # the switch (waiting or starting service) when the last arrivals come, at the
        # (n-1)-th completion: D = (n - 1) + floor(B / S), sink link busy from t + d on.
        d = (n - 1) + buffer_bytes // size
        closed.update(rx_packets=d, rx_bytes=d * size, drops=senders * n - d, last_rx_ps=incast_last(d, size))
    return nodes, links, flows, buffer_bytes, closed


def incast_last(d, size=1500):
    """Last arrival at the sink when the sink link carries D packets back to back from the
    first arrival at the switch on."""
    t = ser_ps(size, G)
    return (t + US) + d * t + US


SCENARIOS = [
    ("1a", "line h0-s0-s1-s2-h1, 4 x 100 Gbps, 100 x 1500 B", lambda: line(G)),
    ("1b", "line, s1-s2 at 40 Gbps, 100 x 1500 B", lambda: line(40_000_000_000)),
    ("2a", "incast 16->1, 100 Gbps, buffer 200,000 B, 16 x 667 x 1500 B", lambda: incast(200_000)),
    ("2b", "incast 16->1, 100 Gbps, buffer 1 MiB, 16 x 667 x 1500 B", lambda: incast(1 << 20)),
    ("2c", "incast 16->1, 100 Gbps, buffer 200,000 B, 16 x 3268 x 306 B", lambda: incast(200_000, n=3268, size=306)),
    ("2d", "as 2a, sender i starts at (i-1) x 7.5 ns", lambda: incast(200_000, stagger_ps=7_500)),
]


def fmt_ps(ps):
    return f"{ps / 1e6:.6f}" if ps is not None and ps >= 0 else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="also print every raw result as JSON")
    args = ap.parse_args()
    stop = 10_000 * US  # 10 ms: far beyond every scenario's end
    print(f"inalab vs {ns3.version()}; times in us, sizes are bytes on the wire\n")
    print("| scen. | description | simulator | delivered pkts | delivered bytes | drops | first arrival (us) | last arrival (us) | per-flow delivered |")
    print("|---|---|---|---|---|---|---|---|---|")
    raw = {}
    for key, desc, make in SCENARIOS:
        nodes, links, flows, buf, closed = make()
        a = inalab_run(nodes, links, flows, buf, stop)
        b = ns3_run(nodes, links, flows, buf, stop)
        closed_ns3 = None
        if "last_rx_ps" not in closed:  # D not in closed form: use the simulators' D
            size = flows[0][3]
            closed["last_rx_ps"] = incast_last(a["rx_packets"], size)
            closed_ns3 = incast_last(b["rx_packets"], size)
        raw[key] = {"inalab": a, "ns3": b, "closed": closed}
        for name, r in (("inalab", a), ("ns-3", b)):
            pf = r["per_flow_rx"]
            pf_s = str(pf[0]) if len(pf) == 1 else f"min {min(pf)} max {max(pf)}"
            if name == "ns-3":
                same = pf == a["per_flow_rx"]
                pf_s += " (= inalab's, flow by flow)" if same else f" (differs from inalab's flow by flow: max abs diff {max(abs(x - y) for x, y in zip(pf, a['per_flow_rx']))})"
            print(f"| {key} | {desc} | {name} | {r['rx_packets']:,} | {r['rx_bytes']:,} | {r['drops']:,} | {fmt_ps(r['first_rx_ps'])} | {fmt_ps(r['last_rx_ps'])} | {pf_s} |")
        c = closed
        extra = f" from inalab's D; {fmt_ps(closed_ns3)} from ns-3's D" if closed_ns3 else ""
        print(
            f"| {key} | {desc} | closed form | {format(c['rx_packets'], ',') if 'rx_packets' in c else '-'} | "
            f"{format(c['rx_bytes'], ',') if 'rx_bytes' in c else '-'} | {format(c['drops'], ',') if 'drops' in c else '-'} | {fmt_ps(c['first_rx_ps'])} | {fmt_ps(c['last_rx_ps'])}{extra} | |"
        )
    if args.json:
        print()
        print(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
