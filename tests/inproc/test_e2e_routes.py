"""Issue 38: a model's routes, checked before they are taken and explained on every exchange. Two mock
upstreams on loopback play `local` and `cloud`; the real proxy, from a config file, sits in front; an
OpenAI SDK client asks. The config is the issue's own, with thresholds small enough for a test."""

from __future__ import annotations

import json
import socket
import time

import openai
import pytest

from tests.conftest import corpus_dir
from tests.support.builders import tool
from tests.support.inproc import cli, start, start_mock
from tests.support.procs import until, wait_capture
from tests.support.rawserver import RawServer, json_reply

KEY_ENV = "TAPFIX_TEST_ROUTES_CLOUD_KEY"
CONFIG = """
[upstreams.local]
base_url = "{local}/v1"
engine = "vllm"

[upstreams.cloud]
base_url = "{cloud}/v1"
engine = "openai"
api_key_env = "{key_env}"

[models.coder]
upstream = "local"              # the default route
upstream_model = "tapfix-mock"
context_window = 4096

[[models.coder.routes]]
name = "long-context"
when = {{ prompt_tokens_over = 2000 }}
upstream = "cloud"
upstream_model = "tapfix-mock"

[models."claude-haiku-*"]
upstream = "local"
upstream_model = "tapfix-mock"
"""
LONG = "word " * 4000  # about 5,000 tokens by the estimate: over the route's 2,000 and the local 4,096
SHORT = "hello"


@pytest.fixture(scope="module")
def upstreams(module_tmp):
    local, cloud = start_mock(module_tmp), start_mock(module_tmp)
    yield local, cloud
    local.stop()
    cloud.stop()


def write_config(tmp_path, local: str, cloud: str) -> str:
    path = tmp_path / "tapfix.toml"
    path.write_text(CONFIG.format(local=local, cloud=cloud, key_env=KEY_ENV))
    return str(path)


def ask(proxy, content: str, **kw):
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="client-key", max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model="coder", messages=[{"role": "user", "content": content}], max_tokens=50, **kw
    )


def decision_of(proxy, capture_id: str) -> dict:
    row = wait_capture(proxy.extra["db"], capture_id)
    return json.loads(row["route_decision"])


def run_proxy(tmp_path, config: str, env: dict[str, str] | None = None):
    db = tmp_path / "captures.db"
    proxy = start(["--config", config, "--db", str(db)], tmp_path / "proxy.log", env=env)
    proxy.extra["db"] = db
    return proxy


def test_without_the_credential_check_fails_naming_route_and_variable(tmp_path, upstreams, monkeypatch):
    local, cloud = upstreams
    monkeypatch.delenv(KEY_ENV, raising=False)
    result = cli("check", "--config", write_config(tmp_path, local.url, cloud.url))
    out = result.stdout.decode()
    assert result.returncode == 1, out
    problem = next(line for line in out.splitlines() if "long-context" in line and line.startswith("error"))
    assert KEY_ENV in problem and "never be taken" in problem


def test_without_the_credential_a_long_request_is_told_both_rejections(tmp_path, upstreams, monkeypatch):
    local, cloud = upstreams
    monkeypatch.delenv(KEY_ENV, raising=False)
    proxy = run_proxy(tmp_path, write_config(tmp_path, local.url, cloud.url))
    try:
        with pytest.raises(openai.BadRequestError) as raised:
            ask(proxy, LONG)
        error = raised.value
        message = error.body["message"]
        # The overflow shape (the window turned the last route down), so agents compact ...
        assert error.code == "context_length_exceeded" and message.startswith("This model's maximum context length")
        # ... naming each route and why, and never the variable.
        assert 'no route for model "coder" can take this request: long-context: no credential for upstream cloud; ' in (
            message
        )
        assert "default: prompt " in message and "> window 4,096" in message
        assert KEY_ENV not in message
        headers = error.response.headers
        assert headers["x-tapfix-route"] == "none"
        assert headers["x-tapfix-route-rejected"] == "long-context=credential, default=window"
        decision = decision_of(proxy, headers["x-tapfix-capture-id"])
        assert decision["route"] is None
        assert KEY_ENV in decision["rejected"][0]["reason"]  # the capture names it
        # A short request still goes to the default, the local upstream.
        short = ask(proxy, SHORT)
        assert short.headers["x-tapfix-route"] == "default"
        assert "x-tapfix-route-rejected" not in short.headers
    finally:
        proxy.stop()


