"""Stopping a run on Ctrl-C or SIGTERM: at once, and with no process left.

Every long command of ``inalab`` runs within :func:`on_signals` (``cli.interruptible``). A
simulation checks for signals between event batches; sweeps and reproductions run their
simulations in process pools (``inalab.sweeps.run_points``), ``inalab reproduce all`` runs
reproductions in a pool of their own (:mod:`inalab.reproduce.report`), whose processes fork
pools in turn, and ``inalab emulate`` runs switches and workers as processes. A pool's
``with`` block waits for its running tasks when an exception leaves it, and a task is a
simulation of up to minutes; and a process whose parent died is not found by walking the
tree from the top. So :func:`on_signals` stops every
descendant of this process *in the signal handler*, before raising :class:`Interrupted`: it
freezes the whole tree (SIGSTOP, until no new process appears), then kills it (SIGKILL) and
every process group a descendant leads (the reproductions of ``reproduce all`` each lead one,
so nothing of theirs escapes even if their parent is gone). The pools then find their workers
dead and their ``with`` blocks return at once.

Linux only (it reads ``/proc``); elsewhere :func:`descendants` finds nothing and only the
exception is raised.
"""
from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager
from typing import Iterable, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM arrived: a ``KeyboardInterrupt`` (so no ``except Exception``
    takes it for a failure, and what stops on Ctrl-C stops on it) that says which signal."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        self.signame = signal.Signals(self.signum).name
        super().__init__(f"interrupted by {self.signame}")

    @property
    def exit_status(self) -> int:
        """The shell's status of a process killed by the signal: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process (empty where there is no /proc)."""
    out = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:  # gone meanwhile
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ")".
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) >= 2:
            out[int(entry)] = int(fields[1])
    return out


def descendants(pids: Iterable[int] = ()) -> list[int]:
    """Every process below ``pids`` (default: this process), children before grandchildren."""
    roots = list(pids) or [os.getpid()]
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    out, todo, seen = [], list(roots), set(roots)
    while todo:
        for child in children.get(todo.pop(0), []):
            if child not in seen:
                seen.add(child)
                out.append(child)
                todo.append(child)
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_trees(pids: Iterable[int] = (), include_roots: bool = False) -> list[int]:
    """Kills every process below ``pids`` (default: this process), and ``pids`` too with
    ``include_roots``: freezes them all first (SIGSTOP, repeated until no new process
    appears, so none forks a new one or is orphaned meanwhile), then SIGKILLs them and the
    process groups they lead. Returns the pids killed."""
    roots = list(pids)
    frozen: list[int] = []
    if include_roots:
        for pid in roots:
            _signal(pid, signal.SIGSTOP)
            frozen.append(pid)
    for _ in range(50):
        new = [p for p in descendants(roots) if p not in frozen]
        if not new:
            time.sleep(0.005)  # a fork in flight when the SIGSTOP was sent
            new = [p for p in descendants(roots) if p not in frozen]
            if not new:
                break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
            frozen.append(pid)
    own_group = os.getpgrp()
    groups = set()
    for pid in frozen:
        try:
            if os.getpgid(pid) == pid and pid != own_group:
                groups.add(pid)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in frozen:
        _signal(pid, signal.SIGKILL)
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return frozen


@contextmanager
def on_signals() -> Iterator[None]:
    """Within it, SIGINT and SIGTERM kill every descendant of this process at once and raise
    :class:`Interrupted` in the main thread (later ones, while it unwinds, are ignored). A
    forked child that inherits the handler dies of the signal as it would by default.
    Handlers can only be set from the main thread: elsewhere this does nothing."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()
    fired = []

    def handler(signum, frame):
        if os.getpid() != owner:  # a forked child (a pool's worker): the default action
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if fired:
            return
        fired.append(signum)
        kill_trees()
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
