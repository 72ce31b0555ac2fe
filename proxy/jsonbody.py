"""Reading a body that should be a JSON object, without trusting it."""

from __future__ import annotations

import json
import secrets
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import orjson


def json_object(body: bytes) -> dict[str, Any] | None:
    """The body as a dict, or None when it is not JSON or not an object.

    orjson first (fast); what it refuses but Python's json reads (a lone surrogate escape such as
    `\\ud800`, which orjson rejects) is read too: the SDKs on the other side use Python's json, so
    tapfix must see every event they will see, or a fragment it never judged reaches them."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            obj = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
    return obj if isinstance(obj, dict) else None


def canonical(value: Any) -> bytes:
    """`value` as JSON in one spacing and key order: two bodies that mean the same compare equal."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # integers beyond 64 bits
        return repr(value).encode()


def canonical_arguments(value: Any) -> bytes:
    """Tool-call arguments as `canonical` JSON, whether sent as a JSON string or an object (a string that isn't
    JSON: itself, stripped)."""
    if isinstance(value, str):
        text: str = value
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            return text.strip().encode(errors="surrogatepass")
    return canonical(value)


PARSED_KEY = "parsed_body"  # Exchange.extra: the request body as forwarded and its parse (`shared_parse`)
# Exchange.extra: the same pair, kept for the capture writer after the request side let go of PARSED_KEY
# (`parse_for_store`): its session and prefix-break trackers read the request from it instead of parsing it again.
STORE_PARSE_KEY = "parsed_for_store"
NotedParse = tuple[bytes, dict[str, Any] | None]  # what PARSED_KEY and STORE_PARSE_KEY hold: a body and its parse
# The largest body whose parse is kept for the writer. The kept parse lives while the exchange streams and waits in
# the writer's queue, at about 1.2x the body: kept for every body, bench/run's 32 paced streams with 1 MB bodies
# peaked ~25 MB higher (VmHWM, 3-4 runs each). The trackers' gain is on agent bodies of tens to hundreds of KB; a
# bigger one is parsed again by the writer, on its own thread (~0.5 ms for 1 MB), as before issue 34's cut.
STORE_PARSE_MAX = 512 * 1024


def note_parse(extra: MutableMapping[str, Any], body: bytes, parsed: dict[str, Any] | None) -> None:
    """Issue 34: `parsed` is the parse of `body`, the request body as it now goes upstream. An addon that changes
    the body notes the new pair (or drops the entry), so the next one reading it needn't parse it again."""
    _note(extra, (body, parsed))


def _note(extra: MutableMapping[str, Any], pair: NotedParse) -> None:
    """The pair for the request side, and for the writer when the body is at most STORE_PARSE_MAX (else an
    earlier body's pair kept for it goes too: it is of other bytes, and its memory is what the bound saves)."""
    extra[PARSED_KEY] = pair
    if len(pair[0]) <= STORE_PARSE_MAX:
        extra[STORE_PARSE_KEY] = pair
    else:
        extra.pop(STORE_PARSE_KEY, None)


def shared_parse(extra: MutableMapping[str, Any], body: bytes) -> dict[str, Any] | None:
    """`json_object(body)`, parsed once per request: the parse noted for these bytes, else parsed and noted. The
    parse is shared: read it, never change it (an addon that edits the body notes a new one)."""
    noted = extra.get(PARSED_KEY)
    if noted is not None and (noted[0] is body or noted[0] == body):
        found: dict[str, Any] | None = noted[1]
        return found
    parsed = json_object(body)
    _note(extra, (body, parsed))
    return parsed


def noted_parse(noted: NotedParse | None, body: bytes) -> dict[str, Any] | None:
    """The parse in `noted` (the pair kept under STORE_PARSE_KEY) when it is the parse of these bytes, else None
    (not parsed here). The bytes decide, so a body changed after its parse was noted is parsed again by the
    caller. Read-only, as `shared_parse`'s."""
    if noted is not None and (noted[0] is body or noted[0] == body):
        return noted[1]
    return None


