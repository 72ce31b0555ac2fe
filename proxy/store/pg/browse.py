"""The browser's queries on a PostgreSQL store (read-only): PostgreSQL's `BrowseQueries` (store/backend.py),
with the same pages as SQLite's (store/sqlite/browse.py) for the same exchanges; the stats page's
numbers are store/pg/stats.py's.

- Lists are newest first by capture id, with keyset pagination on it (`id < cursor order by id desc
  limit 51`): the primary key `(id, started_at)` serves the plain list and id prefixes, and each
  filter has an index ending in the id (schema pg001, pg005), so a page walks one index per day
  partition in order (a Merge Append) and stops after 51 rows, however many captures there are.
- Search: each term the user typed (a word, a "phrase", a `prefix*`, as SQLite's `to_match` reads
  them) must match, as words of the `search` tsvector (GIN, `simple` configuration) or as a
  substring of `search_text` (`ILIKE`, served by the pg_trgm GIN index), so part of a word and CJK
  text without spaces are found too. The writer keeps both columns; the browser only queries.
- Rows that live in day partitions (changes, bodies) are read with their day, so PostgreSQL prunes
  to the partitions concerned instead of probing every day's index.
- Connections come from a small pool (psycopg_pool, from the `tapfix[postgres]` extra), autocommit:
  a page never holds a transaction open.

psycopg is imported here only: this module is loaded for a `postgresql://` store alone.
"""

from __future__ import annotations

import contextlib
import datetime
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.filters import ERRORS, Filters, search_terms
from tapfix.proxy.store.pages import PAGE, TURNS_PAGE, CachedStore, Page, SessionPage, SessionTurns, decode_flags
from tapfix.proxy.store.pg.filters import DAY, where
from tapfix.proxy.store.pg.locator import PostgresLocator
from tapfix.proxy.store.pg.reader import PostgresReader, iso, said

if TYPE_CHECKING:
    from tapfix.proxy.store.pages import Stats
    from tapfix.proxy.store.parts import CaptureReader

POOL_SIZE = 4  # a browser serves a handful of people: the pool stays small for the server
LIST_COLUMNS = (
    "e.id, e.started_at, e.method, e.path, e.model, e.status, e.user_agent, e.stream,"
    " e.changes_count, e.flags, e.tags, e.first_token_ms, e.duration_ms, e.finish_reason, e.error,"
    " e.session_id, e.source_id, e.prompt_tokens, e.completion_tokens,"
    " substr(e.content, 1, 160) as content_start, e.attempt_of, e.attempt"
)
SNIPPET_BEFORE, SNIPPET_LENGTH = 60, 200  # characters of `search_text` shown around the first match
CHANGE_REASONS_LIMIT = 20  # why an attempt was made, per attempt: its tool-call change rows


