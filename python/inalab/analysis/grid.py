"""GRID's control plane: the GRIA problem (GRID eq. (1)) with link capacities, its LP relaxation
solved with HiGHS, R-GRIA randomized rounding (Algorithm 1) and the resulting routing policy.

Differences from the paper's formulation (also in docs/analysis.md):

* Paths and link capacities. The paper assumes links are never the bottleneck; here each
  worker's stream to aggregation node v is split over up to ``max_paths`` shortest paths w -> v
  (plus the prefix of its default route to the PS), every aggregating switch sends its
  aggregated stream y_s to the PS over its default route, and every directed link's load (the
  worker streams that cross it before being aggregated plus the aggregated streams) is at most
  its rate. Without this the motivating example (Fig. 1) would not give 3 Gbps.
* After the LP, each worker's rates are scaled to sum to lambda (they may sum to more when the
  worker is not a bottleneck). This only lowers loads, and lambda after rounding still equals
  the LP's (Theorem 7).
* Rounding also picks one path for the worker, with probability proportional to the LP flow on
  it among the paths to the chosen node.
"""
from __future__ import annotations

import json
import math
from fractions import Fraction
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from ..errors import ConfigError
from .flow_model import FlowResult, Portion, Problem, default_paths, link_loads
from .lp import LP, LPError


@dataclass
class LPSolution:
    rate: float  # lambda of the relaxation (an upper bound of GRIA's optimum)
    # worker -> node -> list of (path, rate); rates scaled so each worker's total is lambda
    flows: dict[int, dict[int, list[tuple[list[int], float]]]]
    y: dict[int, float]
    agg_path: dict[int, list[int]]
    seconds: float
    shape: tuple[int, int]
    build_seconds: float = 0.0


@dataclass
class GridPlan:
    """The output of GRID planning: the routing policy and the figures of Theorems 5 to 7."""

    problem: Problem
    lp: LPSolution
    seed: int
    assignment: dict[int, tuple[int, list[int], float]]  # worker -> (aggregation node, path, rate)
    result: FlowResult
    violations: dict[str, float] = field(default_factory=dict)
    bounds: dict[str, float] = field(default_factory=dict)

    def policy(self) -> dict:
        """The routing policy as a JSON-able dict (consumed by the packet simulator later).

        Rates are those at which the rounded routing fits every capacity: ``rate_gbps`` (=
        ``feasible_rate_gbps``), each worker's ``rate_gbps`` and each switch's
        ``aggregated_rate_gbps`` are R-GRIA's divided by the worst violation factor.
        ``lp_rate_gbps`` is the LP bound (R-GRIA's lambda equals it, Theorem 7), which the rounded
        plan overloads some capacity at when ``violations`` has a factor above 1."""
        pb, n = self.problem, self.problem.name
        feasible = self.result.extra["feasible_rate_gbps"]
        scale = feasible / self.result.rate if self.result.rate > 0 else 1.0
        return {
            "kind": "grid-routing-policy",
            "version": 1,
            "ps": n(pb.ps),
            "seed": self.seed,
            "rate_gbps": feasible,
            "lp_rate_gbps": self.lp.rate,
            "feasible_rate_gbps": feasible,
            "violations": self.violations,
            "bounds": self.bounds,
            # How the plan was found (plan_grid_best); no wall time, so the JSON is deterministic.
            "search": {k: self.result.extra[k] for k in SEARCH_KEYS if k in self.result.extra},
            "workers": [
                {"worker": n(w), "aggregation_node": n(v), "path": [n(x) for x in path], "rate_gbps": rate * scale}
                for w, (v, path, rate) in sorted(self.assignment.items())
            ],
            "switches": [
                {"switch": n(s), "aggregated_rate_gbps": y * scale, "workers": sorted(n(w) for w, a in self.assignment.items()
                                                                                      if a[0] == s),
                 "path_to_ps": [n(x) for x in path], "capacity_gbps": float(pb.capacity[s])}
                for s, (y, path) in sorted(self.result.agg_streams.items())
            ],
        }

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self.policy(), indent=indent)


# ---------------------------------------------------------------- the LP relaxation


