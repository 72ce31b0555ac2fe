"""Body storage: every body reconstructs byte for byte, a long agent session costs a few % of raw.

Agents resend the whole conversation each turn, so turn N's body is turn N-1's body with a few
thousand bytes spliced in near the end. A body is stored as a prefix/suffix delta against the
latest body of the same family (session) when they share most bytes. Chains are capped in depth so
a read never rebuilds more than `MAX_DEPTH` bodies, and identical bodies are stored once
(content-addressed by sha256).

`DeltaWriter` is that algorithm, the same on every backend; where a body goes and how its middle is
packed is the backend's (`BodyWriter` in store/sqlite/bodies.py: zlib middles; PostgreSQL's in
store/pg/body_writer.py: raw middles filed by day).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

MAX_DEPTH = 48
# Bytes of remembered bases kept in memory; beyond it the oldest families keep only their id and
# reload the base from the store when their next turn arrives (32 agents × 1 MB bodies stay bounded).
BASES_MEMORY_BUDGET = 16 * 1024 * 1024
MIN_SHARED_FRACTION = 0.5
_FAMILIES = 256

# Which exchange column holds each of an exchange's four bodies: `forwarded` and `client_response` are
# stored only when they differ, so a NULL id there means "the same as `request` / `response`".
BODY_KINDS = ("request", "forwarded", "response", "client_response")
FALLBACK_KIND = {"forwarded": "request", "client_response": "response"}


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


class DeltaWriter:
    """Used by the single writer thread only; keeps the latest body of each family in memory.
    A backend supplies the five methods below `put` (its SQL and its packing)."""

    def __init__(self) -> None:
        # family → (body id, bytes, depth, sha256): the base the next body of the family is a delta on
        self._latest: OrderedDict[str, tuple[int, bytes | None, int, str]] = OrderedDict()
        self._held = 0  # bytes of bases held in memory
        # This transaction's bodies, when the backend looked them up in one go (`prefetch`): digest of the bytes,
        # and what the store holds for a digest (None: not stored), bodies added since included.
        self._batch_digests: dict[bytes, str] = {}
        self._batch_found: dict[str, tuple[int, int, bool] | None] = {}

    def forget(self) -> None:
        """After a rollback the remembered ids may not exist (or be reused by other bodies): start over."""
        self._latest.clear()
        self._held = 0
        self.end_batch()

    batch_lookups = False  # the backend's `_lookup_many` looks a transaction's bodies up in one go

    def prefetch(self, bodies: list[bytes]) -> None:
        """The bodies a transaction will `put`, looked up together where the backend can (`_lookup_many`)."""
        if not self.batch_lookups or not bodies:
            return
        digests: dict[bytes, str] = {}
        for data in bodies:
            if data not in digests:  # each distinct body hashed once
                digests[data] = hashlib.sha256(data).hexdigest()
        self._batch_digests, self._batch_found = digests, self._lookup_many(sorted(set(digests.values())))

    def end_batch(self) -> None:
        """The transaction ended (committed or rolled back): what `prefetch` learned is no longer sure."""
        self._batch_digests, self._batch_found = {}, {}

    def put(self, data: bytes, family: str | None = None, *, level: int = 6, when: float | None = None) -> int:
        """Store a body; `level` is zlib's (responses use 1: 10x cheaper, a few % larger); `when`, the
        exchange's start (unix time), is for backends that file bodies by day (SQLite doesn't)."""
        digest = self._batch_digests.get(data) or hashlib.sha256(data).hexdigest()
        found = self._batch_found[digest] if digest in self._batch_found else self._lookup(digest)
        if found is not None:
            body_id, depth, own = found
            if own:
                self._remember(family, body_id, data, depth, digest)
            return body_id
        base = self._latest.get(family) if family else None
        body_id, depth = self._insert(data, digest, base, level)
        if digest in self._batch_found:
            self._batch_found[digest] = (body_id, depth, True)
        self._remember(family, body_id, data, depth, digest)
        return body_id

    # The backend's part.

    def _lookup_many(self, digests: list[str]) -> dict[str, tuple[int, int, bool] | None]:
        """`_lookup` of each digest (None: not stored), in as few statements as the backend can (`batch_lookups`)."""
        raise NotImplementedError

    def _lookup(self, digest: str) -> tuple[int, int, bool] | None:
        """The stored body with these bytes: (id, depth, whether a delta may take it as its base)."""
        raise NotImplementedError

    def _still_stored(self, body_id: int, digest: str) -> bool:
        """A purge may have removed a remembered base, and its id may hold another body since."""
        raise NotImplementedError

    def _rebuild(self, body_id: int) -> bytes:
        raise NotImplementedError

    def _pack(self, data: bytes, level: int) -> tuple[str, bytes]:
        """(encoding, bytes) of a delta's middle or a whole body."""
        raise NotImplementedError

    def _add(
        self, digest: str, size: int, base: int | None, prefix: int, suffix: int, packed: tuple[str, bytes], depth: int
    ) -> int:
        """Insert one body row; its id."""
        raise NotImplementedError

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
