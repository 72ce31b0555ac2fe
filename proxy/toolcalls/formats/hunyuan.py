"""Tencent Hunyuan: Hy3's `<tool_calls>` of `<tool_call>NAME<tool_sep>` with `<arg_key>` / `<arg_value>`
pairs, and A13B's JSON list inside its `<answer>`.

Hy3's shipping tokenizer suffixes every tag (`<tool_calls:opensource>`, `<arg_key:opensource>`, …), its
preview one doesn't (SGLang's hunyuan detector reads both): the suffix is taken from the opener. A value
is written as is when it is a string, as JSON otherwise.

A13B writes `<tool_calls>[{"name": ..., "arguments": {...}}]</tool_calls>`, exactly Jamba's list: it is
claimed here only inside A13B's `<answer>`; elsewhere formats/jamba.py reads it, with the same calls.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, ToolFormat, XmlArgs, dumps, open_markup, skip_ws
from tapfix.proxy.toolcalls.formats.jamba import inside_answer, json_list_calls

SUFFIX = ":opensource"
OPEN_BARE = "<tool_calls>"


class Hunyuan(ToolFormat):
    name = "hunyuan"
    family = "Tencent Hunyuan (Hy3, A13B)"
    openers = (f"<tool_calls{SUFFIX}>", OPEN_BARE)

    def claims(self, text: str, at: int) -> bool:
        if not text.startswith(OPEN_BARE, at):
            return True
        pos = skip_ws(text, at + len(OPEN_BARE))
        if text.startswith("[", pos):
            return inside_answer(text, at)
        return text.startswith("<tool_call>", pos)

    def parse(self, text: str, at: int) -> Markup | None:
        opener = next((o for o in self.openers if text.startswith(o, at)), None)
        if opener is None:
            return None
        if text.startswith("[", skip_ws(text, at + len(opener))):
            return json_list_calls(text, at, opener, "</" + opener[1:])
        return _hy3(text, at, opener[len("<tool_calls") : -1])

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        t = _Tags(SUFFIX)
        out = [t.calls_open, "\n"]
        for name, args in calls:
            out.append(f"{t.call_open}{name}{t.sep}\n")
            for key, value in args.items():
                text = value if isinstance(value, str) else dumps(value)
                out.append(f"{t.key_open}{key}{t.key_close}\n{t.value_open}{text}{t.value_close}\n")
            out.append(f"{t.call_close}\n")
        out.append(t.calls_close)
        return "".join(out)


class _Tags:
    def __init__(self, suffix: str) -> None:
        self.calls_open, self.calls_close = f"<tool_calls{suffix}>", f"</tool_calls{suffix}>"
        self.call_open, self.call_close = f"<tool_call{suffix}>", f"</tool_call{suffix}>"
        self.sep = f"<tool_sep{suffix}>"
        self.key_open, self.key_close = f"<arg_key{suffix}>", f"</arg_key{suffix}>"
        self.value_open, self.value_close = f"<arg_value{suffix}>", f"</arg_value{suffix}>"


def _hy3(text: str, at: int, suffix: str) -> Markup | None:
    t = _Tags(suffix)
    calls: list[tuple[str | None, Any]] = []
    pos = skip_ws(text, at + len(t.calls_open))
    while text.startswith(t.call_open, pos):
        pos += len(t.call_open)
        sep = text.find(t.sep, pos)
        if sep < 0:
            return open_markup(at, text, calls)
        name = text[pos:sep].strip()
        if not name or "<" in name or "\n" in name:
            return None
        args = XmlArgs()
        pos = skip_ws(text, sep + len(t.sep))
        while text.startswith(t.key_open, pos):
            key_end = text.find(t.key_close, pos)
            if key_end < 0:
                return open_markup(at, text, calls)
            key = text[pos + len(t.key_open) : key_end].strip()
            pos = skip_ws(text, key_end + len(t.key_close))
            if not text.startswith(t.value_open, pos):
                return open_markup(at, text, calls) if t.value_open.startswith(text[pos:]) else None
            value_end = text.find(t.value_close, pos)
            if value_end < 0:
                return open_markup(at, text, calls)
            args[key] = text[pos + len(t.value_open) : value_end]
            pos = skip_ws(text, value_end + len(t.value_close))
        if not text.startswith(t.call_close, pos):
            return open_markup(at, text, calls) if t.call_close.startswith(text[pos:]) else None
        calls.append((name, args))
        pos = skip_ws(text, pos + len(t.call_close))
    if not calls:
        return None
    if text.startswith(t.calls_close, pos):
        return Markup(at, pos + len(t.calls_close), calls)
    return open_markup(at, text, calls) if t.calls_close.startswith(text[pos:]) else None
