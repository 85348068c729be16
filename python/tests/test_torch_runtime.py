"""examples/train_mlp.py under torchrun (4 workers), gradients through gloo or through a real
software switch on localhost: the loss curves must agree to the quantization error.

Why rtol 1e-5. Each allreduce through SwitchML errs by at most n^2 2^e / 2^31 per value
(n = 4 workers, 2^e the power of two above the bucket's largest gradient), i.e. about 7.5e-9
of the largest gradient; ATP by at most n / (2 * 1e8) = 2e-8 absolute, about the same for
these gradients (largest around 1). Gloo's own float32 sums differ from the exact ones by a
few ulps (~1e-7 relative). Over 30 steps of SGD with momentum 0.9 (each gradient error
reaching the weights up to 10 times) the weights drift from the gloo run's by at most about
30 * 10 * 1e-7 = 3e-5 of a gradient step, and the loss, smooth in the weights, by less: the
observed gap is about 1.5e-7 relative. 1e-5 leaves that a factor of ~60, while any real
mistake (a bucket not averaged, a stale or partial sum, a wrong scale) moves the loss by
percents within a step or two. The switch's counters prove the gradients went through it.
"""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch  # required: these tests exercise inalab.torch

import inalab
from conftest import REPO

WORLD = 4
STEPS = 30  # gloo and the DDP hook
SHORT = 10  # the backend and ATP
RTOL = 1e-5
TIMEOUT_S = 180


def train(comm: str, steps: int, tmp_path, switch: str | None = None, scheme: str | None = None,
          loss_scale: float = 1.0) -> list[float]:
    """Runs examples/train_mlp.py under torchrun; returns rank 0's per-step losses."""
    out = tmp_path / f"{comm}-{scheme or 'none'}-{loss_scale:g}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("INALAB_")}
    env["OMP_NUM_THREADS"] = "1"
    if switch:
        env["INALAB_SWITCH"] = switch
    if scheme:
        env["INALAB_SCHEME"] = scheme
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
           str(REPO / "examples" / "train_mlp.py"), "--comm", comm, "--steps", str(steps), "--out", str(out),
           "--loss-scale", str(loss_scale)]
    # Own session, so that a timeout kills the workers too, not only torchrun.
    p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        output, _ = p.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        output, _ = p.communicate()
        pytest.fail(f"{comm} run timed out after {TIMEOUT_S} s:\n{output}")
    assert p.returncode == 0, f"{comm} run exited with {p.returncode}:\n{output}"
    losses = json.loads(out.read_text())["losses"]
    printed = [line for line in output.splitlines() if line.startswith("step ")]
    assert printed == [f"step {i + 1} loss {v:.4f}" for i, v in enumerate(losses)], output
    assert len(losses) == steps and all(np.isfinite(losses))
    return losses


def assert_decreases(losses):
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses


def assert_close(losses, reference):
    a, b = np.asarray(losses), np.asarray(reference[: len(losses)])
    rel = np.abs(a - b) / np.abs(b)
    assert rel.max() <= RTOL, f"largest relative gap {rel.max():.3g} at step {rel.argmax() + 1}\n{a}\n{b}"


def assert_went_through(stats, steps):
    """Every step's gradients were summed by the switch, and the job left it cleanly."""
    assert stats["received"] >= WORLD * steps, stats
    assert stats["program"]["completed"] >= steps, stats
    assert stats["malformed"] == 0 and stats["unadmitted"] == 0, stats
    assert stats["jobs"] == [] and stats["aggregators_in_use"] == 0, stats


@pytest.fixture(scope="module")
def gloo(tmp_path_factory):
    losses = train("gloo", STEPS, tmp_path_factory.mktemp("gloo"))
    assert_decreases(losses)
    return losses


@pytest.mark.parametrize("comm,steps", [("inalab", STEPS), ("backend", SHORT)], ids=["hook", "backend"])
def test_switchml_matches_gloo(gloo, tmp_path, comm, steps):
    """The DDP hook and the "inalab" backend, each through a SwitchML switch."""
    with inalab.Switch("switchml", udp="127.0.0.1:0", control="127.0.0.1:0") as sw:
        losses = train(comm, steps, tmp_path, switch=sw.control_addr)
        stats = sw.stats()
    assert_decreases(losses)
    assert_close(losses, gloo)
    assert_went_through(stats, steps)


