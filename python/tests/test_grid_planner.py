"""GRID's planner returns the best integral plan it can find (#38): R-GRIA draws, local
improvement, the baselines on GRID's data plane and, on small instances, the exact MILP; checked
against brute-force enumeration of every integral plan on random small instances."""
from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from inalab.analysis import load_analysis
from inalab.analysis.grid import baseline_choices, options, plan_grid, plan_grid_best, solve_lp


def _scenario(nodes, links, workers, capacity, ps_ingress) -> dict:
    return {"name": "hand", "workers": list(workers), "ps": "PS", "ps_ingress": ps_ingress,
            "switch_capacity": capacity,
            "topology": {"kind": "edges", "programmable": "all",
                         "nodes": [{"name": n, "kind": "switch" if n.startswith("S") else "host"} for n in nodes],
                         "links": [{"a": a, "b": b, "rate": r} for a, b, r in links]}}


def _chain() -> dict:
    """#38's hand-solved case: W1..W3 - S1 (6 Gbps) - S2 (9 Gbps) - PS over a 10 Gbps link."""
    return _scenario(["W1", "W2", "W3", "S1", "S2", "PS"],
                     [("W1", "S1", "100Gbps"), ("W2", "S1", "100Gbps"), ("W3", "S1", "100Gbps"),
                      ("S1", "S2", "100Gbps"), ("S2", "PS", "10Gbps")],
                     ["W1", "W2", "W3"], {"S1": "6Gbps", "S2": "9Gbps"}, "10Gbps")


def test_the_chain_gets_its_integral_optimum_not_one_rounding():
    # LP bound 6.67; all at the PS 3.33 (Geryon's); W1, W2 at S2 and W3 at S1 4.5: S2 aggregates
    # 2 x 4.5 = 9, the PS takes two streams of 4.5. One rounding draw gave 3.33 (#38).
    plan = plan_grid(load_analysis(_chain()).problem(), seed=1)
    extra = plan.result.extra
    assert extra["lp_rate_gbps"] == pytest.approx(20 / 3)
    assert extra["feasible_rate_gbps"] == pytest.approx(4.5, abs=1e-9)
    assert extra["milp"] == "optimal" and extra["lp_gap"] == pytest.approx(1 - 4.5 / (20 / 3))
    at = {w["worker"]: w["aggregation_node"] for w in plan.policy()["workers"]}
    assert list(at.values()).count("S2") == 2, at  # S2's 9 Gbps binds (the third at S1 or the PS ties)
    # Without the MILP the draws and local moves find it too.
    assert plan_grid_best(load_analysis(_chain()).problem(), 1, milp=False).result.extra["feasible_rate_gbps"] == pytest.approx(4.5)


def _rate(pb, agg_path, choice) -> float:
    """The rate of an integral plan, counted from scratch: every worker at lambda, each resource's
    unit streams x lambda within its capacity."""
    count: dict = {}

    def add(r):
        count[r] = count.get(r, 0) + 1
    used = set()
    for v, path in choice.values():
        for e in zip(path, path[1:]):
            add(("link", e))
        add(("ps",) if v == pb.ps else ("sw", v))
        if v != pb.ps:
            used.add(v)
    for s in used:
        add(("ps",))
        for e in zip(agg_path[s], agg_path[s][1:]):
            add(("link", e))
    cap = {("ps",): float(pb.ps_ingress), **{("sw", s): float(c) for s, c in pb.capacity.items()},
           **{("link", e): float(c) for e, c in pb.net.cap.items()}}
    return min(cap[r] / k for r, k in count.items())


def _random_instance(rng) -> dict:
    k, n = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    switches = [f"S{i + 1}" for i in range(k)]
    gbps = lambda lo, hi: f"{int(rng.integers(lo, hi + 1))}Gbps"  # noqa: E731
    links = [(switches[i], switches[int(rng.integers(0, i))], gbps(1, 10)) for i in range(1, k)]  # a tree
    links += [(a, b, gbps(1, 10)) for a, b in itertools.combinations(switches, 2)
              if rng.random() < 0.3 and not any({a, b} == {x, y} for x, y, _ in links)]
    links.append((switches[int(rng.integers(0, k))], "PS", gbps(2, 20)))
    workers = [f"W{i + 1}" for i in range(n)]
    links += [(w, switches[int(rng.integers(0, k))], gbps(1, 10)) for w in workers]
    return _scenario(workers + switches + ["PS"], links, workers, {s: gbps(1, 12) for s in switches}, gbps(2, 20))


def test_the_plan_equals_brute_force_over_every_integral_plan_on_random_small_instances():
    rng = np.random.default_rng(38)
    checked = 0
    while checked < 24:
        pb = load_analysis(_random_instance(rng)).problem()
        sol = solve_lp(pb)
        opts = options(pb, sol, list(baseline_choices(pb, sol).values()))
        best = max(_rate(pb, sol.agg_path, dict(zip(pb.workers, combo)))
                   for combo in itertools.product(*(opts[w] for w in pb.workers)))
        plan = plan_grid(pb, seed=checked)
        got = plan.result.extra["feasible_rate_gbps"]
        assert got == pytest.approx(best, rel=1e-9, abs=1e-9), (checked, plan.result.extra)
        assert got <= sol.rate * (1 + 1e-9)
        # The plan's assignment is the one it reports the rate of.
        assert _rate(pb, sol.agg_path, {w: a[:2] for w, a in plan.assignment.items()}) == pytest.approx(got)
        checked += 1


@pytest.mark.parametrize("source", ["grid-fig1", "fat-tree-b-20", "fat-tree-a-20"])
def test_on_shipped_grid_scenarios_the_plan_is_at_least_every_baseline(source):
    if source.startswith("fat-tree"):
        from inalab.reproduce.grid_large_scale import GridLargeScale

        _, scen, n = source.split("-")[0:1] + source.split("-")[2:]
        source = GridLargeScale().scenario("fat-tree", scen, int(n))
    t0 = time.perf_counter()
    plan = plan_grid(load_analysis(source).problem(), seed=1)
    extra = plan.result.extra
    rate = extra["feasible_rate_gbps"]
    assert set(extra["baseline_rates_gbps"]) == {"switchml", "atp-once", "geryon"}
    for name, r in extra["baseline_rates_gbps"].items():
        assert rate >= r * (1 - 1e-9), (name, r, rate)
    assert rate >= extra["r_gria_rate_gbps"] * (1 - 1e-9)
    assert 0 <= extra["lp_gap"] < 1 and extra["method"]
    print(f"{source if isinstance(source, str) else 'fat-tree'}: {rate:.3f} Gbps by {extra['method']}, "
          f"LP gap {extra['lp_gap']:.3f}, MILP {extra['milp']}, {time.perf_counter() - t0:.2f} s")
