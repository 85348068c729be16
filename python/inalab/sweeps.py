"""Parameter sweeps (``inalab sweep FILE`` / ``inalab.sweep(spec)``): every combination of the
varied fields and seeds of a base scenario, simulated in parallel on a local process pool (or a
Ray cluster), written as one Parquet dataset with one row per job per point.

A sweep file::

    base = "ring-star-allreduce"          # a shipped scenario, a path, or an inline [base] table
    seeds = [1, 2, 3]                     # or a count: seeds = 3 is 1, 2, 3 (default: the base's seed)
    [vary]                                # each field an axis of the product
    "topology.link_rate" = ["10Gbps", "100Gbps"]
    "network.buffer" = ["100KB", "200KB", "400KB"]
    "jobs[0].iterations" = { from = 1, to = 4, step = 1 }   # an inclusive numeric range
    [zip]                                 # fields that vary together: one axis ([[zip]]: several)
    "topology.hosts" = [4, 8, 16]
    "jobs[0].workers" = [4, 8, 16]

Fields are dotted paths into the scenario (``jobs[0].ina.timeout``). Points are the cartesian
product of the axes and the seeds, in file order; each has an id (a hash of its values). Every
point's scenario is checked and resolved before the first runs: a field the scenario does not
have, or a value it refuses, refuses the whole sweep naming the field and the point.

A point's ``status`` is its run's outcome: "ok" (every job finished, every flow ended),
"failed" (a job failed), "unfinished" (a job or flow had not ended at the stop time) or
"error" (the run or its measure raised); ``error`` says why for all but "ok". A point that is
not ok does not stop the sweep; :func:`sweep` and ``inalab sweep`` report them (the command
exits 3). A rerun into the same ``out`` skips the points whose file says "ok" and runs the
others again; an ``out`` holding points this sweep cannot reuse (another sweep's, or run on a
scenario that has changed since) is refused (``overwrite`` deletes them).
Ctrl-C stops the sweep at once, killing its worker processes; the points done stay on disk.
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
           "scheme": "string", "kind": "string", "job_workers": "int64", "job_status": "string", "job_reason": "string",
           "finished": "bool", "jct_s": "float64", "iterations": "int64", "iterations_planned": "int64",
           "mean_iteration_s": "float64", "bytes_per_iteration": "int64", "goodput_gbps": "float64", "busbw_gbps": "float64",
           "comm_busy_s": "float64", "aggregation_gbps": "float64", "payload_checked": "int64", "payload_errors": "int64"}
# A job's result fields in a row; those named like the point's own columns get a "job_" prefix.
JOB_FIELDS = ("id", "name", "scheme", "kind", "workers", "status", "reason", "finished", "jct_s", "iterations",
              "iterations_planned", "mean_iteration_s", "bytes_per_iteration", "goodput_gbps", "busbw_gbps", "comm_busy_s",
              "aggregation_gbps", "payload_checked", "payload_errors")
PREFIXED = ("id", "name", "workers", "status", "reason")
SWEEP_KEYS = ("base", "seeds", "vary", "zip")
# A point's status from its run's outcome (the other outcomes keep their word).
STATUS = {"completed": "ok"}

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


def _values(path: str, v: Any, where: str = "vary") -> list:
    if isinstance(v, list):
        if not v:
            raise ConfigError(f"{where}.{path}", "an empty list of values")
        return v
    if isinstance(v, dict) and set(v) == {"from", "to", "step"}:
        lo, hi, step = v["from"], v["to"], v["step"]
        if not all(isinstance(x, (int, float)) for x in (lo, hi, step)) or step <= 0 or hi < lo:
            raise ConfigError(f"{where}.{path}", "a range needs numbers with from <= to and step > 0")
        n = int(round((hi - lo) / step)) + 1
        return [lo + i * step for i in range(n)]
    raise ConfigError(f"{where}.{path}", "give a list of values or a range { from = A, to = B, step = S }")


def _zip_groups(spec: dict) -> list[dict]:
    """The sweep's ``zip`` groups: one table, or an array of them (``[[zip]]``)."""
    z = spec.get("zip", [])
    groups = [z] if isinstance(z, dict) else z
    if not isinstance(groups, list) or not all(isinstance(g, dict) and g for g in groups):
        raise ConfigError("zip", "a table of field paths to lists or ranges of values of one length ([zip]), "
                          "or an array of such tables ([[zip]]) for several groups")
    return groups


