"""Reasoning replay (issue 36): which resent turn gets which recorded reasoning, where it goes, and that nothing
else of the client's bytes changes."""

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tapfix.proxy.assemble import Assembled
from tapfix.proxy.config.file import from_dict
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.request.policy import RequestPolicy
from tapfix.proxy.store.replay_turns import RecentTurns, store_lookup

from tests.support.builders import message_tool_call
from tests.support.depth import examples
from tests.support.stores import BACKENDS, make_backend

CHAT = "/v1/chat/completions"
AGENT = "opencode/1.0"
ME = "127.0.0.1"
REASONING = 'The user wants the file read.\nI\'ll call read with path a.py — «ü» \\ "quoted".'
CALL = {"id": "functions.read:0", "name": "read", "arguments": '{"path": "a.py"}'}
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]


def _turn1(**extra):
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "read a.py"},
        ],
        "tools": TOOLS,
        **extra,
    }


def _turn2(assistant=None, **extra):
    """Turn 1's conversation, the reply as the client resends it (no reasoning), the tool's result."""
    body = _turn1(**extra)
    call = message_tool_call('{"path":"a.py"}', id=CALL["id"], name="read")
    sent = assistant or {"role": "assistant", "content": None, "tool_calls": [call]}
    body["messages"] = [*body["messages"], sent, {"role": "tool", "tool_call_id": CALL["id"], "content": "print(1)"}]
    return body


def _answered(turns, body, addr=ME, agent=AGENT, headers=(), reasoning=REASONING, content="", calls=(CALL,)):
    ex = Exchange(
        path=CHAT,
        request=orjson.dumps(body),
        status=200,
        client_addr=addr,
        user_agent=agent,
        request_headers=[("user-agent", agent), *headers],
    )
    return turns.note(ex, Assembled(content=content, reasoning=reasoning, tool_calls=[dict(c) for c in calls]))


def _policy(engine="vllm", turns=None, **model):
    policy = RequestPolicy(
        from_dict(
            {
                "upstreams": {"u": {"base_url": "http://127.0.0.1:9/v1", "engine": engine}},
                "models": {"m": {"upstream": "u", "replay_reasoning": True, **model}},
            }
        )
    )
    policy.turns = turns
    return policy


def _send(policy, body, addr=ME, agent=AGENT, headers=None, dumps=orjson.dumps):
    raw = body if isinstance(body, bytes) else dumps(body)
    return policy.apply(CHAT, raw, {"user-agent": agent, **(headers or {})}, addr), raw


@pytest.mark.parametrize(
    ("engine", "field"), [("vllm", "reasoning"), ("llamacpp", "reasoning_content"), ("sglang", "reasoning_content")]
)
def test_turn_2_gets_turn_1s_reasoning_byte_for_byte_where_the_engine_reads_it(engine, field):
    turns = RecentTurns()
    first = _answered(turns, _turn1())
    out, raw = _send(_policy(engine, turns), _turn2())
    sent = orjson.loads(out.body)
    assert sent["messages"][2][field] == REASONING
    assert sent == {
        **_turn2(),
        "messages": [*_turn2()["messages"][:2], {**_turn2()["messages"][2], field: REASONING}, _turn2()["messages"][3]],
    }
    (change,) = [c for c in out.changes if c.kind == "replay_reasoning"]
    assert (change.stage, change.path, change.after) == ("request", f"$.messages[2].{field}", REASONING)
    assert first is not None and first.capture_id in change.reason
    # Only the message changed: the bytes before it and after it are the client's.
    start = raw.index(b'{"role":"assistant"')
    assert out.body[:start] == raw[:start]
    assert out.body.endswith(raw[raw.index(b',{"role":"tool"') :])
    assert turns.replayed == 1 and turns.missed == 0


def test_think_places_it_inline_at_the_start_of_the_content():
    turns = RecentTurns()
    _answered(turns, _turn1(), content="Reading it.", calls=(CALL,))
    assistant = {**_turn2()["messages"][2], "content": "Reading it."}
    out, _ = _send(_policy("vllm", turns, replay_reasoning_as="think"), _turn2(assistant))
    sent = orjson.loads(out.body)["messages"][2]
    assert sent["content"] == "<think>\n" + REASONING + "\n</think>\n\nReading it."
    assert "reasoning" not in sent