def _like(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _tsquery(text: str) -> str:
    """`to_tsquery` input for a prefix: the text quoted as one lexeme list, every lexeme a prefix."""
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "':*"


def search_where(terms: list[tuple[str, bool]]) -> tuple[list[str], list[Any]]:
    clauses: list[str] = []
    args: list[Any] = []
    for text, prefix in terms:
        words = "to_tsquery('simple', %s)" if prefix else "phraseto_tsquery('simple', %s)"
        clauses.append(f"(e.search @@ {words} or e.search_text ilike %s)")
        args += [_tsquery(text) if prefix else text, _like(text)]
    return clauses, args


def snippet(text: str, terms: list[str]) -> str:
    """Text around the first match with \\x02/\\x03 around each match (as SQLite's FTS5 `snippet`)."""
    text = " ".join(text.split())
    pattern = "|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True))
    marked = re.sub(pattern, "\x02\\g<0>\x03", text, flags=re.IGNORECASE)
    return f"…{marked}…" if len(text) >= SNIPPET_LENGTH - SNIPPET_BEFORE else marked


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    for key in ("started_at", "first_at", "last_at"):
        if key in row:
            row[key] = iso(row[key])
    return decode_flags(row)


class PostgresBrowse(CachedStore):
    """A pool of read-only connections; `close()` when done."""

    backend = "postgresql"
    transient = (StoreError,)

    def __init__(self, locator: PostgresLocator, *, pool_size: int = POOL_SIZE) -> None:
        super().__init__()
        self.locator = locator
        PostgresReader(locator).close()  # fail now, at start: unreachable, or no tapfix store there
        self.pool: ConnectionPool[psycopg.Connection[dict[str, Any]]] = ConnectionPool(
            locator.url,
            min_size=1,
            max_size=pool_size,
            kwargs={"autocommit": True, "row_factory": dict_row, "application_name": "tapfix browse"},
            name="tapfix-browse",
            open=True,
        )

    def rows(self, sql: str, args: list[Any] | tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """The rows; a database error as a one-line `StoreError` (the password masked)."""
        try:
            with self.pool.connection() as conn:
                return conn.execute(sql.encode(), args).fetchall()
        except psycopg.Error as e:
            raise StoreError(f"{self.locator}: {said(self.locator, e)}") from None

    @contextlib.contextmanager
    def reading(self) -> Iterator[CaptureReader]:
        with self.pool.connection() as conn:
            yield PostgresReader(self.locator, conn=conn)

    def close(self) -> None:
        self.pool.close()

    def list_exchanges(
        self, f: Filters, *, before: str = "", after: str = "", limit: int = PAGE, now: float | None = None
    ) -> Page:
        """A page of the list: newest first, `before`/`after` a capture id (the cursor), `f.q` searched."""
        clauses, args = where(f, now)
        terms = search_terms(f.q)
        columns = LIST_COLUMNS
        if terms:
            found, found_args = search_where(terms)
            clauses, args = [*found, *clauses], [*found_args, *args]
            columns += (
                f", substr(e.search_text, greatest(1, strpos(lower(e.search_text), lower(%s)) - {SNIPPET_BEFORE}),"
                f" {SNIPPET_LENGTH}) as snippet_text"
            )
            args.insert(0, terms[0][0])
        if before or after:
            clauses.append(f"e.id {'<' if before else '>'} %s")
            args.append(before or after)
        direction = "asc" if after and not before else "desc"
        sql = f"select {columns} from exchanges e" + (" where " + " and ".join(clauses) if clauses else "")
        sql += f" order by e.id {direction} limit %s"
        rows = [_decode(r) for r in self.rows(sql, [*args, limit + 1])]
        for row in rows:
            if terms:
                row["snippet"] = snippet(row.pop("snippet_text") or "", [t for t, _ in terms])
        page = Page.of(rows, limit, before, after)
        page.searched = bool(terms)
        return page

    def facets(self) -> dict[str, list[tuple[str, int]]]:
        """Values for the filter form's suggestions; cached, they cost a scan of an index each."""

        def compute() -> dict[str, list[tuple[str, int]]]:
            out = {}
            for name, column in (("models", "model"), ("clients", 'user_agent collate "C"'), ("paths", "path")):
                out[name] = self.counts(
                    f"select {column} as v, count(*) as n from exchanges where {column} is not null"
                    f" group by {column} order by 2 desc limit 60"
                )
            out["flags"] = self.counts(
                "select v, count(*) as n from exchanges e, json_array_elements_text(e.flags::json) v"
                " where e.flags <> '[]' group by v order by 2 desc limit 60"
            )
            return out

        return self.cached("facets", 30.0, compute)

    def counts(self, sql: str) -> list[tuple[str, int]]:
        return [(r["v"], r["n"]) for r in self.rows(sql)]

    def replays_of(self, capture_id: str) -> list[dict[str, Any]]:
        sql = (
            "select id, started_at, status, duration_ms, first_token_ms, flags, changes_count from exchanges"
            " where source_id = %s order by id desc limit 200"
        )
        return [_decode(r) for r in self.rows(sql, (capture_id,))]

    def attempts_of(self, capture_id: str) -> list[dict[str, Any]]:
        """The regeneration attempts made for a client-facing capture, in order, each with why it was made."""
        rows = self.rows(
            "select id, attempt, started_at, status, duration_ms, first_token_ms, finish_reason, flags,"
            f" changes_count, error, {DAY} as day from exchanges e"
            " where attempt_of = %s order by attempt, id limit 200",
            (capture_id,),
        )
        for row in rows:
            _decode(row)
            row["reasons"] = [
                str(r["reason"])
                for r in self.rows(
                    "select reason from changes where exchange_id = %s and day = %s and stage = 'toolcalls'"
                    " and reason is not null and reason <> '' group by reason order by min(seq) limit %s",
                    (row["id"], row.pop("day"), CHANGE_REASONS_LIMIT),
                )
            ]
        return rows

    def session_neighbours(self, capture: Mapping[str, Any]) -> tuple[str | None, str | None]:
        if not capture.get("session_id"):
            return None, None
        found = []
        for op, order in (("<", "desc"), (">", "asc")):
            row = self.rows(
                f"select id from exchanges where session_id = %s and id {op} %s order by id {order} limit 1",
                (capture["session_id"], capture["id"]),
            )
            found.append(str(row[0]["id"]) if row else None)
        return found[0], found[1]

    def list_sessions(self, *, before: str = "", limit: int = PAGE) -> SessionPage:
        """Agent runs, most recently active first (the index on sessions (last_at, id)), with totals."""
        cond, args = "", []
        if before:
            cursor = self.rows("select last_at, id from sessions where id = %s", (before,))
            if cursor:
                cond, args = " where (last_at, id) < (%s, %s)", [cursor[0]["last_at"], cursor[0]["id"]]
        rows = self.rows(f"select * from sessions{cond} order by last_at desc, id desc limit %s", [*args, limit + 1])
        page = SessionPage.of([_decode(r) for r in rows], limit)
        ids = [r["id"] for r in page.rows]
        if ids:
            page.add_totals(
                self.rows(
                    "select session_id, count(*) as turns, sum(changes_count) as changes,"
                    " count(*) filter (where flags <> '[]') as flagged, sum(prompt_tokens) as prompt_tokens,"
                    " sum(completion_tokens) as completion_tokens, sum(duration_ms) as duration_ms,"
                    f" count(*) filter (where {ERRORS}) as errors"
                    " from exchanges e where session_id = any(%s) group by session_id",
                    (ids,),
                )
            )
        return page

    def load_session(self, session_id: str, *, after: str = "", limit: int = TURNS_PAGE) -> SessionTurns | None:
        """One agent run turn by turn; `after`: the id of the last turn of the page before ('' from the start)."""
        session = self.rows("select * from sessions where id = %s", (session_id,))
        total = self.rows("select count(*) as n from exchanges where session_id = %s", (session_id,))[0]["n"]
        if not session and not total:
            return None
        rows = self.rows(
            "select id, started_at, status, model, user_agent, request_body_id, prompt_tokens,"
            " completion_tokens, first_token_ms, duration_ms, changes_count, flags, finish_reason, error,"
            f" substr(content, 1, 400) as content_start, tool_calls, {DAY} as day"
            " from exchanges e where session_id = %s and id > %s order by id limit %s",
            (session_id, after, limit + 1),
        )
        later = rows[limit - 1]["id"] if len(rows) > limit else None
        rows = rows[:limit]
        earlier = self.rows(
            "select count(*) as n from exchanges where session_id = %s and id <= %s", (session_id, after)
        )[0]["n"]
        prev = []
        if after:
            prev = self.rows(
                f"select request_body_id, {DAY} as day from exchanges e where session_id = %s and id <= %s"
                " order by id desc limit 1",
                (session_id, after),
            )
        changes: dict[str, list[dict[str, Any]]] = {}
        if rows:
            for r in self.rows(
                "select exchange_id, stage, kind, path, reason from changes"
                " where exchange_id = any(%s) and day = any(%s) order by exchange_id, seq",
                ([r["id"] for r in rows], sorted({r["day"] for r in rows})),
            ):
                changes.setdefault(r.pop("exchange_id"), []).append(r)
        for row in rows:
            row["request"] = self._body(row.pop("request_body_id"), row.pop("day"))
            row["started_at"] = iso(row["started_at"])  # flags and tool calls: the browser parses them
        return SessionTurns(
            _decode(session[0]) if session else {"id": session_id},
            rows,
            changes,
            first_number=1 + int(earlier),
            previous=self._body(prev[0]["request_body_id"], prev[0]["day"]) if prev else None,
            continues=bool(prev),
            later=later,
            total=total,
        )

    def _body(self, body_id: int | None, day: datetime.date) -> bytes | None:
        """A request body, or None when it can't be read (a damaged chain): the turn shows without it."""
        if body_id is None:
            return None
        try:
            found = self.rows("select tapfix_body_rebuild(%s, %s) as b", (body_id, day))[0]["b"]
        except StoreError:
            return None
        return bytes(found) if found is not None else None

    def compute_stats(self, f: Filters) -> Stats:
        from tapfix.proxy.store.pg.stats import compute_stats

        return compute_stats(self, f)