def candidate_paths(pb: Problem) -> dict[int, dict[int, list[list[int]]]]:
    """worker -> aggregation node (programmable switches, then the PS) -> candidate paths."""
    net, out = pb.net, {}
    defaults = default_paths(pb)
    for w in pb.workers:
        per: dict[int, list[list[int]]] = {}
        for v in pb.programmable + [pb.ps]:
            paths = net.shortest_paths(w, v, pb.max_paths, salt=w)
            d = defaults[w]
            if v in d:  # the default route's prefix, so fixed-route schemes are LP-feasible
                prefix = d[: d.index(v) + 1]
                if prefix not in paths:
                    paths.append(prefix)
            if paths:
                per[v] = paths
        out[w] = per
    return out


def solve_lp(pb: Problem) -> LPSolution:
    import time

    t0 = time.perf_counter()
    net, ps, S = pb.net, pb.ps, pb.programmable
    T = float(pb.ps_ingress)
    cands = candidate_paths(pb)
    agg_path = {s: net.default_path(s, ps, salt=s) for s in S}
    S = [s for s in S if agg_path[s]]  # a switch without a path to the PS cannot aggregate
    lp = LP()
    lam = lp.var(cost=1.0, name="lambda")
    y = {s: lp.var(cost=-1e-7, name=f"y_{s}") for s in S}
    r: dict[tuple[int, int], list[tuple[int, list[int]]]] = {}
    link_terms: dict[tuple[int, int], list] = {}
    for w in pb.workers:
        xs = []
        total = []
        for v, paths in cands[w].items():
            if v != ps and v not in y:
                continue
            x = lp.var(hi=1.0, name=f"x_{w}_{v}")
            xs.append((x, 1.0))
            cols = []
            for p in paths:
                c = lp.var(cost=-1e-7 * len(p), name=f"r_{w}_{v}")
                cols.append((c, p))
                for e in zip(p, p[1:]):
                    link_terms.setdefault(e, []).append((c, 1.0))
            r[(w, v)] = cols
            total += [(c, 1.0) for c, _ in cols]
            lp.row([(c, 1.0) for c, _ in cols] + [(x, -T)], hi=0.0)  # r_n^s <= x_n^s T
            if v != ps:
                lp.row([(c, 1.0) for c, _ in cols] + [(y[v], -1.0)], hi=0.0)  # r_n^s <= y_s
        lp.row(xs, 1.0, 1.0)  # sum_s x_n^s = 1
        lp.row([(lam, 1.0)] + [(c, -1.0) for c, _ in total], hi=0.0)  # lambda <= sum_s r_n^s
    for s in S:
        terms = [(c, 1.0) for w in pb.workers for c, _ in r.get((w, s), [])]
        if terms:
            lp.row(terms, hi=float(pb.capacity[s]))  # processing capacity
        for e in zip(agg_path[s], agg_path[s][1:]):
            link_terms.setdefault(e, []).append((y[s], 1.0))
    ps_terms = [(c, 1.0) for w in pb.workers for c, _ in r.get((w, ps), [])] + [(y[s], 1.0) for s in S]
    lp.row(ps_terms, hi=float(pb.ps_ingress))  # PS ingress bandwidth
    for e, terms in link_terms.items():  # link capacities (the extension)
        lp.row(terms, hi=float(net.cap[e]))
    build = time.perf_counter() - t0
    try:
        x = lp.solve()
    except LPError as e:
        raise ConfigError("analysis", str(e)) from None
    rate = float(x[lam])
    if rate <= 1e-12:
        raise ConfigError("analysis", "the GRIA LP gives every worker a zero rate: check capacities")
    flows: dict[int, dict[int, list]] = {}
    for w in pb.workers:
        per = {}
        for v in cands[w]:
            got = [(p, float(x[c])) for c, p in r.get((w, v), []) if x[c] > 1e-12]
            if got:
                per[v] = got
        tot = sum(q for lst in per.values() for _, q in lst)
        scale = rate / tot if tot > 0 else 0.0
        flows[w] = {v: [(p, q * scale) for p, q in lst] for v, lst in per.items()}
    ys = {s: max((sum(q for _, q in flows[w].get(s, [])) for w in pb.workers), default=0.0) for s in S}
    return LPSolution(rate, flows, ys, agg_path, lp.solve_s, lp.shape, build)


