"""The real data plane on localhost: sums against numpy, loss, sharing, a killed worker."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import inalab
from inalab.runtime import quantization_bound

ANY = "127.0.0.1:0"
SIZES = [1, 31, 32, 33, 61, 62, 63, 1000, 4099, 65_536, 250_001]


def inputs(rank: int, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng([seed, rank, n])
    return rng.standard_normal(n).astype(np.float32)


def run_workers(control: str, scheme: str, job: int, world: int, sizes, seed: int = 0, results=None, context=None,
                config=None):
    """Runs `world` clients in threads; returns {rank: [sum per size]}. `context`: the
    TensorContext every call gives (default none); `config`: the job's scheme parameters."""
    results = {} if results is None else results
    errors = []

    def worker(rank):
        try:
            with inalab.Client(switch=control, job=job, rank=rank, world=world, scheme=scheme, config=config,
                               join_timeout_s=30) as c:
                results[rank] = [c.allreduce(inputs(rank, n, seed), context=context) for n in sizes]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((rank, e))

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return results


def check_sums(results, sizes, scheme, seed=0):
    world = len(results)
    for k, n in enumerate(sizes):
        xs = np.stack([inputs(r, n, seed) for r in range(world)])
        want = xs.astype(np.float64).sum(axis=0)
        bound = quantization_bound(scheme, world, float(np.abs(xs).max()))
        for r in range(world):
            got = results[r][k]
            assert got.shape == (n,) and got.dtype == np.float32
            err = np.abs(got - want).max()
            assert err <= bound, f"{scheme} size {n} rank {r}: error {err} above the bound {bound}"


@pytest.fixture
def switchml():
    with inalab.Switch("switchml", udp=ANY, control=ANY) as sw:
        yield sw


@pytest.fixture
def atp():
    with inalab.Switch("atp", udp=ANY, control=ANY) as sw, inalab.ParameterServer(switch=sw.control_addr, udp=ANY, control=ANY):
        yield sw


@pytest.mark.parametrize("world", [1, 4])
def test_switchml_sums_equal_numpy(switchml, world):
    check_sums(run_workers(switchml.control_addr, "switchml", 1, world, SIZES), SIZES, "switchml")
    st = switchml.stats()
    assert st["aggregators_in_use"] == 0 and st["jobs"] == []
    assert st["malformed"] == 0 and st["unadmitted"] == 0


def test_atp_sums_equal_numpy(atp):
    check_sums(run_workers(atp.control_addr, "atp", 1, 4, SIZES), SIZES, "atp")
    st = atp.stats()
    assert st["program"]["aggregated"] > 0, "the switch aggregated nothing: everything went to the PS"
    assert st["aggregators_in_use"] == 0


def test_dsa_sums_equal_numpy():
    # All of SIZES: a lone job's fragments no longer collide with each other (the consecutive
    # index); with a hash per PSN the 250,001-value tensor took 2-30 s on two shared cores.
    sizes = SIZES
    with inalab.Switch("dsa", udp=ANY, control=ANY) as sw, inalab.ParameterServer(switch=sw.control_addr, udp=ANY, control=ANY):
        check_sums(run_workers(sw.control_addr, "dsa", 1, 4, sizes), sizes, "dsa")
        st = sw.stats()
        assert st["program"]["completed"] > 0, "the switch completed nothing: everything went to the PS"
        assert st["aggregators_in_use"] == 0


@pytest.mark.parametrize("scheme", ["switchml", "atp", "dsa"])
def test_injected_loss_is_recovered(scheme):
    sizes = [100_000, 7]
    with inalab.Switch(scheme, udp=ANY, control=ANY, drop_probability=0.01, seed=3, timeout_us=2000) as sw:
        ps = inalab.ParameterServer(switch=sw.control_addr, udp=ANY, control=ANY) if scheme != "switchml" else None
        try:
            check_sums(run_workers(sw.control_addr, scheme, 2, 3, sizes), sizes, scheme)
            assert sw.stats()["injected_drops"] > 0
        finally:
            if ps:
                ps.stop()


