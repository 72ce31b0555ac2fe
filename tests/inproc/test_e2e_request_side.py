"""Request side through a real proxy: sampling defaults, reasoning dialects, routing, preflight."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from tests.support.inproc import InprocProxy, cli, start, start_mock
from tests.support.procs import free_port, wait_capture
from tests.support.rawserver import RawServer

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
OPENCODE_BODY = (
    b'{"model":"qwen","max_tokens":32000,"messages":[{"role":"system","content":"You are opencode"},'
    b'{"role":"user","content":"\\"fix the bug\\""}],"tools":[],"tool_choice":"auto",'
    b'"stream":false,"stream_options":{"include_usage":true}}'
)


@pytest.fixture
def upstream():
    server = RawServer(lambda _: [(0.0, OK)])
    yield server
    server.close()


def _run(tmp_path, *args, env=None):
    k = len(list(tmp_path.glob("r*.db")))
    db = tmp_path / f"r{k}.db"
    proc = start(["--db", str(db), *args], tmp_path / f"p{k}.log", env)
    proc.extra["db"] = db
    return proc


# A Qwen3 model card's generation_config.json: its sampling defaults, and keys that are none (the token ids).
GENERATION_CONFIG = {
    "bos_token_id": 1,
    "eos_token_id": 2,
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 20,
    "min_p": 0.0,
    "repetition_penalty": 1.05,
    "max_new_tokens": 4096,
}


def _generation_config(tmp_path):
    path = tmp_path / "generation_config.json"
    path.write_text(json.dumps(GENERATION_CONFIG))
    return path


def test_opencode_body_without_sampling_gets_generation_config_defaults(tmp_path, upstream):
    proxy = _run(
        tmp_path,
        "--upstream",
        upstream.url,
        "--engine",
        "vllm",
        "--generation-config",
        str(_generation_config(tmp_path)),
    )
    try:
        response = httpx.post(
            f"{proxy.url}/v1/chat/completions",
            content=OPENCODE_BODY,
            headers={"content-type": "application/json", "user-agent": "opencode/1.18.33"},
        )
        sent = json.loads(upstream.requests[-1].body)
        assert (sent["temperature"], sent["top_p"], sent["top_k"], sent["min_p"]) == (0.6, 0.95, 20, 0.0)
        assert sent["repetition_penalty"] == 1.05
        assert sent["max_tokens"] == 32000  # the client's own value wins under fill
        # Only the injected keys differ: the client's bytes are still there, unchanged.
        assert upstream.requests[-1].body.startswith(OPENCODE_BODY[:-1])
        capture_id = response.headers["x-tapfix-capture-id"]
        row = wait_capture(proxy.extra["db"], capture_id)
        assert "no_sampling_params" in json.loads(row["flags"])
        forwarded = cli("captures", "export", capture_id, "--forwarded", "--db", str(proxy.extra["db"])).stdout
        assert forwarded == upstream.requests[-1].body
        shown = cli("captures", "show", capture_id, "--db", str(proxy.extra["db"])).stdout.decode()
        assert "[sampling] inject $.top_p" in shown and "generation_config.json" in shown
    finally:
        proxy.stop()


def test_client_values_win_and_reasoning_is_rewritten(tmp_path, upstream):
    proxy = _run(
        tmp_path,
        "--upstream",
        upstream.url,
        "--engine",
        "llamacpp",
        "--generation-config",
        str(_generation_config(tmp_path)),
    )
    try:
        body = {
            "model": "glm",
            "temperature": 0.1,
            "reasoning_effort": 80,
            "messages": [{"role": "user", "content": "hi"}],
        }
        httpx.post(f"{proxy.url}/v1/chat/completions", json=body)
        sent = json.loads(upstream.requests[-1].body)
        assert sent["temperature"] == 0.1 and sent["top_p"] == 0.95
        assert "reasoning_effort" not in sent or sent["reasoning_effort"] == "high"
        assert (
            sent.get("chat_template_kwargs", {}).get("enable_thinking") is True
            or sent.get("reasoning_effort") == "high"
        )
    finally:
        proxy.stop()


CONFIG = """
[upstreams.gpu0]
base_url = "{url}"
engine = "vllm"
api_key_env = "TAPFIX_TEST_GPU0_KEY"

