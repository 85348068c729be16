"""PyTorch integration: a DDP communication hook and a ``torch.distributed`` backend that sum
gradients through inalab's software switch.

Hook (gradients through INA, everything else through the process group DDP was built on)::

    dist.init_process_group("gloo")                  # torchrun sets RANK, WORLD_SIZE, ...
    client = inalab.torch.connect()                  # joins the job at $INALAB_SWITCH
    model = DDP(model)
    model.register_comm_hook(client, inalab.torch.allreduce_hook)

Backend (every SUM/AVG allreduce through INA, other collectives delegated to gloo)::

    import inalab.torch                              # registers the backend "inalab"
    dist.init_process_group("inalab")

Environment (all optional): ``INALAB_SWITCH`` the switch's control address (default
127.0.0.1:9100), ``INALAB_SCHEME`` "switchml", "atp" or "dsa" (default switchml), ``INALAB_JOB`` the
job id (default: a random id rank 0 draws and shares through the process group's store),
``INALAB_JOB_SECRET`` the job's rendezvous secret (default: one rank 0 draws and shares the same
way, so only the job's own processes can take its ranks).

The hook tells the scheme where each bucket stands in the iteration (:class:`inalab.TensorContext`:
the bucket's layer, measured communication-to-computation ratio and time left), which DSA turns
into its packets' priority; see :class:`IterationClock`. The backend sees no buckets and gives none.

Tensors may be on the CPU or on a CUDA device, in float32, bfloat16 or float16 (summed in
float32). CUDA tensors are staged through pinned host buffers on a side stream and never block
the caller's stream (:class:`_CudaStaging`); the backend is registered for "cpu" and "cuda".

The futures the hook and the backend return are resolved on the client's completion thread,
a Rust thread that takes the GIL only to copy the sum into the gradient bucket; waiting for
packets never holds the GIL.
"""
from __future__ import annotations

import atexit
import os
import queue
import random
import secrets
import threading
import time
from datetime import timedelta
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from .runtime import Client, TensorContext

__all__ = ["connect", "allreduce_hook", "InalabBackend", "BACKEND_NAME", "IterationClock"]

BACKEND_NAME = "inalab"
DEFAULT_SWITCH = "127.0.0.1:9100"
DEFAULT_SCHEME = "switchml"


def _job_id(store: Optional[dist.Store], rank: int, key: str) -> int:
    if "INALAB_JOB" in os.environ:
        try:
            return int(os.environ["INALAB_JOB"])
        except ValueError:
            raise ValueError(f"INALAB_JOB: {os.environ['INALAB_JOB']!r} is not an integer job id") from None
    if store is None:
        return 1
    if rank == 0:
        # 16 bits: DSA's header carries the job in 16 (the other schemes take 32). Two jobs
        # drawing the same id on one switch are refused there with a clear error.
        store.set(key, str(random.SystemRandom().randrange(1, 2**16)))
    return int(store.get(key))


def _job_secret(store: Optional[dist.Store], rank: int, key: str) -> Optional[str]:
    """The job's rendezvous secret: ``INALAB_JOB_SECRET``, else drawn by rank 0 and shared
    through torch's store (so only this job's processes can take its ranks), else none."""
    if "INALAB_JOB_SECRET" in os.environ:
        return os.environ["INALAB_JOB_SECRET"]
    if store is None:
        return None
    if rank == 0:
        store.set(key, secrets.token_hex(16))
    return store.get(key).decode()


def connect(
    switch: Optional[str] = None,
    scheme: Optional[str] = None,
    job: Optional[int] = None,
    rank: Optional[int] = None,
    world: Optional[int] = None,
    store: Optional[dist.Store] = None,
) -> Client:
    """Joins this process's job: rank and world from the default process group (or
    ``RANK``/``WORLD_SIZE``), the rest from the arguments or the environment (module docs)."""
    if rank is None or world is None:
        if dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        else:
            rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if store is None and dist.is_initialized():
        store = dist.distributed_c10d._get_default_store()
    if job is None:
        job = _job_id(store, rank, "inalab/hook_job")
    client = Client(
        job_secret=_job_secret(store, rank, f"inalab/job_secret/{job}"),
        switch=switch or os.environ.get("INALAB_SWITCH", DEFAULT_SWITCH),
        job=job,
        rank=rank,
        world=world,
        scheme=scheme or os.environ.get("INALAB_SCHEME", DEFAULT_SCHEME),
    )
    # Leave the job cleanly at exit: a worker that vanishes without leaving fails the job.
    atexit.register(client.close)
    return client


