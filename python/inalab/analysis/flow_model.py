"""Flow-level model of one parameter-server job with in-network aggregation (GRID section 4).

A :class:`Problem` is a built topology (directed link capacities), the programmable switches
with their processing capacities, a PS with an ingress bandwidth and the job's workers. Each
scheme computes the *common rate* lambda: the rate at which every worker sends its gradient
(the PS waits for all of them, so the minimum over workers is what counts, as in GRID), where
each worker's gradient is aggregated, every switch's aggregation rate (sum of worker rates it
aggregates), the PS's aggregation rate (its ingress load: un-aggregated worker streams plus one
aggregated stream per aggregating switch) and every directed link's load.

Schemes (see docs/analysis.md for the exact models):

* ``geryon``: no in-network aggregation; every worker's stream is routed to the PS over any
  switch paths (splittable), maximizing lambda under link and PS-ingress capacities (an LP).
* ``atp``: default routes; a worker's gradient is aggregated at the first programmable switch
  on its route with spare processing capacity, the overflow at the next one, the rest at the PS
  (exact progressive filling in rational arithmetic).
* ``switchml``: default routes; aggregation only at the worker's ToR if it is programmable
  (no overflow), otherwise at the PS; aggregated streams go to the PS.
* ``grid``: the GRIA LP with link capacities and R-GRIA randomized rounding (``grid.py``).

All rates are Gbps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Optional

import pandas as pd

from ..errors import ConfigError
from .network import Net, links_of

@dataclass
class Problem:
    """One job on one network. Capacities in Gbps (Fractions, exact)."""

    net: Net
    workers: list[int]
    ps: int
    ps_ingress: Fraction
    capacity: dict[int, Fraction]  # programmable switch -> processing capacity
    max_paths: int = 4  # candidate shortest paths per (worker, aggregation node) pair in GRID

    def __post_init__(self) -> None:
        self.validate()

    @property
    def programmable(self) -> list[int]:
        return sorted(self.capacity)

    def name(self, i: int) -> str:
        return self.net.names[i]

    def validate(self) -> None:
        net = self.net
        if len(self.workers) < 1:
            raise ConfigError("workers", "a job needs at least one worker")
        if len(set(self.workers)) != len(self.workers):
            raise ConfigError("workers", "a worker is listed twice")
        if self.ps in self.workers:
            raise ConfigError("ps", f"the PS {self.name(self.ps)!r} is also a worker; pick a host that is not")
        if self.ps_ingress <= 0:
            raise ConfigError("ps_ingress", f"must be positive, got {float(self.ps_ingress):g} Gbps")
        for s, c in self.capacity.items():
            if net.is_host[s]:
                raise ConfigError(f"switch_capacity.{self.name(s)}", "is a host, not a switch")
            if c <= 0:
                raise ConfigError(f"switch_capacity.{self.name(s)}",
                                  f"must be positive, got {float(c):g} Gbps; make the switch "
                                  "non-programmable instead of giving it no capacity")
        ps_in = sum((net.cap[(u, self.ps)] for u in net.adj[self.ps]), Fraction(0))
        if ps_in <= 0:
            raise ConfigError("ps", f"the PS {self.name(self.ps)!r} has no incoming link capacity")
        for w in self.workers:
            if not net.reachable(w, self.ps):
                raise ConfigError("workers", f"worker {self.name(w)!r} has no path to the PS {self.name(self.ps)!r}")
            if all(net.cap[(w, u)] <= 0 for u in net.adj[w]):
                raise ConfigError("workers", f"worker {self.name(w)!r} has only zero-rate links")
        for (u, v), c in net.cap.items():
            if c <= 0:
                raise ConfigError("topology.links", f"the link {self.name(u)}-{self.name(v)} has zero rate")


@dataclass
class Portion:
    """Part of one worker's gradient stream: aggregated at ``node``, sent along ``path``."""

    worker: int
    node: int
    path: Optional[list[int]]
    rate: float


