"""A scenario's timed failures (``[[failures]]``, the table the simulator reads) carried out
on an emulated fabric (docs/emulation.md, "Failures").

- A switch fails at ``at``: its process is killed (SIGKILL: its programs' soft state is lost,
  as the simulator's failed switch loses its descriptors and queues), its links lose carrier
  (with ``tc``: its veth ends are set down, so what was queued toward it or on its ports is
  dropped), and each neighbouring switch is told the port is down (a JSON line on its stdin,
  ``inalab switch --stdin-commands``: the link-down signal a switch's hardware gets), so its
  routing and its programs' ``next_hops`` skip the port, as the simulator's routing skips dead
  ports at once. Its replacement, a process with the same fabric, was started before the jobs
  on standby (``inalab switch --standby``: it imports everything and waits, which takes a
  second or more on shared cores); at ``until`` its links come up and it is told to start (a
  fresh program, its jobs admitted: milliseconds), and once it serves its neighbours are told
  the port is up again (and it is told which of its own neighbours are still down).
- A host fails (no ``until``: it does not come back): its workers' processes are killed, and
  ``detect`` later (default 1 ms) every other worker of their jobs is told (a JSON line on its
  stdin, which the worker hands to its client, ``Client.peer_failed``), as the simulator's
  membership service tells them: Rina rebuilds its ring over the survivors, any other scheme
  fails the job.
- A link between two switches fails: both ends are told the port is down (and with ``tc``
  its veth ends are set down, dropping what it carried); at ``until`` both come back. A link of
  a host is refused: the simulator's hosts have one link, so such a failure only cuts a host
  off.

Times count from the jobs' common start, as the simulator's count from its time 0.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..config import ConfigError


@dataclass
class Failure:
    index: int
    at_s: float
    until_s: Optional[float]
    node: Optional[str] = None          # a switch
    link: Optional[tuple[str, str]] = None  # two switches
    host: Optional[str] = None          # a host, for good
    detect_s: float = 1e-3
    # What happened, seconds after the common start.
    down_s: Optional[float] = None
    told_down_s: Optional[float] = None
    up_s: Optional[float] = None
    ready_s: Optional[float] = None

    def report(self) -> dict:
        out = {"failure": self.index, "at_s": self.at_s, "until_s": self.until_s}
        out |= {"node": self.node or self.host} if self.node or self.host else {"link": list(self.link)}
        for k in ("down_s", "told_down_s", "up_s", "ready_s"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out


def spares(failures: list[Failure]) -> list[str]:
    """The switches that come back, each needing a process on standby before the jobs start."""
    return sorted({f.node for f in failures if f.node and f.until_s is not None})


def plan(spec: dict, built: dict) -> list[Failure]:
    """The scenario's failures, checked for what the emulator carries out; errors name the field."""
    kind = {n["name"]: n["kind"] for n in built["nodes"]}
    names = [n["name"] for n in built["nodes"]]
    adj: dict[str, set[str]] = {n: set() for n in names}
    for l in built["links"]:
        adj[names[l["a"]]].add(names[l["b"]])
        adj[names[l["b"]]].add(names[l["a"]])
    switches = [n for n in names if kind[n] == "switch"]
    out = []
    for i, f in enumerate(spec.get("failures", [])):
        at, until = f["at_ps"] / 1e12, (f["until_ps"] / 1e12 if f.get("until_ps") is not None else None)
        if "node" in f:
            name = f["node"]
            if kind.get(name) == "host":
                if until is not None:
                    raise ConfigError(f"failures[{i}].until", f"{name!r} is a host, and a failed host does not come back: leave it out")
                out.append(Failure(i, at, None, host=name, detect_s=f.get("detect_ps", 10**9) / 1e12))
                continue
            if kind.get(name) != "switch":
                raise ConfigError(f"failures[{i}].node", f"{name!r} is not a switch or a host; switches are {', '.join(switches)}")
            out.append(Failure(i, at, until, node=name))
        else:
            a, b = f["link"]
            for end in (a, b):
                if end not in kind:
                    raise ConfigError(f"failures[{i}].link", f"no node named {end!r}: a link is given by the names of its two ends")
            if b not in adj[a]:
                raise ConfigError(f"failures[{i}].link", f"{a!r} and {b!r} are not adjacent: no link between them")
            if kind[a] != "switch" or kind[b] != "switch":
                raise ConfigError(f"failures[{i}].link", f"emulate fails links between two switches only; {a!r}-{b!r} is a host's "
                                                         "only link (its failure cuts the host off)")
            out.append(Failure(i, at, until, link=(a, b)))
    # One window at a time per target: the simulator counts overlapping ones, a process cannot
    # be killed twice.
    for x in out:
        for y in out:
            if x.index < y.index and _target(x) == _target(y) and _overlap(x, y):
                raise ConfigError(f"failures[{y.index}]", f"overlaps failures[{x.index}] of the same {'switch' if x.node else 'link'}; "
                                                          "emulate runs one failure of a target at a time")
    return out


