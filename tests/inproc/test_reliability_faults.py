"""Faults through the real proxy and mock (in the test process): a stalling upstream, garbage and malformed
SSE, a locked database. Each: the proxy survives, the client gets what arrived (and its own timeout is
respected), and the capture has it, or, when the store itself fails, traffic still flows and the failure
is counted and shown by `GET /tapfix/health` (invariant 3). A full disk and `kill -9` under load, which
need the proxy's own process: tests/process/test_reliability_faults.py.

Not repeated here (tests/inproc/test_e2e_faults.py proves them): reset mid-stream, client disconnect,
5 MB request bodies, malformed request bodies, odd SSE framing.

CI form: the stall lasts 3 s against a 1 s client timeout. Long form (TAPFIX_LONG=1): the 30 s stall
of the issue against a 10 s client timeout.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from tests.support.builders import tool
from tests.support.inproc import InprocProxy, cli, start_mock, start_proxy
from tests.support.procs import wait_capture

LONG = os.environ.get("TAPFIX_LONG") == "1"
STALL_S, CLIENT_TIMEOUT_S = (30.0, 10.0) if LONG else (3.0, 1.0)
HUGE = 10 * 1024 * 1024
SCENARIO = {
    "description": "tests/inproc/test_reliability_faults.py: one fault per model name",
    "rules": [
        {"when": {"model": "stall"}, "do": "stall", "seconds": STALL_S, "after_chunks": 2},
        {"when": {"model": "short-stall"}, "do": "stall", "seconds": 1.5, "after_chunks": 2},
        {"when": {"model": "garbage"}, "do": "garbage"},
        {"when": {"model": "no_blank_lines"}, "do": "malformed_sse", "kind": "no_blank_lines"},
        {"when": {"model": "huge_line"}, "do": "malformed_sse", "kind": "huge_line", "size": HUGE},
        {"when": {"model": "invalid_utf8"}, "do": "malformed_sse", "kind": "invalid_utf8"},
        {"when": {"model": "error_object_midstream"}, "do": "malformed_sse", "kind": "error_object_midstream"},
    ],
}
TOOLS = [tool("write", {"filePath": {"type": "string"}, "content": {"type": "string"}})]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    scenario = tmp / "faults.json"
    scenario.write_text(json.dumps(SCENARIO))
    mock = start_mock(tmp, "--scenario", str(scenario), "--chunk-delay-ms", "2")
    proxy = start_proxy(tmp, mock.url, shared=True)
    yield mock, proxy
    proxy.stop()
    mock.stop()


def _body(model: str, tools: bool = False, prompt: str = "write notes.txt with a short note") -> dict:
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": prompt}]}
    return {**body, "tools": TOOLS} if tools else body


def _stream(url: str, body: dict, timeout: float = 30.0) -> tuple[int, dict, bytes]:
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=timeout) as r:
        return r.status_code, dict(r.headers), b"".join(r.iter_raw())


def _export(db: Path, capture_id: str, *flags: str) -> bytes:
    result = cli("captures", "export", capture_id, "--db", str(db), *flags)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _health(proxy: InprocProxy) -> dict:
    return httpx.get(f"{proxy.url}/tapfix/health", timeout=10).json()


def test_stalled_upstream_respects_the_client_timeout_and_is_captured(stack):
    mock, proxy = stack
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        with httpx.stream(
            "POST",
            f"{proxy.url}/v1/chat/completions",
            json=_body("stall"),
            timeout=httpx.Timeout(CLIENT_TIMEOUT_S, connect=5),
        ) as r:
            capture_id = r.headers["x-tapfix-capture-id"]
            for _ in r.iter_raw():
                pass
    waited = time.monotonic() - started
    assert waited < CLIENT_TIMEOUT_S + 3, f"the client waited {waited:.1f}s for a {CLIENT_TIMEOUT_S}s timeout"
    # The proxy ends the flow when the client goes (client_disconnected) or, at the latest, when the stall ends.
    row = wait_capture(proxy.extra["db"], capture_id, timeout=STALL_S + 15)
    assert row["chunk_count"] >= 1 and row["error"]
    assert "client_disconnected" in json.loads(row["flags"])
    assert _health(proxy)["status"] == "ok"


def test_a_stall_shorter_than_the_client_timeout_is_recorded_in_the_timing(stack):
    mock, proxy = stack
    status, headers, received = _stream(proxy.url, _body("short-stall"), timeout=10)
    assert status == 200 and received.endswith(b"data: [DONE]\n\n")
    row = wait_capture(proxy.extra["db"], headers["x-tapfix-capture-id"])
    from tapfix.proxy.store.writer import unpack_timing

    offsets = [t for t, _ in unpack_timing(row["chunk_timing"])]
    assert max(b - a for a, b in zip(offsets, offsets[1:], strict=False)) >= 1400  # the 1.5 s gap, in ms
    assert _export(proxy.extra["db"], row["id"], "--client-response") == received


@pytest.mark.parametrize("tools", [False, True], ids=["plain", "repair-armed"])
@pytest.mark.parametrize("kind", ["garbage", "no_blank_lines", "huge_line", "invalid_utf8", "error_object_midstream"])
def test_garbage_and_malformed_sse_pass_and_are_captured(stack, kind, tools):
    mock, proxy = stack
    body = _body(kind, tools)
    _, _, direct = _stream(mock.url, body)
    status, headers, received = _stream(proxy.url, body)
    assert status == 200
    capture_id = headers["x-tapfix-capture-id"]
    wait_capture(proxy.extra["db"], capture_id, timeout=20)
    assert _export(proxy.extra["db"], capture_id, "--response") == direct  # the capture has what arrived
    assert _export(proxy.extra["db"], capture_id, "--client-response") == received
    if not tools:
        assert received == direct  # nothing to repair: byte for byte
    else:
        assert received  # the repair stage may hold or rewrite; the client still gets a complete body
    assert _health(proxy)["capture_writer"]["failures"] == 0


def test_locked_database_keeps_traffic_flowing_and_loses_nothing_silently(stack, tmp_path):
    mock, _ = stack
    proxy = start_proxy(tmp_path, mock.url, db=tmp_path / "locked.db")
    db = proxy.extra["db"]
    try:
        httpx.post(f"{proxy.url}/v1/chat/completions", json=_body("tapfix-mock") | {"stream": False}, timeout=20)
        locker = sqlite3.connect(db, timeout=10, isolation_level=None)
        locker.execute("begin exclusive")  # held longer than the writer's 5 s busy timeout
        ids, started = [], time.monotonic()
        try:
            for i in range(5):
                r = httpx.post(
                    f"{proxy.url}/v1/chat/completions",
                    timeout=10,
                    json={"model": "m", "messages": [{"role": "user", "content": f"locked {i}"}]},
                )
                assert r.status_code == 200
                ids.append(r.headers["x-tapfix-capture-id"])
            assert time.monotonic() - started < 5, "traffic waited on the database lock"
            time.sleep(6.5 - (time.monotonic() - started))
        finally:
            locker.execute("rollback")
            locker.close()
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline:
            writer = _health(proxy)["capture_writer"]
            if writer["written"] + writer["failures"] >= 6 and writer["queue_depth"] == 0:
                break
            time.sleep(0.2)
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        present = {r[0] for r in conn.execute("select id from exchanges")}
        conn.close()
        missing = [i for i in ids if i not in present]
        # Nothing is lost silently: every missing capture is counted as a failure with its reason.
        assert len(missing) <= writer["failures"], (missing, writer)
        # A lock shorter than the writer's retries loses nothing: it is retried, and counted.
        assert not missing and writer["lock_retries"] >= 1, writer
    finally:
        proxy.stop()
