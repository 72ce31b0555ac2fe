"""The real coding agents (opencode, omp) through `tapfix run` in front of `tapfix mock`.

Each test runs one agent headless in a throw-away HOME, under a hard timeout, against its own proxy and
mock, and checks both sides: what the agent did (files, exit code, output) and what the store recorded
(captures, exact bodies, change rows). The agents are installed by scripts/install-agents (pinned
versions, cached in tapfix's cache: ~/.cache/tapfix/agents); see docs/agents.md.

Run just this suite with `scripts/test -m agents tests/e2e`; leave it out with `-m "not agents"`.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime

import pytest

from tests.conftest import corpus_dir
from tests.e2e.agents import (
    AGENTS,
    GREETING,
    MODEL,
    PROMPT,
    RUN_TIMEOUT,
    FileWatcher,
    Sandbox,
    check_run,
    port_open,
    run_agent,
    start_omp,
    start_opencode,
    turn_requests,
)
from tests.inproc.test_e2e_request_side import GENERATION_CONFIG
from tests.support.procs import free_port

pytestmark = [pytest.mark.agents, pytest.mark.e2e]

USER_AGENT = {"opencode": "opencode/1.18.33 ", "omp": "omp/18.2.3"}
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def streamed_tool_args(sse: bytes) -> dict[int, str]:
    """Concatenated `arguments` fragments per tool-call index in an SSE body."""
    args: dict[int, str] = {}
    for line in sse.splitlines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        event = json.loads(line[6:])
        for choice in event.get("choices") or []:
            for call in (choice.get("delta") or {}).get("tool_calls") or []:
                fragment = (call.get("function") or {}).get("arguments") or ""
                args[call.get("index", 0)] = args.get(call.get("index", 0), "") + fragment
    return args


def sse_errors(sse: bytes) -> list[dict]:
    return [
        json.loads(line[6:])["error"]
        for line in sse.splitlines()
        if line.startswith(b"data: {") and b'"error"' in line and "error" in json.loads(line[6:])
    ]


# ---- 1. a plain tool round trip -----------------------------------------------------------------------


@pytest.mark.parametrize("agent", AGENTS)
def test_tool_round_trip(agent, stack, tmp_path):
    s = stack()
    run = run_agent(agent, Sandbox(tmp_path, agent), s.base_url, PROMPT, timeout=RUN_TIMEOUT)
    check_run(run, s)
    assert run.file("hello.txt").read_text() == GREETING
    assert "Done." in run.stdout  # the mock's answer after the tool result reached the user
    s.stop_proxy()

    rows = s.store.rows()
    assert rows, s.describe()
    assert all(r["user_agent"].startswith(USER_AGENT[agent]) for r in rows), rows
    assert all(r["status"] == 200 and r["path"] == "/v1/chat/completions" and r["stream"] for r in rows)
    turns = turn_requests(s, rows)
    assert [r["finish_reason"] for r, _ in turns] == ["tool_calls", "stop"], rows
    if agent == "opencode":  # plus the title request, sent beside turn 1; one session id throughout
        assert len(rows) == 3
        assert len({r["session_id"] for r in rows}) == 1 and rows[0]["session_id"].startswith("ses_")
    else:  # no session id sent: turn 2 continues turn 1's conversation and reply, so one session (issue 15)
        assert len(rows) == 2
        assert len({r["session_id"] for r in rows}) == 1 and rows[0]["session_id"], rows

    (first, body1), (second, body2) = turns
    assert PROMPT in json.dumps(body1["messages"])
    assert "write" in {t["function"]["name"] for t in body1["tools"]}
    # The call the upstream made comes back in turn 2, with its result.
    upstream1 = s.store.body(first["id"], "response")
    call_id = re.search(rb'"id":"(chatcmpl-tool-[0-9a-f]+)"', upstream1).group(1).decode()
    replayed = [m for m in body2["messages"] if m["role"] == "assistant" and m.get("tool_calls")]
    assert replayed[-1]["tool_calls"][0]["id"] == call_id
    assert replayed[-1]["tool_calls"][0]["function"]["name"] == "write"
    assert json.loads(replayed[-1]["tool_calls"][0]["function"]["arguments"])["content"] == GREETING
    assert any(m["role"] == "tool" and m["tool_call_id"] == call_id for m in body2["messages"])
    # Quick mode without an engine changes no body: the exact bytes go both ways.
    for row, _ in turns:
        assert s.store.body(row["id"], "forwarded") == s.store.body(row["id"], "request")
        assert s.store.body(row["id"], "client_response") == s.store.body(row["id"], "response")
        assert not [c for c in s.store.changes(row["id"]) if c["stage"] != "framing"]


# ---- 2. missing sampling parameters are filled from generation_config.json ------------------------------


@pytest.mark.parametrize("agent", AGENTS)
def test_sampling_defaults_filled(agent, stack, tmp_path):
    folder = tmp_path / "Fake-Model-7B"
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    s = stack(proxy_args=["--engine", "vllm", "--generation-config", str(folder / "generation_config.json")])
    run = run_agent(agent, Sandbox(tmp_path, agent), s.base_url, PROMPT, timeout=RUN_TIMEOUT)
    check_run(run, s)
    assert run.file("hello.txt").read_text() == GREETING
    s.stop_proxy()

    rows = s.store.rows()
    assert len(turn_requests(s, rows)) == 2
    for row in rows:
        sent = s.store.json_body(row["id"])
        # Through the CLI, as a user checks it: `tapfix captures export ID --forwarded`.
        forwarded = s.store.json_body(row["id"], "forwarded", cli_export=True)
        assert not any(k in sent for k in SAMPLING_KEYS), "the agent sent sampling parameters itself"
        assert {k: forwarded.get(k) for k in SAMPLING_KEYS} == {k: GENERATION_CONFIG[k] for k in SAMPLING_KEYS}
        # Only those keys were added: the agent's own max-tokens field stays the only one (max_new_tokens
        # must not add a second one), and nothing else changed.
        assert {k: v for k, v in forwarded.items() if k not in SAMPLING_KEYS} == sent
        sampling = [c for c in s.store.changes(row["id"]) if c["stage"] == "sampling"]
        assert {c["path"]: (c["kind"], c["before"], c["after"]) for c in sampling} == {
            f"$.{k}": ("inject", None, GENERATION_CONFIG[k]) for k in SAMPLING_KEYS
        }, sampling
        assert all("generation_config.json" in c["reason"] for c in sampling)


# ---- 3. reasoning effort reaches the upstream in its dialect ---------------------------------------------

TABBY_CONFIG = """
[upstreams.tabby]
base_url = "{MOCK}/v1"
engine = "tabbyapi"

