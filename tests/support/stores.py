"""The store's tests over both backends: a `Backend` is a fresh SQLite file or a fresh PostgreSQL database
(the session's real server, tests/support/postgres.py), used through the store's one interface
(`store()`, store/backend.py `StoreBackend`: writers, readers, the browser's queries), and reads rows
back with one SQL text (qmark) on its own connection, so a check sees only what was committed.

Use `BACKENDS` to parametrize a fixture: the PostgreSQL case carries the `e2e` and `postgres` marks
(it needs the server), the SQLite case none."""

from __future__ import annotations

import itertools
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.backend import StoreBackend
from tapfix.proxy.store.locator import StoreLocator
from tapfix.proxy.store.writer import CaptureWriter

# The postgres marker puts the PostgreSQL variant in the process tier (tests/support/e2e_guard.py).
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
_numbers = itertools.count()


@dataclass
class Backend:
    name: str  # "sqlite" or "postgresql"
    locator: str  # the file's path, or the database's URL

    def store(self) -> StoreBackend:
        return StoreLocator.resolve(self.locator, postgres=True).backend()

    def writer(self, **options: Any) -> CaptureWriter:
        return self.store().writer(wait=False, **options)

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """The committed rows `sql` selects (qmark parameters), on a connection of its own."""
        if self.name == "sqlite":
            conn = sqlite3.connect(f"file:{self.locator}?mode=ro", uri=True)
            try:
                return [tuple(r) for r in conn.execute(sql, params)]
            finally:
                conn.close()
        import psycopg

        with psycopg.connect(self.locator, autocommit=True) as pg:
            return [tuple(r) for r in pg.execute(sql.replace("?", "%s").encode(), params)]

    def drop(self, table: str) -> None:
        """Break the store under a running writer, as a damaged or foreign schema would."""
        if self.name == "sqlite":
            with sqlite3.connect(self.locator) as conn:
                conn.execute(f"drop table {table}")
            return
        import psycopg

        with psycopg.connect(self.locator, autocommit=True) as pg:
            pg.execute(f"drop table {table} cascade".encode())


def make_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """For a fixture parametrized with `BACKENDS`: a new, empty store of `request.param`'s kind."""
    if request.param == "sqlite":
        return Backend("sqlite", str(tmp_path / "c.db"))
    server = request.getfixturevalue("postgres")
    return Backend("postgresql", server.create_database(f"store_{next(_numbers)}_{tmp_path.name[-20:].lower()}"))


def streamed_chat(**fields: Any) -> Exchange:
    """A streamed Chat Completions exchange of model `m` as a writer is given it: answered 200 with the SSE
    events `response_chunks`, 10 ms apart; `fields` are any other of Exchange's, or replace these."""
    chunks = fields.get("response_chunks", [])
    return Exchange(
        **{
            "method": "POST",
            "path": "/v1/chat/completions",
            "model": "m",
            "status": 200,
            "content_type": "text/event-stream",
            "stream": True,
            "chunk_times": [(i + 1) / 100 for i in range(len(chunks))],
        }
        | fields
    )


def undo_sqlite_migration(path: Path | str, name: str, *statements: str) -> None:
    """Turn a SQLite store into what a tapfix before migration `name` left: `statements` undo what the migration
    made (its columns, indexes, views), and its record goes."""
    conn = sqlite3.connect(path)
    for statement in statements:
        conn.execute(statement)
    conn.execute("delete from _sqlite_migrations where name = ?", (name,))
    conn.commit()
    conn.close()


# What m004_attempts made (issue 31): the attempt columns and their index.
M004_MADE = (
    "drop index idx_exchanges_attempt_of",
    "alter table exchanges drop column attempt_of",
    "alter table exchanges drop column attempt",
)
# What m005_trace_context made: the trace columns and their index; exchange_view, which names them, goes too and
# comes back as a stub.
M005_MADE = (
    "drop view exchange_view",
    "drop index idx_exchanges_trace_id",
    *(f"alter table exchanges drop column {c}" for c in ("trace_id", "span_id", "parent_span_id")),
    "create view exchange_view as select id from exchanges",
)
# What m010_route_and_token_details made (issue 38): the route and token-detail columns and their indexes.
M010_MADE = (
    "drop index idx_exchanges_volume",
    "drop index idx_exchanges_route",
    *(f"alter table exchanges drop column {c}" for c in ("route", "cached_tokens", "reasoning_tokens")),
)
