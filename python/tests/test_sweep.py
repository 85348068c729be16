"""``inalab sweep``: points from a sweep file, a parallel run into one Parquet dataset that
pandas reads, failed points recorded without stopping the sweep, resumption, determinism,
the plot helper, the CLI, and Ray where it is installed."""
from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

import inalab
from inalab.config import ConfigError
from inalab.sweeps import load, points, set_path

SPEC = {
    "base": "ring-star-allreduce",
    "seeds": 2,
    "vary": {"jobs[0].allreduce": ["256KiB", "1MiB"], "topology.hosts": {"from": 4, "to": 8, "step": 4},
             "jobs[0].workers": [4, 99]},  # 99 workers do not fit: those points fail
}


def test_points_are_the_product_of_the_varied_values_and_seeds():
    pts = points(SPEC)
    assert len(pts) == 2 * 2 * 2 * 2
    assert len({p["id"] for p in pts}) == len(pts) and [p["id"] for p in pts] == [p["id"] for p in points(SPEC)]
    first = pts[0]
    assert first["params"] == {"jobs[0].allreduce": "256KiB", "topology.hosts": 4, "jobs[0].workers": 4, "seed": 1}
    assert first["scenario"]["jobs"][0]["allreduce"] == "256KiB" and first["scenario"]["topology"]["hosts"] == 4
    assert first["scenario"]["seed"] == 1 and pts[1]["scenario"]["seed"] == 2


@pytest.mark.parametrize("spec, field", [
    ({"base": "ring-star-allreduce", "vary": {"jobs[3].allreduce": ["1MiB"]}}, "vary.jobs[3].allreduce"),
    ({"base": "ring-star-allreduce", "vary": {"topology.hosts": []}}, "vary.topology.hosts"),
    ({"base": "ring-star-allreduce", "vary": {"topology.hosts": {"from": 8, "to": 4, "step": 1}}}, "vary.topology.hosts"),
    ({"base": "ring-star-allreduce", "seeds": 0}, "seeds"),
    ({"base": "ring-star-allreduce", "vary": {}, "points": 3}, "points"),
    ({"vary": {}}, "base"),
    ({"base": "no-such-scenario"}, "scenario"),
])
def test_bad_sweeps_name_the_field(spec, field):
    with pytest.raises(ConfigError) as e:
        points(spec)
    assert e.value.field == field, str(e.value)


def test_set_path_reaches_into_lists_and_makes_tables():
    d = {"jobs": [{"ina": {}}]}
    set_path(d, "jobs[0].ina.timeout", "2ms")
    set_path(d, "network.buffer_bytes", 5)
    assert d == {"jobs": [{"ina": {"timeout": "2ms"}}], "network": {"buffer_bytes": 5}}


def test_a_sweep_runs_in_parallel_records_failures_and_resumes(tmp_path):
    out = tmp_path / "ds"
    df = inalab.sweep(SPEC, out, workers=2, progress=False)
    assert len(df) == 16 and set(df.status) == {"ok", "error"}
    bad = df[df.status == "error"]
    assert (bad["jobs[0].workers"] == 99).all() and bad.error.str.contains("needs 99 free hosts").all()
    ok = df[df.status == "ok"]
    assert len(ok) == 8 and ok.finished.all() and (ok.jct_s > 0).all() and (ok.job_workers == 4).all()
    # Bigger tensors take longer; seeds do not change a deterministic ring.
    by = ok.groupby("jobs[0].allreduce").jct_s.mean()
    assert by["1MiB"] > by["256KiB"]
    assert ok.groupby(["jobs[0].allreduce", "topology.hosts"]).jct_s.nunique().max() == 1
    # pandas reads the directory as one dataset.
    again = pd.read_parquet(out)
    assert len(again) == 16 and "topology.hosts" in again.columns
    # A rerun skips the points done and retries the failed ones.
    ok_files = {f: f.stat().st_mtime_ns for f in out.glob("point-*.parquet")
                if (pd.read_parquet(f).status == "ok").all()}
    seen = []
    inalab.sweep(SPEC, out, workers=2, progress=lambda done, total: seen.append((done, total)))
    assert seen[0] == (9, 16) and seen[-1] == (16, 16), seen  # 8 ok skipped, 8 failed re-run
    assert all(f.stat().st_mtime_ns == t for f, t in ok_files.items())


