"""The content half of a plan: text of one choice that is really tool-call syntax.

Three ways a call ends up outside `tool_calls`: content that continues the open call's arguments (a
server's parser cut at a literal `</tool_call>`), call markup written as content (`leaks.py` finds it
over the armed formats), and markup last in the reasoning with nothing visible after it. Each is moved
into the plan (content edits, calls, changes) or, when it lost information, made the plan's fatal.
`plan_choice` (`plan.py`) runs them before the structural checks, so the calls they give are checked
like the structured ones.
"""

from __future__ import annotations

import json

from tapfix.proxy.changes import Change
from tapfix.proxy.toolcalls.accumulate import Call
from tapfix.proxy.toolcalls.arguments import dumps, repair_arguments
from tapfix.proxy.toolcalls.cutoff import cut_off, turn_sign
from tapfix.proxy.toolcalls.defects import MISSING_FRAGMENT, MISSING_LAST_CHUNK
from tapfix.proxy.toolcalls.formats import Formats
from tapfix.proxy.toolcalls.formats.base import typed_xml_args
from tapfix.proxy.toolcalls.formats.blocks import Context
from tapfix.proxy.toolcalls.jsonfix import is_debris, loads_tolerant
from tapfix.proxy.toolcalls.leaks import (
    LEAKED_INTO_REASONING,
    UNPINNED,
    Leak,
    find_leak,
    find_reasoning_leak,
    foreign_markup,
    formats_for,
    is_xml_args,
)
from tapfix.proxy.toolcalls.plan_types import STAGE, ChoicePlan, Fatal, Part
from tapfix.proxy.toolcalls.schema import ToolSchemas


def content_continuation(
    calls: list[Call], seqs: list[int], parts: list[Part], plan: ChoicePlan, choice: int
) -> set[int]:
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


def content_leaks(
    calls: list[Call],
    parts: list[Part],
    consumed: set[int],
    schemas: ToolSchemas,
    at_start: bool,
    plan: ChoicePlan,
    choice: int,
    path_prefix: str,
    formats: Formats,
    flag_unpinned: bool,
    context: Context | None,
) -> list[tuple[str, str]]:
    """Call markup in the content not `consumed` by a continuation: (name, arguments) of each call it
    confirmed, its region cut from the content; a leaked start of a call that also arrived structured is
    only cut. Unconfirmed markup stays content (flagged when it is another format than the pinned one)."""
    if not schemas:
        return []
    keep = [k for k in range(len(parts)) if k not in consumed]
    full = "".join(parts[k].text for k in keep)
    if not full:
        return []
    leak = find_leak(full, schemas, at_start, formats, context)
    if leak is None or not leak.confirmed:
        if flag_unpinned and formats is not formats_for(None):
            _flag_unpinned(full, schemas, at_start, formats, plan, choice, path_prefix)
    if leak is None:
        return []
    leaked: list[tuple[str, str]] = []
    if leak.confirmed:
        typed = _typed_calls(leak, schemas, plan)
        if typed is None:
            return []  # not a call we can stand behind: it stays content (or it lost information: fatal)
        leaked = typed
        reason = "tool call written as text; turned into a tool_calls delta"
    elif calls and set(leak.names) <= {c.name for c in calls}:
        reason = "leaked start of a call that also arrived structured; dropped"
    else:
        return []
    _cut_regions(keep, parts, leak.regions or [(leak.start, leak.end)], plan)
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


def _typed_calls(leak: Leak, schemas: ToolSchemas, plan: ChoicePlan) -> list[tuple[str, str]] | None:
    """The leak's calls as argument JSON fit to the offered schemas; None when one doesn't check out.

    Markup the format read, naming an offered tool, is a call: when it lacks a required argument the
    call lost information, and passing it as text would drop it silently, so that is the plan's fatal
    (`missing_fragment`, the table's `required_missing` row). Other arguments that don't read leave
    the markup as text."""
    out: list[tuple[str, str]] = []
    for name, raw in leak.calls:
        if is_xml_args(raw):
            raw = typed_xml_args(raw, schemas.properties(name))
        res = repair_arguments([raw if isinstance(raw, str) else dumps(raw)], name, schemas, None)
        if res.fatal and res.fatal.startswith("required"):
            plan.defect(MISSING_FRAGMENT)
            plan.fatal = Fatal(name, f"tool call written as {leak.formats[0]} markup: {res.fatal}", MISSING_FRAGMENT)
            return None
        if res.fatal:
            return None
        out.append((name, res.text))
    return out


