"""One scenario format: `inalab analyze` / `plan` take a simulate scenario as well as an analysis
scenario, and `inalab scenarios` lists every shipped scenario with what it is for (issue #35)."""
from __future__ import annotations

import json
import tomllib
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

import inalab
from inalab.analysis import analyze, load_analysis
from inalab.cli import app
from inalab.config import SCENARIO_DIR, load_scenario, shipped_scenarios
from inalab.errors import ConfigError

runner = CliRunner()

FIG1_COLUMNS = ("rate_gbps", "lp_rate_gbps", "switch_aggregation_gbps", "ps_aggregation_gbps")


def _fig1_sim(**network) -> dict:
    """emulate-grid-fig1 (GRID's Fig. 1 at 1/100 of its rates, a simulate scenario) as a table,
    its policy file path made absolute, with ``network`` set if given."""
    path = shipped_scenarios()["emulate-grid-fig1"]
    d = tomllib.loads(path.read_text())
    d["jobs"][0]["policy"] = str(path.parent / d["jobs"][0]["policy"])
    if network:
        d["network"] = network
    return d


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _assert_fig1_scaled(a, fig1, factor: float = 0.01) -> None:
    """The same plan shape as grid-fig1, every rate multiplied by ``factor``."""
    got, want = a.summary.set_index("scheme"), fig1.summary.set_index("scheme")
    assert list(got.index) == list(want.index) == ["geryon", "atp", "switchml", "grid"]
    for scheme in want.index:
        for col in FIG1_COLUMNS:
            w = want.loc[scheme, col]
            if w != w:  # no LP bound for the fixed-route schemes
                assert got.loc[scheme, col] != got.loc[scheme, col]
            else:
                assert got.loc[scheme, col] == pytest.approx(w * factor, rel=1e-6), (scheme, col)
        assert got.loc[scheme, "switches_used"] == want.loc[scheme, "switches_used"]
        assert got.loc[scheme, "workers"] == want.loc[scheme, "workers"] == 8
    # GRID's plan loads its capacities by the same factors (the best plan fits them: 3 of 3 Gbps). Which
    # one may differ: the LP's optimum is not unique, and HiGHS may return another at 1/100 of the
    # rates, which R-GRIA then rounds differently.
    assert max(a.plan.violations.values()) == pytest.approx(max(fig1.plan.violations.values()))
    assert a.plan.result.extra["feasible_rate_gbps"] == pytest.approx(
        fig1.plan.result.extra["feasible_rate_gbps"] * factor)
    for w, (node, path, _) in a.plan.assignment.items():
        assert a.plan.problem.name(node) in ("S1", "S2", "S3") and a.plan.problem.name(path[0]).startswith("W")


# ---------------------------------------------------------------- analyze and plan of a simulate scenario


@pytest.fixture(scope="module")
def fig1():
    return analyze("grid-fig1")


def test_simulate_version_of_fig1_gives_grid_fig1_scaled(fig1):
    # The shipped simulate scenario whose switches are charged GRID's 9 Gbps / 100.
    notes: list[str] = []
    a = analyze("emulate-grid-fig1-atp", notes=notes)
    _assert_fig1_scaled(a, fig1)
    assert a.name == "emulate-grid-fig1-atp"
    # emulate-grid-fig1 with the same capacities (a dict, as written by a user)
    caps = {"S1": "90Mbps", "S2": "90Mbps", "S3": "90Mbps"}
    _assert_fig1_scaled(analyze(_fig1_sim(switch_capacity=caps), notes=[]), fig1)


def test_shipped_emulate_grid_fig1_unlisted_switches_get_the_analysis_default(fig1):
    # emulate-grid-fig1 lists no switch_capacity: its switches get 3.2 Tbps (docs/analysis.md), so
    # only the links bound the schemes that aggregate; the LP bound and Geryon are Fig. 1's / 100.
    a = analyze("emulate-grid-fig1", notes=[]).summary.set_index("scheme")
    want = fig1.summary.set_index("scheme")
    assert a.loc["geryon", "rate_gbps"] == pytest.approx(want.loc["geryon", "rate_gbps"] / 100)
    assert a.loc["grid", "lp_rate_gbps"] == pytest.approx(want.loc["grid", "lp_rate_gbps"] / 100)
    for scheme in ("atp", "switchml", "grid"):
        assert a.loc[scheme, "rate_gbps"] == pytest.approx(0.03)
    sc = load_analysis("emulate-grid-fig1", notes=[])
    assert sc.switch_capacity == {} and sc.default_switch_capacity == 3_200_000_000_000
    assert sc.workers == [f"W{i}" for i in range(1, 9)] and sc.ps == "PS"


