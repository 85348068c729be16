"""One worker of an emulated job, as a process: ``python -m inalab.emulation.worker TASK.json``.

It starts from its job's spec (the real runtime's client, :meth:`inalab.Client.from_spec`:
the emulator fixed every node id and address in advance), waits for the common start time, then runs the job's workload as the simulator does (crates/inalab-sim/src/workload.rs):

- ``allreduce``: ``iterations`` allreduces of ``bytes``, one after another, no compute;
- ``training``: per iteration, the forward pass of each layer in order (a layer waits for its
  own result of the previous iteration, then sleeps its forward time), then the backward pass in
  reverse order (each layer sleeps its backward time plus jitter, then starts the allreduce of
  its gradient without waiting for it).

Inputs are real data: rank ``r``'s tensor is ``base + r / 1024`` with ``base`` uniform in
[-1, 1) drawn from (job, layer), so every worker knows the exact sum (``world * base + sum r /
1024``) without the others' inputs, and checks each result against it within the scheme's
quantization bound; after another worker's failure (the orchestrator's ``{"op": "peer_failed",
"rank": R}`` on stdin, handed to the client) a result may also be the survivors' sum. With its
own results in, it says ``{"event": "finished"}`` and keeps serving its peers (a Canary leader
resends a result a slower peer lost) until the orchestrator says every worker of the job
finished (``{"op": "all_left"}``: a switch's control plane would), at most
``PEER_LINGER_S``. It then prints one JSON line: the iteration end times (monotonic clock, shared
by every process of the machine), the largest error, the number of wrong sums and its client's
counters.
"""
from __future__ import annotations

import json
import pathlib
import queue
import random
import sys
import threading
import time

import numpy as np

TIMEOUT_S = 120.0  # one allreduce of an emulated job; far above any shipped scenario's
PEER_LINGER_S = 30.0  # serving peers after this worker's own results (the runtime's PEER_LINGER)


