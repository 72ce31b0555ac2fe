"""Issue 38: routes proven by real clients. Two `tapfix mock` upstreams, `big` and `small`, each keeping its own
log of the requests it was sent; the real proxy in front, from a config file; Claude Code, opencode and omp
as the clients. Each class of request must show, in the capture (route, upstream URL, served model) and in the
upstream's own log, that it went where the config sends it.

What the clients sent (these runs, the pinned versions; docs/routing.md "What real clients send"):
- Claude Code 2.1.332 `-p`: no background (haiku-class) request at all; every request is the main loop's, its
  model `claude-opus-5-5` when no ANTHROPIC_*MODEL variable is set. Its `haiku` alias (`--model haiku`) sends
  a `claude-haiku-*` id, which is what its background calls would use.
- opencode 1.18.33: its title request offers no tools and its system prompt starts "You are a title
  generator"; its model and max_tokens are the main loop's (`small_model` names the model to use).
- omp 18.2.3: a role alias (`--model @smol`) is resolved in omp; the request carries the role's model id.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.e2e.agents import (
    BIN,
    PROMPT,
    RUN_TIMEOUT,
    AgentProcess,
    Sandbox,
    check_port,
    check_run,
    claude_result,
    omp_models,
    start_claude,
    start_opencode,
)
from tests.support.inproc import InprocMock, start, start_mock

pytestmark = [pytest.mark.agents, pytest.mark.e2e]

GENERATION_PATHS = ("/v1/messages", "/v1/chat/completions")
SERVED = "tapfix-mock"  # what both mocks serve; the upstream (not the served id) tells the classes apart
CONFIG = """
[upstreams.big]
base_url = "{big}/v1"
engine = "vllm"

[upstreams.small]
base_url = "{small}/v1"
engine = "vllm"

# Claude Code: the main loop to big, its haiku class to small.
[models."claude-*"]
upstream = "big"
upstream_model = "{served}"

[[models."claude-*".routes]]
name = "haiku-class"
when = {{ model = "claude-haiku-*" }}
upstream = "small"

# opencode: a request offering tools (the agent loop) to big; the rest (its title request) to small.
[models.coder]
upstream = "small"
upstream_model = "{served}"

[[models.coder.routes]]
name = "agent-loop"
when = {{ needs = ["tools"] }}
upstream = "big"

# omp: the model ids its roles name; the smol role's to small.
[models."omp-*"]
upstream = "big"
upstream_model = "{served}"

[[models."omp-*".routes]]
name = "smol-role"
when = {{ model = "*-smol" }}
upstream = "small"
"""


class RequestLog:
    """The upstream's own record of what reached it: an ASGI layer in front of the mock's app."""

    def __init__(self, app):
        self.app = app
        self.seen: list[tuple[str, str, dict]] = []  # (method, path, JSON body or {})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            parsed = json.loads(body) if body else {}
        except ValueError:
            parsed = {}
        self.seen.append((scope["method"], scope["path"], parsed))
        given = False

        async def replay():
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def paths(self) -> list[str]:
        return [f"{method} {path}" for method, path, _ in self.seen]

    def generations(self) -> list[dict]:
        return [body for method, path, body in self.seen if method == "POST" and path.endswith(GENERATION_PATHS)]


def logged_mock(tmp: Path) -> tuple[InprocMock, RequestLog]:
    """Each connection takes the server's app when it opens, so wrapping it before any request logs them all."""
    mock = start_mock(tmp)
    log = RequestLog(mock.server.config.loaded_app)
    mock.server.config.loaded_app = log
    return mock, log


@pytest.fixture
def routed(tmp_path, agents_installed):
    big, big_log = logged_mock(tmp_path)
    small, small_log = logged_mock(tmp_path)
    cfg = tmp_path / "tapfix.toml"
    cfg.write_text(CONFIG.format(big=big.url, small=small.url, served=SERVED))
    db = tmp_path / "captures.db"
    proxy = start(["--config", str(cfg), "--db", str(db)], tmp_path / "proxy.log")
    try:
        logs = SimpleNamespace(describe=lambda: f"--- proxy log ---\n{proxy.log()[-3000:]}")
        yield {"proxy": proxy, "db": db, "big": (big, big_log), "small": (small, small_log), "logs": logs}
    finally:
        proxy.stop()
        big.stop()
        small.stop()


