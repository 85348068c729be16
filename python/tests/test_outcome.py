"""A run tells the truth about itself (issue #35): a failed or unfinished job is never reported
as a success (its status and reason in the table, the JSON and the DataFrame; no JCT; exit
status 3), hosts no path joins are refused before the run, flows say what arrived, Ctrl-C and
SIGTERM stop a simulation at once, and progress moves and shows off a terminal."""
from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time

import pytest
from rich.console import Console
from typer.testing import CliRunner

import inalab
from inalab.cli import app

runner = CliRunner()

RING = {"topology": {"kind": "star", "hosts": 4},
        "jobs": [{"name": "ring", "scheme": "ring", "allreduce": "4MiB", "iterations": 3, "workers": 4}]}


def toml(v) -> str:
    """A value as TOML (inline tables and arrays: enough for a scenario)."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(toml(x) for x in v) + "]"
    return json.dumps(v)  # strings, numbers, true/false


def write(tmp_path, name: str, scenario: dict) -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text("\n".join(f"{k} = {toml(v)}" for k, v in {"name": name, **scenario}.items()) + "\n")
    return str(path)


def test_a_failed_job_is_a_failure_everywhere(tmp_path):
    # It printed "(completed)", comm 0 %, "compute-bound", advice for a faster GPU, and exited 0.
    path = write(tmp_path, "failed", {**RING, "failures": [{"node": "h1", "at": "100us"}]})
    r = runner.invoke(app, ["simulate", path])
    assert r.exit_code == 3, r.output
    header = r.stdout.splitlines()[0]
    assert "(1 job failed)" in header and "completed" not in header
    assert "failed" in r.stdout and "0/3" in r.stdout
    text = " ".join(r.stdout.split())
    assert "ring: failed: worker 1 on h1 failed at 100000 ns; ring does not go on without a worker" in text
    assert "compute-bound" not in r.stdout and "compute_scale" not in r.stdout
    r = runner.invoke(app, ["simulate", path, "--json"])
    assert r.exit_code == 3
    s = json.loads(r.stdout.splitlines()[-1])
    j = s["jobs"][0]
    assert (s["outcome"], j["status"], j["finished"]) == ("failed", "failed", False)
    assert j["jct_s"] is None and j["goodput_gbps"] is None and j["comm_share"] is None and j["compute_bound"] is None
    assert "worker 1 on h1" in j["reason"] and s["problems"] == [f"ring: failed: {j['reason']}"]
    df = inalab.simulate(path).jobs
    assert df.status.tolist() == ["failed"] and df.jct_s.isna().all() and df.compute_bound.isna().all()


def test_an_unfinished_job_has_no_jct_and_fails_the_command(tmp_path):
    # Its jct_s was the stop time.
    path = write(tmp_path, "cut", {**RING, "stop": "1us"})
    r = runner.invoke(app, ["simulate", path, "--json"])
    assert r.exit_code == 3
    s = json.loads(r.stdout.splitlines()[-1])
    assert (s["outcome"], s["stopped_by"], s["jobs"][0]["status"], s["jobs"][0]["jct_s"]) == ("unfinished", "stop_time", "unfinished", None)
    assert "not finished at the stop time, 1 us (0 of 3 iterations done)" in s["jobs"][0]["reason"]
    r = runner.invoke(app, ["simulate", path])
    assert "(1 job unfinished at the stop time)" in r.stdout.splitlines()[0] and "unfinished" in r.stdout


def test_the_header_says_completed_and_exits_0_only_when_every_job_finished(tmp_path):
    r = runner.invoke(app, ["simulate", write(tmp_path, "ok", RING)])
    assert r.exit_code == 0 and "(completed)" in r.stdout.splitlines()[0]
    assert "status" not in r.stdout, "a status column only when a job did not finish"
    assert "algbw" in r.stdout and "busbw" in r.stdout and "NCCL's bus bandwidth" in r.stdout


def test_hosts_no_path_joins_are_refused_before_the_run_naming_them(tmp_path):
    edges = {"kind": "edges", "nodes": [{"name": n, "kind": "host"} for n in ("a", "b", "c")]
             + [{"name": "s1", "kind": "switch"}, {"name": "s2", "kind": "switch"}],
             "links": [{"a": "a", "b": "s1"}, {"a": "b", "b": "s1"}, {"a": "c", "b": "s2"}]}
    path = write(tmp_path, "cut", {"topology": edges,
                                   "jobs": [{"name": "ring", "scheme": "ring", "allreduce": "1MiB", "workers": ["a", "b", "c"]}]})
    r = runner.invoke(app, ["simulate", path])
    assert r.exit_code == 2
    assert "error: jobs[0]: no path in the topology from a to c" in " ".join(r.stderr.split()), r.stderr


def test_incast_says_what_arrived(tmp_path):
    # It said "16 flows; see --out" while 12.5 % of the bytes arrived.
    r = runner.invoke(app, ["simulate", "incast"])
    text = " ".join(r.stdout.split())
    assert r.exit_code == 0, r.output
    assert "16 flows: 1 delivered whole, 15 lost packets" in text and "of 16 MiB arrived (12.5%)" in text
    assert "15 flows lost packets" in r.stdout.splitlines()[0]
    f = inalab.simulate("incast").flows
    assert f.fct_s.notna().all() and set(f.status) == {"delivered", "lossy"}
    assert abs(f.bytes_received.sum() / f.bytes.sum() - 0.125) < 0.01


LONG = """name = "long"
[topology]
kind = "star"
hosts = 16
[[jobs]]
name = "ring"
scheme = "ring"
allreduce = "10GiB"
workers = 16
"""


@pytest.mark.parametrize("sig, status, word", [(signal.SIGINT, 130, "Ctrl-C (SIGINT)"), (signal.SIGTERM, 143, "SIGTERM")])
def test_a_signal_stops_a_simulation_at_once_and_prints_what_was_done(tmp_path, sig, status, word):
    # Nothing in the simulation loop checked for signals: a 10 GiB ring ran on for minutes after ^C.
    path = tmp_path / "long.toml"
    path.write_text(LONG)
    p = subprocess.Popen([sys.executable, "-m", "inalab", "simulate", str(path), "--out", str(tmp_path / "out")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)  # well into the run (about 3 minutes in all)
    assert p.poll() is None
    t = time.monotonic()
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    took = time.monotonic() - t
    print(f"\nstopped {took:.2f} s after {sig.name}")
    assert p.returncode == status, err
    assert took < 3.0, f"{took:.2f} s: the loop checks every 0.1 s"
    assert f"interrupted by {word}: simulating {path} stopped" in " ".join(err.split())
    assert "(interrupted)" in out and "unfinished" in out and "interrupted at" in " ".join(out.split())
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert saved["outcome"] == "interrupted" and saved["events"] > 0, "what was done is saved with --out"


def test_a_ctrl_c_in_python_carries_the_partial_result():
    calls = []

    def stop_at_the_third(fraction, events):
        calls.append(fraction)
        if len(calls) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as e:
        inalab.simulate(LONG, progress=stop_at_the_third)
    r = e.value.result
    assert r.outcome == "interrupted" and r.jobs.status.tolist() == ["unfinished"] and r.raw["events"] > 0


def test_progress_moves_within_one_allreduce():
    # One iteration of one tensor: the bar sat at 0 % until the end.
    seen = []
    scenario = LONG.replace('"10GiB"', '"96MiB"')
    inalab.simulate(scenario, progress=lambda f, e: seen.append(f))
    inside = [f for f in seen[:-1] if 0 < f < 1]
    assert seen[-1] == 1.0 and len(inside) >= 2, seen
    assert all(a <= b for a, b in zip(seen, seen[1:])), "never goes back"


def test_progress_off_a_terminal_is_a_line_every_few_seconds(monkeypatch):
    from inalab import progress

    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 0.0)
    buf = io.StringIO()
    console = Console(file=buf, width=200)
    assert not console.is_terminal
    with progress.ProgressBar("demo", console=console) as bar:
        bar.update(0.25, 1_000_000, 0.00123)
        bar.update(0.5, 2_000_000, 0.0025)
        bar.update(1.0, 4_000_000, 0.005)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith("demo: 25%, sim 1.23 ms, 1,000,000 events") and "left" in lines[0]
    assert lines[-1].startswith("demo: 100%, sim 5 ms")
