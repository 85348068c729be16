"""Peak-throughput aggregators (PTA, ATP §5.4.1), measured the way the paper tunes them."""
from __future__ import annotations

from typing import Callable


def static_need(throughput: Callable[[int], float], full: float, hi: int, tol: float = 0.02) -> int:
    """The fewest aggregators a job needs for its peak throughput under static allocation.

    ``throughput(n)`` runs the job alone with a static slice of ``n`` aggregators and ``n``
    slots (so its window is the slice, SwitchML's static baseline); ``full`` is its throughput
    with an ample pool; ``hi`` a slice known to reach it. Bisects for the smallest slice whose
    throughput is within ``tol`` of ``full`` (the paper: "the minimum number needed to get
    maximal training throughput for each job with the static approach").
    """
    lo = 1
    while lo < hi:
        mid = (lo + hi) // 2
        if throughput(mid) >= (1 - tol) * full:
            hi = mid
        else:
            lo = mid + 1
    return hi
