"""Faults only real processes show: a full disk (the proxy process's file size limit) and `kill -9` under load.
Each: traffic still flows, and what the store could not take is counted and shown by `GET /tapfix/health`
(invariant 3), or, after the kill, every exchange older than a second is there. The stalling upstream,
garbage and malformed SSE and the locked database: tests/inproc/test_reliability_faults.py.

Long form (TAPFIX_LONG=1): a longer kill -9 run.
"""

from __future__ import annotations

import concurrent.futures
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

from tests.support import inproc
from tests.support.procs import Proc, cli, free_port, listening, start_mock, start_proxy

LONG = os.environ.get("TAPFIX_LONG") == "1"


@pytest.fixture(scope="module")
def mock(tmp_path_factory):
    """The upstream, in the test process: the process under test is the proxy."""
    handle = inproc.start_mock(tmp_path_factory.mktemp("faults"), "--chunk-delay-ms", "2")
    yield handle
    handle.stop()


def _body(model: str, prompt: str = "write notes.txt with a short note") -> dict:
    return {"model": model, "stream": True, "messages": [{"role": "user", "content": prompt}]}


def _health(proxy: Proc) -> dict:
    return httpx.get(f"{proxy.url}/tapfix/health", timeout=10).json()


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
    return listening(Proc(proc, port, log_path, {"db": db}))


def test_disk_full_keeps_traffic_flowing_and_counts_failures(mock, tmp_path):
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


def test_kill_9_under_load_keeps_every_exchange_older_than_a_second(tmp_path):
    mock = start_mock(tmp_path, "--chunk-delay-ms", "5")  # a process: the load takes both cores, as in use
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
