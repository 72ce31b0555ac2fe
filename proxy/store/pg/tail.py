"""`tapfix captures tail` on PostgreSQL: the exchanges committed after a cursor, every one exactly once,
however many writers commit in whatever order.

SQLite's tail follows the rowid, which is commit order there because one writer commits at a time
(store/sqlite/tail.py). PostgreSQL has no such order: a sequence number drawn at insert (`commit_seq`) is
not commit order across instances. Writer A draws 10, writer B draws 11 and commits first; a tail
that read 11 and moved its cursor past it would never show 10 once A commits. So the cursor is not a
sequence number alone but a transaction horizon:

- Each row records the transaction that wrote it (`commit_xid`, `pg_current_xact_id()`, a 64-bit
  xid that never wraps) and its order within it (`commit_seq`), both column defaults filled at
  insert (migration pg004): the writer sends nothing more.
- `pg_snapshot_xmin(pg_current_snapshot())` is the oldest transaction still running: every
  transaction below it has committed or rolled back, so the rows below it are final. A poll reads
  the rows with `commit_xid` from the cursor up to that horizon, ordered by (xid, seq), and moves
  the cursor to the horizon. A transaction at or above it is read by a later poll, once it is over:
  nothing is missed, nothing is shown twice.
- The order shown is transaction (batch) order, each batch in its insert order, which is the order
  the exchanges completed: a batch holds what completed while the one before was being written.

The price: a transaction that stays open anywhere in the cluster (the horizon is the cluster's, not
this database's) holds the tail back until it ends; the writer's batches last milliseconds, an idle
`psql` session with `begin` typed does not. Rows written before pg004 have no `commit_xid` and are
older than any cursor. A replaced row (the writer's delete then insert) gets a new xid: it comes
again, as on SQLite.
"""

from __future__ import annotations

import time
from typing import Any

from tapfix.proxy.store.pg.reader import PostgresReader, decode, filter_clauses
from tapfix.proxy.store.reader import CaptureFilter, with_parent

CHUNK = 500  # rows a query returns at most: a tail started far back prints in pieces
Cursor = tuple[int, int]  # (commit_xid, commit_seq): the last row shown, or (horizon, 0)


def _horizon(reader: PostgresReader) -> int:
    row = reader.rows("select pg_snapshot_xmin(pg_current_snapshot())::text::bigint as h")[0]
    return int(row["h"])


def latest(reader: PostgresReader) -> Cursor:
    """The cursor for "from now": what is committed already is behind it."""
    return (_horizon(reader), 0)


def after_capture(reader: PostgresReader, capture_id: str) -> Cursor:
    """The cursor for `--since ID`: the exchanges committed after that one (a prefix is enough)."""
    found = reader.resolve_id(capture_id)
    row = reader.rows(
        "select coalesce(commit_xid::text::bigint, 0) as x, coalesce(commit_seq, 0) as s from exchanges where id = ?",
        (found,),
    )[0]
    return (int(row["x"]), int(row["s"]))


def completed_within(reader: PostgresReader, age_s: float, now: float | None = None) -> Cursor:
    """The cursor for `--since AGE`: before the exchanges that completed in the last `age_s` seconds,
    walking back in commit order until one completed earlier."""
    cutoff = (time.time() if now is None else now) - age_s
    with reader.conn.cursor() as cur:
        cur.execute(
            "select commit_xid::text::bigint as x, commit_seq as s, ts + coalesce(duration_ms, 0) / 1000.0 as done"
            " from exchanges where commit_xid is not null order by commit_xid desc, commit_seq desc"
        )
        while (row := cur.fetchone()) is not None:
            if row["done"] < cutoff:
                return (int(row["x"]), int(row["s"]))
    return (0, 0)


class PostgresTail:
    """Polls for the rows committed after `cursor`, matching `filters` (an attempt goes with its
    client request, as in store/sqlite/tail.py's `Tail`); a `Follower` (store/backend.py)."""

    def __init__(self, reader: PostgresReader, cursor: Cursor, filters: CaptureFilter) -> None:
        self.reader = reader
        self.cursor = cursor
        self.filters = filters

    def poll(self) -> list[dict[str, Any]]:
        """The next rows, oldest commit first; each a `captures list --json` row."""
        high = _horizon(self.reader)
        out: list[dict[str, Any]] = []
        while self.cursor[0] < high:
            sql, args = self._query()
            rows = self.reader.rows(sql, [str(self.cursor[0]), self.cursor[1], str(high), *args])
            self.cursor = (int(rows[-1]["x"]), int(rows[-1]["s"])) if len(rows) == CHUNK else (high, 0)
            for row in rows:
                del row["x"], row["s"]
                out.append(decode(row))
        return out

    def close(self) -> None:
        self.reader.close()

    def _query(self) -> tuple[str, list[Any]]:
        sql = (
            f"select commit_xid::text::bigint as x, commit_seq as s, {self.reader.list_columns} from exchanges"
            " where (commit_xid, commit_seq) > (?::xid8, ?) and commit_xid < ?::xid8"
        )
        own, args = filter_clauses(self.filters, "exchanges")
        if own:
            of_parent, parent_args = filter_clauses(self.filters, "parent")
            sql += f" and {with_parent(own, of_parent)}"
            args += parent_args
        return sql + f" order by commit_xid, commit_seq limit {CHUNK}", args


def cursor(reader: PostgresReader, since: str | float | None) -> Cursor:
    """The cursor `--since` names: an age in seconds, a capture id (or prefix), or None for "from now"."""
    if since is None:
        return latest(reader)
    if isinstance(since, float):
        return completed_within(reader, since)
    return after_capture(reader, since)
