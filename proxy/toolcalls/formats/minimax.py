"""MiniMax: M1's JSON lines, M2's `<minimax:tool_call>` invokes, M3's namespaced XML.

- M1: `<tool_calls>\n{"name": ..., "arguments": {...}}\n{...}\n</tool_calls>`, one JSON object per line.
  `<tool_calls>` also opens Jamba's and Hunyuan A13B's JSON list and Hunyuan Hy3's `<tool_call>` items:
  M1 claims it only when an object follows.
- M2: `<minimax:tool_call>\n<invoke name="N">\n<parameter name="k">v</parameter>\n</invoke>\n</minimax:tool_call>`;
  a string value is written as is, anything else as JSON. A value on lines of its own (`>\nv\n</parameter>`)
  loses those two newlines (vLLM's minimax_m2 parser trims them too).
- M3: every tag carries the namespace token `]<]minimax[>[`; a parameter is an element named after its key,
  an object's members are child elements and a list's entries `<item>` elements, down to text leaves
  (booleans as JSON, other scalars as written). A nested value goes on as the JSON text of that tree with
  string leaves; the schema types it later.
"""

from __future__ import annotations

import json
from typing import Any

from tapfix.proxy.toolcalls.formats.base import (
    Markup,
    RawCall,
    ToolFormat,
    XmlArgs,
    XmlCall,
    call_section,
    closed_by,
    dumps,
    frame,
    json_value,
    named_call,
    open_markup,
    quoted_attr,
    skip_ws,
)

M1_OPEN, M1_CLOSE = "<tool_calls>", "</tool_calls>"
M2_OPEN, M2_CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
M2_INVOKE = XmlCall('<invoke name="', "</invoke>", '<parameter name="', "</parameter>", quoted_attr, '">')
NS = "]<]minimax[>["
M3_OPEN, M3_CLOSE = NS + "<tool_call>", NS + "</tool_call>"
M3_INVOKE, M3_INVOKE_END = NS + '<invoke name="', NS + "</invoke>"


class MinimaxM1(ToolFormat):
    name = "minimax_m1"
    family = "MiniMax-M1"
    openers = (M1_OPEN,)

    def claims(self, text: str, at: int) -> bool:
        return text.startswith("{", skip_ws(text, at + len(M1_OPEN)))

    def parse(self, text: str, at: int) -> Markup | None:
        calls = []
        pos = skip_ws(text, at + len(M1_OPEN))
        while text.startswith("{", pos):
            value, pos = json_value(text, pos)
            calls.append(named_call(value))
            pos = skip_ws(text, pos)
        return closed_by(text, at, pos, M1_CLOSE, calls) if calls else None

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        lines = "".join(dumps({"name": n, "arguments": a}) + "\n" for n, a in calls)
        return f"{M1_OPEN}\n{lines}{M1_CLOSE}"


class MinimaxM2(ToolFormat):
    name = "minimax_m2"
    family = "MiniMax-M2"
    openers = (M2_OPEN,)

    def parse(self, text: str, at: int) -> Markup | None:
        return call_section(text, at, M2_OPEN, M2_CLOSE, M2_INVOKE.opener, M2_INVOKE.read)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        invokes = "".join(M2_INVOKE.write(n, a, _scalar, newline="\n") + "\n" for n, a in calls)
        return f"\n{M2_OPEN}\n{invokes}{M2_CLOSE}"


class MinimaxM3(ToolFormat):
    name = "minimax_m3"
    family = "MiniMax-M3"
    openers = (M3_OPEN,)

    def parse(self, text: str, at: int) -> Markup | None:
        return call_section(text, at, M3_OPEN, M3_CLOSE, M3_INVOKE, _m3_invoke)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        out = [M3_OPEN, "\n"]
        for name, args in calls:
            out.append(f'{NS}<invoke name="{name}">')
            for key, value in args.items():
                if value is not None:
                    out.append(f"{NS}<{key}>{_to_xml(value)}{NS}</{key}>")
            out.append(f"{NS}</invoke>\n")
        out.append(M3_CLOSE)
        return "".join(out)


def _m3_invoke(text: str, at: int, pos: int, calls: list[RawCall]) -> tuple[RawCall, int] | Markup | None:
    """One M3 invoke at `pos` (its parameters are elements named after their keys), as `XmlCall.read`."""
    name, pos = quoted_attr(text, pos + len(M3_INVOKE))
    args = XmlArgs()
    while True:
        pos = skip_ws(text, pos)
        if text.startswith(M3_INVOKE_END, pos):
            return (name, args), pos + len(M3_INVOKE_END)
        if not text.startswith(NS + "<", pos) or text.startswith(NS + "</", pos):
            return open_markup(at, text, calls) if _at_end(text, pos, M3_INVOKE_END) else None
        key, value, pos = _element(text, pos)
        args[key] = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _element(text: str, pos: int) -> tuple[str, Any, int]:
    """`NS<tag>` … `NS</tag>` at `pos`: its tag, its value (text, or a list / dict of child values), its end."""
    start = pos + len(NS) + 1
    close = text.find(">", start)
    if close < 0:
        raise ValueError("an M3 element is cut")
    tag = text[start:close]
    end_tag = f"{NS}</{tag}>"
    pos = close + 1
    inner = skip_ws(text, pos)
    if not text.startswith(NS + "<", inner) or text.startswith(end_tag, inner):
        end = text.find(end_tag, pos)
        if end < 0:
            raise ValueError("an M3 element is cut")
        return tag, text[pos:end], end + len(end_tag)
    children: list[tuple[str, Any]] = []
    while True:
        pos = skip_ws(text, pos)
        if text.startswith(end_tag, pos):
            break
        if not text.startswith(NS + "<", pos) or text.startswith(NS + "</", pos):
            raise ValueError("an M3 element is cut")
        child, value, pos = _element(text, pos)
        children.append((child, value))
    if children and all(c == "item" for c, _ in children):
        return tag, [v for _, v in children], pos + len(end_tag)
    return tag, dict(children), pos + len(end_tag)


def _to_xml(value: Any) -> str:
    if isinstance(value, (dict, list)) and not value:
        # `<k></k>` reads as an empty string: M3's markup can't carry an empty list or object.
        raise ValueError("an empty container has no M3 markup")
    if isinstance(value, dict):
        return "".join(f"{NS}<{k}>{_to_xml(v)}{NS}</{k}>" for k, v in value.items() if v is not None)
    if isinstance(value, list):
        return "".join(f"{NS}<item>{_to_xml(v)}{NS}</item>" for v in value)
    if isinstance(value, bool):
        return dumps(value)
    return str(value)


def _scalar(value: Any) -> str:
    return frame(value) if isinstance(value, str) else dumps(value)


def _at_end(text: str, pos: int, marker: str) -> bool:
    """The text stops at `pos` inside what may still become `marker` (a stream cut short)."""
    return marker.startswith(text[pos:])
