"""The quick depth (tests/support/depth.py) cuts what it says and nothing else, and every property test of the
quick tiers goes through it: a count written as a bare number would run in full in `scripts/test --quick`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import depth

TESTS = Path(__file__).resolve().parents[1]
BARE_COUNT = re.compile(r"max_examples=\d")
KEPT = "Not cut at the quick depth"  # a comment just above a bare count says why it stays whole


def test_every_example_count_of_the_quick_tiers_goes_through_the_depth() -> None:
    bare = []
    for path in sorted([*(TESTS / "unit").rglob("*.py"), *(TESTS / "inproc").rglob("*.py")]):
        lines = path.read_text().splitlines()
        for n, line in enumerate(lines):
            if BARE_COUNT.search(line) and not any(KEPT in above for above in lines[max(0, n - 4) : n]):
                bare.append(f"{path.relative_to(TESTS)}:{n + 1}")
    assert not bare, f"write max_examples=examples(N) (tests/support/depth.py): {bare}"


@pytest.mark.parametrize(
    ("at", "count", "want"),
    [("full", 800, 800), ("quick", 800, 200), ("quick", 60, 20), ("quick", 5, 5), ("thorough", 30, 300)],
)
def test_an_example_count_at_each_depth(monkeypatch: pytest.MonkeyPatch, at: str, count: int, want: int) -> None:
    monkeypatch.setattr(depth, "DEPTH", at)
    assert depth.examples(count) == want


def test_the_quick_sweep_takes_every_fourth_point_and_the_seeds_cover_them_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(depth, "DEPTH", "full")
    assert list(depth.split_points(10, 7)) == list(range(1, 10))
    assert depth.draws(2, 5) == [0, 1]
    monkeypatch.setattr(depth, "DEPTH", "quick")
    quick = [set(depth.split_points(40, seed)) for seed in range(depth.QUICK_STRIDE)]
    assert all(len(points) <= 10 for points in quick)
    assert set().union(*quick) == set(range(1, 40))  # the seeds between them take every point
    assert {depth.draws(2, key)[0] for key in range(2)} == {0, 1}
