"""INA at scale: ATP, SwitchML and ring allreduce side by side (a script, not a test).

    .venv/bin/python benchmarks/ina_scale.py                 # 8..63 workers x 1..8 jobs, ~10 min on 2 cores
    .venv/bin/python benchmarks/ina_scale.py --quick         # 8 and 63 workers x 1 and 2 jobs
    .venv/bin/python benchmarks/ina_scale.py --workers 63 --jobs 1,8 --schemes atp,ring --json
    .venv/bin/python benchmarks/ina_scale.py --workers 47,15 --jobs 1,8 --size 2MiB --hosts-per-rack 16 --schemes atp,ring

Every run: `jobs` concurrent jobs of `workers` workers and one server each (the server is
used by ATP; ring and SwitchML leave it idle), one 4 MiB allreduce per job, all starting at 0.
Leaf-spine of 32-host racks, 100 Gbps host links, 8 spines at 400 Gbps (a non-blocking
fabric), 1 us links, adaptive routing, ToRs programmable with the default 5 MB of aggregator
memory, default buffers (1 MiB) and ECN threshold (200 KB). Workers are dealt to jobs round
robin, so every job spans the same racks and all jobs share each ToR's aggregator pool.
Servers (`--servers`): `spread` (default) puts job j's server on the last free host of the
j-th rack from the end (modulo the racks); `last` gives each job the last of its round-robin hosts, which puts every server in
the last rack. ATP aggregates a job's racks at its server's ToR and multicasts from there, so
with `last` that ToR's fabric links carry every job's traffic: at 8 jobs of 63 workers over 16
racks, 8 x 15 racks x 100 Gbps in each direction against 3.2 Tbps of uplinks. With one job of
63 workers both are the scenario of issue #11: 2 racks of 32, the PS on the second. SwitchML aggregates in
one rack only, so it runs where a job's hosts fit one rack (up to 32 hosts in all) and is shown
as n/a elsewhere.

Printed per run: the slowest job's JCT, the mean JCT, drops (queue and loss, all links) as a
share of the packets the hosts sent, the most aggregators any switch held at once and
whether every job finished. The ideal INA time is 4 MiB in 306-byte packets at 100 Gbps:
16,913 x 306 B x 8 / 100 Gbps = 0.414 ms.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

HOSTS_PER_RACK = 32


def placement(workers: int, jobs: int, servers: str, per_rack: int = HOSTS_PER_RACK) -> list[tuple[list[int], int]]:
    """Each job's worker hosts and server host (see the module docs)."""
    hosts = jobs * (workers + 1)
    if servers == "last":
        return [(list(range(j, hosts, jobs))[:workers], list(range(j, hosts, jobs))[workers]) for j in range(jobs)]
    racks = -(-hosts // per_rack)
    taken: list[int] = []
    for j in range(jobs):
        r = racks - 1 - j % racks
        top = min(hosts, (r + 1) * per_rack)
        taken.append(next(h for h in range(top - 1, r * per_rack - 1, -1) if h not in taken))
    rest = [h for h in range(hosts) if h not in taken]
    return [(rest[j::jobs][:workers], taken[j]) for j in range(jobs)]


def scenario(scheme: str, workers: int, jobs: int, size: str, servers: str = "spread", per_rack: int = HOSTS_PER_RACK,
             memory: str = "5MB") -> dict:
    hosts = jobs * (workers + 1)
    leaves = -(-hosts // per_rack)
    js = []
    for j, (mine, server) in enumerate(placement(workers, jobs, servers, per_rack)):
        job = {"name": f"job{j}", "scheme": scheme, "allreduce": size, "iterations": 1, "workers": [f"h{h}" for h in mine]}
        if scheme == "atp":
            job["servers"] = [f"h{server}"]
        js.append(job)
    return {
        "name": f"scale-{scheme}-{workers}w-{jobs}j",
        "stop": "100ms",
        "topology": {"kind": "leaf_spine", "leaves": leaves, "spines": 8, "hosts_per_leaf": per_rack,
                     "host_rate": "100Gbps", "fabric_rate": "400Gbps", "link_delay": "1us", "programmable": "tor"},
        "network": {"routing": "adaptive", "aggregator_memory": memory},
        "jobs": js,
    }


def run(scheme: str, workers: int, jobs: int, size: str, servers: str, per_rack: int = HOSTS_PER_RACK, memory: str = "5MB") -> dict:
    import inalab

    t = time.perf_counter()
    try:
        r = inalab.simulate(scenario(scheme, workers, jobs, size, servers, per_rack, memory))
    except inalab.ConfigError as e:  # SwitchML needs a job's workers in one rack
        return {"scheme": scheme, "workers": workers, "jobs": jobs, "skipped": str(e)}
    wall = time.perf_counter() - t
    sent = int(r.hosts.tx_packets.sum())
    drops = int(r.links.drops_queue.sum() + r.links.drops_loss.sum())
    return {
        "scheme": scheme, "workers": workers, "jobs": jobs,
        "finished": bool(r.jobs.finished.all()),
        "jct_max_ms": 1e3 * float(r.jobs.jct_s.max()),
        "jct_mean_ms": 1e3 * float(r.jobs.jct_s.mean()),
        "packets_sent": sent, "drops": drops, "drop_pct": 100.0 * drops / max(1, sent),
        "aggregators_peak": int(r.switches.aggregators_peak.max()),
        "aggregators_end": int(r.switches.aggregators_end.sum()),
        "wall_s": wall,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", default="8,16,32,63", help="workers per job, comma list (default 8,16,32,63)")
    ap.add_argument("--jobs", default="1,2,4,8", help="concurrent jobs, comma list (default 1,2,4,8)")
    ap.add_argument("--schemes", default="atp,switchml,ring", help="comma list (default atp,switchml,ring)")
    ap.add_argument("--size", default="4MiB", help="allreduce size per job (default 4MiB)")
    ap.add_argument("--servers", choices=["spread", "last"], default="spread",
                    help="where servers go: one per rack (spread, default) or all in the last rack (last)")
    ap.add_argument("--hosts-per-rack", type=int, default=HOSTS_PER_RACK, help=f"hosts per rack (default {HOSTS_PER_RACK})")
    ap.add_argument("--memory", default="5MB", help="aggregator memory per ToR (default 5MB, a Tofino's)")
    ap.add_argument("--quick", action="store_true", help="8 and 63 workers x 1 and 2 jobs")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args(argv)
    workers = [8, 63] if a.quick else [int(x) for x in a.workers.split(",")]
    jobs = [1, 2] if a.quick else [int(x) for x in a.jobs.split(",")]
    schemes = a.schemes.split(",")
    runs = [(w, j, s) for w in workers for j in jobs for s in schemes]
    rows = []
    for i, (w, j, s) in enumerate(runs, 1):
        print(f"[{i}/{len(runs)}] {s}, {w} workers x {j} jobs", file=sys.stderr, flush=True)
        rows.append(run(s, w, j, a.size, a.servers, a.hosts_per_rack, a.memory))
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'workers':>7} {'jobs':>4} {'scheme':>8} {'JCT max ms':>10} {'mean ms':>8} {'vs ring':>7} "
          f"{'drops %':>8} {'aggs peak':>9} {'held at end':>11} {'finished':>8} {'wall s':>6}")
    for r in rows:
        if "skipped" in r:
            print(f"{r['workers']:>7} {r['jobs']:>4} {r['scheme']:>8}   n/a: {r['skipped'].split(': ', 1)[-1][:70]}")
            continue
        ring = next((x for x in rows if x["scheme"] == "ring" and x["workers"] == r["workers"] and x["jobs"] == r["jobs"]), None)
        vs = f"{r['jct_max_ms'] / ring['jct_max_ms']:.2f}" if ring and ring["finished"] else "-"
        print(f"{r['workers']:>7} {r['jobs']:>4} {r['scheme']:>8} {r['jct_max_ms']:>10.3f} {r['jct_mean_ms']:>8.3f} {vs:>7} "
              f"{r['drop_pct']:>8.3f} {r['aggregators_peak']:>9} {r['aggregators_end']:>11} {str(r['finished']):>8} {r['wall_s']:>6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
