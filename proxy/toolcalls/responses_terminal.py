"""The Responses terminal object made to agree with the streamed events.

`response.completed` (or `.incomplete`) repeats every output item, and a client may read only it, so
its function_call items must be the calls the events carried: `reconcile_output` replaces them with
the ones that went out (repaired, renamed or re-identified), inserts one it lacks and drops one the
events never carried, and says where the upstream's object disagreed. The stage records that
(`ResponsesToolCallRepair._terminal`). When the turn fails instead, `without_gaps` keeps the client's
output indexes dense over the calls the error drops.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.sse import named_event
from tapfix.proxy.toolcalls.evented_stage import event_name, parse
from tapfix.proxy.toolcalls.responses_leaks import SentCall


def _call_fields(item: dict[str, Any]) -> dict[str, Any]:
    return {k: item.get(k) for k in ("id", "call_id", "name", "arguments")}


def reconcile_output(output: list[Any], sent: list[SentCall]) -> tuple[list[Any], list[tuple[Any, Any, str]]]:
    """`output` with its function_call items replaced by the ones that went out (matched by item id,
    else in order), and the disagreements with the upstream's own events (before, after, reason)."""
    recovered = [s for s in sent if s.recovered]
    sent = [s for s in sent if not s.recovered]
    by_id = {s.item["id"]: s for s in sent}
    unmatched = [s for s in sent]
    matched: dict[int, SentCall] = {}
    for k, item in enumerate(output):
        if isinstance(item, dict) and item.get("type") == "function_call" and item.get("id") in by_id:
            s = by_id[item["id"]]
            if s in unmatched:
                matched[k] = s
                unmatched.remove(s)
    for k, item in enumerate(output):
        if isinstance(item, dict) and item.get("type") == "function_call" and k not in matched and unmatched:
            matched[k] = unmatched.pop(0)
    disagreements: list[tuple[Any, Any, str]] = []
    new: list[Any] = []
    for k, item in enumerate(output):
        if not isinstance(item, dict) or item.get("type") != "function_call":
            new.append(item)
            continue
        match = matched.get(k)
        if match is None:
            disagreements.append((_call_fields(item), None, "a call the events never carried; dropped"))
            continue
        fields = _call_fields(item)
        if fields != match.upstream:
            reason = "the terminal object disagreed with the streamed events; the events' call kept"
            disagreements.append((fields, _call_fields(match.item), reason))
        new.append({**item, **{k2: v for k2, v in match.item.items() if k2 != "status"}})
    for s in unmatched:
        disagreements.append((None, _call_fields(s.item), "the terminal object lacked a streamed call; inserted"))
        new.insert(min(s.position, len(new)), s.item)
    for s in recovered:  # read out of text by tapfix: the upstream's object never had them (recorded already)
        new.insert(min(s.position, len(new)), s.item)
    return new, disagreements


def without_gaps(held: list[bytes], nl: bytes) -> list[bytes]:
    """The held events the client still gets when the calls among them are dropped: every other item keeps
    its place, moved down over the dropped calls, so the client's output_index stays dense from 0."""
    dropped: list[int] = []
    keep: list[bytes] = []
    for raw in held:
        if b"function_call" in raw:
            obj = parse(raw) if b"output_item.added" in raw else None
            given = obj.get("output_index") if obj is not None else None
            if isinstance(given, int):
                dropped.append(given)
            continue
        keep.append(raw)
    if not dropped:
        return keep
    out = []
    for raw in keep:
        obj = parse(raw) if b'"output_index"' in raw else None
        given = obj.get("output_index") if obj is not None else None
        if obj is None or not isinstance(given, int) or not any(p < given for p in dropped):
            out.append(raw)
            continue
        moved = {**obj, "output_index": given - sum(1 for p in dropped if p < given)}
        out.append(named_event(str(obj.get("type") or event_name(raw)), moved, nl))
    return out
