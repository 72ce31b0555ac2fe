"""tapfix's one aggregation of its metrics: every exchange recorded once, read by Prometheus and OTLP.

Recording each value into prometheus_client and into the OpenTelemetry SDK's meter cost ~2 µs and
~10-17 µs per value, and the per-chunk histogram takes ~255 values per 256-chunk stream: milliseconds
per exchange on the writer thread. Here an exchange's values for one series land in one call
(`record_many`): a stream's chunk intervals are sorted once (in C) and each bucket boundary is found by
bisection, so the per-value cost is a share of one sort, not a Python call. A scrape
(`prometheus.py`) and the OTLP exporter (`otel_metrics.py`) read `snapshot()` copies from their own
threads: each instrument has its lock, held only to add or to copy, never during rendering or I/O.

Pure: no prometheus_client, no opentelemetry.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tapfix.proxy.telemetry.metrics import CURRENT, Catalogue, Instrument, Labeller, key_of, observations
from tapfix.proxy.telemetry.turn import Turn

Key = tuple[str | None, ...]  # a series: its label values in the instrument's label order (None: unknown)
_SORT_FROM = 8  # fewer values than this: one bisection each beats a sort


@dataclass(frozen=True, slots=True)
class HistogramPoint:
    """One histogram series: `bucket_counts[i]` counts values in (bounds[i-1], bounds[i]] (OTLP's
    explicit buckets; the last one is (bounds[-1], +Inf)), not cumulative."""

    bucket_counts: tuple[int, ...]
    count: int
    sum: float
    min: float
    max: float


class CounterAggregate:
    """A monotonic sum per series."""

    __slots__ = ("instrument", "_lock", "_sums")

    def __init__(self, instrument: Instrument) -> None:
        self.instrument = instrument
        self._lock = threading.Lock()
        self._sums: dict[Key, float] = {}

    def record_many(self, key: Key, values: Sequence[float]) -> None:
        added = sum(values)
        with self._lock:
            self._sums[key] = self._sums.get(key, 0) + added

    def snapshot(self) -> dict[Key, float]:
        with self._lock:
            return dict(self._sums)


class _Series:
    """One histogram series as it grows; written only under its instrument's lock."""

    __slots__ = ("count", "sum", "min", "max", "buckets")

    def __init__(self, count: int, total: float, low: float, high: float, buckets: list[int]) -> None:
        self.count, self.sum, self.min, self.max, self.buckets = count, total, low, high, buckets


class HistogramAggregate:
    """Explicit-bucket histograms per series: bucket counts, count, sum, min and max."""

    __slots__ = ("instrument", "bounds", "_lock", "_series")

    def __init__(self, instrument: Instrument, bounds: Sequence[float]) -> None:
        self.instrument = instrument
        self.bounds = tuple(bounds)
        self._lock = threading.Lock()
        self._series: dict[Key, _Series] = {}

    def record_many(self, key: Key, values: Sequence[float]) -> None:
        if not values:
            return
        bounds, buckets = self.bounds, [0] * (len(self.bounds) + 1)
        if len(values) < _SORT_FROM:
            for value in values:
                buckets[bisect_left(bounds, value)] += 1
            low, high = min(values), max(values)
        else:  # one sort, then how many values are <= each bound: B bisections for N values
            ordered = sorted(values)
            below = 0
            for i, bound in enumerate(bounds):
                upto = bisect_right(ordered, bound, below)
                buckets[i], below = upto - below, upto
            buckets[-1] = len(ordered) - below
            low, high = ordered[0], ordered[-1]
        total = sum(values)
        with self._lock:
            series = self._series.get(key)
            if series is None:
                self._series[key] = _Series(len(values), total, low, high, buckets)
                return
            series.count += len(values)
            series.sum += total
            series.min = min(series.min, low)
            series.max = max(series.max, high)
            counts = series.buckets
            for i, n in enumerate(buckets):
                if n:
                    counts[i] += n

    def snapshot(self) -> dict[Key, HistogramPoint]:
        with self._lock:
            copied = [(key, tuple(s.buckets), s.count, s.sum, s.min, s.max) for key, s in self._series.items()]
        return {key: HistogramPoint(b, n, total, low, high) for key, b, n, total, low, high in copied}


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every instrument's series at one moment (`taken`, epoch seconds), for one scrape or export."""

    taken: float
    counters: dict[Instrument, dict[Key, float]]
    histograms: dict[Instrument, dict[Key, HistogramPoint]]
    gauges: dict[Instrument, float]


class Aggregation:
    """A `TurnFanout` sink: the catalogue's counters and histograms, fed `observations(turn)` on the
    writer thread; gauges (the write queue's depth) are read when a snapshot is taken, never pushed."""

    def __init__(
        self,
        labeller: Labeller,
        gauges: dict[Instrument, Callable[[], float]] | None = None,
        catalogue: Catalogue = CURRENT,
    ) -> None:
        self.labeller = labeller
        self.catalogue = catalogue
        self.started = time.time()  # the start of every cumulative series
        self.gauges = dict(gauges or {})
        instruments = catalogue.instruments
        self.counters = {i: CounterAggregate(i) for i in instruments if i.kind == "counter"}
        self.histograms = {i: HistogramAggregate(i, i.buckets or ()) for i in instruments if i.kind == "histogram"}
        self._record: dict[Instrument, Callable[[Key, Sequence[float]], None]] = {
            **{i: a.record_many for i, a in self.counters.items()},
            **{i: a.record_many for i, a in self.histograms.items()},
        }

    def __call__(self, turn: Turn) -> None:
        for inst, values, labels in observations(turn, self.labeller, self.catalogue):
            self._record[inst](key_of(inst, labels), values)

    def snapshot(self) -> Snapshot:
        gauges: dict[Instrument, float] = {}
        for inst, read in self.gauges.items():
            try:
                gauges[inst] = float(read())
            except Exception:  # noqa: BLE001 - a gauge that can't be read is left out, never a failed scrape
                continue
        return Snapshot(
            time.time(),
            {i: a.snapshot() for i, a in self.counters.items()},
            {i: a.snapshot() for i, a in self.histograms.items()},
            gauges,
        )
