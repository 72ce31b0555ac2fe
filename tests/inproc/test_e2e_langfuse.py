"""Spans to Langfuse as its v4 ingestion documents it (langfuse.com, "OpenTelemetry" and "Migrate custom
ingestion to v4"): OTLP on `<host>/api/public/otel`, each request with `x-langfuse-ingestion-version: 4`
(without it the data takes the slow path, ~10 minutes late), and one complete span per observation,
never re-exported to update one Langfuse already accepted.

The receiver here serves the OTLP paths under `/api/public/otel` as Langfuse does, keeps each export
request with its headers, and the test checks both rules on what `tapfix run --otlp` (served in the test
process) sent.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from tapfix.proxy.telemetry import semconv as sc

from tests.support.ci import unavailable
from tests.support.inproc import start_mock, start_proxy

LANGFUSE_PATH = "/api/public/otel"


@pytest.fixture
def receiver() -> Any:
    try:
        import opentelemetry.sdk.trace  # noqa: F401 - tapfix[otel], what `--otlp` needs

        from tests.support.otlp_receiver import OtlpReceiver
    except ImportError as e:
        unavailable(f"OTLP export needs tapfix[otel] and opentelemetry-proto ({e.name})")
    handle = OtlpReceiver(prefix=LANGFUSE_PATH)
    yield handle
    handle.server.shutdown()


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def _spans(receiver: Any) -> list[tuple[int, dict[str, str], Any, dict[str, Any]]]:
    """(export number, its headers, span, span attributes) for every span received."""
    out = []
    for n, (headers, request) in enumerate(list(receiver.trace_exports)):
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    out.append((n, headers, span, {kv.key: _value(kv.value) for kv in span.attributes}))
    return out


def test_langfuse_gets_the_v4_header_and_one_complete_span_per_exchange(receiver, tmp_path: Path) -> None:
    mock = start_mock(tmp_path)
    proxy = start_proxy(tmp_path, mock.url, "--otlp", receiver.url)
    ids = []
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        with httpx.Client(base_url=f"{proxy.url}/v1", timeout=30) as client:
            for stream in (True, False, True):
                usage = {"stream_options": {"include_usage": True}} if stream else {}
                answer = client.post("/chat/completions", json={**body, "stream": stream, **usage})
                assert answer.status_code == 200
                ids.append(answer.headers["x-tapfix-capture-id"])
            messages = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
            answer = client.post("/messages", json=messages)
            ids.append(answer.headers["x-tapfix-capture-id"])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(_spans(receiver)) < len(ids):
            time.sleep(0.2)
    finally:
        proxy.stop()
        mock.stop()
    spans = _spans(receiver)
    assert receiver.trace_exports, "no span reached the Langfuse endpoint"
    # Every export request carries the header that selects v4 (real-time) ingestion.
    assert all(headers.get("x-langfuse-ingestion-version") == "4" for headers, _ in receiver.trace_exports)
    # One span per exchange, each in exactly one export, never sent again ...
    by_capture = Counter(attributes[sc.TAPFIX_CAPTURE_ID] for _, _, _, attributes in spans)
    assert by_capture == Counter(ids), by_capture
    assert len({span.span_id for _, _, span, _ in spans}) == len(spans)
    # ... and complete when it arrives: ended, with the answer's outcome and usage already on it.
    for _, _, span, attributes in spans:
        assert span.end_time_unix_nano > span.start_time_unix_nano > 0
        assert attributes[sc.GEN_AI_PROVIDER_NAME] in ("openai", "anthropic")
        assert attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS]
        assert attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] > 0 and attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] > 0
        assert attributes[sc.TAPFIX_STATUS] == 200


def test_other_receivers_get_no_langfuse_header(tmp_path: Path) -> None:
    from tapfix.proxy.telemetry.config import export_config

    plain = export_config("http://127.0.0.1:4318", {}, None)
    assert plain is not None and "x-langfuse-ingestion-version" not in plain.headers
    cloud = export_config("https://cloud.langfuse.com/api/public/otel", {}, None)
    assert cloud is not None and cloud.headers["x-langfuse-ingestion-version"] == "4"
    assert cloud.traces_endpoint == "https://cloud.langfuse.com/api/public/otel/v1/traces"
    # A header the user set is left as they set it.
    env = {"OTEL_EXPORTER_OTLP_HEADERS": "X-Langfuse-Ingestion-Version=3,Authorization=Basic%20abc"}
    mine = export_config("http://localhost:3000/api/public/otel", env, None)
    assert mine is not None and mine.headers == {"X-Langfuse-Ingestion-Version": "3", "Authorization": "Basic abc"}
