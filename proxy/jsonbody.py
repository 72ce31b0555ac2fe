"""Reading a body that should be a JSON object, without trusting it."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
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