def test_with_the_credential_long_goes_to_cloud_and_short_to_local(tmp_path, upstreams):
    local, cloud = upstreams
    proxy = run_proxy(tmp_path, write_config(tmp_path, local.url, cloud.url), env={KEY_ENV: "cloud-secret"})
    try:
        long = ask(proxy, LONG)
        assert long.headers["x-tapfix-route"] == "long-context"
        row = wait_capture(proxy.extra["db"], long.headers["x-tapfix-capture-id"])
        assert row["upstream_url"].startswith(cloud.url)
        decision = json.loads(row["route_decision"])
        assert decision["route"] == "long-context" and decision["upstream"] == "cloud"
        assert decision["matched"] == "prompt_tokens_over 2,000"
        assert decision["inputs"]["prompt_tokens"] > 2000

        short = ask(proxy, SHORT)
        assert short.headers["x-tapfix-route"] == "default"
        row = wait_capture(proxy.extra["db"], short.headers["x-tapfix-capture-id"])
        assert row["upstream_url"].startswith(local.url)
        assert json.loads(row["route_decision"])["not_matched"] == ["long-context"]

        db = str(proxy.extra["db"])
        listed = cli("captures", "list", "--route", "long-context", "--json", "--db", db).stdout.decode()
        assert [json.loads(line)["id"] for line in listed.splitlines()] == [long.headers["x-tapfix-capture-id"]]
        shown = cli("captures", "show", long.headers["x-tapfix-capture-id"], "--db", db).stdout.decode()
        assert "route: long-context → cloud/tapfix-mock   matched: prompt_tokens_over 2,000" in shown
    finally:
        proxy.stop()


def test_a_glob_public_name_serves_a_clients_hard_coded_model(tmp_path, upstreams):
    local, cloud = upstreams
    proxy = run_proxy(tmp_path, write_config(tmp_path, local.url, cloud.url))
    try:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        answer = client.chat.completions.with_raw_response.create(
            model="claude-haiku-4-5-20251001", messages=[{"role": "user", "content": "hi"}]
        )
        row = wait_capture(proxy.extra["db"], answer.headers["x-tapfix-capture-id"])
        assert (row["model"], row["served_model"]) == ("claude-haiku-4-5-20251001", "tapfix-mock")
        assert row["upstream_url"].startswith(local.url)
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="claude-opus-4", messages=[{"role": "user", "content": "hi"}])
    finally:
        proxy.stop()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_dead_upstream_falls_over_to_the_next_eligible_route(tmp_path, upstreams):
    local, _ = upstreams
    config = tmp_path / "dead.toml"
    config.write_text(
        "[routing]\nbreaker_failures = 2\n\n"
        f'[upstreams.local]\nbase_url = "{local.url}/v1"\nengine = "vllm"\n\n'
        f'[upstreams.gpu1]\nbase_url = "http://127.0.0.1:{closed_port()}/v1"\nengine = "vllm"\n\n'
        '[models.coder]\nupstream = "local"\nupstream_model = "tapfix-mock"\n\n'
        '[[models.coder.routes]]\nname = "fast"\nupstream = "gpu1"\n'
    )
    proxy = run_proxy(tmp_path, str(config))
    try:
        answer = ask(proxy, SHORT)
        assert answer.parse().choices[0].message.content
        assert answer.headers["x-tapfix-route"] == "default"
        assert answer.headers["x-tapfix-route-rejected"] == "fast=failed"
        decision = decision_of(proxy, answer.headers["x-tapfix-capture-id"])
        assert [a["route"] for a in decision["attempts"]] == ["fast"]
        assert decision["rejected"][0]["reason"].startswith("upstream gpu1 failed: unreachable")
        # The second failure opens its breaker (`[routing] breaker_failures = 2`): the third request doesn't try it.
        ask(proxy, SHORT)
        third = ask(proxy, SHORT)
        assert third.headers["x-tapfix-route"] == "default"
        decision = decision_of(proxy, third.headers["x-tapfix-capture-id"])
        assert decision["attempts"] == []
        assert decision["rejected"][0]["reason"].startswith("upstream gpu1 failed: circuit open for")
    finally:
        proxy.stop()