def test_a_second_client_sending_the_same_ids_and_content_never_gets_the_first_clients_reasoning():
    turns = RecentTurns()
    _answered(turns, _turn1())
    policy = _policy("vllm", turns)
    for addr, agent in (("10.0.0.7", AGENT), (ME, "omp/2.0")):
        out, raw = _send(policy, _turn2(), addr=addr, agent=agent)
        assert out.body == raw
        assert REASONING.encode() not in out.body
        assert not [c for c in out.changes if c.kind == "replay_reasoning"]
    assert turns.missed == 2 and turns.replayed == 0


def test_a_named_session_must_be_the_same():
    turns = RecentTurns()
    _answered(turns, _turn1(), headers=[("x-session-id", "s1")])
    policy = _policy("vllm", turns)
    out, raw = _send(policy, _turn2(), headers={"x-session-id": "s2"})
    assert out.body == raw
    out, raw = _send(policy, _turn2())  # no session named: not the named session's turn either
    assert out.body == raw
    out, _ = _send(policy, _turn2(), headers={"x-session-id": "s1"})
    assert orjson.loads(out.body)["messages"][2]["reasoning"] == REASONING


@pytest.mark.parametrize(
    "call",
    [
        {"id": CALL["id"], "type": "function", "function": {"name": "read", "arguments": '{"path":"b.py"}'}},
        {"id": "functions.read:1", "type": "function", "function": {"name": "read", "arguments": '{"path":"a.py"}'}},
        {"id": CALL["id"], "type": "function", "function": {"name": "write", "arguments": '{"path":"a.py"}'}},
    ],
    ids=["arguments", "id", "name"],
)
def test_a_message_that_is_not_what_tapfix_delivered_gets_nothing(call):
    turns = RecentTurns()
    _answered(turns, _turn1())
    out, raw = _send(_policy("vllm", turns), _turn2({"role": "assistant", "content": None, "tool_calls": [call]}))
    assert out.body == raw


def test_the_same_ids_in_another_conversation_get_nothing():
    """Kimi's ids are `functions.read:0` in every conversation: the conversation before must match too."""
    turns = RecentTurns()
    _answered(turns, _turn1())
    other = _turn2()
    other["messages"][1] = {"role": "user", "content": "read a.py please"}
    out, raw = _send(_policy("vllm", turns), other)
    assert out.body == raw


def test_arguments_compare_parsed_key_order_and_spacing_dont_count():
    turns = RecentTurns()
    _answered(turns, _turn1(), calls=({**CALL, "arguments": '{"path": "a.py", "n": 1}'},))
    call = {"id": CALL["id"], "type": "function", "function": {"name": "read", "arguments": '{ "n":1,"path":"a.py" }'}}
    out, _ = _send(_policy("vllm", turns), _turn2({"role": "assistant", "content": "", "tool_calls": [call]}))
    assert orjson.loads(out.body)["messages"][2]["reasoning"] == REASONING


def test_reasoning_the_client_kept_stays_and_a_field_the_engine_doesnt_read_is_moved():
    turns = RecentTurns()
    _answered(turns, _turn1(), reasoning="recorded")
    kept = {**_turn2()["messages"][2], "reasoning": "the client's own"}
    out, raw = _send(_policy("vllm", turns), _turn2(kept))
    assert out.body == raw
    moved = {**_turn2()["messages"][2], "reasoning_content": "the client's own"}
    out, _ = _send(_policy("vllm", turns), _turn2(moved))
    message = orjson.loads(out.body)["messages"][2]
    assert message["reasoning"] == "the client's own" and "reasoning_content" not in message
    assert [c.kind for c in out.changes] == ["replay_reasoning"]
    out, raw = _send(_policy("llamacpp", turns), _turn2(moved))  # llama.cpp reads that one: stays
    assert out.body == raw


def test_off_unless_the_model_asks():
    turns = RecentTurns()
    _answered(turns, _turn1())
    policy = _policy("vllm", turns, replay_reasoning=False)
    out, raw = _send(policy, _turn2())
    assert out.body == raw and not out.replay_reasoning


@pytest.mark.parametrize("engine", ["openai", "anthropic"])
def test_a_route_to_a_hosted_api_never_gets_reasoning_back(engine):
    turns = RecentTurns()
    _answered(turns, _turn1())
    out, raw = _send(_policy(engine, turns), _turn2())
    assert out.body == raw and not out.replay_reasoning and turns.missed == 0


