"""Spans to an OTLP receiver without ever slowing or breaking traffic (imported only when export is on).

The writer thread only enqueues (`submit`: a `put_nowait` on a bounded queue; when it is full the
turn is dropped and counted, so a stalled receiver costs memory up to the bound, never time). One
worker thread builds the spans and hands them to the OTLP exporter in batches. A receiver that is
down, slow or rejecting is counted and logged once (until it recovers), and the SDK's own
per-failure log lines are silenced: a down receiver must not flood the proxy's log either.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from tapfix.proxy.telemetry.config import EXIT_FLUSH_S, ExportConfig
from tapfix.proxy.telemetry.spans import resource_of, spans_of
from tapfix.proxy.telemetry.turn import Turn

log = logging.getLogger("tapfix.telemetry")
QUEUE_SIZE = 4096
BATCH = 512
FLUSH_EVERY_S = 1.0
# The OTLP exporters log every failed export (and each retry) at WARNING/ERROR; tapfix logs once.
_SDK_LOGGERS = ("opentelemetry.exporter.otlp", "opentelemetry.sdk.trace.export")


@dataclass
class ExportStats:
    submitted: int = 0
    skipped: int = 0  # not a GenAI call (/v1/models, health): no span
    unsampled: int = 0  # the client's traceparent said not sampled: tapfix's span isn't recorded either
    dropped: int = 0  # the queue was full
    exported: int = 0
    failed: int = 0  # spans in batches the receiver didn't take
    failed_batches: int = 0
    build_errors: int = 0
    last_error: str | None = None
    last_export: float | None = None
    _failing: bool = field(default=False, repr=False)

    def as_dict(self, depth: int, endpoint: str) -> dict[str, Any]:
        return {
            "endpoint": endpoint,
            "queue_depth": depth,
            "submitted": self.submitted,
            "skipped": self.skipped,
            "unsampled": self.unsampled,
            "dropped": self.dropped,
            "exported": self.exported,
            "failed": self.failed,
            "failed_batches": self.failed_batches,
            "build_errors": self.build_errors,
            "last_error": self.last_error,
        }


def otlp_span_exporter(cfg: ExportConfig) -> SpanExporter:
    """The OTLP span exporter of the configured protocol (http/protobuf or grpc)."""
    signal = cfg.signal("traces")
    if signal.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        parts = urlsplit(signal.endpoint)
        return GrpcExporter(
            endpoint=parts.netloc, insecure=parts.scheme == "http", headers=signal.headers, timeout=signal.timeout_s
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=signal.endpoint, headers=signal.headers, timeout=signal.timeout_s)


class SpanExport:
    """`Runtime.telemetry` while export is on: the span sink (`submit`), its worker, its health."""

    def __init__(
        self,
        cfg: ExportConfig,
        exporter: SpanExporter | None = None,
        *,
        queue_size: int = QUEUE_SIZE,
        batch: int = BATCH,
        flush_every_s: float = FLUSH_EVERY_S,
    ) -> None:
        for name in _SDK_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        self.cfg = cfg
        self.exporter = exporter if exporter is not None else otlp_span_exporter(cfg)
        self.resource = resource_of(cfg)
        self.stats = ExportStats()
        self._queue: queue.Queue[Turn] = queue.Queue(maxsize=queue_size)
        self._batch = batch
        self._every = flush_every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tapfix-otlp-spans", daemon=True)
        self._thread.start()

    def submit(self, turn: Turn) -> None:
        """The span sink: enqueue, never block, never raise (called on the writer thread)."""
        if not turn.is_genai:
            self.stats.skipped += 1
            return
        if turn.trace_id is not None and turn.span_id is None:  # ParentBased: the trace-context addon gave no span
            self.stats.unsampled += 1
            return
        try:
            self._queue.put_nowait(turn)
        except queue.Full:
            if not self.stats.dropped:
                log.warning(
                    "OTLP export queue full (%d spans): dropping spans, counted in /tapfix/health", self._queue.maxsize
                )
            self.stats.dropped += 1
            return
        self.stats.submitted += 1

    def health(self) -> dict[str, Any]:
        return self.stats.as_dict(self._queue.qsize(), self.cfg.traces_endpoint)

    def close(self, timeout: float = EXIT_FLUSH_S) -> None:
        """Export what is queued (within `timeout`), then shut the exporter down (which ends its retries)."""
        self._stop.set()
        self._thread.join(timeout)
        try:
            self.exporter.shutdown()
        except Exception as e:  # noqa: BLE001 - shutting down must not fail tapfix's exit
            log.warning("OTLP span exporter shutdown: %s", e)

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch:
                self._export(batch)
            elif self._stop.is_set():
                return

    def _take(self) -> list[Turn]:
        """Up to a batch: what is queued now, or what arrives within the flush interval."""
        batch: list[Turn] = []
        deadline = time.monotonic() + self._every
        while len(batch) < self._batch:
            wait = 0.0 if self._stop.is_set() else deadline - time.monotonic()
            try:
                batch.append(self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _export(self, turns: list[Turn]) -> None:
        try:
            spans = spans_of(turns, self.cfg, self.resource)
        except Exception as e:  # noqa: BLE001 - a bug in one turn's span must not stop the worker
            self.stats.build_errors += len(turns)
            self.stats.last_error = f"{type(e).__name__}: {e}"
            log.exception("building spans failed for %d exchange(s)", len(turns))
            return
        try:
            result = self.exporter.export(spans)
            error = None if result is SpanExportResult.SUCCESS else "the receiver did not accept the spans"
        except Exception as e:  # noqa: BLE001 - an exporter's exception is a failed export, never a crash
            error = f"{type(e).__name__}: {e}"
        if error is None:
            self.stats.exported += len(spans)
            self.stats.last_export = time.time()
            if self.stats._failing:
                log.warning("OTLP export to %s works again", self.cfg.traces_endpoint)
                self.stats._failing = False
            return
        self.stats.failed += len(spans)
        self.stats.failed_batches += 1
        self.stats.last_error = error
        if not self.stats._failing:  # once per outage, not once per batch
            log.warning(
                "OTLP export to %s failed (%s); spans are counted as failed in /tapfix/health",
                self.cfg.traces_endpoint,
                error,
            )
            self.stats._failing = True
