"""Timeline analysis (TTFT, stalls, decode rate) and the SVG it draws."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.browse.charts import analyze, histogram_svg, timeline_svg


def steady(n: int, start: float = 100.0, gap: float = 20.0) -> list[tuple[float, int]]:
    return [(start + gap * i, 30) for i in range(n)]


def test_steady_stream_has_no_stall() -> None:
    t = analyze(steady(50), ttft_ms=100.0, duration_ms=1100.0, completion_tokens=50)
    assert t.stalls == [] and t.median_gap_ms == 20.0
    assert t.tokens_per_s == pytest.approx(49 / 0.98)
    assert t.chunks_per_s == pytest.approx(49 / 0.98)


@pytest.mark.parametrize(("gap", "stalled"), [(1500.0, True), (300.0, True), (150.0, False)])
def test_stall_thresholds(gap: float, stalled: bool) -> None:
    points = steady(10) + [(100 + 20 * 9 + gap, 30)] + steady(10, start=100 + 20 * 9 + gap + 20)
    t = analyze(points, ttft_ms=100.0)
    assert bool(t.stalls) is stalled


def test_slow_steady_stream_stalls_only_past_a_second() -> None:
    t = analyze(steady(10, gap=400.0) + [(100 + 400 * 9 + 1200, 5)], ttft_ms=100.0)
    assert len(t.stalls) == 1 and t.stalls[0][1] - t.stalls[0][0] == pytest.approx(1200)


def test_timeline_is_well_formed_svg() -> None:
    points = steady(30) + steady(10, start=3000)
    t = analyze(points, ttft_ms=100.0, first_byte_ms=40.0, duration_ms=3300.0)
    svg = timeline_svg(points, t)
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg")
    assert "TTFT 100 ms" in svg and "first byte 40 ms" in svg and svg.count('class="stall"') == 1
    assert "style=" not in svg and "<script" not in svg


def test_long_streams_are_downsampled() -> None:
    points = steady(20000, gap=1.0)
    svg = timeline_svg(points, analyze(points))
    assert len(svg) < 200_000


def test_histogram() -> None:
    svg = histogram_svg([float(v) for v in range(1, 1001)], unit="ms", label="TTFT <x>")
    ET.fromstring(svg)
    assert "TTFT &lt;x&gt;" in svg and "median 501 ms" in svg
    assert "no ttft data" in histogram_svg([], unit="ms", label="ttft")
    ET.fromstring(histogram_svg([5.0, 5.0], unit="ms", label="same"))


@given(
    st.lists(st.tuples(st.floats(0, 1e6, allow_nan=False), st.integers(0, 2**31)), max_size=60),
    st.none() | st.floats(0, 1e6, allow_nan=False),
    st.none() | st.integers(0, 10**6),
)
def test_any_timing_draws(points: list[tuple[float, int]], ttft: float | None, tokens: int | None) -> None:
    points = sorted(points)
    t = analyze(points, ttft_ms=ttft, duration_ms=None, completion_tokens=tokens)
    ET.fromstring(timeline_svg(points, t))
