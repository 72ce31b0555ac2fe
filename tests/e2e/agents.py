"""Run the real coding agents (opencode, omp, Codex CLI, Claude Code) headless, each in a throw-away HOME,
under a hard timeout.

How to drive them and what they send is in ../shared/clients.md (and docs/agents.md). Each agent runs in
its own process group, so a timeout or an explicit stop kills it together with its children (opencode
and omp both start helper processes). Nothing here talks to the internet: the agents get a static
model list and their update checks, model catalogues and plugin downloads are switched off.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = ROOT / "scripts" / "install-agents"
# scripts/install-agents' default: tapfix's cache, beside the engines (tests/process/engine_suite.py cache_root).
CACHE = Path(os.environ.get("TAPFIX_CACHE") or Path.home() / ".cache" / "tapfix")
AGENTS_DIR = Path(os.environ.get("TAPFIX_AGENTS_DIR") or CACHE / "agents")
if not AGENTS_DIR.is_absolute():
    AGENTS_DIR = ROOT / AGENTS_DIR
BIN = AGENTS_DIR / "node_modules" / ".bin"

API_KEY = "sk-tapfix-e2e-not-a-secret"
AGENTS = ["opencode", "omp"]  # the Chat Completions agents (Codex speaks only Responses)
PROMPT = "Create hello.txt containing a greeting"
GREETING = "Hello, world!\n"  # what the mock's write call puts in a greeting file (docs/mock.md)
RUN_TIMEOUT = 90  # seconds; a healthy run takes 2-4 s, one with a retried turn up to ~10 s (opencode)
MODEL = "fake-model"  # an id neither agent special-cases (clients.md §2): no sampling params, no qwen forms

# Keep opencode offline and quiet (clients.md "How to run each one headless").
OPENCODE_ENV = {
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
}


def opencode_config(base_url: str, model: str = MODEL, *, reasoning: bool = False) -> dict:
    """~/.config/opencode/opencode.json: one OpenAI-compatible provider `custom` at `base_url` (…/v1)."""
    entry: dict = {"name": model, "limit": {"context": 128000, "output": 16384}}
    if reasoning:
        entry["reasoning"] = True
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "custom": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Custom",
                "options": {"baseURL": base_url, "apiKey": "{env:CUSTOM_API_KEY}"},
                "models": {model: entry},
            }
        },
        "model": f"custom/{model}",
        "small_model": f"custom/{model}",
        "autoupdate": False,
        "share": "disabled",
    }


def omp_models(base_url: str, model: str = MODEL, *, reasoning: bool = False) -> dict:
    """~/.omp/agent/models.yml (JSON is valid YAML): provider `custom`, `apiKey` names an env variable."""
    return {
        "providers": {
            "custom": {
                "baseUrl": base_url,
                "api": "openai-completions",
                "apiKey": "CUSTOM_API_KEY",
                "authHeader": True,
                "models": [
                    {
                        "id": model,
                        "name": model,
                        "reasoning": reasoning,
                        "input": ["text"],
                        "contextWindow": 128000,
                        "maxTokens": 16384,
                        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                    }
                ],
            }
        }
    }


@dataclass
class AgentRun:
    agent: str
    argv: list[str]
    returncode: int | None  # None: still running when stopped (killed by us)
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool
    workdir: Path
    home: Path
    extra: dict = field(default_factory=dict)

    def file(self, name: str) -> Path:
        return self.workdir / name

    def describe(self) -> str:
        return (
            f"{self.agent} exit={self.returncode} timed_out={self.timed_out} in {self.seconds:.1f}s\n"
            f"argv: {self.argv}\n--- stdout ---\n{self.stdout[-3000:]}\n"
            f"--- stderr ---\n{self.stderr[-6000:]}"
        )


def port_open(url: str, timeout: float = 1.0) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port or 80), timeout=timeout):
            return True
    except OSError:
        return False


def check_port(url: str) -> None:
    """Agents retry a refused connection silently until killed (clients.md): never start one blind."""
    if not port_open(url):
        raise RuntimeError(f"nothing listens at {url}; refusing to start an agent against it")


class Sandbox:
    """A throw-away HOME plus a git work directory for one agent run."""

    def __init__(self, root: Path, name: str):
        self.root = root / name
        self.home = self.root / "home"
        self.work = self.root / "work"
        # The agents' temp files stay in the sandbox too: opencode 1.18.33 (a Bun executable) extracts a
        # 5.5 MB native library into $TMPDIR on every start and never removes it.
        self.tmp = self.root / "tmp"
        for d in (
            self.home,
            self.work,
            self.home / ".config",
            self.home / ".local" / "share",
            self.home / ".cache",
            self.home / ".local" / "state",
            self.tmp,
        ):
            d.mkdir(parents=True, exist_ok=True)
        # opencode wants a project (a git work tree); omp is happy either way.
        subprocess.run(["git", "init", "-q", str(self.work)], check=True, timeout=30)

    def env(self, extra: dict | None = None) -> dict:
        keep = {k: os.environ[k] for k in ("LANG", "LC_ALL", "TERM") if k in os.environ}
        env = {
            **keep,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(self.home),
            "TMPDIR": str(self.tmp),
            "USERPROFILE": str(self.home),
            "XDG_CONFIG_HOME": str(self.home / ".config"),
            "XDG_DATA_HOME": str(self.home / ".local" / "share"),
            "XDG_CACHE_HOME": str(self.home / ".cache"),
            "XDG_STATE_HOME": str(self.home / ".local" / "state"),
            "CUSTOM_API_KEY": API_KEY,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "NO_COLOR": "1",
            "CI": os.environ.get("CI", "1") or "1",
            "GIT_CONFIG_NOSYSTEM": "1",
        }
        return {**env, **(extra or {})}


class AgentProcess:
    """A running agent in its own process group; `wait` enforces the deadline, `stop` kills the group."""

    def __init__(self, agent: str, argv: list[str], sandbox: Sandbox, env: dict):
        self.agent, self.argv, self.sandbox = agent, argv, sandbox
        self.out_path = sandbox.root / f"{agent}.stdout"
        self.err_path = sandbox.root / f"{agent}.stderr"
        self._out, self._err = open(self.out_path, "wb"), open(self.err_path, "wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            argv,
            cwd=sandbox.work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=self._err,
            start_new_session=True,
        )
        self._lock = threading.Lock()

    def _killgroup(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)  # the group id is the leader's pid (start_new_session)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        """SIGTERM the whole group, then SIGKILL what is left."""
        with self._lock:
            if self.proc.poll() is None:
                self._killgroup(signal.SIGTERM)
                try:
                    self.proc.wait(3)
                except subprocess.TimeoutExpired:
                    pass
            self._killgroup(signal.SIGKILL)  # children that outlived the leader
            if self.proc.poll() is None:
                self.proc.wait(5)

    def wait(self, timeout: float) -> AgentRun:
        timed_out = False
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        seconds = time.monotonic() - self.started
        returncode = None if timed_out else self.proc.returncode
        self.stop()
        return self.result(returncode, seconds, timed_out)

    def result(self, returncode, seconds, timed_out) -> AgentRun:
        self._out.close()
        self._err.close()
        return AgentRun(
            self.agent,
            self.argv,
            returncode,
            self.out_path.read_text(errors="replace"),
            self.err_path.read_text(errors="replace"),
            seconds,
            timed_out,
            self.sandbox.work,
            self.sandbox.home,
        )


def start_opencode(
    sandbox: Sandbox,
    base_url: str,
    prompt: str,
    *,
    model: str = MODEL,
    reasoning: bool = False,
    variant: str | None = None,
    config: dict | None = None,
) -> AgentProcess:
    """`config`: extra top-level keys of opencode.json (e.g. `tools` switches)."""
    check_port(base_url)
    cfg_dir = sandbox.home / ".config" / "opencode"
    cfg_dir.mkdir(parents=True, exist_ok=True)
    settings = {**opencode_config(base_url, model, reasoning=reasoning), **(config or {})}
    (cfg_dir / "opencode.json").write_text(json.dumps(settings, indent=2))
    argv = [str(BIN / "opencode"), "run", "--print-logs", "-m", f"custom/{model}"]
    if variant:
        argv += ["--variant", variant]
    argv.append(prompt)
    return AgentProcess("opencode", argv, sandbox, sandbox.env(OPENCODE_ENV))


def start_omp(
    sandbox: Sandbox,
    base_url: str,
    prompt: str,
    *,
    model: str = MODEL,
    reasoning: bool = False,
    thinking: str | None = None,
) -> AgentProcess:
    check_port(base_url)
    cfg_dir = sandbox.home / ".omp" / "agent"
    cfg_dir.mkdir(parents=True, exist_ok=True)
    models = omp_models(base_url, model, reasoning=reasoning)
    (cfg_dir / "models.yml").write_text(json.dumps(models, indent=2))
    argv = [str(BIN / "omp"), "-p", "--model", f"custom/{model}", "--no-session", "--no-title", "--auto-approve"]
    if thinking:
        argv += ["--thinking", thinking]
    argv.append(prompt)
    return AgentProcess("omp", argv, sandbox, sandbox.env())


def start_codex(sandbox: Sandbox, base_url: str, prompt: str, *, model: str = MODEL) -> AgentProcess:
    """Codex CLI speaks only the Responses API (`wire_api = "responses"`); `codex exec` is headless."""
    check_port(base_url)
    codex_home = sandbox.home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "tapfix"\nmodel_reasoning_effort = "high"\n\n'
        f'[model_providers.tapfix]\nname = "tapfix"\n'
        f'base_url = "{base_url}"\nenv_key = "CUSTOM_API_KEY"\nwire_api = "responses"\n'
    )
    argv = [str(BIN / "codex"), "exec", "--skip-git-repo-check", "-s", "workspace-write", prompt]
    return AgentProcess("codex", argv, sandbox, sandbox.env({"CODEX_HOME": str(codex_home)}))


# Claude Code offline and headless: no telemetry, error reports, update checks, surveys or other traffic
# beyond the API (the switches ../shared/evidence/clients3/run3.sh found it needs).
CLAUDE_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    "DO_NOT_TRACK": "1",
    "IS_SANDBOX": "1",
}


def start_claude(
    sandbox: Sandbox,
    base_url: str,
    prompt: str,
    *,
    model: str | None = MODEL,
    api_key_header: bool = False,
    permission_mode: str = "acceptEdits",
    args: tuple[str, ...] = (),
    env: dict | None = None,
) -> AgentProcess:
    """Claude Code (`claude -p`) on the Messages API. `base_url` is the server's root or its `/v1` (Claude
    Code adds `/v1/messages` itself); every model slot (main, small/fast, haiku, sonnet, opus) is `model`
    (None: Claude Code's own defaults, as a user without those variables gets them).
    The key goes as a bearer token (`ANTHROPIC_AUTH_TOKEN`), or as `x-api-key` with `api_key_header`.
    `permission_mode` `acceptEdits` lets it write files; `default` refuses every write (headless, nobody
    grants it). stdout is one JSON object, the run's result (`claude_result`)."""
    check_port(base_url)
    root = base_url.rstrip("/").removesuffix("/v1")
    key = {"ANTHROPIC_API_KEY": API_KEY} if api_key_header else {"ANTHROPIC_AUTH_TOKEN": API_KEY}
    slots = (
        ()
        if model is None
        else (
            "ANTHROPIC_MODEL",
            "ANTHROPIC_SMALL_FAST_MODEL",
            "ANTHROPIC_DEFAULT_HAIKU_MODEL",
            "ANTHROPIC_DEFAULT_SONNET_MODEL",
            "ANTHROPIC_DEFAULT_OPUS_MODEL",
        )
    )
    models = dict.fromkeys(slots, model)
    argv = [str(BIN / "claude"), "-p", "--output-format", "json", "--permission-mode", permission_mode, *args, prompt]
    extra = {**CLAUDE_ENV, **key, **models, "ANTHROPIC_BASE_URL": root, **(env or {})}
    return AgentProcess("claude", argv, sandbox, sandbox.env(extra))


def claude_result(run: AgentRun) -> dict:
    """Claude Code's result object (`type: result`): `result` (the final text), `is_error`, `num_turns`..."""
    text = run.stdout.strip()
    data = json.loads(text[text.index("{") :]) if "{" in text else {}
    if isinstance(data, list):  # --verbose prints every message; the result is the last one
        data = data[-1] if data else {}
    assert data.get("type") == "result", run.describe()
    return data


STARTERS = {"opencode": start_opencode, "omp": start_omp, "codex": start_codex, "claude": start_claude}


def run_agent(agent: str, sandbox: Sandbox, base_url: str, prompt: str, *, timeout: float = 90, **kw) -> AgentRun:
    return STARTERS[agent](sandbox, base_url, prompt, **kw).wait(timeout)


def turn_requests(stack, rows=None) -> list[tuple[dict, dict]]:
    """(row, client request body) for the requests that carry tools: the agent's turns. opencode's title
    request (no tools) is left out."""
    out = []
    for row in rows if rows is not None else stack.store.rows():
        body = stack.store.json_body(row["id"])
        if body.get("tools"):
            out.append((row, body))
    return out


def check_run(run, stack, *, ok: bool = True) -> None:
    assert not run.timed_out, f"agent hit the timeout\n{run.describe()}\n{stack.describe()}"
    if ok:
        assert run.returncode == 0, f"{run.describe()}\n{stack.describe()}"


class FileWatcher:
    """Polls a file while an agent runs and keeps every distinct content it saw, so a test can assert
    that no half-written version ever existed (not only that the final one is right)."""

    def __init__(self, path: Path, interval: float = 0.005):
        self.path, self.interval = path, interval
        self.seen: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.path.read_bytes()
            except OSError:
                data = None
            if data is not None and (not self.seen or self.seen[-1] != data):
                self.seen.append(data)
            time.sleep(self.interval)

    def __enter__(self) -> FileWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
        if self.path.exists():  # the final state, in case the last write landed after the last poll
            data = self.path.read_bytes()
            if not self.seen or self.seen[-1] != data:
                self.seen.append(data)
