"""#38 item 2: a job's server (PS) on one of its own workers' hosts, sharing that host's NIC (the
Rina paper's testbed co-locates ATP's PS with a worker). An INA scheme's packets cross the
network even between the two (they exist to meet the switch); a host transport's (the plain
PS) go through host memory. The emulator runs it in network namespaces (test_emulate.py)."""
from __future__ import annotations

import pytest

import inalab

WORKERS = ["h0", "h1", "h2", "h3"]


def run(scheme: str, server: str):
    return inalab.simulate({"payload": True, "stop": "5s", "topology": {"kind": "star", "hosts": 5, "link_rate": "100Gbps"},
                            "jobs": [{"scheme": scheme, "allreduce": "4MiB", "iterations": 2, "workers": WORKERS, "servers": [server]}]})


def rx(r, host: str) -> int:
    return int(r.hosts.set_index("name").loc[host, "rx_bytes"])


@pytest.mark.parametrize("scheme", ["atp", "dsa", "grid"])
def test_a_colocated_ina_server_shares_its_workers_nic(scheme):
    apart, together = run(scheme, "h4"), run(scheme, "h3")
    for r in (apart, together):
        j = r.jobs.iloc[0]
        assert j.finished and j.payload_checked > 0 and j.payload_errors == 0, j.reason
        assert r.switches.aggregators_end.sum() == 0
    # One NIC carries what the worker and the PS received on two.
    assert rx(together, "h3") == rx(apart, "h3") + rx(apart, "h4"), (rx(together, "h3"), rx(apart, "h3"), rx(apart, "h4"))
    assert rx(together, "h4") == 0
    if rx(apart, "h4") > 0:  # DSA's lone job is summed at the switch: its PS receives nothing
        assert together.jobs.jct_s[0] > apart.jobs.jct_s[0]


def test_a_colocated_plain_ps_talks_to_its_worker_through_host_memory():
    apart, together = run("ps", "h4"), run("ps", "h3")
    assert together.jobs.finished[0] and together.jobs.payload_errors[0] == 0
    # The local worker's push and pull never reach the wire.
    assert rx(together, "h3") < rx(apart, "h3") + rx(apart, "h4")


def test_another_jobs_worker_host_is_still_refused_as_a_server():
    sc = {"topology": {"kind": "star", "hosts": 8},
          "jobs": [{"scheme": "atp", "allreduce": "64KiB", "workers": ["h0", "h1"], "servers": ["h7"]},
                   {"scheme": "atp", "allreduce": "64KiB", "workers": ["h2", "h3"], "servers": ["h1"]}]}
    with pytest.raises(inalab.ConfigError) as e:
        inalab.simulate(sc)
    assert e.value.field == "jobs[1].servers" and "co-located" in str(e.value)
