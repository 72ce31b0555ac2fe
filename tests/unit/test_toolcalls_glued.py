"""A second call glued into a call's arguments (issue 31 item 12; docs/repair.md, "Calls glued together").

Split where the offered tool's name marks the boundary (the bare name, or a `{"name": …}` object), on
every surface, streamed with the fragments cut anywhere (inside the name too) and not; refused, as the
retryable error, wherever the boundary isn't marked unambiguously: no name, a name no tool has, text in
between, or an object that may be the first tool's arguments again.
"""

from __future__ import annotations

import json
import random
from functools import partial
from typing import Any

import orjson
import pytest
from tapfix.proxy.mock.messages import messages_body, messages_events
from tapfix.proxy.mock.responses import responses_body, responses_events
from tapfix.proxy.mock.surface_script import Part, Script
from tapfix.proxy.toolcalls import (
    ChatToolCallRepair,
    MessagesToolCallRepair,
    ResponsesToolCallRepair,
    repair_messages_body,
    repair_responses_body,
)
from tapfix.proxy.toolcalls.arguments import repair_arguments
from tapfix.proxy.toolcalls.glued import split_glued
from tapfix.proxy.toolcalls.nonstream import repair_chat_completion
from tapfix.proxy.toolcalls.schema import ToolSchemas

from tests.support.builders import chat_chunk, random_splits, split_arguments, sse, tool, tool_call_chunk
from tests.support.stage_io import client_view, run_stage
from tests.unit.test_toolcalls_invariants_evented import messages_view, responses_view

WRITE = tool("write", {"filePath": {"type": "string"}, "content": {"type": "string"}}, ["filePath", "content"])
BASH = tool("bash", {"command": {"type": "string"}}, ["command"])
CREATE = tool("create_tool", {"name": {"type": "string"}, "arguments": {"type": "object"}}, ["name"])
TOOLS = [WRITE, BASH]
SCHEMAS = ToolSchemas(TOOLS)
A = '{"filePath": "a.txt", "content": "hi"}'
LS = '{"command": "ls"}'
WANT = [("write", {"filePath": "a.txt", "content": "hi"}), ("bash", {"command": "ls"})]

SPLIT = {
    "the bare name": (A + "bash" + LS, WANT),
    "the name between spaces": (A + " bash\n" + LS, WANT),
    "a call object": (A + '{"name": "bash", "arguments": ' + LS + "}", WANT),
    "a call object with parameters": (A + '{"type": "function", "name": "bash", "parameters": ' + LS + "}", WANT),
    "a call object with a string": (A + '{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}', WANT),
    "the same tool twice": (
        LS + "bash" + '{"command": "pwd"}',
        [("bash", {"command": "ls"}), ("bash", {"command": "pwd"})],
    ),
    "three calls": (A + "bash" + LS + "bash" + '{"command": "pwd"}', [*WANT, ("bash", {"command": "pwd"})]),
    "a closer left after the last": (A + "bash" + LS + "}", WANT),
}
REFUSED = {
    "no name": A + LS,
    "a name no tool has": A + "grep" + LS,
    "text between": A + " then bash" + LS,
    "a name, no object": A + "bash",
    "a call object naming no tool": A + '{"name": "grep", "arguments": ' + LS + "}",
    "the first object not whole": A[:-1] + "bash" + LS,
}


@pytest.mark.parametrize(("text", "want"), SPLIT.values(), ids=SPLIT.keys())
def test_the_offered_name_marks_where_the_glued_call_starts(text: str, want: list[tuple[str, Any]]) -> None:
    res = repair_arguments([text], want[0][0], SCHEMAS, None)
    assert res.fatal is None and "glued_call" in res.kinds
    got = [(want[0][0], json.loads(res.text))] + [(n, json.loads(a)) for n, a in res.glued]
    assert got == want


@pytest.mark.parametrize("text", REFUSED.values(), ids=REFUSED.keys())
def test_a_boundary_no_name_marks_is_never_guessed(text: str) -> None:
    res = repair_arguments([text], "write", SCHEMAS, None)
    assert res.fatal is not None and res.glued == []


