"""ATP Fig. 10: throughput against packet loss at one worker, ATP vs SwitchML (timeout recovery)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import Seeded, band, markdown_table, n_seeds, register, setup_table, simulate_all

LOSS = (0.0, 1e-5, 1e-4, 1e-3, 1e-2)  # 0, 0.001 %, 0.01 %, 0.1 %, 1 %

# The paper's numbers, judged within a band either way on the mean over seeds:
# §1: "The loss recovery mechanism of ATP outperforms the state-of-the-art (SwitchML) by 34%":
# ATP's normalized throughput over SwitchML's, the largest over the loss rates, within BAND of 1.34.
PAPER_OVER_SWITCHML = 1.34
BAND = 1.25
# §3.8: "we see no deterioration in training throughput if the packet loss rate is < 0.1%
# (§5.2.3)": ATP's normalized throughput at every loss rate below 0.1 % within NO_LOSS_BAND of 1.
NO_LOSS_BELOW_PCT = 0.1
NO_LOSS_BAND = 1.05


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
    # The simulations' scenario seed: it draws which packets the lossy worker loses. Three: the
    # project's least.
    seeds = (1, 2, 3)
    seed_use = "the simulations' scenario `seed`: which packets the lossy worker loses"
    keys = ["scheme", "loss_pct"]  # a row's setup, to match rows across seeds

    def __init__(self, size: str = "32MiB", workers: int = 4, loss=LOSS):
        self.size, self.workers, self.loss = size, workers, list(loss)

    def setup(self) -> list:
        """The write-up's set-up table: (parameter, the paper (where), ours, why different)."""
        rates = ", ".join(f"{100 * p:g} %" for p in self.loss if p)
        return [
            ("topology", "one 32 x 100 Gbps Tofino, 9 hosts (§5.1)", f"a {self.workers + 1}-host star at 100 Gbps, "
             "1 us per link", "a smaller job (next row)"),
            ("workers", "not in §5.2.3; 8 \"unless specified\" (§5.1)", f"{self.workers} workers (+ ATP's PS host)",
             "a smaller job keeps each run short; one lossy worker either way"),
            ("workload", "training (Fig. 10a) and the 4 MB-tensor microbenchmark (Fig. 10b; §5.1)",
             f"one allreduce of {self.size} (the microbenchmark's shape: no compute, always data to send)",
             "Fig. 10b only; one tensor instead of a run of them"),
            ("loss", "one worker drops 0.001 %-1 % of its packets (§5.2.3)",
             f"`host_loss` on worker h0, each packet it sends or receives: {rates}", ""),
            ("timeouts", "1 ms, SwitchML's, for both (§5.2.3)", "`ina.timeout = \"1ms\"` for both", ""),
            ("ATP's CC", "off, \"to avoid window back-off due to this adversarial packet loss\" (§5.2.3)",
             "`ina.congestion_control = false`: a fixed window of 60,000 B (`transport.init_window` default)",
             "the window is not in the paper; 60 KB is its initial one (§3.7)"),
            ("packets", "ATP 306 B (§3.6), SwitchML 180 B (§4)", "ATP 306 B, SwitchML 180 B", ""),
            ("aggregators", "not in the paper", "5 MB (`aggregator_memory` default): ATP's 512 slots, SwitchML an "
             "equal share of the pool", "ample for one job: only losses slow it"),
            ("metric", "throughput normalized to no loss (Fig. 10)", "allreduce bytes / JCT, over the scheme's "
             "no-loss run", ""),
            ("seeds", "not in the paper", f"{len(self.seeds)} ({', '.join(map(str, self.seeds))}): which packets are lost",
             "the project's least"),
        ]


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
    # ("degrades gracefully"); and the paper's numbers above, within their bands.
    MARGIN = 0.05

    @property
    def tolerance(self) -> str:
        """What `holds` checks, with its thresholds (shown by the report and the JSON)."""
        return (f"every run finishes; at every loss rate ATP's normalized throughput >= SwitchML's - {self.MARGIN}; at "
                f"0.01 % loss ATP keeps >= 0.5 of its lossless throughput; ATP's largest normalized throughput over "
                f"SwitchML's within {BAND}x of the paper's {PAPER_OVER_SWITCHML}x either way (\"outperforms SwitchML by "
                f"34%\", §1); ATP's normalized throughput at every loss rate below {NO_LOSS_BELOW_PCT:g} % within "
                f"{NO_LOSS_BAND}x of 1 (\"no deterioration\", §3.8)")

    def _normalized(self, rows: pd.DataFrame) -> pd.DataFrame:
        return rows[rows.loss_pct > 0].pivot(index="loss_pct", columns="scheme", values="normalized")

    def over_switchml(self, rows: pd.DataFrame) -> float:
        """ATP's normalized throughput over SwitchML's, the largest over the loss rates."""
        n = self._normalized(rows)
        return float((n["atp"] / n["switchml"]).max())

    def checks(self, rows: pd.DataFrame) -> dict:
        n = self._normalized(rows)
        low = n[n.index < NO_LOSS_BELOW_PCT]
        return {"finished": bool(rows.finished.all()),
                "atp_degrades_less": bool((n["atp"] >= n["switchml"] - self.MARGIN).all()),
                "graceful": bool(n.loc[0.01, "atp"] >= 0.5) if 0.01 in n.index else True,
                "over_switchml_band": band(self.over_switchml(rows), PAPER_OVER_SWITCHML, BAND),
                "no_deterioration_below_0.1%": bool(all(band(v, 1.0, NO_LOSS_BAND) for v in low["atp"]))}

    def holds(self, rows: pd.DataFrame) -> bool:
        return all(self.checks(rows).values())

    def headline(self, rows: pd.DataFrame) -> str:
        """The index's one line (inalab.reproduce.index)."""
        n = self._normalized(rows)
        top = n.index.max()
        return (f"at {top:g} % loss ATP keeps {n.loc[top, 'atp']:.2f} of its throughput, SwitchML (1 ms timeouts) "
                f"{n.loc[top, 'switchml']:.2f}; ATP over SwitchML up to {self.over_switchml(rows):.2f}x (paper {PAPER_OVER_SWITCHML}x)")

    def explain(self, rows: pd.DataFrame) -> str:
        n = rows.pivot(index="loss_pct", columns="scheme", values="normalized").reset_index()
        a = rows[rows.scheme == "atp"].set_index("loss_pct")
        top = a.index.max()
        over = self.over_switchml(rows)
        band_word = "inside" if band(over, PAPER_OVER_SWITCHML, BAND) else "outside"
        sw = rows[rows.scheme == "switchml"].set_index("loss_pct")
        sw_lost = float(sw.loc[top, "packets_lost"])
        sw_slow = float(sw.loc[top, "jct_s"] / sw.loc[0.0, "jct_s"]) if 0.0 in sw.index else float("nan")
        atp_slow = float(a.loc[top, "jct_s"] / a.loc[0.0, "jct_s"]) if 0.0 in a.index else float("nan")
        checks = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in self.checks(rows).items())
        return f"""# atp-loss (ATP Fig. 10b, microbenchmark)

{setup_table(self.setup())}

**Claim.** {self.claim}

**Command.** `inalab reproduce atp-loss`. Scenario: one allreduce of {self.size} with {self.workers} workers
on a 100 Gbps star; ATP (`congestion_control = false`, fixed 60000 B window, 1 ms timeout, one PS
host) vs SwitchML (1 ms timeout, equal-share slot pool); `host_loss` on worker `h0` (each packet
it sends or receives is lost with this probability). Throughput = allreduce bytes / JCT,
normalized to the scheme's no-loss run.

**Our result** (`holds` = {self.holds(rows)}; tolerance: {self.tolerance}; checks: {checks}):

ATP's largest normalized throughput over SwitchML's: {over:.2f}x (paper: {PAPER_OVER_SWITCHML}x).

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
* The paper's "34%" (§1): ours is {over:.2f}x, {band_word} the band {PAPER_OVER_SWITCHML / BAND:.2f}-{PAPER_OVER_SWITCHML * BAND:.2f}.
  The paper does not say at which loss rate, nor in which panel (training, Fig. 10a, or the
  microbenchmark, Fig. 10b), ATP is 34 % ahead; we judge the largest ratio over our rates in a run
  with no compute, where nothing hides SwitchML's 1 ms stalls: at {top:g} % loss SwitchML loses
  {sw_lost:,.0f} packets and takes {sw_slow:.2f}x its lossless time, ATP {atp_slow:.2f}x.
* At the highest rate ATP still loses {1 - a.loc[top, 'normalized']:.0%} of its throughput: with
  congestion control off its window does not shrink, and resends compete with new fragments.
* History: an earlier version resent only the oldest missing fragment once and let the PS ignore a
  resend within half a timeout of its answer; losses then cost serialized 1 ms timeouts and this
  reproduction showed the reverse order. That was a modelling error (the paper's recovery is
  meant to react within a round trip), fixed in the ATP worker and PS.
* The paper's SwitchML is its own prototype with 180 B packets; ours is a packet-level model of
  SwitchML's per-slot protocol with the same packet size.
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
