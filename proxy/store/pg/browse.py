"""The browser's queries on a PostgreSQL store (read-only): PostgreSQL's `BrowseQueries` (store/parts.py),
over the logic every backend shares (store/queries.py `BrowseBase`), with the same pages as SQLite's
for the same exchanges; the stats page's numbers are store/pg/stats.py's.

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
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.filters import ERRORS, Filters, search_terms
from tapfix.proxy.store.pages import PAGE, Page
from tapfix.proxy.store.pg.filters import DAY, where
from tapfix.proxy.store.pg.locator import PostgresLocator
from tapfix.proxy.store.pg.reader import PostgresReader, iso, pyformat, said
from tapfix.proxy.store.queries import BrowseBase

if TYPE_CHECKING:
    from tapfix.proxy.store.pages import Stats
    from tapfix.proxy.store.reader import CaptureReader

POOL_SIZE = 4  # a browser serves a handful of people: the pool stays small for the server
LIST_COLUMNS = (
    "e.id, e.started_at, e.method, e.path, e.model, e.status, e.user_agent, e.stream,"
    " e.changes_count, e.flags, e.tags, e.first_token_ms, e.duration_ms, e.finish_reason, e.error,"
    " e.session_id, e.source_id, e.prompt_tokens, e.completion_tokens,"
    " substr(e.content, 1, 160) as content_start, e.attempt_of, e.attempt"
)
SNIPPET_BEFORE, SNIPPET_LENGTH = 60, 200  # characters of `search_text` shown around the first match


def _like(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _tsquery(text: str) -> str:
    """`to_tsquery` input for a prefix: the text quoted as one lexeme list, every lexeme a prefix."""
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "':*"


def search_where(terms: list[tuple[str, bool]]) -> tuple[list[str], list[Any]]:
    clauses: list[str] = []
    args: list[Any] = []
    for text, prefix in terms:
        words = "to_tsquery('simple', ?)" if prefix else "phraseto_tsquery('simple', ?)"
        clauses.append(f"(e.search @@ {words} or e.search_text ilike ?)")
        args += [_tsquery(text) if prefix else text, _like(text)]
    return clauses, args


def snippet(text: str, terms: list[str]) -> str:
    """Text around the first match with \\x02/\\x03 around each match (as SQLite's FTS5 `snippet`)."""
    text = " ".join(text.split())
    pattern = "|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True))
    marked = re.sub(pattern, "\x02\\g<0>\x03", text, flags=re.IGNORECASE)
    return f"…{marked}…" if len(text) >= SNIPPET_LENGTH - SNIPPET_BEFORE else marked


class PostgresBrowse(BrowseBase):
    """A pool of read-only connections; `close()` when done."""

    backend = "postgresql"
    transient = (StoreError,)
    ORDER = "id"
    CLIENT = 'user_agent collate "C"'  # bytewise, as the index on it (and the client filter) is
    FLAG_COUNTS = (
        "select v, count(*) as n from exchanges e, json_array_elements_text(e.flags::json) v"
        " where e.flags <> '[]' group by v order by 2 desc limit 60"
    )
    TURN_COLUMNS = (
        "id, started_at, status, model, user_agent, prompt_tokens, completion_tokens, first_token_ms,"
        " duration_ms, changes_count, flags, finish_reason, error, substr(content, 1, 400) as content_start, tool_calls"
    )
    SESSION_TOTALS = (
        "select session_id, count(*) as turns, sum(changes_count) as changes,"
        " count(*) filter (where flags <> '[]') as flagged, sum(prompt_tokens) as prompt_tokens,"
        " sum(completion_tokens) as completion_tokens, sum(duration_ms) as duration_ms,"
        f" count(*) filter (where {ERRORS}) as errors from exchanges e where {{ids}} group by session_id"
    )

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
                return conn.execute(pyformat(sql), args).fetchall()
        except psycopg.Error as e:
            raise StoreError(f"{self.locator}: {said(self.locator, e)}") from None

    def times(self, row: dict[str, Any]) -> dict[str, Any]:
        for key in ("started_at", "first_at", "last_at"):
            if key in row:
                row[key] = iso(row[key])
        return row

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
                f", substr(e.search_text, greatest(1, strpos(lower(e.search_text), lower(?)) - {SNIPPET_BEFORE}),"
                f" {SNIPPET_LENGTH}) as snippet_text"
            )
            args.insert(0, terms[0][0])
        if before or after:
            clauses.append(f"e.id {'<' if before else '>'} ?")
            args.append(before or after)
        direction = "asc" if after and not before else "desc"
        sql = f"select {columns} from exchanges e" + (" where " + " and ".join(clauses) if clauses else "")
        sql += f" order by e.id {direction} limit ?"
        rows = [self.decode(r) for r in self.rows(sql, [*args, limit + 1])]
        for row in rows:
            if terms:
                row["snippet"] = snippet(row.pop("snippet_text") or "", [t for t, _ in terms])
        page = Page.of(rows, limit, before, after)
        page.searched = bool(terms)
        return page

    def compute_stats(self, f: Filters) -> Stats:
        from tapfix.proxy.store.pg.stats import compute_stats

        return compute_stats(self, f)

    def _day_column(self) -> tuple[str, str]:
        return f", {DAY} as day", " and day = ?"  # rows of changes and bodies are read in their day's partition

    def _in(self, column: str, values: list[Any]) -> tuple[str, list[Any]]:
        return f"{column} = any(?)", [values]

    def _position(self, capture_id: str) -> str:
        return capture_id

    def _turn_cursor(self, after: str) -> str:
        return after

    def _later(self, row: dict[str, Any]) -> str:
        return str(row["id"])

    def _changes_of(self, rows: list[dict[str, Any]]) -> tuple[str, list[Any]]:
        return "exchange_id = any(?) and day = any(?)", [[r["id"] for r in rows], sorted({r["day"] for r in rows})]

    def _request_bodies(self) -> Callable[[dict[str, Any]], bytes | None]:
        return lambda row: self._body(row.pop("request_body_id"), row.pop("day"))

    def _body(self, body_id: int | None, day: datetime.date) -> bytes | None:
        if body_id is None:
            return None
        try:
            found = self.rows("select tapfix_body_rebuild(?, ?) as b", (body_id, day))[0]["b"]
        except StoreError:
            return None
        return bytes(found) if found is not None else None
