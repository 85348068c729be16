"""ATP Fig. 8 (shape): single-job training throughput of ATP, SwitchML, PS (N-to-1, N-to-N) and ring."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import Seeded, markdown_table, register, simulate_all

SCHEMES = ("atp", "switchml", "ring", "ps_sharded", "ps")
LABELS = {"atp": "ATP", "switchml": "SwitchML", "ring": "ring allreduce", "ps_sharded": "PS N-to-N",
          "ps": "PS N-to-1"}

# Tolerances of `holds` (the paper's shape, Fig. 8 and §5.2.1):
RING_TOL = 0.95      # ATP >= 0.95 x ring for every model ("comparable to, and in many cases outperforms")
PS_MARGIN = 1.0      # ATP >= PS N-to-N and >= PS N-to-1 for every model
SWITCHML_MARGIN = 1.0  # ATP >= SwitchML on the network-intensive model
# and ATP's gain over PS N-to-N is larger on the network-intensive model than on the compute-intensive one


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
    # they do). (1,): the committed write-up's.
    seeds = (1,)

    def __init__(self, models=("vgg16", "resnet50", "alexnet"), iterations: int = 2,
                 compute_scale: float = 0.7, workers: int = 8, schemes=SCHEMES,
                 network_intensive: str = "vgg16", compute_intensive: str = "resnet50",
                 extra_scales=(0.1,)):
        self.models, self.iterations, self.compute_scale = tuple(models), iterations, compute_scale
        self.workers, self.schemes = workers, tuple(schemes)
        self.network_intensive, self.compute_intensive = network_intensive, compute_intensive
        # sensitivity rows (not used by `holds`): the network-intensive model on faster GPUs
        self.extra_scales = tuple(extra_scales)

    def scenario(self, model: str, scheme: str, compute_scale=None, seed: int = 1) -> dict:
        nw = self.workers
        job = {"name": f"{model}-{scheme}", "scheme": scheme, "model": model,
               "compute_scale": compute_scale or self.compute_scale, "iterations": self.iterations,
               "workers": f"h0..h{nw - 1}"}
        if scheme in ("ps", "atp"):
            job["servers"] = [f"h{nw}"]
        return {"name": f"atp8-{model}-{scheme}", "seed": seed, "stop": "20s",
                "topology": {"kind": "star", "hosts": nw + 1},
                "jobs": [job], "metrics": {"bin": "10ms"}}


    def _run(self, seed: int, progress) -> pd.DataFrame:
        from ..models import get_model

        runs = [(model, self.compute_scale) for model in self.models]
        runs += [(self.network_intensive, cs) for cs in self.extra_scales if self.network_intensive in self.models]
        done = simulate_all("atp-8", [({"model": model, "compute_scale": cs, "scheme": scheme}, self.scenario(model, scheme, cs, seed))
                                      for model, cs in runs for scheme in self.schemes], progress)
        rows = []
        for _, j in done.iterrows():
            m = get_model(j.model)
            it_s = float(j.mean_iteration_s) if j.iterations else float("nan")
            rows.append({"model": j.model, "compute_scale": j.compute_scale, "scheme": j.scheme, "finished": bool(j.finished),
                         "compute_ms": 1e3 * m.iteration_compute_s * j.compute_scale,
                         "iteration_ms": 1e3 * it_s,
                         "img_per_s_per_worker": (m.batch_size or 1) / it_s,
                         "goodput_gbps": float(j.goodput_gbps)})
        df = pd.DataFrame(rows)
        key = [df.model, df.compute_scale]
        df["vs_best"] = df.img_per_s_per_worker / df.groupby(["model", "compute_scale"]).img_per_s_per_worker.transform("max")
        atp = df[df.scheme == "atp"].set_index(["model", "compute_scale"]).img_per_s_per_worker
        df["atp_speedup"] = [atp[(mo, cs)] / v for mo, cs, v in zip(*key, df.img_per_s_per_worker)]
        return df

    def _main(self, rows: pd.DataFrame) -> pd.DataFrame:
        return rows[rows.compute_scale == self.compute_scale]

    def _table(self, rows: pd.DataFrame) -> pd.DataFrame:
        return self._main(rows).pivot(index="model", columns="scheme", values="img_per_s_per_worker")

    @property
    def tolerance(self) -> str:
        """What `holds` checks, with its thresholds (shown by the report and the JSON)."""
        return (f"the main runs finish; ATP >= {RING_TOL}x ring and >= {PS_MARGIN}x both PS baselines for every model, "
                f">= {SWITCHML_MARGIN}x SwitchML on {self.network_intensive}, and ATP's gain over PS N-to-N larger "
                f"on {self.network_intensive} than on {self.compute_intensive}")

    def holds(self, rows: pd.DataFrame) -> bool:
        if not self._main(rows).finished.all():
            return False
        t = self._table(rows)
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

    def explain(self, rows: pd.DataFrame) -> str:
        fast = rows[rows.compute_scale != self.compute_scale]
        order = " > ".join(LABELS[k] for k in fast.groupby("scheme").img_per_s_per_worker.mean().sort_values(ascending=False).index) if len(fast) else "(not run)"
        t = self._table(rows)[[s for s in self.schemes]].reset_index()
        sp = self._main(rows).pivot(index="model", columns="scheme", values="atp_speedup")[[s for s in self.schemes]].reset_index()
        extra = rows[rows.compute_scale != self.compute_scale]
        ex = (extra.pivot(index=["model", "compute_scale"], columns="scheme", values="img_per_s_per_worker")
              [[s for s in self.schemes]].reset_index() if len(extra) else None)
        ex_md = ("Sensitivity (not used by `holds`): the network-intensive model with faster compute "
                 "(images/s per worker):\n\n" + markdown_table(ex)) if ex is not None else ""
        show = rows[["model", "compute_scale", "scheme", "finished", "compute_ms", "iteration_ms",
                     "img_per_s_per_worker", "goodput_gbps"]]
        return f"""# {self.name} (ATP Fig. 8, shape)

