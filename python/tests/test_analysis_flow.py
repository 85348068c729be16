"""Flow-level model and GRID planning: the motivating example, LP bounds, rounding, errors."""
from __future__ import annotations

import json
from fractions import Fraction

import pytest

import inalab
from inalab.analysis import analyze, load_analysis
from inalab.analysis.grid import lp_result, plan_grid, round_solution, solve_lp
from inalab.errors import ConfigError


@pytest.fixture(scope="module")
def fig1():
    return analyze("grid-fig1")


def test_motivating_example_rates_exact(fig1):
    r = fig1.results
    assert r["geryon"].rate == pytest.approx(1.0, abs=1e-9)
    assert r["atp"].rate_exact == Fraction(39, 16)  # the paper's 2.43 (= 2.25 + 0.75/4, truncated)
    assert r["switchml"].rate_exact == Fraction(9, 4)
    assert r["grid"].rate == pytest.approx(3.0, abs=1e-9)
    assert r["grid"].extra["lp_rate_gbps"] == pytest.approx(3.0, abs=1e-9)


def test_atp_places_overflow_at_s3(fig1):
    w = fig1.workers[fig1.workers.scheme == "atp"]
    w1 = w[w.worker == "W1"].set_index("aggregation_node")["rate_gbps"]
    assert w1["S1"] == pytest.approx(2.25) and w1["S3"] == pytest.approx(0.1875)
    links = fig1.links[fig1.links.scheme == "atp"].set_index(["src", "dst"])
    assert links.loc[("S1", "S3"), "load_gbps"] == pytest.approx(3.0)


def test_lp_bounds_the_schemes_and_the_rounding():
    for source in ("grid-fig1", _fat_tree(20, "b")):
        pb = load_analysis(source).problem()
        sol = solve_lp(pb)
        a = analyze(source, schemes=["geryon", "atp", "switchml"])
        for res in a.results.values():  # fixed-route schemes are feasible points of the LP
            if res.scheme != "geryon":
                assert res.rate <= sol.rate + 1e-6
        lp = lp_result(pb, sol)
        assert lp.switch_aggregation >= 0
        for seed in range(5):
            plan = round_solution(pb, sol, seed)
            # Theorem 7: rounded lambda equals the LP's
            assert plan.result.rate == pytest.approx(sol.rate, rel=1e-9)
            # an integral plan that fits every capacity runs at most at the LP's rate
            feasible = plan.result.extra["feasible_rate_gbps"]
            assert feasible <= sol.rate + 1e-9
            assert feasible == pytest.approx(sol.rate / max(1.0, *plan.violations.values()))
            # every worker has one aggregation node (Theorem 1) and rate <= T (Theorem 2)
            assert len(plan.assignment) == len(pb.workers)
            assert all(r <= float(pb.ps_ingress) + 1e-9 for _, _, r in plan.assignment.values())


def test_violation_factors_within_theorem_bounds():
    pb = load_analysis("grid-fig1").problem()
    sol = solve_lp(pb)
    for seed in range(10):
        plan = round_solution(pb, sol, seed)
        v, b = plan.violations, plan.bounds
        assert set(v) == {"processing", "bandwidth", "link"}
        assert v["processing"] <= b["processing"]
        assert v["bandwidth"] <= b["bandwidth"]


def test_policy_json_is_complete(tmp_path):
    pb = load_analysis("grid-fig1").problem()
    policy = json.loads(plan_grid(pb, seed=3).to_json())
    assert policy["kind"] == "grid-routing-policy" and len(policy["workers"]) == 8
    for w in policy["workers"]:
        assert w["path"][0] == w["worker"] and w["path"][-1] == w["aggregation_node"]
    for s in policy["switches"]:
        assert s["path_to_ps"][-1] == "PS"


def test_public_api_returns_dataframes():
    a = inalab.analyze("grid-fig1", schemes=["atp"])
    assert list(a.summary.scheme) == ["atp"]
    assert {"worker", "aggregation_node", "rate_gbps", "path"} <= set(a.workers.columns)


def _fig1_dict() -> dict:
    import tomllib
    from inalab.analysis.scenario import shipped_analyses

    return tomllib.loads(shipped_analyses()["grid-fig1"].read_text())


def _fat_tree(n: int, scen: str) -> dict:
    from inalab.reproduce.grid_large_scale import GridLargeScale

    return GridLargeScale().scenario("fat-tree", scen, n)


def test_worker_without_path_is_a_clear_error():
    d = _fig1_dict()
    d["topology"]["nodes"].append({"name": "W9", "kind": "host"})
    d["topology"]["nodes"].append({"name": "S4", "kind": "switch"})
    d["topology"]["links"].append({"a": "W9", "b": "S4", "rate": "3Gbps"})
    d["workers"] = "W1..W9"
    with pytest.raises(ConfigError) as e:
        analyze(d)
    assert e.value.field == "workers" and "W9" in str(e.value) and "no path" in str(e.value)


@pytest.mark.parametrize("key,value,field", [
    ("switch_capacity", {"S1": "0Gbps"}, "switch_capacity.S1"),
    ("default_switch_capacity", "0Gbps", "default_switch_capacity"),
    ("ps_ingress", "0Gbps", "ps_ingress"),
])
def test_zero_capacities_name_the_field(key, value, field):
    d = _fig1_dict()
    d[key] = value
    with pytest.raises(ConfigError) as e:
        analyze(d)
    assert e.value.field == field


def test_zero_link_rate_is_a_clear_error():
    d = _fig1_dict()
    d["topology"]["links"][0]["rate"] = "0Gbps"
    with pytest.raises(ConfigError) as e:
        analyze(d)
    assert e.value.field.startswith("topology")


def test_unknown_key_is_rejected():
    d = _fig1_dict()
    d["bogus"] = 1
    with pytest.raises(ConfigError) as e:
        analyze(d)
    assert "bogus" in str(e.value)