def lp_result(pb: Problem, sol: LPSolution) -> FlowResult:
    """The fractional LP solution as a FlowResult (portions split over nodes and paths)."""
    portions = [Portion(w, v, p, q) for w in pb.workers for v, lst in sol.flows[w].items() for p, q in lst]
    streams = {s: (y, sol.agg_path[s]) for s, y in sol.y.items() if y > 1e-12}
    return FlowResult("grid-lp", pb, sol.rate, portions, link_loads(portions, streams), streams,
                      bottleneck="LP optimum", extra={"lp_seconds": sol.seconds})


# ---------------------------------------------------------------- R-GRIA


def draw(pb: Problem, sol: LPSolution, seed: int) -> dict[int, tuple[int, list[int]]]:
    """One R-GRIA rounding (Algorithm 1): per worker, an aggregation node and a path drawn with
    probability proportional to the LP's flow on them."""
    rng = np.random.default_rng(seed)
    choice = {}
    for w in pb.workers:
        options = [(v, p, q) for v, lst in sol.flows[w].items() for p, q in lst]
        weights = np.array([q for _, _, q in options])
        k = int(rng.choice(len(options), p=weights / weights.sum()))
        choice[w] = options[k][:2]
    return choice


def round_solution(pb: Problem, sol: LPSolution, seed: int) -> GridPlan:
    """R-GRIA: one rounding of the LP (``seed``), as a plan."""
    return plan_of(pb, sol, draw(pb, sol, seed), seed)


def plan_of(pb: Problem, sol: LPSolution, choice: dict[int, tuple[int, list[int]]], seed: int) -> GridPlan:
    """The plan that sends each worker's gradients to ``choice[w]`` = (aggregation node, path),
    every worker at the LP's rate (R-GRIA's r_n^{s_n} = sum_s r~_n^s = lambda, Theorem 7), with its
    measured violation factors; ``feasible_rate_gbps`` is that rate over the worst of them."""
    assignment = {w: (v, path, sum(q for lst in sol.flows[w].values() for _, q in lst)) for w, (v, path) in choice.items()}
    rates = {w: a[2] for w, a in assignment.items()}
    portions = [Portion(w, v, p, q) for w, (v, p, q) in assignment.items()]
    streams = {}
    for w, (v, _, q) in assignment.items():
        if v != pb.ps:
            streams[v] = (max(streams.get(v, (0.0, None))[0], q), sol.agg_path[v])  # y^_s = max r_n^{s_n}
    res = FlowResult("grid", pb, min(rates.values()), portions, link_loads(portions, streams), streams)
    # measured violation factors (load / capacity; <= 1 means the constraint holds)
    net = pb.net
    proc_at = max(res.switch_load.items(), key=lambda kv: kv[1] / float(pb.capacity[kv[0]]), default=None)
    proc = proc_at[1] / float(pb.capacity[proc_at[0]]) if proc_at else 0.0
    bw = res.ps_aggregation / float(pb.ps_ingress)
    link_at = max(res.link_load.items(), key=lambda kv: kv[1] / float(net.cap[kv[0]]), default=None)
    link = link_at[1] / float(net.cap[link_at[0]]) if link_at else 0.0
    viol = {"processing": proc, "bandwidth": bw, "link": link}
    worst = max(1.0, proc, bw, link)
    if worst <= 1.0:
        res.bottleneck = "LP optimum (the plan fits every capacity)"
    else:
        what = max([(proc, f"processing of {pb.name(proc_at[0])}" if proc_at else ""), (bw, "PS ingress"),
                    (link, f"link {pb.name(link_at[0][0])}->{pb.name(link_at[0][1])}" if link_at else "")],
                   key=lambda t: t[0])[1]
        res.bottleneck = f"{what} (the plan at the LP bound loads it {worst:.3g}x)"
    res.extra = {"lp_rate_gbps": sol.rate, "feasible_rate_gbps": res.rate / worst,
                 "violation_processing": proc, "violation_bandwidth": bw, "violation_link": link,
                 "lp_seconds": sol.seconds}
    return GridPlan(pb, sol, seed, assignment, res, viol, theorem_bounds(pb, sol))


