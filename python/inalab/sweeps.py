"""Parameter sweeps (``inalab sweep FILE`` / ``inalab.sweep(spec)``): every combination of the
varied fields and seeds of a base scenario, simulated in parallel on a local process pool (or a
Ray cluster), written as one Parquet dataset with one row per job per point.

A sweep file::

    base = "ring-star-allreduce"          # a shipped scenario, a path, or an inline [base] table
    seeds = [1, 2, 3]                     # or a count: seeds = 3 is 1, 2, 3 (default: the base's seed)
    [vary]
    "topology.link_rate" = ["10Gbps", "100Gbps"]
    "jobs[0].allreduce" = ["1MiB", "4MiB"]
    "network.buffer_bytes" = { from = 100000, to = 400000, step = 100000 }   # inclusive range

Fields are dotted paths into the scenario (``jobs[0].ina.timeout``), set before it is checked,
so a bad value fails its point with the scenario's own error. Points are the cartesian product
of the varied values and the seeds, in file order; each has an id (a hash of its values), so a
rerun into the same ``out`` directory skips the points already done (``point-<id>.parquet``
with status "ok") and retries the failed ones. A failed point is a row with ``status`` "error"
and its ``error``; it does not stop the sweep.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import time
import tomllib
from pathlib import Path
from typing import Any, Callable, Optional, Union

import pandas as pd

from .config import ConfigError, read_source, shipped_scenarios

# Columns of a row besides the point and its parameters, with their Arrow types: every file of
# a dataset has the same schema, so pandas reads the directory as one table.
COLUMNS = {"status": "string", "error": "string", "wall_s": "float64", "job_id": "int64", "job_name": "string",
           "scheme": "string", "job_workers": "int64", "finished": "bool", "jct_s": "float64", "iterations": "int64",
           "mean_iteration_s": "float64", "bytes_per_iteration": "int64", "goodput_gbps": "float64",
           "comm_busy_s": "float64", "aggregation_gbps": "float64", "payload_checked": "int64", "payload_errors": "int64"}
JOB_FIELDS = ("id", "name", "scheme", "workers", "finished", "jct_s", "iterations", "mean_iteration_s",
              "bytes_per_iteration", "goodput_gbps", "comm_busy_s", "aggregation_gbps", "payload_checked", "payload_errors")
SWEEP_KEYS = ("base", "seeds", "vary")
_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def set_path(d: dict, path: str, value: Any) -> None:
    """Sets ``d[a][b][0][c] = value`` for ``path = "a.b[0].c"``, creating tables on the way."""
    steps = [int(i) if i else k for k, i in _STEP.findall(path)]
    if not steps:
        raise ConfigError(f"vary.{path}", "not a field path (write e.g. \"jobs[0].ina.timeout\")")
    cur: Any = d
    for here, nxt in zip(steps, steps[1:]):
        if isinstance(here, int):
            if not isinstance(cur, list) or here >= len(cur):
                raise ConfigError(f"vary.{path}", f"index [{here}] is not in the base scenario")
            cur = cur[here]
        else:
            cur = cur.setdefault(here, [] if isinstance(nxt, int) else {})
    last = steps[-1]
    if isinstance(last, int):
        if not isinstance(cur, list) or last >= len(cur):
            raise ConfigError(f"vary.{path}", f"index [{last}] is not in the base scenario")
    cur[last] = value


def _values(path: str, v: Any) -> list:
    if isinstance(v, list):
        if not v:
            raise ConfigError(f"vary.{path}", "an empty list of values")
        return v
    if isinstance(v, dict) and set(v) == {"from", "to", "step"}:
        lo, hi, step = v["from"], v["to"], v["step"]
        if not all(isinstance(x, (int, float)) for x in (lo, hi, step)) or step <= 0 or hi < lo:
            raise ConfigError(f"vary.{path}", "a range needs numbers with from <= to and step > 0")
        n = int(round((hi - lo) / step)) + 1
        return [lo + i * step for i in range(n)]
    raise ConfigError(f"vary.{path}", "give a list of values or a range { from = A, to = B, step = S }")


def points(spec: dict) -> list[dict]:
    """The sweep's points: ``{"id", "params", "scenario"}``, params holding the varied fields
    and ``seed``."""
    unknown = set(spec) - set(SWEEP_KEYS)
    if unknown:
        raise ConfigError(sorted(unknown)[0], f"unknown key; a sweep has {', '.join(SWEEP_KEYS)}")
    if "base" not in spec:
        raise ConfigError("base", "missing: the scenario to vary (a shipped name, a path or a table)")
    base = read_source(spec["base"], shipped_scenarios(), "shipped scenario")
    seeds = spec.get("seeds", [base.get("seed", 1)])
    if isinstance(seeds, int):
        if seeds < 1:
            raise ConfigError("seeds", f"a count must be at least 1, got {seeds}")
        seeds = list(range(1, seeds + 1))
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise ConfigError("seeds", "a list of non-negative integers, or a count")
    vary = spec.get("vary", {})
    if not isinstance(vary, dict):
        raise ConfigError("vary", "a table of field paths to lists or ranges of values")
    axes = [(path, _values(path, v)) for path, v in vary.items()] + [("seed", seeds)]
    out = []
    for combo in itertools.product(*(vals for _, vals in axes)):
        params = {path: val for (path, _), val in zip(axes, combo)}
        scenario = json.loads(json.dumps(base))
        for path, val in params.items():
            if path != "seed":
                set_path(scenario, path, val)
        scenario["seed"] = params["seed"]
        out.append({"id": point_id(params), "params": params, "scenario": scenario})
    return out


def point_id(params: dict) -> str:
    return hashlib.sha1(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:12]


def run_point(point: dict, measure: Optional[Callable] = None) -> list[dict]:
    """Simulates one point; its rows (one per job, or ``measure(result)``'s, or one error
    row). Never raises."""
    from . import simulate

    t0 = time.monotonic()
    head = {"point": point["id"], **point["params"]}
    try:
        r = simulate(point["scenario"])
        measured = measure(r) if measure is not None else None
    except Exception as e:  # a point's failure (its measure's too) is data, not the sweep's end
        return [{**head, "status": "error", "error": f"{type(e).__name__}: {e}", "wall_s": time.monotonic() - t0}]
    if measured is not None:
        return [{**head, "status": "ok", "error": None, "wall_s": r.raw["wall_s"], **m} for m in measured]
    rows = []
    for j in r.raw["jobs"]:
        rows.append({**head, "status": "ok", "error": None, "wall_s": r.raw["wall_s"],
                     **{f"job_{k}" if k in ("id", "name", "workers") else k: j.get(k) for k in JOB_FIELDS}})
    if not rows:  # a scenario of flows only: one row for the point
        rows.append({**head, "status": "ok", "error": None, "wall_s": r.raw["wall_s"]})
    return rows


def schema(pts: list[dict]):
    """The dataset's Arrow schema: the point id, each parameter (int64 or float64 where all its
    values are numbers, bool, else text), then :data:`COLUMNS`."""
    import pyarrow as pa

    def kind(values: list) -> str:
        if all(isinstance(v, bool) for v in values):
            return "bool"
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return "int64"
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return "float64"
        return "string"

    params = list(pts[0]["params"]) if pts else []
    # A parameter named like a column (e.g. "scheme") is that column.
    fields = [("point", "string")] + [(k, kind([p["params"][k] for p in pts])) for k in params]
    fields += [(c, t) for c, t in COLUMNS.items() if c not in params]
    return pa.schema([(name, pa.type_for_alias(t)) for name, t in fields])


def _write(out: Path, point: dict, rows: list[dict], sch) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if sch is None:  # a measure's own columns: their types as the rows give them
        tmp = out / f".point-{point['id']}.parquet.tmp"
        pq.write_table(pa.Table.from_pylist(rows), tmp)
        tmp.replace(out / f"point-{point['id']}.parquet")
        return
    cols = {}
    for f in sch:
        vals = [r.get(f.name) for r in rows]
        if pa.types.is_string(f.type):
            vals = [None if v is None else (v if isinstance(v, str) else json.dumps(v)) for v in vals]
        cols[f.name] = pa.array(vals, type=f.type)
    tmp = out / f".point-{point['id']}.parquet.tmp"
    pq.write_table(pa.table(cols, schema=sch), tmp)
    tmp.replace(out / f"point-{point['id']}.parquet")


def _done(out: Path, point: dict) -> bool:
    path = out / f"point-{point['id']}.parquet"
    if not path.exists():
        return False
    try:
        return bool((pd.read_parquet(path, columns=["status"]).status == "ok").all())
    except Exception:
        return False  # a damaged file: run the point again


def run_points(pts: list[dict], out: Union[str, Path], *, workers: Optional[int] = None, ray: Optional[str] = None,
               progress: Union[bool, Callable[[int, int], None]] = True, measure: Optional[Callable] = None) -> pd.DataFrame:
    """Runs ``pts`` (from :func:`points`, or any ``{"id", "params", "scenario"}``) into ``out``
    and returns the whole dataset. ``workers``: local processes (default: the machine's CPU
    count); ``ray``: run on Ray instead: "local" (a Ray instance started on this machine for
    the sweep), "auto" (the running cluster this machine belongs to) or a cluster address.
    ``measure``: a module-level function from a point's :class:`Result` to its rows (dicts of
    metrics), instead of one row per job (the reproductions use it for hosts' and switches'
    counters); the params, ``status`` and ``error`` are added to each."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sch = None if measure is not None else schema(pts)
    todo = [p for p in pts if not _done(out, p)]
    report = _progress(progress, len(pts), len(pts) - len(todo))
    try:
        write = lambda p, rows: _write(out, p, rows, sch)  # noqa: E731
        if ray is not None:
            _run_ray(todo, write, ray, report, measure)
        elif (workers or os.cpu_count() or 1) <= 1 or len(todo) <= 1:
            for p in todo:
                write(p, run_point(p, measure))
                report(1)
        else:
            _run_pool(todo, write, workers or os.cpu_count() or 1, report, measure)
    finally:
        report(None)
    return load(out, [p["id"] for p in pts])


