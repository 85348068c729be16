"""The analyze-scenario schema (``inalab analyze SCENARIO.toml``) and ``inalab.analyze``.

The ``[topology]`` section is exactly the simulator's (``inalab.config.Topology``); the other
keys describe one parameter-server job for the flow-level model. Every problem is a
``ConfigError`` naming the field.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, Optional, Union

import pandas as pd
from pydantic import ValidationError, model_validator

from ..config import (_HOSTS_TYPE, _REQUIRED, Hosts, OptRate, Rate, Topology, _from_validation, _Graph, _Model,
                      build_topology, opt, read_source)
from ..errors import ConfigError
from .flow_model import FlowResult, Problem
from .models import SCHEMES, run_scheme
from .network import GBPS, Net

SCENARIO_DIR = Path(__file__).resolve().parent.parent / "scenarios" / "analysis"

Scheme = Literal["geryon", "atp", "switchml", "grid"]


class AnalysisScenario(_Model):
    name: str = opt("analysis", "Scenario name, shown in results.", default_doc="the file's name without .toml")
    description: str = opt("", "One line describing the scenario.")
    seed: int = opt(1, "Seed of R-GRIA's rounding and of random capacities and programmable switches.", ge=0)
    topology: Topology = opt(_REQUIRED, "The network, as in simulation scenarios (see docs/config.md).",
                             type_doc="table")
    workers: Hosts = opt(_REQUIRED, 'Worker hosts: names and ranges (["h0", "h4..h7"]), a range or a count '
                         "(the first hosts).", type_doc=_HOSTS_TYPE)
    ps: Optional[str] = opt(None, "The parameter-server host.", default_doc="the last host that is not a worker")
    ps_ingress: OptRate = opt(None, "Ingress bandwidth of the PS (B_alpha; also GRID's T).",
                              default_doc="the sum of the PS's link rates")
    schemes: list[Scheme] = opt(list(SCHEMES), "Schemes to compute: geryon, atp, switchml, grid.")
    default_switch_capacity: Rate = opt("3.2Tbps", "Processing capacity of a programmable switch not listed in "
                                        "switch_capacity (and not drawn from switch_capacity_range).")
    switch_capacity: dict[str, Rate] = opt({}, 'Processing capacity per programmable switch, e.g. {S1 = "9Gbps"}.',
                                           type_doc="table of rate")
    switch_capacity_range: list[Rate] = opt(
        [], 'Two rates [low, high]: unlisted programmable switches get a capacity drawn uniformly (in whole Gbps) '
        'between them with `seed`, as in GRID section 6.3.', type_doc="list of two rates")
    programmable_fraction: Optional[float] = opt(
        None, "Make this fraction of all switches, drawn with `seed`, the programmable ones (GRID scenario (b)); "
        "replaces topology.programmable.", gt=0, le=1)
    max_paths: int = opt(4, "Candidate shortest paths per (worker, aggregation node) pair in GRID's LP.", gt=0)
    rounding_trials: int = opt(
        1, "R-GRIA roundings tried (seeds seed, seed+1, ...); the one with the smallest worst violation is "
        "kept. 1 is Algorithm 1 as published.", gt=0)
    bom: bool = opt(False, "Also compute Rina's bandwidth-occupation model with the programmable switches as INA "
                    "switches.")

    @model_validator(mode="after")
    def _range(self) -> "AnalysisScenario":
        if self.switch_capacity_range and (len(self.switch_capacity_range) != 2
                                           or self.switch_capacity_range[0] > self.switch_capacity_range[1]):
            raise ConfigError("switch_capacity_range", "give two rates [low, high] with low <= high")
        for s, c in self.switch_capacity.items():
            if c <= 0:
                raise ConfigError(f"switch_capacity.{s}", "must be positive; a switch with no processing "
                                  "capacity should not be programmable")
        if self.default_switch_capacity <= 0:
            raise ConfigError("default_switch_capacity", "must be positive")
        if self.ps_ingress is not None and self.ps_ingress <= 0:
            raise ConfigError("ps_ingress", "must be positive")
        if self.switch_capacity_range and self.switch_capacity_range[0] <= 0:
            raise ConfigError("switch_capacity_range", "the low end must be positive")
        return self

    # ---------------------------------------------------------------- resolution

    def problem(self) -> Problem:
        spec = self.topology.to_spec()
        rng = random.Random(self.seed)
        built0 = build_topology(spec)
        if self.programmable_fraction is not None:
            switches = [n["name"] for n in built0["nodes"] if n["kind"] == "switch"]
            k = max(1, round(self.programmable_fraction * len(switches)))
            spec = dict(spec, programmable={"names": sorted(rng.sample(switches, k), key=switches.index)})
        built = build_topology(spec)
        graph = _Graph(built)
        net = Net(built)
        if isinstance(self.workers, int):
            if self.workers > len(graph.hosts) - 1:
                raise ConfigError("workers", f"needs {self.workers} hosts plus a PS; the topology has "
                                  f"{len(graph.hosts)}")
            workers = graph.hosts[: self.workers]
        else:
            workers = graph.expand(self.workers, "workers")
        if self.ps is None:
            free = [h for h in graph.hosts if h not in workers]
            if not free:
                raise ConfigError("ps", "every host is a worker; no host is left for the PS")
            ps = free[-1]
        else:
            ps = graph.host(self.ps, "ps")
        caps: dict[int, Fraction] = {}
        for s, c in self.switch_capacity.items():
            i = net.index.get(graph.switch(s, f"switch_capacity.{s}"))
            if not net.programmable[i]:
                raise ConfigError(f"switch_capacity.{s}", f"{s!r} is not programmable in this topology")
        lo_hi = self.switch_capacity_range
        for s in net.switches:
            if not net.programmable[s]:
                continue
            name = net.names[s]
            if name in self.switch_capacity:
                caps[s] = Fraction(self.switch_capacity[name], GBPS)
            elif lo_hi:
                caps[s] = Fraction(rng.randint(-(-lo_hi[0] // GBPS), lo_hi[1] // GBPS))
            else:
                caps[s] = Fraction(self.default_switch_capacity, GBPS)
        ps_i = net.index[ps]
        ingress = (Fraction(self.ps_ingress, GBPS) if self.ps_ingress is not None
                   else sum((net.cap[(u, ps_i)] for u in net.adj[ps_i]), Fraction(0)))
        return Problem(net, [net.index[w] for w in workers], ps_i, ingress, caps, max_paths=self.max_paths)


@dataclass
class Analysis:
    """What ``inalab.analyze`` returns: one row per scheme and per-worker/switch/link tables."""

    name: str
    summary: pd.DataFrame
    workers: pd.DataFrame
    switches: pd.DataFrame
    links: pd.DataFrame
    results: dict[str, FlowResult] = field(default_factory=dict)
    plan: Any = None  # the GridPlan, if grid was computed
    bom: Optional[dict] = None

    def to_dict(self) -> dict:
        out = {"name": self.name, "schemes": json.loads(self.summary.to_json(orient="records"))}
        if self.bom is not None:
            out["bom"] = self.bom
        return out


def load_analysis(source: Union[str, Path, dict, AnalysisScenario]) -> AnalysisScenario:
    """An AnalysisScenario from a TOML path, a shipped analysis scenario name, TOML text or a dict."""
    if isinstance(source, AnalysisScenario):
        return source
    data = read_source(source, shipped_analyses(), "shipped analysis scenario")
    try:
        return AnalysisScenario.model_validate(data)
    except ValidationError as e:
        raise _from_validation(e) from None


def shipped_analyses() -> dict[str, Path]:
    return {p.stem: p for p in sorted(SCENARIO_DIR.glob("*.toml"))}


def analyze(source: Union[str, Path, dict, AnalysisScenario], *, seed: Optional[int] = None,
            schemes: Optional[list[str]] = None) -> Analysis:
    """Runs the flow-level model of every scheme of the scenario; returns DataFrames."""
    sc = load_analysis(source)
    if seed is not None:
        sc = sc.model_copy(update={"seed": seed})
    pb = sc.problem()
    results, plan = {}, None
    for scheme in schemes or sc.schemes:
        if scheme == "grid":
            from .grid import plan_grid_best

            plan = plan_grid_best(pb, sc.seed, sc.rounding_trials)
            results[scheme] = plan.result
        else:
            results[scheme] = run_scheme(pb, scheme, sc.seed)
    summary = pd.DataFrame([r.summary() for r in results.values()])
    cat = lambda frames: pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()  # noqa: E731
    bom_out = None
    if sc.bom:
        from .rina import bom

        b = bom(pb.net, pb.ps, pb.workers, set(pb.capacity))
        bom_out = {"throughput_gbps": b.throughput, "bottleneck": b.bottleneck}
    return Analysis(sc.name, summary, cat([r.workers_frame() for r in results.values()]),
                    cat([r.switches_frame() for r in results.values()]),
                    cat([r.links_frame() for r in results.values()]), results, plan, bom_out)
