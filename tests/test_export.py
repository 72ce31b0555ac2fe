"""Repro exports: curl and Python repros, run for real, send byte-identical bodies; bundles hold no secret."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.replay.export import curl_script, export_capture, python_script, write_bundle
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.sqlite.database import open_for_reading
from tapfix.proxy.store.sqlite.reader import SqliteReader, load_capture
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.ci import unavailable
from tests.support.procs import cli
from tests.support.rawserver import RawServer

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


def _need_curl() -> None:
    if shutil.which("curl") is None:
        unavailable("curl is not installed")  # CI runs every repro test


@pytest.mark.e2e
@pytest.mark.parametrize("body", BODIES)
def test_curl_repro_sends_exact_bytes(tmp_path: Path, server: RawServer, body: bytes) -> None:
    _need_curl()
    script = tmp_path / "repro.sh"
    script.write_text(curl_script(_capture(body), body))
    before = len(server.requests)
    run = subprocess.run(["bash", str(script)], env=_env(server), capture_output=True, timeout=30)
    assert run.returncode == 0, run.stderr.decode()
    assert run.stdout == b"{}"
    request = server.requests[before]
    assert request.body == body
    assert request.path == "/v1/chat/completions"
    assert request.header("authorization") == f"Bearer {SECRET}"  # from the environment at run time
    assert request.header("user-agent") == "t/1" and request.header("x-goog-api-key") is None
    assert SECRET not in script.read_text()


@pytest.mark.e2e
@pytest.mark.parametrize("body", BODIES)
def test_python_repro_sends_exact_bytes(tmp_path: Path, server: RawServer, body: bytes) -> None:
    script = tmp_path / "repro.py"
    script.write_text(python_script(_capture(body), body))
    before = len(server.requests)
    run = subprocess.run([sys.executable, str(script)], env=_env(server), capture_output=True, timeout=30)
    assert run.returncode == 0, run.stderr.decode()
    assert run.stdout == b"{}" and b"HTTP 200" in run.stderr
    assert server.requests[before].body == body
    assert server.requests[before].header("authorization") == f"Bearer {SECRET}"


@pytest.mark.e2e
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(min_size=1, max_size=400) | st.text(min_size=1, max_size=400).map(str.encode))
def test_curl_repro_any_bytes(tmp_path: Path, server: RawServer, body: bytes) -> None:
    _need_curl()
    script = tmp_path / "any.sh"
    script.write_text(curl_script(_capture(body), body))
    before = len(server.requests)
    run = subprocess.run(["bash", str(script)], env=_env(server), capture_output=True, timeout=30)
    assert run.returncode == 0, run.stderr.decode()
    assert server.requests[before].body == body


@pytest.fixture
def stored(tmp_path: Path) -> Path:
    """A real store holding one streamed exchange with a change and a redacted key."""
    db = tmp_path / "c.db"
    writer = CaptureWriter(db)
    body = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"Say hi"}]}'
    forwarded = body[:-1] + b',"temperature":0.7}'
    chunks = [
        b'data: {"choices":[{"index":0,"delta":{"content":"Hello there, here is the answer you asked for. '
        + "因为配置文件需要更新以便系统能够正确加载模型参数然后我们再检查输出结果是否符合预期".encode()
        + b'"}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n',
    ]
    writer.submit(
        Exchange(
            id="01exportcapture0",
            method="POST",
            path="/v1/chat/completions",
            url="http://127.0.0.1:8080/v1/chat/completions",
            upstream_url="http://127.0.0.1:9/v1/chat/completions",
            model="m",
            stream=True,
            request=body,
            forwarded=forwarded,
            request_headers=[("content-type", "application/json"), ("authorization", f"Bearer {SECRET}")],
            forwarded_headers=[("content-type", "application/json"), ("authorization", f"Bearer {SECRET}")],
            status=200,
            response_headers=[
                ("content-type", "text/event-stream"),
                ("server", "uvicorn"),
                ("set-cookie", f"s={SECRET}"),
            ],
            content_type="text/event-stream",
            response_chunks=chunks,
            chunk_times=[0.01, 0.02],
            response_started_at=None,
            ended_at=None,
            user_agent="opencode/1",
        )
    )
    writer.close()
    return db


def _all_bytes(path: Path) -> bytes:
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as archive:
            return b"".join(archive.read(name) for name in archive.namelist())
    return b"".join(p.read_bytes() for p in sorted(path.iterdir()))


@pytest.mark.parametrize("name", ["bundle", "bundle.zip"])
def test_bundle_is_complete_and_secret_free(
    tmp_path: Path, stored: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_UPSTREAM_API_KEY", "local-key-value-123456")
    conn = open_for_reading(stored)
    capture = load_capture(conn, "01exportcapture0")
    out = write_bundle(SqliteReader(conn), capture, tmp_path / name)
    data = _all_bytes(out)
    assert SECRET.encode() not in data and b"local-key-value-123456" not in data
    if out.is_dir():
        files = {p.name for p in out.iterdir()}
        assert {
            "README.md",
            "request.json",
            "forwarded.json",
            "response.sse",
            "headers.json",
            "changes.json",
            "timing.json",
            "flags.json",
            "repro.sh",
            "repro.py",
            "exchange.json",
        } <= files
        assert (out / "request.json").read_bytes().endswith(b'"Say hi"}]}')
        assert (out / "forwarded.json").read_bytes().endswith(b',"temperature":0.7}')
        assert (out / "response.sse").read_bytes().endswith(b"data: [DONE]\n\n")
        readme = (out / "README.md").read_text()
        assert "script_drift" in readme and "`temperature`: `0.7`" in readme and "server: `uvicorn`" in readme
        timing = orjson.loads((out / "timing.json").read_bytes())
        assert [c["size"] for c in timing["chunks"]] == [len(c) for c in _chunks_of(out)]
        assert orjson.loads((out / "flags.json").read_bytes()) == ["script_drift"]
        headers = orjson.loads((out / "headers.json").read_bytes())
        assert all(
            k.lower() not in ("authorization", "set-cookie") for k, _ in headers["request"] + headers["response"]
        )
    else:
        with zipfile.ZipFile(out) as archive:
            assert "bundle/README.md" in archive.namelist()


def _chunks_of(out: Path) -> list[bytes]:
    data = (out / "response.sse").read_bytes()
    cut = data.index(b"\n\n") + 2
    return [data[:cut], data[cut:]]


def test_bundle_refuses_to_overwrite(tmp_path: Path, stored: Path) -> None:
    conn = open_for_reading(stored)
    capture = load_capture(conn, "01exportcapture0")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("mine")
    with pytest.raises(StoreError, match="already exists"):
        write_bundle(SqliteReader(conn), capture, tmp_path / "taken")
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["x"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tapfix-bundle")]


def test_curl_export_refuses_a_response_body(stored: Path) -> None:
    conn = open_for_reading(stored)
    with pytest.raises(StoreError, match="request body"):
        export_capture(SqliteReader(conn), load_capture(conn, "01exportcapture0"), "curl", None, "response")


@pytest.mark.e2e
def test_cli_export_formats(tmp_path: Path, stored: Path, server: RawServer) -> None:
    """Via `captures export`: stdout repros run as they are; a bundle defaults to ./tapfix-bundle-ID."""
    curl = cli("captures", "export", "01export", "--db", str(stored), "--as", "curl")
    assert curl.returncode == 0, curl.stderr.decode()
    before = len(server.requests)
    if shutil.which("curl"):
        run = subprocess.run(["bash", "-c", curl.stdout.decode()], env=_env(server), capture_output=True, timeout=30)
        assert run.returncode == 0 and server.requests[before].body.endswith(b',"temperature":0.7}')
    py = cli("captures", "export", "01export", "--db", str(stored), "--as", "python", "-o", str(tmp_path / "r.py"))
    assert py.returncode == 0 and (tmp_path / "r.py").read_text().startswith("#!/usr/bin/env python3")
    bundle = subprocess.run(
        [
            sys.executable,
            "-m",
            "tapfix.proxy.cli",
            "captures",
            "export",
            "01export",
            "--db",
            str(stored),
            "--as",
            "bundle",
        ],
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
    )
    assert bundle.returncode == 0, bundle.stderr.decode()
    assert (tmp_path / "tapfix-bundle-01exportcapture0" / "README.md").exists()
