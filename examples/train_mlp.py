"""Train a small MLP with DistributedDataParallel, summing gradients through inalab's switch.

A regression task on deterministic synthetic data: 4096 samples of 16 features, targets from a
fixed random teacher network plus noise. Each rank trains on its own shard (samples
``rank::world``) with its own fixed batch order, so a run is the same whatever the
communication; only the gradient allreduce changes with ``--comm``:

- ``gloo``: DDP's default allreduce over the gloo process group (the reference);
- ``inalab``: a gloo process group, and ``inalab.torch.allreduce_hook`` registered as DDP's
  comm hook with the client from ``inalab.torch.connect()``: gradients go through the switch;
- ``backend``: ``dist.init_process_group("inalab")`` (the backend ``import inalab.torch``
  registers); DDP's allreduce goes through the switch, other collectives through gloo.

Rank 0 prints one line per step, ``step 10 loss 0.4321`` (the training loss averaged over the
ranks, through a separate gloo group so the number does not itself go through the switch), then
``30 steps in 0.41 s`` (the training loop's wall time), and with ``--out`` writes
``{"comm": ..., "world": ..., "steps": ..., "losses": [...]}`` as JSON.

Run it against a switch (``INALAB_SWITCH`` defaults to 127.0.0.1:9100, the switch's default
control address)::

    .venv/bin/inalab switch &                                   # SwitchML, udp :9000, control :9100
    .venv/bin/torchrun --standalone --nproc-per-node 4 examples/train_mlp.py --comm inalab
    .venv/bin/torchrun --standalone --nproc-per-node 4 examples/train_mlp.py --comm backend
    .venv/bin/torchrun --standalone --nproc-per-node 4 examples/train_mlp.py --comm gloo   # no switch needed

For ATP, run an ATP switch and its parameter server, and tell the workers the scheme::

    .venv/bin/inalab switch --program atp &
    .venv/bin/inalab ps &                                       # attaches to 127.0.0.1:9100
    INALAB_SCHEME=atp .venv/bin/torchrun --standalone --nproc-per-node 4 examples/train_mlp.py --comm inalab

Elsewhere: ``INALAB_SWITCH=host:port`` for a switch at another control address, ``INALAB_JOB``
to pick the job id (default: rank 0 draws one and shares it through torchrun's store).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

SAMPLES = 4096
FEATURES = 16
HIDDEN = 64


def make_data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole data set, identical on every rank: a random 16-32-1 tanh teacher plus noise,
    targets scaled to unit variance."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    w1 = torch.randn(FEATURES, 32, generator=g) / FEATURES**0.5
    w2 = torch.randn(32, 1, generator=g) / 32**0.5
    y = torch.tanh(x @ w1) @ w2
    y = y + 0.1 * y.std() * torch.randn(SAMPLES, 1, generator=g)
    return x, (y - y.mean()) / y.std()


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--comm", choices=("inalab", "gloo", "backend"), required=True,
                   help="gradient allreduce: inalab comm hook, DDP's gloo default, or the 'inalab' backend")
    p.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step (default 32)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05, momentum 0.9)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data, the model and the batch order")
    p.add_argument("--loss-scale", type=float, default=1.0,
                   help="multiply the loss (so the gradients) by this and divide the learning rate by it: the same "
                        "training, with gradients that large (default 1; e.g. 1000 pushes ATP's sums beyond its "
                        "fixed-point range, into its float fallback)")
    p.add_argument("--out", help="write the per-step losses here as JSON (rank 0)")
    args = p.parse_args(argv)

    torch.set_num_threads(1)
    if args.comm == "backend":
        import inalab.torch  # noqa: F401  registers the "inalab" backend

        dist.init_process_group("inalab")
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # Loss reporting only, so that the logged number is exact whatever --comm is.
    metrics = dist.new_group(backend="gloo")

    x, y = make_data(args.seed)
    x, y = x[rank::world], y[rank::world]
    model = DDP(make_model(args.seed))
    if args.comm == "inalab":
        import inalab.torch

        client = inalab.torch.connect()
        model.register_comm_hook(client, inalab.torch.allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr / args.loss_scale, momentum=0.9)
    loss_fn = nn.MSELoss()
    order = torch.Generator().manual_seed(args.seed * 1000 + rank)

    losses = []
    start = time.perf_counter()
    perm = torch.randperm(len(x), generator=order)
    pos = 0
    for step in range(1, args.steps + 1):
        if pos + args.batch_size > len(perm):
            perm, pos = torch.randperm(len(x), generator=order), 0
        idx = perm[pos : pos + args.batch_size]
        pos += args.batch_size
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x[idx]), y[idx])
        (loss * args.loss_scale).backward()  # DDP's allreduce (or the hook) runs here
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=metrics)
        mean = mean.item() / world
        losses.append(mean)
        if rank == 0:
            print(f"step {step} loss {mean:.4f}", flush=True)

    if rank == 0:
        print(f"{args.steps} steps in {time.perf_counter() - start:.2f} s", flush=True)
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"comm": args.comm, "world": world, "steps": args.steps, "losses": losses}, f)
            f.write("\n")
    dist.barrier(group=metrics)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
