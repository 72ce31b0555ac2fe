"""Tool-call markup leaked into the text or reasoning of the Responses and Messages surfaces (issue 17).

When a server runs without the right tool parser, the model's own markup (`<tool_call>…`, DeepSeek's
`<｜tool▁calls▁begin｜>`, …) reaches the client as text. The registry (`formats/`) knows every format and
the rules that say when markup is a call; this module is the streaming side both evented surfaces share:

- `LeakDetector` (one per answer): the armed formats, the offered names, and the byte checks derived once
  from the registered openers, so an ordinary text delta costs a few `bytes.find`s and no parse;
- `TextHold` (one per text part): holds back only text that may start a marker (the tail that is a prefix
  of an opener; from a whole opener to the end of the part; a marker-less format's head at the start of the
  content, for at most `ANCHOR_LIMIT` bytes) and releases it the moment it can't be markup;
- `Leaked`: what the end of a part found — the text to release with the markup cut out, the recovered calls
  with their arguments through `repair_arguments`, or the unrecoverable one;
- `reasoning_leak`: the rule for the reasoning field, decided at the end of the turn.

The surfaces build the events (`responses.py`, `messages.py`); the rules live here once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import orjson
from tapfix.proxy.changes import Change
from tapfix.proxy.toolcalls.arguments import repair_arguments
from tapfix.proxy.toolcalls.formats.base import XmlArgs, dumps, typed_xml_args
from tapfix.proxy.toolcalls.formats.blocks import Context
from tapfix.proxy.toolcalls.formats.placement import Found
from tapfix.proxy.toolcalls.formats.registry import ANCHOR_LIMIT, Formats
from tapfix.proxy.toolcalls.leaks import formats_for
from tapfix.proxy.toolcalls.plan_types import STAGE, Fatal
from tapfix.proxy.toolcalls.schema import ToolSchemas

LEAKED = "leaked_into_content"
UNPINNED = "unpinned_tool_format"
_RECHECK_FREE = 2048  # held text this short is looked at again on every delta; longer as it grows by 1/4
_BACKSLASH = 92


@dataclass(slots=True)
class Leaked:
    """What the end of one text part (or the reasoning) found."""

    text: str  # the held text to release, the markup cut out
    calls: list[tuple[str, str]] = field(default_factory=list)  # (offered name, arguments JSON text)
    markups: list[str] = field(default_factory=list)  # each recovered markup as the model wrote it
    flagged: list[str] = field(default_factory=list)  # markup of a registered format other than the pinned one
    fatal: Fatal | None = None  # a confirmed call whose arguments can't be recovered
    held: str = ""  # the held text as it came
    events: list[bytes] = field(default_factory=list)  # the held events, to send as they came without calls


def raw_string(event: bytes, key: bytes) -> bytes | None:
    """The raw (still escaped) JSON string value of the first `key` (`b'"delta":'`) in `event`, or None.

    Byte scanning only: the fast path of every text delta, so no JSON parse."""
    at = event.find(key)
    if at < 0:
        return None
    start = at + len(key)
    while event[start : start + 1] == b" ":
        start += 1
    if event[start : start + 1] != b'"':
        return None
    start += 1
    end = event.find(b'"', start)
    while end > 0 and event[end - 1] == _BACKSLASH:
        k = end - 1
        while event[k] == _BACKSLASH:
            k -= 1
        if (end - 1 - k) % 2 == 0:  # an even run of backslashes: the quote ends the string
            break
        end = event.find(b'"', end + 1)
    return event[start:end] if end > 0 else None


def _punctuation_at(opener: str) -> int:
    """Where an opener's first punctuation is (0 for `<tool_call>`; 6 for `Action:`)."""
    return next((k for k, ch in enumerate(opener) if not (ch.isalnum() or ch in " _")), len(opener))


def decode_raw(raw: bytes) -> str:
    return raw.decode("utf-8", "replace") if b"\\" not in raw else str(orjson.loads(b'"' + raw + b'"'))


