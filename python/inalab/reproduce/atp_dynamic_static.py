"""ATP Fig. 13a: dynamic (hashed) vs static aggregator sharing among 3 identical jobs on one switch."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import markdown_table, register

AGGREGATOR_BYTES = 272  # ATP aggregator: 62 x 4 B values + 6 x 4 B metadata

# Tolerances of `holds` (the paper's shape, Fig. 13a):
PEAK_TOL = 0.10      # at 100 % PTA dynamic and static are within 10 % of each other
MIN_ADVANTAGE = 1.10  # below 100 % PTA dynamic beats static by >= 10 % at the most contended point


class AtpDynamicVsStatic:
    name = "atp-dynamic-vs-static"
    claim = ("ATP Fig. 13a: 3 identical jobs share one switch's aggregators. With 100 % of the peak "
             "throughput aggregators (PTA) dynamic (hashed, best-effort) and static (1/3 each) sharing "
             "perform similarly; as the aggregators drop to 33 % of PTA the dynamic approach degrades "
             "less than static (up to 38 % better training time under heavy contention).")

    def __init__(self, model: str = "dnn_a", workers: int = 4, iterations: int = 6,
                 fractions=(1.0, 0.8, 0.66, 0.5, 0.33), stagger: bool = True, windowed: bool = True):
        self.model, self.workers, self.iterations = model, workers, iterations
        self.fractions, self.stagger, self.windowed = tuple(fractions), stagger, windowed

    # -- scenarios -------------------------------------------------------------------------
    def scenario(self, aggregators: int, hashing: str, starts=(0.0, 0.0, 0.0), window: int = 0) -> dict:
        nw = self.workers
        jobs = []
        for k in range(3):
            b = k * (nw + 1)
            jobs.append({"name": f"job{k}", "scheme": "atp", "model": self.model,
                         "iterations": self.iterations, "workers": f"h{b}..h{b + nw - 1}",
                         "servers": [f"h{b + nw}"], "start": f"{starts[k] * 1e6:.3f}us",
                         "ina": {"hashing": hashing}})
            if window:  # SwitchML-like: a fixed window of the job's slice, no AIMD
                jobs[-1]["ina"]["congestion_control"] = False
                jobs[-1]["transport"] = {"init_window": f"{window}B"}
        return {"name": f"atp13a-{hashing}-{aggregators}", "stop": "5s",
                "topology": {"kind": "star", "hosts": 3 * (nw + 1)},
                "network": {"aggregator_memory": f"{aggregators * AGGREGATOR_BYTES}B"},
                "jobs": jobs, "metrics": {"bin": "1ms"}}

    def run(self, progress) -> pd.DataFrame:
        import inalab
        from ..models import get_model

        # Calibration: with a pool far larger than needed and static partitioning, every fragment
        # is aggregated in the switch; the peak number of aggregators in use is what the 3 jobs need
        # for peak throughput (PTA). We check below that 100 % PTA gives the ample pool's throughput.
        progress("atp-13a: calibrating PTA (static, ample pool)")
        big = inalab.simulate(self.scenario(30000, "static"))
        pta = int(big.switches.aggregators_peak.iloc[0])
        iter_s = float(big.iterations.duration_s.median())
        starts = (0.0, iter_s / 3, 2 * iter_s / 3) if self.stagger else (0.0, 0.0, 0.0)
        batch = get_model(self.model).batch_size or 1
        rows = []
        for frac in self.fractions:
            aggs = max(3, int(round(pta * frac)))
            for hashing, label, window in (("hash", "dynamic", 0), ("static", "static", 0),
                                           ("static", "static-window", (aggs // 3) * 306)):
                if label == "static-window" and not self.windowed:
                    continue
                progress(f"atp-13a: {label}, {frac:.0%} of PTA = {aggs} aggregators")
                r = inalab.simulate(self.scenario(aggs, hashing, starts, window))
                it = r.iterations
                # training throughput after warm-up: iterations from the second on
                steady = it[it.iteration >= 1].groupby("job").duration_s.mean()
                c = r.switches.counters.iloc[0]
                rows.append({"pta_fraction": float(frac), "aggregators": aggs, "sharing": label,
                             "finished": bool(r.jobs.finished.all()),
                             "iteration_ms": 1e3 * float(steady.mean()),
                             "throughput": float((batch / steady).mean()),
                             "goodput_gbps": float(r.jobs.goodput_gbps.mean()),
                             "switch_agg_fraction": float(c["aggregated"] / max(1, r.switches.rx_packets.iloc[0])),
                             "collisions": int(c["collisions"]),
                             "pta": pta})
        df = pd.DataFrame(rows)
        base = df.throughput.max()
        df["normalized"] = df.throughput / base
        return df

    # -- verdict ---------------------------------------------------------------------------
    def holds(self, rows: pd.DataFrame) -> bool:
        t = rows.pivot(index="pta_fraction", columns="sharing", values="throughput")
        if not rows.finished.all():
            return False
        top, low = t.index.max(), t.index.min()
        peak_ok = abs(t.loc[top, "dynamic"] / t.loc[top, "static"] - 1) <= PEAK_TOL
        adv_ok = t.loc[low, "dynamic"] >= MIN_ADVANTAGE * t.loc[low, "static"]
        # dynamic never clearly below static below 100 %
        never_worse = bool((t.loc[t.index < top, "dynamic"] >= (1 - PEAK_TOL) * t.loc[t.index < top, "static"]).all())
        return bool(peak_ok and adv_ok and never_worse)

    def explain(self, rows: pd.DataFrame) -> str:
        pta = int(rows.pta.iloc[0])
        t = rows.pivot(index="pta_fraction", columns="sharing", values="throughput").sort_index(ascending=False)
        t["dynamic/static"] = t["dynamic"] / t["static"]
        if "static-window" in t:
            t["dynamic/static-window"] = t["dynamic"] / t["static-window"]
        t = t.reset_index()
        tt = t.set_index("pta_fraction")
        top, low = tt.index.max(), tt.index.min()
        r = rows.set_index(["pta_fraction", "sharing"])
        static_coll = int(r.loc[(top, "static"), "collisions"])
        static_agg = float(r.loc[(top, "static"), "switch_agg_fraction"])
        dyn_coll = int(r.loc[(top, "dynamic"), "collisions"])
        dsw_low = float(tt.loc[low, "dynamic/static-window"]) if "dynamic/static-window" in tt else float("nan")
        dsw_top = float(tt.loc[top, "dynamic/static-window"]) if "dynamic/static-window" in tt else float("nan")
        ds_low, ds_top = float(tt.loc[low, "dynamic/static"]), float(tt.loc[top, "dynamic/static"])
        summary = (f"dynamic / static = {ds_top:.2f} at 100 % PTA (paper: ~1) and {ds_low:.2f} at {low:.0%} PTA "
                   f"(paper: dynamic better, up to 1.38x in training time).")
        show = rows[["pta_fraction", "aggregators", "sharing", "iteration_ms", "throughput",
                     "normalized", "switch_agg_fraction", "collisions", "finished"]]
        return f"""# {self.name} (ATP Fig. 13a)

