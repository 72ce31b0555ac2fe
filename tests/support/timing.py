"""The best of a few timed runs: what the linear-time tests and bench/repair.py compare."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def best_of(fn: Callable[[], Any], runs: int = 3) -> float:
    """The fastest of `runs` calls, in seconds of this thread's CPU: the least disturbed by whatever else the
    machine runs (wall time let a loaded CI machine stretch one call of a linear-time check past its bound)."""
    best = float("inf")
    for _ in range(runs):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best
