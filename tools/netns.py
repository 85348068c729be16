"""A star of Linux network namespaces joined by veth pairs, to run the inalab data plane
(``inalab switch``, ``inalab ps``, ``inalab.Client``) over real interfaces instead of loopback.

    sudo python tools/netns.py up --prefix ina --hosts ps,w0,w1,w2   # prints the topology as JSON
    sudo ip netns exec ina-w0 python -c 'import inalab; ...'
    sudo python tools/netns.py down --prefix ina

Namespaces: ``<prefix>-sw`` (the switch) and ``<prefix>-<host>`` per host. Host ``i`` (from 1,
in the order given) is linked to the switch by a veth pair on its own /24, ``10.77.<i>.0/24``:
``eth0`` = ``10.77.<i>.2`` in the host's namespace, ``h-<host>`` = ``10.77.<i>.1`` in the switch's.
Links and ``lo`` are up; MTU is veth's default, 1500. A prefix from :func:`unique_prefix` names
the process that made it, so that ``up()`` removes the namespaces of a run that was killed
before its ``down()`` (whose pid is gone), saying so. There is no IP forwarding, so hosts reach
only the switch's namespace: everything between workers and the PS goes through the switch
process. Used by ``python/tests/test_netns.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from typing import Optional, Sequence

SUBNET = "10.77"
TIMEOUT_S = 10


# unique_prefix's names: "in" and letters, the owner's pid, "x" and 4 hex digits (nothing else
# on the machine is touched).
_OWNED = re.compile(r"^(in[a-z]*)(\d+)x[0-9a-f]{4}-")


def unique_prefix(letters: str) -> str:
    """A prefix no other run uses, naming this process (see :func:`remove_stale`)."""
    if not re.fullmatch(r"in[a-z]*", letters):
        raise ValueError(f"letters: lower-case letters starting with 'in', got {letters!r}")
    return f"{letters}{os.getpid()}x{uuid.uuid4().hex[:4]}"


def remove_stale() -> list[str]:
    """Deletes namespaces named by :func:`unique_prefix` whose process is gone; returns them."""
    gone = []
    for name in _ip("netns", "list").stdout.split():
        m = _OWNED.match(name)
        if m and not os.path.exists(f"/proc/{m.group(2)}"):
            _ip("netns", "del", name, check=False)
            gone.append(name)
    if gone:
        print(f"netns: removed {len(gone)} namespaces left by a killed run: {', '.join(gone)}", file=sys.stderr)
    return gone


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=TIMEOUT_S)
    if check and r.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` exited {r.returncode}: {r.stderr.strip()}")
    return r


def unavailable() -> Optional[str]:
    """Why namespaces with veth pairs cannot be built here, or None if they can (tried for real
    on a throwaway namespace)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return f"creating network namespaces needs root (euid is {os.geteuid()})"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not on PATH"
    probe = f"inaprobe{os.getpid()}-{uuid.uuid4().hex[:6]}"
    try:
        r = _ip("netns", "add", probe, check=False)
        if r.returncode != 0:
            return f"`ip netns add {probe}` failed: {r.stderr.strip()}"
        r = _ip("-n", probe, "link", "add", "name", "probe0", "type", "veth", "peer", "name", "probe1", check=False)
        if r.returncode != 0:
            return f"creating a veth pair in a namespace failed: {r.stderr.strip()}"
        return None
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"running `ip` failed: {e}"
    finally:
        _ip("netns", "del", probe, check=False)


class Star:
    """The topology above; ``up()`` builds it, ``down()`` removes every namespace it created
    (their veths go with them). ``down()`` is safe to call at any point, more than once."""

    def __init__(self, prefix: str, hosts: Sequence[str]):
        if len(set(hosts)) != len(hosts) or not hosts:
            raise ValueError(f"hosts: need distinct names, got {list(hosts)}")
        for h in hosts:
            if len(f"h-{h}") > 15:
                raise ValueError(f"host name {h!r} too long for an interface name (h-{h})")
        if len(hosts) > 250:
            raise ValueError("at most 250 hosts")
        self.prefix, self.hosts = prefix, list(hosts)
        self.created: list[str] = []

    def ns(self, host: str) -> str:
        """Namespace of ``host``, or of the switch for "sw"."""
        return f"{self.prefix}-{host}"

    @property
    def switch_ns(self) -> str:
        return self.ns("sw")

    def _index(self, host: str) -> int:
        return self.hosts.index(host) + 1

    def switch_ip(self, host: str) -> str:
        """The switch's address on ``host``'s link (what ``host`` connects to)."""
        return f"{SUBNET}.{self._index(host)}.1"

    def host_ip(self, host: str) -> str:
        return f"{SUBNET}.{self._index(host)}.2"

    def switch_ifname(self, host: str) -> str:
        return f"h-{host}"

    def exec(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``host``'s namespace ("sw" for the switch's)."""
        return ["ip", "netns", "exec", self.ns(host), *argv]

    def up(self) -> "Star":
        remove_stale()
        existing = set(_ip("netns", "list").stdout.split())
        for name in [self.switch_ns] + [self.ns(h) for h in self.hosts]:
            if name in existing:  # left by a dead run with the same prefix
                _ip("netns", "del", name, check=False)
            _ip("netns", "add", name)
            self.created.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
        sw = self.switch_ns
        for h in self.hosts:
            ns, sif = self.ns(h), self.switch_ifname(h)
            _ip("link", "add", "name", "eth0", "netns", ns, "type", "veth", "peer", "name", sif, "netns", sw)
            _ip("-n", ns, "addr", "add", f"{self.host_ip(h)}/24", "dev", "eth0")
            _ip("-n", sw, "addr", "add", f"{self.switch_ip(h)}/24", "dev", sif)
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", sw, "link", "set", sif, "up")
        return self

    def down(self) -> list[str]:
        """Deletes the namespaces; returns the errors (a namespace with processes still inside
        lives on until they exit, but its name is gone)."""
        errors = []
        for name in reversed(self.created):
            r = _ip("netns", "del", name, check=False)
            if r.returncode != 0:
                errors.append(f"ip netns del {name}: {r.stderr.strip()}")
        self.created.clear()
        return errors

    def link_stats(self, host: str) -> dict:
        """Counters of the switch-side veth of ``host``'s link: ``{"rx": {...}, "tx": {...}}``
        as ``ip -s -j link`` reports them (packets, bytes, errors, dropped, ...)."""
        r = _ip("-n", self.switch_ns, "-s", "-j", "link", "show", "dev", self.switch_ifname(host))
        return json.loads(r.stdout)[0]["stats64"]

    def describe(self) -> dict:
        return {
            "switch": self.switch_ns,
            "hosts": {h: {"ns": self.ns(h), "ip": self.host_ip(h), "switch_ip": self.switch_ip(h),
                          "switch_if": self.switch_ifname(h)} for h in self.hosts},
        }


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("up", "down", "check"))
    p.add_argument("--prefix", default="ina")
    p.add_argument("--hosts", default="ps,w0,w1,w2", help="comma-separated host names")
    a = p.parse_args(argv)
    if a.action == "check":
        why = unavailable()
        print(why or "ok")
        return 1 if why else 0
    star = Star(a.prefix, a.hosts.split(","))
    if a.action == "up":
        try:
            star.up()
        except Exception:
            star.down()
            raise
        print(json.dumps(star.describe(), indent=1))
        return 0
    star.created = [n for n in [star.switch_ns] + [star.ns(h) for h in star.hosts]
                    if n in set(_ip("netns", "list").stdout.split())]
    errors = star.down()
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
