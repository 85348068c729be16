"""The scenarios of ``inalab analyze`` / ``inalab plan`` and ``inalab.analyze``.

Two formats are accepted, told apart by their keys (docs/analysis.md, "Scenario"):

* the analysis format (``AnalysisScenario``; shipped in ``inalab/scenarios/analysis``): the
  simulator's ``[topology]`` (``inalab.config.Topology``) and top-level keys describing one
  parameter-server job for the flow-level model;
* a simulate scenario (``inalab.config.Scenario``, docs/config.md; it has ``[[jobs]]``): its
  topology, its one job with a parameter server (placed exactly as the simulator places it),
  ``network.switch_capacity`` for the programmable switches it lists, and the analysis format's
  defaults for everything else. What the flow model cannot use is reported in notes.

Every problem is a ``ConfigError`` naming the field as the user wrote it.
"""
from __future__ import annotations

import json
import random
import tomllib
import warnings
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, Optional, Union

import pandas as pd
from pydantic import PrivateAttr, ValidationError, model_validator

from .. import schemes as scheme_registry
from ..config import (_HOSTS_TYPE, _REQUIRED, Hosts, OptRate, Rate, Scenario, Topology, _from_validation, _Graph,
                      _Model, _place_jobs, build_topology, opt, read_source, shipped_scenarios)
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
        16, "R-GRIA roundings drawn (seeds seed, seed+1, ...). GRID's plan is the best integral plan found among "
        "them, the baselines on GRID's data plane (SwitchML's ToR, ATP's first switch, Geryon's PS), local "
        "moves from the 4 best draws and every baseline, and, with at most 400 (worker, node, path) options, "
        "the exact MILP (HiGHS, 20,000 nodes). 1 draw is Algorithm 1's.", gt=0)
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

    # Made from a simulate scenario: each of our fields -> the simulate scenario's field it came
    # from (``workers`` -> ``jobs[0].workers``), so that errors name what the user wrote.
    _origin: dict[str, str] = PrivateAttr(default_factory=dict)

    def user_error(self, e: ConfigError) -> ConfigError:
        """``e`` with its field named as in the scenario the user wrote (a simulate scenario's
        field where this was made from one)."""
        return _renamed(e, self._origin)

    # ---------------------------------------------------------------- resolution

    def problem(self) -> Problem:
        try:
            return self._problem()
        except ConfigError as e:
            raise self.user_error(e) from None

    def _problem(self) -> Problem:
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
    # What the flow model did not use of a simulate scenario, one line each (empty for an
    # analysis scenario).
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        out = {"name": self.name, "schemes": json.loads(self.summary.to_json(orient="records"))}
        if self.bom is not None:
            out["bom"] = self.bom
        if self.notes:
            out["notes"] = self.notes
        return out


class FlowModelNote(UserWarning):
    """A key of a simulate scenario that the flow model did not use (``inalab.analyze`` issues
    one per note when no ``notes`` list is given)."""


def load_analysis(source: Union[str, Path, dict, AnalysisScenario, Scenario], *, job: Optional[str] = None,
                  notes: Optional[list[str]] = None) -> AnalysisScenario:
    """The AnalysisScenario of a scenario in either format (docs/analysis.md): a TOML path, a
    shipped scenario's name (``inalab scenarios``), TOML text, a dict, an AnalysisScenario or an
    ``inalab.config.Scenario``.

    A simulate scenario's job with a parameter server is the one analysed; ``job`` names it
    where there are several. What the flow model does not use of a simulate scenario is appended
    to ``notes`` as one line each, or, without a list, issued as :class:`FlowModelNote` warnings."""
    got: list[str] = []
    sc = _load(source, job, got)
    _deliver(got, notes)
    return sc


def _deliver(got: list[str], notes: Optional[list[str]]) -> None:
    if notes is not None:
        notes.extend(got)
    else:
        for note in got:
            warnings.warn(note, FlowModelNote, stacklevel=3)


def _load(source, job: Optional[str], notes: list[str]) -> AnalysisScenario:
    if isinstance(source, AnalysisScenario):
        _no_job(job)
        return source
    if isinstance(source, Scenario):
        return _from_simulate(source, job, notes)
    data = read_source(source, shipped(), "shipped scenario")
    if scenario_format(data) == "analysis":
        _no_job(job)
        try:
            return AnalysisScenario.model_validate(data)
        except ValidationError as e:
            raise _from_validation(e) from None
    try:
        sim = Scenario.model_validate(data)
    except ValidationError as e:
        raise _from_validation(e) from None
    return _from_simulate(sim, job, notes)


def _no_job(job: Optional[str]) -> None:
    if job is not None:
        raise ConfigError("job", "applies only to a simulate scenario (one with [[jobs]]); an analysis scenario "
                          "describes its one job with workers and ps")


# Keys only one format has (name, description, seed and topology are in both).
SIMULATE_KEYS = tuple(k for k in Scenario.model_fields if k not in AnalysisScenario.model_fields)
ANALYSIS_KEYS = tuple(k for k in AnalysisScenario.model_fields if k not in Scenario.model_fields)


