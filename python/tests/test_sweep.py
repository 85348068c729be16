"""``inalab sweep``: points from a sweep file (linked axes too), every point checked before the
first runs, a parallel run into one Parquet dataset that pandas reads, points that did not
complete recorded as such without stopping the sweep (and failing the command), resumption,
another sweep's points refused, Ctrl-C, determinism, the plot helper, the CLI, the docs'
example, and Ray where it is installed."""
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
             "stop": ["5us", "1s"]},  # 5 us is too short for either allreduce: those points are unfinished
    "zip": {"jobs[0].workers": [4]},
}


def test_points_are_the_product_of_the_varied_values_and_seeds():
    pts = points(SPEC)
    assert len(pts) == 2 * 2 * 2 * 2
    assert len({p["id"] for p in pts}) == len(pts) and [p["id"] for p in pts] == [p["id"] for p in points(SPEC)]
    first = pts[0]
    assert first["params"] == {"jobs[0].allreduce": "256KiB", "topology.hosts": 4, "stop": "5us", "jobs[0].workers": 4, "seed": 1}
    assert first["scenario"]["jobs"][0]["allreduce"] == "256KiB" and first["scenario"]["topology"]["hosts"] == 4
    assert first["scenario"]["seed"] == 1 and pts[1]["scenario"]["seed"] == 2


def test_zipped_fields_vary_together_as_one_axis():
    spec = {"base": "ring-star-allreduce", "vary": {"jobs[0].allreduce": ["1MiB", "4MiB"]},
            "zip": [{"topology.hosts": [4, 8, 16], "jobs[0].workers": {"from": 4, "to": 16, "step": 6}}, {"stop": ["1s"]}]}
    pts = points(spec)
    assert len(pts) == 2 * 3
    assert {(p["params"]["topology.hosts"], p["params"]["jobs[0].workers"]) for p in pts} == {(4, 4), (8, 10), (16, 16)}
    assert all(p["scenario"]["topology"]["hosts"] == p["params"]["topology.hosts"] for p in pts)


@pytest.mark.parametrize("spec, field", [
    ({"base": "ring-star-allreduce", "vary": {"jobs[3].allreduce": ["1MiB"]}}, "vary.jobs[3].allreduce"),
    ({"base": "ring-star-allreduce", "vary": {"topology.hosts": []}}, "vary.topology.hosts"),
    ({"base": "ring-star-allreduce", "vary": {"topology.hosts": {"from": 8, "to": 4, "step": 1}}}, "vary.topology.hosts"),
    ({"base": "ring-star-allreduce", "seeds": 0}, "seeds"),
    ({"base": "ring-star-allreduce", "vary": {}, "points": 3}, "points"),
    ({"vary": {}}, "base"),
    ({"base": "no-such-scenario"}, "scenario"),
    ({"base": "ring-star-allreduce", "zip": {"topology.hosts": [4, 8], "jobs[0].workers": [4]}}, "zip"),
    ({"base": "ring-star-allreduce", "vary": {"stop": ["1s"]}, "zip": {"stop": ["2s"]}}, "zip.stop"),
    ({"base": "ring-star-allreduce", "zip": [{"stop": ["1s"]}, {"seed": [], "x": [1]}]}, "zip[1].seed"),
    ({"base": "ring-star-allreduce", "zip": 3}, "zip"),
])
def test_bad_sweeps_name_the_field(spec, field):
    with pytest.raises(ConfigError) as e:
        points(spec)
    assert e.value.field == field, str(e.value)


@pytest.mark.parametrize("vary, field, words", [
    # A typo in a varied field: every point would fail; refused before any runs, naming the allowed keys.
    ({"topology.hostz": [8, 16]}, "vary.topology.hostz", "unknown key; allowed keys here: kind, hosts"),
    # A value the scenario refuses, at one point of several.
    ({"network.buffer": ["1MiB", "-3B"]}, "vary.network.buffer", "network.buffer = '-3B'"),
    # A combination that cannot be placed: 16 workers on 8 hosts.
    ({"topology.hosts": [8, 16]}, "jobs[0].workers", "topology.hosts = 8"),
])
def test_every_point_is_checked_before_the_first_runs(tmp_path, vary, field, words):
    with pytest.raises(ConfigError) as e:
        inalab.sweep({"base": "ring-star-allreduce", "vary": vary}, tmp_path / "ds", workers=1, progress=False)
    assert e.value.field == field and words in str(e.value), str(e.value)
    assert not (tmp_path / "ds").exists(), "nothing ran, nothing was written"


