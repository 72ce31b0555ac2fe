"""GLM 4.5 / 4.6 and GLM 4.7: `<tool_call>NAME` then `<arg_key>k</arg_key><arg_value>v</arg_value>` pairs.

GLM 4.5 / 4.6 put each call on its own line and every tag on its own line
(`\\n<tool_call>NAME\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n</tool_call>`); GLM 4.7 writes the
same without the newlines (the GLM-4.6 and GLM-4.7-Flash chat templates, SGLang's glm4_moe / glm47
detectors). The opener is shared with hermes (JSON follows) and Qwen3-Coder XML (`<function=` follows):
GLM claims it only when a name follows, and the two versions by whether a newline follows the name.
A value is the text as written (a string value is not JSON-quoted), typed later by the tool's schema.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from tapfix.proxy.toolcalls.formats.base import Markup, RawCall, ToolFormat, XmlArgs, dumps, skip_ws

OPEN, CLOSE = "<tool_call>", "</tool_call>"
KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
_NAME = re.compile(r"[^\s<>{}\[\]\"'`]+")


def _name_at(text: str, at: int) -> re.Match[str] | None:
    return _NAME.match(text, skip_ws(text, at + len(OPEN)))


def _read_call(text: str, pos: int) -> tuple[RawCall | None, int, bool]:
    """One call from its `<tool_call>`: (call, where it ends, whether `</tool_call>` closed it)."""
    name = _name_at(text, pos)
    if name is None:
        raise ValueError("no GLM call name")
    args: dict[str, str] = {}
    pos = name.end()
    while True:
        pos = skip_ws(text, pos)
        if text.startswith(CLOSE, pos):
            return (name.group(), XmlArgs(args)), pos + len(CLOSE), True
        if pos >= len(text):
            return ((name.group(), XmlArgs(args)) if args else None), pos, False
        if not text.startswith(KEY_OPEN, pos):
            raise ValueError("not a GLM argument")
        key_end = text.find(KEY_CLOSE, pos)
        if key_end < 0:
            raise ValueError("argument key cut")
        key = text[pos + len(KEY_OPEN) : key_end].strip()
        pos = skip_ws(text, key_end + len(KEY_CLOSE))
        if not text.startswith(VALUE_OPEN, pos):
            raise ValueError("argument without a value")
        value_end = text.find(VALUE_CLOSE, pos)
        if value_end < 0:
            raise ValueError("argument value cut")
        args[key] = text[pos + len(VALUE_OPEN) : value_end]
        pos = value_end + len(VALUE_CLOSE)


class Glm45(ToolFormat):
    name = "glm45"
    family = "GLM 4.5, GLM 4.6, Poolside Laguna XS"
    aliases = ("poolside",)  # Laguna's templates render GLM's markup byte for byte (XS like 4.5, S like 4.7)
    openers = (OPEN,)
    newlines: ClassVar[bool] = True

    def claims(self, text: str, at: int) -> bool:
        name = _name_at(text, at)
        if name is None:
            return False
        after = name.end()
        if after >= len(text):
            return True  # can't tell the versions apart yet
        return text[after] in " \t\r\n" if self.newlines else text[after] == "<"

    def parse(self, text: str, at: int) -> Markup | None:
        calls: list[RawCall] = []
        pos = end = at
        while text.startswith(OPEN, pos) and _name_at(text, pos) is not None:
            call, pos, closed = _read_call(text, pos)
            if call is not None:
                calls.append(call)
            if not closed:
                if not calls:
                    raise ValueError("GLM call cut")
                return Markup(at, len(text), calls, closed=False)
            end = pos
            pos = skip_ws(text, pos)
        return Markup(at, end, calls) if calls else None

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        nl = "\n" if self.newlines else ""
        out = []
        for name, args in calls:
            out.append(f"{nl}{OPEN}{name}{nl}")
            for key, value in args.items():
                text = value if isinstance(value, str) else dumps(value)
                out.append(f"{KEY_OPEN}{key}{KEY_CLOSE}{nl}{VALUE_OPEN}{text}{VALUE_CLOSE}{nl}")
            out.append(CLOSE)
        return "".join(out)


class Glm47(Glm45):
    name = "glm47"
    family = "GLM 4.7, Poolside Laguna S"
    newlines = False
