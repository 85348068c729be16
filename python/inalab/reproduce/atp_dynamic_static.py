"""ATP Fig. 13a: dynamic (hashed) vs static aggregator sharing among 3 identical jobs on one switch."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import Seeded, markdown_table, register
from .atp_pta import static_need

AGGREGATOR_BYTES = 272  # ATP aggregator: 62 x 4 B values + 6 x 4 B metadata

# Tolerances of `holds` (the paper's shape, Fig. 13a):
PEAK_TOL = 0.10      # at 100 % PTA dynamic and static are within 10 % of each other
MIN_ADVANTAGE = 1.10  # below 100 % PTA dynamic beats static by >= 10 % at the most contended point


class AtpDynamicVsStatic(Seeded):
    name = "atp-dynamic-vs-static"
    figure = "Fig. 13a"
    claim = ("ATP Fig. 13a: 3 identical jobs share one switch's aggregators. With 100 % of the peak "
             "throughput aggregators (PTA) dynamic (hashed, best-effort) and static (1/3 each) sharing "
             "perform similarly; as the aggregators drop to 33 % of PTA the dynamic approach degrades "
             "less than static (up to 38 % better training time under heavy contention).")
    simulates = "15-host star"
    # The simulations' scenario seed: it draws loss, jitter and background peers (docs/config.md),
    # which these scenarios do not have, so seeds are expected to agree (the write-up says when
    # they do). (1,): the committed write-up's.
    seeds = (1,)

    def __init__(self, model: str = "dnn_a", workers: int = 4, iterations: int = 6,
                 fractions=(1.0, 0.8, 0.66, 0.5, 0.33), stagger: bool = True, ablation_model: str | None = "dnn_b"):
        self.model, self.workers, self.iterations = model, workers, iterations
        # The same sweep with a model that leaves more idle time (not used by `holds`).
        self.ablation_model = ablation_model
        self.fractions, self.stagger = tuple(fractions), stagger

    # -- scenarios -------------------------------------------------------------------------
    def scenario(self, aggregators: int, hashing: str, starts=(0.0, 0.0, 0.0), slots: int = 0, n_jobs: int = 3,
                 model: str | None = None, seed: int = 1) -> dict:
        nw = self.workers
        jobs = []
        for k in range(n_jobs):
            b = k * (nw + 1)
            jobs.append({"name": f"job{k}", "scheme": "atp", "model": model or self.model,
                         "iterations": self.iterations, "workers": f"h{b}..h{b + nw - 1}",
                         "servers": [f"h{b + nw}"], "start": f"{starts[k] * 1e6:.3f}us",
                         "ina": {"hashing": hashing} | ({"slots": slots} if slots else {})})
        return {"name": f"atp13a-{hashing}-{aggregators}", "seed": seed, "stop": "5s",
                "topology": {"kind": "star", "hosts": n_jobs * (nw + 1)},
                "network": {"aggregator_memory": f"{aggregators * AGGREGATOR_BYTES}B"},
                "jobs": jobs, "metrics": {"bin": "1ms"}}


    def _run(self, seed: int, progress) -> pd.DataFrame:
        rows = self.sweep(self.model, progress, seed)
        if self.ablation_model:
            rows = pd.concat([rows, self.sweep(self.ablation_model, progress, seed)], ignore_index=True)
        return rows

    def sweep(self, model: str, progress, seed: int = 1) -> pd.DataFrame:
        import inalab
        from ..models import get_model

        def sim(*a, **k):
            return inalab.simulate(self.scenario(*a, model=model, seed=seed, **k))

        # PTA as the paper tunes it: the fewest aggregators with which static allocation gives each
        # job its peak throughput; one job's need by bisection over static slices (its window is its
        # slice), x 3 jobs. Every job then has that many slots, under both allocations.
        progress(f"atp-13a: {model}: calibrating PTA (one job, static slices)")
        big = sim(30000, "static", n_jobs=1)
        full = float(big.jobs.goodput_gbps.iloc[0])
        iter_s = float(big.iterations.duration_s.median())

        def alone(n: int) -> float:
            # A job that does not finish with n slots has no goodput: n is too few (0).
            return float(sim(n, "static", slots=n, n_jobs=1).jobs.goodput_gbps.fillna(0.0).iloc[0])

        need = static_need(alone, full, 4 * int(big.switches.aggregators_peak.iloc[0]))
        pta = 3 * need
        starts = (0.0, iter_s / 3, 2 * iter_s / 3) if self.stagger else (0.0, 0.0, 0.0)
        batch = get_model(model).batch_size or 1
        rows = []
        for frac in self.fractions:
            aggs = max(3, int(round(pta * frac)))
            for hashing, label in (("hash", "dynamic"), ("static", "static")):
                progress(f"atp-13a: {model}: {label}, {frac:.0%} of PTA = {aggs} aggregators")
                r = sim(aggs, hashing, starts, need)
                it = r.iterations
                # training throughput after warm-up: iterations from the second on
                steady = it[it.iteration >= 1].groupby("job").duration_s.mean()
                c = r.switches.counters.iloc[0]
                rows.append({"model": model, "pta_fraction": float(frac), "aggregators": aggs, "sharing": label,
                             "finished": bool(r.jobs.finished.all()),
                             "iteration_ms": 1e3 * float(steady.mean()),
                             "throughput": float((batch / steady).mean()),
                             "goodput_gbps": float(r.jobs.goodput_gbps.mean(skipna=False)),
                             "switch_agg_fraction": float(c["aggregated"] / max(1, r.switches.rx_packets.iloc[0])),
                             "collisions": int(c["collisions"]),
                             "rehashes": int(sum(h.get("rehashes", 0) for h in r.hosts["counters"])),
                             "pta": pta, "slots": need})
        df = pd.DataFrame(rows)
        base = df.throughput.max()
        df["normalized"] = df.throughput / base
        return df

    # -- verdict ---------------------------------------------------------------------------
    @property
    def tolerance(self) -> str:
        """What `holds` checks, with its thresholds (shown by the report and the JSON)."""
        return (f"({self.model}) every job finishes; at 100 % PTA |dynamic / static - 1| <= {PEAK_TOL}; at the lowest "
                f"PTA dynamic >= {MIN_ADVANTAGE}x static; in between dynamic >= {1 - PEAK_TOL:.2f}x static")

    def holds(self, rows: pd.DataFrame) -> bool:
        rows = rows[rows.model == self.model]
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
        every = rows
        rows = rows[rows.model == self.model]
        ab = every[every.model == self.ablation_model]
        if len(ab):
            at = ab.pivot(index="pta_fraction", columns="sharing", values="throughput").sort_index(ascending=False)
            at["dynamic/static"] = at["dynamic"] / at["static"]
            ab_table = markdown_table(at.reset_index())
            ab_low = float(at["dynamic/static"].iloc[-1])
            ab_holds = self.holds(ab.assign(model=self.model))
        else:
            ab_table, ab_low, ab_holds = "(not run)", float("nan"), False
        pta, need = int(rows.pta.iloc[0]), int(rows.slots.iloc[0])
        t = rows.pivot(index="pta_fraction", columns="sharing", values="throughput").sort_index(ascending=False)
        t["dynamic/static"] = t["dynamic"] / t["static"]
        tt = t
        t = t.reset_index()
        top, low = tt.index.max(), tt.index.min()
        r = rows.set_index(["pta_fraction", "sharing"])
        ds_low, ds_top = float(tt.loc[low, "dynamic/static"]), float(tt.loc[top, "dynamic/static"])
        mid = tt.loc[(tt.index < top) & (tt.index > low), "dynamic/static"]
        mid_text = (f"dynamic / static is {mid.min():.2f}-{mid.max():.2f} at {mid.index.min():.0%}-{mid.index.max():.0%} PTA"
                    if len(mid) else "there is no fraction between the extremes")
        dyn_top, dyn_low = r.loc[(top, "dynamic")], r.loc[(low, "dynamic")]
        summary = (f"dynamic / static = {ds_top:.2f} at 100 % PTA (paper: ~1) and {ds_low:.2f} at {low:.0%} PTA "
                   f"(paper: dynamic better, up to 1.38x in training time).")
        show = rows[["pta_fraction", "aggregators", "sharing", "iteration_ms", "throughput",
                     "normalized", "switch_agg_fraction", "collisions", "rehashes", "finished"]]
        return f"""# {self.name} (ATP Fig. 13a)

