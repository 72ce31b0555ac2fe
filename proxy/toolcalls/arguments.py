"""Turning one call's accumulated argument fragments into a JSON string an agent can run, or a reason why not.

The order matters: strict json.loads first (a valid call is never touched), then rules that explain
a whole class of defects (a resent copy, a dropped `{"`, Python literals...), and finally the schema:
a required argument that never arrived makes the call unrecoverable instead of becoming `{}`. There is
no last-resort guesser: text no rule explains fails the call (the retryable error), since a general
JSON "repair" fills in what a dropped fragment took and hands out a different call.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any

from tapfix.proxy.toolcalls.defects import (
    AMBIGUOUS_ESCAPE,
    DUPLICATED,
    GLUED,
    INVALID_JSON,
    MISSING_FRAGMENT,
    MISSING_LAST_CHUNK,
)
from tapfix.proxy.toolcalls.escapes import EscapeReading, PathToken, read_escapes, with_literal
from tapfix.proxy.toolcalls.glued import Glued, split_glued
from tapfix.proxy.toolcalls.jsonfix import MISSING, Parsed, is_debris, loads_tolerant, strip_gemma_delimiters
from tapfix.proxy.toolcalls.schema import ToolSchemas

CUT = "arguments cut off inside a value"
_KEY_FIRST = re.compile(r'\s*([A-Za-z_$][\w$\-]*)"\s*:')
_QUOTED_KEY_FIRST = re.compile(r'\s*"([^"\\]+)"\s*:')
_FIX_CLASS = {"closed_brackets": "missing_last_chunk"}


@dataclass(slots=True)
class ArgResult:
    text: str  # the arguments to send (the original text when unchanged)
    value: Any = MISSING
    kinds: list[str] = field(default_factory=list)  # defect classes found
    fixes: list[str] = field(default_factory=list)  # finer-grained notes for the reason text
    fatal: str | None = None
    glued: list[tuple[str, str]] = field(default_factory=list)  # calls split off after these arguments

    @property
    def changed(self) -> bool:
        return bool(self.kinds)

    def note(self, kind: str, fix: str | None = None) -> None:
        if kind not in self.kinds:
            self.kinds.append(kind)
        if fix and fix not in self.fixes:
            self.fixes.append(fix)

    def fail(self, reason: str, kind: str) -> None:
        """Unrecoverable; `kind` goes first, since the first kind is what the error is recorded as."""
        self.fatal = reason
        if kind in self.kinds:
            self.kinds.remove(kind)
        self.kinds.insert(0, kind)

    def adopt(self, other: ArgResult) -> None:
        for kind in other.kinds:
            self.note(kind)
        for fix in other.fixes:
            self.note(other.kinds[0] if other.kinds else INVALID_JSON, fix)
        if other.fatal:
            self.fail(other.fatal, other.kinds[0] if other.kinds else INVALID_JSON)


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def repair_arguments(
    frags: list[Any],
    name: str | None,
    schemas: ToolSchemas,
    finish_reason: str | None = None,
    null_seen: bool = False,
) -> ArgResult:
    strings = [f for f in frags if isinstance(f, str)]
    objects = [f for f in frags if not isinstance(f, str)]
    text = "".join(strings)
    result = ArgResult(text=text)
    value = (
        _from_objects(objects, text, result)
        if objects
        else _from_text(strings, text, name, schemas, finish_reason, result)
    )
    if result.fatal:
        return result
    if value is MISSING:
        value = {}
        result.note("empty_arguments", "null arguments" if null_seen or not frags else "empty arguments")
    if isinstance(value, str) and value.strip()[:1] == "{":
        inner = loads_tolerant(value)
        if isinstance(inner.value, dict) and not inner.cut and not inner.bad:
            result.note("invalid_json", "double-encoded arguments")
            value = inner.value
    if not isinstance(value, dict):
        result.fatal = "arguments are not a JSON object"
        return result
    value, stripped = strip_gemma_delimiters(value)
    if stripped:
        result.note("invalid_json", "delimiter_debris")
    value, coerced, missing = schemas.fit(name, value)
    if coerced:
        result.note("schema_mismatch", "coerced " + ", ".join(coerced))
    if missing:
        result.fatal = "required argument " + ", ".join(repr(m) for m in missing) + " never sent"
        return result
    result.value = value
    if result.kinds and result.kinds != [GLUED]:  # split off glued calls alone: the object as written
        result.text = dumps(value)
    return result


def _from_objects(objects: list[Any], text: str, result: ArgResult) -> Any:
    """Arguments sent as a JSON object instead of a string (Ollama, MiniMax)."""
    result.note("args_as_object")
    first = objects[0]
    if any(o != first for o in objects[1:]):
        result.fatal = "argument objects disagree"
        return MISSING
    serialized = dumps(first)
    stripped = text.strip()
    if stripped and not serialized.startswith(stripped) and not json.dumps(first).startswith(stripped):
        try:
            same = json.loads(stripped) == first
        except ValueError:
            same = False
        if not same:
            result.fatal = "string and object arguments disagree"
            return MISSING
    return first


def _from_text(
    strings: list[str],
    text: str,
    name: str | None,
    schemas: ToolSchemas,
    finish: str | None,
    result: ArgResult,
) -> Any:
    if not text.strip():
        return MISSING
    props = schemas.properties(name)
    value = _strict(text, props, result)
    if value is not MISSING:
        return value
    glued = split_glued(text, name, schemas)
    if glued is not None:
        return _split(glued, text, props, schemas, finish, result)
    resent = _resent_whole(strings, props)
    if resent is not None:
        result.note(DUPLICATED, "final chunk resent the whole arguments")
        return _read(resent, name, schemas, finish, result)
    deduped = _without_repeated_fragments(strings, name, schemas)
    if deduped is not None:
        result.note(DUPLICATED, "fragment sent twice in a row")
        return _read(deduped, name, schemas, finish, result)
    return _read_invalid(text, name, schemas, finish, result)


def _split(
    glued: Glued, text: str, props: dict[str, Any] | None, schemas: ToolSchemas, finish: str | None, result: ArgResult
) -> Any:
    """The first call's arguments; the calls glued after them, each repaired as a call, in `result.glued`."""
    for name, args in glued.calls:
        sub = repair_arguments([args], name, schemas, finish)
        if sub.fatal:
            result.fail(f"the call of {name!r} glued after the arguments: {sub.fatal}", (sub.kinds or [GLUED])[0])
            return MISSING
        result.glued += [(name, sub.text), *sub.glued]
    names = ", ".join(repr(n) for n, _ in glued.calls)
    result.note(GLUED, f"the call of {names} glued after the arguments' object: split where its name starts")
    result.text = glued.first_text
    return _trusted(glued.first_text, glued.first, props, result)


