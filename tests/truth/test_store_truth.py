"""Issue 15, items 0-2: the store never loses an exchange, keeps every byte that arrived, knows its version.

Through a real `tapfix run` in front of `tapfix mock` where the bug is in the proxy; the writer's
fallback (an exchange that still can't be stored whole) in process, against a real SQLite limit.
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.reader import capture_body, list_captures, load_capture
from tapfix.proxy.store.writer import CaptureWriter, open_for_reading, open_for_writing

from tests.support.procs import TAPFIX, cli, free_port, start_proxy, wait_capture
from tests.support.rawserver import RawServer

CHAT = "/v1/chat/completions"


def _capture_id(response: httpx.Response) -> str:
    capture_id = response.headers.get("x-tapfix-capture-id")
    assert capture_id, response.headers
    return capture_id


def _health(proxy) -> dict:
    return httpx.get(f"{proxy.url}/tapfix/health", timeout=10).json()


# --- item 0: one bad body loses its neighbours ---------------------------------------------------


def _bad_or_good(i: int) -> bytes:
    content = b"turn %d" % i
    if i % 4 == 1:  # a non-UTF-8 byte in a key
        return b'{"model":"m\xc7","mess\xa8ages":[{"role":"user","content":"' + content + b'"}]}'
    if i % 4 == 3:  # a non-UTF-8 byte in the model name
        return b'{"model":"m\xc7","messages":[{"role":"user","content":"' + content + b'"}]}'
    return b'{"model":"tapfix-mock","messages":[{"role":"user","content":"' + content + b'"}]}'


@pytest.mark.e2e
def test_truth_0_bad_body_keeps_neighbours(proxy) -> None:
    db = proxy.extra["db"]
    before = _health(proxy)["capture_writer"]

    def send(i: int) -> tuple[str, bytes]:
        body = _bad_or_good(i)
        with httpx.Client(timeout=30) as client:
            response = client.post(f"{proxy.url}{CHAT}", content=body, headers={"content-type": "application/json"})
        return _capture_id(response), body

    def stream(i: int) -> str:
        body = {"model": "tapfix-mock", "stream": True, "messages": [{"role": "user", "content": f"stream {i}"}]}
        with httpx.Client(timeout=30) as client, client.stream("POST", f"{proxy.url}{CHAT}", json=body) as response:
            response.read()
            return _capture_id(response)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        sent = list(pool.map(send, range(60)))
        streams = list(pool.map(stream, range(16)))
    for capture_id, body in sent:
        wait_capture(db, capture_id, timeout=20)
        exported = cli("captures", "export", capture_id, "--db", str(db))
        assert exported.returncode == 0, exported.stderr.decode()
        assert exported.stdout == body  # the bad ones too, byte for byte
    for capture_id in streams:
        assert wait_capture(db, capture_id, timeout=20)["content"]
    after = _health(proxy)
    assert after["capture_writer"]["failures"] == before["failures"] == 0, after
    assert not after["capture_writer"].get("capture_failed"), after
    assert after["status"] != "degraded", after


def _json_answer(content: str) -> bytes:
    return orjson.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})


def test_truth_0_unstorable_exchange_kept_with_its_bytes(tmp_path: Path) -> None:
    """An exchange the writer can't store whole (here: an answer beyond SQLite's length limit, lowered
    so the test stays small; the default limit is 1 GB) is kept as a row with its raw bytes and the
    error, flagged `capture_failed`, and the exchanges around it are stored as usual."""
    db = tmp_path / "c.db"
    writer = CaptureWriter(db)
    writer.conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 100_000)
    huge = "a" * 200_000  # compresses to a small body blob, but the assembled text column is too long
    exchanges = [
        Exchange(
            method="POST",
            path=CHAT,
            request=b'{"model":"m","messages":[{"role":"user","content":"%d"}]}' % i,
            model="m",
            status=200,
            content_type="application/json",
            response=_json_answer(huge if i == 2 else f"answer {i}"),
        )
        for i in range(5)
    ]
    for ex in exchanges:
        writer.submit(ex)
    writer.close()
    conn = open_for_reading(db)
    rows = {row["id"]: row for row in list_captures(conn, limit=0)}
    assert set(rows) == {ex.id for ex in exchanges}
    for i, ex in enumerate(exchanges):
        capture = load_capture(conn, ex.id)
        assert capture_body(conn, capture, "request") == ex.request
        assert capture_body(conn, capture, "response") == ex.response
        if i == 2:
            assert "capture_failed" in capture["flags"]
            assert "too big" in capture["error"]
            assert capture["status"] == 200 and capture["path"] == CHAT and capture["model"] == "m"
        else:
            assert capture["content"] == f"answer {i}" and "capture_failed" not in capture["flags"]
    health = writer.health()
    assert health["capture_failed"] == {"DataError": 1} and health["failures"] == 0, health
    assert list_captures(conn, flag="capture_failed")[0]["id"] == exchanges[2].id
