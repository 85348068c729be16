"""Timed switch and link failures in scenarios: parsed, translated to the simulator's fields, and
refused with the field named. Only the configuration is tested here (no simulation)."""
import pytest

from inalab.config import ConfigError, load_scenario, rust_error

SCENARIO = """
name = "failing"
[topology]
kind = "leaf_spine"
leaves = 2
spines = 2
hosts_per_leaf = 2

[[jobs]]
name = "ring"
scheme = "ring"
allreduce = "1MiB"
workers = "h0..h3"

[[failures]]
node = "spine1"
at = "2ms"
until = "3ms"

[[failures]]
link = ["leaf0", "spine0"]
at = "1ms"
"""


@pytest.fixture
def failing(star):
    star["topology"] = {"kind": "leaf_spine", "leaves": 2, "spines": 2, "hosts_per_leaf": 4}
    return star


def error(data) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        load_scenario(data).to_spec()
    return e.value


def test_failures_become_the_simulators_fields_in_picoseconds():
    spec = load_scenario(SCENARIO).to_spec()
    assert spec["failures"] == [
        {"node": "spine1", "at_ps": 2_000_000_000, "until_ps": 3_000_000_000},
        {"link": ["leaf0", "spine0"], "at_ps": 1_000_000_000},
    ]


def test_no_failures_no_key(star):
    # Specs without failures stay exactly what older simulators read.
    assert "failures" not in load_scenario(star).to_spec()


@pytest.mark.parametrize("failure, field, words", [
    ({"at": "1ms"}, "failures[0]", "exactly one of node"),
    ({"node": "spine0", "link": ["leaf0", "spine0"], "at": "1ms"}, "failures[0]", "not both"),
    ({"link": ["leaf0"], "at": "1ms"}, "failures[0].link", "two end nodes"),
    ({"node": "spine0", "at": "2ms", "until": "2ms"}, "failures[0].until", "after `at`"),
    ({"node": "spine0", "at": "2ms", "until": "1ms"}, "failures[0].until", "after `at`"),
    ({"node": "spine0"}, "failures[0].at", "required"),
    ({"node": "spine0", "at": 5}, "failures[0].at", "needs a unit"),
    ({"node": "spine0", "at": "1ms", "switch": "spine1"}, "failures[0].switch", "node, link, at, until"),
])
def test_bad_failures_name_the_field(failing, failure, field, words):
    failing["failures"] = [failure]
    e = error(failing)
    assert e.field == field, e
    assert words in e.message, e


def test_the_simulators_errors_come_back_on_the_users_field_names():
    # Names are checked by the simulator; its fields carry base units the user did not write.
    e = rust_error(ValueError('failures[1].until_ps: must be after at_ps (5 ps), got 5 ps'))
    assert (e.field, e.message.startswith("must be after")) == ("failures[1].until", True)
    e = rust_error(ValueError('failures[0].node: "h0" is a host; only switches fail (switches are leaf0, leaf1)'))
    assert e.field == "failures[0].node"
