"""One rank of test_torch_runtime's backend check, run under torchrun: allreduces through the
"inalab" backend on tensors of each dtype (float32, bfloat16, float16) with SUM and AVG, several
in flight at once (``async_op=True``), their values written on the caller's stream behind a
slow kernel on CUDA, on ``--device`` (cpu or cuda: all ranks on cuda:0). Each
rank's tensor is drawn from its rank's seed, so every rank knows the exact float64 sum; rank 0
writes, per case, the largest absolute error against it and the largest exact value to ``--out``.
"""
import argparse
import json

import torch
import torch.distributed as dist

import inalab.torch  # noqa: F401  registers the backend

N = 10_000
IN_FLIGHT = 4


def tensor(rank: int, case: int, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * case + rank)
    return (torch.rand(N, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dist.init_process_group("inalab")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    cases = [(dtype, op) for dtype in (torch.float32, torch.bfloat16, torch.float16)
             for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG)]
    report = {}
    for i, (dtype, op) in enumerate(cases):
        # Several allreduces started before any is waited for: the CUDA path's submitter must
        # hand them to the client in the same order on every rank.
        srcs = [tensor(rank, IN_FLIGHT * i + k, dtype).to(dev) for k in range(IN_FLIGHT)]
        ts = [torch.zeros_like(s) for s in srcs]
        if dev.type == "cuda":
            # The values land late on the caller's stream (after a ~50 ms kernel): an allreduce
            # that does not wait for that stream sums the zeros.
            torch.cuda._sleep(100_000_000)
        for t, s in zip(ts, srcs):
            t.copy_(s)
        works = [dist.all_reduce(t, op=op, async_op=True) for t in ts]
        for w in works:
            w.wait()
        worst, largest = 0.0, 0.0
        for k, t in enumerate(ts):
            exact = sum(tensor(r, IN_FLIGHT * i + k, dtype).double() for r in range(world))
            if op == dist.ReduceOp.AVG:
                exact = exact / world
            got = t.to("cpu", torch.float64)
            worst = max(worst, (got - exact).abs().max().item())
            largest = max(largest, exact.abs().max().item())
            assert t.dtype == dtype and t.device.type == dev.type
        report[f"{str(dtype).removeprefix('torch.')}-{'avg' if op == dist.ReduceOp.AVG else 'sum'}"] = {
            "max_error": worst, "max_abs": largest}
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