@dataclass(frozen=True, slots=True)
class _Checks:
    """What a `LeakDetector` derives from its armed formats alone: built once per format set (`_checks`)."""

    formats: Formats
    every: Formats | None
    first_bytes: tuple[bytes, ...]
    single: bytes
    words: tuple[bytes, ...]
    prefixes: frozenset[str]
    word_tails: tuple[bytes, ...]
    heads: tuple[str, ...]


@lru_cache(maxsize=64)
def _checks(tool_format: str | None) -> _Checks:
    armed = formats_for(tool_format)
    every = formats_for(None) if tool_format is not None else None
    watched = every or armed  # pinned: the other formats' markup is still seen, to flag it
    # A delta none of whose bytes may start an opener can't hold markup (nor the start of one). The
    # registry derives those bytes once (with the `\\uXXXX` a server may write instead); in a delta's
    # own text a `[` or `]` counts alone (the registry pairs them only against a chunk's JSON).
    first_bytes = tuple(watched.fast_bytes) + tuple(watched.paired_bytes)
    # For one pass per check: single bytes deleted at once (`bytes.translate`), then the few longer
    # starts that hold none of them (every `\\uXXXX` escape checked as `\\u`).
    single = b"".join(sorted(b for b in first_bytes if len(b) == 1))
    longer = {b"\\u" if b.startswith(b"\\u") else b for b in first_bytes if len(b) > 1}
    # An opener that starts with a word or a space (`Action:`, ` functools[`) may be cut before the
    # punctuation the byte check sees: a delta that ends with the start of one is held (one `endswith`).
    word_tails = sorted({o[:k].encode() for o in watched.by_opener for k in range(1, _punctuation_at(o) + 1)})
    # A marker-less format that starts with the tool's name (Functionary's `NAME\n{…}`) is held at the
    # start only while the content spells an offered name; the others while it opens with their head.
    return _Checks(
        formats=armed,
        every=every,
        first_bytes=first_bytes,
        single=single,
        words=tuple(sorted(b for b in longer if not any(c in single for c in b))),
        prefixes=frozenset(o[:k] for o in armed.by_opener for k in range(1, len(o))),
        word_tails=tuple(word_tails),
        heads=tuple(h for h in armed.anchor_heads if not h.isalnum()),
    )


