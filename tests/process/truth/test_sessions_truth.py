"""Issue 15 item 8, where it takes two processes: two `tapfix run` on one store, two agents whose turns
alternate between them; each agent's run is still one session. The rest: tests/inproc/truth/test_sessions_truth.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.inproc.truth.test_sessions_truth import CHAT_TOOLS, MAX_TURNS, _openai, one_session
from tests.support.inproc import InprocMock, start_mock
from tests.support.procs import start_proxy


@pytest.fixture(scope="module")
def mock(module_tmp: Path) -> Iterator[InprocMock]:
    """The upstream runs in the test process: the two proxies are the processes under test."""
    handle = start_mock(module_tmp)
    yield handle
    handle.stop()


def test_truth_8_two_processes_one_store(module_tmp, mock):
    """Two `tapfix run` on one --db; two agents whose turns alternate between them, nobody waits for
    the store: each agent's run is one session."""
    db = module_tmp / "shared.db"
    a = start_proxy(module_tmp, mock.url, db=db)
    b = start_proxy(module_tmp, mock.url, db=db)
    try:
        agents = [_Alternating([a.url, b.url], task) for task in ("Read notes.txt", "Read todo.md")]
        for _ in range(MAX_TURNS):
            if all(agent.done for agent in agents):
                break
            for agent in agents:
                agent.step()
        assert all(agent.done and len(agent.ids) == 4 for agent in agents)
        sids = [one_session(db, agent.ids) for agent in agents]
        assert sids[0] != sids[1]
    finally:
        a.stop()
        b.stop()


class _Alternating:
    """An agent that sends each turn to the next proxy in turn: read, answer, write, answer."""

    def __init__(self, urls: list[str], task: str) -> None:
        self.clients = [_openai(u) for u in urls]
        self.messages: list[Any] = [{"role": "user", "content": task}]
        self.tasks = ['Create out.txt containing "done"']
        self.ids: list[str] = []
        self.done = False

    def step(self) -> None:
        if self.done:
            return
        client = self.clients[len(self.ids) % len(self.clients)]
        raw = client.chat.completions.with_raw_response.create(model="m", messages=self.messages, tools=CHAT_TOOLS)
        self.ids.append(raw.headers["x-tapfix-capture-id"])
        message = raw.parse().choices[0].message
        self.messages.append(message)
        if message.tool_calls:
            self.messages += [{"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in message.tool_calls]
        elif self.tasks:
            self.messages.append({"role": "user", "content": self.tasks.pop()})
        else:
            self.done = True


# -- Responses -----------------------------------------------------------------------------------
