"""A turn that `max_tokens` ended, through the Chat Completions repair (issue 31 items 10 and 13; docs/repair.md,
"A turn max_tokens ended"), streamed with hostile chunk splits and not, both sides of each rule.

A call written as markup and cut short is the retryable error, never half-written markup with finish
`length`. Complete calls keep the finish rewrite (`length` → `tool_calls`) only when nothing says more
was coming: a further opener (whole or cut), a calls section left open, text after the last call or a
further call opened make the turn the error. Prose that only mentions markup passes as it came.
"""

from __future__ import annotations

import json
import random
from functools import partial
from typing import Any

import pytest
from tapfix.proxy.toolcalls import ChatToolCallRepair
from tapfix.proxy.toolcalls.nonstream import repair_chat_completion

from tests.support.builders import chat_chunk, random_splits, sse, tool, tool_call_chunk
from tests.support.stage_io import client_view, run_stage

WRITE = tool("write", {"filePath": {"type": "string"}, "content": {"type": "string"}}, ["filePath", "content"])
BASH = tool("bash", {"command": {"type": "string"}})  # nothing required: `{}` would be a whole call
TOOLS = [WRITE, BASH]
HERMES_CUT = '<tool_call>\n{"name": "write", "arguments": {"filePath": "a.txt", "content": "hi'
PROSE = [
    "I want to",  # the start of harmony's ` to=functions.` is how prose ends, too
    "Qwen wraps each call in <tool_call> tags and the server",
    "Mistral writes [TOOL_CALLS] before the calls, then",
    'Here is the format:\n\n```\n<tool_call>\n{"name": "write", "arguments": {"content": "hi',  # a fenced example
    # examples in the other containers (docs/formats.md, "What counts as a call")
    'Two forms:\n\n- <tool_call>\n{"name": "write", "arguments": {"content": "hi',  # a list item
    'It answered "<tool_call>{"name": "write", "arguments": {"content": "hi',  # quotes
    'Example:\n\n    <tool_call>\n    {"name": "write", "arguments": {"content": "hi',  # an indented code block
    '> <tool_call>\n> {"name": "write", "arguments": {"content": "hi',  # a blockquote
    '| model | output |\n|---|---|\n| Qwen3 | <tool_call>{"name": "write", "arguments": {"content": "hi',  # a table
    '<tool_call>\n{"name": "delete_everything", "arguments": {"path": "/',  # no such tool was offered
    '{"name": "write", "description": "Writes a file", "parameters": {"type": "obj',  # a JSON answer, no call
    "Action: I will now write the file, then",
]

chunk = partial(chat_chunk, id="chatcmpl-cut")
call = partial(tool_call_chunk, chunk_id="chatcmpl-cut")
ROLE = chunk({"role": "assistant", "content": ""})


def content(text: str) -> dict[str, Any]:
    return chunk({"content": text})


def pieces(text: str, seed: int) -> list[dict[str, Any]]:
    """`text` as content deltas of 1 to 6 characters: every marker is split somewhere."""
    rng, out, pos = random.Random(seed), [], 0
    while pos < len(text):
        step = rng.randint(1, 6)
        out.append(content(text[pos : pos + step]))
        pos += step
    return out


def stream(stream: list[dict[str, Any]], seed: int = 0) -> tuple[bytes, bytes, ChatToolCallRepair]:
    data = sse(stream)
    stage = ChatToolCallRepair(TOOLS, capture_id="cap-cut")
    return data, run_stage(stage, random_splits(data, random.Random(seed))), stage


def body(message: dict[str, Any], finish: str) -> bytes:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
    return json.dumps({"id": "chatcmpl-cut", "object": "chat.completion", "choices": [choice]}).encode()


