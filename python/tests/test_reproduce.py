"""The reproduction registry and the `inalab reproduce` / `analyze` / `plan` commands."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from inalab.cli import app
from inalab.reproduce import REPRODUCTIONS, reproduce
from inalab.reproduce.grid_large_scale import GridLargeScale

runner = CliRunner()


def test_registry_objects():
    assert {"grid-motivating-example", "grid-large-scale", "rina-incremental"} <= set(REPRODUCTIONS)
    for rep in REPRODUCTIONS.values():
        assert rep.name and rep.claim and callable(rep.run) and callable(rep.holds) and callable(rep.explain)
        assert rep.figure and rep.tolerance  # the report's columns


def test_motivating_example_json(tmp_path, monkeypatch):
    monkeypatch.setattr("inalab.reproduce.DOCS_DIR", tmp_path / "docs")
    r = runner.invoke(app, ["reproduce", "grid-motivating-example", "--json", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert {"name", "paper", "figure", "claim", "tolerance", "rows", "holds", "checks"} <= set(last)
    assert last["name"] == "grid-motivating-example" and last["holds"] is True
    rates = {row["scheme"]: row["rate_gbps"] for row in last["rows"]}
    assert rates["atp"] == 2.4375
    assert (tmp_path / "grid-motivating-example.png").exists()
    assert "Claim" in (tmp_path / "grid-motivating-example.md").read_text()  # the write-up goes to --out
    assert not (tmp_path / "docs").exists()  # docs only with --update-docs


def test_unknown_reproduction_lists_names():
    r = runner.invoke(app, ["reproduce", "nope"])
    assert r.exit_code == 2
    assert "grid-motivating-example" in r.output and "rina-incremental" in r.output


def test_rina_incremental_holds(tmp_path):
    res = reproduce("rina-incremental", out=tmp_path, docs=tmp_path)
    assert res["holds"] is True


def test_large_scale_small_variant(tmp_path):
    rep = GridLargeScale(workers=[20], topologies=["fat-tree"])
    rows = rep.run(lambda m: None)
    assert len(rows) == 8  # 2 scenarios x 4 schemes
    assert rep.holds(rows)
    geryon = rows[rows.scheme == "geryon"].rate_gbps
    assert (abs(geryon - 100 / 20) < 1e-6).all()  # the PS ingress shared by 20 streams
    assert "Where and why" in rep.explain(rows)


def test_analyze_and_plan_commands(tmp_path):
    r = runner.invoke(app, ["analyze", "grid-fig1", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert {s["scheme"] for s in d["schemes"]} == {"geryon", "atp", "switchml", "grid"}
    out = tmp_path / "policy.json"
    r = runner.invoke(app, ["plan", "grid", "grid-fig1", "--out", str(out), "--seed", "2"])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["seed"] == 2
    r = runner.invoke(app, ["analyze", str(tmp_path / "missing.toml")])
    assert r.exit_code == 2 and "scenario" in r.output
