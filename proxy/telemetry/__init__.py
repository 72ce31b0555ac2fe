"""Telemetry (issue 20): trace context, OpenTelemetry GenAI spans and metrics, Prometheus; no mitmproxy here."""
