"""The real data plane: a software switch, a parameter server and the worker client, over UDP.

They run the same Rust protocol code as the simulator (``inalab-net`` drives it over sockets)::

    sw = inalab.Switch("switchml")                       # 127.0.0.1:9000 (UDP), :9100 (control)
    c = inalab.Client(switch="127.0.0.1:9100", job=1, rank=0, world=1)
    c.allreduce(np.ones(10, np.float32))                  # -> array of sums over the job's workers

Every worker of a job calls ``allreduce`` with arrays of the same lengths in the same order.
Values are float32 in and out, summed as integers by the switch: SwitchML with a per-tensor
exponent (error at most ``n^2 2^e / 2^31`` per value, ``e`` the largest binary exponent of the
tensor's values over the workers, for every finite float32), ATP with a fixed scale (the job's
``ina.scale``, 1e8: error at most ``n / 2e8`` while sums stay within +/-21.47; beyond that ATP's
overflow fallback sums the original floats, so the result is the float sum), the other schemes
with a fixed scale and no fallback. A call returns that sum on every rank or raises on every
rank, never a wrong value: a NaN, an infinity, a value or sum beyond a scheme's range, a sum
beyond float32, or ranks that disagree on a tensor's size fail it, the error naming the value
(docs/runtime.md, "Workers and quantization"). Which schemes the switch runs and how each
quantizes come from the scheme registry (:mod:`inalab.schemes`).
"""
from __future__ import annotations

import json
import math
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np

from . import _core, schemes

__all__ = ["Switch", "ParameterServer", "Client", "quantization_bound"]


def _check_choice(field: str, value: str, allowed) -> str:
    if value not in allowed:
        raise ValueError(f"{field}: {value!r} is not one of {', '.join(map(repr, allowed))}")
    return value


#: The longest timeout a call takes, seconds (a day): longer, or not a positive number, is a
#: ValueError naming the argument.
MAX_TIMEOUT_S = 86_400.0


def _check_timeout(field: str, seconds: Any) -> float:
    """``seconds`` as a timeout in (0, MAX_TIMEOUT_S], or a ValueError naming ``field`` and the
    range (inf, nan, 0, negative and 1e300 are all refused)."""
    ok = isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_S
    if not ok:
        raise ValueError(f"{field}: {seconds!r} is not a number of seconds in (0, {MAX_TIMEOUT_S:g}] (0 excluded, at most a day)")
    return float(seconds)


