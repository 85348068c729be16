"""docs/results.md: generated from inalab.columns, and complete: every column a run writes is
defined there, and every column defined there is written by some run (emulation-only ones by
test_emulate)."""
from __future__ import annotations

from pathlib import Path

import pytest

import inalab
from inalab import columns

REPO = Path(__file__).resolve().parents[2]
EMULATION_ONLY = "`inalab emulate` only"


def test_docs_results_md_is_generated_from_the_column_definitions():
    assert (REPO / "docs" / "results.md").read_text() == columns.markdown(), "run `make docs` to regenerate docs/results.md"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs that together write every column: training and allreduce jobs, flows (lossy and
    unfinished), PFC, a failed host, an unfinished job, captures."""
    from inalab.capture import Capture

    pfc = {"name": "pfc", "topology": {"kind": "star", "hosts": 5}, "network": {"flow_control": "pfc"},
           "flows": [{"src": f"h{i}", "dst": "h0", "size": "300KiB"} for i in range(1, 5)]}
    failed = {"name": "failed", "topology": {"kind": "star", "hosts": 4},
              "jobs": [{"name": "ring", "scheme": "ring", "allreduce": "4MiB", "iterations": 3, "workers": 4}],
              "failures": [{"node": "h1", "at": "100us"}]}
    cut = {"name": "cut", "stop": "20us", "topology": {"kind": "star", "hosts": 4},
           "jobs": [{"name": "ring", "scheme": "ring", "allreduce": "4MiB", "workers": 4}]}
    out = [inalab.simulate(s) for s in ("demo", "ring-star-allreduce", "incast", pfc, failed, cut)]
    out.append(inalab.simulate("emulate-atp-star", pcap=Capture(tmp_path_factory.mktemp("pcap"), ["h0"])))
    return out


def test_every_column_a_run_writes_is_defined(runs):
    for r in runs:
        assert columns.undocumented(r.raw) == [], r.raw["scenario"]
        assert set(r.summary()) == set(columns.SUMMARY), r.raw["scenario"]
        derived = {"comm_share", "compute_bound"}
        assert set(r.jobs.columns) - derived <= set(columns.JOBS), r.raw["scenario"]


@pytest.mark.parametrize("name, table, written", [
    ("run", columns.RUN, lambda r: [r.raw]),
    ("jobs", columns.JOBS, lambda r: r.raw["jobs"]),
    ("iterations", columns.ITERATIONS, lambda r: r.raw["iterations"]),
    ("links", columns.LINKS, lambda r: r.raw["links"]),
    ("switches", columns.SWITCHES, lambda r: r.raw["switches"]),
    ("hosts", columns.HOSTS, lambda r: r.raw["hosts"]),
    ("flows", columns.FLOWS, lambda r: r.raw["flows"]),
    ("conservation", columns.CONSERVATION, lambda r: [r.raw["conservation"]]),
    ("captures", columns.CAPTURES, lambda r: r.raw["captures"]),
    ("metrics", columns.METRICS, lambda r: [{row["metric"]: 1 for row in r.raw["timeseries"]}]),
])
def test_every_defined_column_is_written_by_some_run(runs, name, table, written):
    seen = {k for r in runs for row in written(r) for k in row}
    if name == "jobs":
        seen |= {"comm_share", "compute_bound"}  # derived by Result.jobs
    missing = [k for k, (_, text) in table.items() if k not in seen and EMULATION_ONLY not in text]
    assert missing == [], f"{name}: defined but never written: {missing}"


def test_the_status_columns_tell_what_happened(runs):
    by = {r.raw["scenario"]: r for r in runs}
    assert by["failed"].outcome == "failed" and by["cut"].outcome == "unfinished" and by["demo"].ok
    flows = by["incast"].flows
    assert set(flows.status) == {"delivered", "lossy"} and flows.fct_s.notna().all()
    assert by["cut"].jobs.jct_s.isna().all() and by["cut"].summary()["jobs"][0]["jct_s"] is None