def _run_pool(todo: list[dict], write, workers: int, report, measure) -> None:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # fork: the children start with inalab imported (spawn or a fork server re-import it, a
    # second per worker, a fifth of a 20-point sweep); they only simulate and return rows, so
    # the parent's threads (the progress bar's) are not a hazard.
    ctx = mp.get_context("fork")
    with ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=ctx) as pool:
        futures = {pool.submit(run_point, p, measure): p for p in todo}
        for f in as_completed(futures):
            write(futures[f], f.result())
            report(1)


def _run_ray(todo: list[dict], write, address: str, report, measure) -> None:
    try:
        import ray
    except ImportError:
        raise ConfigError("ray", "Ray is not installed (pip install 'inalab[ray]')") from None
    # "local": start a Ray instance on this machine for the sweep; "auto" or an address:
    # join a running cluster (the sweep's points then run on all its machines).
    started = not ray.is_initialized()
    if started:
        ray.init(address=None if address == "local" else address, log_to_driver=False)
    try:
        remote = ray.remote(run_point)
        pending = {remote.remote(p, measure): p for p in todo}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                write(pending.pop(ref), ray.get(ref))
                report(1)
    finally:
        if started:
            ray.shutdown()


def _progress(progress, total: int, already: int):
    """A callable taking the number of points just finished (``None``: the end)."""
    if callable(progress):
        state = {"done": already}

        def call(n):
            if n is not None:
                state["done"] += n
                progress(state["done"], total)
        return call
    if not progress:
        return lambda n: None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.console import Console

    bar = Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=False)
    bar.start()
    task = bar.add_task("points", total=total, completed=already)

    def call(n):
        if n is None:
            bar.stop()
        else:
            bar.update(task, advance=n)
    return call


