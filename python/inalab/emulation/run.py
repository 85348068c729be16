"""``inalab emulate``: a scenario's jobs run for real on its topology (docs/emulation.md).

One process per switch (``inalab switch --fabric`` with the programs its jobs' schemes
install), per parameter server (``inalab ps --fabric``) and per worker
(:mod:`inalab.emulation.worker`), all fixed in advance by :mod:`inalab.emulation.plan`. Either
each in its node's network namespace with links shaped by ``tc`` (:class:`fabric.Fabric`), or
all on loopback with links shaped in user space (:class:`fabric.LocalFabric`). The result has
the tables and summary of ``inalab simulate`` (times from the wall clock), plus ``emulation``:
how links were shaped and routed, what the processes counted, and when the scenario's
failures (``[[failures]]``) were carried out (:mod:`inalab.emulation.failures`).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

from .. import schemes
from ..config import ConfigError, build_topology, load_scenario
from ..results import Result
from . import fabric as fab
from . import failures as fail
from .plan import PS_CONTROL, SWITCH_PORT, deploy

# What one 2-core machine carries (docs/emulation.md, "Limits"): beyond these the processes,
# not the links, set the pace and the emulation stops meaning anything. Measured on 2 cores;
# on a machine with more, the limits below scale with its cores (:func:`limits`).
BASE_CORES = 2
MAX_HOSTS = 8
# One or two more where the links are slow enough that the processes idle most of the time:
# GRID's Fig. 1 (8 workers and a PS) at 30 Mbps links (0.42 Gbps in use) kept the cores below
# saturation (docs/emulation.md, "Limits").
MAX_HOSTS_LOW_RATE = 10
LOW_RATE_GBPS = 1.0       # the sum of the rates of the links in use up to which MAX_HOSTS_LOW_RATE apply
MAX_SWITCHES = 6          # one process each
MAX_AGGREGATE_GBPS = 5.0  # sum of the rates of the links in use
# Per switch process (one data-plane thread), so not scaled by the machine's cores.
MAX_PACKETS_PER_S = 500_000  # datagrams per second the software switch receives, summed over its links
JOIN_TIMEOUT_S = 30.0     # a worker process is up and its client started
START_DELAY_S = 0.5       # from the last worker up to the common start
STOP_TIMEOUT_S = 5.0      # a switch / PS exits after SIGINT
SWITCH_CONTROL = 9100


@dataclass(frozen=True)
class Limits:
    """What this machine carries: the 2-core values above times cores / 2 (never below them).
    Scaled linearly because each host and switch is a process of its own that needs a core's
    share at line rate; measured at 2 cores only."""

    cores: int
    hosts: int
    hosts_low_rate: int
    switches: int
    aggregate_gbps: float


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or taskset's share,
    not the machine's count), or ``$INALAB_EMULATE_CORES`` where set."""
    if "INALAB_EMULATE_CORES" in os.environ:
        try:
            n = int(os.environ["INALAB_EMULATE_CORES"])
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError("INALAB_EMULATE_CORES", f"{os.environ['INALAB_EMULATE_CORES']!r} is not a whole number of cores (1 or more)")
        return n
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or BASE_CORES)


def limits(cores: Optional[int] = None) -> Limits:
    c = machine_cores() if cores is None else cores
    f = max(1.0, c / BASE_CORES)
    return Limits(c, int(MAX_HOSTS * f), int(MAX_HOSTS_LOW_RATE * f), int(MAX_SWITCHES * f), MAX_AGGREGATE_GBPS * f)


class EmulationError(RuntimeError):
    """The emulation could not run or did not complete; the message says why."""