[models."qwen3-32b"]
upstream = "gpu0"
upstream_model = "Qwen/Qwen3-32B"
aliases = ["qwen"]

[models."qwen3-32b".sampling]
temperature = {{ mode = "override", value = 0.6 }}
top_p = {{ mode = "clamp", max = 0.9 }}
presence_penalty = {{ mode = "drop" }}
"""


def test_config_mode_routes_aliases_policies_and_credentials(tmp_path, upstream):
    config = tmp_path / "tapfix.toml"
    config.write_text(CONFIG.format(url=upstream.url))
    proxy = _run(tmp_path, "--config", str(config), env={"TAPFIX_TEST_GPU0_KEY": "upstream-key-123"})
    try:
        body = {"model": "qwen", "temperature": 1.0, "top_p": 0.99, "presence_penalty": 1.5, "messages": []}
        response = httpx.post(
            f"{proxy.url}/v1/chat/completions", json=body, headers={"authorization": "Bearer client-token"}
        )
        assert response.status_code == 200
        request = upstream.requests[-1]
        sent = json.loads(request.body)
        assert sent["model"] == "Qwen/Qwen3-32B"
        assert sent["temperature"] == 0.6 and sent["top_p"] == 0.9 and "presence_penalty" not in sent
        assert request.header("authorization") == "Bearer upstream-key-123"
        rows = wait_capture(proxy.extra["db"], response.headers["x-tapfix-capture-id"])
        assert rows["served_model"] == "Qwen/Qwen3-32B" and rows["changes_count"] >= 4

        unknown = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": "gpt-4o", "messages": []})
        assert unknown.status_code == 404
        error = unknown.json()["error"]
        assert error["type"] == "invalid_request_error" and "qwen3-32b" in error["message"]
        assert "qwen" in error["message"]
        posts = [r for r in upstream.requests if r.head.startswith(b"POST")]
        assert len(posts) == 1  # never re-routed silently
        assert upstream.requests[0].path == "/v1/models"  # the start-up preflight asked what is served

        listing = httpx.get(f"{proxy.url}/v1/models").json()
        assert {"qwen3-32b", "qwen"} <= {m["id"] for m in listing["data"]}
    finally:
        proxy.stop()


def test_check_catches_missing_credential_and_unserved_model(tmp_path):
    mock = start_mock(tmp_path)
    try:
        config = tmp_path / "tapfix.toml"
        config.write_text(CONFIG.format(url=mock.url))
        result = cli("check", "--config", str(config), env={"TAPFIX_TEST_GPU0_KEY": ""})
        out = result.stdout.decode()
        assert result.returncode == 1
        assert "TAPFIX_TEST_GPU0_KEY" in out and "Qwen/Qwen3-32B" in out
        assert "tapfix-mock" in out  # what the upstream really serves
        good = tmp_path / "good.toml"
        good.write_text(CONFIG.format(url=mock.url).replace("Qwen/Qwen3-32B", "tapfix-mock"))
        ok = cli("check", "--config", str(good), env={"TAPFIX_TEST_GPU0_KEY": "k"})
        assert ok.returncode == 0, ok.stdout
        strict = cli(
            "run",
            "--config",
            str(config),
            "--strict",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--db",
            str(tmp_path / "s.db"),
            env={"TAPFIX_TEST_GPU0_KEY": ""},
        )
        assert strict.returncode != 0 and b"TAPFIX_TEST_GPU0_KEY" in strict.stderr
    finally:
        mock.stop()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "[upstreams.a]\nbase_url = 'http://x'\nengine = 'vllm'\n[models.m]\nupstream = 'a'\n"
            "[models.m.sampling]\ntop_p = { mode = 'clamp', max = 'high' }\n",
            "models.m.sampling.top_p.max",
        ),
        ("[upstreams.a]\nbase_url = 'http://x'\nengine = 'vllm'\napi_key = 'sk-literal-secret'\n", "api_key"),
        ("not toml = = =", "not valid TOML"),
    ],
)
def test_bad_config_files_get_clear_errors(tmp_path, text, expected):
    config = tmp_path / "bad.toml"
    config.write_text(text)
    for args in (["check", "--config", str(config)], ["run", "--config", str(config), "--db", str(tmp_path / "x.db")]):
        result = cli(*args)
        assert result.returncode != 0
        assert str(config).encode() in result.stderr and expected.encode() in result.stderr
        assert b"sk-literal-secret" not in result.stderr


RENAME_CONFIG = """
[reasoning_field]
default = "keep"
clients = {{ "opencode" = "reasoning_content" }}

