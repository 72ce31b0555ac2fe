"""Defect mutations of the fragments a call's arguments are streamed in: duplicated, dropped, cut,
the whole object twice, the whole arguments resent at the end, and arguments sent as an object.

Preserving ones keep a unique reading: `fragment_duplicated` doubles a fragment only when the copy
breaks the JSON and every removal of one of two equal neighbouring fragments that gives valid JSON
gives the original. Destroying ones destroy detectably: `fragment_dropped` loses a string's end or a
`,` `:` together with content characters, and only where the rest does not still read as a whole
value (strictly, or as a tolerant repair reads it: raw control characters, invalid escapes as
literal backslashes, escape noise between tokens, trailing commas, quotes that can't end a string,
a lost opening `{"`); `arguments_cut` ends inside a value.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterator
from typing import Any

from tapfix.proxy.mock.mutations_text import SPACE_AND_NOISE, pick_some, same_value
from tapfix.proxy.mock.mutations_wire import Sent, Wire, ensure_frags, split_text, strict_json


# -- fragments -------------------------------------------------------------------------------------
def _spans(frags: list[str]) -> list[tuple[int, int]]:
    out, pos = [], 0
    for f in frags:
        out.append((pos, pos + len(f)))
        pos += len(f)
    return out


def _pristine(sent: Sent) -> bool:
    return sent.frags is not None and "".join(sent.frags) == sent.whole


def _unique_after_dedup(frags: list[str], original: Any) -> bool:
    for j in range(len(frags) - 1):
        if frags[j] == frags[j + 1]:
            ok, value = strict_json("".join(frags[:j] + frags[j + 1 :]))
            if ok and not same_value(value, original):
                return False
    return True


def _pristine_calls(rng: random.Random, wire: Wire) -> Iterator[tuple[Sent, list[str]]]:
    """Each call still as sent, with its fragments (every call is cut into fragments on the way, so
    each mutation draws from `rng` alike)."""
    for sent in wire.calls:
        frags = ensure_frags(sent, rng)
        if _pristine(sent):
            yield sent, frags


def fragment_duplicated(rng: random.Random, wire: Wire) -> Wire | None:
    options = []
    for sent, frags in _pristine_calls(rng, wire):
        ok, value = strict_json("".join(frags))
        if ok:
            options.append((sent, value))
    rng.shuffle(options)
    for sent, value in options:
        frags = sent.frags or []
        for _ in range(6):
            i = rng.randrange(len(frags))
            new = frags[: i + 1] + [frags[i]] + frags[i + 1 :]
            if not strict_json("".join(new))[0] and _unique_after_dedup(new, value):
                sent.frags = new
                sent.applied.add("fragment_duplicated")
                return wire
    return None


_LENIENT = json.JSONDecoder(strict=False)


def quotes_read_leniently(text: str) -> str:
    """`text` with each quote inside a string escaped when what follows can't end the string: the
    reading `unescaped_quotes` relies on."""
    out: list[str] = []
    i, inside = 0, False
    while i < len(text):
        ch = text[i]
        if inside and ch == "\\":
            out.append(text[i : i + 2])
            i += 2
            continue
        if ch == '"':
            if inside:
                rest = text[i + 1 :]
                after = rest[SPACE_AND_NOISE.match(rest).end() :]  # type: ignore[union-attr]
                inside = after[:1] not in ("", ",", "}", "]", ":")
                out.append('\\"' if inside else ch)
            else:
                inside = True
                out.append(ch)
        else:
            out.append(ch)
        i += 1
    return "".join(out)


_ESCAPE = re.compile(r"\\(.)", re.S)


def _literal_backslashes(text: str) -> str:
    """Each backslash that doesn't start a valid JSON escape, doubled (read as itself)."""
    return _ESCAPE.sub(lambda m: m.group() if m.group(1) in '"\\/bfnrtu' else "\\\\" + m.group(1), text)


_TRAILING_COMMA = re.compile(r",(\s*[}\]])")


def noise_dropped(text: str) -> str:
    """`text` without the `\\n` `\\t` `\\r` pairs outside strings (the reading escaped_whitespace
    relies on)."""
    out, i, inside = [], 0, False
    while i < len(text):
        ch = text[i]
        if inside and ch == "\\":
            out.append(text[i : i + 2])
            i += 2
            continue
        if ch == '"':
            inside = not inside
        elif not inside and ch == "\\" and text[i + 1 : i + 2] in ("n", "t", "r"):
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


