"""A simulation's result: the simulator's JSON, as pandas DataFrames and a short summary."""
from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

import pandas as pd

# The simulator's row tables (crates/inalab-sim/src/result.rs), each a list of dicts.
TABLES = ("jobs", "iterations", "links", "switches", "hosts", "flows", "timeseries")


class Result:
    """What ``inalab.simulate`` returns.

    Tables are DataFrames with the simulator's columns: ``jobs``, ``iterations`` (one row per job
    and iteration), ``links`` (one row per link direction), ``switches``, ``hosts``, ``flows``
    and ``timeseries`` (long form: ``t_s, metric, entity, value``). Times are seconds and rates
    Gbps. ``raw`` is the simulator's JSON as a dict.
    """

    def __init__(self, raw: dict):
        self.raw = raw

    @classmethod
    def from_json(cls, text: str) -> "Result":
        return cls(json.loads(text))

    def _table(self, name: str) -> pd.DataFrame:
        return pd.DataFrame(self.raw.get(name) or [])

    @cached_property
    def jobs(self) -> pd.DataFrame:
        return self._table("jobs")

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

    @property
    def conservation(self) -> dict:
        return self.raw.get("conservation", {})

    def summary(self) -> dict:
        """The JSON object that ``inalab simulate --json`` prints."""
        r = self.raw
        return {
            "scenario": r["scenario"],
            "seed": r["seed"],
            "sim_time_s": r["sim_time_s"],
            "wall_s": r["wall_s"],
            "events": r["events"],
            "stopped_by": r.get("stopped_by"),
            "jobs": [
                {
                    "id": j["id"],
                    "name": j["name"],
                    "scheme": j["scheme"],
                    "workers": j["workers"],
                    "finished": j["finished"],
                    "jct_s": j["jct_s"],
                    "iterations": j["iterations"],
                    "mean_iteration_s": j["mean_iteration_s"],
                    "goodput_gbps": j["goodput_gbps"],
                }
                for j in r.get("jobs", [])
            ],
            "flows": len(r.get("flows", [])),
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
        return (f"<Result {r.get('scenario')!r}: {len(r.get('jobs', []))} jobs, "
                f"sim {r.get('sim_time_s', 0):.6g} s, {r.get('events', 0)} events>")
