"""Leaked tool-call markup on the Responses and Messages surfaces (issue 17 item 4).

A model's own tool-call markup that arrives as text (`response.output_text.delta`, a `text_delta`) or at
the end of the reasoning becomes calls in the surface's own events, streamed and not. Every vector file in
tests/vectors/toolformats/ is read, so a new format is covered as soon as its vectors land: its text is
split at hostile points (every character boundary for short texts, random splits otherwise), rendered by
the mock, run through the stage, and read back as a client assembles it (the readers of the issue-16
invariant tests, which also check dense indexes, unique ids and a terminal object that agrees).
Decoy vectors (no calls) keep their text byte for byte and no call appears.
"""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from tapfix.proxy.mock.messages import messages_body, messages_events
from tapfix.proxy.mock.responses import responses_body, responses_events
from tapfix.proxy.mock.surface_script import Part, Script
from tapfix.proxy.toolcalls import (
    MessagesToolCallRepair,
    ResponsesToolCallRepair,
    formats,
    repair_messages_body,
    repair_responses_body,
)

from tests.support.builders import sse_json as events
from tests.support.builders import tool
from tests.support.depth import split_points
from tests.unit.test_toolcalls_invariants_evented import messages_view, responses_view

VECTOR_DIR = Path(__file__).parents[1] / "vectors" / "toolformats"
CALL_ID = "chatcmpl-tool-0123456789abcdef01234567"
PLAIN = ["Sure", " — the answer is ", "42.\n", "No tools needed here."]


def _vectors() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(VECTOR_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        for k, vector in enumerate(data["vectors"]):
            out.append((f"{data['format']}-{k}", {**vector, "format": data["format"]}))
    return out


VECTORS = _vectors()
IDS = [name for name, _ in VECTORS]


def r_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "function", **t["function"]} for t in tools]


def m_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": t["function"]["name"], "input_schema": t["function"].get("parameters") or {}} for t in tools]


def splits(text: str, seed: int) -> list[list[str]]:
    """One character per delta, every two-piece split of a short text (every fourth at the quick depth:
    tests/support/depth.py), and random splits."""
    out = [list(text)]
    if len(text) <= 160:
        out += [[text[:k], text[k:]] for k in split_points(len(text), seed)]
    rng = random.Random(seed)
    for _ in range(6):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return out


def text_script(pieces: list[str], reasoning: list[str] | None = None) -> Script:
    parts = [Part("reasoning", reasoning)] if reasoning else []
    if pieces:
        parts.append(Part("text", pieces))
    return Script(parts, "stop", 9)


def run(stage: Any, evs: list[bytes]) -> bytes:
    out: list[bytes] = []
    for raw in evs:
        out += stage.feed(raw)
    out += stage.flush()
    return b"".join(out)


def run_r(s: Script, tools: list[Any], **kw: Any) -> tuple[bytes, ResponsesToolCallRepair]:
    evs = responses_events(s, {"tools": tools}, "f" * 64, 1_760_000_000, "m", 10)
    stage = ResponsesToolCallRepair(tools, capture_id="cap-17", **kw)
    return run(stage, evs), stage


def run_m(s: Script, tools: list[Any], **kw: Any) -> tuple[bytes, MessagesToolCallRepair]:
    evs = messages_events(s, "f" * 64, "m", 10)
    stage = MessagesToolCallRepair(tools, capture_id="cap-17", **kw)
    return run(stage, evs), stage


def r_text(data: bytes) -> str:
    """The message text a Responses client assembles; every `.done` form of it must agree with the deltas."""
    evs = events(data)
    text = "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta")
    for e in evs:
        if e["type"] == "response.output_text.done":
            assert e["text"] == text
        elif e["type"] == "response.content_part.done":
            assert e["part"]["text"] == text
        elif e["type"] == "response.output_item.done" and e["item"]["type"] == "message":
            assert "".join(c["text"] for c in e["item"]["content"]) == text
        elif e["type"] in ("response.completed", "response.incomplete"):
            messages = [i for i in e["response"]["output"] if i["type"] == "message"]
            assert "".join(c["text"] for m in messages for c in m["content"]) == text
    return text


