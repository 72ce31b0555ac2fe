"""Defect mutations of a rendered stream: indexes, ids, names and the finish. Each is
`(rng, wire) -> wire | None` and edits the wire's events (see mutations_wire: chat tool-call entries
carry a hidden tag naming their call; Responses and Messages events carry it on the event).

Decidable by construction: a chat delta that carries a new id and a name starts a call, so no
mutation puts a name on a delta with a fresh id (`name_repeated` and `name_split` put the name on a
delta without an id, `id_churn` only touches deltas with arguments and no name); the compositions
that would leave a delta with two readings are excluded in mutations.EXCLUSIVE.
"""

from __future__ import annotations

import random
import re
import string
from typing import Any

from tapfix.proxy.mock.mutations_text import SCHEMA_DEPENDENT
from tapfix.proxy.mock.mutations_wire import TAG, Event, Wire, chat_chunk, tool_name


# -- chat helpers ------------------------------------------------------------------------------------
def _entries(wire: Wire) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for i, ev in enumerate(wire.events or []):
        if ev.body is None:
            continue
        for choice in ev.body.get("choices") or []:
            for entry in (choice.get("delta") or {}).get("tool_calls") or []:
                out.append((i, entry))
    return out


def _call_entries(wire: Wire, k: int, role: str | None = None) -> list[tuple[int, dict[str, Any]]]:
    return [(i, e) for i, e in _entries(wire) if e[TAG][0] == k and (role is None or e[TAG][1] == role)]


def _fresh_id(rng: random.Random) -> str:
    return "call_" + "".join(rng.choice("0123456789abcdef") for _ in range(24))


def _evented_calls(wire: Wire, kind: str) -> dict[int, dict[str, Any]]:
    """Responses: each call's added item; Messages: each call's started block (what ids and names live in)."""
    out: dict[int, dict[str, Any]] = {}
    for ev in wire.events or []:
        if ev.call is None:
            continue
        if kind == "responses" and ev.name == "response.output_item.added":
            out[ev.call] = ev.body["item"]
        elif kind == "messages" and ev.name == "content_block_start":
            out[ev.call] = ev.body["content_block"]
    return out


def _id_key(wire: Wire) -> str:
    return "call_id" if wire.surface == "responses" else "id"


# -- indexes -----------------------------------------------------------------------------------------
def _remap(wire: Wire, mapping: Any) -> None:
    if wire.surface == "chat":
        for _, entry in _entries(wire):
            entry["index"] = mapping(entry["index"])
        return
    key = "output_index" if wire.surface == "responses" else "index"
    for ev in wire.events or []:
        if isinstance(ev.body, dict) and isinstance(ev.body.get(key), int):
            ev.body[key] = mapping(ev.body[key])


def _positions(wire: Wire) -> int:
    if wire.surface == "chat":
        return len(wire.calls)
    return len(wire.calls) + (1 if wire.turn.content else 0)


def index_offset(rng: random.Random, wire: Wire) -> Wire | None:
    if not wire.calls:
        return None
    k = rng.randint(1, 3)
    _remap(wire, lambda i: i + k)
    return wire


def index_gap(rng: random.Random, wire: Wire) -> Wire | None:
    n = _positions(wire)
    if n < 2:
        return None
    gaps = [0] + [rng.randint(0, 2) for _ in range(n - 1)]
    gaps[rng.randrange(1, n)] += 1
    shift = [sum(gaps[: i + 1]) for i in range(n)]
    _remap(wire, lambda i: i + shift[i] if 0 <= i < n else i)
    return wire


def index_all_zero(rng: random.Random, wire: Wire) -> Wire | None:
    if len(wire.calls) < 2:
        return None
    _remap(wire, lambda i: 0)
    return wire


