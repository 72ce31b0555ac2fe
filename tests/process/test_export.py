"""Repro exports: curl and Python repros, run for real (bash, curl, python), send byte-identical bodies.
The CLI itself runs in the test process; the bundle's contents: tests/unit/test_export.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tapfix.proxy.replay.export import curl_script, python_script

from tests.support.ci import unavailable
from tests.support.inproc import cli
from tests.support.rawserver import RawServer
from tests.unit.test_export import stored  # noqa: F401 - the fixture: a real store with one exchange

SECRET = "sk-tapfix-export-secret-0123456789"
BODIES = [
    b'{"model":"m","messages":[{"role":"user","content":"hi"}]}',
    b'{ "model" : "m",\n  "messages":[{"content":"caf\\u00e9 \xe2\x9c\x93 \'quotes\' $HOME `ls` \\\\ \\"", '
    b'"role":"user"}] }\n\n',
    b'{"a": "no trailing newline"}',
    b"\xff\xfe not utf-8 \x00 with a NUL \r\n and CR\r",
    b"line\nTAPFIX_BODY_\nEOF\n'EOF'\n",
    "中文 тест 🙂".encode() * 1000,
    b"",
]


def _ok(request) -> list[tuple[float, bytes]]:
    return [(0.0, b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")]


@pytest.fixture(scope="module")
def server():
    srv = RawServer(_ok)
    yield srv
    srv.close()


def _capture(body: bytes, **kw) -> dict:
    return {
        "id": "01testcapture000",
        "method": "POST",
        "path": "/v1/chat/completions",
        "upstream_url": "http://127.0.0.1:9/v1/chat/completions",
        "request_headers": [
            ["content-type", "application/json"],
            ["authorization", "[redacted]"],
            ["x-api-key", "[redacted]"],
            ["Host", "127.0.0.1:8080"],
            ["user-agent", "t/1"],
            ["x-goog-api-key", "whatever"],
            ["x-session-id", "ses_1"],
        ],
        "forwarded_headers": None,
        **kw,
    }


def _env(server: RawServer) -> dict[str, str]:
    return {**os.environ, "TAPFIX_UPSTREAM": server.url, "TAPFIX_API_KEY": SECRET}


def run_repro(server: RawServer, script: Path, text: str, runner: str) -> tuple[subprocess.CompletedProcess, Any]:
    """A repro script written to `script` and run by `runner` against the server: it exits 0; returns the run
    and the request it sent."""
    script.write_text(text)
    before = len(server.requests)
    run = subprocess.run([runner, str(script)], env=_env(server), capture_output=True, timeout=30)
    assert run.returncode == 0, run.stderr.decode()
    return run, server.requests[before]


def _need_curl() -> None:
    if shutil.which("curl") is None:
        unavailable("curl is not installed")  # CI runs every repro test


@pytest.mark.parametrize("body", BODIES)
def test_curl_repro_sends_exact_bytes(tmp_path: Path, server: RawServer, body: bytes) -> None:
    _need_curl()
    script = tmp_path / "repro.sh"
    run, request = run_repro(server, script, curl_script(_capture(body), body), "bash")
    assert run.stdout == b"{}"
    assert request.body == body
    assert request.path == "/v1/chat/completions"
    assert request.header("authorization") == f"Bearer {SECRET}"  # from the environment at run time
    assert request.header("user-agent") == "t/1" and request.header("x-goog-api-key") is None
    assert SECRET not in script.read_text()


@pytest.mark.parametrize("body", BODIES)
def test_python_repro_sends_exact_bytes(tmp_path: Path, server: RawServer, body: bytes) -> None:
    run, request = run_repro(server, tmp_path / "repro.py", python_script(_capture(body), body), sys.executable)
    assert run.stdout == b"{}" and b"HTTP 200" in run.stderr
    assert request.body == body
    assert request.header("authorization") == f"Bearer {SECRET}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(min_size=1, max_size=400) | st.text(min_size=1, max_size=400).map(str.encode))
def test_curl_repro_any_bytes(tmp_path: Path, server: RawServer, body: bytes) -> None:
    _need_curl()
    _, request = run_repro(server, tmp_path / "any.sh", curl_script(_capture(body), body), "bash")
    assert request.body == body


def test_cli_export_formats(tmp_path: Path, stored: Path, server: RawServer, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Via `captures export`: stdout repros run as they are; a bundle defaults to ./tapfix-bundle-ID."""
    curl = cli("captures", "export", "01export", "--db", str(stored), "--as", "curl")
    assert curl.returncode == 0, curl.stderr.decode()
    before = len(server.requests)
    if shutil.which("curl"):
        run = subprocess.run(["bash", "-c", curl.stdout.decode()], env=_env(server), capture_output=True, timeout=30)
        assert run.returncode == 0 and server.requests[before].body.endswith(b',"temperature":0.7}')
    py = cli("captures", "export", "01export", "--db", str(stored), "--as", "python", "-o", str(tmp_path / "r.py"))
    assert py.returncode == 0 and (tmp_path / "r.py").read_text().startswith("#!/usr/bin/env python3")
    monkeypatch.chdir(tmp_path)
    bundle = cli("captures", "export", "01export", "--db", str(stored), "--as", "bundle")
    assert bundle.returncode == 0, bundle.stderr.decode()
    assert (tmp_path / "tapfix-bundle-01exportcapture0" / "README.md").exists()