**Claim.** {self.claim}

**Command.** `inalab reproduce {self.name}`

**Setup (scaled down).** 3 identical ATP jobs on one 100 Gbps star switch, each with
{self.workers} workers and its own PS host (`{self.model}` from the catalog, {self.iterations}
iterations; `throughput` = batch / mean duration of iterations 2..{self.iterations}, i.e. after warm-up,
per worker; `{self.model}` has no batch size in the catalog, so it is iterations/s). Jobs start staggered
by 1/3 of an iteration (`stagger = {self.stagger}`) so that their on/off phases are not aligned, as in
the paper's Fig. 13c. The paper uses VGG16 (553 MB per iteration); one VGG16 iteration of 3 jobs costs
~10^8 packet events, so we use `{self.model}` (16 MB, comm:comp = 2:1 at 100 Gbps, i.e.
network-intensive like VGG16 on the paper's testbed). The inalab simulator cannot co-locate workers of
different jobs on one host, so the jobs do not share links (the paper's jobs had "identical placement"
and shared the switch-to-PS link); the aggregator pool is the only shared resource.

**PTA.** Measured as the paper tunes it: the fewest aggregators with which one job alone under
static allocation (its window is its slice, as in SwitchML) reaches its ample-pool throughput within
2 % (bisection, `atp_pta.static_need`): **{need}** per job, PTA = 3 x {need} = **{pta}**. Every job has
`ina.slots = {need}` under both allocations. The sweep uses
{', '.join(f'{f:.0%}' for f in sorted(rows.pta_fraction.unique(), reverse=True))} of PTA.
Static: each job owns a third of the pool and its window is its slice. Dynamic: ATP's hashed slot
table of {need} slots over the whole pool; the PS moves a colliding slot for good to an aggregator the
job has not used; a fragment that finds its aggregator taken goes to the PS.

**Our result** (`holds` = {self.holds(rows)}; tolerances: at 100 % PTA |dynamic/static - 1| <= {PEAK_TOL};
at the lowest fraction dynamic >= {MIN_ADVANTAGE} x static; never below (1 - {PEAK_TOL}) x static):

{markdown_table(t)}

All runs:

{markdown_table(show)}

**Ablation: a model that leaves the pool idle more often.** The same sweep with `{self.ablation_model}`
(comm:comp = 1:2 at 100 Gbps, so each job computes two thirds of the time and its aggregators sit
idle; `holds` on these rows = {ab_holds}):

{ab_table}

**Where and why we differ.**

* {summary}
* The one mechanism that separates our main result from the paper's is how much of the time the
  other jobs leave the pool idle. `{self.model}` (chosen to be network-intensive like VGG16) keeps
  each job communicating two thirds of the time, so below 100 % PTA the jobs' slots overlap while
  they are all busy, and the PS's moves run out of unused aggregators (each job tries every
  aggregator once, then keeps its slots): {mid_text}, and {ds_low:.2f} at {low:.0%}. With `{self.ablation_model}` the paper's shape appears: equal at 100 %,
  dynamic ahead below it and {ab_low:.2f}x static at the lowest fraction (paper: up to 1.38x). The
  paper's Fig. 13c shows its VGG16 jobs off for hundreds of ms at a time, i.e. much idle time.
