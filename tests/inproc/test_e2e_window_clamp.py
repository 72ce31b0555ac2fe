"""Issue 37: a request whose prompt fits but whose max_tokens doesn't is answered, its budget clamped to what
the window leaves by the engine's own count (the mock plays a vLLM with a small window that refuses such
requests, as vLLM does: vllm #42474); a prompt that can't fit at all gets the overflow answer; the windows
are published on /v1/models."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import orjson
import pytest

from tests.support.config_text import toml_table
from tests.support.inproc import cli, start_mock, start_proxy
from tests.support.procs import wait_capture

WINDOW = 2048


def count(messages) -> int:  # the mock's tokenizer (proxy/mock/window.py): what its /tokenize answers
    return max(1, len(orjson.dumps(messages)) // 4)


def conversation(tokens: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You are opencode"}, {"role": "user", "content": "x" * (tokens * 4)}]


@pytest.fixture
def mock(tmp_path):
    handle = start_mock(tmp_path, "--context-window", str(WINDOW))
    yield handle
    handle.stop()


def forwarded(proxy, capture_id: str) -> dict:
    wait_capture(proxy.extra["db"], capture_id)
    return json.loads(cli("captures", "export", capture_id, "--forwarded", "--db", str(proxy.extra["db"])).stdout)


def test_the_mock_refuses_what_does_not_fit_as_vllm_does(mock):
    response = httpx.post(
        f"{mock.url}/v1/chat/completions", json={"model": "m", "messages": conversation(1000), "max_tokens": 32000}
    )
    assert response.status_code == 400 and "for a total of at least" in response.json()["error"]["message"]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_budget_larger_than_what_is_left_is_clamped_and_answered(tmp_path, mock, field):
    proxy = start_proxy(tmp_path, mock.url, "--engine", "vllm")
    try:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        messages = conversation(1000)
        raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, **{field: 32000})
        assert raw.parse().choices[0].message.content
        capture_id = raw.headers["x-tapfix-capture-id"]
        assert forwarded(proxy, capture_id)[field] == WINDOW - count(messages)
        shown = cli("captures", "show", capture_id, "--db", str(proxy.extra["db"])).stdout.decode()
        assert f"[window] clamp $.{field}" in shown and "GET /v1/models" in shown
    finally:
        proxy.stop()


def test_messages_and_responses_budgets_are_clamped(tmp_path, mock):
    proxy = start_proxy(tmp_path, mock.url, "--engine", "vllm")
    try:
        messages = conversation(1200)[1:]
        reply = anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0).messages.with_raw_response.create(
            model="m", max_tokens=16000, system="You are Claude Code", messages=messages
        )
        assert reply.parse().content
        system = [{"role": "system", "content": "You are Claude Code"}]
        assert forwarded(proxy, reply.headers["x-tapfix-capture-id"])["max_tokens"] == WINDOW - count(system + messages)
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        text = "y" * 4000
        raw = client.responses.with_raw_response.create(model="m", input=text, max_output_tokens=65536)
        assert raw.parse().output_text
        expected = WINDOW - count([{"role": "user", "content": text}])
        assert forwarded(proxy, raw.headers["x-tapfix-capture-id"])["max_output_tokens"] == expected
    finally:
        proxy.stop()


def test_never_below_the_floor_and_never_up(tmp_path, mock):
    proxy = start_proxy(tmp_path, mock.url, "--engine", "vllm", "--max-tokens-floor", "100")
    try:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        near_full = conversation(WINDOW - 60)  # leaves under 100
        with pytest.raises(openai.BadRequestError) as raised:  # clamped to the floor: vLLM still refuses
            client.chat.completions.create(model="m", messages=near_full, max_tokens=32000)
        # the engine's own refusal of prompt plus max_tokens, not an overflow
        assert raised.value.code != "context_length_exceeded"
        capture_id = raised.value.response.headers["x-tapfix-capture-id"]
        assert forwarded(proxy, capture_id)["max_tokens"] == 100
        small = client.chat.completions.with_raw_response.create(model="m", messages=conversation(10), max_tokens=50)
        assert forwarded(proxy, small.headers["x-tapfix-capture-id"])["max_tokens"] == 50
    finally:
        proxy.stop()


def test_a_prompt_that_cannot_fit_is_an_overflow_before_sending(tmp_path, mock):
    proxy = start_proxy(tmp_path, mock.url, "--engine", "vllm")
    try:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        messages = conversation(3000)
        with pytest.raises(openai.BadRequestError) as raised:
            client.chat.completions.create(model="m", messages=messages, max_tokens=1000)
        assert raised.value.code == "context_length_exceeded"
        assert f"maximum context length is {WINDOW} tokens" in raised.value.message
        assert f"resulted in {count(messages)} tokens" in raised.value.message
        row = wait_capture(proxy.extra["db"], raised.value.response.headers["x-tapfix-capture-id"])
        assert "context_overflow" in json.loads(row["flags"])
    finally:
        proxy.stop()


def test_a_configured_window_wins_and_models_list_it(tmp_path, mock):
    proxy = start_proxy(tmp_path, mock.url, "--engine", "vllm", "--context-window", "1500")
    try:
        listed = httpx.get(f"{proxy.url}/v1/models").json()["data"][0]
        assert listed["context_length"] == 1500
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        messages = conversation(500)
        raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=32000)
        assert forwarded(proxy, raw.headers["x-tapfix-capture-id"])["max_tokens"] == 1500 - count(messages)
    finally:
        proxy.stop()


def test_config_mode_lists_every_model_with_its_window(tmp_path, mock):
    config = tmp_path / "tapfix.toml"
    config.write_text(
        toml_table("upstreams.gpu", base_url=mock.url, engine="vllm")
        + toml_table("models.small", upstream="gpu", upstream_model="tapfix-mock", context_window=1024)
        + toml_table("models.big", upstream="gpu", upstream_model="tapfix-mock")
    )
    from tests.support.inproc import start

    proxy = start(["--config", str(config), "--db", str(tmp_path / "c.db")], tmp_path / "p.log")
    try:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        client.chat.completions.create(model="big", messages=conversation(10), max_tokens=10)  # asks the engine
        listed = {m["id"]: m for m in httpx.get(f"{proxy.url}/v1/models").json()["data"]}
        assert listed["small"]["context_length"] == 1024
        assert listed["big"]["context_length"] == WINDOW and listed["big"]["max_model_len"] == WINDOW
    finally:
        proxy.stop()


CHECK_CONFIG = """
[upstreams.gpu0]
base_url = "{url}"
engine = "vllm"

[models.asked]
upstream = "gpu0"
upstream_model = "tapfix-mock"

[models.set]
upstream = "gpu0"
upstream_model = "tapfix-mock"
context_window = 1024
"""


def test_check_prints_each_models_window_and_where_it_came_from(tmp_path, mock):
    config = tmp_path / "tapfix.toml"
    config.write_text(CHECK_CONFIG.format(url=mock.url))
    result = cli("check", "--config", str(config))
    assert result.returncode == 0, result.stdout
    lines = {line.split()[1]: line for line in result.stdout.decode().splitlines() if line.startswith("model ")}
    assert "window 2,048 tokens (GET /v1/models)" in lines["asked"]
    assert "window 1,024 tokens (config context_window; the engine says 2,048)" in lines["set"]
