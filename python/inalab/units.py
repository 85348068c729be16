"""Quantities with units, as users write them in scenarios: durations, rates and sizes.

Each parser turns a string such as ``"2.5 ms"`` into the simulator's integer base unit
(picoseconds, bits per second, bytes). Arithmetic is decimal, so ``"3.2Tbps"`` is exactly
3_200_000_000_000. A bare number is an error: units are never guessed.

    >>> parse_duration("1us"), parse_rate("100Gbps"), parse_size("4MiB")
    (1000000, 100000000000, 4194304)
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from .errors import ConfigError

__all__ = ["Unit", "DURATION", "RATE", "SIZE", "parse_duration", "parse_rate", "parse_size"]


@dataclass(frozen=True)
class Unit:
    """A kind of quantity: its name, base unit and the suffixes accepted, with their factors."""

    kind: str
    base: str
    factors: dict[str, int]

    @property
    def accepted(self) -> str:
        return ", ".join(self.factors)

    def parse(self, value: object, field: str = "") -> int:
        """``value`` in base units; ``ConfigError(field, ...)`` if it is not a valid quantity."""
        example = f"e.g. \"{_EXAMPLES[self.kind]}\""
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ConfigError(field, f"expected a {self.kind} string with a unit ({self.accepted}), {example}; got {value!r}")
        m = _QUANTITY.match(value) if isinstance(value, str) else None
        if m is None and isinstance(value, str) and _SIGNED.match(value):
            raise ConfigError(field, f"a {self.kind} is never negative; got {value!r}")
        if m is None and isinstance(value, str) and _NOT_FINITE.match(value):
            raise ConfigError(field, f"a {self.kind} is a finite number with a unit ({example}); got {value!r}")
        if m is None or not m.group("unit"):
            raise ConfigError(
                field, f"a {self.kind} needs a unit, one of {self.accepted} ({example}); got {value!r}"
            )
        number, unit = m.group("number"), m.group("unit")
        if unit not in self.factors:
            raise ConfigError(field, f"unknown {self.kind} unit {unit!r} in {value!r}; accepted units: {self.accepted}")
        try:
            exact = Decimal(number) * self.factors[unit]
        except InvalidOperation:
            raise ConfigError(field, f"not a number: {number!r}") from None
        if exact != exact.to_integral_value():
            raise ConfigError(field, f"{value!r} is not a whole number of {self.base}")
        if exact > _MAX:
            raise ConfigError(field, f"{value!r} is too large: at most {_MAX} {self.base} (64 bits)")
        return int(exact)


# Sign is not accepted: no quantity in a scenario is negative.
_QUANTITY = re.compile(r"^\s*(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(?P<unit>[A-Za-zµ/]*)\s*$")
_EXAMPLES = {"duration": "1us", "rate": "100Gbps", "size": "4MiB"}
_SIGNED = re.compile(r"^\s*-")
_NOT_FINITE = re.compile(r"^\s*[+]?(nan|inf)", re.IGNORECASE)
# The simulator's quantities are unsigned 64-bit integers of the base unit.
_MAX = 2**64 - 1

DURATION = Unit("duration", "picoseconds", {
    "ps": 1, "ns": 10**3, "us": 10**6, "µs": 10**6, "ms": 10**9, "s": 10**12,
})
# Rates are decimal (networking convention): 1 Gbps = 10^9 bits per second.
RATE = Unit("rate", "bits per second", {
    "bps": 1, "Kbps": 10**3, "kbps": 10**3, "Mbps": 10**6, "Gbps": 10**9, "Tbps": 10**12,
})
# Sizes: KB/MB/GB are decimal, KiB/MiB/GiB binary; "b" (bits) is deliberately absent.
SIZE = Unit("size", "bytes", {
    "B": 1, "KB": 10**3, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
})


def parse_duration(value: object, field: str = "") -> int:
    """A duration such as ``"1us"`` or ``"2.5 ms"`` in integer picoseconds."""
    return DURATION.parse(value, field)


def parse_rate(value: object, field: str = "") -> int:
    """A rate such as ``"100Gbps"`` in integer bits per second."""
    return RATE.parse(value, field)


def parse_size(value: object, field: str = "") -> int:
    """A size such as ``"4MiB"`` or ``"1 KB"`` in integer bytes."""
    return SIZE.parse(value, field)
