"""The prompt units' digests (request/prefix_break.py `digest`), remembered by the units' serialization.

Why: an agent resends its whole prompt every turn, so the prefix tracker met every unit of a thread's earlier
turns again on each new one, and digested each again: its normal form serialized with the keys sorted, looked
at for `cache_control` and text parts, hashed. A unit's compact serialization (orjson, keys as given) costs a
fraction of that and decides its digest: the digest reads nothing but what that serialization writes (equal
bytes are equal values, key order and all, up to what orjson writes alike, such as NaN and null, which the
digest's own serialization writes alike too). So a unit seen before costs a serialization and a dict lookup,
and the digest is byte for byte the one `digest` gives (tests/unit/test_unit_digests.py holds it to that).

Bounded by the bytes of the serializations kept (the least recently used go first); one per writer thread.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import orjson
from tapfix.proxy.request.prefix_break import digest

MAX_BYTES = 16 * 1024 * 1024  # serializations kept: a few long agent threads' prompts
MAX_UNIT = 1024 * 1024  # a unit larger than this is digested each time, not kept


class UnitDigests:
    """`digest`, remembered. Not thread-safe: one per thread (the capture writer's)."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._seen: OrderedDict[bytes, bytes] = OrderedDict()
        self._bytes = 0

    def __call__(self, value: Any) -> bytes:
        try:
            key = orjson.dumps(value)
        except TypeError:  # what orjson can't write (integers beyond 64 bits, lone surrogates): `digest` decides
            return digest(value)
        found = self._seen.get(key)
        if found is not None:
            self._seen.move_to_end(key)
            return found
        found = digest(value)
        if len(key) <= MAX_UNIT:
            self._seen[key] = found
            self._bytes += len(key)
            while self._bytes > self.max_bytes:
                dropped, _ = self._seen.popitem(last=False)
                self._bytes -= len(dropped)
        return found
