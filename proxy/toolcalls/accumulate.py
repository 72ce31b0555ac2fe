"""Collecting streamed tool-call deltas into calls, robust to the index/id mistakes servers make.

Spec clients key calls strictly by `index`; servers break that in known ways (every parallel call on
index 0, ids and names repeated on a finish-time chunk, openers without id or name). The rules here
are the ones that tell those apart from a valid interleaved stream: a delta with a *different*
non-null id **and** a name (or a different name after arguments started) starts a new call, even on
an index already in use; a different id on a delta that carries only argument text is id churn (the
same call, its first id wins); a repeated identical name or id is a duplicate, never appended.
Indexes are kept as they arrived: whether they are dense is the plan's check (`plan.py`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from tapfix.proxy.toolcalls.defects import UNKNOWN_TOOL
from tapfix.proxy.toolcalls.names import fold_name, match_name

WRONG_INDEX = "wrong_index_or_id"


@dataclass(slots=True)
class Call:
    index: int | None  # the upstream index it arrived on
    id: str | None = None
    name: str | None = None
    frags: list[Any] = field(default_factory=list)  # str fragments, or objects sent as arguments
    kinds: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # what was found, in words, for the change's reason
    null_args: bool = False
    started_args: bool = False
    original: str | None = None  # the arguments as received, kept when a repair rewrites `frags`
    original_name: str | None = None

    def note(self, kind: str, reason: str | None = None) -> None:
        if kind not in self.kinds:
            self.kinds.append(kind)
        if reason and reason not in self.reasons:
            self.reasons.append(reason)

    def raw_arguments(self) -> str:
        if self.original is not None:
            return self.original
        return "".join(f if isinstance(f, str) else _show(f) for f in self.frags)


def _show(value: Any) -> str:
    import json

    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


class CallAccumulator:
    """One choice's calls, in the order they were opened."""

    __slots__ = ("calls", "_by_index", "_by_id", "_offered")

    def __init__(self, offered: Collection[str] = ()) -> None:
        self.calls: list[Call] = []
        self._by_index: dict[int, Call] = {}
        self._by_id: dict[str, Call] = {}
        self._offered = offered  # the offered tool names: tell a name's second piece from another call

    def add(self, delta: Any) -> None:
        if not isinstance(delta, dict):
            self._new(None).note(WRONG_INDEX)
            return
        index = delta.get("index")
        call_id = delta.get("id") if isinstance(delta.get("id"), str) and delta.get("id") else None
        fn = delta.get("function")
        fn = fn if isinstance(fn, dict) else {}
        name = fn.get("name") if isinstance(fn.get("name"), str) and fn.get("name") else None
        args = fn.get("arguments", None)

        if isinstance(index, bool) or not isinstance(index, int):
            index = None
            if call_id is not None and call_id in self._by_id:
                cur: Call | None = self._by_id[call_id]
            elif (call_id is not None and name is not None) or not self.calls:
                cur = None
            else:
                cur = self.calls[-1]
            noted = True
        else:
            cur = self._by_index.get(index)
            noted = False
        if cur is not None:
            if call_id is not None and cur.id is not None and call_id != cur.id:
                if name is not None:
                    cur = None  # a new id with a name: another call (parallel calls all on index 0)
                    noted = True
                else:
                    cur.note(WRONG_INDEX, "a new id on an argument delta (id churn): the call's first id kept")
                    self._by_id.setdefault(call_id, cur)
            elif name is not None and cur.name is not None and name != cur.name and cur.started_args:
                if not (call_id is None and _names_one_tool(cur.name + name, self._offered, cur.name)):
                    cur = None  # another call on the same index; only the rest of an offered name continues it
                    noted = True
        if cur is None:
            cur = self._new(index)
            if noted:
                cur.note(WRONG_INDEX)
            if call_id is None:
                cur.note(WRONG_INDEX)
        elif noted:
            cur.note(WRONG_INDEX)
        if call_id is not None and cur.id is None:
            cur.id = call_id
            self._by_id[call_id] = cur
        if name is not None:
            if cur.name is None:
                cur.name = name
            elif name == cur.name:
                cur.note("duplicated_fragments")
            else:
                cur.name += name  # a name streamed in pieces
        if args is None:
            if "arguments" in fn:
                cur.null_args = True
        elif isinstance(args, str):
            if args:
                cur.frags.append(args)
                cur.started_args = True
        else:
            cur.frags.append(args)
            cur.started_args = True
            cur.note("args_as_object")

    def _new(self, index: int | None) -> Call:
        call = Call(index=index)
        self.calls.append(call)
        if index is not None:
            self._by_index[index] = call
        return call


def _names_one_tool(joined: str, offered: Collection[str], head: str) -> bool:
    """Whether a name's pieces continue one offered tool's name (`to` + `d` + `o`, `writeFi` + `le`):
    the head alone names no tool, and the pieces so far are a name, or the start of exactly one."""
    if not offered:
        return False
    tools = list(offered)
    if match_name(head, tools).kind != UNKNOWN_TOOL:
        return False
    if match_name(joined, tools).kind != UNKNOWN_TOOL:
        return True
    start = fold_name(joined)
    return sum(1 for t in tools if fold_name(t).startswith(start)) == 1


def assemble_tool_calls(events: list[dict[str, Any]], choice: int = 0) -> list[dict[str, Any]]:
    """What a strict spec client builds: calls keyed by index, name/arguments appended, id kept.

    `events` are parsed chunk objects (not raw bytes). Used by tests to judge what an agent would run.
    """
    calls: dict[int, dict[str, Any]] = {}
    for event in events:
        for ch in event.get("choices") or []:
            if ch.get("index", 0) != choice:
                continue
            for tc in (ch.get("delta") or {}).get("tool_calls") or []:
                slot = calls.setdefault(tc.get("index"), {"id": None, "name": "", "arguments": ""})
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                if isinstance(fn.get("name"), str):
                    slot["name"] += fn["name"]
                args = fn.get("arguments")
                slot["arguments"] += args if isinstance(args, str) else ("" if args is None else _show(args))
    return [calls[k] for k in sorted(calls, key=lambda k: (k is None, k if isinstance(k, int) else 0))]