def _read(text: str, name: str | None, schemas: ToolSchemas, finish: str | None, result: ArgResult) -> Any:
    """The one reading of an arguments text, whether as received or the copy a duplicate removal chose: the
    same escape evidence decides either way, so a copy's Windows path keeps its backslashes."""
    value = _strict(text, schemas.properties(name), result)
    return value if value is not MISSING else _read_invalid(text, name, schemas, finish, result)


def _strict(text: str, props: dict[str, Any] | None, result: ArgResult) -> Any:
    """The value of text that json.loads reads (MISSING otherwise), through the path evidence."""
    try:
        value = json.loads(text)
    except ValueError:
        return MISSING
    return _trusted(text, value, props, result)


def _read_invalid(text: str, name: str | None, schemas: ToolSchemas, finish: str | None, result: ArgResult) -> Any:
    """A text json.loads refused: repeated objects, the escape readings, then the tolerant reader."""
    props = schemas.properties(name)
    repeated = _strict_repeats(text)
    if repeated is not MISSING:
        result.note(DUPLICATED, "arguments repeated")
        return _trusted(text, repeated, props, result)
    reading = read_escapes(text, props, valid=False)
    if not reading.ambiguous:
        return _tolerant(_literal(text, reading.literal, result), props, finish, result)
    return _either_reading(text, reading, name, schemas, finish, result)