def test_an_object_that_may_be_the_first_tools_arguments_again_is_not_split() -> None:
    """`create_tool` takes `name` and `arguments`: a second such object has two readings."""
    schemas = ToolSchemas([CREATE, BASH])
    text = '{"name": "x", "arguments": {}}{"name": "bash", "arguments": ' + LS + "}"
    assert split_glued(text, "create_tool", schemas) is None
    assert repair_arguments([text], "create_tool", schemas, None).fatal is not None


def test_a_glued_call_is_repaired_as_a_call() -> None:
    cut = repair_arguments([A + 'bash{"command": "l'], "write", SCHEMAS, "length")
    assert cut.fatal is not None and cut.kinds[0] == "missing_last_chunk"
    lost = repair_arguments([A + "bash{}"], "write", SCHEMAS, None)
    assert lost.fatal is not None and "required argument 'command'" in lost.fatal


# -- chat ----------------------------------------------------------------------------------------------
chunk = partial(chat_chunk, id="chatcmpl-glue")
call = partial(tool_call_chunk, chunk_id="chatcmpl-glue")


def chat_stream(name: str, text: str, seed: int) -> list[dict[str, Any]]:
    frags = split_arguments(text, random.Random(seed), 8)
    return [
        chunk({"role": "assistant", "content": ""}),
        call(0, "call_a", name, ""),
        *[call(0, arguments=f) for f in frags],
        chunk(finish_reason="tool_calls"),
    ]


def run_chat(stream: list[dict[str, Any]], seed: int) -> tuple[bytes, ChatToolCallRepair]:
    stage = ChatToolCallRepair(TOOLS, capture_id="cap-glue")
    return run_stage(stage, random_splits(sse(stream), random.Random(seed))), stage


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("text", "want"), SPLIT.values(), ids=SPLIT.keys())
def test_chat_splits_the_glued_call_streamed(text: str, want: list[tuple[str, Any]], seed: int) -> None:
    out, stage = run_chat(chat_stream(want[0][0], text, seed), seed)
    view = client_view(out)
    assert [(c["name"], json.loads(c["arguments"])) for c in view.calls] == want
    indexes = [tc["index"] for c in view.chunks for ch in c["choices"] for tc in ch["delta"].get("tool_calls") or []]
    assert list(dict.fromkeys(indexes)) == list(range(len(want))) and len({c["id"] for c in view.calls}) == len(want)
    assert view.finish_reasons == ["tool_calls"] and "glued_call" in stage.defects
    change = next(c for c in stage.changes if c.kind == "glued_call")
    assert [g["name"] for g in change.after["glued"]] == [n for n, _ in want[1:]]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("text", REFUSED.values(), ids=REFUSED.keys())
def test_chat_refuses_an_unmarked_boundary_streamed(text: str, seed: int) -> None:
    out, stage = run_chat(chat_stream("write", text, seed), seed)
    view = client_view(out)
    assert view.calls == [] and len(view.errors) == 1 and stage.outcome == "unrecoverable"


@pytest.mark.parametrize(("text", "want"), SPLIT.values(), ids=SPLIT.keys())
def test_chat_splits_the_glued_call_not_streamed(text: str, want: list[tuple[str, Any]]) -> None:
    tc = {"id": "call_a", "type": "function", "function": {"name": want[0][0], "arguments": text}}
    message = {"role": "assistant", "content": None, "tool_calls": [tc]}
    body = {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
    }
    out, _, outcome = repair_chat_completion(json.dumps(body).encode(), TOOLS)
    calls = json.loads(out)["choices"][0]["message"]["tool_calls"]
    assert (
        outcome == "repaired"
        and [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == want
    )
    assert len({c["id"] for c in calls}) == len(want)


# -- Responses and Messages ------------------------------------------------------------------------------
R_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
M_TOOLS = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]


