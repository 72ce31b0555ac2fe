"""Deciding, once a message's tool calls are complete, what the client gets for one choice.

Shared by the streaming stage and the non-streamed repair, so both apply the same rules. The plan says
which calls go out (with stable indexes 0..n-1, ids and names), which content is removed because it
was leaked call syntax, and whether anything is unrecoverable.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Final

from tapfix.proxy.changes import Change
from tapfix.proxy.toolcalls.accumulate import Call
from tapfix.proxy.toolcalls.arguments import CUT, ArgResult, dumps, repair_arguments
from tapfix.proxy.toolcalls.jsonfix import is_debris, loads_tolerant
from tapfix.proxy.toolcalls.leaks import find_leak, is_xml_args, typed_xml_args
from tapfix.proxy.toolcalls.schema import ToolSchemas

STAGE: Final = "toolcalls"


@dataclass(slots=True)
class OutCall:
    index: int
    id: str
    name: str
    arguments: str
    continued: bool = False  # prefix mode: only the rest of arguments the client already partly has


@dataclass(slots=True)
class Fatal:
    name: str
    reason: str
    kind: str


QUOTE_LIMIT = 200  # of the engine's message, in the error an agent reads (the store keeps all of it)


def cut_by_upstream_error(message: str) -> str:
    """The reason of a call an engine's error event cut short: the engine's words, quoted, so the
    agent (and its user) read what really happened, not a guess at a broken connection."""
    message = " ".join(message.split())
    if len(message) > QUOTE_LIMIT:
        message = message[:QUOTE_LIMIT] + "…"
    if not message:
        return "the upstream ended the stream with an error before the call was complete"
    return f"the upstream ended the stream with an error before the call was complete: {message}"


@dataclass(slots=True)
class ChoicePlan:
    calls: list[OutCall] = field(default_factory=list)
    structured_clean: bool = True  # upstream tool-call deltas may go out as they came
    content_edits: dict[int, str] = field(default_factory=dict)  # content part -> new text
    changes: list[Change] = field(default_factory=list)
    defects: list[str] = field(default_factory=list)
    fatal: Fatal | None = None

    @property
    def untouched(self) -> bool:
        return self.structured_clean and not self.content_edits and self.fatal is None

    def defect(self, kind: str) -> None:
        if kind not in self.defects:
            self.defects.append(kind)


@dataclass(slots=True)
class Part:
    seq: int  # position of its event in the stream, to compare with Call.seq
    text: str


def plan_choice(
    calls: list[Call],
    call_seqs: list[int],
    parts: list[Part],
    schemas: ToolSchemas,
    finish: str | None,
    choice: int,
    at_start: bool,
    seed: str,
    path_prefix: str = "delta",
    index_base: int = 0,
    sent_ids: frozenset[str] = frozenset(),
) -> ChoicePlan:
    """`index_base`/`sent_ids`: calls this choice already sent (tool calls arriving after a finish)."""
    plan = ChoicePlan()
    late = [c for c in calls if c.id is not None and c.id in sent_ids]
    for call in late:
        plan.defect("duplicated_fragments")
        plan.changes.append(
            Change(
                STAGE,
                "duplicated_fragments",
                f"$.choices[{choice}].{path_prefix}.tool_calls",
                {"name": call.name, "arguments": call.raw_arguments(), "id": call.id},
                None,
                "a call already sent was sent again after the finish; dropped",
            )
        )
    if late:
        late_ids = {id(c) for c in late}
        keep = [k for k, c in enumerate(calls) if id(c) not in late_ids]
        calls, call_seqs = [calls[k] for k in keep], [call_seqs[k] for k in keep]
    consumed = _continuation(calls, call_seqs, parts, plan, choice)
    leaked = _leaks(calls, parts, consumed, schemas, at_start, plan, choice, path_prefix)
    if plan.fatal:
        return plan
    seen_ids: set[str] = set()
    for call in calls:
        if call.id is not None and call.id in seen_ids:
            call.note("wrong_index_or_id")  # results are matched to calls by id
        seen_ids.add(call.id or "")
        if call.name is not None and schemas and call.name not in schemas.schemas:
            repeated = _repeated_name(call.name, schemas.names)
            if repeated:
                call.original_name = call.name
                call.name = repeated
                call.note("duplicated_fragments")
        for kind in call.kinds:
            plan.defect(kind)
    results: list[ArgResult] = []
    names: list[str] = []
    for call in calls:
        name = call.name
        if name is None:
            if len(schemas.names) == 1:
                name = schemas.names[0]
                call.note("wrong_index_or_id")
                plan.defect("wrong_index_or_id")
            else:
                plan.fatal = Fatal("?", "tool call has no name", "wrong_index_or_id")
                return plan
        res = repair_arguments(call.frags, name, schemas, finish, call.null_args)
        for kind in res.kinds:
            plan.defect(kind)
        if res.fatal:
            kind = (res.kinds or call.kinds or ["missing_last_chunk" if res.fatal == CUT else "invalid_json"])[0]
            if res.fatal.startswith("required"):
                kind = (call.kinds or res.kinds or ["missing_fragment"])[0]
            plan.defect(kind)
            plan.fatal = Fatal(name, res.fatal, kind)
            return plan
        results.append(res)
        names.append(name)
    clean = (
        not leaked
        and not late
        and index_base == 0
        and all(not c.kinds and not r.changed for c, r in zip(calls, results, strict=True))
    )
    plan.structured_clean = clean
    if clean and not consumed:
        return plan
    used: set[str] = set(sent_ids)
    index = index_base
    for call, res, name in zip(calls, results, names, strict=True):
        call_id = call.id if call.id and call.id not in used else _make_id(seed, choice, index)
        used.add(call_id)
        plan.calls.append(OutCall(index, call_id, name, res.text))
        if call.kinds or res.changed or call_id != call.id or name != call.name:
            kind = (call.kinds + res.kinds + ["wrong_index_or_id"])[0]
            plan.changes.append(
                Change(
                    STAGE,
                    kind,
                    f"$.choices[{choice}].{path_prefix}.tool_calls[{index}]",
                    {
                        "name": call.original_name or call.name,
                        "arguments": call.raw_arguments(),
                        "id": call.id,
                    },
                    {"name": name, "arguments": res.text, "id": call_id},
                    "; ".join(res.fixes + [k for k in call.kinds if k not in res.kinds]) or kind,
                )
            )
        index += 1
    for name, text in leaked:
        call_id = _make_id(seed, choice, index)
        plan.calls.append(OutCall(index, call_id, name, text))
        index += 1
    return plan


def _repeated_name(name: str, offered: list[str]) -> str | None:
    """'get_weatherget_weather': a name appended once per repeated delta."""
    for tool in offered:
        if len(name) > len(tool) and len(name) % len(tool) == 0 and name == tool * (len(name) // len(tool)):
            return tool
    return None


def _make_id(seed: str, choice: int, index: int) -> str:
    digest = hashlib.sha1(f"{seed}:{choice}:{index}".encode()).hexdigest()[:24]
    return f"call_{digest}"


def _continuation(calls: list[Call], seqs: list[int], parts: list[Part], plan: ChoicePlan, choice: int) -> set[int]:
    """Content that continues an open call's arguments (a parser cut at a literal `</tool_call>`)."""
    if not calls or not parts:
        return set()
    last = calls[-1]
    after = [k for k, p in enumerate(parts) if p.seq > seqs[-1]]
    if not after or not last.frags or not all(isinstance(f, str) for f in last.frags):
        return set()
    base = "".join(last.frags)
    try:
        json.loads(base)
        return set()
    except ValueError:
        pass
    merged = base + "".join(parts[k].text for k in after)
    parsed = loads_tolerant(merged)
    if not isinstance(parsed.value, dict) or parsed.cut or parsed.bad or parsed.closed or not is_debris(parsed.rest):
        return set()
    end = len(merged) - len(parsed.rest)
    last.original = base
    last.frags = [merged[:end]]
    last.note("leaked_into_content")
    for k in after:
        plan.content_edits[k] = ""
    plan.defect("leaked_into_content")
    plan.changes.append(
        Change(
            STAGE,
            "leaked_into_content",
            f"$.choices[{choice}].delta.content",
            "".join(parts[k].text for k in after),
            "",
            "content continued the open call's arguments; moved back into the call",
        )
    )
    return set(after)