def m_text(data: bytes) -> str:
    return "".join(
        e["delta"]["text"]
        for e in events(data)
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta"
    )


def r_calls(data: bytes) -> list[tuple[str, Any]]:
    view = responses_view(data)
    assert not view["errors"]
    ids = [c["call_id"] for c in view["calls"]]
    assert len(set(ids)) == len(ids) and all(ids)
    return [(c["name"], json.loads(c["arguments"])) for c in view["calls"]]


def m_calls(data: bytes) -> tuple[list[tuple[str, Any]], str | None]:
    view = messages_view(data)
    assert not view["errors"]
    ids = [c["id"] for c in view["calls"]]
    assert len(set(ids)) == len(ids) and all(i.startswith("toolu_") for i in ids)
    return [(c["name"], c["input"]) for c in view["calls"]], view["stop"]


def expected(vector: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(c["name"], c["arguments"]) for c in vector["calls"]]


def lacks_required(vector: dict[str, Any]) -> bool:
    """A vector whose markup reads as a call without an argument the tool requires: the markup is read,
    but the call can't be sent (the retryable error, as for a structured call)."""
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in vector["tools"]}
    return any(set(schemas[c["name"]].get("required") or []) - set(c["arguments"]) for c in vector["calls"])


def same_calls(got: list[tuple[str, Any]], want: list[tuple[str, Any]]) -> bool:
    """The vector's calls are what `find` reads (the first markup); the stage reads every markup."""
    return got[: len(want)] == want and (len(got) == len(want) or bool(want))


def without_markup(text: str, stage: Any) -> str:
    """The vector's text with each recovered markup (the changes' `before`, as the model wrote it) cut out."""
    for change in stage.changes:
        if change.kind == "leaked_into_content":
            for markup in change.before if isinstance(change.before, list) else [change.before]:
                assert isinstance(markup, str) and markup and markup in text
                text = text.replace(markup, "", 1)
    return text


def leak_kinds(stage: Any) -> list[str]:
    return [c.kind for c in stage.changes]


# == content, streamed ================================================================================
# surface -> (its tools for a vector's, its stage run, its client view, its calls and stop reason, its text,
# the stop reasons of an answer with calls and without: Responses has none)
EVENTED = {
    "responses": (r_tools, run_r, responses_view, lambda data: (r_calls(data), None), r_text, (None, None)),
    "messages": (m_tools, run_m, messages_view, m_calls, m_text, ("tool_use", "end_turn")),
}


@pytest.mark.parametrize("surface", list(EVENTED))
@pytest.mark.parametrize(("name", "vector"), VECTORS, ids=IDS)
def test_markup_in_text_becomes_calls_split_anywhere(name: str, vector: dict[str, Any], surface: str) -> None:
    tools_of, run, view, calls_and_stop, text_of, (stop_with_calls, stop_without) = EVENTED[surface]
    tools = tools_of(vector["tools"])
    want = expected(vector)
    # A seed of its own per vector and surface, the same on every run (`hash` of a str changes with the process).
    for pieces in splits(vector["text"], zlib.crc32(f"{name}-{surface}".encode())):
        data, stage = run(text_script(pieces), tools)
        if lacks_required(vector):
            assert view(data)["errors"] and stage.outcome == "unrecoverable"
            continue
        got, stop = calls_and_stop(data)
        assert same_calls(got, want), (pieces, got)
        text = text_of(data)
        if want:
            assert stop == stop_with_calls
            assert "leaked_into_content" in leak_kinds(stage)
            assert stage.outcome == "repaired"
            assert text == without_markup(vector["text"], stage)
        else:
            assert stop == stop_without
            assert text == vector["text"] and stage.changes == []


