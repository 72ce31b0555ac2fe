"""Structural invariants of a Chat Completions answer that offered tools (issue 16 item 1), checked on
every answer, not only when a defect was noticed: dense indexes, one id per call, offered names, a
finish_reason that matches what the client received; per choice when n > 1. Streamed (the stage) and
non-streamed (the body repair) alike."""

from __future__ import annotations

import json
import random
from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.toolcalls import (
    ChatToolCallRepair,
    assemble_tool_calls,
    body_repair_for,
    repair_chat_completion,
    stage_for,
)
from tapfix.proxy.toolcalls.defects import EMPTY_TURN, FINISH_MISMATCH, UNKNOWN_TOOL, WRONG_INDEX

from tests.support.builders import (
    chat_chunk,
    message_tool_call,
    random_splits,
    sse,
    tool,
    tool_call_chunk,
    tool_call_delta,
)
from tests.support.depth import examples
from tests.support.stage_io import client_view, run_stage

WEATHER = tool("get_weather", {"city": {"type": "string"}}, ["city"])
READ = tool("read", {"path": {"type": "string"}}, ["path"])
TOOLS = [WEATHER, READ]
NAMED = {"type": "function", "function": {"name": "get_weather"}}

chunk = partial(chat_chunk, id="chatcmpl-inv")
call = partial(tool_call_chunk, chunk_id="chatcmpl-inv")
ROLE = chunk({"role": "assistant", "content": ""})


def finish(reason: str, index: int = 0) -> dict:
    return chunk(finish_reason=reason, index=index)


def run(stream: list, seed: int = 0, **kw) -> tuple[bytes, bytes, ChatToolCallRepair]:
    data = sse([ROLE, *stream])
    stage = ChatToolCallRepair(TOOLS, capture_id="cap", **kw)
    return data, run_stage(stage, random_splits(data, random.Random(seed))), stage


def tool_indexes(out: bytes, choice: int = 0) -> list[int]:
    """Every tool-call index the client received, in order."""
    return [
        tc["index"]
        for c in client_view(out).chunks
        for ch in c.get("choices") or []
        if ch.get("index", 0) == choice
        for tc in (ch.get("delta") or {}).get("tool_calls") or []
    ]


def calls_of(out: bytes, choice: int = 0) -> list[tuple[str, dict]]:
    return [(c["name"], json.loads(c["arguments"])) for c in assemble_tool_calls(client_view(out).chunks, choice)]


def kinds(stage: ChatToolCallRepair) -> list[str]:
    return [c.kind for c in stage.changes]


# -- indexes are dense from 0, in order of first appearance ------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_lone_call_on_index_1_is_renumbered_to_0(seed: int) -> None:
    _, out, stage = run([call(1, "c1", "read", '{"path": "a"}'), finish("tool_calls")], seed)
    assert tool_indexes(out) == [0]
    assert calls_of(out) == [("read", {"path": "a"})]
    assert [c["id"] for c in client_view(out).calls] == ["c1"]
    assert stage.outcome == "repaired" and WRONG_INDEX in stage.defects
    change = next(c for c in stage.changes if c.kind == WRONG_INDEX)
    assert change.path == "$.choices[0].delta.tool_calls[0]" and change.reason


def test_index_gap_is_closed_in_order_of_first_appearance() -> None:
    _, out, stage = run(
        [
            call(0, "c1", "read", '{"path": "a"}'),
            call(2, "c2", "get_weather", '{"city": "Oslo"}'),
            finish("tool_calls"),
        ]
    )
    assert tool_indexes(out) == [0, 1]
    assert calls_of(out) == [("read", {"path": "a"}), ("get_weather", {"city": "Oslo"})]
    assert WRONG_INDEX in kinds(stage) and stage.outcome == "repaired"


def test_offset_indexes_3_4_become_0_1() -> None:
    _, out, _ = run(
        [call(3, "c1", "read", '{"path": "a"}'), call(4, "c2", "read", '{"path": "b"}'), finish("tool_calls")]
    )
    assert tool_indexes(out) == [0, 1]
    assert [c["id"] for c in client_view(out).calls] == ["c1", "c2"]


def test_dense_indexes_pass_byte_for_byte() -> None:
    data, out, stage = run(
        [call(0, "c1", "read", '{"path": "a"}'), call(1, "c2", "read", '{"path": "b"}'), finish("tool_calls")]
    )
    assert out == data and stage.outcome == "untouched" and stage.changes == []


