"""The PyTorch example (examples/train_mlp.py) on emulated links: every worker in its own
network namespace behind one shaped link to the switch's namespace, trained once with DDP's
gloo allreduce and once through inalab's switch (SwitchML, the comm hook), in the same run
(a script, not a test: it needs root for namespaces and `tc`).

    .venv/bin/python benchmarks/train_mlp_emulated.py                    # 4 workers, 1 Gbps, 30 steps
    .venv/bin/python benchmarks/train_mlp_emulated.py --rate 100Mbps --workers 8 --json

The network is `inalab.emulation.fabric.Fabric`'s, as `inalab emulate` builds it: a star of
veth pairs (9000-B MTU) shaped by `tc tbf` to `--rate` (1 us of delay with netem). The switch's
namespace runs `inalab switch` on 0.0.0.0 and forwards IP, so gloo's TCP (DDP's allreduce, and
the loss averaging both runs do through gloo) crosses the same two shaped links as inalab's
datagrams. Prints, per run, the training loop's wall time and the losses; the largest
difference between the two runs' per-step losses; and, with --json, one JSON object last.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_mlp.py"
TIMEOUT_S = 300  # one training run, all ranks


def train(net, hosts: list[str], comm: str, steps: int, out: Path) -> float:
    """One run of the example with `comm` on every host; rank 0's loop time, seconds."""
    master = f"{net.end(hosts[0], 's0').ip}"
    procs = []
    for rank, h in enumerate(hosts):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(len(hosts)), "MASTER_ADDR": master, "MASTER_PORT": "29510",
               "LOCAL_RANK": "0", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": net.end(h, "s0").ifname,
               "INALAB_SWITCH": f"{net.end('s0', h).ip}:9100"}
        argv = [sys.executable, str(EXAMPLE), "--comm", comm, "--steps", str(steps), "--out", str(out)]
        procs.append(subprocess.Popen(net.exec(h, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    from inalab.emulation.fabric import wait_all

    outs = wait_all(procs, TIMEOUT_S, f"training with --comm {comm}")
    last = outs[0][0].strip().splitlines()[-1]  # "30 steps in 0.43 s"
    return float(last.split(" in ")[1].split()[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="1Gbps", help="every link's rate (default %(default)s)")
    ap.add_argument("--workers", type=int, default=4, help="ranks, one per namespace (default 4)")
    ap.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON object last")
    a = ap.parse_args()

    from inalab.emulation import fabric as fab
    from inalab.units import parse_rate

    why = fab.unavailable()
    if why:
        raise SystemExit(f"needs network namespaces: {why}")
    hosts = [f"h{i}" for i in range(a.workers)]
    links = [{"a": h, "b": "s0", "rate_bps": int(parse_rate(a.rate)), "delay_ps": 1_000_000} for h in hosts]
    net = fab.Fabric(nodes=["s0", *hosts], links=links, buffer_bytes=1 << 20, mtu=9000, netem=fab.has_netem())
    switch = None
    result: dict = {"rate": a.rate, "workers": a.workers, "steps": a.steps}
    try:
        net.up()
        net.route_ip_via("s0")
        switch = subprocess.Popen(net.exec("s0", [sys.executable, "-m", "inalab", "switch", "--udp", "0.0.0.0:9000", "--control",
                                                  "0.0.0.0:9100", "--json", "--stats-every", "0"]),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = json.loads(switch.stdout.readline() or "{}")
        if ready.get("event") != "ready":
            raise RuntimeError(f"the switch did not start: {switch.stderr.read().strip()[-2000:]}")
        with tempfile.TemporaryDirectory() as tmp:
            for comm in ("gloo", "inalab"):
                print(f"training with --comm {comm} over {a.workers} namespaces at {a.rate} ...", flush=True)
                out = Path(tmp) / f"{comm}.json"
                result[comm] = {"loop_s": train(net, hosts, comm, a.steps, out), "losses": json.loads(out.read_text())["losses"]}
        g, i = result["gloo"], result["inalab"]
        result["max_loss_diff"] = max(abs(x - y) for x, y in zip(g["losses"], i["losses"]))
        result["time_vs_gloo"] = i["loop_s"] / g["loop_s"]
    finally:
        if switch is not None:
            switch.terminate()
            switch.wait(timeout=10)
        net.down()
    print(f"| comm | {a.steps} steps, s | final loss |\n|---|---|---|")
    for comm in ("gloo", "inalab"):
        print(f"| {comm} | {result[comm]['loop_s']:.2f} | {result[comm]['losses'][-1]:.4f} |")
    print(f"largest per-step loss difference: {result['max_loss_diff']:.2e}; inalab / gloo time: {result['time_vs_gloo']:.2f}x")
    if a.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
