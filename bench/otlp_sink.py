"""A loopback OTLP/HTTP receiver for the benchmark: accepts what `tapfix run --otlp` exports and counts it.

Why a process of its own: the export's cost must show in tapfix's CPU alone, and the receiver's decoding
must not. It answers 200 to `POST /v1/traces` and `/v1/metrics` (protobuf, gzip or plain), counts the
spans and metric points it decoded, and reports them at `GET /stats`, so the runner can check that export
really happened (a ratio of 1.00 against an exporter that sent nothing would prove nothing).

    python bench/otlp_sink.py --listen 127.0.0.1:4318
"""

from __future__ import annotations

import argparse
import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

COUNTS = {"trace_posts": 0, "spans": 0, "metric_posts": 0, "metric_points": 0, "undecodable": 0}
LOCK = threading.Lock()


def _spans(body: bytes) -> int:
    req = ExportTraceServiceRequest.FromString(body)
    return sum(len(s.spans) for r in req.resource_spans for s in r.scope_spans)


def _points(body: bytes) -> int:
    req = ExportMetricsServiceRequest.FromString(body)
    total = 0
    for r in req.resource_metrics:
        for s in r.scope_metrics:
            for m in s.metrics:
                kind = m.WhichOneof("data")
                total += len(getattr(m, kind).data_points) if kind else 0
    return total


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's spelling
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        try:
            if self.path == "/v1/traces":
                n, keys = _spans(body), ("trace_posts", "spans")
            elif self.path == "/v1/metrics":
                n, keys = _points(body), ("metric_posts", "metric_points")
            else:
                self.send_error(404)
                return
        except Exception:  # noqa: BLE001 - count it; the exporter is what is measured, not this
            with LOCK:
                COUNTS["undecodable"] += 1
            n, keys = 0, ("undecodable", "undecodable")
        else:
            with LOCK:
                COUNTS[keys[0]] += 1
                COUNTS[keys[1]] += n
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        with LOCK:
            body = json.dumps(COUNTS).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", default="127.0.0.1:4318")
    host, port = ap.parse_args().listen.rsplit(":", 1)
    ThreadingHTTPServer((host, int(port)), Handler).serve_forever()


if __name__ == "__main__":
    main()
