"""OTLP metrics: the aggregation of `aggregate.py`, exported periodically by a thread of tapfix's own.

Imported only when export is on (it needs `tapfix[otel]`). Nothing is recorded here: the writer thread
records each exchange once into the aggregation `/tapfix/metrics` serves too, and every
`OTEL_METRIC_EXPORT_INTERVAL` ms (60 s by default) this thread turns a snapshot into the SDK's
`MetricsData` and hands it to the OTLP exporter. (The SDK's meter cost ~10-17 µs per recorded value,
~4 ms per 256-chunk stream; a snapshot per minute costs nothing per exchange.) Temporality is the
exporter's, from `OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`: cumulative (the default) with
the process's start as start time, or delta, the last exported snapshot subtracted.

A receiver that is down, or that takes traces only (Phoenix answers 404 on `/v1/metrics`; a gRPC one
UNIMPLEMENTED), must never break or flood anything: each failed export is counted, the first one is
logged once, and the SDK's own line per failure is swallowed (kept as `last_error` in health), for
the process's whole life: an export still retrying at exit logs once more after the shutdown.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.metrics import Counter as SdkCounter
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from tapfix.proxy.telemetry import semconv as sc
from tapfix.proxy.telemetry.aggregate import Aggregation, HistogramPoint, Snapshot
from tapfix.proxy.telemetry.config import EXIT_FLUSH_S, ExportConfig
from tapfix.proxy.telemetry.metrics import CURRENT, Catalogue, attributes

log = logging.getLogger("tapfix.telemetry")
# Where the OTLP exporters log each failure: the HTTP metric exporter's own logger, and the gRPC
# exporters' shared one (whose metric lines say "metrics"; its span lines are not ours to touch).
_HTTP_LOGGER = "opentelemetry.exporter.otlp.proto.http.metric_exporter"
_GRPC_LOGGER = "opentelemetry.exporter.otlp.proto.grpc.exporter"


class _Swallow(logging.Filter):
    """Drops every line of the exporter's logger (the spans' export silences them too) and keeps the
    last one about metrics as the reason a metrics export failed."""

    def __init__(self, only_metrics: bool) -> None:
        super().__init__()
        self.only_metrics = only_metrics
        self.last: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not self.only_metrics or "metrics" in message:
            self.last = message[:300]
        return False


_swallowed: list[tuple[str, _Swallow]] = []


def _swallow_sdk_lines() -> list[tuple[str, _Swallow]]:
    """The exporters' loggers silenced for the rest of the process (installed once, never removed): an
    export still retrying when tapfix shuts the exporter down logs once more ("Shutdown in progress,
    aborting retry.") from its own thread, after any shutdown step that took the filters away."""
    if not _swallowed:
        for name, swallow in (
            (_HTTP_LOGGER, _Swallow(only_metrics=False)),
            (_GRPC_LOGGER, _Swallow(only_metrics=True)),
        ):
            logger = logging.getLogger(name)
            logger.setLevel(logging.WARNING)  # reach the filter even where a parent logger is silenced
            logger.addFilter(swallow)
            _swallowed.append((name, swallow))
    return _swallowed


class CountingExporter(MetricExporter):
    """Wraps the OTLP exporter: never raises into the export thread, counts, logs the first failure."""

    def __init__(self, inner: MetricExporter, endpoint: str) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self.inner = inner
        self.endpoint = endpoint
        self.exports = 0
        self.failures = 0
        self.last_error: str | None = None
        self.closing = False  # set before the flush at exit
        self._last_failed = False
        self._filters = _swallow_sdk_lines()
        for _, swallow in self._filters:
            swallow.last = None  # this exporter's failures only

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        if self.closing and self._last_failed:  # a receiver that failed the last time: don't hold the exit
            self.failures += 1
            return MetricExportResult.FAILURE
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis)
            reason = None
        except Exception as e:  # noqa: BLE001 - an exporter's bug must not end the export thread
            result, reason = MetricExportResult.FAILURE, f"{type(e).__name__}: {e}"
        self._last_failed = result is not MetricExportResult.SUCCESS
        if not self._last_failed:
            self.exports += 1
            return result
        self.failures += 1
        self.last_error = reason or next((f.last for _, f in self._filters if f.last), None) or "export failed"
        if self.failures == 1:
            log.warning(
                "OTLP metrics export to %s failed (%s); traffic is unaffected, further failures are only counted "
                "(/tapfix/health: telemetry.otlp_metrics)",
                self.endpoint,
                self.last_error,
            )
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis)

    def health(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "exports": self.exports,
            "failures": self.failures,
            "last_error": self.last_error,
        }


