"""Every figure the package draws says what it shows (issue 20): a title naming the paper's figure
or what is compared, labelled axes (the value axis with its unit or as a ratio), legends that
hide no data, and no line hidden under an identical-looking one.

The figures are drawn as `inalab demo` and `inalab reproduce` draw them; the packet-level
reproductions (minutes of simulation each) from the rows of their committed write-ups
(docs/reproductions/NAME.md), which `explain` printed from the same rows."""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

import inalab
from inalab.plots import demo_figure
from inalab.reproduce import REPRODUCTIONS
from inalab.reproduce.grid_large_scale import GridLargeScale

matplotlib.use("Agg")

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reproductions"
# Cheap enough to run for real here; the others are drawn from their write-ups' rows.
RUN_FOR_REAL = {"grid-motivating-example", "rina-incremental"}


@pytest.fixture
def drawn(monkeypatch):
    """Figures saved while the test runs, checked as they are saved (after layout)."""
    figures = []
    save = Figure.savefig

    def savefig(fig, *args, **kwargs):
        out = save(fig, *args, **kwargs)
        figures.append((fig, problems(fig)))
        return out

    monkeypatch.setattr(Figure, "savefig", savefig)
    return figures


def problems(fig) -> list[str]:
    """What the figure lacks; empty if it says what it shows and hides nothing."""
    found = []
    renderer = fig.canvas.get_renderer()
    title = fig._suptitle.get_text() if fig._suptitle is not None else ""
    axes = [ax for ax in fig.axes if ax.get_visible() and (ax.lines or ax.patches or ax.collections)]
    if not title and not (len(axes) == 1 and axes[0].get_title()):
        found.append("no title")
    for ax in axes:
        name = ax.get_title() or "axes"
        if not ax.get_xlabel():
            found.append(f"{name}: no x label")
        ylabel = ax.get_ylabel() or next((a.get_ylabel() for a in ax.get_shared_y_axes().get_siblings(ax)
                                          if a.get_ylabel()), "")
        if not ylabel:
            found.append(f"{name}: no y label")
        elif "(" not in ylabel and "/" not in ylabel:
            found.append(f"{name}: y label {ylabel!r} has no unit and is no ratio")
        found += [f"{name}: {p}" for p in hidden_lines(ax)]
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    for legend in legends:
        box = legend.get_window_extent(renderer).shrunk(0.98, 0.98)
        for ax in axes:
            what = covered(ax, box, renderer)
            if what:
                found.append(f"{ax.get_title() or 'axes'}: the legend covers {what}")
    return found


def covered(ax, box, renderer) -> str:
    """The first data artist of ``ax`` that ``box`` (display coordinates) overlaps, or ''."""
    clip = ax.get_window_extent(renderer)
    for line in ax.lines:
        xy = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
        xy = xy[np.isfinite(xy).all(axis=1)]
        # Points along every segment (a segment may cross the box between its ends).
        t = np.linspace(0, 1, 25)[:, None, None]
        pts = (xy[:-1] + t * (xy[1:] - xy[:-1])).reshape(-1, 2) if len(xy) > 1 else xy
        inside = (pts[:, 0] > max(box.x0, clip.x0)) & (pts[:, 0] < min(box.x1, clip.x1)) \
            & (pts[:, 1] > max(box.y0, clip.y0)) & (pts[:, 1] < min(box.y1, clip.y1))
        if inside.any():
            return f"line {line.get_label()!r}"
    for patch in ax.patches:
        ext = patch.get_window_extent(renderer)
        if ext.width > 0 and ext.height > 0 and ext.overlaps(box) and clip.overlaps(box):
            inter = (min(ext.x1, box.x1, clip.x1) - max(ext.x0, box.x0, clip.x0),
                     min(ext.y1, box.y1, clip.y1) - max(ext.y0, box.y0, clip.y0))
            if inter[0] > 1 and inter[1] > 1:
                return f"bar {patch.get_label()!r}"
    for coll in ax.collections:
        offsets = coll.get_offsets()
        if len(offsets):
            pts = coll.get_offset_transform().transform(offsets)
            if ((pts[:, 0] > box.x0) & (pts[:, 0] < box.x1) & (pts[:, 1] > box.y0) & (pts[:, 1] < box.y1)).any():
                return f"points {coll.get_label()!r}"
    return ""


