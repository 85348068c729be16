"""The flow-level rate models by name (Geryon, ATP and SwitchML from :mod:`.flow_model`, GRID's
LP from :mod:`.grid`): the one place that knows them all, so neither module imports the other."""
from __future__ import annotations

from ..errors import ConfigError
from .flow_model import FlowResult, Problem, atp, geryon, switchml
from .grid import plan_grid

SCHEMES = ("geryon", "atp", "switchml", "grid")


def run_scheme(pb: Problem, scheme: str, seed: int = 1) -> FlowResult:
    """The flow-level result of ``scheme`` on ``pb`` (``seed``: GRID's randomized rounding)."""
    if scheme == "geryon":
        return geryon(pb)
    if scheme == "atp":
        return atp(pb)
    if scheme == "switchml":
        return switchml(pb)
    if scheme == "grid":
        return plan_grid(pb, seed=seed).result
    raise ConfigError("schemes", f"unknown scheme {scheme!r}; allowed values: {', '.join(SCHEMES)}")
