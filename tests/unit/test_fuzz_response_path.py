"""Fuzz the response path and the store with hostile bytes: the stream pipeline (SSE split → tool-call
repair → reasoning-field rename), assembly and flags (what the writer derives), the non-stream repair,
and `CaptureWriter` with random exchanges. Nothing may raise; the writer must store every exchange and
give every body back byte for byte.

Extends tests/unit/test_toolcalls_props.py and tests/unit/test_sse.py (which fuzz the stage and splitter alone)
to the composed pipeline and the writer. Long run: `TAPFIX_FUZZ_EXAMPLES=20000 scripts/test tests/test_fuzz_*`.
"""

from __future__ import annotations

import os
import random
from functools import partial

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tapfix.proxy.assemble import assemble, assemble_json, assemble_sse
from tapfix.proxy.assemble.flags import response_flags
from tapfix.proxy.changes import Change
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.response.pipeline import StreamPipeline
from tapfix.proxy.response.reasoning_fields import ReasoningFieldRename
from tapfix.proxy.store.sqlite.database import open_for_reading
from tapfix.proxy.store.sqlite.reader import capture_body, load_capture
from tapfix.proxy.store.writer import CaptureWriter
from tapfix.proxy.toolcalls import ChatToolCallRepair, repair_chat_completion

from tests.support.builders import chat_chunk, rechunk, sse_event, tool, tool_call_delta
from tests.support.depth import examples

EXAMPLES = int(os.environ.get("TAPFIX_FUZZ_EXAMPLES") or examples(150))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
TOOLS = [
    tool("write", {"filePath": {"type": "string"}, "content": {"type": "string"}}, ["filePath", "content"]),
    tool("bash", {"command": {"type": "string"}}),
]
chunk = partial(chat_chunk, id="c")
SEED_CHUNKS = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"reasoning": "Let me"}),
    chunk({"reasoning": " think é"}),
    chunk({"reasoning_content": "old field"}),
    chunk({"content": "I'll write <tool_call>"}),
    chunk({"tool_calls": [tool_call_delta(0, "call_1", "write", "")]}),
    chunk({"tool_calls": [tool_call_delta(0, arguments='{"filePath": "a.txt", ')]}),
    chunk({"tool_calls": [tool_call_delta(0, arguments='"content": "hi 😀\\n"}')]}),
    chunk({}, "tool_calls"),
]
SEED_STREAM = b"".join(
    [
        *map(sse_event, SEED_CHUNKS),
        b": ping\n\n",
        b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9,"total_tokens":12}}\n\n',
        b"data: [DONE]\n\n",
    ]
)
_SEED_CALL = {
    "id": "t",
    "type": "function",
    "function": {"name": "write", "arguments": '{"filePath": "a", "content": 1'},
}
SEED_JSON = orjson.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": None, "reasoning": "r", "tool_calls": [_SEED_CALL]},
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2},
    }
)
JUNK = [
    b"\n",
    b"\r\n",
    b"\n\n",
    b"data: ",
    b"data:",
    b": c\n",
    b"event: x\n",
    b"{",
    b"}",
    b'"',
    b"\\",
    b"\xff",
    b"\xf0\x9f",
    b"[DONE]",
    b'{"error":{"message":"boom","code":500}}',
    b"\x00",
    b"<tool_call>",
    b"</tool_call>",
    b'"tool_calls":[{"index":7}]',
    b'"arguments":"{\\"',
    b"null",
    b"retry: 10\n",
    b"\r",
]


def mutate(data: bytes, rng: random.Random, rounds: int) -> bytes:
    buf = bytearray(data)
    for _ in range(rounds):
        at = rng.randrange(len(buf) + 1)
        op = rng.randrange(5)
        if op == 0 and buf:
            del buf[at : at + rng.randrange(1, 24)]
        elif op == 1:
            buf[at:at] = rng.choice(JUNK)
        elif op == 2 and buf:
            buf[min(at, len(buf) - 1)] = rng.randrange(256)
        elif op == 3 and buf:
            start = rng.randrange(len(buf))
            buf[at:at] = buf[start : start + rng.randrange(1, 120)]
        else:
            buf = buf[:at]
    return bytes(buf)


def run_pipeline(data: bytes, rng: random.Random, stages: bool) -> tuple[bytes, Exchange]:
    ex = Exchange(tools=TOOLS, stream=True, content_type="text/event-stream")
    armed = (
        [
            ChatToolCallRepair(TOOLS, policy=rng.choice(["error", "fail_fast", "passthrough"]), capture_id=ex.id),
            ReasoningFieldRename(*rng.choice([("reasoning", "reasoning_content"), ("reasoning_content", "reasoning")])),
        ]
        if stages
        else []
    )
    pipeline = StreamPipeline(ex, armed)
    out: list[bytes] = []
    for piece in rechunk(data, rng, [1, 2, 3, 7, 64, 500, 4096]):
        got = pipeline(piece)
        assert got != b"", "b'' before the end means end-of-body to mitmproxy"
        out += [got] if isinstance(got, bytes) else got
    end = pipeline(b"")
    out += [end] if isinstance(end, bytes) else end
    assert all(isinstance(p, bytes) for p in out)
    return b"".join(out), ex


