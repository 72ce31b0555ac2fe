"""Llama 3.1 / 3.2 / 3.3: JSON tool calls, and `<|python_tag|>` calls.

- `llama3_json`: `{"name": "get_weather", "parameters": {"city": "Paris"}}` as the whole message
  (the templates' "Respond in the format {"name": function name, "parameters": …}"); `arguments` for
  `parameters` and several calls separated by `;` are read too (vLLM's llama3_json parser). No marker,
  so `anchored`: only at the start of content, and only when nothing but the calls follows.
- `llama3_python_tag`: `<|python_tag|>` then JSON calls as above, a built-in tool's
  `brave_search.call(query="…")` (the template's form for `builtin_tools`), or raw code for the
  code interpreter, read as llama.cpp does: a call of `python` with `{"code": …}`.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, RawCall, ToolFormat, dumps, json_value, skip_ws
from tapfix.proxy.toolcalls.formats.pythonic import bracket_end, check_names, literal, parse_python

PYTHON_TAG = "<|python_tag|>"
END_TOKENS = ("<|eom_id|>", "<|eot_id|>")
_CALL_KEYS = {"type", "name", "parameters", "arguments"}
_BUILTIN = re.compile(r"([A-Za-z_]\w*)\s*\.\s*call\s*\(")
_BUILTIN_PREFIX = re.compile(r"[A-Za-z_]\w*\s*(?:\.\s*(?:c(?:a(?:l(?:l\s*)?)?)?)?)?")  # `NAME.cal` still streaming


def _llama_call(value: Any) -> RawCall:
    """`{"name": N, "parameters": A}` (or `arguments`, optionally `"type": "function"`): nothing else,
    so an answer that merely holds a `name` isn't a call."""
    if not isinstance(value, dict) or not set(value) <= _CALL_KEYS or value.get("type", "function") != "function":
        raise ValueError("not a Llama 3 call")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("a call has a name")
    if "parameters" in value and "arguments" in value:
        raise ValueError("both parameters and arguments")
    args = value.get("parameters", value.get("arguments"))
    if not isinstance(args, dict | str):
        raise ValueError("arguments are an object")
    return name, args


def _json_calls(text: str, pos: int) -> tuple[list[RawCall], int]:
    """One JSON call or several separated by `;`, and where the last one ends."""
    calls = []
    while True:
        value, pos = json_value(text, pos)
        calls.append(_llama_call(value))
        after = skip_ws(text, pos)
        if not text.startswith(";", after) or not text.startswith("{", skip_ws(text, after + 1)):
            return calls, pos
        pos = after + 1


def _strip_end(text: str, pos: int) -> int:
    """Past an end-of-turn token the server left in the text."""
    after = skip_ws(text, pos)
    for token in END_TOKENS:
        if text.startswith(token, after):
            return after + len(token)
    return pos


class Llama3Json(ToolFormat):
    name = "llama3_json"
    family = "Llama 3.1, 3.2, 3.3 (JSON tool calls)"
    anchored = True

    def parse(self, text: str, at: int) -> Markup | None:
        if not text.startswith("{", at):
            return None
        calls, end = _json_calls(text, at)
        end = _strip_end(text, end)
        if text[end:].strip():
            return None  # a marker-less call is the whole message
        return Markup(at, end, calls)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        if len(calls) != 1:
            raise ValueError("the Llama 3 templates render one tool call per turn")
        name, args = calls[0]
        return '{"name": "' + name + '", "parameters": ' + dumps(args) + "}"


class Llama3PythonTag(ToolFormat):
    name = "llama3_python_tag"
    family = "Llama 3.1, 3.2, 3.3 (<|python_tag|>: built-in tools, code interpreter)"
    openers = (PYTHON_TAG,)

    def parse(self, text: str, at: int) -> Markup | None:
        pos = skip_ws(text, at + len(PYTHON_TAG))
        if pos >= len(text):
            return None
        if text.startswith("{", pos):
            calls, end = _json_calls(text, pos)
            return Markup(at, _strip_end(text, end), calls)
        m = _BUILTIN.match(text, pos)
        if m is not None:
            end = bracket_end(text, m.end() - 1)
            return Markup(at, _strip_end(text, end), [_builtin_call(text[pos:end])])
        if _BUILTIN_PREFIX.fullmatch(text, pos):
            return None  # may still become NAME.call(…)
        # Anything else is code for the code interpreter, up to the end of the turn.
        ends = [i for i in (text.find(t, pos) for t in END_TOKENS) if i >= 0]
        stop = min(ends) if ends else len(text)
        code = text[pos:stop]
        if not code.strip():
            return None
        return Markup(at, _strip_end(text, stop), [("python", {"code": code})], closed=bool(ends))

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        if len(calls) != 1:
            raise ValueError("the Llama 3 templates render one tool call per turn")
        name, args = calls[0]
        check_names(name, args)
        for value in args.values():  # the template writes name="value" with the value unescaped
            if not isinstance(value, str) or any(c in value for c in '"\\\n\r'):
                raise ValueError("the template carries only plain string values")
        return PYTHON_TAG + name + ".call(" + ", ".join(f'{k}="{v}"' for k, v in args.items()) + ")"


def _builtin_call(src: str) -> RawCall:
    tree = parse_python(src)
    assert isinstance(tree, ast.Expression)
    node = tree.body
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "call"
        and isinstance(node.func.value, ast.Name)
    ):
        raise ValueError("not a built-in tool call")
    if node.args or any(kw.arg is None for kw in node.keywords):
        raise ValueError("positional or ** arguments")
    return node.func.value.id, {kw.arg: literal(kw.value) for kw in node.keywords if kw.arg is not None}
