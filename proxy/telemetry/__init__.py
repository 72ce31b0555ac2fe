"""tapfix in the observability stack (issue 20): trace context, OpenTelemetry GenAI spans and metrics,
Prometheus.

Nothing here imports mitmproxy. The `opentelemetry` packages (the `tapfix[otel]` extra) are imported
only by `spans`, `export` and `otel_metrics`, which are imported only when export is on, so `tapfix
--help` and a run without export never load them.
"""