[models."MODEL"]
upstream = "tabby"

[models."MODEL".reasoning]
template_var = "enable_thinking"      # a Qwen3-style template: reads enable_thinking, not reasoning_effort
""".replace("MODEL", MODEL)

# omp sends a bare `reasoning_effort`: "high" for --thinking high, and "minimal" (not nothing) for
# --thinking off (clients.md §3). What the upstream must receive, and the reasoning change rows:
REASONING_CASES = {
    # TabbyAPI forwards reasoning_effort as a template variable the Qwen template ignores: tapfix adds
    # template_vars.enable_thinking. "minimal" is a level, i.e. thinking on (vLLM's rule: effort != none).
    ("tabbyapi", "high"): (
        {"reasoning_effort": "high", "template_vars": {"enable_thinking": True}},
        {("inject", "$.template_vars.enable_thinking", None, True)},
    ),
    ("tabbyapi", "off"): (
        {"reasoning_effort": "minimal", "template_vars": {"enable_thinking": True}},
        {("inject", "$.template_vars.enable_thinking", None, True)},
    ),
    # Ollama /v1 has no "minimal": clamped to the nearest level it reads.
    ("ollama", "high"): ({"reasoning_effort": "high"}, set()),
    ("ollama", "off"): ({"reasoning_effort": "low"}, {("clamp", "$.reasoning_effort", "minimal", "low")}),
}


@pytest.mark.parametrize(("engine", "thinking"), list(REASONING_CASES))
def test_omp_reasoning_dialect(engine, thinking, stack, tmp_path):
    if engine == "tabbyapi":
        s = stack(config=TABBY_CONFIG)
    else:
        s = stack(proxy_args=["--engine", engine])
    run = run_agent(
        "omp", Sandbox(tmp_path, "omp"), s.base_url, PROMPT, timeout=RUN_TIMEOUT, reasoning=True, thinking=thinking
    )
    check_run(run, s)
    assert run.file("hello.txt").read_text() == GREETING
    s.stop_proxy()

    want_fields, want_changes = REASONING_CASES[(engine, thinking)]
    sent_effort = {"high": "high", "off": "minimal"}[thinking]
    turns = turn_requests(s)
    assert len(turns) == 2
    for row, sent in turns:
        assert sent["reasoning_effort"] == sent_effort
        forwarded = s.store.json_body(row["id"], "forwarded")
        assert {k: forwarded.get(k) for k in want_fields} == want_fields
        assert not {"chat_template_kwargs", "enable_thinking", "think"} & forwarded.keys()
        changes = {
            (c["kind"], c["path"], c["before"], c["after"])
            for c in s.store.changes(row["id"])
            if c["stage"] == "reasoning"
        }
        assert changes == want_changes
        # The (vLLM-shaped) mock thinks when asked: reasoning deltas stream back.
        assert b'"reasoning":' in s.store.body(row["id"], "response")


# ---- 4. a broken but repairable tool-call stream ---------------------------------------------------------

HERMES_CASE = "leaked_into_content__hermes_literal_close_tag_inside_string_argument.json"


def hermes_scenario(agent: str) -> tuple[dict, str]:
    """The corpus case where the call's arguments leak into content at a literal </tool_call>, adapted
    to the agent's own write tool (name and argument names). Served for turn 1 only: opencode's title
    request shares the first two request numbers with it, omp's turn 1 is request 1."""
    case = json.loads((corpus_dir() / HERMES_CASE).read_text())
    expected = case["expected"][0]["arguments"]["content"]
    text = json.dumps(case["stream"]).replace('"name": "write_file"', '"name": "write"')
    key = '{\\"filePath\\": ' if agent == "opencode" else '{\\"i\\": \\"Write the note\\", \\"path\\": '
    assert '{\\"path\\": ' in text and "docs/hermes.md" in text
    text = text.replace('{\\"path\\": ', key).replace("docs/hermes.md", "hermes.md")
    scenario = {
        "description": f"{HERMES_CASE} for {agent}'s write tool",
        "rules": [
            {
                "when": {"nth": [1, 2] if agent == "opencode" else 1, "has_tools": True},
                "do": "serve_case",
                "case": {"stream": json.loads(text)},
            }
        ],
    }
    return scenario, expected


