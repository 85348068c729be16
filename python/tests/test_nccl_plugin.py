"""The NCCL network/CollNet plugin (crates/inalab-nccl, shipped as inalab.nccl_plugin_path()),
loaded and driven the way NCCL does by a C harness (crates/inalab-nccl/tests/harness.c, compiled
here with gcc against NCCL's own net_v8.h .. net_v12.h) in separate processes, against a real
inalab switch running in this process."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

import inalab

REPO = Path(__file__).resolve().parents[2]
NCCL_DIR = REPO / "crates" / "inalab-nccl"
HARNESS_SRC = NCCL_DIR / "tests" / "harness.c"
ANY = "127.0.0.1:0"
TIMEOUT_S = 120  # every harness process; the harness bounds each of its waits at 60 s itself
HEADS = 4


@pytest.fixture(scope="session")
def harness(tmp_path_factory) -> Path:
    """The harness, compiled once per session; warnings are errors (a mismatch with NCCL's
    declarations shows as an incompatible-pointer warning in gcc 12)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is not installed: the NCCL plugin tests compile a C harness (apt-get install gcc)")
    exe = tmp_path_factory.mktemp("nccl_harness") / "harness"
    cmd = [gcc, "-O1", "-Wall", "-Wextra", "-Werror", "-I", str(NCCL_DIR / "nccl"), str(HARNESS_SRC), "-o", str(exe), "-ldl"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"compiling the harness failed: {' '.join(cmd)}\n{r.stdout}{r.stderr}"
    return exe


@pytest.fixture(scope="session")
def plugin() -> Path:
    path = inalab.nccl_plugin_path()  # FileNotFoundError (run `make build`) where it is not built
    assert path.is_file(), path
    return path


def plugin_env(switch: str | None, scheme: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INALAB_", "HARNESS_", "NCCL_"))}
    if switch is not None:
        env["INALAB_SWITCH"] = switch
    if scheme is not None:
        env["INALAB_SCHEME"] = scheme
    return env


def run_ranks(harness: Path, plugin: Path, mode: str, version, nranks: int, workdir: Path, env: dict, extra=()) -> list[str]:
    """Runs ranks 0..nranks-1 of `harness PLUGIN MODE VERSION RANK NRANKS DIR [extra]` at once;
    returns each rank's stdout, or fails showing every rank's exit status, stdout and stderr."""
    bootstrap = workdir / f"{mode}-v{version}"
    bootstrap.mkdir()
    procs, files = [], []
    try:
        for r in range(nranks):
            out = open(bootstrap / f"rank{r}.stdout", "w+")
            err = open(bootstrap / f"rank{r}.stderr", "w+")
            files.append((out, err))
            args = [str(harness), str(plugin), mode, str(version), str(r), str(nranks), str(bootstrap), *extra]
            procs.append(subprocess.Popen(args, stdout=out, stderr=err, env=env, cwd=workdir))
        deadline = time.monotonic() + TIMEOUT_S
        killed = set()
        for r, p in enumerate(procs):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                killed.add(r)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    outs, errs = [], []
    for out, err in files:
        out.seek(0)
        err.seek(0)
        outs.append(out.read())
        errs.append(err.read())
        out.close()
        err.close()
    if killed or any(p.returncode != 0 for p in procs):
        report = "\n".join(
            f"----- rank {r}: exit {p.returncode}{' (killed after %d s)' % TIMEOUT_S if r in killed else ''}\n"
            f"stdout:\n{outs[r]}stderr:\n{errs[r]}"
            for r, p in enumerate(procs)
        )
        pytest.fail(f"harness {mode} v{version} {' '.join(extra)} with {nranks} rank(s) failed:\n{report}", pytrace=False)
    return outs


def wait_released(sw: inalab.Switch, timeout_s: float = 5.0) -> dict:
    """The switch's stats once it holds no aggregator (the heads' jobs ended), or after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = sw.stats()
        if st["aggregators_in_use"] == 0 or time.monotonic() > deadline:
            return st
        time.sleep(0.05)


@pytest.mark.parametrize("version", ["all", 8, 9, 10, 11, 12])
def test_symbols(harness, plugin, version):
    # No INALAB_SWITCH: NCCL loads the plugin wherever NCCL_NET_PLUGIN names it; init must still succeed.
    r = subprocess.run([str(harness), str(plugin), "symbols", str(version)], capture_output=True, text=True,
                       env=plugin_env(None), timeout=TIMEOUT_S)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}stderr:\n{r.stderr}"
    lines = r.stdout.splitlines()
    want = [12, 11, 10, 9, 8] if version == "all" else [version]
    assert [line.split(":")[0] for line in lines] == [f"v{v}" for v in want], r.stdout
    for line in lines:
        assert "name=inalab" in line and "devType=0" in line, line


@pytest.mark.parametrize("version", [8, 12])
def test_p2p(harness, plugin, tmp_path, version):
    with inalab.Switch("switchml", udp=ANY, control=ANY) as sw:
        outs = run_ranks(harness, plugin, "p2p", version, 2, tmp_path, plugin_env(sw.control_addr, "switchml"))
    assert "all checked" in outs[0] and "sent 5 messages" in outs[1], outs


def check_allreduce(outs: list[str], version: int, types: list[str]) -> None:
    for r, out in enumerate(outs):
        assert f"allreduce v{version} rank {r}/{len(outs)}: OK" in out, out
        for t in types:
            assert f"rank {r}/{len(outs)} {t}:" in out, out


@pytest.mark.parametrize("version,types", [(12, ["f32", "f16", "bf16"]), (8, ["f32"])], ids=["v12-all-types", "v8-f32"])
def test_allreduce_switchml(harness, plugin, tmp_path, version, types):
    extra = types if len(types) == 1 else []
    with inalab.Switch("switchml", udp=ANY, control=ANY) as sw:
        env = plugin_env(sw.control_addr, "switchml")
        outs = run_ranks(harness, plugin, "allreduce", version, HEADS, tmp_path, env, extra)
        check_allreduce(outs, version, types)
        st = wait_released(sw)
        assert st["aggregators_in_use"] == 0, st
        assert st["malformed"] == 0 and st["unadmitted"] == 0, st


@pytest.mark.parametrize("scheme", ["atp", "dsa"])
def test_allreduce_ps_schemes(harness, plugin, tmp_path, scheme):
    with inalab.Switch(scheme, udp=ANY, control=ANY) as sw, \
            inalab.ParameterServer(switch=sw.control_addr, udp=ANY, control=ANY):
        env = plugin_env(sw.control_addr, scheme)
        outs = run_ranks(harness, plugin, "allreduce", 12, HEADS, tmp_path, env, ["f32"])
        check_allreduce(outs, 12, ["f32"])
        st = wait_released(sw)
        assert st["aggregators_in_use"] == 0, st


def closed_port() -> str:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    addr = "127.0.0.1:%d" % s.getsockname()[1]
    s.close()  # nothing listens there now: a connection is refused
    return addr


def test_fallback_when_the_switch_is_unreachable(harness, plugin, tmp_path):
    start = time.monotonic()
    outs = run_ranks(harness, plugin, "fallback", 12, 1, tmp_path, plugin_env(closed_port(), "switchml"))
    assert "fallback v12: connect returned" in outs[0], outs
    assert time.monotonic() - start < 35


def test_the_cli_prints_the_plugin_s_path_and_says_how_to_build_a_missing_one(plugin, monkeypatch):
    from typer.testing import CliRunner

    from inalab.cli import app

    r = CliRunner().invoke(app, ["nccl-plugin", "--path"])
    assert r.exit_code == 0 and r.stdout.strip() == str(plugin), r.output
    monkeypatch.setattr(inalab, "NCCL_PLUGIN", "libnccl-net-missing.so")
    with pytest.raises(FileNotFoundError, match="make build"):
        inalab.nccl_plugin_path()
    r = CliRunner().invoke(app, ["nccl-plugin"])
    assert r.exit_code == 1 and "make build" in r.output, r.output
