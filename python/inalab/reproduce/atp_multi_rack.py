"""ATP §5.2.2 / Fig. 9: traffic at the PS with two-level aggregation vs a rack-scale solution."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from . import Seeded, band, markdown_table, n_seeds, register, setup_table, simulate_all, whole

WORKERS = {"w0": "sw0", "w1": "sw0", "w2": "sw1", "w3": "sw1", "w4": "sw2", "w5": "sw2"}


def topology(variant: str) -> dict:
    """Fig. 9: three racks sw0..sw2 under one core switch; w0-w1 at sw0, w2-w3 at sw1, w4-w5 and
    the PS at sw2. Variant "rss" moves the PS to its own non-programmable rack sw3 (see explain)."""
    tors = ["sw0", "sw1", "sw2"] + (["sw3"] if variant == "rss" else [])
    nodes = [{"name": s, "kind": "switch", "tier": 1} for s in tors] + [{"name": "core", "kind": "switch", "tier": 2}]
    links = [{"a": s, "b": "core"} for s in tors]
    hosts = dict(WORKERS, ps="sw3" if variant == "rss" else "sw2")
    for h, s in hosts.items():
        nodes.append({"name": h, "kind": "host"})
        links.append({"a": h, "b": s})
    programmable = {"atp": ["sw0", "sw1", "sw2"], "rss": ["sw0", "sw1", "sw2"],
                    "level1_only": ["sw0", "sw1"], "none": []}[variant]
    return {"kind": "edges", "nodes": nodes, "links": links, "programmable": programmable}


def measure(r) -> list[dict]:
    """A run's row: what reached the PS, the job's outcome, the switches' drops and collisions,
    the workers' timeouts."""
    h = r.hosts.set_index("name")
    j = r.jobs.iloc[0]
    sw = r.switches.set_index("name")
    return [{"ps_rx_bytes": int(h.loc["ps", "rx_bytes"]), "finished": bool(j["finished"]), "jct_s": float(j["jct_s"]),
             "queue_drops": int(sw["drops_queue"].sum()),
             "collisions": int(sum(c.get("collisions", 0) for c in sw["counters"])),
             "worker_timeouts": int(sum(h.loc[w, "counters"].get("timeouts", 0) for w in WORKERS))}]


def scenario(variant: str, size: str, iterations: int, seed: int = 1) -> dict:
    return {"name": f"atp-fig9-{variant}", "seed": seed, "stop": "10s", "topology": topology(variant),
            "jobs": [{"name": "job", "scheme": "atp", "allreduce": size, "iterations": iterations,
                      "workers": list(WORKERS), "servers": ["ps"]}]}


# The paper's number (§5.2.2): "PS with RSS receives 3X more traffic than PS with ATP" (ATP
# "eliminates 2/3 of the traffic to the PS"). `holds` judges RSS / ATP within BAND of it either
# way (2.4x to 3.75x): a ratio far above 3x would be as much a miss as one below.
PAPER_RSS_OVER_ATP = 3.0
BAND = 1.25

VARIANTS = {
    "atp": "ATP two-level (sw0, sw1 level 1; sw2 aggregates w4, w5 and the sw0/sw1 partials)",
    "rss": "RSS: each rack aggregates its own workers, PS aggregates the 3 partials",
    "level1_only": "PS's ToR not programmable (sw0, sw1 aggregate; w4, w5 raw to PS)",
    "none": "no aggregation (reference)",
}


