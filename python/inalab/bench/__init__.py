"""``inalab bench``: every INA design on the same workloads, in one table.

A fixed suite of scenarios (``scenarios/<scale>/*.toml``, shipped, each isolating one condition
the papers argue about) times a fixed list of schemes (:data:`CELLS`: the baselines, and each
INA design at each of its documented variants), at least 3 seeds per cell, run through the
sweep runner (local processes or Ray). Every cell is a number with its spread or a reason it
cannot run (the scheme's own planning error, in one phrase); none is silently missing.

Outputs in ``--out``:

* ``bench.parquet`` and ``bench.csv``: one row per (scenario, scheme, seed) with
  :data:`TABLE_COLUMNS`;
* ``summary.csv``: one row per (scenario, scheme): mean and standard deviation over the seeds,
  goodput normalised to ring's on the same scenario, or the reason;
* ``heatmap.png``: that normalised goodput, scenario by scheme (mean, with the spread);
* ``index.html``: a self-contained page with the scenarios' descriptions, the tables, the
  figure and, per scenario, the winner and the mechanism its counters show;
* ``points/``: the sweep runner's dataset (a rerun skips the cells done).

Scenario files are ordinary scenarios with a `ring` placeholder for each job's scheme: the
bench sets every job's scheme to the cell's, drops ``servers`` for schemes without a parameter
server, and applies the cell's settings (:data:`CELLS`).
"""
from __future__ import annotations

import base64
import functools
import html
import json
import math
import tomllib
from pathlib import Path
from typing import Optional, Union

import pandas as pd

from ..config import ConfigError

SCALES = ("small", "paper")
SCENARIO_DIR = Path(__file__).parent / "scenarios"
DEFAULT_SEEDS = 3
# Cell name -> (scheme, settings merged into each job). The baselines first, then each design at
# each of its levels or variants the papers compare.
CELLS: dict[str, tuple[str, dict]] = {
    "ring": ("ring", {}),
    "hierarchical": ("hierarchical", {}),
    "ps": ("ps", {}),
    "ps_sharded": ("ps_sharded", {}),
    "static_tree": ("static_tree", {}),
    "static_trees_4": ("static_tree", {"ina": {"trees": 4}}),
    "switchml": ("switchml", {}),
    "atp": ("atp", {}),
    "atp_once": ("atp", {"ina": {"levels": "once"}}),
    "atp_tree": ("atp", {"ina": {"levels": "tree"}}),
    "dsa": ("dsa", {}),
    "canary": ("canary", {}),
    "rina": ("rina", {}),
    "grid": ("grid", {}),
}
CELL_DOCS = {
    "ring": "ring allreduce on the hosts (the baseline every goodput is normalised to)",
    "hierarchical": "ring in each rack, then across racks",
    "ps": "one parameter server (the scenario's server host)",
    "ps_sharded": "parameter servers sharded over the workers (BytePS-like)",
    "static_tree": "one static aggregation tree rooted at a spine (SHARP-like)",
    "static_trees_4": "four static trees, blocks round robin (PANAMA-like)",
    "switchml": "SwitchML: a slot pool in the workers' shared ToR",
    "atp": "ATP at its two levels: the workers' ToRs and the PS's",
    "atp_once": "ATP aggregating each gradient once, at its first ATP switch (GRID's ATP baseline)",
    "atp_tree": "ATP at every ATP switch on the routes to the PS (Rina's PS-based INA)",
    "dsa": "DSA: shared aggregators with preemption by priority",
    "canary": "Canary: dynamic trees built per block, congestion-aware",
    "rina": "Rina: ring over INA racks as abstracted workers",
    "grid": "GRID: each worker aggregated where GRID's LP and R-GRIA's best rounding plan it",
}
# One row per (scenario, scheme, seed).
TABLE_COLUMNS = {
    "scenario": "string", "scheme": "string", "seed": "int64", "status": "string", "reason": "string",
    "jct_s": "float64", "goodput_gbps": "float64", "jobs": "int64", "jobs_finished": "int64",
    "drops": "int64", "ecn_marks": "int64", "aggregators_peak": "int64", "absorbed_packets": "int64",
    "host_tx_bytes": "int64", "resends": "int64", "wall_s": "float64",
}
COLUMN_DOCS = {
    "scenario": "the suite's scenario (file name without .toml)",
    "scheme": "the cell (see the schemes' list)",
    "seed": "the run's seed",
    "status": "ok, failed, unfinished, impossible (the cell cannot run: see reason) or error (the run raised)",
    "reason": "why the cell cannot run or did not finish; empty when ok",
    "jct_s": "the time until the last job finished, s (makespan)",
    "goodput_gbps": "mean over the jobs of bytes allreduced x 8 / JCT, Gbps",
    "jobs": "jobs in the scenario",
    "jobs_finished": "jobs that finished",
    "drops": "packets dropped on links (queue overflow and loss) and by switches (no route, failures)",
    "ecn_marks": "packets ECN-marked on links",
    "aggregators_peak": "the most aggregators in use at any one switch",
    "absorbed_packets": "packets switches consumed into sums (in-network aggregation at work)",
    "host_tx_bytes": "bytes the jobs' hosts (workers and servers) sent",
    "resends": "loss-recovery resends of the jobs' hosts (every scheme's counter of them)",
    "wall_s": "the run's wall time, s",
}
# Host counters that count loss-recovery resends, by scheme.
RESEND_COUNTERS = ("retransmissions", "resends", "resent", "retransmits", "rtx_requests")


