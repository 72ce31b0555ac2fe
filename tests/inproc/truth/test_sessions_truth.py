"""Issue 15 item 8: a session is one agent run, derived from the stored data.

Real clients (the openai and anthropic SDKs, httpx) drive multi-turn, tool-using conversations through
the proxy to the mock (both in the test process), and the test reads back which session each capture was
filed under. Two proxy processes on one store: tests/process/truth/test_sessions_truth.py.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.builders import message_tool_call, tool
from tests.support.inproc import start_proxy
from tests.support.procs import wait_capture

CHAT_TOOLS = [
    tool("read", {"path": {"type": "string"}}, ["path"], description="Read a file"),
    tool("write", {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]),
]
RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in CHAT_TOOLS]
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in CHAT_TOOLS]
TASKS = ("Read notes.txt", 'Create hello.txt containing "hi"')
MAX_TURNS = 8  # bounds every agent loop below


def sessions_of(db: Path, capture_ids: list[str]) -> list[str | None]:
    return [wait_capture(db, c)["session_id"] for c in capture_ids]


def session_row(db: Path, session_id: str) -> dict[str, Any]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        row = conn.execute("select * from sessions where id = ?", (session_id,)).fetchone()
        turns = conn.execute("select count(*) from exchanges where session_id = ?", (session_id,)).fetchone()[0]
    finally:
        conn.close()
    assert row is not None, session_id
    return {**dict(row), "turns": turns}


def one_session(db: Path, capture_ids: list[str]) -> str:
    """All these captures are one session, and the session row counts exactly them."""
    sids = sessions_of(db, capture_ids)
    assert len(set(sids)) == 1 and sids[0], sids
    row = session_row(db, sids[0])
    assert row["exchanges"] == row["turns"] == len(capture_ids), row
    return sids[0]


def _openai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=30)


# -- chat ----------------------------------------------------------------------------------------
def _streamed_message(raw: Any) -> dict[str, Any]:
    """Fold a chat stream into the assistant message, as agents do from the deltas."""
    content, calls = "", {}
    for chunk in raw.parse():
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for tc in delta.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = tc.id or call["id"]
                call["name"] += (tc.function.name or "") if tc.function else ""
                call["arguments"] += (tc.function.arguments or "") if tc.function else ""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [
            message_tool_call(c["arguments"], c["id"], c["name"]) for _, c in sorted(calls.items())
        ]
    return message


def _resent(message: dict[str, Any]) -> dict[str, Any]:
    """What a fussier agent re-sends: keys in another order, content as text parts, the tool-call
    arguments re-serialized with other whitespace, and a reasoning field of its own."""
    out: dict[str, Any] = {"reasoning_content": "I thought about it."}
    for call in message.get("tool_calls") or []:
        call["function"]["arguments"] = json.dumps(json.loads(call["function"]["arguments"]), indent=2)
    if message.get("tool_calls"):
        out["tool_calls"] = [dict(reversed(list(c.items()))) for c in message["tool_calls"]]
    out["content"] = [{"type": "text", "text": message["content"]}] if message.get("content") else None
    out["role"] = "assistant"
    return out


def chat_agent(url: str, *, stream: bool, fussy: bool = False, tasks: tuple[str, ...] = TASKS) -> list[str]:
    """A tool-using agent on the openai SDK: each task until the model stops calling tools."""
    client = _openai(url)
    messages: list[Any] = [{"role": "system", "content": "You are a coding agent."}]
    ids: list[str] = []
    for task in tasks:
        messages.append({"role": "user", "content": [{"type": "text", "text": task}] if fussy else task})
        for _ in range(MAX_TURNS):
            raw = client.chat.completions.with_raw_response.create(
                model="m", messages=messages, tools=CHAT_TOOLS, stream=stream
            )
            ids.append(raw.headers["x-tapfix-capture-id"])
            if stream:
                message: Any = _streamed_message(raw)
                calls = message.get("tool_calls") or []
                call_ids = [c["id"] for c in calls]
                messages.append(_resent(message) if fussy else message)
            else:
                message = raw.parse().choices[0].message  # the SDK's own object, as the SDK docs append it
                call_ids = [c.id for c in message.tool_calls or []]
                messages.append(message)
            if not call_ids:
                break
            messages += [{"role": "tool", "tool_call_id": c, "content": "hello from the file"} for c in call_ids]
    return ids


@pytest.mark.parametrize(("stream", "fussy"), [(False, False), (True, False), (True, True)])
def test_truth_8_sdk_tool_conversation_twice(proxy, stream, fussy):
    """The same 2-task tool-using run, twice in a row from the same client: two sessions, each whole."""
    db = proxy.extra["db"]
    first = chat_agent(proxy.url, stream=stream, fussy=fussy)
    second = chat_agent(proxy.url, stream=stream, fussy=fussy)
    assert len(first) == len(second) >= 4  # read → answer, write → answer
    a, b = one_session(db, first), one_session(db, second)
    assert a != b


def test_truth_8_same_first_prompt_twenty_clients(proxy):
    """Twenty clients, one identical prompt, then each one's second turn: twenty 2-turn sessions."""
    db = proxy.extra["db"]
    body = {"model": "m", "messages": [{"role": "user", "content": "Say hello to the team"}]}
    firsts, replies = [], []
    for _ in range(20):
        with httpx.Client(base_url=proxy.url, timeout=30) as client:  # a connection of its own each
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200
            firsts.append(r.headers["x-tapfix-capture-id"])
            replies.append(r.json()["choices"][0]["message"])
    seconds = []
    for reply in replies:
        follow = {**body, "messages": [*body["messages"], reply, {"role": "user", "content": "Thanks"}]}
        with httpx.Client(base_url=proxy.url, timeout=30) as client:
            r = client.post("/v1/chat/completions", json=follow)
            assert r.status_code == 200
            seconds.append(r.headers["x-tapfix-capture-id"])
    first_sessions = sessions_of(db, firsts)
    assert len(set(first_sessions)) == 20 and None not in first_sessions
    second_sessions = sessions_of(db, seconds)
    assert set(second_sessions) == set(first_sessions)
    assert Counter(first_sessions + second_sessions) == dict.fromkeys(first_sessions, 2)


