"""Prose must never become an executable call (issue 31 item 1): markup counts only in a call position.

The false-positive matrix: every registered format's markup of `bash(command="rm -rf ~/project")` (its own
`render`, the region its reader reads) placed in every container a reader sees as no call — the middle of
a sentence, quotes, a list item, a table cell, a blockquote, `<pre>`, an indented code block, fences of
backticks or tildes... — with every format armed. Each cell goes through the Chat Completions body repair
and its stream stage (deltas of one character and cut inside every marker), and through the Responses and
Messages stages, streamed and not: the client gets the exact bytes, no call. The other side: the same
markup where a model writes a call is one on every surface, and the stream decides as the body does for
every split of mixed texts. docs/formats.md, "What counts as a call", states the rule.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Callable
from functools import partial
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tapfix.proxy.mock.messages import messages_body, messages_events
from tapfix.proxy.mock.mutations_leak import hostile_pieces
from tapfix.proxy.mock.responses import responses_body, responses_events
from tapfix.proxy.toolcalls import (
    ChatToolCallRepair,
    chat_stage,
    repair_chat_completion,
    repair_messages_body,
    repair_responses_body,
)
from tapfix.proxy.toolcalls.formats import REGISTRY, armed

from tests.support.builders import chat_chunk, sse, sse_event
from tests.support.depth import draws, examples
from tests.support.rawserver import RawRequest, json_reply, sse_response
from tests.support.stage_io import client_view, run_stage
from tests.unit.test_toolcalls_glued import TOOLS  # opencode's write (filePath) and bash
from tests.unit.test_toolformats_evented import (
    m_calls,
    m_text,
    m_tools,
    r_calls,
    r_text,
    r_tools,
    run_m,
    run_r,
    text_script,
)

CALL = ("bash", {"command": "rm -rf ~/project"})
REPORTED = (
    'Never let a model emit <tool_call>{"name": "bash", "arguments": {"command": "rm -rf ~/project"}}</tool_call> '
    "unchecked; that is why agents ask first."
)

chunk = partial(chat_chunk, id="chatcmpl-p1")
ROLE = chunk({"role": "assistant", "content": ""})
STOP = chunk(finish_reason="stop")


def _markup(name: str) -> str:
    """The region of format `name`'s render of the call that its reader reads (its own markup, without
    the text around it some templates write)."""
    rendered = REGISTRY[name].render([CALL])
    found = armed(name).find(rendered, ["write", "bash"])
    assert found is not None and found.confirmed and found.calls[0][0] == "bash", name
    return rendered[found.markup.start : found.markup.end].strip()


MARKUPS = {name: _markup(name) for name in sorted(REGISTRY)}


def _indented(m: str) -> str:
    return "\n".join("    " + line for line in m.split("\n"))


# Where a reader sees markup as text: (name, wrap). The texts are realistic prose around an example.
CONTAINERS: list[tuple[str, Callable[[str], str]]] = [
    ("mid_sentence", lambda m: f"Never let a model emit {m} unchecked; that is why agents ask first."),
    ("mid_sentence_start", lambda m: f"{m} is what the model writes to run a command; never run it unchecked."),
    ("sentence_wrapped", lambda m: f"Never let a model emit\n{m}\nunchecked; that is why agents ask first."),
    ("wrapped_after_markup", lambda m: f"Qwen answers with {m}\nwhen it wants the tool, and the parser reads it."),
    ("straight_quotes", lambda m: f'The model answers "{m}" when it wants the tool.'),
    ("quote_ends_turn", lambda m: f'The model answers with this: "{m}"'),
    ("curly_quotes", lambda m: f"The model answers “{m}” when it wants the tool."),
    ("curly_quote_lines", lambda m: f"He pasted this:\n“\n{m}\n”"),
    ("guillemets", lambda m: f"Le modèle écrit «{m}» pour appeler l'outil."),
    ("list_item", lambda m: f"What the models write:\n\n- {m}\n- plain text otherwise\n"),
    ("list_item_last", lambda m: f"Two forms:\n\n* a structured call\n* {m}"),
    ("numbered_item", lambda m: f"Steps:\n\n1. Read the file.\n2. {m}"),
    ("list_continuation", lambda m: f"1. The model writes:\n\n   {m}\n\n2. The server parses it."),
    ("table_cell", lambda m: f"| model | output |\n|---|---|\n| Qwen3 | {m} |\n"),
    ("table_row_end", lambda m: f"| model | output |\n| --- | --- |\n| Qwen3 | {m}"),
    ("blockquote", lambda m: f"The docs say:\n\n> {m}\n\nSo that is the format."),
    ("blockquote_last", lambda m: f"> Example from the model card:\n> {m}"),
    ("pre", lambda m: f"Raw output:\n<pre>{m}</pre>"),
    ("pre_block", lambda m: f"<pre>\n{m}\n</pre>\n"),
    ("code_tag", lambda m: f"It looks like <code>{m}</code> in the logs."),
    ("indented_code", lambda m: f"Example of the format:\n\n{_indented(m)}\n\nThat is all."),
    ("indented_code_last", lambda m: f"Example:\n\n{_indented(m)}\n"),
    ("backtick_fence", lambda m: f"Here is how it looks:\n\n```\n{m}\n```\n"),
    ("backtick_fence_info", lambda m: f"```text\n{m}\n```"),
    ("long_backtick_fence", lambda m: f"Example:\n\n````markdown\n{m}\n````\n\nDone."),
    ("tilde_fence", lambda m: f"Example:\n~~~\n{m}\n~~~\n"),
    ("tilde_fence_info", lambda m: f"~~~~ xml\n{m}\n~~~~"),
    ("unclosed_fence", lambda m: f"Output:\n```\n{m}\n"),
    ("think", lambda m: f"<think>I could call {m} here, but no.</think>The answer is 4."),
]
# Inline code can't hold a backtick or a line break of the markup.
INLINE = ("inline_code", lambda m: f"Write `{m}` to call it.")

CELLS = [
    pytest.param(fmt, wrap(m), id=f"{fmt}-{where}")
    for fmt, m in MARKUPS.items()
    for where, wrap in [*CONTAINERS, *([INLINE] if "`" not in m and "\n" not in m else [])]
]


def test_the_matrix_is_big_enough() -> None:
    assert len(MARKUPS) >= 8 and len(CONTAINERS) >= 8
    assert len(CELLS) >= len(MARKUPS) * len(CONTAINERS)


# -- the surfaces ---------------------------------------------------------------------------------------
def _chat_stream(text: str, pieces: list[str], tools: list[Any] = TOOLS) -> tuple[bytes, bytes, Any]:
    data = sse([ROLE, *[chunk({"content": p}) for p in pieces], STOP])
    stage = ChatToolCallRepair(tools, capture_id="cap-31")
    rng = random.Random(len(pieces))
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, 40)))
    wire = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    return data, run_stage(stage, wire), stage


def _chat_body(text: str, tools: list[Any] = TOOLS, **kw: Any) -> tuple[bytes, bytes, str]:
    body = json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        }
    ).encode()
    out, changes, outcome = repair_chat_completion(body, tools, capture_id="cap-31", **kw)
    assert outcome != "untouched" or changes == [], changes  # nothing flagged either
    return body, out, outcome


def _splits(text: str) -> list[list[str]]:
    """One character per delta, and cut inside every registered marker (two draws; one at the quick depth,
    which of them by the text: tests/support/depth.py)."""
    return [list(text), *(hostile_pieces(text, random.Random(1 + k)) for k in draws(2, zlib.crc32(text.encode())))]


@pytest.mark.parametrize(("fmt", "text"), CELLS)
def test_markup_in_a_container_stays_text_on_chat(fmt: str, text: str) -> None:
    body, out, outcome = _chat_body(text)
    assert outcome == "untouched" and out == body
    body, out, outcome = _chat_body(text, tool_format=fmt)  # its own format pinned: the same
    assert outcome == "untouched" and out == body
    for pieces in _splits(text):
        data, out, stage = _chat_stream(text, pieces)
        view = client_view(out)
        assert not view.calls and not view.errors, (pieces, view.calls)
        assert view.content == text
        assert out == data, "held events go out byte for byte"
        assert stage.changes == [] and stage.outcome == "untouched"


@pytest.mark.parametrize(("fmt", "text"), CELLS)
def test_markup_in_a_container_stays_text_on_responses_and_messages(fmt: str, text: str) -> None:
    rt, mt = r_tools(TOOLS), m_tools(TOOLS)
    for pieces in _splits(text)[1:]:
        s = text_script(pieces)
        data, stage = run_r(s, rt)
        assert data == b"".join(responses_events(s, {"tools": rt}, "f" * 64, 1_760_000_000, "m", 10))
        assert r_calls(data) == [] and r_text(data) == text and stage.changes == []
        data, stage = run_m(s, mt)
        assert data == b"".join(messages_events(s, "f" * 64, "m", 10))
        assert m_calls(data) == ([], "end_turn") and m_text(data) == text and stage.changes == []
    s = text_script([text])
    body = responses_body(s, {"tools": rt}, "f" * 64, 1_760_000_000, "m", 10)
    assert repair_responses_body(body, rt, capture_id="cap-31") == (body, [], "untouched")
    body = messages_body(s, "f" * 64, "m", 10)
    assert repair_messages_body(body, mt, capture_id="cap-31") == (body, [], "untouched")


# -- the other side: where a model writes a call ------------------------------------------------------
# (name, wrap, prose the client keeps): a call at block level, after a sentence, ending the turn or its line.
POSITIONS: list[tuple[str, Callable[[str], str], str]] = [
    ("alone", lambda m: m, ""),
    ("paragraph_after_prose", lambda m: f"Let me write it.\n\n{m}", "Let me write it.\n\n"),
    ("line_after_prose", lambda m: f"I'll check.\n{m}", "I'll check.\n"),
    ("glued_to_a_sentence", lambda m: f"I'll write it now.{m}", "I'll write it now."),
    ("ends_the_turn_after_prose", lambda m: f"Running it with {m}", "Running it with "),
    ("prose_on_the_next_line", lambda m: f"Let me check.\n{m}\nDone.", "Let me check.\n\nDone."),
    ("after_a_list", lambda m: f"Plan:\n\n- read\n- run\n\n{m}", "Plan:\n\n- read\n- run\n\n"),
    ("after_a_fence", lambda m: f"```\nls\n```\n\n{m}", "```\nls\n```\n\n"),
    ("after_a_closed_think", lambda m: f"<think>I need the shell.</think>\n{m}", "<think>I need the shell.</think>\n"),
]
TRUE_CELLS = [
    pytest.param(fmt, wrap(m), kept, id=f"{fmt}-{where}")
    for fmt, m in MARKUPS.items()
    for where, wrap, kept in POSITIONS
    if not REGISTRY[fmt].anchored or where == "alone"
    if not REGISTRY[fmt].fence or where != "prose_on_the_next_line"
]


@pytest.mark.parametrize(("fmt", "text", "kept"), TRUE_CELLS)
def test_markup_in_a_call_position_is_a_call_everywhere(fmt: str, text: str, kept: str) -> None:
    body, out, outcome = _chat_body(text)
    message = json.loads(out)["choices"][0]["message"]
    assert outcome == "repaired", text
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [CALL]
    assert (message["content"] or "").split() == kept.split()  # the prose around the call, as words
    for pieces in _splits(text)[1:]:
        _, out, _ = _chat_stream(text, pieces)
        view = client_view(out)
        assert [(c["name"], json.loads(c["arguments"])) for c in view.calls] == [CALL], pieces
        assert view.content.split() == kept.split()
        s = text_script(pieces)
        assert r_calls(run_r(s, r_tools(TOOLS))[0]) == [CALL]
        assert m_calls(run_m(s, m_tools(TOOLS))[0]) == ([CALL], "tool_use")


# -- the stream decides as the body does, for every split -------------------------------------------------
HERMES = MARKUPS["hermes"]
MIXED = [
    REPORTED,
    f"Never let a model emit\n{HERMES}\nunchecked.\n\nSo I'll run it myself.\n{HERMES}",
    f"```\n{HERMES}\n```\nThat was the example; now the call:\n\n{MARKUPS['mistral_v11']}",
    f"- {HERMES}\n\n{MARKUPS['qwen3_coder']}\nDone.",
    f'He said "{MARKUPS["glm47"]}" and\n{HERMES}',
    f"> {HERMES}\n\nDone.",
    f"Use {HERMES}\n\nand then {HERMES} carefully.",
]


@pytest.mark.parametrize("text", MIXED, ids=[str(k) for k in range(len(MIXED))])
def test_the_stream_decides_as_the_body_for_every_split(text: str) -> None:
    _, out, _ = _chat_body(text)
    message = json.loads(out)["choices"][0]["message"]
    want_calls = [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []
    ]
    want_text = message["content"] or ""
    for k in range(1, len(text)):
        for pieces in ([text[:k], text[k:]],):
            _, out, _ = _chat_stream(text, pieces)
            view = client_view(out)
            assert [(c["name"], json.loads(c["arguments"])) for c in view.calls] == want_calls, pieces
            assert view.content == want_text, pieces
    _, out, _ = _chat_stream(text, list(text))
    assert client_view(out).content == want_text


FRAGMENTS = st.sampled_from(
    [
        HERMES,
        MARKUPS["mistral_v11"],
        MARKUPS["qwen3_coder"],
        MARKUPS["kimi_k2"],
        MARKUPS["gemma"],
        MARKUPS["llama3_json"],
        MARKUPS["pythonic"],
        MARKUPS["phi4_mini"],
        MARKUPS["harmony"],
        "Let me check.",
        "Never let a model emit",
        " unchecked",
        " ",
        "\n",
        "\n\n",
        "```\n",
        "~~~\n",
        "`",
        "- ",
        "1. ",
        "> ",
        "| ",
        '"',
        "“",
        "”",
        "    ",
        "<think>",
        "</think>",
        "<pre>",
        "</pre>",
        "<|im_end|>",
        "好的。",
        ":",
    ]
)


@given(parts=st.lists(FRAGMENTS, min_size=1, max_size=12), data=st.data())
@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_mix_of_prose_and_markup_streams_as_its_body_reads(parts: list[str], data: st.DataObject) -> None:
    """Whatever the prose, containers and markup, and wherever the deltas are cut, a stream's client gets
    what the non-streamed body gives: the same calls and the same text, on all three surfaces."""
    text = "".join(parts)
    _, out, _ = _chat_body(text)
    message = json.loads(out)["choices"][0]["message"]
    want = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(text) - 1)), max_size=12))))
    pieces = [p for p in (text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)) if p]
    _, out, _ = _chat_stream(text, pieces)
    view = client_view(out)
    assert [(c["name"], json.loads(c["arguments"])) for c in view.calls] == want
    assert view.content.strip() == (message["content"] or "").strip()  # (a blank one is None beside calls)
    assert view.content == (message["content"] or "") or not view.content.strip()
    s = text_script(pieces)
    rt = r_tools(TOOLS)
    body = responses_body(text_script([text]), {"tools": rt}, "f" * 64, 1_760_000_000, "m", 10)
    whole = orjson.loads(repair_responses_body(body, rt, capture_id="cap-31")[0])
    data_r = run_r(s, rt)[0]
    assert r_calls(data_r) == [
        (i["name"], json.loads(i["arguments"])) for i in whole["output"] if i["type"] == "function_call"
    ]
    assert r_text(data_r) == "".join(c["text"] for i in whole["output"] if i["type"] == "message" for c in i["content"])
    assert m_calls(run_m(s, m_tools(TOOLS))[0])[0] == r_calls(data_r)


# -- streaming stays streaming -------------------------------------------------------------------------
def _sent_as_fed(stage: ChatToolCallRepair, pieces: list[str]) -> list[str]:
    """What the client has read after each delta is fed."""
    seen, out = [], ""
    for p in [ROLE, *[chunk({"content": p}) for p in pieces]]:
        for event in stage.feed(sse_event(p)):
            for ch in json.loads(event[6:])["choices"]:
                out += ch["delta"].get("content") or ""
        seen.append(out)
    return seen[1:]


CHUNK_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
DELTAS = st.one_of(
    st.builds(lambda t: {"content": t}, CHUNK_TEXT),
    st.just({"role": "assistant", "content": ""}),
    st.just({}),
    st.builds(lambda t: {"reasoning_content": t}, CHUNK_TEXT),
    st.just({"content": None}),
)


@given(
    deltas=st.lists(st.tuples(DELTAS, st.sampled_from([0, 0, 0, 1, 10])), min_size=1, max_size=8), ascii_=st.booleans()
)
@settings(max_examples=examples(300), deadline=None)
def test_the_fast_paths_deltas_are_read_as_a_json_parser_reads_them(deltas: list[Any], ascii_: bool) -> None:
    """The chunks the fast path lets through are read from their bytes in batches; whenever that reading
    answers, it is the content a JSON parser reads (else the stage parses them one by one)."""
    events = [sse_event(chat_chunk(d, index=i), ensure_ascii=ascii_) for d, i in deltas]
    got = chat_stage._contents(events)
    if got is not None:
        want = "".join(json.loads(e[6:])["choices"][0]["delta"].get("content") or "" for e in events)
        assert got == want
        assert all(i == 0 and "reasoning_content" not in d for d, i in deltas)


def test_markup_in_a_container_is_not_held_at_all() -> None:
    pieces = ["Example:\n\n```\n", HERMES[:5], HERMES[5:], "\n```\n", "That is all."]
    seen = _sent_as_fed(ChatToolCallRepair(TOOLS), pieces)
    assert seen == ["".join(pieces[: k + 1]) for k in range(len(pieces))]


def test_a_mention_in_a_sentence_goes_out_once_prose_follows_it() -> None:
    words = ["Never let a model emit ", HERMES[:9], HERMES[9:], " unchecked;", " that is", " why", " agents"]
    words += [" ask first."] * 20
    seen = _sent_as_fed(ChatToolCallRepair(TOOLS), words)
    assert HERMES not in seen[2], "the markup is held until its line shows what follows it"
    assert seen[3] == "".join(words[:4]), "held longer than the prose after the markup needs"
    assert seen[-1] == "".join(words)


def test_a_call_after_an_unfinished_sentence_is_held_to_the_end_of_its_paragraph() -> None:
    """`emit\\n<tool_call>…</tool_call>\\n`: prose on the next line makes it text; a blank line, a call."""
    stage = ChatToolCallRepair(TOOLS)
    seen = _sent_as_fed(stage, ["Never let a model emit\n", HERMES, "\n", "unchecked", "; really."])
    assert seen[2] == "Never let a model emit\n" and seen[3].endswith("unchecked")
    data = sse([ROLE, *[chunk({"content": p}) for p in ["Run it:\n", HERMES, "\n\n", "Done."]], STOP])
    view = client_view(run_stage(ChatToolCallRepair(TOOLS), [data]))
    assert [c["name"] for c in view.calls] == ["bash"]


# -- the reasoning field -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reasoning", "is_call"),
    [
        (f"I should call the tool.\n{HERMES}", True),
        (f"Thinking about the format:\n```\n{HERMES}\n```", False),
        (f"Options:\n- {HERMES}", False),
        (f'The docs quote "{HERMES}"', False),
    ],
)
def test_the_reasoning_rule_holds_the_position_rule_too(reasoning: str, is_call: bool) -> None:
    for pieces in (list(reasoning), hostile_pieces(reasoning, random.Random(3))):
        data = sse([ROLE, *[chunk({"reasoning_content": p}) for p in pieces], STOP])
        view = client_view(run_stage(ChatToolCallRepair(TOOLS), [data]))
        assert [c["name"] for c in view.calls] == (["bash"] if is_call else [])
    body = json.dumps(
        {
            "id": "x",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "", "reasoning_content": reasoning},
                    "finish_reason": "stop",
                }
            ],
        }
    ).encode()
    out, _, _ = repair_chat_completion(body, TOOLS)
    assert bool(json.loads(out)["choices"][0]["message"].get("tool_calls")) == is_call
    s = text_script([], reasoning=list(reasoning))
    assert bool(r_calls(run_r(s, r_tools(TOOLS))[0])) == is_call
    assert bool(m_calls(run_m(s, m_tools(TOOLS))[0])[0]) == is_call


# -- through a real proxy, as an agent's SDK reads it -------------------------------------------------
def _answer(request: RawRequest) -> list[tuple[float, bytes]]:
    """The upstream (a server without a tool parser): the model's text as plain content, streamed in small
    deltas or whole. The model named in the request picks the text."""
    req = json.loads(request.body)
    text = REPORTED if req["model"] == "reported" else f"I'll clean up now.\n{HERMES}"
    if req.get("stream"):
        pieces = [text[k : k + 7] for k in range(0, len(text), 7)]
        return sse_response(
            [ROLE_EVENT, *[sse_event(chunk({"content": p})) for p in pieces], sse_event(STOP)] + [b"data: [DONE]\n\n"]
        )
    body = json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        }
    ).encode()
    return [(0.0, json_reply(body))]


ROLE_EVENT = sse_event(ROLE)