def _check(spec: dict, built: dict) -> None:
    """Refuses, naming the field and the limit, what this machine or this emulator cannot run."""
    lim = limits()
    here = f"on this machine ({lim.cores} cores)"
    switches = [n for n in built["nodes"] if n["kind"] == "switch"]
    if len(switches) > lim.switches:
        raise ConfigError("topology", f"{len(switches)} switches; emulate runs at most {lim.switches} {here}")
    if spec["flows"] or spec.get("background"):
        raise ConfigError("flows", "emulate runs jobs only; remove [[flows]] and [background]")
    if "flow_control" in spec["network"]:
        # Its links are shaped queues that drop: nothing there could pause a sender.
        raise ConfigError("network.flow_control", 'emulate runs drop-tail queues only; set flow_control = "drop_tail"')
    if spec["network"].get("host_costs"):
        # Emulated hosts are real processes: their costs are this machine's, not a model's.
        raise ConfigError("network.host_costs", "emulate runs real processes with this machine's own costs; remove host_costs")
    used = {h for j in spec["jobs"] for h in j["workers"] + j["servers"]}
    rates = [l["rate_bps"] for l in built["links"] if built["nodes"][l["a"]]["name"] in used or built["nodes"][l["b"]]["name"] in used]
    if len(used) > lim.hosts and (len(used) > lim.hosts_low_rate or sum(rates) / 1e9 > LOW_RATE_GBPS):
        raise ConfigError("jobs.workers", f"{len(used)} hosts in use; emulate runs at most {lim.hosts} {here}, "
                                          f"or {lim.hosts_low_rate} where the links in use sum to at most {LOW_RATE_GBPS:g} Gbps "
                                          f"(these sum to {sum(rates) / 1e9:.2f} Gbps)")
    if sum(rates) / 1e9 > lim.aggregate_gbps:
        raise ConfigError("topology.host_rate", f"{sum(rates) / 1e9:.1f} Gbps of links in use; emulate carries at most "
                                                f"{lim.aggregate_gbps:g} Gbps {here}")


def _packet_bytes(job: dict) -> int:
    return int(job.get("ina", {}).get("packet_bytes", 1500))


def _check_rate(spec: dict, built: dict) -> None:
    """The switch's packet rate at line rate must stay within what it processes."""
    rate = {built["nodes"][l["a"]]["name"]: l["rate_bps"] for l in built["links"]}
    pps = 0.0
    for j in spec["jobs"]:
        for h in j["workers"] + j["servers"]:
            pps += rate.get(h, 0) / 8 / _packet_bytes(j)
    if pps > MAX_PACKETS_PER_S:
        worst = min(spec["jobs"], key=_packet_bytes)
        raise ConfigError(f"jobs[{worst['id']}].ina.packet_bytes",
                          f"at line rate the switch would receive {pps:,.0f} datagrams/s, above the {MAX_PACKETS_PER_S:,} "
                          "a software switch handles on this machine; use larger packets (docs/emulation.md)")