def scenario_format(data: dict) -> Literal["simulate", "analysis"]:
    """Which format the raw table ``data`` is in, by its keys: a simulate scenario has [[jobs]]
    (or another of SIMULATE_KEYS), an analysis scenario `workers` (or another of ANALYSIS_KEYS).
    A table with keys of both, or of neither, is a ConfigError naming both formats."""
    sim = [k for k in data if k in SIMULATE_KEYS]
    ana = [k for k in data if k in ANALYSIS_KEYS]
    if sim and ana:
        raise ConfigError("scenario", f"mixes the two scenario formats: {', '.join(sim)} belong to a simulate "
                          f"scenario (docs/config.md), {', '.join(ana)} to an analysis scenario (docs/analysis.md); "
                          "write one or the other")
    if sim:
        return "simulate"
    if ana:
        return "analysis"
    found = ", ".join(str(k) for k in data) or "none"
    raise ConfigError("scenario", "neither a simulate scenario (docs/config.md: [topology] and [[jobs]]; its other keys "
                      f"are {', '.join(k for k in SIMULATE_KEYS if k != 'jobs')}) nor an analysis scenario "
                      "(docs/analysis.md: [topology] and workers; its other keys are "
                      f"{', '.join(k for k in ANALYSIS_KEYS if k != 'workers')}); this one's keys: {found}")


def ps_schemes() -> list[str]:
    """The schemes whose jobs have a parameter server (the registry's `servers` is not "none")."""
    return [n for n, s in scheme_registry.registry().items() if s["servers"] != "none"]


def _from_simulate(sim: Scenario, job: Optional[str], notes: list[str]) -> AnalysisScenario:
    """The analysis of ``sim``'s job with a parameter server; appends to ``notes`` what the flow
    model does not use."""
    built = build_topology(sim.topology.to_spec())
    graph = _Graph(built)
    placed = _place_jobs(sim.jobs, sim.background, graph)  # the simulator's own placement
    takers = ps_schemes()
    what = f"the flow model analyses one job with a parameter server (schemes {', '.join(takers)})"
    if not sim.jobs:
        only = f"; it has only [[flows]] ({len(sim.flows)})" if sim.flows else ""
        raise ConfigError("jobs", f"{what}; this scenario has no [[jobs]]{only}")
    with_ps = [i for i, p in enumerate(placed) if p["scheme"] in takers]
    if not with_ps:
        listed = ", ".join(f"{p['name']!r} (scheme {p['scheme']})" for p in placed)
        raise ConfigError("jobs", f"{what}; none of this scenario's jobs has one: {listed}")
    names = [placed[i]["name"] for i in with_ps]
    if job is None:
        if len(with_ps) > 1:
            raise ConfigError("job", f"{len(with_ps)} jobs have a parameter server; pick one with --job NAME "
                              f"(job=NAME in Python); allowed values: {', '.join(names)}")
        k = with_ps[0]
    else:
        matches = [i for i in with_ps if placed[i]["name"] == job]
        if not matches:
            other = next((p for p in placed if p["name"] == job), None)
            why = (f"job {job!r} (scheme {other['scheme']}) has no parameter server" if other
                   else f"no job named {job!r}")
            raise ConfigError("job", f"{why}; allowed values: {', '.join(names)}")
        if len(matches) > 1:
            raise ConfigError("job", f"{len(matches)} jobs are named {job!r} "
                              f"({', '.join(f'jobs[{i}]' for i in matches)}); give them distinct names")
        k = matches[0]
    spec, j = placed[k], sim.jobs[k]

    programmable = {n["name"] for n in built["nodes"] if n["kind"] == "switch" and n.get("programmable")}
    capacity = {}
    for s, v in sim.network.switch_capacity.items():
        graph.switch(s, f"network.switch_capacity.{s}")
        if s in programmable:
            capacity[s] = f"{v}bps"
        else:
            notes.append(f"network.switch_capacity.{s}: ignored by the flow model: {s!r} is not programmable in "
                         "this topology, so it aggregates nothing")

    # Keys set in the scenario that the flow model has no use for, in the schema's order.
    ignored = [key for key in ("payload", "payload_values", "stop", "metrics") if key in sim.model_fields_set]
    ignored += [f"network.{key}" for key in type(sim.network).model_fields
                if key in sim.network.model_fields_set and key != "switch_capacity"]
    ignored += [f"jobs[{k}].{key}" for key in type(j).model_fields
                if key in j.model_fields_set and key not in ("name", "scheme", "workers", "servers")]
    if ignored:
        notes.append(f"ignored by the flow model, which computes steady sending rates (no packets, queues, "
                     f"losses or time): {', '.join(ignored)}")
    if j.scheme not in SCHEMES:
        notes.append(f"jobs[{k}].scheme: the flow model has no {j.scheme!r} model; it computes "
                     f"{', '.join(SCHEMES)} for this job's workers and PS")
    if len(spec["servers"]) > 1:
        notes.append(f"jobs[{k}].servers: the flow model has one PS, {spec['servers'][0]!r}; "
                     f"{', '.join(spec['servers'][1:])} ignored")
    others = [i for i in range(len(placed)) if i != k]
    if others:
        listed = ", ".join(f"jobs[{i}] ({placed[i]['name']!r}, scheme {placed[i]['scheme']})" for i in others)
        notes.append(f"{listed}: ignored by the flow model, which analyses one job, jobs[{k}] ({spec['name']!r}); "
                     "their traffic does not compete with it there")
    if sim.background is not None:
        notes.append("background: ignored by the flow model (no competing traffic)")
    if sim.flows:
        notes.append(f"flows ({len(sim.flows)}): ignored by the flow model (no competing traffic)")
    if sim.failures:
        notes.append(f"failures ({len(sim.failures)}): ignored by the flow model (every node and link is up)")

    origin = {"workers": f"jobs[{k}].workers", "ps": f"jobs[{k}].servers", "switch_capacity": "network.switch_capacity"}
    data = {"name": sim.name, "description": sim.description, "seed": sim.seed, "topology": sim.topology,
            "workers": spec["workers"], "ps": spec["servers"][0], "switch_capacity": capacity}
    try:
        sc = AnalysisScenario.model_validate(data)
    except ValidationError as e:
        raise _renamed(_from_validation(e), origin) from None
    sc._origin = origin
    return sc