@dataclass
class FlowResult:
    """What a scheme computes. ``rate`` is the common rate lambda (Gbps)."""

    scheme: str
    problem: Problem
    rate: float
    portions: list[Portion]
    link_load: dict[tuple[int, int], float]
    agg_streams: dict[int, tuple[float, list[int]]]  # switch -> (aggregated stream rate y_s, path to PS)
    rate_exact: Optional[Fraction] = None
    bottleneck: str = ""
    extra: dict = field(default_factory=dict)

    # ---------------------------------------------------------------- derived figures

    @property
    def switch_load(self) -> dict[int, float]:
        load = {s: 0.0 for s in self.problem.capacity}
        for p in self.portions:
            if p.node != self.problem.ps:
                load[p.node] = load.get(p.node, 0.0) + p.rate
        return load

    @property
    def switch_aggregation(self) -> float:
        """Sum of the worker rates aggregated by switches (GRID's 'aggregation rate of switches')."""
        return sum(self.switch_load.values())

    @property
    def ps_aggregation(self) -> float:
        """The PS's ingress load: worker streams aggregated at the PS plus aggregated switch streams."""
        direct = sum(p.rate for p in self.portions if p.node == self.problem.ps)
        return direct + sum(y for y, _ in self.agg_streams.values())

    def summary(self) -> dict:
        """One row: the scheme's rate and loads as it can run. A plan that overloads some capacity
        at ``rate`` (GRID's rounding; ``extra["feasible_rate_gbps"]`` is then below ``rate``) is
        shown at its feasible rate: ``rate_gbps`` is that rate, the aggregation rates and the link
        utilization are scaled with it, and ``lp_rate_gbps`` keeps the LP bound."""
        pb = self.problem
        util = max((l / float(pb.net.cap[e]) for e, l in self.link_load.items()), default=0.0)
        used = sum(1 for s, l in self.switch_load.items() if l > 1e-9)
        feasible = self.extra.get("feasible_rate_gbps", self.rate)
        scale = feasible / self.rate if self.rate > 0 else 1.0
        row = {
            "scheme": self.scheme, "workers": len(pb.workers), "rate_gbps": feasible,
            "switch_aggregation_gbps": self.switch_aggregation * scale, "ps_aggregation_gbps": self.ps_aggregation * scale,
            "switches_used": used, "max_link_utilization": util * scale, "bottleneck": self.bottleneck,
        }
        row.update(self.extra)
        return row

    def workers_frame(self) -> pd.DataFrame:
        n = self.problem.name
        rows = [{"scheme": self.scheme, "worker": n(p.worker), "aggregation_node": n(p.node),
                 "rate_gbps": p.rate, "path": None if p.path is None else [n(v) for v in p.path]}
                for p in self.portions]
        return pd.DataFrame(rows, columns=["scheme", "worker", "aggregation_node", "rate_gbps", "path"])

    def switches_frame(self) -> pd.DataFrame:
        pb, load = self.problem, self.switch_load
        rows = [{"scheme": self.scheme, "switch": pb.name(s), "capacity_gbps": float(c),
                 "aggregation_gbps": load.get(s, 0.0), "utilization": load.get(s, 0.0) / float(c),
                 "output_gbps": self.agg_streams.get(s, (0.0, []))[0]}
                for s, c in sorted(pb.capacity.items())]
        return pd.DataFrame(rows, columns=["scheme", "switch", "capacity_gbps", "aggregation_gbps", "utilization",
                                           "output_gbps"])

    def links_frame(self) -> pd.DataFrame:
        pb = self.problem
        rows = [{"scheme": self.scheme, "src": pb.name(u), "dst": pb.name(v), "capacity_gbps": float(pb.net.cap[(u, v)]),
                 "load_gbps": l, "utilization": l / float(pb.net.cap[(u, v)])}
                for (u, v), l in sorted(self.link_load.items()) if l > 1e-12]
        return pd.DataFrame(rows, columns=["scheme", "src", "dst", "capacity_gbps", "load_gbps", "utilization"])


