"""`inalab reproduce` tells the truth (issue #35): --list with each one's scale, seeds and
expected time (from the last full run's report.json), --seeds, no "nan" in a printed table,
`compare` without "+nan%", and Ctrl-C / SIGTERM that stop at once and leave no process."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import inalab
import inalab.analysis
from inalab.cli import app
from inalab.reproduce import REPRODUCTIONS, markdown_table, mean_over_seeds, per_seed, run_one, takes_seeds
from inalab.reproduce.report import COMMITTED_REPORT

runner = CliRunner()
INALAB = Path(sys.executable).with_name("inalab")
SEEDS_FORM = "a comma-separated list of distinct non-negative integers"


def _last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------- --list

def test_list_shows_every_reproduction_with_its_time_from_report_json(tmp_path):
    # An earlier run's report.json (--report DIR's, else the committed docs/report/report.json)
    # is where the expected times come from: here made up, so they can only come from the file.
    # Every other entry records the 2 seeds it ran; one that records none ran once (reports from
    # before seeds were recorded). Expected: per seed run, times the default seeds.
    made_up = {name: 1000.0 + i for i, name in enumerate(REPRODUCTIONS)}
    ran = {name: [7, 8] if i % 2 else None for i, name in enumerate(REPRODUCTIONS)}
    report = {"generated": "2030-01-02T03:04:05+00:00", "command": "inalab reproduce all --jobs 2", "jobs": 2,
              "machine": {"cpus": 2}, "reproductions": [{"name": n, "seconds": s, **({"seeds": ran[n]} if ran[n] else {})}
                                                      for n, s in made_up.items()]}
    (tmp_path / "report.json").write_text(json.dumps(report))
    r = runner.invoke(app, ["reproduce", "--list", "--json", "--report", str(tmp_path)])
    assert r.exit_code == 0, r.output
    cat = _last_json(r.stdout)
    assert cat["source"]["path"] == str(tmp_path / "report.json") and cat["source"]["generated"] == report["generated"]
    by = {e["name"]: e for e in cat["reproductions"]}
    assert set(by) == set(REPRODUCTIONS)
    for name, rep in REPRODUCTIONS.items():
        e = by[name]
        one = made_up[name] / (2 if ran[name] else 1)
        assert e["expected_s"] == pytest.approx(one * (len(rep.seeds) if takes_seeds(rep) else 1)), name
        assert e["paper"] and e["figure"] == rep.figure and e["scale"]  # e.g. "1024-host fat tree", "LP only (9 hosts)"
        assert e["seeds"] == (list(rep.seeds) if takes_seeds(rep) else None)
    assert by["canary-congestion"]["scale"] == "1024-host fat tree" and by["grid-motivating-example"]["scale"].startswith("LP only")

    # The committed run by default, and `reproduce list` is the same; the table says where the times come from.
    r = runner.invoke(app, ["reproduce", "list", "--json"])
    assert r.exit_code == 0, r.output
    committed = {e["name"]: e["seconds"] / max(1, len(e.get("seeds") or ()))
                 for e in json.loads(COMMITTED_REPORT.read_text())["reproductions"]}
    want = {n: None if n not in committed else committed[n] * (len(rep.seeds) if takes_seeds(rep) else 1)
            for n, rep in REPRODUCTIONS.items()}
    assert {e["name"]: e["expected_s"] for e in _last_json(r.stdout)["reproductions"]} == pytest.approx(want)
    r = runner.invoke(app, ["reproduce", "--list"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    for name in REPRODUCTIONS:
        assert re.search(rf"\s{re.escape(name)}\s", r.stdout), name
    assert "report.json" in r.stdout and "generated" in r.stdout


def test_a_single_reproduction_prints_its_wall_time(tmp_path):
    r = runner.invoke(app, ["reproduce", "rina-incremental", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert re.search(r"^wall time: \d+\.\d s$", r.stdout, re.M), r.stdout


# ------------------------------------------------------------------------------------- --seeds

def test_seeds_reach_the_rows_and_the_write_up(tmp_path):
    r = runner.invoke(app, ["reproduce", "grid-motivating-example", "--seeds", "11,12", "--json", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    d = _last_json(r.stdout)
    assert d["seeds"] == [11, 12] and d["seeds_default"] is False
    assert d["columns"][0] == "seed" and sorted({row["seed"] for row in d["rows"]}) == [11, 12]
    assert len(d["rows"]) == 2 * len(d["means"]) and "seed" not in d["means"][0]  # holds judged the mean
    writeup = (tmp_path / "grid-motivating-example.md").read_text()
    assert "**Seeds.** Seeds 11, 12, the user's" in writeup and "the default is 1" in writeup
    assert "mean over the 2 seeds" in writeup
    # Without --seeds: the default, written in the write-up, and no seed column (the committed rows).
    o = run_one("grid-motivating-example")
    assert o.seeds == (1,) and o.seeds_default and "seed" not in o.rows and o.means is None
    assert "**Seeds.** Seed 1, the default" in o.writeup


class _Stop(Exception):
    pass


@pytest.mark.parametrize("name", [n for n, rep in REPRODUCTIONS.items() if takes_seeds(rep)])
def test_every_reproduction_builds_its_runs_on_the_seeds_given(name, monkeypatch):
    # The expensive ones (Canary's 1024 hosts take minutes) are not run: their first simulation,
    # sweep or flow-level analysis is caught, with the seed it was given.
    seen = []

    def simulate(scenario, *a, **k):
        seen.append(scenario.get("seed"))
        raise _Stop

    def simulate_all(label, runs, progress, measure=None):
        seen.extend(sc.get("seed") for _, sc in runs)
        raise _Stop

    def analyze(source, *a, seed=None, **k):
        seen.append(seed if seed is not None else source.get("seed"))
        raise _Stop

    monkeypatch.setattr(inalab, "simulate", simulate)
    monkeypatch.setattr(inalab.analysis, "analyze", analyze)
    for mod in [m for m in sys.modules.values() if getattr(m, "__name__", "").startswith("inalab.reproduce.")]:
        if hasattr(mod, "simulate_all"):
            monkeypatch.setattr(mod, "simulate_all", simulate_all)
    with pytest.raises(_Stop):
        run_one(name, seeds=(11, 12))
    assert seen and set(seen) <= {11, 12} and seen[0] == 11, seen  # never the default 1


class _Seeded:
    """A reproduction whose verdict on one seed differs from that on the mean of two."""

    name, figure, claim, tolerance, simulates = "seeded-example", "Fig. 0", "A claim.", "x is 12", "no hosts"
    seeds = (12,)

    def run(self, progress):
        return per_seed(self.seeds, lambda seed: pd.DataFrame({"setup": ["a", "b"], "x": [float(seed), 0.0],
                                                                "ok": [True, seed != 13]}))

    def checks(self, rows):
        return {"x_is_12": bool(len(rows) == 2 and rows.x.iloc[0] == 12.0)}

    def holds(self, rows):
        return all(self.checks(rows).values())

    def explain(self, rows):
        return f"# seeded-example\n\n**Claim.** {self.claim}\n\n**Command.** none.\n\n{markdown_table(rows)}\n"

    def plot(self, rows, path):
        path.write_bytes(b"")
        return path


def test_several_seeds_are_judged_on_their_mean(monkeypatch, tmp_path):
    monkeypatch.setitem(REPRODUCTIONS, "seeded-example", _Seeded())
    assert run_one("seeded-example").holds  # its default, 12
    assert not run_one("seeded-example", seeds=(11,)).holds
    o = run_one("seeded-example", seeds=(11, 13))  # x: 11 and 13, mean 12
    assert o.holds and o.checks == {"x_is_12": True}
    assert list(o.rows.seed) == [11, 11, 13, 13]
    assert o.means.to_dict("records") == [{"setup": "a", "x": 12.0, "ok": True}, {"setup": "b", "x": 0.0, "ok": False}]
    r = runner.invoke(app, ["reproduce", "seeded-example", "--seeds", "11,13", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "holds: yes" in r.stdout and "seeds 11, 13 (--seeds)" in r.stdout


class _Incomplete(_Seeded):
    """A reproduction one of whose runs does not finish by its stop time."""

    name = "incomplete-example"

    def run(self, progress):
        from inalab.reproduce import simulate_all

        cut = {"name": "cut", "stop": "2us", "topology": {"kind": "star", "hosts": 4},
               "jobs": [{"name": "r", "scheme": "ring", "allreduce": "1MiB", "workers": 4}]}
        return simulate_all(self.name, [({"stop": "2us"}, cut)], progress)


def test_a_reproduction_whose_run_does_not_complete_says_so_without_a_traceback(monkeypatch, tmp_path):
    # simulate_all's RuntimeError reached the user as a traceback (exit 1).
    monkeypatch.setitem(REPRODUCTIONS, "incomplete-example", _Incomplete())
    r = runner.invoke(app, ["reproduce", "incomplete-example", "--out", str(tmp_path)])
    assert r.exit_code == 3, r.output
    text = " ".join(r.output.split())
    assert "error: incomplete-example: incomplete-example: 1 of 1 runs did not complete (unfinished)" in text
    assert "not finished at the stop time, 2 us" in text and "Traceback" not in r.output


def test_mean_over_seeds_matches_rows_by_their_setup_not_their_order():
    rows = pd.DataFrame({"seed": [1, 1, 2, 2], "scheme": ["a", "b", "b", "a"], "rate": [1.0, 10.0, 30.0, 3.0],
                         "drops": [1, 2, 4, 5]})
    m = mean_over_seeds(rows, keys=["scheme"])
    assert m.to_dict("records") == [{"scheme": "a", "rate": 2.0, "drops": 3.0}, {"scheme": "b", "rate": 20.0, "drops": 3.0}]


@pytest.mark.parametrize("seeds", ["1,x", "", "-1", "1,,2", "1.5", "3,3"])
def test_bad_seeds_are_refused_naming_the_option(seeds, tmp_path):
    for name in ("grid-motivating-example", "all"):
        r = runner.invoke(app, ["reproduce", name, f"--seeds={seeds}", "--out", str(tmp_path / "o")])
        assert r.exit_code == 2, r.output
        assert "error: --seeds:" in r.output and SEEDS_FORM in r.output, r.output
    assert not (tmp_path / "o").exists()  # refused before running


def test_a_reproduction_without_seeds_refuses_them(tmp_path):
    r = runner.invoke(app, ["reproduce", "rina-incremental", "--seeds", "1,2", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2, r.output
    assert "error: --seeds: rina-incremental takes no seed: an analytical model" in " ".join(r.output.split())
    assert not (tmp_path / "o").exists()
    # With all, it runs without them (and says so) while the others take them.
    r = runner.invoke(app, ["reproduce", "all", "--only", "rina-incremental,grid-motivating-example", "--jobs", "1",
                            "--seeds", "2,3", "--json", "--out", str(tmp_path / "all")])
    assert r.exit_code == 0, r.output
    assert "rina-incremental takes no seed" in r.output
    assert _last_json(r.stdout)["seeds"] == {"grid-motivating-example": [2, 3], "rina-incremental": None}
    assert "**Seeds.** None: an analytical model" in (tmp_path / "all" / "rina-incremental.md").read_text()


# ------------------------------------------------------------------------------------- no nan

def test_a_missing_value_prints_as_a_dash_not_nan(tmp_path):
    # grid-motivating-example's paper_gbps is missing for SwitchML (not in the paper's figure).
    r = runner.invoke(app, ["reproduce", "grid-motivating-example", "--out", str(tmp_path)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert not re.search(r"\bnan\b", r.stdout, re.I), r.stdout
    switchml = next(line for line in r.stdout.splitlines() if line.split()[:1] == ["switchml"])
    assert switchml.split()[1] == "-", switchml
    table = markdown_table(pd.DataFrame({"a": [1.5, float("nan")], "b": [None, "x"], "c": [pd.NA, 2]}))
    assert "nan" not in table.lower() and "None" not in table and "<NA>" not in table and table.count("| - |") >= 2, table


def _star_result() -> dict:
    return inalab.simulate({"name": "t", "topology": {"kind": "star", "hosts": 8},
                            "jobs": [{"name": "a", "scheme": "ring", "allreduce": "64KiB", "workers": "h0..h3"}]}).raw


def test_compare_prints_no_nan_for_links_without_bytes(tmp_path):
    a, b = _star_result(), _star_result()
    # s0->h4..h7 carry nothing in either run; make one link new in B (nothing in A).
    new = next(link for link in a["links"] if link["tx_bytes"] > 0)
    new["tx_bytes"] = 0
    for d, raw in (("a", a), ("b", b)):
        (tmp_path / d).mkdir()
        (tmp_path / d / "result.json").write_text(json.dumps(raw))
    r = runner.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b")], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "nan" not in r.stdout.lower() and "inf" not in r.stdout.lower(), r.stdout
    line = next(line for line in r.stdout.splitlines() if f"{new['src']}->{new['dst']} " in line)
    assert line.split("│")[-2].strip() == "new", line
    idle = next(line for line in r.stdout.splitlines() if "s0->h5 " in line)
    assert idle.split("│")[-2].strip() == "-", idle
    r = runner.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"])
    links = {(x["src"], x["dst"]): x for x in json.loads(r.stdout)["links"]}
    assert links[(new["src"], new["dst"])]["tx_bytes_rel"] is None and links[("s0", "h5")]["tx_bytes_rel"] is None


# ------------------------------------------------------------------------------------- signals

def _processes_alive(pids) -> list:
    """Those of ``pids`` still running (a zombie, dead but not yet collected, is not)."""
    alive = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2] not in "ZX":
            alive.append(pid)
    return alive


def _tree(pid: int) -> set:
    from inalab.stop import descendants

    return set(descendants([pid]))


@pytest.fixture
def start(tmp_path):
    """Starts `inalab reproduce ARGS` in the background in tmp_path: (process, its stderr lines
    as they come). Whatever the test does, nothing it started outlives it."""
    from inalab.stop import kill_trees

    started = []

    def run(args: list[str]):
        p = subprocess.Popen([str(INALAB), "reproduce", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=tmp_path, env={**os.environ, "COLUMNS": "200"})
        started.append(p)
        lines: list[str] = []
        p.reader = threading.Thread(target=lambda: lines.extend(p.stderr), daemon=True)
        p.reader.start()
        return p, lines

    yield run
    for p in started:
        if p.poll() is None:
            kill_trees([p.pid], include_roots=True)
            p.wait(timeout=10)


def _wait_for(what, cond, p, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while not cond():
        if p.poll() is not None or time.monotonic() - t0 > timeout:
            pytest.fail(f"never saw {what} (exit status {p.returncode})")
        time.sleep(0.05)


def _signal_and_check(p, err, seen: set, sig) -> str:
    """Sends ``sig`` to ``p``; checks it exits with 128 + sig within 3 s (about a second at
    most: most of it is exiting Python) and leaves none of the processes ``seen`` under it;
    returns its stderr as one line."""
    t0 = time.monotonic()
    p.send_signal(sig)
    p.wait(timeout=60)
    stopped_in = time.monotonic() - t0
    p.reader.join(timeout=10)  # every line of its stderr
    time.sleep(0.2)
    text = " ".join("".join(err).split())
    assert p.returncode == 128 + sig, text
    assert stopped_in < 3.0, stopped_in
    assert _processes_alive(seen) == [], text
    return text


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_ctrl_c_stops_reproduce_all_at_once_names_what_finished_and_leaves_no_process(tmp_path, start):
    # The earlier run's times (--report DIR's report.json) set the order: the two cheap ones
    # first, then atp-loss (a sweep: pool processes under the reproduction's process) beside
    # grid-large-scale (20 s of LPs).
    order = {"grid-motivating-example": 100, "rina-incremental": 99, "atp-loss": 50, "grid-large-scale": 1}
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "report.json").write_text(json.dumps({"reproductions": [{"name": n, "seconds": s}
                                                                                     for n, s in order.items()]}))
    p, err = start(["all", "--only", ",".join(order), "--jobs", "2", "--out", "out", "--report", "report"])
    seen = set()

    def started() -> bool:
        seen.update(_tree(p.pid))
        done = sum(line.startswith(("grid-motivating-example: holds", "rina-incremental: holds")) for line in list(err))
        return done == 2 and len(_tree(p.pid)) >= 3  # 2 reproductions, and atp-loss's sweep under one
    _wait_for("the cheap ones finish and atp-loss's sweep start", started, p)
    seen.update(_tree(p.pid))
    text = _signal_and_check(p, err, seen, signal.SIGINT)
    assert "interrupted by Ctrl-C (SIGINT): reproduce all stopped" in text and "grid-motivating-example (holds)" in text and "rina-incremental (holds)" in text
    assert re.search(r"stopped unfinished: (atp-loss, grid-large-scale|grid-large-scale, atp-loss)", text), text


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_sigterm_stops_a_single_reproduction_and_its_sweep(tmp_path, start):
    p, err = start(["atp-loss", "--out", "out"])  # its sweep's pool runs under it
    seen = set()

    def started() -> bool:
        seen.update(_tree(p.pid))
        return len(_tree(p.pid)) >= 1
    _wait_for("atp-loss's sweep start", started, p)
    text = _signal_and_check(p, err, seen, signal.SIGTERM)
    assert "interrupted by SIGTERM: atp-loss stopped" in text
    assert not (tmp_path / "out").exists()


def test_a_reproductions_progress_names_its_points_and_seeds():
    """Issue #39: a reproduction's seeds and points run as one sweep, and its progress says how
    many of each (a seedless or one-seed sweep shows the count alone)."""
    from inalab.reproduce import simulate_all

    base = {"name": "p", "topology": {"kind": "star", "hosts": 4},
            "jobs": [{"name": "r", "scheme": "ring", "allreduce": "64KiB", "workers": 4}]}
    runs = [({"size": size, "seed": seed}, {**base, "seed": seed, "jobs": [{**base["jobs"][0], "allreduce": size}]})
            for seed in (1, 2, 3) for size in ("32KiB", "64KiB")]
    said = []
    rows = simulate_all("example", runs, said.append)
    assert len(rows) == 6 and said[-1] == "example: 6/6 runs (2 points x 3 seeds)", said
    said.clear()
    simulate_all("example", runs[:2], said.append)
    assert said[-1] == "example: 2/2 runs", said
