"""A request's conversation as a chain of digests, so a later turn can find the exchange it continues.

An agent resends its whole conversation every turn: turn N's request is turn N-1's request, plus the
reply it received as an assistant message, plus what is new. Each exchange's `chain_hash` is the
digest of its conversation followed by its reply; a new request's candidate parents are the digests
of its own prefixes that end with an assistant message. Only the conversation's values are parsed,
one item at a time (the rest of the body is skipped by span), and an item seen in an earlier turn is
not parsed again: its parts are remembered by the digest of its bytes.

Agents do not resend their replies byte for byte, so the digest is taken over a normal form: key
order, content as a string or as `[{type: text}]` parts, whitespace around text, tool-call argument
JSON spacing, tool-call and item ids, and reasoning (`reasoning_content`, Responses `reasoning`
items, Messages `thinking` blocks, which agents drop or keep) do not count. Consecutive assistant
items (a Responses message then its function calls, Messages content blocks) are one reply.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from tapfix.proxy.assemble import Assembled
from tapfix.proxy.jsonbody import canonical, canonical_arguments
from tapfix.proxy.jsonsplice import SpliceError
from tapfix.proxy.surfaces import Surface, api_surface

# A part: ("a", text) assistant text, ("c", digest) a tool call, ("u", digest) anything the client said.
Part = tuple[str, bytes | str]
_CACHE_ITEMS = 8192
_CACHE_TEXT = 256 * 1024  # an assistant text longer than this is parsed again next turn, not held
MAX_PARENTS = 256  # the longest prefixes looked up: a 1000-turn run still costs one bounded query
CONVERSATION_FIELDS = ("messages", "input")  # the arrays whose items `Parser` reads
Spans = dict[str, tuple[int, int]]
Items = dict[str, list[tuple[int, int]]]
_PARSE_ERRORS = (SpliceError, orjson.JSONDecodeError, IndexError, TypeError, ValueError)


def _digest(*pieces: bytes | memoryview) -> bytes:
    """sha256 cut to 16 bytes: with the CPU's SHA instructions it is the fastest hashlib has."""
    h = hashlib.sha256()
    for piece in pieces:
        h.update(piece)
    return h.digest()[:16]


