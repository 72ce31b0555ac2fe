"""`turn_from`: one exchange summed up from what a real capture writer hands its observers."""

from __future__ import annotations

import json
import time

import pytest
from tapfix.proxy.changes import Change
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.writer import Written
from tapfix.proxy.telemetry import semconv as sc
from tapfix.proxy.telemetry.turn import Turn, TurnContext, turn_from

from tests.support.builders import chat_chunk, named_event, sse_events
from tests.support.turns import WrittenBy
from tests.support.turns import exchange as _exchange

ENGINES = {"local": "vllm"}
CONTEXT = TurnContext(engine_of=ENGINES.get)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    written = WrittenBy(tmp_path_factory.mktemp("turns") / "c.db")
    yield written.write
    written.close()


def _turn(store, ex: Exchange, context: TurnContext = CONTEXT) -> Turn:
    return turn_from(store(ex), context)


def test_a_streamed_chat_turn(store):
    request = {
        "model": "public",
        "stream": True,
        "messages": [{"role": "user", "content": "hi sk-live-SECRETSECRET0123456789"}],
        "temperature": 0.2,
        "max_tokens": 64,
        "stop": ["END"],
        "n": 1,
        "reasoning_effort": "high",
    }
    forwarded = dict(request, model="org/served-7b")
    usage = {
        "prompt_tokens": 11,
        "completion_tokens": 7,
        "completion_tokens_details": {"reasoning_tokens": 3},
        "prompt_tokens_details": {"cached_tokens": 8},
    }
    chunks = sse_events(
        [
            chat_chunk({"role": "assistant", "content": ""}, id="chatcmpl-42", model="served-7b-0613"),
            chat_chunk({"content": "hel"}, id="chatcmpl-42"),
            chat_chunk({"content": "lo"}, "stop", id="chatcmpl-42", usage=usage),
        ]
    )
    ex = _exchange(
        "/v1/chat/completions",
        request,
        forwarded=json.dumps(forwarded).encode(),
        served_model="org/served-7b",
        status=200,
        content_type="text/event-stream",
        response_started_at=time.perf_counter(),
        response_chunks=chunks,
        chunk_times=[0.1, 0.15, 0.25, 0.3],
        trace_id="a" * 32,
        span_id="b" * 16,
        parent_span_id="c" * 16,
    )
    ex.changes.append(Change("sampling", "inject", "$.temperature", None, 0.2, "model default"))
    written = store(ex)
    turn = turn_from(written, TurnContext(engine_of=ENGINES.get, capture_content=True))
    assert (turn.outcome, turn.surface, turn.operation, turn.provider, turn.upstream) == (
        "stored",
        "chat",
        "chat",
        "vllm",
        "local",
    )
    assert (turn.public_model, turn.request_model) == ("public", "org/served-7b")
    assert (turn.response_model, turn.response_id, turn.finish_reasons) == ("served-7b-0613", "chatcmpl-42", ("stop",))
    assert (turn.input_tokens, turn.output_tokens, turn.reasoning_tokens, turn.cached_tokens) == (11, 7, 3, 8)
    assert turn.stream and turn.status == 200 and turn.status_class == "2xx" and turn.error_type is None
    assert turn.duration_s == pytest.approx(0.5)
    assert turn.time_to_first_chunk_s == pytest.approx(0.15, abs=1e-6)  # the first chunk with a token
    assert turn.chunk_intervals_s == pytest.approx((0.05, 0.1, 0.05))
    assert turn.request_params == {
        sc.GEN_AI_REQUEST_STREAM: True,
        sc.GEN_AI_REQUEST_TEMPERATURE: 0.2,
        sc.GEN_AI_REQUEST_MAX_TOKENS: 64,
        sc.GEN_AI_REQUEST_STOP_SEQUENCES: ("END",),
        sc.GEN_AI_REQUEST_REASONING_LEVEL: "high",
    }  # n=1 left out, as the conventions say
    assert (turn.trace_id, turn.span_id, turn.parent_span_id) == ("a" * 32, "b" * 16, "c" * 16)
    assert (turn.server_address, turn.server_port) == ("10.0.0.5", 8000)
    assert [c.kind for c in turn.changes] == ["inject"] and turn.repairs == {}
    assert turn.content is not None
    sent = json.loads(turn.content.input_messages)
    assert sent[0]["role"] == "user" and "SECRETSECRET" not in turn.content.input_messages  # redacted
    answer = json.loads(turn.content.output_messages)
    assert answer == [{"role": "assistant", "parts": [{"type": "text", "content": "hello"}], "finish_reason": "stop"}]
    # With export off only the metrics read the Turn: the request body is not parsed, and nothing they read differs.
    lean = turn_from(written, TurnContext(engine_of=ENGINES.get, request_body=False))
    assert (
        lean.request_params == {sc.GEN_AI_REQUEST_STREAM: True}
        and lean.content is None
        and lean.request_model == "org/served-7b"
    )
    metrics_fields = ("public_model", "provider", "upstream", "surface", "operation", "input_tokens", "output_tokens")
    assert [getattr(lean, f) for f in metrics_fields] == [getattr(turn, f) for f in metrics_fields]
    assert (lean.chunk_intervals_s, lean.time_to_first_chunk_s, lean.status_class) == (
        turn.chunk_intervals_s,
        turn.time_to_first_chunk_s,
        turn.status_class,
    )


