"""The user-facing scenario schema: what users write in TOML, validated before any simulation.

This module is the single home of user-facing defaults and units. ``load_scenario`` reads a
scenario (TOML file, shipped scenario name, TOML text, dict) into a :class:`Scenario`;
``Scenario.to_spec()`` turns it into the exact ``SimSpec`` JSON of the Rust simulator (integer
picoseconds, bits/s and bytes), resolving host ranges against the topology that the simulator
itself builds. Every problem is raised as :class:`ConfigError` naming the field, e.g.
``jobs[1].workers: host 'h3' is already a worker of job 'ring' (jobs[0])``.

``python -m inalab.config --markdown`` prints the reference (docs/config.md) from this schema.
"""
from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator
from pydantic_core import PydanticCustomError

from . import schemes
from .errors import ConfigError
from .units import DURATION, RATE, SIZE, Unit

__all__ = ["ConfigError", "Scenario", "load_scenario", "shipped_scenarios", "SCENARIO_DIR", "markdown_reference"]

SCENARIO_DIR = Path(__file__).with_name("scenarios")

# Defaults shared by several fields. 100 Gbps is today's common server NIC and ToR port; 1 us per
# hop is a typical intra-datacenter hop: roughly 0.5 us of switch port-to-port latency plus
# ~100 m of fiber at 5 ns/m.
DEFAULT_LINK_RATE = "100Gbps"
DEFAULT_LINK_DELAY = "1us"
DEFAULT_SWITCH_PORTS = 64
DEFAULT_PACKET = "1500B"


# ---------------------------------------------------------------- field types and helpers


class _UnitTag:
    """Marks an annotated field as a quantity of ``unit`` (read by the markdown generator)."""

    def __init__(self, unit: Unit):
        self.unit = unit


def _quantity(unit: Unit, optional: bool = False):
    def parse(value: Any) -> Any:
        return None if (optional and value is None) else unit.parse(value)

    inner = Optional[int] if optional else int
    return Annotated[inner, BeforeValidator(parse), _UnitTag(unit)]


Duration = _quantity(DURATION)
OptDuration = _quantity(DURATION, optional=True)
Rate = _quantity(RATE)
Size = _quantity(SIZE)
OptSize = _quantity(SIZE, optional=True)
OptRate = _quantity(RATE, optional=True)

_RANGE = re.compile(r"^([A-Za-z_][A-Za-z_]*?)(\d+)\.\.([A-Za-z_][A-Za-z_]*?)?(\d+)$")


