"""Mistral: `[TOOL_CALLS]`, in the two forms its tokenizers have used.

- `mistral_v3` (tokenizers before v11: Mistral 7B v0.3, Nemo, Small 3.1):
  `[TOOL_CALLS][{"name": "get_weather", "arguments": {...}, "id": "a1B2c3D4e"}, ...]`, one JSON list.
- `mistral_v11` (v11 and later: Small 3.2, Devstral, Ministral 3, Magistral): one
  `[TOOL_CALLS]NAME[ARGS]{...}` per call, `[CALL_ID]id` between the name and `[ARGS]` in some
  templates (Small 3.2).

Both open with `[TOOL_CALLS]`; what follows tells them apart: a JSON list (or object) is v3, a name v11.
"""

from __future__ import annotations

import re
from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, RawCall, ToolFormat, dumps, json_value, named_call, skip_ws

OPEN, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_NAME = re.compile(r"[A-Za-z_][\w.\-]*")
_ID = re.compile(r"[A-Za-z0-9_\-]*")


class MistralV3(ToolFormat):
    name = "mistral_v3"
    family = "Mistral before tokenizer v11 (7B v0.3, Nemo, Small 3.1)"
    openers = (OPEN,)

    def claims(self, text: str, at: int) -> bool:
        return text[skip_ws(text, at + len(OPEN)) :][:1] in ("[", "{")

    def parse(self, text: str, at: int) -> Markup | None:
        value, end = json_value(text, at + len(OPEN))
        items = value if isinstance(value, list) else [value]
        calls = [named_call(item) for item in items]
        return Markup(at, end, calls) if calls else None

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        # The template requires 9-character alphanumeric ids and writes them after the arguments.
        items = [{"name": n, "arguments": a, "id": f"call{k:05d}"} for k, (n, a) in enumerate(calls)]
        return OPEN + dumps(items)


class MistralV11(ToolFormat):
    name = "mistral_v11"
    family = "Mistral tokenizer v11+ (Small 3.2, Devstral, Ministral 3, Magistral)"
    openers = (OPEN,)

    def claims(self, text: str, at: int) -> bool:
        return _NAME.match(text, skip_ws(text, at + len(OPEN))) is not None

    def parse(self, text: str, at: int) -> Markup | None:
        calls: list[RawCall] = []
        pos = end = at
        while text.startswith(OPEN, pos):
            pos = skip_ws(text, pos + len(OPEN))
            m = _NAME.match(text, pos)
            if m is None:
                break
            name, pos = m.group(), skip_ws(text, m.end())
            if text.startswith(CALL_ID, pos):
                ident = _ID.match(text, pos + len(CALL_ID))
                assert ident is not None
                pos = skip_ws(text, ident.end())
            if text.startswith(ARGS, pos):
                pos += len(ARGS)
            elif not text.startswith("{", pos):
                # Still streaming inside the name or the markers: not a call yet; otherwise not this format.
                if calls and pos >= len(text):
                    return Markup(at, end, calls, closed=False)
                return None
            args, pos = json_value(text, pos)
            if not isinstance(args, dict | str):
                raise ValueError("arguments are an object")
            calls.append((name, args))
            end = pos
            pos = skip_ws(text, pos)
        return Markup(at, end, calls) if calls else None

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "".join(f"{OPEN}{n}{ARGS}{dumps(a)}" for n, a in calls)
