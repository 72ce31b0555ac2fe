"""Defect mutations of a call's arguments: values against the schema, and escapes in the JSON text (the
fragments it is streamed in: mutations_frags). Each is `(rng, wire) -> wire | None` (None: the turn
has nothing the defect applies to) and edits the wire's calls before they are rendered.

A preserving mutation is built so that the result still says the original arguments uniquely; where
a definition would let two readings stand, the mutation declines (returns None) instead:
- `path_backslashes` only touches a Windows or UNC path in a path-named property, with no whitespace,
  no doubled or trailing backslash (past a UNC `\\\\`), no `\\u` + 4 hex digits and no `\\/`; and
  only when the single-backslash text is not already valid JSON for a string without control
  characters (then both readings would stand);
- `unescaped_quotes` leaves a quote escaped when what follows it (spaces and escape noise skipped)
  could end the string: `,` `}` `]` `:`; keys are never touched;
- `scalar_as_string` / `container_as_string` only touch a property whose schema type says, alone
  (no `string`, no anyOf/enum), what the value was;
- each string token is rewritten by at most one escape mutation.
`required_missing` (destroying) removes a property the schema requires, so the loss is detectable.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from typing import Any

from tapfix.proxy.mock.mutations_wire import (
    Sent,
    Token,
    Wire,
    ensure_tokens,
    schema_of,
    strict_json,
)

SCHEMA_DEPENDENT = frozenset({"scalar_as_string", "container_as_string", "required_missing", "path_backslashes"})


def same_value(a: Any, b: Any) -> bool:
    """JSON equality that tells `true` from `1` (Python's `==` doesn't)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def pick_some(rng: random.Random, items: list[Any]) -> list[Any]:
    """A non-empty random subset, in order."""
    count = rng.randint(1, len(items))
    chosen = set(rng.sample(range(len(items)), count))
    return [x for i, x in enumerate(items) if i in chosen]


def _untokenized(wire: Wire) -> list[int]:
    return [k for k, s in enumerate(wire.calls) if s.tokens is None and s.frags is None]


# -- schema (values) ---------------------------------------------------------------------------------
def _types(schema: Any) -> set[str] | None:
    if not isinstance(schema, dict) or any(k in schema for k in ("anyOf", "oneOf", "allOf", "enum", "const")):
        return None
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list) and all(isinstance(x, str) for x in kind):
        return set(kind)
    return None


def _slots(value: Any, schema: Any) -> Iterator[tuple[dict[str, Any], str, dict[str, Any]]]:
    """Every (object, property, property schema) of `value` the schema declares, outer first."""
    if isinstance(value, dict) and isinstance(schema, dict):
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        for key, item in value.items():
            sub = props.get(key)
            if isinstance(sub, dict):
                yield value, key, sub
                yield from _slots(item, sub)
    elif isinstance(value, list) and isinstance(schema, dict):
        for item in value:
            yield from _slots(item, schema.get("items"))


def _is_scalar_slot(value: Any, schema: dict[str, Any]) -> bool:
    types = _types(schema)
    if not types or "string" in types:
        return False
    wanted = types - {"null"}
    if isinstance(value, bool):
        return wanted == {"boolean"}
    if isinstance(value, (int, float)):
        return bool(wanted) and wanted <= {"integer", "number"}
    return False


def _is_container_slot(value: Any, schema: dict[str, Any]) -> bool:
    types = _types(schema)
    if not types or "string" in types:
        return False
    wanted = types - {"null"}
    return (wanted == {"array"} and isinstance(value, list)) or (wanted == {"object"} and isinstance(value, dict))


def _stringify(wire: Wire, rng: random.Random, name: str, fits: Any, render: Any) -> Wire | None:
    done = False
    for k in _untokenized(wire):
        sent = wire.calls[k]
        slots = [s for s in _slots(sent.value, schema_of(wire.turn, sent.name)) if fits(s[0][s[1]], s[2])]
        if not slots or (done and rng.random() < 0.5):
            continue
        for obj, key, _ in reversed(pick_some(rng, slots)):  # inner first: an outer copy includes it
            obj[key] = render(obj[key])
        sent.applied.add(name)
        done = True
    return wire if done else None


def scalar_as_string(rng: random.Random, wire: Wire) -> Wire | None:
    return _stringify(wire, rng, "scalar_as_string", _is_scalar_slot, json.dumps)


def container_as_string(rng: random.Random, wire: Wire) -> Wire | None:
    seps = rng.choice(((",", ":"), (", ", ": ")))
    return _stringify(
        wire,
        rng,
        "container_as_string",
        _is_container_slot,
        lambda v: json.dumps(v, ensure_ascii=False, separators=seps),
    )


