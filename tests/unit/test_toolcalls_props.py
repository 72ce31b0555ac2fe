"""Properties over generated streams: valid ones pass byte for byte; broken ones never raise and never
reach the client as unparseable arguments."""

from __future__ import annotations

import json
import random
from functools import partial

from hypothesis import given, settings
from hypothesis import strategies as st
from tapfix.proxy.toolcalls import ChatToolCallRepair

from tests.support.builders import (
    chat_chunk,
    corrupt_events,
    random_splits,
    split_arguments,
    sse_event,
    tool,
    tool_call_delta,
)
from tests.support.stage_io import judged_view, run_stage

_TC = b'data: {"choices":[{"index":0,"delta":{"tool_calls":'

TEXT = st.text(alphabet=st.sampled_from(list("ab <>[]{}\"'`\n\\é€😀_:,")) | st.characters(codec="utf-8"), max_size=12)
KEYS = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)
SCALARS = (
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False, allow_infinity=False) | TEXT
)
ARGS = st.dictionaries(
    KEYS,
    st.recursive(
        SCALARS,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
        max_leaves=6,
    ),
    max_size=4,
)


# This module's upstream: chunk id chatcmpl-p, created 7.
chunk = partial(chat_chunk, id="chatcmpl-p", created=7)


@st.composite
def valid_streams(draw, min_calls: int = 0) -> tuple[bytes, list, list[dict]]:
    rng = random.Random(draw(st.integers(0, 2**32)))
    events: list[bytes] = []
    nl = draw(st.sampled_from(["\n", "\r\n"]))
    compact = draw(st.booleans())

    def emit(obj) -> None:
        if isinstance(obj, bytes):
            events.append(obj)
            return
        separators = (",", ":") if compact else (", ", ": ")
        events.append(sse_event(obj, newline=nl, ensure_ascii=draw(st.booleans()), separators=separators))

    emit(chunk({"role": "assistant", "content": ""}))
    for text in draw(st.lists(TEXT, max_size=3)):
        emit(chunk({"reasoning_content": text}))
    for text in draw(st.lists(TEXT, max_size=4)):
        if text:
            emit(chunk({"content": text}))
    calls = draw(st.lists(ARGS, min_size=min_calls, max_size=3))
    tools = [tool(f"t{i}") for i in range(max(1, len(calls)))]
    queues = []
    for i, args in enumerate(calls):
        text = json.dumps(args, ensure_ascii=draw(st.booleans()))
        frags = split_arguments(text, rng, 5)
        queue = [tool_call_delta(i, f"call_{i}", f"t{i}", "")] + [tool_call_delta(i, arguments=f) for f in frags]
        queues.append(queue)
    while any(queues):
        queue = rng.choice([q for q in queues if q])
        emit(chunk({"tool_calls": [queue.pop(0)]}))
        if rng.random() < 0.1:
            emit(f": ping{nl}{nl}".encode())
    emit(chunk(finish_reason="tool_calls" if calls else "stop"))
    if draw(st.booleans()):
        emit(chunk(usage={"total_tokens": 5}) | {"choices": []})
    events.append(sse_event(b"[DONE]", newline=nl))
    return b"".join(events), tools, calls


@settings(deadline=None)
@given(valid_streams(), st.integers(0, 2**16), st.booleans())
def test_valid_streams_pass_byte_for_byte(stream, seed: int, with_tools: bool) -> None:
    data, tools, _ = stream
    stage = ChatToolCallRepair(tools if with_tools else None)
    out = run_stage(stage, random_splits(data, random.Random(seed), 30))
    assert out == data
    assert stage.outcome == "untouched" and stage.changes == []


@settings(deadline=None)
@given(valid_streams(min_calls=1), st.integers(0, 2**16), st.sampled_from(["error", "fail_fast", "passthrough"]))
def test_mutated_streams_never_raise_and_never_hand_out_broken_arguments(stream, seed: int, policy: str) -> None:
    data, tools, _ = stream
    rng = random.Random(seed)
    broken = corrupt_events(data, rng)
    stage = ChatToolCallRepair(tools, policy=policy)
    out = run_stage(stage, random_splits(broken, rng, 50))
    view = judged_view(stage, policy, out)
    if view is None:
        return
    if view.errors:
        assert not view.calls
        return
    for call in view.calls:
        assert isinstance(json.loads(call["arguments"]), dict)


@settings(deadline=None)
@given(st.binary(max_size=300), st.sampled_from([None, [{"type": "function", "function": {"name": "x"}}]]))
def test_arbitrary_bytes_never_raise(data: bytes, tools) -> None:
    stage = ChatToolCallRepair(tools)
    run_stage(stage, [data[:7], data[7:]])


@settings(deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                _TC + b'[{"index":0,"id":"a","function":{"name":"x","arguments":"{\\"a\\""}}]}}]}\n\n',
                _TC + b'[{"index":1,"function":{"arguments":{"k":1}}}]}}]}\n\n',
                _TC + b'[{"function":{"name":"x"}}]}}]}\n\n',
                _TC + b'[null, 3, {"index":"z"}]}}]}\n\n',
                b'data: {"choices":[{"index":0,"delta":{"content":"<tool_call>{\\"name\\": \\"x\\""}}]}\n\n',
                b'data: {"choices":[{"index":0,"delta":{"content":"[TOOL_CALLS]x{}"}}]}\n\n',
                b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n',
                b'data: {"choices":[{"index":1,"delta":{},"finish_reason":"length"}]}\n\n',
                b'data: {"error":{"message":"Failed to parse input at pos 3: '
                b'<tool_call>{\\"name\\": \\"x\\", \\"arguments\\": {}}"}}\n\n',
                b'data: {"choices": "nope"}\n\n',
                b"data: [1, 2]\n\n",
                b": ping\n\n",
                b"data: [DONE]\n\n",
                b"event: x\n\n",
            ]
        ),
        max_size=12,
    ),
    st.sampled_from(["error", "fail_fast", "passthrough"]),
)
def test_hostile_event_sequences_never_raise(events: list[bytes], policy: str) -> None:
    tools = [{"type": "function", "function": {"name": "x", "parameters": {"type": "object"}}}]
    stage = ChatToolCallRepair(tools, policy=policy)
    run_stage(stage, events)
    assert stage.outcome in ("untouched", "repaired", "unrecoverable", "recovered_from_error")