def points(spec: dict) -> list[dict]:
    """The sweep's points: ``{"id", "params", "scenario"}``, params holding the varied fields
    and ``seed``. Checks the sweep file's own keys; :func:`resolve` checks the scenarios."""
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
    # An axis is a list of {path: value} choices: one path for a [vary] field, several for a zip group.
    axes = [[{path: v} for v in _values(path, values)] for path, values in vary.items()]
    seen = set(vary)
    for g, group in enumerate(_zip_groups(spec)):
        where = "zip" if isinstance(spec["zip"], dict) else f"zip[{g}]"
        columns = {path: _values(path, values, where) for path, values in group.items()}
        twice = seen & set(columns)
        if twice:
            raise ConfigError(f"{where}.{sorted(twice)[0]}", "varied twice: a field is in [vary] or one zip group, not both")
        seen |= set(columns)
        lengths = {path: len(v) for path, v in columns.items()}
        if len(set(lengths.values())) > 1:
            raise ConfigError(where, "fields that vary together need as many values each; got "
                              + ", ".join(f"{p}: {n}" for p, n in lengths.items()))
        axes.append([dict(zip(columns, values)) for values in zip(*columns.values())])
    axes.append([{"seed": s} for s in seeds])
    out = []
    for combo in itertools.product(*axes):
        params = {k: v for choice in combo for k, v in choice.items()}
        scenario = json.loads(json.dumps(base))
        for path, val in params.items():
            if path != "seed":
                set_path(scenario, path, val)
        scenario["seed"] = params["seed"]
        out.append({"id": point_id(params), "params": params, "scenario": scenario})
    return out


def resolve(pts: list[dict]) -> list[dict]:
    """Checks every point's scenario and resolves it into the simulator's spec (``"spec"``)
    before anything runs, so that a sweep fails at once rather than point by point: a field
    the scenario lacks or a value it refuses raises :class:`ConfigError` naming the varied
    field (``vary.<path>``, when the error is in one) and the point."""
    from .config import load_scenario

    for p in pts:
        if "spec" in p:
            continue
        try:
            p["spec"] = load_scenario(p["scenario"]).to_spec()
        except ConfigError as e:
            varied = [k for k in p["params"] if k != "seed" and (e.field == k or e.field.startswith((k + ".", k + "[")))]
            shown = ", ".join(f"{k} = {v!r}" for k, v in p["params"].items())
            raise ConfigError(f"vary.{varied[0]}" if varied else e.field,
                              f"{e.message}{' (' + e.field + ')' if varied and e.field != varied[0] else ''}; at the point {shown}"
                              ) from None
    return pts


def point_id(params: dict) -> str:
    return hashlib.sha1(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:12]


