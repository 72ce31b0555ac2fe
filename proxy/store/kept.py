"""An exchange as the store can hold it: its head as text, and what is kept of it when the writer
can't store it whole (see `CaptureWriter._write_batch`)."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import orjson
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.http_headers import head_text
from tapfix.proxy.store.redact import redact_headers, redact_url


def kept_row(ex: Exchange, bodies: dict[str, int | None], upstream: bytes, reason: str) -> dict[str, Any]:
    """The exchanges row of a `capture_failed` exchange: metadata, body ids, the error; no assembly."""
    return {
        "id": ex.id,
        "ts": ex.started_at,
        "started_at": _iso(ex.started_at),
        "upstream_first_byte_ms": _ms(ex.response_started_at, ex.mark),
        "duration_ms": _ms(ex.ended_at, ex.mark),
        "client_addr": _safe(ex.client_addr),
        "user_agent": _safe(ex.user_agent),
        "method": _safe(ex.method),
        "path": _safe(redact_url(ex.path)),
        "url": _safe(redact_url(ex.url)),
        "upstream_url": _safe(redact_url(ex.upstream_url)),
        "model": _maybe(ex.model),
        "served_model": _maybe(ex.served_model),
        "stream": int(ex.stream),
        "status": ex.status,
        "error": _safe(f"{ex.error}; {reason}" if ex.error else reason),
        "source_id": _maybe(ex.source_id),
        "tags": _json(sorted(_safe(t) for t in ex.tags)),
        "flags": _json(sorted({_safe(f) for f in ex.flags} | {"capture_failed"})),
        **body_columns(ex, bodies, upstream),
        "request_headers": _json([(_safe(k), _safe(v)) for k, v in redact_headers(ex.request_headers)]),
        "response_headers": _json([(_safe(k), _safe(v)) for k, v in redact_headers(ex.response_headers)]),
        "chunk_count": len(ex.chunk_times),
        **trace_columns(ex),
        **route_columns(ex),
    }


def body_columns(ex: Exchange, bodies: dict[str, int | None], upstream: bytes) -> dict[str, int | None]:
    """The four bodies' ids and the two sizes, the same on a whole row and a kept-in-part one."""
    return {
        "request_body_id": bodies["req"],
        "forwarded_body_id": bodies["fwd"],
        "response_body_id": bodies["resp"],
        "client_response_body_id": bodies["client"],
        "request_size": len(ex.request),
        "response_size": len(upstream),
    }


def trace_columns(ex: Exchange) -> dict[str, str | None]:
    """The exchange's place in a trace (migration m005), for every row the writer stores."""
    return {"trace_id": ex.trace_id, "span_id": ex.span_id, "parent_span_id": ex.parent_span_id}


def _safe(value: str) -> str:
    """Text SQLite and JSON take whatever it holds (a lone surrogate becomes `\\udcNN`)."""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


def _maybe(value: str | None) -> str | None:
    return None if value is None else _safe(value)


def as_text(ex: Exchange) -> Exchange:
    """A copy whose head (method, path, URLs, header names and values) is storable text: mitmproxy's
    surrogate-escaped bytes as `\\xNN`, a backslash as `\\\\` (`http_headers.head_text`). Copied, not
    changed in place: the event loop may still hold the exchange."""
    return dataclasses.replace(
        ex,
        client_addr=head_text(ex.client_addr),
        method=head_text(ex.method),
        path=head_text(ex.path),
        url=head_text(ex.url),
        upstream_url=head_text(ex.upstream_url),
        user_agent=head_text(ex.user_agent),
        request_headers=_text_fields(ex.request_headers),
        forwarded_headers=None if ex.forwarded_headers is None else _text_fields(ex.forwarded_headers),
        response_headers=_text_fields(ex.response_headers),
        error=_valid_text(ex.error),
        session_hint=_valid_text(ex.session_hint),
    )


def _text_fields(fields: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(head_text(k), head_text(v)) for k, v in fields]


def _valid_text(value: str | None) -> str | None:
    """Text that is already valid stays as is (an error may quote JSON, backslashes included)."""
    if value is None or value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return head_text(value)
    return value


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat(timespec="milliseconds")


def _ms(when: float | None, mark: float) -> float | None:
    return None if when is None else round((when - mark) * 1000, 3)


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def route_columns(ex: Exchange, cache_n: int | None = None) -> dict[str, str | None]:
    """The route decision (issue 38, request/routes.py `Decision.record`) as JSON text (migration m008), with the
    llama.cpp slot the request was pinned to (request/slots.py) as its `slot`, and in that the prompt tokens
    the engine's answer says the slot's cache served (`cache_n`). A model without routes whose upstream pins
    slots has a decision of its slot alone."""
    decision = ex.extra.get("route_decision")
    slot = ex.extra.get("slot")
    if isinstance(slot, dict):
        decision = {**(decision if isinstance(decision, dict) else {}), "slot": {**slot, "cache_n": cache_n}}
    return {"route_decision": _json(decision) if decision is not None else None}
