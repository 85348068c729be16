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

Seeds. A reproduction's ``seeds`` is its documented default (a tuple; most are ``(1,)``, what
its committed results ran), and ``run`` runs every one of ``self.seeds``: the simulations'
scenario ``seed``, or R-GRIA's rounding seed for the flow-level GRID ones. :func:`run_one` runs
a copy with the caller's ``seeds`` (``inalab reproduce NAME --seeds 11,12,13``). With several
seeds the rows carry a ``seed`` column and ``holds``, ``checks``, ``explain`` and ``plot`` get
:func:`mean_over_seeds` of them (the rows of one setup matched across seeds by ``keys``, where a
reproduction names them, else by the columns every seed has equal). ``seed_use`` says what the
seed draws, for the write-up's **Seeds.** paragraph (:func:`seeds_paragraph`, added to every
write-up). A reproduction in which nothing is drawn from a seed has ``seeds = None`` and says
why in ``no_seeds``; it refuses seeds. ``simulates`` is its scale (the hosts simulated, or "LP
only"), for ``inalab reproduce --list``.
"""
from __future__ import annotations

import copy
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Protocol

import pandas as pd

from ..errors import ConfigError
from ..results import MISSING, is_missing

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
    simulates: str  # its scale: "9-host star", "1024-host fat tree", "LP only (...)"
    seeds: Optional[tuple]  # the default seeds; None: nothing is drawn from a seed (``no_seeds`` says why)

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
    rows: pd.DataFrame  # every run's rows (with several seeds, a `seed` column)
    writeup: str  # the markdown write-up (`explain`)
    seconds: float  # wall time of the run
    files: dict = field(default_factory=dict)  # what was written: md, png, csv, json (and docs)
    seeds: Optional[tuple] = None  # the seeds run (None: the reproduction takes none)
    seeds_default: bool = True  # whether they are its default seeds (not the caller's)
    means: Optional[pd.DataFrame] = None  # with several seeds: the mean over them, what `holds` judged

    @property
    def judged(self) -> pd.DataFrame:
        """The rows `holds` judged: the mean over the seeds, or the rows themselves with one."""
        return self.rows if self.means is None else self.means

    def to_dict(self) -> dict:
        """JSON-ready: the rows as records (numbers as JSON numbers, a missing one null), their
        column order; with several seeds ``means``, the mean over them (what ``holds`` judged)."""
        return {"name": self.name, "paper": self.paper, "figure": self.figure, "claim": self.claim,
                "tolerance": self.tolerance, "holds": self.holds, "checks": self.checks,
                "seeds": None if self.seeds is None else list(self.seeds), "seeds_default": self.seeds_default,
                "columns": [str(c) for c in self.rows.columns],
                "rows": json.loads(self.rows.to_json(orient="records")),
                "means": None if self.means is None else json.loads(self.means.to_json(orient="records")),
                "writeup": self.writeup, "seconds": round(self.seconds, 3),
                "files": {k: str(v) for k, v in self.files.items()}}


def paper_of(rep: Reproduction) -> str:
    return getattr(rep, "paper", None) or PAPERS.get(rep.name.split("-")[0], rep.name.split("-")[0])


# ------------------------------------------------------------------------------------------ seeds

SEEDS_FORM = "a comma-separated list of distinct non-negative integers, e.g. 11,12,13"


def default_seeds(rep: Reproduction) -> Optional[tuple]:
    """A reproduction's default seeds (None: it takes none)."""
    seeds = getattr(rep, "seeds", None)
    return None if seeds is None else tuple(seeds)


def takes_seeds(rep: Reproduction) -> bool:
    return default_seeds(rep) is not None


def parse_seeds(text: str, option: str = "--seeds") -> tuple:
    """``"11,12,13"`` -> ``(11, 12, 13)``; anything else is refused naming ``option``."""
    parts = [p.strip() for p in str(text).split(",")]
    if not all(re.fullmatch(r"\d+", p) for p in parts):
        raise ConfigError(option, f"{SEEDS_FORM}; got {text!r}")
    return check_seeds(tuple(int(p) for p in parts), option)


def check_seeds(seeds, option: str = "seeds") -> tuple:
    """``seeds`` as a tuple of distinct non-negative ints, or a :class:`ConfigError` naming ``option``."""
    seeds = tuple(seeds) if isinstance(seeds, (list, tuple, range)) else None
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        raise ConfigError(option, f"{SEEDS_FORM}; got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(option, f"{SEEDS_FORM}: each seed once; got {', '.join(map(str, seeds))}")
    return seeds


def seeds_for(rep: Reproduction, seeds=None, option: str = "seeds") -> Optional[tuple]:
    """The seeds ``rep`` runs: ``seeds`` checked, or its default when None. A reproduction that
    takes no seed refuses any, naming ``option`` and why."""
    if seeds is None:
        return default_seeds(rep)
    seeds = check_seeds(seeds, option)
    if not takes_seeds(rep):
        raise ConfigError(option, f"{rep.name} takes no seed: {getattr(rep, 'no_seeds', 'nothing in it is drawn at random')}")
    return seeds


def per_seed(seeds, run: Callable[[int], pd.DataFrame], progress: Optional[Progress] = None) -> pd.DataFrame:
    """``run(seed)`` for each seed; with one seed its rows as they are, with several their
    concatenation with a ``seed`` column first (``progress``, if given, is told which seed)."""
    seeds = tuple(seeds)
    if len(seeds) == 1:
        return run(seeds[0])
    frames = []
    for seed in seeds:
        if progress is not None:
            progress(f"seed {seed} ({len(frames) + 1} of {len(seeds)})")
        df = run(seed).copy()
        df.insert(0, "seed", seed)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


class Seeded:
    """A reproduction that runs one seed at a time (``_run(seed, progress)``): ``run`` runs
    every one of ``self.seeds`` (:func:`per_seed`)."""

    def run(self, progress: Progress) -> pd.DataFrame:
        return per_seed(self.seeds, lambda seed: self._run(seed, progress), progress)


def _same(a, b) -> bool:
    try:
        if pd.isna(a) and pd.isna(b):
            return True
    except (TypeError, ValueError):  # a list or an array: compare as it is
        pass
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def _hashable(col: pd.Series) -> bool:
    try:
        for v in col:
            hash(v)
        return True
    except TypeError:
        return False


def _inferred_keys(rows: pd.DataFrame, cols: list[str]) -> list[str]:
    """The columns that name a row: those every seed has equal row by row (the same setups in
    the same order), else the text and flag columns."""
    groups = [g.reset_index(drop=True) for _, g in rows.groupby("seed", sort=False)]
    usable = [c for c in cols if _hashable(rows[c])]
    if len({len(g) for g in groups}) == 1:
        first = groups[0]
        return [c for c in usable if all(_same(a, b) for g in groups[1:] for a, b in zip(first[c], g[c]))]
    return [c for c in usable if not pd.api.types.is_numeric_dtype(rows[c]) or pd.api.types.is_bool_dtype(rows[c])]


def mean_over_seeds(rows: pd.DataFrame, keys=None) -> pd.DataFrame:
    """Rows of several seeds as one row per setup (``keys``, the columns naming one; default:
    those every seed has equal, row by row): numbers averaged over the seeds (missing in any
    seed: missing), a flag true only if it is in every seed, a text that differs joined with
    " / ", anything else (a series) the first seed's. One seed's rows (or rows without a
    ``seed`` column) come back as they are."""
    if "seed" not in rows.columns or rows["seed"].nunique() <= 1:
        return rows
    cols = [c for c in rows.columns if c != "seed"]
    keys = [k for k in keys if k in cols] if keys is not None else _inferred_keys(rows, cols)
    if not keys:
        raise ValueError("mean over seeds: no column names a setup (give the reproduction `keys`)")

    def combine(col: pd.Series):
        vals = list(col)
        if pd.api.types.is_bool_dtype(col) or all(isinstance(v, bool) for v in vals):
            return bool(all(vals))
        if pd.api.types.is_numeric_dtype(col):
            return float(col.mean(skipna=False))
        if all(_same(vals[0], v) for v in vals[1:]):
            return vals[0]
        if all(isinstance(v, str) for v in vals):
            return " / ".join(dict.fromkeys(vals))
        return vals[0]

    out = []
    for _, g in rows.groupby(keys, sort=False, dropna=False):
        out.append({c: (g[c].iloc[0] if c in keys else combine(g[c])) for c in cols})
    means = pd.DataFrame(out, columns=cols)
    for c in keys:  # the keys keep their types (a groupby's NaN-free ints stay ints)
        try:
            means[c] = means[c].astype(rows[c].dtype)
        except (TypeError, ValueError):
            pass
    return means


def _seed_list(seeds) -> str:
    return ", ".join(map(str, seeds))


def n_seeds(seeds) -> str:
    """"one seed" or "3 seeds (their mean)", for a write-up's text."""
    return "one seed" if len(seeds) == 1 else f"{len(seeds)} seeds (their mean)"


def seeds_paragraph(rep: Reproduction, seeds: Optional[tuple], defaults: Optional[tuple], rows: pd.DataFrame,
                    means: Optional[pd.DataFrame]) -> str:
    """The write-up's **Seeds.** paragraph: which seeds ran, whether they are the default
    (``defaults``) or the user's, and what the tables show."""
    if seeds is None:
        return f"**Seeds.** None: {getattr(rep, 'no_seeds', 'nothing in this reproduction is drawn at random')}."
    word = "seed" if len(seeds) == 1 else "seeds"
    use = getattr(rep, "seed_use", "the simulations' scenario `seed`")
    if seeds == defaults:
        text = (f"**Seeds.** {word.capitalize()} {_seed_list(seeds)}, the default ({use}); `inalab reproduce {rep.name} "
                f"--seeds 11,12,13` runs others.")
    else:
        text = (f"**Seeds.** {word.capitalize()} {_seed_list(seeds)}, the user's (`--seeds {','.join(map(str, seeds))}`; "
                f"{use}); the default is {_seed_list(defaults or ())}.")
    if means is not None:
        text += (f" The tables are the mean over the {len(seeds)} seeds (numbers averaged, a flag true only if true "
                 f"for every seed); `{rep.name}.csv` has each seed's rows.")
        metrics = [c for c in means.columns if c in rows.columns]
        per = [g.drop(columns="seed").reset_index(drop=True) for _, g in rows.groupby("seed", sort=False)]
        if len({len(g) for g in per}) == 1 and all(_same(a, b) for g in per[1:] for c in metrics
                                                     for a, b in zip(per[0][c], g[c])):
            text += " Every seed gave the same rows: nothing these runs measure depends on the seed."
    return text


def with_seeds_paragraph(writeup: str, paragraph: str) -> str:
    """The write-up with ``paragraph`` after its **Command.** paragraph (else after the
    **Claim.** one, else after the title)."""
    lines = writeup.rstrip("\n").split("\n")
    at = None
    for lead in ("**Command.**", "**Claim.**"):
        start = next((i for i, line in enumerate(lines) if line.startswith(lead)), None)
        if start is not None:
            at = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
            break
    if at is None:
        at = 1 if lines and lines[0].startswith("#") else 0
    before = [""] if at and lines[at - 1].strip() else []
    after = [] if at < len(lines) and not lines[at].strip() else [""]
    return "\n".join(lines[:at] + before + [paragraph] + after + lines[at:]).rstrip("\n") + "\n"


def run_one(name: str, progress: Optional[Progress] = None, seeds=None) -> Outcome:
    """Runs reproduction ``name`` on ``seeds`` (default: its own, :func:`default_seeds`) and
    judges it; writes nothing. With several seeds ``holds``, ``checks`` and the write-up are of
    the mean over them (:func:`mean_over_seeds`). A reproduction that takes no seed refuses
    ``seeds`` (:class:`ConfigError`)."""
    rep = get(name)
    chosen, defaults = seeds_for(rep, seeds), default_seeds(rep)
    if chosen is not None and chosen != defaults:
        rep = copy.copy(rep)
        rep.seeds = chosen
    t0 = time.monotonic()
    rows = rep.run(progress or (lambda _msg: None))
    seconds = time.monotonic() - t0
    means = None
    if chosen is not None and len(chosen) > 1 and "seed" in rows.columns:
        means = mean_over_seeds(rows, getattr(rep, "keys", None))
    judged = rows if means is None else means
    checks = {str(k): bool(v) for k, v in rep.checks(judged).items()} if callable(getattr(rep, "checks", None)) else None
    paragraph = seeds_paragraph(rep, chosen, defaults, rows, means)
    if callable(getattr(rep, "headline", None)):
        # The index's line for it (inalab.reproduce.index), from the same rows as the write-up.
        from .index import HEADLINE

        paragraph += f"\n\n{HEADLINE} {rep.headline(judged)}"
    writeup = with_seeds_paragraph(rep.explain(judged), paragraph)
    if means is not None and callable(getattr(rep, "seed_range", None)):
        # The spread the mean hides: every seed's rows, per setup.
        writeup = writeup.rstrip("\n") + f"\n\n**Range over the seeds** ({rep.range_metric}):\n\n{rep.seed_range(rows)}\n"
    return Outcome(name=name, paper=paper_of(rep), figure=getattr(rep, "figure", ""), claim=rep.claim,
                   tolerance=getattr(rep, "tolerance", ""), holds=bool(rep.holds(judged)), checks=checks, rows=rows,
                   writeup=writeup, seconds=seconds, seeds=chosen, seeds_default=chosen == defaults, means=means)


def write_outcome(outcome: Outcome, out: Path) -> dict:
    """Writes OUT/NAME.md (the write-up), .png (the figure), .csv (the rows) and .json
    (:meth:`Outcome.to_dict`); returns their paths, also kept in ``outcome.files``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    name = outcome.name
    files = {"md": out / f"{name}.md", "png": out / f"{name}.png", "csv": out / f"{name}.csv",
             "json": out / f"{name}.json"}
    files["md"].write_text(outcome.writeup)
    rep = get(name)
    # A reproduction whose plot averages the seeds itself gets every seed's rows, to draw their range.
    plotted = outcome.rows if getattr(rep, "plots_every_seed", False) else outcome.judged
    files["png"] = Path(rep.plot(plotted, files["png"]))
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
    from .index import regenerate

    regenerate(docs)  # the index and the README's count, from the write-ups
    return path


def source_docs_dir() -> Path:
    """The committed write-ups' folder (DOCS_DIR), if this package runs from a source checkout."""
    if not (DOCS_DIR.is_dir() and (DOCS_DIR / "README.md").is_file()):
        raise ConfigError("--update-docs", f"not running from a source checkout: there is no {DOCS_DIR} with the "
                          "committed write-ups (README.md) next to the package; run from the repository (pip install -e "
                          "or maturin develop), or copy OUT/NAME.md by hand")
    return DOCS_DIR


def reproduce(name: str, progress: Optional[Progress] = None, out: Optional[Path] = None,
              docs: Optional[Path] = None, seeds=None) -> dict:
    """Runs reproduction ``name`` (on ``seeds``, default its own); writes OUT/NAME.md, .png,
    .csv and .json (OUT default ``out``), and DOCS/NAME.md only if ``docs`` is given (the
    committed write-ups are :func:`source_docs_dir`); returns the summary."""
    outcome = run_one(name, progress, seeds)
    write_outcome(outcome, Path("out") if out is None else Path(out))
    if docs is not None:
        update_docs(outcome, docs)
    f = outcome.files
    return {"name": name, "paper": outcome.paper, "figure": outcome.figure, "claim": outcome.claim,
            "tolerance": outcome.tolerance, "rows": outcome.rows, "holds": outcome.holds, "checks": outcome.checks,
            "seconds": outcome.seconds, "seeds": outcome.seeds, "png": str(f["png"]), "markdown": str(f["md"]), "csv": str(f["csv"]),
            "json": str(f["json"]), "docs": str(f["docs"]) if "docs" in f else None}


def _runs_shape(params) -> str:
    """" (24 points x 5 seeds)" for runs whose params carry several seeds, else ""."""
    params = list(params)
    seeds = {p.get("seed") for p in params}
    if len(seeds) < 2 or None in seeds:
        return ""
    points = len({tuple(sorted((k, str(v)) for k, v in p.items() if k != "seed")) for p in params})
    return f" ({points} points x {len(seeds)} seeds)"


def simulate_all(label: str, runs: list[tuple[dict, dict]], progress: Progress, measure=None) -> pd.DataFrame:
    """Simulates every ``(params, scenario)`` of a reproduction as one sweep, in parallel on
    this machine's cores (``inalab.sweeps.run_points``): one row per point and job (or per
    ``measure(result)`` row, ``measure`` a module-level function), ``params`` as columns.
    Raises if a run did not complete (a job failed or did not finish by its ``stop``, or the
    run raised): a reproduction needs all of them, and an unfinished job has no JCT to judge."""
    import tempfile

    from ..sweeps import point_id, run_points

    pts = [{"id": point_id(params), "params": params, "scenario": scenario} for params, scenario in runs]
    shape = _runs_shape(params for params, _ in runs)
    with tempfile.TemporaryDirectory(prefix=f"{label}-") as out:
        done = run_points(pts, out, measure=measure, progress=lambda n, total: progress(f"{label}: {n}/{total} runs{shape}"))
    failed = done[done.status != "ok"].drop_duplicates("point")
    if len(failed):
        first = failed.iloc[0]
        raise RuntimeError(f"{label}: {len(failed)} of {len(pts)} runs did not complete ({', '.join(sorted(set(failed.status)))}); "
                           f"the first, {first.status}: {first.error}")
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


def setup_table(rows) -> str:
    """A write-up's opening table (#37): one row per parameter, (name, the paper's value and
    where it says so, ours, why ours differs; "" when it does not)."""
    lines = ["| parameter | the paper (where) | ours | why different |", "| --- | --- | --- | --- |"]
    lines += [f"| {name} | {paper} | {ours} | {why or '-'} |" for name, paper, ours, why in rows]
    return "\n".join(lines)


def band(value: float, paper: float, factor: float) -> bool:
    """Two-sided: ``value`` within ``factor`` of the paper's either way (a ratio far above the
    paper's is as much a miss as one below)."""
    return bool(paper / factor <= value <= paper * factor)


def whole(rows: pd.DataFrame) -> pd.DataFrame:
    """For display: a column of counts averaged over seeds back to whole numbers, where every
    value is one (the mean of equal counts)."""
    out = rows.copy()
    for c in out.columns:
        if pd.api.types.is_float_dtype(out[c]) and out[c].notna().all() and (out[c] % 1 == 0).all():
            out[c] = out[c].astype(int)
    return out


def markdown_table(rows: pd.DataFrame, floatfmt: str = "{:.3g}") -> str:
    """A markdown table; a missing value is "-" (never "nan" or "None")."""
    cols = [str(c) for c in rows.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for _, r in rows.iterrows():
        cells = [MISSING if is_missing(v) else floatfmt.format(v) if isinstance(v, float) else str(v) for v in r]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


from . import atp_congestion, atp_dynamic_static, atp_hash_vs_linear, atp_loss, atp_multi_rack, atp_single_job, dsa_jct, dsa_policy_ablation, canary, grid_large_scale, grid_motivating, grid_packet, rina_incremental, rina_packet  # noqa: E402,F401  (registers them)
