"""The registry's formats through the Chat Completions repair (streamed with hostile splits, and the
non-streamed body): the rules that say when markup is a call (docs/formats.md), each both ways;
holding; the fast path's byte checks; pinning a format; the docs' table of the registered formats."""

from __future__ import annotations

import json
import random
import re
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from tapfix.proxy.config.file import ConfigError, from_dict
from tapfix.proxy.mock.mutations_leak import small_pieces
from tapfix.proxy.sse import SSESplitter
from tapfix.proxy.toolcalls import ChatToolCallRepair, body_repair_for, stage_for
from tapfix.proxy.toolcalls.formats import REGISTRY, UnknownFormat, armed, registry

from tests.support.builders import chat_chunk, random_splits, sse, sse_event, tool, tool_call_chunk
from tests.support.stage_io import client_view, run_stage

READ = tool("read", {"path": {"type": "string"}}, ["path"])
GREP = tool("grep", {"pattern": {"type": "string"}}, ["pattern"])
TOOLS = [READ, GREP]
DOCS = Path(__file__).parents[2] / "docs" / "formats.md"

chunk = partial(chat_chunk, id="chatcmpl-f1")
call = partial(tool_call_chunk, chunk_id="chatcmpl-f1")
ROLE = chunk({"role": "assistant", "content": ""})
STOP = chunk(finish_reason="stop")
TOOL_FINISH = chunk(finish_reason="tool_calls")
HERMES = '<tool_call>\n{"name": "read", "arguments": {"path": "a.py"}}\n</tool_call>'
READ_A = [("read", {"path": "a.py"})]


def content(text: str) -> dict[str, Any]:
    return chunk({"content": text})


def reasoning(text: str, field: str = "reasoning_content") -> dict[str, Any]:
    return chunk({field: text})


def run(stream: list[dict[str, Any]], seed: int = 0, tools: Any = TOOLS, **kw: Any) -> tuple[bytes, bytes, Any]:
    data = sse(stream)
    stage = ChatToolCallRepair(tools, capture_id="cap", **kw)
    return data, run_stage(stage, random_splits(data, random.Random(seed))), stage


def texts(text: str, seed: int, make=content) -> list[dict[str, Any]]:
    return [make(t) for t in small_pieces(text, random.Random(seed))]


def calls_of(out: bytes) -> list[tuple[str, Any]]:
    return [(c["name"], json.loads(c["arguments"])) for c in client_view(out).calls]


def reasoning_of(out: bytes, field: str = "reasoning_content") -> str:
    view = client_view(out)
    return "".join((ch.get("delta") or {}).get(field) or "" for c in view.chunks for ch in c.get("choices") or [])


def assert_each_event_goes_out_at_once(stage: ChatToolCallRepair, data: bytes) -> None:
    """The stage holds nothing back: each event it is fed is what it returns, unchanged."""
    for event in SSESplitter().feed(data):
        assert stage.feed(event) == [event]


SEEDS = [0, 1, 2]


# -- rule 1: offered tools, offered names --------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_markup_naming_an_offered_tool_is_a_call(seed: int) -> None:
    _, out, stage = run([ROLE, *texts("Reading it.\n" + HERMES, seed), STOP], seed)
    assert calls_of(out) == READ_A and client_view(out).finish_reasons == ["tool_calls"]
    assert client_view(out).content == "Reading it.\n" and "leaked_into_content" in stage.defects


@pytest.mark.parametrize("seed", SEEDS)
def test_markup_naming_a_tool_not_offered_stays_text(seed: int) -> None:
    text = HERMES.replace('"read"', '"delete_all"')
    data, out, stage = run([ROLE, *texts(text, seed), STOP], seed)
    assert out == data and stage.outcome == "untouched"


@pytest.mark.parametrize("seed", SEEDS)
def test_without_offered_tools_markup_is_text_and_nothing_is_held(seed: int) -> None:
    data, out, _ = run([ROLE, *texts(HERMES, seed), STOP], seed, tools=None)
    assert out == data
    assert_each_event_goes_out_at_once(ChatToolCallRepair(None), sse([ROLE, content("<tool_"), content("call>")]))


