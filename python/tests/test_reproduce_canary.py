"""Canary's reproductions: the scenario builder and a scaled-down Fig. 7 run end to end (the
1024-host runs themselves are `inalab reproduce canary-*`, too long for CI)."""
from __future__ import annotations

import inalab
from inalab.config import load_scenario
from inalab.reproduce import REPRODUCTIONS
from inalab.reproduce.canary import CanaryCongestion, measure, scenario

SMALL = {"kind": "leaf_spine", "leaves": 4, "spines": 4, "hosts_per_leaf": 4, "link_delay": "300ns", "programmable": "all"}


def test_every_canary_figure_is_registered():
    assert {"canary-congestion", "canary-fraction", "canary-size", "canary-tenants", "canary-timeout", "canary-ablations"} <= set(REPRODUCTIONS)


def test_scenarios_split_the_hosts_at_random_and_validate():
    for label in ("canary", "ring", "1 ST", "4 ST"):
        load_scenario(scenario(label))  # the 1024-host scenario is valid for every scheme
    s = scenario("canary", fraction=0.5, tenants=4, seed=3)
    groups = [set(j["workers"]) for j in s["jobs"]]
    assert len(groups) == 4 and all(len(g) == 128 for g in groups)
    assert len(set().union(*groups)) == 512, "tenants never share a host"
    assert not set(s["background"]["hosts"]) & set().union(*groups) and len(s["background"]["hosts"]) == 512
    # Hosts are drawn at random (the paper's 5 runs), so racks mix workers and congestion.
    assert groups[0] != set(scenario("canary", fraction=0.5, tenants=4, seed=4)["jobs"][0]["workers"])
    assert "background" not in scenario("canary", congested=False)
    assert scenario("ring")["jobs"][0]["transport"]["mss"] == "1024B", "spec A20: the INA packets' size"
    assert scenario("4 ST")["jobs"][0]["ina"]["trees"] == 4
    assert scenario("canary", ina={"table": "static"})["jobs"][0]["ina"] == {"table": "static"}


def test_scenarios_can_run_on_a_lossless_fabric():
    import pytest

    s = scenario("canary", flow_control="pfc", pfc={"pfc_xoff": "32KiB"})
    assert s["network"]["flow_control"] == "pfc" and s["network"]["pfc_xoff"] == "32KiB"
    assert load_scenario(s).to_spec()["network"]["flow_control"] == {"kind": "pfc", "xoff_bytes": 32768, "xon_bytes": 32768}
    assert "flow_control" not in scenario("canary")["network"], "drop-tail stays the default"
    # Another buffer keeps adaptive routing's 512 KiB threshold.
    assert scenario("canary", buffer="1MiB")["network"]["adaptive_threshold"] == 0.5
    with pytest.raises(ValueError, match="drop_tail, pfc, credit"):
        scenario("canary", flow_control="credits")
    with pytest.raises(ValueError, match="sst, inalab"):
        scenario("canary", setup="ns3")
    row = measure(inalab.simulate(scenario("canary", size="256KiB", topology=SMALL, flow_control="pfc")))[0]
    assert row["finished"] and row["drops_queue"] == 0 and row["pfc_pauses"] > 0, row


def test_the_paper_network_routes_every_packet_by_one_rule():
    """Issue #40 item 1/6: `setup = "sst"` gives the background, the trees and Canary's partial
    sums one routing rule (destination port, rerouted above half a 14 KB port buffer), credit
    links, a permutation background; Canary's own threshold is gone."""
    s = scenario("canary", setup="sst", flow_control="credit")
    net = s["network"]
    assert net["default_port"] == "destination" and net["routing"] == "adaptive" and net["adaptive_threshold"] == 0.5
    assert net["flow_control"] == "credit" and net["credit_buffer"] == net["buffer"] == "14KB"
    assert s["jobs"][0]["ina"] == {"routing": "network"} and s["background"]["pattern"] == "permutation"
    spec = load_scenario(s).to_spec()["network"]
    assert spec["flow_control"] == {"kind": "credit", "buffer_bytes": 14_000}
    # The same rule for a static tree (its job has no routing of its own) and the ECMP ablation.
    t = scenario("4 ST", setup="sst", flow_control="credit")
    assert t["network"] == net and t["jobs"][0]["ina"] == {"trees": 4}
    assert scenario("canary", setup="sst", routing="ecmp")["network"]["routing"] == "ecmp"
    # PFC as a sensitivity row: half of its pause threshold.
    assert scenario("canary", setup="sst", flow_control="pfc")["network"]["buffer"] == "64KiB"
    row = measure(inalab.simulate(scenario("canary", size="256KiB", topology=SMALL, setup="sst", flow_control="credit")))[0]
    assert row["finished"] and row["drops_queue"] == 0 and row["credit_waits"] > 0 and row["pfc_pauses"] == 0, row


