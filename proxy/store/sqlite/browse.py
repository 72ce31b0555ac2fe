"""The browser's queries on a SQLite store (read-only) and its search sidecar: SQLite's `BrowseQueries`
(store/parts.py), over the logic every backend shares (store/queries.py `BrowseBase`).

Lists are newest first by `exchanges.rowid` (write order) with keyset pagination: every single-column
index of the schema ends in the rowid, so `where model = ? order by rowid desc limit 51` walks one
index in order and stops after a page, however many captures there are. Cursors in URLs are capture
ids (`?before=ID`), turned into rowids through the primary key; a session page's cursor is a rowid.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tapfix.proxy.store.filters import ERRORS, Filters
from tapfix.proxy.store.pages import PAGE, Page, decode_flags
from tapfix.proxy.store.queries import BrowseBase
from tapfix.proxy.store.sqlite.database import open_for_reading
from tapfix.proxy.store.sqlite.filters import where
from tapfix.proxy.store.sqlite.reader import SqliteReader, attempt_columns, has_attempts
from tapfix.proxy.store.sqlite.search_index import BodyCache, SearchIndex, to_match

if TYPE_CHECKING:
    from tapfix.proxy.store.pages import Stats
    from tapfix.proxy.store.reader import CaptureReader

LIST_COLUMNS = (
    "e.rowid as rid, e.id, e.started_at, e.method, e.path, e.model, e.status, e.user_agent, e.stream,"
    " e.changes_count, e.flags, e.tags, e.first_token_ms, e.duration_ms, e.finish_reason, e.error,"
    " e.session_id, e.source_id, e.prompt_tokens, e.completion_tokens,"
    " substr(e.content, 1, 160) as content_start"
)
SYNC_SEARCH_BACKLOG = 500  # a search indexes this many new captures itself; the background does the rest


class SqliteBrowse(BrowseBase):
    """Thread-local read-only connections (Starlette runs sync endpoints in a thread pool), the search
    sidecar (`index`, None when search is off) attached to each and kept up by a thread of its own."""

    backend = "sqlite"
    transient = (sqlite3.Error,)
    ORDER = "rowid"
    FLAG_COUNTS = (
        "select j.value as v, count(*) as n from exchanges e, json_each(e.flags) j where e.flags != '[]'"
        " group by j.value order by 2 desc limit 60"
    )
    TURN_COLUMNS = (
        "rowid as rid, id, started_at, status, model, user_agent, prompt_tokens, completion_tokens,"
        " first_token_ms, duration_ms, changes_count, flags, finish_reason, error,"
        " substr(content, 1, 400) as content_start, tool_calls"
    )
    SESSION_TOTALS = (
        "select session_id, count(*) as turns, sum(changes_count) as changes, sum(flags != '[]') as flagged,"
        " sum(prompt_tokens) as prompt_tokens, sum(completion_tokens) as completion_tokens,"
        f" sum(duration_ms) as duration_ms, sum({ERRORS}) as errors from exchanges e where {{ids}} group by session_id"
    )

    def __init__(self, db_path: Path, index: SearchIndex | None = None, *, background: bool = True) -> None:
        super().__init__()
        self.db_path = db_path
        self.index = index
        self.background = background
        self._local = threading.local()
        open_for_reading(db_path).close()  # fail now, at start, on a missing or foreign db

    def conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = open_for_reading(self.db_path)
            if self.index is not None:
                conn.execute("attach database ? as fts", (self.index.attach_uri(),))
            self._local.conn = conn
        return conn

    def rows(self, sql: str, args: list[Any] | tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        return [dict(r) for r in self.conn().execute(sql, args)]

    def thread_done(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:  # this thread ends: don't leave its connection to the collector
            conn.close()
            self._local.conn = None

    def start(self) -> None:
        if self.index is not None and self.background:
            self.index.start()

    def catch_up(self) -> None:
        if self.index is not None:
            self.index.catch_up()

    def stats_complete(self) -> bool:
        if self.index is None:
            return True
        done, top = self.index.status()
        return done >= top

    def close(self) -> None:
        if self.index is not None:
            self.index.stop()
        self.thread_done()

    @contextlib.contextmanager
    def reading(self) -> Iterator[CaptureReader]:
        yield SqliteReader(self.conn())

    def list_exchanges(
        self, f: Filters, *, before: str = "", after: str = "", limit: int = PAGE, now: float | None = None
    ) -> Page:
        if f.q and self.index is not None:
            self.index.catch_up(limit=SYNC_SEARCH_BACKLOG, wait=False)
        conn = self.conn()
        clauses, args = where(f, now)
        columns = f"{LIST_COLUMNS}, {attempt_columns(conn, 'e')}"
        searched = bool(f.q and self.index is not None and to_match(f.q))
        key = "d.rowid" if searched else "e.rowid"
        if before or after:
            rid = self._position(before or after)
            if rid is not None:
                clauses.append(f"{key} {'<' if before else '>'} ?")
                args.append(rid)
        direction = "asc" if after and not before else "desc"
        if searched:
            sql = (
                f"select {columns}, snippet(doc, -1, char(2), char(3), '…', 16) as snippet"
                " from fts.doc d join exchanges e on e.rowid = d.rowid where doc match ?"
            )
            args.insert(0, to_match(f.q))
            sql += "".join(f" and {w}" for w in clauses) + f" order by {key} {direction} limit ?"
        else:  # rowids first: index-only when the filters are on indexed columns, then one page of rows
            inner = "select e.rowid from exchanges e" + (" where " + " and ".join(clauses) if clauses else "")
            sql = (
                f"select {columns} from exchanges e where e.rowid in ({inner} order by e.rowid {direction}"
                f" limit ?) order by e.rowid {direction}"
            )
        page = Page.of([decode_flags(r) for r in self.rows(sql, [*args, limit + 1])], limit, before, after)
        page.searched = searched
        if searched:
            top = conn.execute("select max(rowid) from exchanges").fetchone()[0] or 0
            done = conn.execute("select value from fts.meta where key = 'last_rowid'").fetchone()
            page.index_behind = max(0, int(top) - int(done[0] if done else 0))
        return page

    def attempts_of(self, capture_id: str) -> list[dict[str, Any]]:
        return super().attempts_of(capture_id) if has_attempts(self.conn()) else []  # none before m004

    def compute_stats(self, f: Filters) -> Stats:
        from tapfix.proxy.store.sqlite.stats import compute_stats

        return compute_stats(self.conn(), f, indexed=self.index is not None)

    def _in(self, column: str, values: list[Any]) -> tuple[str, list[Any]]:
        return f"{column} in ({','.join('?' * len(values))})", values

    def _position(self, capture_id: str) -> int | None:
        row = self.conn().execute("select rowid from exchanges where id = ?", (capture_id,)).fetchone()
        return None if row is None else int(row[0])

    def _turn_cursor(self, after: str) -> int:
        return int(after) if after.isdigit() else 0

    def _later(self, row: dict[str, Any]) -> int:
        return int(row["rid"])

    def _request_bodies(self) -> Callable[[dict[str, Any]], bytes | None]:
        bodies = BodyCache(self.conn())  # a session's turns share delta chains: read them through one cache
        return lambda row: bodies.get(row.pop("request_body_id"))