UNCLOSED_SCENARIO = {
    "description": "the agent's own call, missing its final }, on every first attempt",
    "rules": [{"when": {"attempt": 1, "has_tools": True}, "do": "break_tool_call", "mode": "unclosed"}],
}


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize("case", ["unclosed", "hermes_close_tag"])
def test_repairable_tool_call(agent, case, stack, tmp_path):
    if case == "unclosed":
        scenario, expected, name, prompt = UNCLOSED_SCENARIO, GREETING, "hello.txt", PROMPT
    else:
        (scenario, expected), name = hermes_scenario(agent), "hermes.md"
        prompt = "Write hermes.md explaining how to close a tool call"
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario))
    s = stack(mock_args=["--scenario", str(path)])
    sandbox = Sandbox(tmp_path, agent)
    with FileWatcher(sandbox.work / name) as watch:
        run = run_agent(agent, sandbox, s.base_url, prompt, timeout=RUN_TIMEOUT)
    check_run(run, s)
    assert run.file(name).read_text() == expected  # the whole content, not the part before the break
    assert [v for v in watch.seen if v] == [expected.encode()]
    s.stop_proxy()

    turns = turn_requests(s)
    assert [r["finish_reason"] for r, _ in turns] == ["tool_calls", "stop"]  # repaired in place: no retry
    first = turns[0][0]
    assert "toolcall_repaired" in first["flags"]
    assert [c for c in s.store.changes(first["id"]) if c["stage"] == "toolcalls"]
    upstream = s.store.body(first["id"], "response")
    delivered = s.store.body(first["id"], "client_response")
    assert list(streamed_tool_args(delivered)) == [0]
    args = json.loads(streamed_tool_args(delivered)[0])  # the agent got complete JSON ...
    assert args["content"] == expected
    with pytest.raises(ValueError):  # ... which the upstream never sent
        json.loads(streamed_tool_args(upstream).get(0, ""))


