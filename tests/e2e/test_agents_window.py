"""Issue 37, the agents' side: opencode, omp and Codex CLI through tapfix in front of a mock playing a vLLM with a
small window (`tapfix mock --context-window N`: vLLM's 400s for a prompt, or prompt plus budget, that doesn't fit).

Each agent is asked to read a file far bigger than the window; its next turn, carrying the file, can't fit. What
each one does with the overflow in the standard shape (docs/window.md) is asserted as observed: opencode compacts
and goes on, omp and Codex report the overflow in their own words and stop. None resends the turn that overflowed.
And an agent's fixed output budget (opencode's `limit.output`, omp's `maxTokens`: 16384) on a smaller window is
clamped by the engine's count and answered, where the mock alone refuses it as vLLM does.
"""

from __future__ import annotations

import json

import pytest
from tapfix.proxy.mock.window import messages_of, prompt_count

from tests.e2e.agents import GREETING, PROMPT, Sandbox, check_run, run_agent

pytestmark = [pytest.mark.agents, pytest.mark.e2e]

TIMEOUT = 60
READ_PROMPT = "Read big.txt"
# ~160 KB, ~39k of the mock's tokens: each agent's read tool or shell gives back far more than the window holds
# (opencode's read stops at 50 KB, Codex truncates the output it shows the model; both still overflow).
BIG = "".join(f"line {i:05d} of the big file, padding padding padding\n" for i in range(3000))
# The windows: each agent's first turn (its system prompt, the tools aside) fits, its turn with the file doesn't.
# By the mock's count: opencode 2461 then 16829 tokens, omp 4778 then 9111, Codex 5448 then 8269.
WINDOWS = {"opencode": 8000, "omp": 8000, "codex": 7000}
BUDGET = 16384  # opencode's limit.output and omp's maxTokens (tests/e2e/agents.py)


def surface(row: dict) -> str:
    return "responses" if row["path"].endswith("/responses") else "chat"


def tokens(s, row: dict) -> int:
    """The prompt's tokens by the mock's own count (what it refuses on)."""
    return prompt_count(messages_of(s.store.json_body(row["id"]), surface(row)))


def overflow_run(stack, tmp_path, agent: str):
    s = stack(mock_args=["--context-window", str(WINDOWS[agent])], proxy_args=["--engine", "vllm"])
    sandbox = Sandbox(tmp_path, agent)
    (sandbox.work / "big.txt").write_text(BIG)
    run = run_agent(agent, sandbox, s.base_url, READ_PROMPT, timeout=TIMEOUT)
    check_run(run, s, ok=False)
    s.stop_proxy()
    rows = s.store.rows()
    overflowed = [r for r in rows if "context_overflow" in r["flags"]]
    assert len(overflowed) == 1, f"{[(r['status'], r['flags']) for r in rows]}\n{run.describe()}\n{s.describe()}"
    row = overflowed[0]
    assert row["status"] == 400
    error = s.store.json_body(row["id"], "client_response")["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "context_length_exceeded", error
    assert error["message"].startswith(f"This model's maximum context length is {WINDOWS[agent]} tokens.")
    # Never the same request again: the overflowed body went once, and the run stayed short.
    sent = s.store.body(row["id"])
    assert [r["id"] for r in rows if s.store.body(r["id"]) == sent] == [row["id"]]
    return run, s, rows, row


def test_opencode_compacts_after_the_overflow_and_goes_on(stack, tmp_path):
    run, s, rows, overflow = overflow_run(stack, tmp_path, "opencode")
    # Its next turn fits the window by the engine's count, so tapfix answered the overflow without asking the mock.
    assert "tapfix_answered" in overflow["flags"] and tokens(s, overflow) > WINDOWS["opencode"]
    after = rows[rows.index(overflow) + 1 :]
    assert [r["status"] for r in after] == [200, 200], [(r["status"], r["flags"]) for r in rows]
    summary, resumed = after
    # First a summary request (no tools) over the conversation, the file's text cut down ...
    summary_body = s.store.json_body(summary["id"])
    assert not summary_body.get("tools")
    assert "Here is the conversation so far" in json.dumps(summary_body["messages"][-1])
    assert tokens(s, summary) < WINDOWS["opencode"]
    # ... then the turn again, on the compacted history: the tools back, the file's content gone.
    resumed_body = s.store.json_body(resumed["id"])
    assert resumed_body.get("tools") and "line 02999" not in json.dumps(resumed_body)
    assert "The conversation was compacted" in json.dumps(resumed_body["messages"])
    assert tokens(s, resumed) < WINDOWS["opencode"] < tokens(s, overflow)
    assert len(rows) == 5, [(r["status"], r["flags"]) for r in rows]  # title, turn 1, overflow, summary, resumed
    assert "maximum context length is 8000 tokens" in run.stdout + run.stderr
    # It prints the error, answers on the compacted history (the mock's reply to it is on stdout), and exits 1.
    assert "The previous request exceeded" in run.stdout and run.returncode == 1, run.describe()


@pytest.mark.parametrize("agent", ["omp", "codex"])
def test_omp_and_codex_report_the_overflow_and_stop(stack, tmp_path, agent):
    run, s, rows, overflow = overflow_run(stack, tmp_path, agent)
    assert rows[-1]["id"] == overflow["id"] and len(rows) == 2, [(r["status"], r["flags"]) for r in rows]
    assert run.returncode == 1, run.describe()
    if agent == "omp":
        # omp sends max_completion_tokens: the engine's count shows the prompt can't fit, tapfix answers at once.
        assert "tapfix_answered" in overflow["flags"]
        assert "code=context_length_exceeded" in run.stderr, run.describe()
    else:
        # Codex sends no budget: the mock overflows as vLLM does, tapfix rewrites its error.
        assert b"your prompt contains at least" in s.store.body(overflow["id"], "response")
        changes = [(c["stage"], c["kind"], c["path"]) for c in s.store.changes(overflow["id"])]
        assert ("window", "rewrite", "$.error") in changes, changes
        assert "ran out of room in the model's context window" in run.stdout + run.stderr, run.describe()


@pytest.mark.parametrize("agent", ["opencode", "omp"])
def test_a_budget_the_window_cannot_hold_is_clamped_and_the_agent_finishes(stack, tmp_path, agent):
    window = WINDOWS[agent]
    s = stack(mock_args=["--context-window", str(window)], proxy_args=["--engine", "vllm"])
    sandbox = Sandbox(tmp_path, agent)
    run = run_agent(agent, sandbox, s.base_url, PROMPT, timeout=TIMEOUT)
    check_run(run, s)
    assert run.file("hello.txt").read_text() == GREETING
    s.stop_proxy()
    rows = s.store.rows()
    assert rows and all(r["status"] == 200 for r in rows), [(r["status"], r["flags"]) for r in rows]
    for row in rows:
        body = s.store.json_body(row["id"])
        field = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        left = window - tokens(s, row)
        assert body[field] == BUDGET > left  # what the agent sent doesn't fit: the mock alone answers 400
        assert s.store.json_body(row["id"], "forwarded")[field] == left
        clamp = [c for c in s.store.changes(row["id"]) if c["stage"] == "window" and c["kind"] == "clamp"]
        assert [(c["path"], c["before"], c["after"]) for c in clamp] == [(f"$.{field}", BUDGET, left)], clamp
