"""Rina's BOM lemmas, ring model and incremental planner on hand-checkable cases."""
from __future__ import annotations

import math

import pytest

from inalab.analysis.network import Net
from inalab.analysis.rina import (RingParams, bom, plan_incremental, rina_groups, ring_phase_time,
                                  incremental_curve)
from inalab.config import build_topology

G = 10**9


def _edges(nodes, links, rate=100 * G):
    return Net(build_topology({"shape": {"kind": "edges", "nodes": nodes,
                                         "links": [{"a": a, "b": b, "rate_bps": rate, "delay_ps": 1} for a, b in links]},
                               "programmable": "none"}))


def _fig4():
    """Rina Fig. 4: PS - s4 - {s3, w5}; s3 - {w1, w2, s2}; s2 - {w3, w4, w6, w7}."""
    hosts = ["ps", "w1", "w2", "w3", "w4", "w5", "w6", "w7"]
    nodes = [{"name": h, "kind": "host"} for h in hosts] + [{"name": s, "kind": "switch"} for s in ("s2", "s3", "s4")]
    links = [("ps", "s4"), ("s4", "s3"), ("s4", "w5"), ("s3", "w1"), ("s3", "w2"), ("s3", "s2"),
             ("s2", "w3"), ("s2", "w4"), ("s2", "w6"), ("s2", "w7")]
    return _edges(nodes, links)


def test_lemma1_regular_switches_share_the_root():
    net = _fig4()
    workers = [net.index[w] for w in ("w1", "w2", "w3", "w4", "w5", "w6", "w7")]
    b = bom(net, net.index["ps"], workers, set())
    assert b.throughput == pytest.approx(100 / 7)  # OR(r) / W


def test_lemmas_2_and_3_fig4():
    net = _fig4()
    workers = [net.index[w] for w in ("w1", "w2", "w3", "w4", "w5", "w6", "w7")]
    b = bom(net, net.index["ps"], workers, {net.index["s3"]})
    # s3 (INA) is one worker for s4: s4 -> PS carries 2 streams (B0/2); s2 -> s3 carries 4 (B0/4)
    links = b.links.set_index("child")
    assert links.loc["s4", "streams"] == 2 and links.loc["s3", "streams"] == 1 and links.loc["s2", "streams"] == 4
    assert b.throughput == pytest.approx(25.0)  # the worst child, B0/4 (Lemma 3)
    b2 = bom(net, net.index["ps"], workers, {net.index["s2"], net.index["s3"], net.index["s4"]})
    assert b2.throughput == pytest.approx(100.0)


def test_ring_model_eq1():
    p = RingParams(model_bytes=1e6, link_gbps=8.0, overhead_s=1e-6, sigma_s=1e-5)
    assert p.k_s == pytest.approx(1e-3)
    assert ring_phase_time(1, p) == pytest.approx(1e-3 + 1e-6)
    n = 16
    assert ring_phase_time(n, p) == pytest.approx(n * 1e-6 + 1e-3 + n * 1e-5 * math.sqrt(2 * math.log(n)))
    assert ring_phase_time(4, p) < ring_phase_time(16, p)


@pytest.fixture(scope="module")
def fat4():
    return Net(build_topology({"shape": {"kind": "fat_tree", "k": 4, "link_rate_bps": 100 * G, "link_delay_ps": 1},
                               "programmable": "none"}))


def test_planner_order_fat_tree_k4(fat4):
    order = [fat4.names[s] for s in plan_incremental(fat4, fat4.hosts)]
    # ToRs first (2 workers each, ties in topology order), then the aggregation switch above the
    # root's rack (everything is downstream of it), then the core switch it uses, ...
    assert order[:8] == [f"edge{p}_{i}" for p in range(4) for i in range(2)]
    assert order[8] == "agg0_0" and order[9] == "core0"
    assert len(order) == 20 and len(set(order)) == 20


def test_rina_groups_fat_tree(fat4):
    order = plan_incremental(fat4, fat4.hosts)
    assert rina_groups(fat4, fat4.hosts[0], fat4.hosts, set()) == 16
    assert rina_groups(fat4, fat4.hosts[0], fat4.hosts, set(order[:1])) == 15  # root's rack of 2 -> 1 group
    assert rina_groups(fat4, fat4.hosts[0], fat4.hosts, set(order[:8])) == 8  # 8 racks
    assert rina_groups(fat4, fat4.hosts[0], fat4.hosts, set(order[:9])) == 2  # root's rack + agg0_0's subtree


def test_incremental_curve_shapes(fat4):
    df = incremental_curve(fat4, fat4.hosts)
    assert len(df) == 21
    assert (df.rina_gbps.diff().dropna() >= -1e-12).all()
    assert df.bom_gbps.iloc[0] == pytest.approx(100 / 15)  # co-located PS: 15 remote workers
    assert df.bom_gbps.iloc[-1] == pytest.approx(100.0)
