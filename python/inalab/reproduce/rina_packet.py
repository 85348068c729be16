"""Rina at packet level (`scheme = "rina"`, docs/rina.md): the testbed analogue of Fig. 12."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import markdown_table, register, simulate_all

RACKS = {"sw0": [f"w{i}" for i in range(4)], "sw1": [f"w{i}" for i in range(4, 8)]}


def testbed(programmable: list[str]) -> dict:
    """The paper's testbed (§VI-A-2): two racks of 4 nodes, two ToRs, modelled as two ToRs
    joined by one 100 Gbps link (spec A13); ATP's PS is a ninth host in rack 1 (inalab runs
    a PS on its own host; the paper co-locates it)."""
    nodes = [{"name": s, "kind": "switch", "tier": 1} for s in RACKS]
    links = [{"a": "sw0", "b": "sw1"}]
    for s, hosts in RACKS.items():
        for h in hosts:
            nodes.append({"name": h, "kind": "host"})
            links.append({"a": h, "b": s})
    nodes.append({"name": "ps", "kind": "host"})
    links.append({"a": "ps", "b": "sw1"})
    return {"kind": "edges", "nodes": nodes, "links": links, "programmable": programmable}


INA = {"1 of 2": ["sw0"], "2 of 2": ["sw0", "sw1"]}
SCHEMES = ["ring", "hierarchical", "atp", "rina"]


def testbed_scenario(scheme: str, ina: str, size: str, iterations: int) -> dict:
    workers = [h for hosts in RACKS.values() for h in hosts]
    job = {"name": scheme, "scheme": scheme, "allreduce": size, "iterations": iterations, "workers": workers}
    if scheme == "atp":
        job["servers"] = ["ps"]
    return {"name": f"rina-testbed-{scheme}", "stop": "10s", "topology": testbed(INA[ina]), "jobs": [job]}


class RinaTestbed:
    name = "rina-testbed"
    claim = ("Rina Fig. 12 (testbed, 2 racks x 4 nodes, two Tofino ToRs at 100 Gbps): Rina matches ATP when "
             "both ToRs are INA and beats ATP when only part of them are; both are far above ring-allreduce.")

    def __init__(self, size: str = "8MiB", iterations: int = 2):
        self.size, self.iterations = size, iterations

    def run(self, progress) -> pd.DataFrame:
        runs = [({"ina": ina, "scheme": s}, testbed_scenario(s, ina, self.size, self.iterations)) for ina in INA for s in SCHEMES]
        df = simulate_all("rina-testbed", runs, progress)
        df = df[["ina", "scheme", "finished", "jct_s", "goodput_gbps"]].copy()
        atp = df[df.scheme == "atp"].set_index("ina")["goodput_gbps"]
        df["vs_atp"] = df["goodput_gbps"] / df["ina"].map(atp)
        return df.reset_index(drop=True)

    # Tolerance: with 1 of 2 ToRs INA Rina is at least 1.2x ATP (spec §3: order and a ratio of
    # at least 1.2x); with 2 of 2 within 15 % of ATP; Rina above the ring in both.
    def holds(self, rows: pd.DataFrame) -> bool:
        t = rows.set_index(["ina", "scheme"])["goodput_gbps"]
        return bool(t["1 of 2", "rina"] >= 1.2 * t["1 of 2", "atp"] and abs(t["2 of 2", "rina"] / t["2 of 2", "atp"] - 1) <= 0.15
                    and all(t[i, "rina"] > t[i, "ring"] for i in INA))

    def explain(self, rows: pd.DataFrame) -> str:
        t = rows.set_index(["ina", "scheme"])["goodput_gbps"]
        return f"""# rina-testbed (Rina Fig. 12 analogue, packet level)

**Claim.** {self.claim}

**Command.** `inalab reproduce rina-testbed`. Scenario: two ToRs sw0, sw1 joined by one 100 Gbps
link (spec A13), 4 workers under each, 1 us links; ATP's PS is a ninth host under sw1 (the paper
co-locates it with a worker; inalab runs a PS on its own host). "1 of 2": only sw0 INA-capable,
so Rina's ring is rack 0 (one group) plus 4 autonomous workers (G = 5) and ATP aggregates rack 0
at sw0 while w4-w7 reach the PS unaggregated; "2 of 2": G = 2, ATP aggregates at both ToRs.
Workload: an allreduce of {self.size} x {self.iterations} (communication-bound; the paper trains models,
whose compute would hide part of the difference). Metric: goodput (tensor bits / iteration time).

**Our result** (`holds` = {self.holds(rows)}; tolerance: 1 of 2: Rina >= 1.2x ATP; 2 of 2: Rina
within 15 % of ATP; Rina above the ring in both):

{markdown_table(rows)}

**Where and why they differ.**

* The claim does not hold here, and a bandwidth count says why: the run is bound by the
  sw0-sw1 link. Per direction it carries, per allreduce of S bytes: ATP S (rack 0's aggregate
  up, the result down), Rina with 2 of 2 INA 1.5 S (the step-0 AGG, the step-1 AGG and the
  AllGather hop, S/2 each), the ring 1.75 S (2 (N-1)/N S over the one ring hop that crosses).
  INA packets carry 62 values in 306-319 B (78-81 % of the link), the ring 1436-B segments
  (96 %). Bounds: ATP about 81 Gbps, Rina about 52, ring about 55; measured ATP
  {t['2 of 2', 'atp']:.1f}, Rina {t['2 of 2', 'rina']:.1f}, ring {t['2 of 2', 'ring']:.1f}. Rina is further below its bound
  because every ScatterReduce step waits for its whole chunk (step barrier, spec A6), so step 0
  and step 1 do not overlap.
* So Rina cannot match ATP on a link-bound testbed; it can where both are bound by the
  switches' aggregation rate (about 20 Gbps for a Tofino-1 with 100G ports, the paper's
  footnote 1), which is presumably the paper's case. inalab's `network.switch_capacity`
  charges every packet a switch forwards, which would cap the ring too; charging only the
  packets a switch aggregates is issue 18's work, after which this reproduction should be run
  with a 20 Gbps INA rate.
* 1 of 2 INA: Rina {t['1 of 2', 'rina']:.1f} Gbps is {t['1 of 2', 'rina'] / t['1 of 2', 'atp']:.1f}x ATP ({t['1 of 2', 'atp']:.1f}): ATP's PS receives four raw
  streams and one aggregate on its single link, so each worker gets about a fifth of it. This
  part of the claim holds. Rina (G = 5) is below the ring ({t['1 of 2', 'ring']:.1f}) for the same
  reasons as above.
"""

    def plot(self, rows: pd.DataFrame, path: Path) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.3))
        width = 0.8 / len(SCHEMES)
        for k, s in enumerate(SCHEMES):
            sub = rows[rows.scheme == s].set_index("ina").reindex(list(INA))
            ax.bar([i + k * width for i in range(len(INA))], sub["goodput_gbps"], width, label=s)
        ax.set_xticks([i + width * (len(SCHEMES) - 1) / 2 for i in range(len(INA))], [f"{k} ToRs INA" for k in INA])
        ax.set_ylabel("goodput (Gbps)")
        ax.set_title("Rina Fig. 12 analogue: 2 racks x 4 at 100 Gbps")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path


register(RinaTestbed())
