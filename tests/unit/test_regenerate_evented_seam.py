"""Issue 19 on Responses and Messages, pure: the evented tool-call stage keeps an unrecoverable call's error
events back (`defer_fatal`), and a spliced pipeline (proxy/regenerate/splice.py with
proxy/regenerate/evented_seam.py, a fake relay handle) makes the client's view of attempt 1 + attempt 2
one valid stream. The attempts' bytes are the mock's own broken-first answers, cut at random places."""

from __future__ import annotations

import json
import re
import tempfile
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.mock import MockOptions, create_app
from tapfix.proxy.regenerate.eligibility import RegenerateSettings
from tapfix.proxy.regenerate.evented_seam import client_view
from tapfix.proxy.regenerate.splice import AttemptSplice
from tapfix.proxy.response.pipeline import StreamPipeline
from tapfix.proxy.sse import SSESplitter
from tapfix.proxy.toolcalls import stage_for
from tapfix.proxy.toolcalls.evented_stage import event_name, parse

from tests.support.attempts import through_attempts
from tests.support.builders import named_event, streamed_case
from tests.support.depth import examples
from tests.unit.test_mock_attempts import SURFACE_BODIES
from tests.unit.test_regenerate_splice import FakeSession

RESPONSES, MESSAGES = "/v1/responses", "/v1/messages"
SURFACE = {RESPONSES: "responses", MESSAGES: "messages"}
TERMINAL = ("response.completed", "response.incomplete", "response.failed")
THINK = {RESPONSES: {"reasoning": {"effort": "high"}}, MESSAGES: {"thinking": {"type": "enabled", "budget_tokens": 99}}}
ALWAYS_BROKEN = {"rules": [{"when": {"has_tools": True}, "do": "break_tool_call", "mode": "truncate"}]}


def body_for(path: str, think: bool, **extra: Any) -> dict[str, Any]:
    return {**SURFACE_BODIES[path], "stream": True, **(THINK[path] if think else {}), **extra}


def answers(path: str, body: dict[str, Any], scenario: Any = "break_args_first_attempt", n: int = 2) -> list[bytes]:
    """The mock's first `n` streamed answers to the same conversation (broken first, then fine)."""
    if isinstance(scenario, dict):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(scenario, f)
        scenario = f.name
    client = TestClient(create_app(MockOptions(scenario=scenario)))
    out = []
    for _ in range(n):
        r = client.post(path, json=body)
        assert r.status_code == 200, r.text
        out.append(r.content)
    return out


def regenerated(path: str, attempts: list[bytes], body: dict[str, Any], seed: int, **kw: Any) -> tuple[bytes, Any]:
    """The attempts' bytes through a spliced pipeline in random pieces, each ending where the splice decides
    (`last_cut`: the last one broke off, no decision at its end)."""
    relay = FakeSession()
    tools = body["tools"]
    ex = Exchange(path=path, stream=True, tools=tools)
    surface = SURFACE[path]
    settings_ = kw.pop("settings", RegenerateSettings(1))

    def stages() -> list[Any]:
        stage = stage_for(surface, tools, "error", ex.id, False)
        assert stage is not None
        stage.defer_fatal, stage.defer_unknown_tool = True, settings_.unknown_tool
        return [stage]

    pipeline = StreamPipeline(ex, stages())
    pipeline.splice = splice = AttemptSplice(relay, body, stages, settings_, "error", surface=surface)
    last_cut = kw.pop("last_cut", False)
    if last_cut:
        attempts = [*attempts, b""]
    return through_attempts(pipeline, attempts, seed, last_cut=last_cut), splice


