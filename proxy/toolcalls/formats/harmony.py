"""gpt-oss harmony: a call is a message addressed to the tool, in the commentary channel:
`<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>`.

The recipient may also sit in the header before the channel (`<|start|>assistant to=functions.NAME
<|channel|>commentary json<|message|>…<|call|>`, what the openai-gpt-oss-120b chat template renders; the
model's own output starts after the generation prompt `<|start|>assistant`, so at ` to=`). The
content type is `<|constrain|>json` or a bare `json`. One call per message; several calls are
consecutive messages. A message without a recipient (analysis, final) is not a call. Recipients outside
`functions.` (the built-in browser / python tools) keep their whole name, which no offered tool matches.
"""

from __future__ import annotations

import re
from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, RawCall, ToolFormat, dumps, json_value, skip_ws

START, CHANNEL, MESSAGE, CALL = "<|start|>", "<|channel|>", "<|message|>", "<|call|>"
_HEADER = re.compile(
    r"(?:<\|start\|>\s*assistant)?"
    r"(?:\s*to=(?P<to1>[^\s<]+))?"
    r"(?:\s*<\|channel\|>\s*(?P<channel>\w+))?"
    r"(?:\s*to=(?P<to2>[^\s<]+))?"
    r"\s*(?:<\|constrain\|>\s*)?(?P<type>[\w/+.-]+)?\s*" + re.escape(MESSAGE)
)


def _recipient_name(recipient: str) -> str:
    return recipient[len("functions.") :] if recipient.startswith("functions.") else recipient


class Harmony(ToolFormat):
    name = "harmony"
    family = "gpt-oss (harmony)"
    openers = (START + "assistant", CHANNEL, " to=functions.")

    def _call(self, text: str, pos: int) -> tuple[RawCall, int] | None:
        header = _HEADER.match(text, pos)
        if header is None:
            return None
        recipient = header.group("to1") or header.group("to2")
        if not recipient or header.group("to1") and header.group("to2"):
            return None
        args, end = json_value(text, header.end())
        end = skip_ws(text, end)
        if text.startswith(CALL, end):
            return (_recipient_name(recipient), args), end + len(CALL)
        if end >= len(text):
            return (_recipient_name(recipient), args), -1  # the call's end not seen yet
        raise ValueError("harmony call not ended by <|call|>")

    def parse(self, text: str, at: int) -> Markup | None:
        calls: list[RawCall] = []
        pos = end = at
        while pos < len(text):
            read = self._call(text, pos)
            if read is None:
                break
            calls.append(read[0])
            if read[1] < 0:
                return Markup(at, len(text), calls, closed=False)
            end = read[1]
            pos = skip_ws(text, end)
            if not text.startswith(START, pos):
                break
        return Markup(at, end, calls) if calls else None

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "".join(
            f"{START}assistant to=functions.{name}{CHANNEL}commentary json{MESSAGE}{dumps(args)}{CALL}"
            for name, args in calls
        )
