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

Text that is really a call (a continuation of the open call's arguments, markup in the content or
last in the reasoning) is read by `plan_content.py` first; the records a plan is made of are in
`plan_types.py`.
"""

from __future__ import annotations

import hashlib
from typing import Any

from tapfix.proxy.changes import Change
from tapfix.proxy.toolcalls.accumulate import Call
from tapfix.proxy.toolcalls.arguments import CUT, ArgResult, repair_arguments
from tapfix.proxy.toolcalls.defects import EMPTY_TURN, FINISH_MISMATCH, UNKNOWN_TOOL, WRONG_INDEX
from tapfix.proxy.toolcalls.formats import Formats
from tapfix.proxy.toolcalls.formats.blocks import Context
from tapfix.proxy.toolcalls.leaks import formats_for
from tapfix.proxy.toolcalls.names import match_name
from tapfix.proxy.toolcalls.plan_content import content_continuation, content_leaks, length_cut, reasoning_leak
from tapfix.proxy.toolcalls.plan_types import STAGE, ChoicePlan, Fatal, OutCall, Part
from tapfix.proxy.toolcalls.schema import ToolSchemas


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
    context: Context | None = None,
    reasoning_context: Context | None = None,
) -> ChoicePlan:
    """`index_base`/`sent_ids`: calls this choice already sent (tool calls arriving after a finish);
    `named`: the tool a named `tool_choice` forces (`named_tool`), whose call may finish with `stop`;
    `formats`: the armed tool-call formats (None: every registered one); `reasoning`: the choice's
    reasoning text, searched for a call only when nothing visible followed it (the caller says so by
    passing it); `flag_unpinned`: with a pinned format, flag another format's markup in the content;
    `context` / `reasoning_context`: what the content / reasoning sent before `parts` / `reasoning` left
    open (`blocks.Context`)."""
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
    consumed = content_continuation(calls, call_seqs, parts, plan, choice)
    leaked = content_leaks(
        calls, parts, consumed, schemas, at_start, plan, choice, path_prefix, formats, flag_unpinned, context
    )
    searched = reasoning if reasoning and not calls and not leaked and not any(p.text.strip() for p in parts) else None
    if searched is not None:
        where = f"{path_prefix}.{reasoning_field}"
        leaked = reasoning_leak(searched, schemas, formats, plan, choice, where, reasoning_context)
    if finish == "length" and schemas and not plan.fatal:
        plan.fatal = length_cut(
            calls, call_seqs, parts, consumed, schemas, formats, at_start, context, searched, reasoning_context
        )
        if plan.fatal is not None:
            plan.defect(plan.fatal.kind)
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
    glued = [n for r in results for n, _ in r.glued]
    _check_finish(finish, names + glued + [n for n, _ in leaked], named, plan, choice)
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
                    {"name": name, "arguments": res.text, "id": call_id}
                    | ({"glued": [{"name": n, "arguments": a} for n, a in res.glued]} if res.glued else {}),
                    "; ".join(res.fixes + call.reasons + [k for k in call.kinds if k not in res.kinds]) or kind,
                )
            )
        index += 1
        for glued_name, glued_args in res.glued:  # calls split off this one's arguments follow it
            plan.calls.append(OutCall(index, _make_id(seed, choice, index), glued_name, glued_args))
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
