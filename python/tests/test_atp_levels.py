"""#38 item 3: ATP as the GRID paper's baseline, ``ina.levels = "once"``: each gradient is
aggregated at the first ATP switch on its way only ("aggregated in-network once at most", GRID
§4.2). The workers' ToRs sum their racks as in ATP; the PS's ToR sums only the workers no other
switch summed, and every rack's sum reaches the PS apart, where ATP's two levels send it one."""
from __future__ import annotations

import pytest

import inalab

# Three racks of a leaf-spine, every ToR programmable: two racks of two workers, and the PS's
# rack with one worker beside the PS.
WORKERS, PS = ["h0", "h1", "h3", "h4", "h6"], "h7"


def scenario(levels: str, rate: str = "100Gbps", tensor: str = "4MiB") -> dict:
    return {"payload": True, "stop": "5s",
            "topology": {"kind": "leaf_spine", "leaves": 3, "spines": 2, "hosts_per_leaf": 3, "host_rate": rate,
                         "fabric_rate": rate, "link_delay": "1us", "programmable": "tor"},
            "jobs": [{"scheme": "atp", "allreduce": tensor, "iterations": 2, "workers": WORKERS, "servers": [PS],
                      "ina": {"levels": levels}}]}


def test_once_sends_each_racks_sum_to_the_ps_apart():
    two, once = (inalab.simulate(scenario(lv)) for lv in ("tor", "once"))
    rx = {lv: int(r.hosts.set_index("name").loc[PS, "rx_bytes"]) for lv, r in (("tor", two), ("once", once))}
    for r in (two, once):
        j = r.jobs.iloc[0]
        assert j.finished and j.payload_checked > 0 and j.payload_errors == 0, j.reason
        assert r.switches.aggregators_end.sum() == 0
    # Three contributors (two racks' sums and the PS rack's worker, summed alone at its ToR)
    # reach the PS where ATP's second level sends it one stream.
    assert rx["once"] == 3 * rx["tor"], rx
    agg = lambda r: [c.get("aggregated", 0) for c in r.switches.counters[:3]]  # noqa: E731  leaf0..leaf2
    assert agg(once)[:2] == agg(two)[:2] and agg(once)[2] * 3 == agg(two)[2], (agg(once), agg(two))
    assert once.jobs.jct_s[0] > 2 * two.jobs.jct_s[0]


def test_a_bad_levels_value_names_the_field_and_once_among_the_choices():
    with pytest.raises(inalab.ConfigError) as e:
        inalab.simulate(scenario("twice"))
    assert "once" in str(e.value) and "ina.levels" in e.value.field


def test_once_sums_exactly_when_emulated():
    # The same set-up in the UDP runtime (user-space shaper): the PS's switch passes the racks'
    # sums on, so the PS receives three streams there too, and the sums stay exact.
    sc = scenario("once", rate="100Mbps", tensor="128KiB")
    emu = inalab.emulate(sc, progress=False, shaper="user")
    e = emu.jobs.iloc[0]
    assert e.finished and e.payload_errors == 0 and e.max_error <= e.error_bound, e.failures
    sw = emu.raw["emulation"]["switches"]
    assert all(st["aggregators_in_use"] == 0 for st in sw.values()), sw
    # leaf2 summed only h6's packets, one per fragment, where leaf0 and leaf1 sum two workers'
    # each (resends make the counts inexact); under "tor" it sums three contributions.
    agg = {n: sw[n]["program"]["aggregated"] for n in ("leaf0", "leaf1", "leaf2")}
    assert 0 < agg["leaf2"] < 0.75 * min(agg["leaf0"], agg["leaf1"]), agg
