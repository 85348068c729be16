"""Real data plane benchmark: allreduce over UDP through inalab's software switch, against
torch.distributed's gloo backend on the same tensors, in the same run (a script, not a test).

    .venv/bin/python benchmarks/udp_allreduce.py                 # 2, 4, 8 workers; SwitchML + gloo; 4 MiB; 3 runs
    .venv/bin/python benchmarks/udp_allreduce.py --quick         # 1 MiB, 2 and 4 workers, 2 iterations, 1 run
    .venv/bin/python benchmarks/udp_allreduce.py --schemes switchml,atp --workers 2,4
    .venv/bin/python benchmarks/udp_allreduce.py --schemes switchml,switchml:packet_bytes=180   # a Tofino's 32 values
    .venv/bin/python benchmarks/udp_allreduce.py --floats 262144 --iters 3 --json
    .venv/bin/python benchmarks/udp_allreduce.py --in-process-switch   # switch in this process's threads
    .venv/bin/python benchmarks/udp_allreduce.py --emulate 1Gbps --workers 4 --iters 5   # shaped links, root

Set-up. Every worker is its own process (multiprocessing, spawn). For each worker count the
same processes run ``--reps`` rounds (default 3), each timing every inalab scheme asked for and
then gloo, so the backends interleave. Each worker's tensor is float32, uniform in [-1, 1),
seeded by its rank, the same for inalab and gloo. After ``--warmup`` allreduces (first round
only), all workers and this process meet at a barrier; each worker then times ``--iters``
allreduces of the same tensor. The time per allreduce is (latest end - earliest start) /
iters, read from CLOCK_MONOTONIC (``time.perf_counter``), which all processes share. A second
table gives, per backend and worker count, the minimum and median time, the median CPU-ms per
allreduce of all processes (workers; switch and PS) and the medians' ratios to gloo's;
``--json`` prints it as one JSON object, the last line (``summary``: ``time_vs_gloo``,
``cpu_vs_gloo``).

``--emulate RATE``: SwitchML through ``inalab emulate`` on a star of ``--workers`` hosts whose
links are shaped to RATE (the shipped emulate-switchml-star, 8 KiB datagrams), ``--reps``
runs, against gloo over the same shaped links (the switch's namespace forwards IP), with the
simulator's prediction for the scenario and the wire-rate floors (INA: the tensor once per
worker; ring: 2(n-1)/n times).

The switch (and ATP's parameter server) run by default as their own processes (``python -m inalab switch``
/ ``python -m inalab ps`` with ``--json``); their counters are read over the control plane
(``{"op":"stats"}`` on the control TCP address) at the barrier before and after the timed
loop, so the deltas count exactly the timed allreduces. Their CPU time (user + system, from
/proc/PID/stat) is read at the same points.

``--schemes`` entries are ``switchml`` or ``atp``, optionally with switch options
(``switchml:timeout_us=5000:pool_slots=512``; ``switchml:threads=4`` runs the switch's data
plane on 4 threads, its default being the switch's) and the job's ``ina`` parameters (any
other key: ``switchml:packet_bytes=180``); each entry gets its own switch process, so variants
run side by side on the same worker processes.

The first output line calibrates the machine: one connected send() and one recv() of a
160-byte loopback datagram from Python, in microseconds (the kernel's per-datagram cost).

Columns:
  time/AR        wall time per allreduce
  GB/s           goodput: tensor bytes / time per allreduce (what each worker gets reduced)
  sw Mpps rx+tx  switch datagrams received + forwarded per wall second (timed loop)
  sw Mpps rx     switch datagrams received per wall second
  sw CPU         switch process CPU seconds / wall seconds (1.00 = one core busy)
  Mpps/core      switch datagrams received (+ forwarded) per switch CPU second
  rx/call        datagrams per receive syscall on the switch (recvmmsg + GRO)
  tx/call        datagrams per send syscall on the switch (GSO trains)
  workers CPU    CPU seconds of all worker processes / wall seconds (2.00 = both cores)
  timeouts, rtx  workers' loss-recovery timeouts / retransmitted packets in the timed loop (sum;
                 SwitchML: retransmissions, ATP: resends)
  kernel drops   UDP datagrams the kernel dropped on full receive buffers during the timed loop
                 (RcvbufErrors in /proc/net/snmp, whole network namespace): real loss
  vs gloo        inalab time / gloo time (below 1: inalab faster)

gloo: ``torch.distributed`` ``all_reduce`` (SUM) on a CPU tensor; the tensor is refilled from
the input before each call (a 4 MiB copy, inside the timed loop: inalab also returns a new
array). Workers run with OMP_NUM_THREADS=1.

Results are checked: every worker compares its last inalab result with the float64 numpy sum of
all ranks' tensors and fails if the error exceeds the scheme's quantization bound
(``inalab.runtime.quantization_bound``, x1.5 slack); gloo's result is checked too (1e-5 x workers).
Rows are written to ``out/udp_allreduce.json`` (``--out`` to change, ``--out ''`` for none).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BARRIER_TIMEOUT_S = 600.0
EMULATED_GLOO_TIMEOUT_S = 180  # all of gloo's runs over emulated links
CLI = [sys.executable, "-m", "inalab"]


def log(msg: str) -> None:
    print(f"[udp_allreduce {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------ workers


def tensor_for(rank: int, floats: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, rank])
    return rng.uniform(-1.0, 1.0, floats).astype(np.float32)


def expected_sum(world: int, floats: int, seed: int) -> tuple[np.ndarray, float]:
    total = np.zeros(floats, np.float64)
    max_abs = 0.0
    for r in range(world):
        t = tensor_for(r, floats, seed)
        total += t
        max_abs = max(max_abs, float(np.max(np.abs(t))))
    return total, max_abs


def _protocol(st: dict) -> dict:
    """The worker's protocol counters plus its I/O ones (prefixed io_)."""
    p = {k: int(v) for k, v in (st.get("protocol") or {}).items() if isinstance(v, (int, float))}
    p.update({f"io_{k}": int(v) for k, v in (st.get("io") or {}).items() if isinstance(v, (int, float))})
    return p


