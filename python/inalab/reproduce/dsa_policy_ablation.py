"""DSA Fig. 11 (with Fig. 8's 8-job point): average JCT of 8 jobs x 8 workers on one switch,
DSA against its two strawman policies, an FCFS ablation, ATP and SwitchML."""
from __future__ import annotations

import random
from pathlib import Path

import pandas as pd

from . import markdown_table, register, simulate_all

JOBS, WORKERS = 8, 8
# (scheme, policy) pairs; policy None for the baselines.
VARIANTS = (("atp", None), ("dsa", "dsa"), ("dsa", "always-preempt"), ("dsa", "preempt-half"), ("dsa", "fcfs"), ("switchml", None))
MIXES = {"A": "all DNN A", "AB": "DNN A and B alternating"}


def scenario(scheme: str, policy, mix: str, seed: int = 1, min_rto=None, jobs: int = JOBS, workers: int = WORKERS) -> dict:
    """DSA §VII-B: a star of 64 workers and 8 PS hosts at 100 Gbps, 5 MB of aggregator memory,
    jobs starting U(0, 1 ms) apart, each worker's backward pass jittered by U(0, 300 us),
    one epoch (one iteration) of the synthetic DNN A or B."""
    rng = random.Random(seed)
    specs = []
    for k in range(jobs):
        model = "dnn_a" if mix == "A" or (mix == "AB" and k % 2 == 0) else "dnn_b"
        job = {"name": f"j{k}", "scheme": scheme, "model": model, "iterations": 1, "jitter": "300us",
               "workers": f"h{k * workers}..h{k * workers + workers - 1}", "start": f"{rng.uniform(0, 1000):.3f}us"}
        if scheme != "switchml":
            job["servers"] = [f"h{jobs * workers + k}"]
        if policy:
            job["ina"] = {"policy": policy}
        if min_rto:
            job["ina"]["min_rto"] = min_rto
        specs.append(job)
    return {"name": f"dsa-fig11-{scheme}-{policy}-{mix}", "seed": seed, "stop": "1s",
            "topology": {"kind": "star", "hosts": jobs * workers + jobs, "switch_ports": 128},
            "network": {"aggregator_memory": "5MB"}, "jobs": specs}


def _sum(counters, name: str) -> int:
    return int(sum(c.get(name, 0) for c in counters))


def measure(r) -> list[dict]:
    """A run's row: mean and slowest JCT, and where fragments were finished."""
    sw = list(r.switches["counters"])
    hosts = list(r.hosts["counters"])
    return [{"mean_jct_ms": float(r.jobs.jct_s.mean() * 1e3), "max_jct_ms": float(r.jobs.jct_s.max() * 1e3),
             # DSA's "memory utilization" (Fig. 10, spec §4 item 21): each job's aggregation
             # rate while it waits on an allreduce, over the 100 Gbps link, averaged over jobs.
             "utilization": float(sum(j["aggregation_gbps"] for j in r.raw["jobs"]) / len(r.raw["jobs"]) / 100),
             "finished": bool(r.jobs.finished.all()),
             "collisions": _sum(sw, "collisions"), "preemptions": _sum(sw, "preemptions"),
             "switch_completed": _sum(sw, "completed"), "ps_completed": _sum(hosts, "completed"),
             "ps_reminders": _sum(hosts, "reminders"), "worker_timeouts": _sum(hosts, "timeouts")}]


