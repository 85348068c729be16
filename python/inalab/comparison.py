"""Two results side by side (``inalab compare A B``): typically a simulated and an emulated run
of one scenario. Jobs are matched by name, links by (src, dst); each row has both values and
the relative difference ``(b - a) / a``. Where it has no meaning (``a`` is 0, or a value is
missing: a link only one result has, a job that did not finish) it is missing (NaN here,
null in JSON), never a division by zero; :func:`change_text` says which case it is."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Union

import pandas as pd

from .results import MISSING, Result, is_missing

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
        base = m[f"{c}_a"].astype(float)
        m[f"{c}_rel"] = (m[f"{c}_b"].astype(float) - base) / base.where(base != 0)  # 0 or missing: NaN
    return m


def number_text(v, fmt: str = "{:,.0f}") -> str:
    """A table cell: ``v`` formatted, or "-" where it is missing."""
    return MISSING if is_missing(v) else fmt.format(v)


def change_text(a, b, rel) -> str:
    """The "B vs A" cell: the relative difference as a signed percentage; "new" where A is 0
    and B is not; "-" where there is none (both 0, or either missing)."""
    if not is_missing(rel):
        return f"{rel:+.1%}"
    if not is_missing(a) and not is_missing(b) and a == 0 and b != 0:
        return "new"
    return "-"


def compare(a: Union[str, Path, Result], b: Union[str, Path, Result]) -> dict[str, pd.DataFrame]:
    """``{"jobs": ..., "links": ...}``: DataFrames with each metric of ``a`` and ``b``
    (``jct_s_a``, ``jct_s_b``) and their relative difference (``jct_s_rel``)."""
    ra, rb = load_result(a), load_result(b)
    return {
        "jobs": _side_by_side(ra.jobs, rb.jobs, ["name"], JOB_METRICS),
        "links": _side_by_side(ra.links, rb.links, ["src", "dst"], LINK_METRICS),
    }