def test_same_sweep_same_numbers(tmp_path):
    spec = {"base": "ring-star-allreduce", "vary": {"jobs[0].allreduce": ["512KiB"]}, "seeds": [3]}
    a = inalab.sweep(spec, tmp_path / "a", workers=1, progress=False)
    b = inalab.sweep(spec, tmp_path / "b", workers=2, progress=False)
    assert a.jct_s.tolist() == b.jct_s.tolist()


def test_plot_draws_from_the_dataset(tmp_path):
    df = inalab.sweep({"base": "ring-star-allreduce", "vary": {"jobs[0].allreduce": ["256KiB", "1MiB"]}},
                      tmp_path / "ds", workers=1, progress=False)
    from inalab.sweeps import plot

    fig = plot(df, x="jobs[0].allreduce", y="jct_s", path=tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000 and fig.axes[0].get_ylabel() == "jct_s (s)"
    assert fig.axes[0].get_xlabel() == "jobs[0].allreduce" and "jct_s against jobs[0].allreduce" in fig._suptitle.get_text()


def test_cli_sweep_prints_a_summary_and_refuses_bad_files(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('base = "ring-star-allreduce"\n[vary]\n"jobs[0].allreduce" = ["256KiB", "1MiB"]\n')
    r = subprocess.run([sys.executable, "-m", "inalab", "sweep", str(f), "--out", str(tmp_path / "o"), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"out": str(tmp_path / "o"), "points": 2, "failed": 0, "rows": 2}
    assert len(load(tmp_path / "o")) == 2
    f.write_text('base = "ring-star-allreduce"\nrepeat = 3\n')
    r = subprocess.run([sys.executable, "-m", "inalab", "sweep", str(f), "--out", str(tmp_path / "o2")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "repeat: unknown key" in r.stderr, r.stderr


def test_a_sweep_runs_on_a_local_ray_instance(tmp_path):
    try:
        import ray  # noqa: F401
    except ImportError:
        print("\nskipping the Ray sweep: Ray is not installed (pip install 'inalab[ray]')")
        pytest.skip("Ray is not installed")
    spec = {"base": "ring-star-allreduce", "vary": {"jobs[0].allreduce": ["256KiB", "1MiB"]}}
    df = inalab.sweep(spec, tmp_path / "ds", ray="local", progress=False)
    local = inalab.sweep(spec, tmp_path / "ds2", workers=1, progress=False)
    assert df.jct_s.tolist() == local.jct_s.tolist()


def links_used(r) -> list[dict]:
    """A measure: one row per link direction that carried bytes."""
    return [{"link": f"{l.src}->{l.dst}", "tx_bytes": int(l.tx_bytes)} for l in r.links.itertuples() if l.tx_bytes > 0]


def test_a_measure_gives_its_own_rows_and_failed_points_stay_in_the_dataset(tmp_path):
    from inalab.sweeps import run_points

    spec = {"base": "ring-star-allreduce", "vary": {"jobs[0].workers": [4, 99]}}
    df = run_points(points(spec), tmp_path / "ds", workers=2, measure=links_used, progress=False)
    ok, bad = df[df.status == "ok"], df[df.status == "error"]
    assert len(ok) == 8 and ok.link.str.contains("->").all() and (ok.tx_bytes > 0).all()  # 4 hosts, both ways
    assert len(bad) == 1 and bad.tx_bytes.isna().all() and "99" in bad.error.iloc[0]


def failing_measure(r) -> list[dict]:
    """A measure that fails on small jobs (as one reading a field a run lacks would)."""
    if r.jobs.workers.iloc[0] < 4:
        raise KeyError("field_the_run_lacks")
    return [{"jct": float(r.jobs.jct_s.iloc[0])}]


def test_a_failing_measure_is_its_points_error_not_the_sweeps_end(tmp_path):
    # A measure that raised used to end the whole sweep with the exception.
    from inalab.sweeps import run_points

    spec = {"base": "ring-star-allreduce", "vary": {"jobs[0].workers": [2, 4]}}
    df = run_points(points(spec), tmp_path / "ds", workers=2, measure=failing_measure, progress=False)
    assert sorted(df.status) == ["error", "ok"]
    assert "field_the_run_lacks" in df[df.status == "error"].error.iloc[0]
