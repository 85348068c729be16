"""ATP Fig. 10: throughput against packet loss at one worker, ATP vs SwitchML (timeout recovery)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import Seeded, markdown_table, n_seeds, register, simulate_all

LOSS = (0.0, 1e-5, 1e-4, 1e-3, 1e-2)  # 0, 0.001 %, 0.01 %, 0.1 %, 1 %


def scenario(scheme: str, prob: float, size: str, workers: int, seed: int = 1) -> dict:
    job = {"name": scheme, "scheme": scheme, "allreduce": size, "iterations": 1,
           "workers": f"h0..h{workers - 1}", "ina": {"timeout": "1ms"}}
    if scheme == "atp":
        job["servers"] = [f"h{workers}"]
        job["ina"]["congestion_control"] = False  # as in the paper's §5.2.3
    return {"name": f"atp-fig10-{scheme}-{prob:g}", "seed": seed, "stop": "30s",
            "topology": {"kind": "star", "hosts": workers + 1}, "jobs": [job],
            "network": {"host_loss": [{"host": "h0", "prob": prob}] if prob else []}}


def measure(r) -> list[dict]:
    """A run's row: the job's throughput and the lossy worker's (h0's) recovery counters."""
    j = r.jobs.iloc[0]
    h = r.hosts.set_index("name")
    c = h.loc["h0", "counters"]
    return [{"goodput_gbps": float(j["goodput_gbps"]), "jct_s": float(j["jct_s"]), "finished": bool(j["finished"]),
             "packets_lost": int(h["drops_loss"].sum()),
             "lossy_worker_timeouts": int(c.get("timeouts", 0)),
             "lossy_worker_resends": int(c.get("resends", c.get("retransmissions", 0)))}]


class AtpLoss(Seeded):
    name = "atp-loss"
    figure = "Fig. 10"
    claim = ("ATP Fig. 10 (§5.2.3): with one worker dropping 0.001 %-1 % of its packets and congestion "
             "control off, ATP's throughput (normalized to no loss) degrades gracefully and less than "
             "SwitchML's, whose loss recovery is a 1 ms timeout.")
    simulates = "5-host star"
    # The simulations' scenario seed: it draws which packets the lossy worker loses. (1,): the
    # committed write-up's.
    seeds = (1,)
    seed_use = "the simulations' scenario `seed`: which packets the lossy worker loses"

    def __init__(self, size: str = "32MiB", workers: int = 4, loss=LOSS):
        self.size, self.workers, self.loss = size, workers, list(loss)


    def _run(self, seed: int, progress) -> pd.DataFrame:
        runs = [({"scheme": scheme, "loss_pct": p * 100}, scenario(scheme, p, self.size, self.workers, seed))
                for scheme in ("atp", "switchml") for p in self.loss]
        rows = simulate_all("atp-fig10", runs, progress, measure).to_dict("records")
        df = pd.DataFrame(rows)
        base = df[df.loss_pct == 0].set_index("scheme")["goodput_gbps"]
        df["normalized"] = df["goodput_gbps"] / df["scheme"].map(base)
        return df

    # Tolerance: at every loss rate > 0, ATP's normalized throughput >= SwitchML's minus 0.05
    # ("ATP degrades ... to a lesser degree than SwitchML"), and ATP keeps >= 50 % at 0.01 % loss
    # ("degrades gracefully").
    MARGIN = 0.05

    @property
    def tolerance(self) -> str:
        """What `holds` checks, with its thresholds (shown by the report and the JSON)."""
        return (f"at every loss rate ATP's normalized throughput >= SwitchML's - {self.MARGIN}; at 1 % loss ATP keeps "
                ">= 0.5 of its lossless throughput")

    def holds(self, rows: pd.DataFrame) -> bool:
        n = rows[rows.loss_pct > 0].pivot(index="loss_pct", columns="scheme", values="normalized")
        graceful = True
        if 0.01 in n.index:
            graceful = n.loc[0.01, "atp"] >= 0.5
        return bool((n["atp"] >= n["switchml"] - self.MARGIN).all() and graceful)

    def explain(self, rows: pd.DataFrame) -> str:
        n = rows.pivot(index="loss_pct", columns="scheme", values="normalized").reset_index()
        a = rows[rows.scheme == "atp"].set_index("loss_pct")
        top = a.index.max()
        return f"""# atp-loss (ATP Fig. 10b, microbenchmark)