def test_set_path_reaches_into_lists_and_makes_tables():
    d = {"jobs": [{"ina": {}}]}
    set_path(d, "jobs[0].ina.timeout", "2ms")
    set_path(d, "network.buffer_bytes", 5)
    assert d == {"jobs": [{"ina": {"timeout": "2ms"}}], "network": {"buffer_bytes": 5}}


def test_a_sweep_runs_in_parallel_records_points_that_did_not_complete_and_resumes(tmp_path):
    from inalab.sweeps import summarize

    out = tmp_path / "ds"
    df = inalab.sweep(SPEC, out, workers=2, progress=False)
    assert len(df) == 16 and set(df.status) == {"ok", "unfinished"}
    bad = df[df.status == "unfinished"]
    # An unfinished point is a failure in the dataset, not a result: no JCT, a reason.
    assert (bad.stop == "5us").all() and len(bad) == 8 and bad.jct_s.isna().all() and (bad.job_status == "unfinished").all()
    assert bad.error.str.contains("not finished at the stop time, 5 us").all()
    ok = df[df.status == "ok"]
    assert len(ok) == 8 and ok.finished.all() and (ok.jct_s > 0).all() and (ok.job_workers == 4).all()
    assert (ok.busbw_gbps / ok.goodput_gbps - 2 * 3 / 4).abs().max() < 1e-9  # NCCL's 2(n-1)/n, n = 4
    s = summarize(df)
    assert (s["points"], s["ok"], s["not_ok"], s["by_status"]) == (16, 8, 8, {"ok": 8, "unfinished": 8})
    assert sum(r["points"] for r in s["reasons"]) == 8 and all(r["status"] == "unfinished" for r in s["reasons"])
    # Bigger tensors take longer; seeds do not change a deterministic ring.
    by = ok.groupby("jobs[0].allreduce").jct_s.mean()
    assert by["1MiB"] > by["256KiB"]
    assert ok.groupby(["jobs[0].allreduce", "topology.hosts"]).jct_s.nunique().max() == 1
    # pandas reads the directory as one dataset.
    again = pd.read_parquet(out)
    assert len(again) == 16 and "topology.hosts" in again.columns
    # A rerun skips the points done and runs the others again.
    ok_files = {f: f.stat().st_mtime_ns for f in out.glob("point-*.parquet")
                if (pd.read_parquet(f).status == "ok").all()}
    seen = []
    inalab.sweep(SPEC, out, workers=2, progress=lambda done, total: seen.append((done, total)))
    assert seen[0] == (9, 16) and seen[-1] == (16, 16), seen  # 8 ok skipped, 8 unfinished re-run
    assert all(f.stat().st_mtime_ns == t for f, t in ok_files.items())


def test_another_sweeps_points_in_out_are_refused_unless_overwritten(tmp_path):
    # A second sweep into the same --out used to leave the first one's rows in pd.read_parquet(out).
    out = tmp_path / "ds"
    first = {"base": "ring-star-allreduce", "vary": {"jobs[0].allreduce": ["256KiB", "1MiB"]}}
    second = {"base": "ring-star-allreduce", "vary": {"jobs[0].allreduce": ["512KiB"]}}
    inalab.sweep(first, out, workers=1, progress=False)
    with pytest.raises(ConfigError) as e:
        inalab.sweep(second, out, workers=1, progress=False)
    assert e.value.field == "--out" and "--overwrite" in str(e.value)
    assert len(pd.read_parquet(out)) == 2, "the refused sweep wrote nothing"
    inalab.sweep(second, out, workers=1, progress=False, overwrite=True)
    assert pd.read_parquet(out)["jobs[0].allreduce"].tolist() == ["512KiB"]
    inalab.sweep(second, out, workers=1, progress=False)  # the same sweep again: resumed, not refused
    # More seeds keep the points already run (their files untouched).
    kept = {f: f.stat().st_mtime_ns for f in out.glob("point-*.parquet")}
    inalab.sweep({**second, "seeds": [1, 2]}, out, workers=1, progress=False)
    assert len(pd.read_parquet(out)) == 2 and all(f.stat().st_mtime_ns == t for f, t in kept.items())