def test_figures_default_to_the_lossless_fabric_and_keep_drop_tail():
    import pytest

    from inalab.reproduce.canary import FLOW_CONTROL, PFC_REROUTE_QUEUE, SETUP

    assert FLOW_CONTROL == "pfc" and SETUP == "sst"
    # Every figure runs on the paper's network with its five seeds (issue #40).
    for name in ("canary-congestion", "canary-fraction", "canary-size", "canary-tenants", "canary-timeout", "canary-ablations"):
        rep = REPRODUCTIONS[name]
        assert (rep.setup, rep.flow_control, rep.seeds, rep.reroute_queue) == ("sst", "credit", (1, 2, 3, 4, 5), None), name
        assert "Set-up." in rep.setup_table() and "14KB" in rep.setup_table()
        inalab_setup = type(rep)(setup="inalab")
        assert inalab_setup.flow_control == "pfc" and inalab_setup.reroute_queue == PFC_REROUTE_QUEUE, name
        assert type(rep)(flow_control="drop_tail", setup="inalab").scenario("canary")["network"].get("flow_control") is None, name
    with pytest.raises(ValueError, match="reroute_queue applies only"):
        CanaryCongestion(reroute_queue="64KiB")
    rep = CanaryCongestion(setup="inalab")
    s = rep.scenario("canary")
    assert s["network"]["flow_control"] == "pfc" and s["jobs"][0]["ina"] == {"reroute_queue": PFC_REROUTE_QUEUE}
    # Only Canary's program gets the threshold; an explicit one wins (the ECMP ablation's 1 TiB).
    assert "ina" not in rep.scenario("ring")["jobs"][0] and rep.scenario("4 ST")["jobs"][0]["ina"] == {"trees": 4}
    assert rep.scenario("canary", ina={"reroute_queue": "1TiB"})["jobs"][0]["ina"] == {"reroute_queue": "1TiB"}
    drop = CanaryCongestion(flow_control="drop_tail", setup="inalab")
    assert drop.scenario("canary")["jobs"][0]["ina"] == {} and "pfc" in rep.fabric_text() and "drop-tail" in drop.fabric_text()
    assert CanaryCongestion(reroute_queue="512KiB", setup="inalab").scenario("canary")["jobs"][0]["ina"] == {"reroute_queue": "512KiB"}
    load_scenario(s)
    # The congested ring runs by default on PFC only (no losses, so no 1 ms timeouts per step).
    assert rep.ring_congested and not drop.ring_congested and not CanaryCongestion(ring_congested=False).ring_congested
    assert CanaryCongestion().ring_congested, "credits are lossless too"
    with pytest.raises(ValueError, match="drop_tail, pfc, credit"):
        CanaryCongestion(flow_control="credits")


def test_a_small_fig7_runs_and_is_explained(tmp_path):
    rep = CanaryCongestion(trees=(1, 4))  # the paper's network: credits
    rows = []
    for label in rep.schemes:
        for congested in (False, True):
            if label == "ring" and congested:
                continue
            r = inalab.simulate(rep.scenario(label, congested=congested, size="256KiB", topology=SMALL))
            row = measure(r)[0]
            assert row["finished"] and row["goodput_gbps"] > 0, (label, congested, row)
            assert r.switches.aggregators_end.sum() == 0
            rows.append({"scheme": label, "congested": congested, "seed": 1, **row})
    import pandas as pd

    from inalab.reproduce.canary import relative

    df = pd.DataFrame(rows)
    df["vs_canary"] = relative(df, ["congested"])
    assert set(rep.checks(df)) == {"no_degradation", "vs_one_tree", "vs_multi_trees", "utilization_order"}
    text = rep.explain(df)
    assert "Where and why" in text and "holds" in text and "| parameter | paper (where) | ours | why different |" in text
    assert "| scheme | congested | min | mean | max |" in rep.seed_range(df)
    assert rep.plot(df, tmp_path / "fig7.png").exists()