def _host_selection(value: Any) -> Any:
    """Accepts a count (int), a name or range string, or a list of names and ranges."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise ConfigError("", f"a host count must be positive, got {value}")
        return value
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    raise ConfigError(
        "", f'expected a list of host names (["h0", "h1"]), a range ("h0..h7") or a count (8); got {value!r}'
    )


def _programmable(value: Any) -> Any:
    if value in ("all", "none", "tor"):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise ConfigError("", f'expected "all", "none", "tor" or a list of switch names; got {value!r}')


Hosts = Annotated[Any, BeforeValidator(_host_selection)]
Programmable = Annotated[Any, BeforeValidator(_programmable)]

_REQUIRED = ...


def opt(default: Any, text: str, *, default_doc: str | None = None, type_doc: str | None = None, **kw) -> Any:
    """A field whose description states its default and, for quantities, its unit.

    ``default_doc`` replaces the shown default where the real one is derived (e.g. "same as
    host_rate"); ``type_doc`` replaces the type shown in the reference.
    """
    shown = "required" if default is _REQUIRED else (default_doc or _show(default))
    extra = {"doc": text, "default_doc": shown}
    if type_doc:
        extra["type_doc"] = type_doc
    desc = f"{text} {'Required' if default is _REQUIRED else 'Default: ' + shown}."
    return Field(default, description=desc, json_schema_extra=extra, **kw)


def _show(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "none"
    if value == [] or value == {}:
        return "empty"
    return str(value)


def _unwrap(annotation: Any) -> tuple[Any, list]:
    """(inner type, metadata) with Optional and Annotated peeled off."""
    meta: list = []
    while True:
        if get_origin(annotation) is Annotated:
            annotation, *more = get_args(annotation)
            meta += more
        elif get_origin(annotation) is Union and type(None) in get_args(annotation):
            annotation = next(a for a in get_args(annotation) if a is not type(None))
        else:
            return annotation, meta


def _unit_of(field) -> Optional[Unit]:
    _, meta = _unwrap(field.annotation)
    return next((m.unit for m in meta + field.metadata if isinstance(m, _UnitTag)), None)


class _Model(BaseModel):
    # strict: no silent coercion ("16" is not 16); validate_default: defaults written with units
    # go through the same parsers as user values.
    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        # Reported here, rather than by extra="forbid", to list the keys that are allowed.
        if isinstance(data, dict):
            for key in data:
                if key not in cls.model_fields:
                    raise PydanticCustomError(
                        "unknown_key", "unknown key", {"key": key, "allowed": ", ".join(cls.model_fields)}
                    )
        return data

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        # Quantity fields learn their unit from their type, so descriptions state it without
        # repeating it at every field.
        super().__pydantic_init_subclass__(**kwargs)
        changed = False
        for field in cls.model_fields.values():
            unit = _unit_of(field)
            if unit and "Unit:" not in (field.description or ""):
                field.description += f" Unit: {unit.kind} ({unit.accepted})."
                changed = True
        if changed:
            cls.model_rebuild(force=True)


# ---------------------------------------------------------------- topology


class _Topology(_Model):
    def shape(self) -> dict:
        raise NotImplementedError

    def to_spec(self) -> dict:
        p = self.programmable
        return {"shape": self.shape(), "programmable": {"names": p} if isinstance(p, list) else p}


_PROGRAMMABLE_DOC = (
    'Switches that run the INA program: "all", "none", "tor" (only switches with hosts attached) '
    "or a list of switch names."
)
_PROGRAMMABLE_TYPE = '"all", "none", "tor" or list of names'
_DELAY_DOC = "Propagation plus switching delay of every link, each direction."


class Star(_Topology):
    kind: Literal["star"] = opt(_REQUIRED, "One switch `s0` with hosts `h0..h{hosts-1}`.")
    hosts: int = opt(_REQUIRED, "Number of hosts.", gt=0)
    switch_ports: int = opt(DEFAULT_SWITCH_PORTS, "Ports of the switch; must be >= hosts.", gt=0)
    link_rate: Rate = opt(DEFAULT_LINK_RATE, "Rate of every host link.")
    link_delay: Duration = opt(DEFAULT_LINK_DELAY, _DELAY_DOC)
    programmable: Programmable = opt("all", _PROGRAMMABLE_DOC, type_doc=_PROGRAMMABLE_TYPE)

    def shape(self) -> dict:
        return {"kind": "star", "hosts": self.hosts, "switch_ports": self.switch_ports,
                "link_rate_bps": self.link_rate, "link_delay_ps": self.link_delay}


class LeafSpine(_Topology):
    kind: Literal["leaf_spine"] = opt(
        _REQUIRED, "Two tiers: leaves `leaf{i}` with hosts, every leaf linked to every spine `spine{j}`."
    )
    leaves: int = opt(_REQUIRED, "Number of leaf (ToR) switches.", gt=0)
    spines: int = opt(_REQUIRED, "Number of spine switches.", gt=0)
    hosts_per_leaf: int = opt(_REQUIRED, "Hosts under each leaf; hosts are numbered leaf by leaf.", gt=0)
    switch_ports: int = opt(DEFAULT_SWITCH_PORTS, "Ports per switch; a leaf needs hosts_per_leaf + spines.", gt=0)
    host_rate: Rate = opt(DEFAULT_LINK_RATE, "Rate of host-leaf links.")
    fabric_rate: OptRate = opt(None, "Rate of leaf-spine links.", default_doc="same as host_rate")
    link_delay: Duration = opt(DEFAULT_LINK_DELAY, _DELAY_DOC)
    programmable: Programmable = opt("all", _PROGRAMMABLE_DOC, type_doc=_PROGRAMMABLE_TYPE)

    def shape(self) -> dict:
        return {"kind": "leaf_spine", "leaves": self.leaves, "spines": self.spines,
                "hosts_per_leaf": self.hosts_per_leaf, "switch_ports": self.switch_ports,
                "host_rate_bps": self.host_rate,
                "fabric_rate_bps": self.host_rate if self.fabric_rate is None else self.fabric_rate,
                "link_delay_ps": self.link_delay}


class CanaryFatTree(LeafSpine):
    kind: Literal["canary_fat_tree"] = opt(
        _REQUIRED, "The Canary paper's 1024-host two-level fat tree: a `leaf_spine` preset whose "
        "parameters can be overridden."
    )
    leaves: int = opt(32, "Number of leaf (ToR) switches.", gt=0)
    spines: int = opt(32, "Number of spine switches.", gt=0)
    hosts_per_leaf: int = opt(32, "Hosts under each leaf; hosts are numbered leaf by leaf.", gt=0)


class FatTree(_Topology):
    kind: Literal["fat_tree"] = opt(
        _REQUIRED, "k-ary three-tier fat tree: k pods of k/2 `edge{p}_{i}` and k/2 `agg{p}_{i}` switches, "
        "(k/2)^2 `core{i}` switches, k^3/4 hosts."
    )
    k: int = opt(_REQUIRED, "Ports per switch; an even number >= 2.")
    link_rate: Rate = opt(DEFAULT_LINK_RATE, "Rate of every link.")
    link_delay: Duration = opt(DEFAULT_LINK_DELAY, _DELAY_DOC)
    programmable: Programmable = opt("all", _PROGRAMMABLE_DOC, type_doc=_PROGRAMMABLE_TYPE)

    def shape(self) -> dict:
        return {"kind": "fat_tree", "k": self.k, "link_rate_bps": self.link_rate, "link_delay_ps": self.link_delay}


class Dragonfly(_Topology):
    kind: Literal["dragonfly"] = opt(
        _REQUIRED, "g groups of a routers `r{g}_{i}`, all-to-all inside a group, h global links per router."
    )
    a: int = opt(_REQUIRED, "Routers per group.", gt=0)
    g: int = opt(_REQUIRED, "Number of groups; at most a*h + 1.", gt=0)
    h: int = opt(_REQUIRED, "Global links per router.", ge=0)
    p: Optional[int] = opt(None, "Hosts per router.", default_doc="same as h", gt=0)
    link_rate: Rate = opt(DEFAULT_LINK_RATE, "Rate of host and intra-group links.")
    global_rate: OptRate = opt(None, "Rate of global (inter-group) links.", default_doc="same as link_rate")
    link_delay: Duration = opt(DEFAULT_LINK_DELAY, _DELAY_DOC)
    programmable: Programmable = opt("all", _PROGRAMMABLE_DOC, type_doc=_PROGRAMMABLE_TYPE)

    def shape(self) -> dict:
        return {"kind": "dragonfly", "a": self.a, "g": self.g, "h": self.h,
                "p": self.h if self.p is None else self.p, "link_rate_bps": self.link_rate,
                "global_rate_bps": self.link_rate if self.global_rate is None else self.global_rate,
                "link_delay_ps": self.link_delay}


class EdgeNode(_Model):
    name: str = opt(_REQUIRED, "Node name, unique.")
    kind: Literal["host", "switch"] = opt(_REQUIRED, "Whether the node is a host or a switch.")
    tier: Optional[int] = opt(
        None, "Tier for up/down routing and ToR selection.", default_doc="0 for hosts, 1 for switches", ge=0, le=255
    )


class EdgeLink(_Model):
    a: str = opt(_REQUIRED, "One end (node name).")
    b: str = opt(_REQUIRED, "The other end (node name).")
    rate: Rate = opt(DEFAULT_LINK_RATE, "Link rate, each direction.")
    delay: Duration = opt(DEFAULT_LINK_DELAY, "Propagation plus switching delay, each direction.")


class Edges(_Topology):
    kind: Literal["edges"] = opt(_REQUIRED, "An explicit graph of named nodes and links.")
    nodes: list[EdgeNode] = opt(_REQUIRED, "The nodes.")
    links: list[EdgeLink] = opt(_REQUIRED, "The full-duplex links.")
    programmable: Programmable = opt("all", _PROGRAMMABLE_DOC, type_doc=_PROGRAMMABLE_TYPE)

    def shape(self) -> dict:
        nodes = [{"name": n.name, "kind": n.kind} | ({} if n.tier is None else {"tier": n.tier}) for n in self.nodes]
        links = [{"a": l.a, "b": l.b, "rate_bps": l.rate, "delay_ps": l.delay} for l in self.links]
        return {"kind": "edges", "nodes": nodes, "links": links}


TOPOLOGIES: dict[str, type[_Topology]] = {
    "star": Star, "leaf_spine": LeafSpine, "canary_fat_tree": CanaryFatTree,
    "fat_tree": FatTree, "dragonfly": Dragonfly, "edges": Edges,
}
Topology = Annotated[Union[tuple(TOPOLOGIES.values())], Field(discriminator="kind")]


# ---------------------------------------------------------------- network


class LinkLoss(_Model):
    a: str = opt(_REQUIRED, "One end of the link (node name).")
    b: str = opt(_REQUIRED, "The other end (node name).")
    prob: float = opt(_REQUIRED, "Probability that a packet crossing the link, either direction, is lost.", ge=0, le=1)


class HostLoss(_Model):
    host: str = opt(_REQUIRED, "Host name.")
    prob: float = opt(_REQUIRED, "Probability that a packet the host sends or receives is lost.", ge=0, le=1)


class HostCost(_Model):
    hosts: str = opt(_REQUIRED, 'A host name, or "workers" / "servers" (every host with a worker / a server of a job), or "all". '
                     "A later entry overrides an earlier one for the same host.")
    per_packet: Duration = opt("0s", "CPU time per packet the host sends or receives (0: free).")
    copy_rate: Rate = opt("0Gbps", "Rate at which the host copies a packet's bytes, sent or received (0: free).")


class Network(_Model):
    buffer: Size = opt(
        "1MiB", "Drop-tail buffer of every switch egress port (with flow_control = \"pfc\" or \"credit\" nothing "
        "is dropped and it is only the base of adaptive_threshold)."
    )
    ecn_threshold: Size = opt("200KB", "Queue length above which a packet is ECN-marked on enqueue.")
    flow_control: Literal["drop_tail", "pfc", "credit"] = opt(
        "drop_tail", '"drop_tail": a switch egress port that is full drops; "pfc": a lossless fabric by '
        "802.1Qbb-style pause (one traffic class): a switch holding more than pfc_xoff bytes that came in "
        "through one port pauses the sender at the other end of that link (a switch port or a host NIC), one "
        "link delay later, and resumes it at pfc_xon; \"credit\": lossless by credits, as SST's merlin routers: a "
        "port sends into a switch only while that switch holds less than credit_buffer bytes that came in "
        "through the link, each credit coming back one link delay after its bytes left the switch. Either way "
        "nothing is dropped for lack of buffer, the packets a switch makes of one packet (a multicast's copies) "
        "are held once, and the links' results gain pfc_pauses (under credits: waits for credits), pfc_paused_s, "
        "pfc_pauses_sent and pfc_max_ingress_bytes."
    )
    credit_buffer: Size = opt(
        "14KB", 'Credits (flow_control = "credit"): the bytes a switch holds for each link into it, the most it '
        "ever holds from that link (SST ember's default per-port buffer, defaultParams.py). A flow through a "
        "buffer smaller than the credit loop (2 x link delay x rate, 7.5 KB at 100 Gbps and 300 ns) runs at "
        "buffer / loop."
    )
    # xoff: the PAUSE threshold. What arrives after it is the headroom, 2 x link delay x rate +
    # about 2 MTU (25 KB + 3 KB at 100 Gbps and 1 us), so each ingress port of a switch holds at
    # most ~95 KB: a shallow-buffer switch's share per port (12-32 MB shared by 32-64 ports of
    # 100 Gbps). xon: RESUME's first bytes come back 2 x link delay after it is sent, so xon
    # should cover that much draining (25 KB at 100 Gbps, 1 us) to keep the egress busy; the
    # 32 KiB gap to xoff keeps pause and resume from firing at every packet.
    pfc_xoff: Size = opt(
        "64KiB", 'PFC (flow_control = "pfc"): bytes from one ingress port held at a switch above which it pauses '
        "that port's sender. Each ingress port then holds at most about pfc_xoff + 2 x link delay x rate + "
        "2 MTU (the headroom: what is on the link and in service when the PAUSE lands), ~95 KB at 100 Gbps "
        "and 1 us."
    )
    pfc_xon: Size = opt(
        "32KiB", 'PFC (flow_control = "pfc"): the held bytes at or below which the switch resumes the sender; '
        "at most pfc_xoff. Keeping it above 2 x link delay x rate (25 KB at 100 Gbps and 1 us) keeps the "
        "egress busy until the resumed sender's bytes arrive."
    )
    routing: Literal["ecmp", "adaptive"] = opt(
        "ecmp", '"ecmp": one of the equal-cost ports by flow hash; "adaptive": Canary\'s up/down adaptive '
        "routing, leaving the flow's port when its queue exceeds adaptive_threshold x buffer."
    )
    adaptive_threshold: float = opt(
        0.5, 'Queue fraction of the buffer that makes adaptive routing pick another port (routing = "adaptive" only).',
        gt=0, le=1,
    )
    default_port: Literal["flow_hash", "destination"] = opt(
        "flow_hash", 'Which equal-cost port a packet takes unless adaptive routing moves it: "flow_hash" = a hash of '
        'its flow, salted per switch (ECMP); "destination" = the destination host\'s index modulo the number of '
        "ports, the same at every switch (merlin's fat-tree routing in SST, the network of Canary's evaluation): a "
        "leaf's hosts spread exactly over its up ports. Canary's switches follow it with jobs[].ina.routing = "
        '"network".'
    )
    link_loss: list[LinkLoss] = opt([], "Random loss on links.")
    host_loss: list[HostLoss] = opt([], "Random loss at hosts.")
    host_costs: list[HostCost] = opt(
        [], "Hosts' processing costs (default: every host is free). A host's CPU takes one packet at a time, sends "
            "and receives alike, for per_packet plus its bytes at copy_rate, and prepares the next packet to send "
            "while the NIC serializes this one, so it sends at the lower of its NIC's and its CPU's rates. Its time "
            "on packets is the host counter cpu_busy_ns."
    )
    switch_capacity: dict[str, Rate] = opt(
        {}, "Processing-capacity limit per switch name, e.g. {s0 = \"1Tbps\"} (GRID's C_s, a Tofino's aggregation "
            "rate): a FIFO charged, in wire bytes, only with the packets the switch's INA program aggregates (every "
            "program's; transit, results and control packets pass at line rate), ECN-marking above "
            "ecn_threshold and dropping above buffer (drop-tail); what it outputs joins its egress queue once "
            "processed. Unlisted switches are unlimited.",
        type_doc="table of rate",
    )
    aggregator_memory: Size = opt("5MB", "Aggregator memory of every programmable switch, split equally among the INA programs its jobs use there.")
    switch_memory: dict[str, Size] = opt(
        {}, "Per-switch overrides of aggregator_memory, e.g. {s0 = \"10MB\"}.", type_doc="table of size"
    )

    @model_validator(mode="after")
    def _threshold_needs_adaptive(self) -> "Network":
        if "adaptive_threshold" in self.model_fields_set and self.routing != "adaptive":
            raise ConfigError("adaptive_threshold", 'applies only with routing = "adaptive"')
        return self

    @model_validator(mode="after")
    def _pfc_thresholds(self) -> "Network":
        for name, needs in (("pfc_xoff", "pfc"), ("pfc_xon", "pfc"), ("credit_buffer", "credit")):
            if name in self.model_fields_set and self.flow_control != needs:
                raise ConfigError(name, f'applies only with flow_control = "{needs}"')
        if not 0 < self.credit_buffer < 1 << 32:
            raise ConfigError("credit_buffer", f"must be a size from 1 B to 4 GiB, got {self.credit_buffer} B")
        if self.pfc_xoff <= 0:
            raise ConfigError("pfc_xoff", f"must be a positive size, got {self.pfc_xoff} B")
        if self.pfc_xon > self.pfc_xoff:
            raise ConfigError("pfc_xon", f"must be at most pfc_xoff ({self.pfc_xoff} B), got {self.pfc_xon} B")
        return self

    def flow_control_spec(self) -> Optional[dict]:
        """The spec's `flow_control`, or None for drop-tail (left out, so those specs are unchanged)."""
        if self.flow_control == "drop_tail":
            return None
        if self.flow_control == "credit":
            return {"kind": "credit", "buffer_bytes": self.credit_buffer}
        return {"kind": "pfc", "xoff_bytes": self.pfc_xoff, "xon_bytes": self.pfc_xon}


# ---------------------------------------------------------------- jobs and traffic

# Each [jobs.ina] field and the scheme parameter it sets (filled from the registry below); a
# scheme takes the ones its registry entry lists, and setting one it does not take is an error.
INA_FIELDS: dict[str, str] = {}


def _taking(param: str) -> str:
    """ "schemes a and b" that take ``param``."""
    return "schemes " + " and ".join(n for n in schemes.names() if schemes.takes(n, param))


def _show_base(value: Any, unit: str) -> str:
    """A registry default in its base unit, as a user would write it."""
    if unit == "bytes":
        return f"{value} B"
    if unit == "ps":
        for name, ps in (("s", 10**12), ("ms", 10**9), ("us", 10**6), ("ns", 10**3)):
            if value % ps == 0:
                return f"{value // ps}{name}"
        return f"{value}ps"
    return _show(value)


def _show_bound(value: Any, unit: str) -> str:
    """A range's bound as a user would write it: sizes in binary units where exact (64KiB)."""
    if unit == "bytes" and value:
        for name, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if value % size == 0:
                return f"{value // size}{name}"
    return _show_base(value, unit)


def _allowed(ranges: dict[str, dict], unit: str) -> str:
    """ " Allowed: 1us to 60s." for the schemes' ranges of one parameter (the registry's bounds,
    which every job's configuration is checked against); per scheme where they differ. Names
    and booleans are described by the parameter's own text."""
    def words(r: dict) -> Optional[str]:
        if "min" not in r:
            return None
        return f"{_show_bound(r['min'], unit)} to {_show_bound(r['max'], unit)}"

    shown: dict[str, list[str]] = {}
    for scheme, r in ranges.items():
        w = words(r)
        if w is not None:
            shown.setdefault(w, []).append(scheme)
    if not shown:
        return ""
    if len(shown) == 1:
        return f" Allowed: {next(iter(shown))}."
    return " Allowed: " + "; ".join(f"{', '.join(names)}: {w}" for w, names in shown.items()) + "."


def _param_allowed(param: str) -> str:
    """ " Allowed: ..." of a parameter the hand-written models document (`transport.rto_ps`,
    `partition_bytes`), as the registry bounds it for every scheme that takes it."""
    for entry in schemes.registry().values():
        for p in entry["params"]:
            if p["name"] == param:
                return _allowed({"": p["range"]}, p["unit"])
    return ""


class Transport(_Model):
    mss: Size = opt("1436B", "Maximum segment (payload) size of a packet." + _param_allowed("transport.mss_bytes"))
    header: Size = opt("64B", "Header bytes added to every packet on the wire." + _param_allowed("transport.header_bytes"))
    rto: Duration = opt("1ms", "Retransmission timeout." + _param_allowed("transport.rto_ps"))
    init_window: Size = opt("60000B", "Initial congestion window." + _param_allowed("transport.init_window_bytes"))
    increment: Size = opt("1500B", "Additive increase of the window per round trip." + _param_allowed("transport.increment_bytes"))


def _ina_model() -> type:
    """[jobs.ina], built from the registry: one field per `ina.*` parameter of any scheme, named
    without its unit suffix (`timeout_ps` is `timeout`), typed by its unit; unset means the
    scheme's default. A new scheme's parameters appear here without a change to this file."""
    fields: dict = {}
    for scheme, entry in schemes.registry().items():
        for p in entry["params"]:
            if not p["name"].startswith("ina."):
                continue
            key = p["name"][len("ina."):]
            user = re.sub(r"_(bytes|ps)$", "", key)
            f = fields.setdefault(user, {"key": key, "unit": p["unit"], "docs": {}, "defaults": {}, "ranges": {}})
            f["defaults"][scheme] = p["default"]
            f["docs"].setdefault(p["doc"], []).append(scheme)
            f["ranges"][scheme] = p["range"]
    model_fields = {}
    for user, f in fields.items():
        kind = {"bytes": _quantity(SIZE, optional=True), "ps": _quantity(DURATION, optional=True)}.get(f["unit"])
        if kind is None:
            sample = next(iter(f["defaults"].values()))
            kind = Optional[type(sample)]
        shown = "; ".join(f"{n}: {_show_base(v, f['unit'])}" for n, v in f["defaults"].items())
        takers = ", ".join(f["defaults"])
        # Schemes that share a parameter may mean it differently (a static tree's re-send is
        # not Canary's request to a leader): each meaning with the schemes that have it.
        docs = f["docs"]
        doc = (f"{next(iter(docs))} Schemes: {takers}." if len(docs) == 1
               else " ".join(f"{', '.join(names)}: {d}" for d, names in docs.items()))
        doc += _allowed(f["ranges"], f["unit"])
        model_fields[user] = (kind, opt(None, doc, default_doc=f"the scheme's ({shown})"))
    INA_FIELDS.update({user: f["key"] for user, f in fields.items()})
    return create_model("Ina", __base__=_Model, **model_fields)


Ina = _ina_model()


_HOSTS_TYPE = 'list of names, "h0..h7" or count'


class Job(_Model):
    name: Optional[str] = opt(None, "Job name, shown in results.", default_doc='"job{index}"')
    scheme: Literal[schemes.names()] = opt(  # type: ignore[valid-type]  (the registry's names)
        _REQUIRED, "Allreduce scheme: " + "; ".join(f"{n}: {s['doc']}" for n, s in schemes.registry().items()) + "."
    )
    model: Optional[str] = opt(
        None, "Training workload: a model from the catalog (`inalab.models.list_models()`), or a profile file, "
        "a path ending in .json (e.g. written by `inalab.models.from_torch`; a relative path is relative to the "
        "scenario file's directory, or to the current directory for a scenario given as text or a table); "
        "exactly one of model and allreduce."
    )
    allreduce: OptSize = opt(None, "Benchmark workload: allreduce a tensor of this size, with no compute.")
    iterations: int = opt(1, "Training iterations, or allreduce repetitions.", gt=0, le=2**32 - 1)
    compute_scale: float = opt(
        1.0, "Multiplies every compute time of the model (0.5 = a GPU twice as fast as the profiled one).", gt=0
    )
    workers: Hosts = opt(
        _REQUIRED, 'Worker hosts in rank order: a list of names and ranges (["h0", "h4..h7"]), one range '
        '("h0..h7", both ends included) or a count (the first hosts no other job or background uses).',
        type_doc=_HOSTS_TYPE,
    )
    servers: Optional[Hosts] = opt(
        None, "Parameter-server hosts (schemes ps, atp, dsa and grid; atp, dsa and grid take exactly one; ps_sharded "
        "co-locates them with the workers). A host that several jobs name here is one PS serving them all, sharing "
        "its link (ATP's \"identical placement\"); one of the job's own worker hosts co-locates the PS with that "
        "worker, sharing its NIC (an INA scheme's packets still cross the switch; simulator only); a count takes "
        "hosts no job uses.",
        default_doc="ps, atp, dsa, grid: the next free host", type_doc=_HOSTS_TYPE,
    )
    start: Duration = opt("0s", "Simulated time at which the job starts.")
    jitter: Duration = opt("0s", "Each backward layer's compute is stretched by U(0, jitter); with allreduce, each "
                           "worker starts each allreduce U(0, jitter) late (stragglers).")
    send_order: Optional[list[str]] = opt(
        None, "The model's layer names in the order their gradients go to the allreduce; each waits until its "
        'backward pass ran and every one before it went (DSA §VII-B sends ["layer2.part0", "layer1.part0", '
        '"layer1.part1", "layer2.part1"]).',
        default_doc="the backward pass's order, each gradient as soon as it is computed", type_doc="array of strings",
    )
    partition: Size = opt("4MiB", "Tensor partition size for parameter servers." + _param_allowed("partition_bytes"))
    transport: Transport = opt(Transport(), "Transport parameters, see [jobs.transport] (atp uses init_window and "
                               "increment for its window).", default_doc="see below")
    ina: Ina = opt(Ina(), "In-network aggregation parameters of the INA schemes (atp, switchml, dsa, canary, rina, "
                   "static_tree, grid), see [jobs.ina].", default_doc="see below")
    policy: Optional[Union[str, dict]] = opt(
        None, "Scheme grid: the routing policy, a file written by `inalab plan grid --out` (or its JSON object): each "
        "worker's aggregation node and path to the PS, by node name; its PS must be the job's server. \"auto\": "
        "planned at set-up as `inalab plan grid` plans, from the topology, network.switch_capacity (unlisted "
        "programmable switches: the sum of their link rates) and the PS's links: GRID's LP, 16 R-GRIA roundings from "
        "the scenario's seed and the baselines, the best improved locally, and, on an instance of at most 400 "
        "options, the exact MILP (HiGHS, at most 60 s); the best plan wins.",
        default_doc="every worker sends to the PS", type_doc="path or table",
    )

    @field_validator("model")
    @classmethod
    def _known_model(cls, name: Optional[str]) -> Optional[str]:
        if name is not None:
            from .models import get_model

            try:
                get_model(name)  # a catalog name, or a profile file that loads
            except ValueError as e:
                raise ConfigError("", str(e).removeprefix("model: ")) from None
        return name

    @model_validator(mode="after")
    def _consistent(self) -> "Job":
        if (self.model is None) == (self.allreduce is None):
            raise ConfigError("model", 'give exactly one of model = "<name>" (training) or allreduce = "<size>"')
        if self.allreduce is not None and self.allreduce % 4 != 0:
            raise ConfigError("allreduce", f"must be a positive multiple of 4 B (float32 values), got {self.allreduce} B")
        if self.allreduce is not None and "compute_scale" in self.model_fields_set:
            raise ConfigError("compute_scale", "applies only to model workloads (allreduce has no compute)")
        if self.send_order is not None:
            if self.allreduce is not None:
                raise ConfigError("send_order", "applies only to model workloads (allreduce has one tensor)")
            from .models import get_model

            names = [layer["name"] for layer in get_model(self.model).to_workload()]
            if sorted(self.send_order) != sorted(names):
                shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
                raise ConfigError("send_order", f"must list each of the model's layers once; allowed values: {shown}")
        reg = schemes.registry()
        if self.servers is not None and reg[self.scheme]["servers"] == "none":
            takers = " and ".join(f'"{n}"' for n, s in reg.items() if s["servers"] != "none")
            raise ConfigError("servers", f"applies only to schemes {takers}, not {self.scheme!r}")
        if "ina" in self.model_fields_set and not schemes.takes(self.scheme, "ina"):
            raise ConfigError("ina", f"applies only to {_taking('ina')}, not {self.scheme!r}")
        for name in self.ina.model_fields_set:
            if not schemes.takes(self.scheme, f"ina.{INA_FIELDS[name]}"):
                raise ConfigError(f"ina.{name}", f"applies only to {_taking('ina.' + INA_FIELDS[name])}, not {self.scheme!r}")
        if "transport" in self.model_fields_set and not schemes.takes(self.scheme, "transport"):
            raise ConfigError("transport", f"applies only to {_taking('transport')}, not {self.scheme!r}")
        if "partition" in self.model_fields_set and not schemes.takes(self.scheme, "partition_bytes"):
            raise ConfigError("partition", f"applies only to {_taking('partition_bytes')}, not {self.scheme!r}")
        if self.policy is not None and not schemes.takes(self.scheme, "policy"):
            raise ConfigError("policy", f"applies only to {_taking('policy')}, not {self.scheme!r}")
        return self


class Background(_Model):
    hosts: Hosts = opt(
        _REQUIRED, "Hosts that send background traffic: names, a range, or a count of free hosts.",
        type_doc=_HOSTS_TYPE,
    )
    load: float = opt(_REQUIRED, "Offered load of each host as a fraction of its link rate.", gt=0, le=1)
    message: Size = opt("1MiB", "Size of each message, sent to a peer chosen by `pattern`.")
    packet: Size = opt(DEFAULT_PACKET, "Packet size on the wire.")
    start: Duration = opt("0s", "When background traffic starts.")
    pattern: Literal["uniform", "permutation"] = opt(
        "uniform",
        "How each message's receiver is chosen: `uniform`, a peer drawn uniformly among the other hosts afresh for every "
        "message (a receiver may have several senders at once); `permutation`, every host's r-th message follows a "
        "derangement drawn for round r, so each host sends to one peer and receives from exactly one (Canary §5.2: "
        "\"each host sends to one random host and receives from another\").",
    )
    closed_loop: bool = opt(
        False, "false: a host starts a message every message time / load (at its line rate) whatever became of the "
        "last, so a host its network slows builds a backlog of messages; true: it starts the next once the last has "
        "left its NIC, after the idle time that load leaves (none at load 1), so it never has more than one message "
        "outstanding.",
    )


class Flow(_Model):
    src: str = opt(_REQUIRED, "Sending host.")
    dst: str = opt(_REQUIRED, "Receiving host.")
    size: Size = opt(_REQUIRED, "Bytes to send, at line rate.")
    packet: Size = opt(DEFAULT_PACKET, "Packet size on the wire.")
    start: Duration = opt("0s", "When the flow starts.")
    path: Optional[list[str]] = opt(
        None,
        "A fixed path: node names from `src` to `dst`, used instead of ECMP (static trees, GRID).",
        default_doc="none (routing tables decide)",
    )


class Failure(_Model):
    node: Optional[str] = opt(
        None,
        "A switch that fails: it loses every packet queued in it or reaching it, its timers stop, and it comes "
        "back (at `until`) with a fresh switch program whose soft state is empty. Or a host: it stops for good (no "
        "`until`), and `detect` later its jobs' other workers are told; a scheme that goes on without a worker "
        "(Rina) rebuilds its ring over the survivors, any other fails the job, naming the worker. Give `node` or "
        "`link`, not both.",
        default_doc="none",
    )
    link: Optional[list[str]] = opt(
        None,
        'A link that fails, by the names of its two ends, e.g. `["s0", "s2"]`: packets on it either way, and '
        "packets sent into it while it is down, are lost. Give `node` or `link`, not both.",
        default_doc="none", type_doc="array of 2 strings",
    )
    at: Duration = opt(_REQUIRED, "When the switch or link fails.")
    until: OptDuration = opt(None, "When it comes back; without it, it stays down to the end of the run.", default_doc="none (never)")
    detect: OptDuration = opt(None, "A host's failure only: how long until its jobs' other workers are told (a membership "
                              "service's detection delay).", default_doc="1ms")

    @model_validator(mode="after")
    def _one_target(self) -> "Failure":
        if (self.node is None) == (self.link is None):
            both = ", not both" if self.node is not None else ""
            raise ConfigError("", f"give exactly one of node (a switch or host name) or link (two node names){both}")
        if self.link is not None and len(self.link) != 2:
            raise ConfigError("link", f'a link is given by its two end nodes, e.g. ["s0", "s2"]; got {len(self.link)} names')
        if self.until is not None and self.until <= self.at:
            raise ConfigError("until", "must be after `at`; leave it out for a failure that lasts to the end")
        return self


class Metrics(_Model):
    bin: Duration = opt("100us", "Width of a time-series bin.")


class Scenario(_Model):
    name: str = opt("scenario", "Scenario name, shown in results.", default_doc="the file's name without .toml")
    description: str = opt("", "One line shown by `inalab scenarios`.")
    seed: int = opt(1, "Seed of every random choice (loss, jitter, background peers); same seed, same result.", ge=0)
    payload: bool = opt(False, "Payload mode: packets carry real values, which are summed and checked.")
    payload_values: Literal["int", "float"] = opt(
        "int",
        "What payload mode sends: `int`, small integers whose sums must be exact; `float`, float32 tensors of "
        "magnitude 1e-3 to 1e35 (through each scheme's quantization), whose sums must be within the scheme's "
        "bound (`inalab.runtime.quantization_bound`).",
    )
    stop: Duration = opt("10s", "Simulated-time limit; the run ends there even if jobs have not finished.")
    topology: Topology = opt(_REQUIRED, "The network, see [topology].", type_doc="table")
    network: Network = opt(Network(), "Switch and link behaviour, see [network].", default_doc="see below")
    jobs: list[Job] = opt([], "Training or allreduce jobs, see [[jobs]].")
    background: Optional[Background] = opt(None, "Random background traffic, see [background].")
    flows: list[Flow] = opt([], "Raw line-rate flows, see [[flows]].")
    failures: list[Failure] = opt([], "Timed switch, host and link failures, see [[failures]]; routing avoids what is down.")
    metrics: Metrics = opt(Metrics(), "Measurement settings, see [metrics].", default_doc="see below")

    @model_validator(mode="after")
    def _has_work(self) -> "Scenario":
        if not self.jobs and not self.flows:
            raise ConfigError("jobs", "nothing to simulate: add at least one [[jobs]] or [[flows]] entry")
        return self

    def to_spec(self) -> dict:
        """The exact ``SimSpec`` JSON object for ``inalab._core.simulate``."""
        topology = self.topology.to_spec()
        built = build_topology(topology)
        net = _Graph(built)
        jobs = _place_jobs(self.jobs, self.background, net)
        n = self.network
        for i, (job, js) in enumerate(zip(self.jobs, jobs)):
            if job.policy == "auto":
                from .analysis.grid import auto_policy, policy_for_job

                if len(js["servers"]) != 1:
                    raise ConfigError(f"jobs[{i}].servers", "policy = \"auto\" plans for one PS")
                planned = auto_policy(built, js["workers"], js["servers"][0], n.switch_capacity, self.seed)
                js["policy"] = policy_for_job(planned, js["workers"], js["servers"], f"jobs[{i}].policy")
        spec = {
            "name": self.name,
            "seed": self.seed,
            "payload": self.payload,
            "payload_values": self.payload_values,
            "stop_ps": self.stop,
            "topology": topology,
            "network": {
                "buffer_bytes": n.buffer,
                "ecn_threshold_bytes": n.ecn_threshold,
                "routing": {"kind": "adaptive", "threshold": n.adaptive_threshold}
                if n.routing == "adaptive" else {"kind": "ecmp"},
                "default_port": n.default_port,
                "link_loss": [
                    {"a": net.link(l.a, l.b, f"network.link_loss[{i}]")[0], "b": l.b, "prob": l.prob}
                    for i, l in enumerate(n.link_loss)
                ],
                "host_loss": [
                    {"host": net.host(l.host, f"network.host_loss[{i}].host"), "prob": l.prob}
                    for i, l in enumerate(n.host_loss)
                ],
                "host_costs": [
                    {"hosts": c.hosts if c.hosts in ("all", "workers", "servers") else net.host(c.hosts, f"network.host_costs[{i}].hosts"),
                     "per_packet_ps": c.per_packet, "copy_bps": float(c.copy_rate)}
                    for i, c in enumerate(n.host_costs)
                ],
                "switch_capacity": [
                    {"switch": net.switch(s, f"network.switch_capacity.{s}"), "value": v}
                    for s, v in n.switch_capacity.items()
                ],
                "aggregator_memory_bytes": n.aggregator_memory,
                "switch_memory": [
                    {"switch": net.switch(s, f"network.switch_memory.{s}"), "value": v}
                    for s, v in n.switch_memory.items()
                ],
            },
            "jobs": jobs,
            "flows": [_flow_spec(i, f, net) for i, f in enumerate(self.flows)],
            "metrics": {"bin_ps": self.metrics.bin},
        }
        if (fc := n.flow_control_spec()) is not None:
            # Only for PFC, so drop-tail specs stay as they were.
            spec["network"]["flow_control"] = fc
        if self.failures:
            # Only when present, so specs without failures stay readable by older simulators.
            spec["failures"] = [_failure_spec(f) for f in self.failures]
        if self.background is not None:
            b = self.background
            spec["background"] = {
                "hosts": _background_hosts(b, self.jobs, jobs, net),
                "load": b.load, "message_bytes": b.message, "packet_bytes": b.packet, "start_ps": b.start,
                "pattern": b.pattern, "closed_loop": b.closed_loop,
            }
        return spec


# ---------------------------------------------------------------- resolution against the topology


def build_topology(topology: dict) -> dict:
    """The built topology from ``inalab._core``; its errors become ``ConfigError`` on the user's field names."""
    from . import _core

    try:
        return json.loads(_core.build_topology(json.dumps(topology)))
    except ValueError as e:
        raise rust_error(e, prefix="topology") from None


_RUST_SUFFIX = re.compile(r"_(bps|ps|bytes)\b")


def rust_error(e: ValueError, prefix: str = "") -> ConfigError:
    """A ``ValueError("field.path: message")`` from the simulator as a ConfigError on user names.

    Rust fields carry their base unit (``link_rate_bps``) where the user wrote ``link_rate``;
    ``prefix`` is the user-facing path of what was sent (``topology``), if the field lacks it.
    """
    field, sep, message = str(e).partition(": ")
    if not sep or " " in field.split("+")[0].strip():
        return ConfigError(prefix or "scenario", str(e))
    field = _RUST_SUFFIX.sub("", field)
    if prefix and not field.startswith(prefix):
        field = f"{prefix}.{field}"
    return ConfigError(field, message)


class _Graph:
    """Names of the built topology, for checking the hosts and switches a scenario refers to."""

    def __init__(self, built: dict):
        self.nodes = built["nodes"]
        self.kind = {n["name"]: n["kind"] for n in self.nodes}
        self.hosts = [n["name"] for n in self.nodes if n["kind"] == "host"]
        self.adjacent = set()
        for link in built["links"]:
            a, b = self.nodes[link["a"]]["name"], self.nodes[link["b"]]["name"]
            self.adjacent |= {(a, b), (b, a)}

    def describe_hosts(self) -> str:
        if self.hosts == [f"h{i}" for i in range(len(self.hosts))]:
            return f"this topology has hosts h0..h{len(self.hosts) - 1}"
        return f"this topology's hosts are {', '.join(self.hosts[:8])}{', ...' if len(self.hosts) > 8 else ''}"

    def host(self, name: str, field: str) -> str:
        kind = self.kind.get(name)
        if kind is None:
            raise ConfigError(field, f"no host named {name!r} ({self.describe_hosts()})")
        if kind != "host":
            raise ConfigError(field, f"{name!r} is a {kind}, not a host")
        return name

    def switch(self, name: str, field: str) -> str:
        kind = self.kind.get(name)
        if kind != "switch":
            what = "no node" if kind is None else f"a {kind}, not a switch,"
            raise ConfigError(field, f"{name!r} is {what} in this topology")
        return name

    def link(self, a: str, b: str, field: str) -> tuple[str, str]:
        for end, key in ((a, "a"), (b, "b")):
            if end not in self.kind:
                raise ConfigError(f"{field}.{key}", f"no node named {end!r}")
        if (a, b) not in self.adjacent:
            raise ConfigError(field, f"no link between {a!r} and {b!r}")
        return a, b

    def expand(self, selection: Any, field: str) -> list[str]:
        """Explicit names and ranges of a host selection, checked, in order, without repeats."""
        items = [selection] if isinstance(selection, str) else selection
        names: list[str] = []
        for item in items:
            m = _RANGE.match(item)
            if m and (m.group(3) in (None, m.group(1))):
                prefix, lo, hi = m.group(1), int(m.group(2)), int(m.group(4))
                if hi < lo:
                    raise ConfigError(field, f"empty range {item!r}: the end is below the start")
                names += [f"{prefix}{i}" for i in range(lo, hi + 1)]
            elif ".." in item:
                raise ConfigError(field, f'bad range {item!r}; write "h0..h7" (both ends included)')
            else:
                names.append(item)
        seen = set()
        for name in names:
            self.host(name, field)
            if name in seen:
                raise ConfigError(field, f"host {name!r} is listed twice")
            seen.add(name)
        return names


def _place_jobs(jobs: list[Job], background: Optional[Background], net: _Graph) -> list[dict]:
    """Job specs with every host resolved; a host belongs to at most one job, except a server
    host that several jobs name explicitly (one PS serving them all)."""
    # Explicit placements are resolved first, so counts ("workers = 8") take only hosts that no
    # job or background names anywhere in the file, whatever the order of the jobs.
    reserved: set[str] = set()
    explicit: dict[tuple[int, str], list[str]] = {}
    for i, job in enumerate(jobs):
        for role in ("workers", "servers"):
            sel = getattr(job, role)
            if sel is not None and not isinstance(sel, int):
                explicit[i, role] = net.expand(sel, f"jobs[{i}].{role}")
                reserved |= set(explicit[i, role])
    if background is not None and not isinstance(background.hosts, int):
        reserved |= set(net.expand(background.hosts, "background.hosts"))

    owner: dict[str, int] = {}  # host -> index of the job using it (as a worker, or as a counted server)
    shared: dict[str, set[int]] = {}  # server host -> the jobs that name it (they share one PS)
    specs = []
    for i, job in enumerate(jobs):
        name = job.name or f"job{i}"
        roles = {}
        for role in ("workers", "servers"):
            sel = getattr(job, role)
            if sel is None and role == "servers" and schemes.registry()[job.scheme]["servers"] != "none":
                sel = 1  # the next free host
            if sel is None:
                roles[role] = []
                continue
            field = f"jobs[{i}].{role}"
            hosts = explicit.get((i, role))
            if hosts is None:
                free = [h for h in net.hosts if h not in reserved and h not in owner]
                if len(free) < sel:
                    raise ConfigError(field, f"needs {sel} free hosts but only {len(free)} are left "
                                      f"({len(net.hosts)} hosts in the topology)")
                hosts = free[:sel]
            for h in hosts:
                # A server host that several jobs name is one PS serving them all (ATP Fig. 13:
                # "identical placement", the jobs sharing their PS and its link), and a job may
                # name one of its own workers' hosts as a server (co-located: the PS shares that
                # host's NIC, as the Rina paper's testbed places ATP's PS). Every other reuse of
                # a host is refused: another job's worker host, or a server host named twice by
                # one job.
                named = role == "servers" and (i, role) in explicit
                colocated = named and owner.get(h) == i and i not in shared.get(h, ())
                if not colocated and (h in owner or (not named and h in shared) or i in shared.get(h, ())):
                    other = owner[h] if h in owner else (i if i in shared[h] else min(shared[h]))
                    where = "this job" if other == i else f"job {specs[other]['name']!r} (jobs[{other}])"
                    raise ConfigError(field, f"host {h!r} is already used by {where}; only a server host may be "
                                      "named by several jobs (one PS serving them) or by its own job beside one of "
                                      "its workers (co-located)")
                if named:
                    shared.setdefault(h, set()).add(i)
                else:
                    owner[h] = i
            roles[role] = hosts
        if len(roles["workers"]) < 2:
            raise ConfigError(f"jobs[{i}].workers", "a job needs at least 2 workers")
        specs.append({
            "id": i,
            "name": name,
            "scheme": job.scheme,
            "workers": roles["workers"],
            "servers": roles["servers"],
            "workload": _workload(i, job),
            "start_ps": job.start,
            "jitter_ps": job.jitter,
            **_scheme_config(i, job, roles),
        })
    return specs


def _scheme_config(i: int, job: Job, roles: dict) -> dict:
    """The job's scheme configuration as the registry takes it: what the user set, in base units,
    checked by the scheme and with every default filled in (``_core.normalize_config``)."""
    from . import _core

    out: dict = {"scheme": job.scheme}
    if job.policy is not None and job.policy != "auto":  # "auto" is planned in to_spec
        from .analysis.grid import policy_for_job

        out["policy"] = policy_for_job(job.policy, roles["workers"], roles["servers"], f"jobs[{i}].policy")
    if schemes.takes(job.scheme, "transport"):
        t = job.transport
        out["transport"] = {"mss_bytes": t.mss, "header_bytes": t.header, "rto_ps": t.rto,
                            "init_window_bytes": t.init_window, "increment_bytes": t.increment}
    if schemes.takes(job.scheme, "partition_bytes"):
        out["partition_bytes"] = job.partition
    ina = {INA_FIELDS[name]: getattr(job.ina, name) for name in job.ina.model_fields_set}
    if ina:
        out["ina"] = ina
    try:
        return json.loads(_core.normalize_config(json.dumps(out)))
    except ValueError as e:
        field, _, message = str(e).partition(": ")
        if not field:  # about the configuration as a whole
            raise ConfigError(f"jobs[{i}]", message) from None
        raise rust_error(e, f"jobs[{i}]") from None


def _workload(i: int, job: Job) -> dict:
    if job.allreduce is not None:
        return {"kind": "allreduce", "bytes": job.allreduce, "iterations": job.iterations}
    from .models import get_model

    layers = get_model(job.model).scaled(job.compute_scale).to_workload()
    out = {"kind": "training", "layers": layers, "iterations": job.iterations}
    if job.send_order is not None:
        index = {layer["name"]: k for k, layer in enumerate(layers)}
        out["send_order"] = [index[name] for name in job.send_order]
    return out


def _background_hosts(b: Background, jobs: list[Job], job_specs: list[dict], net: _Graph) -> list[str]:
    if not isinstance(b.hosts, int):
        hosts = net.expand(b.hosts, "background.hosts")
    else:
        used = {h for j in job_specs for h in j["workers"] + j["servers"]}
        free = [h for h in net.hosts if h not in used]
        if len(free) < b.hosts:
            raise ConfigError("background.hosts", f"needs {b.hosts} free hosts but only {len(free)} are left")
        hosts = free[: b.hosts]
    if len(hosts) < 2:
        raise ConfigError("background.hosts", "background traffic needs at least 2 hosts")
    return hosts


def _flow_spec(i: int, f: Flow, net: _Graph) -> dict:
    src = net.host(f.src, f"flows[{i}].src")
    dst = net.host(f.dst, f"flows[{i}].dst")
    if src == dst:
        raise ConfigError(f"flows[{i}].dst", "a flow's destination must differ from its source")
    spec = {"src": src, "dst": dst, "bytes": f.size, "packet_bytes": f.packet, "start_ps": f.start}
    if f.path is not None:
        spec["path"] = f.path
    return spec


def _failure_spec(f: Failure) -> dict:
    # Names are checked by the simulator, which knows which nodes are switches and adjacent.
    spec: dict = {"node": f.node} if f.node is not None else {"link": list(f.link)}
    spec["at_ps"] = f.at
    if f.until is not None:
        spec["until_ps"] = f.until
    if f.detect is not None:
        spec["detect_ps"] = f.detect
    return spec


# ---------------------------------------------------------------- loading


def shipped_scenarios() -> dict[str, Path]:
    """Scenario name -> TOML file shipped in ``inalab/scenarios``."""
    return {p.stem: p for p in sorted(SCENARIO_DIR.glob("*.toml"))}


def load_scenario(source: Union[str, Path, dict, Scenario]) -> Scenario:
    """A validated Scenario from a TOML path, a shipped scenario name, TOML text, a dict or a Scenario."""
    if isinstance(source, Scenario):
        return source
    return _validate(read_source(source, shipped_scenarios(), "shipped scenario"))


def read_source(source: Union[str, Path, dict], shipped: dict[str, Path], what: str) -> dict:
    """The raw table of a scenario given as a dict, TOML text, a file path or the name of a
    shipped file (``what`` names that kind in errors); a file's name becomes the default ``name``."""
    if isinstance(source, dict):
        return dict(source)
    if isinstance(source, str) and "\n" in source:
        return _parse_toml(source, "scenario")
    path = Path(source)
    if not path.exists():
        if str(source) not in shipped:
            from .analysis.scenario import shipped_analyses

            hint = ""
            if what == "shipped scenario" and str(source) in shipped_analyses():
                hint = f"; {str(source)!r} is an analysis scenario: run it with `inalab analyze` or `inalab plan grid`"
            raise ConfigError("scenario", f"no file {str(source)!r} and no {what} of that name{hint}; "
                              f"shipped: {', '.join(shipped)}")
        path = shipped[str(source)]
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError("scenario", f"cannot read {str(path)!r}: {e.strerror}") from None
    data = _parse_toml(text, str(path))
    data.setdefault("name", path.stem)
    # A job's policy file named relative to the scenario file (a shipped scenario's beside it).
    for job in data.get("jobs", []) if isinstance(data.get("jobs"), list) else []:
        policy = job.get("policy") if isinstance(job, dict) else None
        if isinstance(policy, str) and not Path(policy).is_absolute() and (path.parent / policy).exists():
            job["policy"] = str(path.parent / policy)
        # A job's model profile file (*.json) named relative to the scenario file, always.
        model = job.get("model") if isinstance(job, dict) else None
        if isinstance(model, str) and model.lower().endswith(".json") and not Path(model).is_absolute():
            job["model"] = str(path.parent / model)
    return data


def _parse_toml(text: str, where: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("scenario", f"invalid TOML in {where}: {e}") from None


def _validate(data: dict) -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        raise _from_validation(e) from None


def _path(loc: tuple) -> str:
    # The discriminated topology union adds the kind to the location: ("topology", "star", "hosts").
    if len(loc) > 1 and loc[0] == "topology" and loc[1] in TOPOLOGIES:
        loc = loc[:1] + loc[2:]
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _from_validation(e: ValidationError) -> ConfigError:
    """The first pydantic error as a ConfigError whose field is the full key path."""
    err = e.errors()[0]
    field, kind, ctx = _path(err["loc"]), err["type"], err.get("ctx") or {}
    if kind == "unknown_key":
        key = f"{field}.{ctx['key']}" if field else str(ctx["key"])
        return ConfigError(key, f"unknown key; allowed keys here: {ctx['allowed']}")
    if isinstance(ctx.get("error"), ConfigError):
        return ctx["error"].under(field)
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        what = "missing" if kind == "union_tag_not_found" else f"unknown kind {ctx.get('tag')!r}"
        return ConfigError(f"{field}.kind", f"{what}; allowed values: {', '.join(TOPOLOGIES)}")
    if kind == "missing":
        return ConfigError(field, "required key is missing")
    if kind == "model_type" or kind == "dict_type":
        return ConfigError(field, f"expected a table, got {err['input']!r}")
    return ConfigError(field, f"{err['msg'][0].lower()}{err['msg'][1:]}; got {err['input']!r}")


# ---------------------------------------------------------------- reference documentation


def _type_doc(field) -> str:
    if (field.json_schema_extra or {}).get("type_doc"):
        return field.json_schema_extra["type_doc"]
    if _unit_of(field):
        return "string"
    tp, _ = _unwrap(field.annotation)
    if get_origin(tp) is Literal:
        return " or ".join(f'"{a}"' for a in get_args(tp))
    if get_origin(tp) is list:
        return "array of tables"
    return {int: "integer", float: "number", bool: "boolean", str: "string"}.get(tp, "table")


def _sections(model: type[_Model], title: str, toml: str, prefix: str) -> list[tuple[str, str, type[_Model]]]:
    """(section title, key prefix, model) for ``model`` and, after it, every table nested in it."""
    out = [(title, prefix, model)]
    for name, field in model.model_fields.items():
        tp, _ = _unwrap(field.annotation)
        sub_toml, key = (f"{toml}.{name}", f"{prefix}.{name}") if prefix else (name, name)
        brackets = "[{}]"
        if get_origin(tp) is list:
            tp, key, brackets = get_args(tp)[0], f"{key}[]", "[[{}]]"
        if get_origin(tp) is Union:  # the topology kinds
            for kind, cls in TOPOLOGIES.items():
                out += _sections(cls, brackets.format(sub_toml) + f' kind = "{kind}"', sub_toml, key)
        elif isinstance(tp, type) and issubclass(tp, _Model):
            out += _sections(tp, brackets.format(sub_toml), sub_toml, key)
    return out


def markdown_reference() -> str:
    """docs/config.md: every field with its path, type, default, unit and description."""
    units = "\n".join(f"- **{u.kind}** (in {u.base}): {', '.join(f'`{s}`' for s in u.factors)}"
                      for u in (DURATION, RATE, SIZE))
    lines = [
        "# Scenario reference",
        "",
        "<!-- Generated by `python -m inalab.config --markdown > docs/config.md`; do not edit by hand. -->",
        "",
        "A scenario is a TOML file (`python/inalab/scenarios/` has examples; `inalab scenarios` lists them).",
        "Unknown keys are errors. Quantities are strings with a unit, e.g. `\"1us\"`, `\"100Gbps\"`, `\"4MiB\"`;",
        "a bare number is an error for them. Integers and numbers marked unitless have no unit.",
        "",
        "Units accepted:",
        "",
        units,
        "",
        "Host selections (`workers`, `servers`, `background.hosts`) are a list of names and ranges "
        '(`["h0", "h4..h7"]`), one range (`"h0..h7"`, both ends included) or a count (`8`: the first hosts '
        "that no job or background names). Hosts are `h0..h{N-1}` in parametric topologies.",
    ]
    for title, prefix, model in _sections(Scenario, "Top level", "", ""):
        lines += ["", f"## {title}", "", "| key | type | default | unit | description |",
                  "| --- | --- | --- | --- | --- |"]
        for name, field in model.model_fields.items():
            extra = field.json_schema_extra or {}
            unit = _unit_of(field)
            tp = _type_doc(field)
            shown = unit.kind if unit else ("unitless" if tp in ("integer", "number") else "")
            tp = tp.replace("|", "\\|")
            lines.append(f"| `{f'{prefix}.{name}' if prefix else name}` | {tp} | {extra['default_doc']} | {shown} "
                         f"| {extra['doc']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m inalab.config --markdown")
    sys.stdout.write(markdown_reference())
