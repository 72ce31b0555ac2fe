"""The capture store: one writer thread fed by a queue, readers on their own read-only connections.

The event loop never waits on disk: addons hand finished `Exchange`s to `CaptureWriter.submit`,
which only enqueues. The writer thread assembles, redacts and stores them, committing every batch
(at least once a second), so a crash or `kill -9` loses at most the last second.

A database that is out of reach (a PostgreSQL server down or restarting; `WriteBackend.outage`)
breaks no traffic and loses nothing the hold can keep: the batch is held in memory with everything
submitted after it, retried with a backoff, and written in order when the database returns
(store/held.py: the bound, and why no spill file).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson
from tapfix.proxy.assemble import Assembled
from tapfix.proxy.assemble.flags import response_flags
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.jsonbody import STORE_PARSE_KEY
from tapfix.proxy.store.choices import write_choices
from tapfix.proxy.store.engine_error import upstream_error, upstream_view
from tapfix.proxy.store.exchange_row import assemble_answer, attempt_columns, exchange_row
from tapfix.proxy.store.held import MAX_HELD, MAX_HELD_BYTES, Held
from tapfix.proxy.store.kept import as_text, kept_row
from tapfix.proxy.store.prefix_breaks import STORED, PrefixTracker
from tapfix.proxy.store.retention import Retention
from tapfix.proxy.store.sessions import SessionLink, SessionTracker
from tapfix.proxy.surfaces import is_inference
from tapfix.proxy.window.truncation import FLAG as TRUNCATED
from tapfix.proxy.window.truncation import prompt_truncation

if TYPE_CHECKING:
    from tapfix.proxy.store.parts import WriteBackend

log = logging.getLogger("tapfix.store")
BATCH_WINDOW_S = 0.05  # well inside the 1 s durability window
LOCK_RETRIES = 3  # a locked database (another process in a long write) is retried before counting a failure


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def describe(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"


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
    # Exchanges not stored at all (`failures`), by cause: disk_full, locked, read_only, io, unavailable (the
    # database was still out of reach at shutdown), queue_full (dropped from the hold), or the error's type.
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


def _kept_bodies(ex: Exchange, upstream: bytes, client: bytes, *, always_response: bool = False) -> dict[str, bytes]:
    """The bodies an exchange stores, by kind, in storing order: none without `store_bodies`; the forwarded
    request and the client's answer only where they differ from the request and the upstream's answer; the
    upstream's answer when one came (`always_response`: a kept-in-part capture's, even empty)."""
    if not ex.store_bodies:
        return {}
    kept = {"req": ex.request}
    if ex.forwarded is not None and ex.forwarded != ex.request:
        kept["fwd"] = ex.forwarded
    if always_response or ex.status is not None or upstream:
        kept["resp"] = upstream
    if client is not upstream and client != upstream:
        kept["client"] = client
    return kept


class CaptureWriter:
    """Owns the single write connection; `submit` is safe to call from the event loop.

    `store`: a `WriteBackend` (store/backend.py), or a SQLite file's path (scripts and tests: its
    backend, store/sqlite/writer.py). Everything below is the same on every backend."""

    def __init__(
        self,
        store: Path | str | WriteBackend,
        *,
        batch: int = 256,
        retention: Retention | None = None,
        max_held: int = MAX_HELD,
        max_held_bytes: int = MAX_HELD_BYTES,
    ) -> None:
        if isinstance(store, Path | str):
            from tapfix.proxy.store.sqlite.writer import SqliteBackend

            store = SqliteBackend(store)
        self.backend: WriteBackend = store
        self.retention = retention
        self.bodies = self.backend.bodies
        self.sessions = SessionTracker(self.backend.session_sql)
        self.prefixes = PrefixTracker()
        # Since start, of what was committed (health): request-stage changes by kind, prefix breaks by cause.
        self.request_changes: dict[str, int] = {}
        self.prefix_breaks: dict[str, int] = {}
        self.stats = WriterStats()
        self._queue: queue.SimpleQueue[Exchange | None] = queue.SimpleQueue()
        self._batch = batch
        # Called on this thread after each commit, one `Written` per exchange: each must only hand it on
        # (enqueue), never block. Add them before traffic starts.
        self.observers: list[Observer] = [self._count]
        self._pending: list[Written] = []  # this transaction's, told to the observers after its commit
        self._joined: dict[str, tuple[bytes, bytes]] = {}  # this transaction's answers, joined (`_prefetch`)
        self.held = Held(max_held, max_held_bytes, starting=self.backend.unreachable)
        # An outage that hit a commit leaves its fate unknown: these may be stored; checked before a retry.
        self._unsure: dict[str, Written] = {}
        self._stopping = False
        self._give_up_at = float("inf")  # monotonic: when a close stops waiting for the database
        self._thread = threading.Thread(target=self._run, name="tapfix-writer", daemon=True)
        self._thread.start()

    def submit(self, exchange: Exchange) -> None:
        """Never blocks, never raises: while the database is out of reach, the writer holds what comes."""
        self.stats.queued += 1
        self._queue.put(exchange)

    def health(self) -> dict[str, Any]:
        health = self.stats.as_dict(self._queue.qsize())
        health["store"] = {"location": self.backend.location, "backend": self.backend.name, **self.held.health()}
        if self.retention is not None:
            health["retention"] = self.retention.health()
        health["prefix_breaks"] = dict(self.prefix_breaks)  # by cause (store/prefix_breaks.py)
        health["request_changes"] = dict(self.request_changes)  # by kind: strip_billing_line, ...
        return health

    def close(self, timeout: float = 10.0) -> None:
        """Drain what is queued, then close the store (SQLite checkpoints its WAL). A database still out
        of reach gets most of `timeout`; what is held then is counted as lost (`unavailable`)."""
        self._give_up_at = time.monotonic() + max(0.0, timeout - 2.0)
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():  # the connection is the thread's: closing it under a batch garbles it
            log.error(
                "capture writer still writing after %.0f s; %d queued exchange(s) not written",
                timeout,
                self._queue.qsize(),
            )
            return
        try:
            self.backend.close()
        except Exception as e:  # noqa: BLE001  # pragma: no cover - closing a broken db
            log.warning("closing capture db: %s", e)

    def _run(self) -> None:
        while True:
            if len(self.held):
                if self._retry_held():
                    return
                continue
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
            # Let go of the batch before waiting for the next: kept, these locals held the last exchanges
            # (their chunks, their stages) for as long as traffic paused
            del item, batch
            if stop:
                self._stopping = True
            if not len(self.held):
                self._retain()
                if stop:
                    return

    def _stored_requests(self, session_id: str, own_id: str, limit: int) -> list[tuple[Any, ...]]:
        """A session's latest requests in the store (`prefix_breaks.STORED`), in this transaction."""
        return list(self.backend.execute(STORED, (session_id, own_id, limit)).fetchall())

    def _count(self, written: Written) -> None:
        if written.outcome != "stored":
            return
        ex = written.exchange
        for change in ex.changes:
            if change.stage == "request":
                self.request_changes[change.kind] = self.request_changes.get(change.kind, 0) + 1
        cause = ex.prefix_break.get("cause") if ex.prefix_break else None
        if isinstance(cause, str):
            self.prefix_breaks[cause] = self.prefix_breaks.get(cause, 0) + 1

    def _retry_held(self) -> bool:
        """One attempt at the oldest held batch, after the backoff's wait (spent moving the submit queue
        into the hold, so its bound applies to everything unwritten). True: stop the thread."""
        wait_until = min(time.monotonic() + self.held.delay, self._give_up_at)
        while True:
            wait = max(0.0, wait_until - time.monotonic())
            if self._stopping:  # nothing more comes: only the wait
                time.sleep(wait)
                break
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                break
            if item is None:
                self._stopping = True
                wait_until = min(wait_until, self._give_up_at)
            else:
                item.extra.pop(STORE_PARSE_KEY, None)  # held for long perhaps: the body is parsed again when written
                self._hold([as_text(item)])
        if self._stopping and time.monotonic() >= self._give_up_at:
            left = self.held.take(len(self.held))
            log.error(
                "capture db %s still out of reach at shutdown: %d held exchange(s) lost",
                self.backend.location,
                len(left),
            )
            self._lost(left, cause="unavailable", why=self.held.reason)
            return True
        self._write_texts(self.held.take(self._batch))
        return self._stopping and not len(self.held)

    def _hold(self, exchanges: list[Exchange]) -> None:
        dropped = self.held.add(exchanges)
        if dropped:
            self._lost(dropped, cause="queue_full", why=self.held.why_full())

    def _retain(self) -> None:
        """Between batches, on this thread: traffic only enqueues, so it never waits on a purge."""
        if self.retention is not None and self.held.state == "ok":  # not while the database is out of reach
            self.backend.retain(self.retention)

    def _write_batch(self, batch: list[Exchange]) -> None:
        """One transaction for the batch; when it fails, one per exchange, so a failure stays with its
        exchange: the others are stored as usual, and the one that still fails is kept in part."""
        if batch:
            self._write_texts([as_text(ex) for ex in batch])

    def _write_texts(self, batch: list[Exchange]) -> None:
        """`_write_batch` of exchanges already `as_text` (held ones are)."""
        if not batch:
            return
        error = self._transaction(batch, self._write_one)
        if error is None:
            return
        if self.backend.outage(error):
            self._held_back(batch, error)
            return
        if self.backend.environmental(error):  # not about any exchange's content: one at a time would fail the same way
            self._lost(batch, error)
            return
        if len(batch) > 1:
            log.warning("capture batch of %d failed (%s); storing them one at a time", len(batch), describe(error))
        for i, ex in enumerate(batch):
            failed = self._transaction([ex], self._write_one) if len(batch) > 1 else error
            if failed is not None and self.backend.outage(failed):
                self._held_back(batch[i:], failed)
                return
            self._write_alone(ex, failed)

    def _held_back(self, batch: list[Exchange], error: Exception) -> None:
        """The database is out of reach: `batch` goes back to the front of the hold (it was taken from
        there, or the hold was empty), to be tried again after the backoff."""
        if self.held.state == "ok":
            log.warning("capture db %s out of reach (%s); holding exchanges", self.backend.location, describe(error))
        self.held.failed(describe(error))
        self.held.put_back(batch)
        dropped = self.held.add([])
        if dropped:
            self._lost(dropped, cause="queue_full", why=self.held.why_full())

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
                stored = self._already_stored(exchanges)
                self._prefetch([ex for ex in exchanges if ex.id not in stored])
                for exchange in exchanges:
                    if exchange.id in stored:  # committed before the connection broke: told now, not written twice
                        self._pending.append(stored[exchange.id])
                    else:
                        write(exchange)
                self.backend.commit()
                self._end_batch()
                self._unsure = {}
                self.stats.written += len(exchanges)
                self.stats.last_commit = time.time()
                if self.held.state != "ok":
                    log.warning(
                        "capture db %s reachable again; %d held exchange(s) to write",
                        self.backend.location,
                        len(self.held),
                    )
                    self.held.reached()
                self._tell(self._pending)
                return None
            except Exception as e:  # noqa: BLE001 - a capture failure must never break traffic
                written, self._pending = self._pending, []
                self._end_batch()
                self.backend.rollback()
                self.bodies.forget()  # its remembered bases may have been rolled back with the batch
                if self.backend.outage(e):
                    self._unsure |= {w.exchange.id: w for w in written}
                    return e
                if self.backend.locked(e) and attempt < LOCK_RETRIES:
                    self.stats.lock_retries += 1
                    log.warning("capture db busy (%s); retrying %d exchange(s)", describe(e), len(exchanges))
                    continue
                return e
        raise AssertionError("unreachable")  # pragma: no cover - the last attempt returns

    def _prefetch(self, exchanges: list[Exchange]) -> None:
        """The batch's bodies, joined once (`_answer_bodies`), looked up in the store together (`Bodies.prefetch`)."""
        self._joined = {}
        bodies: list[bytes] = []
        for ex in exchanges:
            upstream = ex.response_body()
            client = ex.client_response_body(upstream)
            self._joined[ex.id] = (upstream, client)
            bodies += _kept_bodies(ex, upstream, client).values()
        self.bodies.prefetch(bodies)

    def _answer_bodies(self, ex: Exchange) -> tuple[bytes, bytes]:
        """What the upstream answered and what the client received, whole: joined by `_prefetch` for this batch."""
        joined = self._joined.get(ex.id)
        if joined is not None:
            return joined
        upstream = ex.response_body()
        return upstream, ex.client_response_body(upstream)

    def _end_batch(self) -> None:
        self._joined = {}
        self.bodies.end_batch()
        self.sessions.end_batch()

    def _already_stored(self, exchanges: list[Exchange]) -> dict[str, Written]:
        """Of `exchanges`, those an earlier commit may have stored after all (`_unsure`) and did."""
        maybe = [ex.id for ex in exchanges if ex.id in self._unsure]
        if not maybe:
            return {}
        marks = ", ".join("?" * len(maybe))
        found = self.backend.execute(f"select id from exchanges where id in ({marks})", maybe).fetchall()
        return {str(r[0]): self._unsure[str(r[0])] for r in found}

    def _lost(
        self, exchanges: list[Exchange], error: Exception | None = None, *, cause: str = "", why: str | None = None
    ) -> None:
        if not exchanges:
            return
        self.stats.failures += len(exchanges)
        if not cause:
            cause = self.backend.cause_of(error) if error is not None else "unknown"
        self.stats.lost[cause] = self.stats.lost.get(cause, 0) + len(exchanges)
        self.stats.last_error = describe(error) if error is not None else why
        log.error("capture write failed for %d exchange(s): %s", len(exchanges), self.stats.last_error)
        for ex in exchanges:
            self._unsure.pop(ex.id, None)
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
        put, when = self.bodies.put, ex.started_at
        for kind, data in _kept_bodies(ex, upstream, client, always_response=always_response).items():
            if kind in ("req", "fwd"):
                bodies[kind] = put(data, family, when=when)
            else:
                bodies[kind] = put(data, level=1, when=when)
        return bodies

    def _write_kept(self, ex: Exchange, error: Exception) -> None:
        """What is left of an exchange the writer could not store whole: its metadata, its raw bytes as
        bodies (no delta, no assembly, no session) and the error, flagged, so it is still listed."""
        upstream, client = self._answer_bodies(ex)
        bodies = self._put_bodies(ex, upstream, client, None, always_response=True)
        row = kept_row(ex, bodies, upstream, f"capture failed, stored without its assembled answer: {describe(error)}")
        row |= attempt_columns(ex)
        self.backend.put_exchange(row, ex)
        self._pending.append(Written(ex, row, None, "kept"))

    def _write_one(self, ex: Exchange) -> None:
        upstream, client = self._answer_bodies(ex)
        assembled = assemble_answer(ex, client)
        upstream_answer = upstream_view(ex, assembled, client, upstream)  # one assembly for timing and error
        first_token_ms = None
        if ex.response is None and ex.chunk_times and upstream_answer is not None:
            if upstream_answer.first_token_chunk is not None:
                first_token_ms = ex.chunk_times[upstream_answer.first_token_chunk] * 1000
        # An attempt's reply is not what the client received: it is no turn of a session (a later turn
        # continues its client-facing capture), so it gets no session and nothing to be continued by.
        # The request side's parse of the body it forwarded (issue 34): read, not parsed again; its memory goes here.
        noted = ex.extra.pop(STORE_PARSE_KEY, None)
        if ex.attempt_of is not None:
            link = SessionLink(None)
        else:
            link = self.sessions.assign(self.backend, ex, assembled, ex.readable(client), noted)
        session_id = link.session_id
        own = session_id == f"s-{ex.id}"
        ex.prefix_break = self.prefixes.observe(
            ex, session_id, own_session=own, stored=self._stored_requests, noted=noted
        )
        if assembled.usage is None and upstream_answer is not None:
            assembled.usage = upstream_answer.usage  # the engine's counts, for a client that didn't ask for them
        flags = set(ex.flags)
        if is_inference(ex.path):
            flags |= response_flags(assembled, ex.status, ex.stream, tools=ex.tools, request_body=ex.readable_request())
            if (cut := prompt_truncation(ex, assembled.usage)) is not None:
                flags.add(TRUNCATED)
                log.warning("capture %s: %s", ex.id, cut)
        error = upstream_error(ex, upstream_answer, upstream)  # the engine's own error object, as JSON
        if error is not None:
            flags.add("upstream_error")
        bodies = self._put_bodies(ex, upstream, client, session_id)
        row = exchange_row(
            ex, assembled, link, bodies, upstream=upstream, flags=flags, error=error, first_token_ms=first_token_ms
        )
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
