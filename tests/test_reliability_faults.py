"""Faults through real processes: a stalling upstream, garbage and malformed SSE, a full disk, a locked
database, and `kill -9` under load. Each: the proxy survives, the client gets what arrived (and its own
timeout is respected), and the capture has it — or, when the store itself fails, traffic still flows
and the failure is counted and shown by `GET /tapfix/health` (invariant 3).

Not repeated here (tests/test_e2e_faults.py proves them): reset mid-stream, client disconnect,
5 MB request bodies, malformed request bodies, odd SSE framing.

CI form: the stall lasts 3 s against a 1 s client timeout. Long form (TAPFIX_LONG=1): the 30 s stall
of the issue against a 10 s client timeout, and a longer kill -9 run.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.builders import tool
from tests.support.procs import Proc, cli, free_port, start_mock, start_proxy, wait_capture, wait_port

pytestmark = pytest.mark.e2e
LONG = os.environ.get("TAPFIX_LONG") == "1"
STALL_S, CLIENT_TIMEOUT_S = (30.0, 10.0) if LONG else (3.0, 1.0)
HUGE = 10 * 1024 * 1024
SCENARIO = {
    "description": "tests/test_reliability_faults.py: one fault per model name",
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
    proxy = start_proxy(tmp, mock.url)
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


def _health(proxy: Proc) -> dict:
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
    from tapfix.proxy.store.exchange_row import unpack_timing

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


def _start_limited_proxy(tmp: Path, upstream: str, db: Path, fsize: int) -> Proc:
    """A proxy whose files may not grow beyond `fsize` bytes (RLIMIT_FSIZE): a full disk, no root needed.
    Python ignores SIGXFSZ, so writes fail with EFBIG and SQLite reports the disk as full."""
    port = free_port()
    launcher = (
        f"import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize})); "
        f"sys.argv = ['tapfix'] + sys.argv[1:]; runpy.run_module('tapfix.proxy.cli', run_name='__main__')"
    )
    log_path = tmp / f"proxy-{port}.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            launcher,
            "run",
            "--upstream",
            upstream,
            "--listen",
            f"127.0.0.1:{port}",
            "--db",
            str(db),
        ],
        stdout=open(log_path, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    handle = Proc(proc, port, log_path, {"db": db})
    try:
        wait_port(port, proc)
    except Exception:
        handle.stop(signal.SIGKILL)
        raise
    return handle


def test_disk_full_keeps_traffic_flowing_and_counts_failures(stack, tmp_path):
    mock, _ = stack
    db = tmp_path / "full.db"
    from tapfix.proxy.store.sqlite.database import open_for_writing

    open_for_writing(db).close()  # created and migrated while there is room
    proxy = _start_limited_proxy(tmp_path, mock.url, db, fsize=db.stat().st_size + 96 * 1024)
    try:
        filler = os.urandom(48 * 1024).hex()  # incompressible: each request needs ~100 KB of WAL
        ok = 0
        for i in range(8):
            body = {"model": "tapfix-mock", "messages": [{"role": "user", "content": f"{i} {filler}"}]}
            response = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=20)
            ok += response.status_code == 200
        assert ok == 8, "a full disk must never break traffic"
        deadline = time.monotonic() + 15
        while (writer := _health(proxy)["capture_writer"])["failures"] == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert writer["failures"] >= 1, writer
        assert "full" in writer["last_error"].lower() or "disk" in writer["last_error"].lower(), writer
        assert writer["written"] + writer["failures"] >= 1  # every exchange is either stored or counted
        # Health counts what could not be stored per cause (issue 15): here the database's full disk.
        assert sum(writer["failures_by_cause"].values()) == writer["failures"], writer
        assert set(writer["failures_by_cause"]) <= {"disk_full", "io"}, writer
        assert (
            httpx.post(
                f"{proxy.url}/v1/chat/completions",
                timeout=20,
                json={"model": "m", "messages": [{"role": "user", "content": "still there?"}]},
            ).status_code
            == 200
        )
    finally:
        proxy.stop()
    assert "capture(s) failed" in proxy.log()  # said again at exit


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


def test_kill_9_under_load_keeps_every_exchange_older_than_a_second(tmp_path):
    mock = start_mock(tmp_path, "--chunk-delay-ms", "5")
    proxy = start_proxy(tmp_path, mock.url, db=tmp_path / "kill.db")
    db = proxy.extra["db"]
    done: list[tuple[str, float]] = []
    stop = threading.Event()
    run_for = 20.0 if LONG else 4.0

    def client(n: int) -> None:
        with httpx.Client(timeout=30) as http:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    with http.stream(
                        "POST",
                        f"{proxy.url}/v1/chat/completions",
                        json=_body("tapfix-mock", prompt=f"client {n} turn {i}: say hi"),
                    ) as r:
                        capture_id = r.headers["x-tapfix-capture-id"]
                        b"".join(r.iter_raw())
                    done.append((capture_id, time.monotonic()))
                except httpx.HTTPError:
                    return  # the kill

    try:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(client, n) for n in range(16)]
            time.sleep(run_for)
            killed_at = time.monotonic()
            os.killpg(proxy.proc.pid, signal.SIGKILL)
            stop.set()
            for f in futures:
                f.result(timeout=30)
        proxy.proc.wait(10)
    finally:
        proxy.stop()
        mock.stop()
    old = [cid for cid, t in done if t < killed_at - 1.0]
    assert len(old) >= 20, f"too little load before the kill ({len(done)} exchanges)"
    conn = sqlite3.connect(db)
    assert conn.execute("pragma integrity_check").fetchone()[0] == "ok"
    present = {r[0] for r in conn.execute("select id from exchanges")}
    conn.close()
    lost = [cid for cid in old if cid not in present]
    assert not lost, f"{len(lost)} of {len(old)} exchanges finished >1 s before kill -9 are missing"
    assert cli("captures", "list", "--db", str(db)).returncode == 0  # readers open it afterwards