def test_canary_sums_exactly_on_1024_hosts_under_loss():
    # Issue #16: payload mode on the paper's 1024-host fat tree with loss: exact sums on every
    # host, every descriptor free at the end. 1 MiB (1,024 blocks, each led by its own host)
    # and 0.01 % loss at every host, so reductions and broadcasts both lose packets.
    s = scenario("canary", fraction=1.0, congested=False, size="1MiB")
    s["payload"] = True
    s["jobs"][0]["ina"] = {"rtx_timeout": "50us"}
    s["network"]["host_loss"] = [{"host": f"h{i}", "prob": 1e-4} for i in range(1024)]
    r = inalab.simulate(s)
    j = r.jobs.iloc[0]
    assert j.finished and j.payload_checked == 1024 and j.payload_errors == 0
    assert r.switches.aggregators_end.sum() == 0
    hosts = {k: sum(c.get(k, 0) for c in r.hosts.counters) for k in ("rtx_requests", "reissues", "resent_results")}
    assert hosts["rtx_requests"] > 0, f"the loss was repaired: {hosts}"


def test_fig11_on_the_paper_network_delays_packets_and_gives_the_trees_the_same_noise(monkeypatch):
    """Issue #40 item 4: on "sst" Fig. 11's noise delays the drawn packet alone, and four static
    trees run under every noise level (on "inalab" they ran noiseless, and Canary's NIC stalled)."""
    import pandas as pd

    from inalab.reproduce import canary as mod

    seen = []
    monkeypatch.setattr(mod, "run_grid", lambda label, pts, progress: seen.extend(pts) or pd.DataFrame([p for p, _ in pts]))
    mod.CanaryTimeout(windows=("1us",), noise=(0.001, 0.1), setup="sst").run(lambda _m: None)
    trees = [(p, s) for p, s in seen if p["scheme"] == "4 ST"]
    assert sorted({p["noise"] for p, _ in trees}) == [0.001, 0.1]
    assert all(s["jobs"][0]["ina"] == {"trees": 4, "noise_prob": p["noise"], "noise_mode": "packet"} for p, s in trees)
    canary = [s for p, s in seen if p["scheme"] == "canary"]
    assert all(s["jobs"][0]["ina"]["noise_mode"] == "packet" and s["jobs"][0]["ina"]["routing"] == "network" for s in canary)
    for p, s in seen:
        load_scenario(s)
    seen.clear()
    mod.CanaryTimeout(windows=("1us",), noise=(0.1,), setup="inalab").run(lambda _m: None)
    assert [p["noise"] for p, _ in seen if p["scheme"] == "4 ST"] == [0.0, 0.0]
    assert all("noise_mode" not in s["jobs"][0]["ina"] for p, s in seen if p["scheme"] == "canary")


def test_fig8_bands_are_two_sided_on_the_paper_network():
    """Issue #40 item 6: on "sst" Fig. 8 checks the static trees' losses at 5 % and the ratios at
    the largest fraction against bands around the paper's numbers, from both sides."""
    import pandas as pd

    from inalab.reproduce.canary import CanaryFraction

    def rows(one_tree_loss):
        # The paper's shape: uncongested all 90 Gbps; congested at 5 % Canary -20 %, four trees
        # -47 %, one tree `one_tree_loss`; at 75 % Canary 2x one tree and 1.23x four.
        out = []
        for f in (0.05, 0.75):
            cong = {0.05: {"canary": 72, "4 ST": 47.7, "1 ST": 90 * (1 - one_tree_loss)}, 0.75: {"canary": 70, "4 ST": 57, "1 ST": 35}}[f]
            for s in ("canary", "1 ST", "4 ST"):
                out += [{"scheme": s, "fraction": f, "congested": False, "goodput_gbps": 90.0},
                        {"scheme": s, "fraction": f, "congested": True, "goodput_gbps": float(cong[s])}]
        df = pd.DataFrame(out)
        df["vs_uncongested"] = df.goodput_gbps / 90.0
        return df

    rep = CanaryFraction(fractions=(0.05, 0.75))
    assert rep.setup == "sst" and all(rep.checks(rows(0.66)).values()), rep.checks(rows(0.66))
    for loss in (0.3, 0.95):  # a tree losing far less or far more than the paper's 66 %
        assert rep.checks(rows(loss))["one_tree_loss"] is False
    assert "one_tree_loss" not in CanaryFraction(setup="inalab").checks(rows(0.66))