def _target(f: Failure):
    return f.node or f.host or frozenset(f.link)


def _overlap(x: Failure, y: Failure) -> bool:
    inf = float("inf")
    return x.at_s < (y.until_s or inf) and y.at_s < (x.until_s or inf)


class Executor:
    """Carries out the failures of a running emulation. ``revive(switch)`` makes a switch's
    standby process its process and tells it to start, ``spare(switch)`` starts another standby
    process (for a later window), ``procs.command(name, obj)`` writes a line on a process's
    stdin, ``ready(switch)`` tells whether its revived process is serving; ``set_links(node,
    peers, up)`` sets the node's ends of its links to ``peers`` (tc) down or up."""

    def __init__(self, failures: list[Failure], start_at: float, node_id: dict[str, int], neighbours: dict[str, list[str]],
                 procs, revive: Callable[[str], None], spare: Callable[[str], None], ready: Callable[[str], bool],
                 set_links: Optional[Callable[[str, list[str], bool], None]], say,
                 workers: Optional[list[tuple[str, str, int, int]]] = None):
        self.failures, self.start_at, self.node_id, self.adj = failures, start_at, node_id, neighbours
        self.procs, self.revive, self.spare, self.ready, self.set_links, self.say = procs, revive, spare, ready, set_links, say
        # (process name, host, job, rank) of every worker, and the ones a host failure killed.
        self.workers, self.killed = workers or [], set()
        self.events = sorted([(f.at_s, 0, "down", f) for f in failures] + [(f.until_s, 1, "up", f) for f in failures if f.until_s is not None],
                             key=lambda e: (e[0], e[1], e[3].index))
        self.down_nodes: set[str] = set()
        self.down_links: set[frozenset] = set()
        self.starting: list[Failure] = []   # restarted switches not ready yet

    def next_in(self) -> Optional[float]:
        """Seconds until something is due (0: now), or None when nothing is left."""
        if self.starting:
            return 0.005
        if not self.events:
            return None
        return max(0.0, self.start_at + self.events[0][0] - time.monotonic())

    def step(self) -> None:
        now = time.monotonic()
        while self.events and self.start_at + self.events[0][0] <= now:
            _, _, what, f = self.events.pop(0)
            {"down": self._down, "up": self._up, "detect": self._tell_peers}[what](f)
        for f in list(self.starting):
            if self.ready(f.node):
                f.ready_s = self._t()
                self.starting.remove(f)
                self._tell_up(f.node)

    def _t(self) -> float:
        return time.monotonic() - self.start_at

    def _tell(self, switch: str, peer: str, up: bool) -> None:
        if switch not in self.down_nodes and switch not in [f.node for f in self.starting]:
            self.procs.command(f"switch-{switch}", {"op": "link", "peer": self.node_id[peer], "up": up})

    def _switch_neighbours(self, s: str) -> list[str]:
        return [n for n in self.adj[s] if f"switch-{n}" in self.procs.procs]

    def _down(self, f: Failure) -> None:
        if f.host:
            for name, host, _, _ in self.workers:
                if host == f.host:
                    kill_group(self.procs.procs[name], wait=True)
                    self.killed.add(name)
            f.down_s = self._t()
            self.events.append((f.at_s + f.detect_s, 2, "detect", f))
            self.events.sort(key=lambda e: (e[0], e[1], e[3].index))
            self.say(f"{f.down_s:.3f} s: host {f.host} failed (its workers killed)")
        elif f.node:
            s = f.node
            p = self.procs.procs[f"switch-{s}"]
            kill_group(p, wait=False)
            f.down_s = self._t()
            self.down_nodes.add(s)
            for n in self._switch_neighbours(s):
                self._tell(n, s, False)
            f.told_down_s = self._t()
            if self.set_links:
                self.set_links(s, self.adj[s], False)
            p.wait(5)
            self.say(f"{f.down_s:.3f} s: {s} failed (killed; its neighbours told its ports are down)")
        else:
            a, b = f.link
            f.down_s = self._t()
            self.down_links.add(frozenset(f.link))
            self._tell(a, b, False)
            self._tell(b, a, False)
            f.told_down_s = self._t()
            if self.set_links:
                self.set_links(a, [b], False)
            self.say(f"{f.down_s:.3f} s: link {a}-{b} failed")

    def _tell_peers(self, f: Failure) -> None:
        """The host's jobs' other workers learn which of their ranks died."""
        # Workers that finished and exited are named too, first: a survivor's recovery must not
        # wait for them (a protocol told twice of a rank ignores the second).
        done = [(job, rank) for name, _, job, rank in self.workers if name not in self.killed and self.procs.procs[name].poll() is not None]
        dead = done + [(job, rank) for name, host, job, rank in self.workers if host == f.host]
        for name, host, job, _ in self.workers:
            if name not in self.killed:
                for j, rank in dead:
                    if j == job:
                        self.procs.command(name, {"op": "peer_failed", "rank": rank})
        f.told_down_s = self._t()
        self.say(f"{f.told_down_s:.3f} s: the other workers of host {f.host}'s jobs told")

    def _up(self, f: Failure) -> None:
        f.up_s = self._t()
        if f.node:
            s = f.node
            self.down_nodes.discard(s)
            if self.set_links:
                self.set_links(s, [n for n in self.adj[s] if n not in self.down_nodes and frozenset((s, n)) not in self.down_links], True)
            self.revive(s)
            self.starting.append(f)
            self.say(f"{f.up_s:.3f} s: {s} starting again with a fresh program")
            if any(g.node == s and g.until_s is not None and g.at_s > f.at_s for g in self.failures):
                self.spare(s)
        else:
            a, b = f.link
            self.down_links.discard(frozenset(f.link))
            if self.set_links and a not in self.down_nodes and b not in self.down_nodes:
                self.set_links(a, [b], True)
            f.ready_s = self._t()
            self._tell(a, b, True)
            self._tell(b, a, True)
            self.say(f"{f.up_s:.3f} s: link {a}-{b} up again")

    def _tell_up(self, s: str) -> None:
        """A restarted switch is serving: it learns which of its links are still down, its live
        neighbours that it is up."""
        for n in self._switch_neighbours(s):
            if n in self.down_nodes or frozenset((s, n)) in self.down_links:
                self._tell(s, n, False)
            else:
                self._tell(n, s, True)
        self.say(f"{self._t():.3f} s: {s} serving again; its neighbours told")

    def report(self) -> list[dict]:
        return [f.report() for f in self.failures]


def kill_group(p: subprocess.Popen, wait: bool = True) -> None:
    """SIGKILL to a process started in its own session (and everything in it)."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if wait:
            p.wait(5)
