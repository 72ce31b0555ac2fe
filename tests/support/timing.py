"""The best of a few timed runs: what the linear-time tests and bench/repair.py compare."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def best_of(fn: Callable[[], Any], runs: int = 3) -> float:
    """The fastest of `runs` calls, in seconds: the least disturbed by whatever else the machine runs."""
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