def theorem_bounds(pb: Problem, sol: LPSolution) -> dict[str, float]:
    """The violation bounds of Theorems 5 and 6 for this instance, computed as the paper does.

    Theorem 5: nu = C_min / (|N| T); the factor is 2 if nu >= 3 log|S|, else log|S|/nu + 3.
    Theorem 6: the PS ingress carries worker streams (B1) and switch streams (B2); each part's
    factor is bounded like Theorem 5 (2 under the paper's assumption B_i >= 3 log(count), with
    B_i in Gbps), and the total is their sum (4 under the assumption). log is base 10, as the
    paper's numbers (3 log 50 = 5.09) imply. These are high-probability bounds, not certainties.
    """
    T, N, S = float(pb.ps_ingress), len(pb.workers), max(len(pb.capacity), 1)
    cmin = float(min(pb.capacity.values())) if pb.capacity else T

    def factor(nu: float, count: int) -> float:
        lg = math.log10(max(count, 1))
        return 2.0 if nu >= 3 * lg else lg / nu + 3.0

    b1 = sum(q for w in pb.workers for _, q in sol.flows[w].get(pb.ps, []))
    b2 = sum(sol.y.values())

    def part(b: float, count: int) -> float:
        if b <= 1e-12 or b >= 3 * math.log10(max(count, 1)):
            return 2.0
        return math.log10(count) / (b / (count * T)) + 3.0

    return {"processing": factor(cmin / (N * T), S), "bandwidth": part(b1, N) + part(b2, S)}


# ---------------------------------------------------------------- the best integral plan

# R-GRIA draws `plan_grid` takes by default, and the most (worker, node, path) options for which it
# also solves the integral problem exactly (a MILP, HiGHS), within MILP_TIME_LIMIT_S seconds.
# What `policy()["search"]` reports of the search (plan_grid_best).
SEARCH_KEYS = ("method", "milp", "lp_gap", "r_gria_rate_gbps", "baseline_rates_gbps", "rounding_trials")
DEFAULT_DRAWS = 16
IMPROVED_DRAWS = 4
MILP_MAX_OPTIONS = 400
# The MILP stops at MILP_MAX_NODES branch-and-bound nodes, which keeps plans deterministic; the
# time limit is only a backstop (a plan it cut short could differ between machines).
MILP_MAX_NODES = 20_000
MILP_TIME_LIMIT_S = 60.0


