"""Rina's analytical side: the bandwidth-occupation model (BOM, Rina section III-B), the ring
dependency-chain model (eq. (1)) with Rina's groups, and the incremental-deployment planner
(section IV-D). Rates in Gbps, times in seconds.

BOM assumes one path from every node to the PS. In multipath topologies we use the BFS
shortest-path tree rooted at the PS (ties to the lowest node index), i.e. every worker's
default route; docs/analysis.md discusses what this means for fat trees.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Optional

import pandas as pd

from ..errors import ConfigError
from .network import Net


def spanning_tree(net: Net, root: int) -> list[int]:
    """Parent of every node in the BFS tree rooted at ``root`` (hosts are leaves; -1: root or unreachable)."""
    parent = [-2] * len(net.names)
    parent[root] = -1
    queue = deque([root])
    while queue:
        v = queue.popleft()
        if net.is_host[v] and v != root:
            continue
        for u in net.adj[v]:
            if parent[u] == -2:
                parent[u] = v
                queue.append(u)
    return [p if p != -2 else -1 for p in parent]


def _children(parent: list[int]) -> list[list[int]]:
    ch: list[list[int]] = [[] for _ in parent]
    for v, p in enumerate(parent):
        if p >= 0:
            ch[p].append(v)
    return ch


def _postorder(children: list[list[int]], root: int) -> list[int]:
    out, stack = [], [root]
    while stack:
        v = stack.pop()
        out.append(v)
        stack.extend(children[v])
    return out[::-1]


@dataclass
class BomResult:
    throughput: float  # Gbps every worker achieves (the global minimum, Lemma 3)
    workers: pd.DataFrame  # worker, bottleneck share on its own path
    links: pd.DataFrame  # child, parent, streams, capacity, share
    bottleneck: str


def bom(net: Net, ps: int, workers: list[int], ina: set[int]) -> BomResult:
    """Worker throughput of the PS architecture with INA switches ``ina`` (Lemmas 1 to 3).

    Every link of the tree rooted at the PS carries one stream per worker below it, except that
    an INA switch with any worker below it sends a single stream (Lemma 2: it and its children
    act as one worker). A link of capacity B with n streams gives each B/n (Lemma 1), and a
    synchronous job runs at the slowest share anywhere (Lemma 3). A PS co-located with a worker
    aggregates that worker's gradient locally.
    """
    if not workers:
        raise ConfigError("workers", "BOM needs at least one worker")
    parent = spanning_tree(net, ps)
    for w in workers:
        if w != ps and parent[w] < 0:
            raise ConfigError("workers", f"worker {net.names[w]!r} has no path to the PS {net.names[ps]!r}")
    wset = set(workers)
    children = _children(parent)
    streams = [0] * len(parent)
    for v in _postorder(children, ps):
        if v == ps:
            continue
        if net.is_host[v]:
            streams[v] = 1 if v in wset else 0
        else:
            s = sum(streams[c] for c in children[v])
            streams[v] = 1 if (v in ina and s > 0) else s
    share = {}
    rows = []
    for v in range(len(parent)):
        if parent[v] >= 0 and streams[v] > 0:
            cap = float(net.cap[(v, parent[v])])
            share[v] = cap / streams[v]
            rows.append({"child": net.names[v], "parent": net.names[parent[v]], "streams": streams[v],
                         "capacity_gbps": cap, "share_gbps": share[v]})
    wrows = []
    for w in workers:
        if w == ps:
            continue
        v, best = w, math.inf
        while v != ps:
            best = min(best, share[v])
            v = parent[v]
        wrows.append({"worker": net.names[w], "path_share_gbps": best})
    if not share:
        return BomResult(math.inf, pd.DataFrame(wrows), pd.DataFrame(rows), "no remote worker")
    v = min(share, key=lambda x: (share[x], x))
    return BomResult(share[v], pd.DataFrame(wrows), pd.DataFrame(rows),
                     f"{net.names[v]}->{net.names[parent[v]]} carries {streams[v]} streams")


# ---------------------------------------------------------------- ring allreduce, Rina groups


@dataclass
class RingParams:
    """Parameters of Rina's eq. (1). ``model_bytes`` at ``link_gbps`` gives k (one model's transfer)."""

    model_bytes: float = 98e6  # ResNet50's 98 MB, as in Rina section VI-C
    link_gbps: float = 100.0
    overhead_s: float = 5e-6  # O(G_u): fixed per-step cost (protocol, memory movement)
    sigma_s: float = 50e-6  # standard deviation of one step's compute+communication time

    @property
    def k_s(self) -> float:
        return self.model_bytes * 8 / (self.link_gbps * 1e9)


def ring_phase_time(n: int, p: RingParams) -> float:
    """One ScatterReduce phase of ring allreduce over n participants, Rina eq. (1):
    T = n O + k + n sigma sqrt(2 ln n)  (n = 1: only k + O, nothing to wait for)."""
    if n < 1:
        raise ConfigError("workers", "the ring needs at least one participant")
    return n * p.overhead_s + p.k_s + n * p.sigma_s * math.sqrt(2 * math.log(n))


def ring_sync_time(n: int, p: RingParams) -> float:
    """ScatterReduce plus AllGather (two phases of eq. (1))."""
    return 2 * ring_phase_time(n, p)


def ps_sync_time(throughput_gbps: float, p: RingParams) -> float:
    """PS-based synchronization: push the model at the BOM throughput, then pull it back."""
    return 2 * p.model_bytes * 8 / (throughput_gbps * 1e9)


def is_tor(net: Net, s: int) -> bool:
    return not net.is_host[s] and any(net.is_host[u] for u in net.adj[s])


def rina_groups(net: Net, root: int, workers: list[int], ina: set[int]) -> int:
    """G: the number of abstracted workers Rina's ring has.

    An INA ToR with at least two workers attached makes them one group; a non-ToR INA switch makes
    all the units below it (in the spanning tree rooted at the worker ``root``) one group
    (section IV-D); every other worker is its own group.
    """
    return _units(net, root, workers, ina)[0]


def _units(net: Net, root: int, workers: list[int], ina: set[int]) -> tuple[int, list[int]]:
    parent = spanning_tree(net, root)
    children = _children(parent)
    wset = set(workers)
    units = [0] * len(parent)
    rack_of_root = None
    for v in _postorder(children, root):
        if net.is_host[v]:
            units[v] = 1 if v in wset else 0
            continue
        s = sum(units[c] for c in children[v])
        if v in ina and is_tor(net, v):
            rack = [u for u in net.adj[v] if net.is_host[u] and u in wset]
            if len(rack) >= 2:
                local = sum(units[c] for c in children[v] if net.is_host[c])
                s = s - local + 1  # the rack's workers (the root too, if attached here) are one group
                if root in rack:
                    rack_of_root = v
        elif v in ina and s > 0:
            s = 1
        units[v] = s
    g = sum(units[c] for c in children[root]) + (1 if rack_of_root is None and root in wset else 0)
    return g, units


def plan_incremental(net: Net, workers: list[int], root: Optional[int] = None) -> list[int]:
    """The order in which Rina replaces switches (section IV-D).

    First the ToR switches, the one with the most workers attached first; then, on the spanning
    tree rooted at the worker ``root`` (default: the first worker), repeatedly the regular switch
    with the most downstream units, where an INA switch and everything below it count as one
    worker. Ties go to the switch listed first in the topology. Switches with nothing below come
    last.
    """
    root = workers[0] if root is None else root
    wset = set(workers)
    tors = [s for s in net.switches if is_tor(net, s)]
    attached = {s: sum(1 for u in net.adj[s] if u in wset) for s in tors}
    order = sorted((s for s in tors if attached[s] > 0), key=lambda s: (-attached[s], s))
    ina = set(order)
    rest = [s for s in net.switches if s not in ina]
    while rest:
        _, units = _units(net, root, workers, ina)
        best = min(rest, key=lambda s: (-units[s], s))
        order.append(best)
        ina.add(best)
        rest.remove(best)
    return order


def incremental_curve(net: Net, workers: list[int], root: Optional[int] = None,
                      params: Optional[RingParams] = None) -> pd.DataFrame:
    """Throughput after each replacement of the planner's order, for PS-based INA (BOM, PS
    co-located with ``root``) and for Rina (ring over G groups). Throughput is the effective
    synchronization bandwidth model_bytes*8 / sync_time in Gbps, and relative to no INA."""
    root = workers[0] if root is None else root
    p = params or RingParams()
    order = plan_incremental(net, workers, root)
    rows = []
    for i in range(len(order) + 1):
        ina = set(order[:i])
        b = bom(net, root, workers, ina)
        g = rina_groups(net, root, workers, ina)
        t_ps, t_rina = ps_sync_time(b.throughput, p), ring_sync_time(g, p)
        rows.append({"replaced": i, "switch": net.names[order[i - 1]] if i else "",
                     "bom_gbps": b.throughput, "groups": g, "ps_ina_sync_s": t_ps, "rina_sync_s": t_rina,
                     "ps_ina_gbps": p.model_bytes * 8 / t_ps / 1e9, "rina_gbps": p.model_bytes * 8 / t_rina / 1e9})
    df = pd.DataFrame(rows)
    df["ps_ina_speedup"] = df["ps_ina_gbps"] / df["ps_ina_gbps"].iloc[0]
    df["rina_speedup"] = df["rina_gbps"] / df["rina_gbps"].iloc[0]
    return df