@FUZZ
@given(st.integers(0, 2**32), st.integers(0, 10), st.booleans())
def test_pipeline_survives_mutated_streams(salt, rounds, stages):
    rng = random.Random(salt)
    data = mutate(SEED_STREAM, rng, rounds)
    sent, ex = run_pipeline(data, rng, stages)
    assert b"".join(ex.response_chunks) == data  # the upstream tap keeps every byte as it arrived
    if not stages:
        assert sent == data  # nothing armed: byte-exact passthrough (invariant 1)
    for body in (sent, data):  # what the writer derives from either side never raises
        assembled = assemble_sse(body)
        response_flags(assembled, 200, True, tools=TOOLS)


@FUZZ
@given(
    st.binary(max_size=600),
    st.integers(0, 2**32),
    st.sampled_from(["text/event-stream", "application/json", "text/html", "", "application/json; charset=utf-8"]),
)
def test_assembly_and_flags_never_raise(data, salt, content_type):
    rng = random.Random(salt)
    run_pipeline(data, rng, True)
    for body in (data, mutate(SEED_JSON, rng, rng.randrange(6))):
        assembled = assemble(body, content_type)
        assemble_json(body)
        response_flags(assembled, rng.choice([None, 200, 400, 500, 502]), rng.random() < 0.5, tools=TOOLS)


@FUZZ
@given(st.integers(0, 2**32), st.integers(0, 8), st.sampled_from(["error", "fail_fast", "passthrough"]))
def test_non_stream_repair_survives_mutated_bodies(salt, rounds, policy):
    body = mutate(SEED_JSON, random.Random(salt), rounds)
    repaired, changes, outcome = repair_chat_completion(body, TOOLS, capture_id="c", policy=policy)
    assert isinstance(repaired, bytes) and all(isinstance(c, Change) for c in changes)
    if repaired != body:
        orjson.loads(repaired)  # a change is always valid JSON


TEXT = st.text(max_size=30) | st.sampled_from(["Bearer sk-abcdefghijklmnop1234", "é😀", "\x00", "a\nb"])
HEADER = st.tuples(
    st.sampled_from(["authorization", "x-api-key", "user-agent", "x-session-id", "cookie", "x-y"])
    | st.text(min_size=1, max_size=10),
    TEXT,
)
EXCHANGES = st.builds(
    Exchange,
    method=st.sampled_from(["POST", "GET", "", "PATCH"]),
    path=st.sampled_from(["/v1/chat/completions", "/v1/responses?key=sk-secretsecret123", "/", ""]),
    url=TEXT,
    user_agent=TEXT,
    model=st.none() | TEXT,
    served_model=st.none() | TEXT,
    stream=st.booleans(),
    request=st.binary(max_size=300),
    forwarded=st.none() | st.binary(max_size=300),
    request_headers=st.lists(HEADER, max_size=4),
    status=st.none() | st.integers(100, 599),
    response_headers=st.lists(HEADER, max_size=3),
    content_type=st.sampled_from(["text/event-stream", "application/json", "", "x/y"]),
    response_chunks=st.lists(st.binary(max_size=80) | st.just(SEED_STREAM[:200]), max_size=5),
    client_response=st.none() | st.binary(max_size=100),
    error=st.none() | TEXT,
    flags=st.sets(st.sampled_from(["upstream_reset", "x"]), max_size=2),
    session_hint=st.none() | st.sampled_from(["s1", "s2"]),
    store_bodies=st.booleans(),
)


@settings(max_examples=max(examples(20), EXAMPLES // 5), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(EXCHANGES, min_size=1, max_size=8))
def test_writer_stores_any_exchange_and_gives_bodies_back(tmp_path_factory, exchanges):
    path = tmp_path_factory.mktemp("fz") / "c.db"
    writer = CaptureWriter(path)
    for ex in exchanges:
        ex.chunk_times = [0.001 * i for i in range(len(ex.response_chunks))]
        writer.submit(ex)
    writer.close()
    assert writer.health()["failures"] == 0, writer.health()["last_error"]
    conn = open_for_reading(path)
    for ex in exchanges:
        capture = load_capture(conn, ex.id)
        if not ex.store_bodies:
            continue
        assert capture_body(conn, capture, "request") == ex.request
        assert capture_body(conn, capture, "response") == ex.response_body()
        assert capture_body(conn, capture, "client_response") == ex.client_response_body()
    for row in conn.execute("select request_headers, response_headers, path from exchanges"):
        assert all("sk-abcdefghijklmnop1234" not in (col or "") for col in row), row
        assert "sk-secretsecret123" not in row[2]
