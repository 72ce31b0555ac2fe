"""Body storage: every body reconstructs byte for byte, a long agent session costs a few % of raw.

Agents resend the whole conversation each turn, so turn N's body is turn N-1's body with a few
thousand bytes spliced in near the end. A body is stored as a prefix/suffix delta against the
latest body of the same family (session) when they share most bytes; the middle is zlib-compressed.
Chains are capped in depth so a read never rebuilds more than `MAX_DEPTH` bodies, and identical
bodies are stored once (content-addressed by sha256).
"""

from __future__ import annotations

import hashlib
import sqlite3
import zlib
from collections import OrderedDict

MAX_DEPTH = 48
# Bytes of remembered bases kept in memory; beyond it the oldest families keep only their id and
# reload the base from the store when their next turn arrives (32 agents × 1 MB bodies stay bounded).
BASES_MEMORY_BUDGET = 16 * 1024 * 1024
MIN_SHARED_FRACTION = 0.5
_FAMILIES = 256


def common_prefix_len(a: bytes, b: bytes) -> int:
    """Length of the shared prefix, by binary search on slices (memcmp speed, not a Python loop)."""
    hi = min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def common_suffix_len(a: bytes, b: bytes, limit: int) -> int:
    hi = min(len(a), len(b), limit)
    if hi == 0:
        return 0
    if a[len(a) - hi :] == b[len(b) - hi :]:
        return hi
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid : len(a) - lo] == b[len(b) - mid : len(b) - lo]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _pack(data: bytes, level: int = 6) -> tuple[str, bytes]:
    if len(data) < 64:
        return "raw", data
    packed = zlib.compress(data, level)
    if len(packed) >= len(data):
        return "raw", data
    return "zlib", packed


def _unpack(encoding: str, data: bytes) -> bytes:
    return zlib.decompress(data) if encoding == "zlib" else bytes(data)


class BodyWriter:
    """Used by the single writer thread only; keeps the latest body of each family in memory."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        # family → (body id, bytes, depth, sha256): the base the next body of the family is a delta on
        self._latest: OrderedDict[str, tuple[int, bytes | None, int, str]] = OrderedDict()
        self._held = 0  # bytes of bases held in memory

    def forget(self) -> None:
        """After a rollback the remembered ids may not exist (or be reused by other bodies): start over."""
        self._latest.clear()
        self._held = 0

    def put(self, data: bytes, family: str | None = None, *, level: int = 6, when: float | None = None) -> int:
        """Store a body; `level` is zlib's (responses use 1: 10x cheaper, a few % larger); `when`, the
        exchange's start (unix time), is for backends that file bodies by day (SQLite doesn't)."""
        digest = hashlib.sha256(data).hexdigest()
        found = self._lookup(digest)
        if found is not None:
            body_id, depth, own = found
            if own:
                self._remember(family, body_id, data, depth, digest)
            return body_id
        base = self._latest.get(family) if family else None
        body_id, depth = self._insert(data, digest, base, level)
        self._remember(family, body_id, data, depth, digest)
        return body_id

    # The backend's part, overridden by PostgreSQL's (store/pg/bodies_writer.py).

    def _lookup(self, digest: str) -> tuple[int, int, bool] | None:
        """The stored body with these bytes: (id, depth, whether a delta may take it as its base)."""
        row = self.conn.execute("select id, depth from bodies where sha256 = ?", (digest,)).fetchone()
        return None if row is None else (int(row[0]), int(row[1]), True)

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

    def _insert(
        self, data: bytes, digest: str, base: tuple[int, bytes | None, int, str] | None, level: int = 6
    ) -> tuple[int, int]:
        if base is not None and base[2] < MAX_DEPTH and self._still_stored(base[0], base[3]):
            base_id, base_data, base_depth, _ = base
            if base_data is None:  # evicted from memory: rebuild it from the store
                base_data = self._rebuild(base_id)
            prefix = common_prefix_len(data, base_data)
            suffix = common_suffix_len(data, base_data, min(len(data), len(base_data)) - prefix)
            if prefix + suffix >= MIN_SHARED_FRACTION * len(data):
                packed = self._pack(data[prefix : len(data) - suffix], level)
                return self._add(digest, len(data), base_id, prefix, suffix, packed, base_depth + 1), base_depth + 1
        return self._add(digest, len(data), None, 0, 0, self._pack(data, level), 0), 0

    def _remember(self, family: str | None, body_id: int, data: bytes, depth: int, digest: str) -> None:
        if not family:
            return
        old = self._latest.get(family)
        if old is not None and old[1] is not None:
            self._held -= len(old[1])
        self._latest[family] = (body_id, data, depth, digest)
        self._held += len(data)
        self._latest.move_to_end(family)
        while len(self._latest) > _FAMILIES:
            _, (_, dropped, _, _) = self._latest.popitem(last=False)
            self._held -= len(dropped) if dropped is not None else 0
        if self._held > BASES_MEMORY_BUDGET:
            for key, (kept_id, kept, kept_depth, kept_digest) in self._latest.items():
                if self._held <= BASES_MEMORY_BUDGET or key == family:
                    break
                if kept is not None:
                    self._latest[key] = (kept_id, None, kept_depth, kept_digest)
                    self._held -= len(kept)


# Which exchange column holds each of an exchange's four bodies: `forwarded` and `client_response` are
# stored only when they differ, so a NULL id there means "the same as `request` / `response`".
BODY_KINDS = ("request", "forwarded", "response", "client_response")
FALLBACK_KIND = {"forwarded": "request", "client_response": "response"}
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