# -- item 10: a leaked call cut by max_tokens, chat ----------------------------------------------------------
CUT_CALLS = {
    "hermes": HERMES_CUT,
    "hermes, prose before": "I'll create it now.\n\n" + HERMES_CUT,
    "qwen3_coder": "<tool_call>\n<function=write>\n<parameter=filePath>\na.txt\n</parameter>\n<parameter=content>\nhi",
    "mistral": '[TOOL_CALLS]write[ARGS]{"filePath": "a.txt", "content": "hi',
    "harmony, its second call": (
        ' to=functions.bash<|channel|>commentary json<|message|>{"command": "ls"}<|call|>'
        '<|start|>assistant to=functions.write<|channel|>commentary json<|message|>{"filePath": "a'
    ),
    "kimi, in the name": "<|tool_calls_section_begin|><|tool_call_begin|>functions.wri",
    "pythonic, at the start": '[write(filePath="a.txt", content="hi',
    "llama3 json, at the start": '{"name": "write", "parameters": {"filePath": "a.txt", "content": "hi',
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("text", CUT_CALLS.values(), ids=CUT_CALLS.keys())
def test_a_leaked_call_cut_by_max_tokens_is_the_retryable_error_streamed(text: str, seed: int) -> None:
    _, out, stage = stream([ROLE, *pieces(text, seed), chunk(finish_reason="length")], seed)
    view = client_view(out)
    assert view.calls == [] and view.finish_reasons == []
    assert len(view.errors) == 1 and view.errors[0]["type"] == "server_error" and view.done == 1
    assert "max_tokens reached" in view.errors[0]["message"] and stage.outcome == "unrecoverable"
    assert "missing_last_chunk" in stage.defects


@pytest.mark.parametrize("text", CUT_CALLS.values(), ids=CUT_CALLS.keys())
def test_a_leaked_call_cut_by_max_tokens_is_the_retryable_error_not_streamed(text: str) -> None:
    out, changes, outcome = repair_chat_completion(body({"content": text}, "length"), TOOLS)
    assert outcome == "unrecoverable" and json.loads(out)["error"]["type"] == "server_error"
    assert any(c.kind == "missing_last_chunk" for c in changes)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("text", PROSE)
def test_prose_cut_by_max_tokens_passes_as_it_came(text: str, seed: int) -> None:
    data, out, stage = stream([ROLE, *pieces(text, seed), chunk(finish_reason="length")], seed)
    assert out == data and stage.outcome == "untouched"
    raw = body({"content": text}, "length")
    assert repair_chat_completion(raw, TOOLS)[0] == raw


@pytest.mark.parametrize("seed", [0, 1])
def test_a_leaked_call_cut_with_a_stop_finish_is_left_as_text(seed: int) -> None:
    """The rule is max_tokens': a model that stopped inside markup wrote no call (issue 31 leaves it so)."""
    data, out, _ = stream([ROLE, *pieces(HERMES_CUT, seed), chunk(finish_reason="stop")], seed)
    assert out == data


# -- item 13: complete calls, then max_tokens ---------------------------------------------------------------
def leaked(text: str, seed: int) -> list[dict[str, Any]]:
    return [ROLE, *pieces(text, seed), chunk(finish_reason="length")]


def structured(*after: dict[str, Any]) -> list[dict[str, Any]]:
    return [ROLE, call(0, "call_a", "bash", ""), call(0, arguments='{"command": "ls"}'), *after]


HERMES_LS = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
KIMI_LS = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>"
    '{"command": "ls"}<|tool_call_end|>'
)
DEEPSEEK_LS = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>bash<｜tool▁sep｜>{"command": "ls"}<｜tool▁call▁end｜>'
LENGTH = chunk(finish_reason="length")
SIGNS: dict[str, Any] = {
    "a second call opened, no arguments yet": lambda seed: structured(call(1, "call_b", "bash", ""), LENGTH),
    "text after the last call": lambda seed: structured(content("Now I will"), LENGTH),
    "an opener after the last call": lambda seed: structured(content("<tool_call>"), LENGTH),
    "a leaked call, then a further opener": lambda seed: leaked(HERMES_LS + "\n<tool_call>", seed),
    "a leaked call, then the start of an opener": lambda seed: leaked(HERMES_LS + "\n<tool_", seed),
    "a leaked call, then prose": lambda seed: leaked(HERMES_LS + "\nNow I will", seed),
    "a leaked call, then a cut one": lambda seed: leaked(HERMES_LS + "\n" + HERMES_CUT, seed),
    "kimi's calls section left open": lambda seed: leaked(KIMI_LS, seed),
    "deepseek's calls section left open": lambda seed: leaked(DEEPSEEK_LS, seed),
    "hermes' call left open": lambda seed: leaked(
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}', seed
    ),
}
COMPLETE: dict[str, Any] = {
    "one structured call": lambda seed: structured(LENGTH),
    "two structured calls": lambda seed: structured(call(1, "call_b", "bash", '{"command": "pwd"}'), LENGTH),
    "a structured call, then whitespace": lambda seed: structured(content("\n"), LENGTH),
    "a leaked hermes call": lambda seed: leaked("Listing.\n" + HERMES_LS, seed),
    "kimi's calls section closed": lambda seed: leaked(KIMI_LS + "<|tool_calls_section_end|>", seed),
    "deepseek's calls section closed": lambda seed: leaked(DEEPSEEK_LS + "<｜tool▁calls▁end｜>", seed),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("make", SIGNS.values(), ids=SIGNS.keys())
def test_a_sign_that_more_was_coming_makes_a_length_turn_the_retryable_error(make: Any, seed: int) -> None:
    _, out, stage = stream(make(seed), seed)
    view = client_view(out)
    assert view.calls == [] and view.finish_reasons == [] and len(view.errors) == 1
    assert "max_tokens reached" in view.errors[0]["message"] and stage.outcome == "unrecoverable"


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("make", COMPLETE.values(), ids=COMPLETE.keys())
def test_complete_calls_and_nothing_after_keep_the_finish_rewrite(make: Any, seed: int) -> None:
    _, out, stage = stream(make(seed), seed)
    view = client_view(out)
    assert view.errors == [] and view.calls and view.finish_reasons == ["tool_calls"]
    assert "finish_reason_mismatch" in stage.defects or "leaked_into_content" in stage.defects


def test_the_rule_holds_on_the_non_streamed_body() -> None:
    """A body's content comes before its calls (where a stream's text after a call has no place)."""
    ls = {"id": "call_a", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    kept = repair_chat_completion(body({"content": None, "tool_calls": [ls]}, "length"), TOOLS)
    assert kept[2] == "repaired" and json.loads(kept[0])["choices"][0]["finish_reason"] == "tool_calls"
    opened = {"id": "call_b", "type": "function", "function": {"name": "bash", "arguments": ""}}
    for message in (
        {"content": None, "tool_calls": [ls, opened]},
        {"content": KIMI_LS},
        {"content": HERMES_LS + "\n<tool_call>"},
    ):
        out, _, outcome = repair_chat_completion(body(message, "length"), TOOLS)
        assert outcome == "unrecoverable" and "max_tokens reached" in json.loads(out)["error"]["message"]
