"""Issue 19 end to end: `tapfix run --regenerate 1` in front of `tapfix mock`, the OpenAI SDK streaming
with `max_retries=0`. A tool call broken on the first attempt reaches the client whole, from the
second attempt, in the same response; the captures hold the client-facing exchange and attempt 2."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.builders import tool
from tests.support.ci import unavailable
from tests.support.inproc import InprocProxy, mock_and_proxy
from tests.support.procs import wait_capture
from tests.support.stage_io import client_view

WRITE = tool(
    "write",
    {"content": {"type": "string"}, "filePath": {"type": "string"}},
    ["content", "filePath"],
    description="Write a file",
)
TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{CLIENT_SPAN}-01"
ALWAYS_BROKEN = {"rules": [{"when": {"has_tools": True}, "do": "break_tool_call", "mode": "truncate"}]}


@pytest.fixture
def stack(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[InprocProxy]:
    with mock_and_proxy(tmp_path, *request.param) as (mock, proxy):
        proxy.extra["upstream_authority"] = mock.url.split("://", 1)[1]
        yield proxy


def messages(text: str = "Create a file hello.txt containing a greeting") -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def rows(db: Path, parent: str, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The parent and its attempts, once the writer committed `count` of them."""
    wait_capture(db, parent)
    deadline = time.monotonic() + timeout
    while True:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        try:
            found = [
                dict(r)
                for r in conn.execute(
                    "select * from exchanges where id = ? or attempt_of = ? order by attempt", (parent, parent)
                )
            ]
            for row in found:
                row["changes"] = [
                    dict(c)
                    for c in conn.execute("select * from changes where exchange_id = ? order by seq", (row["id"],))
                ]
        finally:
            conn.close()
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def parent_id(proxy: InprocProxy) -> str:
    """The client-facing capture (attempt 1), once written: an SDK stream helper hides the response headers, and a
    client that left never got them."""
    db = proxy.extra["db"]
    for _ in range(200):
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True) if db.exists() else None
        try:
            row = conn.execute("select id from exchanges where attempt_of is null").fetchone() if conn else None
        except sqlite3.OperationalError:
            row = None
        finally:
            if conn:
                conn.close()
        if row:
            wait_capture(db, row[0])
            return str(row[0])
        time.sleep(0.05)
    raise AssertionError("no client-facing capture recorded")


def all_exchanges(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute("select count(*) from exchanges").fetchone()[0])
    finally:
        conn.close()


def raw_stream(proxy: InprocProxy, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[str, bytes]:
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, headers=headers, timeout=30) as r:
        data = b"".join(r.iter_raw())
        return r.headers["x-tapfix-capture-id"], data


@pytest.mark.parametrize("stack", [("break_args_first_attempt", "--regenerate", "1")], indirect=True)
def test_a_call_broken_on_the_first_attempt_reaches_the_sdk_whole(stack: InprocProxy) -> None:
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0, timeout=30)
    raw = client.chat.completions.with_raw_response.create(
        model="m",
        messages=messages(),
        tools=[WRITE],
        stream=True,  # type: ignore[list-item]
    )
    capture_id = raw.headers["x-tapfix-capture-id"]
    calls: dict[int, dict[str, str]] = {}
    ids = set()
    for chunk in raw.parse():
        ids.add(chunk.id)
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                got = calls.setdefault(call.index, {"name": "", "arguments": ""})
                if call.function and call.function.name:
                    got["name"] += call.function.name
                if call.function and call.function.arguments:
                    got["arguments"] += call.function.arguments
    assert len(calls) == 1 and calls[0]["name"] == "write"
    assert set(json.loads(calls[0]["arguments"])) >= {"content", "filePath"}
    assert len(ids) == 1, "one completion id across both attempts"
    found = rows(stack.extra["db"], capture_id, 2)
    assert [(r["attempt"], r["attempt_of"]) for r in found] == [(1, None), (2, capture_id)]
    parent, second = found
    assert "regenerated" in json.loads(parent["flags"])
    assert all_exchanges(stack.extra["db"]) == 2, "the mock was asked twice, each ask one exchange"
    assert any(c["kind"] == "regenerate" for c in second["changes"]), second["changes"]


@pytest.mark.parametrize("stack", [("break_args_first_attempt", "--regenerate", "1")], indirect=True)
def test_the_client_reads_one_role_chunk_no_marker_no_error(stack: InprocProxy) -> None:
    body = {"model": "m", "messages": messages(), "tools": [WRITE], "stream": True}
    capture_id, data = raw_stream(stack, body, {"traceparent": TRACEPARENT})
    assert b"tapfix-attempt-end" not in data
    view = client_view(data)
    assert view.errors == [] and view.done == 1 and len(view.calls) == 1
    roles = [c for c in view.chunks for ch in c["choices"] if (ch.get("delta") or {}).get("role")]
    assert len(roles) == 1
    found = rows(stack.extra["db"], capture_id, 2)
    forwarded = json.loads(found[0]["forwarded_headers"] or found[0]["request_headers"])
    assert not any(k.lower() == "x-tapfix-relay" for k, _ in forwarded)
    assert stack.extra["upstream_authority"] in [v for k, v in forwarded if k.lower() == "host"]
    assert not any(k.lower() in ("x-tapfix-relay", "host") for k, _ in json.loads(found[1]["request_headers"]))
    # The attempt resends the forwarded headers: the same trace context (export off: the client's, as sent).
    assert [v for k, v in json.loads(found[1]["request_headers"]) if k.lower() == "traceparent"] == [TRACEPARENT]
    assert [v for k, v in forwarded if k.lower() == "traceparent"] == [TRACEPARENT]
    assert [(r["trace_id"], r["span_id"], r["parent_span_id"]) for r in found] == [(TRACE, None, CLIENT_SPAN)] * 2


