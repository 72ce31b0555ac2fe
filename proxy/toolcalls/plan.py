"""Deciding, once a message's tool calls are complete, what the client gets for one choice.

Shared by the streaming stage and the non-streamed repair, so both apply the same rules. The plan says
which calls go out (with stable indexes 0..n-1, ids and names), which content is removed because it
was leaked call syntax, which finish_reason the client gets, and whether anything is unrecoverable.

The structural invariants are checked on every choice of every answer that offered tools, not only
when a defect was noticed, each from its definition:
- indexes are dense from 0 in order of first appearance (calls are listed in that order): any other
  numbering is renumbered;
- every call has its own id (a missing one or one another call already has is minted; id churn was
  undone by the accumulator);
- a name that is not offered becomes the offered one when it is a form of exactly one (`names.py`);
  otherwise it passes as sent, flagged `unknown_tool` (a change is recorded, the bytes stay);
- the finish_reason matches what the client receives: `tool_calls` with no call is the retryable error
  (after the leak recovery had its chance), `stop` or `length` with calls becomes `tool_calls`
  (`length` only once every call passed the cut check), except `stop` with the call a named
  `tool_choice` forced, which OpenAI and vLLM send as is.
With n > 1 each choice gets its own plan: a broken choice is repaired without touching the others.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Final

from tapfix.proxy.changes import Change
from tapfix.proxy.toolcalls.accumulate import Call
from tapfix.proxy.toolcalls.arguments import CUT, ArgResult, dumps, repair_arguments
from tapfix.proxy.toolcalls.defects import EMPTY_TURN, FINISH_MISMATCH, MISSING_FRAGMENT, UNKNOWN_TOOL, WRONG_INDEX
from tapfix.proxy.toolcalls.formats import Formats
from tapfix.proxy.toolcalls.formats.base import typed_xml_args
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
from tapfix.proxy.toolcalls.names import match_name
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
    finish_edit: str | None = None  # the finish_reason the client gets instead of the upstream's

    @property
    def untouched(self) -> bool:
        return self.structured_clean and not self.content_edits and self.fatal is None and self.finish_edit is None

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
    named: str | None = None,
    formats: Formats | None = None,
    reasoning: str | None = None,
    reasoning_field: str = "reasoning_content",
    flag_unpinned: bool = True,
    context: str = "",
) -> ChoicePlan:
    """`index_base`/`sent_ids`: calls this choice already sent (tool calls arriving after a finish);
    `named`: the tool a named `tool_choice` forces (`named_tool`), whose call may finish with `stop`;
    `formats`: the armed tool-call formats (None: every registered one); `reasoning`: the choice's
    reasoning text, searched for a call only when nothing visible followed it (the caller says so by
    passing it); `flag_unpinned`: with a pinned format, flag another format's markup in the content;
    `context`: an open `<think>` or fence of the content sent before `parts` (`leaks.open_context`)."""
    plan = ChoicePlan()
    formats = formats or formats_for(None)
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
    leaked = _leaks(
        calls, parts, consumed, schemas, at_start, plan, choice, path_prefix, formats, flag_unpinned, context
    )
    if reasoning and not calls and not leaked and not any(p.text.strip() for p in parts):
        leaked = _reasoning_leak(reasoning, schemas, formats, plan, choice, f"{path_prefix}.{reasoning_field}")
    if plan.fatal:
        return plan
    if not calls and not leaked and finish == "tool_calls" and index_base == 0 and schemas:
        plan.defect(EMPTY_TURN)  # the server's parser lost the call: never a silent empty turn
        plan.fatal = Fatal("?", "finish_reason tool_calls, but the answer carried no tool call", EMPTY_TURN)
        return plan
    calls = _client_order(calls) if index_base == 0 else calls
    _check_structure(calls, schemas, plan, choice, path_prefix, index_base)
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
    _check_finish(finish, names + [n for n, _ in leaked], named, plan, choice)
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
                    "; ".join(res.fixes + call.reasons + [k for k in call.kinds if k not in res.kinds]) or kind,
                )
            )
        index += 1
    for name, text in leaked:
        call_id = _make_id(seed, choice, index)
        plan.calls.append(OutCall(index, call_id, name, text))
        index += 1
    return plan


def named_tool(tool_choice: Any) -> str | None:
    """The tool a request's `tool_choice` forces by name: Chat Completions'
    `{"type": "function", "function": {"name": X}}` (or the Responses form `{"type": "function",
    "name": X}`); None for "auto", "required", "none" or anything else."""
    if not isinstance(tool_choice, dict) or tool_choice.get("type") not in (None, "function"):
        return None
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, dict) else tool_choice.get("name")
    return name if isinstance(name, str) and name else None


def _client_order(calls: list[Call]) -> list[Call]:
    """Calls whose indexes already are 0..n-1 (interleaved openers included: a valid stream) in index
    order, as a client keying by index lists them, so a repair elsewhere keeps every call at its index;
    any other numbering stays in order of first appearance, which is how it is renumbered."""
    indexes = [c.index for c in calls]
    if indexes == list(range(len(calls))):
        return calls
    if all(isinstance(i, int) for i in indexes) and sorted(i for i in indexes if i is not None) == list(
        range(len(calls))
    ):
        return sorted(calls, key=lambda c: c.index or 0)
    return calls


def _check_structure(
    calls: list[Call], schemas: ToolSchemas, plan: ChoicePlan, choice: int, path_prefix: str, index_base: int
) -> None:
    """Indexes dense from 0, one id per call, offered names: noted on the calls (which makes them go out
    rewritten), except an unknown name, which only is flagged."""
    seen_ids: set[str] = set()
    for k, call in enumerate(calls):
        if call.id is not None and call.id in seen_ids:  # results are matched to calls by id
            call.note(WRONG_INDEX, f"id {call.id!r} already used by an earlier call: a fresh one minted")
        seen_ids.add(call.id or "")
        if index_base == 0 and call.index is not None and call.index != k:
            call.note(WRONG_INDEX, f"arrived on index {call.index}, not {k}: indexes are dense from 0")
        if call.name is not None and schemas:
            verdict = match_name(call.name, schemas.names)
            if verdict.kind == UNKNOWN_TOOL:
                plan.defect(UNKNOWN_TOOL)
                plan.changes.append(
                    Change(
                        STAGE,
                        UNKNOWN_TOOL,
                        f"$.choices[{choice}].{path_prefix}.tool_calls[{index_base + k}].function.name",
                        call.name,
                        call.name,
                        "not a form of exactly one offered tool; passed through as sent",
                    )
                )
            elif verdict.kind is not None:
                call.original_name = call.name
                call.name = verdict.name
                call.note(verdict.kind, f"name {call.original_name!r} is a form of the offered {verdict.name!r}")
        for kind in call.kinds:
            plan.defect(kind)


def _check_finish(finish: str | None, names: list[str], named: str | None, plan: ChoicePlan, choice: int) -> None:
    """A finish with calls says `tool_calls`: `stop` is corrected (unless it carries the call a named
    tool_choice forced), `length` too, once every call passed the cut check (`repair_arguments`)."""
    if not names or finish not in ("stop", "length"):
        return
    if finish == "stop" and named is not None and all(n == named for n in names):
        return
    if finish == "stop":
        reason = "the message ends in tool calls"
    else:
        reason = "max_tokens reached after the calls were complete and fit the schema; the calls are kept"
    plan.finish_edit = "tool_calls"
    plan.defect(FINISH_MISMATCH)
    plan.changes.append(
        Change(STAGE, FINISH_MISMATCH, f"$.choices[{choice}].finish_reason", finish, "tool_calls", reason)
    )


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
    formats: Formats,
    flag_unpinned: bool,
    context: str,
) -> list[tuple[str, str]]:
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
    for start, end in leak.regions or [(leak.start, leak.end)]:
        _cut_region(full, keep, parts, start, end, plan)
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


def _reasoning_leak(
    reasoning: str, schemas: ToolSchemas, formats: Formats, plan: ChoicePlan, choice: int, path: str
) -> list[tuple[str, str]]:
    """Markup last in the reasoning, nothing visible after it: a reasoning parser took the turn's call.
    The calls go out as tool_calls before the finish; the reasoning already went out as it was."""
    if not schemas:
        return []
    leak = find_reasoning_leak(reasoning, schemas, formats)
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
