"""Server-side replay: `tapfix mock --db PATH --capture ID` replays a capture's upstream response exactly."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.replay.server import recorded_response
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.locator import StoreLocator
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.inproc import cli, start_mock, start_proxy
from tests.support.procs import wait_capture

CHUNKS = [
    b'data: {"choices":[{"index":0,"delta":{"content":"He"}}]}\n\ndata: {"choi',
    b'ces":[{"index":0,"delta":{"content":"llo \xe2\x9c',
    b'\x93"}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n',
]
TIMES = [0.05, 0.1, 0.25, 0.4]


def _store(db: Path, **kw) -> str:
    ex = Exchange(
        method="POST",
        path="/v1/chat/completions",
        upstream_url="http://127.0.0.1:9/v1/chat/completions",
        stream=True,
        request=b"{}",
        status=200,
        content_type="text/event-stream",
        response_headers=[
            ("date", "Mon, 01 Dec 2025 10:00:00 GMT"),
            ("server", "uvicorn"),
            ("content-type", "text/event-stream; charset=utf-8"),
            ("Transfer-Encoding", "chunked"),
            ("x-tapfix-capture-id", "abc"),
            ("set-cookie", "secret=1"),
        ],
        response_chunks=list(CHUNKS),
        chunk_times=list(TIMES),
    )
    for key, value in kw.items():
        setattr(ex, key, value)
    writer = CaptureWriter(db)
    writer.submit(ex)
    writer.close()
    return ex.id


def test_recorded_response_cuts_the_body_at_the_recorded_chunks(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    capture_id = _store(db)
    recorded = recorded_response(StoreLocator.of(db).backend().reader(), capture_id)
    assert recorded.status == 200
    assert [data for _, data in recorded.chunks] == CHUNKS
    assert [round(at, 3) for at, _ in recorded.chunks] == TIMES
    assert recorded.headers == [
        ("date", "Mon, 01 Dec 2025 10:00:00 GMT"),
        ("server", "uvicorn"),
        ("content-type", "text/event-stream; charset=utf-8"),
    ]


def test_plain_response_is_one_chunk_and_no_response_is_an_error(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    plain = _store(
        db,
        stream=False,
        content_type="application/json",
        response_chunks=[],
        chunk_times=[],
        response=b'{"ok": true}',
        response_headers=[("content-type", "application/json")],
    )
    failed = _store(db, status=None, response_chunks=[], chunk_times=[], error="connect refused")
    reader = StoreLocator.of(db).backend().reader()
    assert [data for _, data in recorded_response(reader, plain).chunks] == [b'{"ok": true}']
    with pytest.raises(StoreError, match="no upstream response"):
        recorded_response(reader, failed)
    result = cli("mock", "--db", str(db), "--capture", failed)
    assert result.returncode != 0 and b"no upstream response" in result.stderr


def test_mock_replays_a_real_capture_byte_exact_with_its_timing(tmp_path: Path) -> None:
    upstream = start_mock(tmp_path, "--chunk-delay-ms", "15")
    proxy = start_proxy(tmp_path, upstream.url)
    try:
        response = httpx.post(
            f"{proxy.url}/v1/chat/completions",
            json={
                "model": "tapfix-mock",
                "stream": True,
                "messages": [{"role": "user", "content": "Say hello"}],
            },
        )
        capture_id = response.headers["x-tapfix-capture-id"]
        row = wait_capture(proxy.extra["db"], capture_id)
    finally:
        proxy.stop()
        upstream.stop()
    db = proxy.extra["db"]
    recorded = cli("captures", "export", capture_id, "--db", str(db), "--response").stdout
    assert recorded and row["chunk_count"] > 3
    last_offset = recorded_response(StoreLocator.of(db).backend().reader(), capture_id).chunks[-1][0]
    for args, slow in ((), True), (("--fast",), False):
        replayer = start_mock(tmp_path, "--db", str(db), "--capture", capture_id, *args)
        try:
            started = time.perf_counter()
            with httpx.stream("POST", f"{replayer.url}/v1/chat/completions", content=b"{}") as again:
                body = b"".join(again.iter_raw())
                headers = again.headers
            elapsed = time.perf_counter() - started
        finally:
            replayer.stop()
        assert body == recorded
        assert headers["content-type"].startswith("text/event-stream") and "x-tapfix-capture-id" not in headers
        if slow:
            assert elapsed >= last_offset * 0.8
        else:
            assert elapsed < max(0.2, last_offset)
