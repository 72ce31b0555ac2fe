"""Issue 37 against an upstream that speaks Ollama's bytes: its window read at start from `GET /api/ps` (or
`POST /api/show`) and logged; a prompt it silently cut to num_ctx is flagged `prompt_truncated` (the capture,
`captures list --flag`, a log line), streamed or not; `tapfix check` prints its window.

The shapes are Ollama's own: `/api/ps` and `/api/show` as docs.ollama.com/api/ps and /api/show give them;
the chat answers as `openai/openai.go` (ToChatCompletion, ToChunk, ToUsage: usage.prompt_tokens is the
runner's prompt_eval_count) and its middleware write them; the cut as `runner/ollamarunner/runner.go`
(NewSequence: a prompt longer than num_ctx keeps num_ctx tokens, and reports that many)."""

from __future__ import annotations

import json
import re
import time
from functools import partial

import httpx
import openai
import orjson
import pytest

from tests.support.builders import DONE, chat_chunk, sse_event
from tests.support.config_text import toml_table
from tests.support.inproc import cli, start_proxy
from tests.support.procs import wait_capture
from tests.support.rawserver import RawRequest, RawServer, framed

MODEL = "qwen3:8b"
NUM_CTX = 512
LOADED = {"num_ctx": NUM_CTX, "loaded": True}  # the window the fake Ollama runs the model with; loaded yet


def tokens(messages: list[dict]) -> int:
    """The fake Ollama's tokenizer: a token per word and per message (its template's)."""
    return sum(len(str(m.get("content", "")).split()) + 4 for m in messages)


def _json(body: bytes, status: int = 200) -> list[tuple[float, bytes]]:
    head = b"HTTP/1.1 %d OK\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: %d\r\n\r\n"
    return [(0.0, head % (status, len(body)) + body)]


chunk = partial(chat_chunk, id="chatcmpl-386", created=1796530149, model=MODEL, system_fingerprint="fp_ollama")


def ollama(request: RawRequest) -> list[tuple[float, bytes]]:
    if request.path == "/api/ps" and not LOADED["loaded"]:
        return _json(b'{"models":[]}')  # Ollama loads a model on its first request
    if request.path == "/api/ps":
        loaded = {
            "name": MODEL,
            "model": MODEL,
            "size": 6591830464,
            "digest": "a2af6c",
            "context_length": LOADED["num_ctx"],
        }
        return _json(orjson.dumps({"models": [loaded | {"expires_at": "2026-12-06T12:00:00Z", "size_vram": 0}]}))
    if request.path == "/api/show":
        info = {"general.architecture": "qwen3", "qwen3.context_length": 40960}
        return _json(orjson.dumps({"parameters": 'stop "<|im_end|>"', "model_info": info}))
    if request.path == "/v1/models":
        return _json(
            orjson.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "library"}]})
        )
    body = json.loads(request.body)
    LOADED["loaded"] = True
    prompt = min(tokens(body["messages"]), LOADED["num_ctx"])  # what survives the cut, and what it reports
    usage = {"prompt_tokens": prompt, "completion_tokens": 2, "total_tokens": prompt + 2}
    if not body.get("stream"):
        message = {"role": "assistant", "content": "Sure."}
        answer = {"id": "chatcmpl-386", "object": "chat.completion", "created": 1796530149, "model": MODEL}
        answer |= {
            "system_fingerprint": "fp_ollama",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        }
        return _json(json.dumps(answer | {"usage": usage}, separators=(",", ":")).encode())
    chunks = [
        chunk({"role": "assistant", "content": "Sure"}),
        chunk({"role": "assistant", "content": "."}),
        chunk({"role": "assistant", "content": ""}, "stop"),
    ]
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append(chunk() | {"choices": [], "usage": usage})
    events = [*map(sse_event, chunks), DONE]
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return [(0.0, head)] + [(0.0, framed(e)) for e in events] + [(0.0, b"0\r\n\r\n")]


@pytest.fixture
def upstream():
    LOADED.update(num_ctx=NUM_CTX, loaded=True)
    server = RawServer(ollama)
    yield server
    server.close()


