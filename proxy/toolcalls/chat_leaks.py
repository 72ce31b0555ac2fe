"""What the Chat Completions stage watches, per choice, while a message's text goes out: leaked markup.

Text that goes out can't be taken back, so the stage must see markup before its first piece leaves:
- the per-event fast path (`FastPath`): byte checks derived once from the armed openers, no parse and no
  regex, and the end of each delta's text checked for the start of a word-led opener (`functi`, ` to`),
  last byte first;
- the reasoning field from where it may hold markup (a call only when nothing visible follows it);
- with a format pinned, content that may hold another registered format's markup (flagged, never cut);
- what the content and the reasoning already sent leave open (`blocks.Context`: a fence, `<think>`, a
  quote, a list item, the paragraph's last sentence...), read from every delta that went out, the ones
  the fast path let through included (read in batches when the slow path next runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import orjson
from tapfix.proxy.changes import Change
from tapfix.proxy.toolcalls.accumulate import Call
from tapfix.proxy.toolcalls.arguments import dumps
from tapfix.proxy.toolcalls.formats import Formats
from tapfix.proxy.toolcalls.formats.base import typed_xml_args
from tapfix.proxy.toolcalls.formats.blocks import Context
from tapfix.proxy.toolcalls.jsonfix import loads_tolerant
from tapfix.proxy.toolcalls.leaks import UNPINNED, Leak, foreign_markup, formats_for, is_xml_args
from tapfix.proxy.toolcalls.plan_types import STAGE
from tapfix.proxy.toolcalls.schema import ToolSchemas

_TEXT_KEYS = (b'content":', b'"reasoning":')  # `content":` also ends `"reasoning_content":`
_BACKSLASH, _QUOTE, _SPACE = 92, 34, 32


@dataclass(slots=True)
class TextWatch:
    """One choice's watched text. `reasoning`: the reasoning field from where it may hold markup (None:
    not watching); `foreign`: a pinned stage's content that may hold another format's markup; `context`
    and `reasoning_context`: what the content and the reasoning already sent leave open (`blocks.Context`:
    an open fence, quote, list item... before what is held)."""

    reasoning: str | None = None
    reasoning_field: str = "reasoning_content"
    foreign: str | None = None
    context: Context = field(default_factory=Context)
    reasoning_context: Context = field(default_factory=Context)
    foreign_context: Context | None = None  # what the content before `foreign` left open

    @property
    def active(self) -> bool:
        return self.reasoning is not None or self.foreign is not None

    def carried(self) -> TextWatch:
        """The watch a message that goes on keeps across a released hold."""
        kept = (self.reasoning, self.reasoning_field, self.foreign)
        return TextWatch(*kept, self.context, self.reasoning_context, self.foreign_context)

    def sent(self, text: str) -> None:
        """Content went out: read what of it stays open."""
        self.context.feed(text)

    def watch_reasoning(self, delta: dict[str, Any], call: bool, formats: Formats) -> None:
        """Collect the reasoning field from where it may hold markup; anything visible after it (content,
        a call) makes that markup a decoy. Nothing is held for it: the reasoning goes out at once. What
        isn't collected is read into `reasoning_context`, where the collected part starts."""
        text = delta.get("reasoning_content")
        field = "reasoning_content"
        if not isinstance(text, str) or not text:
            text, field = delta.get("reasoning"), "reasoning"
        text = text if isinstance(text, str) else ""
        content = delta.get("content")
        if call or (isinstance(content, str) and content.strip()):
            self._drop_reasoning(text)  # something visible follows: what the reasoning held was thinking
            return
        if not text:
            return
        if self.reasoning is None:
            if formats.has_opener(text) or formats.may_start(text):
                self.reasoning, self.reasoning_field = text, field
            else:
                self.reasoning_context.feed(text)
            return
        self.reasoning += text
        if not formats.has_opener(self.reasoning) and not formats.may_start(self.reasoning):
            self._drop_reasoning("")

    def _drop_reasoning(self, more: str) -> None:
        if self.reasoning is not None:
            self.reasoning_context.feed(self.reasoning)
            self.reasoning = None
        self.reasoning_context.feed(more)

    def watch_foreign(self, content: str, at_start: bool) -> None:
        """A pinned stage: collect content that may hold another registered format's markup, to flag it
        at the finish (the bytes pass as they came)."""
        if self.foreign is not None:
            self.foreign += content
            return
        everyone = formats_for(None)
        head = content.lstrip()[:1]
        if everyone.has_opener(content) or everyone.may_start(content) or (at_start and head in everyone.anchor_heads):
            self.foreign, self.foreign_context = content, self.context.copy()

    def flag_foreign(
        self, choice: int, schemas: ToolSchemas, at_start: bool, pinned: Formats, pinned_name: str | None
    ) -> Change | None:
        """At the finish: the change that flags another registered format's markup, if it was a call."""
        text, self.foreign = self.foreign or "", None
        leak = foreign_markup(text, schemas, at_start, pinned, self.foreign_context)
        if leak is None:
            return None
        other = next(f for f in leak.formats if f not in pinned.names)
        return Change(
            STAGE,
            UNPINNED,
            f"$.choices[{choice}].delta.content",
            {"format": other, "markup": text[leak.start : leak.end]},
            None,
            f"markup of the registered format {other!r}, but {pinned_name!r} is pinned; passed through",
        )