class _Loads:
    """How many unit streams each resource carries under a choice of (node, path) per worker, and
    the rate every worker then gets: the least capacity / count. Resources: each programmable
    switch's processing (the workers aggregating there), the PS's ingress (the workers sending
    there and one stream per switch in use) and each directed link (worker streams up to their
    node, and each switch in use's stream to the PS)."""

    def __init__(self, pb: Problem, agg_path: dict[int, list[int]], choice: dict):
        self.pb, self.agg_path = pb, agg_path
        self.cap = {("ps",): float(pb.ps_ingress)}
        self.cap.update({("sw", s): float(c) for s, c in pb.capacity.items()})
        self.cap.update({("link", e): float(c) for e, c in pb.net.cap.items()})
        self.count: dict = {}
        self.users: dict[int, int] = {}
        self.choice = dict(choice)
        for w, c in self.choice.items():
            self._apply(self._delta(None, c), c, +1)

    def _own(self, c):
        v, path = c
        return [("link", e) for e in zip(path, path[1:])] + [("ps",) if v == self.pb.ps else ("sw", v)]

    def _stream(self, s):
        return [("link", e) for e in zip(self.agg_path[s], self.agg_path[s][1:])] + [("ps",)]

    def _delta(self, old, new) -> dict:
        d: dict = {}
        for c, sign in ((old, -1), (new, +1)):
            if c is None:
                continue
            for r in self._own(c):
                d[r] = d.get(r, 0) + sign
        ov, nv = (old[0] if old else None), (new[0] if new else None)
        if ov != nv:
            if ov is not None and ov != self.pb.ps and self.users.get(ov, 0) == 1:
                for r in self._stream(ov):
                    d[r] = d.get(r, 0) - 1
            if nv is not None and nv != self.pb.ps and self.users.get(nv, 0) == 0:
                for r in self._stream(nv):
                    d[r] = d.get(r, 0) + 1
        return {r: k for r, k in d.items() if k}

    def _apply(self, d, c, sign):
        for r, k in d.items():
            self.count[r] = self.count.get(r, 0) + k
        if c[0] != self.pb.ps:
            self.users[c[0]] = self.users.get(c[0], 0) + sign

    def ratios(self) -> list[tuple[float, tuple]]:
        return sorted((self.cap[r] / k, r) for r, k in self.count.items() if k > 0)

    @staticmethod
    def score(ratios: list[tuple[float, tuple]]) -> tuple[float, int]:
        """(rate, - resources at it): a move that keeps the rate but frees a bottleneck is progress."""
        if not ratios:
            return (math.inf, 0)
        lam = ratios[0][0]
        return (lam, -sum(1 for q, _ in ratios if q <= lam * (1 + 1e-12)))

    def score_after(self, ratios, d) -> tuple[float, int]:
        """``score`` once the counts change by ``d``, reading the unchanged resources off ``ratios``."""
        changed = [(self.cap[r] / (self.count.get(r, 0) + k), r) for r, k in d.items() if self.count.get(r, 0) + k > 0]
        lam = next((q for q, r in ratios if r not in d), math.inf)
        lam = min([lam] + [q for q, _ in changed])
        tight = sum(1 for q, r in changed if q <= lam * (1 + 1e-12))
        for q, r in ratios:
            if q > lam * (1 + 1e-12):
                break
            tight += r not in d
        return (lam, -tight)

    def move(self, w, new):
        old = self.choice[w]
        d = self._delta(old, new)
        if old[0] != self.pb.ps:
            self.users[old[0]] -= 1
        self._apply(d, new, +1)
        self.choice[w] = new


def options(pb: Problem, sol: LPSolution, extra: list[dict] = ()) -> dict[int, list[tuple[int, list[int]]]]:
    """Per worker, every (aggregation node, path) GRID's data plane can give it: the LP's candidate
    paths to each node that can reach the PS, and any choice in ``extra``."""
    cands = candidate_paths(pb)
    out = {w: [(v, p) for v, paths in cands[w].items() if v == pb.ps or v in sol.agg_path and sol.agg_path[v]
               for p in paths] for w in pb.workers}
    for choice in extra:
        for w, c in choice.items():
            if c not in out[w]:
                out[w].append(c)
    return out


def improve(pb: Problem, sol: LPSolution, choice: dict, opts: dict) -> dict:
    """Local improvement: while moving one worker to another of its options raises the rate (or
    keeps it and leaves fewer resources at it), make the best such move."""
    loads = _Loads(pb, sol.agg_path, choice)
    for _ in range(50 * len(pb.workers)):
        ratios = loads.ratios()
        now = loads.score(ratios)
        best = None
        tight = {r for q, r in ratios if q <= now[0] * (1 + 1e-12)}
        for w in pb.workers:
            cur = loads.choice[w]
            # Only a worker that loads a bottleneck (itself, or as its switch's last user) can relieve it.
            mine = loads._own(cur) + (loads._stream(cur[0]) if cur[0] != pb.ps and loads.users[cur[0]] == 1 else [])
            if tight.isdisjoint(mine):
                continue
            for c in opts[w]:
                if c == cur:
                    continue
                sc = loads.score_after(ratios, loads._delta(cur, c))
                if sc[0] > now[0] * (1 + 1e-12) or (sc[0] >= now[0] * (1 - 1e-12) and sc[1] > now[1]):
                    if best is None or sc > best[0]:
                        best = (sc, w, c)
        if best is None:
            break
        loads.move(best[1], best[2])
    return loads.choice


