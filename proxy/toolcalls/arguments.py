"""Turning one call's accumulated argument fragments into a JSON string an agent can run, or a reason why not.

The order matters: strict json.loads first (a valid call is never touched), then rules that explain
a whole class of defects (a resent copy, a dropped `{"`, Python literals...), json-repair once as a
last resort, and finally the schema: a required argument that never arrived makes the call
unrecoverable instead of becoming `{}`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import json_repair
from tapfix.proxy.toolcalls.jsonfix import MISSING, is_debris, loads_tolerant, strip_gemma_delimiters
from tapfix.proxy.toolcalls.schema import ToolSchemas

CUT = "arguments cut off inside a value"
_KEY_FIRST = re.compile(r'\s*([A-Za-z_$][\w$\-]*)"\s*:')
_QUOTED_KEY_FIRST = re.compile(r'\s*"([^"\\]+)"\s*:')
_LOSSY = re.compile(r"ignor|remov|miss|stray|skip|discard|drop|doubled|misplaced|unexpected", re.I)
_FIX_CLASS = {"closed_brackets": "missing_last_chunk"}


@dataclass(slots=True)
class ArgResult:
    text: str  # the arguments to send (the original text when unchanged)
    value: Any = MISSING
    kinds: list[str] = field(default_factory=list)  # defect classes found
    fixes: list[str] = field(default_factory=list)  # finer-grained notes for the reason text
    fatal: str | None = None

    @property
    def changed(self) -> bool:
        return bool(self.kinds)

    def note(self, kind: str, fix: str | None = None) -> None:
        if kind not in self.kinds:
            self.kinds.append(kind)
        if fix and fix not in self.fixes:
            self.fixes.append(fix)


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
    if result.kinds:
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
    try:
        return json.loads(text)
    except ValueError:
        pass
    resent = _resent_whole(strings)
    if resent is not MISSING:
        result.note("duplicated_fragments", "final chunk resent the whole arguments")
        return resent
    props = schemas.properties(name)
    text = _restore_prefix(text, props, result)
    parsed = loads_tolerant(text)
    if parsed.cut or (parsed.closed and finish == "length"):
        result.fatal = CUT
        return MISSING
    if parsed.spliced:
        result.fatal = "a key repeats: fragments were spliced"
        return MISSING
    if parsed.bad or parsed.value is MISSING:
        return _last_resort(text, result)
    for fix in parsed.fixes:
        result.note(_FIX_CLASS.get(fix, "invalid_json"), fix)
    value = parsed.value
    rest = parsed.rest
    if rest.strip():
        if is_debris(rest):
            result.note("invalid_json", "trailing debris")
        else:
            again = loads_tolerant(rest)
            if again.value == value and (not again.rest.strip() or is_debris(again.rest)):
                result.note("duplicated_fragments", "arguments repeated")
            else:
                result.fatal = "two argument objects in one call"
                return MISSING
    return value


def _resent_whole(strings: list[str]) -> Any:
    """A later fragment that is a whole object by itself resends the arguments (vLLM hermes final delta)."""
    tried = 0
    for k in range(len(strings) - 1, 0, -1):
        if not strings[k].lstrip().startswith("{"):
            continue
        tried += 1
        if tried > 4:
            break
        suffix = "".join(strings[k:])
        try:
            value = json.loads(suffix)
        except ValueError:
            continue
        if not isinstance(value, dict):
            continue
        prefix = "".join(strings[:k])
        if not prefix.strip():
            return MISSING
        if suffix.startswith(prefix) or prefix == suffix:
            return value
        head = loads_tolerant(prefix)
        members = head.value if isinstance(head.value, dict) else head.partial
        if members is not None and set(members) <= set(value) and not _first_key_differs(prefix, value):
            return value
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


def _last_resort(text: str, result: ArgResult) -> Any:
    """json-repair, once per finished call; accepted only when it kept what the model wrote."""
    try:
        # With logging=True it returns (object, log); json-repair's annotations say so only in later releases.
        outcome: Any = json_repair.repair_json(text, return_objects=True, logging=True)
        repaired, log = outcome
    except Exception:  # noqa: BLE001 - a third-party parser must not break the stream
        repaired, log = None, []
    # It also "repairs" by dropping or splicing what the model wrote: accept only additive fixes.
    lossy = any(_LOSSY.search(str(entry.get("text", ""))) for entry in log if isinstance(entry, dict))
    if isinstance(repaired, dict) and repaired and not lossy:
        result.note("invalid_json", "json_repair")
        return repaired
    result.fatal = "arguments are not valid JSON"
    return MISSING
