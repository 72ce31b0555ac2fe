"""Scenario files: validation, rule matching, and each behaviour's effect on the wire."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from tapfix.proxy.mock import MockOptions, ScenarioError, create_app
from tapfix.proxy.mock.scenario import RequestFacts, load_scenario, parse_scenario

from tests.support.builders import tool

SCENARIOS = Path(__file__).resolve().parents[2] / "proxy" / "mock" / "scenarios"
WRITE_TOOL = tool("write", {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"])
TEXT = {"model": "tapfix-mock", "stream": True, "messages": [{"role": "user", "content": "hello"}]}
TOOLS = {
    **TEXT,
    "messages": [{"role": "user", "content": "Create a file hello.txt containing a greeting"}],
    "tools": [WRITE_TOOL],
}


def make(tmp_path: Path, scenario: dict) -> TestClient:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(scenario))
    return TestClient(create_app(MockOptions(scenario=path)))


def payloads(raw: bytes) -> list[dict]:
    return [json.loads(e[6:]) for e in raw.split(b"\n\n") if e.startswith(b"data: {")]


def content(raw: bytes) -> str:
    return "".join(o["choices"][0]["delta"].get("content") or "" for o in payloads(raw) if o.get("choices"))


def facts(**kw: object) -> RequestFacts:
    base: dict = {
        "nth": 1,
        "attempt": 1,
        "path": "/v1/chat/completions",
        "model": "m",
        "has_tools": False,
        "has_images": False,
        "stream": True,
    }
    return RequestFacts(**{**base, **kw})


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"rules": [{"do": "explode"}]},
        {"rules": [{"do": "stall", "when": {"nth": 1, "phase": "moon"}}]},
        {"rules": [{"do": "stall", "secs": 3}]},
        {"rules": [{"do": "degenerate", "style": "poetry"}]},
        {"rules": [{"do": "malformed_sse"}]},
        {"rules": [{"do": "http_error", "status": 200}]},
        {"rules": [{"do": "serve_case", "case": "does/not/exist.json"}]},
        {"rules": [{"do": "stall", "when": {"every": 0}}]},
        {"models": "one", "rules": []},
        {"rulez": []},
    ],
)
def test_invalid_scenarios_fail_at_load(bad: object) -> None:
    with pytest.raises(ScenarioError):
        parse_scenario(bad, base_dir=Path("/nonexistent"))


def test_shipped_scenarios_all_load() -> None:
    files = sorted(SCENARIOS.rglob("*.json"))
    assert len(files) >= 10
    for path in files:
        load_scenario(path)


def test_first_match_wins_and_conditions_combine() -> None:
    s = parse_scenario(
        {
            "rules": [
                {"when": {"nth": [2, 3], "has_tools": True}, "do": "crlf"},
                {"when": {"every": 3}, "do": "garbage"},
                {"when": {"attempt": 1, "model": ["a", "b"]}, "do": "forget_needle"},
                {"when": {"path": "/v1/models"}, "do": "http_error", "status": 503},
            ]
        }
    )
    assert s.match(facts(nth=2, has_tools=True)).do == "crlf"  # type: ignore[union-attr]
    assert s.match(facts(nth=3, has_tools=True)).do == "crlf"  # type: ignore[union-attr]
    assert s.match(facts(nth=3)).do == "garbage"  # type: ignore[union-attr]
    assert s.match(facts(nth=1, model="a")).do == "forget_needle"  # type: ignore[union-attr]
    assert s.match(facts(nth=1, model="c")) is None
    assert s.match(facts(nth=1, attempt=2, model="a")) is None
    assert s.match(facts(path="/v1/models", nth=0)).do == "http_error"  # type: ignore[union-attr]


def test_degenerate_every_4th(tmp_path: Path) -> None:
    c = TestClient(create_app(MockOptions(scenario=SCENARIOS / "degenerate_every_4th.json")))
    texts = [content(c.post("/v1/chat/completions", json=TEXT).content) for _ in range(8)]
    cjk = [bool(re.search(r"[\u4e00-\u9fff]{20,}", t)) for t in texts]
    assert cjk == [False, False, False, True, False, False, False, True]


@pytest.mark.parametrize(
    ("style", "check"),
    [
        ("repeat_loop", lambda text, finish: text.count(text.splitlines()[0]) >= 10 and finish == "length"),
        ("runaway", lambda text, finish: len(text) > 1000 and finish == "length"),
        ("empty", lambda text, finish: text == "" and finish == "stop"),
        ("cjk_drift", lambda text, finish: text.isascii() is False and text.startswith("Hello")),
    ],
)
def test_degenerate_styles(tmp_path: Path, style: str, check: object) -> None:
    c = make(tmp_path, {"rules": [{"do": "degenerate", "style": style}]})
    raw = c.post("/v1/chat/completions", json=TEXT).content
    finish = [o["choices"][0]["finish_reason"] for o in payloads(raw) if o["choices"]][-1]
    assert check(content(raw), finish)  # type: ignore[operator]


def test_fail_first_attempt_then_answer(tmp_path: Path) -> None:
    c = TestClient(create_app(MockOptions(scenario=SCENARIOS / "fail_first_attempt_unrecoverable.json")))
    first = payloads(c.post("/v1/chat/completions", json=TOOLS).content)
    assert first[-1]["choices"][0]["finish_reason"] == "length"  # the corpus case, cut mid-string
    second = payloads(c.post("/v1/chat/completions", json=TOOLS).content)
    args = "".join(
        o["choices"][0]["delta"]["tool_calls"][0]["function"].get("arguments", "")
        for o in second
        if o["choices"] and "tool_calls" in o["choices"][0]["delta"]
    )
    assert json.loads(args) == {"path": "hello.txt", "content": "Hello, world!\n"}
    # a different body is a first attempt again
    other = {**TOOLS, "model": "other"}
    assert payloads(c.post("/v1/chat/completions", json=other).content)[-1]["choices"][0]["finish_reason"] == "length"


def test_break_tool_call_truncates_inside_a_string(tmp_path: Path) -> None:
    c = make(tmp_path, {"rules": [{"do": "break_tool_call"}]})
    body = c.post("/v1/chat/completions", json={**TOOLS, "stream": False}).json()
    args = body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert body["choices"][0]["finish_reason"] == "length"
    assert args.startswith('{"path": "hello.txt", "content": "') and not args.endswith("}")
    with pytest.raises(json.JSONDecodeError):
        json.loads(args)


def test_wrong_model_ids(tmp_path: Path) -> None:
    c = TestClient(create_app(MockOptions(scenario=SCENARIOS / "wrong_model_ids.json")))
    served = [m["id"] for m in c.get("/v1/models").json()["data"]]
    assert "tapfix-mock" not in served and len(served) == 2
    r = c.post("/v1/chat/completions", json=TEXT)
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    ok = c.post("/v1/chat/completions", json={**TEXT, "model": served[0]})
    assert ok.status_code == 200 and payloads(ok.content)[0]["model"] == served[0]


def test_http_error_with_headers_then_healthy(tmp_path: Path) -> None:
    c = make(
        tmp_path,
        {
            "rules": [
                {
                    "when": {"first": 2},
                    "do": "http_error",
                    "status": 503,
                    "headers": {"Retry-After": "1"},
                    "body": {"error": {"message": "busy"}},
                }
            ]
        },
    )
    for _ in range(2):
        r = c.post("/v1/chat/completions", json=TEXT)
        assert r.status_code == 503 and r.headers["retry-after"] == "1" and r.json() == {"error": {"message": "busy"}}
    assert c.post("/v1/chat/completions", json=TEXT).status_code == 200


def test_models_endpoint_can_fail(tmp_path: Path) -> None:
    c = make(tmp_path, {"rules": [{"when": {"path": "/v1/models"}, "do": "http_error", "status": 502}]})
    assert c.get("/v1/models").status_code == 502
    assert c.post("/v1/chat/completions", json=TEXT).status_code == 200


def test_garbage(tmp_path: Path) -> None:
    r = make(tmp_path, {"rules": [{"do": "garbage"}]}).post("/v1/chat/completions", json=TEXT)
    assert r.status_code == 200 and b"data:" not in r.content and r.content


def test_crlf_same_answer_with_pings(tmp_path: Path) -> None:
    plain = TestClient(create_app(MockOptions())).post("/v1/chat/completions", json=TEXT).content
    framed = make(tmp_path, {"rules": [{"do": "crlf"}]}).post("/v1/chat/completions", json=TEXT).content
    assert b"\r\n\r\n: ping\r\n\r\n" in framed
    assert framed.replace(b": ping\r\n\r\n", b"").replace(b"\r\n", b"\n") == plain


@pytest.mark.parametrize(
    ("kind", "check"),
    [
        ("no_blank_lines", lambda raw: b"\n\n" not in raw and raw.count(b"data: ") > 3),
        ("huge_line", lambda raw: max(len(line) for line in raw.split(b"\n")) > 100_000),
        ("invalid_utf8", lambda raw: _not_utf8(raw)),
        (
            "error_object_midstream",
            lambda raw: b'data: {"error":' in raw and raw.endswith(b"data: [DONE]\n\n"),
        ),
    ],
)
def test_malformed_sse(tmp_path: Path, kind: str, check: object) -> None:
    c = make(tmp_path, {"rules": [{"do": "malformed_sse", "kind": kind, "size": 200_000}]})
    assert check(c.post("/v1/chat/completions", json=TEXT).content)  # type: ignore[operator]


def _not_utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return True
    return False


def test_knob_behaviours_reach_the_script(tmp_path: Path) -> None:
    needle = {
        **TEXT,
        "messages": [
            {
                "role": "user",
                "content": "x " * 500 + 'The passphrase is "kiwi-77". ' + "y " * 500 + "What is the passphrase?",
            }
        ],
    }
    assert "kiwi-77" in content(TestClient(create_app(MockOptions())).post("/v1/chat/completions", json=needle).content)
    forgetful = make(tmp_path, {"rules": [{"do": "forget_needle"}]})
    assert "kiwi-77" not in content(forgetful.post("/v1/chat/completions", json=needle).content)


def test_serve_case_path_relative_to_scenario(tmp_path: Path) -> None:
    case = {
        "stream": [
            {
                "id": "c1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "x",
                "choices": [{"index": 0, "delta": {"content": "é"}, "finish_reason": "stop"}],
            }
        ]
    }
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "one.json").write_text(json.dumps(case))
    c = make(tmp_path, {"rules": [{"do": "serve_case", "case": "cases/one.json"}]})
    raw = c.post("/v1/chat/completions", json=TEXT).content
    assert (
        raw
        == (
            'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"x","choices":'
            '[{"index":0,"delta":{"content":"é"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
        ).encode()
    )


def test_shipped_scenarios_resolve_by_name() -> None:
    from tapfix.proxy.mock import shipped_scenarios

    names = shipped_scenarios()
    assert "degenerate_every_4th" in names and "probe_failures/forget_needle" in names
    app = create_app(MockOptions(scenario=Path("probe_failures/forget_needle")))
    assert TestClient(app).get("/v1/models").status_code == 200
    with pytest.raises(ScenarioError, match="shipped examples"):
        create_app(MockOptions(scenario=Path("no_such_scenario")))


# -- last_role ------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["robot", [], ["user", "bot"], 1])
def test_last_role_is_validated(bad: object) -> None:
    with pytest.raises(ScenarioError, match="last_role"):
        parse_scenario({"rules": [{"when": {"last_role": bad}, "do": "answer"}]})


def test_last_role_matches_one_role_or_a_list() -> None:
    s = parse_scenario(
        {
            "rules": [
                {"when": {"last_role": "user"}, "do": "crlf"},
                {"when": {"last_role": ["tool", "assistant"]}, "do": "garbage"},
            ]
        }
    )
    assert s.match(facts(last_role="user")).do == "crlf"  # type: ignore[union-attr]
    assert s.match(facts(last_role="tool")).do == "garbage"  # type: ignore[union-attr]
    assert s.match(facts(last_role="assistant")).do == "garbage"  # type: ignore[union-attr]
    assert s.match(facts(last_role="system")) is None
    assert s.match(facts()) is None  # unknown (no messages) matches no role


FIRST_TURN_ONLY = {"rules": [{"when": {"last_role": "user", "has_tools": True}, "do": "break_tool_call"}]}
CHAT_CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "write", "arguments": '{"path": "hello.txt", "content": "Hello, world!\\n"}'},
}


def _chat_finish(c: TestClient, body: dict) -> str:
    return c.post("/v1/chat/completions", json={**body, "stream": False}).json()["choices"][0]["finish_reason"]


def test_last_role_breaks_only_the_first_turn_on_chat(tmp_path: Path) -> None:
    c = make(tmp_path, FIRST_TURN_ONLY)
    assert _chat_finish(c, TOOLS) == "length"  # the user's prompt last: broken
    title = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Generate a title"},
            {"role": "user", "content": "Create a file hello.txt"},
        ],
    }
    assert _chat_finish(c, title) == "stop"  # opencode's title request has no tools: healthy
    second = {
        **TOOLS,
        "messages": [
            *TOOLS["messages"],
            {"role": "assistant", "content": None, "tool_calls": [CHAT_CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
    }
    assert _chat_finish(c, second) == "stop"  # a tool result last: healthy
    assert _chat_finish(c, TOOLS) == "length"  # every retry of the first turn stays broken


def test_last_role_on_responses(tmp_path: Path) -> None:
    c = make(tmp_path, FIRST_TURN_ONLY)
    tool = {"type": "function", "name": "write", "parameters": WRITE_TOOL["function"]["parameters"]}
    first = {
        "model": "m",
        "tools": [tool],
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": TOOLS["messages"][0]["content"]}],
            }
        ],
    }
    assert c.post("/v1/responses", json=first).json()["status"] == "incomplete"
    assert (
        c.post("/v1/responses", json={**first, "input": TOOLS["messages"][0]["content"]}).json()["status"]
        == "incomplete"
    )  # a string input is a user message
    second = {
        **first,
        "input": [
            *first["input"],
            {"type": "function_call", "call_id": "c1", "name": "write", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ],
    }
    body = c.post("/v1/responses", json=second).json()
    assert body["status"] == "completed" and body["output"][-1]["type"] == "message"


def test_last_role_on_messages(tmp_path: Path) -> None:
    c = make(tmp_path, FIRST_TURN_ONLY)
    tool = {"name": "write", "input_schema": WRITE_TOOL["function"]["parameters"]}
    prompt = {"role": "user", "content": TOOLS["messages"][0]["content"]}
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "write", "input": {}}]}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}
    base = {"model": "m", "max_tokens": 1000, "tools": [tool]}

    def stop(messages: list) -> str:
        return c.post("/v1/messages", json={**base, "messages": messages}).json()["stop_reason"]

    assert stop([prompt]) == "max_tokens"
    assert stop([prompt, use, {"role": "user", "content": [result]}]) == "end_turn"  # all tool_result: tool
    mixed = {"role": "user", "content": [result, {"type": "text", "text": "Now create a.txt"}]}
    assert stop([prompt, use, mixed]) == "max_tokens"  # a tool result plus the user's words: user


def test_shipped_break_first_turn(tmp_path: Path) -> None:
    c = TestClient(create_app(MockOptions(scenario="break_first_turn")))
    assert _chat_finish(c, TOOLS) == "length"
    assert _chat_finish(c, TOOLS) == "tool_calls"  # the retry is healthy
