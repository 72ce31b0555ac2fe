"""SQLite's side of `captures copy` (store/copy.py): a file read as a source, or written as a target.

A store's schema version is named by SQLite's migrations on every backend (PostgreSQL's set maps each
of its migrations to one: store/pg/schema.py `REACHES`; this tapfix's is store/sqlite/database.py
`latest_version`)."""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from tapfix.proxy.store.copy import (
    BODY_COLUMNS,
    CHANGE_COLUMNS,
    CHOICE_COLUMNS,
    SESSION_COLUMNS,
    Capture,
    Key,
)
from tapfix.proxy.store.sqlite.bodies import BodyReader
from tapfix.proxy.store.sqlite.database import open_for_reading
from tapfix.proxy.store.sqlite.schema import migrations
from tapfix.proxy.store.sqlite.writer import SqliteBackend

CHUNK = 500  # ids per `in (...)`: far under SQLite's parameter limit


def sqlite_version(conn: sqlite3.Connection) -> str | None:
    """The last tapfix migration applied (None: no tapfix store yet)."""
    try:
        row = conn.execute(
            "select name from _sqlite_migrations where migration_set = ? order by rowid desc limit 1",
            (migrations.name,),
        ).fetchone()
    except sqlite3.OperationalError:  # no migrations table: an empty file
        return None
    return None if row is None else str(row[0])


def file_version(path: Path) -> str | None:
    """A SQLite store's version, read-only; None for no file or an empty one."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    conn = sqlite3.connect(f"file:{path.absolute()}?mode=ro", uri=True)
    try:
        return sqlite_version(conn)
    finally:
        conn.close()


class SqliteSource:
    """A SQLite store opened read-only (never migrated), its bodies rebuilt by one `BodyReader`."""

    def __init__(self, path: Path) -> None:
        self.conn = open_for_reading(path)
        self.conn.row_factory = None
        self._bodies = BodyReader(self.conn)

    def version(self) -> str | None:
        return sqlite_version(self.conn)

    def count(self) -> int:
        return int(self.conn.execute("select count(*) from exchanges").fetchone()[0])

    def keys(self, after: str | None, limit: int) -> list[Key]:
        rows = self.conn.execute(
            "select id, started_at from exchanges where id > ? order by id limit ?", (after or "", limit)
        )
        return [(str(r[0]), str(r[1])) for r in rows]

    def captures(self, keys: list[Key]) -> list[Capture]:
        ids = [key[0] for key in keys]
        found: dict[str, Capture] = {}
        for start in range(0, len(ids), CHUNK):
            part = ids[start : start + CHUNK]
            marks = ",".join("?" * len(part))
            cur = self.conn.execute(f"select * from exchanges where id in ({marks})", part)
            names = [d[0] for d in cur.description]
            for values in cur:
                row: dict[str, Any] = dict(zip(names, values, strict=True))
                found[row["id"]] = Capture(row, bodies={c: self._bodies.read(row[c]) for c in BODY_COLUMNS})
            for exchange_id, *change in self.conn.execute(
                f"select exchange_id, {', '.join(CHANGE_COLUMNS)} from changes where exchange_id in ({marks})"
                " order by exchange_id, seq",
                part,
            ):
                found[exchange_id].changes.append(tuple(change))
            for exchange_id, *choice in self.conn.execute(
                f"select exchange_id, {', '.join(CHOICE_COLUMNS)} from choices where exchange_id in ({marks})"
                ' order by exchange_id, "index"',
                part,
            ):
                found[exchange_id].choices.append(tuple(choice))
        return [found[i] for i in ids if i in found]

    def sessions(self, ids: list[str] | None = None) -> list[tuple[Any, ...]]:
        select = f"select {', '.join(SESSION_COLUMNS)} from sessions"
        if ids is None:
            return [tuple(r) for r in self.conn.execute(select + " order by id")]
        out: list[tuple[Any, ...]] = []
        for start in range(0, len(ids), CHUNK):
            part = ids[start : start + CHUNK]
            out += [tuple(r) for r in self.conn.execute(f"{select} where id in ({','.join('?' * len(part))})", part)]
        return out

    def close(self) -> None:
        self.conn.close()


class SqliteTarget:
    """A SQLite file written by its writer's backend (created and migrated when new)."""

    def __init__(self, path: Path) -> None:
        self.backend = SqliteBackend(path)

    def existing_ids(self) -> set[str]:
        return {str(r[0]) for r in self.backend.execute("select id from exchanges")}

    def prepare(self, captures: list[Capture]) -> None:
        pass

    def pipelined(self) -> AbstractContextManager[object]:
        return nullcontext()

    def close(self) -> None:
        self.backend.close()