def worker_main(rank: int, world: int, cfg: dict, barrier, results) -> None:
    """One worker process: joins every inalab scheme's job and gloo once, then per repetition
    times each of them in turn (interleaved), between barriers."""
    try:
        import inalab
        from inalab.runtime import quantization_bound

        a = tensor_for(rank, cfg["floats"], cfg["seed"])
        exp, max_abs = expected_sum(world, cfg["floats"], cfg["seed"])
        clients = []
        for i, (label, scheme, control, job_config) in enumerate(cfg["switches"]):
            c = inalab.Client(switch=control, job=cfg["job_base"] + i, rank=rank, world=world,
                              scheme=scheme, config=job_config, join_timeout_s=300.0)
            tol = 1.5 * float(quantization_bound(scheme, world, max_abs))
            clients.append((label, c.allreduce, c, tol))
        if cfg["gloo"]:
            os.environ.setdefault("OMP_NUM_THREADS", "1")
            from datetime import timedelta

            import torch
            import torch.distributed as dist

            torch.set_num_threads(1)
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['gloo_port']}", rank=rank,
                                    world_size=world, timeout=timedelta(seconds=300))
            src = torch.from_numpy(a)
            buf = src.clone()

            def gloo(_a):
                # Refilled before every call (a 4 MiB copy, timed: inalab also returns a new array).
                buf.copy_(src)
                dist.all_reduce(buf)
                return buf.numpy()

            clients.append(("gloo", gloo, None, 1e-5 * world))
        # Set-up (torch's modules above all) moves out of the collector's way: with it tracked,
        # collections during the timed loops cost the workers about 5 % of the machine's CPU.
        import gc

        gc.collect()
        gc.freeze()
        for rep in range(cfg["reps"]):
            for label, allreduce, c, tol in clients:
                if rep == 0:
                    for _ in range(cfg["warmup"]):
                        allreduce(a)
                p0 = _protocol(c.stats()) if c else {}
                barrier.wait(BARRIER_TIMEOUT_S)  # A: ready, parent reads switch counters
                barrier.wait(BARRIER_TIMEOUT_S)  # B: go
                t0, u0 = time.perf_counter(), time.process_time()
                for _ in range(cfg["iters"]):
                    out = allreduce(a)
                t1, u1 = time.perf_counter(), time.process_time()
                barrier.wait(BARRIER_TIMEOUT_S)  # C: all done, parent reads switch counters
                p1 = _protocol(c.stats()) if c else {}
                err = float(np.max(np.abs(out.astype(np.float64) - exp)))
                results.put({"rank": rank, "kind": label, "rep": rep, "t0": t0, "t1": t1, "cpu_s": u1 - u0, "max_err": err,
                             "tol": tol, "proto": {k: p1[k] - p0.get(k, 0) for k in p1}})
        for _, _, c, _ in clients:
            if c:
                c.close()
        if cfg["gloo"]:
            dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - report everything to the parent, then die
        results.put({"rank": rank, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()})
        try:
            barrier.abort()
        except Exception:
            pass
        raise SystemExit(1)


# ------------------------------------------------------------------------ switch and PS nodes


def control_request(addr: str, msg: dict, timeout: float = 10.0) -> dict:
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall((json.dumps(msg) + "\n").encode())
        f = s.makefile("r")
        line = f.readline()
    if not line:
        raise RuntimeError(f"control plane {addr}: connection closed without an answer to {msg}")
    reply = json.loads(line)
    if not reply.get("ok", False):
        raise RuntimeError(f"control plane {addr}: {reply.get('error', reply)}")
    return reply


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is the state (field 3); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Node:
    """A switch or PS: a subprocess of the `inalab` CLI, or (in_process) an object here."""

    def __init__(self, kind: str, args: list[str], in_process_obj=None):
        self.kind = kind
        self.obj = in_process_obj
        self.proc = None
        if in_process_obj is not None:
            self.pid = os.getpid()
            self.udp, self.control = in_process_obj.udp_addr, in_process_obj.control_addr
            return
        cmd = CLI + [kind, "--udp", "127.0.0.1:0", "--control", "127.0.0.1:0", "--json", "--stats-every", "0", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=10)
            raise RuntimeError(f"`inalab {kind}` exited ({self.proc.returncode}): {self.proc.stderr.read().strip()}")
        ready = json.loads(line)
        assert ready.get("event") == "ready", ready
        self.pid = self.proc.pid
        self.udp, self.control = ready["udp"], ready["control"]

    def stats(self) -> dict:
        if self.obj is not None:
            return self.obj.stats()
        return control_request(self.control, {"op": "stats"})

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def stop(self) -> None:
        if self.obj is not None:
            self.obj.stop()
            return
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def parse_scheme(spec: str, args) -> tuple[str, dict, dict]:
    """``switchml`` / ``atp``, optionally with switch options (``pool_slots``, ``timeout_us``) and
    the job's ``ina`` parameters (any other key, e.g. ``packet_bytes``):
    ``switchml:timeout_us=100000:pool_slots=512:packet_bytes=180``. Returns the program, the
    switch options and the job's configuration."""
    program, *kvs = spec.split(":")
    if program not in ("switchml", "atp"):
        raise ValueError(f"{spec!r}: {program!r} is not switchml or atp")
    opts = {"pool_slots": args.pool_slots, "timeout_us": args.timeout_us, "threads": 0}
    ina = {}
    for kv in kvs:
        k, _, v = kv.partition("=")
        if not k or not v.isdigit() or int(v) <= 0:
            raise ValueError(f"{spec!r}: {kv!r} is not KEY=N (N > 0; KEY pool_slots, timeout_us, threads or a job's ina parameter)")
        if k in opts:
            opts[k] = int(v)
        else:
            ina[k] = int(v)
    return program, opts, ({"ina": ina} if ina else {})


def switch_default(name: str):
    import inspect

    from inalab.runtime import Switch

    return inspect.signature(Switch).parameters[name].default


def start_nodes(scheme: str, in_process: bool, pool_slots: int, timeout_us: int, threads: int = 0) -> list[Node]:
    """The switch for `scheme` (and for ATP its PS); the switch first."""
    if in_process:
        import inalab

        sw = Node("switch", [], inalab.Switch(scheme, udp="127.0.0.1:0", control="127.0.0.1:0", pool_slots=pool_slots,
                                              timeout_us=timeout_us, threads=threads))
        nodes = [sw]
        if scheme == "atp":
            nodes.append(Node("ps", [], inalab.ParameterServer(switch=sw.control, udp="127.0.0.1:0", control="127.0.0.1:0")))
        return nodes
    sw = Node("switch", ["--program", scheme, "--pool-slots", str(pool_slots), "--timeout-us", str(timeout_us), "--threads", str(threads)])
    nodes = [sw]
    if scheme == "atp":
        nodes.append(Node("ps", ["--switch", sw.control]))
    return nodes


# --------------------------------------------------------------------------------- the driver


def udp_snmp() -> dict:
    """This network namespace's UDP counters (/proc/net/snmp): RcvbufErrors counts datagrams the
    kernel dropped because a receiving socket's buffer was full (real loss on loopback)."""
    try:
        lines = [l.split() for l in open("/proc/net/snmp") if l.startswith("Udp:")]
        return {k: int(v) for k, v in zip(lines[0][1:], lines[1][1:])}
    except (OSError, IndexError, ValueError):
        return {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def counters(st: dict) -> dict:
    io = st["io"]  # the PS has no received / forwarded packet counters, only I/O ones
    return {"received": st.get("received", 0), "forwarded": st.get("forwarded", 0), "rx": io["datagrams_received"],
            "tx": io["datagrams_sent"], "recv_calls": io["recv_calls"], "send_calls": io["send_calls"],
            "send_errors": io.get("send_errors", 0),
            **{f"program_{k}": v for k, v in (st.get("program") or {}).items() if isinstance(v, (int, float))}}


def run_world(world: int, args, switches: dict[str, list[Node]], job_configs: dict[str, dict], job_base: int) -> list[dict]:
    kinds = list(switches) + (["gloo"] if args.gloo else [])
    cfg = {
        "floats": args.floats, "iters": args.iters, "warmup": args.warmup, "seed": args.seed, "gloo": args.gloo,
        "switches": [(s, s.split(":")[0], nodes[0].control, job_configs[s]) for s, nodes in switches.items()],
        "job_base": job_base, "gloo_port": free_port(), "reps": args.reps,
    }
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(world + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=worker_main, args=(r, world, cfg, barrier, results), daemon=True) for r in range(world)]
    log(f"{world} workers: starting processes")
    for p in procs:
        p.start()
    rows = []
    try:
        for rep in range(args.reps):
            for kind in kinds:
                nodes = switches.get(kind, [])
                if rep == 0:
                    log(f"{world} workers, {kind}: warm-up ({args.warmup} allreduces of {args.floats:,} floats)")
                wait(barrier, results)  # A
                s0 = [counters(n.stats()) for n in nodes]
                c0 = [n.cpu() for n in nodes]
                k0 = udp_snmp()
                wait(barrier, results)  # B
                wait(barrier, results)  # C
                s1 = [counters(n.stats()) for n in nodes]
                c1 = [n.cpu() for n in nodes]
                k1 = udp_snmp()
                got = [get_result(results, procs) for _ in range(world)]
                rows.append(make_row(kind, world, args, got, s0, s1, c0, c1))
                r = rows[-1]
                r["rep"] = rep
                r["udp_rcvbuf_errors"] = k1.get("RcvbufErrors", 0) - k0.get("RcvbufErrors", 0)
                log(f"{world} workers, {kind}, run {rep + 1} of {args.reps}: {r['time_s'] * 1e3:.1f} ms per allreduce, "
                    f"{r['cpu_ms']:.1f} CPU-ms, {r['goodput_gbs']:.3f} GB/s"
                    + (f", switch {r['switch_mpps_rx'] + r['switch_mpps_tx']:.3f} Mpps" if nodes else ""))
        for p in procs:
            p.join(timeout=60)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
    return rows


def wait(barrier, results) -> None:
    try:
        barrier.wait(BARRIER_TIMEOUT_S)
    except Exception:
        errs = []
        while not results.empty():
            r = results.get()
            if "error" in r:
                errs.append(f"rank {r['rank']}: {r['error']}\n{r['trace']}")
        raise RuntimeError("a worker failed:\n" + ("\n".join(errs) or "(no message; barrier broken or timed out)"))


def finite(x):
    """JSON-safe copy: NaN / inf become null."""
    if isinstance(x, float) and not np.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def get_result(results, procs) -> dict:
    r = results.get(timeout=BARRIER_TIMEOUT_S)
    if "error" in r:
        raise RuntimeError(f"worker rank {r['rank']} failed: {r['error']}\n{r['trace']}")
    return r


def make_row(kind, world, args, got, s0, s1, c0, c1) -> dict:
    bad = [g for g in got if not g["max_err"] <= g["tol"]]
    if bad:
        raise SystemExit(
            f"RESULT MISMATCH ({kind}, {world} workers): "
            + "; ".join(f"rank {g['rank']}: max |result - numpy sum| = {g['max_err']:.3g} > tolerance {g['tol']:.3g}" for g in bad)
        )
    span = max(g["t1"] for g in got) - min(g["t0"] for g in got)
    per = span / args.iters
    nbytes = args.floats * 4
    row = {
        "kind": kind, "workers": world, "floats": args.floats, "bytes": nbytes, "iters": args.iters,
        "time_s": per, "goodput_gbs": nbytes / per / 1e9, "max_err": max(g["max_err"] for g in got),
        "tol": min(g["tol"] for g in got),
        "workers_cpu_share": sum(g["cpu_s"] for g in got) / span,
        # CPU per allreduce of every process taking part: the workers (all their threads) and,
        # below, the switch and ATP's PS.
        "workers_cpu_ms": sum(g["cpu_s"] for g in got) / args.iters * 1e3,
        "switch_cpu_ms": sum(c1[i] - c0[i] for i in range(len(c0))) / args.iters * 1e3,
    }
    row["cpu_ms"] = row["workers_cpu_ms"] + row["switch_cpu_ms"]
    # Workers' protocol counters over the timed loop, summed over ranks (SwitchML: packets_sent,
    # retransmissions, timeouts, stale_results; ATP: fragments_sent, resends, timeouts,
    # window_cuts, ...; io_*: the client's socket counters).
    proto: dict = {}
    for g in got:
        for k, v in g["proto"].items():
            proto[k] = proto.get(k, 0) + v
    row["worker_counters"] = proto
    row["timeouts"] = proto.get("timeouts", 0)
    row["retransmissions"] = proto.get("retransmissions", 0) + proto.get("resends", 0)
    if s0:
        d = {k: s1[0][k] - s0[0].get(k, 0) for k in s1[0]}
        cpu = c1[0] - c0[0]
        pkts = d["received"] + d["forwarded"]
        row.update({
            "switch_received": d["received"], "switch_forwarded": d["forwarded"],
            "switch_mpps_rx": d["received"] / span / 1e6, "switch_mpps_tx": d["forwarded"] / span / 1e6,
            "switch_cpu_s": cpu, "switch_cpu_share": cpu / span,
            # The workers' tensors the switch received, per CPU second of its own process.
            "switch_payload_gbs_per_core": world * nbytes * args.iters / cpu / 1e9 if cpu > 0 else float("nan"),
            "switch_mpps_per_core": pkts / cpu / 1e6 if cpu > 0 else float("nan"),
            "switch_mpps_rx_per_core": d["received"] / cpu / 1e6 if cpu > 0 else float("nan"),
            "rx_per_call": d["rx"] / d["recv_calls"] if d["recv_calls"] else float("nan"),
            "tx_per_call": d["tx"] / d["send_calls"] if d["send_calls"] else float("nan"),
            "switch_send_errors": d["send_errors"],
            "switch_program": {k[len("program_"):]: v for k, v in d.items() if k.startswith("program_")},
        })
        if len(s0) > 1:  # ATP's PS
            dp = {k: s1[1][k] - s0[1][k] for k in ("rx", "tx")}
            row.update({"ps_rx": dp["rx"], "ps_tx": dp["tx"], "ps_cpu_s": c1[1] - c0[1]})
    return row