def two_calls_one_delta(rng: random.Random, wire: Wire) -> Wire | None:
    """Call k+1's opening delta moves into the chunk of call k's opening (its own chunk goes)."""
    if len(wire.calls) < 2:
        return None
    k = rng.randrange(len(wire.calls) - 1)
    first = _call_entries(wire, k, "open")
    second = _call_entries(wire, k + 1, "open")
    if not first or not second:
        return None
    events = wire.events or []
    (i, _), (j, entry) = first[0], second[0]
    if len(events[j].body["choices"][0]["delta"]["tool_calls"]) != 1:
        return None
    events[i].body["choices"][0]["delta"]["tool_calls"].append(entry)
    del events[j]
    return wire


# -- ids ---------------------------------------------------------------------------------------------
def id_churn(rng: random.Random, wire: Wire) -> Wire | None:
    touched = False
    for _, entry in _entries(wire):
        fn = entry.get("function") or {}
        if entry[TAG][1] == "args" and "name" not in fn and "id" not in entry:
            entry["id"] = _fresh_id(rng)
            touched = True
    return wire if touched else None


def id_missing(rng: random.Random, wire: Wire) -> Wire | None:
    if not wire.calls:
        return None
    chosen = [k for k in range(len(wire.calls)) if rng.random() < 0.6] or [rng.randrange(len(wire.calls))]
    if wire.surface == "chat":
        for k in chosen:
            for _, entry in _call_entries(wire, k, "open"):
                entry.pop("id", None)
        return wire
    holders = _evented_calls(wire, wire.surface)
    for k in chosen:
        if rng.random() < 0.5:
            holders[k].pop(_id_key(wire), None)
        else:
            holders[k][_id_key(wire)] = ""
    return wire


def id_duplicate(rng: random.Random, wire: Wire) -> Wire | None:
    if len(wire.calls) < 2:
        return None
    j = rng.randrange(1, len(wire.calls))
    i = rng.randrange(j)
    if wire.surface == "chat":
        source = _call_entries(wire, i, "open")
        target = _call_entries(wire, j, "open")
        if not source or not target or not source[0][1].get("id"):
            return None
        target[0][1]["id"] = source[0][1]["id"]
        return wire
    holders = _evented_calls(wire, wire.surface)
    key = _id_key(wire)
    if not holders[i].get(key):
        return None
    holders[j][key] = holders[i][key]
    return wire


# -- names -------------------------------------------------------------------------------------------
_SEPARATORS = re.compile(r"[\s_\-.:/]+")


def fold(name: str) -> str:
    return _SEPARATORS.sub("", name).casefold()


def _offered(wire: Wire) -> list[str]:
    return [tool_name(t) for t in wire.turn.tools]


