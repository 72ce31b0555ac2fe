"""Faults only a real proxy process shows: SIGTERM drains the capture queue before the process exits, and a
port already in use is a clear error at start-up. The rest of the faults (bad input, upstream resets,
odd streams), the proxy in the test process: tests/inproc/test_e2e_faults.py."""

from __future__ import annotations

import json
import signal
import socket

import httpx
import pytest

from tests.support import procs
from tests.support.inproc import cli
from tests.support.procs import start_proxy
from tests.support.rawserver import json_ok, raw_servers


@pytest.fixture
def raw():
    with raw_servers() as make:
        yield make


def test_sigterm_drains_the_capture_queue(raw, tmp_path):
    server = raw(json_ok)
    proxy = start_proxy(tmp_path, server.url, db=tmp_path / "drain.db")
    ids = []
    with httpx.Client() as client:
        for i in range(30):
            response = client.post(f"{proxy.url}/v1/chat/completions", json={"model": "m", "n": i})
            ids.append(response.headers["x-tapfix-capture-id"])
    assert proxy.stop(signal.SIGTERM) == 0
    listed = cli("captures", "list", "--json", "--limit", "0", "--db", str(tmp_path / "drain.db"))
    assert {json.loads(line)["id"] for line in listed.stdout.splitlines()} >= set(ids)


def test_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = procs.cli(
            "run", "--upstream", "http://127.0.0.1:9", "--listen", f"127.0.0.1:{port}", "--db", str(tmp_path / "x.db")
        )
    assert result.returncode != 0
    assert b"could not listen" in result.stderr or b"in use" in result.stderr