def test_a_responses_body_and_a_messages_stream(store):
    body = {
        "id": "resp_1",
        "object": "response",
        "model": "served-r",
        "status": "completed",
        "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}],
        "usage": {
            "input_tokens": 20,
            "output_tokens": 5,
            "input_tokens_details": {"cached_tokens": 4},
            "output_tokens_details": {"reasoning_tokens": 2},
        },
    }
    ex = _exchange(
        "/v1/responses",
        {"model": "r", "input": "hi", "reasoning": {"effort": "low"}, "max_output_tokens": 9},
        status=200,
        content_type="application/json",
        response=json.dumps(body).encode(),
    )
    turn = _turn(store, ex)
    assert (turn.surface, turn.operation, turn.response_model, turn.response_id) == (
        "responses",
        "chat",
        "served-r",
        "resp_1",
    )
    assert (turn.input_tokens, turn.output_tokens, turn.reasoning_tokens, turn.cached_tokens) == (20, 5, 2, 4)
    assert turn.request_params[sc.GEN_AI_REQUEST_REASONING_LEVEL] == "low"
    assert turn.request_params[sc.GEN_AI_REQUEST_MAX_TOKENS] == 9
    assert turn.time_to_first_chunk_s is None and turn.chunk_intervals_s == ()
    assert turn.content is None  # not asked for

    message = {"id": "msg_9", "type": "message", "role": "assistant", "model": "claude-ish", "content": []}
    events = [
        named_event({"type": "message_start", "message": message | {"usage": {"input_tokens": 3, "output_tokens": 1}}}),
        named_event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        named_event({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "yo"}}),
        named_event({"type": "content_block_stop", "index": 0}),
        named_event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 6, "cache_read_input_tokens": 10, "cache_creation_input_tokens": 2},
            }
        ),
        named_event({"type": "message_stop"}),
    ]
    thinking = {"type": "enabled", "budget_tokens": 1024}
    ex = _exchange(
        "/v1/messages",
        {"model": "c", "stream": True, "max_tokens": 100, "thinking": thinking, "messages": []},
        status=200,
        content_type="text/event-stream",
        response_chunks=events,
        chunk_times=[0.2, 0.3, 0.4, 0.5, 0.6, 0.7],
    )
    turn = _turn(store, ex)
    assert (turn.surface, turn.response_model, turn.response_id, turn.finish_reasons) == (
        "messages",
        "claude-ish",
        "msg_9",
        ("end_turn",),
    )
    assert (turn.input_tokens, turn.output_tokens, turn.cached_tokens) == (
        15,
        6,
        10,
    )  # cache counted in, per the conventions
    assert turn.cache_write_tokens == 2  # Messages' cache_creation_input_tokens: the conventions' cache_write
    assert json.loads(turn.request_params[sc.GEN_AI_REQUEST_REASONING_LEVEL]) == thinking