def test_a_turn_without_reasoning_is_not_remembered_and_counts_as_missed():
    turns = RecentTurns()
    assert _answered(turns, _turn1(), reasoning="") is None
    metadata_only = Exchange(path=CHAT, request=orjson.dumps(_turn1()), status=200, client_addr=ME, user_agent=AGENT)
    metadata_only.store_bodies = False
    assert turns.note(metadata_only, Assembled(reasoning=REASONING, tool_calls=[dict(CALL)])) is None
    out, raw = _send(_policy("vllm", turns), _turn2())
    assert out.body == raw and turns.missed == 1


def test_messages_surface_gets_a_thinking_block_before_the_text_and_tool_use():
    turns = RecentTurns()
    body1 = {"model": "m", "system": "be brief", "messages": [{"role": "user", "content": "read a.py"}]}
    ex = Exchange(path="/v1/messages", request=orjson.dumps(body1), status=200, client_addr=ME, user_agent=AGENT)
    call = {"id": "toolu_1", "name": "read", "input": {"path": "a.py"}}
    turns.note(ex, Assembled(content="Reading.", reasoning=REASONING, tool_calls=[call]))
    resent = {
        "role": "assistant",
        "content": [{"type": "text", "text": "Reading."}, {"type": "tool_use", **call}],
    }
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "print(1)"}]}
    body2 = {**body1, "messages": [*body1["messages"], resent, result]}
    out = _policy("llamacpp", turns).apply("/v1/messages", orjson.dumps(body2), {"user-agent": AGENT}, ME)
    blocks = orjson.loads(out.body)["messages"][1]["content"]
    assert blocks[0] == {"type": "thinking", "thinking": REASONING, "signature": ""}
    assert blocks[1:] == resent["content"]


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path):
    return make_backend(request, tmp_path)


def test_turns_the_memory_no_longer_holds_come_from_the_store(store):
    """A restart, or another tapfix of a PostgreSQL fleet: the turn is read from the store, on each backend."""
    call = {"id": CALL["id"], "type": "function", "function": {"name": "read", "arguments": CALL["arguments"]}}
    message = {"role": "assistant", "content": None, "reasoning": REASONING, "tool_calls": [call]}
    answer = {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}
    ex = Exchange(
        path=CHAT,
        method="POST",
        request=orjson.dumps(_turn1()),
        status=200,
        client_addr=ME,
        user_agent=AGENT,
        content_type="application/json",
        response=orjson.dumps(answer),
    )
    writer = store.writer()
    writer.submit(ex)
    writer.close()
    assert writer.stats.failures == 0, writer.stats.last_error
    turns = RecentTurns(lookup=store_lookup(store.store().reader))
    out, _ = _send(_policy("vllm", turns), _turn2())
    assert orjson.loads(out.body)["messages"][2]["reasoning"] == REASONING
    (change,) = out.changes
    assert ex.id in change.reason
    out, raw = _send(_policy("vllm", turns), _turn2(), addr="10.0.0.7")  # the store's turns are no one else's
    assert out.body == raw
    out, raw = _send(_policy("vllm", turns), _turn2(), headers={"x-session-id": "s1"})  # nor another session's
    assert out.body == raw


def test_the_memory_is_bounded():
    turns = RecentTurns(max_turns=3)
    for i in range(10):
        body = _turn1()
        body["messages"][1]["content"] = f"read {i}.py"
        _answered(turns, body)
    for _ in range(40):  # one conversation answered again and again (twenty runs of one script)
        _answered(turns, _turn1())
    assert turns.health()["held"] == 3


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@settings(max_examples=examples(60), deadline=None)
@given(reasoning=st.text(min_size=1, max_size=200), user=_text, indent=st.sampled_from([None, 2]), ascii=st.booleans())
def test_any_reasoning_goes_back_exactly_and_only_the_message_changes(reasoning, user, indent, ascii):
    turns = RecentTurns()
    first = _turn1()
    first["messages"][1]["content"] = user
    _answered(turns, first, reasoning=reasoning)
    second = _turn2()
    second["messages"][1]["content"] = user

    def dumps(o):
        return json.dumps(o, indent=indent, ensure_ascii=ascii).encode()

    out, raw = _send(_policy("vllm", turns), second, dumps=dumps)
    sent = json.loads(out.body)
    assert sent["messages"][2].pop("reasoning") == reasoning
    assert sent == second
    assert "request_reserialized" not in out.flags
    cut = raw.index(b'"tool_calls"')
    tail = raw.rindex(b"{", 0, raw.index(b'"tool_call_id"'))  # the tool's message and all after it
    assert out.body[:cut] == raw[:cut]
    assert out.body.endswith(raw[tail:])


