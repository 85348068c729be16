"""Simulator speed benchmark (a script, not a test).

    .venv/bin/python benchmarks/sim_speed.py            # inalab scenarios a, b, c (+ ns-3 if `import ns` works)
    .venv/bin/python benchmarks/sim_speed.py --ns3      # insist on the ns-3 comparison of scenario (a),
                                                        # installing ns-3 in an environment of its own
    .venv/bin/python benchmarks/sim_speed.py --no-ns3   # skip it
    .venv/bin/python benchmarks/sim_speed.py --only a   # a subset, e.g. "a,c"

Scenarios (all links 100 Gbps, 1 us propagation delay, switch buffer 1 MiB per egress port,
ECN threshold 200 KB, seed 1):

(a) star of 65 hosts: h1..h64 each send 306-byte datagrams back to back at line rate to h0
    (`flows`, bytes = 100 Gbps x 1 ms / 8 = 12.5 MB each, stop at 1 ms). 64:1 incast, so the
    sink port is saturated and most packets are dropped at the switch.
(b) star of 64 hosts, one 4 MiB ring allreduce over all 64 (one iteration, no jitter).
(c) Canary 1024-host leaf-spine (32 leaves x 32 hosts, 32 spines, 64-port switches),
    adaptive routing (threshold 0.5). A 4 MiB ring allreduce on the 512 even-numbered hosts
    (h0, h2, ..., h1022, ring in that order: 16 workers on every leaf, so the ring shares every
    leaf and its uplinks with the background traffic) while the 512 odd-numbered hosts run
    random-uniform background traffic at load 0.5 with 1 MiB messages of 1500-byte packets.
    The run ends when the allreduce finishes (background alone never ends a run).
(b') r1024: the 4 MiB ring of (b) over 1024 hosts of a 1024-port star, to compare the cost per
    event with (b)'s 64 hosts.
(canary) the `canary-congestion` point of `inalab reproduce canary-congestion`: Canary's 4 MiB
    allreduce on 512 random hosts of the 1024-host fat tree (300 ns links, 64 MiB buffers,
    adaptive routing), the other 512 sending 1 MiB messages at line rate (issue #16: < 60 s).
(d) dsa: DSA's 8 jobs x 8 workers of DNN A on one star switch with 5 MB of aggregator memory
    (`inalab reproduce dsa-policy-ablation`'s scenario).

Each scenario runs in a child process; "CPU s" is that process's CPU time around the call and
"state MB" how far its peak resident set grew during it (the simulator's own memory).

"tx" is the sum of `tx_packets` over all link directions (one per packet per hop).
Wall time is measured around `inalab._core.simulate` (spec parsing, setup, JSON out included).

The ns-3 side of (a) is built by `tools/ns3/ns3_scenarios.py` (run in a subprocess, so a
broken ns-3 install cannot take the benchmark down); see that file for the modelling.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import inalab._core as core

G = 100_000_000_000
US = 1_000_000  # ps
MS = 1_000 * US
ROOT = Path(__file__).resolve().parents[1]

TRANSPORT = {"mss_bytes": 1436, "header_bytes": 64, "rto_ps": 1_000_000_000, "init_window_bytes": 60_000, "increment_bytes": 1500}


def base(topo, jobs=(), flows=(), stop_ps=MS, bg=None, routing=None):
    return {
        "name": "bench",
        "seed": 1,
        "payload": False,
        "stop_ps": stop_ps,
        "topology": topo,
        "network": {
            "buffer_bytes": 1 << 20,
            "ecn_threshold_bytes": 200_000,
            "routing": routing or {"kind": "ecmp"},
            "aggregator_memory_bytes": 0,
        },
        "jobs": list(jobs),
        "flows": list(flows),
        "background": bg,
        "metrics": {"bin_ps": 100 * US},
    }


def star(hosts):
    return {"shape": {"kind": "star", "hosts": hosts, "switch_ports": 128, "link_rate_bps": G, "link_delay_ps": US}}


def ring_job(workers, nbytes=4 * 1024 * 1024):
    return {
        "id": 0,
        "name": "ring",
        "scheme": "ring",
        "workers": workers,
        "workload": {"kind": "allreduce", "bytes": nbytes, "iterations": 1},
        "start_ps": 0,
        "jitter_ps": 0,
        "transport": TRANSPORT,
    }


def scenario_a():
    n = 64
    nbytes = G * 1 // 1000 // 8  # 100 Gbps x 1 ms / 8 = 12.5 MB
    flows = [{"src": f"h{i}", "dst": "h0", "bytes": nbytes, "packet_bytes": 306, "start_ps": 0} for i in range(1, n + 1)]
    return base(star(n + 1), flows=flows, stop_ps=MS)


def scenario_b():
    return base(star(64), jobs=[ring_job([f"h{i}" for i in range(64)])], stop_ps=1_000 * MS)


def scenario_c():
    topo = {
        "shape": {
            "kind": "leaf_spine",
            "leaves": 32,
            "spines": 32,
            "hosts_per_leaf": 32,
            "switch_ports": 64,
            "host_rate_bps": G,
            "fabric_rate_bps": G,
            "link_delay_ps": US,
        }
    }
    ar = [f"h{i}" for i in range(0, 1024, 2)]
    bg = {"hosts": [f"h{i}" for i in range(1, 1024, 2)], "load": 0.5, "message_bytes": 1 << 20, "packet_bytes": 1500, "start_ps": 0}
    # stop_ps is only a safety net: the run ends when the allreduce completes.
    return base(topo, jobs=[ring_job(ar)], bg=bg, routing={"kind": "adaptive", "threshold": 0.5}, stop_ps=200 * MS)


def scenario_r1024():
    """Scaling check: the same 4 MiB ring as (b), over 1024 hosts of a 1024-port star."""
    topo = star(1024)
    topo["shape"]["switch_ports"] = 1024
    return base(topo, jobs=[ring_job([f"h{i}" for i in range(1024)])], stop_ps=1_000 * MS)


def scenario_dsa():
    """DSA §VII-B's 8 jobs x 8 workers of DNN A on one star switch (the scenario of
    `inalab reproduce dsa-policy-ablation`), built by the Python front."""
    from inalab.config import load_scenario
    from inalab.reproduce.dsa_policy_ablation import scenario

    return load_scenario(scenario("dsa", "dsa", "A")).to_spec()


def scenario_canary():
    """Fig. 7a's congested Canary point (`inalab reproduce canary-congestion`), built by the
    Python front."""
    from inalab.config import load_scenario
    from inalab.reproduce.canary import scenario

    return load_scenario(scenario("canary", congested=True)).to_spec()


SCENARIOS = {
    "a": ("(a) 64->1 star, 306 B at line rate, 1 ms", scenario_a),
    "b": ("(b) 4 MiB ring allreduce, 64-host star", scenario_b),
    "c": ("(c) 4 MiB ring on 512 + bg 512, 1024-host leaf-spine", scenario_c),
    "r1024": ("(b') 4 MiB ring allreduce, 1024-host star", scenario_r1024),
    "dsa": ("(d) DSA 8 jobs x 8 workers, DNN A, 72-host star", scenario_dsa),
    "canary": ("Canary 512 + bg 512, 1024-host fat tree (Fig. 7a point)", scenario_canary),
}


def stderr_progress(label):
    last = [0.0]

    def cb(frac, events, sim_time_s):  # called every 0.1 s; a line every 2 s
        if time.monotonic() - last[0] >= 2.0:
            last[0] = time.monotonic()
            print(f"  [{label}] {100 * frac:5.1f}%  {events:,} events, {sim_time_s * 1e3:.3f} ms simulated", file=sys.stderr, flush=True)

    return cb


def run(key):
    """Runs one scenario in a child process (so its memory peak is its own) and returns its row."""
    p = subprocess.run([sys.executable, __file__, "--child", key], stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"scenario {key} failed (exit {p.returncode})")
    return json.loads(p.stdout.strip().splitlines()[-1])


def child(key):
    """In the child: simulate, and measure wall and CPU time around the call and the growth of
    the peak resident set over what the process held before it (the simulator's state)."""
    label, make = SCENARIOS[key]
    spec = json.dumps(make())
    progress = stderr_progress(key) if key == "c" else None
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t, c = time.perf_counter(), time.process_time()
    out = core.simulate(spec, progress)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    # Before the result is parsed into Python objects, which are not the simulator's.
    state_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    r = json.loads(out)
    tx = sum(l["tx_packets"] for l in r["links"])
    row = {
        "scenario": label,
        "events": r["events"],
        "tx": tx,
        "sim_s": r["sim_time_s"],
        "wall_s": wall,
        "cpu_s": cpu,
        "state_mb": state_mb,
        "loop_wall_s": r["wall_s"],
        "stopped_by": r["stopped_by"],
    }
    if r["jobs"]:
        row["note"] = f"JCT {r['jobs'][0]['jct_s'] * 1e3:.3f} ms, finished={r['jobs'][0]['finished']}"
    else:
        c = r["conservation"]
        row["note"] = f"delivered {c['delivered_packets']:,} / sent {c['sent_packets']:,} pkts, lost {c['lost_packets']:,}, absorbed {c['absorbed_packets']:,}"
    return row


# ns-3's own environment: the PyPI `ns3` wheel (ns-3.44, cppyy bindings) pins packages the
# project's venv does not want, and takes minutes to build, so it never enters the venv or CI.
# INALAB_NS3_PYTHON names an interpreter that has it; otherwise `--ns3` makes this venv.
NS3_ENV = Path(os.environ.get("INALAB_NS3_ENV", Path.home() / ".cache" / "inalab" / "ns3-env"))


def _has_ns3(python) -> bool:
    return subprocess.run([str(python), "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('ns') is None)"],
                          capture_output=True).returncode == 0


def ns3_python(install: bool):
    """An interpreter that can `import ns`: $INALAB_NS3_PYTHON, this one, or NS3_ENV's (made and
    filled with `pip install ns3` when `install`, about 4 minutes); None if there is none."""
    named = os.environ.get("INALAB_NS3_PYTHON")
    if named:
        return named if _has_ns3(named) else None
    if importlib.util.find_spec("ns") is not None:
        return sys.executable
    env_python = NS3_ENV / "bin" / "python"
    if env_python.exists() and _has_ns3(env_python):
        return str(env_python)
    if not install:
        return None
    print(f"installing ns-3 (PyPI `ns3`) into {NS3_ENV}, once; a few minutes ...", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(NS3_ENV)], check=True)
    p = subprocess.run([str(env_python), "-m", "pip", "install", "--quiet", "ns3"])
    return str(env_python) if p.returncode == 0 and _has_ns3(env_python) else None


