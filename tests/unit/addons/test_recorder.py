"""RecordRequest and RecordExchange in-process: which flows are recorded, what is noted from a request
body, and what reaches the capture store when the exchange ends (by response or by error)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mitmproxy import flow as mflow
from mitmproxy.test import taddons
from tapfix.addons.recorder import RecordExchange, RecordRequest
from tapfix.addons.runner.runtime import META
from tapfix.proxy.store.sqlite.database import open_for_reading
from tapfix.proxy.store.sqlite.reader import capture_body

from tests.support.flows import READ_TOOL, flow, json_response, runtime, store


def test_the_request_is_kept_as_sent_with_what_the_stages_need() -> None:
    rt = runtime()
    recorder = RecordRequest(rt)
    f = flow(body={"model": "m", "stream": True, "tools": [READ_TOOL], "messages": []})
    with taddons.context(recorder):
        recorder.request(f)
    ex = f.metadata[META]
    assert ex.request == f.request.raw_content and ex.method == "POST" and ex.path == "/v1/chat/completions"
    assert (ex.model, ex.stream, ex.tools) == ("m", True, [READ_TOOL])
    assert ("content-type", "application/json") in ex.request_headers and rt.exchanges_seen == 1


def test_a_body_that_is_not_a_json_object_is_flagged_not_refused() -> None:
    recorder = RecordRequest(runtime())
    f = flow(body=b"[1, 2")
    with taddons.context(recorder):
        recorder.request(f)
    assert "malformed_request_body" in f.metadata[META].flags


def test_guard_clauses_skip_answered_own_and_foreign_flows() -> None:
    rt = runtime(mode="regular", intercept=["api.example.com"])
    recorder = RecordRequest(rt)
    answered = flow(response=json_response({"ok": True}))
    own = flow("/tapfix/health", method="GET")
    foreign = flow()  # 127.0.0.1 is not an intercepted host in regular mode
    with taddons.context(recorder):
        for f in (answered, own, foreign):
            recorder.request(f)
            assert META not in f.metadata
    assert rt.exchanges_seen == 0


def test_an_exchange_is_recorded_once_with_the_forwarded_body_when_it_differs(tmp_path: Path) -> None:
    writer = store(tmp_path)
    rt = runtime(writer=writer)
    first, last = RecordRequest(rt), RecordExchange(rt)
    f = flow(body={"model": "m", "messages": []})
    with taddons.context(first, last):
        first.request(f)
        f.request.raw_content = b'{"model":"served","messages":[]}'  # what the router forwarded
        f.response = json_response({"choices": []})
        last.response(f)
        last.response(f)  # a second end (error after response) is ignored
    writer.close()
    conn = open_for_reading(tmp_path / "captures.db")
    rows = conn.execute("select * from exchanges").fetchall()
    assert len(rows) == 1 and rows[0]["status"] == 200
    assert capture_body(conn, rows[0], "forwarded") == b'{"model":"served","messages":[]}'
    assert capture_body(conn, rows[0], "response") == b'{"choices":[]}'


@pytest.mark.parametrize(
    ("message", "answered", "flag"),
    [
        ("connection refused", False, "upstream_error"),
        ("peer closed connection", True, "upstream_reset"),
        ("client disconnected", True, "client_disconnected"),
    ],
)
def test_an_exchange_that_ends_in_an_error_says_which_side_failed(message: str, answered: bool, flag: str) -> None:
    rt = runtime()
    first, last = RecordRequest(rt), RecordExchange(rt)
    f = flow(body={"model": "m"})
    with taddons.context(first, last):
        first.request(f)
        if answered:
            f.response = json_response({"choices": []})
        f.error = mflow.Error(message)
        last.error(f)
    ex = f.metadata[META]
    assert flag in ex.flags and ex.error == message and ex.ended_at is not None
