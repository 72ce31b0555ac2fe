"""Where a request's prompt stopped being the previous turn's prompt plus more: the engine's prefix cache.

An engine with a prefix cache (vLLM, SGLang, llama.cpp) reuses the work for the longest token prefix a new
prompt shares with one it saw. An agent's turn N+1 is turn N plus the reply plus what is new, so all of
turn N is reused, unless the client changed something before its end: a billing line recomputed per
request, a timestamp at the front, tools reordered, an edited system prompt, a compacted history. Then
everything after that point is prefilled again, and the user only sees the engine getting slow.

A request's prompt part is read as units in the order the chat templates render them: the system prompt
(Messages `system` blocks, Responses `instructions`, chat's leading system/developer messages, a part of
theirs each), then `tools`, then the conversation (`messages` / `input` items). Units compare after a
normal form that drops what never reaches the prompt: `cache_control` anywhere (Claude Code moves it every
turn) and a content of one text part versus the same text as a string; top-level fields other than those
(`stream`, sampling, `max_tokens`, `metadata`, ...) are not read at all, except the ones a template reads
(`TEMPLATE_FIELDS`) and `prompt_cache_key` (OpenAI-style servers route the cache by it).

**Thread.** A session may hold several chains of requests (Claude Code's main agent, its subagents and its
side requests share one session id). The previous request of this one's thread is the earlier request of
the session that shares the longest run of leading units with it (a billing line, which changes on its own,
is passed over, not counted); one that shares none qualifies when its conversation is a strict prefix of
this one's (a turn whose system prompt changed at its front); ties go to the latest. No candidate: a
thread's first request, no break.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from tapfix.proxy.jsonsplice import SpliceError, value_span
from tapfix.proxy.request.billing_line import is_billing_line
from tapfix.proxy.request.prefix_causes import CAUSES as CAUSES
from tapfix.proxy.request.prefix_causes import cause_of, missing_cause
from tapfix.proxy.surfaces import Surface, api_surface

# Top-level fields a chat template reads: a change re-renders the prompt (gpt-oss puts the effort in it).
TEMPLATE_FIELDS = ("chat_template", "chat_template_kwargs", "reasoning_effort", "reasoning", "thinking", "documents")
_EXCERPT = 40
_SETTING_PARTS = {"thinking": "type", "reasoning": "effort"}
_SYSTEM_ROLES = ("system", "developer")
Path = tuple[str | int, ...]


@dataclass(slots=True)  # not frozen: a frozen one's init costs 4x, and every turn builds each unit (never changed)
class Unit:
    kind: str  # system | tool | item
    path: Path
    value: Any  # as parsed (None in a `light` prompt)
    digest: bytes  # of its normal form: what compares
    volatile: bool = False  # a billing line: changes by itself, says nothing about the thread


@dataclass(frozen=True, slots=True)
class Prompt:
    """A request's prompt part, read once: what the thread lookup and the comparison need."""

    units: tuple[Unit, ...]
    conversation: int  # how many conversation items
    settings: dict[str, Any] = field(default_factory=dict)  # TEMPLATE_FIELDS present
    cache_key: Any = None
    # The units' kinds and digests in one string (`_signature`), so comparing two prompts' units is comparing
    # bytes, not a loop over units (issue 34: a thread's every earlier request is compared each turn). None:
    # compared unit by unit.
    signature: bytes | None = field(default=None, compare=False)
    volatile: bool = field(default=True, compare=False)  # it has a billing line (`shared` passes it over)

    def light(self) -> Prompt:
        """Without the parsed values: what a recent request is kept as (its body parses again on a break)."""
        units = tuple(Unit(u.kind, u.path, None, u.digest, u.volatile) for u in self.units)
        return Prompt(units, self.conversation, self.settings, self.cache_key, self.signature, self.volatile)


@dataclass(frozen=True, slots=True)
class Break:
    path: str  # JSON path in the new request (`$.system[0].text`)
    offset: int  # byte offset in the new request's body
    cause: str  # one of CAUSES
    reason: str  # for a person
    old: str  # excerpts around the point, as sent (`as_dict` redacts them)
    new: str

    def as_dict(self, previous: str | None, redact: Callable[[str], str] = str) -> dict[str, Any]:
        """The stored and shown form; `redact` hides secrets in the excerpts (the store's redaction)."""
        return {
            "path": self.path,
            "offset": self.offset,
            "cause": self.cause,
            "reason": self.reason,
            "previous": previous,
            "old": redact(self.old),
            "new": redact(self.new),
        }


