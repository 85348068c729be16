"""ATP at the scale and under the adversity the papers use (#11 defect 4 and the tests it asks for)."""
import random

import pytest

import inalab


def two_racks(scheme: str) -> dict:
    """The issue's scenario: 63 workers on two 32-host racks of a 100 Gbps leaf-spine, 1 us links,
    adaptive routing, ToRs programmable with the default memory, the PS (ATP) on the second rack."""
    job = {"scheme": scheme, "allreduce": "4MiB", "iterations": 1, "workers": "h0..h62"}
    if scheme == "atp":
        job["servers"] = ["h63"]
    return {"stop": "50ms",
            "topology": {"kind": "leaf_spine", "leaves": 2, "spines": 2, "hosts_per_leaf": 32,
                         "host_rate": "100Gbps", "link_delay": "1us", "programmable": "tor"},
            "network": {"routing": "adaptive"}, "jobs": [job]}


def test_63_workers_on_two_racks_no_drops_and_faster_than_ring():
    atp, ring = inalab.simulate(two_racks("atp")), inalab.simulate(two_racks("ring"))
    assert atp.jobs.finished.all() and ring.jobs.finished.all()
    sent = atp.hosts.tx_packets.sum()
    drops = atp.links.drops_queue.sum() + atp.links.drops_loss.sum()
    # Before: unfinished after 1 s with 2.04 M of 2.17 M packets dropped.
    assert drops < 0.01 * sent, (drops, sent)
    assert atp.jobs.jct_s.iloc[0] <= ring.jobs.jct_s.iloc[0], (atp.jobs.jct_s.iloc[0], ring.jobs.jct_s.iloc[0])
    # A job never collides with itself: its slots are distinct and its window stays within them.
    assert sum(c.get("collisions", 0) for c in atp.switches.counters) == 0


@pytest.mark.parametrize("seed", range(4))
def test_concurrent_jobs_random_sizes_values_loss_and_scarce_pools_sum_exactly(seed):
    # Property test in the simulator: 3 concurrent ATP jobs and one SwitchML job share two racks'
    # pools (scarce: a few dozen aggregators), random sizes, 0-1 % loss on links, payload mode
    # (every result is checked against the exact sum); afterwards no aggregator is held.
    rng = random.Random(seed)
    jobs = []
    for j in range(3):
        size = 4 * rng.randrange(1, 20_000)
        jobs.append({"scheme": "atp", "allreduce": f"{size}B", "iterations": rng.randint(1, 3),
                     "workers": [f"h{j}", f"h{j + 4}", f"h{j + 8}"], "servers": [f"h{j + 12}"],
                     "ina": {"slots": rng.choice([8, 64, 512]), "timeout": "200us"}})
    jobs.append({"scheme": "switchml", "allreduce": f"{4 * rng.randrange(1, 20_000)}B", "iterations": 2,
                 "workers": ["h16", "h17", "h18"]})
    loss = rng.uniform(0, 0.01)
    scenario = {
        "seed": seed, "payload": True, "stop": "2s",
        "topology": {"kind": "leaf_spine", "leaves": 2, "spines": 1, "hosts_per_leaf": 10,
                     "host_rate": "100Gbps", "link_delay": "1us", "programmable": "tor"},
        "network": {"aggregator_memory": f"{rng.randrange(20, 80) * 272}B",
                    "link_loss": [{"a": "leaf0", "b": "spine0", "prob": loss}, {"a": "h0", "b": "leaf0", "prob": loss}]},
        "jobs": jobs,
    }
    r = inalab.simulate(scenario)
    assert r.jobs.finished.all(), r.jobs
    assert r.jobs.payload_checked.all() and (r.jobs.payload_errors == 0).all()
    assert (r.switches.aggregators_end == 0).all()


def three_racks(scheme: str, workers: int = 47, jobs: int = 1) -> dict:
    """Issue #37 item 6: `jobs` jobs of `workers` workers and a server each over racks of 16
    hosts of a 100 Gbps leaf-spine (8 spines at 400 Gbps, 1 us links, adaptive routing, the
    default 5 MB per ToR), workers dealt round robin and each job's server in its own rack
    (benchmarks/ina_scale.py --hosts-per-rack 16 --size 2MiB)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import ina_scale

    return ina_scale.scenario(scheme, workers, jobs, "2MiB", per_rack=16)


# 2 MiB in 306-byte packets of 248 B of values at 100 Gbps: what one worker's link needs.
WIRE_BOUND_S = -(-(2 << 20) // 248) * 306 * 8 / 100e9


def test_47_workers_over_3_racks_within_1_5x_of_the_wire_and_ahead_of_ring():
    atp, ring = inalab.simulate(three_racks("atp")), inalab.simulate(three_racks("ring"))
    assert atp.jobs.finished.all() and ring.jobs.finished.all()
    jct = atp.jobs.jct_s.max()
    # Was 0.63 ms (3x) when the issue was filed; 0.218 ms now.
    assert jct <= 1.5 * WIRE_BOUND_S, (jct, WIRE_BOUND_S)
    assert jct < ring.jobs.jct_s.max()


def test_parameter_copies_to_other_racks_spread_over_the_uplinks():
    # Issue #37 item 6: every copy of a parameter to a job's other racks kept the parameter's
    # flow key, so a leaf sent all of them on one of its 8 uplinks (23 of its 37 MB); now no
    # uplink carries more than a third of its leaf's bytes.
    r = inalab.simulate(three_racks("atp", workers=15, jobs=8))
    assert r.jobs.finished.all()
    up = r.links[r.links.src.str.startswith("leaf") & r.links.dst.str.startswith("spine")]
    share = up.groupby("src").tx_bytes.max() / up.groupby("src").tx_bytes.sum()
    assert (share < 1 / 3).all(), share
