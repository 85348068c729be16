"""Reproductions of papers' claims: ``inalab reproduce NAME [--json]``.

``REPRODUCTIONS`` maps a name to an object with ``name``, ``claim`` (the paper's statement),
``run(progress) -> rows DataFrame``, ``holds(rows) -> bool`` (does our result show the paper's
shape) and ``explain(rows) -> markdown`` (claim, our table, where and why they differ).
:func:`reproduce` runs one, writes ``docs/reproductions/NAME.md`` and a PNG, and returns a
summary. Results are computed, never hard-coded.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Protocol

import pandas as pd

from ..errors import ConfigError

Progress = Callable[[str], None]

DOCS_DIR = Path(__file__).resolve().parents[3] / "docs" / "reproductions"


class Reproduction(Protocol):
    name: str
    claim: str

    def run(self, progress: Progress) -> pd.DataFrame: ...

    def holds(self, rows: pd.DataFrame) -> bool: ...

    def explain(self, rows: pd.DataFrame) -> str: ...

    def plot(self, rows: pd.DataFrame, path: Path) -> Path: ...


REPRODUCTIONS: dict[str, Reproduction] = {}


def register(rep: Reproduction) -> Reproduction:
    REPRODUCTIONS[rep.name] = rep
    return rep


def get(name: str) -> Reproduction:
    if name not in REPRODUCTIONS:
        raise ConfigError("name", f"unknown reproduction {name!r}; allowed values: {', '.join(REPRODUCTIONS)}")
    return REPRODUCTIONS[name]


def reproduce(name: str, progress: Optional[Progress] = None, out: Optional[Path] = None,
              docs: Optional[Path] = None) -> dict:
    """Runs reproduction ``name``; writes OUT/NAME.png and DOCS/NAME.md; returns the summary."""
    rep = get(name)
    rows = rep.run(progress or (lambda _msg: None))
    holds = bool(rep.holds(rows))
    out = Path("out") if out is None else out
    out.mkdir(parents=True, exist_ok=True)
    png = rep.plot(rows, out / f"{name}.png")
    docs = DOCS_DIR if docs is None else docs
    docs.mkdir(parents=True, exist_ok=True)
    md = docs / f"{name}.md"
    md.write_text(rep.explain(rows).rstrip() + "\n")
    return {"name": name, "claim": rep.claim, "rows": rows, "holds": holds, "png": str(png), "markdown": str(md)}


def simulate_all(label: str, runs: list[tuple[dict, dict]], progress: Progress, measure=None) -> pd.DataFrame:
    """Simulates every ``(params, scenario)`` of a reproduction as one sweep, in parallel on
    this machine's cores (``inalab.sweeps.run_points``): one row per point and job (or per
    ``measure(result)`` row, ``measure`` a module-level function), ``params`` as columns.
    Raises if a run failed: a reproduction needs all of them."""
    import tempfile

    from ..sweeps import point_id, run_points

    pts = [{"id": point_id(params), "params": params, "scenario": scenario} for params, scenario in runs]
    with tempfile.TemporaryDirectory(prefix=f"{label}-") as out:
        done = run_points(pts, out, measure=measure, progress=lambda n, total: progress(f"{label}: {n}/{total} runs"))
    failed = done[done.status != "ok"]
    if len(failed):
        raise RuntimeError(f"{label}: {len(failed)} of {len(pts)} runs failed; the first: {failed.error.iloc[0]}")
    return done.drop(columns=["point", "status", "error", "wall_s"])


def subplots(*args, **kwargs):
    """``matplotlib.pyplot.subplots`` on the file-only Agg backend (a reproduction never opens a window)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save_figure(fig, path: Path) -> Path:
    """Lays the figure out, writes it to ``path`` (PNG, 120 dpi) and frees it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def markdown_table(rows: pd.DataFrame, floatfmt: str = "{:.3g}") -> str:
    cols = list(rows.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for _, r in rows.iterrows():
        cells = [floatfmt.format(v) if isinstance(v, float) else str(v) for v in r]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


from . import atp_congestion, atp_dynamic_static, atp_hash_vs_linear, atp_loss, atp_multi_rack, atp_single_job, dsa_jct, dsa_policy_ablation, canary, grid_large_scale, grid_motivating, grid_packet, rina_incremental, rina_packet  # noqa: E402,F401  (registers them)
