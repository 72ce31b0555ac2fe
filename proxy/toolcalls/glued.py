"""A second call glued into a call's arguments (issue 31 item 12).

A server that loses a call's boundary appends the next call to the arguments of the one before it: the
first call's complete JSON object, then the next call's name and arguments, in one argument string
(`{"path": "a.py"}grep{"pattern": "x"}`, or the next call as the model wrote it, `{"path": "a.py"}{"name":
"grep", "arguments": {"pattern": "x"}}`). The offered tool name marks where the second call starts, so
the text is split there, into calls the client runs one by one. Split only where the boundary is
unambiguous, never guessed:

- the first call's arguments are one JSON object that reads whole and strictly, and what follows it
  starts (after whitespace) with the next call;
- the next call is an offered tool's exact name followed by its arguments object, or an object holding
  only `name` (an offered tool), `arguments` or `parameters` (an object) and at most `type` and `id`,
  whose keys are not all properties of the first call's tool (else it may be that tool's arguments
  again: two readings, so no split);
- anything else after the first object (no name, another name, text between) is not split: the call
  stays "two argument objects in one call", the retryable error.

The arguments of a glued call are repaired as any call's are (`repair_arguments`), so a glued call cut by
`max_tokens` is the error, and a third call glued to the second is split in turn.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tapfix.proxy.toolcalls.jsonfix import is_debris
from tapfix.proxy.toolcalls.schema import ToolSchemas

_WRAPPER_KEYS = frozenset({"name", "arguments", "parameters", "type", "id"})
_DECODER = json.JSONDecoder()


@dataclass(slots=True)
class Glued:
    first: dict[str, Any]  # the first call's arguments
    first_text: str  # as written
    calls: list[tuple[str, str]] = field(default_factory=list)  # the glued calls: offered name, arguments text


def split_glued(text: str, name: str | None, schemas: ToolSchemas) -> Glued | None:
    """The first call's arguments and the calls glued after them, when offered names mark every boundary;
    None when the text isn't that (it may still be one call's arguments, or not split safely)."""
    if not schemas:
        return None
    start = _skip_ws(text, 0)
    try:
        first, end = _DECODER.raw_decode(text, start)
    except ValueError:
        return None
    if not isinstance(first, dict) or _skip_ws(text, end) >= len(text):
        return None
    out = Glued(first, text[start:end])
    own = set(schemas.properties(name) or ())
    pos = _skip_ws(text, end)
    while pos < len(text):
        if out.calls and is_debris(text[pos:]):
            break  # a closer or quote left after the last call
        read = _next_call(text, pos, schemas, own)
        if read is None:
            return None
        glued_name, args, pos = read
        out.calls.append((glued_name, args))
        pos = _skip_ws(text, pos)
    return out


def _next_call(text: str, pos: int, schemas: ToolSchemas, own: set[str]) -> tuple[str, str, int] | None:
    """The call glued at `pos`: (its name, its arguments text, where it ends); the last one runs to the end
    of the text, whether or not it reads whole (its repair says)."""
    if text.startswith("{", pos):
        return _wrapped(text, pos, schemas, own)
    named = [n for n in schemas.names if text.startswith(n, pos) and text.startswith("{", _skip_ws(text, pos + len(n)))]
    if len(named) != 1:
        return None
    args_at = _skip_ws(text, pos + len(named[0]))
    try:
        _, end = _DECODER.raw_decode(text, args_at)
    except ValueError:
        return named[0], text[args_at:], len(text)  # the last call, not whole: its repair decides
    if _skip_ws(text, end) >= len(text):
        return named[0], text[args_at:], len(text)
    return named[0], text[args_at:end], end


def _wrapped(text: str, pos: int, schemas: ToolSchemas, own: set[str]) -> tuple[str, str, int] | None:
    """`{"name": N, "arguments": {…}}` naming an offered tool, that can't be the first tool's arguments."""
    try:
        value, end = _DECODER.raw_decode(text, pos)
    except ValueError:
        return None
    if not isinstance(value, dict) or not set(value) <= _WRAPPER_KEYS or set(value) <= own:
        return None
    name = value.get("name")
    if not isinstance(name, str) or name not in schemas.schemas or ("arguments" in value) == ("parameters" in value):
        return None
    args = value.get("arguments", value.get("parameters"))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return name, json.dumps(args, ensure_ascii=False), end


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos
