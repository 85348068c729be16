"""Memory over a long job: allreduces of 1 M values per scheme through the real runtime, with
the RSS of every process (switch, PS, workers) sampled, and the slope per allreduce reported
side by side (issue #36 item 4; the target is under 1 KiB per allreduce for every PS and
worker). A script, not a test.

    .venv/bin/python benchmarks/memory_slope.py                        # every scheme with a switch program, 2,000 x 1 M values, 2 workers
    .venv/bin/python benchmarks/memory_slope.py --allreduces 200       # what fits a shared 2-core machine
    .venv/bin/python benchmarks/memory_slope.py --schemes atp,grid --workers 3 --json

Set-up, per scheme: ``inalab switch --program SCHEME`` and, for the schemes with a parameter
server (ATP, DSA, GRID), ``inalab ps`` as processes of their own (``--json``, no status
lines), and ``--workers`` worker processes (multiprocessing, spawn), each an
``inalab.Client`` that allreduces its own float32 tensor of ``--values`` values (uniform in
+/-1, seeded by its rank: every sum stays inside every scheme's fixed-point range)
``--allreduces`` times, the same tensor every time. Each worker checks its last result
against the float64 sum of all ranks' tensors within ``quantization_bound`` (x1.5).

Sampling: this process reads VmRSS (``/proc/PID/status``) of every process of the scheme every
``--every`` seconds (0.25 by default), with the allreduces rank 0 has finished so far (a
shared counter). The slope is the least-squares fit of RSS against that count, over the
samples after the first ``--skip`` of the allreduces (10 %: a process's first allreduces
fill what it keeps at its bound, such as a PS's window of results, allocator arenas and
socket buffers, which is no growth over the job) and before the last one (closing frees the
job's state). ``start`` and ``end`` are the RSS at the first fitted sample and at the last;
``peak`` the largest.

Columns:
  process        switch, ps or worker N (rank)
  start, end     RSS at the first fitted sample and at the end, MiB
  peak           largest RSS sampled, MiB
  slope          bytes per allreduce (least squares over the fitted samples)
  late           the same over the second half of the allreduces alone (information: a bound
                 that fills past the skipped tenth is flat here; ``ok`` is judged on slope)
  ok             slope under --target bytes per allreduce (1,024) for a PS or worker (the
                 switch's memory is the aggregators it was given, not per job)
  AR/s           allreduces per second (rank 0)

Rows are written to ``out/memory_slope.json`` (``--out`` to change, ``--out ''`` for none).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from udp_allreduce import Node  # noqa: E402 - the switch and PS as `inalab` subprocesses

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "inalab"]
SCHEMES = ["switchml", "atp", "dsa", "canary", "static_tree", "rina", "grid"]
WITH_PS = {"atp", "dsa", "grid"}
PROGRESS_EVERY_S = 30.0


def log(msg: str) -> None:
    print(f"[memory_slope {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def tensor_for(rank: int, values: int) -> np.ndarray:
    return np.random.default_rng([36, rank]).uniform(-1.0, 1.0, values).astype(np.float32)


def worker_main(rank: int, world: int, cfg: dict, done, barrier, results) -> None:
    """One worker process: joins the job, allreduces its tensor `allreduces` times (rank 0
    counts them in `done`), checks the last sum. The workers close together: a Canary leader
    that closed first left a slower peer's last allreduce unanswered (#36 item 8)."""
    try:
        import inalab
        from inalab.runtime import quantization_bound

        a = tensor_for(rank, cfg["values"])
        with inalab.Client(switch=cfg["control"], job=cfg["job"], rank=rank, world=world, scheme=cfg["scheme"],
                           join_timeout_s=120.0) as c:
            t0 = time.perf_counter()
            out = None
            for k in range(cfg["allreduces"]):
                out = c.allreduce(a, timeout_s=120.0)
                if rank == 0:
                    done.value = k + 1
            t1 = time.perf_counter()
            barrier.wait(120.0)
        want = sum(tensor_for(r, cfg["values"]).astype(np.float64) for r in range(world))
        err = float(np.max(np.abs(out.astype(np.float64) - want)))
        tol = 1.5 * float(quantization_bound(cfg["scheme"], world, 1.0))
        results.put({"rank": rank, "pid": os.getpid(), "seconds": t1 - t0, "max_err": err, "tol": tol})
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        results.put({"rank": rank, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()})
        raise SystemExit(1)


def held(st, keys=("pending", "completed_kept", "retained")) -> dict:
    """What a process's protocols say they hold (counters named in ``keys``, summed over the
    stats' jobs), to tell a bound that fills from growth while the run goes on."""
    out: dict = {}

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k in keys and isinstance(v, (int, float)):
                    out[k] = out.get(k, 0) + v
                else:
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(st)
    return out


def slope(points: list[tuple[int, int]]) -> float:
    """Least-squares slope of RSS (bytes) against allreduces done."""
    x = np.array([p[0] for p in points], np.float64)
    y = np.array([p[1] for p in points], np.float64)
    if len(x) < 2 or np.ptp(x) == 0:
        return float("nan")
    return float(np.polyfit(x, y, 1)[0])


