"""The chat stream's assembly: its shortcuts (one-line framing split in one pass, content deltas and
tool-call fragments folded without the general walk) give what the general walk gives, on any stream."""

from __future__ import annotations

import json

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from tapfix.proxy.assemble import assemble_sse
from tapfix.proxy.assemble.chat import _assemble_events, _fold_general, assemble_chat_sse
from tapfix.proxy.assemble.result import Assembled

from tests.support.builders import chat_chunk, split_at, sse, sse_event, tool_call_chunk
from tests.support.depth import examples

texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)
objects = st.one_of(
    st.builds(lambda t: chat_chunk({"content": t}), texts),
    st.builds(lambda t: chat_chunk({"role": "assistant", "content": t}), texts),
    st.builds(lambda t: chat_chunk({"reasoning_content": t}), texts),
    st.builds(lambda i, t: tool_call_chunk(i, arguments=t), st.integers(0, 2), texts),
    st.builds(lambda i, name: tool_call_chunk(i, f"call_{i}", name), st.integers(0, 2), st.sampled_from(["a", "b"])),
    st.builds(lambda t: chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": t, "name": "a"}}]}), texts),
    st.builds(lambda t: chat_chunk({"content": t}, index=1), texts),  # another choice (n > 1)
    st.builds(lambda t: chat_chunk({"content": t}, finish_reason="stop"), texts),
    st.builds(lambda t: chat_chunk({"content": t}, timings={"cache_n": 3}), texts),
    st.builds(lambda t: chat_chunk({"content": t}, usage={"prompt_tokens": 2}), texts),
    st.builds(lambda t: chat_chunk({"content": t}, error={"message": "boom"}), texts),
    st.builds(lambda t: chat_chunk({"content": None, "tool_calls": []}), texts),
    st.just({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}),
    st.just({"choices": [{"index": 0, "text": "legacy", "delta": {"content": "x"}, "finish_reason": None}]}),
    st.just({"choices": [{"index": 0, "text": "old style", "finish_reason": None}]}),
)
# An engine's content delta with its text's string swapped for other bytes: another string (escaped as any
# encoder may), or bytes that make another object (a second key, a closed delta, a number, two strings).
_PREFIX, _SUFFIX = orjson.dumps(chat_chunk({"content": "X"})).split(b'"X"')
_ARGS = [orjson.dumps(tool_call_chunk(0, arguments="X")).split(b'"X"')]
_ARGS.append(
    orjson.dumps(chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": "X", "name": "a"}}]})).split(b'"X"')
)
middles = st.one_of(
    texts.map(orjson.dumps),
    texts.map(lambda t: json.dumps(t).encode()),
    st.sampled_from(
        [b'"a","content":"b"', b'"a","role":"x"', b'"a"},"x":{"y":"b"', b"1", b"null", b'"a" "b"', b' "a" ']
        + [b'""', b'"\\ud800"', b'"\\u00e9\\n"', b'"a', b"", b'"a"}]}', b'{"x":"a"}']
    ),
)
payloads = st.one_of(
    objects.map(orjson.dumps),
    middles.map(lambda middle: _PREFIX + middle + _SUFFIX),
    st.just(b'{"choices":[{"index":0,"delta":{"content":"a","content":"b"},"finish_reason":null}]}'),
    st.just(b'{"choices":[{"index":0,"delta":{"content":"a","content":"a"},"finish_reason":null}]}'),
    st.just(b'{"choices":[{"index":0,"delta":{"content":"b","content":"a"},"finish_reason":null}]}'),
    st.sampled_from([b"[DONE]", b" [DONE] ", b"{not json", b"", b"[1, 2]", b'"text"', b"  {}", b"{}"]),
)
framings = st.sampled_from(["one_line", "crlf", "two_lines", "comment", "no_space", "extra_blank"])


def _framed(data: bytes, framing: str) -> bytes:
    """One event in one of the framings SSE allows (every engine sends `one_line`)."""
    if framing == "crlf":
        return sse_event(data, newline="\r\n")
    if framing == "two_lines" and len(data) > 1:
        return sse_event(data[:1])[:-1] + sse_event(data[1:])
    if framing == "comment":
        return b": keep-alive\n\n" + sse_event(data)
    if framing == "no_space":
        return sse_event(data).replace(b": ", b":", 1)
    if framing == "extra_blank":
        return sse_event(data) + b"\n"
    return sse_event(data)


@st.composite
def streams(draw: st.DrawFn) -> list[bytes]:
    events = draw(st.lists(st.tuples(payloads, framings), max_size=24))
    one_line = draw(st.booleans())  # most real streams: every event one line, the shortcut's case
    framed = [_framed(data, "one_line" if one_line else framing) for data, framing in events]
    body = b"".join(framed)
    if draw(st.booleans()):
        body += draw(st.sampled_from([b'data: {"choices": []}', b"data: [DON", b"\n", b"data: x\n"]))
    ends = [sum(len(e) for e in framed[: i + 1]) for i in range(len(framed))]
    near_ends = st.sampled_from(ends).flatmap(lambda end: st.integers(max(0, end - 2), min(len(body), end + 1)))
    anywhere = st.integers(0, len(body))
    cuts = sorted(draw(st.lists(st.one_of(anywhere, near_ends) if ends else anywhere, max_size=12)))
    return split_at(body, cuts) if cuts else [body]


def _same(got: Assembled, want: Assembled) -> None:
    assert got == want
    assert [c.as_dict() | {"index": c.index} for c in got.choices] == [
        c.as_dict() | {"index": c.index} for c in want.choices
    ]


@settings(max_examples=examples(400), deadline=None)
@given(streams())
def test_the_shortcuts_give_what_the_general_walk_gives(chunks: list[bytes]) -> None:
    _same(assemble_chat_sse(chunks), _assemble_events(chunks, _fold_general))


def test_a_one_line_stream_reads_whole_with_its_first_token_chunk() -> None:
    body = sse(
        [
            chat_chunk({"role": "assistant", "content": ""}),
            chat_chunk({"content": "Hel"}),
            chat_chunk({"content": "lo"}),
            tool_call_chunk(0, "c1", "f"),
            tool_call_chunk(0, arguments='{"a":'),
            tool_call_chunk(0, arguments="1}"),
            chat_chunk({}, "tool_calls"),
        ]
    )
    first = body.index(b"\n\n", body.index(b"Hel")) + 2
    chunks = split_at(body, [first - 8, first - 1, first])
    got = assemble_sse(chunks, "/v1/chat/completions")  # "Hel"'s event ends with the third chunk
    assert (got.content, got.finish_reason, got.done, got.events) == ("Hello", "tool_calls", True, 8)
    assert got.tool_calls == [{"id": "c1", "name": "f", "arguments": '{"a":1}'}]
    assert got.first_token_chunk == 2
    _same(got, _assemble_events(chunks, _fold_general))


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(middles, min_size=1, max_size=12), texts)
def test_an_event_shaped_like_the_last_content_delta_reads_as_what_it_is(found: list[bytes], text: str) -> None:
    body = sse([chat_chunk({"content": text}), *(_PREFIX + middle + _SUFFIX for middle in found)])
    _same(assemble_chat_sse([body]), _assemble_events([body], _fold_general))


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(middles, min_size=1, max_size=12), texts, st.sampled_from(_ARGS))
def test_an_event_shaped_like_the_last_tool_call_fragment_reads_as_what_it_is(
    found: list[bytes], text: str, shape: list[bytes]
) -> None:
    before, after = shape
    opener = tool_call_chunk(0, "c1", "write")
    body = sse([opener, before + orjson.dumps(text) + after, *(before + middle + after for middle in found)])
    _same(assemble_chat_sse([body]), _assemble_events([body], _fold_general))


def test_a_content_given_twice_reads_as_the_last_one_given() -> None:
    twice = b'{"choices":[{"index":0,"delta":{"content":"%s","content":"a"},"finish_reason":null}]}'
    body = sse([twice % b"a", twice % b"b"])
    got = assemble_chat_sse([body])
    assert got.content == "aa"
    _same(got, _assemble_events([body], _fold_general))