def rate_of(pb: Problem, sol: LPSolution, choice: dict) -> float:
    """The rate every worker gets under ``choice`` (the least capacity / count)."""
    return _Loads.score(_Loads(pb, sol.agg_path, choice).ratios())[0]


def baseline_choices(pb: Problem, sol: LPSolution) -> dict[str, dict]:
    """The baselines expressible on GRID's data plane (one node and one path per worker), as
    choices: ``switchml`` (its ToR if programmable, else the PS; GRID §6.1), ``atp-once`` (the
    first programmable switch on its default route, "aggregated in-network once at most", §4.2)
    and ``geryon`` (no aggregation: the PS on its default route)."""
    out = {}
    routes = default_paths(pb)
    usable = {s for s, p in sol.agg_path.items() if p}

    def at(w, v):
        r = routes[w]
        return (v, r[: r.index(v) + 1])
    out["switchml"] = {w: at(w, routes[w][1] if routes[w][1] in usable else pb.ps) for w in pb.workers}
    out["atp-once"] = {w: at(w, next((x for x in routes[w][1:-1] if x in usable), pb.ps)) for w in pb.workers}
    out["geryon"] = {w: at(w, pb.ps) for w in pb.workers}
    return out


def solve_milp(pb: Problem, sol: LPSolution, opts: dict, time_limit_s: float = MILP_TIME_LIMIT_S):
    """GRIA as a MILP (eq. (1), with one path per worker among its options): the best integral
    plan, or HiGHS's best within MILP_MAX_NODES nodes or ``time_limit_s``. Returns (choice or
    None, HiGHS's status, gap)."""
    ps, T = pb.ps, float(pb.ps_ingress)
    lp = LP(time_limit_s=time_limit_s, max_nodes=MILP_MAX_NODES)
    lam = lp.var(cost=1.0, name="lambda")
    S = sorted({v for w in pb.workers for v, _ in opts[w] if v != ps})
    y = {s: lp.var(name=f"y_{s}") for s in S}
    z, link_terms, at = {}, {}, {}
    for w in pb.workers:
        zs, rs = [], []
        for k, (v, p) in enumerate(opts[w]):
            zk, rk = lp.var(hi=1.0, integer=True, name=f"z_{w}_{k}"), lp.var(name=f"r_{w}_{k}")
            z[(w, k)] = zk
            zs.append((zk, 1.0))
            rs.append((rk, 1.0))
            lp.row([(rk, 1.0), (zk, -T)], hi=0.0)  # r <= T z: only the chosen option carries
            for e in zip(p, p[1:]):
                link_terms.setdefault(e, []).append((rk, 1.0))
            at.setdefault(v, []).append((rk, 1.0))
            if v != ps:
                lp.row([(rk, 1.0), (y[v], -1.0)], hi=0.0)  # y_s >= r
        lp.row(zs, 1.0, 1.0)
        lp.row([(lam, 1.0)] + [(c, -1.0) for c, _ in rs], hi=0.0)  # lambda <= the worker's rate
    for s in S:
        lp.row(at.get(s, []), hi=float(pb.capacity[s]))
        for e in zip(sol.agg_path[s], sol.agg_path[s][1:]):
            link_terms.setdefault(e, []).append((y[s], 1.0))
    lp.row(at.get(ps, []) + [(y[s], 1.0) for s in S], hi=T)
    for e, terms in link_terms.items():
        lp.row(terms, hi=float(pb.net.cap[e]))
    try:
        x = lp.solve()
    except LPError as e:
        return None, str(e), math.inf
    choice = {w: opts[w][max(range(len(opts[w])), key=lambda k: x[z[(w, k)]])] for w in pb.workers}
    return choice, lp.status, lp.gap