# Each reading, and a character without which it changes nothing (skipped then: this runs per drop).
_TOLERANT_READS: tuple[tuple[Callable[[str], str], str], ...] = (
    (_literal_backslashes, "\\"),
    (noise_dropped, "\\"),
    (lambda t: _TRAILING_COMMA.sub(r"\1", t), ","),
    (quotes_read_leniently, '"'),
)


def _readings(text: str) -> list[str]:
    """`text` as a tolerant repair may read it: with a lost `{"` or `{` put back, and every
    combination of invalid escapes read as literal backslashes, escape noise between tokens dropped,
    trailing commas dropped, and quotes that can't end a string read inside it (in that order)."""
    out = [text]
    if not text.lstrip().startswith("{"):  # a lost first chunk, as the corpus repairs it
        out += ['{"' + text.lstrip(), "{" + text.lstrip()]
    for read, needs in _TOLERANT_READS:
        if needs in text:
            out = list(dict.fromkeys(out + [read(t) for t in out]))
    return out


def _complete_prefix(text: str) -> bool:
    """`text`, read strictly or as a tolerant repair reads it (raw control characters, invalid
    escapes, escape noise, trailing commas, unescaped quotes, a lost opening), starts with a whole
    JSON value (junk after it a repair may drop as stray characters): a drop that leaves this shape
    is not detectably destroying."""
    for candidate in _readings(text):
        try:
            _LENIENT.raw_decode(candidate.lstrip())
        except ValueError:
            continue
        return True
    return False


def fragment_dropped(rng: random.Random, wire: Wire) -> Wire | None:
    options = []
    for sent, frags in _pristine_calls(rng, wire):
        if len(frags) < 2:
            continue
        for i, (a, b) in enumerate(_spans(frags)):
            marks = sent.charmap[a:b]
            structural = "c" in marks or any(sent.whole[p] in ",:" and sent.charmap[p] == "p" for p in range(a, b))
            content = any(m in "skv" for m in marks)
            rest = "".join(frags[:i] + frags[i + 1 :])
            if structural and content and rest.strip() and not _complete_prefix(rest):
                options.append((sent, i))
    if not options:
        return None
    sent, i = rng.choice(options)
    sent.frags = (sent.frags or [])[:i] + (sent.frags or [])[i + 1 :]
    sent.applied.add("fragment_dropped")
    return wire


def arguments_cut(rng: random.Random, wire: Wire) -> Wire | None:
    options = []
    for sent, _ in _pristine_calls(rng, wire):
        m = sent.charmap
        options += [
            (sent, p) for p in range(1, len(m)) if (m[p - 1] in "os" and m[p] in "sc") or m[p - 1] + m[p] == "vv"
        ]
    if not options:
        return None
    sent, p = rng.choice(options)
    kept = []
    for f, (a, _) in zip(sent.frags or [], _spans(sent.frags or []), strict=True):
        if a < p:
            kept.append(f[: p - a])
    sent.frags = kept
    sent.applied.add("arguments_cut")
    return wire


def _picked(rng: random.Random, wire: Wire) -> tuple[Sent, list[str]] | None:
    """One of the calls, picked at random, with the fragments it goes out in."""
    if not wire.calls:
        return None
    sent = rng.choice(wire.calls)
    return sent, ensure_frags(sent, rng)


def objects_concatenated(rng: random.Random, wire: Wire) -> Wire | None:
    if (picked := _picked(rng, wire)) is None:
        return None
    sent, frags = picked
    text = "".join(frags)
    if not text:
        return None
    sent.frags = split_text(text + text, rng) if _pristine(sent) else frags + frags
    sent.applied.add("objects_concatenated")
    return wire


def resent_at_finish(rng: random.Random, wire: Wire) -> Wire | None:
    if (picked := _picked(rng, wire)) is None:
        return None
    sent, frags = picked
    if not sent.whole:
        return None
    sent.frags = frags + [sent.whole]
    sent.applied.add("resent_at_finish")
    return wire


def args_as_object(rng: random.Random, wire: Wire) -> Wire | None:
    """The arguments as a JSON object: only where the text as sent still reads, strictly, as the
    value meant (a path whose single backslashes happen to be valid escapes would go out as the
    wrong object, its information lost)."""
    options = []
    for sent in wire.calls:
        ok, value = strict_json("".join(ensure_frags(sent, rng)))
        if ok and isinstance(value, dict) and not sent.as_object and same_value(value, sent.value):
            options.append(sent)
    if not options:
        return None
    for sent in pick_some(rng, options):
        sent.as_object = True
        sent.applied.add("args_as_object")
    return wire
