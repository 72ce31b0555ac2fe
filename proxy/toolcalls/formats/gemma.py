"""Gemma: Gemma 2/3's ```tool_code``` fence, and Gemma 4's `<|tool_call>call:NAME{…}<tool_call|>` tokens.

Gemma 2/3 have no tool tokens: Google's function-calling guide has the model write Python wrapped in a
```tool_code``` fence (answers come back in ```tool_output```). A call is a fence, so it counts only as
the last thing in the text (the registry checks that), and it is read with Python's `ast`: a call of a
name (`get_weather(...)`, `default_api.get_weather(...)`, optionally inside `print(...)`, or a pythonic
list of them) with keyword arguments whose values are literals. Nothing is ever evaluated.

Gemma 4 (google-gemma-4-31B-it.jinja) writes `<|tool_call>call:NAME{key:value,…}<tool_call|>` per call,
back to back, and stops on `<|tool_response>`. Values are its own notation: strings between `<|"|>`
delimiters with nothing escaped, bare keys (the template's `escape_keys=False`), `true`/`false`,
numbers as written, `[…]` and `{…}`. Markup inside the thought channel (`<|channel>thought…<channel|>`)
is the model's thinking, not a call.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, RawCall, ToolFormat, inside, skip_ws

FENCE_OPEN, FENCE_CLOSE = "```tool_code", "```"
_JSONISH = {"true": True, "false": False, "null": None}


class GemmaToolCode(ToolFormat):
    name = "gemma"
    family = "Gemma 2, Gemma 3 (```tool_code```)"
    openers = (FENCE_OPEN,)
    fence = True

    def claims(self, text: str, at: int) -> bool:
        rest = text[at + len(FENCE_OPEN) : at + len(FENCE_OPEN) + 2]
        return rest[:1] == "\n" or rest == "\r\n"

    def parse(self, text: str, at: int) -> Markup | None:
        body_at = at + len(FENCE_OPEN)
        if not self.claims(text, at):
            return None
        close = text.find("\n" + FENCE_CLOSE, body_at)
        if close < 0:
            body, end, closed = text[body_at:], len(text), False
        else:
            body, end, closed = text[body_at:close], close + 1 + len(FENCE_CLOSE), True
        calls = python_calls(body)
        return Markup(at, end, calls, closed) if calls else None

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        lines = [f"{n}({', '.join(f'{k}={v!r}' for k, v in a.items())})" for n, a in calls]
        return FENCE_OPEN + "\n" + "\n".join(lines) + "\n" + FENCE_CLOSE


def python_calls(body: str) -> list[RawCall]:
    """The calls of a ```tool_code``` body; ValueError unless every statement is a literal call."""
    try:
        tree = ast.parse(body.strip("\r\n"), mode="exec")
    except SyntaxError as exc:
        raise ValueError("tool_code is not Python") from exc
    calls: list[RawCall] = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr):
            raise ValueError("a tool_code statement is a call")
        node = stmt.value
        items = node.elts if isinstance(node, ast.List) else [node]
        for item in items:
            calls.append(_call(item))
    return calls


def _call(node: ast.expr) -> RawCall:
    if not isinstance(node, ast.Call):
        raise ValueError("not a call")
    if isinstance(node.func, ast.Name) and node.func.id == "print" and len(node.args) == 1 and not node.keywords:
        return _call(node.args[0])  # print(get_weather(...)): Gemini's code-execution habit
    if isinstance(node.func, ast.Name):
        name = node.func.id
    elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
        name = node.func.attr  # default_api.get_weather(...)
    else:
        raise ValueError("a call of a plain name")
    if node.args or any(k.arg is None for k in node.keywords):
        raise ValueError("arguments are keywords")  # positional values carry no parameter name
    return name, {k.arg: _literal(k.value) for k in node.keywords if k.arg is not None}


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSONISH:
        return _JSONISH[node.id]  # a model mixing JSON into Python
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("no ** in a literal")
        return {_key(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True) if k is not None}
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise ValueError("not a literal") from exc
    if value is not None and not isinstance(value, str | int | float):
        raise ValueError("not a JSON value")  # bytes, complex, sets
    return value


def _key(node: ast.expr) -> str:
    value = _literal(node)
    if not isinstance(value, str):
        raise ValueError("object keys are strings")
    return value


# -- Gemma 4 ------------------------------------------------------------------------------------------
G4_OPEN, G4_CLOSE, G4_CALL = "<|tool_call>", "<tool_call|>", "call:"
G4_STOP = "<|tool_response>"  # what the model writes after its calls to hand over to the tools
STR = '<|"|>'
THOUGHT_OPEN, THOUGHT_CLOSE = "<|channel>", "<channel|>"
_NAME = re.compile(r"[^\s{}<>]+")
_BARE_KEY = re.compile(r"[^\s:,{}\[\]<>\"]+")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_WORDS = {"true": True, "false": False, "null": None, "None": None, "True": True, "False": False}
_DECODER = json.JSONDecoder()


class Gemma4(ToolFormat):
    name = "gemma4"
    family = "Gemma 4"
    openers = (G4_OPEN,)

    def claims(self, text: str, at: int) -> bool:
        in_thought = inside(text, at, THOUGHT_OPEN, THOUGHT_CLOSE)  # Gemma 4's thinking channel
        return text.startswith(G4_CALL, at + len(G4_OPEN)) and not in_thought

    def parse(self, text: str, at: int) -> Markup | None:
        calls: list[RawCall] = []
        pos = at
        while text.startswith(G4_OPEN, pos):
            pos += len(G4_OPEN)
            if not text.startswith(G4_CALL, pos):
                raise ValueError("a Gemma 4 call starts with call:")
            m = _NAME.match(text, pos + len(G4_CALL))
            if m is None or not text.startswith("{", m.end()):
                return None if m is None or m.end() < len(text) else Markup(at, len(text), calls, closed=False)
            args, pos = _g4_object(text, m.end())
            calls.append((m.group(), args))
            if not text.startswith(G4_CLOSE, pos):
                return Markup(at, len(text), calls, closed=False) if pos >= len(text) else None
            pos += len(G4_CLOSE)
            nxt = skip_ws(text, pos)
            if text.startswith(G4_OPEN, nxt):
                pos = nxt
        if text.startswith(G4_STOP, pos):
            pos += len(G4_STOP)
        return Markup(at, pos, calls) if calls else None

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "".join(f"{G4_OPEN}{G4_CALL}{n}{_g4_value(a, top=True)}{G4_CLOSE}" for n, a in calls)


def _g4_object(text: str, pos: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    pos = skip_ws(text, pos + 1)  # past "{"
    if text.startswith("}", pos):
        return out, pos + 1
    while True:
        key, pos = _g4_key(text, skip_ws(text, pos))
        pos = skip_ws(text, pos)
        if not text.startswith(":", pos):
            raise ValueError("a key is followed by ':'")
        value, pos = _g4_any(text, skip_ws(text, pos + 1))
        if key in out:
            raise ValueError("a key repeats")
        out[key] = value
        pos = skip_ws(text, pos)
        if text.startswith(",", pos):
            pos += 1
            continue
        if text.startswith("}", pos):
            return out, pos + 1
        raise ValueError("an object continues with ',' or '}'")


def _g4_key(text: str, pos: int) -> tuple[str, int]:
    if text.startswith(STR, pos) or text.startswith('"', pos):
        key, pos = _g4_any(text, pos)
        if not isinstance(key, str):
            raise ValueError("a key is a string")
        return key, pos
    m = _BARE_KEY.match(text, pos)
    if m is None:
        raise ValueError("no key")
    return m.group(), m.end()


def _g4_any(text: str, pos: int) -> tuple[Any, int]:
    if text.startswith(STR, pos):
        end = text.find(STR, pos + len(STR))
        if end < 0:
            raise ValueError("a string is cut")
        return text[pos + len(STR) : end], end + len(STR)
    if text.startswith('"', pos):
        return _DECODER.raw_decode(text, pos)
    if text.startswith("{", pos):
        return _g4_object(text, pos)
    if text.startswith("[", pos):
        items: list[Any] = []
        pos = skip_ws(text, pos + 1)
        if text.startswith("]", pos):
            return items, pos + 1
        while True:
            value, pos = _g4_any(text, skip_ws(text, pos))
            items.append(value)
            pos = skip_ws(text, pos)
            if text.startswith(",", pos):
                pos += 1
            elif text.startswith("]", pos):
                return items, pos + 1
            else:
                raise ValueError("a list continues with ',' or ']'")
    m = _NUMBER.match(text, pos)
    if m is not None and not text[m.end() : m.end() + 1].isalnum():
        number = m.group()
        return (float(number) if any(c in number for c in ".eE") else int(number)), m.end()
    for word, value in _WORDS.items():
        if text.startswith(word, pos) and not text[pos + len(word) : pos + len(word) + 1].isalnum():
            return value, pos + len(word)
    raise ValueError("not a Gemma 4 value")


def _g4_value(value: Any, top: bool = False) -> str:
    """As the template's format_argument writes it (keys sorted, bare; strings between <|"|>)."""
    if isinstance(value, str):
        return STR + value + STR
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_g4_value(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_g4_value(v) for v in value) + "]"
    if value is None:
        return "None"  # Jinja prints None as Python does
    return str(value)