def load(out: Union[str, Path], ids: Optional[list[str]] = None) -> pd.DataFrame:
    """The dataset in ``out`` (every point, or those of ``ids``) as one DataFrame."""
    out = Path(out)
    if ids is None:
        files = sorted(out.glob("point-*.parquet"))
    else:  # in the points' order
        files = [f for f in (out / f"point-{i}.parquet" for i in dict.fromkeys(ids)) if f.exists()]
    if not files:
        return pd.DataFrame()
    import pyarrow.parquet as pq
    import pyarrow as pa

    # A measure's columns may be null in some points (an error row): types are promoted.
    return pa.concat_tables([pq.read_table(f) for f in files], promote_options="default").to_pandas()


def read_sweep(source: Union[str, Path, dict]) -> dict:
    """A sweep spec from a dict or a TOML file."""
    if isinstance(source, dict):
        return source
    path = Path(source)
    try:
        return tomllib.loads(path.read_text())
    except OSError as e:
        raise ConfigError("sweep", f"cannot read {str(path)!r}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("sweep", f"{path}: {e}") from None


def sweep(spec: Union[str, Path, dict], out: Union[str, Path], *, workers: Optional[int] = None,
          ray: Optional[str] = None, progress: Union[bool, Callable[[int, int], None]] = True) -> pd.DataFrame:
    """Runs the sweep ``spec`` (a TOML path or dict, see the module docs) into the Parquet
    dataset ``out`` and returns it: one row per job per point, the varied fields and ``seed``
    as columns, ``status`` "ok" or "error"."""
    spec = read_sweep(spec)
    pts = points(spec)
    Path(out).mkdir(parents=True, exist_ok=True)
    # Underscore: Parquet readers skip it when they read the directory as a dataset.
    (Path(out) / "_sweep.json").write_text(json.dumps(spec, indent=1, default=str))
    return run_points(pts, out, workers=workers, ray=ray, progress=progress)


def plot(df: pd.DataFrame, x: str, y: str = "jct_s", hue: Optional[str] = None, path: Union[str, Path, None] = None,
         title: Optional[str] = None):
    """A line per ``hue`` value of the mean of ``y`` over seeds against ``x`` (min-max band);
    saved to ``path`` if given; returns the figure. Axis labels are the column names with the
    unit their suffix names (``jct_s`` -> "jct_s (s)"); ``title`` defaults to what is compared."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plots import line_style, unit_label, wrap_title

    ok = df[df.status == "ok"]
    fig, ax = plt.subplots(figsize=(6, 3.8), layout="constrained")
    groups = ok.groupby(hue) if hue else [(None, ok)]
    for i, (key, g) in enumerate(groups):
        stats = g.groupby(x)[y].agg(["mean", "min", "max"]).reset_index()
        style = line_style(i)
        ax.plot(stats[x], stats["mean"], label=None if key is None else f"{hue}={key}", **style)
        ax.fill_between(stats[x], stats["min"], stats["max"], alpha=0.2, color=style["color"])
    ax.set(xlabel=unit_label(x), ylabel=unit_label(y))
    if hue:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    seeds = ok["seed"].nunique() if "seed" in ok and hue != "seed" else 1
    fig.suptitle(wrap_title(title or f"{y} against {x}" + (f" for each {hue}" if hue else "")
                            + (f" (mean of {seeds} seeds, band min-max)" if seeds > 1 else ""), fig), fontsize=10)
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
