"""End to end: the real proxy in front of the real mock (in the test process), driven by the openai SDK and httpx.

What a user relies on: the agent notices nothing, and the store gives back exactly what went over
the wire, request and response, with secrets redacted.
"""

from __future__ import annotations

import json
import sqlite3

import httpx
import openai

from tests.support.builders import WRITE_FILE
from tests.support.inproc import cli
from tests.support.procs import wait_capture

SECRET = "sk-tapfix-test-secret-0123456789abcdef"


def _client(proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=SECRET, max_retries=0)


def _export(proxy, capture_id: str, *flags: str) -> bytes:
    result = cli("captures", "export", capture_id, "--db", str(proxy.extra["db"]), *flags)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout


def test_streamed_sdk_request_is_captured_exactly(proxy, mock):
    raw = _client(proxy).chat.completions.with_raw_response.create(
        model="tapfix-mock", stream=True, messages=[{"role": "user", "content": "Say hello in one line"}]
    )
    capture_id = raw.headers["x-tapfix-capture-id"]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)
    row = wait_capture(proxy.extra["db"], capture_id)
    assert text and row["content"] == text
    assert row["status"] == 200 and row["stream"] == 1 and row["model"] == "tapfix-mock"
    assert row["user_agent"].startswith("OpenAI/Python")
    assert row["first_token_ms"] is not None and row["chunk_count"] > 2
    sent = _export(proxy, capture_id)
    assert json.loads(sent)["messages"][0]["content"] == "Say hello in one line"
    # The raw upstream response is what the mock serves for the same request, byte for byte.
    direct = httpx.post(
        f"{mock.url}/v1/chat/completions", content=sent, headers={"content-type": "application/json"}
    ).content
    assert _export(proxy, capture_id, "--response") == direct


def test_plain_and_tool_requests(proxy):
    client = _client(proxy)
    raw = client.chat.completions.with_raw_response.create(
        model="tapfix-mock", messages=[{"role": "user", "content": "What is 2+2?"}]
    )
    reply = raw.parse()
    row = wait_capture(proxy.extra["db"], raw.headers["x-tapfix-capture-id"])
    assert row["content"] == reply.choices[0].message.content and row["stream"] == 0
    raw = client.chat.completions.with_raw_response.create(
        model="tapfix-mock",
        stream=True,
        tools=[WRITE_FILE],
        messages=[{"role": "user", "content": "Create hello.txt containing a greeting"}],
    )
    calls: dict[int, dict] = {}
    for chunk in raw.parse():
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
    assert calls[0]["name"] == "write"
    assert json.loads(calls[0]["arguments"])["path"] == "hello.txt"
    row = wait_capture(proxy.extra["db"], raw.headers["x-tapfix-capture-id"])
    stored = json.loads(row["tool_calls"])
    assert stored[0]["name"] == "write" and stored[0]["arguments"] == calls[0]["arguments"]
    assert row["finish_reason"] == "tool_calls"


def test_odd_body_passes_byte_identical(proxy):
    body = (
        b'{ "messages" :[ {"content":"caf\\u00e9 \xe2\x9c\x93  tabs\\t", "role":"user"}],\n'
        b'  "model":"tapfix-mock" ,"stream":false}  '
    )
    response = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json", "authorization": f"Bearer {SECRET}"},
    )
    assert response.status_code == 200
    capture_id = response.headers["x-tapfix-capture-id"]
    row = wait_capture(proxy.extra["db"], capture_id)
    assert row["forwarded_body_id"] is None  # nothing changed, so nothing else stored
    assert _export(proxy, capture_id) == body
    assert _export(proxy, capture_id, "--forwarded") == body
    assert _export(proxy, capture_id, "--response") == response.content


def test_secret_never_reaches_database_files(proxy):
    response = httpx.post(
        f"{proxy.url}/v1/chat/completions?api_key={SECRET}",
        json={"model": "tapfix-mock", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {SECRET}", "x-api-key": SECRET, "cookie": f"session={SECRET}"},
    )
    row = wait_capture(proxy.extra["db"], response.headers["x-tapfix-capture-id"])
    assert "[redacted]" in row["request_headers"] and "[redacted]" in row["url"]
    db = proxy.extra["db"]
    for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        if path.exists():
            assert SECRET.encode() not in path.read_bytes(), path


def test_every_response_carries_capture_id_and_list_json(proxy):
    for path in ("/v1/models", "/health"):
        response = httpx.get(proxy.url + path)
        assert response.status_code == 200
        wait_capture(proxy.extra["db"], response.headers["x-tapfix-capture-id"])
    result = cli("captures", "list", "--json", "--limit", "0", env={"TAPFIX_DB": str(proxy.extra["db"])})
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) >= 2
    for key in ("id", "method", "path", "model", "status", "user_agent", "stream", "changes", "flags"):
        assert key in rows[0]
    assert rows == sorted(rows, key=lambda r: r["id"], reverse=True)
    one = cli("captures", "list", "--json", "--limit", "1", "--db", str(proxy.extra["db"]))
    assert len(one.stdout.splitlines()) == 1


def test_show_is_readable(proxy):
    response = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        headers={"accept-encoding": "gzip"},
        json={"model": "tapfix-mock", "messages": [{"role": "user", "content": "hello there"}]},
    )
    capture_id = response.headers["x-tapfix-capture-id"]
    wait_capture(proxy.extra["db"], capture_id)
    shown = cli("captures", "show", capture_id[:12], "--db", str(proxy.extra["db"]))
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout.decode()
    assert capture_id in text and "hello there" in text and "request as sent by the client" in text
    assert "accept-encoding" in text  # the framing change is listed


def test_readers_fail_clearly(tmp_path):
    missing = cli("captures", "list", "--db", str(tmp_path / "nope.db"))
    assert missing.returncode != 0 and b"no capture database" in missing.stderr
    foreign = tmp_path / "foreign.db"
    sqlite3.connect(foreign).execute("create table t (x)").connection.commit()
    result = cli("captures", "list", "--db", str(foreign))
    assert result.returncode != 0 and b"not a tapfix capture database" in result.stderr
    assert not (tmp_path / "nope.db").exists()