def otlp_exporter(export: ExportConfig) -> CountingExporter:
    """The OTLP metric exporter `export` names: http/protobuf at its metrics URL, or gRPC; with the
    metrics' own protocol, headers and timeout where OTEL_EXPORTER_OTLP_METRICS_* set them."""
    signal = export.signal("metrics")
    inner: MetricExporter
    if signal.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        inner = GrpcExporter(
            endpoint=signal.endpoint,
            insecure=signal.endpoint.startswith("http://"),
            headers=dict(signal.headers),
            timeout=signal.timeout_s,
        )
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

        inner = HttpExporter(endpoint=signal.endpoint, headers=dict(signal.headers), timeout=signal.timeout_s)
    return CountingExporter(inner, signal.endpoint)


DEFAULT_INTERVAL_S = 60.0  # OTEL_METRIC_EXPORT_INTERVAL's default, 60 000 ms
NANOS = 1_000_000_000


def export_interval(env: Mapping[str, str]) -> float:
    """OTEL_METRIC_EXPORT_INTERVAL (milliseconds) in seconds; a value that is no positive number is the default."""
    try:
        interval = float(env.get("OTEL_METRIC_EXPORT_INTERVAL", "")) / 1000
    except ValueError:
        return DEFAULT_INTERVAL_S
    return interval if interval > 0 else DEFAULT_INTERVAL_S


def metrics_data(
    now: Snapshot,
    last: Snapshot | None,
    started: float,
    delta: Mapping[str, bool],
    resource: Resource,
    catalogue: Catalogue = CURRENT,
) -> MetricsData:
    """One export of the catalogue from `now`. A kind ("counter", "histogram") that `delta` marks gets
    `now - last` over the time since `last.taken` (a series unchanged since is left out), every other
    the totals since `started`. An instrument without a series is left out, as the SDK does."""
    at = int(now.taken * NANOS)
    metrics: list[Metric] = []
    for inst in catalogue.instruments:
        is_delta = delta.get(inst.kind, False)
        before = last if is_delta else None
        start = int((before.taken if before is not None else started) * NANOS)
        temporality = AggregationTemporality.DELTA if is_delta else AggregationTemporality.CUMULATIVE
        data: Sum | Histogram | Gauge
        if inst.kind == "counter":
            previous = before.counters[inst] if before is not None else {}
            sums = [
                NumberDataPoint(attributes(inst, key), start, at, value - previous.get(key, 0))
                for key, value in now.counters[inst].items()
                if previous.get(key) != value
            ]
            data = Sum(sums, temporality, is_monotonic=True)
        elif inst.kind == "histogram":
            earlier = before.histograms[inst] if before is not None else {}
            points = []
            for key, point in now.histograms[inst].items():
                was = earlier.get(key)
                if was is None or was.count != point.count:
                    points.append(_histogram_point(attributes(inst, key), point, was, start, at, inst.buckets or ()))
            data = Histogram(points, temporality)
        elif inst in now.gauges:
            data = Gauge([NumberDataPoint({}, start, at, now.gauges[inst])])
        else:
            continue
        if data.data_points:
            metrics.append(Metric(inst.name, inst.description, inst.unit, data))
    schema = sc.LEGACY_SCHEMA_URL if catalogue.naming == sc.LEGACY else sc.SCHEMA_URL
    scope = ScopeMetrics(InstrumentationScope(sc.INSTRUMENTATION_SCOPE, None, schema), metrics, schema)
    return MetricsData([ResourceMetrics(resource, [scope], resource.schema_url)])


