"""No aggregator is held after every job ended (#11 defect 3): a job's end releases it at every
switch, as the UDP switch does when its workers leave, and the result says what was freed."""
import inalab

LEAK = """
name = "atp-leak-min"
stop = "1s"
[topology]
kind = "leaf_spine"
leaves = 3
spines = 1
hosts_per_leaf = 2
host_rate = "25Gbps"
programmable = "tor"
[network]
aggregator_memory = "{memory}"
[[jobs]]
scheme = "atp"
allreduce = "100004B"
iterations = 1
workers = ["h0", "h2", "h4"]
servers = ["h5"]
"""


def test_the_issues_scenario_ends_with_no_aggregator_held():
    for memory in ("20KB", "40KB", "5MB"):
        r = inalab.simulate(LEAK.format(memory=memory))
        assert r.jobs["finished"].all()
        sw = r.switches.set_index("name")
        assert (sw["aggregators_end"] == 0).all(), (memory, sw)
        # ATP's parameters free most aggregators; what they missed is reported, not hidden.
        assert (sw["aggregators_released"] <= sw["aggregators_peak"]).all()


def test_every_scheme_releases_its_jobs():
    scenario = {
        "payload": True,
        "topology": {"kind": "leaf_spine", "leaves": 2, "spines": 1, "hosts_per_leaf": 5, "programmable": "tor"},
        "network": {"aggregator_memory": "40KB"},
        "jobs": [
            {"scheme": "switchml", "allreduce": "40KiB", "iterations": 2, "workers": "h0..h3"},
            {"scheme": "atp", "allreduce": "40KiB", "iterations": 2, "workers": "h5..h8", "servers": ["h9"]},
        ],
    }
    r = inalab.simulate(scenario)
    assert r.jobs["finished"].all() and (r.jobs["payload_errors"] == 0).all()
    assert (r.switches["aggregators_end"] == 0).all()
