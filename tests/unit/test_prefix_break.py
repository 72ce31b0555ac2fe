"""Where a turn's prompt stopped extending the previous one: the point, its byte offset, the cause, the thread."""

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tapfix.proxy.jsonsplice import value_span
from tapfix.proxy.request.prefix_break import extends, find_break, previous_in_thread, prompt_of, string_offset

from tests.support.depth import examples

LINE = "x-anthropic-billing-header: cc_version=2.1.332.4e6; cc_entrypoint=sdk-cli; cch=1a2b3;"
PROMPT = "You are Claude Code, Anthropic's official CLI for Claude."
TOOLS = [
    {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}},
    {"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}},
]


def claude_code(line, messages, *, prompt=PROMPT, tools=TOOLS, cache_last=True):
    """A Claude-Code-shaped Messages body: its billing block, its prompt, `cache_control` on the last turn."""
    system = ([{"type": "text", "text": line}] if line else []) + [
        {"type": "text", "text": prompt, "cache_control": {"type": "ephemeral"}}
    ]
    messages = [dict(m) for m in messages]
    if cache_last and messages:
        last = messages[-1]
        text = last["content"] if isinstance(last["content"], str) else last["content"][0]["text"]
        last["content"] = [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]
    return {"model": "q", "max_tokens": 32000, "system": system, "tools": tools, "messages": messages, "stream": True}


TURN1 = [{"role": "user", "content": "fix the bug"}]
TURN2 = [
    *TURN1,
    {"role": "assistant", "content": [{"type": "text", "text": "Looking."}]},
    {"role": "user", "content": "go on"},
]


def brk(previous, new, surface="messages", dumps=orjson.dumps):
    body = dumps(new)
    return find_break(prompt_of(previous, surface), prompt_of(new, surface), body), body


def test_a_turn_that_extends_the_last_has_no_break_though_cache_control_moved_and_sampling_changed():
    new = claude_code(LINE, TURN2) | {"temperature": 0.3, "metadata": {"user_id": "x"}, "stream": False}
    found, _ = brk(claude_code(LINE, TURN1), new)
    assert found is None
    assert extends(prompt_of(claude_code(LINE, TURN1), "messages"), prompt_of(new, "messages"))


def test_a_changed_billing_line_is_the_break_at_its_byte():
    found, body = brk(claude_code(LINE, TURN1), claude_code(LINE.replace("1a2b3", "9f9f9"), TURN2))
    assert (found.path, found.cause) == ("$.system[0].text", "billing_line")
    assert body[found.offset : found.offset + 5] == b"9f9f9"
    assert "1a2b3" in found.old and "9f9f9" in found.new


def test_without_the_billing_line_the_same_turns_extend():
    assert brk(claude_code(None, TURN1), claude_code(None, TURN2))[0] is None


def test_a_date_at_the_front_of_the_system_prompt_is_a_timestamp():
    old = claude_code(None, TURN1, prompt="Today is 2026-12-06.\n" + PROMPT)
    found, body = brk(old, claude_code(None, TURN2, prompt="Today is 2026-12-07.\n" + PROMPT))
    assert (found.path, found.cause) == ("$.system[0].text", "timestamp")
    assert body[found.offset : found.offset + 1] == b"7"


def test_an_edited_system_prompt():
    found, body = brk(claude_code(None, TURN1), claude_code(None, TURN2, prompt=PROMPT + " Be brief."))
    assert (found.path, found.cause) == ("$.system[0].text", "system_edited")
    assert body[found.offset : found.offset + 9] == b" Be brief"


def test_reordered_and_changed_tools():
    found, _ = brk(claude_code(None, TURN1), claude_code(None, TURN2, tools=TOOLS[::-1]))
    assert (found.path, found.cause) == ("$.tools[0].name", "tools_reordered")
    edited = [TOOLS[0], {**TOOLS[1], "description": "Read any file"}]
    found, _ = brk(claude_code(None, TURN1), claude_code(None, TURN2, tools=edited))
    assert (found.path, found.cause) == ("$.tools[1].description", "tools_changed")
    assert "Read" in found.reason
    found, _ = brk(claude_code(None, TURN1), claude_code(None, TURN2, tools=TOOLS[:1]))
    assert found.cause == "tools_changed" and "removed: Read" in found.reason