def run_ns3_a(python):
    """Scenario (a) in ns-3, in a subprocess of `python`; returns its JSON row or an error string."""
    script = ROOT / "tools" / "ns3" / "ns3_scenarios.py"
    p = subprocess.run([python, str(script), "speed_a"], capture_output=True, text=True)
    if p.returncode != 0:
        return f"ns-3 run failed (exit {p.returncode}): {p.stderr.strip()[-2000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def fmt_row(r):
    ev_rate = r["events"] / r["wall_s"] if r.get("events") is not None else float("nan")
    tx_rate = r["tx"] / r["wall_s"] if r.get("tx") is not None else float("nan")
    ev = f"{r['events']:,}" if r.get("events") is not None else "n/a"
    tx = f"{r['tx']:,}" if r.get("tx") is not None else "n/a"
    extra = f" {r['cpu_s']:.2f} | {r['state_mb']:.0f} |" if "cpu_s" in r else " | |"
    return f"| {r['scenario']} | {ev} | {tx} | {r['sim_s'] * 1e3:.3f} ms | {r['wall_s']:.2f} |{extra} {ev_rate / 1e6:.2f} M | {tx_rate / 1e6:.2f} M | {r.get('note', '')} |"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--ns3", action="store_true", help="also run scenario (a) in ns-3 (fails if ns-3 is missing)")
    g.add_argument("--no-ns3", action="store_true", help="never run ns-3")
    ap.add_argument("--only", default="a,b,c,r1024,dsa,canary", help="comma-separated subset of " + ",".join(SCENARIOS))
    ap.add_argument("--sweep", action="store_true", help="also time a 20-point sweep of (b): 2 local workers vs serial")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    keys = [k.strip() for k in args.only.split(",") if k.strip()]
    if args.sweep:
        sweep_speedup()

    rows = []
    for k in keys:
        print(f"running {k} ...", file=sys.stderr, flush=True)
        rows.append(run(k))

    print(f"machine: nproc={os.cpu_count()}, {cpu_model()}")
    print()
    print("| scenario | events | tx (pkt x hop) | sim time | wall s | CPU s | state MB | events/s | tx/s | outcome |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(fmt_row(r))
    print_targets(dict(zip(keys, rows)))

    python = None if args.no_ns3 or "a" not in keys else ns3_python(install=args.ns3)
    if args.ns3 and python is None:
        sys.exit(f"--ns3: no interpreter with ns-3 (set INALAB_NS3_PYTHON, or let it install into {NS3_ENV})")
    if python is not None:
        print(f"running ns-3 (a) with {python} ...", file=sys.stderr, flush=True)
        n = run_ns3_a(python)
        if isinstance(n, str):
            print()
            print(n)
            if args.ns3:
                sys.exit(1)
            return
        ours = rows[keys.index("a")]
        print()
        print("Scenario (a), same simulated work in both simulators:")
        print()
        print("| simulator | events | tx (pkt x hop) | sim time | wall s | CPU s | state MB | events/s | tx/s | outcome |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        print(fmt_row({**ours, "scenario": "inalab"}))
        print(fmt_row({**n, "scenario": n.get("version", "ns-3")}))
        ours_rate = ours["events"] / ours["wall_s"]
        ns3_rate = n["events"] / n["wall_s"]
        print()
        print(f"event rate ratio inalab/ns-3: {ours_rate / ns3_rate:.1f}x   "
              f"(events are not the same unit: ns-3 spends several events per packet per hop, inalab one)")
        print(f"tx rate ratio inalab/ns-3:    {(ours['tx'] / ours['wall_s']) / (n['tx'] / n['wall_s']):.1f}x")
        print(f"wall time ratio ns-3/inalab:  {n['wall_s'] / ours['wall_s']:.1f}x   (same simulated work; ns-3 wall = Simulator::Run only; "
              f"target >= 150x, issue #39)")


def print_targets(rows):
    """Issues #14 and #39's targets, as ratios of runs made side by side in this one invocation."""
    print()
    if "c" in rows:
        c = rows["c"]
        print(f"(c): {c['cpu_s']:.1f} CPU s (target <= 10 s on a quiet core, issue #39), {c['state_mb']:.0f} MB of state (target <= 130)")
        if "a" in rows:
            print(f"(c)/(a) CPU time: {c['cpu_s'] / rows['a']['cpu_s']:.0f}x (a load-independent record of (c)'s speed)")
    if "dsa" in rows:
        print(f"(d): {rows['dsa']['wall_s']:.1f} s wall (target < 60 s on one core, issue #15)")
    if "canary" in rows:
        print(f"canary: {rows['canary']['wall_s']:.1f} s wall (target < 60 s on one core, issue #16)")
    if "b" in rows and "r1024" in rows:
        small, big = (rows[k]["events"] / rows[k]["cpu_s"] for k in ("b", "r1024"))
        print(f"events per CPU-second, 64 hosts / 1024 hosts: {small / 1e6:.2f} M / {big / 1e6:.2f} M = "
              f"{small / big:.2f}x (target <= 1.3x: flat cost per event)")
    if "b" in rows and "c" in rows:
        small, big = (rows[k]["events"] / rows[k]["cpu_s"] for k in ("b", "c"))
        print(f"events per CPU-second, (b) / (c): {small / 1e6:.2f} M / {big / 1e6:.2f} M = {small / big:.2f}x (target <= 1.3x, issue #39)")


def sweep_speedup(points: int = 20, reps: int = 2) -> None:
    """`inalab sweep` of scenario (b) (64-host star, 4 MiB ring over all 64) with `points` seeds,
    on 2 local worker processes against 1, interleaved `reps` times. Target: parallel at most
    0.6x serial (issue #14)."""
    import tempfile

    import inalab

    spec = {"base": {"name": "bench-b", "topology": {"kind": "star", "hosts": 64},
                     "jobs": [{"name": "ring", "scheme": "ring", "allreduce": "4MiB", "workers": 64}]},
            "seeds": list(range(1, points + 1))}
    times = {1: [], 2: []}
    for _ in range(reps):
        for workers in (1, 2):
            with tempfile.TemporaryDirectory() as out:
                t = time.monotonic()
                df = inalab.sweep(spec, out, workers=workers, progress=False)
                times[workers].append(time.monotonic() - t)
                assert (df.status == "ok").all() and len(df) == points
    serial, parallel = min(times[1]), min(times[2])
    print(f"sweep of (b), {points} points: serial {serial:.1f} s, 2 workers {parallel:.1f} s "
          f"(best of {reps} each, interleaved): ratio {parallel / serial:.2f} (target <= 0.6)")


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    main()
