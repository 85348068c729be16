"""ATP Fig. 8 (shape): single-job training throughput of ATP, SwitchML, PS (N-to-1, N-to-N) and ring."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import Seeded, band, markdown_table, register, setup_table, simulate_all

SCHEMES = ("atp", "switchml", "ring", "ps_sharded", "ps")
LABELS = {"atp": "ATP", "switchml": "SwitchML", "ring": "ring allreduce", "ps_sharded": "PS N-to-N",
          "ps": "PS N-to-1"}

# Tolerances of `holds` (the paper's shape, Fig. 8 and §5.2.1):
RING_TOL = 0.95      # ATP >= 0.95 x ring for every model ("comparable to, and in many cases outperforms")
PS_MARGIN = 1.0      # ATP >= PS N-to-N and >= PS N-to-1 for every model
SWITCHML_MARGIN = 1.0  # ATP >= SwitchML on the network-intensive model
# and ATP's gain over PS N-to-N is larger on the network-intensive model than on the compute-intensive one
# The paper's largest speedups of ATP (§5.2.1), judged within BAND either way on the largest over
# the models: 1.5x over BytePS N-to-N RDMA (our PS N-to-N), 1.24x over Horovod RDMA (our ring),
# 1.5x over SwitchML. (Its TCP baselines' 2.5-8.7x measure TCP stacks, which inalab has not.)
PAPER_SPEEDUP = {"ps_sharded": 1.5, "ring": 1.24, "switchml": 1.5}
BAND = 1.25

# The testbed's hosts (issue #37 item 1). ATP §D.1: with every offload on, "throughput is
# bottlenecked by the memory copy at the PS and workers", and its PS "saturates at 60Gbps"
# (§5.5) while it receives and sends back the same stream (§D.1's microbenchmark: the PS copies
# each received packet into the send region and returns it). One CPU that copies both
# directions at 60 Gbps each copies 120 Gbps in all; the paper gives no per-packet cost once
# TSO and multi-queue are on (D.1's 6x gain removed it), so per_packet is 0. Workers too
# (they send a gradient and receive a parameter per fragment, as the PS).
HOST_COSTS = [{"hosts": "all", "copy_rate": "120Gbps"}]

SETUP = [
    ("hosts", "9 machines, 8 with one RTX 2080 Ti, on one 32 x 100 Gbps Tofino (§5.1)", "a 9-host star at 100 Gbps", ""),
    ("workers", "8 (§5.1: \"8 workers unless specified\")", "8", ""),
    ("models", "AlexNet, VGG11/16/19, ResNet50/101/152 on ImageNet (§5.1, Fig. 8)", "alexnet, vgg16, resnet50 (the catalog's profiles)",
     "VGG16 and ResNet50 are the paper's representatives (§5.1); AlexNet the most network-bound"),
    ("compute", "RTX 2080 Ti (§5.1)", "the catalog's P100 times x 0.7", "2080 Ti ~13.4 vs P100 ~9.3 FP32 TFLOPS"),
    ("host costs", "PS saturates at 60 Gbps (§5.5); memory copies at PS and workers bound throughput (§D.1)",
     "every host copies 120 Gbps in all (60 Gbps each way), 0 per packet (`network.host_costs`)", "derived from §D.1 (the module's `HOST_COSTS`)"),
    ("packets", "ATP 306 B; SwitchML smaller (§5.2.1)", "ATP 306 B (62 values), SwitchML 180 B (32)", ""),
    ("baselines", "BytePS N-to-N / N-to-1 over RDMA and TCP, Horovod ring over RDMA and TCP, SwitchML (§5.1)",
     "`ps_sharded`, `ps`, `ring` over one reliable transport with AIMD; `switchml`", "no TCP or RDMA stacks: the RDMA variants are the comparable ones"),
    ("length", "training throughput, images/s per worker (§5.1); run length not in the paper", "2 iterations per run", "an iteration of VGG16 is 2 x 10^7 packets"),
    ("seeds", "not in the paper", "3 (1, 2, 3); nothing here is drawn from the seed", "the project's least"),
]


class AtpSingleJob(Seeded):
    name = "atp-single-job"
    figure = "Fig. 8"
    claim = ("ATP Fig. 8: for a single 8-worker job ATP gives the best training throughput: comparable "
             "to or better than ring all-reduce, better than BytePS PS baselines (N-to-N and N-to-1) "
             "and better than SwitchML (whose packets are smaller); gains are larger for "
             "network-intensive models (VGG) than for compute-intensive ones (ResNet).")
    simulates = "9-host star"
    # The simulations' scenario seed: it draws loss, jitter and background peers (docs/config.md),
    # which these scenarios do not have, so seeds are expected to agree (the write-up says when
    # they do). Three: the project's least.
    seeds = (1, 2, 3)

    def __init__(self, models=("vgg16", "resnet50", "alexnet"), iterations: int = 2,
                 compute_scale: float = 0.7, workers: int = 8, schemes=SCHEMES,
                 network_intensive: str = "vgg16", compute_intensive: str = "resnet50",
                 extra_scales=(0.1,), host_costs=HOST_COSTS):
        self.models, self.iterations, self.compute_scale = tuple(models), iterations, compute_scale
        self.workers, self.schemes = workers, tuple(schemes)
        self.network_intensive, self.compute_intensive = network_intensive, compute_intensive
        # sensitivity rows (not used by `holds`): the network-intensive model on faster GPUs
        self.extra_scales = tuple(extra_scales)
        # the testbed's host costs (None: free hosts, the ablation row)
        self.host_costs = host_costs

    def scenario(self, model: str, scheme: str, compute_scale=None, seed: int = 1, host_costs="default") -> dict:
        nw = self.workers
        job = {"name": f"{model}-{scheme}", "scheme": scheme, "model": model,
               "compute_scale": compute_scale or self.compute_scale, "iterations": self.iterations,
               "workers": f"h0..h{nw - 1}"}
        if scheme in ("ps", "atp"):
            job["servers"] = [f"h{nw}"]
        costs = self.host_costs if host_costs == "default" else host_costs
        return {"name": f"atp8-{model}-{scheme}", "seed": seed, "stop": "20s",
                "topology": {"kind": "star", "hosts": nw + 1},
                "network": {"host_costs": costs or []},
                "jobs": [job], "metrics": {"bin": "10ms"}}


    def _run(self, seed: int, progress) -> pd.DataFrame:
        from ..models import get_model

        costed = bool(self.host_costs)
        runs = [(model, self.compute_scale, costed) for model in self.models]
        runs += [(self.network_intensive, cs, costed) for cs in self.extra_scales if self.network_intensive in self.models]
        if costed and self.network_intensive in self.models:
            # Ablation: the network-intensive model on free hosts (inalab before #37).
            runs.append((self.network_intensive, self.compute_scale, False))
        done = simulate_all("atp-8", [({"model": model, "compute_scale": cs, "host_costs": c, "scheme": scheme},
                                       self.scenario(model, scheme, cs, seed, host_costs="default" if c else None))
                                      for model, cs, c in runs for scheme in self.schemes], progress)
        rows = []
        for _, j in done.iterrows():
            m = get_model(j.model)
            it_s = float(j.mean_iteration_s) if j.iterations else float("nan")
            rows.append({"model": j.model, "compute_scale": j.compute_scale, "host_costs": bool(j.host_costs), "scheme": j.scheme,
                         "finished": bool(j.finished),
                         "compute_ms": 1e3 * m.iteration_compute_s * j.compute_scale,
                         "iteration_ms": 1e3 * it_s,
                         "img_per_s_per_worker": (m.batch_size or 1) / it_s,
                         "goodput_gbps": float(j.goodput_gbps)})
        df = pd.DataFrame(rows)
        key = [df.model, df.compute_scale, df.host_costs]
        df["vs_best"] = df.img_per_s_per_worker / df.groupby(["model", "compute_scale", "host_costs"]).img_per_s_per_worker.transform("max")
        atp = df[df.scheme == "atp"].set_index(["model", "compute_scale", "host_costs"]).img_per_s_per_worker
        df["atp_speedup"] = [atp[k] / v for k, v in zip(zip(*key), df.img_per_s_per_worker)]
        return df

    def _main(self, rows: pd.DataFrame) -> pd.DataFrame:
        return rows[(rows.compute_scale == self.compute_scale) & (rows.host_costs == bool(self.host_costs))]

    def _others(self, rows: pd.DataFrame) -> pd.DataFrame:
        return rows.drop(self._main(rows).index)

    def _table(self, rows: pd.DataFrame) -> pd.DataFrame:
        return self._main(rows).pivot(index="model", columns="scheme", values="img_per_s_per_worker")

    @property
    def tolerance(self) -> str:
        """What `holds` checks, with its thresholds (shown by the report and the JSON)."""
        bands = ", ".join(f"{LABELS[k]} {v}" for k, v in PAPER_SPEEDUP.items() if k in self.schemes)
        return (f"the main runs finish; ATP >= {RING_TOL}x ring and >= {PS_MARGIN}x both PS baselines for every model, "
                f">= {SWITCHML_MARGIN}x SwitchML on {self.network_intensive}, ATP's gain over PS N-to-N larger "
                f"on {self.network_intensive} than on {self.compute_intensive}, and ATP's largest speedup over each "
                f"within {BAND}x of the paper's either way ({bands})")

    def _order_holds(self, t: pd.DataFrame) -> bool:
        ok = True
        if "ring" in t:
            ok &= bool((t.atp >= RING_TOL * t.ring).all())
        for ps in ("ps_sharded", "ps"):
            if ps in t:
                ok &= bool((t.atp >= PS_MARGIN * t[ps]).all())
        ni, ci = self.network_intensive, self.compute_intensive
        if "switchml" in t and ni in t.index:
            ok &= bool(t.loc[ni, "atp"] >= SWITCHML_MARGIN * t.loc[ni, "switchml"])
        if "ps_sharded" in t and ni in t.index and ci in t.index:
            gain = t.atp / t.ps_sharded
            ok &= bool(gain[ni] > gain[ci])
        return bool(ok)

    def _largest(self, t: pd.DataFrame) -> dict:
        """ATP's largest speedup over each baseline the paper quantifies, over the models."""
        return {k: float((t.atp / t[k]).max()) for k in PAPER_SPEEDUP if k in t}

    def _bands_hold(self, t: pd.DataFrame) -> bool:
        return all(band(v, PAPER_SPEEDUP[k], BAND) for k, v in self._largest(t).items())

    def holds(self, rows: pd.DataFrame) -> bool:
        if not self._main(rows).finished.all():
            return False
        t = self._table(rows)
        return self._order_holds(t) and self._bands_hold(t)

    def headline(self, rows: pd.DataFrame) -> str:
        """The index's one line (inalab.reproduce.index)."""
        t = self._table(rows)
        largest = ", ".join(f"{LABELS[k]} {v:.2f}x ({PAPER_SPEEDUP[k]})" for k, v in self._largest(t).items())
        return (f"with the testbed's copy rate, ATP's largest speedups (paper's): {largest}; "
                f"the paper's order {'holds' if self._order_holds(t) else 'does not hold'}")

    def explain(self, rows: pd.DataFrame) -> str:
        t = self._table(rows)
        tab = t[[s for s in self.schemes]].reset_index()
        sp = self._main(rows).pivot(index="model", columns="scheme", values="atp_speedup")[[s for s in self.schemes]].reset_index()
        other = self._others(rows)
        ex = (other.pivot(index=["model", "compute_scale", "host_costs"], columns="scheme", values="img_per_s_per_worker")
              [[s for s in self.schemes]].reset_index() if len(other) else None)
        ex_md = ("Sensitivity and ablation (not used by `holds`; images/s per worker): the network-intensive "
                 "model with faster compute, and on free hosts:\n\n" + markdown_table(ex)) if ex is not None else ""
        show = rows[["model", "compute_scale", "host_costs", "scheme", "finished", "compute_ms", "iteration_ms",
                     "img_per_s_per_worker", "goodput_gbps"]]
        largest = self._largest(t)
        largest_text = ", ".join(f"{LABELS[k]} {v:.2f}x (paper {PAPER_SPEEDUP[k]}x)" for k, v in largest.items())
        ni = self.network_intensive
        free = rows[(rows.model == ni) & (rows.compute_scale == self.compute_scale) & (~rows.host_costs)]
        costed = rows[(rows.model == ni) & (rows.compute_scale == self.compute_scale) & (rows.host_costs)]
        cost_text = ""
        if len(free) and len(costed):
            f, c = (x.set_index("scheme").img_per_s_per_worker for x in (free, costed))
            cost_text = ("* Host costs, measured on " + ni + ": " + "; ".join(
                f"{LABELS[k]} {f[k]:.1f} -> {c[k]:.1f} images/s" for k in self.schemes if k in f and k in c)
                + " (free hosts -> the testbed's copy rate). A PS that receives every worker's gradients "
                "copies 8x a worker's bytes, so the copy rate costs the PS baselines most.")
        return f"""# {self.name} (ATP Fig. 8, shape)

{setup_table(SETUP)}

**Claim.** {self.claim}

**Command.** `ulimit -s unlimited; inalab reproduce {self.name}` (the VGG16 `ps_sharded` run overflows
the default 8 MiB main-thread stack inside the simulator and segfaults; see the report).

**Setup.** One job of {self.workers} workers on one 100 Gbps star switch (one rack, so
SwitchML's single-ToR requirement holds); ATP's and PS N-to-1's server is a 9th host; PS N-to-N
(BytePS-like) co-locates one server with each worker. Throughput = batch / mean iteration time,
images/s per worker. Host costs: `network.host_costs = {self.host_costs}` (derived in the table above).

**Our result** (images/s per worker; `holds` = {self.holds(rows)}; tolerance: {self.tolerance}):

{markdown_table(tab)}

ATP's speedup over each scheme:

{markdown_table(sp)}

ATP's largest speedups: {largest_text or "-"}; the order holds: {self._order_holds(t)}; the bands hold: {self._bands_hold(t)}.

{ex_md}

All runs:

{markdown_table(show)}

**Where and why we differ.**

{cost_text}
* Compute hides communication: at compute x {self.compute_scale} the fast schemes overlap most of their
  communication with the backward pass, so they are close, and the largest speedups above are small
  where the paper's are 1.24-1.5x; the sensitivity row with faster compute shows the gaps once
  communication is exposed.
* The paper's largest gains (2.5-8.7x) are over TCP baselines; inalab has one transport, so only
  the RDMA variants are compared.
* SwitchML uses 180 B packets (128 B of values) vs ATP's 306 B (248 B), so at line rate its goodput
  is 71 % vs 81 %, and with a copy rate per byte the same share of its time goes to headers.
* Only {self.iterations} iterations: the first includes a full forward pass with no overlap, the same
  for every scheme.
"""

    def plot(self, rows: pd.DataFrame, path: Path) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        t = self._main(rows).pivot(index="model", columns="scheme", values="vs_best")
        from ..plots import finish_figure

        fig, ax = plt.subplots(figsize=(7.5, 3.6))
        n = len(self.schemes)
        w = 0.8 / n
        for i, s in enumerate(self.schemes):
            ax.bar([k + (i - (n - 1) / 2) * w for k in range(len(t))], t[s], w, label=LABELS[s])
        ax.set_xticks(list(range(len(t))), list(t.index))
        ax.set_xlabel("model")
        ax.set_ylabel("training throughput / best scheme's")
        return finish_figure(fig, path, f"ATP Fig. 8: one training job of {self.workers} workers, ATP vs SwitchML, ring "
                             f"allreduce and parameter servers (compute x {self.compute_scale})", legend="right",
                             legend_title="scheme")


register(AtpSingleJob())