RESPONSES = "/v1/responses"
FIRST_INPUT = [{"role": "user", "content": "read a.py"}]


def _responses_turn2(call_id="call_1", arguments='{"path":"a.py"}'):
    call = {"type": "function_call", "id": "fc_1", "call_id": call_id, "name": "read", "arguments": arguments}
    output = {"type": "function_call_output", "call_id": call_id, "output": "print(1)"}
    return {"model": "m", "instructions": "You are a coding agent.", "input": [*FIRST_INPUT, call, output]}


def _responses_answered(turns):
    body = {"model": "m", "instructions": "You are a coding agent.", "input": FIRST_INPUT}
    ex = Exchange(path=RESPONSES, request=orjson.dumps(body), status=200, client_addr=ME, user_agent=AGENT)
    call = {"id": "call_1", "name": "read", "arguments": '{"path": "a.py"}'}
    return turns.note(ex, Assembled(content="", reasoning=REASONING, tool_calls=[call]))


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_responses_gets_a_reasoning_item_before_the_function_call(engine):
    turns = RecentTurns()
    first = _responses_answered(turns)
    body = _responses_turn2()
    raw = json.dumps(body, indent=2).encode()
    out = _policy(engine, turns).apply(RESPONSES, raw, {"user-agent": AGENT}, ME)
    sent = json.loads(out.body)
    item = {"type": "reasoning", "id": f"rs_{first.capture_id}", "summary": [], "content": []}
    item["content"] = [{"type": "reasoning_text", "text": REASONING}]
    assert sent["input"] == [body["input"][0], item, *body["input"][1:]]
    assert {k: v for k, v in sent.items() if k != "input"} == {k: v for k, v in body.items() if k != "input"}
    (change,) = out.changes
    assert (change.kind, change.path, change.after) == ("replay_reasoning", "$.input[1]", REASONING)
    cut = raw.index(b'"type": "function_call"')
    assert out.body.endswith(raw[raw.rindex(b"{", 0, cut) :])  # the client's items from the call on, as sent


@pytest.mark.parametrize(
    ("engine", "body"),
    [
        ("sglang", _responses_turn2()),
        ("vllm", _responses_turn2(call_id="call_2")),
        ("vllm", _responses_turn2(arguments="{}")),
    ],
    ids=["engine-takes-no-item", "other-id", "other-arguments"],
)
def test_responses_left_alone(engine, body):
    turns = RecentTurns()
    _responses_answered(turns)
    raw = orjson.dumps(body)
    assert _policy(engine, turns).apply(RESPONSES, raw, {"user-agent": AGENT}, ME).body == raw


def test_claude_codes_billing_line_changing_between_turns_doesnt_lose_the_turn():
    """Claude Code versions that put `cch` in the billing block change it on every request; the block is no
    part of the conversation a turn is found by (and a local engine doesn't get it: billing_line.py)."""
    turns = RecentTurns()
    line = "x-anthropic-billing-header: cc_version=2.1.332.4e6; cc_entrypoint=sdk-cli; cch={};"
    prompt = {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}
    first = [{"role": "user", "content": "read a.py"}]
    body1 = {"model": "m", "system": [{"type": "text", "text": line.format("1a2b3")}, prompt], "messages": first}
    ex = Exchange(path="/v1/messages", request=orjson.dumps(body1), status=200, client_addr=ME, user_agent=AGENT)
    call = {"id": "toolu_1", "name": "read", "input": {"path": "a.py"}}
    turns.note(ex, Assembled(content="", reasoning=REASONING, tool_calls=[call]))
    resent = {"role": "assistant", "content": [{"type": "tool_use", **call}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "1"}]}
    body2 = {**body1, "messages": [*first, resent, result]}
    body2["system"] = [{"type": "text", "text": line.format("9f8e7")}, prompt]
    out = _policy("llamacpp", turns).apply("/v1/messages", orjson.dumps(body2), {"user-agent": AGENT}, ME)
    sent = orjson.loads(out.body)
    assert sent["messages"][1]["content"][0] == {"type": "thinking", "thinking": REASONING, "signature": ""}
    assert sent["system"] == [prompt]
    assert [c.kind for c in out.changes] == ["replay_reasoning", "strip_billing_line"]