**Claim.** {self.claim}

**Command.** `ulimit -s unlimited; inalab reproduce {self.name}` (the VGG16 `ps_sharded` run overflows
the default 8 MiB main-thread stack inside the simulator and segfaults; see the report).

**Setup (scaled down).** One job of {self.workers} workers on one 100 Gbps star switch (one rack, so
SwitchML's single-ToR requirement holds); ATP's and PS N-to-1's server is a 9th host; PS N-to-N
(BytePS-like) co-locates one server with each worker. Models: {', '.join(self.models)} (catalog
profiles; ResNet50 = compute-intensive, VGG16 = network-intensive, AlexNet = most network-intensive),
{self.iterations} iterations each (not epochs: each VGG16 ATP iteration is ~2 x 10^7 packets); throughput =
batch / mean iteration time, images/s per worker. Compute times are the catalog's P100 profile x
`compute_scale = {self.compute_scale}` (the paper's RTX 2080 Ti has ~13.4 vs the P100's ~9.3 FP32 TFLOPS).
Paper's BytePS+RDMA/TCP, Horovod+RDMA/TCP map to our transport-agnostic `ps`/`ps_sharded`/`ring`
(one reliable transport with AIMD, no RDMA/TCP distinction).

**Our result** (images/s per worker; `holds` = {self.holds(rows)}; tolerances: ATP >= {RING_TOL} x ring for every
model, ATP >= PS N-to-N and N-to-1 for every model, ATP >= SwitchML on {self.network_intensive}, and ATP's
gain over PS N-to-N larger on {self.network_intensive} than on {self.compute_intensive}):

{markdown_table(t)}

ATP's speedup over each scheme:

{markdown_table(sp)}

{ex_md}

All runs:

{markdown_table(show)}

**Where and why we differ.**

* Compute dominates (the one mechanism): at compute x {self.compute_scale} every fast scheme hides
  its communication behind the backward pass, so they tie and `holds` fails on "ATP's gain larger on
  {self.network_intensive}".
* Detail: with the catalog's compute times the communication of a 100 Gbps in-rack job is
  a fraction of an iteration, and it overlaps with the backward pass, so differences between the
  fast schemes are small; the paper's speedups over TCP baselines (up to 8.7x) come from host
  networking costs (TCP stacks, PS CPUs saturating at ~60 Gbps) that inalab does not model.
* inalab's PS has no CPU/memory-bandwidth limit, so PS N-to-1 is limited only by its 100 Gbps link
  (8-to-1 incast) and PS N-to-N by the co-located servers' links.
* SwitchML uses 180 B packets (128 B of values) vs ATP's 306 B (248 B), so its line-rate goodput is
  71 % vs 81 %; it has no PS, so it never falls back.
* With faster compute (sensitivity table) communication is exposed; there the order is
  {order}, the paper's order of ATP, ring and the PS baselines (this is the measured ablation: the
  paper's shape appears once compute no longer hides communication).
* Only {self.iterations} iterations: the first iteration includes a full forward pass with no overlap,
  which is the same for every scheme.
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
