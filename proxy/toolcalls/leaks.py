"""Tool calls that leaked into `content` as the model's raw syntax (no parser, or the parser gave up).

A leak is confirmed only when every call names an offered tool and its arguments parse: a JSON answer
that merely looks like a call stays content. The formats are the ones chat templates emit: hermes
`<tool_call>{json}</tool_call>`, Qwen3-Coder XML, Mistral `[TOOL_CALLS]`, Kimi section markers, and a
bare `{"name": ..., "arguments": ...}` as the whole message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tapfix.proxy.toolcalls.formats.base import XmlArgs
from tapfix.proxy.toolcalls.jsonfix import MISSING, loads_tolerant
from tapfix.proxy.toolcalls.schema import ToolSchemas

MARKERS = (
    "<tool_call>",
    "<function=",
    "[TOOL_CALLS]",
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
)
MARKER_RE = re.compile("|".join(re.escape(m) for m in MARKERS))
_MAX_MARKER = max(len(m) for m in MARKERS)
_JSON_HEADS = tuple(
    f'{fence}{bracket}{{"{key}":'
    for fence in ("", "```json", "```")
    for bracket in ("", "[")
    for key in ("name", "function", "arguments", "parameters")
)
_HEAD_NAME = re.compile(r'\{\s*"name"\s*:\s*"([^"\\]*)"')
_NAME = re.compile(r"\s*([A-Za-z_][\w\-.]*)")
_XML_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|\Z)", re.S)
_XML_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.S)
_KIMI_CALL = re.compile(
    r"<\|tool_call_begin\|>\s*(?:functions\.)?([\w\-.]+?)(?::\d+)?\s*<\|tool_call_argument_begin\|>(.*?)"
    r"(?:<\|tool_call_end\|>|\Z)",
    re.S,
)
_KIMI_END = "<|tool_calls_section_end|>"
_WHITESPACE_ONLY = re.compile(r"\s*")


@dataclass(slots=True)
class Leak:
    start: int  # where the leaked syntax starts in the text
    end: int  # where it ends (the rest is ordinary content)
    calls: list[tuple[str, Any]] = field(default_factory=list)  # (name, raw arguments) when confirmed
    names: list[str] = field(default_factory=list)  # names seen, confirmed or not

    @property
    def confirmed(self) -> bool:
        return bool(self.calls)


def hold_verdict(text: str, at_start: bool, schemas: ToolSchemas) -> str:
    """'leak' (hold to the end of the message), 'maybe' (hold a little longer) or 'no'."""
    if MARKER_RE.search(text):
        return "leak"
    if at_start:
        head = text.lstrip()
        if head[:1] in ("{", "[", "`"):
            compact = re.sub(r"\s+", "", head[:96])
            if compact.startswith(_JSON_HEADS):
                m = _HEAD_NAME.search(head[:200])
                if m and m.group(1) not in schemas.schemas:
                    return "no"
                return "leak"
            if len(head) < 96 and any(h.startswith(compact) for h in _JSON_HEADS):
                return "maybe"
    tail = text[-_MAX_MARKER:]
    if "<" in tail or "[" in tail:
        for marker in MARKERS:
            for k in range(min(len(marker) - 1, len(tail)), 0, -1):
                if tail.endswith(marker[:k]):
                    return "maybe"
    return "no"


def find_leak(text: str, schemas: ToolSchemas, at_start: bool) -> Leak | None:
    """The leaked region of `text`, with its calls when they check out."""
    m = MARKER_RE.search(text)
    if m is not None:
        start = m.start()
    elif at_start and text.lstrip()[:1] in ("{", "[", "`"):
        start = len(text) - len(text.lstrip())
    else:
        return None
    leak = Leak(start=start, end=len(text))
    try:
        calls, end = _parse_from(text, start, leak.names)
    except (ValueError, RecursionError):
        calls, end = [], len(text)
    if not calls or any(name not in schemas.schemas for name, _ in calls):
        if m is None and not calls:
            return None if not leak.names else leak
        return leak
    leak.calls = calls
    tail = text[end:]
    leak.end = len(text) if _WHITESPACE_ONLY.fullmatch(tail) else end
    return leak


def _parse_from(text: str, pos: int, names: list[str]) -> tuple[list[tuple[str, Any]], int]:
    calls: list[tuple[str, Any]] = []
    while True:
        pos = _skip_ws(text, pos)
        if pos >= len(text):
            return calls, pos
        if text.startswith("<tool_call>", pos):
            pos = _skip_ws(text, pos + len("<tool_call>"))
            if text.startswith("<function=", pos):
                pos = _xml(text, pos, calls, names)
            else:
                pos = _json_calls(text, pos, calls, names)
            pos = _skip_ws(text, pos)
            if text.startswith("</tool_call>", pos):
                pos += len("</tool_call>")
        elif text.startswith("<function=", pos):
            pos = _xml(text, pos, calls, names)
        elif text.startswith("[TOOL_CALLS]", pos):
            pos = _mistral(text, pos + len("[TOOL_CALLS]"), calls, names)
        elif text.startswith("<|tool_calls_section_begin|>", pos) or text.startswith("<|tool_call_begin|>", pos):
            pos = _kimi(text, pos, calls, names)
        elif text.startswith("```", pos):
            m = re.compile(r"```(?:json)?\s*").match(text, pos)
            assert m is not None
            pos = _json_calls(text, m.end(), calls, names)
            pos = _skip_ws(text, pos)
            if text.startswith("```", pos):
                pos += 3
        elif text[pos] in "{[":
            pos = _json_calls(text, pos, calls, names)
        else:
            return calls, pos
        if not calls:
            return calls, pos


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _json_calls(text: str, pos: int, calls: list[tuple[str, Any]], names: list[str]) -> int:
    parsed = loads_tolerant(text[pos:])
    if parsed.cut or parsed.bad or parsed.value is MISSING:
        if parsed.partial and isinstance(parsed.partial.get("name"), str):
            names.append(parsed.partial["name"])
        raise ValueError("not a call")
    items = parsed.value if isinstance(parsed.value, list) else [parsed.value]
    for item in items:
        if not isinstance(item, dict):
            raise ValueError("not a call")
        fn: dict[str, Any] = item["function"] if isinstance(item.get("function"), dict) else item
        name = fn.get("name")
        if not isinstance(name, str):
            raise ValueError("no name")
        names.append(name)
        args = fn.get("arguments", fn.get("parameters", MISSING))
        calls.append((name, {} if args is MISSING or args is None else args))
    return len(text) - len(parsed.rest)


def _xml(text: str, pos: int, calls: list[tuple[str, Any]], names: list[str]) -> int:
    m = _XML_FUNCTION.match(text, pos)
    if m is None:
        raise ValueError("not a function")
    name = m.group(1).strip()
    names.append(name)
    if not text.startswith("</function>", m.end() - len("</function>")):
        raise ValueError("function not closed")
    params: dict[str, str] = {}
    for p in _XML_PARAM.finditer(m.group(2)):
        value = p.group(2)
        # One newline each side is template framing, not payload (vllm#48753).
        if value.startswith("\n"):
            value = value[1:]
        if value.endswith("\n"):
            value = value[:-1]
        params[p.group(1).strip()] = value
    calls.append((name, XmlArgs(params)))
    return m.end()


def _mistral(text: str, pos: int, calls: list[tuple[str, Any]], names: list[str]) -> int:
    pos = _skip_ws(text, pos)
    if text.startswith("[", pos) and not text.startswith("[ARGS]", pos):
        return _json_calls(text, pos, calls, names)
    m = _NAME.match(text, pos)
    if m is None:
        raise ValueError("no name")
    name = m.group(1)
    names.append(name)
    pos = _skip_ws(text, m.end())
    if text.startswith("[ARGS]", pos):
        pos = _skip_ws(text, pos + len("[ARGS]"))
    if text.startswith("[CALL_ID]", pos):
        id_end = re.compile(r"\[CALL_ID\][\w\-]*").match(text, pos)
        pos = _skip_ws(text, id_end.end() if id_end else pos)
        if text.startswith("[ARGS]", pos):
            pos = _skip_ws(text, pos + len("[ARGS]"))
    parsed = loads_tolerant(text[pos:])
    if parsed.cut or parsed.bad or not isinstance(parsed.value, dict):
        raise ValueError("arguments do not parse")
    calls.append((name, parsed.value))
    return len(text) - len(parsed.rest)


def _kimi(text: str, pos: int, calls: list[tuple[str, Any]], names: list[str]) -> int:
    if text.startswith("<|tool_calls_section_begin|>", pos):
        pos += len("<|tool_calls_section_begin|>")
    while True:
        pos = _skip_ws(text, pos)
        m = _KIMI_CALL.match(text, pos)
        if m is None:
            break
        names.append(m.group(1))
        parsed = loads_tolerant(m.group(2))
        if parsed.cut or parsed.bad or not isinstance(parsed.value, dict):
            raise ValueError("arguments do not parse")
        calls.append((m.group(1), parsed.value))
        pos = m.end()
    pos = _skip_ws(text, pos)
    if text.startswith(_KIMI_END, pos):
        pos += len(_KIMI_END)
    return pos


def is_xml_args(args: Any) -> bool:
    return isinstance(args, XmlArgs)