def run_point(point: dict, measure: Optional[Callable] = None) -> list[dict]:
    """Simulates one point (its resolved ``"spec"``, else its ``"scenario"``); its rows (one
    per job, or ``measure(result)``'s, or one error row), each with the point's ``status``
    (see the module's docs). Never raises but on Ctrl-C."""
    from . import _core, _run, simulate

    t0 = time.monotonic()
    head = {"point": point["id"], **point["params"]}
    r = None
    try:
        r = _run(_core, json.dumps(point["spec"]), None) if "spec" in point else simulate(point["scenario"])
        measured = measure(r) if measure is not None else None
    except Exception as e:  # a point's failure (its measure's too) is data, not the sweep's end
        error = f"{type(e).__name__}: {e}"
        if r is not None and not r.ok:  # a measure that could not read a run that did not complete
            return [{**head, "status": STATUS.get(r.outcome, r.outcome), "wall_s": r.raw["wall_s"],
                     "error": "; ".join(r.problems()) + f" (and the measure raised {error})"}]
        return [{**head, "status": "error", "error": error, "wall_s": time.monotonic() - t0}]
    status = STATUS.get(r.outcome, r.outcome)
    done = {"status": status, "error": None if status == "ok" else "; ".join(r.problems()), "wall_s": r.raw["wall_s"]}
    if measured is not None:
        return [{**head, **done, **m} for m in measured]
    rows = [{**head, **done, **{f"job_{k}" if k in PREFIXED else k: j.get(k) for k in JOB_FIELDS}} for j in r.raw["jobs"]]
    return rows or [{**head, **done}]  # a scenario of flows only: one row for the point


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
    and returns the whole dataset. Every point is checked and resolved first (:func:`resolve`).
    ``workers``: local processes (default: the machine's CPU count); ``ray``: run on Ray
    instead: "local" (a Ray instance started on this machine for the sweep), "auto" (the
    running cluster this machine belongs to) or a cluster address. ``measure``: a module-level
    function from a point's :class:`Result` to its rows (dicts of metrics), instead of one row
    per job (the reproductions use it for hosts' and switches' counters); the params,
    ``status`` and ``error`` are added to each. Ctrl-C kills the worker processes and raises
    ``KeyboardInterrupt``; the points written stay."""
    out = Path(out)
    resolve(pts)
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
                rows = run_point(p, measure)
                write(p, rows)
                report(1, rows[0]["status"])
        else:
            _run_pool(todo, write, workers or os.cpu_count() or 1, report, measure)
    finally:
        report(None)
    return load(out, [p["id"] for p in pts])


def _worker_start() -> None:
    """A pool worker's start: Ctrl-C is the parent's to handle (it kills the workers), and
    SIGTERM ends a worker at once rather than through a Python handler inherited from the
    parent, which would run only at the simulator's next signal check."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class WorkerDied(RuntimeError):
    """A pool worker process ended without answering (killed: the OOM killer, a signal)."""


def _run_pool(todo: list[dict], write, workers: int, report, measure) -> None:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    # fork: the children start with inalab imported (spawn or a fork server re-import it, a
    # second per worker, a fifth of a 20-point sweep); they only simulate and return rows, so
    # the parent's threads (the progress bar's) are not a hazard. An executor rather than a
    # multiprocessing.Pool: a worker that dies breaks it (BrokenProcessPool) where a Pool
    # replaces the worker, loses its point and waits for ever; and a Pool's terminate() hangs
    # on the task queue's lock when a worker killed while idle held it.
    pool = ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=mp.get_context("fork"), initializer=_worker_start)
    try:
        futures = {pool.submit(run_point, p, measure): p for p in todo}
        for f in as_completed(futures):
            try:
                rows = f.result()
            except BrokenProcessPool:
                raise WorkerDied("a worker process died while simulating (killed, e.g. by the kernel's OOM killer); "
                                 "the points done stay written, and the same sweep resumes from them") from None
            write(futures[f], rows)
            report(1, rows[0]["status"])
    except BaseException:
        # Ctrl-C, a dead worker or a failed write: the running points are killed, not waited for
        # (the executor's exit waits for them, minutes each). `_processes` is the executor's
        # own table of its workers; it has no public way to stop them.
        for proc in list((pool._processes or {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


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
    pending = {}
    try:
        remote = ray.remote(run_point)
        pending = {remote.remote(p, measure): p for p in todo}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                rows = ray.get(ref)
                write(pending.pop(ref), rows)
                report(1, rows[0]["status"])
    except BaseException:
        for ref in pending:  # Ctrl-C or an error: the cluster's tasks stop too
            ray.cancel(ref, force=True)
        raise
    finally:
        if started:
            ray.shutdown()


def _progress(progress, total: int, already: int):
    """A callable taking the number of points just finished and their status (``None``: the
    end): a rich bar on a terminal, a line every few seconds off one (logs, CI)."""
    if callable(progress):
        state = {"done": already}

        def call(n, status=None):
            if n is not None:
                state["done"] += n
                progress(state["done"], total)
        return call
    if not progress:
        return lambda n, status=None: None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .progress import PLAIN_EVERY_S, left

    console = Console(stderr=True)
    counts = {"done": already, "bad": 0, "last": time.monotonic(), "t0": time.monotonic(), "lines": 0}
    if not console.is_terminal:
        def line(n, status=None):
            now = time.monotonic()
            if n is not None:
                counts["done"] += n
                counts["bad"] += status not in (None, "ok")
            # A line every few seconds, and a last one at the end of a sweep that showed any.
            if now - counts["last"] >= PLAIN_EVERY_S or (n is None and counts["lines"]):
                counts["last"] = now
                counts["lines"] += 1
                elapsed = now - counts["t0"]
                eta = left(elapsed, (counts["done"] - already) / max(total - already, 1))
                console.print(f"sweep: {counts['done']}/{total} points ({counts['bad']} not ok), {elapsed:.0f} s elapsed"
                              + ("" if eta is None or n is None else f", ~{eta:.0f} s left"), markup=False, highlight=False)
        return line
    bar = Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[bad]}"),
                   TimeElapsedColumn(), console=console, transient=False)
    bar.start()
    task = bar.add_task("points", total=total, completed=already, bad="")

    def call(n, status=None):
        if n is None:
            bar.stop()
        else:
            counts["bad"] += status not in (None, "ok")
            bar.update(task, advance=n, bad=f"{counts['bad']} not ok" if counts["bad"] else "")
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


def scenario_hash(point: dict) -> str:
    """A hash of a resolved point's scenario (its simulator spec): a point file is reused only
    for the very scenario it was run on."""
    return hashlib.sha1(json.dumps(point["spec"], sort_keys=True, default=str).encode()).hexdigest()[:16]


def _claim(out: Path, spec: dict, pts: list[dict], overwrite: bool) -> None:
    """Makes ``out`` this sweep's. ``_sweep.json`` records the sweep file and each point's
    :func:`scenario_hash`. A point file found there is kept (its point is resumed) when it is one
    of this sweep's points run on the same scenario, so a sweep that adds values or seeds keeps
    the points it shares. Any other (another sweep's point, or one run on a scenario that has
    changed since: an edited base file, an upgraded shipped scenario) would put stale rows into
    ``pandas.read_parquet(out)``: it is refused, or deleted with ``overwrite``."""
    record = out / "_sweep.json"
    mine = {p["id"]: scenario_hash(p) for p in pts}
    try:
        old = json.loads(record.read_text()) if record.exists() else None
    except (OSError, json.JSONDecodeError):
        old = None
    if isinstance(old, dict) and set(old) == {"sweep", "points"}:
        recorded = old["points"]
    elif old == json.loads(json.dumps(spec, default=str)):
        recorded = mine  # written by an older inalab (the sweep file alone): the same sweep file
    else:
        recorded = {}
    for tmp in out.glob(".point-*.parquet.tmp"):  # half-written by a run that was killed
        tmp.unlink()
    files = sorted(out.glob("point-*.parquet"))
    pid = lambda f: f.name[len("point-"):-len(".parquet")]  # noqa: E731
    foreign = [f for f in files if pid(f) not in mine]
    stale = [f for f in files if pid(f) in mine and recorded.get(pid(f)) != mine[pid(f)]]
    if (foreign or stale) and not overwrite:
        why = ([f"{len(foreign)} of another sweep (not among this one's points)"] if foreign else []) + (
            [f"{len(stale)} run on a scenario that differs from this sweep's (an edited base file, another inalab)"] if stale else [])
        raise ConfigError("--out", f"{out} holds point files this sweep cannot reuse: {' and '.join(why)}; "
                          f"pandas.read_parquet({str(out)!r}) would mix their rows with this sweep's. Choose another --out, "
                          "or --overwrite to delete them (the points this sweep shares are kept)")
    for f in foreign + stale:
        f.unlink()
    out.mkdir(parents=True, exist_ok=True)
    # Underscore: Parquet readers skip it when they read the directory as a dataset.
    record.write_text(json.dumps({"sweep": spec, "points": mine}, indent=1, sort_keys=True, default=str))


def sweep(spec: Union[str, Path, dict], out: Union[str, Path], *, workers: Optional[int] = None,
          ray: Optional[str] = None, progress: Union[bool, Callable[[int, int], None]] = True,
          overwrite: bool = False) -> pd.DataFrame:
    """Runs the sweep ``spec`` (a TOML path or dict, see the module docs) into the Parquet
    dataset ``out`` and returns it: one row per job per point, the varied fields and ``seed``
    as columns, ``status`` "ok", "failed", "unfinished" or "error" (:func:`summarize` counts
    them). Every point's scenario is checked before the first runs. ``out`` holding another
    sweep's points is refused unless ``overwrite``."""
    spec = read_sweep(spec)
    pts = resolve(points(spec))
    _claim(Path(out), spec, pts, overwrite)
    return run_points(pts, out, workers=workers, ray=ray, progress=progress)


def summarize(df: pd.DataFrame) -> dict:
    """A sweep's dataset in counts: points, by status, and the reasons of those not ok (the
    most common first, each with its count)."""
    pts = df.drop_duplicates("point") if not df.empty else df
    counts = pts.status.value_counts() if len(pts) else {}
    order = ["ok", "failed", "unfinished", "error"]
    by_status = {k: int(counts[k]) for k in order + sorted(set(counts.keys()) - set(order)) if k in counts}
    bad = pts[pts.status != "ok"] if len(pts) else pts
    reasons = []
    if len(bad):
        counts = bad.fillna({"error": ""}).groupby(["status", "error"]).size().sort_values(ascending=False, kind="stable")
        reasons = [{"status": st, "error": err, "points": int(n)} for (st, err), n in counts.items()]
    return {"points": len(pts), "ok": by_status.get("ok", 0), "not_ok": len(bad), "by_status": by_status, "rows": len(df),
            "reasons": reasons}


def plot(df: pd.DataFrame, x: str, y: str = "jct_s", hue: Optional[str] = None, path: Union[str, Path, None] = None,
         title: Optional[str] = None):
    """A line per ``hue`` value of the mean of ``y`` over seeds against ``x`` (min-max band),
    of the points that are ok (the title says when some seeds of a point are left out); saved
    to ``path`` if given; returns the figure. Axis labels are the column names with the
    unit their suffix names (``jct_s`` -> "jct_s (s)"); ``title`` defaults to what is compared."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plots import line_style, unit_label, wrap_title

    ok = df[df.status == "ok"]
    if ok.empty:
        raise ValueError("no point of this sweep is ok: nothing to plot (see its status and error columns)")
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
    # Seeds behind each plotted point: a point whose seeds did not all complete is a mean of fewer.
    if "seed" in ok and hue != "seed":
        per = ok.groupby(([hue] if hue else []) + [x])["seed"].nunique()
        lo, hi, of = int(per.min()), int(per.max()), int(df["seed"].nunique())
    else:
        lo = hi = of = 1
    seeds = "" if of == 1 else (f" (mean of {hi} seeds, band min-max)" if lo == hi == of else
                                f" (mean of {lo}-{hi} of {of} seeds: the runs not ok are left out; band min-max)")
    fig.suptitle(wrap_title(title or f"{y} against {x}" + (f" for each {hue}" if hue else "") + seeds, fig), fontsize=10)
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