@pytest.mark.parametrize(
    "path, request_body, engine, provider",
    [
        # Quick mode without --engine: the provider whose API the client speaks, as the conventions name it.
        ("/v1/chat/completions", {"model": "m", "messages": []}, None, "openai"),
        ("/v1/responses", {"model": "m", "input": "hi"}, None, "openai"),
        ("/v1/completions", {"model": "m", "prompt": "hi"}, None, "openai"),
        ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": []}, None, "anthropic"),
        ("/v1/embeddings", {"model": "m", "input": "hi"}, None, "openai"),
        # An engine tapfix knows (--engine, or an upstream's engine) wins.
        ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": []}, "llama.cpp", "llama.cpp"),
    ],
)
def test_the_provider_name_is_never_missing(store, path, request_body, engine, provider):
    """gen_ai.provider.name is required by the conventions, on spans and on every GenAI metric."""
    from tapfix.proxy.telemetry.config import ExportConfig
    from tapfix.proxy.telemetry.spans import attributes_of

    ex = _exchange(path, request_body, status=200, content_type="application/json", response=b"{}")
    turn = _turn(store, ex, TurnContext(engine_of=lambda _target: engine))
    assert turn.provider == provider
    cfg = ExportConfig("http://r/v1/traces", "http://r/v1/metrics", "http/protobuf", {}, 1.0, "NO_CONTENT", None)
    assert attributes_of(turn, cfg)[sc.GEN_AI_PROVIDER_NAME] == provider


def test_repairs_errors_and_lost_exchanges(store):
    repaired = _exchange("/v1/chat/completions", {"model": "m", "messages": []}, status=200, response=b"{}")
    repaired.content_type = "application/json"
    repaired.changes += [
        Change("toolcalls", "json_repair", "$.choices[0].message.tool_calls[0]", "{", "{}", "closed the object"),
        Change("toolcalls", "json_repair", "$.choices[0].message.tool_calls[1]", "{", "{}", "closed the object"),
        Change("toolcalls", "leaked", "$.choices[0].message.content", "<tool>", None, "tool call written as text"),
        Change("toolcalls", "truncated", "$.choices[0].message.tool_calls[2]", None, None, "unrecoverable (cut off)"),
        Change("toolcalls", "regenerate", "attempt[2]", "truncated", "fresh_seed", "asked again"),
        Change("toolcalls", "skip", "attempt[3]", None, "budget", "no time left"),
        Change("toolcalls", "upstream_error", "$.error", "boom", None, "replaced by tapfix's error"),
    ]
    repaired.flags.add("toolcall_unrecoverable")
    turn = _turn(store, repaired)
    assert turn.repairs == {"json_repair": 2, "leaked": 1}
    assert turn.unrecoverable and turn.error_type == sc.ERROR_UNRECOVERABLE and "toolcall_unrecoverable" in turn.flags

    failed = _exchange("/v1/chat/completions", {"model": "m"}, status=500, response=b'{"error":{"message":"boom"}}')
    failed.content_type = "application/json"
    turn = _turn(store, failed)
    assert (turn.status_class, turn.error_type) == ("5xx", "500")

    unanswered = _exchange("/v1/chat/completions", {"model": "m", "stream": True}, error="connection refused")
    turn = _turn(store, unanswered)
    assert (turn.status, turn.status_class, turn.error_type, turn.response_model) == (
        None,
        "none",
        sc.ERROR_NO_ANSWER,
        None,
    )

    reset = _exchange(
        "/v1/chat/completions",
        {"model": "m", "stream": True},
        status=200,
        content_type="text/event-stream",
        response_chunks=sse_events([chat_chunk({"content": "par"})], done=False),
        chunk_times=[0.1],
    )
    reset.flags.add("upstream_reset")
    assert _turn(store, reset).error_type == sc.ERROR_RESET

    models = _exchange("/v1/models", {}, method="GET", status=200, response=b'{"data":[]}')
    turn = _turn(store, models)
    assert (turn.surface, turn.operation, turn.is_genai) == ("other", "other", False)

    private = _exchange("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}]})
    private.store_bodies, private.status, private.response = False, 200, b"{}"
    turn = _turn(store, private, TurnContext(engine_of=ENGINES.get, capture_content=True))
    assert turn.content is None and not turn.store_bodies  # --no-bodies wins

    lost = turn_from(
        Written(_exchange("/v1/chat/completions", {"model": "m"}, status=200), None, None, "lost"), CONTEXT
    )
    assert (lost.outcome, lost.finish_reasons, lost.input_tokens) == ("lost", (), None)