# -- Responses -----------------------------------------------------------------------------------
def _responses_turn(client: openai.OpenAI, stream: bool, **kw: Any) -> tuple[str, Any]:
    raw = client.responses.with_raw_response.create(model="m", tools=RESPONSES_TOOLS, stream=stream, **kw)
    if not stream:
        return raw.headers["x-tapfix-capture-id"], raw.parse()
    final = None
    for event in raw.parse():
        if event.type == "response.completed":
            final = event.response
    assert final is not None
    return raw.headers["x-tapfix-capture-id"], final


@pytest.mark.parametrize("stream", [False, True])
def test_truth_8_responses_sessions(proxy, stream):
    """Responses input items (the output items re-sent, function_call_output) chain into one session;
    so do turns linked by previous_response_id. Twice the same run is two sessions."""
    db = proxy.extra["db"]
    client = _openai(proxy.url)
    runs = []
    for _ in range(2):
        ids: list[str] = []
        items: list[Any] = []
        for task in TASKS:
            items.append({"role": "user", "content": task})
            for _ in range(MAX_TURNS):
                capture_id, response = _responses_turn(client, stream, input=items if ids else task)
                ids.append(capture_id)
                items += [item.model_dump(exclude_none=True) for item in response.output]
                calls = [item for item in response.output if item.type == "function_call"]
                if not calls:
                    break
                items += [{"type": "function_call_output", "call_id": c.call_id, "output": "hello"} for c in calls]
        runs.append(ids)
    assert all(len(ids) == 4 for ids in runs), runs
    assert one_session(db, runs[0]) != one_session(db, runs[1])

    # previous_response_id: the server keeps the conversation, the client sends only what is new
    ids = []
    capture_id, response = _responses_turn(client, stream, input="Read chained.txt")
    ids.append(capture_id)
    for _ in range(MAX_TURNS):
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            break
        outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": "x"} for c in calls]
        capture_id, response = _responses_turn(client, stream, input=outputs, previous_response_id=response.id)
        ids.append(capture_id)
    assert len(ids) == 2
    one_session(db, ids)


def test_truth_8_ids_the_agent_sends(proxy):
    """x-session-id and prompt_cache_key name the session, whatever the conversation."""
    db = proxy.extra["db"]
    client = _openai(proxy.url)
    ids = []
    for prompt in ("Say hi", "Something else entirely"):
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": prompt}], extra_headers={"x-session-id": "ses_truth8"}
        )
        ids.append(raw.headers["x-tapfix-capture-id"])
    assert sessions_of(db, ids) == ["ses_truth8", "ses_truth8"]
    raw = client.responses.with_raw_response.create(model="m", input="Say hi", prompt_cache_key="pck-truth8")
    assert sessions_of(db, [raw.headers["x-tapfix-capture-id"]]) == ["pck-truth8"]