def test_a_model_the_upstream_does_not_list_is_passed_over_and_explained(tmp_path, upstreams):
    local, cloud = upstreams
    config = tmp_path / "served.toml"
    config.write_text(
        f'[upstreams.local]\nbase_url = "{local.url}/v1"\nengine = "vllm"\n\n'
        f'[upstreams.cloud]\nbase_url = "{cloud.url}/v1"\nengine = "vllm"\n\n'
        '[models.coder]\nupstream = "local"\nupstream_model = "tapfix-mock"\n\n'
        '[[models.coder.routes]]\nname = "agents"\nwhen = { user_agent = "OpenAI/Python*" }\n'
        'upstream = "cloud"\nupstream_model = "not-served-here"\n'
    )
    proxy = run_proxy(tmp_path, str(config))
    try:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        with client.chat.completions.with_streaming_response.create(
            model="coder", messages=[{"role": "user", "content": "hi"}], stream=True
        ) as streamed:
            assert streamed.headers["x-tapfix-route"] == "default"
            assert streamed.headers["x-tapfix-route-rejected"] == "agents=served"
            capture_id = streamed.headers["x-tapfix-capture-id"]
            assert list(streamed.iter_lines())
        decision = decision_of(proxy, capture_id)
        assert decision["rejected"][0]["reason"].startswith("upstream cloud does not serve not-served-here")
        assert decision["inputs"]["user_agent"].startswith("OpenAI/Python")
        # `route explain` reads the capture's request and headers and sends nothing: without the served lists
        # it would take the route whose rule matched.
        explain = ("route", "explain", "--config", str(config), "--capture", capture_id, "--db", str(proxy.extra["db"]))
        explained = cli(*explain, "--json")
        assert explained.returncode == 0, explained.stderr
        assert json.loads(explained.stdout)["route"] == "agents"
        other = cli(*explain, "--user-agent", "curl/8")
        assert "route: default → local/tapfix-mock" in other.stdout.decode()
    finally:
        proxy.stop()


def test_replicas_are_tried_in_order_and_messages_get_its_own_error_shape(tmp_path, upstreams):
    import anthropic

    local, cloud = upstreams
    config = tmp_path / "replicas.toml"
    config.write_text(
        f'[upstreams.gpu0]\nbase_url = "http://127.0.0.1:{closed_port()}/v1"\nengine = "vllm"\n\n'
        f'[upstreams.gpu1]\nbase_url = "{cloud.url}/v1"\nengine = "vllm"\n\n'
        f'[upstreams.local]\nbase_url = "{local.url}/v1"\nengine = "vllm"\nsupports = ["tools"]\n\n'
        '[models.coder]\nupstream = "local"\nupstream_model = "tapfix-mock"\n\n'
        '[[models.coder.routes]]\nname = "vision"\nwhen = { needs = ["images"] }\nupstream = ["gpu0", "gpu1"]\n'
    )
    proxy = run_proxy(tmp_path, str(config))
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    try:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        answer = client.chat.completions.with_raw_response.create(
            model="coder", messages=[{"role": "user", "content": [{"type": "text", "text": "what?"}, image]}]
        )
        assert (answer.headers["x-tapfix-route"], answer.headers["x-tapfix-route-rejected"]) == (
            "vision",
            "vision=failed",
        )
        row = wait_capture(proxy.extra["db"], answer.headers["x-tapfix-capture-id"])
        assert row["upstream_url"].startswith(cloud.url)
        assert json.loads(row["route_decision"])["upstream"] == "gpu1"
        # Both replicas gone (gpu1 now points at a closed port too) and the default declares no images: on
        # Messages the client gets Anthropic's 503 overloaded_error, which it retries.
        config.write_text(config.read_text().replace(cloud.url, f"http://127.0.0.1:{closed_port()}"))
        proxy.stop()
        proxy = run_proxy(tmp_path, str(config))
        messages = anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0)
        picture = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
        with pytest.raises(anthropic.APIStatusError) as raised:
            messages.messages.create(model="coder", max_tokens=20, messages=[{"role": "user", "content": [picture]}])
        assert raised.value.status_code == 503
        body = raised.value.body
        assert body["error"]["type"] == "overloaded_error"
        assert body["error"]["message"] == (
            'no route for model "coder" can take this request: vision: upstream gpu0 failed; vision: upstream gpu1 '
            "failed; default: upstream local does not support images"
        )
    finally:
        proxy.stop()


FLAKY = {
    "models": ["m503", "m429", "m400"],
    "rules": [
        {"when": {"model": "m429"}, "do": "http_error", "status": 429, "headers": {"retry-after": "30"}},
        {"when": {"model": "m400"}, "do": "http_error", "status": 400},
        {"do": "http_error", "status": 503},
    ],
}


def test_an_engine_overflow_moves_only_to_a_larger_window(tmp_path, upstreams):
    local, _ = upstreams
    small = start_mock(tmp_path, "--context-window", "1000")  # plays vLLM: its 400 for a prompt that won't fit
    config = tmp_path / "overflow.toml"
    config.write_text(
        f'[upstreams.local]\nbase_url = "{local.url}/v1"\nengine = "vllm"\n\n'
        f'[upstreams.small]\nbase_url = "{small.url}/v1"\nengine = "vllm"\n\n'
        '[models.coder]\nupstream = "local"\nupstream_model = "tapfix-mock"\ncontext_window = 20000\n\n'
        # The config believes the route's window is larger than it is: the engine's overflow tells the truth.
        '[[models.coder.routes]]\nname = "fast"\nupstream = "small"\nupstream_model = "tapfix-mock"\n'
        "context_window = 10000\n"
    )
    proxy = run_proxy(tmp_path, str(config))
    try:
        answer = ask(proxy, "word " * 2000)
        assert answer.parse().choices[0].message.content
        assert (answer.headers["x-tapfix-route"], answer.headers["x-tapfix-route-rejected"]) == (
            "default",
            "fast=failed",
        )
        decision = decision_of(proxy, answer.headers["x-tapfix-capture-id"])
        assert decision["attempts"][0]["reason"] == "overflowed its window of 1,000 tokens"
        # A streamed request's overflow head falls over the same way, before any byte reached the client.
        long = [{"role": "user", "content": "word " * 2000}]
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        with client.chat.completions.with_streaming_response.create(
            model="coder", messages=long, max_tokens=50, stream=True
        ) as raw:
            assert "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
            assert (raw.headers["x-tapfix-route"], raw.headers["x-tapfix-route-rejected"]) == ("default", "fast=failed")
        # The overflow is the prompt's, not the upstream's: its breaker counted nothing, a short prompt goes there.
        assert ask(proxy, SHORT).headers["x-tapfix-route"] == "fast"
    finally:
        proxy.stop()
        small.stop()


def test_a_fallback_to_a_smaller_window_is_sent_with_max_tokens_clamped_to_it(tmp_path, upstreams):
    """The default route was eligible for the prompt plus the clamped budget; the first route's 503 moves the
    request there, and it must go clamped: the small engine refuses prompt + 4,000 > 1,000 as vLLM does."""
    scenario = tmp_path / "flaky.json"
    scenario.write_text(json.dumps(FLAKY))
    flaky = start_mock(tmp_path, "--scenario", str(scenario))
    small = start_mock(tmp_path, "--context-window", "1000")
    config = tmp_path / "clamp.toml"
    config.write_text(
        f'[upstreams.flaky]\nbase_url = "{flaky.url}/v1"\nengine = "vllm"\n\n'
        f'[upstreams.small]\nbase_url = "{small.url}/v1"\nengine = "vllm"\n\n'
        '[models.coder]\nupstream = "small"\nupstream_model = "tapfix-mock"\ncontext_window = 1000\n\n'
        '[[models.coder.routes]]\nname = "primary"\nupstream = "flaky"\nupstream_model = "m503"\n'
    )
    proxy = run_proxy(tmp_path, str(config))
    try:
        answer = ask(proxy, SHORT, extra_body={"max_tokens": 4000})
        assert answer.parse().choices[0].message.content
        assert (answer.headers["x-tapfix-route"], answer.headers["x-tapfix-route-rejected"]) == (
            "default",
            "primary=failed",
        )
        capture_id = answer.headers["x-tapfix-capture-id"]
        wait_capture(proxy.extra["db"], capture_id)
        shown = cli("captures", "show", capture_id, "--db", str(proxy.extra["db"])).stdout.decode()
        assert "[window] clamp $.max_tokens" in shown and "route default's 1000-token window" in shown
    finally:
        proxy.stop()
        flaky.stop()
        small.stop()


def test_a_threads_turns_stay_on_the_replica_that_served_it(tmp_path, upstreams):
    local, cloud = upstreams
    scenario = tmp_path / "first-fails.json"
    scenario.write_text(json.dumps({"rules": [{"when": {"first": 1}, "do": "http_error", "status": 503}]}))
    gpu0 = start_mock(tmp_path, "--scenario", str(scenario))  # fails its first request only
    config = tmp_path / "replicas.toml"
    config.write_text(
        f'[upstreams.gpu0]\nbase_url = "{gpu0.url}/v1"\nengine = "vllm"\n\n'
        f'[upstreams.gpu1]\nbase_url = "{cloud.url}/v1"\nengine = "vllm"\n\n'
        f'[upstreams.local]\nbase_url = "{local.url}/v1"\nengine = "vllm"\n\n'
        '[models.coder]\nupstream = "local"\nupstream_model = "tapfix-mock"\n\n'
        '[[models.coder.routes]]\nname = "gpus"\nupstream = ["gpu0", "gpu1"]\n'
    )
    proxy = run_proxy(tmp_path, str(config))

    def turn(task: str, history: list[dict]) -> str:
        messages = [{"role": "system", "content": "you code"}, {"role": "user", "content": task}, *history]
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        answer = client.chat.completions.with_raw_response.create(model="coder", messages=messages)
        row = wait_capture(proxy.extra["db"], answer.headers["x-tapfix-capture-id"])
        assert answer.headers["x-tapfix-route"] == "gpus"
        return "gpu0" if row["upstream_url"].startswith(gpu0.url) else "gpu1"

    try:
        # Thread A's first turn: gpu0 fails it, gpu1 serves it; its later turns stay on gpu1 though gpu0 is well.
        assert turn("task A", []) == "gpu1"
        follow = [{"role": "assistant", "content": "done"}, {"role": "user", "content": "more"}]
        assert turn("task A", follow) == "gpu1"
        later = [*follow, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]
        assert turn("task A", later) == "gpu1"
        # Another thread starts on the first replica.
        assert turn("task B", []) == "gpu0"
        assert turn("task B", follow) == "gpu0"
    finally:
        proxy.stop()
        gpu0.stop()


def flaky_config(tmp_path, local_url: str, flaky_url: str) -> str:
    """`coder` and `limited` try a route on the flaky mock first (503, 429); `picky` one answering 400."""
    config = tmp_path / "flaky.toml"
    models = "".join(
        f'[models.{name}]\nupstream = "local"\nupstream_model = "tapfix-mock"\n\n'
        f'[[models.{name}.routes]]\nname = "primary"\nupstream = "{upstream}"\nupstream_model = "{served}"\n\n'
        for name, upstream, served in (
            ("coder", "flaky", "m503"),
            ("limited", "limiter", "m429"),
            ("picky", "picky", "m400"),
        )
    )
    config.write_text(
        f'[upstreams.local]\nbase_url = "{local_url}/v1"\nengine = "vllm"\n\n'
        + "".join(
            f'[upstreams.{n}]\nbase_url = "{flaky_url}/v1"\nengine = "vllm"\n\n' for n in ("flaky", "limiter", "picky")
        )
        + models
    )
    return str(config)


def streamed(client: openai.OpenAI, model: str):
    """A streamed chat completion, read to its end: (its text, its response headers)."""
    hi = [{"role": "user", "content": "hi"}]
    with client.chat.completions.with_streaming_response.create(model=model, messages=hi, stream=True) as raw:
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        return text, raw.headers


def answered(client: openai.OpenAI, model: str, stream: bool):
    """A chat completion, streamed or whole: (its text, its response headers)."""
    if stream:
        return streamed(client, model)
    raw = client.chat.completions.with_raw_response.create(model=model, messages=[{"role": "user", "content": "hi"}])
    return raw.parse().choices[0].message.content, raw.headers