# -- rule 2: a closed <think> in content is a decoy ------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_markup_inside_a_closed_think_is_a_decoy(seed: int) -> None:
    text = f"<think>I could write {HERMES} here, but no.</think>The answer is 4."
    data, out, stage = run([ROLE, *texts(text, seed), STOP], seed)
    assert out == data and stage.outcome == "untouched"


@pytest.mark.parametrize("seed", SEEDS)
def test_markup_after_the_closed_think_is_a_call(seed: int) -> None:
    text = f"<think>Let me read the file.</think>{HERMES}"
    _, out, _ = run([ROLE, *texts(text, seed), STOP], seed)
    assert calls_of(out) == READ_A and client_view(out).content == "<think>Let me read the file.</think>"


# -- rule 3: the reasoning field --------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
@pytest.mark.parametrize("finish", [STOP, TOOL_FINISH], ids=["stop", "tool_calls"])
@pytest.mark.parametrize("seed", SEEDS)
def test_markup_last_in_the_reasoning_with_nothing_after_is_a_call(field: str, finish: dict, seed: int) -> None:
    thought = "The user wants a.py. I'll read it.\n" + HERMES + "\n"
    _, out, stage = run([ROLE, *texts(thought, seed, partial(reasoning, field=field)), finish], seed)
    view = client_view(out)
    assert calls_of(out) == READ_A and view.finish_reasons == ["tool_calls"] and not view.errors
    assert reasoning_of(out, field) == thought  # the reasoning already went out, unchanged
    assert "leaked_into_reasoning" in stage.defects
    assert any(c.kind == "leaked_into_reasoning" and "reasoning" in c.path for c in stage.changes)


@pytest.mark.parametrize("seed", SEEDS)
def test_reasoning_markup_followed_by_content_is_a_decoy(seed: int) -> None:
    stream = [ROLE, *texts("Maybe " + HERMES, seed, reasoning), *texts("No tool needed: it is 4.", seed), STOP]
    data, out, stage = run(stream, seed)
    assert out == data and stage.outcome == "untouched"


@pytest.mark.parametrize("seed", SEEDS)
def test_reasoning_markup_followed_by_a_call_is_a_decoy(seed: int) -> None:
    stream = [ROLE, *texts(HERMES, seed, reasoning), call(0, "c1", "grep", '{"pattern": "x"}'), TOOL_FINISH]
    data, out, stage = run(stream, seed)
    assert out == data and calls_of(out) == [("grep", {"pattern": "x"})]


@pytest.mark.parametrize("seed", SEEDS)
def test_reasoning_markup_that_is_not_last_is_a_decoy(seed: int) -> None:
    stream = [ROLE, *texts(HERMES + "\nHmm, no, I already know the answer.", seed, reasoning), STOP]
    data, out, stage = run(stream, seed)
    assert out == data and stage.outcome == "untouched"


def test_reasoning_events_go_out_at_once() -> None:
    """Nothing extra is held for reasoning: the decision waits for the finish."""
    stream = sse([ROLE, *[reasoning(t) for t in small_pieces(HERMES, random.Random(3))]], done=False)
    assert_each_event_goes_out_at_once(ChatToolCallRepair(TOOLS), stream)


# -- rule 4: fences ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_markup_in_a_fenced_block_of_a_format_without_fence_syntax_is_a_decoy(seed: int) -> None:
    text = f"Here is how a call looks:\n```\n{HERMES}\n```\n"
    data, out, stage = run([ROLE, *texts(text, seed), STOP], seed)
    assert out == data and stage.outcome == "untouched"


FENCED = [f for f in REGISTRY.values() if f.fence]