def required_missing(rng: random.Random, wire: Wire) -> Wire | None:
    options = []
    for k in _untokenized(wire):
        sent = wire.calls[k]
        required = schema_of(wire.turn, sent.name).get("required")
        if isinstance(sent.value, dict) and isinstance(required, list):
            options += [(k, r) for r in required if isinstance(r, str) and r in sent.value]
    if not options:
        return None
    k, key = rng.choice(options)
    del wire.calls[k].value[key]
    wire.calls[k].applied.add("required_missing")
    return wire


# -- escapes (the JSON text) -------------------------------------------------------------------------
def _value_strings(wire: Wire, test: Any) -> list[tuple[Sent, Token]]:
    out = []
    for sent in wire.calls:
        if sent.frags is not None:
            continue
        for tok in ensure_tokens(sent):
            if tok.kind == "string" and not tok.is_key and not tok.touched and test(tok):
                out.append((sent, tok))
    return out


def _esc(ch: str) -> str:
    return json.dumps(ch, ensure_ascii=False)[1:-1]


_PATH_KEYS = {"path", "filepath", "file", "filename", "dir", "directory", "cwd", "workdir", "folder", "target"}
_SEGMENT = r"[^\s\"\\/\x00-\x1f]+"
WINDOWS_PATH = re.compile(rf"(?:[A-Za-z]:\\|\\\\{_SEGMENT}\\){_SEGMENT}(?:\\{_SEGMENT})*")
_UNICODE_ESCAPE = re.compile(r"\\u[0-9A-Fa-f]{4}")


def _path_token(tok: Token) -> bool:
    key = (tok.key or "").lower().replace("_", "").replace("-", "")
    text = tok.value
    if key not in _PATH_KEYS or not isinstance(text, str) or not WINDOWS_PATH.fullmatch(text):
        return False
    if _UNICODE_ESCAPE.search(text):
        return False
    ok, standard = strict_json('"' + text + '"')
    return not (ok and not any(ord(c) < 0x20 for c in standard))  # valid JSON and plausible: undecided


def path_backslashes(rng: random.Random, wire: Wire) -> Wire | None:
    options = _value_strings(wire, _path_token)
    if not options:
        return None
    for sent, tok in pick_some(rng, options):
        tok.raw = '"' + tok.value + '"'
        tok.touched = "path_backslashes"
        sent.applied.add("path_backslashes")
    return wire


_NOISE = ("\\n", "\\t", "\\n  ", "\\r\\n", "\\n\\t")


def escaped_whitespace(rng: random.Random, wire: Wire) -> Wire | None:
    options = [s for s in wire.calls if s.frags is None and len(ensure_tokens(s)) > 1]
    if not options:
        return None
    for sent in pick_some(rng, options):
        tokens = ensure_tokens(sent)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(1, len(tokens))
            tokens.insert(at, Token("ws", rng.choice(_NOISE)))
        sent.applied.add("escaped_whitespace")
    return wire


def raw_control_characters(rng: random.Random, wire: Wire) -> Wire | None:
    options = _value_strings(wire, lambda t: any(c in t.value for c in "\n\t\r"))
    if not options:
        return None
    for sent, tok in pick_some(rng, options):
        raw_all = rng.random() < 0.5
        chars = [c if c in "\n\t\r" and (raw_all or rng.random() < 0.5) else _esc(c) for c in tok.value]
        if all(len(c) != 1 or c not in "\n\t\r" for c in chars):
            chars = [c if c in "\n\t\r" else _esc(c) for c in tok.value]
        tok.raw = '"' + "".join(chars) + '"'
        tok.touched = "raw_control_characters"
        sent.applied.add("raw_control_characters")
    return wire


SPACE_AND_NOISE = re.compile(r"(?:[ \t\r\n]|\\[ntr])*")


def _unescape_quotes(text: str) -> str | None:
    pieces = [_esc(c) for c in text]
    bare = False
    for j, ch in enumerate(text):
        if ch != '"':
            continue
        rest = "".join(pieces[j + 1 :]) + '"'
        after = rest[SPACE_AND_NOISE.match(rest).end() :]  # type: ignore[union-attr]
        if after[:1] not in (",", "}", "]", ":", '"'):  # a quote before these could end the string
            pieces[j] = '"'
            bare = True
    return '"' + "".join(pieces) + '"' if bare else None


def unescaped_quotes(rng: random.Random, wire: Wire) -> Wire | None:
    options = [
        (s, t, raw) for s, t in _value_strings(wire, lambda t: '"' in t.value) if (raw := _unescape_quotes(t.value))
    ]
    if not options:
        return None
    for sent, tok, raw in pick_some(rng, options):
        tok.raw = raw
        tok.touched = "unescaped_quotes"
        sent.applied.add("unescaped_quotes")
    return wire