def summarize(rows: list[dict]) -> dict:
    """Per scheme and worker count, over the repetitions: time per allreduce (min, median),
    goodput and CPU-ms per allreduce (median; workers, switch + PS, all), and the ratios of the
    medians to gloo's of the same worker count (``time_vs_gloo``, ``cpu_vs_gloo``)."""
    med = lambda xs: float(np.median(xs))  # noqa: E731
    out: dict = {}
    for kind in dict.fromkeys(r["kind"] for r in rows):
        for w in dict.fromkeys(r["workers"] for r in rows):
            rs = [r for r in rows if r["kind"] == kind and r["workers"] == w]
            if rs:
                out.setdefault(kind, {})[str(w)] = {
                    "runs": len(rs), "time_ms_min": min(r["time_s"] for r in rs) * 1e3, "time_ms_median": med([r["time_s"] for r in rs]) * 1e3,
                    "goodput_gbs_median": med([r["goodput_gbs"] for r in rs]),
                    "cpu_ms_median": med([r["cpu_ms"] for r in rs]), "workers_cpu_ms_median": med([r["workers_cpu_ms"] for r in rs]),
                    "switch_cpu_ms_median": med([r["switch_cpu_ms"] for r in rs]),
                    "retransmissions": sum(r.get("retransmissions", 0) for r in rs),
                }
    for kind, by in out.items():
        for w, v in by.items():
            g = out.get("gloo", {}).get(w)
            if g and kind != "gloo":
                v["time_vs_gloo"] = v["time_ms_median"] / g["time_ms_median"]
                v["cpu_vs_gloo"] = v["cpu_ms_median"] / g["cpu_ms_median"]
    return out


def fmt_summary(summary: dict) -> str:
    cols = ["workers", "backend", "runs", "time/AR ms min", "median", "GB/s", "CPU-ms/AR workers", "switch+PS", "all",
            "rtx", "time vs gloo", "CPU vs gloo"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for kind, by in summary.items():
        for w, v in by.items():
            ratio = lambda k: f"{v[k]:.2f}x" if k in v else ""  # noqa: E731
            out.append("| " + " | ".join([w, kind, str(v["runs"]), f"{v['time_ms_min']:.1f}", f"{v['time_ms_median']:.1f}",
                                          f"{v['goodput_gbs_median']:.3f}", f"{v['workers_cpu_ms_median']:.1f}",
                                          f"{v['switch_cpu_ms_median']:.1f}", f"{v['cpu_ms_median']:.1f}",
                                          str(v["retransmissions"]) if kind != "gloo" else "", ratio("time_vs_gloo"),
                                          ratio("cpu_vs_gloo")]) + " |")
    return "\n".join(out)


def fmt_table(rows: list[dict]) -> str:
    gloo = {r["workers"]: r["time_s"] for r in rows if r["kind"] == "gloo"}
    cols = ["workers", "backend", "time/AR ms", "GB/s", "sw Mpps rx+tx", "sw Mpps rx", "sw CPU",
            "Mpps/core rx+tx (rx)", "rx/call", "tx/call", "workers CPU", "timeouts, rtx", "kernel drops", "vs gloo"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        ratio = f"{r['time_s'] / gloo[r['workers']]:.1f}x" if r["kind"] != "gloo" and r["workers"] in gloo else ""
        if "switch_mpps_rx" in r:
            sw = [f"{r['switch_mpps_rx'] + r['switch_mpps_tx']:.3f}", f"{r['switch_mpps_rx']:.3f}", f"{r['switch_cpu_share']:.2f}",
                  f"{r['switch_mpps_per_core']:.2f} ({r['switch_mpps_rx_per_core']:.2f})", f"{r['rx_per_call']:.1f}",
                  f"{r['tx_per_call']:.2f}"]
            rt = f"{r['timeouts']}, {r['retransmissions']}"
        else:
            sw, rt = [""] * 6, ""
        cells = [str(r["workers"]), r["kind"], f"{r['time_s'] * 1e3:.1f}", f"{r['goodput_gbs']:.3f}", *sw,
                 f"{r['workers_cpu_share']:.2f}", rt, str(r.get("udp_rcvbuf_errors", "")) if sw[0] else "", ratio]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def calibrate(count: int = 20_000) -> dict:
    """This machine's loopback UDP cost: one connected send() of a 160-byte datagram (a SwitchML
    packet's size on this runtime's wire, roughly) and one non-blocking recv(), from Python, in
    microseconds per datagram (medians of 3; Python adds well under 1 us to each)."""
    r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        r.bind(("127.0.0.1", 0))
        try:
            r.setsockopt(socket.SOL_SOCKET, 33, 32 << 20)  # SO_RCVBUFFORCE (root), past rmem_max
        except OSError:
            r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
        c.connect(r.getsockname())
        r.setblocking(False)
        msg = b"x" * 160
        sends, recvs = [], []
        for _ in range(3):
            n = min(count, r.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 1024)  # fits the receive buffer
            t = time.perf_counter()
            for _ in range(n):
                c.send(msg)
            sends.append((time.perf_counter() - t) / n)
            t, got = time.perf_counter(), 0
            try:
                while True:
                    r.recv(2048)
                    got += 1
            except BlockingIOError:
                pass
            recvs.append((time.perf_counter() - t) / max(got, 1))
        return {"loopback_send_us": sorted(sends)[1] * 1e6, "loopback_recv_us": sorted(recvs)[1] * 1e6}
    finally:
        r.close()
        c.close()


def build_info() -> dict:
    """Git commit of the checkout and the extension's modification time (it is rebuilt in place)."""
    import inalab._core as core

    info = {"core_mtime": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(os.path.getmtime(core.__file__)))}
    try:
        info["commit"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "crates"], capture_output=True,
                               text=True).stdout.strip()
        info["crates_dirty"] = bool(dirty)
    except (OSError, subprocess.CalledProcessError):
        pass
    return info


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