def test_hook_through_atp_matches_gloo(gloo, tmp_path):
    with inalab.Switch("atp", udp="127.0.0.1:0", control="127.0.0.1:0") as sw, \
            inalab.ParameterServer(switch=sw.control_addr, udp="127.0.0.1:0", control="127.0.0.1:0"):
        losses = train("inalab", SHORT, tmp_path, switch=sw.control_addr, scheme="atp")
        stats = sw.stats()
    assert_decreases(losses)
    assert_close(losses, gloo)
    assert_went_through(stats, SHORT)
    assert stats["program"]["overflows"] == 0, stats


def test_hook_through_dsa_matches_gloo(gloo, tmp_path):
    with inalab.Switch("dsa", udp="127.0.0.1:0", control="127.0.0.1:0") as sw, \
            inalab.ParameterServer(switch=sw.control_addr, udp="127.0.0.1:0", control="127.0.0.1:0"):
        losses = train("inalab", SHORT, tmp_path, switch=sw.control_addr, scheme="dsa")
        stats = sw.stats()
    assert_decreases(losses)
    assert_close(losses, gloo)
    assert stats["program"]["completed"] > 0, stats


def test_hook_through_atp_with_gradients_beyond_its_fixed_point_range(tmp_path):
    """Gradients x 1000 (the learning rate / 1000: the same training) sum far beyond ATP's
    +/-21.47 at scale 1e8; its float fallback carries them and the losses are gloo's (#11:
    they were capped, or the job died, before)."""
    reference = train("gloo", SHORT, tmp_path, loss_scale=1000)
    with inalab.Switch("atp", udp="127.0.0.1:0", control="127.0.0.1:0") as sw, \
            inalab.ParameterServer(switch=sw.control_addr, udp="127.0.0.1:0", control="127.0.0.1:0"):
        losses = train("inalab", SHORT, tmp_path, switch=sw.control_addr, scheme="atp", loss_scale=1000)
        stats = sw.stats()
    assert_decreases(losses)
    assert_close(losses, reference)
    assert_went_through(stats, SHORT)
    assert stats["program"]["overflows"] > 0, stats


def test_iteration_clock_turns_buckets_into_dsa_contexts():
    # A fake clock: iterations of 10 ms, three buckets handed over 1 ms apart from t0, the
    # last result 4 ms after t0. Comm = 4 ms, Comp = (10 - 4) + 2 = 8 ms, ratio 0.5.
    from inalab.torch import IterationClock

    t = [0.0]
    clock = IterationClock(now=lambda: t[0])
    got = []
    for it in range(3):
        t0 = it * 0.010
        for i in range(3):
            t[0] = t0 + i * 0.001
            got.append(clock.bucket(i, i == 2))
        t[0] = t0 + 0.004
        clock.done()
    assert got[:3] == [None] * 3, "no context before one iteration was measured"
    c = got[4]  # iteration 1, bucket 1: the middle layer, 1 ms into a 10 ms iteration
    assert (c.layer, c.layers) == (2, 3)
    assert c.comm_over_comp == pytest.approx(0.5) and c.remaining_s == pytest.approx(0.009)
    assert [g.layer for g in got[6:]] == [3, 2, 1], "bucket 0 holds the last layers"


@pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")),
])
def test_backend_sums_every_float_dtype_with_several_in_flight(tmp_path, device):
    """float32, bfloat16 and float16 tensors, SUM and AVG, four allreduces in flight per case,
    through the "inalab" backend (CUDA: staged through pinned buffers on a side stream). The
    result comes back in the tensor's dtype: its error is the dtype's rounding of the float32
    sum (half an ulp: eps/2 of the value) plus SwitchML's quantization (far below); an AVG not
    divided, a lost or reordered allreduce or a stale buffer errs by the values themselves."""
    out = tmp_path / "collectives.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("INALAB_")}
    env["OMP_NUM_THREADS"] = "1"
    with inalab.Switch("switchml", udp="127.0.0.1:0", control="127.0.0.1:0") as sw:
        env["INALAB_SWITCH"] = sw.control_addr
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
               str(REPO / "python" / "tests" / "helpers" / "torch_collectives.py"), "--device", device, "--out", str(out)]
        p = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=TIMEOUT_S)
        stats = sw.stats()
    assert p.returncode == 0, p.stdout
    report = json.loads(out.read_text())
    assert len(report) == 6, report
    for case, r in report.items():
        eps = torch.finfo(getattr(torch, case.split("-")[0])).eps
        bound = r["max_abs"] * eps / 2 + 1e-6
        assert r["max_error"] <= bound, (case, r, bound)
        assert r["max_abs"] > 0.5, (case, r)
    assert stats["program"]["completed"] >= 6 * 4, stats
    assert stats["jobs"] == [] and stats["aggregators_in_use"] == 0, stats
