"""Issue 19 with the real agents: `tapfix run --regenerate 1` in front of a mock that breaks the first
attempt of every tool-carrying conversation. tapfix asks the upstream again inside the agent's request, so
the agent sends each turn once, gets one whole call and no error event, and writes its file; the store
holds the client-facing capture with attempt 2 under it. The error-and-retry counterpart (`--regenerate
0`, the agent resends the turn itself) is test_agents.py::test_unrecoverable_first_attempt_is_retried.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.agents import (
    AGENTS,
    GREETING,
    PROMPT,
    RUN_TIMEOUT,
    FileWatcher,
    Sandbox,
    check_run,
    run_agent,
    turn_requests,
)
from tests.support.stage_io import client_view

pytestmark = [pytest.mark.agents, pytest.mark.e2e]


def delivered_calls(sse: bytes) -> list[tuple[str, str]]:
    """(name, joined arguments) per tool-call index, as the agent read them."""
    calls: dict[int, list[str]] = {}
    for chunk in client_view(sse).chunks:
        for choice in chunk.get("choices") or []:
            for call in (choice.get("delta") or {}).get("tool_calls") or []:
                got = calls.setdefault(call.get("index", 0), ["", ""])
                got[0] += (call.get("function") or {}).get("name") or ""
                got[1] += (call.get("function") or {}).get("arguments") or ""
    return [(name, args) for name, args in (calls[i] for i in sorted(calls))]


def field_text(sse: bytes, key: str) -> str:
    """A delta field (`content`, `reasoning`) joined over the stream."""
    return "".join(
        (choice.get("delta") or {}).get(key) or ""
        for chunk in client_view(sse).chunks
        for choice in chunk.get("choices") or []
    )


# The agents' reasoning switches (test_agents.py::test_omp_reasoning_dialect): the mock then thinks first.
REASONING = {"opencode": {"reasoning": True, "variant": "high"}, "omp": {"reasoning": True, "thinking": "high"}}


def run_regenerated(agent, scenario, stack, tmp_path, proxy_args=(), **agent_kw):
    """Run the agent under `--regenerate 1`, check what it did and that tapfix, not the agent, asked again:
    one request per turn, turn 1 with exactly one attempt under it, the agent given one whole call and no
    error event. Returns the stack, turn 1's capture and its attempt."""
    s = stack(mock_args=["--scenario", scenario], proxy_args=["--regenerate", "1", *proxy_args])
    sandbox = Sandbox(tmp_path, agent)
    with FileWatcher(sandbox.work / "hello.txt") as watch:
        run = run_agent(agent, sandbox, s.base_url, PROMPT, timeout=RUN_TIMEOUT, **agent_kw)
    check_run(run, s)
    assert run.file("hello.txt").read_text() == GREETING
    assert [v for v in watch.seen if v] == [GREETING.encode()], "a half-written file existed"
    assert sorted(p.name for p in sandbox.work.iterdir() if p.name != ".git") == ["hello.txt"]
    s.stop_proxy()

    rows = s.store.rows()
    parents = [r for r in rows if r["attempt_of"] is None]
    attempts = [r for r in rows if r["attempt_of"] is not None]
    turns = turn_requests(s, parents)
    # One request per turn from the agent: the tool turn and the answer after its result, no resend.
    assert [r["finish_reason"] for r, _ in turns] == ["tool_calls", "stop"], rows
    assert len({s.store.body(r["id"]) for r, _ in turns}) == 2
    assert len(parents) == (3 if agent == "opencode" else 2), parents  # opencode's title request, no tools

    first, _ = turns[0]
    (second,) = [a for a in attempts if a["attempt_of"] == first["id"]]
    assert second["attempt"] == 2 and first["attempt"] == 1
    assert "regenerated" in first["flags"] and "toolcall_unrecoverable" not in first["flags"], first["flags"]
    # Two upstream requests for turn 1: attempt 1's call broken (held, never sent on), attempt 2's whole.
    assert b'"tool_calls"' in s.store.body(first["id"], "response")
    delivered = s.store.body(first["id"], "client_response")
    view = client_view(delivered)
    assert view.errors == [] and view.done == 1, view
    ((name, arguments),) = delivered_calls(delivered)
    assert name == "write" and json.loads(arguments)["content"] == GREETING
    assert len({c["id"] for c in view.chunks}) == 1, "one completion id across both attempts"
    assert delivered_calls(s.store.body(second["id"], "response")) == [(name, arguments)]
    # The parent records the unrecoverable call attempt 2 replaced, and nothing was skipped.
    held = [c for c in s.store.changes(first["id"]) if c["stage"] == "toolcalls"]
    assert held and all(c["reason"].startswith("unrecoverable") for c in held), held
    assert not [c for c in s.store.changes(first["id"]) if c["kind"] == "skip"]

    # Every upstream request is an agent request or one attempt under one: turn 2 (and opencode's title
    # request) may be regenerated too, since the mock breaks attempt 1 of any tool-carrying conversation.
    assert all(a["attempt"] == 2 and a["attempt_of"] in {r["id"] for r in parents} for a in attempts)
    assert {a["attempt_of"] for a in attempts} == {r["id"] for r in parents if "regenerated" in r["flags"]}
    print(f"\n[timing] {agent} {scenario} --regenerate 1: {run.seconds:.1f}s, {len(rows)} upstream requests")
    return s, first, second


