"""GRID at packet level from a policy to a run (issue 18): `inalab plan grid`'s policy for Fig. 1
is accepted by a simulation scenario and carried out on packets with exact sums; a policy that
does not fit its job is an error naming the field."""
from __future__ import annotations

import json

import pytest

import inalab
from inalab.analysis import load_analysis
from inalab.analysis.grid import plan_grid_best
from inalab.config import load_scenario
from inalab.errors import ConfigError

WORKERS = [f"W{i}" for i in range(1, 9)]


def fig1_policy() -> dict:
    sc = load_analysis("grid-fig1")
    return plan_grid_best(sc.problem(), sc.seed, sc.rounding_trials).policy()


def scenario(policy, **job) -> dict:
    import tomllib

    from inalab.analysis.scenario import shipped_analyses

    topo = tomllib.loads(shipped_analyses()["grid-fig1"].read_text())["topology"]
    j = {"name": "grid", "scheme": "grid", "allreduce": "64KiB", "iterations": 2, "workers": WORKERS, "servers": ["PS"],
         "policy": policy} | job
    return {"name": "grid-fig1-packet", "seed": 1, "payload": True, "stop": "10s", "topology": topo, "jobs": [j]}


def test_a_planned_policy_runs_on_packets_with_exact_sums(tmp_path):
    policy = fig1_policy()
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy))
    r = inalab.simulate(scenario(str(path)))
    j = r.jobs.iloc[0]
    assert j.finished and j.payload_checked == 16 and j.payload_errors == 0
    # Each switch the policy names aggregates; the others only forward.
    named = {w["aggregation_node"] for w in policy["workers"]} - {"PS"}
    agg = {s.name: s.counters.get("agg_packets", 0) for s in r.switches.itertuples()}
    assert named and all(agg[s] > 0 for s in named), agg
    assert all(agg[s] == 0 for s in agg if s not in named), agg


def test_the_policy_must_fit_the_job():
    policy = fig1_policy()
    with pytest.raises(ConfigError, match=r"jobs\[0\]\.policy"):
        load_scenario(scenario(policy, workers=WORKERS[:-1])).to_spec()
    with pytest.raises(ConfigError, match="grid-routing-policy"):
        load_scenario(scenario({"workers": []})).to_spec()
    with pytest.raises(ConfigError, match="policy"):
        load_scenario(scenario(policy, scheme="atp"))