class _Procs:
    """Processes in namespaces, output to files; ``close()`` stops what still runs."""

    def __init__(self, fabric: fab.Fabric, logdir: Path, env: dict):
        self.fabric, self.logdir, self.env = fabric, logdir, env
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, node: str, argv: list[str], commands: bool = False) -> None:
        """``commands``: its stdin is a pipe for :meth:`command`."""
        out, err = open(self.logdir / f"{name}.out", "w"), open(self.logdir / f"{name}.err", "w")
        # Switches and PSes are stopped with SIGINT (`interrupt`). A run started with SIGINT
        # ignored (`nohup ... &` in a script) would pass that on, the children would never stop
        # and their final counters would be lost: give them SIGINT's default back.
        ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        self.procs[name] = subprocess.Popen(self.fabric.exec(node, argv), stdout=out, stderr=err,
                                            stdin=subprocess.PIPE if commands else subprocess.DEVNULL,
                                            env=self.env, start_new_session=True,
                                            preexec_fn=_sigint_default if ignored else None)
        out.close(), err.close()

    def command(self, name: str, obj: dict) -> None:
        """One JSON line on the process's stdin (a dead process's is ignored)."""
        p = self.procs[name]
        try:
            p.stdin.write((json.dumps(obj) + "\n").encode())
            p.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def kill(self, name: str) -> None:
        """SIGKILL: no final counters, no clean-up."""
        fail.kill_group(self.procs[name])

    def promote(self, spare: str, name: str) -> None:
        """Process ``spare`` becomes ``name`` (whose dead process's output is kept as
        ``name.<k>.out``)."""
        old = self.procs[name]
        if old.stdin:
            old.stdin.close()
        k = 1
        while (self.logdir / f"{name}.{k}.out").exists():
            k += 1
        for ext in ("out", "err"):
            (self.logdir / f"{name}.{ext}").rename(self.logdir / f"{name}.{k}.{ext}")
            (self.logdir / f"{spare}.{ext}").rename(self.logdir / f"{name}.{ext}")
        self.procs[name] = self.procs.pop(spare)

    def lines(self, name: str) -> list[dict]:
        out = []
        for line in (self.logdir / f"{name}.out").read_text().splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
        return out

    def event(self, name: str, event: str, where=lambda e: True) -> Optional[dict]:
        """The process's first ``event`` line for which ``where`` holds, if any yet."""
        return next((e for e in self.lines(name) if e.get("event") == event and where(e)), None)

    def wait_event(self, name: str, event: str, timeout: float, where=lambda e: True) -> dict:
        """:meth:`event`, waited for up to ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            ev = self.event(name, event, where)
            if ev is not None:
                return ev
            if self.procs[name].poll() is not None:
                time.sleep(0.05)
                ev = self.event(name, event, where)
                if ev is not None:
                    return ev
                raise EmulationError(f"{name} exited {self.procs[name].returncode} before it was {event}: {self.tail(name)}")
            if time.monotonic() > deadline:
                raise EmulationError(f"{name} was not {event} within {timeout:.0f} s: {self.tail(name)}")
            time.sleep(0.02)

    def tail(self, name: str) -> str:
        err = (self.logdir / f"{name}.err").read_text().strip().splitlines()
        return " | ".join(err[-3:]) or "(no output)"

    def interrupt(self, name: str) -> Optional[dict]:
        """SIGINT and the process's final ``stopped`` line."""
        p = self.procs[name]
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        return self.event(name, "stopped")

    def close(self) -> None:
        for p in self.procs.values():
            if p.stdin:
                try:
                    p.stdin.close()
                except OSError:
                    pass
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(3)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(3)


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


SHAPERS = ("auto", "tc", "user")


