"""The browser's queries on a SQLite store (read-only) and its search sidecar: SQLite's `BrowseQueries`
(store/backend.py); PostgreSQL's are store/pg/browse.py.

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

from tapfix.proxy.store.filters import ERRORS, Filters
from tapfix.proxy.store.pages import PAGE, TURNS_PAGE, CachedStore, Page, SessionPage, SessionTurns, decode_flags
from tapfix.proxy.store.sqlite.database import open_for_reading
from tapfix.proxy.store.sqlite.filters import where
from tapfix.proxy.store.sqlite.reader import SqliteReader, attempt_columns, has_attempts
from tapfix.proxy.store.sqlite.search_index import BodyCache, SearchIndex, to_match

if TYPE_CHECKING:
    from tapfix.proxy.store.pages import Stats
    from tapfix.proxy.store.parts import CaptureReader

LIST_COLUMNS = (
    "e.rowid as rid, e.id, e.started_at, e.method, e.path, e.model, e.status, e.user_agent, e.stream,"
    " e.changes_count, e.flags, e.tags, e.first_token_ms, e.duration_ms, e.finish_reason, e.error,"
    " e.session_id, e.source_id, e.prompt_tokens, e.completion_tokens,"
    " substr(e.content, 1, 160) as content_start"
)
CHANGE_REASONS_LIMIT = 20  # why an attempt was made, per attempt: its tool-call change rows
SYNC_SEARCH_BACKLOG = 500  # a search indexes this many new captures itself; the background does the rest


class SqliteBrowse(CachedStore):
    """Thread-local read-only connections (Starlette runs sync endpoints in a thread pool), the search
    sidecar (`index`, None when search is off) attached to each and kept up by a thread of its own."""

    backend = "sqlite"
    transient = (sqlite3.Error,)

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

    def rowid_of(self, capture_id: str) -> int | None:
        row = self.conn().execute("select rowid from exchanges where id = ?", (capture_id,)).fetchone()
        return None if row is None else int(row[0])

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
            rid = self.rowid_of(before or after)
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

    def facets(self) -> dict[str, list[tuple[str, int]]]:
        """Values for the filter form's suggestions; cached, they cost a scan of an index each."""

        def compute() -> dict[str, list[tuple[str, int]]]:
            out = {}
            for name, column in (("models", "model"), ("clients", "user_agent"), ("paths", "path")):
                out[name] = self.counts(
                    f"select {column}, count(*) from exchanges where {column} is not null"
                    f" group by {column} order by 2 desc limit 60"
                )
            out["flags"] = self.counts(
                "select j.value, count(*) from exchanges e, json_each(e.flags) j where e.flags != '[]'"
                " group by j.value order by 2 desc limit 60"
            )
            return out

        return self.cached("facets", 30.0, compute)

    def counts(self, sql: str) -> list[tuple[str, int]]:
        return [(r[0], r[1]) for r in self.conn().execute(sql)]

    def replays_of(self, capture_id: str) -> list[dict[str, Any]]:
        sql = (
            "select id, started_at, status, duration_ms, first_token_ms, flags, changes_count from exchanges"
            " where source_id = ? order by rowid desc limit 200"
        )
        return [decode_flags(r) for r in self.rows(sql, (capture_id,))]

    def attempts_of(self, capture_id: str) -> list[dict[str, Any]]:
        """The regeneration attempts made for a client-facing capture, in order, each with why it was made
        (the reasons of its tool-call change rows)."""
        if not has_attempts(self.conn()):
            return []
        rows = self.rows(
            "select id, attempt, started_at, status, duration_ms, first_token_ms, finish_reason, flags,"
            " changes_count, error from exchanges where attempt_of = ? order by attempt, rowid limit 200",
            (capture_id,),
        )
        for row in rows:
            decode_flags(row)
            row["reasons"] = [
                str(r["reason"])
                for r in self.rows(
                    "select reason from changes where exchange_id = ? and stage = 'toolcalls'"
                    " and reason is not null and reason != '' group by reason order by min(seq) limit ?",
                    (row["id"], CHANGE_REASONS_LIMIT),
                )
            ]
        return rows

    def session_neighbours(self, capture: Mapping[str, Any]) -> tuple[str | None, str | None]:
        if not capture.get("session_id"):
            return None, None
        rid = self.rowid_of(capture["id"])
        found = []
        for op, order in (("<", "desc"), (">", "asc")):
            row = self.rows(
                f"select id from exchanges where session_id = ? and rowid {op} ? order by rowid {order} limit 1",
                (capture["session_id"], rid),
            )
            found.append(str(row[0]["id"]) if row else None)
        return found[0], found[1]

    def list_sessions(self, *, before: str = "", limit: int = PAGE) -> SessionPage:
        """Agent runs, most recently active first, with per-run totals from the exchanges index."""
        cond, args = "", []
        if before:
            cursor = self.rows("select last_at, id from sessions where id = ?", (before,))
            if cursor:
                cond, args = " where (last_at, id) < (?, ?)", [cursor[0]["last_at"], cursor[0]["id"]]
        rows = self.rows(f"select * from sessions{cond} order by last_at desc, id desc limit ?", [*args, limit + 1])
        page = SessionPage.of(rows, limit)
        ids = [r["id"] for r in page.rows]
        if ids:
            page.add_totals(
                self.rows(
                    "select session_id, count(*) as turns, sum(changes_count) as changes,"
                    " sum(flags != '[]') as flagged, sum(prompt_tokens) as prompt_tokens,"
                    " sum(completion_tokens) as completion_tokens, sum(duration_ms) as duration_ms,"
                    f" sum({ERRORS}) as errors"
                    f" from exchanges e where session_id in ({','.join('?' * len(ids))}) group by session_id",
                    ids,
                )
            )
        return page

    def load_session(self, session_id: str, *, after: str = "", limit: int = TURNS_PAGE) -> SessionTurns | None:
        """One agent run turn by turn; `after`: the rowid cursor of the page before ('' from the first turn)."""
        start = int(after) if after.isdigit() else 0
        session = self.rows("select * from sessions where id = ?", (session_id,))
        total = self.rows("select count(*) as n from exchanges where session_id = ?", (session_id,))[0]["n"]
        if not session and not total:
            return None
        rows = self.rows(
            "select rowid as rid, id, started_at, status, model, user_agent, request_body_id, prompt_tokens,"
            " completion_tokens, first_token_ms, duration_ms, changes_count, flags, finish_reason, error,"
            " substr(content, 1, 400) as content_start, tool_calls"
            " from exchanges where session_id = ? and rowid > ? order by rowid limit ?",
            (session_id, start, limit + 1),
        )
        later = rows[limit - 1]["rid"] if len(rows) > limit else None
        rows = rows[:limit]
        earlier = self.rows(
            "select count(*) as n from exchanges where session_id = ? and rowid <= ?", (session_id, start)
        )[0]["n"]
        bodies = BodyCache(self.conn())
        prev = []
        if start:
            prev = self.rows(
                "select request_body_id from exchanges where session_id = ? and rowid <= ? order by rowid desc limit 1",
                (session_id, start),
            )
        changes: dict[str, list[dict[str, Any]]] = {}
        if rows:
            ids = [r["id"] for r in rows]
            for r in self.rows(
                "select exchange_id, stage, kind, path, reason from changes"
                f" where exchange_id in ({','.join('?' * len(ids))}) order by exchange_id, seq",
                ids,
            ):
                changes.setdefault(r.pop("exchange_id"), []).append(r)
        for row in rows:
            row["request"] = bodies.get(row["request_body_id"])
        return SessionTurns(
            session[0] if session else {"id": session_id},
            rows,
            changes,
            first_number=1 + earlier,
            previous=bodies.get(prev[0]["request_body_id"]) if prev else None,
            continues=bool(prev),
            later=later,
            total=total,
        )

    def compute_stats(self, f: Filters) -> Stats:
        from tapfix.proxy.store.sqlite.stats import compute_stats

        return compute_stats(self.conn(), f, indexed=self.index is not None)
