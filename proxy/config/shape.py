"""The config file's shape, and how a problem with it is said: the JSON Schema in
`schemas/config.schema.json`, a credential written in the file, a NaN or infinity anywhere. Every
message names the place in the file, what was found and what was expected (`config/file.py` adds the
checks a schema can't express and reports them together with these)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from importlib.resources import files
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from tapfix.proxy.quantities import finite

_LITERAL_KEYS = {"api_key", "apikey", "key", "token", "secret", "password", "authorization", "bearer"}
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


_VALIDATOR: Draft202012Validator | None = None


def schema() -> dict[str, Any]:
    text = (files("tapfix.schemas") / "config.schema.json").read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def shape_problems(data: Mapping[str, Any], source: str) -> list[str]:
    """What is wrong with the file's shape: a credential written in it, what the schema refuses, and a NaN
    or infinity anywhere (TOML allows them; they pass every range a schema states, `nan < 0` being false).
    One message per place."""
    global _VALIDATOR
    found = _literal_credentials(data) | dict(_non_finite(data))
    problems = [f"{source}: {where}: {message}" for where, message in found.items()]
    if _VALIDATOR is None:
        _VALIDATOR = Draft202012Validator(schema())
    errors = sorted(_VALIDATOR.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
    for e in errors:
        for where, message in _describe(e):
            if where not in found:
                problems.append(f"{source}: {where}: {message}")
    return problems


def _non_finite(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """(place, message) for every NaN or infinity in the parsed file (`tapfix.proxy.quantities.finite`)."""
    if isinstance(value, float):
        try:
            finite(value, "found")
        except ValueError as e:
            yield _dotted(path) or "(top level)", str(e).removeprefix("found: ")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _non_finite(item, (*path, str(key)))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _non_finite(item, (*path, str(i)))


def _literal_credentials(data: Mapping[str, Any]) -> dict[str, str]:
    found = {}
    upstreams = data.get("upstreams")
    if isinstance(upstreams, dict):
        for name, u in upstreams.items():
            if isinstance(u, dict):
                for key in u:
                    if key.lower().replace("-", "_") in _LITERAL_KEYS:
                        found[f"upstreams.{key_name(name)}.{key_name(key)}"] = (
                            'found a credential written in the file, expected api_key_env = "SOME_ENV_VAR" '
                            "naming the environment variable that holds it"
                        )
    return found


def _describe(e: ValidationError) -> list[tuple[str, str]]:
    """(path in the file, "found ..., expected ...") for one schema error."""
    where = _dotted(e.absolute_path)
    v = e.validator
    # The config schema is all objects, so the failing subschema is one too (jsonschema also allows `true`).
    at: Mapping[str, Any] = e.schema if isinstance(e.schema, Mapping) else {}
    if v == "additionalProperties":
        allowed = ", ".join(sorted(at.get("properties", {})))
        extra = [k for k in e.instance if k not in at.get("properties", {})] if isinstance(e.instance, dict) else []
        prefix = f"{where}." if where else ""
        return [(f"{prefix}{key_name(k)}", f"found an unknown key, expected one of {allowed}") for k in extra]
    if v == "required":
        missing = re.findall(r"'([^']+)' is a required property", e.message)
        name = missing[0] if missing else "?"
        sub = at.get("properties", {}).get(name, {})
        prefix = f"{where}." if where else ""
        return [(f"{prefix}{key_name(name)}", f"missing, expected {_expectation(sub, name)}")]
    found = _found(e)
    expected = at.get("x-expected")
    if expected is None:
        if v in ("enum", "type"):
            expected = _expectation({v: e.validator_value}, "")
        elif v in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            op = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}[v]
            expected = f"a number {op} {e.validator_value}"
        elif v == "minProperties":
            expected = "at least one entry"
        elif v == "uniqueItems":
            expected = "no duplicates"
        else:
            expected = e.message
    return [(where or "(top level)", f"found {found}, expected {expected}")]


def _expectation(sub: Mapping[str, Any], name: str) -> str:
    if "x-expected" in sub:
        return str(sub["x-expected"])
    if "enum" in sub:
        return "one of " + ", ".join(str(x) for x in sub["enum"])
    if "$ref" in sub:
        return f"a [{name}] table" if name else "a table"
    types = sub.get("type", [])
    words = {
        "object": f"a [{name}.NAME] table" if name else "a table",
        "array": "a list",
        "integer": "an integer",
        "number": "a number",
        "string": "a string",
        "boolean": "true or false",
    }
    names = types if isinstance(types, list) else [types]
    return " or ".join(words.get(str(t), str(t)) for t in names) or "a value"


def _found(e: ValidationError) -> str:
    value = e.instance
    if e.validator == "pattern" and list(e.absolute_path)[-1:] == ["api_key_env"] and isinstance(value, str):
        return f"{value[:3]}… (redacted, {len(value)} characters)"
    kind = {
        dict: "a table",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
    }.get(type(value), type(value).__name__)
    if isinstance(value, dict | list):
        return kind
    return f"{value!r} ({kind})"


def _dotted(path: Any) -> str:
    return ".".join(key_name(str(p)) for p in path)


def key_name(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else json.dumps(name)