class DsaPolicy:
    name = "dsa-policy-ablation"
    claim = ("DSA Fig. 11 (§VII-C) and Fig. 8 (§VII-B): with 8 jobs of 8 workers sharing one switch, the "
             "average JCT speedup over ATP is 1.35 (DSA), 1.19 (always preempt), 1.19 (preempt half) with "
             "all-A jobs and 1.22 / 1.05 / 1.05 with a 1:1 mix of A and B; DSA also beats SwitchML (up to 1.89x).")

    def __init__(self, jobs: int = JOBS, workers: int = WORKERS, mixes=tuple(MIXES)):
        self.jobs, self.workers, self.mixes = jobs, workers, list(mixes)

    def run(self, progress) -> pd.DataFrame:
        size = {"jobs": self.jobs, "workers": self.workers}
        runs = [({"mix": mix, "scheme": scheme, "policy": policy or "-"}, scenario(scheme, policy, mix, **size))
                for mix in self.mixes for scheme, policy in VARIANTS]
        # Ablation: DSA's 1 ms minimum timeout (§VI) lowered to 300 us.
        runs += [({"mix": mix, "scheme": "dsa", "policy": "dsa, min_rto 300us"}, scenario("dsa", "dsa", mix, min_rto="300us", **size))
                 for mix in self.mixes]
        df = simulate_all("dsa-fig11", runs, progress, measure)
        atp = df[df.scheme == "atp"].set_index("mix")["mean_jct_ms"]
        df["speedup_over_atp"] = df["mix"].map(atp) / df["mean_jct_ms"]
        return df

    # Tolerance: the paper's order in both mixes, with 5 % slack: DSA at least as fast as ATP
    # and as SwitchML, and at least as fast as either strawman.
    SLACK = 0.05

    def _speedups(self, rows: pd.DataFrame) -> pd.DataFrame:
        r = rows.assign(variant=rows.scheme + "/" + rows.policy)
        return r.pivot(index="mix", columns="variant", values="speedup_over_atp")

    def holds(self, rows: pd.DataFrame) -> bool:
        s = self._speedups(rows)
        dsa = s["dsa/dsa"]
        rivals = [s["atp/-"], s["switchml/-"], s["dsa/always-preempt"], s["dsa/preempt-half"]]
        return bool(all((dsa >= r * (1 - self.SLACK)).all() for r in rivals))

    def explain(self, rows: pd.DataFrame) -> str:
        s = self._speedups(rows).reset_index()
        d = rows.set_index(["mix", "scheme", "policy"])
        a_dsa = d.loc[("A", "dsa", "dsa")]
        sp = self._speedups(rows)
        policies = ["dsa/dsa", "dsa/always-preempt", "dsa/preempt-half", "dsa/fcfs"]
        best = {mix: sp.loc[mix, policies].idxmax().split("/")[1] for mix in sp.index}
        ablation = {mix: sp.loc[mix, "dsa/dsa, min_rto 300us"] for mix in sp.index}
        best_ab, ablation_ab = best.get("AB", "-"), ablation.get("AB", float("nan"))
        cols = ["mix", "scheme", "policy", "mean_jct_ms", "max_jct_ms", "speedup_over_atp", "collisions", "preemptions",
                "switch_completed", "ps_completed", "ps_reminders", "worker_timeouts"]
        return f"""# dsa-policy (DSA Fig. 11, and Fig. 8 at 8 jobs; simulation)

**Claim.** {self.claim}

**Command.** `inalab reproduce dsa-policy-ablation`. Scenario (DSA §VII-B): one 100 Gbps star switch with 5 MB
of aggregator memory, {self.jobs} jobs x {self.workers} workers (one per host) plus one PS host per job, jobs
starting U(0, 1 ms) apart, each worker's backward pass of every partition jittered by U(0, 300 us),
one epoch of DNN A (2 layers x 2 partitions of 4 MB, Comm:Comp 2:1) or B (2 MB partitions, 1:2);
306 B packets for ATP and DSA, SwitchML's own (equal split of the pool). Priorities from DSA's
policy P = (1/T)(L/l)(Comm/Comp) per tensor (partitions share their layer's l; T from each
worker's own progress); workers send in the backward pass's order (the paper's L2p1 -> L1 -> L2p2
reordering is not built, docs/dsa.md).

**Our result** (`holds` = {self.holds(rows)}; tolerance: DSA's speedup at least (1 - {self.SLACK}) x that of
ATP, SwitchML and both strawmen, in both mixes):

Average-JCT speedup over ATP:

{markdown_table(s)}

All runs:

{markdown_table(rows[cols])}

**Where and why they differ.**

* The paper's order does not hold here: DSA is slower than ATP. The cause is visible in the
  counters: a fragment whose contributions end up split between the PS and the switch (an
  eviction or a lost preemption, then the rest re-reserving the freed aggregator: the paper's
  type-III task, its Fig. 3 steps 7-10) is finished only by the PS's reminder or the workers'
  retransmission, both at DSA's 1 ms minimum timeout (§VI). With all-A jobs DSA finished
  {int(a_dsa.switch_completed)} fragments on the switch and {int(a_dsa.ps_completed)} at the PSes, with
  {int(a_dsa.ps_reminders)} reminders and {int(a_dsa.worker_timeouts)} worker timeouts: a few hundred
  split fragments among half a million, but every job has some, and each costs its job about one
  millisecond on a JCT of two to three. ATP repairs the same situation within a round trip: its workers resend a fragment once three
  later results arrived, and the resend takes the switch's partial along to the PS.
* Many collisions are a job's with itself: DSA hashes every (job, PSN) over the whole array
  (§III-B), and under the 300 us send jitter a job's fastest worker runs a window ahead of its
  slowest, so its own half-aggregated fragments meet (`dsa-jct-vs-jobs` shows DSA slower than
  ATP even with one job). ATP gives each job a table of distinct slots.
* Among DSA's policies the fastest is {best['A']} (all A) and {best_ab} (mixed), not DSA's own:
  the fewer fragments a policy splits, the fewer millisecond waits (FCFS never evicts, but every
  loser goes to the PS and the rest of its fragment re-reserves the freed aggregator, so it splits
  the most). The policy matters less here than the paper's 1.16x because every variant pays the
  same timeout floor.
* A lower floor narrows the gap without closing it: with `ina.min_rto = "300us"` DSA's speedup
  over ATP is {ablation['A']:.2f} (all A) and {ablation_ab:.2f} (mixed), at the price of spurious
  retransmissions (`worker_timeouts`).
* What the paper's simulator did differently cannot be checked (no public code). Its ATP baseline
  may recover from collisions more slowly than ours (inalab's ATP reacts within a round trip,
  see `atp-loss`), which would narrow or reverse the gap; and its jobs may see fewer splits.
* One seed; x-values of Fig. 8 are only in the paper's image, so only its 8-job point is here.
"""

    def plot(self, rows: pd.DataFrame, path: Path) -> Path:
        return bar_plot(self._speedups(rows).T, path, "average JCT speedup over ATP", "DSA Fig. 11: 8 jobs x 8 workers", (7, 3.5), ref=1.0)


def bar_plot(table: pd.DataFrame, path: Path, ylabel: str, title: str, size, ref=None) -> Path:
    """A grouped bar chart of ``table`` (rows on the x axis) written to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = table.plot.bar(figsize=size)
    if ref is not None:
        ax.axhline(ref, color="grey", lw=0.8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    plt.tight_layout()
    plt.savefig(path, dpi=120)
    plt.close()
    return path


register(DsaPolicy())