def test_points_run_on_a_scenario_that_changed_since_are_not_reused(tmp_path):
    # Only the sweep file's text was compared: an edited base file kept its stale "ok" rows.
    base = tmp_path / "base.toml"
    base.write_text('[topology]\nkind = "star"\nhosts = 4\n[[jobs]]\nname = "r"\nscheme = "ring"\nallreduce = "1MiB"\n'
                    'workers = 4\n')
    spec = {"base": str(base), "vary": {"jobs[0].iterations": [1, 2]}}
    out = tmp_path / "ds"
    inalab.sweep(spec, out, workers=1, progress=False)
    base.write_text(base.read_text().replace("1MiB", "2MiB"))
    with pytest.raises(ConfigError, match="2 run on a scenario that differs"):
        inalab.sweep(spec, out, workers=1, progress=False)
    df = inalab.sweep(spec, out, workers=1, progress=False, overwrite=True)
    assert (pd.read_parquet(out).bytes_per_iteration == 2 << 20).all() and len(df) == 2


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


def test_the_plot_says_when_a_point_is_a_mean_of_fewer_seeds():
    # It said "mean of 2 seeds" where one seed of a point was not ok and left out.
    from inalab.sweeps import plot

    df = pd.DataFrame({"point": list("abcd"), "x": [1, 1, 2, 2], "seed": [1, 2, 1, 2], "jct_s": [1.0, 3.0, 2.0, None],
                       "status": ["ok", "ok", "ok", "unfinished"]})
    assert "mean of 1-2 of 2 seeds: the runs not ok are left out" in plot(df, x="x")._suptitle.get_text().replace("\n", " ")
    assert "mean of 2 seeds," in plot(df[df.x == 1], x="x")._suptitle.get_text()


