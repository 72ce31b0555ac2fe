"""Swiss AI Apertus: `<|tools_prefix|>[{"NAME": {…}}, …]<|tools_suffix|>`.

As Apertus-8B-Instruct.jinja renders it: a JSON list of one-member objects, each the tool's name
holding its arguments (an object, or the JSON text the client sent). Markup inside the model's
thought span (`<|inner_prefix|>…<|inner_suffix|>`) is thinking, not a call.
"""

from __future__ import annotations

import json
from typing import Any

from tapfix.proxy.toolcalls.formats.base import RawCall, dumps
from tapfix.proxy.toolcalls.formats.tagged import TaggedJson

OPEN, CLOSE = "<|tools_prefix|>", "<|tools_suffix|>"
THOUGHT = ("<|inner_prefix|>", "<|inner_suffix|>")


def _name_keyed(value: Any) -> list[RawCall]:
    calls: list[RawCall] = []
    for item in value if isinstance(value, list) else [value]:
        if not isinstance(item, dict) or len(item) != 1:
            raise ValueError("an Apertus call is {name: arguments}")
        ((name, args),) = item.items()
        if not name or not isinstance(args, dict | str):
            raise ValueError("arguments are an object or its JSON text")
        calls.append((name, args))
    return calls


class Apertus(TaggedJson):
    name = "apertus"
    family = "Swiss AI Apertus"

    def __init__(self) -> None:
        super().__init__(self.name, self.family, OPEN, CLOSE, reader=_name_keyed, thinking=THOUGHT)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        # the name as JSON with non-ASCII escaped, the arguments as they are
        return OPEN + "[" + ", ".join(f"{{{json.dumps(n)}: {dumps(a)}}}" for n, a in calls) + "]" + CLOSE