def fell_over(proxy, capture_id: str) -> tuple[dict, dict]:
    """The capture of a request that fell over to another route, and its failed first attempt's."""
    db = proxy.extra["db"]
    row = wait_capture(db, capture_id)

    def attempts() -> list[dict]:  # the writer may commit the failed attempt's row after the capture's own
        listed = cli("captures", "list", "--json", "--db", str(db)).stdout.splitlines()
        return [r for r in map(json.loads, listed) if r["attempt_of"] == capture_id]

    (attempt,) = until(attempts, timeout=10.0)
    return row, wait_capture(db, attempt["id"])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_request_falls_over_on_a_5xx_or_429_not_on_a_400(tmp_path, upstreams, stream):
    local, _ = upstreams
    scenario = tmp_path / "flaky.json"
    scenario.write_text(json.dumps(FLAKY))
    flaky = start_mock(tmp_path, "--scenario", str(scenario))
    proxy = run_proxy(tmp_path, flaky_config(tmp_path, local.url, flaky.url))
    try:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        text, headers = answered(client, "coder", stream)
        assert text, "the client reads a whole answer from the route it fell over to"
        assert (headers["x-tapfix-route"], headers["x-tapfix-route-rejected"]) == ("default", "primary=failed")
        capture_id = headers["x-tapfix-capture-id"]
        row, failed = fell_over(proxy, capture_id)
        assert row["status"] == 200 and row["upstream_url"].startswith(local.url)
        assert "route_fallback" in json.loads(row["flags"])
        assert json.loads(row["route_decision"])["attempts"][0]["status"] == 503
        assert failed["status"] == 503 and failed["upstream_url"].startswith(flaky.url)
        assert failed["served_model"] == "m503"
        if stream:
            assert headers["content-type"].startswith("text/event-stream")
            export = cli("captures", "export", capture_id, "--client-response", "--db", str(proxy.extra["db"]))
            assert b"[DONE]" in export.stdout

        # A 429 falls over too, and its Retry-After keeps that upstream skipped: the next request doesn't try it.
        text, headers = answered(client, "limited", stream)
        assert text and headers["x-tapfix-route"] == "default"
        text, headers = answered(client, "limited", stream)
        decision = decision_of(proxy, headers["x-tapfix-capture-id"])
        assert decision["attempts"] == []
        assert decision["rejected"][0]["reason"].startswith("upstream limiter failed: circuit open for")

        # A 400 is the request's own fault: it reaches the client, from the route it took, no other route is asked.
        with pytest.raises(openai.BadRequestError) as raised:
            answered(client, "picky", stream)
        assert raised.value.response.headers["x-tapfix-route"] == "primary"
    finally:
        proxy.stop()
        flaky.stop()


def silent_upstream() -> RawServer:
    """Lists `tapfix-mock` and accepts every request, but never answers one (its head never comes)."""
    listing = json.dumps({"object": "list", "data": [{"id": "tapfix-mock", "object": "model"}]}).encode()
    models = json_reply(listing)
    return RawServer(lambda r: [(0.0, models)] if r.path.endswith("/models") else [(60.0, b"<CLOSE>")])


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_an_upstream_that_never_answers_the_head_falls_over_after_its_head_timeout(tmp_path, upstreams, stream):
    local, _ = upstreams
    silent = silent_upstream()
    config = tmp_path / "silent.toml"
    config.write_text(
        f'[upstreams.local]\nbase_url = "{local.url}/v1"\nengine = "vllm"\n\n'
        f'[upstreams.silent]\nbase_url = "{silent.url}/v1"\nengine = "vllm"\nhead_timeout = 1\n\n'
        '[models.coder]\nupstream = "local"\nupstream_model = "tapfix-mock"\n\n'
        '[[models.coder.routes]]\nname = "fast"\nupstream = "silent"\nupstream_model = "tapfix-mock"\n'
    )
    proxy = run_proxy(tmp_path, str(config))
    try:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0, timeout=30)
        started = time.monotonic()
        if stream:
            text, headers = streamed(client, "coder")
        else:
            raw = ask(proxy, SHORT)
            text, headers = raw.parse().choices[0].message.content, raw.headers
        assert time.monotonic() - started >= 1.0, "the route had its head_timeout to answer"
        assert text
        assert (headers["x-tapfix-route"], headers["x-tapfix-route-rejected"]) == ("default", "fast=failed")
        assert [r.path for r in silent.requests if not r.path.endswith("/models")] == ["/v1/chat/completions"]
        row, failed = fell_over(proxy, headers["x-tapfix-capture-id"])
        assert row["status"] == 200 and row["upstream_url"].startswith(local.url) and not row["error"]
        decision = json.loads(row["route_decision"])
        assert decision["attempts"][0]["reason"] == "sent no response head within 1 s"
        assert failed["status"] is None and failed["upstream_url"].startswith(silent.url)
        assert "no response head" in failed["error"]
    finally:
        proxy.stop()
        silent.close()


