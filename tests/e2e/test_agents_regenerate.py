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


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize("scenario", ["fail_first_attempt_unrecoverable", "break_args_first_attempt"])
def test_a_broken_first_attempt_is_regenerated_inside_the_agents_request(agent, scenario, stack, tmp_path):
    s = stack(mock_args=["--scenario", scenario], proxy_args=["--regenerate", "1"])
    sandbox = Sandbox(tmp_path, agent)
    with FileWatcher(sandbox.work / "hello.txt") as watch:
        run = run_agent(agent, sandbox, s.base_url, PROMPT, timeout=RUN_TIMEOUT)
    check_run(run, s)
    assert run.file("hello.txt").read_text() == GREETING
    assert [v for v in watch.seen if v] == [GREETING.encode()], "a half-written file existed"
    assert sorted(p.name for p in sandbox.work.iterdir() if p.name != ".git") == ["hello.txt"]
    s.stop_proxy()

    rows = s.store.rows()
    parents = [r for r in rows if r["attempt_of"] is None]
    attempts = {r["id"]: r for r in rows if r["attempt_of"] is not None}
    turns = turn_requests(s, parents)
    # One request per turn from the agent: the tool turn and the answer after its result, no resend.
    assert [r["finish_reason"] for r, _ in turns] == ["tool_calls", "stop"], rows
    assert len({s.store.body(r["id"]) for r, _ in turns}) == 2

    first, _ = turns[0]
    (second,) = [a for a in attempts.values() if a["attempt_of"] == first["id"]]
    assert second["attempt"] == 2 and first["attempt"] == 1
    assert "regenerated" in first["flags"] and "toolcall_unrecoverable" not in first["flags"], first["flags"]
    # Two upstream requests for turn 1: attempt 1 broken (held, never sent on), attempt 2 whole.
    assert b'"tool_calls"' in s.store.body(first["id"], "response")
    view = client_view(s.store.body(first["id"], "client_response"))
    assert view.errors == [] and view.done == 1, view
    ((name, arguments),) = delivered_calls(s.store.body(first["id"], "client_response"))
    assert name == "write" and json.loads(arguments)["content"] == GREETING
    assert len({c["id"] for c in view.chunks}) == 1, "one completion id across both attempts"
    assert delivered_calls(s.store.body(second["id"], "response")) == [(name, arguments)]
    # The agent's body went to attempt 2 as it was sent, plus a fresh seed (no continuation engine).
    sent = s.store.json_body(first["id"])
    regenerated = s.store.json_body(second["id"])
    assert {k: v for k, v in regenerated.items() if k != "seed"} == sent and "seed" not in sent
    # Why attempt 2 was made, on its own row; the parent records the unrecoverable call it replaced.
    why = {
        (c["stage"], c["kind"], c["path"], json.dumps(c["before"]), json.dumps(c["after"]))
        for c in s.store.changes(second["id"])
    }
    assert why == {
        ("toolcalls", "regenerate", "attempt[2]", '"unrecoverable"', '"fresh_seed"'),
        ("toolcalls", "inject", "$.seed", "null", json.dumps(regenerated["seed"])),
    }, why
    held = [c for c in s.store.changes(first["id"]) if c["stage"] == "toolcalls"]
    assert held and all(c["reason"].startswith("unrecoverable") for c in held), held
    assert not [c for c in s.store.changes(first["id"]) if c["kind"] == "skip"]

    # Every upstream request is either an agent request or one attempt under one: opencode's title request
    # (no tools) and turn 2 may be regenerated too (the mock breaks attempt 1 of any tool-carrying
    # conversation), never more than once each, and never retried by the agent.
    for attempt in attempts.values():
        assert attempt["attempt"] == 2 and attempt["attempt_of"] in {r["id"] for r in parents}
    regenerated_parents = {a["attempt_of"] for a in attempts.values()}
    assert regenerated_parents == {r["id"] for r in parents if "regenerated" in r["flags"]}
    assert len(parents) == (3 if agent == "opencode" else 2), parents
    print(f"\n[timing] {agent} {scenario} --regenerate 1: {run.seconds:.1f}s, {len(rows)} upstream requests")
