"""Reasoning replay (issue 36) with the real agents: opencode and omp through `tapfix run --replay-reasoning
--engine E` in front of a mock that answers turn 1 with reasoning and a write call, as vLLM streams it
(reasoning in `reasoning`), and turn 2, after the tool result, with its usual text.

Neither agent drops the reasoning on Chat Completions: each sends turn 1's reasoning back itself, byte for
byte, opencode as `reasoning_content` although it arrived in `reasoning`, omp as `reasoning`. So what
tapfix does for them is the "kept" branch of docs/request-side.md "Reasoning replay": reasoning kept in the
field the engine reads is left as sent; kept in the other one, it is moved to the engine's field (vLLM reads
`reasoning`, llama.cpp `reasoning_content`), recorded as a `replay_reasoning` change with the old path as
`before`. Without the flag the upstream gets the client's bytes.
"""

from __future__ import annotations

import json
from functools import partial

import pytest

from tests.e2e.agents import AGENTS, GREETING, PROMPT, RUN_TIMEOUT, Sandbox, check_run, run_agent, turn_requests
from tests.support.builders import chat_chunk, tool_call_delta
from tests.support.stage_io import client_view

pytestmark = [pytest.mark.agents, pytest.mark.e2e]

# Unicode, a blank line inside and a trailing newline: what an agent that trimmed or re-encoded would change.
REASONING = "The user wants hello.txt.\n\nI'll write it with the write tool — «grüße» ✓, no shell.\n"
AGENT_KW = {"opencode": {"reasoning": True, "variant": "high"}, "omp": {"reasoning": True, "thinking": "high"}}
KEPT_IN = {"opencode": "reasoning_content", "omp": "reasoning"}  # where each agent sends the reasoning back
ENGINE_FIELD = {"vllm": "reasoning", "llamacpp": "reasoning_content"}  # the field each engine reads
OTHER = {"reasoning": "reasoning_content", "reasoning_content": "reasoning"}
# The agents' write tools: opencode `{filePath, content}`, omp `{i, path, content}`.
WRITE_ARGS = {
    "opencode": {"filePath": "hello.txt", "content": GREETING},
    "omp": {"i": "Create hello.txt", "path": "hello.txt", "content": GREETING},
}


chunk = partial(chat_chunk, id="chatcmpl-replay1", created=1787270400, model="fake-model")


def scenario(agent: str) -> dict:
    """Turn 1 (the prompt last, tools offered): REASONING in three pieces, then the write call in
    fragments. Turn 2 (a tool result last) and opencode's title request (no tools): the mock's own answers."""
    args = json.dumps(WRITE_ARGS[agent])
    stream = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning": REASONING[:20]}),
        chunk({"reasoning": REASONING[20:50]}),
        chunk({"reasoning": REASONING[50:]}),
        chunk({"tool_calls": [tool_call_delta(0, "chatcmpl-tool-replay1", "write", "")]}),
        chunk({"tool_calls": [tool_call_delta(0, arguments=args[:15])]}),
        chunk({"tool_calls": [tool_call_delta(0, arguments=args[15:])]}),
        chunk({}, "tool_calls"),
    ]
    rule = {"when": {"last_role": "user", "has_tools": True}, "do": "serve_case", "case": {"stream": stream}}
    return {"description": f"turn 1 of {agent}: reasoning, then a write call", "rules": [rule]}


def delivered_reasoning(sse: bytes) -> str:
    """The reasoning a stream gave the client, joined (whichever field carried it)."""
    return "".join(
        (choice.get("delta") or {}).get(key) or ""
        for chunk in client_view(sse).chunks
        for choice in chunk.get("choices") or []
        for key in ("reasoning", "reasoning_content")
    )


def run_turns(agent, stack, tmp_path, proxy_args):
    """One agent run against the scenario; its two turns (row, client request body), the proxy stopped."""
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario(agent)))
    s = stack(mock_args=["--scenario", str(path)], proxy_args=proxy_args)
    run = run_agent(agent, Sandbox(tmp_path, agent), s.base_url, PROMPT, timeout=RUN_TIMEOUT, **AGENT_KW[agent])
    check_run(run, s)
    assert run.file("hello.txt").read_text() == GREETING
    s.stop_proxy()
    turns = turn_requests(s)
    assert [r["finish_reason"] for r, _ in turns] == ["tool_calls", "stop"], s.describe()
    # tapfix recorded turn 1's reasoning as the agent got it: the scenario's, byte for byte.
    assert delivered_reasoning(s.store.body(turns[0][0]["id"], "client_response")) == REASONING
    return s, turns


def resent_turn(body: dict) -> tuple[int, dict]:
    """Turn 1's reply as turn 2 carries it: the one assistant message with the write call."""
    found = [(i, m) for i, m in enumerate(body["messages"]) if m["role"] == "assistant"]
    assert len(found) == 1 and found[0][1]["tool_calls"][0]["function"]["name"] == "write", found
    return found[0]


def replay_changes(s, capture_id: str) -> list[tuple]:
    return [
        (c["path"], c["before"], c["after"]) for c in s.store.changes(capture_id) if c["kind"] == "replay_reasoning"
    ]


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize("engine", list(ENGINE_FIELD))
def test_replay_puts_the_agents_own_reasoning_where_the_engine_reads_it(agent, engine, stack, tmp_path):
    s, turns = run_turns(agent, stack, tmp_path, ["--replay-reasoning", "--engine", engine])
    row, sent = turns[1]
    i, message = resent_turn(sent)
    kept, wanted = KEPT_IN[agent], ENGINE_FIELD[engine]
    # What the agent itself sent back: the reasoning it got, byte for byte, in its own field only.
    assert message[kept] == REASONING and OTHER[kept] not in message, message

    forwarded = s.store.json_body(row["id"], "forwarded")
    _, upstream = resent_turn(forwarded)
    assert upstream.get(wanted) == REASONING and OTHER[wanted] not in upstream, upstream
    changes = replay_changes(s, row["id"])
    if kept == wanted:  # the engine reads the agent's field: left as sent, nothing recorded
        assert s.store.body(row["id"], "forwarded") == s.store.body(row["id"], "request")
        assert changes == []
    else:  # moved to the engine's field; the rest of the body is the client's
        moved = {k: v for k, v in message.items() if k != kept}
        assert forwarded == {
            **sent,
            "messages": [*sent["messages"][:i], {**moved, wanted: REASONING}, *sent["messages"][i + 1 :]],
        }
        assert changes == [(f"$.messages[{i}].{wanted}", f"$.messages[{i}].{kept}", None)]
    # Turn 1 had no earlier assistant turn to replay into.
    assert replay_changes(s, turns[0][0]["id"]) == []


@pytest.mark.parametrize("agent", AGENTS)
def test_without_the_flag_the_upstream_gets_the_clients_bytes(agent, stack, tmp_path):
    engine = {"opencode": "vllm", "omp": "llamacpp"}[agent]  # where the flag would move the reasoning
    s, turns = run_turns(agent, stack, tmp_path, ["--engine", engine])
    row, sent = turns[1]
    _, message = resent_turn(sent)
    assert message[KEPT_IN[agent]] == REASONING
    assert s.store.body(row["id"], "forwarded") == s.store.body(row["id"], "request")
    assert replay_changes(s, row["id"]) == []
