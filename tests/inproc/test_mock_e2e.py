"""The mock under real uvicorn over loopback, driven by httpx and the openai SDK."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn
from tapfix.proxy.mock import MockOptions, RecordedResponse, uvicorn_config

from tests.conftest import corpus_dir  # noqa: E402
from tests.support.builders import sse  # noqa: E402

CORPUS = corpus_dir()
WRITE_TOOL = {
    "type": "function",
    "function": {
        "name": "write",
        "description": "Write a file",
        "parameters": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"content": {"type": "string"}, "filePath": {"type": "string"}},
            "required": ["content", "filePath"],
        },
    },
}
PROMPT = "Create a file hello.txt containing a greeting"


class Running:
    def __init__(self, opts: MockOptions) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn_config(opts, port=self.port))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Running:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "mock did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture(scope="module")
def mock() -> Iterator[Running]:
    with Running(MockOptions()) as running:
        yield running


def scenario(tmp_path: Path, data: dict, **opts: object) -> Running:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(data))
    return Running(MockOptions(scenario=path, **opts))  # type: ignore[arg-type]


def sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, timeout=10)


def test_openai_sdk_streamed_tool_call(mock: Running) -> None:
    stream = sdk(mock.base).chat.completions.create(
        model="tapfix-mock",
        messages=[{"role": "user", "content": PROMPT}],
        tools=[WRITE_TOOL],  # type: ignore[list-item]
        stream=True,
        stream_options={"include_usage": True},
    )
    args, names, finish, usage = "", [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            for tc in choice.delta.tool_calls or []:
                if tc.function and tc.function.name:
                    names.append(tc.function.name)
                if tc.function and tc.function.arguments:
                    args += tc.function.arguments
            finish = choice.finish_reason or finish
    assert names == ["write"] and finish == "tool_calls"
    assert json.loads(args) == {"content": "Hello, world!\n", "filePath": "hello.txt"}
    assert usage is not None and usage.completion_tokens > 0


def test_openai_sdk_non_streamed_tool_call_and_text(mock: Running) -> None:
    client = sdk(mock.base)
    done = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": PROMPT}], tools=[WRITE_TOOL], tool_choice="required"
    )  # type: ignore[list-item]
    call = done.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "write" and json.loads(call.function.arguments)["filePath"] == "hello.txt"  # type: ignore[union-attr]
    text = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is 6 * 7?"}])
    assert text.choices[0].message.content == "6 * 7 = 42." and text.choices[0].finish_reason == "stop"


def test_openai_sdk_sees_reasoning_field(mock: Running) -> None:
    stream = sdk(mock.base).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hello"}], stream=True, reasoning_effort="high"
    )
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning", "") for c in stream if c.choices)
    assert len(reasoning.split()) > 40


def test_identical_requests_identical_bytes(mock: Running) -> None:
    body = {
        "model": "m",
        "stream": True,
        "messages": [{"role": "user", "content": PROMPT}],
        "tools": [WRITE_TOOL],
    }
    with httpx.Client(base_url=mock.base) as http:
        first = http.post("/v1/chat/completions", json=body).content
        second = http.post("/v1/chat/completions", json=body).content
    assert first == second and first.endswith(b"data: [DONE]\n\n")


def test_corpus_case_byte_exact_over_the_wire() -> None:
    path = CORPUS / "duplicated_fragments__hermes_qwen25_partial_json_diff_and_final_resend.json"
    case = json.loads(path.read_text())
    expected = sse(case["stream"])
    with Running(MockOptions(cases=[path])) as running, httpx.Client(base_url=running.base) as http:
        with http.stream("POST", "/v1/chat/completions", json={"stream": True, "messages": []}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            raw = b"".join(r.iter_raw())
    assert raw == expected


def test_llama_error_case_ends_without_done_and_sdk_raises() -> None:
    path = CORPUS / "invalid_json__unescaped_quotes_in_json_valued_xml_parameter_llamacpp.json"
    with Running(MockOptions(cases=[path])) as running:
        raw = httpx.post(running.base + "/v1/chat/completions", json={"stream": True, "messages": []}).content
        assert raw.rstrip().endswith(b"}}") and b"[DONE]" not in raw
        with pytest.raises(openai.APIError):
            for _ in sdk(running.base).chat.completions.create(model="m", messages=[], stream=True):
                pass


def test_reset_mid_stream_leaves_the_body_incomplete(tmp_path: Path) -> None:
    with scenario(tmp_path, {"rules": [{"do": "reset_mid_stream", "after_chunks": 3}]}) as running:
        got = b""
        with pytest.raises(httpx.RemoteProtocolError), httpx.Client(base_url=running.base) as http:
            with http.stream(
                "POST",
                "/v1/chat/completions",
                json={"stream": True, "messages": [{"role": "user", "content": "hello"}]},
            ) as r:
                for chunk in r.iter_raw():
                    got += chunk
        assert got.count(b"data: ") == 3 and b"[DONE]" not in got
        # The server survives and answers the next request normally (the rule matches every request,
        # so ask for a non-streamed body: it is cut in the middle).
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(running.base + "/v1/chat/completions", json={"messages": []})
        assert httpx.get(running.base + "/health").status_code == 200


def test_chunk_delay_and_stall_pace_the_stream(tmp_path: Path) -> None:
    rules = {"rules": [{"when": {"nth": 2}, "do": "stall", "seconds": 0.6, "after_chunks": 2}]}
    body = {"stream": True, "messages": [{"role": "user", "content": "hello"}]}
    with scenario(tmp_path, rules, chunk_delay_ms=30) as running, httpx.Client(base_url=running.base) as http:
        times = []
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            for _ in r.iter_lines():
                times.append(time.monotonic())
        assert times[-1] - times[0] >= 0.03 * 8
        arrivals = []
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if line:
                    arrivals.append(time.monotonic())
        gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
        assert max(gaps) >= 0.55 and gaps.index(max(gaps)) == 1


def test_recorded_replay_keeps_timing_unless_fast() -> None:
    rec = RecordedResponse(
        200,
        [("content-type", "text/event-stream")],
        [(0.0, b'data: {"x":1}\n\n'), (0.5, b"data: [DONE]\n\n")],
    )
    for fast, slow in ((False, True), (True, False)):
        with Running(MockOptions(recorded=rec, fast=fast)) as running:
            start = time.monotonic()
            r = httpx.post(running.base + "/v1/chat/completions", json={})
            elapsed = time.monotonic() - start
            assert r.content == b'data: {"x":1}\n\ndata: [DONE]\n\n'
            assert (elapsed >= 0.45) is slow
