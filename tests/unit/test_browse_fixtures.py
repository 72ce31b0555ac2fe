"""Capture databases for the browser's tests, written by the real `CaptureWriter`.

One opencode session of three streamed turns (a sampling injection, a repaired tool call, a stall
and a runaway length), a plain OpenAI SDK call and its replay, an upstream error, a request without
sampling parameters, and one capture full of XSS payloads.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import orjson
from tapfix.proxy.changes import Change
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.builders import chat_chunk, message_tool_call, sse_events, tool_call_delta

XSS_TEXT = "<script>document.title='pwned'</script>"
XSS_IMG = "<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">"
XSS = XSS_TEXT + XSS_IMG
OPENCODE = "opencode/0.4.2 ai-sdk/4.3.16"
SDK = "OpenAI/Python 1.82.0"


@dataclass
class Built:
    path: Path
    ids: dict[str, str] = field(default_factory=dict)


# The tool the first capture offers: a bare name, no `parameters` (test data, kept as sent).
READ_WITHOUT_SCHEMA = {"type": "function", "function": {"name": "read"}}
# The upstream of these captures: chunk id c1, model qwen3, no `created`.
chunk = partial(chat_chunk, id="c1", model="qwen3", created=None)


def body(messages: list[dict], **extra: object) -> bytes:
    return orjson.dumps({"model": "qwen3", "messages": messages, "stream": True, **extra})


def _exchange(
    started: float,
    *,
    ua: str = OPENCODE,
    model: str = "qwen3",
    stream: bool = True,
    request: bytes = b"",
    headers: list[tuple[str, str]] | None = None,
    **kw: object,
) -> Exchange:
    mark = time.perf_counter()
    ex = Exchange(
        started_at=started,
        method="POST",
        path="/v1/chat/completions",
        url="http://127.0.0.1:8080/v1/chat/completions",
        upstream_url="http://127.0.0.1:8000/v1/chat/completions",
        user_agent=ua,
        model=model,
        stream=stream,
        request=request,
        client_addr="127.0.0.1",
        request_headers=[
            ("user-agent", ua),
            ("authorization", "Bearer sk-very-secret-key"),
            *(headers or []),
        ],
        status=200,
        mark=mark,
        response_started_at=mark + 0.05,
    )
    ex.response_headers = [("content-type", "text/event-stream" if stream else "application/json")]
    ex.content_type = ex.response_headers[0][1]
    for key, value in kw.items():
        setattr(ex, key, value)
    if ex.chunk_times:
        ex.ended_at = mark + ex.chunk_times[-1] + 0.01
    else:
        ex.ended_at = mark + 0.3
    return ex


def build_db(path: Path, *, now: float | None = None) -> Built:
    built = Built(path)
    writer = CaptureWriter(path)
    for name, ex in browse_exchanges(now).items():
        writer.submit(ex)
        built.ids[name] = ex.id
    writer.close()
    return built


def browse_exchanges(now: float | None = None) -> dict[str, Exchange]:
    """The exchanges of `build_db` by name, in write order."""
    now = now or time.time() - 600
    system = {"role": "system", "content": "You are opencode, a coding agent."}
    user1 = {"role": "user", "content": "Fix the flaky test in parser_test.py"}
    session = [("x-session-id", "ses_opencode_1")]

    b1 = body([system, user1], tools=[READ_WITHOUT_SCHEMA])
    fwd1 = b1[:-1] + b',"temperature":0.6,"top_p":0.95}'
    chunks1 = sse_events(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Let me "}),
            chunk({"content": "look at the parser."}),
            chunk({}, "stop", usage={"prompt_tokens": 120, "completion_tokens": 9}),
        ]
    )
    ex1 = _exchange(
        now,
        request=b1,
        forwarded=fwd1,
        headers=session,
        response_chunks=chunks1,
        chunk_times=[0.40, 0.42, 0.45, 0.47, 0.48],
        changes=[
            Change("sampling", "inject", "$.temperature", None, 0.6, "generation_config.json"),
            Change("sampling", "inject", "$.top_p", None, 0.95, "generation_config.json"),
        ],
        flags={"no_sampling_params"},
    )
    assistant1 = {"role": "assistant", "content": "Let me look at the parser."}
    user2 = {"role": "user", "content": "Go ahead, read tokenizer.py first"}
    b2 = body([system, user1, assistant1, user2])
    call_args_bad = '{"path": "tokenizer.py"}{"path": "tokenizer.py"}'
    chunks2 = sse_events(
        [
            chunk({"tool_calls": [tool_call_delta(0, "call_1", "read", '{"path": "tokenizer.py"}')]}),
            chunk({}, "tool_calls", usage={"prompt_tokens": 160, "completion_tokens": 14}),
        ]
    )
    ex2 = _exchange(
        now + 5,
        request=b2,
        headers=session,
        response_chunks=chunks2,
        chunk_times=[0.9, 0.95, 1.0],
        changes=[
            Change(
                "toolcalls",
                "concatenated_json",
                "$.choices[0].tool_calls[0].function.arguments",
                call_args_bad,
                '{"path": "tokenizer.py"}',
                "two JSON objects glued together",
            )
        ],
    )
    tool_result = {"role": "tool", "tool_call_id": "call_1", "content": "def tokenize(s): return s.split()"}
    assistant2 = {
        "role": "assistant",
        "content": None,
        "tool_calls": [message_tool_call('{"path": "tokenizer.py"}', "call_1", "read")],
    }
    b3 = body([system, user1, assistant1, user2, assistant2, tool_result])
    words = [chunk({"content": f"word{i} "}) for i in range(40)]
    times = [0.3 + 0.02 * i for i in range(20)] + [2.9 + 0.02 * i for i in range(20)] + [3.5, 3.52]
    ex3 = _exchange(
        now + 9,
        request=b3,
        headers=session,
        response_chunks=sse_events(
            [*words, chunk({}, "length", usage={"prompt_tokens": 200, "completion_tokens": 40})]
        ),
        chunk_times=times,
    )
    sdk_body = orjson.dumps(
        {
            "model": "llama-3.1-8b",
            "temperature": 0.2,
            "messages": [{"role": "user", "content": "What is the capital of Australia?"}],
        }
    )
    sdk_response = orjson.dumps(
        {
            "id": "r1",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "Canberra is the capital."},
                }
            ],
            "usage": {"prompt_tokens": 15, "completion_tokens": 6},
        }
    )
    ex4 = _exchange(now + 20, ua=SDK, model="llama-3.1-8b", stream=False, request=sdk_body, response=sdk_response)
    ex5 = _exchange(
        now + 30,
        ua="tapfix-replay/0.1",
        model="llama-3.1-8b",
        stream=False,
        request=sdk_body,
        response=sdk_response,
        tags={"replay"},
        source_id=ex4.id,
    )
    ex6 = _exchange(
        now + 40,
        ua=SDK,
        model="llama-3.1-8b",
        stream=False,
        request=orjson.dumps(
            {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "Summarise the zebra report"}]}
        ),
        response=b'{"error": {"message": "upstream overloaded"}}',
        error="upstream: 502 Bad Gateway",
    )
    ex6.status = 502
    xss_body = orjson.dumps({"model": "qwen3", "messages": [{"role": "user", "content": "payload " + XSS}]})
    ex7 = _exchange(
        now + 50,
        ua="evil-agent/1.0 " + XSS,
        stream=True,
        request=xss_body,
        headers=[("x-note", XSS)],
        response_chunks=sse_events(
            [
                chunk({"reasoning_content": "thinking " + XSS}),
                chunk({"content": "answer " + XSS}),
                chunk({"tool_calls": [tool_call_delta(0, "x1", XSS, '{"a": 1}')]}),
                chunk({}, "stop"),
            ]
        ),
        chunk_times=[0.1, 0.2, 0.3, 0.31, 0.32],
        changes=[Change("toolcalls", "bad_name", "$.choices[0].tool_calls[0]", XSS, XSS, XSS)],
        flags={"xss_" + "flag"},
    )
    return {"turn1": ex1, "turn2": ex2, "turn3": ex3, "sdk": ex4, "replay": ex5, "error": ex6, "xss": ex7}


def test_fixture_db_is_complete(tmp_path: Path) -> None:
    built = build_db(tmp_path / "t.db")
    conn = sqlite3.connect(built.path)
    assert conn.execute("select count(*) from exchanges").fetchone()[0] == 7
    rows = dict(conn.execute("select id, session_id from exchanges"))
    assert rows[built.ids["turn1"]] == rows[built.ids["turn3"]] == "ses_opencode_1"
    assert conn.execute("select count(*) from changes where stage = 'toolcalls'").fetchone()[0] == 2
    flags = conn.execute("select flags from exchanges where id = ?", (built.ids["turn3"],)).fetchone()[0]
    assert "runaway_length" in flags
    assert "sk-very-secret-key" not in str(conn.execute("select request_headers from exchanges").fetchall())