def reasoning_leak(
    reasoning: str,
    schemas: ToolSchemas,
    formats: Formats,
    plan: ChoicePlan,
    choice: int,
    path: str,
    context: Context | None = None,
) -> list[tuple[str, str]]:
    """Markup last in the reasoning, nothing visible after it: a reasoning parser took the turn's call.
    The calls go out as tool_calls before the finish; the reasoning already went out as it was."""
    if not schemas:
        return []
    leak = find_reasoning_leak(reasoning, schemas, formats, context)
    leaked = _typed_calls(leak, schemas, plan) if leak is not None else None
    if leak is None or not leaked:
        return []
    plan.defect(LEAKED_INTO_REASONING)
    plan.changes.append(
        Change(
            STAGE,
            LEAKED_INTO_REASONING,
            f"$.choices[{choice}].{path}",
            reasoning[leak.start : leak.end],
            [{"name": n, "arguments": a} for n, a in leaked],
            f"tool call ({leak.formats[0]} markup) last in the reasoning with nothing after it; added as "
            "tool_calls before the finish (the reasoning, already sent, keeps the markup)",
        )
    )
    return leaked


def _flag_unpinned(
    text: str, schemas: ToolSchemas, at_start: bool, pinned: Formats, plan: ChoicePlan, choice: int, prefix: str
) -> None:
    leak = foreign_markup(text, schemas, at_start, pinned)
    if leak is None:
        return
    other = next(f for f in leak.formats if f not in pinned.names)
    plan.defect(UNPINNED)
    plan.changes.append(
        Change(
            STAGE,
            UNPINNED,
            f"$.choices[{choice}].{prefix}.content",
            {"format": other, "markup": text[leak.start : leak.end]},
            None,
            f"markup of the registered format {other!r}, but {', '.join(pinned.names)} is pinned; passed through",
        )
    )


def _cut_regions(keep: list[int], parts: list[Part], regions: list[tuple[int, int]], plan: ChoicePlan) -> None:
    """Cut the markup's regions (offsets in the kept parts joined) out of each part they touch; a part
    may hold several regions and the prose between them."""
    offset = 0
    for k in keep:
        text = parts[k].text
        lo, hi = offset, offset + len(text)
        offset = hi
        inside = [(max(a, lo) - lo, min(b, hi) - lo) for a, b in regions if a < hi and b > lo]
        if not inside:
            continue
        kept, pos = [], 0
        for a, b in inside:
            kept.append(text[pos:a])
            pos = b
        kept.append(text[pos:])
        plan.content_edits[k] = "".join(kept)


def length_cut(
    calls: list[Call],
    seqs: list[int],
    parts: list[Part],
    consumed: set[int],
    schemas: ToolSchemas,
    formats: Formats,
    at_start: bool,
    context: Context | None,
    reasoning: str | None,
    reasoning_context: Context | None = None,
) -> Fatal | None:
    """A choice that `max_tokens` ended (finish `length`): the unrecoverable verdict when it stopped inside
    a call, or after one with a sign that more was coming (`cutoff.py`: docs/repair.md says which); None
    when its calls (if any) are complete and nothing follows them, so the finish may become `tool_calls`.

    Structured calls: the last one opened with no argument text is a further call cut at its start, and
    content after the last one opened is text after it. Without them: the content's leaked markup (left
    open, or text after it) or markup cut short; the reasoning's, when it was searched for the call."""
    keep = [k for k in range(len(parts)) if k not in consumed]
    if not calls:
        text = "".join(parts[k].text for k in keep)
        sign = turn_sign(
            text,
            schemas,
            formats,
            reasoning=reasoning,
            context=context,
            at_start=at_start,
            reasoning_context=reasoning_context,
        )
        return cut_off(sign) if sign is not None else None
    last = max(range(len(calls)), key=lambda k: (seqs[k], k))  # the last opened
    call = calls[last]
    texts = [f for f in call.frags if isinstance(f, str)]
    if not "".join(texts).strip() and len(texts) == len(call.frags):
        return Fatal(
            call.name or "?",
            "max_tokens reached after a further call was opened, before its arguments",
            MISSING_LAST_CHUNK,
        )
    after = "".join(parts[k].text for k in keep if parts[k].seq > seqs[last])
    sign = turn_sign(after, schemas, formats, last_call=call.name or "?")
    return cut_off(sign) if sign is not None else None
