"""A real coding agent (opencode) through `tapfix run` in front of a real llama-server serving the tiny model.

The mock-driven agent suite (tests/e2e/test_agents.py) can only confirm what the team believes about
engines; here every byte the agent gets comes from llama.cpp. The server has a context of its own that
fits opencode's first turn (its tools and system prompt are ~14,000 tokens with the tiny model's
byte-level tokenizer, more than the shared `llama`'s 2048), and opencode may use only `write` and `read`.

What a user relies on: the agent finishes, the file lands in the project, tapfix's captures show both
turns (the second carrying the tool result), tool-call repair keeps quiet on the engine's valid call,
and nothing is written outside the throw-away directory (not the checkout, not the real home).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.e2e import conftest as agent_fixtures
from tests.e2e.agents import Sandbox, start_opencode
from tests.e2e.conftest import Store
from tests.process.realengine import tiny_model
from tests.process.realengine.engine import ROOT, LlamaServer
from tests.support.inproc import InprocProxy, cli

pytestmark = [pytest.mark.realengine, pytest.mark.agents]

agents_installed = agent_fixtures.agents_installed  # the agent suite's install (idempotent, once a session)

AGENT_CTX = 32768  # measured: opencode's first turn is ~14,000 tokens; the test re-measures and prints it
RUN_TIMEOUT = 120  # seconds; a run takes ~10 s on 2 cores
PROMPT = "Create hello.txt"
ONLY_WRITE_AND_READ = {"*": False, "write": True, "read": True}  # opencode's `tools` switches
OPENCODE_DIRS = (".config/opencode", ".local/share/opencode", ".cache/opencode", ".local/state/opencode")


def tree(root: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple[int, int]]:
    """Every file under `root` (relative path -> (mtime_ns, size)); empty when `root` doesn't exist."""
    found: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip]
        for name in filenames:
            path = Path(dirpath) / name
            try:
                stat = path.lstat()
            except FileNotFoundError:
                continue
            found[str(path.relative_to(root))] = (stat.st_mtime_ns, stat.st_size)
    return found