def objects(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    splitter = SSESplitter()
    out = []
    for event in splitter.feed(data) + splitter.flush():
        obj = parse(event)
        if obj is not None:
            kind = str(obj.get("type") or event_name(event))
            assert event_name(event) in (None, kind), event
            out.append((kind, obj))
    return out


def valid_responses(data: bytes) -> list[dict[str, Any]]:
    """Check the client's view is one valid Responses stream; its function calls."""
    events = objects(data)
    kinds = [k for k, _ in events]
    assert kinds.count("response.created") == 1 and kinds[0] == "response.created", kinds
    seqs = [o["sequence_number"] for _, o in events]
    assert all(a < b for a, b in zip(seqs, seqs[1:], strict=False)), seqs
    terminals = [k for k in kinds if k in TERMINAL or k == "error"]
    assert len([k for k in terminals if k in TERMINAL]) == 1 and kinds[-1] in TERMINAL, kinds
    added = [o for k, o in events if k == "response.output_item.added"]
    assert [o["output_index"] for o in added] == list(range(len(added)))
    ids = [o["item"]["id"] for o in added]
    assert len(set(ids)) == len(ids), ids
    for kind, obj in events:
        if "output_index" in obj:
            assert obj["output_index"] < len(added), (kind, obj)
            if "item_id" in obj:
                assert obj["item_id"] == ids[obj["output_index"]], (kind, obj)
            if "item" in obj:
                assert obj["item"]["id"] == ids[obj["output_index"]], (kind, obj)
    created = events[0][1]["response"]["id"]
    terminal = events[-1][1]["response"]
    assert terminal["id"] == created
    assert [i["id"] for i in terminal["output"]] == ids
    calls = [i for i in terminal["output"] if i["type"] == "function_call"]
    for call in calls:  # the streamed arguments are the ones the terminal object lists
        index = ids.index(call["id"])
        streamed = [o["delta"] for k, o in events if k.endswith("arguments.delta") and o["output_index"] == index]
        assert "".join(streamed) == call["arguments"]
    return calls


def valid_messages(data: bytes) -> list[dict[str, Any]]:
    """Check the client's view is one valid Messages stream; its tool_use blocks with their input text."""
    events = objects(data)
    kinds = [k for k, _ in events]
    assert kinds.count("message_start") == 1 and kinds[0] == "message_start", kinds
    ends = [k for k in kinds if k in ("message_stop", "error")]
    assert len(ends) == 1 and kinds[-1] == ends[0], kinds
    blocks: list[dict[str, Any]] = []
    open_blocks: set[int] = set()
    for kind, obj in events:
        if kind == "content_block_start":
            assert obj["index"] == len(blocks), (obj, len(blocks))
            blocks.append({**obj["content_block"], "text": ""})
            open_blocks.add(obj["index"])
        elif kind == "content_block_delta":
            assert obj["index"] in open_blocks, obj
            blocks[obj["index"]]["text"] += obj["delta"].get("partial_json", "")
        elif kind == "content_block_stop":
            open_blocks.remove(obj["index"])
    assert not open_blocks
    return [b for b in blocks if b["type"] == "tool_use"]


VALID = {RESPONSES: valid_responses, MESSAGES: valid_messages}


# ---- the stage keeps its error events back -----------------------------------------------------------


@pytest.mark.parametrize("path", [RESPONSES, MESSAGES])
@pytest.mark.parametrize("defer", [True, False])
def test_defer_fatal_keeps_the_error_events_back(path: str, defer: bool) -> None:
    body = body_for(path, think=True)
    broken = answers(path, body, n=1)[0]
    stage = stage_for(SURFACE[path], body["tools"], "error", "cap-e", False)
    assert stage is not None
    stage.defer_fatal = defer
    splitter = SSESplitter()
    out = []
    for event in splitter.feed(broken) + splitter.flush():
        out += stage.feed(event)
    out += stage.flush()
    assert stage.outcome == "unrecoverable"
    sent = [k for k, _ in objects(b"".join(out))]
    held = [k for k, _ in objects(b"".join(stage.deferred))]
    errors = ["error", "response.failed"] if path == RESPONSES else ["error"]
    if defer:
        assert held == errors and not set(errors) & set(sent)
    else:
        assert held == [] and sent[-len(errors) :] == errors
    # What the client may have of the answer goes out either way: the thinking before the call.
    assert ("response.reasoning_text.delta" if path == RESPONSES else "content_block_delta") in sent


# ---- attempt 1 broken, attempt 2 fine: one stream ----------------------------------------------------


@pytest.mark.parametrize("path", [RESPONSES, MESSAGES])
@pytest.mark.parametrize("think", [True, False])
@settings(max_examples=examples(30), deadline=None)
@given(seed=st.integers(0, 10_000))
def test_a_broken_first_attempt_then_a_fine_one_is_one_valid_stream(path: str, think: bool, seed: int) -> None:
    body = body_for(path, think)
    data, splice = regenerated(path, answers(path, body), body, seed)
    assert b"tapfix-attempt-end" not in data and "error" not in [k for k, _ in objects(data)]
    calls = VALID[path](data)
    assert len(calls) == 1 and calls[0]["name"] == "write"
    text = calls[0]["arguments"] if path == RESPONSES else calls[0]["text"]
    assert json.loads(text) == {"path": "hello.txt", "content": "Hello, world!\n"}
    assert [(d.made, d.reason) for d in splice.decisions] == [(True, "fresh")]
    # the thinking the client had from attempt 1 is not repeated from attempt 2
    thinking = [o for k, o in objects(data) if k in ("response.output_item.added", "content_block_start")]
    kinds = [(o.get("item") or o.get("content_block"))["type"] for o in thinking]
    assert kinds == (["reasoning" if path == RESPONSES else "thinking"] if think else []) + [
        "function_call" if path == RESPONSES else "tool_use"
    ]


@pytest.mark.parametrize("path", [RESPONSES, MESSAGES])
@settings(max_examples=examples(15), deadline=None)
@given(seed=st.integers(0, 10_000))
def test_every_attempt_broken_ends_with_one_error(path: str, seed: int) -> None:
    body = body_for(path, think=True)
    data, splice = regenerated(path, answers(path, body, ALWAYS_BROKEN, n=2), body, seed)
    assert VALID[path](data) == []
    kinds = [k for k, _ in objects(data)]
    assert kinds.count("error") == 1
    assert kinds[-1] == ("response.failed" if path == RESPONSES else "error")
    assert [(d.made, d.reason) for d in splice.decisions] == [(True, "fresh"), (False, "attempts_spent")]


@pytest.mark.parametrize("path", [RESPONSES, MESSAGES])
def test_a_later_attempt_that_brings_nothing_gives_the_first_ones_error(path: str) -> None:
    """A later attempt that breaks off before anything of it came (no decision at its end): the client
    still gets the retryable error, not a stream that just stops."""
    body = body_for(path, think=True)
    data, _ = regenerated(path, answers(path, body, n=1), body, seed=3, last_cut=True)
    kinds = [k for k, _ in objects(data)]
    assert kinds.count("error") == 1 and kinds[-1] == ("response.failed" if path == RESPONSES else "error"), kinds


@pytest.mark.parametrize("path", [RESPONSES, MESSAGES])
def test_a_deterministic_request_is_skipped(path: str) -> None:
    body = body_for(path, think=False, temperature=0)
    data, splice = regenerated(path, answers(path, body, n=1), body, seed=5)
    assert [k for k, _ in objects(data)].count("error") == 1
    assert [(d.made, d.reason) for d in splice.decisions] == [(False, "deterministic")]


# ---- the seam's rules on hand-made views -------------------------------------------------------------


def spoken_attempt(clash: str) -> bytes:
    """A Responses attempt that says something, then calls write; its message reuses the id `clash`."""
    response = {"id": "resp_second", "object": "response", "status": "in_progress", "output": []}
    message = {"id": clash, "type": "message", "role": "assistant", "status": "completed"}
    message_done = {**message, "content": [{"type": "output_text", "text": "Sure.", "annotations": []}]}
    args = json.dumps({"path": "hello.txt", "content": "Hello, world!\n"})
    call = {"id": "fc_second", "type": "function_call", "call_id": "call_2", "name": "write", "arguments": ""}
    call_done = {**call, "arguments": args, "status": "completed"}
    where = {"item_id": clash, "output_index": 0, "content_index": 0}
    objs = [
        {"type": "response.created", "response": response},
        {"type": "response.in_progress", "response": response},
        {"type": "response.output_item.added", "output_index": 0, "item": {**message, "content": []}},
        {"type": "response.output_text.delta", **where, "delta": "Sure."},
        {"type": "response.output_item.done", "output_index": 0, "item": message_done},
        {"type": "response.output_item.added", "output_index": 1, "item": call},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_second", "output_index": 1, "delta": args},
        {"type": "response.output_item.done", "output_index": 1, "item": call_done},
        {
            "type": "response.completed",
            "response": {**response, "status": "completed", "output": [message_done, call_done]},
        },
    ]
    return b"".join(named_event({**o, "sequence_number": n}) for n, o in enumerate(objs))


def test_text_of_a_type_the_client_lacks_goes_out_and_a_clashing_id_is_renamed() -> None:
    """Attempt 1 sent only reasoning; attempt 2 says something before its call, reusing attempt 1's item id."""
    body = body_for(RESPONSES, think=True)
    first = answers(RESPONSES, body, n=1)[0]
    reasoning_id = next(o["item"]["id"] for k, o in objects(first) if k == "response.output_item.added")
    data, _ = regenerated(RESPONSES, [first, spoken_attempt(reasoning_id)], body, seed=1)
    calls = valid_responses(data)
    assert [c["name"] for c in calls] == ["write"]
    view = client_view("responses", [data])
    assert [i["type"] for i in view.items] == ["reasoning", "message", "function_call"]
    assert view.items[1]["id"] == f"{reasoning_id}_2" and view.received.content == "Sure."
    assert view.response_id is not None and view.response_id != "resp_second"


def test_on_chat_too_a_later_attempt_that_brings_nothing_gives_the_first_ones_error() -> None:
    from tests.support.stage_io import client_view as chat_view
    from tests.unit.test_regenerate_splice import broken, chat_pipeline

    pipeline, relay, _ = chat_pipeline()
    out = [pipeline(broken()), *pipeline(b"")]
    assert len(relay.bodies) == 1 and pipeline.pending  # attempt 2 asked for; it breaks off before anything
    pipeline.close_splice()
    pipeline.cut = True
    view = chat_view(b"".join([*out, *pipeline.end_of_attempt()]))
    assert len(view.errors) == 1 and view.done == 1 and view.calls == []


def naming(data: bytes, name: bytes) -> bytes:
    return re.sub(rb'"name": ?"write"', b'"name": "' + name + b'"', data)


@pytest.mark.parametrize("path", [RESPONSES, MESSAGES])
@settings(max_examples=examples(15), deadline=None)
@given(seed=st.integers(0, 10_000))
def test_with_unknown_tool_on_a_call_to_a_tool_not_offered_is_regenerated(path: str, seed: int) -> None:
    body = body_for(path, False)
    fine = answers(path, body)[1]
    unknown = RegenerateSettings(1, unknown_tool=True)
    data, splice = regenerated(path, [naming(fine, b"delete_all"), fine], body, seed, settings=unknown)
    assert [c["name"] for c in VALID[path](data)] == ["write"]
    assert [(d.made, d.changes[0].before) for d in splice.decisions] == [(True, "unknown_tool")]


@pytest.mark.parametrize("path", [RESPONSES, MESSAGES])
def test_unknown_tool_off_or_spent_the_call_goes_out_as_sent(path: str) -> None:
    body = body_for(path, False)
    fine = answers(path, body)[1]
    data, splice = regenerated(path, [naming(fine, b"delete_all")], body, 0)
    assert [c["name"] for c in VALID[path](data)] == ["delete_all"] and splice.decisions == []
    both = [naming(fine, b"delete_all"), naming(fine, b"rm_rf")]
    data, splice = regenerated(path, both, body, 0, settings=RegenerateSettings(1, unknown_tool=True))
    assert [c["name"] for c in VALID[path](data)] == ["rm_rf"]
    assert [(d.made, d.reason) for d in splice.decisions] == [(True, "fresh"), (False, "attempts_spent")]


# ---- issue 31, item 5: an attempt that answers in text alone is the answer ---------------------------


TEXT_ANSWER = {
    "rules": [
        {
            "when": {"attempt": 1},
            "do": "serve_case",
            "case": streamed_case("a1", ["I will write it."], ['{"pa'], "length"),
        },
        {"do": "serve_case", "case": streamed_case("a2", ["I cannot write files here."], None, "stop")},
    ]
}


@pytest.mark.parametrize("path", [RESPONSES, MESSAGES])
@settings(max_examples=examples(15), deadline=None)
@given(seed=st.integers(0, 10_000))
def test_a_later_attempt_that_answers_in_text_follows_what_the_client_read(path: str, seed: int) -> None:
    body = body_for(path, think=False)
    data, splice = regenerated(path, answers(path, body, TEXT_ANSWER), body, seed)
    assert VALID[path](data) == [] and "error" not in [k for k, _ in objects(data)]
    view = client_view(SURFACE[path], [data])  # type: ignore[arg-type]
    assert view.received.content == "I will write it.I cannot write files here."
    assert [i["type"] for i in view.items] == ["message", "message"] if path == RESPONSES else ["text", "text"]
    assert len({i.get("id") for i in view.items}) == len(view.items) or path == MESSAGES, "ids stay distinct"
    ends = [o for k, o in objects(data) if k in ("response.completed", "message_delta")]
    assert len(ends) == 1
    if path == RESPONSES:
        assert [i["type"] for i in ends[0]["response"]["output"]] == ["message", "message"]
    else:
        assert ends[0]["delta"]["stop_reason"] == "end_turn"
    assert not [c for d in splice.decisions for c in d.changes if c.kind == "drop"]