def captures(db: Path) -> list[dict]:
    """Every exchange the proxy recorded (read after it stopped), oldest first, with the client's body."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        rows = [dict(r) for r in conn.execute("select * from exchanges where method = 'POST' order by ts, id")]
    finally:
        conn.close()
    from tapfix.proxy.store.sqlite.database import open_for_reading
    from tapfix.proxy.store.sqlite.reader import capture_body, load_capture

    conn = open_for_reading(db)
    try:
        for row in rows:
            row["body"] = json.loads(capture_body(conn, load_capture(conn, row["id"]), "request"))
            row["decision"] = json.loads(row["route_decision"])
    finally:
        conn.close()
    return rows


def went(row: dict, route: str, upstream: InprocMock, name: str) -> None:
    assert row["route"] == route, (row["model"], row["route"], row["decision"])
    assert row["decision"]["route"] == route and row["decision"]["upstream"] == name, row["decision"]
    assert row["upstream_url"].startswith(upstream.url), row["upstream_url"]
    assert row["served_model"] == SERVED and row["status"] == 200, row
    assert ["x-tapfix-route", route] in json.loads(row["response_headers"]), row["response_headers"]  # the client's


def last_user_text(body: dict) -> str:
    """The prompt text of a request, to match the upstream's log against the capture."""
    return json.dumps(body.get("messages", []))[-2000:]


def test_claude_codes_main_loop_and_haiku_class_go_to_their_upstreams(routed, tmp_path):
    proxy, (big, big_log), (small, small_log) = routed["proxy"], routed["big"], routed["small"]
    # Claude Code's own defaults: no model variable set, as a user pointing it at a base URL has it.
    main = start_claude(Sandbox(tmp_path, "main"), proxy.url, PROMPT, model=None).wait(RUN_TIMEOUT)
    check_run(main, routed["logs"])
    haiku = start_claude(Sandbox(tmp_path, "haiku"), proxy.url, PROMPT, model=None, args=("--model", "haiku")).wait(
        RUN_TIMEOUT
    )
    check_run(haiku, routed["logs"])
    assert not claude_result(main)["is_error"] and not claude_result(haiku)["is_error"], haiku.describe()
    proxy.stop()

    rows = captures(routed["db"])
    # Claude Code names its session on each request: each run's rows are its own.
    main_rows = [r for r in rows if r["session_id"] == claude_result(main)["session_id"]]
    haiku_rows = [r for r in rows if r["session_id"] == claude_result(haiku)["session_id"]]
    assert main_rows and haiku_rows and len(main_rows) + len(haiku_rows) == len(rows), [r["session_id"] for r in rows]
    # Headless, the main loop sent no haiku-class request of its own: every one is a turn of the main model
    # (claude-opus-5-5 in 2.1.332), offering tools.
    assert all(r["body"].get("tools") and not r["model"].startswith("claude-haiku-") for r in main_rows), [
        r["model"] for r in main_rows
    ]
    assert all(r["user_agent"].startswith("claude-cli/") for r in rows)  # a signal `user_agent` can route on
    # Its `haiku` alias sends a claude-haiku-* id (claude-haiku-5-5 in 2.1.332).
    assert all(r["model"].startswith("claude-haiku-") for r in haiku_rows), [r["model"] for r in haiku_rows]
    for row in main_rows:
        went(row, "default", big, "big")
        assert row["decision"]["not_matched"] == ["haiku-class"]
    for row in haiku_rows:
        went(row, "haiku-class", small, "small")
        assert row["decision"]["matched"].startswith("model"), row["decision"]
    # Each upstream's own log holds exactly its class, asked for the served id.
    assert len(big_log.generations()) == len(main_rows), big_log.paths()
    assert len(small_log.generations()) == len(haiku_rows)
    assert {b["model"] for b in big_log.generations() + small_log.generations()} == {SERVED}
    assert sorted(last_user_text(b) for b in small_log.generations()) == sorted(
        last_user_text(r["body"]) for r in haiku_rows
    )


def test_opencodes_title_request_goes_to_the_small_upstream(routed, tmp_path):
    proxy, (big, big_log), (small, small_log) = routed["proxy"], routed["big"], routed["small"]
    sandbox = Sandbox(tmp_path, "opencode")
    run = start_opencode(sandbox, f"{proxy.url}/v1", PROMPT, model="coder").wait(RUN_TIMEOUT)
    check_run(run, routed["logs"])
    proxy.stop()

    rows = captures(routed["db"])
    titles = [r for r in rows if not r["body"].get("tools")]
    turns = [r for r in rows if r["body"].get("tools")]
    assert len(titles) == 1 and turns, [(r["model"], r["route"]) for r in rows]
    assert all(r["user_agent"].startswith("opencode/") for r in rows)
    (title,) = titles
    assert title["body"]["messages"][0]["content"].startswith("You are a title generator")
    # Nothing else tells it apart: same model, same max_tokens as the turns.
    assert {r["model"] for r in rows} == {"coder"}
    assert {r["body"].get("max_tokens") for r in rows} == {title["body"].get("max_tokens")}
    went(title, "default", small, "small")
    assert title["decision"]["not_matched"] == ["agent-loop"]
    for row in turns:
        went(row, "agent-loop", big, "big")
    # The small upstream was asked for the title and nothing else; the big one for every turn.
    (asked,) = small_log.generations()
    assert not asked.get("tools") and asked["messages"][0]["content"].startswith("You are a title generator")
    assert len(big_log.generations()) == len(turns) and all(b.get("tools") for b in big_log.generations())


