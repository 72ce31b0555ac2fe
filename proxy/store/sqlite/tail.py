"""`tapfix captures tail`'s read side on SQLite: the exchanges the writer committed after a cursor, in commit order.

The cursor is the `exchanges` rowid. The writer stores each row with `insert or replace`
(store/sqlite/writer.py `put_exchange`), which gives it rowid max(rowid)+1 even when it replaces an older row of
the same id, and SQLite lets one writer commit at a time, whichever process it is: rowid order is
commit order. "What completed after the last line" is then `rowid > cursor`, a range read on the
table's own key, so a poll costs the new rows, not the store's size. Capture ids wouldn't do: they sort
by arrival, and a long stream that arrived first completes last. A writer that restarts continues
from max(rowid), so a tail across the restart prints nothing twice and misses nothing.

A poll reads max(rowid) first and only rows up to it, then moves the cursor there: rows a filter
skipped are never read again, and a row committed meanwhile has a larger rowid, read next time.
Retention deletes the oldest rows; if the newest go too (a purge of everything), max(rowid) falls
below the cursor, and the cursor follows it down so new rows, which reuse those rowids, are seen.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.reader import CaptureFilter, decode_row, with_parent
from tapfix.proxy.store.sqlite.database import open_when_ready, unusable
from tapfix.proxy.store.sqlite.reader import filter_clauses, has_attempts, list_columns, resolve_id

CHUNK = 500  # rows a query returns at most: a tail started far back prints in pieces


def latest(conn: sqlite3.Connection) -> int:
    """The cursor for "from now": the last committed row (0 for an empty store)."""
    row = conn.execute("select max(rowid) from exchanges").fetchone()
    return int(row[0] or 0)


def after_capture(conn: sqlite3.Connection, capture_id: str) -> int:
    """The cursor for `--since ID`: the exchanges committed after that one (a prefix is enough)."""
    found = resolve_id(conn, capture_id)
    return int(conn.execute("select rowid from exchanges where id = ?", (found,)).fetchone()[0])


def completed_within(conn: sqlite3.Connection, age_s: float, now: float | None = None) -> int:
    """The cursor for `--since AGE`: before the exchanges that completed in the last `age_s` seconds.

    Walks back from the newest row until one completed earlier (its arrival plus its duration), so the
    cost is the rows it will print."""
    cutoff = (time.time() if now is None else now) - age_s
    cursor = conn.execute("select rowid, ts + coalesce(duration_ms, 0) / 1000.0 from exchanges order by rowid desc")
    try:
        for rowid, completed in cursor:
            if completed < cutoff:
                return int(rowid)
        return 0
    finally:
        cursor.close()  # no read transaction left open: it would hold back the writer's checkpoints


class Tail:
    """Polls one read-only connection for the rows committed after `cursor`, matching `filters`.

    A regeneration attempt goes with its client request, as in `captures list`: it matches when its
    parent does (or, with its parent not in the store, when it does itself)."""

    def __init__(self, conn: sqlite3.Connection, cursor: int, filters: CaptureFilter) -> None:
        self.conn = conn
        self.cursor = cursor
        self.filters = filters

    def poll(self) -> list[dict[str, Any]]:
        """The next rows, oldest commit first; each a `captures list --json` row."""
        high = latest(self.conn)
        if high < self.cursor:  # the newest rows were deleted: their rowids will be used again
            self.cursor = high
        out: list[dict[str, Any]] = []
        while self.cursor < high:
            sql, args = self._query()
            rows = self.conn.execute(sql, [self.cursor, high, *args]).fetchall()
            out += [decode_row({k: row[k] for k in row.keys() if k != "seq"}) for row in rows]
            self.cursor = int(rows[-1]["seq"]) if len(rows) == CHUNK else high
        return out

    def _query(self) -> tuple[str, list[Any]]:
        conn = self.conn
        sql = f"select exchanges.rowid as seq, {list_columns(conn)} from exchanges"
        sql += " where exchanges.rowid > ? and exchanges.rowid <= ?"
        own, args = filter_clauses(conn, self.filters, "exchanges")
        if own and has_attempts(conn):
            of_parent, parent_args = filter_clauses(conn, self.filters, "parent")
            sql += f" and {with_parent(own, of_parent)}"
            args += parent_args
        elif own:
            sql += " and " + " and ".join(own)
        return sql + f" order by exchanges.rowid limit {CHUNK}", args


def identity(path: Path) -> tuple[int, int] | None:
    """Which file the path names (device, inode); None while there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class Following:
    """`captures tail` on a SQLite file, a `Follower` (store/parts.py): `Tail` on the store the path names.

    A store that isn't there yet (no file, or one a writer hasn't migrated yet) is waited for (`poll`
    is None meanwhile) and followed from its start: everything in it was committed after the tail
    began. So is a new store made where the followed one was (the path deleted or replaced). `since`
    (an age in seconds, a capture id or prefix; None for "from now") applies to the first store met.
    A database error is a `StoreError`, a `since` naming no capture `CaptureNotFound`."""

    def __init__(self, path: Path, since: str | float | None, filters: CaptureFilter) -> None:
        self.path = path
        self.filters = filters
        self.tail: Tail | None = None
        self.identity: tuple[int, int] | None = None
        self._since: str | float | None = since
        self._waited = False  # a store met later is new to this tail: followed from its start
        self._open()

    def _open(self) -> None:
        try:
            conn = open_when_ready(self.path)
        except (OSError, sqlite3.Error) as e:
            raise unusable(self.path, e, "read") from e
        if conn is None:
            self._waited = True
            return
        try:
            if self._since is not None:
                start = cursor(conn, self._since)
            else:
                start = 0 if self._waited else latest(conn)
        except sqlite3.Error as e:
            conn.close()
            raise StoreError(str(e)) from e
        except BaseException:
            conn.close()
            raise
        self._since, self._waited = None, True
        self.tail, self.identity = Tail(conn, start, self.filters), identity(self.path)

    def poll(self) -> list[dict[str, Any]] | None:
        if self.tail is None:
            self._open()
            if self.tail is None:
                return None
        try:
            rows = self.tail.poll()
        except sqlite3.Error as e:
            raise StoreError(str(e)) from e
        if identity(self.path) != self.identity:  # deleted, or replaced by a new store: follow the new one
            self.close()
        return rows

    def close(self) -> None:
        if self.tail is not None:
            self.tail.conn.close()
            self.tail = None


def cursor(conn: sqlite3.Connection, since: str | float) -> int:
    """The cursor `--since` names: an age in seconds, or a capture id (or prefix)."""
    if isinstance(since, float):
        return completed_within(conn, since)
    return after_capture(conn, since)
