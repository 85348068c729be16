"""Profiles the user's own PyTorch model into an inalab model profile (``inalab.models.from_torch``).

torch is imported only when :func:`from_torch` runs, so ``inalab.models`` works without it.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional, Union

from . import BYTES_PER_PARAM, Layer, ModelProfile, save_profile

__all__ = ["from_torch", "GROUPS"]

GROUPS = ("module+norm", "module")  # the named values of from_torch's ``group`` (or a positive int)
ROOT = "(root)"  # the layer name of parameters owned by the model itself, not by a submodule


def from_torch(
    model: Any,
    example_input: Any,
    path: Union[str, os.PathLike, None] = None,
    *,
    name: Optional[str] = None,
    loss_fn: Optional[Callable[[Any], Any]] = None,
    group: Union[str, int] = "module+norm",
    warmup: int = 2,
    repeat: int = 5,
    threads: Optional[int] = None,
    batch_size: Optional[int] = None,
    description: Optional[str] = None,
) -> ModelProfile:
    """Measures ``model`` on the CPU and returns its :class:`ModelProfile` (saved to ``path`` if given).

    Each profiled iteration is ``loss_fn(model(example_input)).backward()`` in train mode, timed
    with ``time.perf_counter_ns`` from forward hooks on the modules and
    ``register_post_accumulate_grad_hook`` on the parameters (the moment each gradient is ready).

    Arguments (defaults and units):

    * ``model``: a ``torch.nn.Module`` whose parameters and buffers are on the CPU. Only trainable
      parameters (``requires_grad=True``) count; each must receive a gradient from the loss.
    * ``example_input``: one mini-batch: a tensor (``model(x)``), a tuple or list of positional
      arguments (``model(*x)``) or a dict of keyword arguments (``model(**x)``). Tensors on the CPU.
    * ``path``: a file name ending in ``.json`` to write the profile to (parent directories are
      created), for a scenario's ``model = "path/to/profile.json"``. Default ``None``: not saved.
    * ``name``: the profile's name. Default: the model's class name.
    * ``loss_fn``: called with the model's output, returns the scalar tensor to backpropagate.
      Default: the sum of every floating-point tensor in the output (nested tuples, lists and
      dicts are searched), which reaches every parameter the output depends on.
    * ``group``: how parameters form layers (one layer = one gradient tensor group, as in the catalog):

      - ``"module+norm"`` (default): each module that directly owns trainable parameters (for
        built-in layers the leaf module: ``Linear``, ``Conv2d``, ``Embedding``, ``LSTM``, ...) is
        one layer, except that a normalization module (BatchNorm, InstanceNorm, LayerNorm,
        GroupNorm, RMSNorm) joins the layer whose module ran just before it in the forward pass
        (conv+BN is one layer, as in the catalog), keeping that layer's name.
      - ``"module"``: each module that directly owns trainable parameters is one layer.
      - an int ``n >= 1``: parameters are grouped by the first ``n`` components of their owning
        module's name (e.g. ``2`` makes each torchvision ResNet block ``layer1.0``, ... one layer).

      Layers are named after the module (``"fc1"``, ``"features.0"``); parameters owned by the
      model itself are the layer ``"(root)"``. A parameter shared by several modules belongs to
      the first of them in ``model.named_modules()`` order.
    * ``warmup``: untimed iterations before measuring (integer >= 0). Default 2.
    * ``repeat``: timed iterations (integer >= 1); each layer's forward and backward times are the
      medians over them. Default 5.
    * ``threads``: torch CPU threads while profiling (integer >= 1; restored afterwards).
      Default ``None``: ``torch.get_num_threads()`` as it is.
    * ``batch_size``: recorded in the profile only (samples per iteration). Default: the size of
      dimension 0 of the first tensor in ``example_input`` (``None`` if that tensor is 0-d).
    * ``description``: free text stored in the profile. Default: the class name and input shapes.

    Result (the catalog's format, see README.md here):

    * ``params`` per layer: exact element counts, ``sum(p.numel())``; bytes are ``params * 4``
      (gradients travel as float32 whatever the model's dtype).
    * Layer order: the reverse of the order the layers' gradients became ready (a layer is ready
      when its last parameter's gradient is), which for a chain of modules is the forward order.
      The simulator runs the backward pass and sends gradients in reverse list order, so it sends
      them in the measured order.
    * ``fwd_s`` and ``bwd_s`` (seconds, per iteration on this CPU): the forward pass is cut at
      the end of each parameter-owning module's forward call and each cut goes to that module's
      layer, so parameter-free operations (activations, pooling, reshapes) count with the layer
      that ran before them; work before the first such module goes to it and work after the last
      one (including ``loss_fn``) to the last. Likewise the backward pass is cut where each layer's
      gradient becomes ready: a layer's ``bwd_s`` is the time from the previous layer's gradient
      (or from the start of ``backward()``) to its own, and what runs after the last gradient goes
      to that last layer. The sum of a layer's times over all layers is thus the whole measured
      iteration (without the optimizer step). A layer whose module is never called as a module
      (its parameters used only by another module's code) gets a forward time of 0. Use
      ``scaled()`` or the scenario's ``compute_scale`` to model another device.

    The model is left as it was: its train/eval modes, the parameters' ``.grad``, its buffers
    (e.g. BatchNorm running statistics), torch's random state and thread count are restored.
    Bad arguments raise ``ValueError`` naming the argument and the allowed values.
    """
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is optional for inalab
        raise ImportError("inalab.models.from_torch needs PyTorch: pip install -r requirements-torch.txt") from e

    args, kwargs = _check_args(torch, model, example_input, path, name, loss_fn, group, warmup, repeat, threads,
                               batch_size, description)
    params = _trainable(model)  # [(qualified module name, parameter name, parameter)]
    if not params:
        raise ValueError("model: has no trainable parameters (none with requires_grad=True)")
    owner_names = list(dict.fromkeys(owner for owner, _, _ in params))
    owner_of = {id(p): owner for owner, _, p in params}
    modules = dict(model.named_modules())

    fwd_events: list[tuple[int, str]] = []  # (ns, owner) at the end of each owner's forward call
    bwd_events: list[tuple[int, int]] = []  # (ns, id(param)) when each gradient has accumulated
    handles = []
    saved = _save_state(torch, model)
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        for owner in owner_names:
            handles.append(modules[owner].register_forward_hook(
                lambda _m, _i, _o, owner=owner: fwd_events.append((time.perf_counter_ns(), owner))))
        for _, _, p in params:
            handles.append(p.register_post_accumulate_grad_hook(
                lambda p: bwd_events.append((time.perf_counter_ns(), id(p)))))
        model.train()
        runs = []  # per iteration: (t0, t1, t2, forward events, backward events)
        with torch.enable_grad():
            for _ in range(warmup + repeat):
                for _, _, p in params:
                    p.grad = None
                fwd_events.clear()
                bwd_events.clear()
                t0 = time.perf_counter_ns()
                out = model(*args, **kwargs)
                loss = loss_fn(out) if loss_fn is not None else _default_loss(torch, out)
                if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad):
                    raise ValueError("loss_fn: must return a scalar tensor that depends on the parameters, got "
                                     + (f"a tensor of shape {tuple(loss.shape)} with requires_grad="
                                        f"{loss.requires_grad}" if isinstance(loss, torch.Tensor) else repr(loss))[:200])
                t1 = time.perf_counter_ns()
                loss.reshape(()).backward()
                t2 = time.perf_counter_ns()
                runs.append((t0, t1, t2, list(fwd_events), list(bwd_events)))
                del out, loss
    finally:
        for h in handles:
            h.remove()
        _restore_state(torch, model, saved)

    missing = [f"{o}.{n}" if o else n for o, n, p in params if id(p) not in {pid for _, pid in runs[0][4]}]
    if missing:
        shown = ", ".join(missing[:10]) + (f", ... ({len(missing)} in all)" if len(missing) > 10 else "")
        raise ValueError(f"model: these trainable parameters get no gradient from the loss: {shown}; freeze them "
                         "(requires_grad=False) to leave them out, or pass a loss_fn that uses them")

    # Layers: owners grouped, then ordered by when their gradients became ready (first run).
    group_of = _groups(torch, group, owner_names, modules, runs[0][3])
    names = list(dict.fromkeys(group_of[o] for o in owner_names))
    ready_rank: dict[str, int] = {}
    for k, (_, pid) in enumerate(runs[0][4]):
        ready_rank[group_of[owner_of[pid]]] = k  # the last parameter of the group decides
    backward_order = sorted(names, key=lambda g: ready_rank[g])
    layer_names = backward_order[::-1]
    counts = {g: 0 for g in names}
    for owner, _, p in params:
        counts[group_of[owner]] += p.numel()

    fwd_ns = {g: [] for g in names}
    bwd_ns = {g: [] for g in names}
    for t0, t1, t2, fev, bev in runs[warmup:]:
        f = _cut(t0, t1, [(t, group_of[o]) for t, o in fev], names, counts)
        last = {}
        for t, pid in bev:
            last[group_of[owner_of[pid]]] = t
        b = _cut(t1, t2, sorted((t, g) for g, t in last.items()), names, counts)
        for g in names:
            fwd_ns[g].append(f[g])
            bwd_ns[g].append(b[g])
    layers = tuple(Layer(g, counts[g], statistics.median(fwd_ns[g]) / 1e9, statistics.median(bwd_ns[g]) / 1e9)
                   for g in layer_names)

    shapes = _input_shapes(torch, args, kwargs)
    used_threads = threads if threads is not None else saved["threads"]
    if batch_size is None:
        first = next((a for a in _tensors(torch, (args, kwargs))), None)
        batch_size = int(first.shape[0]) if first is not None and first.dim() > 0 and first.shape[0] > 0 else None
    total = sum(counts.values())
    cls = type(model).__name__
    profile = ModelProfile(
        name=name or cls,
        description=description or f"{cls} (PyTorch), input {shapes}, {len(layers)} layers (group={group!r})",
        total_params=total,
        total_bytes=total * BYTES_PER_PARAM,
        params_reference="counted: sum of numel() of the module's trainable parameters",
        source=f"measured: inalab.models.from_torch on the CPU, torch {torch.__version__}, {used_threads} threads, "
               f"train mode; per layer the median of {repeat} timed iterations after {warmup} warm-up ones; "
               f"loss {'loss_fn' if loss_fn is not None else 'sum of the outputs'}; forward and backward passes cut "
               "at each layer's forward end and gradient-ready time (no optimizer step)",
        reference_gpu=f"CPU: {_cpu_name()}",
        batch_size=batch_size,
        iteration_compute_s=sum(l.fwd_s + l.bwd_s for l in layers),
        fwd_flops_per_sample=None,
        layers=layers,
    )
    if path is not None:
        save_profile(profile, path, measurement={
            "tool": "inalab.models.from_torch", "device": "cpu", "cpu": _cpu_name(), "threads": used_threads,
            "torch": torch.__version__, "python": platform.python_version(), "warmup": warmup, "repeat": repeat,
            "statistic": "median", "group": group, "input": shapes, "loss": "loss_fn" if loss_fn else "sum of outputs",
            "backward_order": backward_order,
            "iteration_s_median": statistics.median((t2 - t0) / 1e9 for t0, _, t2, _, _ in runs[warmup:]),
        })
    return profile


# ---------------------------------------------------------------- helpers


def _check_args(torch, model, example_input, path, name, loss_fn, group, warmup, repeat, threads, batch_size,
                description) -> tuple[tuple, dict]:
    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if isinstance(example_input, torch.Tensor):
        args, kwargs = (example_input,), {}
    elif isinstance(example_input, (tuple, list)):
        args, kwargs = tuple(example_input), {}
    elif isinstance(example_input, dict) and all(isinstance(k, str) for k in example_input):
        args, kwargs = (), dict(example_input)
    else:
        raise ValueError("example_input: expected a tensor, a tuple or list of positional arguments or a dict of "
                         f"keyword arguments, got {type(example_input).__name__}")
    where = [f"parameter {n!r}" for n, p in model.named_parameters() if p.device.type != "cpu"]
    where += [f"buffer {n!r}" for n, b in model.named_buffers() if b.device.type != "cpu"]
    if where:
        raise ValueError(f"model: must be on the CPU (model.cpu()); {where[0]} is not")
    if any(t.device.type != "cpu" for t in _tensors(torch, (args, kwargs))):
        raise ValueError("example_input: every tensor must be on the CPU")
    if path is not None and not (isinstance(path, (str, os.PathLike)) and str(path).lower().endswith(".json")):
        raise ValueError(f"path: must be a file name ending in .json (a scenario's model = tells a profile file from "
                         f"a catalog name by it) or None, got {path!r}")
    if name is not None and not (isinstance(name, str) and name):
        raise ValueError(f"name: must be a non-empty string or None, got {name!r}")
    if loss_fn is not None and not callable(loss_fn):
        raise ValueError(f"loss_fn: must be callable (output -> scalar tensor) or None, got {loss_fn!r}")
    if not ((isinstance(group, str) and group in GROUPS) or (is_int(group) and group >= 1)):
        raise ValueError(f"group: allowed values: {', '.join(repr(g) for g in GROUPS)} or an integer >= 1 "
                         f"(module-name depth), got {group!r}")
    if not is_int(warmup) or warmup < 0:
        raise ValueError(f"warmup: must be an integer >= 0 (untimed iterations), got {warmup!r}")
    if not is_int(repeat) or repeat < 1:
        raise ValueError(f"repeat: must be an integer >= 1 (timed iterations), got {repeat!r}")
    if threads is not None and not (is_int(threads) and threads >= 1):
        raise ValueError(f"threads: must be an integer >= 1 or None (torch's current setting), got {threads!r}")
    if batch_size is not None and not (is_int(batch_size) and batch_size >= 1):
        raise ValueError(f"batch_size: must be an integer >= 1 or None (dimension 0 of the input), got {batch_size!r}")
    if description is not None and not isinstance(description, str):
        raise ValueError(f"description: must be a string or None, got {description!r}")
    return args, kwargs


def _trainable(model) -> list[tuple[str, str, Any]]:
    out, seen = [], set()
    for owner, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                out.append((owner, pname, p))
    return out


def _groups(torch, group, owners: list[str], modules: dict, fwd_events: list[tuple[int, str]]) -> dict[str, str]:
    """Owner module name -> layer name."""
    if isinstance(group, int):
        return {o: ".".join(o.split(".")[:group]) if o else ROOT for o in owners}
    out = {o: o or ROOT for o in owners}
    if group == "module+norm":
        norms = tuple(c for c in (getattr(torch.nn.modules.batchnorm, "_NormBase", None), torch.nn.LayerNorm,
                                  torch.nn.GroupNorm, getattr(torch.nn, "RMSNorm", None)) if c is not None)
        prev, done = None, set()
        for _, o in fwd_events:
            if o in done:
                continue  # a module's first call places it
            done.add(o)
            if isinstance(modules[o], norms) and prev is not None:
                out[o] = out[prev]
            prev = o
    return out


def _cut(start: int, end: int, marks: list[tuple[int, str]], names: list[str], counts: dict) -> dict[str, int]:
    """Splits [start, end] ns at each (time, layer) mark: the span up to a mark goes to its layer,
    the rest after the last mark to the last one's layer."""
    out = {g: 0 for g in names}
    if not marks:  # no cut at all: in proportion to the parameters
        total = sum(counts.values())
        for g in names:
            out[g] = (end - start) * counts[g] // total
        return out
    t = start
    for when, g in marks:
        out[g] += when - t
        t = when
    out[marks[-1][1]] += end - t
    return out


def _default_loss(torch, out):
    parts = [t.float().sum() for t in _tensors(torch, out) if t.is_floating_point() or t.is_complex()]
    if not parts:
        raise ValueError("loss_fn: the model's output holds no floating-point tensor; pass a loss_fn")
    return torch.stack([p.real if p.is_complex() else p for p in parts]).sum()


def _tensors(torch, value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(torch, v)
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(torch, v)
    elif hasattr(value, "to_tuple"):  # e.g. HuggingFace ModelOutput
        yield from _tensors(torch, value.to_tuple())


def _input_shapes(torch, args: tuple, kwargs: dict) -> str:
    def shape(v):
        return "x".join(map(str, v.shape)) or "scalar" if isinstance(v, torch.Tensor) else type(v).__name__

    parts = [shape(a) for a in args] + [f"{k}={shape(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)


def _save_state(torch, model) -> dict:
    with torch.no_grad():
        return {
            "modes": [(m, m.training) for m in model.modules()],
            "grads": [(p, p.grad) for p in model.parameters()],
            "buffers": [(b, b.detach().clone()) for b in model.buffers()],
            "rng": torch.random.get_rng_state(),
            "threads": torch.get_num_threads(),
        }


def _restore_state(torch, model, saved: dict) -> None:
    for m, training in saved["modes"]:
        m.training = training
    for p, grad in saved["grads"]:
        p.grad = grad
    with torch.no_grad():
        for b, value in saved["buffers"]:
            b.copy_(value)
    torch.random.set_rng_state(saved["rng"])
    if torch.get_num_threads() != saved["threads"]:
        torch.set_num_threads(saved["threads"])


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"