def hidden_lines(ax) -> list[str]:
    """Pairs of lines with the same data drawn alike: the one on top hides the other."""
    out = []
    lines = [l for l in ax.lines if not l.get_label().startswith("_")]
    for i, a in enumerate(lines):
        for b in lines[i + 1:]:
            xa, xb = np.asarray(a.get_xydata(), float), np.asarray(b.get_xydata(), float)
            if xa.shape == xb.shape and len(xa) > 1 and np.allclose(xa, xb, rtol=1e-3, equal_nan=True) \
                    and a.get_marker() == b.get_marker() and a.get_linestyle() == b.get_linestyle():
                out.append(f"line {b.get_label()!r} hides {a.get_label()!r}")
    return out


def assert_says_what_it_shows(drawn, count: int = 1, title: str = "") -> None:
    assert len(drawn) == count, f"{len(drawn)} figures saved"
    for fig, found in drawn:
        assert not found, found
        if title:
            assert re.search(title, fig._suptitle.get_text()), fig._suptitle.get_text()


# ---------------------------------------------------------------- the demo figure


def test_demo_figure_says_what_it_compares(tmp_path, drawn):
    # The demo's four jobs, with a small allreduce instead of ResNet50 (a second of simulation).
    import tomllib

    with (Path(inalab.__file__).parent / "scenarios" / "demo.toml").open("rb") as f:
        sc = tomllib.load(f)
    for j in sc["jobs"]:
        j.pop("model"), j.pop("compute_scale")
        j["allreduce"], j["iterations"] = "1MiB", 2
    sc["metrics"] = {"bin": "100us"}
    result = inalab.simulate(sc)
    demo_figure(result, tmp_path / "demo.png")
    assert_says_what_it_shows(drawn, title="switchml, atp, ps, ring")
    fig = drawn[0][0]
    util = fig.axes[2]
    assert "0.1 ms bin" in util.get_title() and "0.1 ms bin" in util.get_ylabel()  # the bin width is stated


# ---------------------------------------------------------------- the reproductions


def _tables(md: str) -> list[pd.DataFrame]:
    blocks, cur = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            cur.append(line)
        elif cur:
            blocks.append(cur)
            cur = []
    frames = []
    for b in blocks:
        if len(b) < 3:
            continue
        cols = [c.strip().strip("`") for c in b[0].strip().strip("|").split("|")]
        rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in b[2:]]
        df = pd.DataFrame([r for r in rows if len(r) == len(cols)], columns=cols)
        for c in df.columns:
            v = df[c].replace({"-": np.nan, "nan": np.nan, "True": True, "False": False})
            try:
                df[c] = pd.to_numeric(v)
            except (ValueError, TypeError):
                df[c] = v
        frames.append(df)
    return sorted(frames, key=lambda d: -d.shape[1])