def run_scheme(scheme: str, args) -> list[dict]:
    nodes = [Node("switch", ["--program", scheme])]
    if scheme in WITH_PS:
        nodes.append(Node("ps", ["--switch", nodes[0].control]))
    ctx = mp.get_context("spawn")
    done = ctx.Value("l", 0)
    barrier = ctx.Barrier(args.workers)
    results = ctx.Queue()
    cfg = {"scheme": scheme, "control": nodes[0].control, "job": 36, "values": args.values, "allreduces": args.allreduces}
    workers = [ctx.Process(target=worker_main, args=(r, args.workers, cfg, done, barrier, results)) for r in range(args.workers)]
    samples: dict[str, list[tuple[int, int]]] = {}
    try:
        for w in workers:
            w.start()
        procs = {n.kind: n.pid for n in nodes} | {f"worker {r}": w.pid for r, w in enumerate(workers)}
        t_start = last_said = time.monotonic()
        while any(w.is_alive() for w in workers):
            k = done.value
            if time.monotonic() - last_said >= PROGRESS_EVERY_S:
                last_said = time.monotonic()
                state = ""
                if len(nodes) > 1:
                    try:
                        state = f"; PS holds {held(nodes[1].stats())}"
                    except Exception as e:  # noqa: BLE001 - progress only
                        state = f"; PS stats unavailable ({e})"
                log(f"{scheme}: {k}/{args.allreduces} allreduces, {k / (last_said - t_start):.1f}/s{state}")
            # While the allreduces run: closing frees the job's state, which is no slope.
            for name, pid in procs.items():
                rss = rss_bytes(pid)
                if rss is not None and k < args.allreduces and (name not in samples or k > 0):
                    samples.setdefault(name, []).append((k, rss))
            if time.monotonic() - t_start > args.timeout_s:
                raise RuntimeError(f"{scheme}: not done within {args.timeout_s} s ({k} allreduces)")
            time.sleep(args.every)
        reports = [results.get(timeout=10) for _ in workers]
    finally:
        for w in workers:
            if w.is_alive():
                w.kill()
            w.join()
        for n in nodes:
            n.stop()
    errors = [r for r in reports if "error" in r]
    if errors:
        raise RuntimeError(f"{scheme}: {errors[0]['error']}\n{errors[0]['trace']}")
    for r in reports:
        if not r["max_err"] <= r["tol"]:
            raise RuntimeError(f"{scheme} rank {r['rank']}: error {r['max_err']} above {r['tol']}")
    rate = args.allreduces / next(r["seconds"] for r in reports if r["rank"] == 0)
    rows = []
    for name, pts in samples.items():
        fitted = [p for p in pts if p[0] >= args.skip * args.allreduces]
        s = slope(fitted)
        # The second half alone: a bound that fills past the skipped tenth (Rina's hosts keep
        # the last 256 results) shows here as flat, where growth stays a slope.
        late = slope([p for p in pts if p[0] >= args.allreduces // 2])
        judged = name != "switch"
        rows.append({"scheme": scheme, "process": name, "allreduces": args.allreduces, "values": args.values,
                     "workers": args.workers, "samples": len(fitted),
                     "start_mib": fitted[0][1] / 2**20 if fitted else float("nan"),
                     "end_mib": pts[-1][1] / 2**20, "peak_mib": max(p[1] for p in pts) / 2**20,
                     "slope_bytes_per_allreduce": s, "late_slope_bytes_per_allreduce": late, "ok": (s < args.target) if judged else None,
                     "allreduces_per_s": rate})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemes", default=",".join(SCHEMES), help=f"comma-separated, of {', '.join(SCHEMES)}")
    ap.add_argument("--allreduces", type=int, default=2000)
    ap.add_argument("--values", type=int, default=1 << 20, help="float32 values per allreduce (1 M)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--every", type=float, default=0.25, help="seconds between RSS samples")
    ap.add_argument("--skip", type=float, default=0.1, help="fraction of the allreduces left out of the fit")
    ap.add_argument("--target", type=float, default=1024.0, help="bytes per allreduce a PS or worker may grow")
    ap.add_argument("--timeout-s", type=float, default=3600.0, help="per scheme")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON lines")
    ap.add_argument("--out", default=str(ROOT / "out" / "memory_slope.json"))
    args = ap.parse_args(argv)
    schemes = [s for s in args.schemes.split(",") if s]
    unknown = [s for s in schemes if s not in SCHEMES]
    if unknown:
        ap.error(f"--schemes: {', '.join(unknown)} not among {', '.join(SCHEMES)}")
    if args.allreduces < 10 or not 0 <= args.skip < 0.9:
        ap.error("--allreduces must be at least 10 and --skip in [0, 0.9)")
    rows = []
    for scheme in schemes:
        log(f"{scheme}: {args.allreduces} allreduces of {args.values} values, {args.workers} workers")
        t0 = time.monotonic()
        rows += run_scheme(scheme, args)
        log(f"{scheme}: {time.monotonic() - t0:.0f} s")
    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print(f"{'scheme':<12}{'process':<10}{'start MiB':>10}{'end MiB':>9}{'peak MiB':>9}{'slope B/AR':>12}{'late B/AR':>11}{'ok':>5}{'AR/s':>7}")
        for r in rows:
            ok = "" if r["ok"] is None else ("yes" if r["ok"] else "NO")
            print(f"{r['scheme']:<12}{r['process']:<10}{r['start_mib']:>10.1f}{r['end_mib']:>9.1f}{r['peak_mib']:>9.1f}"
                  f"{r['slope_bytes_per_allreduce']:>12.0f}{r['late_slope_bytes_per_allreduce']:>11.0f}{ok:>5}{r['allreduces_per_s']:>7.1f}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))
    bad = [r for r in rows if r["ok"] is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