def change_set(changes: list[dict]) -> set[tuple]:
    return {(c["stage"], c["kind"], c["path"], json.dumps(c["before"]), json.dumps(c["after"])) for c in changes}


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize("scenario", ["fail_first_attempt_unrecoverable", "break_args_first_attempt"])
def test_a_broken_first_attempt_is_regenerated_inside_the_agents_request(agent, scenario, stack, tmp_path):
    s, first, second = run_regenerated(agent, scenario, stack, tmp_path)
    # No continuation engine: the body goes again as it was forwarded (the agent's, unchanged), plus a fresh seed.
    sent = s.store.json_body(first["id"], "forwarded")
    assert sent == s.store.json_body(first["id"])
    regenerated = s.store.json_body(second["id"])
    assert {k: v for k, v in regenerated.items() if k != "seed"} == sent and "seed" not in sent
    # Why attempt 2 was made and what it changed, on its own row.
    assert change_set(s.store.changes(second["id"])) == {
        ("toolcalls", "regenerate", "attempt[2]", '"unrecoverable"', '"fresh_seed"'),
        ("toolcalls", "inject", "$.seed", "null", json.dumps(regenerated["seed"])),
    }


@pytest.mark.parametrize("agent", AGENTS)
def test_a_reasoning_agent_gets_the_continuation_after_the_reasoning_it_already_read(agent, stack, tmp_path):
    """With an engine that continues a partial assistant message (llama.cpp continues reasoning alone),
    attempt 2 carries the reasoning the agent already got as the assistant prefix; the agent reads that
    reasoning once, then attempt 2's call."""
    s, first, second = run_regenerated(
        agent, "break_args_first_attempt", stack, tmp_path, ["--engine", "llamacpp"], **REASONING[agent]
    )
    upstream1 = s.store.body(first["id"], "response")
    reasoning = field_text(upstream1, "reasoning")
    assert reasoning, "the mock thought before the call"
    delivered = s.store.body(first["id"], "client_response")
    assert field_text(delivered, "reasoning") == reasoning and field_text(delivered, "content") == ""
    sent = s.store.json_body(first["id"], "forwarded")
    regenerated = s.store.json_body(second["id"])
    prefix = {"role": "assistant", "content": "", "reasoning_content": reasoning}
    assert regenerated == {
        **sent,
        "messages": [*sent["messages"], prefix],
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    n = len(sent["messages"])
    assert change_set(s.store.changes(second["id"])) == {
        ("toolcalls", "regenerate", "attempt[2]", '"unrecoverable"', '"continuation"'),
        ("toolcalls", "inject", f"$.messages[{n}]", "null", json.dumps(prefix)),
        ("toolcalls", "inject", "$.continue_final_message", "null", "true"),
        ("toolcalls", "inject", "$.add_generation_prompt", "null", "false"),
    }
    assert field_text(s.store.body(second["id"], "response"), "reasoning") == ""  # the thinking was over