class IterationClock:
    """Measures a DDP job's iterations from its gradient buckets, for DSA's priority
    P = (1/T)(L/l)(Comm/Comp) (§V; spec §1.10's runtime choices):

    - layer l: DDP fills buckets from the last layers backwards, so bucket i of L is layer L - i
      (a bucket stands for the layers in it); L is learned when a bucket says it is the last;
    - T: the previous iteration's duration (first bucket to first bucket) minus the time since
      this iteration's first bucket, at least 1 us;
    - Comm/Comp: an EWMA (weight ``alpha``, default 0.5) of communication time (first bucket to the
      last result) over computation time (last result to the next first bucket, plus first to last
      bucket of the backward pass);
    - until one iteration has been measured, no context: every tensor has the lowest priority.
    ``now`` is the clock (seconds), injectable for tests."""

    def __init__(self, alpha: float = 0.5, now=time.monotonic):
        self.alpha, self.now = alpha, now
        self.layers: Optional[int] = None
        self.ratio: Optional[float] = None
        self.start: Optional[float] = None
        self.duration: Optional[float] = None
        self.last_hook = self.last_done = None

    def bucket(self, index: int, is_last: bool) -> Optional[TensorContext]:
        """Called when bucket ``index`` is handed over; the context to send it with."""
        t = self.now()
        if index == 0:
            if self.start is not None:
                self.duration = t - self.start
                if self.last_done is not None and self.last_hook is not None:
                    comm = self.last_done - self.start
                    comp = (t - self.last_done) + (self.last_hook - self.start)
                    if comm > 0 and comp > 0:
                        r = comm / comp
                        self.ratio = r if self.ratio is None else self.alpha * r + (1 - self.alpha) * self.ratio
            self.start = t
        if is_last:
            self.layers = index + 1
        self.last_hook = t
        if self.layers is None or self.duration is None or self.ratio is None or self.start is None:
            return None
        layer = max(1, self.layers - index)
        return TensorContext(layer=layer, layers=self.layers, comm_over_comp=self.ratio,
                             remaining_s=max(1e-6, self.duration - (t - self.start)))

    def done(self) -> None:
        """Called when a bucket's sum is back."""
        self.last_done = self.now()


def _allreduce_into(client: Client, tensors: list, divide: int, context: Optional[TensorContext] = None,
                    on_done=None) -> torch.futures.Future:
    """Sums ``tensors`` (flattened together) over the job, writes the sum (divided by
    ``divide``) back into them, and resolves the returned future with them. CUDA tensors go
    through :class:`_CudaStaging` (pinned buffers, a side stream); others through a float32 copy."""
    if tensors[0].device.type == "cuda":
        return _CudaStaging.of(tensors[0].device).allreduce(client, tensors, divide, context, on_done)
    fut: torch.futures.Future = torch.futures.Future()
    flat = torch.cat([t.detach().reshape(-1).to("cpu", torch.float32) for t in tensors]) if len(tensors) > 1 else (
        tensors[0].detach().reshape(-1).to("cpu", torch.float32)
    )

    def done(result: Optional[np.ndarray], err: Optional[str]) -> None:
        if on_done is not None:
            on_done()
        if err is not None:
            fut.set_exception(RuntimeError(f"inalab allreduce failed: {err}"))
            return
        out = torch.from_numpy(result)
        if divide != 1:
            out = out.div(divide)
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(out[offset : offset + n].view_as(t))
            offset += n
        fut.set_result(tensors)

    client.allreduce_async(flat.numpy(), callback=done, context=context)
    return fut


class _CudaStaging:
    """The CUDA path of one device, built so that no call blocks the caller's stream or thread:

    - out: on a side stream that first waits for the caller's current stream, each tensor is
      cast to float32 on the GPU and copied into a pinned host buffer (asynchronous D2H); an
      event marks the copy's end;
    - a submitter thread (one per device, FIFO, so every rank submits in the same order, which
      the schemes' sequence numbers rely on) waits for that event without the GIL and hands the
      pinned buffer to the client: the copies of the next bucket overlap this one's network;
    - back: on the client's completion thread the sum is copied into the same pinned buffer,
      sent to the GPU asynchronously on the side stream, divided and cast there into the
      caller's tensors, and the future (CUDA-aware: ``devices=[device]``) is resolved on the
      side stream, so whoever waits on it (DDP, ``work.wait()``) synchronises its stream with
      that event instead of the host.

    Pinned buffers are reused once the event of their last H2D copy has passed."""

    _by_device: dict = {}
    _lock = threading.Lock()

    @classmethod
    def of(cls, device: torch.device) -> "_CudaStaging":
        index = device.index if device.index is not None else torch.cuda.current_device()
        with cls._lock:
            if index not in cls._by_device:
                cls._by_device[index] = cls(torch.device("cuda", index))
            return cls._by_device[index]

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.free: list = []  # (pinned float32 tensor, event of its last use or None)
        self.free_lock = threading.Lock()
        self.queue: "queue.SimpleQueue" = queue.SimpleQueue()
        threading.Thread(target=self._submitter, name=f"inalab-cuda{device.index}", daemon=True).start()

    def _take(self, n: int) -> torch.Tensor:
        with self.free_lock:
            for i, (buf, ev) in enumerate(self.free):
                if buf.numel() >= n and (ev is None or ev.query()):
                    del self.free[i]
                    return buf
        return torch.empty(n, dtype=torch.float32, pin_memory=True)

    def _give(self, buf: torch.Tensor, ev) -> None:
        with self.free_lock:
            self.free.append((buf, ev))

    def _submitter(self) -> None:
        while True:
            ready, start = self.queue.get()
            ready.synchronize()  # releases the GIL while the D2H copy finishes
            start()

    def allreduce(self, client: Client, tensors: list, divide: int, context, on_done) -> torch.futures.Future:
        n = sum(t.numel() for t in tensors)
        host = self._take(n)
        fut: torch.futures.Future = torch.futures.Future(devices=[self.device])
        ready = torch.cuda.Event()
        caller = torch.cuda.current_stream(self.device)  # read before the side stream becomes current
        with torch.cuda.stream(self.stream):
            self.stream.wait_stream(caller)
            offset = 0
            for t in tensors:
                t.record_stream(self.stream)  # the caller may free it before our copies ran
                k = t.numel()
                host[offset : offset + k].copy_(t.detach().reshape(-1).to(torch.float32), non_blocking=True)
                offset += k
            ready.record(self.stream)

        def done(result: Optional[np.ndarray], err: Optional[str]) -> None:
            if on_done is not None:
                on_done()
            if err is not None:
                self._give(host, None)
                fut.set_exception(RuntimeError(f"inalab allreduce failed: {err}"))
                return
            host[:n].copy_(torch.from_numpy(result))
            with torch.cuda.stream(self.stream):
                summed = host[:n].to(self.device, non_blocking=True)
                if divide != 1:
                    summed.div_(divide)
                offset = 0
                for t in tensors:
                    k = t.numel()
                    t.copy_(summed[offset : offset + k].view_as(t))
                    offset += k
                copied = torch.cuda.Event()
                copied.record(self.stream)
                self._give(host, copied)
                fut.set_result(tensors)  # records its event on the side stream (the current one here)

        def start() -> None:
            try:  # the client copies the values in before returning
                client.allreduce_async(host[:n].numpy(), callback=done, context=context)
            except Exception as e:  # a closed client: fail the future, never leave it pending
                done(None, str(e))

        self.queue.put((ready, start))
        return fut


