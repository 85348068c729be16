"""Canary's congested Fig. 7a setting under set-ups and fabrics side by side: the sensitivity rows of issue #40 (a script, not a test).

    .venv/bin/python benchmarks/canary_pfc.py                  # 64 hosts, 1 and 4 MiB x seeds 1-3, drop-tail vs PFC
    .venv/bin/python benchmarks/canary_pfc.py --setup inalab,sst --flow-control pfc --sizes 4MiB --seeds 1,2,3,4,5
    .venv/bin/python benchmarks/canary_pfc.py --hosts 1024 --setup sst --flow-control credit --sizes 4MiB \\
        --seeds 1,2,3 --set credit_buffer=64KiB           # one sensitivity row of canary-congestion (~3 min on 2 cores)

`inalab.reproduce.canary.scenario`, the allreduce on half the hosts drawn at random, the other
half congesting. `--hosts 64`: an 8 x 8 leaf-spine with 8 spines (100 Gbps, 300 ns links, every
switch programmable), the analog; `--hosts 1024`: the paper's fat tree (the reproductions').
`--setup`: "inalab" (the earlier write-ups' network: flow-hash ECMP, Canary's own load balancer,
a fresh peer per background message), "sst" (the paper's, `scenario(setup="sst")`: one routing
rule for every packet, a permutation background), or one part of "sst" alone: "sst-routing"
(its rule, the earlier background), "sst-background" (its background, the earlier routing).
`--flow-control`: "drop_tail" (64 MiB buffers), "pfc" (xoff 64 KiB, xon 32 KiB) or "credit"
(14 KB per port). `--set NAME=VALUE` overrides `network.NAME` (a buffer, a threshold), `--load`
the background's load. Runs go in parallel on this machine's cores. Printed per run: the
allreduce's goodput, Canary's stragglers and reroutes, PAUSE frames sent, waits for credits, the
deepest switch queue; then the mean goodput per set-up and scheme over the seeds.
"""

from __future__ import annotations

import argparse
import json

from inalab.reproduce import markdown_table, simulate_all
from inalab.reproduce.canary import measure, scenario

TOPOLOGIES = {64: {"kind": "leaf_spine", "leaves": 8, "spines": 8, "hosts_per_leaf": 8, "link_delay": "300ns", "programmable": "all"},
              1024: None}  # None: the paper's fat tree
SCHEMES = ("canary", "1 ST", "4 ST")
SETUPS = ("inalab", "sst", "sst-routing", "sst-background")


def point(scheme: str, size: str, flow_control: str, seed: int, setup: str, hosts: int, net: dict, load: float | None) -> dict:
    """One run's scenario: ``setup`` (SETUPS) on ``flow_control``, ``net`` over its network."""
    whole = "sst" if setup in ("sst", "sst-routing") else "inalab"
    s = scenario(scheme, size=size, seed=seed, topology=TOPOLOGIES[hosts], flow_control=flow_control, setup=whole)
    if "background" in s:
        # The part of "sst" left out goes back to the earlier one, and the other way round.
        s["background"]["pattern"] = {"sst-routing": "uniform", "sst-background": "permutation"}.get(setup, s["background"].get("pattern", "uniform"))
        if load is not None:
            s["background"]["load"] = load
    s["network"].update(net)
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=64, choices=sorted(TOPOLOGIES))
    ap.add_argument("--sizes", default="1MiB,4MiB")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--flow-control", default="drop_tail,pfc")
    ap.add_argument("--setup", default="inalab", help=f"comma-separated, of: {', '.join(SETUPS)}")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="network.NAME = VALUE (a number or a size)")
    ap.add_argument("--load", type=float, help="the background's load (default 1.0, line rate)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    a = ap.parse_args()
    bad = [s for s in a.setup.split(",") if s not in SETUPS]
    if bad:
        ap.error(f"--setup {bad[0]!r}; allowed values: {', '.join(SETUPS)}")
    net = {}
    for kv in a.set:
        name, _, value = kv.partition("=")
        try:
            net[name] = float(value)
        except ValueError:
            net[name] = value
    pts = [({"setup": setup, "size": size, "scheme": scheme, "flow_control": fc, "seed": int(seed)},
            point(scheme, size, fc, int(seed), setup, a.hosts, net, a.load))
           for setup in a.setup.split(",") for size in a.sizes.split(",") for seed in a.seeds.split(",")
           for scheme in SCHEMES for fc in a.flow_control.split(",")]
    df = simulate_all("canary-sensitivity", pts, lambda msg: print(msg, flush=True), measure)
    cols = ["setup", "size", "scheme", "flow_control", "seed", "goodput_gbps", "runtime_us", "stragglers", "rerouted",
            "reissues", "pfc_pauses", "credit_waits", "max_queue_bytes", "util_mean"]
    print(markdown_table(df[cols].round(2)))
    mean = df.pivot_table(index=["setup", "size", "flow_control"], columns="scheme", values="goodput_gbps", aggfunc="mean").round(1)
    print(f"\nGoodput (Gbps), mean over seeds {a.seeds}; network overrides {net or 'none'}, background load {a.load or 1.0}:\n")
    print(markdown_table(mean.reset_index()))
    if a.json:
        print(json.dumps(df[cols].to_dict(orient="records")))


if __name__ == "__main__":
    main()
