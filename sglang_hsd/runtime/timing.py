"""Wall-clock timing of a call: the one measurement loop the runtime's probes and the planners
share (``row_padding``'s few-row probes, ``hierarchy.measure`` / ``hierarchy.call_timer``)."""

from __future__ import annotations

import statistics
import time
from typing import Callable

__all__ = ["median_seconds"]


def median_seconds(call: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    """Median seconds of ``repeats`` timed calls of ``call``, after ``warmup`` untimed ones (the
    first call of a kernel pays its setup and cold caches)."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(statistics.median(times))