def test_a_rewritten_earlier_message_and_a_compacted_history():
    turn3 = [*TURN2, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "thanks"}]
    rewritten = [{"role": "user", "content": "fix the other bug"}, *turn3[1:]]
    found, _ = brk(claude_code(None, TURN2), claude_code(None, rewritten))
    assert (found.path, found.cause) == ("$.messages[0].content", "message_rewritten")
    compacted = [{"role": "user", "content": "Summary of the conversation so far: ..."}]
    found, _ = brk(claude_code(None, turn3), claude_code(None, compacted))
    assert (found.path, found.cause) == ("$.messages[0].content", "compaction")
    assert "5 to 1" in found.reason


def test_chat_surface_system_message_and_prompt_cache_key():
    chat1 = {"model": "q", "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}]}
    chat2 = {**chat1, "messages": [*chat1["messages"], {"role": "assistant", "content": "hey"}]}
    assert brk(chat1, chat2, "chat")[0] is None
    edited = {**chat2, "messages": [{"role": "system", "content": "Be kind."}, *chat2["messages"][1:]]}
    found, _ = brk(chat1, edited, "chat")
    assert (found.path, found.cause) == ("$.messages[0].content", "system_edited")
    keyed = {**chat2, "prompt_cache_key": "b"}
    found, body = brk({**chat1, "prompt_cache_key": "a"}, keyed, "chat")
    assert (found.path, found.cause) == ("$.prompt_cache_key", "prompt_cache_key")
    assert body[found.offset : found.offset + 3] == b'"b"'
    found, _ = brk(chat1, {**chat2, "chat_template_kwargs": {"enable_thinking": False}}, "chat")
    assert found.cause == "template_settings"


def test_only_the_part_of_a_setting_the_template_reads_counts():
    thinking = claude_code(None, TURN1) | {"thinking": {"type": "enabled", "budget_tokens": 4000}}
    more = claude_code(None, TURN2) | {"thinking": {"type": "enabled", "budget_tokens": 31999}}
    assert brk(thinking, more)[0] is None
    found, _ = brk(thinking, more | {"thinking": {"type": "disabled"}})
    assert (found.path, found.cause) == ("$.thinking", "template_settings")
    r1 = {"model": "q", "input": "hi", "reasoning": {"effort": "low", "summary": "auto"}}
    assert brk(r1, {**r1, "reasoning": {"effort": "low"}}, "responses")[0] is None
    assert brk(r1, {**r1, "reasoning": {"effort": "high"}}, "responses")[0].cause == "template_settings"


def test_responses_surface_instructions_and_input():
    r1 = {"model": "q", "instructions": "Now: 12:01. Be terse.", "input": [{"role": "user", "content": "hi"}]}
    r2 = {**r1, "input": [*r1["input"], {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]}
    assert brk(r1, r2, "responses")[0] is None
    found, _ = brk(r1, {**r2, "instructions": "Now: 12:02. Be terse."}, "responses")
    assert (found.path, found.cause) == ("$.instructions", "timestamp")


def test_the_offset_counts_escapes_and_multibyte_characters():
    text = 'é"\\\n😀 x'
    body = json.dumps({"a": text}, ensure_ascii=True).encode()
    start = value_span(body, ("a",))[0]
    for k in range(len(text)):
        decoded = json.loads(b'"' + body[start + string_offset(body, start, k) : -1])
        assert decoded == text[k:]
    body = json.dumps({"a": text}, ensure_ascii=False).encode()
    start = value_span(body, ("a",))[0]
    assert json.loads(b'"' + body[start + string_offset(body, start, 5) : -1]) == text[5:]


def test_the_thread_is_the_request_sharing_the_longest_prefix_not_the_latest():
    main1 = prompt_of(claude_code(LINE, TURN1), "messages")
    sub = prompt_of(
        claude_code(LINE, [{"role": "user", "content": "search"}], prompt="You are a subagent."), "messages"
    )
    main2 = claude_code(LINE.replace("1a2b3", "00000"), TURN2)
    found = previous_in_thread(prompt_of(main2, "messages"), [("main1", main1.light()), ("sub", sub.light())])
    assert found[0] == "main1"
    # A subagent's first request shares only the billing line with the main agent: a thread of its own.
    assert previous_in_thread(sub, [("main1", main1.light())]) is None


def test_a_turn_whose_front_changed_still_finds_its_thread_by_its_conversation():
    old = prompt_of(claude_code(None, TURN1, prompt="Today is Monday."), "messages")
    new = prompt_of(claude_code(None, TURN2, prompt="Today is Tuesday."), "messages")
    assert previous_in_thread(new, [("a", old.light())])[0] == "a"
    # A sibling with the same first message and no more (a side request) is no turn of it.
    assert previous_in_thread(old, [("b", new.light())]) is None


# Properties: an extension never breaks; a change at a random point is found at that point.
_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=30)
_message = st.builds(lambda role, text: {"role": role, "content": text}, st.sampled_from(["user", "assistant"]), _text)
_dumps = st.sampled_from([orjson.dumps, lambda o: json.dumps(o, indent=1, ensure_ascii=True).encode()])


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(_message, min_size=1, max_size=6), st.lists(_message, max_size=4), _text, _dumps)
def test_property_a_request_that_extends_the_previous_never_breaks(history, more, prompt, dumps):
    old = claude_code(LINE, history, prompt=prompt)
    new = claude_code(LINE, history + more, prompt=prompt) | {"temperature": 0.5}
    assert brk(old, new, dumps=dumps)[0] is None


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(_message, min_size=1, max_size=6), st.data(), _dumps)
def test_property_a_change_at_a_random_point_is_found_there(history, data, dumps):
    which = data.draw(st.integers(0, len(history) - 1))
    text = history[which]["content"]
    at = data.draw(st.integers(0, len(text)))
    insert = data.draw(_text)
    changed = [dict(m) for m in history]
    changed[which]["content"] = text[:at] + insert + text[at:]
    if changed[which]["content"] == text:
        return
    old, new = claude_code(None, history, cache_last=False), claude_code(None, changed, cache_last=False)
    found, body = brk(old, new, dumps=dumps)
    assert found.path == f"$.messages[{which}].content"
    common = next((k for k, (a, b) in enumerate(zip(text, changed[which]["content"], strict=False)) if a != b), None)
    common = min(len(text), len(changed[which]["content"])) if common is None else common
    start = value_span(body, ("messages", which, "content"))[0]
    assert found.offset == start + string_offset(body, start, common)
    assert (
        json.loads(b'"' + body[found.offset : value_span(body, ("messages", which, "content"))[1]])
        == (changed[which]["content"][common:])
    )


@pytest.mark.parametrize("surface", ["completions", None])
def test_other_surfaces_have_no_prompt_to_compare(surface):
    assert prompt_of({"prompt": "hi"}, surface) is None


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["role", "content", "type", "text", "cache_control", "name"]), inner, max_size=3
        )
    ),
    max_leaves=12,
)


@settings(max_examples=examples(200), deadline=None)
@given(
    st.sampled_from(["chat", "responses", "messages"]),
    st.dictionaries(
        st.sampled_from(
            ["system", "instructions", "messages", "input", "tools", "prompt_cache_key", "reasoning", "thinking"]
        ),
        _json,
    ),
    st.dictionaries(
        st.sampled_from(
            ["system", "instructions", "messages", "input", "tools", "prompt_cache_key", "reasoning", "thinking"]
        ),
        _json,
    ),
    _dumps,
)
def test_property_any_json_compares_without_raising(surface, old, new, dumps):
    """Whatever two requests hold, the comparison answers (a break or none) and its offset is in the body."""
    body = dumps(new)
    found = find_break(prompt_of(old, surface), prompt_of(new, surface), body)
    if found is not None:
        assert 0 <= found.offset <= len(body) and found.path.startswith("$")
