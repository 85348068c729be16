"""#38 item 4: the per-step costs of the Rina paper's eq. (1) for ring and hierarchical
allreduce, under Rina's own names (`ina.step_overhead`, `ina.step_jitter`) and with an optional
barrier per step (`ina.step_barrier`): each reduce-scatter step waits O + max(0, sigma Z) per
worker, or with the barrier O + the step's slowest of its members' draws (eq. (1)'s Max)."""
from __future__ import annotations

import math

import pytest

import inalab

ITERATIONS = 3


def jct_ms(scheme: str, workers: int, ina: dict | None = None, seed: int = 1, hosts_per_leaf: int = 0) -> float:
    topo = ({"kind": "star", "hosts": workers, "link_rate": "100Gbps"} if not hosts_per_leaf else
            {"kind": "leaf_spine", "leaves": workers // hosts_per_leaf, "spines": 1, "hosts_per_leaf": hosts_per_leaf,
             "host_rate": "100Gbps", "fabric_rate": "400Gbps"})
    job = {"scheme": scheme, "allreduce": "2MiB", "iterations": ITERATIONS, "workers": workers}
    if ina:
        job["ina"] = ina
    r = inalab.simulate({"seed": seed, "payload": True, "topology": topo, "jobs": [job]})
    j = r.jobs.iloc[0]
    assert j.finished and j.payload_checked > 0 and j.payload_errors == 0, j.reason
    return j.jct_s * 1e3


@pytest.mark.parametrize("workers", [4, 16])
def test_a_rings_overhead_is_paid_once_per_reduce_scatter_step(workers):
    extra = jct_ms("ring", workers, {"step_overhead": "20us"}) - jct_ms("ring", workers)
    assert extra == pytest.approx(ITERATIONS * (workers - 1) * 0.020, rel=0.01)


def test_hierarchical_pays_its_rack_and_its_cross_rack_steps():
    # 4 racks of 4: 3 reduce-scatter steps in the rack, 3 across racks.
    extra = jct_ms("hierarchical", 16, {"step_overhead": "20us"}, hosts_per_leaf=4) - jct_ms("hierarchical", 16, hosts_per_leaf=4)
    assert extra == pytest.approx(ITERATIONS * (3 + 3) * 0.020, rel=0.01)


def test_a_barrier_makes_every_step_wait_for_its_slowest_member():
    # E[max(0, max of n standard normals)] ~ sqrt(2 ln n) for large n (eq. (1)'s form); a
    # barrier at 16 workers costs each step about 1.77 sigma, one draw alone about 0.4 sigma.
    n, sigma_ms = 16, 0.050
    base = jct_ms("ring", n)
    seeds = (1, 2, 3)
    barrier = sum(jct_ms("ring", n, {"step_jitter": "50us", "step_barrier": True}, seed=s) - base for s in seeds) / len(seeds)
    alone = sum(jct_ms("ring", n, {"step_jitter": "50us"}, seed=s) - base for s in seeds) / len(seeds)
    steps = ITERATIONS * (n - 1)
    assert 1.4 * sigma_ms * steps < barrier < 2.2 * sigma_ms * steps, (barrier, steps)
    assert alone < 0.7 * barrier, (alone, barrier)
    assert math.sqrt(2 * math.log(n)) * sigma_ms * steps * 0.6 < barrier


def test_step_costs_are_drawn_from_the_seed():
    ina = {"step_jitter": "50us"}
    assert jct_ms("ring", 8, ina, seed=5) == jct_ms("ring", 8, ina, seed=5) != jct_ms("ring", 8, ina, seed=6)


def test_a_ring_pays_its_step_overhead_when_emulated():
    sc = {"topology": {"kind": "star", "hosts": 3, "link_rate": "100Mbps", "link_delay": "1us"},
          "jobs": [{"scheme": "ring", "allreduce": "12KiB", "iterations": 2, "workers": 3, "ina": {"step_overhead": "100ms"}}]}
    e = inalab.emulate(sc, progress=False, shaper="user").jobs.iloc[0]
    assert e.finished and e.payload_errors == 0, e.failures
    assert e.jct_s >= 2 * 2 * 0.100, e.jct_s  # 2 iterations x 2 reduce-scatter steps x 100 ms
