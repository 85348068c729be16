from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def star():
    """A minimal valid scenario (dict) to break in tests."""
    return {
        "name": "t",
        "topology": {"kind": "star", "hosts": 8},
        "jobs": [{"name": "a", "scheme": "ring", "allreduce": "64KiB", "workers": "h0..h3"}],
    }