def allreduce_hook(state: Client, bucket: dist.GradBucket) -> torch.futures.Future:
    """DDP communication hook: averages the bucket over the job's workers through INA (like
    DDP's default allreduce hook, which sums and divides by the world size)."""
    buf = bucket.buffer()
    clock = state.__dict__.setdefault("_iteration_clock", IterationClock())
    context = clock.bucket(bucket.index(), bucket.is_last())
    return _allreduce_into(state, [buf], state.world, context, clock.done).then(lambda f: f.value()[0])


# DDP.register_comm_hook checks the hook's annotations with inspect.signature and rejects any
# other than dist.GradBucket / torch.futures.Future[torch.Tensor]; with `from __future__ import
# annotations` they would be strings, so set the real objects.
allreduce_hook.__annotations__ = {
    "state": Client, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor],
}


class _Work(dist._Work):
    def __init__(self, fut: torch.futures.Future):
        super().__init__()
        self._fut = fut

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        self._fut.wait()
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    def get_future(self) -> torch.futures.Future:
        return self._fut


# Collectives the backend hands to gloo unchanged.
_DELEGATED = (
    "broadcast", "allgather", "_allgather_base", "allgather_coalesced", "allgather_into_tensor_coalesced",
    "reduce", "gather", "scatter", "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced",
    "alltoall", "alltoall_base", "barrier", "send", "recv", "recv_anysource", "monitored_barrier",
)


class InalabBackend(dist.ProcessGroup):
    """``torch.distributed`` backend "inalab": allreduce with SUM or AVG of float tensors goes
    through the switch; everything else (and other ops or dtypes) through a gloo group built
    on the same store.

    A Python ``ProcessGroup`` (c10d uses it as the group itself), not a ``Backend``: the C++
    ``Backend`` has no Python constructor in PyTorch 2.11 ("No constructor defined!"), which
    is what CUDA machines ship today; ``ProcessGroup(rank, size)`` has one in every 2.x."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self.gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        job = _job_id(store, rank, "inalab/backend_job")
        self.client = connect(job=job, rank=rank, world=size, store=store)

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def allreduce(self, tensors, opts=None):
        op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
        # `op in (SUM, AVG)` would always be False: opts.reduceOp is a ReduceOp and the tuple's
        # RedOpType members do not compare equal to it (only ReduceOp == RedOpType works).
        ina = (op == dist.ReduceOp.SUM or op == dist.ReduceOp.AVG) and all(t.is_floating_point() for t in tensors)
        if not ina:
            return self.gloo.allreduce(tensors, opts) if opts is not None else self.gloo.allreduce(tensors)
        divide = self.size() if op == dist.ReduceOp.AVG else 1
        return _Work(_allreduce_into(self.client, list(tensors), divide))


def _delegate(name: str):
    def method(self, *args, **kwargs):
        return getattr(self.gloo, name)(*args, **kwargs)

    method.__name__ = name
    return method


for _name in _DELEGATED:
    setattr(InalabBackend, _name, _delegate(_name))


def _create(store, rank, size, timeout):
    return InalabBackend(store, rank, size, timeout)


if BACKEND_NAME not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])
