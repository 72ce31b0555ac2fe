"""A real agent (opencode) meets the real llama-server's window through tapfix (issue 37).

opencode's first turn is ~14,000 tokens with the tiny model's tokenizer (tests/process/realengine/test_agent.py
measures it), so a server with a 4096-token context can't take it. tapfix counts the prompt with llama.cpp's
own /apply-template and /tokenize and answers the overflow in the standard shape before anything is generated.
What a user relies on: the agent is told in the shape it recognises and compacts. Seen here: opencode compacts
(a summary request without tools, which fits), then sends the very same request again, which can't fit either:
its own system prompt and tools are larger than the window. Told "overflow" each time, it did that 70 times in
45 s. So the same request overflowing again is answered as a plain client error that no agent reads as an
overflow (flag overflow_repeated), and the agent stops, saying why.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e import conftest as agent_fixtures
from tests.e2e.agents import Sandbox, start_opencode
from tests.e2e.conftest import Store
from tests.process.realengine.engine import LlamaServer
from tests.support.inproc import InprocProxy

pytestmark = [pytest.mark.realengine, pytest.mark.agents]

agents_installed = agent_fixtures.agents_installed

CTX = 4096
RUN_TIMEOUT = 90


def test_opencode_compacts_once_then_stops_when_its_own_prompt_can_never_fit(
    agents_installed: Path,
    llama_server: Callable[..., LlamaServer],
    tapfix_in_front: Callable[..., InprocProxy],
    tmp_path: Path,
) -> None:
    server = llama_server(ctx=CTX, parallel=1)
    proxy = tapfix_in_front(server, "--engine", "llamacpp")
    sandbox = Sandbox(tmp_path, "opencode")

    run = start_opencode(sandbox, f"{proxy.url}/v1", "Create hello.txt").wait(RUN_TIMEOUT)
    proxy.stop()  # its writer has committed every capture once it exited

    store = Store(proxy.extra["db"])
    rows = store.rows()
    shape = [(r["status"], sorted(r["flags"])) for r in rows]
    overflowed = [r for r in rows if "context_overflow" in r["flags"]]
    assert overflowed, f"{shape}\n{run.describe()}"
    assert all(r["status"] == 400 and "tapfix_answered" in r["flags"] for r in overflowed), shape  # never sent
    error = store.json_body(overflowed[0]["id"], "client_response")["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "context_length_exceeded", error
    assert error["message"].startswith(f"This model's maximum context length is {CTX} tokens."), error
    # An overflow is answered by a compaction (opencode's summary request: no tools, it fits); a request that
    # comes back unchanged after it gets the answer that stops the agent, and the run ends there.
    again = overflowed[-1]
    assert [r is again for r in overflowed] == ["overflow_repeated" in r["flags"] for r in overflowed], shape
    assert store.body(again["id"]) in [store.body(r["id"]) for r in overflowed[:-1]], shape
    stop = store.json_body(again["id"], "client_response")["error"]
    assert stop["type"] == "invalid_request_error" and stop["code"] == "prompt_exceeds_window", stop
    assert not run.timed_out and run.returncode not in (0, None), run.describe()
    assert "compacting the conversation didn't shorten it" in run.stdout + run.stderr, run.describe()
    assert len(rows) <= 8, shape