@pytest.mark.parametrize("fmt", FENCED, ids=[f.name for f in FENCED])
def test_a_fence_format_is_a_call_only_last_in_the_turn(fmt: Any) -> None:
    markup = fmt.render([("read", {"path": "a.py"})])
    if not markup.startswith(fmt.openers):  # a format also read bare (xLAM): its fenced form
        markup = f"{fmt.openers[0]}\n{markup}\n```"
    _, out, _ = run([ROLE, content("Let me look.\n" + markup), STOP], tool_format=fmt.name)
    assert calls_of(out) == READ_A
    data, out, _ = run([ROLE, content(markup + "\nThat is how you would call it."), STOP], tool_format=fmt.name)
    assert out == data


# -- rule 5: prose ------------------------------------------------------------------------------------------------
PROSE = [
    "To call a tool, wrap JSON in <tool_call> and </tool_call> tags.",
    'Write `<tool_call>{"name": "read", "arguments": {"path": "a.py"}}</tool_call>` to read.',
    "Use <tool_call> then a name, like <tool_call>read.",
]


@pytest.mark.parametrize("text", PROSE)
@pytest.mark.parametrize("seed", SEEDS)
def test_prose_mentioning_markup_stays_prose(text: str, seed: int) -> None:
    data, out, stage = run([ROLE, *texts(text, seed), STOP], seed)
    assert out == data and stage.outcome == "untouched"


# -- holding ------------------------------------------------------------------------------------------------------
def _feed_all(stage: ChatToolCallRepair, stream: list[dict[str, Any]]) -> list[list[bytes]]:
    events = SSESplitter().feed(sse(stream, done=False))
    return [stage.feed(e) for e in events]


def test_only_text_that_may_start_a_marker_is_held() -> None:
    stage = ChatToolCallRepair(TOOLS)
    outs = _feed_all(stage, [ROLE, content("Sure."), content(" a < b"), content(" and x <"), content("= y")])
    assert [len(o) for o in outs] == [1, 1, 1, 0, 2]  # only "x <" waited, one event


def test_a_marker_split_across_events_is_held_until_it_is_clear() -> None:
    stage = ChatToolCallRepair(TOOLS)
    outs = _feed_all(stage, [ROLE, content("Hi. <tool"), content("_ca"), content("rpet> b")])
    assert [len(o) for o in outs] == [1, 0, 0, 3]


def test_markerless_formats_are_held_only_at_the_start_and_boundedly() -> None:
    stage = ChatToolCallRepair(TOOLS)
    body = "[" + "x" * (registry.ANCHOR_LIMIT + 100)
    outs = _feed_all(stage, [ROLE, *[content(body[i : i + 50]) for i in range(0, len(body), 50)]])
    released = sum(len(o) for o in outs)
    assert released == len(outs)  # all out by the end,
    first_out = next(k for k, o in enumerate(outs) if o and k > 0)
    assert first_out * 50 <= registry.ANCHOR_LIMIT + 50  # and none held past the limit
    stage = ChatToolCallRepair(TOOLS)
    outs = _feed_all(stage, [ROLE, content("Sure."), content(' {"name": "read", "arg'), content("s")])
    assert [len(o) for o in outs] == [1, 1, 1, 1]  # not at the start: nothing held


def test_the_fast_path_checks_bytes_derived_from_every_registered_opener() -> None:
    stage = ChatToolCallRepair(TOOLS)
    _feed_all(stage, [ROLE, content("Plain text first.")])
    assert not stage._interesting(sse([content("hello world, nothing to see")], done=False))
    for fmt in REGISTRY.values():
        for opener in fmt.openers:
            event = sse([content("so " + opener)], done=False)
            assert stage._interesting(event), (fmt.name, opener)
            escaped = sse_ascii(content("so " + opener))
            assert stage._interesting(escaped), (fmt.name, opener, "escaped")


def sse_ascii(obj: dict[str, Any]) -> bytes:
    """A server that escapes `<` and non-ASCII (Go's encoder, ensure_ascii)."""
    return sse_event(obj, ensure_ascii=True).replace(b"<", b"\\u003c").replace(b">", b"\\u003e")