@pytest.fixture
def exporting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[InprocProxy]:
    """OTLP export on, to a receiver that isn't there (failures are counted, never raised), so tapfix has
    a span of its own; a short exporter timeout keeps the flush at exit short."""
    try:
        import opentelemetry.sdk.trace  # noqa: F401 - tapfix[otel], what `--otlp` needs
    except ImportError as e:
        unavailable(f"OTLP export needs tapfix[otel] ({e.name})")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    args = ("--regenerate", "1", "--otlp", "http://127.0.0.1:9")
    with mock_and_proxy(tmp_path, "break_args_first_attempt", *args) as (_, proxy):
        yield proxy


def test_with_export_on_the_attempt_resends_tapfix_traceparent_and_is_a_child_span(exporting: InprocProxy) -> None:
    body = {"model": "m", "messages": messages(), "tools": [WRITE], "stream": True}
    capture_id, data = raw_stream(exporting, body, {"traceparent": TRACEPARENT})
    assert client_view(data).errors == []
    parent, attempt = rows(exporting.extra["db"], capture_id, 2)
    assert (parent["trace_id"], parent["parent_span_id"]) == (TRACE, CLIENT_SPAN)
    ours = f"00-{TRACE}-{parent['span_id']}-01"
    assert [v for k, v in json.loads(parent["forwarded_headers"]) if k.lower() == "traceparent"] == [ours]
    assert [v for k, v in json.loads(attempt["request_headers"]) if k.lower() == "traceparent"] == [ours]
    assert (attempt["trace_id"], attempt["parent_span_id"]) == (TRACE, parent["span_id"])
    assert attempt["span_id"] not in (None, parent["span_id"])
    assert [(c["stage"], c["path"]) for c in parent["changes"] if c["stage"] == "telemetry"] == [
        ("telemetry", "headers.traceparent")
    ]


@pytest.mark.parametrize("stack", [(ALWAYS_BROKEN, "--regenerate", "1")], indirect=True)
def test_every_attempt_broken_ends_with_todays_error_event(stack: InprocProxy) -> None:
    capture_id, data = raw_stream(stack, {"model": "m", "messages": messages(), "tools": [WRITE], "stream": True})
    view = client_view(data)
    assert view.calls == [] and len(view.errors) == 1 and view.done == 1
    assert view.errors[0]["tapfix"]["reason"] == "tool_call_unrecoverable"
    found = rows(stack.extra["db"], capture_id, 2)
    assert [r["attempt"] for r in found] == [1, 2]
    skips = [c for c in found[0]["changes"] if c["kind"] == "skip"]
    assert skips and json.loads(skips[0]["after"]) == "attempts_spent"


@pytest.mark.parametrize("stack", [("break_args_first_attempt", "--regenerate", "1")], indirect=True)
def test_a_deterministic_request_is_not_regenerated_without_continuation(stack: InprocProxy) -> None:
    body = {"model": "m", "messages": messages(), "tools": [WRITE], "stream": True, "temperature": 0}
    capture_id, data = raw_stream(stack, body)
    view = client_view(data)
    assert view.calls == [] and len(view.errors) == 1
    found = rows(stack.extra["db"], capture_id, 1, timeout=1.0)
    assert [r["attempt"] for r in found] == [1]
    skips = [c for c in found[0]["changes"] if c["kind"] == "skip"]
    assert skips and json.loads(skips[0]["after"]) == "deterministic", found[0]["changes"]


@pytest.mark.parametrize("stack", [("break_args_first_attempt", "--regenerate", "0")], indirect=True)
def test_regenerate_0_is_todays_error(stack: InprocProxy) -> None:
    capture_id, data = raw_stream(stack, {"model": "m", "messages": messages(), "tools": [WRITE], "stream": True})
    view = client_view(data)
    assert view.calls == [] and len(view.errors) == 1
    found = rows(stack.extra["db"], capture_id, 1, timeout=1.0)
    assert [r["attempt"] for r in found] == [1] and "regenerated" not in json.loads(found[0]["flags"])


@pytest.mark.parametrize("stack", [("break_args_first_attempt", "--regenerate", "1")], indirect=True)
def test_a_request_for_two_choices_is_not_regenerated(stack: InprocProxy) -> None:
    """A regenerated choice can't be asked for alone: `n: 2` goes straight to the upstream, as today."""
    body = {"model": "m", "messages": messages(), "tools": [WRITE], "stream": True, "n": 2}
    capture_id, data = raw_stream(stack, body)
    assert client_view(data).errors, "the broken call ends in today's error event"
    found = rows(stack.extra["db"], capture_id, 1, timeout=1.0)
    assert [r["attempt"] for r in found] == [1] and "regenerated" not in json.loads(found[0]["flags"])
    assert not [c for c in found[0]["changes"] if c["kind"] in ("skip", "regenerate")], "never relayed"
