"""Figures drawn only from a Result's DataFrames (matplotlib, Agg backend: no display needed),
and the helpers every figure of the package uses so that it says what it compares: a title,
axis labels with units, and legends that hide no data (outside the axes, styles that keep
coinciding lines visible)."""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Iterable, Optional

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

from .results import Result  # noqa: E402

BUSIEST_LINKS = 4

# Line styles for series that may coincide: hollow markers of different shapes and different
# dashes, so that a line drawn over another one leaves it visible.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
DASHES = ("-", "--", "-.", ":")


def line_style(i: int) -> dict:
    """Keyword arguments for ``ax.plot`` of the ``i``-th series: color, marker and dashes that
    differ from the other series', hollow markers (a marker under another one stays visible)."""
    return {"color": f"C{i % 10}", "marker": MARKERS[i % len(MARKERS)], "linestyle": DASHES[(i // 2) % len(DASHES)],
            "markerfacecolor": "none", "markersize": 7, "linewidth": 1.5}


def styles(labels: Iterable) -> dict:
    """``label -> line_style(i)``, one style per distinct label in order: the same series keeps
    its look in every panel of a figure."""
    return {label: line_style(i) for i, label in enumerate(dict.fromkeys(labels))}


def wrap_title(title: str, fig) -> str:
    """``title`` broken into lines that fit the figure's width."""
    width = max(30, int(fig.get_figwidth() * 9.5))
    return "\n".join(textwrap.wrap(title, width=width)) if len(title) > width else title


def legend_columns(fig, labels: list[str], most: int = 4) -> int:
    """How many columns a legend of ``labels`` below ``fig`` can have and still fit its width
    (about 0.065 in per character at the small font, plus the handle)."""
    width = fig.get_figwidth()
    longest = max((len(label) for label in labels), default=1)
    for ncol in range(min(most, len(labels)), 1, -1):
        if ncol * (longest * 0.065 + 0.6) <= width:
            return ncol
    return 1


def figure_legend(fig, where: str = "right", title: Optional[str] = None, ncol: Optional[int] = None) -> None:
    """Gathers the legend entries of every axes of ``fig`` (one per label) into one legend
    outside the axes, on the right or below, and removes the axes' own legends: it cannot hide
    data. Switches the figure to the constrained layout, which makes room for it."""
    handles, labels = [], []
    for ax in fig.axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label and not label.startswith("_") and label not in labels:
                handles.append(h)
                labels.append(label)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    fig.set_layout_engine("constrained")
    if not labels:
        return
    if where == "below":
        fig.legend(handles, labels, loc="outside lower center", ncol=ncol or legend_columns(fig, labels),
                   fontsize="small", title=title, title_fontsize="small")
    else:
        # Beside the top-right axes (a figure legend on the right would share the suptitle's row).
        top = max(fig.axes, key=lambda ax: (round(ax.get_position().y1, 2), ax.get_position().x1))
        top.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, ncol=ncol or 1,
                   fontsize="small", title=title, title_fontsize="small")


def finish_figure(fig, path, title: str, legend: Optional[str] = "right", legend_title: Optional[str] = None,
                  dpi: int = 120) -> Path:
    """Titles ``fig`` (``title``: the paper's figure or what is compared), puts its legend
    outside the axes (``legend``: "right", "below", or None to keep the axes' own legends,
    placed by the caller outside the data), writes it to ``path`` and frees it."""
    if legend is not None:
        figure_legend(fig, legend, legend_title)
    else:
        fig.set_layout_engine("constrained")
    fig.suptitle(wrap_title(title, fig))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- the demo figure


def demo_figure(result: Result, path: str | Path, title: Optional[str] = None) -> Path:
    """Three panels: each job's completion time, its iteration times, and the busiest links'
    utilization over time. ``title`` says what is compared (default: the jobs' schemes)."""
    fig, (ax_jct, ax_iter, ax_util) = plt.subplots(1, 3, figsize=(16, 5), layout="constrained")
    colors = job_colors(result)
    plot_jct(result, ax_jct, colors)
    plot_iterations(result, ax_iter, colors)
    plot_link_utilization(result, ax_util)
    jobs = result.jobs
    if title is None:
        schemes = ", ".join(dict.fromkeys(jobs["scheme"])) if not jobs.empty else "no jobs"
        title = f"{result.raw.get('scenario', '')}: {len(jobs)} jobs compared ({schemes})"
    sim = f"simulated {result.raw.get('sim_time_s', 0):.4g} s"
    # Jobs: one legend for the first two panels, below them; links: beside the third panel.
    handles, labels = ax_iter.get_legend_handles_labels()
    if labels:
        ax_iter.get_legend().remove()
        fig.legend(handles, labels, loc="outside lower center", ncol=legend_columns(fig, labels), fontsize="small",
                   title="job (scheme)", title_fontsize="small")
    fig.suptitle(wrap_title(f"{title}; {sim}", fig))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _label(jobs, job_id) -> str:
    row = jobs[jobs["id"] == job_id]
    return f"{row['name'].iloc[0]} ({row['scheme'].iloc[0]})" if not row.empty else f"job {job_id}"


def job_colors(result: Result) -> dict:
    """job id -> color, the same in every panel."""
    jobs = result.jobs
    return {} if jobs.empty else {j: f"C{i % 10}" for i, j in enumerate(jobs["id"])}


def plot_jct(result: Result, ax, colors: Optional[dict] = None) -> None:
    jobs = result.jobs
    ax.set_title("Job completion time")
    if jobs.empty:
        ax.text(0.5, 0.5, "no jobs", ha="center", transform=ax.transAxes)
        return
    colors = colors or job_colors(result)
    x = range(len(jobs))
    ax.bar(list(x), jobs["jct_s"] * 1e3, width=0.6, color=[colors[j] for j in jobs["id"]])
    # Job names can be long: rotate them so neighbours do not overlap.
    ax.set_xticks(list(x), [_label(jobs, j) for j in jobs["id"]], rotation=20, ha="right", fontsize=8)
    ax.set_xlabel("job (scheme)")
    ax.set_ylabel("JCT (ms)")


def plot_iterations(result: Result, ax, colors: Optional[dict] = None) -> None:
    it, jobs = result.iterations, result.jobs
    ax.set_title("Time of each iteration")
    if it.empty:
        ax.text(0.5, 0.5, "no iterations", ha="center", transform=ax.transAxes)
        return
    colors = colors or job_colors(result)
    for i, (job_id, rows) in enumerate(it.groupby("job")):
        style = line_style(i) | {"color": colors.get(job_id, f"C{i % 10}")}
        ax.plot(rows["iteration"], rows["duration_s"] * 1e3, label=_label(jobs, job_id), **style)
    ax.set_xlabel("iteration")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("iteration time (ms)")
    ax.set_ylim(bottom=0)
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
    for i, name in enumerate(names):
        if name in table:
            # Links of one job often carry the same bytes at the same times: a wider line under a
            # narrower, differently dashed one keeps both visible.
            ax.step(table.index * 1e3, table[name], where="post", label=name, color=f"C{i % 10}",
                    linestyle=DASHES[i % len(DASHES)], linewidth=max(0.7, 1.6 - 0.3 * i))
    ax.set_title(f"Utilization of the {top} busiest link directions, per {width * 1e3:.3g} ms bin")
    ax.set_xlabel("simulated time (ms)")
    ax.set_ylabel(f"utilization (share of each {width * 1e3:.3g} ms bin spent sending)")
    ax.set_ylim(0, 1.05)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", title="link (by bytes sent)",
              title_fontsize="small")


# Column-name suffixes and the units they stand for (the simulator's result columns).
UNITS = {"_s": "s", "_ms": "ms", "_us": "us", "_ps": "ps", "_gbps": "Gbps", "_bps": "bit/s", "_bytes": "bytes",
         "_pct": "%"}


def unit_label(column: str) -> str:
    """An axis label for a result column: its name and the unit its suffix names (``jct_s`` ->
    "jct_s (s)"), or the name alone."""
    for suffix, unit in UNITS.items():
        if column.endswith(suffix):
            return f"{column} ({unit})"
    return column
