"""A tiny OTLP/HTTP receiver on loopback for the tests: it decodes what tapfix exports with the
protocol's own messages (`opentelemetry-proto`), as a collector would.

Phoenix takes traces only, so the metrics tests need a receiver of their own. `metrics=False` makes it
answer `/v1/metrics` with 404 as Phoenix does; traces are always accepted, and kept with the headers
they came with (`trace_exports`). `prefix` puts the OTLP paths under a base path, as Langfuse's
`/api/public/otel` does.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class Point:
    """One data point as received: metric name, unit, attributes, and its value (a sum's or gauge's
    value; a histogram's count, sum and bounds)."""

    metric: str
    unit: str
    attributes: dict[str, Any]
    value: float | None = None
    count: int | None = None
    total: float | None = None
    bounds: tuple[float, ...] = ()
    buckets: tuple[int, ...] = ()  # a histogram's bucket counts (not cumulative), one more than bounds
    temporality: int | None = None  # a sum's or histogram's: 1 delta, 2 cumulative (AggregationTemporality)
    start_ns: int = 0
    time_ns: int = 0


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as received: its name, status (code: 0 unset, 1 ok, 2 error; the message) and attributes."""

    name: str
    status_code: int
    status_message: str
    attributes: dict[str, Any]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class OtlpReceiver:
    """Listens on 127.0.0.1 (a free port); `url` is the base URL to give `tapfix run --otlp`."""

    def __init__(self, *, metrics: bool = True, prefix: str = "", metrics_status: int = 200) -> None:
        self.accept_metrics = metrics
        self.metrics_status = metrics_status  # e.g. 503: a receiver that is failing (the exporter retries)
        self.prefix = prefix
        self.requests: list[ExportMetricsServiceRequest] = []
        self.rejected = 0  # metrics requests answered 404
        self.trace_requests = 0
        self.trace_exports: list[tuple[dict[str, str], ExportTraceServiceRequest]] = []  # (headers, request)
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, answer = receiver._handle(self.path, body, headers)
                self.send_response(status)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self.server.serve_forever, args=(0.05,), name="otlp-receiver", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{self.prefix}"

    def _handle(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        if not path.startswith(self.prefix):
            return 404, b""
        path = path[len(self.prefix) :]
        with self._lock:
            if path == "/v1/metrics":
                if not self.accept_metrics:
                    self.rejected += 1
                    return 404, b"404 page not found"
                if self.metrics_status != 200:
                    self.rejected += 1
                    return self.metrics_status, b"unavailable"
                request = ExportMetricsServiceRequest()
                request.ParseFromString(body)
                self.requests.append(request)
                return 200, ExportMetricsServiceResponse().SerializeToString()
            if path == "/v1/traces":
                self.trace_requests += 1
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                self.trace_exports.append((headers, request))
                return 200, ExportTraceServiceResponse().SerializeToString()
        return 404, b""

    def points(self) -> Iterator[tuple[dict[str, Any], str, Point]]:
        """(resource attributes, scope name, point) for every data point received so far."""
        with self._lock:
            requests = list(self.requests)
        for request in requests:
            for rm in request.resource_metrics:
                resource = _attributes(rm.resource.attributes)
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        for point in _points(metric):
                            yield resource, sm.scope.name, point

    def latest(self) -> dict[str, list[Point]]:
        """The data points of the last request (cumulative temporality: the totals so far), by metric."""
        with self._lock:
            last = self.requests[-1] if self.requests else None
        out: dict[str, list[Point]] = {}
        if last is not None:
            for rm in last.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        out.setdefault(metric.name, []).extend(_points(metric))
        return out

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far."""
        with self._lock:
            bodies = [request for _, request in self.trace_exports]
        return [
            ReceivedSpan(span.name, span.status.code, span.status.message, _attributes(span.attributes))
            for body in bodies
            for rs in body.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _points(metric: Any) -> Iterator[Point]:
    kind = metric.WhichOneof("data")
    if kind in ("sum", "gauge"):
        data = getattr(metric, kind)
        temporality = data.aggregation_temporality if kind == "sum" else None
        for p in data.data_points:
            value = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
            times = {"start_ns": p.start_time_unix_nano, "time_ns": p.time_unix_nano}
            yield Point(
                metric.name, metric.unit, _attributes(p.attributes), value=value, temporality=temporality, **times
            )
    elif kind == "histogram":
        for p in metric.histogram.data_points:
            yield Point(
                metric.name,
                metric.unit,
                _attributes(p.attributes),
                count=p.count,
                total=p.sum,
                bounds=tuple(p.explicit_bounds),
                buckets=tuple(p.bucket_counts),
                temporality=metric.histogram.aggregation_temporality,
                start_ns=p.start_time_unix_nano,
                time_ns=p.time_unix_nano,
            )