def plan_grid_best(pb: Problem, seed: int = 1, trials: int = DEFAULT_DRAWS, milp: Optional[bool] = None) -> GridPlan:
    """The best plan found: ``trials`` R-GRIA roundings (seeds seed, seed+1, ...) and the
    baselines on GRID's data plane, the best IMPROVED_DRAWS draws and every baseline improved
    locally (:func:`improve`); with ``milp`` (by
    default when the instance has at most MILP_MAX_OPTIONS options) also the exact integral
    optimum. The plan's ``extra`` names the ``method`` that won, the rate of the first rounding
    (``r_gria_rate_gbps``), ``milp`` ("optimal", "stopped (HiGHS's status), gap g", "not run") and
    ``lp_gap`` = 1 - feasible rate / LP bound."""
    import time

    t0 = time.perf_counter()
    sol = solve_lp(pb)
    base = baseline_choices(pb, sol)
    opts = options(pb, sol, list(base.values()))
    draws = [(f"R-GRIA draw {seed + t}", draw(pb, sol, seed + t)) for t in range(max(1, trials))]
    found = [(rate_of(pb, sol, c), name, c) for name, c in draws]
    found += [(rate_of(pb, sol, c), f"{name} baseline", c) for name, c in base.items()]
    # Improved: the IMPROVED_DRAWS best draws (the first on ties) and every baseline.
    starts = sorted(found[: len(draws)], key=lambda f: -f[0])[:IMPROVED_DRAWS] + found[len(draws):]
    for _, name, c in starts:
        better = improve(pb, sol, c, opts)
        found.append((rate_of(pb, sol, better), f"{name}, improved", better))
    n_opts = sum(len(o) for o in opts.values())
    milp_note = "not run"
    if milp if milp is not None else n_opts <= MILP_MAX_OPTIONS:
        c, status, gap = solve_milp(pb, sol, opts)
        optimal = status == "Optimal"
        if c is not None:
            found.append((rate_of(pb, sol, c), "MILP" + ("" if optimal else f" ({status})"), c))
            milp_note = "optimal" if optimal else f"stopped ({status}), gap {gap:.3g}"
    best_rate = max(r for r, _, _ in found)
    rate, name, choice = next(f for f in found if f[0] >= best_rate * (1 - 1e-12))  # the first at the best
    plan = plan_of(pb, sol, choice, seed)
    plan.result.extra.update({"method": name, "rounding_trials": trials, "r_gria_rate_gbps": found[0][0],
                              "milp": milp_note, "lp_gap": 1 - plan.result.extra["feasible_rate_gbps"] / sol.rate,
                              "baseline_rates_gbps": {n.split(" ")[0]: r for r, n, _ in found if n.endswith("baseline")},
                              "plan_seconds": time.perf_counter() - t0})
    return plan


def plan_grid(pb: Problem, seed: int = 1) -> GridPlan:
    """GRID's plan (:func:`plan_grid_best` with its defaults): the best integral plan found."""
    return plan_grid_best(pb, seed)


def baseline_policy(pb: Problem, scheme: str) -> dict:
    """A baseline as a policy for GRID's data plane (spec §1.7.6: the same packets, switches and
    congestion control, so that only where gradients go differs):

    * ``"switchml"`` (SwitchML "accelerated", GRID §6.1): a worker aggregates at its ToR if that
      is programmable, else at the PS; default routes (the flow model's);
    * ``"geryon"``: no aggregation; each worker sends to the PS on one path, taken from the
      flow-level Geryon plan by decomposing its flow (each worker in turn follows the link
      carrying the most flow left; a worker's rate is then taken off that path).

    ``feasible_rate_gbps`` is the flow model's rate of that scheme."""
    from .flow_model import geryon, switchml

    n = pb.name
    if scheme == "switchml":
        res = switchml(pb)
        route = {w: pb.net.default_path(w, pb.ps, salt=w) for w in pb.workers}
        node = {w: route[w][1] if route[w][1] in pb.capacity else pb.ps for w in pb.workers}
        workers = [{"worker": n(w), "aggregation_node": n(node[w]),
                    "path": [n(x) for x in (route[w][:2] if node[w] != pb.ps else route[w])]} for w in pb.workers]
        tors = sorted({v for v in node.values() if v != pb.ps})
        switches = [{"switch": n(s), "workers": sorted(n(w) for w in pb.workers if node[w] == s),
                     "path_to_ps": [n(x) for x in pb.net.default_path(s, pb.ps, salt=s)]} for s in tors]
    elif scheme == "geryon":
        res = geryon(pb)
        left = dict(res.link_load)
        workers = []
        for w in pb.workers:
            path = [w]
            while path[-1] != pb.ps:
                out = [(f, v) for (u, v), f in left.items() if u == path[-1] and v not in path]
                if not out:
                    raise ValueError(f"Geryon's flow has no path from {n(w)} to the PS")
                path.append(max(out)[1])
            for e in zip(path, path[1:]):
                left[e] = left[e] - res.rate
            workers.append({"worker": n(w), "aggregation_node": n(pb.ps), "path": [n(x) for x in path]})
        switches = []
    else:
        raise ConfigError("scheme", f"no baseline policy for {scheme!r}; allowed values: switchml, geryon")
    return {"kind": "grid-routing-policy", "version": 1, "ps": n(pb.ps), "baseline": scheme,
            "rate_gbps": res.rate, "feasible_rate_gbps": res.rate, "workers": workers, "switches": switches}


