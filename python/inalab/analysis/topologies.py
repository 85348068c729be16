"""Topologies of the GRID paper's evaluation, written in the user-facing schema ([topology]).

GRID's fat tree (section 6.3) has 80 switches (32 edge, 32 aggregation, 16 core) and 192
servers: the switch fabric of a k=8 fat tree with 6 servers per edge switch (192 / 32) instead
of k/2 = 4. The built-in ``fat_tree`` shape fixes 4 hosts per edge switch, so we write it as an
explicit ``edges`` topology with the same names and tiers as ``fat_tree`` (edge{p}_{i}: tier 1,
agg{p}_{i}: tier 2, core{i}: tier 3) and the same wiring. The leaf-spine (30 spines, 30 leaves,
"500 servers", "16 workers per rack") is the built-in ``leaf_spine`` shape with 16 hosts per
leaf (480 servers; 500 is not a multiple of 30, and the paper's 16 per rack decides the results).
"""
from __future__ import annotations


def grid_fat_tree(k: int = 8, hosts_per_edge: int = 6, rate: str = "100Gbps", programmable="tor") -> dict:
    half = k // 2
    nodes, links = [], []
    hosts = [f"h{i}" for i in range(k * half * hosts_per_edge)]
    nodes += [{"name": h, "kind": "host"} for h in hosts]
    nodes += [{"name": f"edge{p}_{i}", "kind": "switch", "tier": 1} for p in range(k) for i in range(half)]
    nodes += [{"name": f"agg{p}_{i}", "kind": "switch", "tier": 2} for p in range(k) for i in range(half)]
    nodes += [{"name": f"core{i}", "kind": "switch", "tier": 3} for i in range(half * half)]
    for p in range(k):
        for e in range(half):
            edge = f"edge{p}_{e}"
            for h in range(hosts_per_edge):
                links.append({"a": hosts[(p * half + e) * hosts_per_edge + h], "b": edge, "rate": rate})
            for a in range(half):
                links.append({"a": edge, "b": f"agg{p}_{a}", "rate": rate})
        for a in range(half):
            for j in range(half):
                links.append({"a": f"agg{p}_{a}", "b": f"core{a * half + j}", "rate": rate})
    return {"kind": "edges", "nodes": nodes, "links": links, "programmable": programmable}


def grid_leaf_spine(leaves: int = 30, spines: int = 30, hosts_per_leaf: int = 16, rate: str = "100Gbps",
                    programmable="tor") -> dict:
    return {"kind": "leaf_spine", "leaves": leaves, "spines": spines, "hosts_per_leaf": hosts_per_leaf,
            "switch_ports": hosts_per_leaf + spines, "host_rate": rate, "programmable": programmable}
