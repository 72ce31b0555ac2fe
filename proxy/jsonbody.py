"""Reading a body that should be a JSON object, without trusting it."""

from __future__ import annotations

from typing import Any

import orjson


def json_object(body: bytes) -> dict[str, Any] | None:
    """The body as a dict, or None when it is not JSON or not an object."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None
