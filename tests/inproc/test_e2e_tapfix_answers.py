"""tapfix's own answers, through a real proxy in config mode with the real SDKs (issue 31, items 14 and 15).

Every error tapfix makes is in the surface's own shape (Anthropic's on Messages, OpenAI's on chat and
Responses), so each SDK raises its own exception carrying tapfix's message and type; and the capture says
tapfix answered: flagged `tapfix_answered` (never `upstream_error`), no upstream, the error object (not a
string of JSON) in the `error` column, and `captures show` / `list` / the browser say so. The proxy, the
mock and the `captures` commands run in the test process (tests/support/inproc.py), one proxy for the
module's config.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from starlette.testclient import TestClient
from tapfix.proxy.browse import create_app

from tests.support.config_text import toml_table
from tests.support.inproc import InprocProxy, cli, start, start_mock, start_proxy
from tests.support.procs import free_port, wait_capture

SERVED = "served models: qwen, gone"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InprocProxy]:
    tmp = tmp_path_factory.mktemp("answers")
    mock = start_mock(tmp)
    config = tmp / "tapfix.toml"
    config.write_text(
        toml_table("upstreams.mock", base_url=mock.url, engine="vllm")
        + toml_table("upstreams.dead", base_url=f"http://127.0.0.1:{free_port()}", engine="vllm")
        + toml_table("models.qwen", upstream="mock")
        + toml_table("models.gone", upstream="dead")
    )
    db = tmp / "captures.db"
    proxy = start(["--config", str(config), "--db", str(db)], tmp / "proxy.log", shared=True)
    proxy.extra["db"] = db
    try:
        yield proxy
    finally:
        proxy.stop()
        mock.stop()


def _anthropic(proxy: InprocProxy, key: str = "sk-test") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0, timeout=30)


def _say_hi(proxy: InprocProxy, model: str, key: str = "sk-test", **extra: Any) -> Any:
    """A one-word Messages request through the anthropic SDK."""
    return _anthropic(proxy, key).messages.create(model=model, max_tokens=16, messages=HI, **extra)


def _openai(proxy: InprocProxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-test", max_retries=0, timeout=30)


def _capture_id(e: anthropic.APIStatusError | openai.APIStatusError) -> str:
    return e.response.headers["x-tapfix-capture-id"]


def _recorded_as_tapfix_answer(proxy: InprocProxy, capture_id: str, error: dict) -> dict:
    """The capture says tapfix answered: its flag, no upstream, no upstream timing, the error object."""
    db = proxy.extra["db"]
    row = wait_capture(db, capture_id)
    flags = json.loads(row["flags"])
    assert "tapfix_answered" in flags and "upstream_error" not in flags, flags
    assert row["upstream_url"] == "" and row["upstream_first_byte_ms"] is None
    assert json.loads(row["error"]) == error  # the object itself, not a string of JSON inside a string
    shown = cli("captures", "show", capture_id, "--db", str(db))
    text = shown.stdout.decode()
    assert shown.returncode == 0 and "tapfix answered" in text, text
    assert "upstream error" not in text and "passed unchanged" not in text, text
    as_json = json.loads(cli("captures", "show", capture_id, "--json", "--db", str(db)).stdout)
    assert as_json["tapfix_error"] == error and as_json["upstream_error"] is None
    listed = cli("captures", "list", "--flag", "tapfix_answered", "--limit", "0", "--json", "--db", str(db))
    assert capture_id in {json.loads(line)["id"] for line in listed.stdout.splitlines()}
    upstream_errors = cli("captures", "list", "--flag", "upstream_error", "--limit", "0", "--json", "--db", str(db))
    assert capture_id not in {json.loads(line)["id"] for line in upstream_errors.stdout.splitlines()}
    with TestClient(create_app(db, background_index=False), base_url="http://127.0.0.1") as browser:
        page = browser.get(f"/exchange/{capture_id}").text
    assert "tapfix answered" in page and "upstream error" not in page and "passed unchanged" not in page
    return row


# -- Messages: Anthropic's shape, through the anthropic SDK -----------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_messages_unknown_model_is_anthropics_not_found_error(stack: InprocProxy, stream: bool) -> None:
    with pytest.raises(anthropic.NotFoundError) as raised:
        _say_hi(stack, "nope", stream=stream)
    e = raised.value
    message = f"model 'nope' is not served here; {SERVED}"
    assert e.body == {"type": "error", "error": {"type": "not_found_error", "message": message}}
    assert message in str(e) and "not_found_error" in str(e)
    _recorded_as_tapfix_answer(stack, _capture_id(e), {"type": "not_found_error", "message": message})


def test_messages_bad_model_is_anthropics_invalid_request_error(stack: InprocProxy) -> None:
    with pytest.raises(anthropic.BadRequestError) as raised:
        _say_hi(stack, "")
    error = raised.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error" and "expected the name of a served model" in error["message"]
    _recorded_as_tapfix_answer(stack, _capture_id(raised.value), error)


@pytest.mark.parametrize("stream", [False, True])
def test_messages_unreachable_upstream_is_anthropics_api_error(stack: InprocProxy, stream: bool) -> None:
    with pytest.raises(anthropic.InternalServerError) as raised:
        _say_hi(stack, "gone", stream=stream)
    e = raised.value
    assert e.status_code == 502
    error = e.body["error"]  # type: ignore[index]
    assert e.body["type"] == "error" and error["type"] == "api_error"  # type: ignore[index]
    assert error["message"].startswith("upstream http://127.0.0.1:") and "unreachable" in error["message"]
    assert set(error) == {"type", "message"}
    row = _recorded_as_tapfix_answer(stack, _capture_id(e), error)
    assert "upstream_unreachable" in json.loads(row["flags"])


# -- chat and Responses: OpenAI's shape, through the openai SDK -------------------------------------
def test_chat_unknown_model_is_openais_not_found(stack: InprocProxy) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        _openai(stack).chat.completions.create(model="nope", messages=HI)
    e = raised.value
    message = f"model 'nope' is not served here; {SERVED}"
    assert e.code == "model_not_found" and e.type == "invalid_request_error" and e.param == "model"
    assert message in str(e)
    error = {"message": message, "type": "invalid_request_error", "param": "model", "code": "model_not_found"}
    assert e.body == error
    _recorded_as_tapfix_answer(stack, _capture_id(e), error)


def test_responses_unknown_model_is_openais_not_found(stack: InprocProxy) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        _openai(stack).responses.create(model="nope", input="hi")
    e = raised.value
    assert e.code == "model_not_found" and e.type == "invalid_request_error" and "is not served here" in str(e)
    _recorded_as_tapfix_answer(stack, _capture_id(e), e.body)  # type: ignore[arg-type]


@pytest.mark.parametrize("surface", ["chat", "responses"])
def test_unreachable_upstream_is_openais_shape(stack: InprocProxy, surface: str) -> None:
    client = _openai(stack)
    with pytest.raises(openai.InternalServerError) as raised:
        if surface == "chat":
            client.chat.completions.create(model="gone", messages=HI, stream=True)
        else:
            client.responses.create(model="gone", input="hi", stream=True)
    e = raised.value
    assert e.status_code == 502 and e.type == "upstream_unreachable" and "unreachable" in str(e)
    row = _recorded_as_tapfix_answer(stack, _capture_id(e), e.body)  # type: ignore[arg-type]
    assert "upstream_unreachable" in json.loads(row["flags"])


def test_models_listing_is_tapfix_answer(stack: InprocProxy) -> None:
    response = httpx.get(f"{stack.url}/v1/models", timeout=10)
    assert response.status_code == 200 and {m["id"] for m in response.json()["data"]} == {"qwen", "gone"}
    row = wait_capture(stack.extra["db"], response.headers["x-tapfix-capture-id"])
    assert "tapfix_answered" in json.loads(row["flags"]) and row["upstream_url"] == "" and row["error"] is None


def test_an_upstream_answer_is_not_flagged_tapfix(stack: InprocProxy) -> None:
    """The other side: what the upstream answered names it, and is not tapfix's."""
    message = _say_hi(stack, "qwen")
    assert message.content
    response = httpx.post(f"{stack.url}/v1/chat/completions", json={"model": "qwen", "messages": HI})
    row = wait_capture(stack.extra["db"], response.headers["x-tapfix-capture-id"])
    assert "tapfix_answered" not in json.loads(row["flags"]) and row["upstream_url"].startswith("http://127.0.0.1:")


# -- 401 (not recorded: an unauthenticated caller can't fill the store) -------------------------------
def test_wrong_token_is_each_surfaces_authentication_error(tmp_path: Path) -> None:
    mock = start_mock(tmp_path)
    proxy = start_proxy(tmp_path, mock.url, "--token", "right-token-123", db=tmp_path / "c.db")
    try:
        with pytest.raises(anthropic.AuthenticationError) as raised:
            _say_hi(proxy, "m", "wrong-token-456")
        error = raised.value.body["error"]  # type: ignore[index]
        assert error["type"] == "authentication_error" and "invalid or missing API key" in error["message"]
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="wrong-token-456", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as wrong:
            client.chat.completions.create(model="m", messages=HI)
        assert wrong.value.code == "invalid_api_key" and "invalid or missing API key" in str(wrong.value)
    finally:
        proxy.stop()
        mock.stop()
