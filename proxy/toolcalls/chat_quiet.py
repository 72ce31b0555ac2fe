"""The Chat Completions stage's per-event path for the common chunk: a content delta that provably can't
start, carry or continue a tool call or leaked markup, passed untouched with the least bookkeeping.

A server writes every content chunk of a stream alike: the same envelope around a different string
(`data: {"id":…,"choices":[{"index":0,"delta":{"content":"` + text + `"},…}]}`). `learn` takes that
envelope from one chunk whose choice 0 carries content and nothing else the stage acts on (no call, finish
or reasoning), proved by probe parses (`sse_envelope.learn`). A later event that starts with the head and
ends with the tail (`Envelope.raw`) is then that chunk with another string: when the string's bytes hold
no quote, no control byte and no trailing backslash, the JSON around it is the learned one, byte for byte.

What is left is the string itself (`QuietText`): it can't begin or carry any armed format's markup when
it holds none of the bytes an opener starts with (its first punctuation, a word-led opener up to
that punctuation, any ASCII `\\u00XX` escape, a non-ASCII opener character escaped in any case), and
doesn't end in the start of a word-led opener (`functi`, ` to`). One regex search and a last-byte test.

The stage takes this path only while nothing is held or watched (`ChatToolCallRepair._quiet`), so the
full path would have done nothing with such an event but read its text into the choice's
`blocks.Context`: the strings are kept and read in batches, when the full path next needs them.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

import orjson
from tapfix.proxy import sse_envelope
from tapfix.proxy.jsonbody import json_object
from tapfix.proxy.sse import event_data
from tapfix.proxy.sse_envelope import Envelope
from tapfix.proxy.toolcalls.formats import Formats

_KEY = b'"content":'
_SLOT = ("choices", 0, "delta", "content")
_FINISHES = (b'"finish_reason":"', b'"finish_reason": "')
_SURROGATE = re.compile(rb"\\u[dD]")
_SEEN, _SEEN_LEN = 4096, 24  # verdicts kept per format set, of strings this short
_CONTENT = re.compile(rb'"content": ?"((?:[^"\\]|\\.)*)"')
OTHER_CHOICE = re.compile(rb'"index":(?! ?0[,} ])')


def learn(event: bytes) -> Envelope | None:
    """The content slot of a chunk that carries one choice (index 0) whose delta is its content and nothing
    the stage acts on (no call, finish, reasoning text, error): its envelope (`sse_envelope`) around
    `choices[0].delta.content`; None for any other event."""
    at = event.find(_KEY)
    if at < 0 or event.find(_KEY, at + 1) >= 0 or not event.endswith((b"\n\n", b"\r\n\r\n")):
        return None
    if any(event.find(f) >= 0 for f in (*_FINISHES, b'"tool_calls"')):  # none in the slot: a quote ends it
        return None
    obj = _event_object(event)
    return sse_envelope.learn(event, obj, _SLOT, _event_object) if _content_only(obj) else None


def _event_object(event: bytes) -> dict[str, Any] | None:
    data = event_data(event)
    return json_object(data) if data is not None else None


def _content_only(obj: dict[str, Any] | None) -> bool:
    choices = obj.get("choices") if obj is not None else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return False
    ch = choices[0]
    delta = ch.get("delta")
    if type(ch.get("index")) is not int or ch["index"] != 0 or not isinstance(delta, dict):
        return False
    if not isinstance(delta.get("content"), str) or delta.get("tool_calls") or ch.get("finish_reason"):
        return False
    return not any(isinstance(delta.get(k), str) and delta[k] for k in ("reasoning_content", "reasoning"))


class QuietText:
    """Whether a content string's raw bytes can't begin or carry markup of the armed formats (`quiet`)."""

    __slots__ = ("ends", "formats", "marks", "reach", "seen")

    def __init__(self, formats: Formats) -> None:
        self.formats = formats
        self.marks = _marks(formats)
        self.ends = formats.word_ends
        self.reach = formats.word_reach + 2
        self.seen: dict[bytes, bool] = {}  # a token's string recurs (` the`): its verdict is looked up

    def quiet(self, raw: bytes) -> bool:
        verdict = self.seen.get(raw)
        if verdict is None:
            verdict = self._quiet(raw)
            if len(raw) <= _SEEN_LEN:
                if len(self.seen) >= _SEEN:
                    self.seen.clear()
                self.seen[raw] = verdict
        return verdict

    def _quiet(self, raw: bytes) -> bool:
        if self.marks.search(raw) is not None or raw.endswith(b"\\"):
            return False
        return not (raw and raw[-1] in self.ends and self.formats.ends_in_word_start(raw[-self.reach :]))

    def plain(self, raw: bytes) -> bool:
        """Quiet but maybe for its end (`quiet` without the word-led opener's start)."""
        return self.marks.search(raw) is None and not raw.endswith(b"\\")


@lru_cache(maxsize=64)
def quiet_text(formats: Formats) -> QuietText:
    """One per armed-format set (`formats_for` caches those): built once per process, not per stage."""
    return QuietText(formats)


def _marks(formats: Formats) -> re.Pattern[bytes]:
    """One search for every byte an opener may start with in a string's raw bytes: its first punctuation
    (`[` and `]` too: in a string they aren't the envelope's), a word-led opener up to that punctuation,
    a non-ASCII opener's UTF-8; any `\\u00XX` escape (a server may escape any ASCII character), a
    non-ASCII one's escape in any case; and what would change the JSON around the string: a quote, a
    control byte."""
    singles = {b"[", b"]", b'"'} | {b for b in (*formats.fast_bytes, *formats.paired_bytes) if len(b) == 1}
    alts = [rb"\\u00"]
    for needle in formats.fast_bytes:
        if len(needle) == 1:
            continue
        if needle.startswith(b"\\u"):
            if not needle.startswith(b"\\u00"):
                alts.append(rb"\\u(?i:" + re.escape(needle[2:]) + rb")")
        else:
            alts.append(re.escape(needle))
    cls = b"".join(re.escape(b) for b in sorted(singles))
    return re.compile(rb"[\x00-\x1f" + cls + rb"]|" + b"|".join(alts))


def read_texts(raws: list[bytes]) -> str:
    """The strings' text joined, as a JSON parser reads each (`json_object`: orjson, else Python's json,
    which takes a lone surrogate); one that doesn't read adds nothing, as its event added nothing."""
    blob = b"".join(raws)
    if blob.find(b"\\") < 0:
        try:
            return blob.decode()
        except UnicodeDecodeError:
            pass
    elif _SURROGATE.search(blob) is None:  # a pair split across strings would join here, not in a parser
        try:
            return str(orjson.loads(b'"' + blob + b'"'))
        except orjson.JSONDecodeError:
            pass
    return "".join(_read_one(raw) for raw in raws)


def _read_one(raw: bytes) -> str:
    quoted = b'"' + raw + b'"'
    try:
        return str(orjson.loads(quoted))
    except orjson.JSONDecodeError:
        try:
            return str(json.loads(quoted))
        except (ValueError, UnicodeDecodeError, RecursionError):
            return ""


def contents(events: list[bytes]) -> str | None:
    """The content of a batch of chunks that each carry one choice (index 0) and no reasoning, read
    from their bytes in one pass (no JSON parse): their strings joined, as one string; None when a chunk
    is anything else (the caller parses them one by one). Escapes don't span strings, so the joined raw
    strings unescape at once."""
    blob = b"".join(events)
    if blob.find(b'"reasoning') >= 0 or blob.count(b'"index"') != len(events) or OTHER_CHOICE.search(blob):
        return None
    raws = [m.group(1) for m in _CONTENT.finditer(blob)]
    if len(raws) != blob.count(b'"content":'):
        return None  # a content that isn't a string (null, logprobs' list)
    raw = b"".join(raws)
    if raw.find(b"\\ud") >= 0 or raw.find(b"\\uD") >= 0:
        return None  # a surrogate pair split across chunks would join here, not in a parser
    try:
        return raw.decode() if raw.find(b"\\") < 0 else str(orjson.loads(b'"' + raw + b'"'))
    except (UnicodeDecodeError, orjson.JSONDecodeError):
        return None