def link_loads(portions: list[Portion], agg_streams: dict[int, tuple[float, list[int]]]) -> dict:
    load: dict[tuple[int, int], float] = {}
    for p in portions:
        for e in links_of(p.path or []):
            load[e] = load.get(e, 0.0) + p.rate
    for y, path in agg_streams.values():
        for e in links_of(path):
            load[e] = load.get(e, 0.0) + y
    return load


# ---------------------------------------------------------------- fixed-route progressive filling


def _fill(pb: Problem, scheme: str, sequences: dict[int, list[int]], paths: dict[int, list[int]]) -> FlowResult:
    """Raise every worker's rate together; each worker's increment is aggregated at the first node of
    its sequence that is not saturated. Stops when a link or the PS ingress saturates, or a worker
    runs out of aggregation nodes. Exact (Fractions): every phase is linear in lambda.
    """
    net, ps = pb.net, pb.ps
    agg_path = {s: net.default_path(s, ps, salt=s) for s in pb.capacity}
    for s, path in agg_path.items():
        if not path and any(s in seq for seq in sequences.values()):
            raise ConfigError("topology", f"switch {pb.name(s)!r} has no path to the PS")
    portion: dict[int, dict[int, Fraction]] = {w: {} for w in pb.workers}
    at = {w: 0 for w in pb.workers}  # index into sequences[w]
    saturated: set[int] = set()
    lam = Fraction(0)
    bottleneck = ""
    prefix = {w: {v: links_of(paths[w][: paths[w].index(v) + 1]) for v in sequences[w]} for w in pb.workers}

    def advance(w: int) -> bool:
        seq = sequences[w]
        while at[w] < len(seq) and seq[at[w]] in saturated:
            at[w] += 1
        return at[w] < len(seq)

    while True:
        for w in pb.workers:
            if not advance(w):
                return _filled(pb, scheme, lam, portion, agg_path, prefix,
                               bottleneck or f"worker {pb.name(w)} has no aggregation node with spare capacity")
        # current loads and slopes (d load / d lambda) of every resource
        load: dict = {}
        slope: dict = {}

        def add(key, amount, rate):
            load[key] = load.get(key, 0) + amount
            slope[key] = slope.get(key, 0) + rate

        ys: dict[int, Fraction] = {}
        active_at: dict[int, int] = {}
        for w in pb.workers:
            cur = sequences[w][at[w]]
            for v, amount in portion[w].items():
                for e in prefix[w][v]:
                    add(("link", e), amount, 0)
                if v == ps:
                    add(("ps",), amount, 0)
                else:
                    add(("switch", v), amount, 0)
                    ys[v] = max(ys.get(v, Fraction(0)), amount)
            for e in prefix[w][cur]:
                add(("link", e), 0, 1)
            if cur == ps:
                add(("ps",), 0, 1)
            else:
                add(("switch", cur), 0, 1)
                active_at[cur] = 1
        for s in set(ys) | set(active_at):
            y, d = ys.get(s, Fraction(0)), active_at.get(s, 0)
            for e in links_of(agg_path[s]):
                add(("link", e), y, d)
            add(("ps",), y, d)
        step, hit = None, []
        for key, d in slope.items():
            if d <= 0:
                continue
            cap = pb.ps_ingress if key[0] == "ps" else pb.capacity[key[1]] if key[0] == "switch" else net.cap[key[1]]
            t = (cap - load[key]) / d
            if step is None or t < step:
                step, hit = t, [key]
            elif t == step:
                hit.append(key)
        assert step is not None
        step = max(step, Fraction(0))
        lam += step
        for w in pb.workers:
            cur = sequences[w][at[w]]
            portion[w][cur] = portion[w].get(cur, Fraction(0)) + step
        stops = [k for k in hit if k[0] != "switch"]
        if stops:
            k = stops[0]
            what = "PS ingress" if k[0] == "ps" else f"link {pb.name(k[1][0])}->{pb.name(k[1][1])}"
            return _filled(pb, scheme, lam, portion, agg_path, prefix, what)
        saturated |= {k[1] for k in hit}
        bottleneck = "processing capacity of " + ", ".join(pb.name(k[1]) for k in hit)


