"""Issue 37: each engine's own overflow error reaches the client in its surface's standard shape, so agents
compact instead of retrying; the engine's bytes stay in the capture, with the rewrite as a change.

The engines' errors are reproduced byte for byte in a raw upstream; their texts and where each engine writes
them are in docs/window.md (vLLM's is a real sample, ../shared/vllm-samples/hermes/15_error_context_too_long)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.inproc import InprocProxy, cli, start_proxy
from tests.support.overflow_patterns import agents_recognise
from tests.support.procs import wait_capture
from tests.support.rawserver import RawServer, sse_response

VLLM = (
    b'{"error":{"message":"This model\'s maximum context length is 4096 tokens. However, your prompt contains at '
    b"least 5000 input tokens, which exceeds this limit even without any output tokens. Please reduce the length "
    b'of the input prompt. (parameter=input_tokens, value=5000)","type":"BadRequestError","param":"input_tokens",'
    b'"code":400}}'
)
SGLANG = (
    b'{"object":"error","message":"The input (5000 tokens) is longer than the model\'s context length (4096 tokens).",'
    b'"type":"BadRequestError","param":null,"code":400}'
)
LLAMACPP = (
    b'{"error":{"code":400,"message":"request (5000 tokens) exceeds the available context size (4096 tokens), try '
    b'increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}'
)
TABBYAPI = (
    b'{"error":{"message":"Prompt length 5000 exceeds the available context size of 4096 tokens","type":'
    b'"invalid_request_error","param":null,"code":"context_length_exceeded"}}'
)
OLLAMA = (
    b'{"error":{"message":"the input length exceeds the context length","type":"invalid_request_error",'
    b'"param":null,"code":null}}'
)
ENGINES = {"vllm": VLLM, "sglang": SGLANG, "llamacpp": LLAMACPP, "tabbyapi": TABBYAPI}


def json_answer(status: int, body: bytes) -> list[tuple[float, bytes]]:
    head = b"HTTP/1.1 %d Bad Request\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % (
        status,
        len(body),
    )
    return [(0.0, head + body)]


@pytest.fixture
def upstream_answering():
    servers: list[RawServer] = []

    def make(script):
        server = RawServer(lambda _: script)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


MESSAGES = [{"role": "user", "content": "a long conversation"}]


@contextmanager
def answered_by(tmp_path: Path, upstream_answering: Any, script: Any, engine: str) -> Iterator[InprocProxy]:
    """A proxy for `engine` in front of an upstream that answers every request with `script`."""
    proxy = start_proxy(tmp_path, upstream_answering(script).url, "--engine", engine)
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.mark.parametrize("engine", list(ENGINES))
def test_an_engine_overflow_becomes_openai_context_length_exceeded(tmp_path, upstream_answering, engine):
    with answered_by(tmp_path, upstream_answering, json_answer(400, ENGINES[engine]), engine) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.BadRequestError) as raised:
            client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        error = raised.value
        assert error.code == "context_length_exceeded" and error.param == "messages"
        assert error.type == "invalid_request_error"
        body = error.body
        assert isinstance(body, dict)
        assert body["message"] == (
            "This model's maximum context length is 4096 tokens. However, your messages resulted in 5000 tokens. "
            "Please reduce the length of the messages."
        )
        assert agents_recognise(body["message"])
        capture_id = error.response.headers["x-tapfix-capture-id"]
        db = proxy.extra["db"]
        row = wait_capture(db, capture_id)
        assert "context_overflow" in json.loads(row["flags"])
        # The engine's own error stays in the capture as the upstream's answer.
        assert cli("captures", "export", capture_id, "--response", "--db", str(db)).stdout == ENGINES[engine]
        shown = cli("captures", "show", capture_id, "--db", str(db)).stdout.decode()
        assert "[window] rewrite $.error" in shown


def test_ollama_overflow_without_numbers_still_reads_as_an_overflow(tmp_path, upstream_answering):
    with answered_by(tmp_path, upstream_answering, json_answer(400, OLLAMA), "ollama") as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.BadRequestError) as raised:
            client.chat.completions.create(model="m", messages=MESSAGES)
        assert raised.value.code == "context_length_exceeded"
        assert agents_recognise(raised.value.body["message"])


def test_responses_overflow_names_input(tmp_path, upstream_answering):
    with answered_by(tmp_path, upstream_answering, json_answer(400, VLLM), "vllm") as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.BadRequestError) as raised:
            client.responses.create(model="m", input="a long conversation")
        assert raised.value.code == "context_length_exceeded" and raised.value.param == "input"


def test_messages_overflow_is_anthropics_prompt_is_too_long(tmp_path, upstream_answering):
    with answered_by(tmp_path, upstream_answering, json_answer(400, LLAMACPP), "llamacpp") as proxy:
        client = anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as raised:
            client.messages.create(model="m", max_tokens=100, messages=MESSAGES)
        assert raised.value.status_code == 400
        assert raised.value.body == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "prompt is too long: 5000 tokens > 4096 maximum"},
        }
        assert agents_recognise(raised.value.body["error"]["message"])


def test_an_overflow_error_event_inside_a_200_stream_is_rewritten(tmp_path, upstream_answering):
    """SGLang and TabbyAPI report it inside the stream once it started: the client gets chat's own overflow
    event, which the openai SDK raises with the code."""
    event = b"data: " + TABBYAPI + b"\n\n"
    with answered_by(tmp_path, upstream_answering, sse_response([event]), "tabbyapi") as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.APIError) as raised:
            for _ in client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
                pass
        assert raised.value.code == "context_length_exceeded"
        assert agents_recognise(raised.value.message)
        with httpx.stream(
            "POST", f"{proxy.url}/v1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True}
        ) as r:
            received = b"".join(r.iter_raw())
            capture_id = r.headers["x-tapfix-capture-id"]
        data = json.loads(received.removeprefix(b"data: "))
        assert data["error"]["code"] == "context_length_exceeded" and data["error"]["param"] == "messages"
        db = proxy.extra["db"]
        assert "context_overflow" in json.loads(wait_capture(db, capture_id)["flags"])
        assert cli("captures", "export", capture_id, "--response", "--db", str(db)).stdout == event


def test_messages_stream_overflow_event_is_anthropics_error_event(tmp_path, upstream_answering):
    sglang_event = b'data: {"error": ' + SGLANG + b"}\n\n"
    with answered_by(tmp_path, upstream_answering, sse_response([sglang_event]), "sglang") as proxy:
        client = anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as raised:
            with client.messages.stream(model="m", max_tokens=100, messages=MESSAGES) as stream:
                for _ in stream:
                    pass
        assert "prompt is too long: 5000 tokens > 4096 maximum" in str(raised.value)


def test_other_errors_pass_untouched(tmp_path, upstream_answering):
    other = (
        b'{"error":{"message":"max_tokens=5000 cannot be greater than max_model_len=4096.","type":"BadRequestError",'
        b'"param":"max_tokens","code":400}}'
    )
    with answered_by(tmp_path, upstream_answering, json_answer(400, other), "vllm") as proxy:
        response = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
        assert response.status_code == 400 and response.content == other