# ------------------------------------------------------------------------ emulated links


def gloo_worker(cfg: dict) -> None:
    """One gloo rank in its network namespace (``--gloo-worker JSON``): ``reps`` timed runs of
    ``iters`` allreduces after ``warmup``, each started at a barrier; prints one JSON line with
    the start and end of each run (CLOCK_MONOTONIC, which namespaces share) and the error."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = cfg["rank"], cfg["world"]
    dist.init_process_group("gloo", init_method=f"tcp://{cfg['master']}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=EMULATED_GLOO_TIMEOUT_S))
    a = tensor_for(rank, cfg["floats"], cfg["seed"])
    src = torch.from_numpy(a)
    buf = src.clone()
    runs = []
    for rep in range(cfg["reps"]):
        for _ in range(cfg["warmup"] if rep == 0 else 0):
            buf.copy_(src)
            dist.all_reduce(buf)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(cfg["iters"]):
            buf.copy_(src)
            dist.all_reduce(buf)
        runs.append((t0, time.perf_counter()))
    exp, _ = expected_sum(world, cfg["floats"], cfg["seed"])
    err = float(np.max(np.abs(buf.numpy().astype(np.float64) - exp)))
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "runs": runs, "max_err": err}), flush=True)


def emulated_scenario(world: int, rate: str, args) -> dict:
    """The shipped emulate-switchml-star (SwitchML on one switch, 8 KiB datagrams on 9000-B MTU
    links, the real frame's overhead charged) with ``world`` workers, the links at ``rate``, one
    allreduce of the benchmark's tensor per iteration (``warmup + iters``)."""
    import tomllib

    from inalab.config import shipped_scenarios

    sc = tomllib.loads(shipped_scenarios()["emulate-switchml-star"].read_text())
    sc["name"] = f"udp-allreduce-{world}-{rate}"
    sc["topology"].update(hosts=world, link_rate=rate)
    sc["jobs"][0].update(workers=world, allreduce=f"{args.floats * 4}B", iterations=args.warmup + args.iters)
    return sc


def run_gloo_emulated(world: int, rate_bps: int, args) -> list[float]:
    """gloo over a star of ``world`` namespaces whose links are shaped as ``inalab emulate``
    shapes them (the same ``Fabric``; the switch's namespace forwards IP, so TCP crosses the
    same two shaped links a datagram does). Time per allreduce of each run, seconds."""
    from inalab.emulation import fabric as fab

    hosts = [f"h{i}" for i in range(world)]
    links = [{"a": h, "b": "s0", "rate_bps": rate_bps, "delay_ps": 1_000_000} for h in hosts]
    net = fab.Fabric(nodes=["s0", *hosts], links=links, buffer_bytes=1 << 20, mtu=9000, netem=fab.has_netem())
    try:
        net.up()
        net.route_ip_via("s0")
        master = f"{net.end('h0', 's0').ip}:29500"
        procs = []
        for r, h in enumerate(hosts):
            cfg = {"rank": r, "world": world, "master": master, "floats": args.floats, "seed": args.seed, "warmup": args.warmup,
                   "iters": args.iters, "reps": args.reps}
            # gloo advertises the address of the interface it is told to use (else its host
            # name's, which other namespaces cannot reach).
            env = {**os.environ, "GLOO_SOCKET_IFNAME": net.end(h, "s0").ifname}
            procs.append(subprocess.Popen(net.exec(h, [sys.executable, __file__, "--gloo-worker", json.dumps(cfg)]),
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        outs = fab.wait_all(procs, EMULATED_GLOO_TIMEOUT_S, "gloo over the emulated links")
        out = [json.loads(so.strip().splitlines()[-1]) for so, _ in outs]
        bad = [o for o in out if not o["max_err"] <= 1e-5 * world]
        if bad:
            raise SystemExit(f"RESULT MISMATCH (gloo, emulated, {world} workers): {bad}")
        return [(max(o["runs"][k][1] for o in out) - min(o["runs"][k][0] for o in out)) / args.iters
                for k in range(args.reps)]
    finally:
        net.down()


def emulated(args, worlds: list[int]) -> dict:
    """``--emulate RATE``: per worker count, SwitchML through ``inalab emulate`` (``--reps``
    runs), gloo over the same shaped links, and the simulator's prediction for the scenario;
    times per allreduce and their ratios."""
    import inalab
    from inalab.units import parse_rate

    rate_bps = int(parse_rate(args.emulate))

    def per_allreduce(r) -> float:
        """Median iteration (one allreduce) after the warm-up ones, seconds."""
        it = r.iterations
        return float(it[it.iteration >= args.warmup].duration_s.median())

    out = {}
    for world in worlds:
        sc = emulated_scenario(world, args.emulate, args)
        sim = per_allreduce(inalab.simulate(sc))
        ina = []
        for rep in range(args.reps):
            log(f"emulated {args.emulate}, {world} workers: SwitchML run {rep + 1} of {args.reps}")
            r = inalab.emulate(sc, progress=False)
            e = r.jobs.iloc[0]
            if not (e.finished and e.payload_errors == 0):
                raise SystemExit(f"emulated SwitchML ({world} workers) did not finish with exact sums: {e.to_dict()}")
            ina.append(per_allreduce(r))
        log(f"emulated {args.emulate}, {world} workers: gloo, {args.reps} runs")
        gloo = run_gloo_emulated(world, rate_bps, args)
        size = args.floats * 4
        med = lambda xs: float(np.median(xs))  # noqa: E731
        out[str(world)] = {
            "link_bps": rate_bps, "sim_ms": sim * 1e3,
            "ina_ms_min": min(ina) * 1e3, "ina_ms_median": med(ina) * 1e3, "gloo_ms_min": min(gloo) * 1e3,
            "gloo_ms_median": med(gloo) * 1e3,
            # Wire-rate floors: INA sends and receives the tensor once per worker, a ring
            # 2(n-1)/n times (payload only, no headers).
            "ina_floor_ms": size * 8 / rate_bps * 1e3, "ring_floor_ms": 2 * (world - 1) / world * size * 8 / rate_bps * 1e3,
            "time_vs_gloo": med(ina) / med(gloo), "vs_sim": med(ina) / sim,
        }
    return out


def fmt_emulated(rows: dict) -> str:
    cols = ["workers", "link", "SwitchML ms min", "median", "gloo ms min", "median", "simulated ms", "floors INA / ring ms",
            "time vs gloo", "vs simulated"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for w, v in rows.items():
        out.append("| " + " | ".join([w, f"{v['link_bps'] / 1e9:g} Gbps", f"{v['ina_ms_min']:.1f}", f"{v['ina_ms_median']:.1f}",
                                      f"{v['gloo_ms_min']:.1f}", f"{v['gloo_ms_median']:.1f}", f"{v['sim_ms']:.1f}",
                                      f"{v['ina_floor_ms']:.1f} / {v['ring_floor_ms']:.1f}", f"{v['time_vs_gloo']:.2f}x",
                                      f"{v['vs_sim']:.2f}x"]) + " |")
    return "\n".join(out)



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--floats", type=int, default=None, help="float32 values per tensor (default 1,048,576 = 4 MiB)")
    ap.add_argument("--mib", type=float, default=None, help="tensor size in MiB (alternative to --floats)")
    ap.add_argument("--iters", type=int, default=None, help="timed allreduces per configuration (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed allreduces first (default 1)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions, each timing every backend in turn (default 3; --quick 1)")
    ap.add_argument("--workers", default=None, help="comma-separated worker counts (default 2,4,8)")
    ap.add_argument("--schemes", default="switchml", help="comma-separated inalab schemes, each switchml or atp, optionally with switch options "
                    "and the job's ina parameters (e.g. switchml:timeout_us=100000:pool_slots=512, switchml:packet_bytes=180; one "
                    "switch per entry). Default switchml")
    ap.add_argument("--no-gloo", dest="gloo", action="store_false", help="skip the torch.distributed gloo comparison")
    ap.add_argument("--in-process-switch", action="store_true",
                    help="run the switch (and PS) in this process's Rust threads instead of `inalab switch` subprocesses")
    ap.add_argument("--pool-slots", type=int, default=None, help="switch's SwitchML slots per job (default: the switch's, 128)")
    ap.add_argument("--timeout-us", type=int, default=None,
                    help="workers' loss-recovery timeout the switch hands out, us (default: the switch's, see inalab.Switch)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="1 MiB, 2 iterations, 2 and 4 workers (flags given explicitly win)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    ap.add_argument("--out", default=str(ROOT / "out" / "udp_allreduce.json"), help="write rows here as JSON ('' for none)")
    ap.add_argument("--emulate", default=None, metavar="RATE",
                    help="instead: SwitchML through `inalab emulate` on a star with links at RATE (e.g. 1Gbps; needs root) "
                         "against gloo over the same shaped links, with the simulator's prediction")
    ap.add_argument("--gloo-worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.gloo_worker:
        return gloo_worker(json.loads(args.gloo_worker))

    if args.pool_slots is None:
        args.pool_slots = switch_default("pool_slots")
    if args.timeout_us is None:
        args.timeout_us = switch_default("timeout_us")
    if args.floats is None:
        mib = args.mib if args.mib is not None else (1.0 if args.quick else 4.0)
        args.floats = int(mib * 1024 * 1024 / 4)
    if args.iters is None:
        args.iters = 2 if args.quick else 3
    if args.reps is None:
        args.reps = 1 if args.quick else 3
    if args.workers is None:
        args.workers = "2,4" if args.quick else "2,4,8"
    worlds = [int(w) for w in args.workers.split(",") if w.strip()]
    schemes = {}
    for spec in (x.strip() for x in args.schemes.split(",")):
        if spec:
            try:
                schemes[spec] = parse_scheme(spec, args)
            except ValueError as e:
                ap.error(f"--schemes: {e}")
    if args.floats <= 0 or args.iters <= 0 or args.reps <= 0 or args.warmup < 0 or not worlds or min(worlds) < 1:
        ap.error("sizes, iterations and worker counts must be positive")

    if args.emulate:
        rows = emulated(args, worlds)
        print(f"emulated links at {args.emulate}: {args.floats * 4 / 2**20:.2f} MiB float32, {args.warmup} warm-up + "
              f"{args.iters} timed allreduces, {args.reps} runs; SwitchML as emulate-switchml-star (8 KiB datagrams)")
        print(fmt_emulated(rows))
        if args.json:
            print(json.dumps(finite({"emulated": {"switchml": rows}})))
        return
    cal = calibrate()
    t_start = time.perf_counter()
    switches: dict[str, list[Node]] = {}
    rows: list[dict] = []
    try:
        for s, (program, opts, _) in schemes.items():
            switches[s] = start_nodes(program, args.in_process_switch, opts["pool_slots"], opts["timeout_us"], opts["threads"])
            log(f"{s} switch: udp {switches[s][0].udp}, control {switches[s][0].control}"
                + (" (in this process)" if args.in_process_switch else f" (pid {switches[s][0].pid})"))
        for i, w in enumerate(worlds):
            rows += run_world(w, args, switches, {s: job for s, (_, _, job) in schemes.items()}, job_base=1000 * (i + 1))
    finally:
        for nodes in switches.values():
            for n in reversed(nodes):
                n.stop()
    wall = time.perf_counter() - t_start
    log(f"done in {wall:.0f} s")

    summary = summarize(rows)
    meta = {"nproc": os.cpu_count(), "cpu": cpu_model(), "floats": args.floats, "iters": args.iters, "reps": args.reps,
            "warmup": args.warmup, "switch": "in-process" if args.in_process_switch else "subprocess",
            "pool_slots": args.pool_slots, "timeout_us": args.timeout_us,
            "loadavg": os.getloadavg(), "wall_s": wall, **cal, **build_info()}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(finite({"meta": meta, "summary": summary, "rows": rows}), indent=1))
    if args.json:
        # One JSON object, the last line: per backend and worker count the medians and ratios.
        print(json.dumps(finite({"meta": meta, "summary": summary})))
        return
    print(f"machine: nproc={meta['nproc']}, {meta['cpu']}; load average at end {meta['loadavg'][0]:.2f}; loopback UDP "
          f"from Python: send {cal['loopback_send_us']:.1f} us, recv {cal['loopback_recv_us']:.1f} us per 160 B datagram")
    print(f"tensor: {args.floats:,} float32 ({args.floats * 4 / 2**20:.2f} MiB), {args.warmup} warm-up + "
          f"{args.iters} timed allreduces per row; switch {meta['switch']}, "
          f"pool {args.pool_slots} slots, timeout {args.timeout_us} us; commit {meta.get('commit', '?')}"
          f"{' (crates/ modified)' if meta.get('crates_dirty') else ''}, _core built {meta['core_mtime']} UTC")
    print()
    print(fmt_table(rows))
    print()
    print(f"medians over {args.reps} runs (ratios: medians against gloo's of the same worker count):")
    print(fmt_summary(summary))
    sw_rows = [r for r in rows if "switch_mpps_rx" in r]
    if sw_rows:
        best = max(sw_rows, key=lambda r: r["switch_payload_gbs_per_core"])
        print()
        print(f"best switch rate: {best['switch_payload_gbs_per_core']:.2f} GB/s of the workers' tensors received per switch CPU "
              f"second, {best['switch_mpps_rx_per_core']:.3f} M datagrams ({best['kind']}, {best['workers']} workers); target 3 GB/s: "
              f"{'met' if best['switch_payload_gbs_per_core'] >= 3.0 else 'NOT met'}")


if __name__ == "__main__":
    main()