def _renamed(e: ConfigError, origin: dict[str, str]) -> ConfigError:
    """``e`` with a field of ours renamed to the one in ``origin`` it came from."""
    for ours, theirs in origin.items():
        if e.field == ours or e.field.startswith(ours + "."):
            return ConfigError(theirs + e.field[len(ours):], e.message)
    return e


def shipped_analyses() -> dict[str, Path]:
    """Analysis-format scenarios shipped in ``inalab/scenarios/analysis``, by name."""
    return {p.stem: p for p in sorted(SCENARIO_DIR.glob("*.toml"))}


def shipped() -> dict[str, Path]:
    """Every shipped scenario, both formats, by name: what ``inalab analyze`` and ``inalab plan``
    accept. Two files of one name are a ConfigError: a name must mean one scenario wherever it
    is accepted."""
    sims, ana = shipped_scenarios(), shipped_analyses()
    clash = sorted(set(sims) & set(ana))
    if clash:
        listed = "; ".join(f"{n!r}: {sims[n]} and {ana[n]}" for n in clash)
        raise ConfigError("scenarios", f"two shipped scenarios share a name ({listed}); rename one so that every "
                          "name means one scenario")
    return dict(sorted({**sims, **ana}.items()))


def catalog() -> list[dict]:
    """Every shipped scenario, sorted by name: ``{name, format, for, jobs, description, path}``.

    ``for``: the commands that take it by name. A simulate scenario is for ``simulate``, one
    named ``emulate-*`` (sized for ``inalab emulate``'s limits) also for ``emulate``, and one
    with a job with a parameter server also for ``analyze`` and ``plan``; ``jobs`` lists those
    jobs (with several, ``--job NAME`` picks one). An analysis scenario is for ``analyze`` and
    ``plan``. Raises ConfigError if two shipped scenarios share a name."""
    takers = set(ps_schemes())
    rows = []
    for name, path in shipped().items():
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError("scenarios", f"cannot read the shipped scenario {str(path)!r}: {e}") from None
        fmt = scenario_format(data)
        if fmt == "analysis":
            uses, jobs = ["analyze", "plan"], []
        else:
            uses = ["simulate"] + (["emulate"] if name.startswith("emulate-") else [])
            raw = data.get("jobs") if isinstance(data.get("jobs"), list) else []
            jobs = [(jb.get("name") or f"job{i}") for i, jb in enumerate(raw)
                    if isinstance(jb, dict) and jb.get("scheme") in takers]
            if jobs:
                uses += ["analyze", "plan"]
        rows.append({"name": name, "format": fmt, "for": uses, "jobs": jobs,
                     "description": data.get("description", ""), "path": str(path)})
    return rows


def analyze(source: Union[str, Path, dict, AnalysisScenario, Scenario], *, seed: Optional[int] = None,
            schemes: Optional[list[str]] = None, job: Optional[str] = None,
            notes: Optional[list[str]] = None) -> Analysis:
    """Runs the flow-level model of every scheme of the scenario (either format, see
    :func:`load_analysis` for ``job`` and ``notes``); returns DataFrames. ``Analysis.notes``
    holds what the flow model did not use of a simulate scenario."""
    got: list[str] = []
    sc = _load(source, job, got)
    _deliver(got, notes)
    if seed is not None:
        sc = sc.model_copy(update={"seed": seed})
    try:
        return _analyze(sc, schemes, got)
    except ConfigError as e:
        raise sc.user_error(e) from None


def _analyze(sc: AnalysisScenario, schemes: Optional[list[str]], notes: list[str]) -> Analysis:
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
                    cat([r.links_frame() for r in results.values()]), results, plan, bom_out, notes)
