"""Who answered a stored exchange, and whose error its `error` column holds: the upstream's (flag
`upstream_error`: the engine's own error object), tapfix's (flag `tapfix_answered`: tapfix answered the
request itself, nothing from an upstream is in it), or neither (the connection's fate in words). Read by
`captures show` and the browser, so both say the same."""

from __future__ import annotations

from typing import Any

import orjson
from tapfix.proxy.exchange import TAPFIX_ANSWERED


def answered_by_tapfix(capture: dict[str, Any]) -> bool:
    """tapfix answered the request itself (flag `tapfix_answered`): no upstream answered it."""
    return TAPFIX_ANSWERED in (capture.get("flags") or ())


def destination(capture: dict[str, Any]) -> str:
    """Where the request went: the upstream's URL, or that tapfix answered it."""
    upstream = capture.get("upstream_url") or ""
    if answered_by_tapfix(capture):
        return f"{upstream} (unanswered; tapfix answered)" if upstream else "tapfix answered (not forwarded)"
    return upstream or "-"


def _error_object(capture: dict[str, Any], flag: str) -> dict[str, Any] | None:
    text = capture.get("error")
    if not text or flag not in (capture.get("flags") or ()) or text[:1] != "{":
        return None
    try:
        error = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return error if isinstance(error, dict) else None


def upstream_error(capture: dict[str, Any]) -> dict[str, Any] | None:
    """The engine's own error object when the `error` column holds one (flag `upstream_error`);
    otherwise the column is tapfix's or mitmproxy's words about the connection."""
    return _error_object(capture, "upstream_error")


def tapfix_error(capture: dict[str, Any]) -> dict[str, Any] | None:
    """The error object tapfix answered with itself (flag `tapfix_answered`), in the request's
    surface's shape, as the client got it."""
    return _error_object(capture, TAPFIX_ANSWERED)
