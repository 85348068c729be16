"""The inalab command, end to end against the real simulator."""
import json

from typer.testing import CliRunner

import inalab
from inalab.cli import app

runner = CliRunner()
SUMMARY_KEYS = {"scenario", "seed", "sim_time_s", "wall_s", "events", "jobs"}
JOB_KEYS = {"id", "name", "scheme", "jct_s", "iterations", "goodput_gbps"}


def test_simulate_json_last_line_is_the_summary(tmp_path):
    r = runner.invoke(app, ["simulate", "ring-star-allreduce", "--json", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert SUMMARY_KEYS <= summary.keys()
    assert summary["scenario"] == "ring-star-allreduce"
    assert JOB_KEYS <= summary["jobs"][0].keys() and summary["jobs"][0]["jct_s"] > 0
    assert (tmp_path / "result.json").exists() and (tmp_path / "jobs.csv").exists()


def test_seed_override():
    r = runner.invoke(app, ["simulate", "ring-star-allreduce", "--json", "--seed", "7"])
    assert json.loads(r.stdout.strip().splitlines()[-1])["seed"] == 7


def test_human_output_has_the_job_table():
    r = runner.invoke(app, ["simulate", "incast"])
    assert r.exit_code == 0, r.output
    assert "incast" in r.stdout and "16 flows" in r.stdout


def test_bad_scenario_exits_2_naming_the_field(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[topology]\nkind = "star"\nhosts = 4\nlink_rate = 100\n\n'
                   '[[flows]]\nsrc = "h0"\ndst = "h1"\nsize = "1KB"\n')
    r = runner.invoke(app, ["simulate", str(bad)])
    assert r.exit_code == 2
    assert r.stderr.strip().startswith("error: topology.link_rate: ")
    assert "Traceback" not in r.output


def test_missing_scenario_exits_2():
    r = runner.invoke(app, ["simulate", "no-such-scenario"])
    assert r.exit_code == 2 and "error: scenario: " in r.stderr and "demo" in r.stderr


def test_scenarios_lists_shipped_ones():
    r = runner.invoke(app, ["scenarios"])
    assert r.exit_code == 0
    for name in ("demo", "ring-star-allreduce", "canary-congestion", "incast"):
        assert name in r.stdout


def test_same_seed_same_result():
    a, b = (inalab.simulate("incast", seed=3).raw for _ in range(2))
    for r in (a, b):
        r.pop("wall_s")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_result_tables():
    res = inalab.simulate("ring-star-allreduce")
    assert list(res.jobs["name"]) == ["ring-4MiB"]
    assert not res.links.empty and {"src", "dst", "utilization"} <= set(res.links.columns)
    assert {"t_s", "metric", "entity", "value"} <= set(res.timeseries.columns)
    assert res.summary()["jobs"][0]["name"] == "ring-4MiB"