# ---- 5. a broken, unrecoverable tool-call stream on the first attempt ------------------------------------


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize("scenario", ["fail_first_attempt_unrecoverable", "break_args_first_attempt"])
def test_unrecoverable_first_attempt_is_retried(agent, scenario, stack, tmp_path):
    s = stack(mock_args=["--scenario", scenario], proxy_args=["--regenerate", "0"])
    sandbox = Sandbox(tmp_path, agent)
    with FileWatcher(sandbox.work / "hello.txt") as watch:
        run = run_agent(agent, sandbox, s.base_url, PROMPT, timeout=RUN_TIMEOUT)
    check_run(run, s)
    assert run.file("hello.txt").read_text() == GREETING
    assert [v for v in watch.seen if v] == [GREETING.encode()], "a half-written file existed"
    assert sorted(p.name for p in sandbox.work.iterdir() if p.name != ".git") == ["hello.txt"]
    s.stop_proxy()

    turns = turn_requests(s)
    broken = [i for i, (r, _) in enumerate(turns) if "toolcall_unrecoverable" in r["flags"]]
    assert broken and broken[0] == 0, [r for r, _ in turns]
    for i in broken:
        row, body = turns[i]
        upstream = s.store.body(row["id"], "response")
        delivered = s.store.body(row["id"], "client_response")
        assert b'"tool_calls"' in upstream and b'"tool_calls"' not in delivered  # the call was held back
        (error,) = sse_errors(delivered)
        assert error["type"] == "server_error" and error["code"] == 502, error
        assert error["tapfix"]["capture_id"] == row["id"]
        assert delivered.rstrip().endswith(b"data: [DONE]")
        # The agent retried the turn by itself: the next request is the very same body.
        retry_row, retry_body = turns[i + 1]
        assert s.store.body(retry_row["id"]) == s.store.body(row["id"])
        assert "toolcall_unrecoverable" not in retry_row["flags"]
        changes = [c for c in s.store.changes(row["id"]) if c["stage"] == "toolcalls"]
        assert changes and "unrecoverable" in changes[0]["reason"]
    assert turns[-1][0]["finish_reason"] == "stop"
    assert [r["finish_reason"] for r, _ in turns if "toolcall_unrecoverable" not in r["flags"]] == [
        "tool_calls",
        "stop",
    ]


# ---- 6. errors tapfix itself returns ---------------------------------------------------------------------

SERVED_ONLY_CONFIG = """
[upstreams.mock]
base_url = "{MOCK}/v1"
engine = "vllm"

[models."served-model"]
upstream = "mock"
"""