def emulate(
    config: Union[str, Path, dict],
    *,
    seed: Optional[int] = None,
    progress: Union[bool, Callable[[str], None]] = True,
    keep_logs: Optional[Path] = None,
    shaper: str = "auto",
    pcap: Optional[Path] = None,
) -> Result:
    """Runs ``config``'s jobs for real on its topology and returns a :class:`Result` with the
    tables of :func:`inalab.simulate` (wall-clock times). ``shaper``: "tc" (network namespaces,
    links shaped by ``tc``; needs root), "user" (everything on loopback, links shaped in user
    space by the switch and the hosts' pacers; no privileges) or "auto" (default: "tc" where
    namespaces can be built, else "user", saying why). ``progress``: status lines on stderr (or
    a callable taking each line). ``keep_logs``: a directory for the processes' output
    (default: a temporary one, deleted). ``pcap``: a directory where each switch writes
    ``SWITCH.pcapng``, every datagram it receives and sends (a switch restarted after a
    failure: ``SWITCH-restarted.pcapng``); default none. Raises :class:`ConfigError` for what cannot be
    emulated (naming the field and the limit) and :class:`EmulationError` when a run fails."""
    say = (lambda m: print(f"emulate: {m}", file=sys.stderr, flush=True)) if progress is True else (progress or (lambda m: None))
    if shaper not in SHAPERS:
        raise ConfigError("shaper", f"{shaper!r} is not one of {', '.join(SHAPERS)}")
    scenario = load_scenario(config)
    if seed is not None:
        scenario = scenario.model_copy(update={"seed": seed})
    spec = scenario.to_spec()
    built = build_topology(spec["topology"])
    _check(spec, built)
    _check_rate(spec, built)
    failures = fail.plan(spec, built)
    why = fab.unavailable() if shaper != "user" else "asked for the user-space shaper"
    if why and shaper == "tc":
        raise EmulationError(f"cannot build the emulated network with tc: {why}")
    routing = spec["network"]["routing"]["kind"]
    if routing != "ecmp":
        say(f"network.routing = {routing!r} is emulated as ECMP (the software switches do not route adaptively)")
    t_wall = time.monotonic()

    names = [n["name"] for n in built["nodes"]]
    used = [h for j in spec["jobs"] for h in j["workers"] + j["servers"]]
    nodes = [n["name"] for n in built["nodes"] if n["kind"] == "switch" or n["name"] in used]
    links = [{"a": names[l["a"]], "b": names[l["b"]], "rate_bps": l["rate_bps"], "delay_ps": l["delay_ps"]}
             for l in built["links"] if names[l["a"]] in nodes and names[l["b"]] in nodes]
    buffer = spec["network"]["buffer_bytes"]
    if why:
        if len({(l["rate_bps"], l["delay_ps"]) for l in links}) > 1:
            raise ConfigError("topology", "the user-space shaper gives every switch port one rate and delay; this "
                                          "scenario's links differ (use the tc shaper: run as root)")
        if shaper == "auto":
            say(f"no network namespaces ({why}): links shaped in user space")
        colocated = [j for j in spec["jobs"] if set(j["servers"]) & set(j["workers"])]
        if colocated:
            # There each process paces its own link: a co-located PS would get a second one.
            raise ConfigError(f"jobs[{colocated[0]['id']}].servers", "a server on one of its workers' hosts (co-located) "
                                                                     "shares that host's link in network namespaces only: "
                                                                     "run with the tc shaper (as root), not the user-space one")
        net = fab.LocalFabric(nodes=nodes, links=links, buffer_bytes=buffer)
    else:
        fab.remove_stale(say)
        # Jumbo frames: a frame's real overhead (envelope, tag) can push a scenario's 1500 B
        # packet past a 1500 B MTU, and a datagram that does not fit is never sent.
        net = fab.Fabric(nodes=nodes, links=links, buffer_bytes=buffer, mtu=9000, netem=fab.has_netem())
    tmp = tempfile.TemporaryDirectory(prefix="inalab-emulate-")
    logdir = Path(keep_logs) if keep_logs else Path(tmp.name)
    logdir.mkdir(parents=True, exist_ok=True)
    if pcap is not None:
        Path(pcap).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", INALAB_SECRET=os.urandom(32).hex())
    env.pop("INALAB_SECRET_FILE", None)
    procs = _Procs(net, logdir, env)

    def on_sigterm(signum, _frame):
        from ..stop import Interrupted

        raise Interrupted(signum)

    old = signal.signal(signal.SIGTERM, on_sigterm) if _main_thread() else None
    try:
        if isinstance(net, fab.Fabric):
            say(f"building {len(net.nodes)} namespaces and {len(links)} links (shaped by tc tbf"
                f"{', delayed by netem' if net.netem else '; no netem in this kernel: link delay not emulated'})")
        net.up()
        raw = _run(spec, built, net, procs, logdir, say, failures, None if pcap is None else Path(pcap).resolve())
    except KeyboardInterrupt:
        say("interrupted; stopping every process and removing the namespaces")
        raise
    finally:
        procs.close()
        errors = net.down()
        if old is not None:
            signal.signal(signal.SIGTERM, old)
        tmp.cleanup()
        if errors:
            say("clean-up: " + "; ".join(errors))
    raw["wall_s"] = time.monotonic() - t_wall
    raw["emulation"]["routing"] = "ecmp, flows pinned to the simulator's paths"
    return Result(raw)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _free_ports(n: int) -> list[int]:
    """``n`` free TCP/UDP port numbers on loopback (bound and released at once)."""
    import socket

    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(n)]
    try:
        for sk in socks:
            sk.bind(("127.0.0.1", 0))
        return [sk.getsockname()[1] for sk in socks]
    finally:
        for sk in socks:
            sk.close()