def _trusted(text: str, value: Any, props: dict[str, Any] | None, result: ArgResult) -> Any:
    """Valid JSON stays as parsed, unless a path-shaped token has strong evidence of single backslashes."""
    reading = read_escapes(text, props, valid=True)
    if not reading.literal:
        return value
    scratch = ArgResult(text)
    literal = _strict_repeats(_literal(text, reading.literal, scratch))
    if literal is MISSING:
        return value
    result.adopt(scratch)
    return literal


def _literal(text: str, tokens: list[PathToken], result: ArgResult) -> str:
    for token in tokens:
        result.note(INVALID_JSON, "path-shaped token read with literal backslashes: " + token.shown(text))
    return with_literal(text, tokens) if tokens else text


def _either_reading(
    text: str,
    reading: EscapeReading,
    name: str | None,
    schemas: ToolSchemas,
    finish: str | None,
    result: ArgResult,
) -> Any:
    """Weak tokens the evidence doesn't decide: keep the only reading the schema accepts, else fail."""
    props = schemas.properties(name)
    fitting: list[tuple[Any, ArgResult]] = []
    for tokens in (reading.literal, reading.literal + reading.ambiguous):
        scratch = ArgResult(text)
        value = _tolerant(_literal(text, tokens, scratch), props, finish, scratch)
        if not scratch.fatal and _fits(value, name, schemas):
            fitting.append((value, scratch))
    if len(fitting) == 1 or (len(fitting) == 2 and fitting[0][0] == fitting[1][0]):
        value, scratch = fitting[-1]
        result.adopt(scratch)
        return value
    keys = sorted({t.key or "?" for t in reading.ambiguous})
    why = "both readings valid" if fitting else "neither reading valid"
    result.fail("ambiguous escapes in " + ", ".join(repr(k) for k in keys) + ": " + why, AMBIGUOUS_ESCAPE)
    return MISSING


def _fits(value: Any, name: str | None, schemas: ToolSchemas) -> bool:
    """A complete object that the tool's schema accepts (after the usual coercions)."""
    if not isinstance(value, dict):
        return False
    fitted, _, missing = schemas.fit(name, value)
    if missing:
        return False
    if name is None or name not in schemas.schemas:
        return True
    validator = schemas.validator(name)
    try:
        return validator is None or bool(validator.is_valid(fitted))
    except Exception:  # noqa: BLE001 - a hostile schema must not break the stream
        return True


def _without_repeated_fragments(strings: list[str], name: str | None, schemas: ToolSchemas) -> str | None:
    """MTP / speculative decoding sends a fragment twice in a row. Try dropping one copy of each such
    pair (every combination, up to 4 pairs); the text is used when exactly one distinct value parses
    strictly and fits the schema."""
    pairs = [k for k in range(1, len(strings)) if strings[k] and strings[k] == strings[k - 1]]
    if not pairs:
        return None
    if len(pairs) <= 4:
        choices = [c for m in range(1, len(pairs) + 1) for c in itertools.combinations(pairs, m)]
    else:
        choices = [(k,) for k in pairs] + [tuple(pairs)]
    found: dict[str, str] = {}
    for drop in choices:
        skip = set(drop)
        candidate = "".join(f for k, f in enumerate(strings) if k not in skip)
        value = _strict_repeats(candidate)
        if value is not MISSING and _fits(value, name, schemas):
            found.setdefault(json.dumps(value, sort_keys=True), candidate)
    return next(iter(found.values())) if len(found) == 1 else None


