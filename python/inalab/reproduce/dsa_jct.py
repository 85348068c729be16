"""DSA Figs. 8 and 9: average JCT against the number of jobs (8 workers each) and against the
workers per job (8 jobs), DSA against ATP and SwitchML, for all-A, all-B and mixed jobs."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import markdown_table, register, simulate_all
from .dsa_policy_ablation import measure, scenario

SCHEMES = (("dsa", "dsa"), ("atp", None), ("switchml", None))
MIXES = ("A", "B", "AB")


class DsaJct:
    """One of the two sweeps: ``axis`` "jobs" (Fig. 8, 8 workers each) or "workers" (Fig. 9,
    8 jobs)."""

    def __init__(self, axis: str, values=None, mixes=MIXES):
        self.axis = axis
        self.values = list(values or ((1, 2, 4, 6, 8) if axis == "jobs" else (2, 4, 6, 8)))
        self.mixes = list(mixes)
        fig = "8" if axis == "jobs" else "9"
        self.name = f"dsa-jct-vs-{axis}"
        self.claim = (f"DSA Fig. {fig} (§VII-B): on a 100 Gbps star with 5 MB of switch memory, DSA has the lowest "
                      f"average JCT at every number of {'jobs' if axis == 'jobs' else 'workers per job'}; "
                      + ("ATP/DSA up to about 1.35 and SwitchML/DSA up to about 1.89, both growing with the number of jobs."
                         if axis == "jobs" else "its gain over ATP grows with the workers per job."))

    def _size(self, x: int) -> dict:
        return {"jobs": x, "workers": 8} if self.axis == "jobs" else {"jobs": 8, "workers": x}

    def run(self, progress) -> pd.DataFrame:
        runs = [({"mix": mix, self.axis: x, "scheme": scheme}, scenario(scheme, policy, mix, **self._size(x)))
                for mix in self.mixes for x in self.values for scheme, policy in SCHEMES]
        df = simulate_all(self.name, runs, progress, measure)
        dsa = df[df.scheme == "dsa"].set_index(["mix", self.axis])["mean_jct_ms"]
        df["vs_dsa"] = df["mean_jct_ms"] / pd.Series(list(zip(df["mix"], df[self.axis]))).map(dsa).values
        return df

    # Tolerance: DSA's average JCT at most 1.05x the best baseline's at every point.
    SLACK = 0.05

    def holds(self, rows: pd.DataFrame) -> bool:
        return bool((rows[rows.scheme != "dsa"].vs_dsa >= 1 - self.SLACK).all())

    def explain(self, rows: pd.DataFrame) -> str:
        t = rows.pivot_table(index=["mix", self.axis], columns="scheme", values="vs_dsa").reset_index()
        wins = rows[rows.scheme != "dsa"].groupby(["mix", self.axis]).vs_dsa.min()
        n_dsa_best = int((wins >= 1 - self.SLACK).sum())
        cols = ["mix", self.axis, "scheme", "mean_jct_ms", "max_jct_ms", "vs_dsa", "collisions", "preemptions",
                "switch_completed", "ps_completed", "ps_reminders", "worker_timeouts"]
        axis_text = "1 to 8 jobs of 8 workers" if self.axis == "jobs" else "8 jobs of 2 to 8 workers"
        return f"""# {self.name} (DSA Fig. {"8" if self.axis == "jobs" else "9"}; simulation)

**Claim.** {self.claim}

**Command.** `inalab reproduce {self.name}`. Scenario as `dsa-policy-ablation` (DSA §VII-B: one 100 Gbps
star, 5 MB of aggregator memory, one PS host per job, starts U(0, 1 ms), backward passes jittered by
U(0, 300 us), one epoch of DNN A or B), with {axis_text}; mixes all-A, all-B and A/B alternating.

**Our result** (`holds` = {self.holds(rows)}; tolerance: every baseline's average JCT at least
(1 - {self.SLACK}) x DSA's at every point; DSA is the fastest at {n_dsa_best} of {len(wins)} points):

Average JCT relative to DSA's (above 1: DSA faster):

{markdown_table(t)}

All runs:

{markdown_table(rows[cols])}

**Where and why they differ.** The same cause as in `dsa-policy-ablation`: fragments split between
the switch and the PS wait for DSA's 1 ms minimum timeout (`ps_reminders`, `worker_timeouts`),
and every job that has one pays about a millisecond. With few jobs there are few collisions and
DSA completes almost everything on the switch without the PS round trip, which is where it
should gain; with more jobs and workers, splits become likelier and the floor dominates. One
seed; the paper's x-values are only in its images (spec §4 item 18's choice).
"""

    def plot(self, rows: pd.DataFrame, path: Path) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(self.mixes), figsize=(4 * len(self.mixes), 3), sharey=True)
        for ax, mix in zip(list(axes) if len(self.mixes) > 1 else [axes], self.mixes):
            for scheme, g in rows[rows.mix == mix].groupby("scheme"):
                ax.plot(g[self.axis], g["mean_jct_ms"], marker="o", label=scheme)
            ax.set_title(f"mix {mix}")
            ax.set_xlabel(self.axis)
        (axes[0] if len(self.mixes) > 1 else axes).set_ylabel("average JCT (ms)")
        plt.legend()
        plt.tight_layout()
        plt.savefig(path, dpi=120)
        plt.close()
        return path


register(DsaJct("jobs"))
register(DsaJct("workers"))