# -- ids ------------------------------------------------------------------------------------------
PARALLEL_ON_INDEX_0 = [
    call(0, "c1", "read", ""),
    call(0, arguments='{"path": "a"}'),
    call(0, "c2", "read", ""),
    call(0, arguments='{"path": "b"}'),
    finish("tool_calls"),
]


@pytest.mark.parametrize("prefix_mode", [False, True], ids=["held", "prefix_mode_after_a_streamed_call"])
def test_parallel_calls_all_on_index_0_with_new_id_and_name_are_two_calls(prefix_mode: bool) -> None:
    _, out, stage = run(PARALLEL_ON_INDEX_0, stream_valid_prefix=prefix_mode)
    view = client_view(out)
    assert calls_of(out) == [("read", {"path": "a"}), ("read", {"path": "b"})]
    assert [c["id"] for c in view.calls] == ["c1", "c2"]
    if prefix_mode:
        assert not view.errors
    else:
        assert tool_indexes(out) == [0, 1] and WRONG_INDEX in kinds(stage)


def test_id_churn_on_argument_deltas_is_one_call_with_the_first_id() -> None:
    _, out, stage = run(
        [
            call(0, "c1", "read", ""),
            call(0, "c2", None, '{"pa'),
            call(0, "c3", None, 'th": '),
            call(0, "c4", None, '"a"}'),
            finish("tool_calls"),
        ]
    )
    assert calls_of(out) == [("read", {"path": "a"})]
    assert [c["id"] for c in client_view(out).calls] == ["c1"]
    assert stage.outcome == "repaired" and WRONG_INDEX in kinds(stage) and not client_view(out).errors


def test_duplicate_id_across_calls_gets_a_minted_id() -> None:
    _, out, stage = run(
        [call(0, "same", "read", '{"path": "a"}'), call(1, "same", "read", '{"path": "b"}'), finish("tool_calls")]
    )
    ids = [c["id"] for c in client_view(out).calls]
    assert ids[0] == "same" and ids[1] and ids[1] != "same"
    assert WRONG_INDEX in kinds(stage)


# -- names ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["Get_Weather", "get_weatherget_weather", "functions.get_weather", "get-weather"])
def test_a_form_of_one_offered_name_becomes_it(name: str) -> None:
    _, out, stage = run([call(0, "c1", name, '{"city": "Oslo"}'), finish("tool_calls")])
    assert calls_of(out) == [("get_weather", {"city": "Oslo"})]
    assert stage.outcome == "repaired"
    change = next(c for c in stage.changes if c.path == "$.choices[0].delta.tool_calls[0]")
    assert change.before["name"] == name and change.after["name"] == "get_weather"


def test_unknown_name_passes_unchanged_and_is_flagged() -> None:
    data, out, stage = run([call(0, "c1", "delete_everything", '{"city": "Oslo"}'), finish("tool_calls")])
    assert out == data
    assert UNKNOWN_TOOL in stage.defects
    (change,) = [c for c in stage.changes if c.kind == UNKNOWN_TOOL]
    assert change.before == "delete_everything" and change.after == "delete_everything" and change.reason


def test_unknown_name_in_a_body_is_flagged_and_the_body_unchanged() -> None:
    original = body([message_call("delete_everything", '{"city": "Oslo"}')])
    out, changes, outcome = repair_chat_completion(original, TOOLS)
    assert out == original and outcome == "untouched"
    assert [c.kind for c in changes] == [UNKNOWN_TOOL]


# -- finish_reason matches what the client received ---------------------------------------------------
def test_stop_with_calls_becomes_tool_calls_recorded() -> None:
    _, out, stage = run([call(0, "c1", "read", '{"path": "a"}'), finish("stop")])
    view = client_view(out)
    assert calls_of(out) == [("read", {"path": "a"})] and view.finish_reasons == ["tool_calls"]
    change = next(c for c in stage.changes if c.kind == FINISH_MISMATCH)
    assert (change.path, change.before, change.after) == ("$.choices[0].finish_reason", "stop", "tool_calls")
    assert stage.outcome == "repaired" and FINISH_MISMATCH in stage.defects


