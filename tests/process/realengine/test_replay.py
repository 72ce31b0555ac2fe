"""Replay of a real capture: `tapfix replay` resends what tapfix recorded in front of llama-server, and
`tapfix mock --capture` (server-side replay) plays the engine's recorded bytes back.

At temperature 0 the tiny model answers the same again, so a replay must report the same behaviour
(content; tool-call name and arguments) while the engine's random ids and timings differ, and those
must not make the runs look different.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from tapfix.proxy.assemble import Assembled, assemble
from tapfix.proxy.store.sqlite.database import open_for_reading
from tapfix.proxy.store.sqlite.reader import capture_body, load_capture

from tests.process.realengine import tiny_model as tm
from tests.support.inproc import InprocProxy, cli, start_mock
from tests.support.procs import wait_capture

pytestmark = [pytest.mark.realengine]

CHAT = "/v1/chat/completions"


@dataclass
class Stored:
    """One capture as the store holds it: the row, and the upstream's response bytes read as a message."""

    capture: dict[str, Any]
    response: bytes

    @property
    def content_type(self) -> str:
        headers = self.capture.get("response_headers") or []
        return next((value for name, value in headers if name.lower() == "content-type"), "")

    @property
    def message(self) -> Assembled:
        return assemble(self.response, self.content_type, self.capture.get("path"))

    def response_ids(self) -> set[str]:
        """The engine's `chatcmpl-...` ids in the body (one per event when streamed)."""
        return {obj["id"] for obj in _objects(self.response) if isinstance(obj.get("id"), str)}

    def has_timings(self) -> bool:
        return any("timings" in obj for obj in _objects(self.response))


def _objects(body: bytes) -> list[dict[str, Any]]:
    if body.lstrip().startswith(b"{"):
        return [json.loads(body)]
    lines = [line.removeprefix(b"data: ") for line in body.splitlines() if line.startswith(b"data: {")]
    return [json.loads(line) for line in lines]


def stored(db: Path, capture_id: str) -> Stored:
    wait_capture(db, capture_id)
    conn: sqlite3.Connection = open_for_reading(db)
    try:
        capture = load_capture(conn, capture_id)
        return Stored(capture, capture_body(conn, capture, "response"))
    finally:
        conn.close()


def calls(message: Assembled) -> list[tuple[str, Any]]:
    return [(c["name"], json.loads(c["arguments"])) for c in message.tool_calls]


@pytest.fixture(scope="module")
def captured(llama_proxy: InprocProxy) -> dict[str, str]:
    """Two real exchanges through `tapfix run`: a plain answer (not streamed) and a tool-call turn
    (streamed), by name to capture id."""
    turns = {
        "plain": {"messages": [{"role": "user", "content": "Say hello"}], "stream": False},
        "tool": {
            "messages": [{"role": "user", "content": "Write hello.txt"}],
            "tools": [tm.WRITE_TOOL],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    }
    ids = {}
    for name, turn in turns.items():
        body = {"model": "tiny", "temperature": 0, "seed": 11, **turn}
        response = httpx.post(llama_proxy.url + CHAT, json=body, timeout=30)
        assert response.status_code == 200, response.text
        ids[name] = response.headers["x-tapfix-capture-id"]
    return ids


def test_the_captures_hold_the_models_answers(llama_proxy: InprocProxy, captured: dict[str, str]):
    """The ground the replays stand on: what llama-server really answered, as tapfix recorded it."""
    db = llama_proxy.extra["db"]
    assert stored(db, captured["plain"]).message.content == tm.ANSWER
    assert calls(stored(db, captured["tool"]).message) == [(tm.CALL_NAME, tm.CALL_ARGUMENTS)]


@pytest.mark.parametrize("turn", ["plain", "tool"])
def test_replay_reaches_llama_server_and_reports_the_same_behaviour(
    llama, llama_proxy: InprocProxy, captured: dict[str, str], turn: str
):
    db = llama_proxy.extra["db"]
    source = stored(db, captured[turn])
    result = cli("replay", captured[turn], "--db", str(db), "--times", "2", "--json")
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["run"], r["status"], r["source_id"], r["error"]) for r in rows] == [
        (1, 200, captured[turn], None),
        (2, 200, captured[turn], None),
    ]
    # the report: both runs alike (their ids and timings differ, which must not count), no flags
    assert [(r["similarity"], r["outlier"], r["flags"]) for r in rows] == [(1.0, False, [])] * 2
    want = source.message
    if turn == "tool":
        assert [(r["tools_valid"], r["tool_problems"], r["finish_reason"]) for r in rows] == [
            (True, [], want.finish_reason)
        ] * 2
        assert all(r["preview"].startswith(tm.CALL_NAME + "(") for r in rows), rows
    else:
        assert [(r["tools_valid"], r["preview"], r["finish_reason"]) for r in rows] == [
            (None, tm.ANSWER, want.finish_reason)
        ] * 2
    # each run is a capture of its own, and what it holds came from llama-server, generated again
    for row in rows:
        run = stored(db, row["capture_id"])
        assert run.capture["source_id"] == captured[turn] and "replay" in run.capture["tags"]
        assert run.capture["upstream_url"] == llama.url + CHAT
        got = run.message
        assert (got.content, calls(got), got.finish_reason) == (want.content, calls(want), want.finish_reason)
        assert run.has_timings(), "llama-server times every generation; a replay without timings wasn't its answer"
        assert run.response_ids().isdisjoint(source.response_ids()), "a fresh generation gets a fresh id"


def test_a_replay_of_the_tool_turn_with_the_tools_removed_gets_the_text_answer(
    llama_proxy: InprocProxy, captured: dict[str, str]
):
    """The replayed body is what the server acts on: without tools the same model answers in text."""
    db = llama_proxy.extra["db"]
    result = cli("replay", captured["tool"], "--db", str(db), "--unset", "tools", "--json")
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    (row,) = [json.loads(line) for line in result.stdout.splitlines()]
    run = stored(db, row["capture_id"])
    assert (run.message.content, run.message.tool_calls) == (tm.ANSWER, [])
    assert row["tools_valid"] is None and row["preview"] == tm.ANSWER


@pytest.mark.parametrize("turn", ["plain", "tool"])
def test_server_side_replay_plays_the_engines_recorded_bytes(
    llama_proxy: InprocProxy, captured: dict[str, str], turn: str, tmp_path: Path
):
    db = llama_proxy.extra["db"]
    source = stored(db, captured[turn])
    mock = start_mock(tmp_path, "--db", str(db), "--capture", captured[turn], "--fast")
    try:
        conn = open_for_reading(db)
        try:
            request = capture_body(conn, source.capture, "forwarded")
        finally:
            conn.close()
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        response = httpx.post(mock.url + CHAT, content=request, headers=headers, timeout=30)
    finally:
        mock.stop()
    assert response.status_code == source.capture["status"]
    assert response.headers["content-type"] == source.content_type
    assert response.content == source.response  # llama-server's bytes: its ids, timings and all