def _run(spec: dict, built: dict, net, procs: _Procs, logdir: Path, say, failures: list, pcap: Optional[Path] = None) -> dict:
    py = sys.executable

    def capture(s: str, suffix: str = "") -> list:
        return [] if pcap is None else ["--pcap", str(pcap / f"{s}{suffix}.pcapng")]

    local = isinstance(net, fab.LocalFabric)
    used = [n for n in net.nodes if n in {h for j in spec["jobs"] for h in j["workers"] + j["servers"]}]
    if local:
        port = dict(zip(net.nodes, _free_ports(len(net.nodes))))
        dep = deploy(spec, built, used, lambda node, peer, _: f"127.0.0.1:{port[node]}")
    else:
        dep = deploy(spec, built, used, lambda node, peer, p: f"{net.end(node, peer).ip}:{p}")
    name_of = {v: k for k, v in dep.node_id.items()}
    programs = sorted({j["scheme"] for j in spec["jobs"]} & set(schemes.with_program())) or ["switchml"]
    switch_argv = {}
    for s in dep.switches:
        path = logdir / f"fabric-{s}.json"
        path.write_text(json.dumps(dep.fabrics[s]))
        memory = max(sw["memory_bytes"] for sw in dep.specs[0]["switches"]) if dep.specs[0]["switches"] else \
            spec["network"]["aggregator_memory_bytes"]
        argv = [py, "-m", "inalab", "switch", "--node", str(dep.node_id[s]), "--program", ",".join(programs),
                "--udp", f"127.0.0.1:{port[s]}" if local else f"0.0.0.0:{SWITCH_PORT}",
                "--control", "127.0.0.1:0" if local else f"0.0.0.0:{SWITCH_CONTROL}",
                "--memory-bytes", str(memory * len(programs)), "--seed", str(spec["seed"]), "--fabric", str(path),
                "--stats-every", "0", "--json", "--stdin-commands"]
        if local:
            link = net.links[0]
            argv += ["--link-rate", str(link["rate_bps"]), "--link-delay-us", str(link["delay_ps"] / 1e6),
                     "--buffer-bytes", str(net.buffer_bytes)]
        switch_argv[s] = argv
        procs.start(f"switch-{s}", s, argv + capture(s), commands=True)
    for s in dep.switches:
        procs.wait_event(f"switch-{s}", "ready", 15)
    # A switch that fails and comes back gets its replacement now, on standby (imported and
    # waiting to start), so that it serves at `until` rather than after a process start.
    for s in fail.spares(failures):
        procs.start(f"spare-{s}", s, switch_argv[s] + ["--standby"] + capture(s, "-restarted"), commands=True)
    for s in fail.spares(failures):
        procs.wait_event(f"spare-{s}", "standby", 30)
    servers = sorted({h for j in spec["jobs"] for h in j["servers"]})
    for h in servers:
        path = logdir / f"fabric-{h}.json"
        node = dep.node_id[h]
        path.write_text(json.dumps({"gateway": dep.udp[dep.tor[h], h],
                                    "jobs": [sp for sp in dep.specs if any(sv["node"] == node for sv in sp["servers"])]}))
        procs.start(f"ps-{h}", h, [py, "-m", "inalab", "ps", "--node", str(node), "--udp", dep.ps_udp[h],
                                   "--control", "127.0.0.1:0" if local else f"0.0.0.0:{PS_CONTROL}", "--fabric", str(path),
                                   "--link-rate", str(_rate(net, h, dep.tor[h])), "--stats-every", "0", "--json"])
        procs.wait_event(f"ps-{h}", "ready", 15)
    go = logdir / "go.json"
    go.unlink(missing_ok=True)  # a kept log directory may hold the last run's
    workers, roster = [], []
    for j, job_spec in zip(spec["jobs"], dep.specs):
        for rank, h in enumerate(j["workers"]):
            task = {"job": j["id"], "rank": rank, "world": len(j["workers"]), "scheme": j["scheme"], "spec": job_spec,
                    "gateway": dep.udp[dep.tor[h], h], "workload": j["workload"], "start_s": j["start_ps"] / 1e12,
                    "jitter_ps": j["jitter_ps"], "seed": spec["seed"], "host": h, "join_timeout_s": JOIN_TIMEOUT_S,
                    "go": str(go), "link_rate_bps": _rate(net, h, dep.tor[h])}
            path = logdir / f"task-{j['id']}-{rank}.json"
            path.write_text(json.dumps(task))
            name = f"w{j['id']}-{rank}"
            # Its stdin carries the orchestrator's word of a dead peer (a host failure).
            procs.start(name, h, [py, "-m", "inalab.emulation.worker", str(path)], commands=True)
            workers.append(name)
            roster.append((name, h, j["id"], rank))
    say(f"{len(dep.switches)} switches; {len(workers)} workers of {len(spec['jobs'])} jobs starting")
    for w in workers:
        procs.wait_event(w, "joined", JOIN_TIMEOUT_S)
    start_at = time.monotonic() + START_DELAY_S
    tmp_go = go.with_suffix(".tmp")
    tmp_go.write_text(json.dumps({"start_at": start_at}))
    tmp_go.rename(go)
    say("all started; running")
    adj = {s: [p for p in net.nodes if (s, p) in dep.udp and p in dep.switches] for s in dep.switches}

    def set_links(node: str, peers: list[str], up: bool) -> None:
        for p in peers:
            if (node, p) in net.ends:
                e = net.end(node, p)
                fab._run("ip", "-n", e.ns, "link", "set", "dev", e.ifname, "up" if up else "down")

    def revive(s: str) -> None:
        procs.promote(f"spare-{s}", f"switch-{s}")
        procs.command(f"switch-{s}", {"op": "start"})

    executor = fail.Executor(failures, start_at, dep.node_id, adj, procs,
                             revive=revive, spare=lambda s: procs.start(f"spare-{s}", s, switch_argv[s] + ["--standby"] + capture(s, "-restarted"), commands=True),
                             ready=lambda s: procs.event(f"switch-{s}", "ready") is not None,
                             set_links=None if local else set_links, say=say, workers=roster)
    last = time.monotonic()
    told = set()  # jobs whose workers were told that every worker finished

    def tell_all_left() -> None:
        for job in {j for _, _, j, _ in roster} - told:
            names = [n for n, _, j, _ in roster if j == job and n not in executor.killed]
            if all(procs.procs[n].poll() is not None or procs.event(n, "finished") is not None for n in names):
                for n in names:
                    procs.command(n, {"op": "all_left"})
                told.add(job)

    while any(procs.procs[w].poll() is None for w in workers):
        due = executor.next_in()
        time.sleep(0.05 if due is None else min(0.05, due))
        executor.step()
        tell_all_left()
        if time.monotonic() - last >= 2.0:
            last = time.monotonic()
            done = sum(procs.procs[w].poll() is not None for w in workers if w not in executor.killed)
            dead = f" ({len(executor.killed)} failed)" if executor.killed else ""
            say(f"{time.monotonic() - start_at:.1f} s: {done}/{len(workers) - len(executor.killed)} workers done{dead}")
    results = {}
    for w in workers:
        if w in executor.killed:
            continue  # its host failed: the job's result is its survivors'
        ev = procs.event(w, "done")
        if ev is None:
            raise EmulationError(f"worker {w} exited {procs.procs[w].returncode} without a result: {procs.tail(w)}")
        results[w] = ev
    if not local:
        counters = {"links": {(e.node, peer): net.link_stats(e.node, peer) for (node, peer), e in net.ends.items()},
                    "udp": {n: net.udp_stats(n) for n in net.nodes}}
    # Every job ended: each switch removes their state, as the simulator releases a job at its
    # end (what a job still held is counted as aggregators_released, not left in use).
    released = {s: 0 for s in dep.switches}
    for s in dep.switches:
        if procs.procs[f"switch-{s}"].poll() is not None:
            continue  # failed for good
        for sp in dep.specs:
            procs.command(f"switch-{s}", {"op": "release", "job": sp["job"]})
        for sp in dep.specs:
            ev = procs.wait_event(f"switch-{s}", "command", STOP_TIMEOUT_S,
                                  lambda e, j=sp["job"]: e.get("op") == "release" and e.get("job") == j)
            released[s] += int(ev.get("aggregators_released", 0))
    sw_final = {s: procs.interrupt(f"switch-{s}") for s in dep.switches}
    ps_final = {h: procs.interrupt(f"ps-{h}") for h in servers}
    if local:
        counters = _local_counters(net, dep, name_of, results, sw_final, ps_final)
    say("done")
    raw = _result(spec, net, dep, start_at, results, counters, sw_final, ps_final, released)
    raw["emulation"]["failures"] = executor.report()
    return raw