class LeakDetector:
    """One answer's armed formats and offered tools; inactive (nothing held, nothing read) without tools.
    What derives from the formats alone is built once per format set (`_checks`), not per answer."""

    def __init__(self, schemas: ToolSchemas, tool_format: str | None = None) -> None:
        self.schemas = schemas
        self.offered = list(schemas.names)
        checks = _checks(tool_format)
        self.formats: Formats = checks.formats
        self.every: Formats | None = checks.every
        self.active = bool(self.offered) and bool(self.formats.by_opener or self.formats.anchored)
        self.first_bytes = checks.first_bytes
        self.single = checks.single
        self.words = checks.words
        self.prefixes = checks.prefixes
        self.word_tails = checks.word_tails
        self.heads = checks.heads
        self.by_name = bool(self.formats.anchored)  # a generation prompt may have written the marker

    def anchor_head(self, head: str) -> bool:
        """Whether the start of the content (leading space stripped) may be a marker-less format's markup."""
        if head[0] in self.heads:
            return True
        return self.by_name and any(n.startswith(head) or head.startswith(n) for n in self.offered)

    def plain(self, raw: bytes) -> bool:
        """Whether a raw delta value holds none of the bytes an opener starts with (the fast path)."""
        if len(raw.translate(None, self.single)) != len(raw) or raw.endswith(self.word_tails):
            return False
        for word in self.words:
            if word in raw:
                return False
        return True

    def partial(self, text: str) -> int:
        """The length of the longest end of `text` that is the start of an opener (0: none)."""
        for k in range(min(self.formats.max_opener - 1, len(text)), 0, -1):
            if text[-k:] in self.prefixes:
                return k
        return 0

    # -- reading calls ------------------------------------------------------------------------------
    def read(self, full: str, held_from: int, at_start: bool, path: str) -> Leaked:
        """Every markup in call position in `full` that starts in the held part (from `held_from`), its
        calls recovered."""
        out = Leaked(full[held_from:])
        cuts: list[tuple[int, int]] = []
        for found in self.formats.place(full, self.offered, at_start).calls:
            start, end = found.markup.start, max(found.markup.end, found.markup.start + 1)
            if not found.confirmed or start < held_from:
                continue
            if not self._recover(found, out):
                return out
            cuts.append((start, end))
            out.markups.append(full[start:end])
        if cuts:
            kept, pos = [], held_from
            for start, end in cuts:
                kept.append(full[pos:start])
                pos = end
            kept.append(full[pos:])
            out.text = "".join(kept)
        elif self.every is not None:
            out.flagged = self.unpinned(full)
        return out

    def unpinned(self, full: str) -> list[str]:
        """Markup another registered format reads as calls, when one format is pinned: flagged, not recovered."""
        if self.every is None or not self.every.has_opener(full):
            return []
        found = self.every.find(full, self.offered, at_start=False)
        return [full[found.markup.start : found.markup.end]] if found is not None and found.confirmed else []

    def _recover(self, found: Found, out: Leaked) -> bool:
        for name, args in found.calls:
            if isinstance(args, XmlArgs):
                args = typed_xml_args(args, self.schemas.properties(name))
            # A value the markup already held (a dict) goes in as one: read back from text, valid JSON
            # could meet the text-level heuristics meant for broken fragments.
            frag: Any = args if isinstance(args, str | dict) else dumps(args)
            if isinstance(frag, str):
                try:
                    strict = json.loads(frag)
                except ValueError:
                    strict = None
                frag = strict if isinstance(strict, dict) else frag
            res = repair_arguments([frag], name, self.schemas, None)
            if res.fatal:
                kinds = [k for k in res.kinds if k != "args_as_object"]  # the object was the markup's own
                kind = "missing_fragment" if res.fatal.startswith("required") else (kinds or [LEAKED])[0]
                out.fatal = Fatal(name, f"tool call written as text: {res.fatal}", kind)  # as `decide` records it
                return False
            out.calls.append((name, res.text))
        return True

    def reasoning(self, text: str, path: str) -> Leaked | None:
        """Markup last in the reasoning (the caller checks that no text or call follows in the turn): the
        run of confirmed markups that ends the reasoning, with only whitespace between them."""
        if not self.active or not text or not (self.every or self.formats).has_opener(text):
            return None
        spans = [
            (f.markup.start, max(f.markup.end, f.markup.start + 1), f)
            for f in self.formats.place(text, self.offered, False).calls
        ]
        spans.sort(key=lambda s: s[0])
        run: list[tuple[int, int, Found]] = []
        pos = len(text)
        for start, end, found in reversed(spans):
            if text[end:pos].strip() or not found.confirmed:
                break
            run.insert(0, (start, end, found))
            pos = start
        out = Leaked("")
        if not run:
            out.flagged = self.unpinned(text) if self.every is not None else []
            if out.flagged and text[text.rfind(out.flagged[-1]) + len(out.flagged[-1]) :].strip():
                out.flagged = []  # another format's markup that isn't last: a decoy, not worth a flag
            return out if out.flagged else None
        for start, end, found in run:
            if not self._recover(found, out):
                return out
            out.markups.append(text[start:end])
        return out