def test_size_tenants_and_ablations_write_their_index_line_from_the_rows():
    """The index's line of Figs. 9, 10 and the ablations comes from the rows (a rerun keeps it
    true), naming the crossover, the tenants' extremes and the 64-block one-leader variant."""
    import pandas as pd

    from inalab.reproduce.canary import CanaryAblations, CanarySize, CanaryTenants

    size = CanarySize(sizes=("1KiB", "64KiB", "4MiB"))
    rt = {(False, "canary"): (10, 50, 400), (False, "4 ST"): (7, 48, 390), (True, "canary"): (12, 60, 500),
          (True, "4 ST"): (9, 70, 1500)}
    rows = pd.DataFrame([{"scheme": s, "congested": c, "bytes": b, "runtime_us": float(v)}
                         for (c, s), vals in rt.items() for b, v in zip((1024, 65536, 4 << 20), vals)]
                        + [{"scheme": "ring", "congested": False, "bytes": b, "runtime_us": 30.0} for b in (1024, 65536, 4 << 20)])
    line = size.headline(rows)
    assert "+3.0 us against four trees at 1 KiB" in line and "faster than four trees from 64 KiB" in line
    assert "(3.0x faster at 4 MiB)" in line, line
    assert size.holds(rows)

    tenants = CanaryTenants(tenants=(1, 32))
    g = {(1, "canary"): 92, (32, "canary"): 80, (1, "1 ST"): 90, (32, "1 ST"): 40, (1, "4 ST"): 91, (32, "4 ST"): 55,
         (1, "ring"): 45, (32, "ring"): 44}
    rows = pd.DataFrame([{"tenants": k, "scheme": s, "goodput_gbps": float(v)} for (k, s), v in g.items()])
    line = tenants.headline(rows)
    assert "Canary 92 Gbps per job alone, 80 at 32 tenants" in line and "four 91 -> 55" in line, line
    assert tenants.holds(rows)

    abl = CanaryAblations()
    g = {(False, "canary"): (90, 1000), (True, "canary"): (80, 1100), (False, "canary, ECMP"): (90, 1000),
         (True, "canary, ECMP"): (85, 1000), (False, "canary, one leader"): (0.07, 472000),
         (False, "canary, one leader, 64 blocks"): (19, 1770), (True, "canary, one leader, 64 blocks"): (2.7, 12300)}
    rows = pd.DataFrame([{"congested": c, "variant": v, "goodput_gbps": float(x), "runtime_us": float(t)}
                         for (c, v), (x, t) in g.items()])
    line = abl.headline(rows)
    assert "one leader 0.07 Gbps uncongested (472 ms), congested skipped" in line
    assert "with a 64-block window 19.0 uncongested, 2.7 congested" in line, line
    assert set(abl.VARIANTS) >= {"canary, one leader", "canary, one leader, 64 blocks"}


def test_line_figures_draw_the_seeds_range_around_their_mean(tmp_path, monkeypatch):
    """Issue #40 item 6: a figure shows the mean over the seeds and their range. write_outcome
    gives a Canary figure every seed's rows; its lines are the means, shaded min to max."""
    import pandas as pd

    import inalab.plots
    from inalab.reproduce import Outcome, write_outcome
    from inalab.reproduce.canary import CanaryTenants

    rows = pd.DataFrame([{"tenants": k, "scheme": s, "seed": seed, "goodput_gbps": 50.0 + 10 * seed + k}
                         for k in (1, 32) for s in ("canary", "ring") for seed in (1, 2, 3)])
    drawn = {}

    def finish(fig, path, *args, **kw):
        ax = fig.axes[0]
        drawn["lines"] = {l.get_label(): list(l.get_ydata()) for l in ax.get_lines()}
        drawn["bands"] = len(ax.collections)
        fig.savefig(path)
        return path

    monkeypatch.setattr(inalab.plots, "finish_figure", finish)
    rep = CanaryTenants(tenants=(1, 32))
    monkeypatch.setitem(REPRODUCTIONS, rep.name, rep)
    means = rows.groupby(["tenants", "scheme"], as_index=False).goodput_gbps.mean()
    outcome = Outcome(name=rep.name, paper="Canary", figure="Fig. 10", claim="", tolerance="", holds=False, checks=None,
                      rows=rows, writeup="", seconds=0.0, seeds=(1, 2, 3), means=means)
    write_outcome(outcome, tmp_path)
    assert drawn["lines"]["canary"] == [71.0, 102.0] and drawn["bands"] == 2, drawn
    # One seed: no band.
    write_outcome(Outcome(**{**outcome.__dict__, "rows": rows[rows.seed == 1], "seeds": (1,), "means": None}), tmp_path)
    assert drawn["bands"] == 0, drawn
