"""The scheme registry, as the Rust core (``inalab_scheme``) defines it: the only list of
schemes. Config validation, the runtime and the CLI read names, parameters and defaults here."""
from __future__ import annotations

import json
from functools import lru_cache


@lru_cache(maxsize=1)
def registry() -> dict[str, dict]:
    """``{name: {name, doc, servers, program, quantization, params}}`` in the registry's order."""
    from . import _core

    return {s["name"]: s for s in json.loads(_core.schemes())}


def names() -> tuple[str, ...]:
    return tuple(registry())


def with_program() -> tuple[str, ...]:
    """Schemes with a switch program (what the UDP switch runs)."""
    return tuple(n for n, s in registry().items() if s["program"])


def takes(scheme: str, prefix: str) -> bool:
    """Whether ``scheme``'s configuration has a parameter ``prefix`` or one under ``prefix.``."""
    return any(p["name"] == prefix or p["name"].startswith(prefix + ".") for p in registry()[scheme]["params"])


def default(scheme: str, param: str):
    """The default of parameter ``param`` (dotted name) of ``scheme``."""
    for p in registry()[scheme]["params"]:
        if p["name"] == param:
            return p["default"]
    raise KeyError(f"scheme {scheme!r} has no parameter {param!r}")