def _leaks(
    calls: list[Call],
    parts: list[Part],
    consumed: set[int],
    schemas: ToolSchemas,
    at_start: bool,
    plan: ChoicePlan,
    choice: int,
    path_prefix: str,
) -> list[tuple[str, str]]:
    if not schemas:
        return []
    keep = [k for k in range(len(parts)) if k not in consumed]
    full = "".join(parts[k].text for k in keep)
    if not full:
        return []
    leak = find_leak(full, schemas, at_start)
    if leak is None:
        return []
    leaked: list[tuple[str, str]] = []
    if leak.confirmed:
        for name, raw in leak.calls:
            if is_xml_args(raw):
                raw = typed_xml_args(raw, schemas.properties(name))
            res = repair_arguments([raw if isinstance(raw, str) else dumps(raw)], name, schemas, None)
            if res.fatal:
                return []  # not a call we can stand behind: it stays content
            leaked.append((name, res.text))
        reason = "tool call written as text; turned into a tool_calls delta"
    elif calls and set(leak.names) <= {c.name for c in calls}:
        reason = "leaked start of a call that also arrived structured; dropped"
    else:
        return []
    _cut_region(full, keep, parts, leak.start, leak.end, plan)
    plan.defect("leaked_into_content")
    plan.changes.append(
        Change(
            STAGE,
            "leaked_into_content",
            f"$.choices[{choice}].{path_prefix}.content",
            full[leak.start : leak.end],
            [{"name": n, "arguments": a} for n, a in leaked] or None,
            reason,
        )
    )
    return leaked


def _cut_region(full: str, keep: list[int], parts: list[Part], start: int, end: int, plan: ChoicePlan) -> None:
    offset = 0
    for k in keep:
        text = parts[k].text
        lo, hi = offset, offset + len(text)
        offset = hi
        if hi <= start or lo >= end:
            continue
        new = text[: max(0, start - lo)] + text[max(0, end - lo) :] if lo < start or hi > end else ""
        if lo >= start and hi <= end:
            new = ""
        plan.content_edits[k] = new
