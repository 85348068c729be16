"""What a new user reads (issue 20): compute-bound jobs are flagged, GRID's feasible rate is the
headline with the LP bound labelled as such, tables fit 80 columns without cut headers, and the
help texts describe what the commands do."""
from __future__ import annotations

import json
import re
import tomllib

import pytest
from rich.console import Console
from typer.testing import CliRunner

import inalab
from inalab import cli
from inalab.cli import app
from inalab.config import shipped_scenarios
from inalab.results import COMPUTE_BOUND_SHARE

runner = CliRunner()

# One ResNet50 job at the profiled GPU's speed (compute hides the 100 Gbps ring) and one 100x
# faster (the network is what it waits on); a second of simulation.
COMPUTE_AND_NETWORK = """
name = "compute-and-network"
stop = "2s"

[topology]
kind = "star"
hosts = 4
link_rate = "100Gbps"

[[jobs]]
name = "compute-bound-resnet"
scheme = "ring"
model = "resnet50"
iterations = 1
workers = 2

[[jobs]]
name = "network-bound-resnet"
scheme = "ring"
model = "resnet50"
compute_scale = 0.01
iterations = 1
workers = 2
"""


@pytest.fixture
def narrow(monkeypatch):
    """The CLI's stdout console at 80 columns, whatever the terminal the tests run in."""
    monkeypatch.setattr(cli, "out_console", Console(width=80))


def fits_80_columns(text: str) -> None:
    assert "…" not in text, text  # nothing cut with an ellipsis
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80, text


@pytest.fixture(scope="module")
def two_jobs(tmp_path_factory):
    path = tmp_path_factory.mktemp("sc") / "compute-and-network.toml"
    path.write_text(COMPUTE_AND_NETWORK)
    return path


def test_the_result_flags_a_compute_bound_job_and_not_a_network_bound_one(two_jobs):
    r = inalab.simulate(str(two_jobs))
    jobs = r.jobs.set_index("name")
    compute, network = jobs.loc["compute-bound-resnet"], jobs.loc["network-bound-resnet"]
    assert compute.comm_share == pytest.approx(compute.comm_busy_s / compute.jct_s)
    assert compute.comm_share < COMPUTE_BOUND_SHARE and bool(compute.compute_bound)
    assert network.comm_share > 0.5 and not bool(network.compute_bound)
    summary = {j["name"]: j for j in r.summary()["jobs"]}
    assert summary["compute-bound-resnet"]["compute_bound"] is True
    assert summary["network-bound-resnet"]["compute_bound"] is False


def test_simulate_prints_the_communication_share_and_names_compute_bound_jobs(two_jobs, narrow):
    r = runner.invoke(app, ["simulate", str(two_jobs)])
    assert r.exit_code == 0, r.output
    fits_80_columns(r.stdout)
    assert "comm" in r.stdout and "%" in r.stdout
    note = r.stdout[r.stdout.index("compute-bound ("):]
    assert "compute-bound-resnet" in note and "network-bound-resnet" not in note
    r = runner.invoke(app, ["simulate", str(two_jobs), "--json"])
    jobs = json.loads(r.stdout.strip().splitlines()[-1])["jobs"]
    assert [j["compute_bound"] for j in jobs] == [True, False] and all(0 < j["comm_share"] <= 1 for j in jobs)


def test_the_job_table_fits_80_columns_with_long_names(tmp_path, narrow):
    jobs = "".join(f'[[jobs]]\nname = "resnet50-switchml-{i}"\nscheme = "ring"\nallreduce = "64KiB"\n'
                   f'iterations = 1\nworkers = 4\n\n' for i in range(2))
    path = tmp_path / "long.toml"
    path.write_text(f'name = "long-names"\n\n[topology]\nkind = "star"\nhosts = 8\n\n{jobs}')
    r = runner.invoke(app, ["simulate", str(path)])
    assert r.exit_code == 0, r.output
    fits_80_columns(r.stdout)
    assert "resnet50-switchml-0" in r.stdout  # whole, not "resnet50-sw…"


# #38's chain: W1..W3 - S1 (6 Gbps) - S2 (9 Gbps) - PS over 10 Gbps. LP bound 20/3; the best
# integral plan 4.5 (two workers at S2).
CHAIN_TOML = """
name = "chain"
workers = ["W1", "W2", "W3"]
ps = "PS"
ps_ingress = "10Gbps"
switch_capacity = { S1 = "6Gbps", S2 = "9Gbps" }
[topology]
kind = "edges"
programmable = "all"
nodes = [{ name = "W1", kind = "host" }, { name = "W2", kind = "host" }, { name = "W3", kind = "host" },
         { name = "PS", kind = "host" }, { name = "S1", kind = "switch" }, { name = "S2", kind = "switch" }]
links = [{ a = "W1", b = "S1", rate = "100Gbps" }, { a = "W2", b = "S1", rate = "100Gbps" },
         { a = "W3", b = "S1", rate = "100Gbps" }, { a = "S1", b = "S2", rate = "100Gbps" },
         { a = "S2", b = "PS", rate = "10Gbps" }]
"""