def _text(value: Any) -> str:
    """Content as text: a string, or the text of its parts (others in a normal JSON form)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list):
        out = []
        for part in value:
            if isinstance(part, dict) and isinstance(part.get("text"), str) and part.get("type") != "thinking":
                out.append(part["text"])
            elif isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict):
                out.append(canonical({k: v for k, v in part.items() if k != "cache_control"}).decode())
        return "".join(out).strip()
    return canonical(value).decode()


def _call(name: Any, arguments: Any) -> Part:
    return "c", _digest(str(name or "").encode(errors="surrogatepass"), b"\0", canonical_arguments(arguments))


def _said(kind: str, value: Any) -> Part:
    return "u", _digest(kind.encode(), b"\0", _text(value).encode(errors="surrogatepass"))


def _role(role: Any) -> str:
    return "s" if role in ("system", "developer") else "r" if role in ("tool", "function") else "u"


def chat_parts(item: Any) -> list[Part]:
    """A Chat Completions message (also a Messages message: its content blocks are handled here)."""
    if not isinstance(item, dict):
        return [_said("?", item)]
    content = item.get("content")
    if item.get("role") != "assistant":
        if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            return [_block(b) for b in content]
        return [_said(_role(item.get("role")), content)]
    parts: list[Part] = []
    if isinstance(content, list):  # Messages blocks; chat text parts
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                parts.append(_call(block.get("name"), block.get("input")))
            elif not (isinstance(block, dict) and block.get("type") in ("thinking", "redacted_thinking")):
                parts.append(("a", _text([block])))
    else:
        parts.append(("a", _text(content)))
    for call in item.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            parts.append(_call(function.get("name"), function.get("arguments")))
    legacy = item.get("function_call")
    if isinstance(legacy, dict):
        parts.append(_call(legacy.get("name"), legacy.get("arguments")))
    return parts


def _block(block: Any) -> Part:
    if isinstance(block, dict) and block.get("type") == "tool_result":
        return _said("r", block.get("content"))
    return _said("u", [block])


def responses_parts(item: Any) -> list[Part]:
    """A Responses input item."""
    if not isinstance(item, dict):
        return [_said("u", item)]
    kind = item.get("type")
    if kind == "reasoning":
        return []
    if kind in ("function_call", "custom_tool_call"):
        return [_call(item.get("name"), item.get("arguments", item.get("input")))]
    if kind in ("function_call_output", "custom_tool_call_output"):
        return [_said("r", item.get("output"))]
    if kind in (None, "message") and "role" in item:
        if item["role"] == "assistant":
            return [("a", _text(item.get("content")))]
        return [_said(_role(item["role"]), item.get("content"))]
    return [_said("u", {k: v for k, v in item.items() if k not in ("id", "status")})]


def reply_parts(reply: Assembled) -> list[Part]:
    """What the client received, as the parts it will resend; empty when there is nothing to continue."""
    parts: list[Part] = [("a", reply.content.strip())] if reply.content.strip() else []
    for call in reply.tool_calls:
        if isinstance(call, dict):
            parts.append(_call(call.get("name"), call.get("arguments", call.get("input"))))
    return parts


@dataclass(slots=True)
class Conversation:
    """The request's chain: `parents` are the digests of its prefixes that end with an assistant reply,
    shortest first; `chained(reply)` is the digest of the whole conversation followed by the reply."""

    head: bytes
    pending: list[Part]  # a trailing assistant run (prefill), folded together with the reply
    parents: list[str]

    def chained(self, reply: Sequence[Part]) -> str | None:
        if not reply:
            return None
        return _fold(self.head, [*self.pending, *reply]).hex()


def _fold(head: bytes, run: Sequence[Part]) -> bytes:
    """One assistant reply into the chain: its text (pieces joined) and its calls, in that order."""
    text = "".join(str(p[1]) for p in run if p[0] == "a").strip()
    calls = b"".join(p[1] for p in run if p[0] == "c" and isinstance(p[1], bytes))
    return _digest(head, b"A", _digest(text.encode(errors="surrogatepass")), calls)


class Parser:
    """Turns a conversation's items into parts, remembering the parts of items it has seen."""

    def __init__(self) -> None:
        self._seen: OrderedDict[bytes, list[Part]] = OrderedDict()

    def conversation(self, body: bytes, spans: Spans, items: Items, surface: Surface | None) -> Conversation | None:
        """None when the request holds no conversation (not an inference body, legacy completions).
        `spans` and `items`: `jsonsplice.top_level_item_spans(body, CONVERSATION_FIELDS)`."""
        try:
            api = api_surface(surface)  # no surface: a stored body; its fields decide
            if api.item_turns or (surface is None and "input" in spans and "messages" not in spans):
                return self._chain(body, spans, items, "instructions", "input", responses_parts)
            if (api.turns or surface is None) and "messages" in spans:
                return self._chain(body, spans, items, "system", "messages", chat_parts)
        except _PARSE_ERRORS:
            return None
        return None

    def _chain(
        self, body: bytes, spans: Spans, items: Items, preamble: str, field: str, parts_of: Any
    ) -> Conversation | None:
        where = spans.get(field)
        if where is None:
            return None
        parts: list[Part] = []
        if preamble in spans:
            value = orjson.loads(body[slice(*spans[preamble])])
            if value:
                parts.append(_said("s", value))
        if field in items:
            view = memoryview(body)  # items are hashed and parsed in place, not copied
            for start, end in items[field]:
                parts += self._item(view[start:end], parts_of)
        else:  # Responses: `input` may be the user's text alone
            value = orjson.loads(body[slice(*where)]) if field == "input" else None
            if not isinstance(value, str):
                return None
            parts.append(_said("u", value))
        return _conversation(parts)

    def _item(self, raw: memoryview, parts_of: Any) -> list[Part]:
        key = _digest(raw)
        known = self._seen.get(key)
        if known is not None:
            self._seen.move_to_end(key)
            return known
        try:
            parts: list[Part] = parts_of(orjson.loads(raw))
        except orjson.JSONDecodeError:
            parts = [("u", _digest(b"raw\0", raw))]
        if sum(len(p[1]) for p in parts) <= _CACHE_TEXT:
            self._seen[key] = parts
            while len(self._seen) > _CACHE_ITEMS:
                self._seen.popitem(last=False)
        return parts


def reply_chains(
    preamble: Any, items: Sequence[Any], parts_of: Any = chat_parts, whole: bool = False
) -> dict[int, str]:
    """By the index of the first item of each assistant reply that more of the conversation follows: the
    digest of the conversation up to and including that reply, which is the `chain_hash` of the exchange
    whose reply it was. A reply of several items (a Responses message and its function calls) counts only
    when `whole`; an item with no parts (a reasoning item) neither extends nor ends one. Reasoning replay
    finds the turns a request resends by these."""
    head = b""
    if preamble:
        said = _said("s", preamble)[1]
        head = _digest(head, b"U", said if isinstance(said, bytes) else said.encode())
    run: list[Part] = []
    start, count, out = 0, 0, {}
    for i, item in enumerate(items):
        parts = parts_of(item)
        if not parts:
            continue
        if all(p[0] in ("a", "c") for p in parts):
            start, count = (start, count + 1) if run else (i, 1)
            run += parts
            continue
        if run:
            head = _fold(head, run)
            if count == 1 or whole:
                out[start] = head.hex()
            run = []
        for part in parts:
            head = _digest(head, b"U", part[1] if isinstance(part[1], bytes) else part[1].encode())
    return out


def conversation_chain(preamble: Any, items: Sequence[Any], parts_of: Any, reply: Sequence[Part]) -> str | None:
    """`Parser.conversation(...).chained(reply)` from the parsed request (no item cache): the digest a later
    turn's `reply_chains` gives for this reply, with the preamble the caller chose."""
    parts: list[Part] = [_said("s", preamble)] if preamble else []
    for item in items:
        parts += parts_of(item)
    return _conversation(parts).chained(reply)


def _conversation(parts: Iterable[Part]) -> Conversation:
    head, run, parents = b"", [], []
    for part in parts:
        if part[0] in ("a", "c"):
            run.append(part)
            continue
        if run:
            head = _fold(head, run)
            parents.append(head.hex())
            run = []
        head = _digest(head, b"U", part[1] if isinstance(part[1], bytes) else part[1].encode())
    return Conversation(head, run, parents[-MAX_PARENTS:])