def test_when_every_route_sends_no_head_the_client_gets_a_retryable_504(tmp_path):
    """The route fallen over to is held to its own upstream's head_timeout too; with none left, a 504 agents retry."""
    first, second = silent_upstream(), silent_upstream()
    config = tmp_path / "silent.toml"
    config.write_text(
        "".join(
            f'[upstreams.{name}]\nbase_url = "{server.url}/v1"\nengine = "vllm"\nhead_timeout = 1\n\n'
            for name, server in (("first", first), ("second", second))
        )
        + '[models.coder]\nupstream = "second"\nupstream_model = "tapfix-mock"\n\n'
        '[[models.coder.routes]]\nname = "fast"\nupstream = "first"\nupstream_model = "tapfix-mock"\n'
    )
    proxy = run_proxy(tmp_path, str(config))
    try:
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as raised:
            ask(proxy, SHORT)
        assert 2.0 <= time.monotonic() - started < 20, "each route had its head_timeout, no more"
        response = raised.value.response
        assert response.status_code == 504
        assert response.json()["error"]["type"] == "server_error"
        assert "upstream second sent no response head within 1 s" in response.json()["error"]["message"]
        assert response.headers["x-tapfix-route"] == "default"
        decision = decision_of(proxy, response.headers["x-tapfix-capture-id"])
        assert [a["upstream"] for a in decision["attempts"]] == ["first", "second"]
        assert all(len([r for r in s.requests if not r.path.endswith("/models")]) == 1 for s in (first, second))
    finally:
        proxy.stop()
        first.close()
        second.close()


def test_the_answer_a_streamed_request_falls_over_to_is_repaired_like_any_stream(tmp_path, upstreams):
    """The route fallen over to sends a broken tool call (Python literals in its JSON): the client gets it repaired."""
    local, _ = upstreams
    scenario = tmp_path / "repair.json"
    case = str(corpus_dir() / "invalid_json__python_literals_True_None.json")
    scenario.write_text(json.dumps({"rules": [{"do": "serve_case", "case": case}]}))
    broken = start_mock(tmp_path, "--scenario", str(scenario))
    flaky_scenario = tmp_path / "flaky.json"
    flaky_scenario.write_text(json.dumps(FLAKY))
    flaky = start_mock(tmp_path, "--scenario", str(flaky_scenario))
    config = tmp_path / "repair.toml"
    config.write_text(
        f'[upstreams.broken]\nbase_url = "{broken.url}/v1"\nengine = "vllm"\n\n'
        f'[upstreams.flaky]\nbase_url = "{flaky.url}/v1"\nengine = "vllm"\n\n'
        '[models.coder]\nupstream = "broken"\nupstream_model = "tapfix-mock"\n\n'
        '[[models.coder.routes]]\nname = "primary"\nupstream = "flaky"\nupstream_model = "m503"\n'
    )
    proxy = run_proxy(tmp_path, str(config))
    try:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        prompt = [{"role": "user", "content": "list the files"}]
        list_dir = tool("list_dir", {"path": {"type": "string"}, "recursive": {"type": "boolean"}}, ["path"])
        with client.chat.completions.with_streaming_response.create(
            model="coder", messages=prompt, tools=[list_dir], stream=True
        ) as raw:
            assert raw.headers["x-tapfix-route"] == "default"
            chunks = list(raw.parse())
        calls = "".join(
            tc.function.arguments or "" for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []
        )
        assert "true" in calls and "True" not in calls
        json.loads(calls)
        row = wait_capture(proxy.extra["db"], raw.headers["x-tapfix-capture-id"])
        flags = json.loads(row["flags"])
        assert "route_fallback" in flags and any(f.startswith("toolcall_") for f in flags), flags
    finally:
        proxy.stop()
        broken.stop()
        flaky.stop()