def _local_counters(net, dep, name_of: dict, results: dict, sw_final: dict, ps_final: dict) -> dict:
    """Link counters in the user-space mode: a host's uplink from its own pacer's count, a
    switch port's from the switch (queue drops included)."""
    zero = {"qdisc_bytes": 0, "qdisc_packets": 0, "qdisc_drops": 0}
    links = {}
    uplinks = [(r["host"], r["stats"].get("io", {})) for r in results.values()]
    uplinks += [(h, (st or {}).get("io", {})) for h, st in ps_final.items()]
    for h, io in uplinks:
        links[h, dep.tor[h]] = {"qdisc_bytes": io.get("wire_bytes_sent", 0), "qdisc_packets": io.get("datagrams_sent", 0), "qdisc_drops": 0}
    for s, st in sw_final.items():
        for port in (st or {}).get("ports", []):
            peer = name_of.get(port["node"])
            if peer is not None:
                links[s, peer] = {"qdisc_bytes": port["sent_bytes"], "qdisc_packets": port["sent"], "qdisc_drops": port["queue_drops"]}
    for l in net.links:
        links.setdefault((l["a"], l["b"]), dict(zero))
        links.setdefault((l["b"], l["a"]), dict(zero))
    return {"links": links, "udp": {n: {} for n in net.nodes}}


