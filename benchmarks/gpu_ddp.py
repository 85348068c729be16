"""DDP training step time through inalab against gloo, on CUDA tensors (a script, not a test).

    python benchmarks/gpu_ddp.py                          # ResNet-18 on cuda:0, 4 ranks, every variant below
    python benchmarks/gpu_ddp.py --device cpu --model small --steps 6 --only gloo,hook:switchml
    python benchmarks/gpu_ddp.py --json                   # the last line is one JSON object

Set-up (issue #41's measurement): torchvision's ResNet-18 (11.2 M parameters, 10 classes) or,
with ``--model small`` (or where torchvision is missing), a 3-layer CNN; ``--world`` ranks
(default 4) under torchrun, all on one GPU (``cuda:0``) or on the CPU; each rank trains on a fixed
batch of ``--batch`` (default 64) images of 3x32x32 drawn from its own seed, SGD (lr 0.01,
momentum 0.9), ``--steps`` steps (default 12). A step is timed from a synchronised start to a
synchronised end (``torch.cuda.synchronize``); the figure is the median step after the first
``--skip`` (default 2).

Variants (``--only`` takes a comma list of them):
  gloo               DDP over a gloo process group (gloo takes CUDA tensors): the reference
  hook:SCHEME        gloo group, gradients through ``inalab.torch.allreduce_hook`` (SCHEME switchml or atp)
  backend:SCHEME     ``dist.init_process_group("inalab")``: DDP's allreduce through the backend
  nccl               DDP over NCCL, each rank a "node" of its own (``NCCL_HOSTID``), so NCCL's
                     allreduce crosses its network transport: the reference of the collnet variants
  collnet:SCHEME     the same with inalab's NCCL plugin (``NCCL_NET_PLUGIN``) and CollNet forced
                     (``NCCL_COLLNET_ENABLE=1``, ``NCCL_ALGO=allreduce:collnetchain``): unmodified
                     DDP on NCCL, its allreduce through the switch (issue #44; CUDA only). The row
                     says whether NCCL's log showed the plugin loaded and CollNet connected.
  ...+bf16           the same under ``torch.autocast(dtype=bfloat16)`` (gloo+bf16, hook:switchml+bf16, ...)
Default: gloo, hook:switchml, hook:atp, backend:switchml, backend:atp, gloo+bf16, hook:switchml+bf16.

Each scheme gets its own switch process (``python -m inalab switch --program SCHEME``, and for ATP
a parameter server), started once and shared by that scheme's variants (each run is its own job).
Printed: a table (median step, vs its reference: the gloo variant of the same precision, or
``nccl`` for the collnet variants; the largest relative gap of rank 0's losses to the
reference's: cuDNN is not deterministic, so a few percent by step 12 is expected) and with
``--json`` one JSON object as the last line: ``rows`` (each naming its ``reference``) and
``summary`` (``step_vs_ref`` per variant). Rows also go to ``out/gpu_ddp.json`` (``--out``).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RUN_TIMEOUT_S = 300  # one variant's torchrun, start-up included
DEFAULT_VARIANTS = "gloo,hook:switchml,hook:atp,backend:switchml,backend:atp,gloo+bf16,hook:switchml+bf16"


def log(msg: str) -> None:
    print(f"[gpu_ddp {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------ a rank


def build_model(name: str):
    from torch import nn

    if name == "resnet18":
        try:
            import torchvision
        except ImportError:
            log("torchvision is missing: --model small")
            name = "small"
        else:
            return torchvision.models.resnet18(num_classes=10), "resnet18"
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, 10),
    )
    return model, name


def rank_main(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    comm, _, scheme = args.variant.split("+")[0].partition(":")
    amp = args.variant.endswith("+bf16")
    cuda = args.device == "cuda"
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    if comm == "backend":
        import inalab.torch  # registers "inalab"

        dist.init_process_group("inalab")
    elif comm in ("nccl", "collnet"):
        # Each rank a node of its own: NCCL then goes through its network (the plugin, for
        # collnet) rather than shared memory, as across machines (NCCL reads it up to 2.29).
        os.environ["NCCL_HOSTID"] = f"inalab-gpu-ddp-node{rank}"
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model, name = build_model(args.model)
    model = model.to(dev)
    ddp = DDP(model, device_ids=[0] if cuda else None)
    if comm == "hook":
        import inalab.torch

        ddp.register_comm_hook(inalab.torch.connect(), inalab.torch.allreduce_hook)
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(args.batch, 3, 32, 32, generator=g).to(dev)
    y = torch.randint(0, 10, (args.batch,), generator=g).to(dev)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    times, losses = [], []
    for _ in range(args.steps):
        sync()
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        Path(args.rank_out).write_text(json.dumps({"times": times, "losses": losses, "model": name, "params": params}))
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------ the driver


def run_variant(variant: str, args, switches: dict) -> dict:
    scheme = variant.split("+")[0].partition(":")[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("INALAB_")}
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")]))
    if scheme:
        env["INALAB_SCHEME"] = scheme
        env["INALAB_SWITCH"] = switches[scheme][0].control
    if variant.startswith("collnet:"):
        sys.path.insert(0, str(ROOT / "python"))
        import inalab

        env.update(NCCL_NET_PLUGIN=str(inalab.nccl_plugin_path()), NCCL_COLLNET_ENABLE="1",
                   NCCL_ALGO="allreduce:collnetchain", NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET,COLL")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.world}",
               str(Path(__file__).resolve()), "--rank", "--variant", variant, "--rank-out", str(out),
               "--device", args.device, "--model", args.model, "--steps", str(args.steps), "--batch", str(args.batch)]
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        try:
            output, _ = p.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            output, _ = p.communicate()
            return {"variant": variant, "error": f"timed out after {RUN_TIMEOUT_S} s", "output": output[-2000:]}
        if p.returncode != 0 or not out.exists():
            return {"variant": variant, "error": f"exit {p.returncode}", "output": output[-2000:]}
        got = json.loads(out.read_text())
    times = got["times"][args.skip:] or got["times"]
    row = {"variant": variant, "model": got["model"], "params": got["params"], "world": args.world,
           "device": args.device, "step_s": statistics.median(times), "step_min_s": min(times),
           "times": got["times"], "losses": got["losses"]}
    if variant.startswith("collnet:"):
        # What NCCL's INFO log says (net.cc: "Loaded net plugin NAME", "Loaded collnet plugin NAME").
        row["nccl_plugin_loaded"] = "plugin inalab" in output
        row["nccl_collnet_joined"] = "CollNet: head" in output
        row["nccl_log_tail"] = "\n".join(l for l in output.splitlines() if "inalab" in l or "CollNet" in l)[-2000:]
    return row


def summarize(rows: list[dict]) -> dict:
    ok = {r["variant"]: r for r in rows if "step_s" in r}
    out = {}
    for v, r in ok.items():
        base = "nccl" if v.startswith(("nccl", "collnet")) else "gloo"
        ref = ok.get(f"{base}+bf16" if v.endswith("+bf16") else base)
        if ref is None or ref is r:
            continue
        gaps = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(r["losses"], ref["losses"])]
        r["reference"], r["vs_ref"] = ref["variant"], r["step_s"] / ref["step_s"]
        r["loss_gap_max"] = max(gaps) if gaps else None
        out[v] = r["vs_ref"]
    return {"step_vs_ref": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--rank-out", help=argparse.SUPPRESS)
    ap.add_argument("--only", default=DEFAULT_VARIANTS, help=f"variants, comma-separated (default {DEFAULT_VARIANTS})")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda where available")
    ap.add_argument("--model", choices=["resnet18", "small"], default="resnet18")
    ap.add_argument("--world", type=int, default=4, help="ranks (default 4)")
    ap.add_argument("--steps", type=int, default=12, help="steps per run (default 12)")
    ap.add_argument("--skip", type=int, default=2, help="first steps left out of the median (default 2)")
    ap.add_argument("--batch", type=int, default=64, help="images per rank per step (default 64)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--out", default="out/gpu_ddp.json", help="rows as JSON ('' for none)")
    args = ap.parse_args()
    if args.rank:
        rank_main(args)
        return
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    variants = [v.strip() for v in args.only.split(",") if v.strip()]
    for v in variants:
        comm, _, scheme = v.split("+")[0].partition(":")
        if comm not in ("gloo", "nccl", "hook", "backend", "collnet") or (comm not in ("gloo", "nccl")) != bool(scheme) \
                or scheme not in ("", "switchml", "atp") or v.partition("+")[2] not in ("", "bf16"):
            ap.error(f"--only: {v!r} is not gloo, nccl, hook:SCHEME, backend:SCHEME or collnet:SCHEME "
                     "(SCHEME switchml or atp), optionally +bf16")
        if comm in ("nccl", "collnet") and args.device != "cuda":
            ap.error(f"--only: {v!r} runs NCCL, which needs --device cuda")
    sys.path.insert(0, str(HERE))
    from udp_allreduce import start_nodes  # the switch (and ATP's PS) as processes of the CLI

    switches = {}
    rows = []
    try:
        for s in sorted({v.split("+")[0].partition(":")[2] for v in variants} - {""}):
            switches[s] = start_nodes(s, False, 128, 20_000)
        for v in variants:
            log(f"{v}: {args.world} ranks, {args.model} on {args.device}, {args.steps} steps")
            row = run_variant(v, args, switches)
            log(f"{v}: " + (f"median step {row['step_s'] * 1e3:.1f} ms" if "step_s" in row else row["error"]))
            if "error" in row:
                print(row["output"], file=sys.stderr)
            rows.append(row)
    finally:
        for nodes in switches.values():
            for n in reversed(nodes):
                n.stop()
    summary = summarize(rows)
    print(f"{'variant':<22}{'step ms':>10}{'min ms':>10}{'vs ref':>10}{'loss gap':>10}  (ref: gloo; nccl for collnet)")
    for r in rows:
        if "step_s" not in r:
            print(f"{r['variant']:<22}  {r['error']}")
            continue
        vs = f"{r['vs_ref']:.2f}x" if "vs_ref" in r else "-"
        gap = f"{r['loss_gap_max']:.1%}" if r.get("loss_gap_max") is not None else "-"
        print(f"{r['variant']:<22}{r['step_s'] * 1e3:>10.1f}{r['step_min_s'] * 1e3:>10.1f}{vs:>10}{gap:>10}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    if args.json:
        print(json.dumps({"rows": [{k: v for k, v in r.items() if k != "output"} for r in rows], "summary": summary}))
    if any("error" in r for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