@pytest.mark.parametrize("scheme", ["static_tree", "canary", "rina"])
def test_fixed_point_schemes_sum_float_tensors_on_one_switch(scheme):
    # Schemes whose switches sum int32 with no overflow fallback convert floats at the hosts:
    # the static tree once refused every float32 tensor ("static-tree switches sum int32 values").
    sizes = [5_000, 62, 1]
    with inalab.Switch(scheme, udp=ANY, control=ANY) as sw:
        check_sums(run_workers(sw.control_addr, scheme, 7, 3, sizes), sizes, scheme)
        assert sw.stats()["aggregators_in_use"] == 0


def run_two_jobs(control: str, scheme: str, ids: tuple[int, int], sizes) -> None:
    """Jobs ids[0] (3 workers, inputs of seed 1) and ids[1] (2 workers, seed 2) at once on the
    switch at `control`; checks both jobs' sums."""
    a, b = {}, {}
    threads = [threading.Thread(target=run_workers, args=(control, scheme, ids[0], 3, sizes, 1, a)),
               threading.Thread(target=run_workers, args=(control, scheme, ids[1], 2, sizes, 2, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check_sums(a, sizes, scheme, seed=1)
    check_sums(b, sizes, scheme, seed=2)


def test_two_jobs_share_the_switch(switchml):
    run_two_jobs(switchml.control_addr, "switchml", (10, 11), [50_000, 3, 20_000])
    assert switchml.stats()["aggregators_in_use"] == 0


@pytest.mark.parametrize("scheme", ["switchml", "atp", "dsa", "canary", "rina"])
def test_a_switch_on_two_threads_sums_two_jobs_under_loss(scheme):
    # Issue #41 item 2: SwitchML's and ATP's jobs run on both data-plane threads, each packet
    # sent to the one its slot or fragment picks; the others' each on one. The workers and the
    # PS learn which at admission. Counters are the threads' sums.
    with inalab.Switch(scheme, udp=ANY, control=ANY, threads=2, drop_probability=0.005, seed=4) as sw:
        ps = inalab.ParameterServer(switch=sw.control_addr, udp=ANY, control=ANY) if scheme in ("atp", "dsa") else None
        try:
            run_two_jobs(sw.control_addr, scheme, (50, 51), [40_000, 3, 20_000])
            time.sleep(0.1)
            st = sw.stats()
        finally:
            if ps is not None:
                ps.stop()
    assert len(st["shards"]) == 2 and len({s["udp"] for s in st["shards"]}) == 2, st["shards"]
    assert st["received"] == sum(s["received"] for s in st["shards"]), st["shards"]
    assert st["injected_drops"] > 0 and st["aggregators_in_use"] == 0 and st["jobs"] == [], st
    # A frame of a job released meanwhile (a late retransmission) has no key any more
    # (`no_key`, the same with one thread); no other reason may show.
    assert set(st["forged"]) <= {"no_key"}, st
    # Canary's workers linger to serve their peers; a late request after the job's release
    # finds no port (the same with one thread), so only the other schemes must have none.
    assert scheme == "canary" or st["unknown_source"] == 0, st


def test_two_rina_jobs_share_a_tor_without_mixing_their_sums():
    # One switch is one INA rack: each job is one group, its ToR sums the rack's DATA in a
    # contiguous slot region tagged by the job-wide index q. Every job plans the same region
    # (the runtime admits jobs one at a time), so two jobs with equal q would meet in one slot
    # unless the switch places the second elsewhere and tags slots by job.
    with inalab.Switch("rina", udp=ANY, control=ANY, drop_probability=0.005, seed=9) as sw:
        run_two_jobs(sw.control_addr, "rina", (40, 41), [40_000, 62, 10_000])
        st = sw.stats()
    assert st["program"]["aggregated"] > 0 and st["aggregators_in_use"] == 0, st


def test_two_dsa_jobs_share_the_switch_under_loss():
    # Two jobs contend for one small array (256 KiB = 993 aggregators) while the switch drops
    # 1 % of packets: preemption, evictions to the PS and loss recovery, exact sums for both.
    with inalab.Switch("dsa", udp=ANY, control=ANY, drop_probability=0.01, seed=5, memory_bytes=256 * 1024) as sw, \
            inalab.ParameterServer(switch=sw.control_addr, udp=ANY, control=ANY):
        run_two_jobs(sw.control_addr, "dsa", (20, 21), [60_000, 5, 30_000])
        st = sw.stats()
    assert st["injected_drops"] > 0 and st["aggregators_in_use"] == 0, st
    assert st["program"]["collisions"] > 0 and st["program"]["completed"] > 0, st["program"]


def test_dsa_jobs_moving_their_slots_sum_exactly_under_loss():
    # The `ina.move_slots` ablation in the real runtime: the PS's MOVEs cross the same lossy
    # switch as everything else. Tables of 8 slots in 248 aggregators (64 KiB), so slots that
    # collide have somewhere to go.
    cfg = {"ina": {"move_slots": True, "slots": 8}}
    sizes = [30_000, 5, 30_000]
    a, b = {}, {}
    with inalab.Switch("dsa", udp=ANY, control=ANY, drop_probability=0.01, seed=3, memory_bytes=64 * 1024) as sw, \
            inalab.ParameterServer(switch=sw.control_addr, udp=ANY, control=ANY):
        threads = [threading.Thread(target=run_workers, args=(sw.control_addr, "dsa", 24 + k, 3, sizes, 1 + k, out),
                                    kwargs={"config": cfg}) for k, out in enumerate([a, b])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        st = sw.stats()
    check_sums(a, sizes, "dsa", seed=1)
    check_sums(b, sizes, "dsa", seed=2)
    assert st["aggregators_in_use"] == 0, st
    assert st["program"]["collisions"] > 0 and st["program"]["slot_moves"] > 0, st["program"]


def test_a_tensor_context_becomes_dsa_priority_on_the_switch():
    # Job 30's calls carry a context (DSA priority 262,144: layer 1 of 2, Comm/Comp 2, 1 ms
    # left); job 31's none (priority 1). On a 64 KiB array they collide, and only a packet of
    # higher priority preempts (ties keep the incumbent): without the context reaching the
    # packets every priority is 1 and nothing is ever preempted.
    ctx = inalab.TensorContext(layer=1, layers=2, comm_over_comp=2.0, remaining_s=1e-3)
    sizes = [60_000, 60_000]
    a, b = {}, {}
    with inalab.Switch("dsa", udp=ANY, control=ANY, memory_bytes=64 * 1024) as sw, \
            inalab.ParameterServer(switch=sw.control_addr, udp=ANY, control=ANY):
        ta = threading.Thread(target=run_workers, args=(sw.control_addr, "dsa", 30, 2, sizes, 1, a, ctx))
        tb = threading.Thread(target=run_workers, args=(sw.control_addr, "dsa", 31, 2, sizes, 2, b))
        ta.start(), tb.start()
        ta.join(), tb.join()
        st = sw.stats()["program"]
    check_sums(a, sizes, "dsa", seed=1)
    check_sums(b, sizes, "dsa", seed=2)
    assert st["collisions"] > 0 and st["preemptions"] > 0, st


def test_a_bad_tensor_context_names_its_field():
    with pytest.raises(ValueError, match=r"TensorContext.layer: 3 is not an integer in 1..layers \(2\)"):
        inalab.TensorContext(layer=3, layers=2, comm_over_comp=1.0, remaining_s=1.0)
    with pytest.raises(ValueError, match="TensorContext.remaining_s"):
        inalab.TensorContext(layer=1, layers=2, comm_over_comp=1.0, remaining_s=float("nan"))


WORKER = r"""
import sys, json, time, numpy as np, inalab
control, job, rank, world, loops = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
c = inalab.Client(switch=control, job=job, rank=rank, world=world, join_timeout_s=30)
print(json.dumps({"joined": rank}), flush=True)
try:
    for i in range(loops):
        out = c.allreduce(np.full(20_000, rank + 1, np.float32))
        assert abs(out[0] - world * (world + 1) / 2) < 1e-3, out[0]
        time.sleep(0.01)
    print(json.dumps({"done": rank}), flush=True)
    c.close()
except RuntimeError as e:
    print(json.dumps({"error": str(e)}), flush=True)
    sys.exit(3)
"""


def test_killed_worker_fails_its_job_only(switchml):
    """Job 20 (3 workers) loses rank 1 to SIGKILL mid-run: its other workers fail with an error
    naming the dead rank, job 21 finishes, and the switch frees job 20's slots."""
    ctl = switchml.control_addr

    def spawn(job, rank, world, loops):
        return subprocess.Popen([sys.executable, "-c", WORKER, ctl, str(job), str(rank), str(world), str(loops)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    doomed = [spawn(20, r, 3, 100_000) for r in range(3)]
    healthy = [spawn(21, r, 2, 200) for r in range(2)]
    for p in doomed:  # wait until the job runs
        assert json.loads(p.stdout.readline()) == {"joined": doomed.index(p)}
    deadline = time.time() + 20
    while 20 not in switchml.stats()["jobs"] and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    doomed[1].send_signal(signal.SIGKILL)
    outs = {}
    for r in (0, 2):
        out, err = doomed[r].communicate(timeout=30)
        outs[r] = out
        assert doomed[r].returncode == 3, (out, err)
        msg = json.loads(out.strip().splitlines()[-1])["error"]
        assert "rank 1" in msg and "disconnected" in msg, msg
    for p in healthy:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, (out, err)
        assert '"done"' in out
    deadline = time.time() + 5
    while switchml.stats()["jobs"] and time.time() < deadline:
        time.sleep(0.05)
    st = switchml.stats()
    assert st["jobs"] == [] and st["aggregators_in_use"] == 0, st


RINA_WORKER = r"""
import sys, json, time, hashlib, numpy as np, inalab
from inalab.runtime import quantization_bound
control, job, rank, world, loops, dead = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
x = lambda r, i: np.random.default_rng([r, i]).standard_normal(5000).astype(np.float32)
c = inalab.Client(switch=control, job=job, rank=rank, world=world, scheme="rina", join_timeout_s=30)
print(json.dumps({"joined": rank}), flush=True)
digests = []
try:
    for i in range(loops):
        out = c.allreduce(x(rank, i))
        xs = {r: x(r, i).astype(np.float64) for r in range(world)}
        # The sum over all workers (finished before the failure) or over the survivors.
        err = min(np.abs(out - sum(xs.values())).max(), np.abs(out - sum(v for r, v in xs.items() if r != dead)).max())
        bound = quantization_bound("rina", world, max(float(np.abs(v).max()) for v in xs.values()))
        assert err <= bound, f"allreduce {i}: error {err} above {bound}"
        digests.append(hashlib.sha1(out.tobytes()).hexdigest()[:12])
        time.sleep(0.002)
    print(json.dumps({"done": rank, "digests": digests}), flush=True)
    c.close()
except (RuntimeError, AssertionError) as e:
    print(json.dumps({"error": str(e)}), flush=True)
    sys.exit(3)
"""


@pytest.mark.parametrize("dead", [0, 2], ids=["agent", "member"])
def test_rina_survives_a_killed_worker_with_the_same_sums_everywhere(dead):
    """Four Rina workers on one switch (one INA rack); one is SIGKILLed mid-run. The switch
    tells the others, who rebuild the ring (the agent's death dissolves the rack into
    autonomous workers, a member's shrinks it) and finish every allreduce, each result the
    sum over all four or over the survivors and the same at every survivor."""
    loops = 150
    with inalab.Switch("rina", udp=ANY, control=ANY) as sw:
        procs = [subprocess.Popen([sys.executable, "-c", RINA_WORKER, sw.control_addr, "50", str(r), "4", str(loops), str(dead)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(4)]
        for r, p in enumerate(procs):
            assert json.loads(p.stdout.readline()) == {"joined": r}
        time.sleep(0.3)
        procs[dead].send_signal(signal.SIGKILL)
        outs = {}
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=90)
            if r != dead:
                assert p.returncode == 0, (r, out, err[-2000:])
                outs[r] = json.loads(out.strip().splitlines()[-1])["digests"]
            else:
                assert p.returncode == -signal.SIGKILL, "killed mid-run, not after its last allreduce"
        deadline = time.time() + 5
        while sw.stats()["jobs"] and time.time() < deadline:
            time.sleep(0.05)
        st = sw.stats()
    first = next(iter(outs.values()))
    assert len(first) == loops and all(d == first for d in outs.values()), "every survivor got the same sums"
    assert st["jobs"] == [] and st["aggregators_in_use"] == 0, st
    assert st["program"]["epochs"] >= (0 if dead == 0 else 1), st["program"]


def test_bad_options_name_the_field():
    with pytest.raises(ValueError, match="program"):
        inalab.Switch("sharp", udp=ANY, control=ANY)
    with pytest.raises(ValueError, match="drop_probability"):
        inalab.Switch("atp", udp=ANY, control=ANY, drop_probability=2)
    with pytest.raises(ValueError, match="rank"):
        inalab.Client(switch="127.0.0.1:1", rank=3, world=2)
    with pytest.raises(ValueError, match="scheme"):
        inalab.Client(switch="127.0.0.1:1", scheme="ring")
    with pytest.raises(ValueError, match="node"):
        inalab.Switch("atp", udp=ANY, control=ANY, node=0)
    with pytest.raises(ValueError, match="node"):
        inalab.ParameterServer(switch="127.0.0.1:1", udp=ANY, control=ANY, node=70_000)
    with pytest.raises(ValueError, match="job"):
        inalab.Client(switch="127.0.0.1:1", job=-1)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_switch_is_a_connection_error_naming_the_address_and_what_to_start():
    # It was a ValueError (a client) and "I/O error: Connection refused (os error 111)" (inalab ps),
    # with no address and no hint.
    addr = f"127.0.0.1:{_free_port()}"
    with pytest.raises(ConnectionError, match=f"cannot reach the switch's control plane at {addr}: connection refused.*inalab switch"):
        inalab.Client(switch=addr, job=1, rank=0, world=2)
    with pytest.raises(ConnectionError, match=f"at {addr}.*inalab switch --program SCHEME"):
        inalab.ParameterServer(switch=addr, udp=ANY, control=ANY)
    r = subprocess.run([sys.executable, "-m", "inalab", "ps", "--switch", addr, "--udp", ANY, "--control", ANY],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr  # could not be carried out (2 is for bad input)
    assert f"error: cannot reach the switch's control plane at {addr}: connection refused" in " ".join(r.stderr.split())


def test_a_port_in_use_is_named_with_the_option_that_set_it(switchml):
    # It was "I/O error: Address already in use (os error 98)": no port, no hint.
    udp = switchml.udp_addr
    with pytest.raises(ValueError, match=f"--udp {udp}: port {udp.rsplit(':', 1)[1]} is already in use.*give --udp another port"):
        inalab.Switch("switchml", udp=udp, control=ANY)
    control = switchml.control_addr
    r = subprocess.run([sys.executable, "-m", "inalab", "switch", "--udp", ANY, "--control", control],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"error: --control {control}: port {control.rsplit(':', 1)[1]} is already in use" in r.stderr, r.stderr


def test_scheme_mismatch_and_missing_ps_are_clear(switchml):
    with pytest.raises(RuntimeError, match="this switch runs switchml, the worker asked for atp"):
        inalab.Client(switch=switchml.control_addr, job=5, world=1, scheme="atp", join_timeout_s=5)
    with inalab.Switch("atp", udp=ANY, control=ANY) as sw:
        with pytest.raises(RuntimeError, match="inalab ps"):
            inalab.Client(switch=sw.control_addr, job=5, world=1, scheme="atp", join_timeout_s=5)


def _allreduce_all(control: str, job: int, scheme: str, arrays: list) -> list:
    """Every rank's result of one allreduce of arrays[rank], the ranks in threads."""
    results: list = [None] * len(arrays)

    def worker(rank):
        with inalab.Client(switch=control, job=job, rank=rank, world=len(arrays), scheme=scheme, join_timeout_s=30) as c:
            results[rank] = c.allreduce(arrays[rank])

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(len(arrays))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(r is not None for r in results), "every rank got a result"
    return results


@pytest.mark.parametrize("world, values, expected", [
    # #11's examples: sums beyond ATP's fixed-point range (+/-21.47 at scale 1e8), and values beyond it.
    (2, [15, -15, 10, 1.5], [30, -30, 20, 3]),
    (7, [21.4748], [150.3236]),
    (3, [30.0, -1e6, 2.5e30, 0.125], [90.0, -3e6, 7.5e30, 0.375]),
])
def test_atp_sums_beyond_its_fixed_point_range_exactly(atp, world, values, expected):
    arrays = [np.array(values, np.float32) for _ in range(world)]
    for got in _allreduce_all(atp.control_addr, 9, "atp", arrays):
        np.testing.assert_allclose(got, np.array(expected, np.float32), rtol=4 * world * np.finfo(np.float32).eps, atol=world / 2e8)


def test_nan_is_an_error_not_a_wrong_sum(switchml):
    with inalab.Client(switch=switchml.control_addr, job=8, world=1) as c:
        with pytest.raises(ValueError, match="no fixed-point form"):
            c.allreduce(np.array([1.0, np.nan], np.float32))


def test_switchml_carries_the_top_of_float32(switchml):
    """Magnitudes at and above 2^127 come back as sent, within the documented bound (they were
    clamped to 1.7e38 when the exponent was an i8)."""
    xs = np.array([1.6e38, 1.8e38, 2.5e38, -3e38, 3.4e38, 1], np.float32)
    with inalab.Client(switch=switchml.control_addr, job=12, world=1) as c:
        got = c.allreduce(xs)
    bound = inalab.runtime.quantization_bound("switchml", 1, float(np.abs(xs).max()))
    assert np.all(np.isfinite(got)) and np.all(np.abs(got.astype(np.float64) - xs) <= bound), (got, bound)


@pytest.fixture
def any_scheme(request):
    """A switch running the parametrized scheme's program, and a PS where it has one."""
    scheme = request.param
    with inalab.Switch(scheme, udp=ANY, control=ANY) as sw:
        if scheme in ("atp", "dsa", "grid"):
            with inalab.ParameterServer(switch=sw.control_addr, udp=ANY, control=ANY):
                yield scheme, sw
        else:
            yield scheme, sw


NO_FALLBACK = "of the sum is out of the fixed-point range"


@pytest.mark.parametrize("any_scheme,other", [("switchml", "rank 0's tensor"), ("atp", "another worker's value"), ("dsa", NO_FALLBACK),
                                              ("canary", NO_FALLBACK), ("static_tree", NO_FALLBACK), ("rina", NO_FALLBACK),
                                              ("grid", NO_FALLBACK)], indirect=["any_scheme"])
def test_a_nan_on_one_worker_fails_the_call_on_every_worker_and_the_job_goes_on(any_scheme, other):
    """SwitchML: the NaN's worker marks its exponent slot. ATP: the NaN goes through the float
    fallback (ATP's worker once kept it back, and the other worker waited for ever). The
    others: the NaN's worker sends the rail there, which every worker finds in the sum (DSA
    once sent 0 and returned [2, 2]; Canary, static trees, Rina and GRID failed only the
    NaN's worker and gave the other a wrong sum, #36). Every worker gets a ValueError for that
    tensor, the NaN's naming its rank, index and value, and the next allreduce pairs up right
    on all of them."""
    scheme, sw = any_scheme
    outcome: dict = {}

    def worker(rank):
        with inalab.Client(switch=sw.control_addr, job=13, rank=rank, world=2, scheme=scheme, join_timeout_s=30) as c:
            try:
                c.allreduce(np.array([1.0, np.nan if rank == 0 else 2.0], np.float32))
                outcome[rank] = "no error"
            except ValueError as e:
                outcome[rank] = str(e)
            outcome[rank, "next"] = c.allreduce(np.array([rank + 1.0], np.float32))

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert "rank 0's value 1 is NaN, which has no fixed-point form" in outcome[0] and other in outcome[1], outcome
    assert outcome[0, "next"][0] == pytest.approx(3.0) and outcome[1, "next"][0] == pytest.approx(3.0)


@pytest.mark.parametrize("any_scheme", ["switchml", "atp"], indirect=True)
def test_ranks_that_disagree_on_a_tensors_size_fail_naming_the_sizes(any_scheme):
    """#36: SwitchML and ATP returned wrong sums (one of them inf) for tensors of different
    sizes on different ranks; every rank now gets a ValueError naming each rank's size."""
    scheme, sw = any_scheme
    outcome: dict = {}

    def worker(rank):
        with inalab.Client(switch=sw.control_addr, job=14, rank=rank, world=2, scheme=scheme, join_timeout_s=30) as c:
            try:
                outcome[rank] = c.allreduce(np.ones(5 + rank, np.float32))
            except ValueError as e:
                outcome[rank] = str(e)

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for r in range(2):
        assert "the ranks disagree on this tensor's size (values per rank: rank 0 5, rank 1 6)" in str(outcome.get(r)), outcome


def test_a_blocked_allreduce_times_out_and_answers_ctrl_c(switchml):
    """Rank 1 joins and never calls allreduce: rank 0's call ends at its timeout with the
    cause named, later calls fail at once; a blocked call raises KeyboardInterrupt on Ctrl-C
    (before issue #12 it waited for ever and ignored Ctrl-C)."""
    import os
    import signal
    import time

    release = threading.Event()

    def idle_rank(job):
        with inalab.Client(switch=switchml.control_addr, job=job, rank=1, world=2, join_timeout_s=30):
            release.wait(30)

    peers = [threading.Thread(target=idle_rank, args=(j,)) for j in (21, 22)]
    for p in peers:
        p.start()
    try:
        with inalab.Client(switch=switchml.control_addr, job=21, rank=0, world=2, join_timeout_s=30) as c:
            t = time.monotonic()
            with pytest.raises(RuntimeError, match="no result within"):
                c.allreduce(np.ones(10, np.float32), timeout_s=0.5)
            assert time.monotonic() - t < 5
            with pytest.raises(RuntimeError, match="no result within"):
                c.allreduce(np.ones(10, np.float32))
        with inalab.Client(switch=switchml.control_addr, job=22, rank=0, world=2, join_timeout_s=30) as c:
            threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
            t = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                c.allreduce(np.ones(10, np.float32))
            assert time.monotonic() - t < 5
    finally:
        release.set()
        for p in peers:
            p.join(timeout=30)
    with pytest.raises(ValueError, match="timeout_s"):
        with inalab.Client(switch=switchml.control_addr, job=23, world=1) as c:
            c.allreduce(np.ones(1, np.float32), timeout_s=0)


def test_sigterm_stops_the_switch_within_a_second_whatever_a_client_does():
    """A job runs while a client pipelines `stats` without reading its replies (before issue
    #12 a client that stopped reading could freeze the control plane, and SIGTERM with it)."""
    import json as _json
    import signal
    import socket
    import time

    sw = subprocess.Popen([sys.executable, "-m", "inalab", "switch", "--program", "switchml", "--udp", "127.0.0.1:0",
                           "--control", "127.0.0.1:0", "--json", "--stats-every", "0.2"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = _json.loads(sw.stdout.readline())
        host, port = ready["control"].rsplit(":", 1)
        # A job runs, and another connection floods `stats` without reading the replies.
        with inalab.Client(switch=ready["control"], job=5, world=1, join_timeout_s=10):
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(b'{"op":"stats"}\n' * 50_000)
            time.sleep(0.5)
            t = time.monotonic()
            sw.send_signal(signal.SIGTERM)
            sw.wait(timeout=10)
            assert time.monotonic() - t < 3.0, time.monotonic() - t  # a hang would be the 10 s wait
            s.close()
    finally:
        if sw.poll() is None:
            sw.kill()


def test_a_worker_with_only_the_worker_key_joins_and_a_wrong_key_is_refused(switchml, tmp_path):
    """`inalab worker-key` prints what a worker machine needs; with it alone (no readable secret)
    a worker joins; with another key it is refused, with a message that says so."""
    key = subprocess.run([sys.executable, "-m", "inalab", "worker-key"], capture_output=True, text=True, check=True).stdout.strip()
    assert len(key) == 64 and int(key, 16) >= 0
    code = ("import sys, numpy as np, inalab\n"
            "with inalab.Client(switch=sys.argv[1], job=31, world=1, join_timeout_s=10) as c:\n"
            "    print(c.allreduce(np.ones(3, np.float32)).tolist())\n")
    env = {k: v for k, v in os.environ.items() if k != "INALAB_SECRET"}
    env["INALAB_SECRET_FILE"] = str(tmp_path / "no-such-dir" / "secret")  # would make a new, wrong secret
    ok = subprocess.run([sys.executable, "-c", code, switchml.control_addr], env={**env, "INALAB_WORKER_KEY": key},
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout.strip() == "[1.0, 1.0, 1.0]", ok.stderr
    assert not (tmp_path / "no-such-dir").exists(), "the worker key alone was used"
    bad = subprocess.run([sys.executable, "-c", code, switchml.control_addr], env={**env, "INALAB_WORKER_KEY": "ab" * 32},
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "refused our credentials" in bad.stderr, bad.stderr