class AtpMultiRack(Seeded):
    name = "atp-multi-rack"
    figure = "§5.2.2, Fig. 9"
    claim = ("ATP §5.2.2 (Fig. 9): with workers w0-w5 in three racks (two per ToR, the PS under SW2), a "
             "rack-scale solution (RSS: aggregate per rack, then at the PS) makes the PS receive 3x more "
             "traffic than ATP, whose second level at SW2 merges w4, w5 and the SW0/SW1 partials.")
    simulates = "7 hosts in 3-4 racks"
    # The simulations' scenario seed: it draws loss, jitter and background peers (docs/config.md),
    # which these scenarios do not have, so seeds are expected to agree (the write-up says when
    # they do). Three: the project's least.
    seeds = (1, 2, 3)
    keys = ["variant"]  # a row's setup, to match rows across seeds

    def __init__(self, size: str = "4MiB", iterations: int = 3, variants=tuple(VARIANTS)):
        self.size, self.iterations, self.variants = size, iterations, list(variants)

    def setup(self) -> list:
        """The write-up's set-up table: (parameter, the paper (where), ours, why different)."""
        return [
            ("topology", "Fig. 9 (§5.2.2): w0-w1 under SW0, w2-w3 under SW1, w4-w5 and the PS under SW2; how the "
             "switches connect is only in the figure",
             "an `edges` topology: ToRs sw0, sw1, sw2 under one non-programmable core switch; `rss` moves the PS to a "
             "4th, non-programmable ToR sw3",
             "the core switch only carries traffic (it changes no byte count at the PS); RSS's \"the PS aggregates "
             "SW0-SW2's partials\" cannot be set on inalab's ATP switch, which always merges at the PS's ToR (see "
             "below)"),
            ("switches", "Tofino's software switch model, \"so we cannot measure real throughput\" (§5.1, §5.2.2)",
             "inalab's packet-level ATP switch", "the paper measures bytes only, and so do we"),
            ("links", "not in the paper for this emulation (the testbed's are 100 Gbps, §5.1)",
             "100 Gbps, 1 us each way (the defaults)", "the testbed's rate"),
            ("workers, PS", "6 workers w0-w5, 1 PS (§5.2.2)", "6 workers w0-w5, 1 PS", ""),
            ("workload", "not in the paper (it reports only the traffic ratio)",
             f"one ATP allreduce of {self.size} x {self.iterations} iterations",
             "the 4 MB tensor of the paper's aggregation microbenchmark (§5.1)"),
            ("packets", "306 B: 58 B header + 248 B values (§3.6)", "306 B (62 values of 4 B)", ""),
            ("aggregators", "not in the paper", "5 MB per programmable switch (`aggregator_memory` default), "
             "ATP's 512 slots per job (`ina.slots` default)", "enough for the job: no aggregator shortage by design"),
            ("window, CC", "AIMD from 200 packets (~60 KB), ECN-marked above \"some threshold\" (§3.7)",
             "AIMD from 60,000 B; ECN above 200 KB; 1 MiB drop-tail buffers (the defaults)",
             "the ECN threshold and buffers are not in the paper"),
            ("loss, timeouts", "no loss; timeout not given for this experiment",
             "no loss; ATP's 1 ms timeout (default)", ""),
            ("metric", "traffic the PS receives, ATP vs RSS (§5.2.2)", "the PS's `rx_bytes`, also in worker streams", ""),
            ("seeds", "not in the paper", f"{len(self.seeds)} ({', '.join(map(str, self.seeds))}); nothing here is drawn "
             "from the seed", "the project's least"),
        ]


    def _run(self, seed: int, progress) -> pd.DataFrame:
        from ..units import parse_size

        # One stream = one worker's gradient packets: ceil(size / 248 B) x 306 B per iteration.
        stream = math.ceil(parse_size(self.size) / 248) * 306 * self.iterations
        runs = [({"variant": v}, scenario(v, self.size, self.iterations, seed)) for v in self.variants]
        rows = [{"variant": r["variant"], "ps_rx_bytes": r["ps_rx_bytes"], "ps_rx_streams": r["ps_rx_bytes"] / stream,
                 **{k: v for k, v in r.items() if k not in ("variant", "ps_rx_bytes")}}
                for r in simulate_all("atp-fig9", runs, progress, measure).to_dict("records")]
        df = pd.DataFrame(rows)
        atp = df.set_index("variant").loc["atp", "ps_rx_bytes"] if "atp" in self.variants else float("nan")
        df["vs_atp"] = df["ps_rx_bytes"] / atp
        return df

    @property
    def tolerance(self) -> str:
        """What `holds` checks, with its thresholds (shown by the report and the JSON)."""
        return (f"every run finishes, and the PS's received traffic with rack-scale aggregation over ATP's (RSS / ATP) "
                f"within {BAND}x of the paper's {PAPER_RSS_OVER_ATP:g}x either way "
                f"([{PAPER_RSS_OVER_ATP / BAND:.2f}, {PAPER_RSS_OVER_ATP * BAND:.2f}])")

    def checks(self, rows: pd.DataFrame) -> dict:
        r = rows.set_index("variant")["vs_atp"]
        return {"finished": bool(rows.finished.all()),
                "rss_over_atp_band": band(float(r["rss"]), PAPER_RSS_OVER_ATP, BAND)}

    def holds(self, rows: pd.DataFrame) -> bool:
        return all(self.checks(rows).values())

    def headline(self, rows: pd.DataFrame) -> str:
        """The index's one line (inalab.reproduce.index)."""
        r = rows.set_index("variant")["vs_atp"]
        return (f"the PS receives {float(r['rss']):.2f}x more traffic with rack-scale aggregation than with ATP's two levels "
                f"(paper {PAPER_RSS_OVER_ATP:g}x)")

    def explain(self, rows: pd.DataFrame) -> str:
        t = rows.set_index("variant")
        desc = pd.DataFrame({"variant": list(VARIANTS), "meaning": list(VARIANTS.values())})
        checks = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in self.checks(rows).items())
        pair = t.loc[["atp", "rss"]]
        if (pair.queue_drops == 0).all() and (pair.collisions == 0).all():
            excess = ("Neither run dropped a packet or collided (`queue_drops`, `collisions`), so both counts are the "
                      "ideal ones and the ratio is exactly the paper's. Runs that drop (a slow-start overshoot where "
                      "two or three partials meet at one link at 2-3x its rate) or collide (a colliding packet goes "
                      "to the PS unaggregated) add resends and raw packets at the PS, relatively more for ATP, and "
                      "lower the ratio.")
        else:
            excess = (f"Both counts are above the ideal (1 and 3 streams): {int(pair.queue_drops.sum()):,} queue drops "
                      f"and {int(pair.collisions.sum()):,} collisions in the two runs. A colliding packet goes to the PS "
                      "unaggregated, and a drop costs resends: in `atp` the two level-1 partials meet at the "
                      "core->sw2 link at 2x its rate, in `rss` three partials meet at core->sw3 at 3x, so the windows "
                      "overshoot in slow start. The excess is relatively larger for ATP, which lowers the ratio below "
                      "3x. The paper's software-switch measurement has neither congestion nor (presumably) many "
                      "collisions.")
        return f"""# atp-multi-rack (ATP §5.2.2, Fig. 9)

{setup_table(self.setup())}

**Claim.** {self.claim}

**Command.** `inalab reproduce atp-multi-rack`. Scenario: an `edges` topology of three ToRs sw0, sw1,
sw2 (100 Gbps, 1 us links) under one non-programmable core switch; w0-w1 under sw0, w2-w3 under
sw1, w4-w5 and the PS under sw2 (the paper's text: "the PS is connected to switch SW2"; we assume
the ToRs meet at a core switch, which does not change the PS's traffic). One ATP job, allreduce
{self.size} x {self.iterations}, default congestion control. Metric: the PS's `rx_bytes`, also in units of one
worker's gradient stream (ceil({self.size} / 248 B) x 306 B per iteration).

{markdown_table(desc)}

How RSS is modelled: in the paper RSS aggregates w4-w5 at SW2 but does *not* merge the SW0/SW1
partials there. inalab's ATP switch at the PS's rack always does both (level 2), so that exact mix
is not configurable. `rss` reproduces RSS's traffic instead: w4-w5 keep their programmable ToR sw2
and the PS moves to its own non-programmable ToR sw3, so three rack partials reach the PS, as in
RSS. `level1_only` is the literal "PS's ToR not programmable" setting on the Fig. 9 topology: w4 and
w5 then reach the PS unaggregated (4 streams), an upper bound for RSS.

**Our result** (`holds` = {self.holds(rows)}; tolerance: {self.tolerance}; checks: {checks}):

{markdown_table(whole(rows))}

**Where and why they differ.**

* The shape holds: with ATP the PS receives about one stream ({t.loc['atp', 'ps_rx_streams']:.2f}), with RSS about three
  ({t.loc['rss', 'ps_rx_streams']:.2f}): RSS / ATP = {t.loc['rss', 'vs_atp']:.2f} (paper: 3x, i.e. 2/3 of the PS's traffic removed).
* {excess}
* Scaled down: {self.iterations} x {self.size} instead of a training run, {n_seeds(self.seeds)}; the paper only reports the ratio.
"""

    def plot(self, rows: pd.DataFrame, path: Path) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from ..plots import finish_figure

        fig, ax = plt.subplots(figsize=(7, 3.6))
        ax.bar(rows["variant"], rows["ps_rx_streams"], color=["C0", "C1", "C2", "C7"][: len(rows)])
        ax.axhline(1, ls=":", c="k", lw=0.8, label="ideal ATP: one aggregated stream")
        ax.axhline(3, ls="--", c="k", lw=0.8, label="paper: RSS = 3x ATP")
        ax.set_xlabel("variant (where the gradients are aggregated)")
        ax.set_ylabel("bytes into the PS (worker streams)")
        return finish_figure(fig, path, "ATP Fig. 9: traffic arriving at the PS with ATP's two-level aggregation vs "
                             "RSS and none", legend="right")


register(AtpMultiRack())