def script(name: str, text: str, seed: int) -> Script:
    return Script([Part("call", split_arguments(text, random.Random(seed), 8), "call_a", name)], "tool_calls", 9)


def feed(stage: Any, evs: list[bytes]) -> bytes:
    out: list[bytes] = []
    for raw in evs:
        out += stage.feed(raw)
    return b"".join(out + stage.flush())


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("text", "want"), SPLIT.values(), ids=SPLIT.keys())
def test_responses_and_messages_split_the_glued_call(text: str, want: list[tuple[str, Any]], seed: int) -> None:
    s = script(want[0][0], text, seed)
    r_stage = ResponsesToolCallRepair(R_TOOLS, capture_id="cap-glue")
    r_out = feed(r_stage, responses_events(s, {}, "g" * 64, 1, "m", 9))
    split = next(c for c in r_stage.changes if c.kind == "glued_call")
    assert [(g["name"], json.loads(g["arguments"])) for g in split.after["glued"]] == want[1:]
    r_view = responses_view(r_out)  # also: the terminal object lists the same calls, ids unique, indexes dense
    assert r_view["errors"] == [] and [(c["name"], json.loads(c["arguments"])) for c in r_view["calls"]] == want
    m_out = feed(MessagesToolCallRepair(M_TOOLS, capture_id="cap-glue"), messages_events(s, "g" * 64, "m", 9))
    m_view = messages_view(m_out)
    assert m_view["errors"] == [] and [(c["name"], c["input"]) for c in m_view["calls"]] == want
    assert m_view["stop"] == "tool_use" and len({c["id"] for c in m_view["calls"]}) == len(want)
    r_body, _, _ = repair_responses_body(responses_body(s, {}, "g" * 64, 1, "m", 9), R_TOOLS)
    items = [i for i in orjson.loads(r_body)["output"] if i["type"] == "function_call"]
    assert [(i["name"], json.loads(i["arguments"])) for i in items] == want
    m_body, _, _ = repair_messages_body(messages_body(s, "g" * 64, "m", 9), M_TOOLS)
    blocks = [b for b in orjson.loads(m_body)["content"] if b["type"] == "tool_use"]
    assert [(b["name"], b["input"]) for b in blocks] == want and len({b["id"] for b in blocks}) == len(want)


@pytest.mark.parametrize("text", REFUSED.values(), ids=REFUSED.keys())
def test_responses_and_messages_refuse_an_unmarked_boundary(text: str) -> None:
    s = script("write", text, 0)
    r_out = feed(ResponsesToolCallRepair(R_TOOLS, capture_id="cap-glue"), responses_events(s, {}, "g" * 64, 1, "m", 9))
    m_out = feed(MessagesToolCallRepair(M_TOOLS, capture_id="cap-glue"), messages_events(s, "g" * 64, "m", 9))
    assert responses_view(r_out)["errors"] and messages_view(m_out)["errors"]


@pytest.mark.parametrize("seed", range(3))
def test_the_glued_call_takes_its_place_before_the_calls_after_it(seed: int) -> None:
    """Split off the first of two calls, it goes between them, on every surface."""
    rng = random.Random(seed)
    parts = [
        Part("call", split_arguments(A + "bash" + LS, rng, 8), "call_a", "write"),
        Part("call", split_arguments('{"command": "pwd"}', rng, 4), "call_c", "bash"),
    ]
    s = Script(parts, "tool_calls", 9)
    want = [*WANT, ("bash", {"command": "pwd"})]
    r_out = feed(ResponsesToolCallRepair(R_TOOLS, capture_id="cap-glue"), responses_events(s, {}, "g" * 64, 1, "m", 9))
    assert [(c["name"], json.loads(c["arguments"])) for c in responses_view(r_out)["calls"]] == want
    m_out = feed(MessagesToolCallRepair(M_TOOLS, capture_id="cap-glue"), messages_events(s, "g" * 64, "m", 9))
    assert [(c["name"], c["input"]) for c in messages_view(m_out)["calls"]] == want