def auto_policy(built: dict, workers: list[str], ps: str, capacity_bps: dict[str, int], seed: int,
                milp: Optional[bool] = None) -> dict:
    """GRID's policy for a simulation scenario's job (``policy = "auto"``), computed at set-up as
    ``inalab plan grid`` would: the scenario's built topology, the PS's ingress its links' sum,
    a programmable switch's processing capacity its ``network.switch_capacity`` (unlisted: the
    sum of its link rates, all it could receive), the best plan :func:`plan_grid_best` finds
    from the scenario's seed; ``milp`` as there (``False``: R-GRIA's roundings, improved, and
    the baselines only, without the exact MILP, which can run to its time limit)."""
    from .network import GBPS, Net

    net = Net(built)
    names = net.names
    caps = {}
    for s in range(len(names)):
        if net.programmable[s] and not net.is_host[s]:
            cap = capacity_bps.get(names[s])
            caps[s] = Fraction(cap, GBPS) if cap else sum((net.cap[(u, s)] for u in net.adj[s]), Fraction(0))
    p = net.index[ps]
    ingress = sum((net.cap[(u, p)] for u in net.adj[p]), Fraction(0))
    pb = Problem(net, [net.index[w] for w in workers], p, ingress, caps)
    return plan_grid_best(pb, seed, milp=milp).policy()


def policy_for_job(policy, workers: list[str], servers: list[str], field: str = "policy") -> dict:
    """A routing policy (``GridPlan.policy()``, or the path of a file holding it) as the ``grid``
    scheme takes it: per worker, in the job's order, its aggregation node and its whole path to
    the PS (the path to the node, then the node's path to the PS), and its sending rate
    (``rate_gbps``, the plan's: the scheme paces it unless ``ina.pace`` is false). Raises ConfigError naming
    ``field`` when the policy does not fit the job."""
    if isinstance(policy, str):
        try:
            policy = json.loads(Path(policy).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(field, f"cannot read the policy {policy!r}: {e}") from None
    if not isinstance(policy, dict) or policy.get("kind") != "grid-routing-policy":
        raise ConfigError(field, 'not a GRID routing policy (kind = "grid-routing-policy", from `inalab plan grid`)')
    ps = policy.get("ps")
    if servers != [ps]:
        raise ConfigError(field, f"the policy's PS is {ps!r}; the job's server is {servers}")
    by_worker = {w["worker"]: w for w in policy.get("workers", [])}
    to_ps = {s["switch"]: s["path_to_ps"] for s in policy.get("switches", [])}
    missing = [w for w in workers if w not in by_worker]
    extra = sorted(set(by_worker) - set(workers))
    if missing or extra:
        raise ConfigError(field, f"the policy's workers differ from the job's: missing {missing}, not in the job {extra}")
    out = []
    for w in workers:
        e = by_worker[w]
        node, path = e["aggregation_node"], list(e["path"])
        if node != ps:
            if node not in to_ps:
                raise ConfigError(field, f"worker {w!r} aggregates at {node!r}, which has no path_to_ps")
            path = path + list(to_ps[node])[1:]
        out.append({"target": node, "path": path, "rate_gbps": float(e.get("rate_gbps", 0.0))})
    return {"workers": out}