# == content, non-streamed ============================================================================
@pytest.mark.parametrize(("name", "vector"), VECTORS, ids=IDS)
def test_markup_in_text_becomes_calls_in_bodies(name: str, vector: dict[str, Any]) -> None:
    want = expected(vector)
    s = text_script([vector["text"]])
    tools = r_tools(vector["tools"])
    body = responses_body(s, {"tools": tools}, "f" * 64, 1_760_000_000, "m", 10)
    out, changes, outcome = repair_responses_body(body, tools, capture_id="cap-17")
    if lacks_required(vector):  # a confirmed call that lost a required argument: the retryable error body
        assert outcome == "unrecoverable"
        body = messages_body(s, "f" * 64, "m", 10)
        assert repair_messages_body(body, m_tools(vector["tools"]), capture_id="cap-17")[2] == "unrecoverable"
        return
    obj = orjson.loads(out)
    calls = [(i["name"], json.loads(i["arguments"])) for i in obj["output"] if i["type"] == "function_call"]
    assert same_calls(calls, want)
    ids = [i["call_id"] for i in obj["output"] if i["type"] == "function_call"]
    assert len(set(ids)) == len(ids)
    if not want:
        assert out == body and changes == [] and outcome == "untouched"
    else:
        assert outcome == "repaired" and "leaked_into_content" in [c.kind for c in changes]

    tools = m_tools(vector["tools"])
    body = messages_body(s, "f" * 64, "m", 10)
    out, changes, outcome = repair_messages_body(body, tools, capture_id="cap-17")
    obj = orjson.loads(out)
    calls = [(b["name"], b["input"]) for b in obj["content"] if b["type"] == "tool_use"]
    assert same_calls(calls, want)
    if not want:
        assert out == body and changes == [] and outcome == "untouched"
    else:
        assert obj["stop_reason"] == "tool_use" and outcome == "repaired"
        assert all(b["id"].startswith("toolu_") for b in obj["content"] if b["type"] == "tool_use")


# == what stays text ==================================================================================
def test_a_text_only_stream_with_tools_passes_byte_for_byte() -> None:
    tools = [tool("write")]
    for pieces in (PLAIN, ["a < b and c [1] ", "<b>bold</b> ", "[x](y) {z}"], ["<", "tool", "_cal", "l is a tag"]):
        s = text_script(pieces, reasoning=["Think ", "<tool_call> first."])
        evs = responses_events(s, {"tools": r_tools(tools)}, "f" * 64, 1_760_000_000, "m", 10)
        data, stage = run_r(s, r_tools(tools))
        if pieces is PLAIN:
            assert data == b"".join(evs)
        assert r_text(data) == "".join(pieces) and stage.changes == []
        data, stage = run_m(s, m_tools(tools))
        if pieces is PLAIN:
            assert data == b"".join(messages_events(s, "f" * 64, "m", 10))
        assert m_text(data) == "".join(pieces) and stage.changes == []


def test_no_tools_offered_means_no_holding_and_no_calls() -> None:
    hermes = '<tool_call>\n{"name": "write", "arguments": {"path": "x"}}\n</tool_call>'
    pieces = ["Here: ", hermes[:7], hermes[7:]]
    s = text_script(pieces)
    evs = responses_events(s, {"tools": []}, "f" * 64, 1_760_000_000, "m", 10)
    data, stage = run_r(s, [])
    assert data == b"".join(evs) and stage.changes == []
    data, stage = run_m(s, [])
    assert data == b"".join(messages_events(s, "f" * 64, "m", 10)) and stage.changes == []


def test_text_that_cannot_be_markup_is_released_at_once() -> None:
    """A possible opener's start is held only until the next delta shows it isn't one."""
    tools = r_tools([tool("write")])
    s = text_script(["one <", "b> two", " three"])
    evs = responses_events(s, {"tools": tools}, "f" * 64, 1_760_000_000, "m", 10)
    stage = ResponsesToolCallRepair(tools, capture_id="cap-17")
    sent = ""
    for raw in evs:
        for e in events(b"".join(stage.feed(raw))):
            if e["type"] == "response.output_text.delta":
                sent += e["delta"]
        if b'"delta":"b> two"' in raw:
            assert sent == "one <b> two"
    assert sent == "one <b> two three"


# == reasoning ========================================================================================
HERMES_WRITE = '<tool_call>\n{"name": "write", "arguments": {"path": "a.py", "content": "x = 1\\n"}}\n</tool_call>'
WRITE_TOOL = [tool("write", {"path": {"type": "string"}, "content": {"type": "string"}})]


