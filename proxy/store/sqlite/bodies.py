"""SQLite's bodies: the delta writer's rows (middles zlib-compressed) and the reader that rebuilds them.

The delta algorithm is store/bodies.py's `DeltaWriter`; here is where SQLite keeps a body (one
`bodies` table, ids by rowid) and how a chain is read back (`BodyReader`, `read_body`), which the
readers, the search index and the `tapfix_body()` SQL functions share.
"""

from __future__ import annotations

import sqlite3
import zlib
from collections import OrderedDict

from tapfix.proxy.store.bodies import MAX_DEPTH, DeltaWriter


def _pack(data: bytes, level: int = 6) -> tuple[str, bytes]:
    if len(data) < 64:
        return "raw", data
    packed = zlib.compress(data, level)
    if len(packed) >= len(data):
        return "raw", data
    return "zlib", packed


def _unpack(encoding: str, data: bytes) -> bytes:
    return zlib.decompress(data) if encoding == "zlib" else bytes(data)


LOOKUP_BATCH = 500  # digests per statement (SQLite allows 32,766 variables; a batch has a few per exchange)


class BodyWriter(DeltaWriter):
    """SQLite's `DeltaWriter`: on the writer's connection, inside its transaction."""

    batch_lookups = True

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__()
        self.conn = conn

    def _lookup(self, digest: str) -> tuple[int, int, bool] | None:
        """The stored body with these bytes: (id, depth, whether a delta may take it as its base)."""
        row = self.conn.execute("select id, depth from bodies where sha256 = ?", (digest,)).fetchone()
        return None if row is None else (int(row[0]), int(row[1]), True)

    def _lookup_many(self, digests: list[str]) -> dict[str, tuple[int, int, bool] | None]:
        """One statement for a batch's bodies where there was one per body (issue 34: the writer's statements, each
        a GIL hand-over besides the work). Sound for the transaction: it holds the write lock (`begin immediate`),
        so no other process adds or purges bodies meanwhile."""
        known: dict[str, tuple[int, int, bool] | None] = dict.fromkeys(digests)
        for at in range(0, len(digests), LOOKUP_BATCH):
            part = digests[at : at + LOOKUP_BATCH]
            marks = ", ".join("?" * len(part))
            for digest, body_id, depth in self.conn.execute(
                f"select sha256, id, depth from bodies where sha256 in ({marks})", part
            ).fetchall():
                known[digest] = (int(body_id), int(depth), True)
        return known

    def _still_stored(self, body_id: int, digest: str) -> bool:
        """A purge (retention, `tapfix captures purge`) may have removed the base, and SQLite may have
        given its id to another body since: check the id still holds the same bytes."""
        row = self.conn.execute("select sha256 from bodies where id = ?", (body_id,)).fetchone()
        return row is not None and row[0] == digest

    def _rebuild(self, body_id: int) -> bytes:
        return read_body(self.conn, body_id) or b""

    def _pack(self, data: bytes, level: int) -> tuple[str, bytes]:
        return _pack(data, level)

    def _add(
        self, digest: str, size: int, base: int | None, prefix: int, suffix: int, packed: tuple[str, bytes], depth: int
    ) -> int:
        cur = self.conn.execute(
            "insert into bodies (sha256, size, base_id, prefix_len, suffix_len, encoding, data, depth)"
            " values (?, ?, ?, ?, ?, ?, ?, ?)",
            (digest, size, base, prefix, suffix, packed[0], packed[1], depth),
        )
        return int(cur.lastrowid or 0)


# What a `BodyReader` keeps per connection: inflated delta middles and roots (the zlib part of a read).
DECODED_MEMORY_BUDGET = 32 * 1024 * 1024
DECODED_MAX_BODIES = 4096  # a page of 100 turns of six interleaved sessions touches ~300 chain steps
# ... and the last bodies read, whole: where the next turn of each of a few interleaved sessions starts.
WHOLE_BODIES, WHOLE_MEMORY_BUDGET = 8, 16 * 1024 * 1024
_CHAIN_ROW = "select base_id, prefix_len, suffix_len, encoding, data, size, sha256 from bodies where id = ?"


