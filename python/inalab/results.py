"""A simulation's result: the simulator's JSON, as pandas DataFrames and a short summary."""
from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

import pandas as pd

# The simulator's row tables (crates/inalab-sim/src/result.rs), each a list of dicts.
TABLES = ("jobs", "iterations", "links", "switches", "hosts", "flows", "timeseries")

# A job is flagged compute-bound when communication was outstanding for less than this share of
# its JCT (``comm_share``): then no network, INA scheme or routing can shorten it by more than
# that share. Models run at their profiled GPU's speed unless the job sets ``compute_scale``.
COMPUTE_BOUND_SHARE = 0.10


# How a table prints a missing value (a job that did not finish has no JCT): never "nan" or "None".
MISSING = "-"


def is_missing(v) -> bool:
    """A missing value (None, NaN, pd.NA, NaT), never a list or other container."""
    try:
        return v is None or bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def comm_share(job: dict) -> float | None:
    """The communication share of a finished job: the time its worker 0 had at least one
    allreduce outstanding (``comm_busy_s``) over its JCT, 0-1. Communication that overlaps
    compute counts, so this bounds from above what a faster network could save (a job whose
    network were infinitely fast would still compute for the rest). None when the job did not
    finish (it has no JCT), the result has no ``comm_busy_s`` (``inalab emulate``) or the job
    took no time."""
    busy, jct = job.get("comm_busy_s"), job.get("jct_s")
    if not job.get("finished") or busy is None or not jct or jct <= 0:
        return None
    return min(1.0, busy / jct)


def compute_bound(job: dict) -> bool | None:
    """Whether ``comm_share(job)`` is below ``COMPUTE_BOUND_SHARE`` (None when it is unknown)."""
    share = comm_share(job)
    return None if share is None else share < COMPUTE_BOUND_SHARE


