"""Issue 15, items 1-2, where a process is what is checked: an exported repro (curl, Python) run for real
sends every byte that arrived, and `tapfix run` and `tapfix browse` refuse a store that isn't theirs to
open (at once, with one line, no traceback). The rest: tests/inproc/truth/test_store_truth.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.inproc.truth.test_store_truth import (
    _capture_id_of,
    _refused,
    foreign_exchanges_table,
    foreign_file,
    newer_store,
    tables,
)
from tests.support.inproc import InprocMock, InprocProxy, cli, start_mock, start_proxy
from tests.support.procs import TAPFIX, free_port, response_head, wait_capture
from tests.support.rawserver import RawServer


@pytest.fixture(scope="module")
def proxy(module_tmp: Path) -> Iterator[InprocProxy]:
    """The proxy that stores what arrived runs in the test process; the repros are the processes here."""
    mock: InprocMock = start_mock(module_tmp)
    handle = start_proxy(module_tmp, mock.url, shared=True)
    yield handle
    handle.stop()
    mock.stop()


# Every byte HTTP/1.1 framing lets through: no CR, LF or NUL in a header value (and leading or trailing
# whitespace is not part of it); nor whitespace in the request target. Bodies: anything.
VALUE_BYTES = bytes(b for b in range(0x01, 0x100) if b not in (0x0A, 0x0D))
PATH_BYTES = bytes(b for b in range(0x21, 0x100))
BODY_BYTES = bytes(range(0x100)) * 2


@pytest.fixture(scope="module")
def echo_server():
    server = RawServer(lambda request: [(0.0, b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")])
    yield server
    server.close()


@pytest.mark.parametrize("as_format", ["curl", "python"])
def test_truth_1_export_round_trips_every_byte(proxy, echo_server, tmp_path: Path, as_format: str) -> None:
    path = b"/v1/bytes?all=" + PATH_BYTES
    value = b"<" + VALUE_BYTES + b">"
    head = response_head(
        proxy.port,
        b"POST " + path + b" HTTP/1.1\r\nHost: tapfix\r\nX-Every-Byte: " + value + b"\r\n"
        b"Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % len(BODY_BYTES) + BODY_BYTES,
    )
    capture_id = _capture_id_of(head)
    wait_capture(proxy.extra["db"], capture_id)
    script = tmp_path / f"repro.{as_format}"
    exported = cli("captures", "export", capture_id, "--db", str(proxy.extra["db"]), "--as", as_format)
    assert exported.returncode == 0, exported.stderr.decode()
    script.write_bytes(exported.stdout)
    before = len(echo_server.requests)
    command = ["bash", str(script)] if as_format == "curl" else [sys.executable, str(script)]
    run = subprocess.run(
        command, env={**os.environ, "TAPFIX_UPSTREAM": echo_server.url}, capture_output=True, timeout=30
    )
    assert run.returncode == 0, run.stderr.decode(errors="replace")
    sent = echo_server.requests[before]
    assert sent.head.split(b" ", 2)[:2] == [b"POST", path]
    assert b"\r\nX-Every-Byte: " + value + b"\r\n" in sent.head
    assert sent.body == BODY_BYTES


# --- item 2: databases that aren't what they seem ------------------------------------------------


def _tapfix(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    """A command that should refuse at once; if it starts serving instead, the timeout fails the test."""
    try:
        return subprocess.run(TAPFIX + list(args), capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`tapfix {' '.join(args)}` did not refuse: it kept running for {timeout}s")


def _run(db: Path) -> list[str]:
    return ["run", "--upstream", "http://127.0.0.1:9", "--listen", f"127.0.0.1:{free_port()}", "--db", str(db)]


def _browse(db: Path) -> list[str]:
    return ["browse", "--db", str(db), "--listen", f"127.0.0.1:{free_port()}", "--no-search"]


def test_truth_2_newer_store_refused(tmp_path: Path) -> None:
    db = newer_store(tmp_path / "newer.db")
    _refused(_tapfix(*_run(db)), "m999_from_the_future", "newer tapfix")
    _refused(_tapfix(*_browse(db)), "m999_from_the_future")


def test_truth_2_foreign_file_refused(tmp_path: Path) -> None:
    db = foreign_file(tmp_path / "notes.db")
    _refused(_tapfix(*_run(db)), "not a tapfix", "notes")
    assert tables(db) == {"notes"}  # nothing was added to it
    _refused(_tapfix(*_browse(db)), "not a tapfix")


def test_truth_2_foreign_exchanges_table(tmp_path: Path) -> None:
    db = foreign_exchanges_table(tmp_path / "exchanges.db")
    _refused(_tapfix(*_run(db)), "not a tapfix")
    assert tables(db) == {"exchanges"}
    _refused(_tapfix(*_browse(db)), "not a tapfix")