def test_analyze_and_plan_cli_take_a_simulate_scenario(tmp_path, fig1):
    # shipped, by name
    r = runner.invoke(app, ["analyze", "emulate-grid-fig1-atp", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout.strip().splitlines()[-1])
    rates = {s["scheme"]: s["rate_gbps"] for s in d["schemes"]}
    assert rates["atp"] == pytest.approx(39 / 16 / 100) and rates["geryon"] == pytest.approx(0.01)
    # nothing silently dropped: the workload and scheme parameters are named in a note on stderr
    assert "note: ignored by the flow model" in r.stderr and "jobs[0].allreduce" in r.stderr
    assert "jobs[0].ina" in r.stderr and d["notes"]
    # written to a file, planned, and the policy runs in that same scenario
    path = _write(tmp_path, "fig1.toml", tomllib_dump(_fig1_sim()))
    out = tmp_path / "policy.json"
    r = runner.invoke(app, ["plan", "grid", str(path), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "jobs[0].policy" in r.stderr  # the job's own policy is not what the planner uses
    policy = json.loads(out.read_text())
    assert policy["ps"] == "PS" and len(policy["workers"]) == 8
    assert policy["lp_rate_gbps"] == pytest.approx(0.03)
    sim = _fig1_sim()
    sim["jobs"][0]["policy"] = str(out)
    assert load_scenario(sim).to_spec()["jobs"][0]["policy"]["workers"]
    # the analysis format is still accepted, without notes
    r = runner.invoke(app, ["analyze", "grid-fig1", "--json"])
    assert r.exit_code == 0 and "note:" not in r.stderr
    assert "notes" not in json.loads(r.stdout.strip().splitlines()[-1])


def tomllib_dump(d: dict) -> str:
    """A small TOML writer for the tables these tests build (strings, numbers, lists, tables)."""
    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"
        raise TypeError(v)
    return "\n".join(f"{json.dumps(k)} = {value(v)}" for k, v in d.items()) + "\n"


MIXED = '''
name = "mixed"
seed = 3

[topology]
kind = "star"
hosts = 8
link_rate = "10Gbps"

[network]
buffer = "2MiB"
switch_capacity = { s0 = "20Gbps" }

[[jobs]]
name = "r"
scheme = "ring"
allreduce = "4MiB"
workers = ["h0", "h1"]

[[jobs]]
name = "a"
scheme = "atp"
allreduce = "4MiB"
workers = 3

[background]
hosts = 2
load = 0.1

[[failures]]
node = "s0"
at = "1ms"
until = "2ms"
'''


def test_hosts_are_placed_as_the_simulator_places_them_and_ignored_keys_are_noted(tmp_path):
    path = _write(tmp_path, "mixed.toml", MIXED)
    spec = load_scenario(path).to_spec()["jobs"][1]  # the simulator's placement of job "a"
    notes: list[str] = []
    sc = load_analysis(str(path), notes=notes)
    assert sc.workers == spec["workers"] == ["h2", "h3", "h4"] and sc.ps == spec["servers"][0] == "h5"
    assert sc.switch_capacity == {"s0": 20 * 10**9} and sc.seed == 3 and sc.name == "mixed"
    text = "\n".join(notes)
    for key in ("network.buffer", "jobs[1].allreduce", "jobs[0] ('r', scheme ring)", "background", "failures (1)"):
        assert key in text, (key, text)
    a = analyze(str(path), notes=[])
    assert set(a.workers.worker) == {"h2", "h3", "h4"}
    assert a.switches.set_index(["scheme", "switch"]).loc[("atp", "s0"), "capacity_gbps"] == pytest.approx(20)
    # on the command line: each note on stderr, the analysis on stdout
    r = runner.invoke(app, ["analyze", str(path)])
    assert r.exit_code == 0, r.output
    notes_out = [line for line in r.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes_out) == len(notes) and "failures" in r.stderr and "atp" in r.stdout


def test_library_issues_notes_as_warnings_without_a_list():
    from inalab.analysis import FlowModelNote

    with pytest.warns(FlowModelNote, match="jobs\\[0\\].allreduce"):
        a = inalab.analyze("emulate-grid-fig1-atp", schemes=["geryon"])
    assert a.notes and "jobs[0].allreduce" in a.notes[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got: list[str] = []
        inalab.analyze("emulate-grid-fig1-atp", schemes=["geryon"], notes=got)
        assert got
        inalab.analyze("grid-fig1", schemes=["geryon"])  # an analysis scenario has nothing to note


TWO_PS = '''
[topology]
kind = "star"
hosts = 8

[[jobs]]
name = "first"
scheme = "atp"
allreduce = "4MiB"
workers = "h0..h2"
servers = ["h3"]

[[jobs]]
name = "second"
scheme = "ps"
allreduce = "4MiB"
workers = ["h4", "h5"]
servers = ["h6", "h7"]

[[jobs]]
name = "third"
scheme = "ring"
allreduce = "4MiB"
workers = 2
'''


def test_job_choice_and_its_refusals(tmp_path):
    path = _two_ps_file(tmp_path)
    r = runner.invoke(app, ["analyze", path])
    assert r.exit_code == 2
    assert r.stderr.startswith("error: job: ") and "--job" in r.stderr
    assert "first" in r.stderr and "second" in r.stderr and "third" not in r.stderr
    with pytest.raises(ConfigError) as e:
        analyze(path)
    assert e.value.field == "job"
    # --job picks one; the other PS job is noted as ignored, as are the second job's extra servers
    notes: list[str] = []
    sc = load_analysis(path, job="second", notes=notes)
    assert sc.workers == ["h4", "h5"] and sc.ps == "h6"
    text = "\n".join(notes)
    assert "jobs[1].servers" in text and "'h7'" not in text and "h7 ignored" in text
    assert "jobs[1].scheme" in text and "'ps'" in text  # no flow model of scheme ps: said so
    assert "jobs[0] ('first', scheme atp)" in text and "jobs[2] ('third', scheme ring)" in text
    r = runner.invoke(app, ["analyze", path, "--job", "first", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["schemes"][0]["workers"] == 3
    r = runner.invoke(app, ["plan", "grid", path, "--job", "first"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["ps"] == "h3"
    # a job without a PS, and no such job
    r = runner.invoke(app, ["analyze", path, "--job", "third"])
    assert r.exit_code == 2 and "error: job: job 'third' (scheme ring) has no parameter server" in r.stderr
    assert "allowed values: first, second" in r.stderr
    r = runner.invoke(app, ["plan", "grid", path, "--job", "fourth"])
    assert r.exit_code == 2 and "error: job: no job named 'fourth'; allowed values: first, second" in r.stderr
    # --job on an analysis scenario
    r = runner.invoke(app, ["analyze", "grid-fig1", "--job", "first"])
    assert r.exit_code == 2 and r.stderr.startswith("error: job: applies only to a simulate scenario")


def _two_ps_file(tmp_path: Path) -> str:
    path = tmp_path / "two-ps.toml"
    path.write_text(TWO_PS.replace("hosts = 8", "hosts = 10"))
    return str(path)


def test_no_job_with_a_ps_is_refused_naming_why(tmp_path):
    r = runner.invoke(app, ["analyze", "ring-star-allreduce"])
    assert r.exit_code == 2
    assert r.stderr.startswith("error: jobs: ") and "parameter server" in r.stderr
    assert "(scheme ring)" in r.stderr and "atp" in r.stderr  # the job's scheme and the schemes that have a PS
    r = runner.invoke(app, ["plan", "grid", "incast"])
    assert r.exit_code == 2 and "no [[jobs]]" in r.stderr and "flows" in r.stderr


def test_errors_name_the_simulate_scenarios_fields():
    d = _fig1_sim(switch_capacity={"S1": "0Gbps"})
    with pytest.raises(ConfigError) as e:
        analyze(d, notes=[])
    assert e.value.field == "network.switch_capacity.S1"
    d = _fig1_sim()
    d["topology"]["nodes"] += [{"name": "W9", "kind": "host"}, {"name": "S4", "kind": "switch"}]
    d["topology"]["links"].append({"a": "W9", "b": "S4", "rate": "30Mbps"})
    d["jobs"][0]["workers"].append("W9")
    del d["jobs"][0]["policy"]
    with pytest.raises(ConfigError) as e:
        analyze(d, notes=[])
    assert e.value.field == "jobs[0].workers" and "W9" in str(e.value)
    # a capacity on a switch that is not programmable is noted, not dropped silently
    d = _fig1_sim(switch_capacity={"S1": "90Mbps", "S3": "90Mbps"})
    d["topology"]["programmable"] = ["S1", "S2"]
    del d["jobs"][0]["policy"]
    notes: list[str] = []
    sc = load_analysis(d, notes=notes)
    assert sc.switch_capacity == {"S1": 90 * 10**6}
    assert any(n.startswith("network.switch_capacity.S3: ignored") and "not programmable" in n for n in notes)
    # a switch that does not exist
    d = _fig1_sim(switch_capacity={"S9": "90Mbps"})
    with pytest.raises(ConfigError) as e:
        load_analysis(d, notes=[])
    assert e.value.field == "network.switch_capacity.S9"


def test_a_table_of_neither_format_is_one_error_naming_both(tmp_path):
    topo = {"kind": "star", "hosts": 4}
    with pytest.raises(ConfigError) as e:
        analyze({"name": "x", "topology": topo})
    msg = str(e.value)
    assert e.value.field == "scenario" and "simulate scenario" in msg and "analysis scenario" in msg
    assert "[[jobs]]" in msg and "workers" in msg and "docs/config.md" in msg and "docs/analysis.md" in msg
    with pytest.raises(ConfigError) as e:
        analyze({"topology": topo, "workers": 2, "stop": "1s"})
    assert e.value.field == "scenario" and "stop" in str(e.value) and "workers" in str(e.value)
    path = _write(tmp_path, "neither.toml", 'workrs = 2\n\n[topology]\nkind = "star"\nhosts = 4\n')
    for argv in (["analyze", str(path)], ["plan", "grid", str(path)]):
        r = runner.invoke(app, argv)
        assert r.exit_code == 2 and r.stderr.startswith("error: scenario: neither a simulate scenario"), r.output
        assert "workrs" in r.stderr and "Traceback" not in r.output


# ---------------------------------------------------------------- inalab scenarios


def test_scenarios_lists_every_shipped_scenario_with_what_it_is_for():
    r = runner.invoke(app, ["scenarios"])
    assert r.exit_code == 0, r.output
    files = sorted(SCENARIO_DIR.rglob("*.toml"))
    assert any(p.parent.name == "analysis" for p in files)
    for p in files:
        assert p.stem in r.stdout, p
    assert "grid-fig1" in r.stdout.split() and "analyze, plan" in r.stdout
    r = runner.invoke(app, ["scenarios", "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert sorted(rows) == sorted(p.stem for p in files)
    assert rows["grid-fig1"]["format"] == "analysis" and rows["grid-fig1"]["for"] == ["analyze", "plan"]
    assert rows["emulate-grid-fig1"]["for"] == ["simulate", "emulate", "analyze", "plan"]
    assert rows["ring-star-allreduce"]["for"] == ["simulate"]
    assert rows["demo"]["jobs"] == ["resnet50-atp", "resnet50-ps"]
    for row in rows.values():
        assert Path(row["path"]).exists() and row["description"]


def test_every_listed_name_works_where_it_is_listed():
    from inalab.analysis.scenario import catalog
    from inalab.config import build_topology
    from inalab.emulation.run import _check

    for row in catalog():
        name = row["name"]
        if "simulate" in row["for"]:
            spec = load_scenario(name).to_spec()
            if "emulate" in row["for"]:
                _check(spec, build_topology(spec["topology"]))  # within what emulate runs
        else:
            with pytest.raises(ConfigError):
                load_scenario(name)
        if "analyze" in row["for"]:
            for job in row["jobs"] or [None]:
                load_analysis(name, job=job if len(row["jobs"]) > 1 else None, notes=[]).problem()
        else:
            with pytest.raises(ConfigError):
                load_analysis(name, notes=[])


def test_colliding_names_are_refused_at_listing(tmp_path, monkeypatch):
    import inalab.analysis.scenario as scenario_module

    (tmp_path / "demo.toml").write_text((scenario_module.SCENARIO_DIR / "grid-fig1.toml").read_text())
    monkeypatch.setattr(scenario_module, "SCENARIO_DIR", tmp_path)
    r = runner.invoke(app, ["scenarios"])
    assert r.exit_code == 2 and r.stderr.startswith("error: scenarios: ") and "'demo'" in r.stderr
    assert str(tmp_path / "demo.toml") in r.stderr and str(SCENARIO_DIR / "demo.toml") in r.stderr
    r = runner.invoke(app, ["analyze", "demo"])
    assert r.exit_code == 2 and "'demo'" in r.stderr


def test_simulating_an_analysis_scenario_says_which_commands_run_it():
    r = CliRunner().invoke(app, ["simulate", "grid-fig1"])
    assert r.exit_code == 2
    assert "'grid-fig1' is an analysis scenario: run it with `inalab analyze` or `inalab plan grid`" in " ".join(r.stderr.split())
