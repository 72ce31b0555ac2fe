"""The mock's HTTP surface through Starlette's TestClient: endpoints, framing, cases, scenarios."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from tapfix.proxy.mock import MockOptions, RecordedResponse, create_app
from tapfix.proxy.mock.wire import MockReset

from tests.conftest import corpus_dir  # noqa: E402
from tests.support.builders import sse, sse_event, tool

CORPUS = corpus_dir()

WRITE_TOOL = tool("write", {"filePath": {"type": "string"}, "content": {"type": "string"}}, ["filePath", "content"])
TOOL_PROMPT = {
    "model": "tapfix-mock",
    "stream": True,
    "stream_options": {"include_usage": True},
    "messages": [{"role": "user", "content": "Create a file hello.txt containing a greeting"}],
    "tools": [WRITE_TOOL],
}
TEXT_PROMPT = {**TOOL_PROMPT, "messages": [{"role": "user", "content": "hello"}], "tools": None}


def client(**opts: object) -> TestClient:
    return TestClient(create_app(MockOptions(**opts)))  # type: ignore[arg-type]


def events(body: bytes) -> list[bytes]:
    assert body.endswith(b"\n\n")
    return [b + b"\n\n" for b in body[:-2].split(b"\n\n")]


def payloads(body: bytes) -> list[dict]:
    out = []
    for event in events(body):
        assert event.startswith(b"data: ")
        if event != b"data: [DONE]\n\n":
            out.append(json.loads(event[6:]))
    return out


def test_health_and_models() -> None:
    c = client()
    assert c.get("/health").status_code == 200
    models = c.get("/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["tapfix-mock"]
    assert models["data"][0]["object"] == "model"
    assert c.get("/models").status_code == 404


def test_stream_is_vllm_framed_with_usage_and_done() -> None:
    r = client().post("/v1/chat/completions", json=TEXT_PROMPT)
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    raw = r.content
    evs = events(raw)
    assert evs[-1] == b"data: [DONE]\n\n"
    objs = payloads(raw)
    first, usage = objs[0], objs[-1]
    assert list(first) == ["id", "object", "created", "model", "choices", "prompt_token_ids", "prompt_text"]
    assert first["choices"][0] == {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    assert usage["choices"] == [] and list(usage["usage"]) == [
        "prompt_tokens",
        "total_tokens",
        "completion_tokens",
        "completion_tokens_details",  # vLLM with a reasoning parser: 0 when the answer didn't reason
    ]
    assert usage["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
    assert objs[-2]["choices"][0]["finish_reason"] == "stop" and objs[-2]["choices"][0]["delta"] == {}
    assert usage["system_fingerprint"].startswith("vllm-0.32.0-") and "system_fingerprint" not in objs[-2]
    # Re-serializing compactly gives the same bytes: the wire is compact JSON, key order kept.
    for event, obj in zip(evs, objs, strict=False):
        assert event == sse_event(obj)
    text = "".join(o["choices"][0]["delta"].get("content", "") for o in objs[1:-1])
    assert len(objs) > 5 and text == "Hello! How can I help you today?"


def test_usage_only_when_asked() -> None:
    body = {**TEXT_PROMPT, "stream_options": None}
    objs = payloads(client().post("/v1/chat/completions", json=body).content)
    assert all(o["choices"] for o in objs)


def test_streamed_tool_call_is_vllm_style_and_parses() -> None:
    objs = payloads(client().post("/v1/chat/completions", json=TOOL_PROMPT).content)
    calls = [
        o["choices"][0]["delta"]["tool_calls"][0]
        for o in objs
        if o["choices"] and "tool_calls" in o["choices"][0]["delta"]
    ]
    opener, fragments = calls[0], calls[1:]
    assert list(opener) == ["id", "type", "index", "function"]
    # vLLM's parsers open a call with its name alone (tests/process/vllm/test_mock.py compares with the real bytes)
    assert opener["id"].startswith("chatcmpl-tool-") and opener["function"] == {"name": "write"}
    assert len(fragments) >= 3 and all(list(f) == ["index", "function"] for f in fragments)
    args = json.loads("".join(f["function"]["arguments"] for f in fragments))
    assert args == {"filePath": "hello.txt", "content": "Hello, world!\n"}
    finish = objs[-2]["choices"][0]
    assert finish["finish_reason"] == "tool_calls" and finish["delta"] == {}


def test_non_streamed_matches_the_stream() -> None:
    c = client()
    body = c.post("/v1/chat/completions", json={**TOOL_PROMPT, "stream": False}).json()
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {
        "filePath": "hello.txt",
        "content": "Hello, world!\n",
    }
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    text = c.post("/v1/chat/completions", json={**TEXT_PROMPT, "stream": False}).json()
    assert "tool_calls" not in text["choices"][0]["message"]
    assert text["choices"][0]["message"]["content"] == "Hello! How can I help you today?"


def test_reasoning_field_in_stream() -> None:
    body = {**TEXT_PROMPT, "reasoning_effort": "high"}
    objs = payloads(client().post("/v1/chat/completions", json=body).content)
    reasoning = "".join(o["choices"][0]["delta"].get("reasoning", "") for o in objs if o["choices"])
    assert len(reasoning) > 100
    assert not any("reasoning_content" in o["choices"][0]["delta"] for o in objs if o["choices"])


def test_same_request_same_bytes_other_request_other_id() -> None:
    c = client()
    a = c.post("/v1/chat/completions", json=TOOL_PROMPT).content
    b = c.post("/v1/chat/completions", json=TOOL_PROMPT).content
    other = c.post("/v1/chat/completions", json={**TOOL_PROMPT, "model": "x"}).content
    assert a == b
    assert payloads(a)[0]["id"] != payloads(other)[0]["id"]


def test_max_tokens_cuts_with_length() -> None:
    body = {**TEXT_PROMPT, "stream": False, "max_completion_tokens": 3}
    choice = client().post("/v1/chat/completions", json=body).json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] == "Hello! How"


def test_bad_requests_get_vllm_errors() -> None:
    c = client()
    r = c.post("/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["code"] == 400
    assert (r.json()["error"]["type"], r.json()["error"]["param"]) == ("Bad Request", "body.1")
    r = c.post("/v1/chat/completions", json={"model": "m"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "body.messages"


def test_legacy_completions() -> None:
    c = client()
    body = c.post("/v1/completions", json={"model": "m", "prompt": "What is 2 + 2?"}).json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == "2 + 2 = 4."
    objs = payloads(c.post("/v1/completions", json={"model": "m", "prompt": "hi", "stream": True}).content)
    assert "".join(o["choices"][0]["text"] for o in objs) == "Hello! How can I help you today?"
    assert objs[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.json")) if CORPUS.is_dir() else [], ids=lambda p: p.stem[:40])
def test_every_case_is_served_byte_exact(path: Path) -> None:
    case = json.loads(path.read_text())
    c = client(cases=[path])
    raw = c.post("/v1/chat/completions", json={"model": path.stem, "stream": True, "messages": []}).content
    ends_in_error = "error" in case["stream"][-1]
    assert raw == sse(case["stream"], done=not ends_in_error)


def test_case_non_streamed_is_assembled() -> None:
    path = CORPUS / "missing_last_chunk__truncated_inside_string_value.json"
    case = json.loads(path.read_text())
    body = client(cases=[path]).post("/v1/chat/completions", json={"messages": []}).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    expected_args = "".join(
        o["choices"][0]["delta"]["tool_calls"][0]["function"].get("arguments", "")
        for o in case["stream"]
        if o["choices"][0]["delta"].get("tool_calls")
    )
    assert choice["message"]["tool_calls"][0]["function"] == {
        "name": "write_file",
        "arguments": expected_args,
    }
    assert body["id"] == case["stream"][0]["id"]


def test_error_case_non_streamed_is_an_http_error() -> None:
    path = CORPUS / "invalid_json__unescaped_quotes_in_json_valued_xml_parameter_llamacpp.json"
    r = client(cases=[path]).post("/v1/chat/completions", json={"messages": []})
    assert r.status_code == 500 and "Failed to parse input" in r.json()["error"]["message"]


def test_several_cases_by_model_name_else_round_robin() -> None:
    paths = sorted(CORPUS.glob("*.json"))[:3]
    c = client(cases=paths)
    listed = [m["id"] for m in c.get("/v1/models").json()["data"]]
    assert listed == ["tapfix-mock", *[p.stem for p in paths]]

    def served(model: str) -> str:
        return payloads(c.post("/v1/chat/completions", json={"model": model, "stream": True, "messages": []}).content)[
            0
        ]["id"]

    ids = {p.stem: json.loads(p.read_text())["stream"][0]["id"] for p in paths}
    assert served(paths[2].stem) == ids[paths[2].stem]
    assert [served("whatever") for _ in range(4)] == [
        ids[paths[0].stem],
        ids[paths[1].stem],
        ids[paths[2].stem],
        ids[paths[0].stem],
    ]


def test_recorded_replay_serves_the_captured_bytes_on_any_path() -> None:
    chunks = [(0.0, b'data: {"a":1}\r\n\r\n'), (0.01, b": ping\r\n\r\n"), (0.02, b"data: [DONE]\r\n\r\n")]
    rec = RecordedResponse(
        status=201,
        headers=[("Content-Type", "text/event-stream"), ("X-Upstream", "vllm"), ("Content-Length", "999")],
        chunks=chunks,
    )
    for fast in (False, True):
        c = client(recorded=rec, fast=fast)
        for method, path in (("POST", "/v1/chat/completions"), ("GET", "/anything/else")):
            r = c.request(method, path)
            assert r.status_code == 201 and r.headers["x-upstream"] == "vllm"
            assert r.content == b"".join(d for _, d in chunks)


def test_reset_in_process_raises_instead_of_pretending() -> None:
    scenario = {"rules": [{"do": "reset_mid_stream", "after_chunks": 2}]}
    c = scenario_client(scenario)
    with pytest.raises(MockReset):
        c.post("/v1/chat/completions", json=TEXT_PROMPT)


def scenario_client(scenario: dict, tmp: Path | None = None, **opts: object) -> TestClient:
    import tempfile

    folder = Path(tmp or tempfile.mkdtemp())
    path = folder / "scenario.json"
    path.write_text(json.dumps(scenario))
    return client(scenario=path, **opts)
