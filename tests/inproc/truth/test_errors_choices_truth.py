"""Issue 15 items 3, 4 and three of 10: what the store says about upstream errors, `n > 1` answers,
GET requests and `captures list`, checked through a real `tapfix run` in front of `tapfix mock`.

The mock plays the engines: vLLM's in-stream `data: {"error": …}` (`malformed_sse`
`error_object_midstream`), llama-server's HTTP 400 `exceed_context_size_error` body (`http_error`),
llama-server's error event that ends a stream without `[DONE]` (an inline case whose last object is
the error), the Responses/Messages error events (the same case on those paths), and `n > 1` streams
and bodies (an inline case with several `choices[i].index`; a JSON body served as is).
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from starlette.testclient import TestClient
from tapfix.proxy.browse import create_app

from tests.support.builders import chat_chunk, message_tool_call, tool, tool_call_delta
from tests.support.inproc import InprocMock, InprocProxy, cli, start_mock, start_proxy
from tests.support.procs import wait_capture

TOOLS = [tool("write", {"filePath": {"type": "string"}, "content": {"type": "string"}})]
CONTEXT_ERROR = {
    "error": {
        "code": 400,
        "message": "request (10862 tokens) exceeds the available context size (2048 tokens), try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 10862,
        "n_ctx": 2048,
    }
}
GPU_MESSAGE = 'CUDA error: out of memory (slot 0, "n_past" = 1337)'
OPEN = {"role": "assistant", "content": ""}


def _call_piece(call_id: str, name: str | None = None, arguments: str = "") -> dict[str, Any]:
    """A `delta` whose one tool-call entry is call index 0 of its choice (the opener names it)."""
    return {"tool_calls": [tool_call_delta(0, call_id if name else None, name, arguments)]}


# A tool call cut short by llama-server's error event (the stream then closes without [DONE]).
CUT_CALL = [
    chat_chunk(OPEN, index=0),
    chat_chunk(_call_piece("call-a", "write"), index=0),
    chat_chunk(_call_piece("call-a", arguments='{"filePath": "no'), index=0),
    {"error": {"code": 500, "message": GPU_MESSAGE, "type": "server_error"}},
]
# Four choices, interleaved as vLLM sends them: 0 and 3 call the tool (each its call index 0),
# 1 answers in text, 2 is empty.
N_STREAM = [
    *(chat_chunk(OPEN, index=i) for i in range(4)),
    chat_chunk({"content": "Hello0"}, index=0),
    chat_chunk({"content": "Hello1"}, index=1),
    chat_chunk(_call_piece("call-0", "write"), index=0),
    chat_chunk(_call_piece("call-3", "write"), index=3),
    chat_chunk(_call_piece("call-0", arguments='{"filePath": "a.txt", '), index=0),
    chat_chunk(_call_piece("call-3", arguments='{"filePath": "b.txt", '), index=3),
    chat_chunk({"content": " there"}, index=1),
    chat_chunk(_call_piece("call-3", arguments='"content": "B"}'), index=3),
    chat_chunk(_call_piece("call-0", arguments='"content": "A"}'), index=0),
    chat_chunk({}, "stop", index=1),
    chat_chunk({}, "stop", index=2),
    chat_chunk({}, "tool_calls", index=0),
    chat_chunk({}, "tool_calls", index=3),
]


N_BODY = {
    "id": "chatcmpl-nbody",
    "object": "chat.completion",
    "created": 1767000000,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [message_tool_call(json.dumps({"filePath": "a.txt", "content": "A"}), "c0", "write")],
            },
            "finish_reason": "tool_calls",
        },
        {"index": 1, "message": {"role": "assistant", "content": "Hello1"}, "finish_reason": "stop"},
        {
            "index": 2,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [message_tool_call(json.dumps({"filePath": "b.txt", "content": "B"}), "c2", "write")],
            },
            "finish_reason": "tool_calls",
        },
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 30, "total_tokens": 40},
}
SCENARIO = {
    "description": "tests/inproc/truth/test_errors_choices_truth.py: one behaviour per model name",
    "rules": [
        {"when": {"model": "vllm-midstream"}, "do": "malformed_sse", "kind": "error_object_midstream"},
        {"when": {"model": "llama-context"}, "do": "http_error", "status": 400, "body": CONTEXT_ERROR},
        {"when": {"model": "cut-call"}, "do": "serve_case", "case": {"stream": CUT_CALL}},
        {"when": {"model": "cut-call-gz"}, "do": "serve_case", "case": {"stream": CUT_CALL}, "compress": "gzip"},
        {
            "when": {"model": "llama-context-br"},
            "do": "http_error",
            "status": 400,
            "body": CONTEXT_ERROR,
            "compress": "br",
        },
        {"when": {"model": "n-stream"}, "do": "serve_case", "case": {"stream": N_STREAM}},
        {
            "when": {"model": "n-body"},
            "do": "garbage",  # sends `body` as is: here a well-formed n > 1 chat.completion
            "body": json.dumps(N_BODY),
            "content_type": "application/json",
        },
    ],
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InprocMock, InprocProxy]]:
    tmp = tmp_path_factory.mktemp("truth-errors")
    scenario = tmp / "scenario.json"
    scenario.write_text(json.dumps(SCENARIO))
    mock = start_mock(tmp, "--scenario", str(scenario))
    proxy = start_proxy(tmp, mock.url, shared=True)
    yield mock, proxy
    proxy.stop()
    mock.stop()


def _chat(model: str, *, stream: bool = True, tools: bool = False, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "stream": stream,
        "messages": [{"role": "user", "content": "write a.txt with A"}],
        **extra,
    }
    return {**body, "tools": TOOLS} if tools else body


def _post(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=30) as r:
        return r.status_code, dict(r.headers), b"".join(r.iter_raw())


def _db(proxy: InprocProxy) -> Path:
    db: Path = proxy.extra["db"]
    return db


def _show(proxy: InprocProxy, capture_id: str, *args: str) -> str:
    wait_capture(_db(proxy), capture_id)  # the writer commits within its batch window
    result = cli("captures", "show", capture_id, "--db", str(_db(proxy)), *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.decode()


def _listed(proxy: InprocProxy, *args: str) -> list[str]:
    result = cli("captures", "list", "--db", str(_db(proxy)), "--limit", "0", "--json", *args)
    assert result.returncode == 0, result.stderr
    return [json.loads(line)["id"] for line in result.stdout.splitlines()]


def _browse_ids(db: Path, query: str) -> list[str]:
    with TestClient(create_app(db, background_index=False), base_url="http://127.0.0.1") as client:
        page = client.get(f"/?{query}")
        assert page.status_code == 200
        return re.findall(r'<a class="id" href="/exchange/([0-9a-z]+)">', page.text)


def _stats_errors(db: Path, model: str) -> int:
    from tapfix.proxy.store.filters import Filters
    from tapfix.proxy.store.locator import StoreLocator

    stats = StoreLocator.of(db).backend().browse(search=False).compute_stats(Filters(model=model))
    return sum(row["errors"] or 0 for row in stats.by_client_model)


def _sse_errors(body: bytes) -> list[dict[str, Any]]:
    out = []
    for line in body.splitlines():
        if line.startswith(b"data: {"):
            obj = json.loads(line[6:])
            if isinstance(obj, dict) and "error" in obj:
                out.append(obj["error"])
    return out


def _schema() -> Draft202012Validator:
    return Draft202012Validator(json.loads((files("tapfix.schemas") / "capture.schema.json").read_text()))


def _assert_upstream_error(proxy: InprocProxy, capture_id: str, engine: dict[str, Any], model: str) -> None:
    row = wait_capture(_db(proxy), capture_id)
    stored = json.loads(row["error"] or "null")
    assert stored == engine, f"the engine's own error object, as sent: {row['error']!r}"
    assert "upstream_error" in json.loads(row["flags"])
    assert capture_id in _listed(proxy, "--flag", "upstream_error")
    assert engine["message"] in _show(proxy, capture_id)  # verbatim, not JSON-escaped
    shown = json.loads(_show(proxy, capture_id, "--json"))
    _schema().validate(shown)
    assert shown["upstream_error"] == engine
    assert capture_id in _browse_ids(_db(proxy), "status=error")
    assert _stats_errors(_db(proxy), model) >= 1


def _choices(db: Path, capture_id: str) -> list[dict[str, Any]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute(
            'select "index", content, reasoning, tool_calls, finish_reason, flags from choices'
            ' where exchange_id = ? order by "index"',
            (capture_id,),
        ).fetchall()
    finally:
        conn.close()
    return [
        {**dict(r), "tool_calls": json.loads(r["tool_calls"] or "[]"), "flags": json.loads(r["flags"])} for r in rows
    ]


def _args(call: dict[str, Any]) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(call["arguments"])
    return parsed


# -- item 3: upstream errors are first-class ----------------------------------------------------------
def test_truth_3_midstream_error_event(stack: tuple[InprocMock, InprocProxy]) -> None:
    mock, proxy = stack
    _, _, direct = _post(mock.url, "/v1/chat/completions", _chat("vllm-midstream"))
    status, headers, received = _post(proxy.url, "/v1/chat/completions", _chat("vllm-midstream"))
    assert status == 200 and received == direct  # the client gets the engine's bytes unchanged
    (engine,) = _sse_errors(direct)
    _assert_upstream_error(proxy, headers["x-tapfix-capture-id"], engine, "vllm-midstream")


def test_truth_3_http_error_body(stack: tuple[InprocMock, InprocProxy]) -> None:
    _, proxy = stack
    status, headers, received = _post(proxy.url, "/v1/chat/completions", _chat("llama-context", stream=False))
    assert status == 400 and json.loads(received) == CONTEXT_ERROR
    _assert_upstream_error(proxy, headers["x-tapfix-capture-id"], CONTEXT_ERROR["error"], "llama-context")


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses"])
def test_truth_3_evented_error_event(stack: tuple[InprocMock, InprocProxy], path: str) -> None:
    mock, proxy = stack
    if path == "/v1/messages":
        body: dict[str, Any] = {
            "model": "cut-call",
            "max_tokens": 64,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
    else:
        body = {"model": "cut-call", "stream": True, "input": "hi"}
    _, _, direct = _post(mock.url, path, body)
    status, headers, received = _post(proxy.url, path, body)
    assert status == 200 and received == direct
    row = wait_capture(_db(proxy), headers["x-tapfix-capture-id"])
    stored = json.loads(row["error"] or "null")
    assert isinstance(stored, dict) and stored.get("message") == GPU_MESSAGE, row["error"]
    assert "upstream_error" in json.loads(row["flags"])
    assert GPU_MESSAGE in _show(proxy, row["id"])


def test_truth_3_cut_tool_call_quotes_upstream_error(stack: tuple[InprocMock, InprocProxy]) -> None:
    _, proxy = stack
    status, headers, received = _post(proxy.url, "/v1/chat/completions", _chat("cut-call", tools=True))
    assert status == 200
    sent = _sse_errors(received)
    assert sent and sent[-1]["type"] == "server_error"  # still retryable
    assert GPU_MESSAGE in sent[-1]["message"] and "broke off" not in sent[-1]["message"], sent[-1]["message"]
    row = wait_capture(_db(proxy), headers["x-tapfix-capture-id"])
    # The store keeps the engine's error (what the upstream sent), not tapfix's replacement.
    assert json.loads(row["error"] or "null") == CUT_CALL[-1]["error"]
    assert "upstream_error" in json.loads(row["flags"])


def test_truth_3_compressed_upstream_error_is_read_decoded(stack: tuple[InprocMock, InprocProxy]) -> None:
    """An engine that compresses anyway (item 5) still has its error read: from the decoded stream when
    tapfix changed it (a cut tool call), from the decoded body of an error status."""
    _, proxy = stack
    status, headers, received = _post(proxy.url, "/v1/chat/completions", _chat("cut-call-gz", tools=True))
    assert status == 200 and "content-encoding" not in headers  # the repair stage sent it decoded
    assert GPU_MESSAGE in _sse_errors(received)[-1]["message"]
    row = wait_capture(_db(proxy), headers["x-tapfix-capture-id"])
    assert json.loads(row["error"] or "null") == CUT_CALL[-1]["error"]
    assert "upstream_error" in json.loads(row["flags"])

    status, headers, _ = _post(proxy.url, "/v1/chat/completions", _chat("llama-context-br", stream=False))
    assert status == 400
    _assert_upstream_error(proxy, headers["x-tapfix-capture-id"], CONTEXT_ERROR["error"], "llama-context-br")


# -- item 4: n > 1 assembled per choice ----------------------------------------------------------------
def test_truth_4_n_stream_per_choice(stack: tuple[InprocMock, InprocProxy]) -> None:
    mock, proxy = stack
    body = _chat("n-stream", tools=True, n=4)
    _, _, direct = _post(mock.url, "/v1/chat/completions", body)
    status, headers, received = _post(proxy.url, "/v1/chat/completions", body)
    assert status == 200 and received == direct  # four valid choices: nothing to repair, nothing merged
    capture_id = headers["x-tapfix-capture-id"]
    row = wait_capture(_db(proxy), capture_id)
    assert row["content"] == "Hello0" and row["finish_reason"] == "tool_calls"
    (call,) = json.loads(row["tool_calls"])
    assert call["name"] == "write" and _args(call) == {"filePath": "a.txt", "content": "A"}
    choices = _choices(_db(proxy), capture_id)
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [c["content"] for c in choices] == ["Hello0", "Hello1 there", "", ""]
    assert [c["finish_reason"] for c in choices] == ["tool_calls", "stop", "stop", "tool_calls"]
    assert _args(choices[3]["tool_calls"][0]) == {"filePath": "b.txt", "content": "B"}
    assert choices[1]["tool_calls"] == [] and choices[2]["tool_calls"] == []
    assert [c["flags"] for c in choices] == [[], [], ["empty_answer"], []]  # per choice
    assert "invalid_tool_call" not in json.loads(row["flags"])
    shown = json.loads(_show(proxy, capture_id, "--json"))
    _schema().validate(shown)
    assert [c["content"] for c in shown["choices"]] == ["Hello0", "Hello1 there", "", ""]
    assert shown["choices"][2]["flags"] == ["empty_answer"]
    text = _show(proxy, capture_id)
    assert all(f"choice {i}" in text for i in range(4)) and "Hello1 there" in text and "b.txt" in text


def test_truth_4_n_body_per_choice(stack: tuple[InprocMock, InprocProxy]) -> None:
    mock, proxy = stack
    body = _chat("n-body", stream=False, tools=True, n=3)
    _, _, direct = _post(mock.url, "/v1/chat/completions", body)
    status, headers, received = _post(proxy.url, "/v1/chat/completions", body)
    assert status == 200 and json.loads(received) == json.loads(direct) == N_BODY
    capture_id = headers["x-tapfix-capture-id"]
    row = wait_capture(_db(proxy), capture_id)
    assert row["content"] == "" and [c["id"] for c in json.loads(row["tool_calls"])] == ["c0"]
    assert "invalid_tool_call" not in json.loads(row["flags"])
    choices = _choices(_db(proxy), capture_id)
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert choices[1]["content"] == "Hello1" and choices[1]["tool_calls"] == []
    assert [c["id"] for c in choices[2]["tool_calls"]] == ["c2"]
    assert [c["flags"] for c in choices] == [[], [], []]
    shown = json.loads(_show(proxy, capture_id, "--json"))
    assert [c["index"] for c in shown["choices"]] == [0, 1, 2]


# -- item 10: three small ones ---------------------------------------------------------------------------
def test_truth_10_get_not_empty_request_body(stack: tuple[InprocMock, InprocProxy]) -> None:
    _, proxy = stack
    r = httpx.get(f"{proxy.url}/v1/models", timeout=10)
    assert r.status_code == 200
    row = wait_capture(_db(proxy), r.headers["x-tapfix-capture-id"])
    assert row["method"] == "GET" and "empty_request_body" not in json.loads(row["flags"])


def test_truth_10_list_unknown_flag(stack: tuple[InprocMock, InprocProxy]) -> None:
    _, proxy = stack
    r = httpx.post(f"{proxy.url}/v1/chat/completions", json=_chat("plain", stream=False), timeout=30)
    wait_capture(_db(proxy), r.headers["x-tapfix-capture-id"])
    known = {
        flag
        for line in cli("captures", "list", "--db", str(_db(proxy)), "--limit", "0", "--json").stdout.splitlines()
        for flag in json.loads(line)["flags"]
    }
    assert known, "the store has flagged captures"
    result = cli("captures", "list", "--db", str(_db(proxy)), "--flag", "no_such_flag")
    out = result.stdout.decode() + result.stderr.decode()
    assert "no captures yet" not in out
    assert "no_such_flag" in out and all(flag in out for flag in known), out


def test_truth_10_list_time_has_date(stack: tuple[InprocMock, InprocProxy]) -> None:
    _, proxy = stack
    r = httpx.post(f"{proxy.url}/v1/chat/completions", json=_chat("plain", stream=False), timeout=30)
    row = wait_capture(_db(proxy), r.headers["x-tapfix-capture-id"])
    result = cli("captures", "list", "--db", str(_db(proxy)), "--limit", "0")
    assert result.returncode == 0, result.stderr
    header, *lines = result.stdout.decode().splitlines()
    (line,) = [line for line in lines if line.startswith(row["id"])]
    time_column = line[header.index("TIME") :].split("  ")[0]
    assert re.search(r"\d{4}-\d{2}-\d{2}", time_column), line
    assert row["started_at"][:10] in time_column