@pytest.mark.parametrize("cut", [1, 5, 11, 30, len(HERMES_WRITE) - 3])
def test_markup_last_in_reasoning_with_nothing_after_is_a_call(cut: int) -> None:
    pieces = ["I should write the file. ", HERMES_WRITE[:cut], HERMES_WRITE[cut:]]
    want = [("write", {"path": "a.py", "content": "x = 1\n"})]
    data, stage = run_r(text_script([], reasoning=pieces), r_tools(WRITE_TOOL))
    assert r_calls(data) == want and "leaked_into_content" in leak_kinds(stage)
    data, stage = run_m(text_script([], reasoning=pieces), m_tools(WRITE_TOOL))
    assert m_calls(data) == (want, "tool_use") and "leaked_into_content" in leak_kinds(stage)


@pytest.mark.parametrize(("name", "vector"), VECTORS, ids=IDS)
def test_markup_in_reasoning_followed_by_text_is_a_decoy(name: str, vector: dict[str, Any]) -> None:
    s = text_script(["The answer."], reasoning=[vector["text"][:9], vector["text"][9:]])
    data, stage = run_r(s, r_tools(vector["tools"]))
    assert r_calls(data) == [] and r_text(data) == "The answer." and stage.changes == []
    data, stage = run_m(s, m_tools(vector["tools"]))
    assert m_calls(data) == ([], "end_turn") and stage.changes == []


def test_markup_in_reasoning_not_last_is_a_decoy() -> None:
    pieces = ["Maybe ", HERMES_WRITE, " — no, I'll answer directly."]
    data, stage = run_r(text_script([], reasoning=pieces), r_tools(WRITE_TOOL))
    assert r_calls(data) == [] and stage.changes == []
    data, stage = run_m(text_script([], reasoning=pieces), m_tools(WRITE_TOOL))
    assert m_calls(data) == ([], "end_turn") and stage.changes == []


def test_markup_in_reasoning_in_bodies() -> None:
    s = text_script([], reasoning=["I'll write. ", HERMES_WRITE])
    want = [("write", {"path": "a.py", "content": "x = 1\n"})]
    tools = r_tools(WRITE_TOOL)
    body = responses_body(s, {"tools": tools}, "f" * 64, 1_760_000_000, "m", 10)
    obj = orjson.loads(repair_responses_body(body, tools, capture_id="c")[0])
    assert [(i["name"], json.loads(i["arguments"])) for i in obj["output"] if i["type"] == "function_call"] == want
    body = messages_body(s, "f" * 64, "m", 10)
    obj = orjson.loads(repair_messages_body(body, m_tools(WRITE_TOOL), capture_id="c")[0])
    assert [(b["name"], b["input"]) for b in obj["content"] if b["type"] == "tool_use"] == want
    assert obj["stop_reason"] == "tool_use"


# == the recovered calls next to structured ones ======================================================
def test_a_recovered_call_before_a_structured_one_keeps_indexes_dense_and_ids_unique() -> None:
    parts = [
        Part("text", ["Writing. ", HERMES_WRITE[:20], HERMES_WRITE[20:]]),
        Part("call", ['{"path": "b.py", ', '"content": "y"}'], CALL_ID, "write"),
    ]
    s = Script(parts, "tool_calls", 9)
    want = [("write", {"path": "a.py", "content": "x = 1\n"}), ("write", {"path": "b.py", "content": "y"})]
    data, stage = run_r(s, r_tools(WRITE_TOOL))
    assert r_calls(data) == want
    assert r_text(data).strip() == "Writing."
    assert "wrong_index_or_id" not in leak_kinds(stage)
    data, stage = run_m(s, m_tools(WRITE_TOOL))
    assert m_calls(data) == (want, "tool_use")
    assert m_text(data).strip() == "Writing."
    assert "wrong_index_or_id" not in leak_kinds(stage) and "finish_mismatch" not in leak_kinds(stage)


