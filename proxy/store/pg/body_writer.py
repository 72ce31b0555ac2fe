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
- One round trip per body, not three: the delta is made against the remembered base first, then a
  single statement checks that the base is still stored, inserts, and on a dedupe returns the row
  already there (`_PUT`). Only when it returns nothing (the base is gone, or another instance's
  same bytes committed while it ran) does the body take SQLite's path, look-up first.
"""

from __future__ import annotations

import datetime
import hashlib
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from tapfix.proxy.store.bodies import MAX_DEPTH, MIN_SHARED_FRACTION, BodyWriter, common_prefix_len, common_suffix_len

if TYPE_CHECKING:
    from tapfix.proxy.store.sql_executor import Executes

OWN_IDS = 65536  # bodies this writer inserted, remembered by id: far more than the 256 families' bases
_COLUMNS = "sha256, size, base_id, prefix_len, suffix_len, encoding, data, depth, day"
# Insert (when the base, if any, still holds its bytes), else the same bytes' row of the day: (id, depth, new).
_PUT = (
    "with new as (insert into bodies (" + _COLUMNS + ") select"
    " ?::text, ?::bigint, ?::bigint, ?::bigint, ?::bigint, ?::text, ?::bytea, ?::integer, ?::date {base}"
    " on conflict (day, sha256) do nothing returning id, depth)"
    " select id, depth, true from new union all"
    " select id, depth, false from bodies where day = ?::date and sha256 = ?::text and not exists (select from new)"
)
_PUT_WHOLE = _PUT.format(base="")
_PUT_DELTA = _PUT.format(base="where exists (select from bodies where id = ?::bigint and day = ?::date and sha256 = ?::text)")


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
        family = f"{self._day.isoformat()} {family}" if family else None
        digest = hashlib.sha256(data).hexdigest()
        base = self._latest.get(family) if family else None
        if base is not None and base[1] is None:  # evicted from memory: the look-up path rebuilds it
            return super().put(data, family, level=level)
        row = self._put(data, digest, base)
        if row is None:
            return super().put(data, family, level=level)
        body_id, depth, new = int(row[0]), int(row[1]), bool(row[2])
        if new:
            self._own_add(body_id)
        self._remember(family, body_id, data, depth, digest)  # only a body of our own becomes a base
        return body_id

    def _put(self, data: bytes, digest: str, base: tuple[int, bytes | None, int, str] | None) -> tuple | None:
        day = self._day
        if base is not None and base[1] is not None and base[2] < MAX_DEPTH:
            base_id, base_data, base_depth, base_digest = base
            prefix = common_prefix_len(data, base_data)
            suffix = common_suffix_len(data, base_data, min(len(data), len(base_data)) - prefix)
            if prefix + suffix >= MIN_SHARED_FRACTION * len(data):
                middle = data[prefix : len(data) - suffix]
                args = (digest, len(data), base_id, prefix, suffix, "raw", middle, base_depth + 1, day)
                return self.conn.execute(_PUT_DELTA, (*args, base_id, day, base_digest, day, digest)).fetchone()
        args = (digest, len(data), None, 0, 0, "raw", data, 0, day)
        return self.conn.execute(_PUT_WHOLE, (*args, day, digest)).fetchone()

    def _lookup(self, digest: str) -> tuple[int, int, bool] | None:
        row = self.conn.execute(
            "select id, depth from bodies where day = ? and sha256 = ?", (self._day, digest)
        ).fetchone()
        return None if row is None else (int(row[0]), int(row[1]), int(row[0]) in self._own)

    def _still_stored(self, body_id: int, digest: str) -> bool:
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
        self._own_add(body_id)
        return body_id

    def _own_add(self, body_id: int) -> None:
        self._own[body_id] = None
        while len(self._own) > OWN_IDS:
            self._own.popitem(last=False)

    def _remember(self, family: str | None, body_id: int, data: bytes, depth: int, digest: str) -> None:
        if body_id in self._own:  # another instance's body (a shared dedupe) is no base of ours
            super()._remember(family, body_id, data, depth, digest)
