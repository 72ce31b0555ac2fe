"""The registry of tool-call formats: one module per format family in this package.

Every module here is imported once and each `ToolFormat` subclass (or instance: a declared
`TaggedJson`) with a `name` is registered, so a new family is one new file. `armed(None)` gives every
format, `armed("glm47")` only that one.
"""

from __future__ import annotations

import importlib
import pkgutil

from tapfix.proxy.toolcalls.formats.base import Markup, RawCall, ToolFormat, XmlArgs
from tapfix.proxy.toolcalls.formats.placement import Found
from tapfix.proxy.toolcalls.formats.registry import Formats, UnknownFormat

_SKIP = {"base", "registry", "__main__"}


def _discover() -> dict[str, ToolFormat]:
    found: dict[str, ToolFormat] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name in _SKIP or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            fmt = _declared(value, module.__name__)
            if fmt is not None and fmt.name and found.get(fmt.name) is not value:
                if fmt.name in found:
                    raise RuntimeError(f"tool format {fmt.name!r} registered twice")
                found[fmt.name] = fmt
    return found


def _declared(value: object, module: str) -> ToolFormat | None:
    """A format a module declares: a `ToolFormat` subclass of its own, or an instance (`TaggedJson(…)`)."""
    if isinstance(value, type) and issubclass(value, ToolFormat) and value.__module__ == module:
        return value() if value.name else None
    return value if isinstance(value, ToolFormat) else None


REGISTRY: dict[str, ToolFormat] = _discover()
_ALL = Formats(REGISTRY.values())


def _aliases() -> dict[str, list[ToolFormat]]:
    out: dict[str, list[ToolFormat]] = {}
    for fmt in REGISTRY.values():
        for alias in fmt.aliases:
            if alias in REGISTRY:
                raise RuntimeError(f"tool format alias {alias!r} is also a format's name")
            out.setdefault(alias, []).append(fmt)
    return out


ALIASES: dict[str, list[ToolFormat]] = _aliases()


def names() -> list[str]:
    """Every name `--tool-format` and `tool_format =` take: the formats' and their aliases."""
    return sorted([*REGISTRY, *ALIASES])


def armed(pinned: str | None = None) -> Formats:
    """Every format, or only the pinned one(s) (UnknownFormat names the registered ones)."""
    if pinned is None:
        return _ALL
    if pinned in ALIASES:
        return Formats(ALIASES[pinned])
    if pinned not in REGISTRY:
        raise UnknownFormat(f"unknown tool format {pinned!r}; registered: {', '.join(names())}")
    return Formats([REGISTRY[pinned]])


__all__ = [
    "Formats",
    "Found",
    "Markup",
    "RawCall",
    "REGISTRY",
    "ToolFormat",
    "UnknownFormat",
    "XmlArgs",
    "armed",
    "names",
]
