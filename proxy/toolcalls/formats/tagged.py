"""The formats whose markup is JSON between two tags, declared as data.

Many families write their calls as JSON between an opening and a closing tag, either one block per
call (`<tag>{call}</tag><tag>{call}</tag>`) or one list of calls (`<tag>[{call}, …]</tag>`), and differ
only in their tags, what they call a call's arguments, how the template spaces the blocks, and sometimes
a span of their own whose markup is thinking or a token the template writes after the close. A module
declares such a format with `TaggedJson` and keeps only what is really its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tapfix.proxy.toolcalls.formats.base import (
    Markup,
    RawCall,
    ToolFormat,
    closed_by,
    dumps,
    inside,
    json_blocks,
    json_calls,
    json_value,
)

# How a format writes one call as JSON (its arguments under `arguments`, `parameters`, or the name as key).
CallJson = Callable[[str, dict[str, Any]], Any]


def arguments(name: str, args: dict[str, Any]) -> Any:
    return {"name": name, "arguments": args}


class TaggedJson(ToolFormat):
    """JSON calls between `opener` and `closer`.

    `block`: one JSON object per block, written as this template (`{opener}`, `{call}`, `{closer}`) and
    joined by `joiner`; None: one JSON value holding a list of calls (or one call) between the tags.
    `reader` reads the calls out of that value, `as_json` writes one; `thinking` is the family's own
    thought span (markup inside it is a decoy); `trailer` a token the template writes after the close."""

    def __init__(
        self,
        name: str,
        family: str,
        opener: str,
        closer: str,
        *,
        block: str | None = None,
        joiner: str = "",
        as_json: CallJson = arguments,
        reader: Callable[[Any], list[RawCall]] = json_calls,
        thinking: tuple[str, str] | None = None,
        trailer: str = "",
    ) -> None:
        self.name, self.family, self.openers = name, family, (opener,)
        self.opener, self.closer = opener, closer
        self.block, self.joiner, self.as_json, self.reader = block, joiner, as_json, reader
        self.thinking, self.trailer = thinking, trailer

    def claims(self, text: str, at: int) -> bool:
        return self.thinking is None or not inside(text, at, *self.thinking)

    def parse(self, text: str, at: int) -> Markup | None:
        if self.block is not None:
            return json_blocks(text, at, self.opener, self.closer)
        value, pos = json_value(text, at + len(self.opener))
        return closed_by(text, at, pos, self.closer, self.reader(value), self.trailer)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        if self.block is None:
            return self.opener + dumps([self.as_json(n, a) for n, a in calls]) + self.closer
        return self.joiner.join(
            self.block.format(opener=self.opener, call=dumps(self.as_json(n, a)), closer=self.closer) for n, a in calls
        )
