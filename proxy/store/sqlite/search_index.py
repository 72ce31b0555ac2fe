"""Full-text search in a sidecar file `<db>.fts.sqlite`, kept by the browser, never by the proxy.

The store is read-only for the browser and only the writer migrates it, so the index lives next to
it. Per exchange it holds only that turn's new text (the last user message and tool results, and
the answer), never the resent conversation: indexing whole bodies would make the index outgrow the
store. Rows are keyed by the exchange's SQLite rowid, which grows in write order, so catching up is
`rowid > last indexed` and a search can walk the index newest first and stop at one page.
The same pass records per-exchange facts the stats page needs and can't afford to derive from
bodies at request time (did the request carry any sampling parameter).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import zlib
from pathlib import Path

from tapfix.proxy.store.filters import search_terms
from tapfix.proxy.store.sqlite.bodies import DECODED_MAX_BODIES, BodyReader
from tapfix.proxy.store.sqlite.database import BUSY_TIMEOUT_MS, open_for_reading, read_only_uri
from tapfix.proxy.store.turns import lacks_sampling, messages_of, new_in_turn, parse_json, search_document

log = logging.getLogger("tapfix.browse")
SCHEMA = """
create table if not exists meta (key text primary key, value);
create virtual table if not exists doc using fts5(prompt, answer, tokenize = 'unicode61 remove_diacritics 2');
create table if not exists facts (
    rowid integer primary key,       -- exchanges.rowid in the capture db
    exchange_id text not null,
    lacks_sampling integer,          -- 1: JSON request without temperature/top_p/top_k/min_p
    messages integer,                -- messages in the request
    new_messages integer             -- messages after the last assistant message
);
"""


def sidecar_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".fts.sqlite")


def to_match(query: str) -> str:
    """User words (store/filters.py `search_terms`) → a safe FTS5 query: every word or "quoted phrase"
    must appear; `word*` is a prefix."""
    return " ".join(f'"{text}"' + ("*" if prefix else "") for text, prefix in search_terms(query))


class BodyCache(BodyReader):
    """The store's `BodyReader` (sessions are indexed in order, so a chain's last body is remembered),
    reading a damaged or purged-under-us body as missing: the index skips it, never fails on it."""

    def __init__(self, conn: sqlite3.Connection, size: int = DECODED_MAX_BODIES) -> None:
        super().__init__(conn, max_bodies=size)

    def get(self, body_id: int | None) -> bytes | None:
        try:
            return self.read(body_id)
        except (LookupError, ValueError):
            return None


class SearchIndex:
    """The sidecar index: `catch_up()` adds exchanges written since the last call; thread-safe."""

    def __init__(self, db_path: Path, index_path: Path | None = None) -> None:
        self.db_path = db_path
        self.path = index_path or sidecar_path(db_path)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not self.path.exists():  # it holds prompt text: as private as the store itself
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        conn = self._connect()
        conn.executescript(SCHEMA)
        conn.close()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        conn.execute(f"pragma busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("pragma journal_mode = wal")
        conn.execute("pragma synchronous = normal")
        return conn

    def attach_uri(self) -> str:
        return read_only_uri(self.path)

    def catch_up(self, limit: int | None = None, batch: int = 500, *, wait: bool = True) -> int:
        """Index up to `limit` new exchanges (all when None); returns how many were indexed.

        With `wait=False` it returns 0 at once when another thread is indexing (a search request
        should not queue behind the background backlog)."""
        if not self._lock.acquire(blocking=wait):
            return 0
        try:
            src = open_for_reading(self.db_path)
            dst = self._connect()
            try:
                return self._catch_up(src, dst, limit, batch)
            finally:
                src.close()
                dst.close()
        finally:
            self._lock.release()

    def _catch_up(self, src: sqlite3.Connection, dst: sqlite3.Connection, limit: int | None, batch: int) -> int:
        last = self._last(dst)
        if last and not self._same_store(src, dst, last):
            log.info("capture db changed under the search index: rebuilding %s", self.path)
            dst.executescript("delete from doc; delete from facts; delete from meta;")
            last = 0
        bodies = BodyCache(src)
        done = 0
        while limit is None or done < limit:
            size = batch if limit is None else min(batch, limit - done)
            rows = src.execute(
                "select rowid, id, request_body_id, content, reasoning, tool_calls from exchanges"
                " where rowid > ? order by rowid limit ?",
                (last, size),
            ).fetchall()
            if not rows:
                break
            docs, facts = [], []
            for rowid, exchange_id, body_id, content, reasoning, tool_calls in rows:
                try:
                    request = parse_json(bodies.get(body_id))
                except (sqlite3.Error, zlib.error):
                    request = None
                messages = messages_of(request)
                fresh = new_in_turn(messages)
                prompt, answer = search_document(messages, content, reasoning, tool_calls)
                docs.append((rowid, prompt, answer))
                no_sampling = lacks_sampling(request)
                facts.append(
                    (
                        rowid,
                        exchange_id,
                        None if no_sampling is None else int(no_sampling),
                        len(messages),
                        len(fresh),
                    )
                )
            last = rows[-1][0]
            dst.execute("begin immediate")
            dst.executemany("insert or replace into doc (rowid, prompt, answer) values (?, ?, ?)", docs)
            dst.executemany("insert or replace into facts values (?, ?, ?, ?, ?)", facts)
            dst.execute("insert or replace into meta values ('last_rowid', ?), ('last_id', ?)", (last, rows[-1][1]))
            dst.execute("commit")
            done += len(rows)
        return done

    @staticmethod
    def _last(dst: sqlite3.Connection) -> int:
        row = dst.execute("select value from meta where key = 'last_rowid'").fetchone()
        return int(row[0]) if row else 0

    @staticmethod
    def _same_store(src: sqlite3.Connection, dst: sqlite3.Connection, last: int) -> bool:
        row = dst.execute("select value from meta where key = 'last_id'").fetchone()
        here = src.execute("select id from exchanges where rowid = ?", (last,)).fetchone()
        if here is not None:
            return row is not None and here[0] == row[0]
        top = src.execute("select max(rowid) from exchanges").fetchone()[0]
        return top is not None and top >= last  # that row was rewritten later; the rest still holds

    def status(self) -> tuple[int, int]:
        """(last indexed rowid, newest rowid in the store)."""
        dst = self._connect()
        src = open_for_reading(self.db_path)
        try:
            top = src.execute("select max(rowid) from exchanges").fetchone()[0] or 0
            return self._last(dst), int(top)
        finally:
            src.close()
            dst.close()

    def start(self, interval: float = 2.0) -> None:
        """Keep up in the background, so the first search on a big store doesn't wait for the backlog."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(interval,), name="tapfix-browse-fts", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def _run(self, interval: float) -> None:
        while not self._stop.is_set():
            try:
                while not self._stop.is_set() and self.catch_up(limit=2000):
                    pass
            except (sqlite3.Error, OSError) as e:  # a locked or vanished db: try again later
                log.warning("search index: %s", e)
            self._stop.wait(interval)


def purge_sidecar(db: Path) -> int:
    """After a purge: the index holds prompt text too, so the rows of purged exchanges go (their count)."""
    sidecar = sidecar_path(db)
    if not sidecar.exists():
        return 0
    conn = sqlite3.connect(str(sidecar), isolation_level=None)
    try:
        conn.execute("attach database ? as cap", (str(db),))
        before = conn.total_changes
        for table in ("doc", "facts"):
            if conn.execute("select 1 from sqlite_master where name = ?", (table,)).fetchone():
                conn.execute(f"delete from {table} where rowid not in (select rowid from cap.exchanges)")
        return conn.total_changes - before
    except sqlite3.Error:
        return 0  # an index the browser can rebuild; never fail the purge over it
    finally:
        conn.close()
