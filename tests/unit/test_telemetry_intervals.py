"""The chunk intervals of a Turn (the per-chunk histogram's values) are each gap between arrivals, never below
0; computed in C when no gap is negative (issue 34), they must be what the per-gap `max` gave."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.telemetry.turn import _intervals

TIME = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1e-9, 0.5])


@given(st.lists(TIME, max_size=12))
def test_each_gap_never_below_zero(times: list[float]) -> None:
    expected = tuple(max(b - a, 0.0) for a, b in zip(times, times[1:], strict=False))
    got = _intervals(times)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert (math.isnan(g) and math.isnan(e)) or (g == e and math.copysign(1, g) == math.copysign(1, e))


def test_arrivals_in_order() -> None:
    assert _intervals([0.1, 0.15, 0.25, 0.25]) == (0.15 - 0.1, 0.25 - 0.15, 0.0)
    assert _intervals([0.2]) == () and _intervals([]) == ()