def checkout_state() -> dict[str, tuple[int, int]]:
    """The clone's tracked and untracked (not ignored) files with their mtime and size, plus its top-level
    entries (ignored ones too, such as a new `.opencode/`): where an agent that resolved a relative path
    against its launcher's directory (the checkout) would write."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "-co", "--exclude-standard"], capture_output=True, check=True
    )
    files: dict[str, tuple[int, int]] = {}
    for name in filter(None, listed.stdout.decode().split("\0")):
        try:
            stat = (ROOT / name).lstat()
        except FileNotFoundError:
            continue  # deleted in the work tree, still in the index
        files[name] = (stat.st_mtime_ns, stat.st_size)
    return {**files, **{f"{entry.name} (top level)": (0, 0) for entry in ROOT.iterdir()}}


def the_agents(paths: list[str]) -> list[str]:
    """Of the checkout's paths that changed during the run, those the agent could have made: named like the
    file it was asked for or like opencode's own directories, or holding the content the model wrote.
    (The others are someone editing the clone meanwhile: people, or other sessions, work while it runs.)"""
    name = Path(tiny_model.CALL_ARGUMENTS["filePath"]).name
    content = tiny_model.CALL_ARGUMENTS["content"].encode()
    suspects = []
    for changed_path in paths:
        path = ROOT / changed_path.removesuffix(" (top level)")
        if path.name == name or any("opencode" in part for part in path.parts):
            suspects.append(changed_path)
            continue
        try:
            data = path.read_bytes() if path.is_file() else b""
        except OSError:
            continue
        if content in data:
            suspects.append(changed_path)
    return suspects


def outside_state() -> dict[str, dict[str, tuple[int, int]]]:
    """Where opencode keeps things when HOME or TMPDIR leak through: its directories in the real home
    (the test process's HOME, not the sandbox's) and its directory in the shared temp dir."""
    places = [Path.home() / d for d in OPENCODE_DIRS] + [Path(tempfile.gettempdir()) / "opencode"]
    return {str(place): tree(place) for place in places}


def changed(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def show(db: Path, capture_id: str) -> dict:
    """One capture as `tapfix captures show --json` prints it."""
    result = cli("captures", "show", capture_id, "--json", "--db", str(db))
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return json.loads(result.stdout)


def prompt_by_the_server(server: LlamaServer, request: dict) -> tuple[int, int]:
    """The captured request's prompt as this server renders it (/apply-template: its chat template,
    with the tools) and counts it (/tokenize: the model's own tokenizer): (tokens, bytes of prompt)."""
    keys = ("messages", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs")
    rendered = httpx.post(f"{server.url}/apply-template", json={k: request[k] for k in keys if k in request})
    rendered.raise_for_status()
    prompt = rendered.json()["prompt"]
    tokens = httpx.post(f"{server.url}/tokenize", json={"content": prompt, "add_special": True})
    tokens.raise_for_status()
    return len(tokens.json()["tokens"]), len(prompt.encode())


def test_opencode_writes_a_file_through_tapfix_in_front_of_llama_server(
    agents_installed: Path,
    llama_server: Callable[..., LlamaServer],
    tapfix_in_front: Callable[..., InprocProxy],
    tmp_path: Path,
) -> None:
    server = llama_server(ctx=AGENT_CTX, parallel=1)
    props = httpx.get(f"{server.url}/props").raise_for_status().json()
    n_ctx = props["default_generation_settings"]["n_ctx"]
    proxy = tapfix_in_front(server)
    db = proxy.extra["db"]
    sandbox = Sandbox(tmp_path, "opencode")
    checkout_before, outside_before = checkout_state(), outside_state()

    run = start_opencode(sandbox, f"{proxy.url}/v1", PROMPT, config={"tools": ONLY_WRITE_AND_READ}).wait(RUN_TIMEOUT)

    checkout_after, outside_after = checkout_state(), outside_state()
    proxy.stop()  # its writer has committed every capture once it exited
    logs = f"--- tapfix log ---\n{proxy.log()[-3000:]}\n--- llama-server log ---\n{server.log()[-3000:]}"
    print(f"\n[realengine] opencode against llama-server (-c {n_ctx}): exit {run.returncode} in {run.seconds:.1f}s")
    assert not run.timed_out, f"opencode hit the {RUN_TIMEOUT}s timeout\n{run.describe()}\n{logs}"
    assert run.returncode == 0, f"{run.describe()}\n{logs}"

    # The project holds what the model asked for, and nothing else the agent made.
    name = tiny_model.CALL_ARGUMENTS["filePath"]
    assert run.file(name).read_text() == tiny_model.CALL_ARGUMENTS["content"], run.describe()
    assert sorted(tree(sandbox.work, skip=(".git",))) == [name], run.describe()

    # Captures: opencode's turn 1 (with tools) is answered by the call, turn 2 carries its result.
    store = Store(db)
    rows = store.rows()
    assert len(rows) >= 2, f"{rows}\n{logs}"
    assert all(r["status"] == 200 for r in rows), rows
    captures = [show(db, r["id"]) for r in rows]
    turns = [(c, json.loads(c["bodies"]["request"]["text"])) for c in captures]
    turns = [(c, body) for c, body in turns if body.get("tools")]  # opencode's title request has none
    assert len(turns) >= 2, [c["id"] for c in captures]
    (first, first_request), (second, second_request) = turns[0], turns[1]
    offered = {t["function"]["name"] for t in first_request["tools"]}
    # The config's `tools` reached the request: every other tool is off. opencode's `write` switch also
    # turns on `edit` (both are its one `edit` permission).
    assert {"write", "read"} <= offered <= {"write", "read", "edit"}, offered
    calls = first["assembled"]["tool_calls"]
    assert [c["name"] for c in calls] == [tiny_model.CALL_NAME], first["assembled"]
    assert json.loads(calls[0]["arguments"]) == tiny_model.CALL_ARGUMENTS
    assert first["finish_reason"] == "tool_calls", first
    results = [m for m in second_request["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == [calls[0]["id"]], second_request["messages"]
    assert second["assembled"]["content"] == tiny_model.ANSWER, second["assembled"]

    # The first turn fits the server's context, counted by the model's own tokenizer.
    recorded = first["assembled"]["usage"]["prompt_tokens"]
    measured, size = prompt_by_the_server(server, first_request)
    print(
        f"[realengine] opencode's first turn: {measured} tokens by /tokenize ({size} bytes rendered),"
        f" {recorded} in the captured usage; n_ctx {n_ctx}"
    )
    assert recorded < n_ctx
    assert measured == recorded  # the capture's usage is the engine's count of this very prompt

    # Tool-call repair is armed (the default) and left the engine's valid call alone.
    for capture in (first, second):
        response_side = [c for c in capture["changes"] if c["stage"] in ("toolcalls", "stream")]
        assert response_side == [], response_side
        assert "toolcall_repaired" not in capture["flags"], capture["flags"]
        assert store.body(capture["id"], "client_response") == store.body(capture["id"], "response")

    # Nothing written outside the throw-away directory: not the checkout, not the real home's or the shared
    # temp dir's opencode directories; opencode's state and temp files went to the sandbox instead.
    meanwhile = changed(checkout_before, checkout_after)
    assert the_agents(meanwhile) == [], meanwhile
    if meanwhile:
        print(f"[realengine] changed in the checkout during the run, by someone else: {meanwhile}")
    assert {place: changed(outside_before[place], outside_after[place]) for place in outside_before} == dict.fromkeys(
        outside_before, []
    )
    assert tree(sandbox.home / ".local" / "share" / "opencode"), "opencode kept no state in the sandbox's home"
    assert tree(sandbox.tmp), "opencode made no temp file in the sandbox's TMPDIR: where did they go?"