def test_named_tool_choice_and_stop_pass_byte_for_byte() -> None:
    stream = [call(0, "c1", "get_weather", '{"city": "Oslo"}'), finish("stop")]
    data, out, stage = run(stream, tool_choice=NAMED)
    assert out == data and stage.outcome == "untouched" and stage.changes == []


def test_named_tool_choice_of_another_tool_still_corrects_stop() -> None:
    _, out, _ = run([call(0, "c1", "read", '{"path": "a"}'), finish("stop")], tool_choice=NAMED)
    assert client_view(out).finish_reasons == ["tool_calls"]


def test_length_with_a_complete_valid_call_keeps_it_and_finishes_tool_calls() -> None:
    _, out, stage = run([call(0, "c1", "read", '{"path": "a"}'), finish("length")])
    view = client_view(out)
    assert calls_of(out) == [("read", {"path": "a"})] and view.finish_reasons == ["tool_calls"]
    assert not view.errors and stage.outcome == "repaired"
    change = next(c for c in stage.changes if c.kind == FINISH_MISMATCH)
    assert (change.before, change.after) == ("length", "tool_calls")


def test_length_with_a_cut_call_is_the_retryable_error() -> None:
    _, out, stage = run([call(0, "c1", "read", '{"path": "a'), finish("length")])
    view = client_view(out)
    assert stage.outcome == "unrecoverable" and len(view.errors) == 1 and not view.calls


# -- non-streamed bodies ----------------------------------------------------------------------------
def body(tool_calls: list | None, finish_reason: str = "tool_calls", content: str | None = None) -> bytes:
    message: dict = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return json.dumps(
        {
            "id": "chatcmpl-b",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        }
    ).encode()


def message_call(name: str, arguments: str, id: str = "c1", **extra: object) -> dict:
    return {**message_tool_call(arguments, id=id, name=name), **extra}


@pytest.mark.parametrize("tool_calls", [None, []])
def test_body_tool_calls_finish_with_no_call_is_the_error_body(tool_calls: list | None) -> None:
    out, changes, outcome = repair_chat_completion(body(tool_calls), TOOLS, capture_id="cap")
    assert outcome == "unrecoverable"
    error = json.loads(out)["error"]
    assert error["code"] == 502 and error["tapfix"]["defect"] == EMPTY_TURN
    assert [c.kind for c in changes] == [EMPTY_TURN]


def test_body_stop_with_calls_is_corrected_and_named_choice_passes() -> None:
    original = body([message_call("get_weather", '{"city": "Oslo"}')], "stop")
    out, changes, outcome = repair_chat_completion(original, TOOLS)
    assert json.loads(out)["choices"][0]["finish_reason"] == "tool_calls" and outcome == "repaired"
    assert [c.kind for c in changes] == [FINISH_MISMATCH]
    assert repair_chat_completion(original, TOOLS, tool_choice=NAMED) == (original, [], "untouched")


