"""#38 item 1: a switch's aggregation rate (``network.switch_capacity``) is charged to what every
switch program aggregates, in the simulator and in the runtime switch alike. Before, only ATP's
and GRID's programs said which packets they aggregate; SwitchML, DSA, Canary, Rina and the
static trees ran at line rate whatever the scenario gave (the Rina paper's footnote 1 gives
SwitchML and Rina about 20 Gbps of aggregation on a Tofino-1)."""
from __future__ import annotations

import pytest

import inalab

SCHEMES = ["switchml", "dsa", "canary", "rina", "static_tree"]
WORKERS, ITERATIONS, TENSOR = 4, 2, 256 * 1024


def star(scheme: str, link: str, capacity: str | None, tensor: int = TENSOR) -> dict:
    job = {"scheme": scheme, "allreduce": f"{tensor // 1024}KiB", "iterations": ITERATIONS, "workers": WORKERS}
    if scheme == "dsa":
        job["servers"] = 1
    sc = {"name": f"capacity-{scheme}", "topology": {"kind": "star", "hosts": WORKERS + 1, "link_rate": link, "link_delay": "1us"},
          "jobs": [job]}
    if capacity:
        sc["network"] = {"switch_capacity": {"s0": capacity}}
    return sc


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_simulated_switch_aggregates_no_faster_than_its_capacity(scheme):
    # Four workers at 100 Mbps into a switch that aggregates 100 Mbps: every worker's tensor
    # passes the aggregation stage, so a run cannot end before it served them back to back.
    free = inalab.simulate(star(scheme, "100Mbps", None)).jobs.iloc[0]
    capped = inalab.simulate(star(scheme, "100Mbps", "100Mbps"))
    j = capped.jobs.iloc[0]
    assert free.finished and j.finished, (free.reason, j.reason)
    floor = WORKERS * ITERATIONS * TENSOR * 8 / 100e6
    assert j.jct_s >= floor and j.jct_s > 1.5 * free.jct_s, (scheme, j.jct_s, floor, free.jct_s)
    assert "drops_processing" in capped.switches.counters[0], capped.switches.counters[0]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_runtime_switch_charges_what_it_aggregates_to_its_capacity(scheme):
    # The same star emulated (user-space shaper: runs everywhere): the software switch's
    # processing FIFO served at least every worker's tensor, and the sums stay exact.
    sc = star(scheme, "30Mbps", "30Mbps", tensor=64 * 1024)
    emu = inalab.emulate(sc, progress=False, shaper="user")
    e = emu.jobs.iloc[0]
    assert e.finished and e.payload_errors == 0 and e.max_error <= e.error_bound, e.failures
    s0 = emu.raw["emulation"]["switches"]["s0"]
    fifo = s0["processing"]
    assert fifo["rate_bps"] == 30e6 and fifo["bytes"] >= WORKERS * ITERATIONS * 64 * 1024, (scheme, fifo)
    # Nothing held once the job ended. DSA (as its spec's t3/t4/t11 have it) may still hold
    # aggregators then: a resend that comes after its fragment finished reserves one no later
    # packet fills (a later fragment would downgrade and evict it). The job's end releases it,
    # as in the simulator, and counts it in aggregators_released.
    assert s0["aggregators_in_use"] == 0, s0
    sw = emu.switches.set_index("name").loc["s0"]
    assert sw.aggregators_end == 0 and (scheme == "dsa" or sw.aggregators_released == 0), sw


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_switch_slower_than_its_links_queues_at_its_processing_stage_not_at_egress(scheme):
    # 100 Gbps links into a switch that aggregates 10 Gbps. What waits to be processed sits in
    # the processing stage; an egress queue holds what was processed, which leaves at line rate.
    # Before, a processed packet joined its egress queue at once with a start time in the
    # future, the egress counted the wait for processing as queued bytes at 100 Gbps (10x), and
    # results were dropped at egress links carrying 0.03 % of their rate: DSA, Canary and the
    # static tree did not finish in 2 s, SwitchML took 31x the processing floor.
    sc = star(scheme, "100Gbps", "10Gbps", tensor=1024 * 1024)
    sc["stop"] = "2s"
    r = inalab.simulate(sc)
    j = r.jobs.iloc[0]
    assert j.finished, (scheme, j.reason)
    down = r.links[r.links.src == "s0"]
    assert down.drops_queue.sum() == 0, (scheme, down[["dst", "drops_queue", "max_queue_bytes"]])
    assert r.conservation["holds"], r.conservation
    # Stopped while packets wait to be processed: they are counted in flight.
    sc["stop"] = "200us"
    cut = inalab.simulate(sc).conservation
    assert cut["holds"] and cut["in_flight_packets"] > 0, cut
    # A failure loses what waits to be processed with the rest of the switch's queues, counted.
    sc["stop"], sc["failures"] = "2s", [{"node": "s0", "at": "300us", "until": "400us"}]
    failed = inalab.simulate(sc)
    assert failed.conservation["holds"] and failed.conservation["lost_packets"] > 0, failed.conservation
    assert failed.switches.counters[0]["drops_node_failed"] > 0