class BodyReader:
    """Rebuilds bodies on one connection, remembering what was costly: inflated pieces, the last bodies.

    Why: a page of turns (Datasette's 100 rows newest first, the browser's session view and the
    search indexer oldest first) reads bodies that share delta chains. A rebuild holds the body as
    views and copies once; inflating each step's middle (zlib) is what remains costly, so middles
    and roots are kept, least recently used out first, within `max_bytes` and `max_bodies`. The
    last few bodies read are kept whole: the next turns of sessions read oldest first (interleaved,
    as agents write them side by side) start there. A remembered piece is used only while the store
    still holds the same body under its id (sha256): a purge may free an id for a new body.
    Not thread-safe: one reader per connection, like the connection itself.
    """

    def __init__(
        self, conn: sqlite3.Connection, *, max_bytes: int = DECODED_MEMORY_BUDGET, max_bodies: int = DECODED_MAX_BODIES
    ) -> None:
        self.conn = conn
        self.max_bytes, self.max_bodies = max_bytes, max_bodies
        self._inflated: OrderedDict[int, tuple[str, bytes]] = OrderedDict()  # id → (sha256, middle)
        self._held = 0
        self._whole: OrderedDict[int, tuple[str, bytes]] = OrderedDict()  # id → (sha256, the body)
        self._whole_held = 0

    def read(self, body_id: int | None) -> bytes | None:
        """The body's exact bytes; `LookupError` / `ValueError` for a damaged store, as `read_body`."""
        if body_id is None:
            return None
        chain = []
        start = b""
        next_id: int | None = body_id
        while next_id is not None:
            row = self.conn.execute(_CHAIN_ROW, (next_id,)).fetchone()
            if row is None:
                raise LookupError(f"body {next_id} is missing from the store")
            whole = self._whole.get(next_id)
            if whole is not None and whole[0] == row[6]:
                self._whole.move_to_end(next_id)
                start = whole[1]
                break
            chain.append((next_id, row))
            next_id = row[0]
            if len(chain) > MAX_DEPTH + 1:  # a damaged store (a cycle) must fail, not loop forever
                raise ValueError(f"body {body_id}: delta chain longer than {MAX_DEPTH + 1} (damaged store)")
        if not chain:
            return start
        pieces = [memoryview(start)] if start else []
        length = len(start)
        for own_id, (base_id, prefix, suffix, encoding, packed, size, digest) in reversed(chain):
            middle = self._middle(own_id, digest, encoding, packed)
            if base_id is None:
                pieces, length = [memoryview(middle)], len(middle)
            else:
                head = min(prefix, length)
                tail = max(0, min(suffix, length - head))  # never overlapping the head
                pieces = [*_head(pieces, length, head), memoryview(middle), *_tail(pieces, tail)]
                length = head + len(middle) + tail
            if length != size:
                raise ValueError(f"body rebuilt to {length} bytes, expected {size}")
        one = pieces[0].obj if len(pieces) == 1 else None
        data = one if isinstance(one, bytes) and len(one) == length else b"".join(pieces)
        self._keep_whole(body_id, chain[0][1][6], data)
        return data

    def _keep_whole(self, body_id: int, digest: str, data: bytes) -> None:
        if self.max_bodies <= 0 or len(data) > WHOLE_MEMORY_BUDGET:
            return
        old = self._whole.pop(body_id, None)  # read again, or the id now holds another body
        self._whole_held += len(data) - (len(old[1]) if old is not None else 0)
        self._whole[body_id] = (digest, data)
        while self._whole_held > WHOLE_MEMORY_BUDGET or len(self._whole) > WHOLE_BODIES:
            _, (_, dropped) = self._whole.popitem(last=False)
            self._whole_held -= len(dropped)

    def _middle(self, body_id: int, digest: str, encoding: str, packed: bytes) -> bytes:
        kept = self._inflated.get(body_id)
        if kept is not None and kept[0] == digest:
            self._inflated.move_to_end(body_id)
            return kept[1]
        middle = _unpack(encoding, packed)
        if encoding == "raw" or self.max_bodies <= 0 or len(middle) > self.max_bytes:
            return middle
        old = self._inflated.pop(body_id, None)  # a purge gave the id to another body
        self._held -= len(old[1]) if old is not None else 0
        self._inflated[body_id] = (digest, middle)
        self._held += len(middle)
        while self._held > self.max_bytes or len(self._inflated) > self.max_bodies:
            _, (_, dropped) = self._inflated.popitem(last=False)
            self._held -= len(dropped)
        return middle


def _head(pieces: list[memoryview], length: int, n: int) -> list[memoryview]:
    """The first `n` of a body's `length` bytes, held as pieces: views, no copy (a rebuild copies once,
    at the end). Cut from the end: a turn keeps nearly all of its base, so few pieces are looked at."""
    drop = length - n
    k = len(pieces)
    while k > 0 and drop >= len(pieces[k - 1]):
        k -= 1
        drop -= len(pieces[k])
    out = pieces[:k]
    if k and drop > 0:
        out[-1] = out[-1][: len(out[-1]) - drop]
    return out


def _tail(pieces: list[memoryview], n: int) -> list[memoryview]:
    """The last `n` bytes, as views."""
    out = []
    for piece in reversed(pieces):
        if n <= 0:
            break
        out.append(piece if len(piece) <= n else piece[len(piece) - n :])
        n -= len(out[-1])
    out.reverse()
    return out


def read_body(conn: sqlite3.Connection, body_id: int | None) -> bytes | None:
    """Rebuild a body from its delta chain (one read, nothing kept: see `BodyReader` for many)."""
    return BodyReader(conn, max_bodies=0).read(body_id)