def wait_log(proxy, pattern: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := re.search(pattern, proxy.log()):
            return found.group(0)
        time.sleep(0.05)
    raise AssertionError(f"{pattern!r} not in the log:\n{proxy.log()}")


def flags(proxy, capture_id: str) -> list[str]:
    return json.loads(wait_capture(proxy.extra["db"], capture_id)["flags"])


LONG = [
    {"role": "system", "content": "You are opencode. Follow these rules. " * 120},
    {"role": "user", "content": "fix it"},
]


def test_a_prompt_ollama_cut_is_flagged_and_one_it_did_not_is_not(tmp_path, upstream):
    proxy = start_proxy(tmp_path, upstream.url, "--engine", "ollama")
    try:
        wait_log(proxy, rf"window of {re.escape(MODEL)} on \S+: {NUM_CTX} tokens \(GET /api/ps\)")
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=LONG)
        assert raw.parse().choices[0].message.content == "Sure."  # the client gets the engine's answer
        cut = raw.headers["x-tapfix-capture-id"]
        assert "prompt_truncated" in flags(proxy, cut)
        wait_log(proxy, rf"capture {cut}: the engine reported {NUM_CTX} prompt tokens for a prompt of at least \d+")
        short = client.chat.completions.with_raw_response.create(model=MODEL, messages=[LONG[1]])
        assert "prompt_truncated" not in flags(proxy, short.headers["x-tapfix-capture-id"])
        listed = cli("captures", "list", "--flag", "prompt_truncated", "--json", "--db", str(proxy.extra["db"]))
        assert [json.loads(line)["id"] for line in listed.stdout.decode().splitlines()] == [cut]
        counted = r'^tapfix_prompt_truncated_total\{[^}]*model="qwen3:8b"[^}]*\} 1(\.0)?$'
        deadline = time.monotonic() + 10  # the writer's observer counts it after the commit
        while not re.search(counted, metrics := httpx.get(f"{proxy.url}/tapfix/metrics", timeout=10).text, re.M):
            assert time.monotonic() < deadline, metrics
            time.sleep(0.05)
    finally:
        proxy.stop()


def test_a_streamed_cut_is_flagged_from_the_usage_the_client_did_not_ask_for(tmp_path, upstream):
    proxy = start_proxy(tmp_path, upstream.url, "--engine", "ollama")
    try:
        wait_log(proxy, rf"window of {re.escape(MODEL)}")
        body = {"model": MODEL, "messages": LONG, "stream": True}
        with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", json=body, timeout=30) as response:
            received = response.read()
            capture_id = response.headers["x-tapfix-capture-id"]
        assert b'"usage"' not in received and received.endswith(b"data: [DONE]\n\n")
        row = wait_capture(proxy.extra["db"], capture_id)
        assert row["prompt_tokens"] == NUM_CTX and "prompt_truncated" in json.loads(row["flags"])
    finally:
        proxy.stop()


def test_a_model_not_loaded_at_start_has_its_window_read_again_once_it_answered(tmp_path, upstream):
    """At start only `/api/show` knows the model (its own maximum, 40,960): the first answer loads it, and
    tapfix reads `/api/ps` again at once for the window it runs with, so the next cut is flagged."""
    LOADED["loaded"] = False
    proxy = start_proxy(tmp_path, upstream.url, "--engine", "ollama")
    try:
        wait_log(proxy, rf"window of {re.escape(MODEL)} on \S+: 40,960 tokens \(POST /api/show\)")
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        client.chat.completions.create(model=MODEL, messages=[LONG[1]])
        wait_log(proxy, rf"window of {re.escape(MODEL)} on \S+: {NUM_CTX} tokens \(GET /api/ps\)")
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=LONG)
        assert "prompt_truncated" in flags(proxy, raw.headers["x-tapfix-capture-id"])
    finally:
        proxy.stop()


def test_windows_are_read_again_on_a_timer(tmp_path, upstream, monkeypatch):
    """The model reloaded with a larger window (`ollama ps` shows it): tapfix reads it again without a request
    asking, and a prompt that now fits is not flagged."""
    monkeypatch.setattr("tapfix.addons.window.REFRESH_S", 0.2)
    proxy = start_proxy(tmp_path, upstream.url, "--engine", "ollama")
    try:
        wait_log(proxy, rf"window of {re.escape(MODEL)} on \S+: {NUM_CTX} tokens")
        LOADED["num_ctx"] = 2048
        wait_log(proxy, rf"window of {re.escape(MODEL)} on \S+: 2,048 tokens \(GET /api/ps\)")
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=LONG)
        assert "prompt_truncated" not in flags(proxy, raw.headers["x-tapfix-capture-id"])
    finally:
        proxy.stop()


def test_check_prints_the_ollama_window(tmp_path, upstream):
    config = tmp_path / "tapfix.toml"
    config.write_text(
        toml_table("upstreams.box", base_url=f"{upstream.url}/v1", engine="ollama")
        + toml_table("models.coder", upstream="box", upstream_model=MODEL)
    )
    result = cli("check", "--config", str(config))
    lines = {line.split()[1]: line for line in result.stdout.decode().splitlines() if line.startswith("model ")}
    assert f"window {NUM_CTX} tokens (GET /api/ps)" in lines["coder"], result.stdout
