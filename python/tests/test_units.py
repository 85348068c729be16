"""Quantities with units: exact integer base units, and errors that name the field and the units."""
import pytest
from hypothesis import given, strategies as st

from inalab.config import ConfigError
from inalab.units import parse_duration, parse_rate, parse_size


@pytest.mark.parametrize("text, ps", [
    ("1us", 10**6), ("2.5 ms", 2_500_000_000), ("1s", 10**12), ("100ns", 100_000), ("10ps", 10),
    ("0s", 0), ("1e3ns", 10**6), (" 3 us ", 3 * 10**6),
])
def test_durations(text, ps):
    assert parse_duration(text) == ps


@pytest.mark.parametrize("text, bps", [
    ("100Gbps", 100 * 10**9), ("3 Gbps", 3 * 10**9), ("400Mbps", 400 * 10**6), ("1Tbps", 10**12),
    ("3.2Tbps", 3_200_000_000_000),
])
def test_rates(text, bps):
    assert parse_rate(text) == bps


@pytest.mark.parametrize("text, n", [
    ("4MiB", 4 * 2**20), ("306B", 306), ("1 KB", 1000), ("5MB", 5 * 10**6), ("1GiB", 2**30),
])
def test_sizes(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("parse, value, expect", [
    (parse_duration, 5, "ps, ns, us"),          # bare number: no unit guessing
    (parse_duration, "5", "ps, ns, us"),
    (parse_rate, 100e9, "Gbps"),
    (parse_size, "4MiBs", "accepted units"),
    (parse_size, "1.5B", "whole number of bytes"),
    (parse_duration, "0.5ps", "whole number of picoseconds"),
    (parse_duration, "-1us", "never negative"),
    (parse_rate, "100 Gb", "unknown rate unit 'Gb'"),
    (parse_size, True, "expected a size"),
])
def test_bad_quantities_name_the_field_and_units(parse, value, expect):
    with pytest.raises(ConfigError) as e:
        parse(value, "network.buffer")
    assert e.value.field == "network.buffer"
    assert str(e.value).startswith("network.buffer: ")
    assert expect in e.value.message


@given(st.integers(min_value=0, max_value=10**15), st.sampled_from([("ns", 10**3), ("us", 10**6), ("ms", 10**9)]))
def test_duration_is_exact(n, unit):
    suffix, factor = unit
    if n * factor > 2**64 - 1:  # the simulator's picoseconds are 64-bit
        with pytest.raises(ConfigError, match="too large"):
            parse_duration(f"{n}{suffix}")
    else:
        assert parse_duration(f"{n}{suffix}") == n * factor


@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=999))
def test_decimal_fractions_are_exact(whole, frac):
    assert parse_rate(f"{whole}.{frac:03d}Gbps") == whole * 10**9 + frac * 10**6
