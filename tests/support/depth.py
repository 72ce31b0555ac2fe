"""How far the property tests and the exhaustive split sweeps go: `TAPFIX_TEST_DEPTH`.

- `full` (the default, so `scripts/test` and `.ci/run`): each property test's example count as written, and
  every split of every sweep.
- `quick` (`scripts/test --quick` sets it): a quarter of each example count (at least 20, or the count if
  smaller), and the sweeps' two-piece splits at every fourth point (the point a text starts from moves with
  its seed, so the texts share the points between them), and one of a sweep's seeded draws where the full depth
  takes two (picked per case, so the cases share them). The one-character-per-delta split and the random
  splits stay: a split the quick run leaves out is one the full run takes.
- `thorough` (by hand or on a schedule): ten times each example count, every split.

Every test runs at every depth; only how many examples or splits it walks changes. The quick depth keeps the
quick tier inside its five minutes on a 2-core machine (issue 32); the full depth is what CI runs.
"""

from __future__ import annotations

import os

DEPTHS = ("quick", "full", "thorough")
DEPTH = os.environ.get("TAPFIX_TEST_DEPTH") or "full"
if DEPTH not in DEPTHS:
    raise ValueError(f"TAPFIX_TEST_DEPTH={DEPTH!r}: one of {', '.join(DEPTHS)}")
QUICK_FLOOR = 20  # examples a quick run keeps at least
QUICK_STRIDE = 4  # a quick sweep takes every fourth two-piece split


def examples(count: int) -> int:
    """A property test's example count at this depth (`count` is the full depth's)."""
    if DEPTH == "quick":
        return max(min(count, QUICK_FLOOR), count // 4)
    if DEPTH == "thorough":
        return count * 10
    return count


def split_points(length: int, seed: int) -> range:
    """The points where a sweep cuts a text of `length` characters in two: every one inside it, or at a quick
    depth every fourth, starting where `seed` says."""
    if DEPTH != "quick":
        return range(1, length)
    return range(1 + seed % QUICK_STRIDE, length, QUICK_STRIDE)


def draws(count: int, key: int) -> list[int]:
    """Which of a sweep's `count` seeded draws a case takes: all of them, or at the quick depth one, picked by
    `key` (a case's index or checksum), so that the cases share the draws between them."""
    return list(range(count)) if DEPTH != "quick" else [key % count]
