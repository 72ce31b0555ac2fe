"""How a planned response goes on the wire: send, pause, or drop the connection.

Faults (stalls, resets, malformed framing) are plain edits of a list of operations, so every
behaviour composes with every answer and the hot path (no faults, no delay) is a loop of sends of
pre-built bytes. The ASGI app here is deliberately raw (not a Starlette StreamingResponse): a reset
must close the TCP connection without the chunked-encoding terminator, which only the transport can do.
"""

from __future__ import annotations

import asyncio
import sys
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import brotli

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8")]
JSON_HEADERS = [(b"content-type", b"application/json")]


class MockReset(ConnectionError):
    """Raised where a reset cannot be done on a real socket (in-process test clients)."""


@dataclass(frozen=True)
class Send:
    data: bytes


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Reset:
    pass


Op = Send | Sleep | Reset


@dataclass
class Plan:
    """An ASGI response: status, headers, then the operations in order."""

    status: int
    headers: list[tuple[bytes, bytes]]
    ops: list[Op] = field(default_factory=list)
    before_headers: float = 0.0  # time to first byte

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.before_headers > 0:
            await asyncio.sleep(self.before_headers)
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        for op in self.ops:
            if isinstance(op, Send):
                await send({"type": "http.response.body", "body": op.data, "more_body": True})
            elif isinstance(op, Sleep):
                await asyncio.sleep(op.seconds)
            else:
                await _abort(receive)
                return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _abort(receive: Any) -> None:
    """Drop the connection under uvicorn: flush what was sent, then close with no terminating chunk."""
    transport = getattr(getattr(receive, "__self__", None), "transport", None)
    if transport is None:
        raise MockReset("reset_mid_stream: no socket to drop (in-process client)")
    for _ in range(200):
        if transport.get_write_buffer_size() == 0:
            break
        await asyncio.sleep(0.005)
    transport.abort()
    # Let asyncio deliver connection_lost, which marks the request cycle disconnected, so the
    # server neither writes more nor logs "returned without completing response".
    for _ in range(3):
        await asyncio.sleep(0)


def paced(events: Iterable[bytes], delay_s: float) -> list[Op]:
    """Events as operations, with `delay_s` before each one after the first."""
    ops: list[Op] = []
    for i, event in enumerate(events):
        if i and delay_s > 0:
            ops.append(Sleep(delay_s))
        ops.append(Send(event))
    return ops


def insert_after_sends(ops: list[Op], count: int, extra: list[Op], drop_rest: bool = False) -> list[Op]:
    """Insert `extra` after the `count`-th Send (or at the end); optionally drop what follows."""
    seen = 0
    for i, op in enumerate(ops):
        if isinstance(op, Send):
            seen += 1
            if seen == count:
                return ops[: i + 1] + extra + ([] if drop_rest else ops[i + 1 :])
    return ops + extra


def json_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    return [*JSON_HEADERS, (b"content-length", str(len(body)).encode())]


def split_body(body: bytes) -> list[Op]:
    """A non-streamed body in two halves, so a reset or stall can fall between them."""
    half = max(1, len(body) // 2)
    return [Send(body[:half]), Send(body[half:])]


def compress(plan: Plan, encoding: str, lie: bool = False) -> Plan:
    """The plan with `Content-Encoding: encoding`, each Send compressed and flushed on its own, so a
    stream stays a stream (every event decodes as it arrives). `lie`: the header only, bytes plain
    (a misconfigured server; no client can decode it). `content-length` follows the new bytes."""
    headers = [(k, v) for k, v in plan.headers if k != b"content-encoding"] + [(b"content-encoding", encoding.encode())]
    if lie:
        return Plan(plan.status, headers, plan.ops, plan.before_headers)
    piece, end = _compressor(encoding)
    ops: list[Op] = []
    for op in plan.ops:
        ops.append(Send(piece(op.data)) if isinstance(op, Send) else op)
    if not any(isinstance(op, Reset) for op in ops):
        ops.append(Send(end()))
    if any(k == b"content-length" for k, _ in headers):
        size = sum(len(op.data) for op in ops if isinstance(op, Send))
        headers = [(k, str(size).encode() if k == b"content-length" else v) for k, v in headers]
    return Plan(plan.status, headers, ops, plan.before_headers)


def _compressor(encoding: str) -> tuple[Callable[[bytes], bytes], Callable[[], bytes]]:
    """(compress one piece and flush it, end the stream)."""
    if encoding == "br":
        br = brotli.Compressor()
        return lambda data: br.process(data) + br.flush(), br.finish
    if encoding == "zstd":
        zs = zstd.ZstdCompressor()
        return lambda data: zs.compress(data, zs.FLUSH_BLOCK), lambda: zs.flush(zs.FLUSH_FRAME)
    z = zlib.compressobj(wbits=31 if encoding == "gzip" else 15)
    return lambda data: z.compress(data) + z.flush(zlib.Z_SYNC_FLUSH), z.flush
