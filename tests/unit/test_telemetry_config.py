"""`export_config`: --otlp and the standard OTEL_* variables, read the OTLP exporter spec's way."""

from __future__ import annotations

import click
import pytest
from tapfix.proxy.telemetry.config import export_config


def test_export_is_off_without_an_endpoint_or_when_the_sdk_is_disabled():
    assert export_config(None, {}, None) is None
    assert export_config(None, {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, None) is None
    assert export_config("http://127.0.0.1:4318", {"OTEL_SDK_DISABLED": "TRUE"}, None) is None
    env = {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4318"}
    assert export_config(None, env, None) is None


def test_otlp_is_a_base_url_and_wins_over_the_variables():
    cfg = export_config("http://127.0.0.1:6006/", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://other:1"}, None)
    assert cfg is not None
    assert (cfg.traces_endpoint, cfg.metrics_endpoint) == (
        "http://127.0.0.1:6006/v1/traces",
        "http://127.0.0.1:6006/v1/metrics",
    )
    assert (cfg.protocol, cfg.headers, cfg.timeout_s, cfg.content) == ("http/protobuf", {}, 10.0, "NO_CONTENT")
    assert cfg.service_name == "tapfix"
    with_path = export_config("https://collector.example/otlp", {}, None)
    assert with_path is not None and with_path.traces_endpoint == "https://collector.example/otlp/v1/traces"


def test_per_signal_endpoints_are_used_as_they_are_and_settings_override_per_signal():
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://base:4318",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:9999/custom",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20abc,x-team=ml",
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "x-team=infra",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc",
        "OTEL_SERVICE_NAME": "gateway",
        "OTEL_RESOURCE_ATTRIBUTES": "openinference.project.name=agents,deployment.environment=dev",
    }
    cfg = export_config(None, env, "http://127.0.0.1:8090/")
    assert cfg is not None
    assert cfg.traces_endpoint == "http://traces:9999/custom"
    assert cfg.metrics_endpoint == "http://base:4318"  # grpc: the base as is
    assert cfg.headers == {"authorization": "Bearer abc", "x-team": "ml"}
    assert cfg.timeout_s == 2.5
    metrics = cfg.signal("metrics")
    assert (metrics.protocol, metrics.headers["x-team"], metrics.timeout_s) == ("grpc", "infra", 2.5)
    assert cfg.signal("traces").endpoint == cfg.traces_endpoint
    assert cfg.browse_url == "http://127.0.0.1:8090"
    assert cfg.service_name == "gateway"
    assert cfg.resource_attributes == {"openinference.project.name": "agents", "deployment.environment": "dev"}


def test_a_grpc_endpoint_is_used_as_is_and_a_lone_signal_endpoint_turns_export_on():
    cfg = export_config("http://127.0.0.1:4317", {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, None)
    assert cfg is not None and (cfg.traces_endpoint, cfg.protocol) == ("http://127.0.0.1:4317", "grpc")
    only = export_config(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/v1/traces"}, None)
    assert only is not None and only.traces_endpoint == "http://t:1/v1/traces"
    assert only.metrics_endpoint == "http://localhost:4318/v1/metrics"  # the spec's default


@pytest.mark.parametrize(
    ("mode", "on_span", "in_event"),
    [
        ("NO_CONTENT", False, False),
        ("span_only", True, False),
        ("EVENT_ONLY", False, True),
        ("SPAN_AND_EVENT", True, True),
    ],
)
def test_content_modes(mode, on_span, in_event):
    cfg = export_config("http://h:1", {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": mode}, None)
    assert cfg is not None
    assert (cfg.content_on_span, cfg.content_in_event, cfg.captures_content) == (on_span, in_event, on_span or in_event)


@pytest.mark.parametrize(
    ("otlp", "env", "browse", "named"),
    [
        ("127.0.0.1:4318", {}, None, "--otlp"),
        ("http://", {}, None, "--otlp"),
        ("ftp://h:1", {}, None, "--otlp"),
        ("http://h:port", {}, None, "--otlp"),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "localhost"}, None, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "/v1/traces"}, None, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        ("http://h:1", {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, None, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ("http://h:1", {"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}, None, "OTEL_EXPORTER_OTLP_TIMEOUT"),
        ("http://h:1", {"OTEL_EXPORTER_OTLP_HEADERS": "novalue"}, None, "OTEL_EXPORTER_OTLP_HEADERS"),
        ("http://h:1", {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "yes"}, None, "CAPTURE_MESSAGE_CONTENT"),
        ("http://h:1", {}, "tapfix.local", "--browse-url"),
    ],
)
def test_values_that_cannot_be_right_are_usage_errors_naming_their_source(otlp, env, browse, named):
    with pytest.raises(click.UsageError) as raised:
        export_config(otlp, env, browse)
    assert named in raised.value.message and "\n" not in raised.value.message
    assert raised.value.exit_code == 2