class TextHold:
    """One text part's hold (a Responses `message` item's text, a Messages `text` block).

    Whole events are held, and released as they came once their text can't be markup: a decoy (prose
    that mentions a marker, a closed `<think>`) reaches the client byte for byte (invariant 1)."""

    def __init__(self, detector: LeakDetector, at_start: bool) -> None:
        self.det = detector
        self.at_start = at_start  # the first text of the turn: marker-less formats may start here
        self.sent: list[bytes | str] = []  # the text that went out (raw JSON string bytes on the fast path)
        self.held: list[bytes] = []  # the events held, as they came
        self.pending = ""  # their text
        # "" | "opener" (hold, looked at again as it grows) | "whole" (hold to the end of the part) |
        # "anchor" (a marker-less head)
        self.mode = ""
        self.started = not (at_start and (detector.heads or detector.by_name))  # past the first character
        self.suspect = False  # a delta took the slow path: the end of the part reads the text
        self.context = Context()  # what the text sent leaves open (read lazily: `_context`)
        self.read_upto = 0  # how many pieces of `sent` are read into it
        self.recheck = 0  # "opener": the held length at which to look again

    def fast(self, raw: bytes) -> bool:
        """The hot check: a delta that can go out as it came (recorded); False: decode it, call `feed`."""
        if self.held or not self.started or not self.det.plain(raw):
            return False
        self.sent.append(raw)
        return True

    def feed(self, event: bytes, delta: str) -> list[bytes]:
        """The events that can go out now: none while `delta` (with what is held) may be markup, else every
        held one and this one, as they came."""
        self.suspect = True
        text = self.pending + delta
        if self._may_be_markup(text):
            self.held.append(event)
            self.pending = text
            return []
        out, self.held, self.pending = [*self.held, event], [], ""
        self.sent.append(text)
        return out

    def _may_be_markup(self, text: str) -> bool:
        if self.mode == "whole":
            return True
        if self.mode == "opener":
            if len(text) < self.recheck:
                return True
            self.recheck = len(text) + (len(text) // 4 if len(text) > _RECHECK_FREE else 0)
            if self.det.partial(text) or not self._text_only(text):
                return True
            self.mode = ""  # nothing held can become a call any more (a container, prose after it)
            return False
        if not self.started:
            head = text.lstrip()
            if not head:
                return True
            if self.mode == "anchor" or self.det.anchor_head(head):
                if len(text.encode()) <= ANCHOR_LIMIT:
                    self.mode = "anchor"
                    return True
                found = self.det.formats.find(text, self.det.offered, at_start=True)
                if found is not None and found.confirmed:
                    self.mode = "whole"
                    return True
            self.mode, self.started = "", True
        if self.det.formats.has_opener(text) and not self._text_only(text):
            self.mode = "opener"
            self.recheck = 0
            return True
        k = self.det.partial(text)
        return k > 0 and (len(text) > _RECHECK_FREE or not self._context().point(text[:-k]).container)

    def _text_only(self, text: str) -> bool:
        return self.det.formats.place(text, self.det.offered, False, self._context(), final=False).text_only

    def _context(self) -> Context:
        """What the text sent so far leaves open, read up to date."""
        for piece in self.sent[self.read_upto :]:
            self.context.feed(piece if isinstance(piece, str) else decode_raw(piece))
        self.read_upto = len(self.sent)
        return self.context

    def sent_text(self) -> str:
        return "".join(p if isinstance(p, str) else decode_raw(p) for p in self.sent)

    def whole_text(self) -> str:
        """The part's text as the model wrote it so far: what went out and what is held."""
        return self.sent_text() + self.pending

    def finish(self, path: str) -> Leaked | None:
        """At the end of the part: None when nothing could be markup (nothing held, nothing to flag). A
        `Leaked` without calls carries the held events to send as they came (`events`)."""
        if not self.held and not (self.suspect and self.det.every is not None):
            return None
        sent = self.sent_text()
        leaked = self.det.read(sent + self.pending, len(sent), self.at_start, path)
        leaked.held, leaked.events = self.pending, self.held
        self.sent.append(leaked.text if leaked.calls else self.pending)
        self.held, self.pending, self.mode = [], "", ""
        return leaked


def leak_change(leaked: Leaked, where: str, what: str) -> Change:
    """The change row of recovered calls: the markup before, the calls after."""
    after = [{"name": n, "arguments": a} for n, a in leaked.calls]
    before: Any = leaked.markups[0] if len(leaked.markups) == 1 else leaked.markups
    return Change(STAGE, LEAKED, where, before, after, f"tool call written as {what}; sent as the surface's calls")


def unpinned_change(markup: str, where: str, pinned: list[str]) -> Change:
    reason = f"markup of a registered tool format other than the pinned one ({', '.join(pinned)}); passed as sent"
    return Change(STAGE, UNPINNED, where, markup, markup, reason)
