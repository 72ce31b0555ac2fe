"""openPangu: `[unused11][{"name": N, "arguments": {…}}, …][unused12]`.

openPangu's tool prompt and the Pangu tool parsers (vLLM-Ascend, omni_npu) read a JSON list of calls
(or one call) between its reserved tokens `[unused11]` and `[unused12]`. Its thinking runs between
`[unused16]` and `[unused17]`; markup there is thinking, not a call.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, ToolFormat, dumps, inside, json_value, named_call, skip_ws

OPEN, CLOSE = "[unused11]", "[unused12]"
THINK_OPEN, THINK_CLOSE = "[unused16]", "[unused17]"
END_OF_TURN = "[unused10]"  # openPangu's end of turn: a token, never text


class Pangu(ToolFormat):
    name = "pangu"
    family = "openPangu"
    openers = (OPEN,)

    def claims(self, text: str, at: int) -> bool:
        return not inside(text, at, THINK_OPEN, THINK_CLOSE)

    def parse(self, text: str, at: int) -> Markup | None:
        value, pos = json_value(text, at + len(OPEN))
        calls = [named_call(item) for item in (value if isinstance(value, list) else [value])]
        pos = skip_ws(text, pos)
        if not text.startswith(CLOSE, pos):
            return Markup(at, len(text), calls, closed=False) if pos >= len(text) else None
        pos += len(CLOSE)
        return Markup(at, pos + len(END_OF_TURN) if text.startswith(END_OF_TURN, pos) else pos, calls)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return OPEN + dumps([{"name": n, "arguments": a} for n, a in calls]) + CLOSE
