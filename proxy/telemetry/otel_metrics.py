"""OTLP metrics: the catalogue of `metrics.py` as OpenTelemetry instruments, exported periodically.

Imported only when export is on (it needs `tapfix[otel]`). A `TurnFanout` sink like the Prometheus
recorder, fed the same `observations(turn)` on the writer thread; the SDK's reader thread collects and
exports every `OTEL_METRIC_EXPORT_INTERVAL` ms (60 s by default), off the hot path.

A receiver that is down, or that takes traces only (Phoenix answers 404 on `/v1/metrics`; a gRPC one
UNIMPLEMENTED), must never break or flood anything: each failed export is counted, the first one is
logged once, and the SDK's own line per failure is swallowed (kept as `last_error` in health).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from tapfix.proxy.telemetry import semconv as sc
from tapfix.proxy.telemetry.config import ExportConfig
from tapfix.proxy.telemetry.metrics import CATALOGUE, Instrument, Labeller, attributes, observations
from tapfix.proxy.telemetry.turn import Turn

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


class CountingExporter(MetricExporter):
    """Wraps the OTLP exporter: never raises into the SDK's reader, counts, logs the first failure."""

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
        self._filters = [(_HTTP_LOGGER, _Swallow(only_metrics=False)), (_GRPC_LOGGER, _Swallow(only_metrics=True))]
        for name, swallow in self._filters:
            logger = logging.getLogger(name)
            logger.setLevel(logging.WARNING)  # reach the filter even where a parent logger is silenced
            logger.addFilter(swallow)

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        if self.closing and self._last_failed:  # a receiver that failed the last time: don't hold the exit
            self.failures += 1
            return MetricExportResult.FAILURE
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis)
            reason = None
        except Exception as e:  # noqa: BLE001 - an exporter's bug must not reach the SDK's thread
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
        try:
            self.inner.shutdown(timeout_millis=timeout_millis)
        finally:
            for name, swallow in self._filters:
                logging.getLogger(name).removeFilter(swallow)

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


class OtelMetrics:
    """A `TurnFanout` sink recording the catalogue on a meter provider of its own (not the global one)."""

    def __init__(
        self,
        labeller: Labeller,
        queue_depth: Callable[[], float],
        reader: MetricReader,
        exporter: CountingExporter | None = None,
        resource: Resource | None = None,
    ) -> None:
        self.labeller = labeller
        self.exporter = exporter
        resource = resource or Resource.create({"service.name": "tapfix"})
        self.provider = MeterProvider(metric_readers=[reader], resource=resource)
        meter = self.provider.get_meter(sc.INSTRUMENTATION_SCOPE, schema_url=sc.SCHEMA_URL)

        def observe_depth(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(queue_depth())]

        self._instruments: dict[Instrument, Any] = {}
        for inst in CATALOGUE:
            if inst.kind == "counter":
                self._instruments[inst] = meter.create_counter(inst.name, inst.unit, inst.description)
            elif inst.kind == "histogram":
                self._instruments[inst] = meter.create_histogram(
                    inst.name, inst.unit, inst.description, explicit_bucket_boundaries_advisory=inst.buckets
                )
            else:
                meter.create_observable_gauge(inst.name, [observe_depth], inst.unit, inst.description)

    @classmethod
    def exporting(cls, labeller: Labeller, queue_depth: Callable[[], float], export: ExportConfig) -> OtelMetrics:
        """Exporting over OTLP every OTEL_METRIC_EXPORT_INTERVAL ms (the SDK reads it)."""
        exporter = otlp_exporter(export)
        reader = PeriodicExportingMetricReader(
            exporter, export_timeout_millis=export.signal("metrics").timeout_s * 1000
        )
        from tapfix.proxy.telemetry.spans import resource_of

        return cls(labeller, queue_depth, reader, exporter, resource_of(export))

    def __call__(self, turn: Turn) -> None:
        for inst, values, labels in observations(turn, self.labeller):
            instrument, named = self._instruments[inst], attributes(inst, labels)
            record = instrument.add if inst.kind == "counter" else instrument.record
            for value in values:
                record(value, named)

    def shutdown(self) -> None:
        """Collect and export what is left, then stop the reader's thread (at exit, after the writer);
        skipped when the receiver failed the last export: retrying one that is down would hold the exit
        for the whole export timeout."""
        if self.exporter is not None:
            self.exporter.closing = True
        self.provider.shutdown()

    def health(self) -> dict[str, Any]:
        return self.exporter.health() if self.exporter is not None else {}
