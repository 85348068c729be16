"""Canary's congested Fig. 7a setting on 64 hosts, drop-tail (64 MiB) against PFC (a script, not a test).

    .venv/bin/python benchmarks/canary_pfc.py                  # 1 and 4 MiB x seeds 1-3, ~1 min on 2 cores
    .venv/bin/python benchmarks/canary_pfc.py --sizes 1MiB --seeds 1 --json
    .venv/bin/python benchmarks/canary_pfc.py --setup inalab,sst --flow-control pfc --sizes 4MiB --seeds 1,2,3,4,5

`inalab.reproduce.canary.scenario` on an 8 x 8 leaf-spine with 8 spines (100 Gbps, 300 ns links,
every switch programmable): the allreduce on half the hosts drawn at random, the other half
sending 1 MiB messages at line rate to random peers among themselves, adaptive routing with a
512 KiB threshold. `drop_tail` is the reproductions' earlier fabric (64 MiB buffers, effectively
lossless but deep-queued); `pfc` (the reproductions' default now) is `network.flow_control = "pfc"` with the defaults (xoff
64 KiB, xon 32 KiB). Printed per run: the allreduce's goodput, Canary's stragglers, PAUSE
frames sent, the network's reroutes (`rerouted_network`), the deepest switch queue, the background's delivered rate (its receivers' bytes
over the allreduce's runtime) and the simulator's wall time.
"""

from __future__ import annotations

import argparse
import json
import time

import inalab
from inalab.reproduce import markdown_table
from inalab.reproduce.canary import measure, scenario

TOPOLOGY = {"kind": "leaf_spine", "leaves": 8, "spines": 8, "hosts_per_leaf": 8, "link_delay": "300ns", "programmable": "all"}
SCHEMES = ("canary", "1 ST", "4 ST")


# `--setup sst`: the paper's SST network as issue #40 reads it (not yet the reproductions'
# set-up): every packet routed by one rule, merlin's fat tree (default up port = the
# destination modulo the up ports, rerouted when its queue passes half a per-port buffer; the
# buffer here is PFC's 64 KiB pause threshold, so 32 KiB), Canary's leaders by the same rule,
# and a background where each host sends to one peer per round (a new derangement per 1 MiB).
SST_REROUTE_QUEUE = 32 << 10
# `--setup` names: the whole SST set-up, or one part of it (a sensitivity row).
SETUPS = {"sst": ("routing", "background"), "sst-routing": ("routing",), "sst-background": ("background",)}


def sst(s: dict, scheme: str, parts=("routing", "background")) -> dict:
    """The SST set-up's ``parts`` on scenario ``s``: "routing" (the rule, its threshold and
    Canary's leaders), "background" (one peer per round)."""
    from inalab.units import SIZE

    if "routing" in parts:
        s["network"].update(default_port="destination", routing="adaptive",
                            adaptive_threshold=SST_REROUTE_QUEUE / SIZE.parse(s["network"]["buffer"]))
    if "routing" in parts and scheme == "canary":
        for j in s["jobs"]:
            j["ina"] = {**j.get("ina", {}), "routing": "network"}
    if "background" in parts and "background" in s:
        s["background"]["pattern"] = "permutation"
    return s


def run(scheme: str, size: str, flow_control: str, seed: int, setup: str = "inalab") -> dict:
    s = scenario(scheme, size=size, seed=seed, topology=TOPOLOGY, flow_control=flow_control)
    if setup.startswith("sst"):
        s = sst(s, scheme, SETUPS[setup])
    t = time.monotonic()
    r = inalab.simulate(s)
    wall = time.monotonic() - t
    row = measure(r)[0]
    background = set(s["background"]["hosts"])
    bg_bytes = int(r.hosts[r.hosts.name.isin(background)].rx_bytes.sum())
    return {"setup": setup, "size": size, "scheme": scheme, "flow_control": flow_control, "seed": seed,
            "goodput_gbps": round(row["goodput_gbps"], 1), "runtime_us": round(row["runtime_us"]),
            "stragglers": row["stragglers"], "collisions": row["collisions"], "rerouted": row["rerouted"],
            "rerouted_network": int(sum(c.get("rerouted_network", 0) for c in r.switches["counters"])),
            "pfc_pauses": row["pfc_pauses"], "max_queue_kb": round(row["max_queue_bytes"] / 1000),
            "drops_queue": row["drops_queue"], "background_gbps": round(bg_bytes * 8 / (row["runtime_us"] * 1e-6) / 1e9),
            "util_mean": round(row["util_mean"], 3), "wall_s": round(wall, 2), "finished": row["finished"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1MiB,4MiB")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--flow-control", default="drop_tail,pfc")
    ap.add_argument("--setup", default="inalab", help='comma-separated: "inalab" (the reproductions\' fabric), "sst" (see SST_REROUTE_QUEUE), "sst-routing", "sst-background" (one part of it)')
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    a = ap.parse_args()
    rows = [run(scheme, size, fc, int(seed), setup) for setup in a.setup.split(",") for size in a.sizes.split(",")
            for seed in a.seeds.split(",") for scheme in SCHEMES for fc in a.flow_control.split(",")]
    import pandas as pd

    df = pd.DataFrame(rows)
    print(markdown_table(df.drop(columns=["finished"])))
    mean = df.pivot_table(index=["setup", "size", "flow_control"], columns="scheme", values="goodput_gbps", aggfunc="mean").round(1)
    print("\nGoodput (Gbps), mean over seeds:\n")
    print(markdown_table(mean.reset_index()))
    if a.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
