"""The built topology as a graph for flow-level analysis: capacities, shortest paths, default routes.

Built from the topology that ``inalab._core`` builds (``inalab.config.build_topology``), so the
flow model and the packet simulator see the same nodes, names and link rates. Hosts never
forward: a path enters a host only as its last hop. Rates are kept in Gbps as exact
``Fraction``s (for the exact progressive-filling models) and floats (for the LPs).
"""
from __future__ import annotations

from collections import deque
from fractions import Fraction
from typing import Iterable, Optional

from ..errors import ConfigError

GBPS = 10**9


class Net:
    """Nodes, directed link capacities (Gbps) and routing helpers of one built topology."""

    def __init__(self, built: dict):
        self.built = built
        self.nodes = built["nodes"]
        self.names = [n["name"] for n in self.nodes]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.is_host = [n["kind"] == "host" for n in self.nodes]
        self.tier = [n["tier"] for n in self.nodes]
        self.programmable = [bool(n.get("programmable")) for n in self.nodes]
        self.adj: list[list[int]] = [[] for _ in self.nodes]
        # capacity of the directed link (u, v) in Gbps; parallel links add up.
        self.cap: dict[tuple[int, int], Fraction] = {}
        for link in built["links"]:
            a, b, rate = link["a"], link["b"], Fraction(link["rate_bps"], GBPS)
            for u, v in ((a, b), (b, a)):
                if (u, v) not in self.cap:
                    self.adj[u].append(v)
                    self.cap[(u, v)] = Fraction(0)
                self.cap[(u, v)] += rate
        for lst in self.adj:
            lst.sort()
        self._dist: dict[int, list[int]] = {}

    # ------------------------------------------------------------ names

    def node(self, name: str, field: str, kind: Optional[str] = None) -> int:
        i = self.index.get(name)
        if i is None:
            raise ConfigError(field, f"no node named {name!r} in this topology")
        if kind is not None and self.nodes[i]["kind"] != kind:
            raise ConfigError(field, f"{name!r} is a {self.nodes[i]['kind']}, not a {kind}")
        return i

    @property
    def hosts(self) -> list[int]:
        return [i for i, h in enumerate(self.is_host) if h]

    @property
    def switches(self) -> list[int]:
        return [i for i, h in enumerate(self.is_host) if not h]

    def tor(self, host: int) -> int:
        """The switch a host is attached to (its first one if it has several links)."""
        return self.adj[host][0]

    # ------------------------------------------------------------ distances and paths

    def dist_to(self, dst: int) -> list[int]:
        """Hop counts to ``dst`` over paths whose intermediate nodes are switches (-1: unreachable)."""
        d = self._dist.get(dst)
        if d is not None:
            return d
        d = [-1] * len(self.nodes)
        d[dst] = 0
        queue = deque([dst])
        while queue:
            v = queue.popleft()
            if self.is_host[v] and v != dst:
                continue  # a host is an endpoint, never a relay
            for u in self.adj[v]:
                if d[u] < 0:
                    d[u] = d[v] + 1
                    queue.append(u)
        self._dist[dst] = d
        return d

    def reachable(self, src: int, dst: int) -> bool:
        return self.dist_to(dst)[src] >= 0

    def shortest_paths(self, src: int, dst: int, limit: int, salt: int = 0) -> list[list[int]]:
        """Up to ``limit`` distinct shortest paths, enumerated deterministically.

        At every hop the equal-cost next hops are tried starting at ``(salt + hop) % choices``,
        an ECMP-like spread: different ``salt`` (e.g. the worker index) start on different
        paths, so the first path of each source is spread over the fabric.
        """
        d = self.dist_to(dst)
        if d[src] < 0:
            return []
        out: list[list[int]] = []
        path = [src]

        def rec(v: int) -> None:
            if len(out) >= limit:
                return
            if v == dst:
                out.append(list(path))
                return
            hops = [u for u in self.adj[v] if d[u] == d[v] - 1 and (u == dst or not self.is_host[u])]
            k = len(hops)
            start = (salt + v) % k if k else 0
            for j in range(k):
                u = hops[(start + j) % k]
                path.append(u)
                rec(u)
                path.pop()
                if len(out) >= limit:
                    return

        rec(src)
        return out

    def default_path(self, src: int, dst: int, salt: int = 0) -> list[int]:
        """The default (ECMP-like, deterministic) route: the first of ``shortest_paths``."""
        paths = self.shortest_paths(src, dst, 1, salt)
        return paths[0] if paths else []


def links_of(path: Iterable[int]) -> list[tuple[int, int]]:
    p = list(path)
    return list(zip(p, p[1:]))