def test_a_recovered_call_whose_arguments_cannot_be_recovered_is_the_retryable_error() -> None:
    write_n = [tool("write", {"n": {"type": "integer"}}, ["n"])]
    markup = '<tool_call>\n{"name": "write", "arguments": {"m": 1}}\n</tool_call>'
    data, stage = run_r(text_script([markup]), r_tools(write_n))
    assert responses_view(data)["errors"] and stage.outcome == "unrecoverable"
    assert "missing_fragment" in leak_kinds(stage)
    data, stage = run_m(text_script([markup]), m_tools(write_n))
    assert messages_view(data)["errors"] and stage.outcome == "unrecoverable"


# == pinning ==========================================================================================
def test_a_pinned_format_recovers_its_own_markup() -> None:
    want = [("write", {"path": "a.py", "content": "x = 1\n"})]
    data, _ = run_r(text_script([HERMES_WRITE]), r_tools(WRITE_TOOL), tool_format="hermes")
    assert r_calls(data) == want
    data, _ = run_m(text_script([HERMES_WRITE]), m_tools(WRITE_TOOL), tool_format="hermes")
    assert m_calls(data) == (want, "tool_use")


def _other_format_vector() -> tuple[str, dict[str, Any]] | None:
    for _, vector in VECTORS:
        if (
            vector["calls"]
            and vector["format"] != "hermes"
            and formats.armed("hermes").find(vector["text"], [t["function"]["name"] for t in vector["tools"]]) is None
        ):
            return vector["format"], vector
    return None


def test_markup_of_another_format_than_the_pinned_one_passes_flagged() -> None:
    other = _other_format_vector()
    assert other is not None, "the registry holds formats other than hermes, with vectors"
    fmt, vector = other
    s = text_script([vector["text"]])
    data, stage = run_r(s, r_tools(vector["tools"]), tool_format="hermes")
    assert r_calls(data) == [] and r_text(data) == vector["text"]
    assert leak_kinds(stage) == ["unpinned_tool_format"]
    data, stage = run_m(s, m_tools(vector["tools"]), tool_format="hermes")
    assert m_calls(data) == ([], "end_turn") and m_text(data) == vector["text"]
    assert leak_kinds(stage) == ["unpinned_tool_format"]
    tools = r_tools(vector["tools"])
    body = responses_body(s, {"tools": tools}, "f" * 64, 1_760_000_000, "m", 10)
    out, changes, _ = repair_responses_body(body, tools, capture_id="c", tool_format="hermes")
    assert out == body and [c.kind for c in changes] == ["unpinned_tool_format"]


def test_hermes_markup_passes_flagged_when_another_format_is_pinned() -> None:
    # A format with a marker that doesn't also read hermes' markup (GLM and Qwen3-Coder share its opener).
    pinned = next(
        n
        for n in formats.names()
        if n in formats.REGISTRY
        and n != "hermes"
        and not formats.REGISTRY[n].anchored
        and formats.armed(n).find(HERMES_WRITE, ["write"]) is None
    )
    data, stage = run_r(text_script([HERMES_WRITE]), r_tools(WRITE_TOOL), tool_format=pinned)
    assert r_calls(data) == [] and r_text(data) == HERMES_WRITE
    assert leak_kinds(stage) == ["unpinned_tool_format"]
    data, stage = run_m(text_script([HERMES_WRITE]), m_tools(WRITE_TOOL), tool_format=pinned)
    assert m_calls(data) == ([], "end_turn") and leak_kinds(stage) == ["unpinned_tool_format"]
    body = messages_body(text_script([HERMES_WRITE]), "f" * 64, "m", 10)
    out, changes, _ = repair_messages_body(body, m_tools(WRITE_TOOL), capture_id="c", tool_format=pinned)
    assert out == body and [c.kind for c in changes] == ["unpinned_tool_format"]


def test_an_unknown_pinned_format_is_refused_with_the_registered_names() -> None:
    with pytest.raises(formats.UnknownFormat, match="hermes"):
        ResponsesToolCallRepair(r_tools(WRITE_TOOL), tool_format="no-such-format")
    with pytest.raises(formats.UnknownFormat, match="hermes"):
        MessagesToolCallRepair(m_tools(WRITE_TOOL), tool_format="no-such-format")
