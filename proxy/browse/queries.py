"""All the browser's SQL against a SQLite capture store (read-only) and the search sidecar: SQLite's
`BrowseStore` (source.py; PostgreSQL's is pg_queries.py). The form's `Filters` are shared.

Lists are newest first by `exchanges.rowid` (write order) with keyset pagination: every single-column
index of the schema ends in the rowid, so `where model = ? order by rowid desc limit 51` walks one
index in order and stops after a page, however many captures there are. Cursors in URLs are capture
ids (`?before=ID`), turned into rowids through the primary key.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from tapfix.proxy.browse.filters import ERRORS, Filters
from tapfix.proxy.browse.fts import SearchIndex, to_match
from tapfix.proxy.browse.source import PAGE, CachedStore, Page, SessionPage, newest_first
from tapfix.proxy.store.reader import CaptureReader, SqliteReader, attempt_columns, has_attempts
from tapfix.proxy.store.writer import open_for_reading

if TYPE_CHECKING:
    from tapfix.proxy.browse.session_turns import SessionView
    from tapfix.proxy.browse.stats import Stats
LIST_COLUMNS = (
    "e.rowid as rid, e.id, e.started_at, e.method, e.path, e.model, e.status, e.user_agent, e.stream,"
    " e.changes_count, e.flags, e.tags, e.first_token_ms, e.duration_ms, e.finish_reason, e.error,"
    " e.session_id, e.source_id, e.prompt_tokens, e.completion_tokens,"
    " substr(e.content, 1, 160) as content_start"
)
CHANGE_REASONS_LIMIT = 20  # why an attempt was made, per attempt: its tool-call change rows


class Store(CachedStore):
    """SQLite's `BrowseStore` (source.py): thread-local read-only connections (Starlette runs sync
    endpoints in a thread pool), the search sidecar attached to each."""

    backend = "sqlite"
    transient = (sqlite3.Error,)

    def __init__(self, db_path: Path, index: SearchIndex | None = None) -> None:
        super().__init__()
        self.db_path = db_path
        self.index = index
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

    def thread_done(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:  # this thread ends: don't leave its connection to the collector
            conn.close()
            self._local.conn = None

    @contextlib.contextmanager
    def reading(self) -> Iterator[CaptureReader]:
        yield SqliteReader(self.conn())

    def list_exchanges(
        self, f: Filters, *, before: str = "", after: str = "", limit: int = PAGE, now: float | None = None
    ) -> Page:
        return list_exchanges(self, f, before=before, after=after, limit=limit, now=now)

    def facets(self) -> dict[str, list[tuple[str, int]]]:
        return facets(self)

    def replays_of(self, capture_id: str) -> list[dict[str, Any]]:
        return replays_of(self.conn(), capture_id)

    def attempts_of(self, capture_id: str) -> list[dict[str, Any]]:
        return attempts_of(self.conn(), capture_id)

    def session_neighbours(self, capture: Mapping[str, Any]) -> tuple[str | None, str | None]:
        return session_neighbours(self.conn(), capture)

    def list_sessions(self, *, before: str = "", limit: int = PAGE) -> SessionPage:
        return list_sessions(self.conn(), before=before, limit=limit)

    def load_session(self, session_id: str, *, after: str = "", limit: int = PAGE) -> SessionView | None:
        from tapfix.proxy.browse.session_turns import load_session

        return load_session(self.conn(), session_id, after=int(after) if after.isdigit() else 0, limit=limit)

    def compute_stats(self, f: Filters) -> Stats:
        from tapfix.proxy.browse.stats import compute_stats

        return compute_stats(self, f)

    def close(self) -> None:
        self.thread_done()


def rowid_of(conn: sqlite3.Connection, capture_id: str) -> int | None:
    row = conn.execute("select rowid from exchanges where id = ?", (capture_id,)).fetchone()
    return None if row is None else int(row[0])


def decode_row(row: sqlite3.Row) -> dict[str, Any]:
    out = dict(row)
    for key in ("flags", "tags"):
        if isinstance(out.get(key), str):
            out[key] = orjson.loads(out[key])
    return out


def list_exchanges(
    store: Store,
    f: Filters,
    *,
    before: str = "",
    after: str = "",
    limit: int = PAGE,
    now: float | None = None,
) -> Page:
    conn = store.conn()
    where, args = f.where(now)
    columns = f"{LIST_COLUMNS}, {attempt_columns(conn, 'e')}"
    searched = bool(f.q and store.index is not None and to_match(f.q))
    key = "d.rowid" if searched else "e.rowid"
    if before or after:
        rid = rowid_of(conn, before or after)
        if rid is not None:
            where.append(f"{key} {'<' if before else '>'} ?")
            args.append(rid)
    if searched:
        sql = (
            f"select {columns}, snippet(doc, -1, char(2), char(3), '…', 16) as snippet"
            " from fts.doc d join exchanges e on e.rowid = d.rowid where doc match ?"
        )
        args.insert(0, to_match(f.q))
        sql += "".join(f" and {w}" for w in where)
    direction = "asc" if after and not before else "desc"
    if searched:
        sql += f" order by {key} {direction} limit ?"
    else:  # rowids first: index-only when the filters are on indexed columns, then one page of rows
        inner = "select e.rowid from exchanges e" + (" where " + " and ".join(where) if where else "")
        sql = (
            f"select {columns} from exchanges e where e.rowid in ({inner} order by e.rowid {direction}"
            f" limit ?) order by e.rowid {direction}"
        )
    rows = [decode_row(r) for r in conn.execute(sql, [*args, limit + 1])]
    page = newest_first(rows, limit, before=before, after=after)
    page.searched = searched
    if searched and store.index is not None:
        top = conn.execute("select max(rowid) from exchanges").fetchone()[0] or 0
        done = conn.execute("select value from fts.meta where key = 'last_rowid'").fetchone()
        page.index_behind = max(0, int(top) - int(done[0] if done else 0))
    return page


def facets(store: Store) -> dict[str, list[tuple[str, int]]]:
    """Values for the filter form's suggestions; cached, they cost a scan of an index each."""

    def compute() -> dict[str, list[tuple[str, int]]]:
        conn = store.conn()
        out = {}
        for name, column in (("models", "model"), ("clients", "user_agent"), ("paths", "path")):
            out[name] = [
                (r[0], r[1])
                for r in conn.execute(
                    f"select {column}, count(*) from exchanges where {column} is not null"
                    f" group by {column} order by 2 desc limit 60"
                )
            ]
        out["flags"] = [
            (r[0], r[1])
            for r in conn.execute(
                "select j.value, count(*) from exchanges e, json_each(e.flags) j where e.flags != '[]'"
                " group by j.value order by 2 desc limit 60"
            )
        ]
        return out

    return store.cached("facets", 30.0, compute)


