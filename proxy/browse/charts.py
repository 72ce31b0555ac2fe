"""Inline SVG pictures, drawn on the server: a stream's timeline and small histograms.

No scripts and no style attributes (the Content-Security-Policy forbids inline styles): colours are
presentation attributes and CSS classes from the static stylesheet. Every text is escaped.
"""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape
from typing import Any

STALL_MS = 1000.0  # a gap this long is a stall whatever the stream's pace
STALL_FACTOR = 10.0  # ... and so is one this many times the median gap,
STALL_FLOOR_MS = 250.0  # if it is at least this long (10x a 3 ms median is jitter, not a stall)


@dataclass
class StreamTiming:
    chunks: int = 0
    size: int = 0
    end_ms: float = 0.0
    ttft_ms: float | None = None
    first_byte_ms: float | None = None
    median_gap_ms: float | None = None
    stalls: list[tuple[float, float]] = field(default_factory=list)
    chunks_per_s: float | None = None
    tokens_per_s: float | None = None


def analyze(
    points: list[tuple[float, int]],
    *,
    ttft_ms: float | None = None,
    first_byte_ms: float | None = None,
    duration_ms: float | None = None,
    completion_tokens: int | None = None,
) -> StreamTiming:
    t = StreamTiming(chunks=len(points), size=sum(s for _, s in points), ttft_ms=ttft_ms, first_byte_ms=first_byte_ms)
    offsets = [o for o, _ in points]
    t.end_ms = max([duration_ms or 0.0, *offsets, 1.0])
    gaps = [(a, b) for a, b in zip(offsets, offsets[1:], strict=False)]
    if gaps:
        t.median_gap_ms = statistics.median(b - a for a, b in gaps)
        limit = min(STALL_MS, max(STALL_FLOOR_MS, STALL_FACTOR * t.median_gap_ms))
        t.stalls = [(a, b) for a, b in gaps if b - a > limit]
    start = ttft_ms if ttft_ms is not None else (offsets[0] if offsets else None)
    if start is not None and offsets and offsets[-1] - start > 1:
        span_s = (offsets[-1] - start) / 1000
        t.chunks_per_s = sum(1 for o in offsets if o > start) / span_s
        if completion_tokens:
            t.tokens_per_s = max(completion_tokens - 1, 1) / span_s
    return t


def _fmt_ms(ms: float) -> str:
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.0f} ms"