def main(task_path: str) -> int:
    import inalab
    from inalab.runtime import quantization_bound

    t = json.loads(open(task_path).read())
    rank, world, job = t["rank"], t["world"], t["job"]
    wl = t["workload"]
    if wl["kind"] == "allreduce":
        layers = [{"bytes": wl["bytes"], "fwd_ps": 0, "bwd_ps": 0}]
    else:
        layers = wl["layers"]
    iterations = wl["iterations"]
    offset = sum(range(world)) / 1024.0
    inputs, expected, bounds, bases = [], [], [], []
    for l, layer in enumerate(layers):
        n = max(1, layer["bytes"] // 4)
        base = np.random.default_rng([job, l]).uniform(-1.0, 1.0, n).astype(np.float32)
        bases.append(base)
        inputs.append(base + np.float32(rank / 1024.0))
        expected.append((world * base.astype(np.float64) + offset).astype(np.float32))
        # The scheme's bound plus the float32 rounding of the expected sum itself.
        bounds.append(float(quantization_bound(t["scheme"], world, 1.0 + world / 1024.0)) + world * 2.0 ** -23)
    rng = random.Random(hash((job, rank, t["seed"])))
    client = inalab.Client.from_spec(t["spec"], rank, t["gateway"], link_rate=t["link_rate_bps"])
    print(json.dumps({"event": "joined", "rank": rank, "node": client.node}), flush=True)
    # The common start (the orchestrator writes it once every worker joined) plus the job's offset.
    go = pathlib.Path(t["go"])
    deadline = time.monotonic() + t["join_timeout_s"]
    while not go.exists():
        if time.monotonic() > deadline:
            print(json.dumps({"event": "done", "rank": rank, "host": t["host"], "ok": False, "iter_end": [],
                              "failed": ["no start signal"], "wrong": 0, "max_err": 0.0, "bound": 0.0, "stats": {}}), flush=True)
            return 1
        time.sleep(0.005)
    start = json.loads(go.read_text())["start_at"] + t["start_s"]
    while time.monotonic() < start:
        time.sleep(min(0.005, max(0.0, start - time.monotonic())))

    lock = threading.Lock()
    received = [0] * len(layers)          # results in, per layer
    per_iter = [0] * iterations           # layers in, per iteration
    iter_end = [None] * iterations
    errors = {"max_err": 0.0, "wrong": 0, "failed": []}
    changed = threading.Condition(lock)

    # Results are checked on their own thread, off the critical path: the next allreduce does
    # not wait for the check (the simulator's hosts spend no time on it either).
    checks: "queue.Queue" = queue.Queue()
    dead: set[int] = set()

    def check() -> None:
        while (item := checks.get()) is not None:
            l, result = item
            e = float(np.max(np.abs(result - expected[l])))
            if dead and not e <= bounds[l]:
                live = [r for r in range(world) if r not in dead]
                survivors = (len(live) * bases[l].astype(np.float64) + sum(live) / 1024.0).astype(np.float32)
                e = min(e, float(np.max(np.abs(result - survivors))))
            with lock:
                errors["max_err"] = max(errors["max_err"], e)
                errors["wrong"] += int(not e <= bounds[l])

    checker = threading.Thread(target=check, name="inalab-emulate-check")
    checker.start()

    all_left = threading.Event()

    def commands() -> None:
        # The orchestrator tells of a dead worker of the job, and when every worker finished (a
        # switch's control plane would).
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd.get("op") == "peer_failed":
                dead.add(int(cmd["rank"]))
                client.peer_failed(int(cmd["rank"]))
            elif cmd.get("op") == "all_left":
                all_left.set()

    threading.Thread(target=commands, name="inalab-emulate-commands", daemon=True).start()

    def on_result(l: int, it: int):
        def done(result, err):
            now = time.monotonic()
            with lock:
                if err is not None:
                    errors["failed"].append(f"layer {l} iteration {it}: {err}")
                else:
                    checks.put((l, result))
                received[l] += 1
                per_iter[it] += 1
                if per_iter[it] == len(layers):
                    iter_end[it] = now
                changed.notify_all()
        return done

    def sleep_ps(ps: int) -> None:
        if ps > 0:
            time.sleep(ps / 1e12)

    for it in range(iterations):
        for l, layer in enumerate(layers):
            with lock:
                # A layer's forward pass needs its result of the previous iteration.
                if not changed.wait_for(lambda: received[l] >= it or errors["failed"], timeout=TIMEOUT_S):
                    errors["failed"].append(f"layer {l} iteration {it - 1}: no result within {TIMEOUT_S} s")
                if errors["failed"]:
                    break
            sleep_ps(layer["fwd_ps"])
        if errors["failed"]:
            break
        for l in reversed(range(len(layers))):
            jitter = rng.randint(0, t["jitter_ps"]) if t["jitter_ps"] > 0 else 0
            sleep_ps(layers[l]["bwd_ps"] + jitter)
            client.allreduce_async(inputs[l], on_result(l, it))
    with lock:
        changed.wait_for(lambda: all(e is not None for e in iter_end) or errors["failed"], timeout=TIMEOUT_S)
    checks.put(None)
    checker.join()
    # Stopping now could strand a slower peer whose result this worker must resend (Canary's
    # leaders): serve until every worker of the job finished.
    print(json.dumps({"event": "finished", "rank": rank}), flush=True)
    all_left.wait(PEER_LINGER_S)
    stats = client.stats()
    client.close()
    ok = not errors["failed"] and all(e is not None for e in iter_end) and errors["wrong"] == 0
    print(json.dumps({"event": "done", "rank": rank, "host": t["host"], "ok": ok, "start_at": start, "iter_end": iter_end,
                      "max_err": errors["max_err"], "bound": max(bounds), "wrong": errors["wrong"],
                      "failed": errors["failed"][:5], "stats": stats}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
