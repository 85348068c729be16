"""A scenario's topology as Linux network namespaces: one namespace per node (host or switch),
one veth pair per link, each end shaped to the link's rate by ``tc`` (``tbf`` with the
scenario's buffer as its queue limit) and delayed by ``netem`` where the kernel has it.

Link ``i`` (in the built topology's order) is the subnet ``10.(100 + i // 250).(i % 250).0/24``:
its ``a`` end is ``.1``, its ``b`` end ``.2``; the interface is ``l<i>`` in both namespaces.
Nodes reach only their neighbours, so every datagram between hosts crosses the switch
processes, as in the simulator.

Namespaces are named ``inaem<pid>-<node>``, so that a run finds the leftovers of a crashed one
(whose pid is gone) and removes them, saying so.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Optional

PREFIX = "inaem"
TIMEOUT_S = 10          # one `ip` / `tc` command
BURST_BYTES = 32 << 10  # tbf bucket: a few packets at line rate, as a switch port sends back to back
_NAME = re.compile(rf"^{PREFIX}(\d+)-")


class FabricError(RuntimeError):
    pass


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=TIMEOUT_S)
    if check and r.returncode != 0:
        raise FabricError(f"`{' '.join(argv)}` exited {r.returncode}: {r.stderr.strip()}")
    return r


def wait_all(procs: list[subprocess.Popen], timeout_s: float, what: str) -> list[tuple[str, str]]:
    """Each process's (stdout, stderr) once all have exited, within ``timeout_s`` for all of
    them together; kills them all and raises, naming ``what``, on a timeout or a non-zero exit."""
    import time

    deadline = time.monotonic() + timeout_s
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise FabricError(f"{what} did not finish within {timeout_s} s") from None
        if p.returncode != 0:
            for q in procs:
                q.kill()
            raise FabricError(f"{what}: a process exited {p.returncode}: {outs[-1][1].strip()[-2000:]}")
    return outs


def unavailable() -> Optional[str]:
    """Why namespaces with shaped veth pairs cannot be built here, or None (tried for real)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return f"creating network namespaces needs root (euid is {os.geteuid()})"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not on PATH"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        for argv in (["ip", "netns", "add", probe],
                     ["ip", "-n", probe, "link", "add", "name", "p0", "type", "veth", "peer", "name", "p1"],
                     ["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "p0", "root", "tbf", "rate", "1gbit",
                      "burst", "32kb", "limit", "100kb"]):
            r = _run(*argv, check=False)
            if r.returncode != 0:
                return f"`{' '.join(argv)}` failed: {r.stderr.strip()}"
        return None
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"running iproute2 failed: {e}"
    finally:
        _run("ip", "netns", "del", probe, check=False)


def has_netem() -> bool:
    """Whether the kernel has the netem qdisc (link delay); tried on a throwaway namespace."""
    probe = f"{PREFIX}{os.getpid()}-netem"
    try:
        _run("ip", "netns", "add", probe)
        _run("ip", "-n", probe, "link", "add", "name", "p0", "type", "veth", "peer", "name", "p1")
        return _run("ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "p0", "root", "netem", "delay", "1ms",
                    check=False).returncode == 0
    finally:
        _run("ip", "netns", "del", probe, check=False)


