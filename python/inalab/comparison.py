"""Two results side by side (``inalab compare A B``): typically a simulated and an emulated run
of one scenario. Jobs are matched by name, links by (src, dst); each row has both values and
the relative difference ``(b - a) / a``."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Union

import pandas as pd

from .results import Result

JOB_METRICS = ("jct_s", "mean_iteration_s", "goodput_gbps")
LINK_METRICS = ("tx_bytes", "utilization")


def load_result(source: Union[str, Path, Result]) -> Result:
    """A :class:`Result` from itself, a ``result.json`` file, or a directory holding one
    (what ``--out`` writes)."""
    if isinstance(source, Result):
        return source
    path = Path(source)
    if path.is_dir():
        path = path / "result.json"
    if not path.exists():
        raise FileNotFoundError(f"{source}: no result.json there (write one with `inalab simulate/emulate ... --out DIR`)")
    return Result(json.loads(path.read_text()))


def _side_by_side(a: pd.DataFrame, b: pd.DataFrame, keys: list[str], metrics: tuple[str, ...]) -> pd.DataFrame:
    cols = [m for m in metrics if m in a.columns and m in b.columns]
    if a.empty or b.empty or not cols:
        return pd.DataFrame(columns=keys)
    m = a[keys + cols].merge(b[keys + cols], on=keys, how="outer", suffixes=("_a", "_b"))
    for c in cols:
        m[f"{c}_rel"] = (m[f"{c}_b"] - m[f"{c}_a"]) / m[f"{c}_a"].where(m[f"{c}_a"] != 0)
    return m


def compare(a: Union[str, Path, Result], b: Union[str, Path, Result]) -> dict[str, pd.DataFrame]:
    """``{"jobs": ..., "links": ...}``: DataFrames with each metric of ``a`` and ``b``
    (``jct_s_a``, ``jct_s_b``) and their relative difference (``jct_s_rel``)."""
    ra, rb = load_result(a), load_result(b)
    return {
        "jobs": _side_by_side(ra.jobs, rb.jobs, ["name"], JOB_METRICS),
        "links": _side_by_side(ra.links, rb.links, ["src", "dst"], LINK_METRICS),
    }
