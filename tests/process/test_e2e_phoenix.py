"""Spans in a real receiver: the openai SDK → `tapfix run --otlp` → `tapfix mock`, spans to Arize Phoenix.

Phoenix (scripts/install-phoenix, its own venv) receives OTLP/HTTP on its port and serves what it
stored through `GET /v1/projects/{project}/spans`; the project comes from the resource attribute
`openinference.project.name`. Six exchanges (plain, streamed under an agent's `traceparent`, a
streamed tool call tapfix repairs, an upstream 500, a reset stream, a tool call no attempt could save)
must arrive as GenAI spans with the names,
attributes, parents, events and status the conventions and tapfix promise, and the upstream must have
been sent tapfix's own span as its parent.

The proxy is a process (the banner it prints names where spans and metrics go); its mock is served in
the test process.
"""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.support.builders import WRITE_FILE
from tests.support.inproc import start_mock
from tests.support.phoenix import phoenix_executable, start_phoenix
from tests.support.procs import start_proxy, wait_capture

PROJECT = "tapfix-e2e"
TRACE, PARENT = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
BROWSE = "http://127.0.0.1:8090"
TOOLS = [WRITE_FILE]
SCENARIO = {
    "rules": [
        {"when": {"model": "broken"}, "do": "http_error", "status": 500},
        {"when": {"model": "cut"}, "do": "reset_mid_stream", "after_chunks": 2},
        {"when": {"model": "hopeless"}, "do": "break_tool_call", "mode": "truncate"},
        {"when": {"has_tools": True}, "do": "break_tool_call", "mode": "unclosed"},
    ]
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("phoenix")
    phoenix = start_phoenix(phoenix_executable(), tmp)
    (tmp / "scenario.json").write_text(json.dumps(SCENARIO))
    mock = start_mock(tmp, "--scenario", str(tmp / "scenario.json"))
    env = {
        "OTEL_RESOURCE_ATTRIBUTES": f"openinference.project.name={PROJECT}",
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY",
    }
    proxy = start_proxy(tmp, mock.url, "--engine", "vllm", "--otlp", phoenix.url, "--browse-url", BROWSE, env=env)
    try:
        yield phoenix, proxy, mock, tmp
    finally:
        proxy.stop()
        mock.stop()
        phoenix.stop()


def _traffic(proxy) -> dict[str, str]:
    """The six exchanges; their capture ids by name."""
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
    chat = client.chat.completions
    ids = {}
    messages = [{"role": "user", "content": "Say hi"}]
    raw = chat.with_raw_response.create(model="qwen", messages=messages, temperature=0.3, reasoning_effort="high")
    raw.parse()
    ids["plain"] = raw.headers["x-tapfix-capture-id"]
    raw = chat.with_raw_response.create(
        model="qwen",
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"traceparent": f"00-{TRACE}-{PARENT}-01"},
    )
    assert "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    ids["traced"] = raw.headers["x-tapfix-capture-id"]
    prompt = [{"role": "user", "content": 'Create hello.txt containing "hi there"'}]
    raw = chat.with_raw_response.create(model="qwen", messages=prompt, tools=TOOLS, stream=True)
    calls = [tc for c in raw.parse() if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls
    ids["repaired"] = raw.headers["x-tapfix-capture-id"]
    with pytest.raises(openai.InternalServerError) as failed:
        chat.create(model="broken", messages=messages)
    ids["failed"] = failed.value.response.headers["x-tapfix-capture-id"]
    raw = chat.with_raw_response.create(model="cut", messages=messages, stream=True)
    with pytest.raises(openai.APIError):
        list(raw.parse())
    ids["reset"] = raw.headers["x-tapfix-capture-id"]
    raw = chat.with_raw_response.create(model="hopeless", messages=prompt, tools=TOOLS, stream=True)
    with pytest.raises(openai.APIError):  # truncated on every attempt: unrecoverable, after one regeneration
        list(raw.parse())
    ids["unrecoverable"] = raw.headers["x-tapfix-capture-id"]
    return ids


def _wait_spans(phoenix, ids: dict[str, str], project: str = PROJECT, timeout: float = 30.0) -> dict[str, dict]:
    wanted = set(ids.values())
    deadline = time.monotonic() + timeout
    while True:
        spans = {s["attributes"].get("tapfix.capture.id"): s for s in phoenix.spans(project)}
        if wanted <= spans.keys() or time.monotonic() > deadline:
            assert wanted <= spans.keys(), (sorted(spans), phoenix.log_path.read_text(errors="replace")[-2000:])
            return {name: spans[capture_id] for name, capture_id in ids.items()}
        time.sleep(0.3)


def _forwarded_traceparent(proxy, capture_id: str) -> str:
    row = wait_capture(proxy.extra["db"], capture_id)
    headers = json.loads(row["forwarded_headers"] or "[]")
    return next(value for name, value in headers if name.lower() == "traceparent")


def test_each_exchange_is_a_genai_span_in_phoenix(stack):
    phoenix, proxy, _, _ = stack
    ids = _traffic(proxy)
    spans = _wait_spans(phoenix, ids)

    for name, span in spans.items():
        a = span["attributes"]
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "vllm", (name, a)
        assert a["tapfix.capture.url"] == f"{BROWSE}/exchange/{ids[name]}"
        # tapfix's span is the upstream's parent: what went upstream names this very span
        trace_id, span_id = span["context"]["trace_id"], span["context"]["span_id"]
        assert _forwarded_traceparent(proxy, ids[name]) == f"00-{trace_id}-{span_id}-01", name
    assert {n: s["name"] for n, s in spans.items()} == {
        "plain": "chat qwen",
        "traced": "chat qwen",
        "repaired": "chat qwen",
        "failed": "chat broken",
        "reset": "chat cut",
        "unrecoverable": "chat hopeless",
    }

    plain = spans["plain"]["attributes"]
    assert plain["gen_ai.request.temperature"] == 0.3 and plain["gen_ai.request.reasoning.level"] == "high"
    assert plain["gen_ai.request.stream"] is False and plain["gen_ai.usage.input_tokens"] > 0
    assert plain["gen_ai.response.id"] and plain["gen_ai.response.model"]
    assert json.loads(plain["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "Say hi"}]}
    ]  # SPAN_ONLY: content on the span
    assert spans["plain"]["parent_id"] is None and spans["plain"]["status_code"] == "UNSET"

    traced = spans["traced"]
    assert traced["context"]["trace_id"] == TRACE and traced["parent_id"] == PARENT  # the agent's span
    assert traced["attributes"]["gen_ai.request.stream"] is True
    assert traced["attributes"]["gen_ai.response.time_to_first_chunk"] > 0
    assert traced["attributes"]["gen_ai.usage.output_tokens"] > 0

    repaired = spans["repaired"]
    assert repaired["attributes"]["tapfix.repairs.count"] >= 1 and repaired["status_code"] == "UNSET"
    kinds = [e["attributes"]["tapfix.change.kind"] for e in repaired["events"] if e["name"] == "tapfix.change"]
    stages = {e["attributes"]["tapfix.change.stage"] for e in repaired["events"] if e["name"] == "tapfix.change"}
    assert {"toolcalls", "telemetry"} <= stages and len(kinds) == repaired["attributes"]["tapfix.changes.count"]
    assert all("tapfix.change.before" in e["attributes"] for e in repaired["events"])  # content is on

    errors = {
        n: (spans[n]["status_code"], spans[n]["attributes"]["error.type"]) for n in ("failed", "reset", "unrecoverable")
    }
    assert errors == {
        "failed": ("ERROR", "500"),
        "reset": ("ERROR", "tapfix.reset"),
        "unrecoverable": ("ERROR", "tapfix.unrecoverable_tool_call"),
    }
    unrecoverable = spans["unrecoverable"]
    assert unrecoverable["attributes"]["tapfix.unrecoverable"] is True
    assert unrecoverable["attributes"]["tapfix.repairs.count"] == 0  # regeneration's records are no repairs
    # the regeneration attempt (issue 19) is a span of its own, a child of the client-facing one
    (attempt,) = [s for s in phoenix.spans(PROJECT) if s["attributes"].get("tapfix.attempt_of") == ids["unrecoverable"]]
    assert (
        attempt["attributes"]["tapfix.attempt"] == 2
        and attempt["context"]["trace_id"] == unrecoverable["context"]["trace_id"]
    )
    assert attempt["parent_id"] == unrecoverable["context"]["span_id"]

    health = httpx.get(f"{proxy.url}/tapfix/health", timeout=10).json()["telemetry"]["spans"]
    assert health["exported"] >= 7 and health["failed"] == 0 and health["dropped"] == 0
    assert f"spans to {phoenix.url}/v1/traces (http/protobuf, content SPAN_ONLY)" in proxy.log()  # the banner
    assert f"metrics to {phoenix.url}/v1/metrics (http/protobuf)" in proxy.log()


def test_spans_go_over_grpc_too(stack):
    """OTEL_EXPORTER_OTLP_PROTOCOL=grpc: the same span through Phoenix's OTLP/gRPC port."""
    phoenix, _, mock, tmp = stack
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_RESOURCE_ATTRIBUTES": "openinference.project.name=tapfix-grpc"}
    grpc_url = f"http://127.0.0.1:{phoenix.grpc_port}"
    proxy = start_proxy(tmp, mock.url, "--otlp", grpc_url, db=tmp / "grpc.db", env=env)
    try:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model="qwen", messages=[{"role": "user", "content": "hi"}]
        )
        raw.parse()
        capture_id = raw.headers["x-tapfix-capture-id"]
        span = _wait_spans(phoenix, {"grpc": capture_id}, project="tapfix-grpc")["grpc"]
        assert span["name"] == "chat qwen" and span["attributes"]["gen_ai.operation.name"] == "chat"
        content = ("gen_ai.input", "gen_ai.output", "llm.input_messages", "llm.output_messages")
        assert not [k for k in span["attributes"] if k.startswith(content)]  # NO_CONTENT by default
        assert f"spans to {grpc_url} (grpc, content NO_CONTENT)" in proxy.log()
    finally:
        proxy.stop()
