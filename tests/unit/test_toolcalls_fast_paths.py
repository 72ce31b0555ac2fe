"""The Chat Completions stage's fast paths are exact: with them (`_interesting`'s byte checks, the quiet path
of `chat_quiet.py` and its light hold of a word-led opener's start) the stage sends what it sends with
every event taken by the full path, event by event, and records the same changes.

The streams are what a server may send around a turn that offered tools: content made of prose and every
registered format's markup (whole, and its openers' starts) cut at arbitrary points, escapes and non-ASCII
text (written as UTF-8 or as `\\uXXXX`; a lone surrogate escaped, or as bytes that aren't UTF-8), reasoning
deltas, tool-call deltas, empty and null deltas, a second choice, finishes, usage, comments and [DONE], in
several envelopes (vLLM's, spaced JSON, Go's escapes, CRLF framing, a `created` that changes) and with the
clock jumping past the keep-alive interval. Armed: every format, or one pinned; prefix streaming on or off."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tapfix.proxy.toolcalls import ChatToolCallRepair
from tapfix.proxy.toolcalls.chat_quiet import learn, quiet_text, read_texts
from tapfix.proxy.toolcalls.formats import REGISTRY
from tapfix.proxy.toolcalls.leaks import formats_for

from tests.support.builders import chat_chunk, sse_event, tool
from tests.support.depth import examples

TOOLS = [tool("read", {"path": {"type": "string"}}, ["path"]), tool("grep", {"pattern": {"type": "string"}})]
CALLS = [("read", {"path": "a.py"}), ("grep", {"pattern": "x"})]


def _renders() -> list[str]:
    out = []
    for fmt in REGISTRY.values():
        for calls in (CALLS[:1], CALLS):
            try:
                out.append(fmt.render(calls))
            except (ValueError, NotImplementedError):
                pass
        out += fmt.openers
    return out


MARKUP = sorted(set(_renders()))
WORDS = [" the", " to", " to=", "A", " Action", "Action:", "func", " functools", " function call", "Sure.", " wire"]
WORDS += ["\n", "\n\n", "```", "```json\n", "    ", "- ", "> ", "`", "<think>", "</think>", "<", ">", "[", "]"]
WORDS += ["{", "}"]
WORDS += ['"', "\\", "\\u003c", "é", "中文", "｜", "▁", "😀", "\ud83d", "\ude00", " ", "\t", "\x01", "ok. ", "|"]
WORDS += ['{"name": "read", "arguments": {"path": "a.py"}}', '[{"name": "grep"', "read", "(", ")", "=", "A", " f"]
PROSE = st.lists(st.sampled_from([" the", " to", " wire", " A", " went", ",", ".", " over", " f", " Act"]), max_size=8)
FRAGMENTS = st.one_of(st.sampled_from(MARKUP), st.sampled_from(WORDS), st.text(max_size=6), *[PROSE.map("".join)] * 8)


@st.composite
def streams(draw: st.DrawFn, prose: bool = False) -> tuple[list[tuple[float, bytes]], dict[str, Any]]:
    """`prose`: a turn's answer (prose first, then whatever: the quiet path's ground), else anything."""
    ascii_ = draw(st.booleans())
    go = draw(st.booleans())  # Go's encoder: `<`, `>`, `&` as `\\u003c`...
    spaced = draw(st.booleans())
    nl = draw(st.sampled_from(["\n", "\n", "\r\n"]))
    created_moves = draw(st.booleans())
    text = "".join(draw(st.lists(FRAGMENTS, max_size=16)))
    if prose:
        text = "Sure." + "".join(draw(PROSE)) + text + "".join(draw(PROSE))
    cuts = sorted(set(draw(st.lists(st.integers(0, len(text)), max_size=24))))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    others = st.one_of(
        st.tuples(st.just("reasoning"), st.sampled_from(["reasoning_content", "reasoning"]), FRAGMENTS),
        st.tuples(st.just("open"), st.integers(0, 1), st.sampled_from(["read", "grep", "nope"])),
        st.tuples(st.just("args"), st.integers(0, 1), st.sampled_from(['{"path": "a', '.py"}', "{", "}", '"x"'])),
        st.tuples(st.just("finish"), st.sampled_from(["stop", "tool_calls", "length"])),
        st.tuples(st.just("content1"), FRAGMENTS),
        st.sampled_from([("empty",), ("null",), ("usage",), ("comment",), ("done",), ("role",)]),
    )
    extra = draw(st.lists(st.tuples(st.integers(0, len(pieces)), others), max_size=2 if prose else 5))
    items: list[tuple[Any, ...]] = [("content", p) for p in pieces]
    for at, item in sorted(extra, key=lambda x: -x[0]):
        items.insert(at, item)
    if draw(st.booleans()):
        items.insert(0, ("role",))
    items += draw(st.sampled_from([[("finish", "stop"), ("usage",), ("done",)], [("done",)], []]))
    clock = 0.0
    events = []
    for n, item in enumerate(items):
        clock += draw(st.sampled_from([0.0, 0.0, 0.0, 11.0]))
        created = 1 + (n // 3 if created_moves else 0)
        events.append((clock, _wire(item, created, ascii_, go, spaced, nl)))
    kw = {
        "tool_format": draw(st.sampled_from([None, None, "hermes", "harmony", "pythonic", "llama3_json"])),
        "stream_valid_prefix": draw(st.booleans()),
    }
    return events, kw


def _wire(item: tuple[Any, ...], created: int, ascii_: bool, go: bool, spaced: bool, nl: str) -> bytes:
    kind = item[0]
    if kind == "done":
        return sse_event(b"[DONE]", newline=nl)
    if kind == "comment":
        return f": ping{nl}{nl}".encode()
    chunk = {
        "role": lambda: chat_chunk({"role": "assistant", "content": ""}, created=created),
        "content": lambda: chat_chunk({"content": item[1]}, created=created),
        "content1": lambda: chat_chunk({"content": item[1]}, created=created, index=1),
        "reasoning": lambda: chat_chunk({item[1]: item[2]}, created=created),
        "open": lambda: chat_chunk(
            {"tool_calls": [{"index": item[1], "id": f"c{item[1]}", "function": {"name": item[2]}}]}, created=created
        ),
        "args": lambda: chat_chunk({"tool_calls": [{"index": item[1], "function": {"arguments": item[2]}}]}),
        "finish": lambda: chat_chunk({}, item[1], created=created),
        "empty": lambda: chat_chunk({}, created=created),
        "null": lambda: chat_chunk({"content": None}, created=created),
        "usage": lambda: {**chat_chunk(created=created), "choices": [], "usage": {"total_tokens": 3}},
    }[kind]()
    separators = (", ", ": ") if spaced else (",", ":")
    data = json.dumps(chunk, ensure_ascii=ascii_, separators=separators)
    if go:
        data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return sse_event(data.encode(errors="surrogatepass"), newline=nl)  # a lone surrogate as UTF-8: no parser reads it


def _run(events: list[tuple[float, bytes]], fast: bool, kw: dict[str, Any]) -> tuple[Any, ...]:
    now = [0.0]
    stage = ChatToolCallRepair(TOOLS, capture_id="cap", clock=lambda: now[0], **kw)
    stage.fast_paths = fast
    out = []
    for at, event in events:
        now[0] = at
        out.append(stage.feed(event))
    out.append(stage.flush())
    return out, stage.changes, stage.defects, stage.outcome


@given(st.one_of(streams(), streams(prose=True)))
@settings(
    max_examples=examples(800), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
def test_the_fast_paths_send_what_the_full_path_sends(stream: tuple[list[tuple[float, bytes]], dict[str, Any]]) -> None:
    events, kw = stream
    assert _run(events, True, kw) == _run(events, False, kw)


@given(st.lists(st.sampled_from(WORDS + MARKUP[:40]), max_size=6), st.booleans())
@settings(max_examples=examples(300), deadline=None)
def test_the_quiet_strings_are_read_as_a_json_parser_reads_each(texts: list[str], ascii_: bool) -> None:
    """The quiet path's strings are read in batches; the text is what the stage's parser reads from each
    event, joined (a surrogate pair split across events stays two lone halves)."""
    if not ascii_:
        texts = ["".join(c for c in t if not 0xD800 <= ord(c) <= 0xDFFF) for t in texts]
    raws = [json.dumps(t, ensure_ascii=ascii_).encode()[1:-1] for t in texts]
    assert read_texts(raws) == "".join(texts)


def test_a_chunk_of_another_shape_is_not_a_content_slot() -> None:
    """Only a chunk whose one choice carries content and nothing the stage acts on is learned."""
    shaped = [
        chat_chunk({"content": "a"}, "stop"),
        chat_chunk({"content": "a", "tool_calls": [{"index": 0}]}),
        chat_chunk({"content": "a", "reasoning_content": "b"}),
        chat_chunk({"content": "a"}, index=1),
        {**chat_chunk({"content": "a"}), "choices": [chat_chunk({"content": "a"})["choices"][0]] * 2},
        chat_chunk({"content": None}),
    ]
    for obj in shaped:
        assert learn(sse_event(obj)) is None, obj
    slot = learn(sse_event(chat_chunk({"content": "a"})))
    assert slot is not None and slot.raw(sse_event(chat_chunk({"content": "b c"}))) == b"b c"


def test_every_opener_is_loud_to_the_quiet_check() -> None:
    """Each registered opener, whole or escaped as a server may write it, fails the quiet check."""
    check = quiet_text(formats_for(None))
    assert check.quiet(b"hello world, nothing to see")
    for fmt in REGISTRY.values():
        for opener in fmt.openers:
            for ascii_ in (False, True):
                raw = json.dumps("so " + opener, ensure_ascii=ascii_).encode()[1:-1]
                assert not check.quiet(raw), (fmt.name, opener, ascii_)