def scenario_files(scale: str) -> dict[str, Path]:
    """The suite's scenarios at ``scale``, by name, in order."""
    if scale not in SCALES:
        raise ConfigError("scale", f"{scale!r}; allowed: {', '.join(map(repr, SCALES))}")
    return {p.stem: p for p in sorted((SCENARIO_DIR / scale).glob("*.toml"))}


def _pick(what: str, given: Optional[list[str]], allowed: list[str]) -> list[str]:
    if not given:
        return allowed
    unknown = [g for g in given if g not in allowed]
    if unknown:
        raise ConfigError(what, f"unknown {unknown[0]!r}; allowed: {', '.join(allowed)}")
    return [a for a in allowed if a in given]


def cell_scenario(base: dict, cell: str, seed: int, name: str = "bench", plans: Optional[dict] = None) -> dict:
    """``base`` with every job running ``cell``'s scheme and settings, at ``seed``, named
    ``name`` (the suite's scenario: :func:`measure` finds its job hosts by it). ``plans``:
    GRID's policies already planned for ``name`` (filled on first use), so that a scenario is
    planned once, from seed 1, whatever the seeds run (at 1024 hosts a plan takes minutes)."""
    from .. import schemes

    scheme, settings = CELLS[cell]
    sc = json.loads(json.dumps(base))
    sc["name"] = name
    takes_servers = schemes.registry()[scheme]["servers"] != "none"
    for job in sc.get("jobs", []):
        job["scheme"] = scheme
        if not takes_servers:
            job.pop("servers", None)
        for key, value in settings.items():
            if isinstance(value, dict):
                job.setdefault(key, {}).update(value)
            else:
                job[key] = value
    sc["seed"] = seed
    if scheme == "grid":
        plans = {} if plans is None else plans
        if name not in plans:
            plans[name] = _plan_grid({**sc, "seed": 1})
        for job, policy in zip(sc["jobs"], plans[name]):
            if policy is not None:
                job["policy"] = policy
    return sc


def _plan_grid(sc: dict) -> list[Optional[dict]]:
    """Each job's GRID routing policy (``None`` for a job without one PS), planned as
    ``policy = "auto"`` plans it from the scenario's seed, but without the exact MILP: on the
    suite's 16-host leaf-spine it runs to its 60 s limit at every set-up, while GRID's own
    planner (its LP, R-GRIA's roundings, improved locally) takes a tenth of a second there."""
    from ..analysis.grid import auto_policy
    from ..config import build_topology, load_scenario

    scenario = load_scenario(sc)
    spec = scenario.to_spec()  # the placed jobs (no policy yet: every worker to the PS)
    built = build_topology(spec["topology"])
    return [auto_policy(built, placed["workers"], placed["servers"][0], scenario.network.switch_capacity, sc["seed"], milp=False)
            if len(placed["servers"]) == 1 else None for placed in spec["jobs"]]


def _reason(error: str) -> str:
    """A planning or set-up error as the reason of its cell: the field and the message, without
    the exception's name, at most 200 characters."""
    text = error.split(": ", 1)[1] if error.startswith(("ConfigError: ", "SimError: ", "ValueError: ")) else error
    return text[:200]


