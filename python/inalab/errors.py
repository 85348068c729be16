"""The one error type of the user-facing configuration (re-exported as ``inalab.ConfigError``)."""
from __future__ import annotations


class ConfigError(ValueError):
    """A scenario that cannot be simulated, naming the offending field.

    ``field`` is a dotted path with list indices, e.g. ``jobs[1].workers``; ``str()`` is
    ``"<field>: <message>"``. It subclasses ``ValueError`` so that pydantic validators can raise
    it and the loader can recover it intact.
    """

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message

    def under(self, prefix: str) -> "ConfigError":
        """The same error with ``prefix`` prepended to its field path."""
        if not prefix:
            return self
        if not self.field:
            return ConfigError(prefix, self.message)
        sep = "" if self.field.startswith("[") else "."
        return ConfigError(f"{prefix}{sep}{self.field}", self.message)