* At 100 % PTA dynamic collides {int(dyn_top.collisions):,} times in the whole run and the PSs move
  {int(dyn_top.rehashes)} slots; at {low:.0%} PTA, {int(dyn_low.collisions):,} collisions: there is not room
  for every job's slots, so fragments fall back to the PS, which is the point of best effort: a
  static job's window shrinks with its slice, a dynamic job keeps its window and uses the PS link
  and the aggregators the other jobs leave idle in their compute phases.
* Before issue #11, inalab hashed every fragment over the whole pool and rehashed at random with
  replacement; a job then collided with its own in-flight fragments and dynamic sharing was far
  below static at 100 % PTA. The authors' code (`in-ATP/ATP`) gives each job a table of distinct
  slots, keeps the window within it and moves colliding slots without replacement; that is what runs
  here (see `atp-hash-vs-linear`).
* The paper's convergence takes ~500 ms of VGG16 training; our runs last tens of ms of simulated
  time, and the moves happen in the first iterations.
* Compute times come from the catalog's profile of `{self.model}`; there is no CPU/PS processing limit
  (the paper's PS saturates at 60 Gbps).
"""

    def plot(self, rows: pd.DataFrame, path: Path) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from ..plots import finish_figure, line_style

        fig, ax = plt.subplots(figsize=(6, 3.6))
        for i, label in enumerate(("dynamic", "static")):
            d = rows[rows.sharing == label].sort_values("pta_fraction")
            ax.plot(100 * d.pta_fraction, d.throughput, label=f"{label} sharing", **line_style(i))
        ax.invert_xaxis()
        ax.set_xlabel(f"switch aggregators (% of the PTA, {int(rows.pta.iloc[0])})")
        ax.set_ylabel("iterations/s per job (after warm-up)")
        ax.set_ylim(bottom=0)
        return finish_figure(fig, path, "ATP Fig. 13a: 3 ATP jobs sharing the switch's aggregators dynamically vs "
                             "statically, as the aggregators shrink", legend="right")


register(AtpDynamicVsStatic())
