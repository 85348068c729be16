"""Packet captures (``--pcap``): what to capture, for the simulator and the real runtime.

Files are pcapng, one per capture point, with Ethernet/IPv4/UDP framing around inalab's real
frames; Wireshark decodes them with the dissector ``inalab wireshark --install`` sets up
(docs/runtime.md, "Packet captures and Wireshark").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

from .config import ConfigError
from .units import parse_duration


def _duration(value, field: str) -> int:
    """A duration in ps; a bare 0 needs no unit."""
    return 0 if str(value).strip() == "0" else parse_duration(value, field)


@dataclass(frozen=True)
class Capture:
    """What ``simulate(..., pcap=Capture(...))`` and ``inalab simulate --pcap`` write.

    - ``dir``: the directory for the files (created if missing); one ``POINT.pcapng`` per
      capture point.
    - ``at``: capture points. A node's name (``h3``: every link of that host or switch),
      ``NODE:PORT`` (``s0:2``: one port, 0-based in the topology's order) or ``A-B``
      (``s0-s1``: the link or links between two adjacent nodes). Default: every host
      (at most 1,024 points).
    - ``job``: only packets of this job id (by the id its header carries). Default: all.
    - ``start``, ``end``: only packets leaving their port in ``[start, end)``, durations such
      as ``"2ms"`` from the start of the run. Default: the whole run.
    """

    dir: Union[str, Path]
    at: Sequence[str] = field(default_factory=tuple)
    job: Optional[int] = None
    start: Union[str, int, float, None] = None
    end: Union[str, int, float, None] = None

    def to_spec(self) -> dict:
        """The simulator's ``capture`` object (times in picoseconds); raises ConfigError."""
        if self.job is not None and (not isinstance(self.job, int) or isinstance(self.job, bool) or self.job < 0):
            raise ConfigError("capture.job", f"must be a job id (an integer >= 0), got {self.job!r}")
        at = [str(p) for p in self.at]
        if any(not p for p in at):
            raise ConfigError("capture.at", "an empty capture point; give node names (h0), NODE:PORT (s0:2) or A-B (s0-s1)")
        spec: dict = {"dir": str(Path(self.dir)), "at": at, "job": self.job, "start_ps": 0, "end_ps": None}
        if self.start is not None:
            spec["start_ps"] = _duration(self.start, "capture.start")
        if self.end is not None:
            spec["end_ps"] = _duration(self.end, "capture.end")
            if spec["end_ps"] <= spec["start_ps"]:
                raise ConfigError("capture.end", f"must be after capture.start, got {self.end!r}")
        return spec

    @classmethod
    def from_cli(cls, dir: Path, at: Optional[str], job: Optional[int], window: Optional[str]) -> "Capture":
        """From ``--pcap DIR --pcap-at A,B --pcap-job N --pcap-window START,END``."""
        start = end = None
        if window is not None:
            parts = window.split(",")
            if len(parts) != 2:
                raise ConfigError("--pcap-window", f"must be START,END (durations such as 0,5ms; either may be empty), got {window!r}")
            start, end = (p.strip() or None for p in parts)
        points = tuple(p.strip() for p in at.split(",")) if at else ()
        return cls(dir=dir, at=points, job=job, start=start, end=end)
