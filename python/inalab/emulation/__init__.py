"""A scenario's jobs run for real on its topology: ``inalab.emulate(scenario)`` and
``inalab emulate SCENARIO`` (docs/emulation.md)."""
from .run import EmulationError, emulate

__all__ = ["emulate", "EmulationError"]