class RepeatedMembers:
    """Parses request bodies whose big members come back byte for byte, request after request, once per
    member: an agent resends its whole tool list (tens of KB, thousands of small objects) and a Messages
    `system` on every turn. Parsing those again was most of a request's parse (issue 34: ~100 µs of a 32 KB
    agent body on the event loop, and a fresh tree of objects for the collector to walk each time).

    A member learnt from an earlier body (its compact serialization found in that body right after its key)
    is looked for in the next one; where it is found, the body is parsed with those bytes swapped for a marker
    string, and the marker's place, when it is the top-level member's, gets the value kept from before. Equal
    bytes parse to equal values, so the result equals `orjson.loads(body)`; anywhere the marker lands elsewhere,
    the body is parsed whole. The values handed out are shared between parses: read them, never change them
    (as every parse noted by `note_parse`). Not thread-safe: one per thread (the event loop's)."""

    def __init__(self, names: tuple[str, ...] = ("tools", "system"), keep: int = 4, min_bytes: int = 1024) -> None:
        self.names = names
        self.keep = keep
        self.min_bytes = min_bytes
        # A per-process nonce: no body can spell the marker without knowing it (it never leaves the process).
        self._marker = f"tapfix-repeated-member-{secrets.token_hex(12)}"
        self._marker_json = orjson.dumps(self._marker)
        self._known: list[_Learnt] = []  # the most recently used first
        self._misses = 0  # bodies parsed whole in a row where nothing could be learnt
        self._parsed_whole = 0

    def loads(self, body: bytes) -> Any:
        """`orjson.loads(body)`: the same value, or the same JSONDecodeError."""
        found: dict[str, tuple[int, _Learnt]] = {}
        for learnt in self._known:
            if learnt.name not in found and (at := learnt.find_in(body)) >= 0:
                found[learnt.name] = (at, learnt)
        if found:
            parsed = self._with_markers(body, sorted(found.values(), key=lambda f: f[0]))
            if parsed is not None:
                return parsed
        parsed = orjson.loads(body)
        self._parsed_whole += 1
        if isinstance(parsed, dict) and (self._misses < 8 or self._parsed_whole % 64 == 0):
            self._learn(body, parsed)
        return parsed

    def _with_markers(self, body: bytes, found: list[tuple[int, _Learnt]]) -> dict[str, Any] | None:
        """The body parsed with each found member's bytes swapped for the marker, each marker then replaced by
        the member's kept value; None when any marker is not where its member is (the body is parsed whole)."""
        pieces: list[bytes] = []
        pos = 0
        for at, learnt in found:
            if at < pos:  # overlapping finds: not two top-level members
                return None
            pieces += (body[pos : at + len(learnt.key)], self._marker_json)
            pos = at + len(learnt.key) + len(learnt.serialized)
        pieces.append(body[pos:])
        try:
            parsed = orjson.loads(b"".join(pieces))
        except orjson.JSONDecodeError:
            return None
        if not isinstance(parsed, dict) or any(parsed.get(learnt.name) != self._marker for _, learnt in found):
            return None
        for _, learnt in found:
            parsed[learnt.name] = learnt.value
            self._known.remove(learnt)
            self._known.insert(0, learnt)
        return parsed

    def _learn(self, body: bytes, parsed: dict[str, Any]) -> None:
        learnt_any = False
        for name in self.names:
            value = parsed.get(name)
            if not isinstance(value, (list, dict)) or any(k.value is value for k in self._known):
                continue
            try:
                serialized = orjson.dumps(value)
            except TypeError:  # integers beyond 64 bits
                continue
            if len(serialized) < self.min_bytes:
                continue
            learnt = _Learnt(name, orjson.dumps(name) + b":", serialized, value)
            if learnt.find_in(body) < 0:  # not compact as orjson writes it (spaces, escapes): not learnable
                continue
            self._known.insert(0, learnt)
            del self._known[self.keep :]
            learnt_any = True
        self._misses = 0 if learnt_any else self._misses + 1


@dataclass(frozen=True)
class _Learnt:
    name: str
    key: bytes  # `"tools":`
    serialized: bytes  # the value's compact serialization, as found in a body right after the key
    value: Any

    def find_in(self, body: bytes) -> int:
        """Where the key is followed by the serialization (the first of a few places the key is), else -1.
        The key is looked for, not the whole (`find` of a 20 KB needle costs ~60 µs, the key's ~2)."""
        at = body.find(self.key)
        for _ in range(4):
            if at < 0 or body.startswith(self.serialized, at + len(self.key)):
                return at
            at = body.find(self.key, at + 1)
        return -1