def _fixed(name: str, frames: list[pd.DataFrame]) -> list[pd.DataFrame]:
    """Columns the write-up's table does not show, filled in as `run` would have them."""
    first = frames[0].copy()
    if name == "atp-congestion-control":
        rng = np.random.default_rng(0)
        first["series_t_ms"] = [np.arange(0, 80, 0.5) for _ in range(len(first))]
        first["series_gbps"] = [np.clip(g + rng.normal(0, 3, 160), 0, None) for g in first.worker_goodput_mean_gbps]
        return [first]
    if name == "atp-dynamic-vs-static":
        model = REPRODUCTIONS[name].model  # the tables show the main model's rows
        return [f.assign(pta=100) if "model" in f else f.assign(pta=100, model=model) for f in frames]
    if name == "atp-hash-vs-linear":
        return [f.assign(aggregators=4000) for f in frames]
    if name == "atp-single-job":
        rep = REPRODUCTIONS[name]
        per_model = next(f for f in frames if "compute_scale" not in f)  # images/s per worker, by scheme
        long = per_model.melt(id_vars="model", var_name="scheme", value_name="v")
        long["vs_best"] = long.v / long.groupby("model").v.transform("max")
        return [long.assign(compute_scale=rep.compute_scale, host_costs=bool(rep.host_costs))]
    if name == "canary-size":
        units = {"KiB": 1024, "MiB": 1024 ** 2, "B": 1}
        out = []
        for f in frames:
            if "size" in f:
                f = f.copy()
                f["bytes"] = [int(float(re.match(r"[\d.]+", s)[0]) * units[re.search(r"[KMi]*B$", s)[0]])
                              for s in f["size"]]
            out.append(f)
        return out
    if name == "dsa-policy-ablation":
        return [f.assign(policy=f.policy.fillna("-")) if "policy" in f else f for f in frames]
    return frames


@pytest.mark.parametrize("name", sorted(REPRODUCTIONS))
def test_every_reproduction_figure_says_what_it_compares(name, tmp_path, drawn):
    rep = REPRODUCTIONS[name]
    if name in RUN_FOR_REAL:
        rows = rep.run(lambda _msg: None)
        rep.plot(rows, tmp_path / f"{name}.png")
    else:
        md = DOCS / f"{name}.md"
        if not md.exists():
            pytest.skip(f"no write-up {md}")
        errors = []
        for rows in _fixed(name, _tables(md.read_text())):
            try:
                rep.plot(rows, tmp_path / f"{name}.png")
                break
            except (KeyError, AttributeError, ValueError, TypeError) as e:  # a table without the plot's columns
                errors.append(f"{type(e).__name__}: {e}")
                drawn.clear()
        else:
            pytest.skip(f"no table of {md.name} has the columns the plot needs: {errors}")
    # A paper's figure, section or equation, or the words that it is none.
    assert_says_what_it_shows(drawn, title=r"Figs?\. \d|§|no paper figure|eq\. \d")


def test_grid_large_scale_lines_that_coincide_stay_visible(tmp_path, drawn):
    # Fat tree (a): ATP and SwitchML have the same rates (both limited by the PS ingress).
    rep = GridLargeScale(workers=[20, 40], topologies=["fat-tree"])
    rows = rep.run(lambda _msg: None)
    a = rows[rows.scenario == "a"].set_index(["workers", "scheme"]).rate_gbps
    assert np.allclose(a.xs("atp", level="scheme"), a.xs("switchml", level="scheme"))
    rep.plot(rows, tmp_path / "gls.png")
    assert_says_what_it_shows(drawn, title="GRID Figs. 11-12")
    fig = drawn[0][0]
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes)  # one legend, outside
    titles = " ".join(ax.get_title() for ax in fig.axes)
    assert "(a) the ToRs programmable" in titles and "(b) 20 % of all switches programmable" in titles


def test_the_checks_catch_what_issue_20_found(tmp_path, drawn):
    """The old figures' faults, drawn on purpose, are all reported."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2)
    left.plot([1, 2, 3], [1, 2, 3], marker="o", label="atp")
    left.plot([1, 2, 3], [1, 2, 3], marker="o", label="switchml")  # hides atp
    left.set_xlabel("workers")
    left.set_ylabel("rate")  # no unit
    right.bar([0, 1], [5, 5], label="inalab")
    right.legend(loc="center")  # over the bars
    fig.savefig(tmp_path / "bad.png")
    plt.close(fig)
    found = " | ".join(drawn[0][1])
    for fault in ("no title", "no x label", "no unit", "hides 'atp'", "the legend covers bar"):
        assert fault in found, found