def start_omp_roles(sandbox: Sandbox, base_url: str, model: str) -> AgentProcess:
    """omp with two models, `omp-main` and `omp-smol`, the second as its smol role; `model` is what `--model`
    names: a model or a role alias (`@smol`)."""
    check_port(base_url)
    cfg_dir = sandbox.home / ".omp" / "agent"
    cfg_dir.mkdir(parents=True, exist_ok=True)
    models = omp_models(base_url, "omp-main")
    models["providers"]["custom"]["models"] += omp_models(base_url, "omp-smol")["providers"]["custom"]["models"]
    (cfg_dir / "models.yml").write_text(json.dumps(models, indent=2))
    argv = [str(BIN / "omp"), "-p", "--model", model, "--smol", "custom/omp-smol"]
    argv += ["--no-session", "--no-title", "--auto-approve", PROMPT]
    return AgentProcess("omp", argv, sandbox, sandbox.env())


def test_omps_role_alias_is_routed_by_the_model_id_it_sends(routed, tmp_path):
    proxy, (big, big_log), (small, small_log) = routed["proxy"], routed["big"], routed["small"]
    main = start_omp_roles(Sandbox(tmp_path, "main"), f"{proxy.url}/v1", "custom/omp-main").wait(RUN_TIMEOUT)
    check_run(main, routed["logs"])
    smol = start_omp_roles(Sandbox(tmp_path, "smol"), f"{proxy.url}/v1", "@smol").wait(RUN_TIMEOUT)
    check_run(smol, routed["logs"])
    proxy.stop()

    rows = captures(routed["db"])
    # The role alias never reaches the wire: omp sends the id the role names.
    assert {r["model"] for r in rows} == {"omp-main", "omp-smol"}, [r["model"] for r in rows]
    assert all(r["user_agent"].startswith("omp/") for r in rows)
    for row in rows:
        if row["model"] == "omp-smol":
            went(row, "smol-role", small, "small")
        else:
            went(row, "default", big, "big")
    smol_rows = [r for r in rows if r["model"] == "omp-smol"]
    assert len(small_log.generations()) == len(smol_rows)
    assert len(big_log.generations()) == len(rows) - len(smol_rows)


def test_opencodes_turns_keep_their_llama_cpp_slot_and_its_title_request_is_no_main_agent(tmp_path, agents_installed):
    """opencode against an upstream declared a llama-server with 2 slots, one kept for the main agent: every turn
    of its agent loop carries one `id_slot` (the main thread's, reserved), its title request, sent with turn 1
    and offering no tools, is a side request on the other slot. The upstream's own log shows what it got."""
    mock, log = logged_mock(tmp_path)
    cfg = tmp_path / "tapfix.toml"
    cfg.write_text(
        f'[upstreams.llama]\nbase_url = "{mock.url}/v1"\nengine = "llamacpp"\nslots = 2\nreserve_main_slot = true\n\n'
        f'[models.coder]\nupstream = "llama"\nupstream_model = "{SERVED}"\n'
    )
    db = tmp_path / "captures.db"
    proxy = start(["--config", str(cfg), "--db", str(db)], tmp_path / "proxy.log")
    try:
        logs = SimpleNamespace(describe=lambda: f"--- proxy log ---\n{proxy.log()[-3000:]}")
        run = start_opencode(Sandbox(tmp_path, "opencode"), f"{proxy.url}/v1", PROMPT, model="coder").wait(RUN_TIMEOUT)
        check_run(run, logs)
    finally:
        proxy.stop()
        mock.stop()
    rows = captures(db)
    turns = [r for r in rows if r["body"].get("tools")]
    (title,) = [r for r in rows if not r["body"].get("tools")]
    assert len(turns) >= 2, [r["id"] for r in rows]  # the tool call, then the answer after it
    main_slots = {(r["decision"]["slot"]["slot"], r["decision"]["slot"]["role"]) for r in turns}
    assert len(main_slots) == 1 and next(iter(main_slots))[1] == "main", main_slots
    assert title["decision"]["slot"]["role"] == "subagent"
    assert title["decision"]["slot"]["slot"] != next(iter(main_slots))[0]
    sent = [b.get("id_slot") for b in log.generations() if b.get("tools")]
    assert sent == [next(iter(main_slots))[0]] * len(turns), sent
    assert all(r["session_id"] for r in rows) and {
        h[1] for r in rows for h in json.loads(r["request_headers"]) if h[0].lower() == "x-session-id"
    }, "opencode named its session"
