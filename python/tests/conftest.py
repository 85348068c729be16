import os
import shutil
import signal
from pathlib import Path

import pytest

# A suite started in the background of a non-interactive shell (`cmd &` without job control)
# inherits SIGINT ignored, as POSIX has it; Python then installs no KeyboardInterrupt handler,
# and the CLIs the tests start inherit the ignored signal too, so every Ctrl-C test failed (found
# running .ci/run from a subshell). Ctrl-C is what those tests test: give it back.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parents[2]
TSHARK = shutil.which("tshark")


@pytest.fixture
def tshark_required():
    """Tests that decode captures with tshark: skipped where it is not installed, but failed in
    CI (``CI`` set), which installs Debian's tshark (``make tools``): no silent skip there."""
    if TSHARK is None:
        if os.environ.get("CI"):
            pytest.fail("tshark is not installed: CI must install Debian's tshark package (make tools)")
        pytest.skip("tshark is not installed (apt-get install tshark)")


@pytest.fixture
def star():
    """A minimal valid scenario (dict) to break in tests."""
    return {
        "name": "t",
        "topology": {"kind": "star", "hosts": 8},
        "jobs": [{"name": "a", "scheme": "ring", "allreduce": "64KiB", "workers": "h0..h3"}],
    }


@pytest.fixture(autouse=True)
def check_every_simulation(monkeypatch):
    """Every simulation a test runs must conserve packets and bytes, keep links (and every time
    bin of them) at or below 100 % utilization, and leave no aggregator held once every job ended
    (finished or failed), whatever else the test asserts."""
    import json

    from inalab import _core

    real = _core.simulate

    def checked(spec_json, progress=None):
        out = real(spec_json, progress)
        r = json.loads(out)
        c = r["conservation"]
        assert c["holds"], f"conservation violated: {c}"
        for link in r["links"]:
            assert link["utilization"] <= 1.0 + 1e-9, f"{link['src']}->{link['dst']} above 100 %"
            assert link["peak_bin_utilization"] <= 1.0 + 1e-9, f"{link['src']}->{link['dst']} has a bin above 100 %"
        if all(j["status"] != "unfinished" for j in r["jobs"]):  # every job ended: finished or failed
            for sw in r["switches"]:
                assert sw["aggregators_end"] == 0, f"{sw['name']} holds aggregators after every job ended"
        return out

    monkeypatch.setattr(_core, "simulate", checked)