class Result:
    """What ``inalab.simulate`` returns.

    Tables are DataFrames with the simulator's columns: ``jobs``, ``iterations`` (one row per job
    and iteration), ``links`` (one row per link direction), ``switches``, ``hosts``, ``flows``
    and ``timeseries`` (long form: ``t_s, metric, entity, value``). Times are seconds and rates
    Gbps; every column is defined in docs/results.md. ``raw`` is the simulator's JSON as a
    dict. ``jobs`` also has two derived columns: ``comm_share`` (see :func:`comm_share`) and
    ``compute_bound`` (``comm_share`` below ``COMPUTE_BOUND_SHARE``, 10 %), both for finished
    jobs only. ``outcome`` says how the run went and ``problems()`` why a job did not finish.
    """

    def __init__(self, raw: dict):
        self.raw = raw

    @classmethod
    def from_json(cls, text: str) -> "Result":
        return cls(json.loads(text))

    def _table(self, name: str) -> pd.DataFrame:
        from .columns import TABLE_OF

        df = pd.DataFrame(self.raw.get(name) or [])
        # Times and rates are floats, a missing one NaN: a column of a job that did not
        # finish would otherwise hold None (object dtype), which float() and arithmetic reject.
        for col, (unit, _) in TABLE_OF.get(name, {}).items():
            if unit in ("s", "Gbps", "share") and col in df.columns:
                df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
        return df

    @cached_property
    def jobs(self) -> pd.DataFrame:
        df = self._table("jobs")
        if not df.empty:
            jobs = self.raw["jobs"]
            df["comm_share"] = pd.Series([comm_share(j) for j in jobs], index=df.index, dtype="float64")
            df["compute_bound"] = pd.Series([compute_bound(j) for j in jobs], index=df.index, dtype="boolean")
        return df

    @cached_property
    def iterations(self) -> pd.DataFrame:
        return self._table("iterations")

    @cached_property
    def links(self) -> pd.DataFrame:
        return self._table("links")

    @cached_property
    def switches(self) -> pd.DataFrame:
        return self._table("switches")

    @cached_property
    def hosts(self) -> pd.DataFrame:
        return self._table("hosts")

    @cached_property
    def flows(self) -> pd.DataFrame:
        return self._table("flows")

    @cached_property
    def timeseries(self) -> pd.DataFrame:
        return self._table("timeseries")

    @cached_property
    def captures(self) -> pd.DataFrame:
        """Capture files written (``pcap=``): point, path, packets."""
        return self._table("captures")

    @property
    def conservation(self) -> dict:
        return self.raw.get("conservation", {})

    @property
    def outcome(self) -> str:
        """"completed" (every job finished, every flow ended), "failed" (a job failed),
        "unfinished" (a job or flow had not ended when the run stopped) or "interrupted"."""
        return self.raw.get("outcome", "completed")

    @property
    def ok(self) -> bool:
        """Whether the run completed: ``outcome == "completed"``."""
        return self.outcome == "completed"

    def problems(self) -> list[str]:
        """One line per job that did not finish and per kind of unfinished flow, naming why
        (empty when the run completed)."""
        lines = [f"{j['name']}: {j['status']}: {j.get('reason') or ''}".rstrip(": ")
                 for j in self.raw.get("jobs", []) if not j["finished"]]
        open_flows = [f for f in self.raw.get("flows", []) if not f.get("finished", True)]
        if open_flows:
            lines.append(f"{len(open_flows)} of {len(self.raw['flows'])} flows had not ended when the run stopped "
                         f"(packets still to send or in flight; raise `stop`)")
        return lines

    def flows_summary(self) -> dict | None:
        """What the flows delivered: counts by ``status`` and bytes (None without flows)."""
        flows = self.raw.get("flows") or []
        if not flows:
            return None
        size = sum(f["bytes"] for f in flows)
        got = sum(f["bytes_received"] for f in flows)
        fcts = [f["fct_s"] for f in flows if f.get("fct_s") is not None]
        return {"count": len(flows), **{k: sum(f["status"] == k for f in flows) for k in ("delivered", "lossy", "unfinished")},
                "bytes": size, "bytes_received": got, "delivered_fraction": got / size if size else 1.0,
                "max_fct_s": max(fcts) if fcts else None}

    def summary(self) -> dict:
        """The JSON object that ``inalab simulate --json`` prints (docs/results.md)."""
        r = self.raw
        return {
            "scenario": r["scenario"],
            "seed": r["seed"],
            "outcome": self.outcome,
            "stopped_by": r.get("stopped_by"),
            "sim_time_s": r["sim_time_s"],
            "wall_s": r["wall_s"],
            "events": r["events"],
            "jobs": [
                {
                    **{k: j.get(k) for k in ("id", "name", "scheme", "kind", "workers", "status", "reason", "finished", "jct_s",
                                             "iterations", "iterations_planned", "mean_iteration_s", "goodput_gbps", "busbw_gbps")},
                    "comm_share": comm_share(j),
                    "compute_bound": compute_bound(j),
                }
                for j in r.get("jobs", [])
            ],
            "flows": self.flows_summary(),
            "problems": self.problems(),
            "conservation_holds": r.get("conservation", {}).get("holds"),
        }

    def to_json(self, indent: int | None = None) -> str:
        """The full result (every table) as JSON."""
        return json.dumps(self.raw, indent=indent)

    def save(self, out_dir: str | Path) -> list[Path]:
        """Writes ``result.json``, ``summary.json`` and one CSV per non-empty table; returns the paths."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        written = [out / "result.json", out / "summary.json"]
        written[0].write_text(self.to_json())
        written[1].write_text(json.dumps(self.summary(), indent=2))
        for name in TABLES:
            df = getattr(self, name)
            if not df.empty:
                path = out / f"{name}.csv"
                # Dict-valued columns (per-switch counters) go out as JSON text.
                df.map(lambda v: json.dumps(v) if isinstance(v, (dict, list)) else v).to_csv(path, index=False)
                written.append(path)
        return written

    def __repr__(self) -> str:
        r = self.raw
        return (f"<Result {r.get('scenario')!r} {self.outcome}: {len(r.get('jobs', []))} jobs, "
                f"sim {r.get('sim_time_s', 0):.6g} s, {r.get('events', 0)} events>")
