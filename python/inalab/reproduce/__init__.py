"""Reproductions of papers' claims: ``inalab reproduce NAME [--json]``.

``REPRODUCTIONS`` maps a name to an object with ``name``, ``figure`` (which of the paper's
figures or sections), ``claim`` (the paper's statement), ``tolerance`` (what ``holds`` checks,
with its thresholds), ``run(progress) -> rows DataFrame``, ``holds(rows) -> bool`` (does our
result show the paper's shape), optionally ``checks(rows) -> {name: bool}`` (the named parts of
``holds``), ``explain(rows) -> markdown`` (claim, our table, where and why they differ) and
``plot(rows, path)``. :func:`run_one` runs one into an :class:`Outcome` (the result as data);
:func:`reproduce` also writes OUT/NAME.md, .png, .csv and .json, and the committed
``docs/reproductions/NAME.md`` only when asked (``docs``). Results are computed, never
hard-coded. ``inalab reproduce all --report DIR`` (:mod:`.report`) runs them all into one page.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Protocol

import pandas as pd

from ..errors import ConfigError

Progress = Callable[[str], None]

# The committed write-ups: the repository's docs/reproductions/ when this package runs from a
# source checkout (python/inalab/reproduce/ -> parents[3] is the checkout). In an installed
# wheel parents[3] is lib/python3.X, which has none: `inalab reproduce --update-docs` refuses.
DOCS_DIR = Path(__file__).resolve().parents[3] / "docs" / "reproductions"
# The paper of a reproduction, from its name's first word.
PAPERS = {"atp": "ATP", "dsa": "DSA", "canary": "Canary", "grid": "GRID", "rina": "Rina"}


class Reproduction(Protocol):
    name: str
    figure: str
    claim: str
    tolerance: str

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


@dataclass
class Outcome:
    """One reproduction's result as data (OUT/NAME.json, ``--json``, the report)."""

    name: str
    paper: str
    figure: str
    claim: str
    tolerance: str
    holds: bool
    checks: Optional[dict]  # the named parts of `holds` (None: the reproduction names none)
    rows: pd.DataFrame
    writeup: str  # the markdown write-up (`explain`)
    seconds: float  # wall time of the run
    files: dict = field(default_factory=dict)  # what was written: md, png, csv, json (and docs)

    def to_dict(self) -> dict:
        """JSON-ready: the rows as records (numbers as JSON numbers), their column order."""
        return {"name": self.name, "paper": self.paper, "figure": self.figure, "claim": self.claim,
                "tolerance": self.tolerance, "holds": self.holds, "checks": self.checks,
                "columns": [str(c) for c in self.rows.columns],
                "rows": json.loads(self.rows.to_json(orient="records")), "writeup": self.writeup,
                "seconds": round(self.seconds, 3), "files": {k: str(v) for k, v in self.files.items()}}


def paper_of(rep: Reproduction) -> str:
    return getattr(rep, "paper", None) or PAPERS.get(rep.name.split("-")[0], rep.name.split("-")[0])


def run_one(name: str, progress: Optional[Progress] = None) -> Outcome:
    """Runs reproduction ``name`` and judges it; writes nothing."""
    rep = get(name)
    t0 = time.monotonic()
    rows = rep.run(progress or (lambda _msg: None))
    seconds = time.monotonic() - t0
    checks = {str(k): bool(v) for k, v in rep.checks(rows).items()} if callable(getattr(rep, "checks", None)) else None
    return Outcome(name=name, paper=paper_of(rep), figure=getattr(rep, "figure", ""), claim=rep.claim,
                   tolerance=getattr(rep, "tolerance", ""), holds=bool(rep.holds(rows)), checks=checks, rows=rows,
                   writeup=rep.explain(rows).rstrip() + "\n", seconds=seconds)


def write_outcome(outcome: Outcome, out: Path) -> dict:
    """Writes OUT/NAME.md (the write-up), .png (the figure), .csv (the rows) and .json
    (:meth:`Outcome.to_dict`); returns their paths, also kept in ``outcome.files``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    name = outcome.name
    files = {"md": out / f"{name}.md", "png": out / f"{name}.png", "csv": out / f"{name}.csv",
             "json": out / f"{name}.json"}
    files["md"].write_text(outcome.writeup)
    files["png"] = Path(get(name).plot(outcome.rows, files["png"]))
    outcome.rows.to_csv(files["csv"], index=False)
    outcome.files.update(files)
    files["json"].write_text(json.dumps(outcome.to_dict(), indent=1) + "\n")
    return files


# A committed write-up may end with notes written by hand (what a run taught, earlier runs):
# everything from this line on is carried over when --update-docs regenerates the file.
HAND_WRITTEN = "<!-- written by hand from here on: inalab reproduce --update-docs keeps it -->"


def update_docs(outcome: Outcome, docs: Path) -> Path:
    """Writes DOCS/NAME.md: the new write-up, then the old file's part from :data:`HAND_WRITTEN`
    on (if it has one); records it in ``outcome.files["docs"]``."""
    docs = Path(docs)
    docs.mkdir(parents=True, exist_ok=True)
    path = docs / f"{outcome.name}.md"
    old = path.read_text() if path.exists() else ""
    kept = old[old.index(HAND_WRITTEN):] if HAND_WRITTEN in old else ""
    path.write_text(outcome.writeup + ("\n" + kept if kept else ""))
    outcome.files["docs"] = path
    return path


def source_docs_dir() -> Path:
    """The committed write-ups' folder (DOCS_DIR), if this package runs from a source checkout."""
    if not (DOCS_DIR.is_dir() and (DOCS_DIR / "README.md").is_file()):
        raise ConfigError("--update-docs", f"not running from a source checkout: there is no {DOCS_DIR} with the "
                          "committed write-ups (README.md) next to the package; run from the repository (pip install -e "
                          "or maturin develop), or copy OUT/NAME.md by hand")
    return DOCS_DIR


def reproduce(name: str, progress: Optional[Progress] = None, out: Optional[Path] = None,
              docs: Optional[Path] = None) -> dict:
    """Runs reproduction ``name``; writes OUT/NAME.md, .png, .csv and .json (OUT default
    ``out``), and DOCS/NAME.md only if ``docs`` is given (the committed write-ups are
    :func:`source_docs_dir`); returns the summary."""
    outcome = run_one(name, progress)
    write_outcome(outcome, Path("out") if out is None else Path(out))
    if docs is not None:
        update_docs(outcome, docs)
    f = outcome.files
    return {"name": name, "paper": outcome.paper, "figure": outcome.figure, "claim": outcome.claim,
            "tolerance": outcome.tolerance, "rows": outcome.rows, "holds": outcome.holds, "checks": outcome.checks,
            "seconds": outcome.seconds, "png": str(f["png"]), "markdown": str(f["md"]), "csv": str(f["csv"]),
            "json": str(f["json"]), "docs": str(f["docs"]) if "docs" in f else None}


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
