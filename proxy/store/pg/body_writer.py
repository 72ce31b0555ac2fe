"""The body writer on PostgreSQL: store/bodies.py's deltas, filed by day, deltaed only on this instance's own.

What differs from SQLite's `BodyWriter` (store/sqlite/bodies.py), and why (the layout is store/pg/bodies.py's):
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
- No round trip per body: ids come from the sequence in blocks (`ID_BLOCK`), so a body's insert is
  sent in the batch's pipeline and nothing is read back. What a look-up would have told is checked
  once per batch, before its commit (`verify`): every body the batch refers to (its new ones, their
  bases, the ones it took again by sha256 from memory) is stored under its id with its bytes. When
  one is not (another instance stored the same bytes this day, a purge removed a base before the
  batch took the retention lock), the batch is rolled back and written again the careful way, each
  body looked up (SQLite's path), as a lock retry (`BodiesMoved`: SQLSTATE 40001).
"""

from __future__ import annotations

import datetime
import hashlib
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

import psycopg
from tapfix.proxy.store.bodies import MAX_DEPTH, MIN_SHARED_FRACTION, DeltaWriter, common_prefix_len, common_suffix_len
from tapfix.proxy.store.pg.schema import RETENTION_LOCK

if TYPE_CHECKING:
    from tapfix.proxy.store.sql_executor import Executes

OWN_IDS = 65536  # bodies this writer inserted, remembered by id: far more than the 256 families' bases
ID_BLOCK = 512  # body ids taken from the sequence at once (a few batches' worth)
KNOWN = 4096  # (day, sha256) → (id, depth) of bodies stored lately: the same bytes again cost no look-up
_INSERT = (
    "insert into bodies (id, sha256, size, base_id, prefix_len, suffix_len, encoding, data, depth, day)"
    " values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) on conflict (day, sha256) do nothing"
)
_STORED = (
    "select count(*) from unnest(?::bigint[], ?::date[], ?::text[]) t(id, day, sha256)"
    " join bodies b using (id, day, sha256)"
)


class BodiesMoved(psycopg.errors.SerializationFailure):
    """A body the batch refers to is not stored as the writer thought: write the batch again, carefully."""


def utc_day(when: float) -> datetime.date:
    return datetime.datetime.fromtimestamp(when, datetime.UTC).date()


class PostgresBodyWriter(DeltaWriter):
    """On the writer thread only; `conn` is the backend (qmark SQL, store/pg/writer.py)."""

    def __init__(self, conn: Executes) -> None:
        super().__init__()
        self.conn = conn
        self._day = utc_day(time.time())
        self._own: OrderedDict[int, None] = OrderedDict()
        self._known: OrderedDict[tuple[datetime.date, str], tuple[int, int]] = OrderedDict()
        self._ids: list[int] = []
        self._checks: set[tuple[int, datetime.date, str]] = set()
        self.careful = False  # this transaction looks every body up (after `BodiesMoved`)
        self._retention_locked = False  # this transaction holds the retention lock shared

    def forget(self) -> None:
        super().forget()
        self._own.clear()
        self._known.clear()
        self._checks.clear()
        self._retention_locked = False

    def put(self, data: bytes, family: str | None = None, *, level: int = 6, when: float | None = None) -> int:
        self._day = day = utc_day(time.time() if when is None else when)
        family = f"{day.isoformat()} {family}" if family else None
        base = self._latest.get(family) if family else None
        if self.careful or (base is not None and base[1] is None):  # evicted: rebuilt from the store
            return super().put(data, family, level=level)
        digest = hashlib.sha256(data).hexdigest()
        known = self._known.get((day, digest))
        if known is not None:  # the same bytes again: that row (checked before the commit)
            body_id, depth = known
        else:
            body_id, depth = self._insert_unread(data, digest, base)
        self._checks.add((body_id, day, digest))
        self._remember(family, body_id, data, depth, digest)  # only a body of our own becomes a base
        return body_id

    def verify(self) -> None:
        """Before the commit: every body the batch refers to is stored, else `BodiesMoved` (rolled back)."""
        checks, self._checks = self._checks, set()
        if not checks:
            return
        ids, days, digests = (list(column) for column in zip(*checks, strict=True))
        row = self.conn.execute(_STORED, (ids, days, digests)).fetchone()
        if row is None or int(row[0]) != len(checks):
            self.careful = True
            raise BodiesMoved(
                f"{len(checks) - int(row[0] if row else 0)} of the batch's {len(checks)} bodies are stored"
                " otherwise than this writer thought (another instance's same bytes, or a purge)"
            )

    def ended(self, *, committed: bool) -> None:
        """The transaction is over: the lock went with it; after a commit, bodies are written fast again."""
        self._retention_locked = False
        if committed:
            self.careful = False

    def _insert_unread(
        self, data: bytes, digest: str, base: tuple[int, bytes | None, int, str] | None
    ) -> tuple[int, int]:
        """Send the insert (a delta on `base` when it shares enough); nothing is read back."""
        day, body_id = self._day, self._next_id()
        base_id, prefix, suffix, middle, depth = None, 0, 0, data, 0
        if base is not None and base[1] is not None and base[2] < MAX_DEPTH:
            shared = common_prefix_len(data, base[1])
            tail = common_suffix_len(data, base[1], min(len(data), len(base[1])) - shared)
            if shared + tail >= MIN_SHARED_FRACTION * len(data):
                self._hold_retention_lock()
                base_id, prefix, suffix, depth = base[0], shared, tail, base[2] + 1
                middle = data[prefix : len(data) - suffix]
                self._checks.add((base[0], day, base[3]))
        self.conn.execute(_INSERT, (body_id, digest, len(data), base_id, prefix, suffix, "raw", middle, depth, day))
        self._own_add(body_id)
        self._know(digest, body_id, depth)
        return body_id, depth

    def _hold_retention_lock(self) -> None:
        """As `_still_stored`: shared, to the transaction's end, before the first base (no round trip:
        nothing is read; a purge holding it makes the batch's statements wait on the server)."""
        if not self._retention_locked:
            self.conn.execute("select pg_advisory_xact_lock_shared(?)", (RETENTION_LOCK,))
            self._retention_locked = True

    def _next_id(self) -> int:
        if not self._ids:
            rows = self.conn.execute(
                "select nextval('bodies_id_seq') from generate_series(1, ?)", (ID_BLOCK,)
            ).fetchall()
            self._ids = [int(r[0]) for r in reversed(rows)]
        return self._ids.pop()

    def _know(self, digest: str, body_id: int, depth: int) -> None:
        self._known[(self._day, digest)] = (body_id, depth)
        self._known.move_to_end((self._day, digest))
        while len(self._known) > KNOWN:
            self._known.popitem(last=False)

    def _lookup(self, digest: str) -> tuple[int, int, bool] | None:
        row = self.conn.execute(
            "select id, depth from bodies where day = ? and sha256 = ?", (self._day, digest)
        ).fetchone()
        if row is None:
            return None
        self._know(digest, int(row[0]), int(row[1]))
        return int(row[0]), int(row[1]), int(row[0]) in self._own

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
        self._own_add(body_id)
        self._know(digest, body_id, depth)
        return body_id

    def _own_add(self, body_id: int) -> None:
        self._own[body_id] = None
        while len(self._own) > OWN_IDS:
            self._own.popitem(last=False)

    def _remember(self, family: str | None, body_id: int, data: bytes, depth: int, digest: str) -> None:
        if body_id in self._own:  # another instance's body (a shared dedupe) is no base of ours
            super()._remember(family, body_id, data, depth, digest)