[upstreams.mock]
base_url = "{url}"
engine = "vllm"

[models."tapfix-mock"]
upstream = "mock"
"""


@contextmanager
def renaming_proxy(tmp_path, config: str = RENAME_CONFIG, *mock_args: str) -> Iterator[InprocProxy]:
    """`tapfix run --config` with the reasoning-field rename (`config`, its `{url}` the mock's) in front of the mock,
    started with `mock_args`; both stopped at the end."""
    mock = start_mock(tmp_path, *mock_args)
    path = tmp_path / "rename.toml"
    path.write_text(config.format(url=mock.url))
    proxy = _run(tmp_path, "--config", str(path))
    try:
        yield proxy
    finally:
        proxy.stop()
        mock.stop()


def test_reasoning_field_is_renamed_only_for_the_client_that_needs_it(tmp_path):
    with renaming_proxy(tmp_path) as proxy:
        body = {
            "model": "tapfix-mock",
            "stream": True,
            "reasoning_effort": "high",
            "messages": [{"role": "user", "content": "think about it"}],
        }
        seen = {}
        for agent in ("opencode/1.18.33 ai-sdk", "omp/18.2.3"):
            with httpx.stream(
                "POST", f"{proxy.url}/v1/chat/completions", json=body, headers={"user-agent": agent}
            ) as response:
                seen[agent] = (b"".join(response.iter_raw()), response.headers["x-tapfix-capture-id"])
        opencode, omp = seen["opencode/1.18.33 ai-sdk"][0], seen["omp/18.2.3"][0]
        assert b'"reasoning_content":' in opencode and b'"reasoning":' not in opencode
        assert b'"reasoning":' in omp and b'"reasoning_content":' not in omp
        row = wait_capture(proxy.extra["db"], seen["opencode/1.18.33 ai-sdk"][1])
        assert row["reasoning"] and row["client_response_body_id"] is not None
        shown = cli("captures", "show", row["id"], "--db", str(proxy.extra["db"])).stdout.decode()
        assert "[reasoning_field] rename" in shown


def test_upstream_key_env_replaces_the_client_credential(tmp_path, upstream):
    proxy = _run(
        tmp_path, "--upstream", upstream.url, "--key-env", "TAPFIX_TEST_KEY", env={"TAPFIX_TEST_KEY": "server-side-key"}
    )
    try:
        response = httpx.post(
            f"{proxy.url}/v1/chat/completions",
            json={"model": "anything", "messages": []},
            headers={"authorization": "Bearer whatever-the-agent-has"},
        )
        assert response.status_code == 200
        assert upstream.requests[-1].header("authorization") == "Bearer server-side-key"
        db_bytes = proxy.extra["db"].read_bytes() if proxy.extra["db"].exists() else b""
        wait_capture(proxy.extra["db"], response.headers["x-tapfix-capture-id"])
        for path in proxy.extra["db"].parent.glob(proxy.extra["db"].name + "*"):
            db_bytes += path.read_bytes()
        assert b"server-side-key" not in db_bytes and b"whatever-the-agent-has" not in db_bytes
    finally:
        proxy.stop()