# -- pinning ------------------------------------------------------------------------------------------------------
def _other_format() -> str:
    return next(n for n in sorted(REGISTRY) if n != "hermes" and not REGISTRY[n].anchored)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_pinned_format_is_the_only_one_armed(seed: int) -> None:
    _, out, _ = run([ROLE, *texts(HERMES, seed), STOP], seed, tool_format="hermes")
    assert calls_of(out) == READ_A
    other = _other_format()
    data, out, stage = run([ROLE, *texts(HERMES, seed), STOP], seed, tool_format=other)
    assert out == data  # another registered format's markup passes through, flagged
    flagged = [c for c in stage.changes if c.kind == "unpinned_tool_format"]
    assert flagged and "hermes" in json.dumps(flagged[0].before) + flagged[0].reason
    assert "unpinned_tool_format" in stage.defects


def test_a_pinned_format_reads_its_own_markup() -> None:
    other = REGISTRY[_other_format()]
    markup = other.render([("read", {"path": "a.py"})])
    _, out, _ = run([ROLE, content(markup), STOP], tool_format=other.name)
    assert calls_of(out) == READ_A


def test_an_unknown_format_is_refused_everywhere_with_the_registered_names() -> None:
    with pytest.raises(UnknownFormat, match="hermes"):
        ChatToolCallRepair(TOOLS, tool_format="nope")
    with pytest.raises(UnknownFormat, match="hermes"):
        stage_for("chat", TOOLS, "error", "cap", tool_format="nope")
    config = {"upstreams": {"a": {"base_url": "http://x", "engine": "vllm"}}, "models": {"m": {"tool_format": "nope"}}}
    with pytest.raises(ConfigError, match="hermes") as info:
        from_dict(config)
    assert "models.m.tool_format" in str(info.value)
    config["models"]["m"]["tool_format"] = "hermes"
    assert from_dict(config).models["m"].tool_format == "hermes"


def test_tapfix_run_refuses_an_unknown_tool_format() -> None:
    from tapfix.proxy.cli import main

    result = CliRunner().invoke(main, ["run", "--upstream", "http://127.0.0.1:9", "--tool-format", "nope"])
    assert result.exit_code == 2 and "--tool-format" in result.stderr and "hermes" in result.stderr


def test_the_body_repair_pins_too() -> None:
    body = json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": HERMES}, "finish_reason": "stop"}],
        }
    ).encode()
    repair = body_repair_for("chat")
    assert repair is not None
    out, _, outcome = repair(body, TOOLS)
    assert outcome == "repaired" and json.loads(out)["choices"][0]["message"]["tool_calls"]
    out, changes, outcome = repair(body, TOOLS, tool_format=_other_format())
    assert out == body and any(c.kind == "unpinned_tool_format" for c in changes)


# -- docs ---------------------------------------------------------------------------------------------------------
def test_the_docs_table_lists_every_registered_format() -> None:
    text = DOCS.read_text(encoding="utf-8")
    table = registry.markdown_table(REGISTRY.values())
    assert table in text, "docs/formats.md: regenerate the table (python -m tapfix.proxy.toolcalls.formats)"
    rows = [r for r in table.splitlines()[2:] if r.startswith("|")]
    assert len(rows) == len(REGISTRY) and all(re.search(rf"`{re.escape(n)}`", table) for n in REGISTRY)
    for rule in ("offered", "<think>", "reasoning", "fence", "prose", "ANCHOR_LIMIT", "tool_format"):
        assert rule in text, rule


def test_armed_pinned_holds_one_format() -> None:
    assert armed("hermes").names == ["hermes"] and len(armed().names) == len(REGISTRY)


