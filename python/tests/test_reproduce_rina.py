"""Rina's packet-level reproductions at small scale: registered, scenarios valid, a scaled-down
testbed and dependency chain end to end (the full runs are `inalab reproduce rina-*`)."""
from __future__ import annotations

from inalab.config import load_scenario
from inalab.reproduce import REPRODUCTIONS
from inalab.reproduce.rina_packet import (INCREMENTAL_TOPOLOGIES, RinaDependencyChain, RinaTestbed, incremental_points,
                                         replacement_order)
from inalab.reproduce.rina_packet import testbed_scenario as make_testbed


def test_every_rina_packet_reproduction_is_registered():
    assert {"rina-testbed", "rina-incremental-packet", "rina-dependency-chain", "rina-schemes"} <= set(REPRODUCTIONS)


def test_the_replacement_order_starts_with_the_tors_with_most_workers():
    order, workers, ps, tors = replacement_order(INCREMENTAL_TOPOLOGIES["fat-tree-k4"])
    assert (len(order), tors, ps, len(workers)) == (20, 8, "h0", 15)
    assert all(s.startswith("edge") for s in order[:8]) and order[7] == "edge0_0", "the PS's ToR has 1 worker: last"
    assert incremental_points(20, 8) == list(range(21)), "every replacement on the fat tree"
    assert incremental_points(36, 36) == [0, 9, 18, 27, 36]
    for scheme in ("atp", "rina", "ring", "hierarchical"):
        load_scenario(make_testbed(scheme, "1 of 2", "64KiB", 1))


def test_a_small_testbed_shows_rina_ahead_of_atp_with_one_ina_tor(tmp_path):
    rep = RinaTestbed(size="256KiB", iterations=1, seeds=(1,))
    rows = rep.run(lambda _msg: None)
    assert rows.finished.all()
    t = rows.set_index(["ina", "scheme"])["goodput_gbps"]
    assert t["1 of 2", "rina"] > t["1 of 2", "atp"], t
    assert t["2 of 2", "atp"] > t["1 of 2", "atp"], "a second INA ToR helps ATP"
    # The paper's settings (#38): ATP's PS on w7's host, INA rate charged at the INA ToRs.
    from inalab.reproduce.rina_packet import paper_testbed_scenario

    sc = paper_testbed_scenario("atp", "2 of 2", "256KiB", 1)
    assert sc["jobs"][0]["servers"] == ["w7"] and sc["network"]["switch_capacity"] == {"sw0": "80Gbps", "sw1": "80Gbps"}
    assert "| parameter |" in rep.explain(rows) and "O nor sigma" in rep.explain(rows)
    assert rep.plot(rows, tmp_path / "t.png").exists()


def test_a_small_dependency_chain_makes_the_ring_pay_more_for_jitter(tmp_path):
    rep = RinaDependencyChain(sizes=(8, 16), sigmas_us=(0.0, 20.0), size="64KiB", seeds=(1,))
    rows = rep.run(lambda _msg: None)
    j = rows[rows.sigma_us == 20.0].set_index(["scheme", "workers"])["jitter_cost_us"]
    assert (j["ring", 8] > 0) and (j["ring", 16] > j["ring", 8]), j
    assert j["ring", 16] > j["rina", 16], j
    assert "eq. (1)" in rep.explain(rows)


def test_fig10_scenarios_put_the_paper_s_ina_switches_in_place():
    from inalab.reproduce.rina_packet import FIG10, fig10_scenario

    for label in FIG10:
        s = fig10_scenario(label, "64KiB")
        load_scenario(s)
        n = len(s["topology"]["programmable"])
        assert n == {"atp-50%": 6, "rina-50%": 4, "atp-100%": 20, "rina-100%": 20}.get(label, 0), (label, n)
        job = s["jobs"][0]
        assert ("servers" in job) == label.startswith(("ps", "atp"))
        # The paper's settings (#38): every host a worker, the PS co-located with the first;
        # each INA switch's rate is 20 Gbps a port (the fat tree's have 4); eq. (1)'s step costs.
        assert len(job["workers"]) == 16 and job.get("servers", [job["workers"][0]]) == [job["workers"][0]], label
        assert s.get("network", {}).get("switch_capacity", {}) == {sw: "80Gbps" for sw in s["topology"]["programmable"]}
        ina = job.get("ina", {})
        # ATP as Rina's BOM has it: every INA switch on the routes to the PS aggregates.
        assert (ina.get("levels") == "tree") == label.startswith("atp"), label
        assert ("step_jitter" in ina) == label.startswith(("ring", "hierarchical", "rina")), label
        assert ina.get("step_barrier", False) == (label in ("ring", "hierarchical")), label
    # The dragonfly (36 routers): half of them in the planner's order; ATP does not run there.
    for label, n in (("rina-50%", 18), ("rina-100%", 36), ("ring", 0)):
        s = fig10_scenario(label, "64KiB", "dragonfly-4-9-2")
        load_scenario(s)
        assert len(s["topology"]["programmable"]) == n and len(s["jobs"][0]["workers"]) == 72, label


def test_fig10_checks_judge_the_dragonfly_without_atp():
    import pandas as pd
    from inalab.reproduce.rina_packet import RinaSchemes

    rows = pd.DataFrame([{"topology": t, "model": "m", "label": l, "goodput_gbps": g}
                         for t, ls in (("fat-tree-k4", {"ps": 1, "ring": 2, "hierarchical": 3, "atp-50%": 2, "rina-50%": 4,
                                                        "atp-100%": 4, "rina-100%": 4.2}),
                                       ("dragonfly-4-9-2", {"ps": 1, "ring": 3, "hierarchical": 2, "rina-50%": 4, "rina-100%": 5}))
                         for l, g in ls.items()])
    assert RinaSchemes().checks(rows) == {"dragonfly-4-9-2 m": False, "fat-tree-k4 m": True}


def test_the_emulated_testbed_fits_the_emulator_and_finishes_simulated():
    import inalab
    from inalab.emulation.run import MAX_HOSTS

    for scheme in ("rina", "atp"):
        for ina in ("1 of 2", "2 of 2"):
            s = make_testbed(scheme, ina, "64KiB", 1, rate="50Mbps", emulated=True)
            job = s["jobs"][0]
            assert len(set(job["workers"]) | set(job.get("servers", []))) <= MAX_HOSTS, (scheme, ina)
            r = inalab.simulate(s)
            assert r.jobs.finished.all() and (r.jobs.payload_errors == 0).all(), (scheme, ina)
