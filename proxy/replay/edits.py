"""`replay --set KEY=VALUE` / `--unset KEY` as splice edits, checked before anything is sent.

A dotted key walks into objects only: an edit that would cross an array or a scalar is refused
with the key and the type found, rather than replacing that value with an object.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from tapfix.proxy.jsonsplice import Delete, Edit, Set, apply_to_dict


class ReplayError(Exception):
    """Bad input for a replay: the message is for the user, as is."""


def parse_edits(sets: Sequence[str], unsets: Sequence[str]) -> list[Edit]:
    """`--set a.b=JSON-or-text` and `--unset a.b` as splice edits; dotted keys are nested objects."""
    edits: list[Edit] = []
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ReplayError(f"--set {item!r}: expected KEY=VALUE (e.g. temperature=0)")
        try:
            value: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            value = raw
        edits.append(Set(_path(key, "--set"), value))
    edits.extend(Delete(_path(key, "--unset")) for key in unsets)
    return edits


def check_edits(obj: dict[str, Any], edits: Sequence[Edit]) -> None:
    """Refuse an edit whose dotted path crosses an array or a scalar (a null counts as missing).

    The splice would otherwise replace that value with an object: `--set messages.0.content=hi`
    turned the conversation into `{"0": …}`. Edits are checked in order, each against the body as the
    earlier ones leave it, so `--set a=1 --set a.b=2` is refused too.
    """
    for edit in edits:
        option = "--set" if isinstance(edit, Set) else "--unset"
        node: Any = obj
        for depth, key in enumerate(edit.path[:-1], start=1):
            node = node.get(key)
            if node is None:
                break  # missing: --set creates the objects, --unset has nothing to remove
            if not isinstance(node, dict):
                walked = ".".join(edit.path[:depth])
                raise ReplayError(
                    f"{option} {'.'.join(edit.path)}: '{walked}' is {_json_type(node)}, not an object; "
                    f"{option} only walks into objects (arrays are not entered): nothing was sent"
                )
        obj = apply_to_dict(obj, [edit])


def _json_type(value: Any) -> str:
    kinds = {list: "an array", bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    return kinds.get(type(value), f"a {type(value).__name__}")


def _path(key: str, option: str) -> tuple[str, ...]:
    parts = tuple(key.strip().split("."))
    if not all(parts):
        raise ReplayError(f"{option} {key!r}: a key is a name or a dotted path such as chat_template_kwargs.x")
    return parts