def _filled(pb, scheme, lam, portion, agg_path, prefix, bottleneck) -> FlowResult:
    portions, streams = [], {}
    for w in pb.workers:
        for v, amount in portion[w].items():
            if amount > 0:
                path = [w] + [b for _, b in prefix[w][v]]
                portions.append(Portion(w, v, path, float(amount)))
                if v != pb.ps:
                    y = max(streams.get(v, (Fraction(0), None))[0], amount)
                    streams[v] = (y, agg_path[v])
    streams = {s: (float(y), p) for s, (y, p) in streams.items()}
    return FlowResult(scheme, pb, float(lam), portions, link_loads(portions, streams), streams,
                      rate_exact=lam, bottleneck=bottleneck)


def default_paths(pb: Problem) -> dict[int, list[int]]:
    return {w: pb.net.default_path(w, pb.ps, salt=w) for w in pb.workers}


def atp(pb: Problem) -> FlowResult:
    paths = default_paths(pb)
    seqs = {w: [v for v in paths[w][1:-1] if v in pb.capacity] + [pb.ps] for w in pb.workers}
    return _fill(pb, "atp", seqs, paths)


def switchml(pb: Problem) -> FlowResult:
    paths = default_paths(pb)
    seqs = {}
    for w in pb.workers:
        tor = paths[w][1]
        seqs[w] = [tor] if tor in pb.capacity else [pb.ps]
    return _fill(pb, "switchml", seqs, paths)


# ---------------------------------------------------------------- Geryon: routing without aggregation


def geryon(pb: Problem) -> FlowResult:
    """max lambda: a flow of lambda from every worker to the PS over switch paths (one commodity,
    splittable), within link capacities and the PS ingress; a tiny cost per unit of link load
    picks, among the optimal flows, one without detours or cycles."""
    from .lp import LP

    net, ps, workers = pb.net, pb.ps, set(pb.workers)
    lp = LP()
    lam = lp.var(name="lambda", cost=1.0)
    usable = lambda v: not net.is_host[v] or v in workers or v == ps  # noqa: E731
    f = {}
    for (u, v), c in net.cap.items():
        if not (usable(u) and usable(v)) or v in workers or u == ps:
            continue
        f[(u, v)] = lp.var(hi=float(c), cost=-1e-7)
    out_terms: dict[int, list] = {}
    for (u, v), j in f.items():
        out_terms.setdefault(u, []).append((j, 1.0))
        out_terms.setdefault(v, []).append((j, -1.0))
    for v, terms in out_terms.items():
        if v == ps:
            continue
        if v in workers:
            lp.row(terms + [(lam, -1.0)], 0.0, 0.0)
        else:
            lp.row(terms, 0.0, 0.0)
    lp.row([(j, 1.0) for (u, v), j in f.items() if v == ps], hi=float(pb.ps_ingress))
    x = lp.solve()
    rate = float(x[lam])
    load = {e: float(x[j]) for e, j in f.items() if x[j] > 1e-9}
    portions = [Portion(w, ps, None, rate) for w in pb.workers]
    ps_in = sum(l for (u, v), l in load.items() if v == ps)
    tight = [e for e, l in load.items() if l >= float(net.cap[e]) - 1e-6]
    if ps_in >= float(pb.ps_ingress) - 1e-6:
        bottleneck = "PS ingress"
    else:
        bottleneck = "min cut of links" + (f" (e.g. {pb.name(tight[0][0])}->{pb.name(tight[0][1])})" if tight else "")
    return FlowResult("geryon", pb, rate, portions, load, {}, bottleneck=bottleneck,
                      extra={"lp_seconds": lp.solve_s})