def test_cli_sweep_prints_a_summary_and_refuses_bad_files(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('base = "ring-star-allreduce"\n[vary]\n"jobs[0].allreduce" = ["256KiB", "1MiB"]\n')
    r = subprocess.run([sys.executable, "-m", "inalab", "sweep", str(f), "--out", str(tmp_path / "o"), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"out": str(tmp_path / "o"), "points": 2, "ok": 2, "not_ok": 0, "by_status": {"ok": 2},
                                    "rows": 2, "reasons": []}
    assert len(load(tmp_path / "o")) == 2
    # A point that did not complete fails the command (3), counted by reason.
    f.write_text('base = "ring-star-allreduce"\n[vary]\nstop = ["2us", "1s"]\n')
    r = subprocess.run([sys.executable, "-m", "inalab", "sweep", str(f), "--out", str(tmp_path / "o3")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    assert "2 points (1 ok, 1 unfinished)" in " ".join(r.stdout.split()), r.stdout
    assert "1 unfinished: ring-4MiB: unfinished: not finished at the stop time, 2 us" in r.stderr
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


def test_a_measure_gives_its_own_rows_and_unfinished_points_stay_in_the_dataset(tmp_path):
    from inalab.sweeps import run_points

    spec = {"base": "ring-star-allreduce", "vary": {"stop": ["1s", "3us"]}, "zip": {"topology.hosts": [4], "jobs[0].workers": [4]}}
    df = run_points(points(spec), tmp_path / "ds", workers=2, measure=links_used, progress=False)
    ok, bad = df[df.status == "ok"], df[df.status == "unfinished"]
    assert len(ok) == 8 and ok.link.str.contains("->").all() and (ok.tx_bytes > 0).all()  # 4 hosts, both ways
    assert len(bad) >= 1 and (bad.stop == "3us").all() and bad.error.str.contains("3 us").all()


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


def test_ctrl_c_stops_a_sweep_at_once_and_leaves_no_worker(tmp_path):
    # Nothing checked for signals: a sweep ran on after ^C, its pool's workers with it.
    import os
    import signal
    import time

    from inalab.stop import descendants

    f = tmp_path / "slow.toml"
    f.write_text('base = "ring-star-allreduce"\n[vary]\n"jobs[0].allreduce" = ["1GiB", "2GiB", "3GiB"]\n')
    out = tmp_path / "o"
    p = subprocess.Popen([sys.executable, "-m", "inalab", "sweep", str(f), "--out", str(out), "--workers", "2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(descendants([p.pid])) < 2:  # both workers simulating
        time.sleep(0.2)
    workers = descendants([p.pid])
    assert len(workers) >= 2, "the pool started"
    time.sleep(1.0)
    t = time.monotonic()
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=30)
    assert p.returncode == 130, stderr
    assert time.monotonic() - t < 10, "stopped within seconds, not after the points (each takes minutes)"
    assert "interrupted by Ctrl-C (SIGINT)" in stderr
    time.sleep(0.5)
    assert not [w for w in workers if os.path.exists(f"/proc/{w}") and state(w) != "Z"], "no worker left running"


def state(pid: int) -> str:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return "gone"
    return stat[stat.rfind(")") + 2:].split()[0]


def _sweep_process(tmp_path, sizes: list[str]):
    f = tmp_path / "s.toml"
    f.write_text(f'base = "ring-star-allreduce"\n[vary]\n"jobs[0].allreduce" = {json.dumps(sizes)}\n')
    out = tmp_path / "o"
    p = subprocess.Popen([sys.executable, "-m", "inalab", "sweep", str(f), "--out", str(out), "--workers", "2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p, out


def _wait(what: str, cond, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_ctrl_c_with_a_worker_idle_stops_the_sweep(tmp_path):
    # With fewer points left than workers, a multiprocessing.Pool's idle worker held the task
    # queue's lock when it was killed, and the sweep hung for ever (later signals ignored).
    import signal
    import time

    from inalab.stop import descendants

    p, out = _sweep_process(tmp_path, ["1KiB", "2KiB", "2GiB"])
    _wait("the two small points", lambda: len(list(out.glob("point-*.parquet"))) >= 2)
    seen = descendants([p.pid])
    time.sleep(0.5)
    t = time.monotonic()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130 and time.monotonic() - t < 10, err
    time.sleep(0.3)
    assert not [w for w in seen if state(w) not in ("gone", "Z")], "no worker left"


def test_a_worker_that_dies_stops_the_sweep_with_an_error_not_a_hang(tmp_path):
    # A Pool replaced a dead worker (the OOM killer's victim), lost its point and waited for ever.
    import os
    import signal

    from inalab.stop import descendants

    p, out = _sweep_process(tmp_path, ["1KiB", "2KiB", "2GiB", "4KiB"])
    _wait("the small points", lambda: len(list(out.glob("point-*.parquet"))) >= 3)
    _wait("a worker simulating", lambda: len(descendants([p.pid])) >= 1)
    for w in descendants([p.pid]):
        os.kill(w, signal.SIGKILL)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1, err
    assert "a worker process died while simulating" in " ".join(err.split()), err


def test_the_docs_example_runs_as_written_and_its_plot_varies(tmp_path):
    # docs/sweeps.md's example varied topology.hosts under a 16-worker job: 6 of 24 points
    # failed and the other 18 were identical. Its sweep file and plot call, run as written:
    import re
    from pathlib import Path

    from inalab.sweeps import plot

    doc = (Path(__file__).resolve().parents[2] / "docs" / "sweeps.md").read_text()
    toml = re.search(r"```toml\n# sweep.toml\n(.*?)```", doc, re.S).group(1)
    call = re.search(r"(inalab\.sweeps\.plot\(df, .*?\))", doc).group(1)
    (tmp_path / "sweep.toml").write_text(toml)
    df = inalab.sweep(tmp_path / "sweep.toml", tmp_path / "out", workers=2, progress=False)
    assert (df.status == "ok").all(), df[df.status != "ok"].error.tolist()
    fig = eval(call.replace('path="p.png"', "path=tmp_path / 'p.png'"), {"inalab": inalab, "df": df, "tmp_path": tmp_path})
    lines = [l.get_ydata() for l in fig.axes[0].get_lines()]
    assert len(lines) >= 2 and all(len(set(y)) == len(y) > 1 for y in lines), "every line varies along x"
    assert len({tuple(y) for y in lines}) == len(lines), "and the lines differ"