def test_body_length_with_complete_call_is_kept() -> None:
    out, changes, outcome = repair_chat_completion(body([message_call("read", '{"path": "a"}')], "length"), TOOLS)
    choice = json.loads(out)["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and outcome == "repaired"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"path": "a"}
    assert FINISH_MISMATCH in [c.kind for c in changes]


def test_body_wrong_indexes_and_names_are_repaired() -> None:
    original = body(
        [
            message_call("Read", '{"path": "a"}', index=1),
            message_call("get_weather", '{"city": "x"}', id="c2", index=3),
        ]
    )
    out, changes, outcome = repair_chat_completion(original, TOOLS)
    calls = json.loads(out)["choices"][0]["message"]["tool_calls"]
    assert [(c["id"], c["function"]["name"]) for c in calls] == [("c1", "read"), ("c2", "get_weather")]
    assert outcome == "repaired" and changes


# -- n > 1: each choice on its own ----------------------------------------------------------------------
def test_two_choices_one_broken_one_fine_each_right() -> None:
    stream = [
        chunk({"tool_calls": [tool_call_delta(1, "a1", "read", '{"path": "a"}')]}, index=0),
        chunk({"tool_calls": [tool_call_delta(0, "b1", "get_weather", '{"city": "Oslo"}')]}, index=1),
        finish("stop", 0),
        finish("tool_calls", 1),
    ]
    data, out, stage = run(stream)
    assert calls_of(out, 0) == [("read", {"path": "a"})] and tool_indexes(out, 0) == [0]
    assert calls_of(out, 1) == [("get_weather", {"city": "Oslo"})] and tool_indexes(out, 1) == [0]
    finishes = {
        ch["index"]: ch["finish_reason"]
        for c in client_view(out).chunks
        for ch in c["choices"]
        if ch.get("finish_reason")
    }
    assert finishes == {0: "tool_calls", 1: "tool_calls"}
    assert all(c.path.startswith("$.choices[0]") for c in stage.changes)
    fine_event = sse([stream[1]], done=False)
    assert fine_event in out  # the fine choice's event went out as it came


def test_two_choices_in_a_body_each_repaired_on_its_own() -> None:
    fine = {"index": 1, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    obj = json.loads(body([message_call("read", '{"path": "a"}')], "stop"))
    obj["choices"].append(fine)
    out, changes, _ = repair_chat_completion(json.dumps(obj).encode(), TOOLS)
    choices = json.loads(out)["choices"]
    assert [c["finish_reason"] for c in choices] == ["tool_calls", "stop"] and choices[1] == fine
    assert all(c.path.startswith("$.choices[0]") for c in changes)


# -- prefix mode hands out nothing it would have to renumber --------------------------------------------
def test_prefix_mode_holds_an_opener_off_index() -> None:
    _, out, stage = run(
        [call(1, "c1", "read", ""), call(1, arguments='{"path": "a"}'), finish("tool_calls")],
        stream_valid_prefix=True,
    )
    assert tool_indexes(out) == [0] and calls_of(out) == [("read", {"path": "a"})] and not client_view(out).errors


# -- a property: index offsets and gaps, any args, any splits: the client gets dense calls, same content
@settings(deadline=None, max_examples=examples(60))
@given(
    st.lists(st.sampled_from(["a", "b/c", "é 😀", 'q"x']), min_size=1, max_size=4),
    st.lists(st.integers(0, 3), min_size=4, max_size=4),
    st.integers(0, 2**16),
    st.booleans(),
)
def test_any_increasing_indexes_reach_the_client_dense(paths, gaps, seed, prefix) -> None:
    indexes, at = [], 0
    for k in range(len(paths)):
        at += gaps[k] + (1 if k else 0)
        indexes.append(at)
    stream = [
        call(i, f"id{k}", "read", json.dumps({"path": p})) for k, (i, p) in enumerate(zip(indexes, paths, strict=True))
    ]
    data, out, stage = run([*stream, finish("tool_calls")], seed, stream_valid_prefix=prefix)
    assert calls_of(out) == [("read", {"path": p}) for p in paths]
    assert tool_indexes(out) == list(range(len(paths))) or out == data
    if indexes == list(range(len(paths))):
        assert out == data and stage.changes == []
    else:
        assert tool_indexes(out) == list(range(len(paths))) and WRONG_INDEX in stage.defects


# -- the request's tool_choice reaches the repair, on every surface's factory ---------------------------
def test_tool_choice_is_recorded_from_the_request_and_passed_to_every_factory() -> None:
    ex = Exchange()
    ex.note_request_json({"model": "m", "tools": TOOLS, "tool_choice": NAMED})
    assert ex.tool_choice == NAMED
    data = sse([ROLE, call(0, "c1", "get_weather", '{"city": "Oslo"}'), finish("stop")])
    stage = stage_for("chat", TOOLS, "error", "cap", tool_choice=ex.tool_choice)
    assert run_stage(stage, [data]) == data and stage.outcome == "untouched"
    for surface in ("responses", "messages"):
        assert stage_for(surface, TOOLS, "error", "cap", tool_choice=NAMED) is not None
        repair = body_repair_for(surface)
        assert repair is not None and repair(b"{}", TOOLS, capture_id="c", policy="error", tool_choice=NAMED)
    chat = body_repair_for("chat")
    original = body([message_call("get_weather", '{"city": "Oslo"}')], "stop")
    assert chat is not None and chat(original, TOOLS, capture_id="c", policy="error", tool_choice=NAMED)[0] == original


# -- a property: information-preserving structural defects, composed, give the client the original calls
OFFERED = [tool("read_file"), tool("get_weather"), tool("list")]
MUTATIONS = ("offset", "all_zero", "id_churn", "name_case", "name_prefix", "finish_stop", "finish_length")
ARG_VALUES = st.one_of(st.integers(-5, 5), st.booleans(), st.text(alphabet='ab /é"\\', max_size=5))


@settings(deadline=None, max_examples=examples(120))
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["read_file", "get_weather", "list"]),
            st.dictionaries(st.sampled_from("xyz"), ARG_VALUES, max_size=3),
        ),
        min_size=1,
        max_size=3,
    ),
    st.sets(st.sampled_from(MUTATIONS)),
    st.integers(0, 2**16),
    st.booleans(),
)
def test_preserving_structural_defects_compose_to_the_original_calls(calls, mutations, seed, prefix) -> None:
    rng = random.Random(seed)
    texts = [json.dumps(args) for _, args in calls]
    split = [sorted(rng.sample(range(1, len(t)), min(len(t) - 1, rng.randint(0, 3)))) for t in texts]
    frags = [[t[a:b] for a, b in zip([0, *c], [*c, len(t)], strict=True)] for t, c in zip(texts, split, strict=True)]

    def stream_with(muts: set[str]) -> bytes:
        stream = []
        for k, (name, _) in enumerate(calls):
            index = 0 if "all_zero" in muts else k + (2 if "offset" in muts else 0)
            sent_name = name.upper() if "name_case" in muts else name
            sent_name = "functions." + sent_name if "name_prefix" in muts else sent_name
            stream.append(call(index, f"id{k}", sent_name, ""))
            for j, frag in enumerate(frags[k]):
                stream.append(call(index, f"id{k}-{j}" if "id_churn" in muts else None, None, frag))
        reason = "stop" if "finish_stop" in muts else "length" if "finish_length" in muts else "tool_calls"
        return sse([ROLE, *stream, finish(reason)])

    data, clean = stream_with(mutations), stream_with(set())
    stage = ChatToolCallRepair(OFFERED, capture_id="cap", stream_valid_prefix=prefix)
    out = run_stage(stage, random_splits(data, rng))
    view = client_view(out)
    assert not view.errors
    assert [(c["id"], c["name"], json.loads(c["arguments"])) for c in view.calls] == [
        (f"id{k}", name, args) for k, (name, args) in enumerate(calls)
    ]
    assert sorted(set(tool_indexes(out))) == list(range(len(calls))) and view.finish_reasons == ["tool_calls"]
    if data == clean:
        assert out == data and stage.changes == []
    else:
        assert stage.outcome == "repaired" and stage.changes