# -- word-led openers split before their first punctuation ------------------------------------------------
def _word_led() -> list[tuple[Any, str, str]]:
    """(format, opener, text) for every opener that starts with a word or a space (` to=functions.`,
    `Action:`, `functools[`, `function call<|role_sep|>`): the format's rendered markup, from that opener
    on when that alone reads as the call, else whole."""
    out = []
    for fmt in REGISTRY.values():
        for opener in fmt.openers:
            if not (opener[:1].isalnum() or opener[:1] == " "):
                continue
            markup = fmt.render(READ_A)
            at = markup.find(opener)
            for text in (markup[at:], markup) if at >= 0 else ():
                found = armed(fmt.name).find("Let me check.\n" + text, ["read", "grep"], at_start=False)
                if found is not None and found.confirmed:
                    out.append((fmt, opener, text))
                    break
    return out


WORD_LED = _word_led()


def _cuts(opener: str) -> range:
    """Where a delta may end inside the opener before its first punctuation (what a byte check of the
    delta alone cannot see)."""
    first = next((k for k, c in enumerate(opener) if not (c.isalnum() or c in " _")), len(opener))
    return range(1, min(first, len(opener) - 1) + 1)


def test_every_word_led_opener_is_tried() -> None:
    assert {o for _, o, _ in WORD_LED} >= {" to=functions.", "Action:", "functools[", "function call<|role_sep|>"}


@pytest.mark.parametrize(("fmt", "opener", "text"), WORD_LED, ids=[f"{f.name}-{o.strip()}" for f, o, _ in WORD_LED])
@pytest.mark.parametrize("field", ["content", "reasoning_content"])
def test_a_delta_ending_inside_a_word_led_opener_does_not_lose_the_call(
    fmt: Any, opener: str, text: str, field: str
) -> None:
    prose = "Let me check.\n"
    whole = prose + text
    at = whole.find(opener, len(prose) - 1)
    make = content if field == "content" else partial(reasoning, field=field)
    for k in _cuts(opener):
        cut = at + k
        rest = small_pieces(whole[cut:], random.Random(k))
        _, out, stage = run([ROLE, make(whole[:cut]), *[make(t) for t in rest], STOP], k)
        view = client_view(out)
        assert calls_of(out) == READ_A and not view.errors, (opener[:k], view.content, stage.changes)
        assert view.finish_reasons == ["tool_calls"]


def test_a_tail_that_may_start_a_word_led_opener_waits_one_delta_only() -> None:
    stage = ChatToolCallRepair(TOOLS)
    outs = _feed_all(stage, [ROLE, content("Plain text."), content(" It is functi"), content("onal, see.")])
    assert [len(o) for o in outs] == [1, 1, 0, 2]  # "functi" may start `functools[`: held until "onal"
    stage = ChatToolCallRepair(TOOLS)
    outs = _feed_all(stage, [ROLE, content("Plain text."), content(" Actio"), content("nable items.")])
    assert [len(o) for o in outs] == [1, 1, 0, 2]


def test_the_fast_path_sees_a_delta_ending_inside_a_word_led_opener() -> None:
    stage = ChatToolCallRepair(TOOLS)
    _feed_all(stage, [ROLE, content("Plain text first.")])
    for text in ("I call funct", "Now: Actio", "the commentary to", "x function ca"):
        for make in (content, reasoning, partial(reasoning, field="reasoning")):
            assert stage._interesting(sse([make(text)], done=False)), (text, make)
    for text in ("hello world", "nothing to see.", 'a "quoted" word', "ends in a newline\n"):
        assert not stage._interesting(sse([content(text)], done=False)), text


# -- a <think> split across deltas ------------------------------------------------------------------------
def test_markup_inside_a_think_split_across_deltas_stays_text() -> None:
    mistral = ["<think", ">[TOOL", "_", "CA", "LLS", ']execute_bash_code[ARGS]{"code": "uptime"}</think>']
    bash = tool("execute_bash_code", {"code": {"type": "string"}}, ["code"])
    data, out, stage = run([ROLE, *[content(t) for t in mistral], TOOL_FINISH], tools=[bash])
    assert client_view(out).content == "".join(mistral)
    data, out, stage = run([ROLE, *[content(t) for t in mistral], STOP], tools=[bash])
    assert out == data and stage.outcome == "untouched"