def _says_only(wire: Wire, sent_name: str, meant: str) -> bool:
    """`sent_name` is not offered and, folded or repeated, stands for `meant` alone."""
    offered = _offered(wire)
    if sent_name in offered:
        return False
    folded = fold(sent_name)

    def matches(tool: str) -> bool:
        f = fold(tool)
        return bool(f) and (folded == f or (len(folded) % len(f) == 0 and folded == f * (len(folded) // len(f))))

    return [t for t in offered if matches(t)] == [meant]


def _set_name(wire: Wire, k: int, name: str) -> None:
    if wire.surface == "chat":
        for _, entry in _call_entries(wire, k, "open"):
            entry["function"]["name"] = name
    else:
        _evented_calls(wire, wire.surface)[k]["name"] = name
    wire.calls[k].name = name


def _renamable(wire: Wire) -> list[int]:
    return [k for k in range(len(wire.calls)) if k not in wire.unknown]


def _case_forms(name: str) -> list[str]:
    words = [w for w in _SEPARATORS.split(re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)) if w]
    if not words:
        return []
    return [
        name.upper(),
        name.lower(),
        name.swapcase(),
        "".join(w.capitalize() for w in words),
        words[0].lower() + "".join(w.capitalize() for w in words[1:]),
        "-".join(w.lower() for w in words),
        "_".join(w.lower() for w in words),
        ".".join(words),
    ]


def name_case(rng: random.Random, wire: Wire) -> Wire | None:
    options = []
    for k in _renamable(wire):
        meant = wire.expected_names[k]
        options += [
            (k, f) for f in _case_forms(wire.calls[k].name) if f != wire.calls[k].name and _says_only(wire, f, meant)
        ]
    if not options:
        return None
    k, form = rng.choice(options)
    _set_name(wire, k, form)
    return wire


def unknown_tool(rng: random.Random, wire: Wire) -> Wire | None:
    options = [k for k in _renamable(wire) if not wire.calls[k].applied & SCHEMA_DEPENDENT]
    if not options:
        return None
    k = rng.choice(options)
    offered = {fold(t) for t in _offered(wire)}
    for _ in range(10):
        name = "zz_" + "".join(rng.choice(string.ascii_lowercase) for _ in range(6))
        if fold(name) not in offered:
            break
    else:
        return None
    _set_name(wire, k, name)
    wire.expected_names[k] = name
    wire.unknown.add(k)
    return wire


def name_split(rng: random.Random, wire: Wire) -> Wire | None:
    """The name in 2-3 pieces: the opening delta has the first, the next deltas (no id) the rest."""
    options = [k for k in _renamable(wire) if len(wire.calls[k].name) >= 2]
    if not options or wire.events is None:
        return None
    k = rng.choice(options)
    name = wire.calls[k].name
    cuts = sorted(rng.sample(range(1, len(name)), min(len(name) - 1, rng.randint(1, 2))))
    pieces = [name[a:b] for a, b in zip([0, *cuts], [*cuts, len(name)], strict=True)]
    (i, opening) = _call_entries(wire, k, "open")[0]
    opening["function"]["name"] = pieces[0]
    index = opening["index"]
    for n, piece in enumerate(pieces[1:]):
        entry = {"index": index, "function": {"name": piece}, TAG: (k, "name")}
        wire.events.insert(i + 1 + n, Event(chat_chunk({"tool_calls": [entry]})))
    return wire


def name_repeated(rng: random.Random, wire: Wire) -> Wire | None:
    options = _renamable(wire)
    if not options:
        return None
    k = rng.choice(options)
    name = wire.calls[k].name
    if not _says_only(wire, name + name, wire.expected_names[k]):
        return None
    if wire.surface != "chat":
        _set_name(wire, k, name + name)
        return wire
    later = [e for _, e in _call_entries(wire, k, "args") if "id" not in e and "name" not in e["function"]]
    if not later:
        return None
    rng.choice(later)["function"]["name"] = name
    return wire


# -- finish ------------------------------------------------------------------------------------------
def _set_finish(wire: Wire, chat: str, messages: str) -> Wire | None:
    if not wire.calls:
        return None
    for ev in wire.events or []:
        body = ev.body
        if wire.surface == "chat" and body is not None:
            for choice in body.get("choices") or []:
                if choice.get("finish_reason"):
                    choice["finish_reason"] = chat
        elif wire.surface == "messages" and ev.name == "message_delta":
            body["delta"]["stop_reason"] = messages
    wire.finish = chat
    return wire


def finish_stop_with_calls(rng: random.Random, wire: Wire) -> Wire | None:
    return _set_finish(wire, "stop", "end_turn")


def finish_length_complete(rng: random.Random, wire: Wire) -> Wire | None:
    return _set_finish(wire, "length", "max_tokens")


def empty_tool_turn(rng: random.Random, wire: Wire) -> Wire | None:
    if not wire.calls or wire.events is None:
        return None
    if wire.surface == "chat":
        kept = []
        for ev in wire.events:
            delta = (ev.body or {}).get("choices", [{}])[0].get("delta") if ev.body else None
            if delta is not None and "tool_calls" in delta:
                continue
            kept.append(ev)
        wire.events = kept
    else:
        wire.events = [ev for ev in wire.events if ev.call is None]
    return wire
