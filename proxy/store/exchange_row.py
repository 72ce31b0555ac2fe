"""One exchange's row in `exchanges`, as the writer stores it on every backend: its columns from the
exchange, its assembled answer, its session link and its bodies' ids; and the chunk timing's packing."""

from __future__ import annotations

import array
import datetime
from typing import Any

import orjson
from tapfix.proxy.assemble import Assembled, assemble, assemble_sse
from tapfix.proxy.assemble.usage import usage_counts
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.kept import body_columns, route_columns, trace_columns
from tapfix.proxy.store.redact import redact_headers, redact_url
from tapfix.proxy.store.sessions import SessionLink


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat(timespec="milliseconds")


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def exchange_row(
    ex: Exchange,
    assembled: Assembled,
    link: SessionLink,
    bodies: dict[str, int | None],
    *,
    upstream: bytes,
    flags: set[str],
    error: str | None,
    first_token_ms: float | None,
) -> dict[str, Any]:
    usage = assembled.usage if isinstance(assembled.usage, dict) else {}
    row = {
        "id": ex.id,
        "ts": ex.started_at,
        "started_at": _iso(ex.started_at),
        "upstream_first_byte_ms": _ms(ex.response_started_at, ex.mark),
        "first_token_ms": first_token_ms,
        "duration_ms": _ms(ex.ended_at, ex.mark),
        "client_addr": ex.client_addr,
        "user_agent": ex.user_agent,
        "method": ex.method,
        "path": redact_url(ex.path),
        "url": redact_url(ex.url),
        "upstream_url": redact_url(ex.upstream_url),
        "model": ex.model,
        "served_model": ex.served_model,
        "prefix_break": _json(ex.prefix_break) if ex.prefix_break is not None else None,
        "route": ex.route,
        "stream": int(ex.stream),
        "status": ex.status,
        "error": error or ex.error,
        "session_id": link.session_id,
        "thread_id": link.thread_id,
        "chain_hash": link.chain_hash,
        "response_id": link.response_id,
        "source_id": ex.source_id,
        **attempt_columns(ex),
        **trace_columns(ex),
        **route_columns(ex, cache_n(assembled)),
        "tags": _json(sorted(ex.tags)),
        "flags": _json(sorted(flags)),
        "changes_count": len(ex.changes),
        **body_columns(ex, bodies, upstream),
        "request_headers": _json(redact_headers(ex.request_headers)),
        "forwarded_headers": _json(redact_headers(ex.forwarded_headers)) if ex.forwarded_headers is not None else None,
        "response_headers": _json(redact_headers(ex.response_headers)),
        "content": assembled.content if ex.store_bodies else None,
        "reasoning": assembled.reasoning if ex.store_bodies else None,
        "tool_calls": _json(assembled.tool_calls) if ex.store_bodies else None,
        "finish_reason": assembled.finish_reason,
        "usage": _json(assembled.usage) if assembled.usage is not None else None,
        "prompt_tokens": usage.get("prompt_tokens", usage.get("input_tokens")),
        "completion_tokens": usage.get("completion_tokens", usage.get("output_tokens")),
        **usage_details(usage, cache_n(assembled)),
        "chunk_count": len(ex.chunk_times),
        "chunk_timing": pack_timing(ex.chunk_times, ex.response_chunks),
    }
    return row


MAX_COUNT = 2**31 - 1  # beyond this it is no token count (and PostgreSQL's integer column can't hold it)


def usage_details(usage: dict[str, Any], cache_n: int | None = None) -> dict[str, int | None]:
    """`cached_tokens` and `reasoning_tokens` of a usage object, as assemble/usage.py reads every surface's
    (None: it doesn't say). The migrations that added these columns fill old rows by the same paths
    (store/sqlite/schema.py m008, store/pg/schema.py pg007). Where the usage doesn't say, llama.cpp's
    `timings.cache_n` does (the same count: llama-servers that report `cached_tokens` report it from it)."""
    counts = usage_counts(usage)
    cached = counts.cached if counts.cached is not None else cache_n
    return {"cached_tokens": _count(cached), "reasoning_tokens": _count(counts.reasoning)}


def cache_n(assembled: Assembled) -> int | None:
    """The prompt tokens llama.cpp's answer says its slot's cache served (`timings.cache_n`); None: no timings."""
    timings = assembled.timings
    value = timings.get("cache_n") if isinstance(timings, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _count(value: int | None) -> int | None:
    return value if value is not None and 0 <= value <= MAX_COUNT else None


def attempt_columns(ex: Exchange) -> dict[str, Any]:
    """Which attempt the exchange is: the client-facing one (1, no parent), or a regeneration 2...N+1."""
    return {"attempt_of": ex.attempt_of, "attempt": ex.attempt if ex.attempt_of is not None else 1}


def assemble_answer(ex: Exchange, body: bytes) -> Assembled:
    path = ex.path.split("?", 1)[0]
    streamed = ex.response is None and ex.response_chunks and "event-stream" in ex.content_type
    if ex.client_response_chunks is None and streamed:
        return assemble_sse(ex.readable_chunks(), path)  # decoded when it came compressed
    return assemble(ex.readable(body), ex.content_type, path)


def _ms(when: float | None, mark: float) -> float | None:
    return None if when is None else round((when - mark) * 1000, 3)


def pack_timing(times: list[float], chunks: list[bytes]) -> bytes | None:
    if not times:
        return None
    offsets = array.array("f", [t * 1000 for t in times])  # from lists: an array filled from a generator grows
    sizes = array.array("I", list(map(len, chunks[: len(times)])))
    return offsets.tobytes() + sizes.tobytes()


def unpack_timing(blob: bytes | None) -> list[tuple[float, int]]:
    """[(ms offset, size), ...] from an exchange's chunk_timing column."""
    if not blob:
        return []
    n = len(blob) // 8
    offsets = array.array("f")
    offsets.frombytes(blob[: 4 * n])
    sizes = array.array("I")
    sizes.frombytes(blob[4 * n :])
    return list(zip(offsets, sizes, strict=False))