def timeline_svg(points: list[tuple[float, int]], timing: StreamTiming, width: int = 880, height: int = 220) -> str:
    """Chunks over time: the cumulative count as a step line, one tick per chunk, TTFT and stalls marked."""
    left, right, top, bottom = 52, 28, 14, 34
    pw, ph = width - left - right, height - top - bottom
    total = max(len(points), 1)

    def x(ms: float) -> float:
        return round(left + pw * ms / timing.end_ms, 1)

    def y(n: float) -> float:
        return round(top + ph - ph * n / total, 1)

    out = [
        f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}"'
        f' width="{width}" height="{height}" role="img" aria-label="stream timeline">',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fbfbfd" stroke="#ccd"/>',
    ]
    for a, b in timing.stalls:
        out.append(
            f'<rect class="stall" x="{x(a)}" y="{top}" width="{max(x(b) - x(a), 1)}" height="{ph}"'
            f' fill="#f8d0d0"><title>stall: {escape(_fmt_ms(b - a))} without a chunk</title></rect>'
        )
    for i in range(5):
        ms = timing.end_ms * i / 4
        out.append(
            f'<line x1="{x(ms)}" y1="{top + ph}" x2="{x(ms)}" y2="{top + ph + 4}" stroke="#667"/>'
            f'<text x="{x(ms)}" y="{height - 16}" font-size="11" text-anchor="middle"'
            f' fill="#445">{escape(_fmt_ms(ms))}</text>'
        )
    out.append(
        f'<text x="{left - 6}" y="{top + 10}" font-size="11" text-anchor="end" fill="#445">{total}</text>'
        f'<text x="{left - 6}" y="{top + ph}" font-size="11" text-anchor="end" fill="#445">0</text>'
        f'<text x="14" y="{top + ph / 2}" font-size="11" fill="#445" text-anchor="middle"'
        f' transform="rotate(-90 14 {top + ph / 2})">chunks</text>'
    )
    step = max(1, len(points) // 1500)  # keep the picture small for very long streams
    coords = [f"{x(0)},{y(0)}"]
    for i in range(0, len(points), step):
        ms = points[i][0]
        coords.append(f"{x(ms)},{y(i)} {x(ms)},{y(i + 1)}")
    if points:
        coords.append(f"{x(points[-1][0])},{y(len(points))} {x(timing.end_ms)},{y(len(points))}")
        ticks = "".join(f"M{x(o)} {top + ph}v-6" for o, _ in points[::step])
        out.append(f'<path class="ticks" d="{ticks}" stroke="#99a" stroke-width="1"/>')
    out.append(
        f'<polyline class="cumulative" points="{" ".join(coords)}" fill="none" stroke="#2b59c3" stroke-width="1.5"/>'
    )
    markers: list[tuple[float | None, str, str, str]] = [
        (timing.first_byte_ms, "first byte", "#888", "4 3"),
        (timing.ttft_ms, "TTFT", "#0a7d32", ""),
    ]
    for at, label, colour, dash in markers:
        if at is None:
            continue
        text = f"{label} {_fmt_ms(at)}"
        anchor = "start" if x(at) < left + pw * 0.8 else "end"
        dy = 12 if label == "TTFT" else 24
        out.append(
            f'<line class="marker" x1="{x(at)}" y1="{top}" x2="{x(at)}" y2="{top + ph}" stroke="{colour}"'
            + (f' stroke-dasharray="{dash}"' if dash else "")
            + "/>"
            f'<text x="{x(at) + (3 if anchor == "start" else -3)}" y="{top + dy}" font-size="11"'
            f' text-anchor="{anchor}" fill="{colour}">{escape(text)}</text>'
        )
    out.append(
        f'<text x="{left + pw}" y="{height - 2}" font-size="11" text-anchor="end" fill="#445">time since the'
        f" request arrived</text></svg>"
    )
    return "".join(out)


def histogram_svg(
    values: list[float], *, unit: str, label: str, bins: int = 30, width: int = 420, height: int = 150
) -> str:
    """A small histogram, clipped at the 99th percentile (the last bar holds everything above)."""
    if not values:
        return f'<p class="muted">no {escape(label)} data</p>'
    ordered = sorted(values)
    lo = ordered[0]
    hi = ordered[min(len(ordered) - 1, int(0.99 * (len(ordered) - 1)))]
    if hi <= lo:
        hi = lo + 1
    counts = [0] * bins
    for v in ordered:
        counts[min(bins - 1, max(0, int((v - lo) / (hi - lo) * bins)))] += 1
    left, bottom, top = 8, 30, 16
    pw, ph = width - 2 * left, height - top - bottom
    peak = max(counts)
    bar = pw / bins
    out = [
        f'<svg class="histogram" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}"'
        f' width="{width}" height="{height}" role="img" aria-label="{escape(label)} distribution">',
        f'<text x="{left}" y="11" font-size="11" fill="#223">{escape(label)} (n={len(values)})</text>',
    ]
    for i, n in enumerate(counts):
        h = ph * n / peak
        start = lo + (hi - lo) * i / bins
        end = lo + (hi - lo) * (i + 1) / bins
        out.append(
            f'<rect x="{left + i * bar + 0.5:.1f}" y="{top + ph - h:.1f}" width="{max(bar - 1, 1):.1f}"'
            f' height="{h:.1f}" fill="#2b59c3"><title>{start:.0f}–{end:.0f} {escape(unit)}: {n}'
            "</title></rect>"
        )
    median = ordered[len(ordered) // 2]
    mx = left + pw * min(1.0, (median - lo) / (hi - lo))
    out.append(
        f'<line x1="{mx:.1f}" y1="{top}" x2="{mx:.1f}" y2="{top + ph}" stroke="#0a7d32"'
        ' stroke-dasharray="3 2"/>'
        f'<text x="{left}" y="{height - 14}" font-size="11" fill="#445">{lo:.0f}</text>'
        f'<text x="{left + pw / 2}" y="{height - 14}" font-size="11" text-anchor="middle"'
        f' fill="#0a7d32">median {median:.0f} {escape(unit)}</text>'
        f'<text x="{left + pw}" y="{height - 14}" font-size="11" text-anchor="end"'
        f' fill="#445">{hi:.0f}+ {escape(unit)}</text></svg>'
    )
    return "".join(out)


PALETTE = ("#2b59c3", "#e08a1e", "#0a7d32", "#b0336b", "#6b4fbb", "#1f8f9e", "#8a6d1e", "#c24a2b")
MAX_BARS = 96  # hours beyond this are drawn in bins of several hours


@dataclass
class Hourly:
    """`volume_by_hour` rows (store/volume.py) as bars: hours from the first to the last (empty ones too),
    binned so there are at most MAX_BARS; per bar the tokens of each route and of local upstreams."""

    start: int = 0  # unix seconds of the first bar
    hours_per_bar: int = 1
    routes: list[str] = field(default_factory=list)  # the routes, most tokens first; "-" is no route
    tokens: list[dict[str, int]] = field(default_factory=list)  # per bar: route → tokens
    local: list[int] = field(default_factory=list)  # per bar: tokens that went to a local upstream
    total_local: int = 0
    total: int = 0


def hourly(rows: list[dict[str, Any]], is_local: Callable[[str | None], bool]) -> Hourly:
    h = Hourly()
    if not rows:
        return h
    hours = [int(r["hour"]) for r in rows]
    h.start = min(hours)
    span = (max(hours) - h.start) // 3600 + 1
    h.hours_per_bar = -(-span // MAX_BARS)
    bars = -(-span // h.hours_per_bar)
    h.tokens = [{} for _ in range(bars)]
    h.local = [0] * bars
    by_route: dict[str, int] = {}
    for r, hour in zip(rows, hours, strict=True):
        bar, route, tokens = (hour - h.start) // 3600 // h.hours_per_bar, str(r["route"] or "-"), int(r["tokens"])
        h.tokens[bar][route] = h.tokens[bar].get(route, 0) + tokens
        by_route[route] = by_route.get(route, 0) + tokens
        if is_local(r["upstream"]):
            h.local[bar] += tokens
            h.total_local += tokens
        h.total += tokens
    h.routes = sorted(by_route, key=lambda name: (-by_route[name], name))
    return h


def _hour(ts: int) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M")


def _bar_label(h: Hourly, i: int) -> str:
    start = h.start + i * h.hours_per_bar * 3600
    return _hour(start) if h.hours_per_bar == 1 else f"{_hour(start)} +{h.hours_per_bar}h"


def route_tokens_svg(h: Hourly, width: int = 880, height: int = 220) -> str:
    """Tokens (input + output) per route per hour, stacked bars; each segment's title has its numbers."""
    if not h.tokens:
        return '<p class="muted">no token data</p>'
    left, right, top, bottom = 64, 12, 14, 40
    pw, ph = width - left - right, height - top - bottom
    peak = max(max(sum(bar.values()) for bar in h.tokens), 1)
    bar_w = pw / len(h.tokens)
    colour = {route: PALETTE[i % len(PALETTE)] for i, route in enumerate(h.routes)}
    out = [
        f'<svg class="route-tokens" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}"'
        f' width="{width}" height="{height}" role="img" aria-label="tokens per route per hour">',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fbfbfd" stroke="#ccd"/>',
        f'<text x="{left - 6}" y="{top + 10}" font-size="11" text-anchor="end" fill="#445">{peak:,}</text>'
        f'<text x="{left - 6}" y="{top + ph}" font-size="11" text-anchor="end" fill="#445">0</text>',
    ]
    for i, bar in enumerate(h.tokens):
        y = float(top + ph)
        for route in h.routes:
            tokens = bar.get(route, 0)
            if not tokens:
                continue
            size = ph * tokens / peak
            y -= size
            out.append(
                f'<rect class="segment" x="{left + i * bar_w + 0.5:.1f}" y="{y:.1f}" width="{max(bar_w - 1, 1):.1f}"'
                f' height="{size:.1f}" fill="{colour[route]}"><title>{escape(_bar_label(h, i))} UTC'
                f" {escape(route)}: {tokens:,} tokens</title></rect>"
            )
    out.append(
        f'<text x="{left}" y="{height - 24}" font-size="11" fill="#445">{escape(_hour(h.start))}</text>'
        f'<text x="{left + pw}" y="{height - 24}" font-size="11" text-anchor="end" fill="#445">'
        f"{escape(_bar_label(h, len(h.tokens) - 1))} UTC</text>"
    )
    x = left
    for route in h.routes[: len(PALETTE)]:
        out.append(
            f'<rect x="{x}" y="{height - 12}" width="10" height="10" fill="{colour[route]}"/>'
            f'<text x="{x + 14}" y="{height - 3}" font-size="11" fill="#223">{escape(route)}</text>'
        )
        x += 24 + 7 * len(route)
    out.append("</svg>")
    return "".join(out)


def local_share_svg(h: Hourly, width: int = 880, height: int = 160) -> str:
    """The share of each hour's tokens that went to a local upstream, 0-100 %."""
    if not h.total:
        return '<p class="muted">no token data</p>'
    left, right, top, bottom = 64, 12, 14, 26
    pw, ph = width - left - right, height - top - bottom
    bar_w = pw / len(h.tokens)
    out = [
        f'<svg class="local-share" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}"'
        f' width="{width}" height="{height}" role="img" aria-label="share of tokens served locally">',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fbfbfd" stroke="#ccd"/>',
        f'<text x="{left - 6}" y="{top + 10}" font-size="11" text-anchor="end" fill="#445">100%</text>'
        f'<text x="{left - 6}" y="{top + ph}" font-size="11" text-anchor="end" fill="#445">0%</text>',
    ]
    for i, bar in enumerate(h.tokens):
        total = sum(bar.values())
        if not total:
            continue
        share = h.local[i] / total
        size = ph * share
        out.append(
            f'<rect class="share" x="{left + i * bar_w + 0.5:.1f}" y="{top + ph - size:.1f}"'
            f' width="{max(bar_w - 1, 1):.1f}" height="{size:.1f}" fill="#0a7d32"><title>{escape(_bar_label(h, i))}'
            f" UTC: {share:.0%} local ({h.local[i]:,} of {total:,} tokens)</title></rect>"
        )
    out.append(
        f'<text x="{left}" y="{height - 8}" font-size="11" fill="#445">{escape(_hour(h.start))}</text>'
        f'<text x="{left + pw}" y="{height - 8}" font-size="11" text-anchor="end" fill="#445">'
        f"{escape(_bar_label(h, len(h.tokens) - 1))} UTC</text></svg>"
    )
    return "".join(out)
