"""The capture store: one writer thread fed by a queue, readers on their own read-only connections.

The event loop never waits on disk: addons hand finished `Exchange`s to `CaptureWriter.submit`,
which only enqueues. The writer thread assembles, redacts and stores them, committing every batch
(at least once a second), so a crash or `kill -9` loses at most the last second.
"""

from __future__ import annotations

import array
import datetime
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
from tapfix.proxy.assemble import Assembled, assemble, assemble_sse
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.response.flags import response_flags
from tapfix.proxy.store.backend import SqliteBackend, WriteBackend
from tapfix.proxy.store.bodies import read_body
from tapfix.proxy.store.choices import write_choices
from tapfix.proxy.store.database import BUSY_TIMEOUT_MS, StoreError, open_for_reading, open_for_writing
from tapfix.proxy.store.engine_error import upstream_error, upstream_view
from tapfix.proxy.store.kept import as_text, kept_row, trace_columns
from tapfix.proxy.store.redact import redact_headers, redact_url
from tapfix.proxy.store.retention import Retention
from tapfix.proxy.store.sessions import SessionLink, SessionTracker
from tapfix.proxy.store.write_errors import describe
from tapfix.proxy.surfaces import is_inference

log = logging.getLogger("tapfix.store")
BATCH_WINDOW_S = 0.05  # well inside the 1 s durability window
LOCK_RETRIES = 3  # a locked database (another process in a long write) is retried before counting a failure


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat(timespec="milliseconds")


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


@dataclass(slots=True)
class Written:
    """What the writer's observers get for each exchange, once its transaction committed (or once it is
    lost): telemetry (issue 20) reads the stored row and the assembled answer instead of assembling again.

    `outcome`: "stored" (row and assembled answer), "kept" (row of a `capture_failed` exchange, no
    assembly), "lost" (nothing stored: no row)."""

    exchange: Exchange
    row: dict[str, Any] | None
    assembled: Assembled | None
    outcome: Literal["stored", "kept", "lost"]


Observer = Callable[[Written], None]


@dataclass
class WriterStats:
    queued: int = 0
    written: int = 0
    failures: int = 0
    lock_retries: int = 0
    last_error: str | None = None
    last_commit: float = field(default_factory=time.time)
    # Exchanges stored only as metadata and raw bytes (flag `capture_failed`), by the error's type.
    capture_failed: dict[str, int] = field(default_factory=dict)
    # Exchanges not stored at all (`failures`), by cause: disk_full, locked, read_only, io, or the error's type.
    lost: dict[str, int] = field(default_factory=dict)

    def as_dict(self, depth: int) -> dict[str, Any]:
        return {
            "queue_depth": depth,
            "written": self.written,
            "failures": self.failures,
            "failures_by_cause": dict(self.lost),
            "capture_failed": dict(self.capture_failed),
            "lock_retries": self.lock_retries,
            "last_error": self.last_error,
        }


class CaptureWriter:
    """Owns the single write connection; `submit` is safe to call from the event loop.

    `store`: a SQLite file's path, or any `WriteBackend` (store/backend.py; PostgreSQL's is
    store/pg/writer.py): everything below is the same on every backend."""

    def __init__(
        self, store: Path | str | WriteBackend, *, batch: int = 256, retention: Retention | None = None
    ) -> None:
        self.backend: WriteBackend = SqliteBackend(store) if isinstance(store, Path | str) else store
        if isinstance(self.backend, SqliteBackend):
            self.path = self.backend.path
            self.conn = self.backend.conn
        self.retention = retention
        self.bodies = self.backend.bodies
        self.sessions = SessionTracker(self.backend.session_sql)
        self.stats = WriterStats()
        self._queue: queue.SimpleQueue[Exchange | None] = queue.SimpleQueue()
        self._batch = batch
        # Called on this thread after each commit, one `Written` per exchange: each must only hand it on
        # (enqueue), never block. Add them before traffic starts.
        self.observers: list[Observer] = []
        self._pending: list[Written] = []  # this transaction's, told to the observers after its commit
        self._thread = threading.Thread(target=self._run, name="tapfix-writer", daemon=True)
        self._thread.start()

    def submit(self, exchange: Exchange) -> None:
        self.stats.queued += 1
        self._queue.put(exchange)

    def health(self) -> dict[str, Any]:
        health = self.stats.as_dict(self._queue.qsize())
        if self.retention is not None:
            health["retention"] = self.retention.health()
        return health

    def close(self, timeout: float = 10.0) -> None:
        """Drain what is queued, then close the store (SQLite checkpoints its WAL)."""
        self._queue.put(None)
        self._thread.join(timeout)
        try:
            self.backend.close()
        except Exception as e:  # noqa: BLE001  # pragma: no cover - closing a broken db
            log.warning("closing capture db: %s", e)

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self.retention.every_s if self.retention else None)
            except queue.Empty:  # idle: a good moment for retention
                self._retain()
                continue
            if item is not None and time.time() - self.stats.last_commit < BATCH_WINDOW_S:
                # Under load, gather what arrives in a short window into one transaction: one commit
                # per exchange costs more CPU than the whole hot path, and holds the GIL in bursts.
                time.sleep(BATCH_WINDOW_S)
            batch = [item]
            while len(batch) < self._batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = None in batch
            self._write_batch([e for e in batch if e is not None])
            self._retain()
            if stop:
                return

    def _retain(self) -> None:
        """Between batches, on this thread: traffic only enqueues, so it never waits on a purge."""
        if self.retention is not None:
            self.backend.retain(self.retention)

    def _write_batch(self, batch: list[Exchange]) -> None:
        """One transaction for the batch; when it fails, one per exchange, so a failure stays with its
        exchange: the others are stored as usual, and the one that still fails is kept in part."""
        if not batch:
            return
        batch = [as_text(ex) for ex in batch]
        error = self._transaction(batch, self._write_one)
        if error is None:
            return
        if self.backend.environmental(error):  # not about any exchange's content: one at a time would fail the same way
            self._lost(batch, error)
            return
        if len(batch) > 1:
            log.warning("capture batch of %d failed (%s); storing them one at a time", len(batch), describe(error))
        for ex in batch:
            self._write_alone(ex, self._transaction([ex], self._write_one) if len(batch) > 1 else error)

    def _write_alone(self, ex: Exchange, failed: Exception | None) -> None:
        """After `ex` failed (`failed`) in a transaction of its own: keep what can be kept."""
        if failed is None:
            return
        if (
            self.backend.environmental(failed)
            or self._transaction([ex], lambda kept: self._write_kept(kept, failed)) is not None
        ):
            self._lost([ex], failed)
            return
        cause = type(failed).__name__
        self.stats.capture_failed[cause] = self.stats.capture_failed.get(cause, 0) + 1
        self.stats.last_error = describe(failed)
        log.error("capture %s kept without its assembled answer (capture_failed): %s", ex.id, describe(failed))

    def _transaction(self, exchanges: list[Exchange], write: Callable[[Exchange], None]) -> Exception | None:
        """Write `exchanges` in one transaction, retrying a locked database; the error that rolled it back."""
        for attempt in range(LOCK_RETRIES + 1):
            try:
                self.backend.begin()
                for exchange in exchanges:
                    write(exchange)
                self.backend.commit()
                self.stats.written += len(exchanges)
                self.stats.last_commit = time.time()
                self._tell(self._pending)
                return None
            except Exception as e:  # noqa: BLE001 - a capture failure must never break traffic
                self._pending = []
                self.backend.rollback()
                self.bodies.forget()  # its remembered bases may have been rolled back with the batch
                if self.backend.locked(e) and attempt < LOCK_RETRIES:
                    self.stats.lock_retries += 1
                    log.warning("capture db busy (%s); retrying %d exchange(s)", describe(e), len(exchanges))
                    continue
                return e
        raise AssertionError("unreachable")  # pragma: no cover - the last attempt returns

    def _lost(self, exchanges: list[Exchange], error: Exception) -> None:
        self.stats.failures += len(exchanges)
        cause = self.backend.cause_of(error)
        self.stats.lost[cause] = self.stats.lost.get(cause, 0) + len(exchanges)
        self.stats.last_error = describe(error)
        log.error("capture write failed for %d exchange(s): %s", len(exchanges), error)
        self._tell([Written(ex, None, None, "lost") for ex in exchanges])

    def _tell(self, written: list[Written]) -> None:
        self._pending = []
        for observer in self.observers:
            for item in written:
                try:
                    observer(item)
                except Exception:  # noqa: BLE001 - an observer's bug must never stop the store
                    log.exception("capture observer failed for %s", item.exchange.id)

    def _put_bodies(
        self, ex: Exchange, upstream: bytes, client: bytes, family: str | None, *, always_response: bool = False
    ) -> dict[str, int | None]:
        """The four bodies' ids (None where a body is the same as the one before it, or not kept).
        `family` deltas the request against its session's last one; a kept-in-part capture has none."""
        bodies: dict[str, int | None] = dict.fromkeys(("req", "fwd", "resp", "client"))
        if not ex.store_bodies:
            return bodies
        put, when = self.bodies.put, ex.started_at
        bodies["req"] = put(ex.request, family, when=when)
        if ex.forwarded is not None and ex.forwarded != ex.request:
            bodies["fwd"] = put(ex.forwarded, family, when=when)
        if always_response or ex.status is not None or upstream:
            bodies["resp"] = put(upstream, level=1, when=when)
        if client is not upstream and client != upstream:
            bodies["client"] = put(client, level=1, when=when)
        return bodies

    def _write_kept(self, ex: Exchange, error: Exception) -> None:
        """What is left of an exchange the writer could not store whole: its metadata, its raw bytes as
        bodies (no delta, no assembly, no session) and the error, flagged, so it is still listed."""
        upstream = ex.response_body()
        client = ex.client_response_body(upstream)
        bodies = self._put_bodies(ex, upstream, client, None, always_response=True)
        row = kept_row(ex, bodies, upstream, f"capture failed, stored without its assembled answer: {describe(error)}")
        row |= _attempt_columns(ex)
        self.backend.put_exchange(row, ex)
        self._pending.append(Written(ex, row, None, "kept"))

    def _write_one(self, ex: Exchange) -> None:
        upstream = ex.response_body()
        client = ex.client_response_body(upstream)
        assembled = _assemble(ex, client)
        upstream_answer = upstream_view(ex, assembled, client, upstream)  # one assembly for timing and error
        first_token_ms = None
        if ex.response is None and ex.chunk_times and upstream_answer is not None:
            if upstream_answer.first_token_chunk is not None:
                first_token_ms = ex.chunk_times[upstream_answer.first_token_chunk] * 1000
        # An attempt's reply is not what the client received: it is no turn of a session (a later turn
        # continues its client-facing capture), so it gets no session and nothing to be continued by.
        if ex.attempt_of is not None:
            link = SessionLink(None)
        else:
            link = self.sessions.assign(self.backend, ex, assembled, ex.readable(client))
        session_id = link.session_id
        flags = set(ex.flags)
        if is_inference(ex.path):
            flags |= response_flags(assembled, ex.status, ex.stream, tools=ex.tools, request_body=ex.readable_request())
        error = upstream_error(ex, upstream_answer, upstream)  # the engine's own error object, as JSON
        if error is not None:
            flags.add("upstream_error")
        bodies = self._put_bodies(ex, upstream, client, session_id)
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
            "stream": int(ex.stream),
            "status": ex.status,
            "error": error or ex.error,
            "session_id": session_id,
            "chain_hash": link.chain_hash,
            "response_id": link.response_id,
            "source_id": ex.source_id,
            **_attempt_columns(ex),
            **trace_columns(ex),
            "tags": _json(sorted(ex.tags)),
            "flags": _json(sorted(flags)),
            "changes_count": len(ex.changes),
            "request_body_id": bodies["req"],
            "forwarded_body_id": bodies["fwd"],
            "response_body_id": bodies["resp"],
            "client_response_body_id": bodies["client"],
            "request_size": len(ex.request),
            "response_size": len(upstream),
            "request_headers": _json(redact_headers(ex.request_headers)),
            "forwarded_headers": _json(redact_headers(ex.forwarded_headers))
            if ex.forwarded_headers is not None
            else None,
            "response_headers": _json(redact_headers(ex.response_headers)),
            "content": assembled.content if ex.store_bodies else None,
            "reasoning": assembled.reasoning if ex.store_bodies else None,
            "tool_calls": _json(assembled.tool_calls) if ex.store_bodies else None,
            "finish_reason": assembled.finish_reason,
            "usage": _json(assembled.usage) if assembled.usage is not None else None,
            "prompt_tokens": usage.get("prompt_tokens", usage.get("input_tokens")),
            "completion_tokens": usage.get("completion_tokens", usage.get("output_tokens")),
            "chunk_count": len(ex.chunk_times),
            "chunk_timing": _pack_timing(ex.chunk_times, ex.response_chunks),
        }
        self.backend.put_exchange(row, ex)
        day = self.backend.day_columns(ex)  # {} on SQLite; the partition's day on PostgreSQL
        columns = "exchange_id, seq, stage, kind, path, before, after, reason" + "".join(f", {k}" for k in day)
        self.backend.executemany(
            f"insert into changes ({columns}) values (?{', ?' * (7 + len(day))})",
            [
                (ex.id, i, c.stage, c.kind, c.path, _json(c.before), _json(c.after), c.reason, *day.values())
                for i, c in enumerate(ex.changes)
            ],
        )
        write_choices(self.backend, ex.id, assembled, ex.store_bodies, day)
        self.sessions.record(self.backend, link, ex)  # no session, nothing recorded
        self._pending.append(Written(ex, row, assembled, "stored"))


def _attempt_columns(ex: Exchange) -> dict[str, Any]:
    """Which attempt the exchange is: the client-facing one (1, no parent), or a regeneration 2...N+1."""
    return {"attempt_of": ex.attempt_of, "attempt": ex.attempt if ex.attempt_of is not None else 1}


def _assemble(ex: Exchange, body: bytes) -> Assembled:
    path = ex.path.split("?", 1)[0]
    streamed = ex.response is None and ex.response_chunks and "event-stream" in ex.content_type
    if ex.client_response_chunks is None and streamed:
        return assemble_sse(ex.readable_chunks(), path)  # decoded when it came compressed
    return assemble(ex.readable(body), ex.content_type, path)


def _ms(when: float | None, mark: float) -> float | None:
    return None if when is None else round((when - mark) * 1000, 3)


def _pack_timing(times: list[float], chunks: list[bytes]) -> bytes | None:
    if not times:
        return None
    offsets = array.array("f", (t * 1000 for t in times))
    sizes = array.array("I", (len(c) for c in chunks[: len(times)]))
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


__all__ = [
    "BUSY_TIMEOUT_MS",
    "CaptureWriter",
    "StoreError",
    "open_for_reading",
    "open_for_writing",
    "read_body",
    "unpack_timing",
]