def job_hosts(base: dict) -> list[str]:
    """The hosts of ``base``'s jobs, workers and servers (not its background's)."""
    from ..config import load_scenario

    spec = load_scenario(cell_scenario(base, "ps", 1)).to_spec()
    return sorted({h for j in spec["jobs"] for h in j["workers"] + j["servers"]})


def measure(r, hosts_of: dict[str, list[str]]) -> list[dict]:
    """A run's row of the bench table; ``hosts_of``: each scenario's job hosts, by name
    (module level, bound with :func:`functools.partial`: the sweep runner's workers call it)."""
    jobs, links, switches = r.raw["jobs"], r.raw["links"], r.raw["switches"]
    mine = set(hosts_of[r.raw["scenario"]])
    hosts = [h for h in r.raw["hosts"] if h["name"] in mine]
    finished = [j for j in jobs if j["finished"]]
    done = bool(jobs) and len(finished) == len(jobs)
    goodputs = [j["goodput_gbps"] for j in jobs]
    switch_drops = sum(s["counters"].get(k, 0) for s in switches for k in ("drops_no_route", "drops_node_failed", "drops_link_failed"))
    return [{
        "jct_s": max(j["jct_s"] for j in jobs) if done else None,
        "goodput_gbps": sum(goodputs) / len(goodputs) if done else None,
        "jobs": len(jobs),
        "jobs_finished": len(finished),
        "drops": sum(l["drops_queue"] + l["drops_loss"] for l in links) + switch_drops,
        "ecn_marks": sum(l["ecn_marks"] for l in links),
        "aggregators_peak": max((s["aggregators_peak"] for s in switches), default=0),
        "absorbed_packets": sum(s["absorbed_packets"] for s in switches),
        "host_tx_bytes": sum(h["tx_bytes"] for h in hosts),
        "resends": sum(h["counters"].get(k, 0) for h in hosts for k in RESEND_COUNTERS),
    }]


def cells(scale: str = "small", *, seeds: int = DEFAULT_SEEDS, only: Optional[list[str]] = None,
          schemes: Optional[list[str]] = None) -> tuple[list[dict], list[dict], dict[str, str]]:
    """The matrix: (points to run, rows of the cells that cannot run, each scenario's
    description). A cell whose scenario the front refuses (its set-up is checked here, before
    anything runs) is a row with status "impossible" and the reason; one the scheme refuses
    when planning is found so when it runs."""
    from ..config import load_scenario

    if seeds < 1:
        raise ConfigError("seeds", f"at least 1, got {seeds}")
    files = scenario_files(scale)
    names = _pick("only", only, list(files))
    chosen = _pick("schemes", schemes, list(CELLS))
    pts, impossible, described, plans = [], [], {}, {}
    for name in names:
        base = tomllib.loads(files[name].read_text())
        described[name] = base.get("description", "")
        for cell in chosen:
            for seed in range(1, seeds + 1):
                params = {"scenario": name, "scheme": cell, "seed": seed}
                try:
                    sc = cell_scenario(base, cell, seed, name, plans)
                    point = {"id": f"{name}--{cell}--{seed}", "params": params, "scenario": sc, "spec": load_scenario(sc).to_spec()}
                except (ConfigError, ValueError) as e:  # the front's refusal, or GRID's planner's
                    impossible.append({**params, "status": "impossible", "reason": _reason(str(e))})
                    continue
                pts.append(point)
    return pts, impossible, described


def run(scale: str = "small", out: Union[str, Path] = "bench", *, seeds: int = DEFAULT_SEEDS,
        only: Optional[list[str]] = None, schemes: Optional[list[str]] = None, workers: Optional[int] = None,
        ray: Optional[str] = None, progress=True) -> pd.DataFrame:
    """Runs the matrix into ``out`` and writes every output (see the module's docs); returns
    the table (one row per scenario, scheme and seed)."""
    from ..sweeps import run_points

    out = Path(out)
    pts, impossible, described = cells(scale, seeds=seeds, only=only, schemes=schemes)
    files = scenario_files(scale)
    hosts_of = {name: job_hosts(tomllib.loads(files[name].read_text())) for name in described}
    rows_of = functools.partial(measure, hosts_of=hosts_of)
    ran = run_points(pts, out / "points", workers=workers, ray=ray, progress=progress, measure=rows_of) if pts else pd.DataFrame()
    rows = impossible + [_row(r) for r in ran.to_dict("records")]
    table = _table(rows)
    write(table, described, out, scale)
    return table