def remove_stale(say=print) -> list[str]:
    """Deletes the namespaces of emulations whose process is gone; returns their names."""
    gone = []
    for name in _run("ip", "netns", "list").stdout.split():
        m = _NAME.match(name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            _run("ip", "netns", "del", name, check=False)
            gone.append(name)
    if gone:
        say(f"removed {len(gone)} namespaces left by a crashed emulation: {', '.join(gone[:6])}{' ...' if len(gone) > 6 else ''}")
    return gone


@dataclass
class End:
    node: str
    ns: str
    ifname: str
    ip: str


@dataclass
class Fabric:
    """The namespaces and links of one emulation; ``up()`` builds them, ``down()`` removes
    them (safe to call at any point, more than once)."""

    nodes: list[str]
    links: list[dict]          # {"a": name, "b": name, "rate_bps": int, "delay_ps": int}
    buffer_bytes: int
    mtu: int = 1500
    netem: bool = False
    tag: str = field(default_factory=lambda: str(os.getpid()))
    created: list[str] = field(default_factory=list)
    ends: dict = field(default_factory=dict)   # (node, peer) -> End on node's side
    label = "tc tbf"

    def ns(self, node: str) -> str:
        return f"{PREFIX}{self.tag}-{node}"

    def exec(self, node: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(node), *argv]

    def end(self, node: str, peer: str) -> End:
        """``node``'s side of its link to ``peer``."""
        return self.ends[node, peer]

    def up(self) -> "Fabric":
        for n in self.nodes:
            _run("ip", "netns", "add", self.ns(n))
            self.created.append(self.ns(n))
            _run("ip", "-n", self.ns(n), "link", "set", "lo", "up")
            # No IPv6: its neighbour discovery would add stray packets to the links' counts.
            _run("ip", "netns", "exec", self.ns(n), "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                 "net.ipv6.conf.default.disable_ipv6=1", check=False)
        for i, link in enumerate(self.links):
            net = f"10.{100 + i // 250}.{i % 250}"
            a, b = link["a"], link["b"]
            ifname = f"l{i}"
            _run("ip", "link", "add", "name", ifname, "netns", self.ns(a), "mtu", str(self.mtu), "type", "veth",
                 "peer", "name", ifname, "netns", self.ns(b), "mtu", str(self.mtu))
            for node, peer, host in ((a, b, 1), (b, a, 2)):
                ns = self.ns(node)
                _run("ip", "-n", ns, "addr", "add", f"{net}.{host}/24", "dev", ifname)
                _run("ip", "-n", ns, "link", "set", ifname, "up")
                self.shape(ns, ifname, link["rate_bps"], link["delay_ps"])
                self.ends[node, peer] = End(node, ns, ifname, f"{net}.{host}")
        return self

    def route_ip_via(self, router: str) -> None:
        """Lets ``router``'s neighbours reach each other over IP through it (forwarding on, a
        default route on each neighbour): TCP then crosses the same shaped links a datagram
        does, for baselines such as gloo beside an emulated run."""
        _run(*self.exec(router, ["sysctl", "-qw", "net.ipv4.ip_forward=1"]))
        for (node, peer), end in self.ends.items():
            if node == router:
                _run("ip", "-n", self.ns(peer), "route", "add", "default", "via", end.ip)

    def shape(self, ns: str, ifname: str, rate_bps: int, delay_ps: int) -> None:
        """The link's rate (and delay, with netem) on this end's egress; the queue holds the
        scenario's buffer, as a switch port's does."""
        tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", ifname]
        if self.netem and delay_ps > 0:
            _run(*tc, "root", "handle", "1:", "netem", "delay", f"{delay_ps / 1e6:.3f}us", "limit", "100000")
            tc += ["parent", "1:1"]
        else:
            tc += ["root"]
        _run(*tc, "tbf", "rate", f"{rate_bps}bit", "burst", str(BURST_BYTES), "limit", str(max(self.buffer_bytes, 2 * self.mtu)))

    def link_stats(self, node: str, peer: str) -> dict:
        """``ip -s`` counters of ``node``'s interface toward ``peer`` plus its qdisc drops."""
        import json

        e = self.end(node, peer)
        link = json.loads(_run("ip", "-n", e.ns, "-s", "-j", "link", "show", "dev", e.ifname).stdout)[0]["stats64"]
        qdisc = json.loads(_run("ip", "netns", "exec", e.ns, "tc", "-s", "-j", "qdisc", "show", "dev", e.ifname).stdout)
        link["qdisc_drops"] = sum(q.get("drops", 0) for q in qdisc)
        link["qdisc_bytes"] = max((q.get("bytes", 0) for q in qdisc), default=0)
        link["qdisc_packets"] = max((q.get("packets", 0) for q in qdisc), default=0)
        return link

    def udp_stats(self, node: str) -> dict:
        """The kernel's UDP counters in ``node``'s namespace (``/proc/net/snmp``): datagrams in
        and out, and those dropped for a full receive buffer (``RcvbufErrors``)."""
        lines = [l.split() for l in _run("ip", "netns", "exec", self.ns(node), "cat", "/proc/net/snmp").stdout.splitlines()
                 if l.startswith("Udp:")]
        return dict(zip(lines[0][1:], map(int, lines[1][1:]))) if len(lines) >= 2 else {}

    def down(self) -> list[str]:
        errors = []
        for name in reversed(self.created):
            r = _run("ip", "netns", "del", name, check=False)
            if r.returncode != 0:
                errors.append(f"ip netns del {name}: {r.stderr.strip()}")
        self.created.clear()
        return errors


@dataclass
class LocalFabric:
    """Every node on this machine's loopback, links shaped in user space: each switch port's
    egress by the switch (``inalab switch --link-rate``), each host's by its own pacer
    (``Client(link_rate=...)``, ``inalab ps --link-rate``). Needs no privileges. Link delay is
    applied at the switch's egress only (host links are paced, not delayed)."""

    nodes: list[str]
    links: list[dict]
    buffer_bytes: int
    netem: bool = False
    mtu: int = 65535
    label = "user space (switch egress queues, paced hosts)"

    def exec(self, node: str, argv: list[str]) -> list[str]:
        return argv

    def up(self) -> "LocalFabric":
        return self

    def down(self) -> list[str]:
        return []