@pytest.mark.parametrize("agent", AGENTS)
def test_unknown_model_stops_the_agent_at_once(agent, stack, tmp_path):
    s = stack(config=SERVED_ONLY_CONFIG)
    run = run_agent(agent, Sandbox(tmp_path, agent), s.base_url, PROMPT, timeout=60)
    check_run(run, s, ok=False)
    assert run.returncode not in (0, None), run.describe()
    assert "is not served here" in run.stderr + run.stdout, run.describe()
    # "At once": a retried error takes about a minute (opencode: 5 retries 2-35 s apart; clients.md §5).
    assert run.seconds < 30, f"{agent} took {run.seconds:.1f}s to give up on a 404"
    assert not run.file("hello.txt").exists()
    s.stop_proxy()

    rows = s.store.rows()
    assert rows and all(r["status"] == 404 for r in rows), f"{rows}\n{run.describe()}\n{s.describe()}"
    turns = turn_requests(s, rows)
    assert len(turns) == 1, "the agent retried a 4xx"
    error = json.loads(s.store.body(turns[0][0]["id"], "client_response"))["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "model_not_found"
    assert "served-model" in error["message"]
    print(f"\n[timing] {agent}: 404 model_not_found -> exit {run.returncode} after {run.seconds:.1f}s")


# opencode retries after ~2.2 s and ~4.6 s, omp after 0.5 s and 1 s (clients.md §8), so the third try of
# turn 1 should land within ~10 s; the window allows for a slow CI machine.
RETRY_WINDOW = 40.0


@pytest.mark.parametrize("agent", AGENTS)
def test_upstream_down_gets_502_and_the_agent_retries(agent, stack, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    assert not port_open(dead)
    s = stack(upstream=dead)
    starter = {"opencode": start_opencode, "omp": start_omp}[agent]
    proc = starter(Sandbox(tmp_path, agent), s.base_url, PROMPT)
    tries: set[str] = set()  # captures of turn 1 (opencode's title request, without tools, is left out)
    try:
        deadline = time.monotonic() + RETRY_WINDOW
        while time.monotonic() < deadline and len(tries) < 3 and proc.proc.poll() is None:
            time.sleep(0.25)
            tries |= {i for i in s.store.ids() if i not in tries and s.store.json_body(i).get("tools")}
        seen_after = time.monotonic() - proc.started
        still_running = proc.proc.poll() is None
    finally:
        proc.stop()
    run = proc.result(None if still_running else proc.proc.returncode, seen_after, False)
    assert still_running, (
        f"{agent} gave up on a 502 at once (against the server it would retry)\n{run.describe()}\n{s.describe()}"
    )
    s.stop_proxy()

    rows = s.store.rows()
    assert rows and all(r["status"] == 502 for r in rows), f"{rows}\n{run.describe()}\n{s.describe()}"
    turns = turn_requests(s, rows)
    assert len(turns) >= 3, f"{agent}: {len(turns)} tries of turn 1 in {seen_after:.1f}s\n{run.describe()}"
    assert len({s.store.body(r["id"]) for r, _ in turns}) == 1  # the same turn, resent
    error = json.loads(s.store.body(turns[0][0]["id"], "client_response"))["error"]
    assert error["message"]
    assert not run.file("hello.txt").exists()
    stamps = [datetime.fromisoformat(r["started_at"]).timestamp() for r, _ in turns]
    gaps = [round(b - a, 1) for a, b in zip(stamps, stamps[1:], strict=False)]
    print(
        f"\n[timing] {agent}: upstream down -> {len(turns)} tries of turn 1 within {seen_after:.1f}s, "
        f"gaps {gaps} s; error {error}"
    )


# ---- 7. Codex CLI on the Responses API -------------------------------------------------------------------


def test_codex_round_trip_on_the_responses_api(stack, tmp_path):
    """Codex speaks only /v1/responses: its turns are captured, assembled and its file gets written."""
    s = stack()
    run = run_agent("codex", Sandbox(tmp_path, "codex"), s.base_url, PROMPT, timeout=RUN_TIMEOUT)
    check_run(run, s)
    assert run.file("hello.txt").read_text() == GREETING
    s.stop_proxy()
    rows = s.store.rows()
    assert rows and all(r["path"] == "/v1/responses" and r["status"] == 200 for r in rows), rows
    assert all(r["user_agent"].startswith("codex_exec/") for r in rows)
    import sqlite3

    conn = sqlite3.connect(f"file:{s.store.db}?mode=ro", uri=True)
    assembled = conn.execute("select id, tool_calls, content from exchanges order by id").fetchall()
    assert json.loads(assembled[0][1])[0]["name"], "turn 1 is a function call, assembled from the stream"
    assert assembled[-1][2].startswith("Done.")
    body = s.store.json_body(assembled[0][0])
    assert body["reasoning"]["effort"] == "high" and PROMPT in json.dumps(body["input"])