def test_analyze_headlines_grid_feasible_rate_and_labels_the_lp_bound(narrow, tmp_path):
    chain = tmp_path / "chain.toml"
    chain.write_text(CHAIN_TOML)
    r = runner.invoke(app, ["analyze", str(chain)])
    assert r.exit_code == 0, r.output
    fits_80_columns(r.stdout)
    for header in ("bottleneck", "rate", "LP", "bound"):
        assert header in r.stdout
    grid = next(line for line in r.stdout.splitlines() if re.match(r"\s*grid\s", line))
    cells = grid.split()
    assert cells[1] == "4.5" and cells[2] == "6.6667", grid  # rate 4.5 (feasible), LP bound 20/3
    text = " ".join(r.stdout.split())
    assert "GRID's LP bound: 6.6667 Gbps" in text and "MILP optimal" in text and "one R-GRIA draw:" in text, text
    r = runner.invoke(app, ["analyze", str(chain), "--json"])
    g = {s["scheme"]: s for s in json.loads(r.stdout.strip().splitlines()[-1])["schemes"]}["grid"]
    assert g["rate_gbps"] == pytest.approx(4.5) and g["lp_rate_gbps"] == pytest.approx(20 / 3)
    assert g["rate_gbps"] == pytest.approx(g["feasible_rate_gbps"])
    assert g["max_link_utilization"] <= 1 + 1e-9  # shown at the rate it can run at, not the LP's
    # The motivating example: the plan reaches the paper's 3 Gbps (one R-GRIA draw gave 1.5).
    r = runner.invoke(app, ["analyze", "grid-fig1", "--json"])
    schemes = {s["scheme"]: s for s in json.loads(r.stdout.strip().splitlines()[-1])["schemes"]}
    assert schemes["grid"]["rate_gbps"] == pytest.approx(3.0) and schemes["atp"]["rate_gbps"] == pytest.approx(39 / 16)


def test_wide_tables_fold_what_no_group_fits_and_never_read_cells_as_markup():
    import pandas as pd

    rows = pd.DataFrame({"name": ["grid-long-name", "[x] b"], "rate": [1.5, 2.0], "note": ["x" * 100, "y"]})
    console = Console(width=40, record=True)
    for table in cli._wide_table(rows, console):
        console.print(table)
    text = console.export_text()
    fits = [len(line.rstrip()) <= 40 for line in text.splitlines()]
    assert all(fits) and "…" not in text and "[x] b" in text, text
    assert "".join(line.split()[-1] for line in text.splitlines() if "xxx" in line) == "x" * 100, text


def test_a_reproductions_wide_table_wraps_into_column_groups_at_80_columns(tmp_path, narrow):
    # grid-motivating-example's 8 columns need 161; each group repeats the scheme column.
    r = runner.invoke(app, ["reproduce", "grid-motivating-example", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    fits_80_columns(r.stdout)
    columns = json.loads((tmp_path / "grid-motivating-example.json").read_text())["rows"][0].keys()
    headers = [line.split() for line in r.stdout.splitlines() if line.split()[:1] == ["scheme"]]
    assert len(headers) >= 2 and sorted(sum((h[1:] for h in headers), ["scheme"])) == sorted(columns), headers


def test_plan_grid_writes_the_feasible_rate_as_rate_gbps(tmp_path):
    # A path longer than the terminal is printed whole (a wrapped one failed in CI).
    out = tmp_path / ("a-long-folder-name-" * 4) / "policy.json"
    out.parent.mkdir()
    chain = tmp_path / "chain.toml"
    chain.write_text(CHAIN_TOML)
    r = runner.invoke(app, ["plan", "grid", str(chain), "--out", str(out)])
    assert r.exit_code == 0, r.output
    p = json.loads(out.read_text())
    assert p["rate_gbps"] == pytest.approx(4.5) == pytest.approx(p["feasible_rate_gbps"])
    assert p["lp_rate_gbps"] == pytest.approx(20 / 3)
    assert all(w["rate_gbps"] == pytest.approx(4.5) for w in p["workers"])
    assert p["search"]["milp"] == "optimal" and p["search"]["lp_gap"] == pytest.approx(0.325)
    assert f"wrote {out}: rate 4.5 Gbps per worker (LP bound 6.6667, the plan 32.5 % below it; found by " in r.stderr, r.stderr
    assert "MILP optimal" in r.stderr, r.stderr


def test_demo_help_describes_the_shipped_demo():
    r = runner.invoke(app, ["demo", "--help"])
    text = " ".join(r.stdout.split())
    with shipped_scenarios()["demo"].open("rb") as f:
        description = tomllib.load(f)["description"]
    assert "VGG16" not in text and "16-host star" not in text
    for word in ("ResNet50", "SwitchML", "ATP", "parameter server", "ring", "leaf-spine"):
        assert word in text and word in description


def test_switch_help_says_what_json_prints():
    r = runner.invoke(app, ["switch", "--help"])
    text = " ".join(r.stdout.split())
    assert "only the summary" not in text
    for event in ('"ready"', '"stats"', '"stopped"'):
        assert event in text