# -- Messages ------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_truth_8_messages_sessions(proxy, stream):
    """Anthropic Messages: assistant content blocks (thinking included or not) re-sent, tool_result
    blocks: one session per run, two runs of the same task two sessions."""
    db = proxy.extra["db"]
    client = anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0, timeout=30)
    runs = []
    for run in range(2):
        ids: list[str] = []
        messages: list[Any] = [{"role": "user", "content": "Read notes.txt"}]
        for _ in range(MAX_TURNS):
            kw: dict[str, Any] = {"model": "m", "max_tokens": 2000, "messages": messages, "tools": ANTHROPIC_TOOLS}
            kw["thinking"] = {"type": "enabled", "budget_tokens": 1024}
            if stream:
                with client.messages.stream(**kw) as s:
                    message = s.get_final_message()
                    ids.append(s.response.headers["x-tapfix-capture-id"])
            else:
                raw = client.messages.with_raw_response.create(**kw)
                ids.append(raw.headers["x-tapfix-capture-id"])
                message = raw.parse()
            blocks = [b.model_dump(exclude_none=True) for b in message.content]
            if run:  # the second run drops the thinking blocks, as some agents do
                blocks = [b for b in blocks if b["type"] != "thinking"]
            messages.append({"role": "assistant", "content": blocks})
            uses = [b for b in message.content if b.type == "tool_use"]
            if not uses:
                break
            results = [{"type": "tool_result", "tool_use_id": u.id, "content": "hello"} for u in uses]
            messages.append({"role": "user", "content": results})
        runs.append(ids)
    assert all(len(ids) == 2 for ids in runs), runs
    assert one_session(db, runs[0]) != one_session(db, runs[1])


def test_truth_8_compressed_request_bodies_chain(tmp_path: Path) -> None:
    """A client that gzips its request bodies (item 5) is still grouped: the session reads the body as
    the policy did, decoded."""
    import gzip

    from tests.support.rawserver import RawServer, json_reply

    answer = json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "m",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "Hi there."}, "finish_reason": "stop"}
            ],
        }
    ).encode()
    reply = json_reply(answer)
    server = RawServer(lambda request: [(0.0, reply)])
    proxy = start_proxy(tmp_path, server.url)
    try:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Say hi"}]
        ids = []
        for follow_up in ("And again", "Once more"):
            body = gzip.compress(json.dumps({"model": "m", "messages": messages}).encode())
            r = httpx.post(
                f"{proxy.url}/v1/chat/completions",
                content=body,
                headers={"content-type": "application/json", "content-encoding": "gzip"},
                timeout=10,
            )
            assert r.status_code == 200, r.text
            ids.append(r.headers["x-tapfix-capture-id"])
            messages += [r.json()["choices"][0]["message"], {"role": "user", "content": follow_up}]
        one_session(proxy.extra["db"], ids)
    finally:
        proxy.stop()
        server.close()


# -- Claude Code's session header, and threads (issue 31 item 17) -----------------------------------
def test_claude_codes_session_header_and_threads(tmp_path: Path) -> None:
    """Claude Code sends `X-Claude-Code-Session-Id` on every request, its subagents' too. A turn the client
    retried after a 500 is filed under that session (it used to start a session of its own), and the
    session holds one thread per chain: the main agent's turns in one, a subagent's in another."""
    from tests.support.inproc import cli, mock_and_proxy

    scenario = {"rules": [{"when": {"nth": 1}, "do": "http_error", "status": 500}]}
    with mock_and_proxy(tmp_path, scenario) as (_, proxy):
        db = proxy.extra["db"]
        client = anthropic.Anthropic(
            base_url=proxy.url,
            api_key="k",
            max_retries=1,  # the SDK retries the 500 itself: the retried turn
            timeout=30,
            default_headers={"X-Claude-Code-Session-Id": "cc-e2e-1"},
        )
        messages: list[Any] = [{"role": "user", "content": "Read notes.txt"}]
        main: list[str] = []
        for _ in range(MAX_TURNS):
            raw = client.messages.with_raw_response.create(
                model="m", max_tokens=2000, messages=messages, tools=ANTHROPIC_TOOLS
            )
            main.append(raw.headers["x-tapfix-capture-id"])
            message = raw.parse()
            messages.append(
                {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]}
            )
            uses = [b for b in message.content if b.type == "tool_use"]
            if not uses:
                break
            messages.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "hi"} for u in uses],
                }
            )
        sub = client.messages.with_raw_response.create(
            model="m", max_tokens=200, messages=[{"role": "user", "content": "Subagent: list the files"}]
        ).headers["x-tapfix-capture-id"]
        assert len(main) == 2, main
        wait_capture(db, sub)  # the last one: the writer commits in order
        every = json.loads(cli("captures", "list", "--json", "--limit", "0", "--db", str(db)).stdout.splitlines()[-1])
        failed = every["id"]  # the oldest: the 500 the SDK retried
        assert every["status"] == 500 and failed not in main
        shown = {
            c: json.loads(cli("captures", "show", c, "--json", "--db", str(db)).stdout) for c in [failed, *main, sub]
        }
        assert {s["session_id"] for s in shown.values()} == {"cc-e2e-1"}
        assert shown[main[0]]["thread_id"] == shown[main[1]]["thread_id"] == main[0]
        assert shown[sub]["thread_id"] == sub
        assert shown[failed]["thread_id"] == failed  # a sibling of the retried turn, which nothing continues