def _rate(net, a: str, b: str) -> int:
    return next(l["rate_bps"] for l in net.links if {l["a"], l["b"]} == {a, b})


def _result(spec, net, dep, start_at, results, counters, sw_final, ps_final, released: dict) -> dict:
    link_stats, udp = counters["links"], counters["udp"]
    jobs, iterations = [], []
    end_all = start_at
    for j in spec["jobs"]:
        # The survivors' results (a failed host's workers report none).
        rs = [results[w] for r in range(len(j["workers"])) if (w := f"w{j['id']}-{r}") in results]
        t0 = start_at + j["start_ps"] / 1e12
        wl = j["workload"]
        layers = [wl["bytes"]] if wl["kind"] == "allreduce" else [l["bytes"] for l in wl["layers"]]
        n_iter = wl["iterations"]
        ends = []
        for i in range(n_iter):
            ts = [r["iter_end"][i] for r in rs if r["iter_end"] and r["iter_end"][i] is not None]
            if len(ts) < len(rs):
                break
            ends.append(max(ts))
        failures = [f for r in rs for f in r["failed"]]
        wrong = sum(r["wrong"] for r in rs)
        if wrong:  # a wrong sum is a failure, as in the simulator (never "finished" or "unfinished")
            failures.append(f"wrong sums: {wrong} of {len(layers) * len(ends) * len(rs)} results differ from the exact sums "
                            f"beyond the quantization bound")
        finished = len(ends) == n_iter and all(r["ok"] for r in rs) and not failures
        status = "finished" if finished else "failed" if failures else "unfinished"
        reason = None if finished else failures[0] if failures else (
            f"{len(ends)} of {n_iter} iterations done when its processes ended")
        end = (ends[-1] if ends else time.monotonic()) - t0
        end_all = max(end_all, t0 + end)
        jct = end if finished else None
        bpi = sum(layers)
        n = len(j["workers"])
        goodput = bpi * len(ends) * 8 / jct / 1e9 if jct else None
        jobs.append({
            "id": j["id"], "name": j["name"], "scheme": j["scheme"], "workers": n, "kind": wl["kind"],
            "finished": finished, "status": status, "reason": reason,
            "jct_s": jct, "iterations": len(ends), "iterations_planned": n_iter,
            "mean_iteration_s": (ends[-1] - t0) / len(ends) if ends else None,
            "bytes_per_iteration": bpi, "goodput_gbps": goodput,
            "busbw_gbps": None if goodput is None else goodput * 2 * (n - 1) / n,
            "payload_checked": sum(len(layers) * len(ends) for _ in rs), "payload_errors": sum(r["wrong"] for r in rs),
            "max_error": max(r["max_err"] for r in rs), "error_bound": max(r["bound"] for r in rs),
            "failures": failures,
        })
        prev = t0
        for i, t in enumerate(ends):
            iterations.append({"job": j["id"], "iteration": i, "end_s": t - start_at, "duration_s": t - prev})
            prev = t
    duration = max(end_all - start_at, 1e-9)
    rate = {}
    for l in net.links:
        rate[l["a"], l["b"]] = rate[l["b"], l["a"]] = l["rate_bps"]
    links = []
    for i, l in enumerate(net.links):
        for src, dst in ((l["a"], l["b"]), (l["b"], l["a"])):
            st = link_stats[src, dst]
            links.append({"link": i, "src": src, "dst": dst, "rate_gbps": l["rate_bps"] / 1e9,
                          "tx_bytes": st["qdisc_bytes"], "tx_packets": st["qdisc_packets"],
                          "utilization": st["qdisc_bytes"] * 8 / l["rate_bps"] / duration,
                          "drops_queue": st["qdisc_drops"], "drops_loss": 0, "ecn_marks": 0})
    switches = []
    for sw, st in sw_final.items():
        if not st:
            continue
        counters = {k: v for k, v in st.items() if isinstance(v, int)}
        counters.update({f"program.{k}": v for k, v in st.get("program", {}).items()})
        switches.append({"name": sw, "programmable": dep.programmable[sw], "rx_packets": st["received"],
                         "absorbed_packets": sum(st.get("absorbed", {}).values()),
                         "drops_program": sum(st.get("program_drops", {}).values()),
                         "drops_socket": udp[sw].get("RcvbufErrors", 0),
                         "aggregators_end": st["aggregators_in_use"], "aggregators_released": released.get(sw, 0),
                         "counters": counters})
    hosts = []
    for h in net.nodes:
        if h not in dep.tor:
            continue
        up, down = link_stats[h, dep.tor[h]], link_stats[dep.tor[h], h]
        counters = next((r["stats"]["protocol"] for r in results.values() if r["host"] == h), {})
        hosts.append({"name": h, "tx_bytes": up["qdisc_bytes"], "tx_packets": up["qdisc_packets"],
                      "rx_bytes": down["qdisc_bytes"], "rx_packets": down["qdisc_packets"],
                      "drops_loss": udp[h].get("RcvbufErrors", 0),
                      "counters": counters})
    outcome = ("failed" if any(j["status"] == "failed" for j in jobs) else
               "unfinished" if any(not j["finished"] for j in jobs) else "completed")
    return {
        "scenario": spec["name"], "seed": spec["seed"], "sim_time_s": duration, "wall_s": 0.0, "events": 0,
        "stopped_by": "work_ended", "outcome": outcome, "jobs": jobs, "iterations": iterations, "links": links,
        "switches": switches, "hosts": hosts, "flows": [], "timeseries": [], "conservation": {},
        "emulation": {"shaping": net.label + (" + netem" if net.netem else ""),
                      "link_delay_emulated": net.netem or isinstance(net, fab.LocalFabric),
                      "mtu": net.mtu, "udp": udp, "switches": sw_final, "ps": ps_final},
    }