def _check_config(value: Any, field: str = "config") -> None:
    """A job's configuration must be JSON: NaN and infinities have no JSON form (the switch
    would see a malformed line), so they are refused here, naming where they are."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{field}: {value} is not a finite number (a configuration is JSON)")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_config(v, f"{field}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_config(v, f"{field}[{i}]")


def _check_node(node: int) -> int:
    if not 1 <= node <= 65535:
        raise ValueError(f"node: {node} is not in 1..65535 (worker ids are switch node << 16 | n)")
    return node


class _Service:
    """A switch or PS running in threads of this process (``self._h`` is the Rust handle)."""

    _h: Any

    @property
    def udp_addr(self) -> str:
        return self._h.udp_addr

    @property
    def control_addr(self) -> str:
        return self._h.control_addr

    def stats(self) -> dict:
        """Counters; ``RuntimeError`` once the data plane stopped (it then serves nothing: the
        message says why)."""
        return json.loads(self._h.stats())

    def health(self) -> None:
        """Nothing while it serves; ``RuntimeError`` saying why once its data plane stopped."""
        self._h.health()

    def stop(self) -> None:
        self._h.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Switch(_Service):
    """A software switch running the switch programs of ``program`` in this process: a scheme
    with a switch program ("switchml", "atp"), or several separated by commas (each job's
    packets reach its scheme's program; packets of other schemes are routed).

    Defaults: ``udp`` 127.0.0.1:9000, ``control`` 127.0.0.1:9100 (port 0 = any free port),
    ``node`` 1 (unique per switch and PS of a deployment, 1..65535), ``memory_bytes`` 5 MB of
    aggregator memory per program (ATP: 272 B per aggregator, SwitchML: 280 B per slot),
    ``pool_slots`` 128 (switch pool of a job that sets none: SwitchML slots per job),
    ``packet_values`` 2048 (values per datagram of a job that sets no ``ina.packet_bytes``, for
    SwitchML and ATP, at most what the switch's interfaces' MTU carries unfragmented: 352 on a
    1500-B network; 0 = the scheme's default, a Tofino's 32 and 62),
    ``drop_probability`` 0 (share of incoming packets dropped at random, seeded by ``seed`` 1),
    ``upstream`` none (control address of the next switch toward the PS, for ATP chains),
    ``timeout_us`` 20000 (loss-recovery timeout of a job that sets none, µs). ``link_rate``
    (bits per second, default none), ``link_delay_us`` (default 0) and ``buffer_bytes``
    (default 1 MiB): shape every port's egress to that link in user space, where ``tc``
    cannot (``inalab emulate`` without namespaces); tail drops count in ``ports[].queue_drops``.
    ``fabric`` (default none): a static deployment, as ``inalab emulate`` writes it: the
    switch's neighbours (``ports``: node, kind, udp), ``routes`` (ECMP next hops toward other
    nodes) and ``jobs`` (job specs admitted at start; see ``inalab.net`` docs/runtime.md).
    ``pcap`` (default none): a pcapng file that gets every datagram the switch receives and
    sends, with wall-clock timestamps (docs/runtime.md, "Packet captures and Wireshark").
    ``threads`` (default 0: a quarter of the machine's cores, 1 to 8; 1 with ``fabric``,
    ``pcap`` or ``link_rate``): data-plane threads, each with its own UDP socket, programs and
    ``memory_bytes`` (so one thread is a Tofino's budget); a SwitchML or ATP job runs on all of
    them (each packet on the one its slot or fragment picks), any other job on one
    (docs/runtime.md, "Data-plane threads").

    ``stats()`` gives packets received/forwarded, drops by cause (``malformed``,
    ``unknown_source``, ``spoofed``, ``unadmitted``, ``injected_drops``, ...), the program's own
    counters, ``aggregators_in_use``, admitted ``jobs`` and syscall batching (``io``).
    ``set_link(peer, up)`` reports a port's link down or up.
    """

    def __init__(
        self,
        program: str = "switchml",
        udp: str = "127.0.0.1:9000",
        control: str = "127.0.0.1:9100",
        node: int = 1,
        memory_bytes: int = 5_000_000,
        pool_slots: int = 128,
        drop_probability: float = 0.0,
        seed: int = 1,
        upstream: Optional[str] = None,
        timeout_us: int = 20_000,
        link_rate: Optional[int] = None,
        link_delay_us: float = 0.0,
        buffer_bytes: int = 1 << 20,
        fabric: Optional[dict] = None,
        packet_values: int = 2048,
        pcap: Optional[Union[str, Path]] = None,
        threads: int = 0,
    ):
        programs = [p.strip() for p in program.split(",")]
        for p in programs:
            _check_choice("program", p, schemes.with_program())
        _check_node(node)
        if not 0.0 <= drop_probability <= 1.0:
            raise ValueError(f"drop_probability: {drop_probability} is not in [0, 1]")
        if link_rate is not None and link_rate <= 0:
            raise ValueError(f"link_rate: must be a positive number of bits per second, got {link_rate}")
        if link_delay_us < 0:
            raise ValueError(f"link_delay_us: must be >= 0, got {link_delay_us}")
        for name, v in (("memory_bytes", memory_bytes), ("pool_slots", pool_slots), ("timeout_us", timeout_us), ("buffer_bytes", buffer_bytes)):
            if v <= 0:
                raise ValueError(f"{name}: must be positive, got {v}")
        # They become the values of jobs that set none, which every job is checked against.
        if timeout_us > 60_000_000:
            raise ValueError(f"timeout_us: {timeout_us} is not in 1..60000000 (60 s)")
        if pool_slots > 2**24:
            raise ValueError(f"pool_slots: {pool_slots} is not in 1..{2**24}")
        if seed < 0:
            raise ValueError(f"seed: must be a non-negative integer, got {seed}")
        if not 0 <= packet_values <= 16_000:
            raise ValueError(f"packet_values: must be 0 (the scheme's default) to 16000 (a 64 KiB datagram), got {packet_values}")
        if not 0 <= threads <= 64:
            raise ValueError(f"threads: {threads} is not in 0..64 (0: from the machine's cores)")
        self.program = program
        self._h = _core.Switch(
            programs, udp, control, node, memory_bytes, pool_slots, drop_probability, seed, upstream, timeout_us,
            None if link_rate is None else int(link_rate), float(link_delay_us), int(buffer_bytes),
            None if fabric is None else json.dumps(fabric), int(packet_values),
            None if pcap is None else str(pcap), int(threads),
        )

    def set_link(self, peer: int, up: bool) -> None:
        """Reports the link to neighbour node ``peer`` down (``up=False``: what a switch's
        hardware learns from a lost carrier) or up again. While it is down, routing and the
        programs' next hops skip the port and what is still sent on it is lost (``link_down``).
        ValueError if ``peer`` is no neighbour."""
        self._h.set_link(int(peer), bool(up))

    def release_job(self, job: int) -> int:
        """Job ``job`` ended: its state here (its programs' aggregators, key, paths, trees) is
        removed, as a job's end does; returns the aggregators it still held. For a static
        fabric (``fabric=``), whose jobs stay admitted until whoever started them says so."""
        return self._h.release_job(int(job))


class ParameterServer(_Service):
    """The parameter server of jobs whose scheme has one (ATP's), attached to the switch whose
    control address is ``switch``.

    Defaults: ``udp`` 127.0.0.1:9200, ``control`` 127.0.0.1:9300, ``switch`` 127.0.0.1:9100,
    ``node`` 2 (1..65535, unique per deployment), ``link_rate`` none (bits per second: its
    datagrams leave no faster, as ``Client(link_rate=...)``), ``fabric`` none (a static
    deployment: ``{"gateway": switch udp, "jobs": [spec, ...]}``; then it attaches to no switch).
    """

    def __init__(self, switch: str = "127.0.0.1:9100", udp: str = "127.0.0.1:9200", control: str = "127.0.0.1:9300", node: int = 2,
                 link_rate: Optional[int] = None, fabric: Optional[dict] = None):
        if link_rate is not None and link_rate <= 0:
            raise ValueError(f"link_rate: must be a positive number of bits per second, got {link_rate}")
        self._h = _core.ParameterServer(udp, control, switch, _check_node(node), None if link_rate is None else int(link_rate),
                                        None if fabric is None else json.dumps(fabric))


def _context(context: Optional[TensorContext]) -> Optional[tuple]:
    if context is None:
        return None
    if not isinstance(context, TensorContext):
        raise TypeError(f"context: expected an inalab.TensorContext or None, got {type(context).__name__}")
    return context._tuple()


def _as_f32(array: Any) -> np.ndarray:
    a = np.ascontiguousarray(array, dtype=np.float32)
    return a.reshape(-1)


@dataclass(frozen=True)
class TensorContext:
    """Where a tensor stands in its model's iteration, for schemes that schedule by it (DSA's
    priority P = (1/T)(L/l)(Comm/Comp), §V); the others ignore it.

    ``layer``: the tensor's layer, 1-based in forward order (front layers are needed first);
    ``layers``: the model's layer count; ``comm_over_comp``: an iteration's communication time
    over its computation time; ``remaining_s``: seconds left in the current iteration."""

    layer: int
    layers: int
    comm_over_comp: float
    remaining_s: float

    def __post_init__(self):
        if not (isinstance(self.layers, int) and 1 <= self.layers < 2**32):
            raise ValueError(f"TensorContext.layers: {self.layers!r} is not an integer in 1..2^32-1")
        if not (isinstance(self.layer, int) and 1 <= self.layer <= self.layers):
            raise ValueError(f"TensorContext.layer: {self.layer!r} is not an integer in 1..layers ({self.layers})")
        for name in ("comm_over_comp", "remaining_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"TensorContext.{name}: {v!r} is not a finite number >= 0")

    def _tuple(self) -> tuple:
        return (self.layer, self.layers, float(self.comm_over_comp), float(self.remaining_s))


class Client:
    """A worker of job ``job`` (rank ``rank`` of ``world``) attached to the switch whose control
    address is ``switch``. Construction blocks until all ``world`` ranks joined (at most
    ``join_timeout_s``, default 60 s, from the first connect on: a stalled or slow switch
    included; Ctrl-C interrupts it; 0 < ``join_timeout_s`` <= 86400, else ValueError). ``scheme`` must be one of the switch's programs (default
    "switchml"); ``config`` sets the scheme's parameters (``{"ina": {"scale": 1e6}}``; see
    ``inalab.schemes.registry()``), the same for every worker of the job. What it leaves out
    takes the scheme's defaults, and for the loss-recovery timeout and the switch pool the
    switch's (``timeout_us``, ``pool_slots``). ``job_secret`` (default: ``INALAB_JOB_SECRET``,
    else none) binds the job's rendezvous: every worker of the job gives the same string, and a
    joiner without it cannot take a rank. ``link_rate`` (bits per second, default none) makes the
    client send no faster than a link of that rate, as a NIC does (``inalab emulate`` sets it to
    the scenario's host link)."""

    def __init__(
        self,
        switch: str = "127.0.0.1:9100",
        job: int = 1,
        rank: int = 0,
        world: int = 1,
        scheme: str = "switchml",
        join_timeout_s: float = 60.0,
        config: Optional[dict] = None,
        job_secret: Optional[str] = None,
        link_rate: Optional[int] = None,
    ):
        _check_choice("scheme", scheme, schemes.with_program())
        if link_rate is not None and link_rate <= 0:
            raise ValueError(f"link_rate: must be a positive number of bits per second, got {link_rate}")
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"rank: {rank} is not in 0..{world} (world)")
        if not 0 <= job < 2**32:
            raise ValueError(f"job: {job} is not in 0..2^32")
        join_timeout_s = _check_timeout("join_timeout_s", join_timeout_s)
        _check_config(config or {})
        self.scheme, self.job, self.rank, self.world = scheme, job, rank, world
        self._c = _core.Client(switch, job, rank, world, json.dumps({**(config or {}), "scheme": scheme}), join_timeout_s, job_secret,
                                 None if link_rate is None else int(link_rate))

    @classmethod
    def from_spec(cls, spec: dict, rank: int, gateway: str, link_rate: Optional[int] = None) -> "Client":
        """A worker of a static deployment (``inalab emulate``): rank ``rank`` of the job ``spec``
        describes (its ``workers[rank]`` gives the node id and UDP address), sending to its
        switch's data plane at ``gateway``. No rendezvous and no control connection."""
        workers = spec.get("workers", [])
        if not 0 <= rank < len(workers):
            raise ValueError(f"rank: {rank} is not in 0..{len(workers)} (the spec's workers)")
        self = cls.__new__(cls)
        self.scheme, self.job, self.rank, self.world = spec["config"]["scheme"], spec["job"], rank, len(workers)
        self._c = _core.Client.from_spec(json.dumps(spec), rank, gateway, None if link_rate is None else int(link_rate))
        return self

    def allreduce(self, array: Any, timeout_s: float = 30.0, context: Optional[TensorContext] = None) -> np.ndarray:
        """Element-wise sum of ``array`` over the job's workers, as a new float32 array of the
        same shape. ``context`` (a :class:`TensorContext`, default none) tells a scheme that
        schedules tensors where this one stands (DSA turns it into the packets' priority;
        without it every tensor has the lowest). Raises ``ValueError`` on every rank, naming the
        value, when a value or sum has no place in the scheme's range (NaN, infinities, beyond
        +/-21.47 at scale 1e8 without ATP's fallback, a sum beyond float32) or the ranks disagree
        on the tensor's size (docs/runtime.md, "Workers and quantization"). Waits at most
        ``timeout_s`` seconds (default 30; 0 < ``timeout_s`` <= 86400, else ValueError) and raises ``RuntimeError``
        naming the cause (switch gone, PS gone, peer rank gone, job released, timeout); Ctrl-C
        raises ``KeyboardInterrupt``. After a timeout or an interrupt this worker is out of step
        with the others, so the client fails every later call."""
        timeout_s = _check_timeout("timeout_s", timeout_s)
        a = _as_f32(array)
        out = np.frombuffer(self._c.allreduce(a, timeout_s, _context(context)), dtype=np.float32)
        return out.reshape(np.shape(array))

    def allreduce_async(self, array: Any, callback: Optional[Callable[[Optional[np.ndarray], Optional[str]], None]] = None,
                        context: Optional[TensorContext] = None) -> Future:
        """Starts an allreduce (``context`` as for :meth:`allreduce`) and returns a
        ``concurrent.futures.Future`` of the sum. If given,
        ``callback(result, error)`` runs on the client's completion thread instead (used by the
        PyTorch hook to resolve a ``torch.futures.Future`` without an extra thread hop)."""
        a = _as_f32(array)
        shape = np.shape(array)
        fut: Future = Future()

        def done(buf, err):
            result = None if buf is None else np.frombuffer(buf, dtype=np.float32).reshape(shape)
            if callback is not None:
                callback(result, err)
            if err is None:
                fut.set_result(result)
            else:
                fut.set_exception(RuntimeError(err))

        self._c.allreduce_async(a, done, _context(context))
        return fut

    @property
    def node(self) -> int:
        return self._c.node

    def stats(self) -> dict:
        return json.loads(self._c.stats())

    def peer_failed(self, rank: int) -> bool:
        """Tells the job's protocol that worker ``rank`` died (a switch's control plane does this
        by itself; a static deployment's orchestrator calls it). Returns whether the protocol
        goes on without it (Rina rebuilds its ring); if not, every pending and later call fails."""
        return self._c.peer_failed(int(rank))

    def close(self) -> None:
        """Leaves the job; the switch frees its aggregators when every worker left. A worker
        whose scheme has it serve its peers (Canary's leaders) first lingers until every worker
        of the job left (at most 30 s); Ctrl-C ends that."""
        self._c.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def quantization_bound(scheme: str, world: int, max_abs: float, scale: Optional[float] = None) -> float:
    """Largest absolute error of one summed value, by the scheme's quantization: an agreed
    exponent (SwitchML) ``n^2 2^e / (2^31 - 1)`` with ``e`` the binary exponent bound of
    ``max_abs`` (``max_abs < 2^e``), a fixed point (ATP) ``n / (2 scale)`` (``scale`` default:
    the scheme's), none 0; plus the float32 rounding of the result, ``n eps max_abs``. The
    simulator's float payload check uses the same function (``Quantization::error_bound``)."""
    _check_choice("scheme", scheme, schemes.names())
    config = {"scheme": scheme, **({"ina": {"scale": scale}} if scale is not None else {})}
    return _core.quantization_bound(json.dumps(config), int(world), float(max_abs))


