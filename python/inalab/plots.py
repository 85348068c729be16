"""Figures drawn only from a Result's DataFrames (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

from .results import Result  # noqa: E402

BUSIEST_LINKS = 4


def demo_figure(result: Result, path: str | Path) -> Path:
    """Three panels: JCT and mean iteration time per job, iteration times, busiest links over time."""
    fig, (ax_jct, ax_iter, ax_util) = plt.subplots(1, 3, figsize=(16, 4.5))
    plot_jct(result, ax_jct)
    plot_iterations(result, ax_iter)
    plot_link_utilization(result, ax_util)
    fig.suptitle(f"{result.raw.get('scenario', '')}: simulated {result.raw.get('sim_time_s', 0):.4g} s")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _label(jobs, job_id) -> str:
    row = jobs[jobs["id"] == job_id]
    return f"{row['name'].iloc[0]} ({row['scheme'].iloc[0]})" if not row.empty else f"job {job_id}"


def plot_jct(result: Result, ax) -> None:
    jobs = result.jobs
    ax.set_title("Job completion time")
    if jobs.empty:
        ax.text(0.5, 0.5, "no jobs", ha="center", transform=ax.transAxes)
        return
    x = range(len(jobs))
    ax.bar([i - 0.2 for i in x], jobs["jct_s"] * 1e3, width=0.4, label="JCT")
    ax.bar([i + 0.2 for i in x], jobs["mean_iteration_s"] * 1e3, width=0.4, label="mean iteration")
    # Job names can be long: rotate them so neighbours do not overlap.
    ax.set_xticks(list(x), [_label(jobs, j) for j in jobs["id"]], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("ms")
    ax.legend()


def plot_iterations(result: Result, ax) -> None:
    it, jobs = result.iterations, result.jobs
    ax.set_title("Iteration time")
    if it.empty:
        ax.text(0.5, 0.5, "no iterations", ha="center", transform=ax.transAxes)
        return
    for job_id, rows in it.groupby("job"):
        ax.plot(rows["iteration"], rows["duration_s"] * 1e3, marker="o", label=_label(jobs, job_id))
    ax.set_xlabel("iteration")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("ms")
    ax.legend()


def plot_link_utilization(result: Result, ax, top: int = BUSIEST_LINKS) -> None:
    ts, links = result.timeseries, result.links
    ax.set_title(f"Utilization of the {top} busiest link directions")
    if ts.empty or links.empty:
        ax.text(0.5, 0.5, "no time series", ha="center", transform=ax.transAxes)
        return
    busiest = links.nlargest(top, "tx_bytes")
    names = [f"{s}->{d}" for s, d in zip(busiest["src"], busiest["dst"])]
    util = ts[ts["metric"] == "link_utilization"]
    # The series is sparse (idle bins are absent): put every link on the full grid of bins, idle = 0.
    times = np.sort(util["t_s"].unique())
    width = np.diff(times).min() if len(times) > 1 else 1.0
    grid = np.arange(0, round(times.max() / width) + 1) * width if len(times) else times
    table = util[util["entity"].isin(names)].pivot_table(index="t_s", columns="entity", values="value", aggfunc="max")
    table = table.reindex(grid, method="nearest", tolerance=width / 2).fillna(0.0)
    for name in names:
        if name in table:
            ax.step(table.index * 1e3, table[name], where="post", label=name, linewidth=1)
    ax.set_xlabel("simulated time (ms)")
    ax.set_ylabel("utilization per bin")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize="small")
