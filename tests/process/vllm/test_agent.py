"""A real coding agent (opencode) through `tapfix run` in front of the real vLLM serving the tiny model.

The prompt carries the model's script (forced, tests/process/vllm/served/forcing_plan.py): on the first turn it
reasons and calls `write` in Hermes markup, which vLLM's `hermes` parser turns into a streamed call; after
the tool result it reasons and answers. Everything opencode receives comes from vLLM: its ids, its parser's
call deltas, its `reasoning` field. opencode may use only `write` and `read`.

What a user relies on: the agent finishes (exit 0), the file lands in the project with the model's content,
tapfix's captures show both turns (the second carrying the tool result), their prompts fit the window as
vLLM counts it, and tool-call repair keeps quiet on vLLM's valid call.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.e2e import conftest as agent_fixtures
from tests.e2e.agents import Sandbox, start_opencode
from tests.e2e.conftest import Store
from tests.process.realengine.test_agent import ONLY_WRITE_AND_READ, show, tree
from tests.process.vllm.engine import MAX_MODEL_LEN, MODEL, VllmServer
from tests.process.vllm.served.forcing_plan import directive
from tests.process.vllm.wire import hermes_call, think
from tests.support.inproc import InprocProxy

pytestmark = [pytest.mark.vllm, pytest.mark.agents]

agents_installed = agent_fixtures.agents_installed  # the agent suite's install (idempotent, once a session)

RUN_TIMEOUT = 180  # seconds; a run took about 25 s on 2 busy cores
FILE = "hello.txt"
CONTENT = "Hello from vLLM."
CALL = {"content": CONTENT, "filePath": FILE}  # opencode's write tool takes these
ANSWER = "I wrote hello.txt."
TURN_1 = think("\nThe user wants hello.txt. I will write it.\n") + hermes_call("write", CALL)
TURN_2 = think("\nThe file is written.\n") + ANSWER


def prompt_tokens(server: VllmServer, request: dict) -> int:
    """The captured request's prompt as vLLM counts it (/tokenize renders it with the chat template)."""
    keys = ("messages", "tools", "chat_template_kwargs")
    answer = httpx.post(
        server.url + "/tokenize", json={"model": MODEL, **{k: request[k] for k in keys if k in request}}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    count: int = answer.json()["count"]
    return count


def test_opencode_writes_a_file_through_tapfix_in_front_of_vllm(
    agents_installed: Path, vllm: VllmServer, tapfix_in_front: Callable[..., InprocProxy], tmp_path: Path
) -> None:
    proxy = tapfix_in_front(vllm)
    sandbox = Sandbox(tmp_path, "opencode")
    prompt = f"Create {FILE} {directive(TURN_1, TURN_2)}"
    run = start_opencode(sandbox, f"{proxy.url}/v1", prompt, model=MODEL, config={"tools": ONLY_WRITE_AND_READ}).wait(
        RUN_TIMEOUT
    )
    proxy.stop()  # its writer has committed every capture once it exited
    logs = f"--- tapfix log ---\n{proxy.log()[-3000:]}\n--- vllm log ---\n{vllm.log()[-3000:]}"
    print(f"\n[vllm] opencode against vLLM: exit {run.returncode} in {run.seconds:.1f}s")
    assert not run.timed_out, f"opencode hit the {RUN_TIMEOUT}s timeout\n{run.describe()}\n{logs}"
    assert run.returncode == 0, f"{run.describe()}\n{logs}"

    # The project holds what the model asked for, and nothing else the agent made.
    assert run.file(FILE).read_text() == CONTENT, run.describe()
    assert sorted(tree(sandbox.work, skip=(".git",))) == [FILE], run.describe()

    # Captures: turn 1 (with tools) answered by vLLM's parsed call, turn 2 carrying its result.
    db = proxy.extra["db"]
    store = Store(db)
    rows = store.rows()
    assert all(r["status"] == 200 for r in rows), rows
    turns = [(c, json.loads(c["bodies"]["request"]["text"])) for c in (show(db, r["id"]) for r in rows)]
    turns = [(c, body) for c, body in turns if body.get("tools")]  # opencode's title request has none
    assert len(turns) >= 2, [c["id"] for c, _ in turns]
    (first, first_request), (second, second_request) = turns[0], turns[1]
    calls = first["assembled"]["tool_calls"]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("write", CALL)], first["assembled"]
    assert calls[0]["id"].startswith("chatcmpl-tool-") and first["finish_reason"] == "tool_calls"
    assert first["assembled"]["reasoning"] == "\nThe user wants hello.txt. I will write it.\n"
    results = [m for m in second_request["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == [calls[0]["id"]], second_request["messages"]
    assert second["assembled"]["content"].strip() == ANSWER, second["assembled"]

    # The first turn fits the window, counted by vLLM itself, and the capture's usage is that count.
    recorded = first["assembled"]["usage"]["prompt_tokens"]
    measured = prompt_tokens(vllm, first_request)
    print(f"[vllm] opencode's first turn: {measured} tokens by /tokenize, {recorded} in the captured usage")
    assert measured == recorded < MAX_MODEL_LEN

    # Tool-call repair is armed (the default) and left vLLM's valid call alone.
    for capture in (first, second):
        assert [c for c in capture["changes"] if c["stage"] in ("toolcalls", "stream")] == []
        assert "toolcall_repaired" not in capture["flags"], capture["flags"]
        assert store.body(capture["id"], "client_response") == store.body(capture["id"], "response")