**Claim.** {self.claim}

**Command.** `inalab reproduce atp-loss`. Scenario: one allreduce of {self.size} with {self.workers} workers
on a 100 Gbps star; ATP (`congestion_control = false`, fixed 60000 B window, 1 ms timeout, one PS
host) vs SwitchML (1 ms timeout, equal-share slot pool); `host_loss` on worker `h0` (each packet
it sends or receives is lost with this probability). Throughput = allreduce bytes / JCT,
normalized to the scheme's no-loss run.

**Our result** (`holds` = {self.holds(rows)}; tolerance: ATP's normalized throughput >= SwitchML's - {self.MARGIN}
at every loss rate, and >= 0.5 at 0.01 %):

Normalized throughput:

{markdown_table(n)}

All runs:

{markdown_table(rows)}

**Where and why they differ.**

* ATP degrades less than SwitchML, the paper's order. ATP's workers treat a fragment as lost
  when three parameters of later fragments have arrived and resend it at once (counted for every
  missing fragment, like SACK holes), so a loss costs about a round trip; the PS answers the first
  resend of an already completed fragment at once, and a lost resend of the fragment holding the
  window back is resent again one RTO later (RFC 6298 estimate, at least 10 us; inalab's
  addition, the paper waits for the timeout). SwitchML's only signal is its 1 ms per-slot
  timeout, so every loss stalls one slot for a millisecond (the `lossy_worker_timeouts` column
  equals its losses).
* At the highest rate ATP still loses {1 - a.loc[top, 'normalized']:.0%} of its throughput: with
  congestion control off its window does not shrink, and resends compete with new fragments.
* History: an earlier version resent only the oldest missing fragment once and let the PS ignore a
  resend within half a timeout of its answer; losses then cost serialized 1 ms timeouts and this
  reproduction showed the reverse order. That was a modelling error (the paper's recovery is
  meant to react within a round trip), fixed in the ATP worker and PS.
* The paper's SwitchML is its own prototype with 180 B packets; ours is a packet-level model of
  SwitchML's per-slot protocol with the same packet size. The paper's SwitchML may also lose more
  per timeout (its Fig. 10 shows it falling much faster), which we cannot check.
* Scaled down: one {self.size} allreduce (~{int(rows.loc[(rows.scheme == 'atp') & (rows.loss_pct == 0), 'jct_s'].iloc[0] * 1e3 + 0.5)} ms simulated without loss)
  instead of a long training run, {n_seeds(self.seeds)}. The lossy worker sends and receives ~1.4e5 (ATP) /
  ~2.6e5 (SwitchML) packets each way, so 0.001 % gives only a few losses and that point is noisy
  (a larger tensor would sharpen it at a proportional wall-time cost).
"""

    def plot(self, rows: pd.DataFrame, path: Path) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from ..plots import finish_figure, line_style

        fig, ax = plt.subplots(figsize=(6.5, 3.6))
        lossy = rows[rows.loss_pct > 0]
        for i, (scheme, label) in enumerate((("atp", "ATP"), ("switchml", "SwitchML"))):
            d = lossy[lossy.scheme == scheme]
            ax.plot(d["loss_pct"], d["normalized"], label=label, **line_style(i))
        ax.set_xscale("log")
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("packet loss rate at one worker (%)")
        ax.set_ylabel("throughput / no-loss throughput")
        return finish_figure(fig, path, "ATP Fig. 10b: throughput under packet loss at one worker, ATP vs SwitchML",
                             legend="right")


register(AtpLoss())