class FastPath:
    """The per-event byte checks of a stage that offered tools, derived once from the formats it must see.

    A content event may start markup when it holds an opener's first punctuation (`Formats.fast_bytes`:
    `<`, `[`, `]` past the envelope's pair, a backtick..., with the escapes a server may write), a
    word-led opener's needle (` to=`, `Action:`), an error, or when a delta's text ENDS in the start of a
    word-led opener before its punctuation (`functi`, `Actio`, ` to`): that end is found with a few
    `find`s, and only its last byte is looked at before anything else."""

    __slots__ = ("formats", "multi", "table")

    def __init__(self, formats: Formats) -> None:
        self.formats = formats
        self.table, self.multi = _fast_checks(formats.fast_bytes, formats.paired_bytes)

    def interesting(self, event: bytes) -> bool:
        marked = event.translate(self.table)  # one C pass: a single-byte mark is \0, `[` `]` are `[`
        if marked.find(b"\0") >= 0 or marked.count(b"[") > 2:
            return True
        for needle in self.multi:
            if event.find(needle) >= 0:  # find, not `in`: several times cheaper on short bytes
                return True
        return self.formats.word_reach > 0 and _text_ends_in_word_start(event, self.formats)


@lru_cache(maxsize=64)
def fast_path(formats: Formats) -> FastPath:
    """One per armed-format set (`formats_for` caches those): built once, not per stage."""
    return FastPath(formats)


def _text_ends_in_word_start(event: bytes, formats: Formats) -> bool:
    """Whether a delta's text (content or reasoning, each choice) ends in the start of a word-led
    opener: the string's last byte first (a few `find`s and int indexing: no slice until it matters)."""
    ends = formats.word_ends
    for key in _TEXT_KEYS:
        at = event.find(key)
        while at >= 0:
            start = at + len(key)
            while start < len(event) and event[start] == _SPACE:
                start += 1
            if start >= len(event) or event[start] != _QUOTE:
                at = event.find(key, start)
                continue
            start += 1
            end = _string_end(event, start)
            if end < 0:
                return True  # a string that doesn't end (a cut event): the slow path judges it
            if end > start and event[end - 1] in ends:
                if formats.ends_in_word_start(event[max(start, end - formats.word_reach - 2) : end]):
                    return True
            at = event.find(key, end)
    return False


def _string_end(event: bytes, start: int) -> int:
    """Where the JSON string that starts at `start` ends (its closing quote), -1 when it doesn't."""
    end = event.find(b'"', start)
    while end > 0 and event[end - 1] == _BACKSLASH:
        k = end - 1
        while k >= start and event[k] == _BACKSLASH:
            k -= 1
        if (end - 1 - k) % 2 == 0:
            break  # the backslashes escape each other: this quote ends the string
        end = event.find(b'"', end + 1)
    return end


def _fast_checks(singles: tuple[bytes, ...], paired: tuple[bytes, ...]) -> tuple[bytes, tuple[bytes, ...]]:
    """The fast path's checks from `Formats.fast_bytes`: a translate table marking every single-byte one
    as NUL (a JSON text never holds a raw NUL) and `[` `]` as `[` (the envelope's `"choices":[...]`
    holds one of each), and the multi-byte needles, plus `"error"` and a finish (the full path notes it: a
    call after it is judged at once). Escapes: any `\\u00XX` (a server may
    escape any ASCII character, `[` as `\\u005b`), and a non-ASCII opener character's escape by its first
    two hex digits in either case."""
    table = bytearray(range(256))
    table[0] = 1  # a NUL in the event (invalid JSON anyway) must not read as a mark
    multi: list[bytes] = [b'"error"', b"\\u00", b'"finish_reason":"', b'"finish_reason": "']
    for needle in singles + paired:
        if len(needle) == 1:
            table[needle[0]] = ord("[") if needle in paired else 0
    marks = {bytes([b]) for b in range(256) if table[b] in (0, ord("["))}
    for needle in singles:
        if len(needle) == 1 or any(bytes([b]) in marks for b in needle):
            continue  # an event holding it whole holds a marked byte too
        if needle.startswith(b"\\u"):
            hi, lo = needle[2:3], needle[3:4]
            found = [b"\\u" + a + b for a in {hi.lower(), hi.upper()} for b in {lo.lower(), lo.upper()}]
        else:
            found = [needle]
        multi += [n for n in found if n not in multi and not n.startswith(b"\\u00")]
    return bytes(table), tuple(multi)


def carries_tool_call(obj: dict[str, Any]) -> bool:
    """Whether a chunk carries a tool-call delta without content."""
    choices = obj.get("choices")
    for ch in choices if isinstance(choices, list) else []:
        delta = ch.get("delta") if isinstance(ch, dict) else None
        if isinstance(delta, dict) and delta.get("tool_calls") and not delta.get("content"):
            return True
    return False


def calls_from_leak(leak: Leak, calls: list[Call], schemas: ToolSchemas) -> int:
    """The calls of markup found in the model's raw text (llama-server's parse error), added to `calls`:
    one that continues the last call, cut short, completes its arguments; the others are new. Every
    call's fragments end as JSON text. Returns how many calls were added."""
    added = 0
    for name, raw in leak.calls:
        args = typed_xml_args(raw, schemas.properties(name)) if is_xml_args(raw) else raw
        last = calls[-1] if calls else None
        if last is not None and last.name == name and _incomplete(last):
            head = loads_tolerant("".join(f for f in last.frags if isinstance(f, str)))
            base = head.value if isinstance(head.value, dict) else (head.partial or {})
            last.original = last.raw_arguments()
            last.frags = [{**base, **args} if isinstance(args, dict) else args]
            last.note("invalid_json")
        else:
            call = Call(index=None, name=name, frags=[args])
            call.note("invalid_json")
            calls.append(call)
            added += 1
    for call in calls:
        call.frags = [dumps(f) if not isinstance(f, str) else f for f in call.frags]
    return added


def _incomplete(call: Call) -> bool:
    text = "".join(f for f in call.frags if isinstance(f, str))
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return True
    return False