def replays_of(conn: sqlite3.Connection, capture_id: str) -> list[dict[str, Any]]:
    return [
        decode_row(r)
        for r in conn.execute(
            "select id, started_at, status, duration_ms, first_token_ms, flags, changes_count from exchanges"
            " where source_id = ? order by rowid desc limit 200",
            (capture_id,),
        )
    ]


def attempts_of(conn: sqlite3.Connection, capture_id: str) -> list[dict[str, Any]]:
    """The regeneration attempts made for a client-facing capture, in order, each with why it was made
    (the reasons of its tool-call change rows)."""
    if not has_attempts(conn):
        return []
    rows = [
        decode_row(r)
        for r in conn.execute(
            "select id, attempt, started_at, status, duration_ms, first_token_ms, finish_reason, flags,"
            " changes_count, error from exchanges where attempt_of = ? order by attempt, rowid limit 200",
            (capture_id,),
        )
    ]
    for row in rows:
        row["reasons"] = [
            str(r[0])
            for r in conn.execute(
                "select reason from changes where exchange_id = ? and stage = 'toolcalls'"
                " and reason is not null and reason != '' group by reason order by min(seq) limit ?",
                (row["id"], CHANGE_REASONS_LIMIT),
            )
        ]
    return rows


def session_neighbours(conn: sqlite3.Connection, capture: Mapping[str, Any]) -> tuple[str | None, str | None]:
    if not capture.get("session_id"):
        return None, None
    rid = rowid_of(conn, capture["id"])
    prev = conn.execute(
        "select id from exchanges where session_id = ? and rowid < ? order by rowid desc limit 1",
        (capture["session_id"], rid),
    ).fetchone()
    nxt = conn.execute(
        "select id from exchanges where session_id = ? and rowid > ? order by rowid limit 1",
        (capture["session_id"], rid),
    ).fetchone()
    return (prev[0] if prev else None), (nxt[0] if nxt else None)


def list_sessions(conn: sqlite3.Connection, *, before: str = "", limit: int = PAGE) -> SessionPage:
    """Agent runs, most recently active first, with per-run totals from the exchanges index."""
    where, args = "", []
    if before:
        row = conn.execute("select last_at, id from sessions where id = ?", (before,)).fetchone()
        if row is not None:
            where, args = " where (last_at, id) < (?, ?)", [row[0], row[1]]
    rows = [
        dict(r)
        for r in conn.execute(
            f"select * from sessions{where} order by last_at desc, id desc limit ?", [*args, limit + 1]
        )
    ]
    page = SessionPage(rows[:limit], rows[limit - 1]["id"] if len(rows) > limit else None)
    ids = [r["id"] for r in page.rows]
    if ids:
        marks = ",".join("?" * len(ids))
        totals = {
            r["session_id"]: dict(r)
            for r in conn.execute(
                "select session_id, count(*) as turns, sum(changes_count) as changes,"
                " sum(flags != '[]') as flagged, sum(prompt_tokens) as prompt_tokens,"
                " sum(completion_tokens) as completion_tokens, sum(duration_ms) as duration_ms,"
                f" sum({ERRORS}) as errors"
                f" from exchanges e where session_id in ({marks}) group by session_id",
                ids,
            )
        }
        for row in page.rows:
            row.update(totals.get(row["id"], {}))
    return page
