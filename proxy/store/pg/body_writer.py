"""The body writer on PostgreSQL: store/bodies.py's deltas, filed by day, deltaed only on this instance's own.

What differs from SQLite's `BodyWriter`, and why (the layout is store/pg/bodies.py's):
- Middles are raw (`tapfix_body()` rebuilds in PL/pgSQL, which can't inflate); TOAST compresses
  what is large.
- Every body carries its exchange's UTC `day`. The family a body deltas against is keyed by day too,
  so a session's first body of a new day is stored whole: a delta never crosses a partition, and
  dropping a day leaves no delta without its base.
- Identical bodies are stored once per day, `on conflict (day, sha256)`: two instances writing the
  same bytes at once both end up with the one row.
- A delta's base is always a body this writer inserted itself (remembered by id): another instance's
  body, even when a dedupe finds it, is never taken as a base, so no instance waits on, or depends
  on the retention of, another's rows.
- Before it takes a base it holds the retention lock shared (see `_still_stored`), so a purge never
  deletes a base under a delta being written.
"""

from __future__ import annotations

import datetime
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from tapfix.proxy.store.bodies import BodyWriter
from tapfix.proxy.store.pg.schema import RETENTION_LOCK

if TYPE_CHECKING:
    from tapfix.proxy.store.sql_executor import Executes

OWN_IDS = 65536  # bodies this writer inserted, remembered by id: far more than the 256 families' bases


def utc_day(when: float) -> datetime.date:
    return datetime.datetime.fromtimestamp(when, datetime.UTC).date()


class PostgresBodyWriter(BodyWriter):
    """On the writer thread only; `conn` is the backend (qmark SQL, store/pg/writer.py)."""

    def __init__(self, conn: Executes) -> None:
        super().__init__(conn)  # type: ignore[arg-type]  # any qmark executor, not only sqlite3's
        self._day = utc_day(time.time())
        self._own: OrderedDict[int, None] = OrderedDict()

    def forget(self) -> None:
        super().forget()
        self._own.clear()

    def put(self, data: bytes, family: str | None = None, *, level: int = 6, when: float | None = None) -> int:
        self._day = utc_day(time.time() if when is None else when)
        return super().put(data, f"{self._day.isoformat()} {family}" if family else None, level=level)

    def _lookup(self, digest: str) -> tuple[int, int, bool] | None:
        row = self.conn.execute(
            "select id, depth from bodies where day = ? and sha256 = ?", (self._day, digest)
        ).fetchone()
        return None if row is None else (int(row[0]), int(row[1]), int(row[0]) in self._own)

    def _still_stored(self, body_id: int, digest: str) -> bool:
        """First the retention lock, shared, to this transaction's end: a purge collecting this day's
        bodies has finished (the check sees what it deleted) or waits for this commit (and sees the
        delta about to be stored on the base), store/pg/retention.py."""
        self.conn.execute("select pg_advisory_xact_lock_shared(?)", (RETENTION_LOCK,))
        row = self.conn.execute("select sha256 from bodies where id = ? and day = ?", (body_id, self._day)).fetchone()
        return row is not None and row[0] == digest

    def _rebuild(self, body_id: int) -> bytes:
        row = self.conn.execute("select tapfix_body_rebuild(?, ?)", (body_id, self._day)).fetchone()
        return bytes(row[0]) if row is not None and row[0] is not None else b""

    def _pack(self, data: bytes, level: int) -> tuple[str, bytes]:
        return "raw", data

    def _add(
        self, digest: str, size: int, base: int | None, prefix: int, suffix: int, packed: tuple[str, bytes], depth: int
    ) -> int:
        row = self.conn.execute(
            "insert into bodies (sha256, size, base_id, prefix_len, suffix_len, encoding, data, depth, day)"
            " values (?, ?, ?, ?, ?, ?, ?, ?, ?) on conflict (day, sha256) do nothing returning id",
            (digest, size, base, prefix, suffix, packed[0], packed[1], depth, self._day),
        ).fetchone()
        if row is None:  # another instance stored the same bytes this day, just now: share its row
            found = self._lookup(digest)
            if found is None:  # pragma: no cover - the conflicting row is committed once we get here
                raise LookupError(f"body {digest} conflicted but is not stored")
            return found[0]
        body_id = int(row[0])
        self._own[body_id] = None
        while len(self._own) > OWN_IDS:
            self._own.popitem(last=False)
        return body_id

    def _remember(self, family: str | None, body_id: int, data: bytes, depth: int, digest: str) -> None:
        if body_id in self._own:  # another instance's body (a shared dedupe) is no base of ours
            super()._remember(family, body_id, data, depth, digest)
