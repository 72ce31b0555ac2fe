"""Fitting parsed arguments to the tool's JSON schema.

Parsers convert XML/Python-ish values with the wrong type ("True" for a boolean, an array sent as a
JSON string); a strict client rejects those. The schema also tells a complete call from one that lost
information: a required argument that never arrived cannot be invented, so it is reported, not filled.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from jsonschema import validators
from jsonschema.exceptions import SchemaError

_INT = re.compile(r"[-+]?\d+")
_NO = object()


class ToolSchemas:
    """The offered tools by name, with a validator built once per tool."""

    def __init__(self, tools: list[Any] | None) -> None:
        self.schemas: dict[str, dict[str, Any]] = {}
        self._validators: dict[str, Any] = {}
        for tool in tools or []:
            if not isinstance(tool, dict):
                continue
            fn: dict[str, Any] = tool["function"] if isinstance(tool.get("function"), dict) else tool
            name = fn.get("name")
            if isinstance(name, str) and name:
                params = fn.get("parameters")
                self.schemas[name] = params if isinstance(params, dict) else {}

    def __bool__(self) -> bool:
        return bool(self.schemas)

    @property
    def names(self) -> list[str]:
        return list(self.schemas)

    def properties(self, name: str | None) -> dict[str, Any] | None:
        if name is None or name not in self.schemas:
            return None
        props = self.schemas[name].get("properties")
        return props if isinstance(props, dict) else {}

    def validator(self, name: str) -> Any:
        if name not in self._validators:
            schema = self.schemas.get(name) or {}
            try:
                key = json.dumps(schema, separators=(",", ":"))  # the order kept: it orders the errors
            except (TypeError, ValueError):
                key = None
            self._validators[name] = _checked(key) if key is not None else _build(schema)
        return self._validators[name]

    def fit(self, name: str | None, args: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
        """Coerce mistyped values; return (args, coerced paths, missing required names)."""
        if name is None or name not in self.schemas:
            return args, [], []
        validator = self.validator(name)
        if validator is None:
            return args, [], []
        coerced: list[str] = []
        for _ in range(4):
            try:
                errors = [e for e in validator.iter_errors(args) if e.validator == "type"]
            except Exception:  # noqa: BLE001 - a hostile schema must not break the stream
                return args, coerced, []
            changed = False
            for error in errors:
                new = _coerce(error.instance, error.validator_value)
                if new is _NO:
                    continue
                path = list(error.absolute_path)
                if not path:
                    continue
                args = _set(args, path, new)
                coerced.append("$." + ".".join(str(p) for p in path))
                changed = True
            if not changed:
                break
        try:
            missing = [_missing_name(e.message) for e in validator.iter_errors(args) if e.validator == "required"]
        except Exception:  # noqa: BLE001
            missing = []
        return args, coerced, missing


def _missing_name(message: str) -> str:
    m = re.match(r"'(.*)' is a required property", message)
    return m.group(1) if m else message


def _coerce(value: Any, types: Any) -> Any:
    if not isinstance(value, str):
        return _NO
    wanted = [types] if isinstance(types, str) else list(types or [])
    s = value.strip()
    low = s.lower()
    for t in wanted:
        if t == "boolean" and low in ("true", "false"):
            return low == "true"
        if t == "integer" and _INT.fullmatch(s):
            return int(s)
        if t == "number":
            try:
                number = float(s)
            except ValueError:
                continue
            if number == number and number not in (float("inf"), float("-inf")):
                return int(s) if _INT.fullmatch(s) else number
        if t == "null" and low in ("null", "none"):
            return None
        if t in ("array", "object") and s[:1] in ("[", "{"):
            try:
                parsed = json.loads(s)
            except ValueError:
                continue
            if isinstance(parsed, list if t == "array" else dict):
                return parsed
    return _NO


def _set(container: Any, path: list[Any], value: Any) -> Any:
    head, rest = path[0], path[1:]
    if isinstance(container, dict):
        copy: Any = dict(container)
    else:
        copy = list(container)
    copy[head] = _set(copy[head], rest, value) if rest else value
    return copy


@functools.lru_cache(maxsize=512)
def _checked(key: str) -> Any:
    """A validator per distinct schema, shared by every request that offers it: checking a schema against its
    metaschema costs a few milliseconds, and an agent sends the same tools with every request."""
    return _build(json.loads(key))


def _build(schema: Any) -> Any:
    try:
        cls = validators.validator_for(schema)
        cls.check_schema(schema)
        return cls(schema)
    except (SchemaError, TypeError, ValueError):
        return None