**Claim.** {self.claim}

**Command.** `inalab reproduce {self.name}`

**Setup (scaled down).** 3 identical ATP jobs on one 100 Gbps star switch, each with
{self.workers} workers and its own PS host (`{self.model}` from the catalog, {self.iterations}
iterations; `throughput` = batch / mean duration of iterations 2..{self.iterations}, i.e. after warm-up,
per worker; `{self.model}` has no batch size in the catalog, so it is iterations/s). Jobs start staggered by 1/3 of an iteration (`stagger = {self.stagger}`) so that their on/off
phases are not aligned, as in the paper's Fig. 13c. The paper uses VGG16 (553 MB per iteration); one
VGG16 iteration of 3 jobs costs ~10^8 packet events, so we use `{self.model}` (16 MB, comm:comp = 2:1 at
100 Gbps, i.e. network-intensive like VGG16 on the paper's testbed) to keep each run at a few seconds.
The inalab simulator cannot co-locate workers of different jobs on one host, so the jobs do not share
links (the paper's jobs had "identical placement" and shared the switch-to-PS link); the aggregator pool
is the only shared resource.

**PTA.** Measured, not assumed: we run the 3 jobs with static partitioning and an ample pool (30000
aggregators) and take the switch's peak number of aggregators in use: PTA = **{pta}** aggregators
(~{pta // 3} per job; the paper's 1980 reflects its larger RTT through a software PS). The sweep uses
{', '.join(f'{f:.0%}' for f in sorted(rows.pta_fraction.unique(), reverse=True))} of PTA.

**Our result** (`holds` = {self.holds(rows)}; tolerances: at 100 % PTA |dynamic/static - 1| <= {PEAK_TOL};
at the lowest fraction dynamic >= {MIN_ADVANTAGE} x static; never below (1 - {PEAK_TOL}) x static):

{markdown_table(t)}

All runs:

{markdown_table(show)}

**Where and why we differ.**

* {summary}
* Static partitioning here is ATP's `hashing = "static"`: each job owns 1/3 of the pool and uses
  `seq % slice`, but its window is still ATP's (AIMD from a 60 KB initial window), so once the slice
  is smaller than the window a job collides with its own in-flight fragments and those go to the PS.
  At 100 % PTA static records {static_coll:,} collisions and aggregates {static_agg:.0%} of received
  packets in the switch. The paper's static baseline is SwitchML's, whose window is the slice itself
  (self-clocked), so it never collides.
* Dynamic (hashed) sharing is far below static at 100 % PTA for the reason written up in
  `atp-hash-vs-linear`: a window of consecutive fragments hashed into a pool only a few windows
  large meets other in-flight fragments often, and random rehashing does not reach a
  collision-free placement.
* `static-window` (extra series, not used by `holds`) is our closer emulation of that baseline:
  `hashing = "static"` with congestion control off and a fixed window of the job's slice (slice x
  306 B), so a job never has more fragments in flight than its slots. Against it, dynamic sharing shows
  the paper's trend at low aggregator counts (dynamic / static-window = {dsw_low:.2f} at {low:.0%} PTA) but
  not at 100 % PTA ({dsw_top:.2f}), where the paper has them similar.
* Dynamic sharing collides too (switch collision counter counts every forwarded collision, including
  a job's own earlier fragment in the slot): {dyn_coll:,} collisions at 100 % PTA, so the paper's
  "converges to complete in-network aggregation after 500 ms" is not reached in our runs, which last a
  few ms of simulated time; the paper measured from the second *epoch* on.
* Collided fragments go to the PS; a job's PS link then carries up to `workers` x the traffic, which
  sets the floor both ATP variants reach as the pool shrinks.
* Compute times come from the catalog's profile of `{self.model}`; there is no CPU/PS processing limit
  (the paper's PS saturates at 60 Gbps).
"""

    def plot(self, rows: pd.DataFrame, path: Path) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.2))
        for label, m in (("dynamic", "o-"), ("static", "s--"), ("static-window", "^:")):
            if label not in set(rows.sharing):
                continue
            d = rows[rows.sharing == label].sort_values("pta_fraction")
            ax.plot(100 * d.pta_fraction, d.throughput, m, label=f"{label}")
        ax.invert_xaxis()
        ax.set_xlabel(f"aggregators (% of PTA = {int(rows.pta.iloc[0])})")
        ax.set_ylabel("iterations/s per job (after warm-up)")
        ax.set_ylim(bottom=0)
        ax.set_title("3 ATP jobs, dynamic vs static sharing")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path


register(AtpDynamicVsStatic())