def _histogram_point(
    attrs: dict[str, str],
    now: HistogramPoint,
    was: HistogramPoint | None,
    start: int,
    at: int,
    bounds: tuple[float, ...],
) -> HistogramDataPoint:
    """`now`, or `now - was` (a delta): its min and max are then unknown and left out, unless the
    series is new since the last export."""
    if was is None:
        return HistogramDataPoint(attrs, start, at, now.count, now.sum, now.bucket_counts, bounds, now.min, now.max)
    buckets = [n - m for n, m in zip(now.bucket_counts, was.bucket_counts, strict=True)]
    unknown: Any = None  # OTLP's min and max are optional; the SDK's dataclass types them float
    return HistogramDataPoint(
        attrs, start, at, now.count - was.count, now.sum - was.sum, buckets, bounds, unknown, unknown
    )


class OtlpMetrics:
    """The export thread: a snapshot of the aggregation every `interval_s`, exported; one export at a
    time (the thread's, `export_now`'s, the flush at exit)."""

    def __init__(
        self, aggregation: Aggregation, exporter: CountingExporter, resource: Resource, interval_s: float
    ) -> None:
        self.aggregation = aggregation
        self.exporter = exporter
        self.resource = resource
        self.interval_s = interval_s
        self.timeout_ms = 10_000.0
        preferred = exporter._preferred_temporality or {}
        self.delta = {
            "counter": preferred.get(SdkCounter) is AggregationTemporality.DELTA,
            "histogram": preferred.get(SdkHistogram) is AggregationTemporality.DELTA,
        }
        self._last: Snapshot | None = None  # the last snapshot exported (delta subtracts it)
        self._exporting = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tapfix-otlp-metrics", daemon=True)
        self._closed = False

    @classmethod
    def exporting(
        cls, aggregation: Aggregation, export: ExportConfig, env: Mapping[str, str] | None = None
    ) -> OtlpMetrics:
        """Exporting over OTLP every OTEL_METRIC_EXPORT_INTERVAL ms, its thread started."""
        from tapfix.proxy.telemetry.spans import resource_of

        metrics = cls(
            aggregation, otlp_exporter(export), resource_of(export), export_interval(os.environ if env is None else env)
        )
        metrics.timeout_ms = export.signal("metrics").timeout_s * 1000
        metrics._thread.start()
        return metrics

    def _run(self) -> None:
        failed = False
        while not self._stop.wait(self.interval_s):
            try:
                self.export_now()
            except Exception:  # noqa: BLE001 - a bug building the export must not end the thread; said once
                if not failed:
                    log.exception("OTLP metrics: building an export failed (the export thread keeps going)")
                failed = True

    def export_now(self, timeout_ms: float | None = None) -> bool:
        """Take a snapshot and export it now, within `timeout_ms` (default: the export timeout) including
        a wait for an export in progress; true when the receiver took it."""
        timeout_ms = self.timeout_ms if timeout_ms is None else timeout_ms
        if not self._exporting.acquire(timeout=timeout_ms / 1000):
            return False
        try:
            snapshot = self.aggregation.snapshot()
            catalogue = self.aggregation.catalogue
            data = metrics_data(snapshot, self._last, self.aggregation.started, self.delta, self.resource, catalogue)
            result = self.exporter.export(data, timeout_millis=timeout_ms)
            if result is MetricExportResult.SUCCESS:  # a failed delta is sent again, in the next one
                self._last = snapshot
            return result is MetricExportResult.SUCCESS
        finally:
            self._exporting.release()

    def shutdown(self) -> None:
        """Stop the thread, export what is left, close the exporter (at exit, after the writer drained);
        the last export is skipped when the receiver failed the one before (`CountingExporter.closing`):
        retrying one that is down would hold the exit for the whole export timeout."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self.exporter.closing = True
        try:
            self.export_now(min(self.timeout_ms, EXIT_FLUSH_S * 1000))
        finally:
            self.exporter.shutdown()

    def health(self) -> dict[str, Any]:
        return self.exporter.health()
