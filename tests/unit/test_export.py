"""Repro exports: bundles are complete and hold no secret; a response body has no curl repro (the repros run
for real in tests/process/test_export.py)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import orjson
import pytest
from tapfix.proxy.replay.export import export_capture, write_bundle
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.sqlite.database import open_for_reading
from tapfix.proxy.store.sqlite.reader import SqliteReader, load_capture
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.stores import streamed_chat

SECRET = "sk-tapfix-export-secret-0123456789"


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
        streamed_chat(
            id="01exportcapture0",
            url="http://127.0.0.1:8080/v1/chat/completions",
            upstream_url="http://127.0.0.1:9/v1/chat/completions",
            request=body,
            forwarded=forwarded,
            request_headers=[("content-type", "application/json"), ("authorization", f"Bearer {SECRET}")],
            forwarded_headers=[("content-type", "application/json"), ("authorization", f"Bearer {SECRET}")],
            response_headers=[
                ("content-type", "text/event-stream"),
                ("server", "uvicorn"),
                ("set-cookie", f"s={SECRET}"),
            ],
            response_chunks=chunks,
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
