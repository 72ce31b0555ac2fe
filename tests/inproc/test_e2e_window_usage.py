"""Issue 37, usage always: a streamed chat completion whose client didn't ask for usage is sent upstream with
`stream_options.include_usage` (a recorded change), so the capture has the engine's token counts; the client
gets the stream it would have got without the option (the mock writes vLLM's bytes both ways). A client that
asked gets its usage chunk, and its request goes upstream as it came."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

from tests.support.inproc import cli, start_mock, start_proxy
from tests.support.procs import wait_capture

MESSAGES = [{"role": "user", "content": "Please write hello.py."}]


@pytest.fixture
def mock(tmp_path):
    handle = start_mock(tmp_path)
    yield handle
    handle.stop()


def stream(url: str, **extra) -> tuple[bytes, httpx.Headers]:
    body = {"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": 40} | extra
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as response:
        return response.read(), response.headers


def same_but_ids(a: bytes, b: bytes) -> bool:
    def plain(body: bytes) -> bytes:
        return re.sub(rb'"(id|created)":("[^"]*"|\d+)', b"", body)

    return plain(a) == plain(b)


def test_the_capture_has_usage_and_the_client_gets_the_stream_it_asked_for(tmp_path, mock):
    proxy = start_proxy(tmp_path, mock.url, "--engine", "vllm")
    try:
        received, headers = stream(proxy.url)
        direct, _ = stream(mock.url)
        assert b'"usage"' not in received and same_but_ids(received, direct)
        capture_id = headers["x-tapfix-capture-id"]
        row = wait_capture(proxy.extra["db"], capture_id)
        assert row["prompt_tokens"] and row["completion_tokens"]
        db = str(proxy.extra["db"])
        forwarded = json.loads(cli("captures", "export", capture_id, "--forwarded", "--db", db).stdout)
        assert forwarded["stream_options"] == {"include_usage": True}
        shown = cli("captures", "show", capture_id, "--db", db).stdout.decode()
        assert "[window] set $.stream_options.include_usage" in shown and "[window] strip usage chunk" in shown
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True, max_tokens=20))
        assert chunks and all(c.usage is None and c.choices for c in chunks)
    finally:
        proxy.stop()


def test_a_client_that_asked_gets_its_usage_chunk_and_its_request_unchanged(tmp_path, mock):
    proxy = start_proxy(tmp_path, mock.url, "--engine", "vllm")
    try:
        received, headers = stream(proxy.url, stream_options={"include_usage": True})
        direct, _ = stream(mock.url, stream_options={"include_usage": True})
        assert b'"choices":[],"usage":' in received and same_but_ids(received, direct)
        row = wait_capture(proxy.extra["db"], headers["x-tapfix-capture-id"])
        shown = cli("captures", "show", headers["x-tapfix-capture-id"], "--db", str(proxy.extra["db"])).stdout.decode()
        assert row["prompt_tokens"] and "[window]" not in shown  # the body went upstream as it came
    finally:
        proxy.stop()


def test_an_unknown_engine_is_not_sent_the_option(tmp_path, mock):
    proxy = start_proxy(tmp_path, mock.url)  # quick mode without --engine: a field it may refuse isn't sent
    try:
        received, headers = stream(proxy.url)
        assert b'"usage"' not in received
        capture_id = headers["x-tapfix-capture-id"]
        wait_capture(proxy.extra["db"], capture_id)
        assert "[window]" not in cli("captures", "show", capture_id, "--db", str(proxy.extra["db"])).stdout.decode()
    finally:
        proxy.stop()
