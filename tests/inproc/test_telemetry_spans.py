"""Turns as GenAI spans (the SDK's in-memory exporter) and the export path's failure handling (real
OTLP/HTTP exporters against a closed port and a rejecting receiver)."""

from __future__ import annotations

import http.server
import json
import logging
import threading
import time
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from tapfix.proxy.changes import Change
from tapfix.proxy.telemetry import semconv as sc
from tapfix.proxy.telemetry.config import export_config
from tapfix.proxy.telemetry.export import SpanExport
from tapfix.proxy.telemetry.turn import TurnContext, turn_from

from tests.support.builders import chat_chunk, sse_events
from tests.support.procs import free_port
from tests.support.secrets import SECRET
from tests.support.turns import WrittenBy, exchange

TRACE, SPAN, PARENT = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "b7ad6b7169203331"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    written = WrittenBy(tmp_path_factory.mktemp("spans") / "c.db")
    yield written.write
    written.close()


def _config(content: str = "NO_CONTENT", otlp: str = "http://127.0.0.1:9", **env: str):
    env = {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": content, "OTEL_SERVICE_NAME": "gw", **env}
    cfg = export_config(otlp, env, "http://127.0.0.1:8090/")
    assert cfg is not None
    return cfg


def _spans(store, exchanges, content="NO_CONTENT"):
    """Each exchange written, turned into a Turn and exported through a real SpanExport."""
    cfg = _config(content)
    memory = InMemorySpanExporter()
    export = SpanExport(cfg, memory, flush_every_s=0.05)
    context = TurnContext(engine_of={"local": "sglang"}.get, capture_content=cfg.captures_content)
    for ex in exchanges:
        export.submit(turn_from(store(ex), context))
    export.close()
    return memory.get_finished_spans(), export


def _streamed(**fields):
    request = {"model": "qwen", "stream": True, "messages": [{"role": "user", "content": f"key {SECRET}"}]}
    chunks = sse_events(
        [
            chat_chunk({"role": "assistant", "content": "ok"}, id="chatcmpl-7", model="qwen-served"),
            chat_chunk({}, "stop"),
        ]
    )
    ex = exchange(
        "/v1/chat/completions",
        request | {"temperature": 0.5},
        status=200,
        content_type="text/event-stream",
        response_chunks=chunks,
        chunk_times=[0.05, 0.2, 0.25],
        **fields,
    )
    ex.changes.append(Change("sampling", "inject", "$.top_p", None, 0.9, "model default"))
    ex.changes.append(Change("toolcalls", "json_repair", "$.choices[0].delta", f"{{{SECRET}", "{}", "closed it"))
    return ex


def test_a_client_trace_it_did_not_sample_gets_no_span_of_tapfix_either(store):
    """ParentBased sampling: the trace-context addon gave an unsampled client trace no span of tapfix's
    (trace id, no span id); exporting one anyway would start a trace the client chose not to record."""
    unsampled = _streamed(trace_id=TRACE, parent_span_id=PARENT)
    sampled = _streamed(trace_id=TRACE, span_id=SPAN, parent_span_id=PARENT)
    spans, export = _spans(store, [unsampled, sampled])
    assert [s.context.span_id for s in spans] == [int(SPAN, 16)]
    assert (export.health()["unsampled"], export.health()["exported"]) == (1, 1)


def test_an_exchange_is_one_client_span_with_its_own_ids_times_and_attributes(store):
    ex = _streamed(trace_id=TRACE, span_id=SPAN, parent_span_id=PARENT)
    (span,), export = _spans(store, [ex])
    assert span.name == "chat qwen" and span.kind is SpanKind.CLIENT
    assert (span.context.trace_id, span.context.span_id) == (int(TRACE, 16), int(SPAN, 16))
    assert span.parent is not None and span.parent.span_id == int(PARENT, 16) and span.parent.is_remote
    assert span.start_time == int(ex.started_at * 1e9) and span.end_time - span.start_time == pytest.approx(
        5e8, rel=1e-6
    )
    a = dict(span.attributes)
    assert a[sc.GEN_AI_OPERATION_NAME] == "chat" and a[sc.GEN_AI_PROVIDER_NAME] == "sglang"
    assert (a[sc.GEN_AI_REQUEST_MODEL], a[sc.GEN_AI_RESPONSE_MODEL], a[sc.GEN_AI_RESPONSE_ID]) == (
        "qwen",
        "qwen-served",
        "chatcmpl-7",
    )
    assert a[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",) and a[sc.GEN_AI_REQUEST_TEMPERATURE] == 0.5
    assert a[sc.GEN_AI_REQUEST_STREAM] is True
    assert a[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] == pytest.approx(0.05, abs=1e-6)
    assert a[sc.TAPFIX_CAPTURE_ID] == ex.id and a[sc.TAPFIX_CAPTURE_URL] == f"http://127.0.0.1:8090/exchange/{ex.id}"
    assert (a[sc.TAPFIX_CHANGES_COUNT], a[sc.TAPFIX_REPAIRS_COUNT], a[sc.TAPFIX_REPAIRS_PREFIX + "json_repair"]) == (
        2,
        1,
        1,
    )
    assert (a[sc.SERVER_ADDRESS], a[sc.SERVER_PORT], a[sc.TAPFIX_UPSTREAM]) == ("10.0.0.5", 8000, "local")
    assert sc.GEN_AI_INPUT_MESSAGES not in a and sc.ERROR_TYPE not in a
    assert span.status.status_code is StatusCode.UNSET
    assert span.resource.attributes["service.name"] == "gw"
    assert span.instrumentation_scope.name == "tapfix" and span.instrumentation_scope.schema_url == sc.SCHEMA_URL
    events = [(e.name, dict(e.attributes)) for e in span.events]
    assert [e[1][sc.CHANGE_KIND] for e in events] == ["inject", "json_repair"]
    assert events[0][1] == {
        sc.CHANGE_STAGE: "sampling",
        sc.CHANGE_KIND: "inject",
        sc.CHANGE_PATH: "$.top_p",
        sc.CHANGE_REASON: "model default",
    }  # no before/after without content
    assert span.events[0].timestamp == span.start_time and span.events[1].timestamp == span.end_time
    assert export.health()["exported"] == 1 and export.health()["dropped"] == 0
    # docs/opentelemetry.md's names table (made from semconv) lists every attribute and event name a span carries
    listed = {line.split("`")[1] for line in sc.names_table().splitlines()[2:]}
    emitted = {k for k in a if not k.startswith(sc.TAPFIX_REPAIRS_PREFIX) or k == sc.TAPFIX_REPAIRS_COUNT}
    emitted |= {e.name for e in span.events} | {k for e in span.events for k in e.attributes}
    assert emitted <= listed, emitted - listed
    assert sc.TAPFIX_REPAIRS_PREFIX in listed


@pytest.mark.parametrize("mode", ["SPAN_ONLY", "EVENT_ONLY", "SPAN_AND_EVENT"])
def test_content_goes_where_the_mode_says_redacted_and_never_without_bodies(store, mode):
    private = _streamed()
    private.store_bodies = False
    (span, no_bodies), _ = _spans(store, [_streamed(), private], content=mode)
    a = dict(span.attributes)
    details = [e for e in span.events if e.name == sc.EVENT_INFERENCE_DETAILS]
    assert (sc.GEN_AI_INPUT_MESSAGES in a) is (mode != "EVENT_ONLY")
    assert len(details) == (0 if mode == "SPAN_ONLY" else 1)
    sent = a.get(sc.GEN_AI_INPUT_MESSAGES) or details[0].attributes[sc.GEN_AI_INPUT_MESSAGES]
    assert json.loads(sent)[0]["role"] == "user" and SECRET not in sent and "[redacted]" in sent
    answer = json.loads(a.get(sc.GEN_AI_OUTPUT_MESSAGES) or details[0].attributes[sc.GEN_AI_OUTPUT_MESSAGES])
    assert answer[0]["parts"] == [{"type": "text", "content": "ok"}]
    repair = next(e for e in span.events if e.name == sc.EVENT_CHANGE and e.attributes[sc.CHANGE_KIND] == "json_repair")
    assert repair.attributes[sc.CHANGE_AFTER] == '"{}"' and SECRET not in repair.attributes[sc.CHANGE_BEFORE]
    # --no-bodies wins over every content mode
    b = dict(no_bodies.attributes)
    assert sc.GEN_AI_INPUT_MESSAGES not in b and sc.GEN_AI_OUTPUT_MESSAGES not in b
    assert not [e for e in no_bodies.events if e.name == sc.EVENT_INFERENCE_DETAILS]
    assert all(sc.CHANGE_BEFORE not in e.attributes for e in no_bodies.events)


def test_content_hides_every_secret_the_store_hides_in_headers(store):
    """The store hides a credential header's whole value, whatever it looks like; span content hides that
    same value wherever the prompt or a change carries it, and what reads as a credential in text."""
    token = "9f8e7d6c5b4a39281706"  # not key-looking: only the header it came in says it's a secret
    prompt = (
        f"Use token {token}. config: {{'password': 'hunter2!x', 'x-api-key': 'abcd1234efgh'}} "
        "then curl -H 'Authorization: Basic dXNlcjpwYXNz' 'https://h/x?api_key=QWERTY&page=2'"
    )
    request = {"model": "qwen", "messages": [{"role": "user", "content": prompt}]}
    body = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": f"ok {token}"}, "finish_reason": "stop"}]
    }
    ex = exchange(
        "/v1/chat/completions",
        request,
        status=200,
        content_type="application/json",
        response=json.dumps(body).encode(),
        request_headers=[("Authorization", f"Bearer {token}"), ("user-agent", "curl/8")],
    )
    ex.changes.append(Change("policy", "override", "headers.x-upstream", f"Bearer {token}", "x", "routed"))
    (span,), _ = _spans(store, [ex], content="SPAN_ONLY")
    a = dict(span.attributes)
    sent = a[sc.GEN_AI_INPUT_MESSAGES] + a[sc.GEN_AI_OUTPUT_MESSAGES]
    sent += "".join(str(e.attributes.get(sc.CHANGE_BEFORE, "")) for e in span.events)
    for secret in (token, "hunter2!x", "abcd1234efgh", "dXNlcjpwYXNz", "QWERTY"):
        assert secret not in sent, secret
    assert "page=2" in sent and "Use token [redacted]" in sent  # the rest of the words are left alone


def test_errors_get_error_status_and_ids_are_made_when_the_exchange_has_none(store):
    failed = exchange(
        "/v1/chat/completions", {"model": "m"}, status=503, content_type="application/json", response=b"{}"
    )
    broken = exchange(
        "/v1/chat/completions", {"model": "m"}, status=502, content_type="application/json", response=b"{}"
    )
    broken.flags.add("toolcall_unrecoverable")
    unanswered = exchange("/v1/chat/completions", {"model": "m"}, error="connection refused")
    models = exchange("/v1/models", {}, method="GET", status=200, response=b"{}")
    spans, export = _spans(store, [failed, broken, unanswered, models])
    assert [(s.status.status_code, s.status.description, s.attributes[sc.ERROR_TYPE]) for s in spans] == [
        (StatusCode.ERROR, "503", "503"),
        (StatusCode.ERROR, sc.ERROR_UNRECOVERABLE, sc.ERROR_UNRECOVERABLE),
        (StatusCode.ERROR, sc.ERROR_NO_ANSWER, sc.ERROR_NO_ANSWER),
    ]
    assert spans[1].attributes[sc.TAPFIX_UNRECOVERABLE] is True
    assert len({s.context.trace_id for s in spans}) == 3 and all(s.parent is None for s in spans)
    assert export.health()["skipped"] == 1  # /v1/models: no GenAI span


class _Rejecting(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - the stdlib's name
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_an_unreachable_or_rejecting_receiver_is_counted_and_logged_once_never_raised(store, caplog):
    turn = turn_from(store(_streamed()), TurnContext(engine_of=lambda _: None))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Rejecting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    caplog.set_level(logging.DEBUG)
    try:
        for url in (f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{server.server_address[1]}"):
            caplog.clear()
            export = SpanExport(
                _config(otlp=url, OTEL_EXPORTER_OTLP_TIMEOUT="500"), queue_size=2, batch=1, flush_every_s=0.01
            )
            started = time.monotonic()
            for _ in range(6):  # the worker holds one batch at a time: a full queue drops, never waits
                export.submit(turn)
            assert time.monotonic() - started < 0.1
            export.close(timeout=10)
            health = export.health()
            assert health["failed"] >= 1 and health["failed"] == health["failed_batches"]
            assert health["exported"] == 0 and health["failed"] + health["dropped"] == 6
            assert health["last_error"] and health["queue_depth"] == 0
            ours = [r for r in caplog.records if r.name == "tapfix.telemetry" and "failed" in r.getMessage()]
            assert len(ours) == 1, [r.getMessage() for r in caplog.records]
            sdk = [r for r in caplog.records if r.name.startswith("opentelemetry") and r.levelno >= logging.WARNING]
            assert sdk == []
    finally:
        server.shutdown()
        server.server_close()


def test_the_docs_list_every_name_semconv_holds():
    """docs/opentelemetry.md's names table is `names_table()` itself, so what the docs say tapfix emits can't drift."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "opentelemetry.md").read_text()
    begin, end = "<!-- semconv names: begin -->\n", "\n<!-- semconv names: end -->"
    assert page[page.index(begin) + len(begin) : page.index(end)] == sc.names_table()
