import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.response.reasoning_fields import ReasoningFieldRename, rename_field
from tapfix.proxy.sse import SSESplitter

from tests.support.builders import DONE, split_every, sse_event

VLLM_DELTA = b'data: {"id":"c1","choices":[{"index":0,"delta":{"reasoning":"Let me think"},"finish_reason":null}]}\n\n'

# (src, dst, event in, event out)
EVENTS = [
    (
        "reasoning",
        "reasoning_content",
        VLLM_DELTA,
        b'data: {"id":"c1","choices":[{"index":0,"delta":{"reasoning_content":"Let me think"},'
        b'"finish_reason":null}]}\n\n',
    ),
    (
        "reasoning_content",
        "reasoning",
        b'data: {"choices": [{"delta": {"reasoning_content" : "x"}}]}\r\n\r\n',
        b'data: {"choices": [{"delta": {"reasoning" : "x"}}]}\r\n\r\n',
    ),
    # whole (non-stream) body: choices[].message
    (
        "reasoning",
        "reasoning_content",
        b'data: {"choices":[{"message":{"content":"a","reasoning":"b"}}]}\n\n',
        b'data: {"choices":[{"message":{"content":"a","reasoning_content":"b"}}]}\n\n',
    ),
    # two choices, both renamed
    (
        "reasoning",
        "reasoning_content",
        b'data: {"choices":[{"delta":{"reasoning":"a"}},{"delta":{"reasoning":"b"}}]}\n\n',
        b'data: {"choices":[{"delta":{"reasoning_content":"a"}},{"delta":{"reasoning_content":"b"}}]}\n\n',
    ),
]


@pytest.mark.parametrize(("src", "dst", "event", "expected"), EVENTS)
def test_rename(src, dst, event, expected):
    stage = ReasoningFieldRename(src, dst)
    assert stage.feed(event) == [expected]
    assert stage.flush() == []
    change = stage.change()
    assert (change.kind, change.before, change.after) == ("rename", src, dst)


UNCHANGED = [
    b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n',  # no field
    b": ping\n\n",
    b"data: [DONE]\n\n",
    b'data: {"choices":[{"delta":{"content":"the \\"reasoning\\": field"}}]}\n\n',  # only inside a string
    b'data: {"choices":[{"delta":{"reasoning":"a","reasoning_content":"a"}}]}\n\n',  # client already has dst
    b'data: {"usage":{"reasoning":1}}\n\n',  # not in a choice
    b'data: {"choices":[{"delta":{"reasoning":"a","content":"{\\"reasoning\\":1}"}}]}\n\n'[:40] + b"\n\n",  # broken
    b'data: {"choices":[{"delta":{"reasoning":"a"}}],"x":{"reasoning":2}}\n\n',  # ambiguous: left alone
]


@pytest.mark.parametrize("event", UNCHANGED)
def test_no_op_events_are_the_same_object(event):
    stage = ReasoningFieldRename("reasoning", "reasoning_content")
    [out] = stage.feed(event)
    assert out is event
    assert stage.change() is None


def test_bad_field_names():
    with pytest.raises(ValueError):
        ReasoningFieldRename("reasoning", "reasoning")
    with pytest.raises(ValueError):
        ReasoningFieldRename("thinking", "reasoning")


def test_rename_field_on_a_body():
    body = b'{"choices":[{"message":{"role":"assistant","reasoning":"r","content":"c"}}]}'
    assert orjson.loads(rename_field(body, "reasoning", "reasoning_content"))["choices"][0]["message"] == {
        "role": "assistant",
        "reasoning_content": "r",
        "content": "c",
    }


texts = st.text(max_size=20) | st.sampled_from(['"reasoning": x', '{"reasoning":1}'])


@given(st.lists(st.tuples(st.booleans(), texts), min_size=1, max_size=8), st.integers(1, 50))
def test_stream_through_splitter_renames_exactly_the_reasoning_deltas(parts, chunk):
    events, wanted = [], []
    for is_reasoning, text in parts:
        for key, into in (
            ("reasoning" if is_reasoning else "content", events),
            ("reasoning_content" if is_reasoning else "content", wanted),
        ):
            into.append(sse_event({"choices": [{"index": 0, "delta": {key: text}}]}))
    raw = b"".join(events) + DONE
    splitter, stage = SSESplitter(), ReasoningFieldRename("reasoning", "reasoning_content")
    out = []
    for piece in split_every(raw, chunk):
        for event in splitter.feed(piece):
            out += stage.feed(event)
    for event in splitter.flush():
        out += stage.feed(event)
    out += stage.flush()
    assert b"".join(out) == b"".join(wanted) + b"data: [DONE]\n\n"