def _strict_repeats(text: str) -> Any:
    """The value of strictly valid JSON, or of the same object strictly written twice or more in a row."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    pos, n = 0, len(text)
    try:
        while True:
            while pos < n and text[pos] in " \t\r\n":
                pos += 1
            if pos >= n:
                break
            value, pos = decoder.raw_decode(text, pos)
            values.append(value)
    except ValueError:
        return MISSING
    if not values or any(v != values[0] for v in values[1:]):
        return MISSING
    return values[0]


def _tolerant(text: str, props: dict[str, Any] | None, finish: str | None, result: ArgResult) -> Any:
    """The tolerant reader, for text that is not valid JSON."""
    text = _restore_prefix(text, props, result)
    parsed = loads_tolerant(text)
    if parsed.cut or (parsed.closed and not _only_the_last_brace_lost(parsed, props, finish)):
        result.fail(CUT, MISSING_LAST_CHUNK)
        return MISSING
    if parsed.lost:
        result.fail(parsed.lost_reason, MISSING_FRAGMENT)
        return MISSING
    if parsed.spliced:
        result.fatal = "a key repeats: fragments were spliced"
        return MISSING
    if parsed.bad or parsed.value is MISSING:
        result.fatal = "arguments are not valid JSON"  # no reading of the defect classes explains the text
        return MISSING
    for fix in parsed.fixes:
        result.note(_FIX_CLASS.get(fix, INVALID_JSON), fix)
    value = parsed.value
    rest = parsed.rest
    if rest.strip():
        if is_debris(rest):
            result.note(INVALID_JSON, "trailing debris")
        else:
            while rest.strip() and not is_debris(rest):  # the same object again, once or more
                again = loads_tolerant(rest)
                if again.value != value or again.cut or again.bad or again.closed:
                    result.fatal = "two argument objects in one call"
                    return MISSING
                rest = again.rest
            result.note(DUPLICATED, "arguments repeated")
    return value


def _only_the_last_brace_lost(parsed: Parsed, props: dict[str, Any] | None, finish: str | None) -> bool:
    """Whether missing closers at the end are only the top-level `}` a parser dropped, and nothing else could
    have followed: the last value ended (a closed string, a literal or container; a number at the end may
    be cut: `{"n": 4` of `{"n": 45}`), and every property the tool declares is there. Otherwise the text
    is indistinguishable from arguments cut short, and completing them would hand out a different call."""
    if parsed.closed != 1 or finish == "length" or parsed.ends_on_number or not props:
        return False
    if "unescaped_quote" in parsed.fixes:
        return False  # the string that ends the text may have been cut right after a quote inside it
    return isinstance(parsed.value, dict) and all(key in parsed.value for key in props)


def _resent_whole(strings: list[str], props: dict[str, Any] | None) -> str | None:
    """A later fragment that is a whole object by itself resends the arguments (vLLM hermes final delta).

    Returns the copy's text, for the caller to read like any other: it parses strictly, or once the
    path-shaped tokens the evidence reads literally are (`C:\\Data\\new`), or with raw control characters."""
    tried = 0
    for k in range(len(strings) - 1, 0, -1):
        if not strings[k].lstrip().startswith("{"):
            continue
        tried += 1
        if tried > 4:
            break
        suffix = "".join(strings[k:])
        value = _whole_copy(suffix, props)
        if not isinstance(value, dict):
            continue
        prefix = "".join(strings[:k])
        if not prefix.strip():
            return None
        if suffix.startswith(prefix) or prefix == suffix:
            return suffix
        head = loads_tolerant(prefix)
        members = head.value if isinstance(head.value, dict) else head.partial
        if members is not None and set(members) <= set(value) and not _first_key_differs(prefix, value):
            return suffix
    return None


def _whole_copy(text: str, props: dict[str, Any] | None) -> Any:
    """The value of a fragment that is one whole object as written: strict JSON, or strict once raw control
    characters and the literal-backslash reading of path-shaped tokens are allowed (MISSING otherwise)."""
    for candidate in (text, with_literal(text, read_escapes(text, props, valid=False).literal)):
        try:
            return json.loads(candidate, strict=False)
        except ValueError:
            continue
    return MISSING


def _first_key_differs(prefix: str, value: dict[str, Any]) -> bool:
    m = re.match(r'\s*\{\s*"([^"\\]*)"', prefix)
    return m is not None and m.group(1) not in value


def _restore_prefix(text: str, props: dict[str, Any] | None, result: ArgResult) -> str:
    """Put back a dropped `{"` (or `{`) when the text starts with a declared property name."""
    stripped = text.lstrip()
    if not stripped or stripped[0] in "{[":
        return text
    for pattern, prefix in ((_KEY_FIRST, '{"'), (_QUOTED_KEY_FIRST, "{")):
        m = pattern.match(stripped)
        if m and (props is None or m.group(1) in props):
            result.note("missing_first_chunk", "restored " + prefix)
            return prefix + stripped
    return text