def normal(value: Any) -> Any:
    """The form units compare in: no `cache_control`, one text part the same as its text."""
    if isinstance(value, dict):
        return {k: normal(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        items = [normal(v) for v in value]
        if len(items) == 1 and isinstance(items[0], dict) and items[0].keys() == {"type", "text"}:
            if items[0]["type"] == "text" and isinstance(items[0]["text"], str):
                return items[0]["text"]
        return items
    return value


def prompt_of(
    parsed: dict[str, Any], surface: Surface | None, digest_of: Callable[[Any], bytes] | None = None
) -> Prompt | None:
    """The prompt part of a request on the chat, Responses or Messages surface; None on others. `digest_of`:
    `digest` by another way to the same bytes (the capture writer's cache of units seen, store/unit_digests.py)."""
    of = digest_of or digest
    units: list[Unit] = []
    conversation: list[Unit] = []
    api = api_surface(surface)
    field = api.conversation
    if field is None:
        return None
    if api.instructions is not None:  # the system prompt in a field of its own
        units += _system(parsed.get(api.instructions), (api.instructions,), of)
        given = parsed.get(field)
        if api.item_turns and isinstance(given, str):
            conversation = [_unit("item", (field,), given, of=of)]
        else:
            conversation = [_unit("item", (field, i), m, of=of) for i, m in enumerate(_list(given))]
    else:  # chat: system and developer messages lead the turns
        messages = _list(parsed.get("messages"))
        lead = 0
        while lead < len(messages) and isinstance(messages[lead], dict) and messages[lead].get("role") in _SYSTEM_ROLES:
            lead += 1
        for i in range(lead):
            content = messages[i].get("content")
            if isinstance(content, list) and len(content) > 1:
                units += _system(content, ("messages", i, "content"), of)
            else:
                units.append(_unit("system", ("messages", i), messages[i], _billing(content), of))
        conversation = [_unit("item", ("messages", i), m, of=of) for i, m in enumerate(messages) if i >= lead]
    tools = [_unit("tool", ("tools", i), t, of=of) for i, t in enumerate(_list(parsed.get("tools")))]
    settings = {k: _setting(k, parsed[k]) for k in TEMPLATE_FIELDS if k in parsed}
    every = (*units, *tools, *conversation)
    volatile = any(u.volatile for u in every)
    return Prompt(every, len(conversation), settings, parsed.get("prompt_cache_key"), _signature(every), volatile)


_KINDS = {"system": b"s", "tool": b"t", "item": b"i"}
_WIDTH = 17  # a unit in a signature: its kind's letter and its 16-byte digest


def _signature(units: Sequence[Unit]) -> bytes | None:
    if any(len(u.digest) != _WIDTH - 1 or u.kind not in _KINDS for u in units):
        return None
    return b"".join([_KINDS[u.kind] + u.digest for u in units])


def _leading(a: bytes, b: bytes) -> int:
    """How many leading units two signatures share: the longest common prefix in whole units (a bisection on
    slices, compared at memcmp speed)."""
    hi = min(len(a), len(b)) // _WIDTH
    if a[: hi * _WIDTH] == b[: hi * _WIDTH]:
        return hi
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo * _WIDTH : mid * _WIDTH] == b[lo * _WIDTH : mid * _WIDTH]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def json_path(path: Path) -> str:
    """`("messages", 3, "content")` → `$.messages[3].content` (the notation of a change's path)."""
    out = "$"
    for step in path:
        named = isinstance(step, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", step)
        out += f"[{step}]" if isinstance(step, int) else f".{step}" if named else f"[{orjson.dumps(step).decode()}]"
    return out


def _setting(name: str, value: Any) -> Any:
    """What of a template field reaches the prompt: of Messages' `thinking` whether it is on (its budget is
    the sampler's), of Responses' `reasoning` the effort (its `summary` is the output's)."""
    if isinstance(value, dict) and name in _SETTING_PARTS:
        return value.get(_SETTING_PARTS[name])
    return normal(value)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _unit(kind: str, path: Path, value: Any, volatile: bool = False, of: Callable[[Any], bytes] | None = None) -> Unit:
    return Unit(kind, path, value, (of or digest)(value), volatile)


def digest(value: Any) -> bytes:
    """Of the normal form, key order aside (a parser hands the template the same mapping). The value is written
    as it is first: only when that shows a `cache_control` key or a list led by a text part (`[{"text":` with the
    keys sorted; inside a JSON string a quote is escaped, so neither is ever text) does `normal` walk it."""
    try:
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # integers beyond 64 bits (perhaps where the normal form drops them)
        text = b'"cache_control":'
    if text.find(b'"cache_control":') >= 0 or text.find(b'[{"text":') >= 0:  # `find`: ~3x `in` on CPython 3.13
        try:
            text = orjson.dumps(normal(value), option=orjson.OPT_SORT_KEYS)
        except TypeError:
            text = repr(normal(value)).encode()
    return hashlib.sha256(text).digest()[:16]


def _billing(value: Any) -> bool:
    text = value.get("text") if isinstance(value, dict) else value
    return is_billing_line(text)


def _system(value: Any, path: Path, of: Callable[[Any], bytes] | None = None) -> list[Unit]:
    if value is None:
        return []
    if isinstance(value, list):
        return [_unit("system", (*path, i), b, _billing(b), of) for i, b in enumerate(value)]
    return [_unit("system", path, value, _billing(value), of)]


def shared(previous: Prompt, new: Prompt) -> int:
    """How many leading units the two share; a billing line on both sides is passed over, not counted."""
    if previous.signature is not None and new.signature is not None and not (previous.volatile or new.volatile):
        return _leading(previous.signature, new.signature)
    count = 0
    for old, now in zip(previous.units, new.units, strict=False):
        if old.volatile and now.volatile:
            continue
        if old.kind != now.kind or old.digest != now.digest:
            break
        count += 1
    return count


def _extends_conversation(previous: Prompt, new: Prompt) -> bool:
    if new.conversation <= previous.conversation or previous.conversation == 0:
        return False
    if previous.signature is not None and new.signature is not None:  # the items are the units at the end
        old_items = previous.signature[len(previous.signature) - previous.conversation * _WIDTH :]
        return new.signature[len(new.signature) - new.conversation * _WIDTH :].startswith(old_items)
    old = [u.digest for u in previous.units if u.kind == "item"]
    now = [u.digest for u in new.units if u.kind == "item"]
    return now[: len(old)] == old


def previous_in_thread(new: Prompt, candidates: Sequence[tuple[str, Prompt]]) -> tuple[str, Prompt] | None:
    """Of the session's earlier requests (oldest first), the one this request continues (the module's rule)."""
    best: tuple[tuple[int, int, int], tuple[str, Prompt]] | None = None
    for order, (capture_id, prompt) in enumerate(candidates):
        count = shared(prompt, new)
        if count == 0 and not _extends_conversation(prompt, new):
            continue
        key = (count, prompt.conversation if count == 0 else 0, order)
        if best is None or key > best[0]:
            best = key, (capture_id, prompt)
    return None if best is None else best[1]


def extends(previous: Prompt, new: Prompt) -> bool:
    """`new` is `previous` plus more: each unit, the template's settings and the cache key the same."""
    if len(new.units) < len(previous.units) or new.settings != previous.settings:
        return False
    if previous.cache_key is not None and previous.cache_key != new.cache_key:
        return False
    if previous.signature is not None and new.signature is not None:
        return new.signature.startswith(previous.signature)
    return all(a.kind == b.kind and a.digest == b.digest for a, b in zip(previous.units, new.units, strict=False))


def find_break(previous: Prompt, new: Prompt, body: bytes) -> Break | None:
    """The first point where `new` (whose bytes are `body`) stops extending `previous`; None: it extends it.
    Both prompts whole (not `light`): the excerpts come from their values."""
    for i, old in enumerate(previous.units):
        now = new.units[i] if i < len(new.units) else None
        if now is not None and old.kind == now.kind and old.digest == now.digest:
            continue
        return _unit_break(previous, new, i, body)
    for name in sorted(set(previous.settings) | set(new.settings)):
        if previous.settings.get(name) != new.settings.get(name):
            old_text, new_text = _short(previous.settings.get(name)), _short(new.settings.get(name))
            return Break(
                json_path((name,)),
                _offset(body, (name,)),
                "template_settings",
                f"`{name}` changed: the template renders the prompt differently",
                old_text,
                new_text,
            )
    if previous.cache_key != new.cache_key and previous.cache_key is not None:
        return Break(
            "$.prompt_cache_key",
            _offset(body, ("prompt_cache_key",)),
            "prompt_cache_key",
            "`prompt_cache_key` changed: a server that routes its cache by the key starts cold",
            _short(previous.cache_key),
            _short(new.cache_key),
        )
    return None


def _unit_break(previous: Prompt, new: Prompt, i: int, body: bytes) -> Break:
    old = previous.units[i]
    now = new.units[i] if i < len(new.units) else None
    if now is None or now.kind != old.kind:
        # The unit is gone, or another kind stands in its place: the point is where the old one stood.
        path: Path = now.path if now is not None else old.path[:-1] if isinstance(old.path[-1], int) else old.path
        offset = _offset(body, path, at_end=now is None)
        cause, reason = missing_cause(previous, new, old)
        return Break(json_path(path), offset, cause, reason, _short(old.value), _short(now.value if now else None))
    sub, old_text, new_text, char = _first_difference(old.value, now.value, ())
    path = (*now.path, *sub)
    offset = _offset(body, path, char=char)
    cause, reason = cause_of(previous, new, old, now, old_text, new_text, char)
    if char is not None and isinstance(old_text, str) and isinstance(new_text, str):
        return Break(json_path(path), offset, cause, reason, _around(old_text, char), _around(new_text, char))
    return Break(json_path(path), offset, cause, reason, _short(old_text), _short(new_text))


def _first_difference(old: Any, new: Any, path: Path) -> tuple[Path, Any, Any, int | None]:
    """The deepest path where the raw values differ (in normal form), and the character index in a string."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in [*new, *(k for k in old if k not in new)]:
            if key == "cache_control" or normal(old.get(key)) == normal(new.get(key)):
                continue
            if key in old and key in new:
                return _first_difference(old[key], new[key], (*path, key))
            return (*path, key) if key in new else path, old.get(key), new.get(key), None
    elif isinstance(old, list) and isinstance(new, list):
        for j in range(max(len(old), len(new))):
            if j >= len(old) or j >= len(new):
                return path, old, new, None
            if normal(old[j]) != normal(new[j]):
                return _first_difference(old[j], new[j], (*path, j))
    elif isinstance(old, str) and isinstance(new, str):
        char = next((k for k, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new)))
        return path, old, new, char
    return path, old, new, None


def _around(text: str, char: int) -> str:
    start = max(0, char - _EXCERPT)
    piece = ("…" if start else "") + text[start : char + _EXCERPT] + ("…" if char + _EXCERPT < len(text) else "")
    return piece


def _short(value: Any) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else orjson.dumps(value).decode(errors="replace")
    return text[: 2 * _EXCERPT] + ("…" if len(text) > 2 * _EXCERPT else "")


def _offset(body: bytes, path: Path, *, char: int | None = None, at_end: bool = False) -> int:
    """The byte offset of `path`'s value in `body` (of character `char` in it, when a string; of its closing
    bracket, `at_end`). A path the bytes don't hold (a body that isn't the parse): its nearest parent's."""
    for cut in range(len(path), -1, -1):
        try:
            start, end = value_span(body, path[:cut])
        except (SpliceError, IndexError):
            continue
        if cut < len(path):
            return start
        if at_end:
            return max(start, end - 1)
        if char is not None and body[start : start + 1] == b'"':
            return start + string_offset(body, start, char)
        return start
    return 0


def string_offset(body: bytes, start: int, char: int) -> int:
    """Bytes from a JSON string's opening quote at `start` to its decoded character `char`."""
    i, seen = start + 1, 0
    while i < len(body) and seen < char and body[i] != 0x22:
        if body[i] == 0x5C:
            if body[i + 1 : i + 2] == b"u":
                code = int(body[i + 2 : i + 6], 16)
                i += 12 if 0xD800 <= code < 0xDC00 and body[i + 6 : i + 8] == b"\\u" else 6
            else:
                i += 2
        else:
            lead = body[i]
            i += 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        seen += 1
    return i - start
