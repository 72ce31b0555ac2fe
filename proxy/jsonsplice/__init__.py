"""Edit a JSON object's bytes in place: only the keys concerned change.

The proxy must forward what the client sent byte for byte except where it changed something
(design invariant 1), so request edits are spliced into the original bytes instead of
re-serializing the body. Only the objects being edited are scanned member by member; values
that are skipped (a 5 MB `messages` array) are crossed by jumping from one structural character to
the next with a compiled regex and over each string with `bytes.find`, so the Python loop runs
once per bracket or string, never once per character.

Paths are tuples of object keys: `("chat_template_kwargs", "enable_thinking")`. Arrays are never
entered: every request-side knob lives in nested objects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from tapfix.proxy.jsonsplice.scan import _STRING, SpliceError, _Member, _members, _skip_ws, array_item_spans
from tapfix.proxy.jsonsplice.spans import (
    _compact_layout,
    remove_items,
    top_level_item_spans,
    top_level_spans,
    value_span,
)

__all__ = [
    "Delete",
    "Edit",
    "Path",
    "Set",
    "SpliceError",
    "apply_to_dict",
    "array_item_spans",
    "json_path",
    "remove_items",
    "splice",
    "top_level_item_spans",
    "top_level_spans",
    "value_span",
]

Path = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Set:
    path: Path
    value: Any


@dataclass(frozen=True, slots=True)
class Delete:
    path: Path


Edit = Set | Delete


@dataclass(slots=True)
class _Style:
    item_sep: str  # "," or ", "
    key_sep: str  # ":" or ": "


def apply_to_dict(obj: dict[str, Any], edits: Iterable[Edit]) -> dict[str, Any]:
    """The reference semantics of `splice`, on a parsed object (returns a modified deep copy)."""
    out: dict[str, Any] = _copy(obj)
    for edit in edits:
        *parents, last = edit.path
        node = out
        if isinstance(edit, Set):
            for key in parents:
                child = node.get(key)
                if not isinstance(child, dict):
                    child = node[key] = {}
                node = child
            node[last] = edit.value
        else:
            for key in parents:
                child = node.get(key)
                if not isinstance(child, dict):
                    break
                node = child
            else:
                node.pop(last, None)
    return out


def _copy(obj: Any) -> Any:
    try:
        return orjson.loads(orjson.dumps(obj))
    except (TypeError, orjson.JSONDecodeError):  # integers beyond 64 bits
        return json.loads(json.dumps(obj))


def splice(body: bytes, edits: Sequence[Edit], parsed: dict[str, Any] | None = None) -> bytes:
    """Apply `edits` to the JSON object in `body`, touching only the bytes of the keys concerned.

    Inserted keys go after the object's last member (or inside an empty object), written in the
    body's own style: compact `"k":v` or spaced `"k": v`, and the separator the object already uses.

    `parsed`, the body's own parse when the caller has it, spares the scan: keys that are only added find
    their place from the end of the body (`_insert_at_end`), and a compact body's members follow from their
    serialization (`_compact_layout`); where the bytes don't bear that out, the scan decides as without it.
    """
    if not edits:
        return body
    start = _skip_ws(body, 0)
    if start >= len(body) or body[start] != 0x7B:
        raise SpliceError("body is not a JSON object")
    style = _detect_style(body, start)
    tree = _edit_tree(edits)
    if parsed is not None and not any(key in parsed for key in tree):
        inserted = _insert_at_end(body, start, tree, style, parsed)
        if inserted is not None:
            return inserted
    layout = _compact_layout(body, parsed, ()) if parsed is not None else None
    patches: list[tuple[int, int, bytes]] = []
    _edit_object(body, start, tree, style, patches, layout[:2] if layout is not None else None)
    patches.sort(key=lambda p: (p[0], p[1]))
    out: list[bytes] = []
    pos = 0
    for begin, end, text in patches:
        if begin < pos:
            raise SpliceError("overlapping edits")
        out.append(body[pos:begin])
        out.append(text)
        pos = end
    out.append(body[pos:])
    return b"".join(out)


def _insert_at_end(body: bytes, start: int, tree: _Tree, style: _Style, parsed: dict[str, Any]) -> bytes | None:
    """`splice` of edits that only add keys (none of the tree's keys is in `parsed`), found from the end of the
    body: the last member is the parse's last key if its key and value, serialized, are the bytes before the
    closing brace, preceded by `,` or the opening `{` (a string that merely ends the same way would show a
    backslash there, a number a digit). The member separator is then the one before that member, as
    `_member_separator` reads it. None when the bytes don't show that: the scan decides."""
    inserts = _inserts(tree)
    if not inserts:
        return body
    close = _back_ws(body, len(body) - 1)
    if close <= start or body[close] != 0x7D:
        return None
    if not parsed:
        if _skip_ws(body, start + 1) != close:
            return None
        return body[:close] + _member_text(inserts, style.item_sep, style) + body[close:]
    key = next(reversed(parsed))
    try:
        value, name = orjson.dumps(parsed[key]), orjson.dumps(key)
    except TypeError:  # integers beyond 64 bits, lone surrogates: the scan reads those
        return None
    value_end = _back_ws(body, close - 1) + 1
    value_start = value_end - len(value)
    colon = _back_ws(body, value_start - 1)
    if value_start <= start or not body.startswith(value, value_start) or body[colon] != 0x3A:
        return None
    key_end = _back_ws(body, colon - 1) + 1
    key_start = key_end - len(name)
    before = _back_ws(body, key_start - 1)
    if key_start <= start or not body.startswith(name, key_start):
        return None
    if before == start:  # the only member
        indent = body[start + 1 : key_start]
        sep = "," + indent.decode("utf-8", "replace") if b"\n" in indent else style.item_sep
    elif body[before] == 0x2C:
        sep = body[_back_ws(body, before - 1) + 1 : key_start].decode("utf-8", "replace")
    else:
        return None
    return body[:value_end] + sep.encode() + _member_text(inserts, sep, style) + body[value_end:]


def _back_ws(body: bytes, pos: int) -> int:
    """The last position at or before `pos` that is not JSON whitespace (-1: none)."""
    while pos >= 0 and body[pos] in b" \t\r\n":
        pos -= 1
    return pos


def _inserts(tree: _Tree) -> list[tuple[str, Any]]:
    """The members a tree adds to an object that has none of its keys, in the order they were first edited."""
    out: list[tuple[str, Any]] = []
    for key, (kind, arg) in tree.items():
        if kind == "set":
            out.append((key, arg))
        elif kind == "tree":
            created = _build(arg)
            if created is not None:
                out.append((key, created))
    return out


def _member_text(inserts: list[tuple[str, Any]], sep: str, style: _Style) -> bytes:
    return sep.join(
        (_dumps(key, style) + style.key_sep.encode() + _dumps(value, style)).decode("utf-8") for key, value in inserts
    ).encode("utf-8")


class _Tree(dict[str, tuple[str, Any]]):
    """Edits of one object: key -> ("set", value) | ("delete", None) | ("tree", _Tree).

    `create` is true when a Set passes through: the object must exist afterwards even if later
    deletions leave it empty (the same as the dict semantics of `apply_to_dict`).
    """

    create = False


def _edit_tree(edits: Sequence[Edit]) -> _Tree:
    """Group edits by object; a later edit wins over an earlier one on the same path."""
    root = _Tree()
    for edit in edits:
        if not edit.path:
            raise SpliceError("empty path")
        node = root
        for depth, key in enumerate(edit.path[:-1]):
            kind, sub = node.get(key, ("tree", None))
            if kind == "delete" and isinstance(edit, Set):
                kind, sub = "set", None  # deleted, then set inside: a fresh object
            if kind == "set":
                # A nested edit inside a value set whole: fold it into that value.
                rest = ("v", *edit.path[depth + 1 :])
                sub_edit: Edit = Set(rest, edit.value) if isinstance(edit, Set) else Delete(rest)
                node[key] = ("set", apply_to_dict({"v": sub}, [sub_edit])["v"])
                break
            if kind == "delete" and isinstance(edit, Delete):
                break  # deleting inside something already deleted
            if kind != "tree" or sub is None:
                sub = _Tree()
                node[key] = ("tree", sub)
            if isinstance(edit, Set):
                sub.create = True
            node = sub
        else:
            last = edit.path[-1]
            node[last] = ("set", edit.value) if isinstance(edit, Set) else ("delete", None)
    return root


def _edit_object(
    body: bytes,
    start: int,
    tree: _Tree,
    style: _Style,
    patches: list[tuple[int, int, bytes]],
    layout: tuple[list[_Member], int] | None = None,
) -> None:
    """`layout`: the object's members and closing brace when known (`_compact_layout`), else scanned."""
    members, close = layout if layout is not None else _members(body, start)
    last_index: dict[str, int] = {}
    for i, m in enumerate(members):
        last_index[m.key] = i
    deleted: set[int] = set()
    inserts: list[tuple[str, Any]] = []
    for key, (kind, arg) in tree.items():
        index = last_index.get(key)
        if kind == "delete":
            if index is not None:
                deleted.update(i for i, m in enumerate(members) if m.key == key)
        elif kind == "set":
            if index is None:
                inserts.append((key, arg))
            else:
                m = members[index]
                patches.append((m.value_start, m.value_end, _dumps(arg, style)))
        else:  # nested edits
            if index is not None and body[members[index].value_start] == 0x7B:
                _edit_object(body, members[index].value_start, arg, style, patches)
            else:
                created = _build(arg)
                if created is None:
                    continue  # only deletions under a missing object: nothing to do
                if index is None:
                    inserts.append((key, created))
                else:
                    m = members[index]
                    patches.append((m.value_start, m.value_end, _dumps(created, style)))
    _delete_members(members, deleted, patches)
    if inserts:
        kept = [m for i, m in enumerate(members) if i not in deleted]
        sep = _member_separator(body, start, members, style)
        text = _member_text(inserts, sep, style)
        if kept:
            patches.append((members[-1].value_end, members[-1].value_end, sep.encode() + text))
        elif members:
            patches.append((members[-1].value_end, members[-1].value_end, text))
        else:
            patches.append((close, close, text))


def _build(tree: _Tree) -> dict[str, Any] | None:
    """The new object a tree describes when there is no object to edit (None: nothing to create)."""
    out: dict[str, Any] = {}
    for key, (kind, arg) in tree.items():
        if kind == "set":
            out[key] = arg
        elif kind == "tree":
            sub = _build(arg)
            if sub is not None:
                out[key] = sub
    return out if out or tree.create else None


def _delete_members(members: list[_Member], deleted: set[int], patches: list[tuple[int, int, bytes]]) -> None:
    """Remove runs of deleted members together with exactly one separator, keeping valid JSON."""
    i = 0
    n = len(members)
    while i < n:
        if i not in deleted:
            i += 1
            continue
        j = i
        while j + 1 < n and j + 1 in deleted:
            j += 1
        if j + 1 < n:  # a kept member follows: remove up to its key
            patches.append((members[i].key_start, members[j + 1].key_start, b""))
        elif i > 0:  # run at the end after a kept member: remove from that member's value end
            patches.append((members[i - 1].value_end, members[j].value_end, b""))
        else:  # every member goes
            patches.append((members[i].key_start, members[j].value_end, b""))
        i = j + 1


def _member_separator(body: bytes, start: int, members: list[_Member], style: _Style) -> str:
    if len(members) >= 2:
        return body[members[-2].value_end : members[-1].key_start].decode("utf-8", "replace")
    if members:
        indent = body[start + 1 : members[0].key_start]
        if b"\n" in indent:
            return "," + indent.decode("utf-8", "replace")
    return style.item_sep


def _dumps(value: Any, style: _Style) -> bytes:
    if style.key_sep == ":" and style.item_sep == ",":
        try:
            return orjson.dumps(value)
        except TypeError:
            pass
    return json.dumps(value, ensure_ascii=False, separators=(style.item_sep, style.key_sep)).encode("utf-8")


def _detect_style(body: bytes, start: int) -> _Style:
    """Compact or spaced, judged from the first member (`{"model": "x", ...}` → spaced)."""
    pos = _skip_ws(body, start + 1)
    key = _STRING.match(body, pos)
    if key is None:
        return _Style(",", ":")
    after = body[key.end() : key.end() + 2]
    spaced = after.startswith(b": ") or after.startswith(b" :")
    return _Style(", ", ": ") if spaced else _Style(",", ":")


def json_path(path: Path) -> str:
    """`("reasoning", "effort")` → `$.reasoning.effort`, the notation of `Change.path`."""
    return "$" + "".join(f".{k}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) else f"[{json.dumps(k)}]" for k in path)
