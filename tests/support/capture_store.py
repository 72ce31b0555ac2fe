"""A small capture store written by the store's real writer, for commands that only read it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from tapfix.proxy.changes import Change
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.writer import CaptureWriter

CHAT = "/v1/chat/completions"


@dataclass
class Store:
    path: Path
    streamed: str  # forwarded body changed, one change, an SSE response the client got modified
    binary: str  # a response that is not UTF-8
    private: str  # stored without bodies
    failed: str  # no response at all


def _exchanges() -> dict[str, Exchange]:
    request = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi \xc3\xa9"}]}'
    streamed = Exchange(
        method="POST",
        path=CHAT,
        url=f"http://127.0.0.1:8080{CHAT}",
        upstream_url=f"http://127.0.0.1:8000{CHAT}",
        request=request,
        forwarded=request[:-1] + b',"temperature":0.6}',
        model="m",
        stream=True,
        status=200,
        content_type="text/event-stream",
        request_headers=[("content-type", "application/json")],
        response_headers=[("content-type", "text/event-stream")],
        response_chunks=[b'data: {"choices":[{"index":0,"delta":{"content":"hello"}}]}\n\n', b"data: [DONE]\n\n"],
        chunk_times=[0.01, 0.02],
        client_response_chunks=[
            b'data: {"choices":[{"index":0,"delta":{"content":"HELLO"}}]}\n\n',
            b"data: [DONE]\n\n",
        ],
        changes=[Change("request", "inject", "$.temperature", None, 0.6, "generation_config default")],
        flags={"runaway_length"},
        tags={"probe"},
    )
    binary = Exchange(
        method="POST",
        path="/v1/audio",
        request=b"{}",
        status=200,
        content_type="application/octet-stream",
        response=bytes(range(256)),
    )
    private = Exchange(
        method="POST",
        path=CHAT,
        request=b'{"model":"m","messages":[]}',
        status=200,
        response=b'{"choices":[]}',
        content_type="application/json",
        store_bodies=False,
    )
    failed = Exchange(method="POST", path=CHAT, request=b'{"model":"m","messages":[]}', error="upstream unreachable")
    return {"streamed": streamed, "binary": binary, "private": private, "failed": failed}


@pytest.fixture
def store(tmp_path: Path) -> Store:
    path = tmp_path / "c.db"
    exchanges = _exchanges()
    writer = CaptureWriter(path)
    for ex in exchanges.values():
        writer.submit(ex)
    writer.close()
    assert writer.health()["failures"] == 0
    return Store(path, **{name: ex.id for name, ex in exchanges.items()})
