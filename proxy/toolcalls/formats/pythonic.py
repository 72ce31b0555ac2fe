"""Pythonic call lists: Llama 3.2 / Llama 4 / ToolACE `[get_weather(city="Paris"), other(x=1)]`,
Olmo 3 `<function_calls>\nget_weather(city='Paris')\nother(x=1)\n</function_calls>`, and LFM2
`<|tool_call_start|>[get_weather(city='Paris')]<|tool_call_end|>`.

The calls are Python expressions: read with `ast.parse` (never evaluated), arguments keyword-only,
values Python literals. Olmo 3's template and LFM2's (for mappings) write JSON's `true`/`false`/`null`
inside them, so those names read as the JSON values too. A bare list carries no marker: it is a call
only as the whole content (`anchored`), and Llama 4 may wrap it in `<|python_start|>…<|python_end|>`.
"""

from __future__ import annotations

import ast
import json
import keyword
from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, RawCall, ToolFormat, closed_by, dumps, named_call, skip_ws

PY_START, PY_END = "<|python_start|>", "<|python_end|>"
OLMO_OPEN, OLMO_CLOSE = "<function_calls>", "</function_calls>"
LFM_OPEN, LFM_CLOSE = "<|tool_call_start|>", "<|tool_call_end|>"

_JSON_NAMES = {"true": True, "false": False, "null": None}
_PAIRS = {"[": "]", "(": ")", "{": "}"}


def bracket_end(text: str, pos: int) -> int:
    """Where the bracketed Python expression opening at `pos` ends (just after its closer), skipping
    string literals; ValueError when it isn't closed in `text` (still streaming, or not Python)."""
    stack: list[str] = []
    k, n = pos, len(text)
    while k < n:
        c = text[k]
        if c in "'\"":
            quote = c * 3 if text.startswith(c * 3, k) else c
            k += len(quote)
            while k < n and not text.startswith(quote, k):
                k += 2 if text[k] == "\\" else 1
            if k >= n:
                break
            k += len(quote)
            continue
        if c in _PAIRS:
            stack.append(_PAIRS[c])
        elif c in ")]}":
            if not stack or stack.pop() != c:
                raise ValueError("unbalanced brackets")
            if not stack:
                return k + 1
        k += 1
    raise ValueError("expression not closed")


