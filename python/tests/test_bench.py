"""``inalab bench`` (issue #43) on a tiny matrix: two of the suite's scenarios, three schemes, one
seed. The table has its documented schema, every cell is a number or a reason (SwitchML cannot
aggregate a job that spans racks), and the same matrix gives the same table twice."""
from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from inalab import bench
from inalab.config import ConfigError

ONLY = ["1-one-job", "2-multi-tenant-memory"]
SCHEMES = ["ring", "switchml", "atp"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    return out, bench.run("small", out, seeds=1, only=ONLY, schemes=SCHEMES, workers=1, progress=False)


def test_the_table_has_one_row_per_cell_and_seed_with_the_documented_columns(tiny):
    out, table = tiny
    assert list(table.columns) == list(bench.TABLE_COLUMNS) and set(bench.COLUMN_DOCS) == set(bench.TABLE_COLUMNS)
    assert len(table) == len(ONLY) * len(SCHEMES)
    assert set(zip(table.scenario, table.scheme)) == {(s, c) for s in ONLY for c in SCHEMES}
    on_disk = pd.read_parquet(out / "bench.parquet")
    assert list(on_disk.columns) == list(bench.TABLE_COLUMNS) and len(on_disk) == len(table)
    for f in ("bench.csv", "summary.csv", "heatmap.png", "index.html"):
        assert (out / f).stat().st_size > 0, f
    page = (out / "index.html").read_text()
    assert "data:image/png;base64," in page and "SwitchML aggregates at one switch" in page


def test_every_cell_is_a_number_or_a_reason(tiny):
    _, table = tiny
    ok = table[table.status == "ok"]
    assert (ok.goodput_gbps > 0).all() and (ok.jct_s > 0).all() and (ok.jobs_finished == ok.jobs).all()
    assert ok.reason.isna().all()
    others = table[table.status != "ok"]
    assert (others.reason.str.len() > 0).all() and others.goodput_gbps.isna().all()
    # SwitchML aggregates at one ToR: a job over three racks cannot run; on one switch it can.
    spans = table[(table.scenario == "1-one-job") & (table.scheme == "switchml")].iloc[0]
    assert spans.status == "impossible" and "share a ToR" in spans.reason, spans
    one_switch = table[(table.scenario == "2-multi-tenant-memory") & (table.scheme == "switchml")].iloc[0]
    assert one_switch.status == "ok" and one_switch.absorbed_packets > 0
    # The INA schemes sum in the switches, ring on the hosts; each sends what it must.
    atp = table[(table.scenario == "1-one-job") & (table.scheme == "atp")].iloc[0]
    ring = table[(table.scenario == "1-one-job") & (table.scheme == "ring")].iloc[0]
    assert atp.absorbed_packets > 0 and ring.absorbed_packets == 0 and atp.host_tx_bytes < ring.host_tx_bytes
    summary = bench.summarize(table)
    assert summary[summary.scheme == "ring"].vs_ring.eq(1.0).all()
    assert summary[summary.vs_ring.isna()].reason.str.contains("impossible").all()
    assert "wins at" in bench.mechanism(table, "2-multi-tenant-memory")


def test_the_same_matrix_gives_the_same_table(tiny, tmp_path):
    _, first = tiny
    again = bench.run("small", tmp_path, seeds=1, only=ONLY, schemes=SCHEMES, workers=1, progress=False)
    pd.testing.assert_frame_equal(first.drop(columns="wall_s"), again.drop(columns="wall_s"))


def test_bad_options_name_the_field_and_the_allowed_values():
    with pytest.raises(ConfigError) as e:
        bench.cells("medium")
    assert e.value.field == "scale" and "'small'" in e.value.message
    with pytest.raises(ConfigError) as e:
        bench.cells("small", only=["nine-jobs"])
    assert e.value.field == "only" and "1-one-job" in e.value.message
    with pytest.raises(ConfigError) as e:
        bench.cells("small", schemes=["sharp"])
    assert e.value.field == "schemes" and "canary" in e.value.message
    with pytest.raises(ConfigError) as e:
        bench.cells("small", seeds=0)
    assert e.value.field == "seeds"


def test_every_scale_has_the_seven_conditions_and_every_file_sets_up_for_ring():
    for scale in bench.SCALES:
        files = bench.scenario_files(scale)
        assert len(files) == 7, (scale, list(files))
        pts, impossible, described = bench.cells(scale, seeds=1, schemes=["ring"])
        assert not impossible and len(pts) == 7 and all(described.values()), (scale, impossible)
        assert [p["params"]["scenario"] for p in pts] == list(files)


def test_the_command_lists_the_suite_and_refuses_a_bad_scale(tmp_path):
    listed = subprocess.run([sys.executable, "-m", "inalab", "bench", "--list"], capture_output=True, text=True)
    assert listed.returncode == 0 and "7-stragglers" in listed.stdout and "scheme canary" in listed.stdout, listed.stderr
    bad = subprocess.run([sys.executable, "-m", "inalab", "bench", "--out", str(tmp_path), "--scale", "huge"], capture_output=True, text=True)
    assert bad.returncode == 2 and "scale" in bad.stderr, bad.stderr
    missing = subprocess.run([sys.executable, "-m", "inalab", "bench"], capture_output=True, text=True)
    assert missing.returncode == 2 and "--out" in missing.stderr, missing.stderr
    no_workers = subprocess.run([sys.executable, "-m", "inalab", "bench", "--out", str(tmp_path), "--workers", "0"], capture_output=True, text=True)
    assert no_workers.returncode == 2 and "--workers" in no_workers.stderr, no_workers.stderr
    run = subprocess.run([sys.executable, "-m", "inalab", "bench", "--out", str(tmp_path / "b"), "--seeds", "1", "--only", "2-multi-tenant-memory",
                          "--schemes", "ring", "--json"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = json.loads(run.stdout.strip().splitlines()[-1])
    assert rows[0]["scheme"] == "ring" and rows[0]["vs_ring"] == 1.0


def test_a_cell_sets_every_jobs_scheme_and_only_the_servers_it_takes():
    import tomllib

    base = tomllib.loads(bench.scenario_files("small")["2-multi-tenant-memory"].read_text())
    ring = bench.cell_scenario(base, "ring", 2, "x")
    assert ring["seed"] == 2 and ring["name"] == "x" and all(j["scheme"] == "ring" and "servers" not in j for j in ring["jobs"])
    trees = bench.cell_scenario(base, "static_trees_4", 1)
    assert all(j["scheme"] == "static_tree" and j["ina"]["trees"] == 4 for j in trees["jobs"])
    grid = bench.cell_scenario(base, "grid", 1)
    # GRID's policy planned at set-up, one per job, for the job's own workers and PS.
    for job in grid["jobs"]:
        assert job["policy"]["kind"] == "grid-routing-policy" and job["policy"]["ps"] == job["servers"][0]
    assert bench.job_hosts(base) == sorted(f"h{i}" for i in range(15))


def test_a_run_that_raised_is_an_error_row_and_the_command_exits_3(tmp_path, monkeypatch):
    # A run that raises is inalab's failure, not a result: its row says so (status "error",
    # the exception), the table and page are still written, and the command exits 3, also
    # with --json (after printing the summary). Unfinished runs and impossible cells exit 0.
    import inalab
    from typer.testing import CliRunner

    from inalab.cli import app

    def broken(*_args, **_kwargs):
        raise RuntimeError("the simulator broke")

    monkeypatch.setattr(inalab, "_run", broken)
    for extra in ([], ["--json"]):
        out = tmp_path / f"b{len(extra)}"
        r = CliRunner().invoke(app, ["bench", "--out", str(out), "--seeds", "1", "--only", "2-multi-tenant-memory",
                                     "--schemes", "ring,switchml", "--workers", "1", *extra])
        assert r.exit_code == 3, r.output
        assert "error: 2-multi-tenant-memory / ring / seed 1" in r.output and "the simulator broke" in r.output, r.output
        table = pd.read_csv(out / "bench.csv")
        assert list(table.status) == ["error", "error"], table
        assert (out / "index.html").exists()