THINKABLE = [f for f in REGISTRY.values() if not f.anchored]


@pytest.mark.parametrize("fmt", THINKABLE, ids=[f.name for f in THINKABLE])
def test_a_think_opened_in_an_earlier_delta_keeps_its_markup_a_decoy(fmt: Any) -> None:
    text = "<think>" + fmt.render(READ_A) + "</think>\nNo call needed."
    for k in range(1, len("<think>") + 1):
        stream = [ROLE, content(text[:k]), *[content(t) for t in small_pieces(text[k:], random.Random(k))], STOP]
        data, out, stage = run(stream, k)
        assert out == data, (fmt.name, text[:k], client_view(out).content)


# -- confirmed markup that lost a required argument -------------------------------------------------------
def _lacking_required() -> list[tuple[Any, str]]:
    out = []
    for fmt in REGISTRY.values():
        try:
            markup = fmt.render([("read", {})])
        except ValueError:
            continue
        found = armed(fmt.name).find(markup, ["read", "grep"], at_start=True)
        if found is not None and found.confirmed:
            out.append((fmt, markup))
    return out


LACKING = _lacking_required()


@pytest.mark.parametrize(("fmt", "markup"), LACKING, ids=[f.name for f, _ in LACKING])
def test_confirmed_markup_lacking_a_required_argument_is_the_retryable_error(fmt: Any, markup: str) -> None:
    """The format reads it and names an offered tool, but `read` requires `path`: a call that lost
    information. Passing it as text would drop the call silently; it is the retryable error."""
    _, out, stage = run([ROLE, *texts(markup, 0), STOP], tool_format=fmt.name)
    view = client_view(out)
    assert view.errors and not view.calls and stage.outcome == "unrecoverable", view.content
    assert any(c.kind == "missing_fragment" for c in stage.changes)
    body = _body({"role": "assistant", "content": markup})
    repair = body_repair_for("chat")
    assert repair is not None
    out_body, changes, outcome = repair(body, TOOLS, tool_format=fmt.name)
    assert outcome == "unrecoverable" and "error" in json.loads(out_body)
    assert any(c.kind == "missing_fragment" for c in changes)


def test_every_format_that_can_say_an_empty_call_is_tried() -> None:
    assert len(LACKING) >= len(REGISTRY) // 2


# -- the non-streamed body: reasoning ------------------------------------------------------------------------
def _body(message: dict[str, Any], finish: str = "stop") -> bytes:
    choice = {"index": 0, "message": message, "finish_reason": finish}
    return json.dumps({"id": "x", "object": "chat.completion", "choices": [choice]}).encode()


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
@pytest.mark.parametrize("blank", [None, ""])
def test_the_body_recovers_markup_last_in_the_reasoning(field: str, blank: str | None) -> None:
    thought = "The user wants a.py.\n" + HERMES + "\n"
    body = _body({"role": "assistant", "content": blank, field: thought})
    repair = body_repair_for("chat")
    assert repair is not None
    out, changes, outcome = repair(body, TOOLS)
    choice = json.loads(out)["choices"][0]
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]]
    assert outcome == "repaired" and calls == READ_A and choice["finish_reason"] == "tool_calls"
    assert choice["message"][field] == thought
    assert any(c.kind == "leaked_into_reasoning" and field in c.path for c in changes)


@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "content": "It is 4.", "reasoning_content": HERMES},
        {"role": "assistant", "content": None, "reasoning_content": HERMES + "\nNo, I know it."},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": HERMES,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": '{"pattern": "x"}'}}
            ],
        },
    ],
    ids=["content-after", "not-last", "a-call-after"],
)
def test_the_body_keeps_reasoning_decoys(message: dict[str, Any]) -> None:
    body = _body(message, "tool_calls" if "tool_calls" in message else "stop")
    repair = body_repair_for("chat")
    assert repair is not None
    out, _, outcome = repair(body, TOOLS)
    assert out == body and outcome == "untouched"