def _row(r: dict) -> dict:
    row = {k: r.get(k) for k in TABLE_COLUMNS}
    error = r.get("error") or ""
    if r["status"] == "error" and error.startswith("ConfigError: "):
        # The scheme's planning refused the scenario: the cell cannot run, and says why.
        row.update(status="impossible", reason=_reason(error))
    elif r["status"] != "ok":  # failed, unfinished, or error: the run raised, not the scheme's verdict
        row["reason"] = _reason(error or r["status"])
    return row


def _table(rows: list[dict]) -> pd.DataFrame:
    order = {c: i for i, c in enumerate(CELLS)}
    df = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
    for c, t in TABLE_COLUMNS.items():
        df[c] = df[c].astype({"string": "string", "int64": "Int64", "float64": "float64"}[t])
    df = df.sort_values(["scenario", "scheme", "seed"], key=lambda s: s.map(order) if s.name == "scheme" else s)
    return df.reset_index(drop=True)


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (scenario, scheme): the seeds' mean and standard deviation of JCT and
    goodput, goodput over ring's mean on the same scenario (and its spread), or the reason the
    cell has no number (the first seed's)."""
    out = []
    for (scenario, scheme), g in table.groupby(["scenario", "scheme"], sort=False):
        ok = g[g.status == "ok"]
        ring = table[(table.scenario == scenario) & (table.scheme == "ring") & (table.status == "ok")].goodput_gbps
        ring_mean = ring.mean() if len(ring) else math.nan
        row = {"scenario": scenario, "scheme": scheme, "seeds": len(g), "ok": len(ok)}
        if len(ok) == len(g):
            gp = ok.goodput_gbps.astype(float)
            row.update(jct_s=ok.jct_s.mean(), jct_std=ok.jct_s.std(ddof=0), goodput_gbps=gp.mean(), goodput_std=gp.std(ddof=0),
                       vs_ring=gp.mean() / ring_mean, vs_ring_std=gp.std(ddof=0) / ring_mean, reason="")
        else:
            bad = g[g.status != "ok"].iloc[0]
            why = bad.reason if isinstance(bad.reason, str) and bad.reason else bad.status
            row.update(jct_s=math.nan, jct_std=math.nan, goodput_gbps=math.nan, goodput_std=math.nan, vs_ring=math.nan,
                       vs_ring_std=math.nan, reason=f"{bad.status} (seed {bad.seed}): {why}")
        out.append(row)
    return pd.DataFrame(out)


def mechanism(table: pd.DataFrame, scenario: str) -> str:
    """The winner of ``scenario`` (the highest mean goodput) and what its counters show against
    ring's: bytes the hosts sent, packets the switches absorbed, drops and resends."""
    s = summarize(table[table.scenario == scenario])
    s = s[s.goodput_gbps.notna()]
    if s.empty:
        return "no cell finished"
    best = s.sort_values("goodput_gbps", ascending=False).iloc[0]
    mine = table[(table.scenario == scenario) & (table.scheme == best.scheme) & (table.status == "ok")]
    ring = table[(table.scenario == scenario) & (table.scheme == "ring") & (table.status == "ok")]
    words = [f"{best.scheme} wins at {best.goodput_gbps:.1f} Gbps"]
    if len(ring) and best.scheme != "ring":
        words[0] += f" ({best.vs_ring:.2f}x ring)"
        words.append(f"its hosts sent {mine.host_tx_bytes.mean() / max(ring.host_tx_bytes.mean(), 1):.2f}x ring's bytes")
    if mine.absorbed_packets.mean() > 0:
        words.append(f"switches absorbed {mine.absorbed_packets.mean():,.0f} packets into sums")
    against = f" (ring: {ring.drops.mean():,.0f} and {ring.resends.mean():,.0f})" if len(ring) and best.scheme != "ring" else ""
    words.append(f"{mine.drops.mean():,.0f} drops and {mine.resends.mean():,.0f} resends per run{against}")
    return "; ".join(words)


def heatmap(summary: pd.DataFrame, path: Union[str, Path, None] = None):
    """Goodput normalised to ring, scenario by scheme: each cell the mean over the seeds with
    its spread, coloured by log2 of the ratio (red below ring, blue above); a cell without a
    number is grey, "n/a" where the scheme cannot run there and "dnf" where it did not finish
    (the summary says why)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    scenarios = list(dict.fromkeys(summary.scenario))
    schemes = [c for c in CELLS if c in set(summary.scheme)]
    grid = np.full((len(scenarios), len(schemes)), np.nan)
    spread = np.full_like(grid, np.nan)
    missing = {}
    for r in summary.itertuples():
        i, j = scenarios.index(r.scenario), schemes.index(r.scheme)
        grid[i, j], spread[i, j] = r.vs_ring, r.vs_ring_std
        if np.isnan(r.vs_ring):
            missing[(i, j)] = "n/a" if str(r.reason).startswith("impossible") else "dnf"
    with np.errstate(divide="ignore", invalid="ignore"):
        shade = np.log2(grid)
    reach = max(1.0, float(np.nanmax(np.abs(shade)))) if np.isfinite(shade).any() else 1.0
    fig, ax = plt.subplots(figsize=(1.0 + 0.85 * len(schemes), 1.2 + 0.55 * len(scenarios)))
    cmap = matplotlib.colormaps["RdBu"].with_extremes(bad="#dddddd")
    im = ax.imshow(np.ma.masked_invalid(shade), cmap=cmap, norm=TwoSlopeNorm(0.0, -reach, reach), aspect="auto")
    for i in range(len(scenarios)):
        for j in range(len(schemes)):
            text = missing.get((i, j), "") if np.isnan(grid[i, j]) else f"{grid[i, j]:.2f}\n±{spread[i, j]:.2f}"
            dark = np.isfinite(shade[i, j]) and abs(shade[i, j]) > 0.6 * reach
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    ax.set_xticks(range(len(schemes)), schemes, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(scenarios)), scenarios, fontsize=8)
    fig.colorbar(im, ax=ax, label="log2(goodput / ring's), mean over seeds")
    ax.set_title("inalab bench: goodput normalised to ring")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig


def write(table: pd.DataFrame, described: dict[str, str], out: Union[str, Path], scale: str) -> None:
    """Writes the table, the summary, the heatmap and the HTML page into ``out``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([(c, pa.type_for_alias(t)) for c, t in TABLE_COLUMNS.items()])
    pq.write_table(pa.Table.from_pandas(table, schema=schema, preserve_index=False), out / "bench.parquet")
    table.to_csv(out / "bench.csv", index=False)
    summary = summarize(table)
    summary.to_csv(out / "summary.csv", index=False)
    heatmap(summary, out / "heatmap.png")
    (out / "index.html").write_text(page(table, summary, described, scale, (out / "heatmap.png").read_bytes()))


def page(table: pd.DataFrame, summary: pd.DataFrame, described: dict[str, str], scale: str, png: bytes) -> str:
    """The self-contained HTML page (the figure inlined)."""
    from .. import __version__

    esc = html.escape
    parts = [f"<!doctype html><meta charset=utf-8><title>inalab bench ({esc(scale)})</title>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto}table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td:first-child,td:nth-child(2){text-align:left}</style>",
             f"<h1>inalab bench, {esc(scale)} scale</h1><p>inalab {esc(__version__)}; {table.seed.nunique()} seeds per cell; "
             f"{len(table)} runs.</p>",
             "<h2>Goodput normalised to ring</h2>",
             f"<img alt='heatmap' src='data:image/png;base64,{base64.b64encode(png).decode()}'>",
             "<h2>Scenarios and their winners</h2><dl>"]
    for name, text in described.items():
        parts.append(f"<dt><b>{esc(name)}</b></dt><dd>{esc(text)}<br><i>{esc(mechanism(table, name))}</i></dd>")
    parts.append("</dl><h2>Schemes</h2><ul>")
    parts += [f"<li><b>{esc(c)}</b>: {esc(d)}</li>" for c, d in CELL_DOCS.items() if c in set(table.scheme)]
    parts.append("</ul><h2>Summary (mean and spread over seeds)</h2>")
    parts.append(summary.to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep=""))
    parts.append("<h2>Every run</h2><p>" + "; ".join(f"<b>{esc(c)}</b>: {esc(d)}" for c, d in COLUMN_DOCS.items()) + "</p>")
    parts.append(table.to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep=""))
    return "\n".join(parts)