def literal(node: ast.expr) -> Any:
    """A Python (or JSON-ish) literal's value, read from the syntax tree: constants, lists, tuples,
    dicts with constant keys, signed numbers, and the JSON names `true`/`false`/`null`."""
    if isinstance(node, ast.Constant) and not isinstance(node.value, bytes | complex) and node.value is not ...:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = literal(node.operand)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("a sign on a non-number")
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.List | ast.Tuple):
        return [literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None:
                raise ValueError("** in a dict")
            k = literal(key)
            if not isinstance(k, str | int | float | bool) and k is not None:
                raise ValueError("a dict key is not a scalar")
            out[k if isinstance(k, str) else json.dumps(k)] = literal(value)
        return out
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    raise ValueError("not a literal")


def call_of(node: ast.expr) -> RawCall:
    """`name(k=v, …)` as a call; keyword arguments only (a positional one has no parameter name)."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError("not a call by name")
    if node.args or any(kw.arg is None for kw in node.keywords):
        raise ValueError("positional or ** arguments")
    return node.func.id, {kw.arg: literal(kw.value) for kw in node.keywords if kw.arg is not None}


def _escape_raw_controls(src: str) -> str:
    """Raw newlines/tabs inside string literals escaped (templates write values unescaped between
    quotes: LFM2's, Olmo 3's); they have one meaning there, so the reading keeps every character."""
    out: list[str] = []
    quote = ""
    k, n = 0, len(src)
    while k < n:
        c = src[k]
        if quote:
            if c == "\\" and k + 1 < n:
                out.append(src[k : k + 2])
                k += 2
                continue
            if src.startswith(quote, k):
                out.append(quote)
                k += len(quote)
                quote = ""
                continue
            if len(quote) == 1 and c in "\n\r\t":
                out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[c])
                k += 1
                continue
        elif c in "'\"":
            quote = c * 3 if src.startswith(c * 3, k) else c
            out.append(quote)
            k += len(quote)
            continue
        out.append(c)
        k += 1
    return "".join(out)


def parse_python(src: str, mode: str = "eval") -> ast.AST:
    try:
        return ast.parse(src, mode=mode)
    except SyntaxError:
        pass
    try:
        return ast.parse(_escape_raw_controls(src), mode=mode)
    except SyntaxError as err:
        raise ValueError("not Python") from err


def call_list(text: str, pos: int) -> tuple[list[RawCall], int]:
    """The bracketed list of calls at `pos` (`[a(x=1), b()]`) and where it ends."""
    if not text.startswith("[", pos):
        raise ValueError("not a list")
    end = bracket_end(text, pos)
    tree = parse_python(text[pos:end])
    assert isinstance(tree, ast.Expression)
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        raise ValueError("not a list of calls")
    return [call_of(e) for e in tree.body.elts], end


def py_literal(value: Any) -> str:
    """A value as a Python literal (strings double-quoted with JSON's escapes, which Python reads alike)."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if value is None:
        return "None"
    if isinstance(value, str | int | float):
        return dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(py_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{dumps(str(k))}: {py_literal(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"no Python literal for {type(value).__name__}")


def check_names(name: str, args: dict[str, Any]) -> None:
    """ValueError when a Python call can't carry the function or a parameter name (`if=`, `a-b=`)."""
    for word in (name, *args):
        if not word.isidentifier() or keyword.iskeyword(word):
            raise ValueError(f"a Python call can't carry the name {word!r}")


def _py_call(name: str, args: dict[str, Any]) -> str:
    check_names(name, args)
    return f"{name}(" + ", ".join(f"{k}={py_literal(v)}" for k, v in args.items()) + ")"


class Pythonic(ToolFormat):
    name = "pythonic"
    family = "Llama 3.2 / Llama 4 pythonic, ToolACE, Olmo 3"
    openers = (PY_START, OLMO_OPEN)
    anchored = True

    def parse(self, text: str, at: int) -> Markup | None:
        if text.startswith(OLMO_OPEN, at):
            return _olmo3(text, at)
        pos, wrapped = at, text.startswith(PY_START, at)
        if wrapped:
            pos = skip_ws(text, at + len(PY_START))
        if not text.startswith("[", pos):
            return None
        calls, end = call_list(text, pos)
        if wrapped:
            after = skip_ws(text, end)
            if text.startswith(PY_END, after):
                return Markup(at, after + len(PY_END), calls)
        if text[end:].strip():
            return None  # a bare list is a call only as the whole content
        return Markup(at, end, calls)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "[" + ", ".join(_py_call(n, a) for n, a in calls) + "]"


def _olmo3(text: str, at: int) -> Markup | None:
    """Olmo 3: one call per line between `<function_calls>` and `</function_calls>` (a list too)."""
    start = at + len(OLMO_OPEN)
    close = text.find(OLMO_CLOSE, start)
    body = text[start:] if close < 0 else text[start:close]
    if not body.strip():
        return None
    tree = parse_python(body.strip(), mode="exec")
    assert isinstance(tree, ast.Module)
    calls: list[RawCall] = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr):
            raise ValueError("not a call")
        if isinstance(stmt.value, ast.List):
            calls.extend(call_of(e) for e in stmt.value.elts)
        else:
            calls.append(call_of(stmt.value))
    if close < 0:
        return Markup(at, len(text), calls, closed=False)
    return Markup(at, close + len(OLMO_CLOSE), calls)


class Lfm2(ToolFormat):
    name = "lfm2"
    family = "LFM2, LFM2.5 (Liquid AI)"
    openers = (LFM_OPEN,)

    def parse(self, text: str, at: int) -> Markup | None:
        pos = skip_ws(text, at + len(LFM_OPEN))
        if not text.startswith("[", pos):
            return None
        calls = _lfm2_calls(text, pos)
        return closed_by(text, at, bracket_end(text, pos), LFM_CLOSE, calls)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return LFM_OPEN + "[" + ", ".join(_lfm2_call(n, a) for n, a in calls) + "]" + LFM_CLOSE


def _lfm2_calls(text: str, pos: int) -> list[RawCall]:
    """Pythonic calls, or (when the system prompt asked for JSON) a JSON list of named calls."""
    try:
        return call_list(text, pos)[0]
    except ValueError:
        end = bracket_end(text, pos)
        items = json.loads(text[pos:end])
        if not isinstance(items, list) or not items:
            raise
        return [named_call(item) for item in items]


def _lfm2_call(name: str, args: dict[str, Any]) -> str:
    """As LFM2.5's template writes it: strings between single quotes as they are, mappings as JSON,
    anything else as Python's str()."""
    parts = []
    for key, value in args.items():
        if isinstance(value, str):
            if "'" in value or "\\" in value:
                raise ValueError("the template writes this string unreadably")
            parts.append(f"{key}='{value}'")
        elif isinstance(value, dict):
            parts.append(f"{key}={dumps(value)}")
        elif isinstance(value, list) and any(isinstance(v, str) and ("'" in v or "\\" in v) for v in value):
            raise ValueError("the template writes this string unreadably")
        else:
            parts.append(f"{key}={value}")
    check_names(name, args)
    return f"{name}(" + ", ".join(parts) + ")"