@pytest.mark.parametrize(
    ("pieces", "expected"),
    [
        (["get_wea", "ther"], ["get_weather"]),  # the rest of an offered name, after the arguments
        (["Get_Wea", "ther"], ["get_weather"]),  # ... in another case
        (["get_weather", "read"], ["get_weather", "read"]),  # two offered names: two calls on index 0
    ],
)
def test_a_name_piece_after_the_arguments_continues_the_call_only_when_it_completes_an_offered_name(
    pieces: list[str], expected: list[str]
) -> None:
    first = call(0, "c1", pieces[0], {"city": "Paris"})
    second = chunk({"tool_calls": [{"index": 0, "function": {"name": pieces[1], "arguments": '{"path": "a"}'}}]})
    if expected == ["get_weather"]:
        second = chunk({"tool_calls": [{"index": 0, "function": {"name": pieces[1]}}]})
    stage = ChatToolCallRepair(TOOLS, capture_id="cap")
    view = client_view(run_stage(stage, [sse([ROLE, first, second, chunk(finish_reason="tool_calls")])]))
    assert not view.errors
    assert [c["name"] for c in view.calls] == expected


def test_a_name_in_three_pieces_after_the_arguments_is_one_call() -> None:
    todo = tool("todo", {"items": {"type": "array"}})
    first = call(0, "c1", "to", {"items": []})
    pieces = [chunk({"tool_calls": [{"index": 0, "function": {"name": p}}]}) for p in ("d", "o")]
    stage = ChatToolCallRepair([todo, READ], capture_id="cap")
    view = client_view(run_stage(stage, [sse([ROLE, first, *pieces, chunk(finish_reason="tool_calls")])]))
    assert not view.errors
    assert [c["name"] for c in view.calls] == ["todo"]
