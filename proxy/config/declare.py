"""How a run setting is declared: once, with everything the command line, the config file, its JSON
Schema and the docs need to know about it (`settings.py` holds the declarations).

A `Setting` says what kind of value it takes, its default, its range, its help line, its flag, its
config key, and which `[models.NAME]` or `[upstreams.NAME]` key may set it for one model or upstream.
Everything else is derived: the click option (`cli/settings_options.py`), the config key's schema and
the reference tables (`cli/reference.py`), the range check with its message (`Setting.check`).

Plain values only, below every package: the kinds are words (`"size"`, `"listen"`), and the layers that
own a kind's conversion (the CLI, the store) read the word.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

# What a value is, which decides how it is read from the command line and the config file:
#   text, secret (an empty value is none), url: a string; int, number: with `unit` and `range`;
#   flag: true/false (the flag sets the opposite of the default); choice: one of `choices`;
#   file (exists, not a folder), path (exists): a Path; listen: (host, port) from HOST:PORT;
#   store: a capture store locator (a SQLite path or a postgresql:// URL); age: seconds from `7d`;
#   size: bytes from `2G`; hosts: a list of names, the flag repeatable.
Kind = Literal[
    "text",
    "secret",
    "url",
    "int",
    "number",
    "flag",
    "choice",
    "file",
    "path",
    "listen",
    "store",
    "age",
    "size",
    "hosts",
]
Table = Literal["models", "upstreams"]

SETTING = "tapfix.setting"  # the dataclass field metadata key a declaration lives under


class SettingError(ValueError):
    """A value out of its setting's range; `str(e)` names the setting, the range and the value."""


@dataclass(frozen=True, slots=True)
class Range:
    """`min`..`max`; `min_open`: `min` itself is refused. `zero`: what 0 means, said with the range."""

    min: float | None = None
    max: float | None = None
    min_open: bool = False
    zero: str | None = None


@dataclass(frozen=True, slots=True)
class PerTable:
    """The key a `[models.NAME]` or `[upstreams.NAME]` table sets the setting with, for that model or
    upstream (a dotted key is nested: `reasoning.dialect`). `same_shape`: the key takes the setting's own
    values, so its schema is derived from the declaration; otherwise the table's schema says (a quick-mode
    flag whose config-mode key has more to it, e.g. `engine`)."""

    table: Table
    key: str
    help: str
    same_shape: bool = True


@dataclass(frozen=True, slots=True)
class Setting:
    kind: Kind
    help: str  # the --help line, and what the docs say it does
    default: Any = None
    flag: str | None = None  # "--shutdown-grace"; None: not on the command line
    short: str | None = None  # "-v"
    metavar: str | None = None
    key: str | None = None  # the config file's key ("tool_repair.mode" is [tool_repair] mode); None: flag only
    range: Range | None = None
    unit: str | None = None  # "seconds": said in messages and the docs
    choices: tuple[str, ...] = ()
    registry: str | None = None  # the choices are a registry's names, above this layer ("tool-call formats")
    per: PerTable | None = None
    envvar: str | None = None
    old_flags: tuple[str, ...] = ()  # deprecated spellings: hidden, they warn and still work
    default_text: str | None = None  # how the docs and --help show the default when it isn't the value itself
    docs: str = ""  # more than the --help line says, for the reference tables
    name: str = field(default="", compare=False)  # the Settings attribute; filled in by `declared()`

    @property
    def is_number(self) -> bool:
        return self.kind in ("int", "number")

    def shown_default(self) -> str | None:
        """The default as a user writes it (`5`, `127.0.0.1:8080`, `256MiB`); None: no default to show."""
        if self.default_text is not None:
            return self.default_text
        value = self.default
        if value is None or self.kind == "flag" or value == ():
            return None  # a flag is off until given (`--no-bodies` turns a default on off)
        if self.kind == "listen":
            host, port = value
            return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if self.kind == "size":
            return size_text(int(value))
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)

    def expectation(self) -> str:
        """What the setting takes, as the messages say it: `a whole number from 0 to 10 (0 = off)`."""
        if self.kind == "flag":
            return "true or false"
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if not self.is_number:
            return "a value"
        words = "a whole number" if self.kind == "int" else "a number"
        if self.unit:
            words += f" of {self.unit}"
        r = self.range
        if r is not None:
            low, high = _num(r.min), _num(r.max)
            if r.min is not None and r.max is not None:
                words += f" above {low} and at most {high}" if r.min_open else f" from {low} to {high}"
            elif r.min is not None:
                words += f" above {low}" if r.min_open else f" of {low} or more"
            elif r.max is not None:
                words += f" of at most {high}"
            if r.zero:
                words += f" (0 = {r.zero})"
        return words

    def check(self, value: Any, name: str | None = None) -> Any:
        """`value` if the setting takes it (a number as int or float, as the kind says), else SettingError
        naming `name` (the setting's own by default), what it takes and what it got."""
        if not self.accepts(value):
            raise SettingError(f"{name or self.name} must be {self.expectation()}, got {value!r}")
        if self.kind == "int":
            return int(value)
        if self.kind == "number":
            return float(value)
        return value

    def accepts(self, value: Any) -> bool:
        if self.kind == "flag":
            return isinstance(value, bool)
        if self.kind == "choice":
            return value in self.choices
        if not self.is_number:
            return True
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.kind == "int" and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        r = self.range
        if r is None:
            return True
        if r.min is not None and (value <= r.min if r.min_open else value < r.min):
            return False
        return r.max is None or value <= r.max

    def schema(self) -> dict[str, Any]:
        """The JSON Schema of the setting's config key (or its per-table key), without its description."""
        out: dict[str, Any] = {}
        if self.kind == "flag":
            out["type"] = "boolean"
        elif self.kind == "choice":
            out["enum"] = list(self.choices)
        elif self.is_number:
            out["type"] = "integer" if self.kind == "int" else "number"
            r = self.range
            if r is not None and r.min is not None:
                out["exclusiveMinimum" if r.min_open else "minimum"] = _json_number(r.min)
            if r is not None and r.max is not None:
                out["maximum"] = _json_number(r.max)
        elif self.kind == "listen":
            out.update({"type": "string", "pattern": "^.+:[0-9]{1,5}$", "x-expected": "HOST:PORT, e.g. 127.0.0.1:8080"})
        else:
            out.update({"type": "string", "minLength": 1})
        return out


def setting[T](default: T, **declared: Any) -> T:
    """A `Settings` field declared once: `shutdown_grace: float = setting(5.0, kind="number", ...)`.

    The dataclass sees a field with this default; the declaration rides along in its metadata."""
    return field(default=default, metadata={SETTING: Setting(default=default, **declared)})


def size_text(n: int) -> str:
    """Bytes as the options take them back: `256MiB`, `1MiB`, `10B`."""
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


def _json_number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value
