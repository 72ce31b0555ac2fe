"""The request side reaches the real vLLM: what tapfix records as a change to the request is what vLLM used.

Sampling values are read back from vLLM's request log (`--enable-log-requests`: one line per request with
its `SamplingParams`, under the same id as the response). The server runs with `--generation-config vllm`,
so it ignores the model's own generation_config.json: a value from that file shows in the log only if tapfix
put it in the request. The reasoning dialect is read back from behaviour: the model reasons unless Qwen3's
template closes the think block for it (`enable_thinking: false`, which vLLM also derives from
`reasoning_effort: "none"`), so a "no reasoning" in a form vLLM doesn't read gives reasoning sent directly,
and none through `tapfix run --engine vllm`, which writes vLLM's own form.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.process.vllm import tiny_qwen3
from tests.process.vllm.engine import VllmServer
from tests.process.vllm.wire import CHAT, chat_body, chat_choice, shown
from tests.support.inproc import InprocProxy

pytestmark = [pytest.mark.vllm]

GREETING = [{"role": "user", "content": "Say hello"}]
VLLM_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}  # what vLLM samples with when nobody says


@pytest.fixture(scope="module")
def card_proxy(tapfix_in_front: Callable[..., InprocProxy], vllm: VllmServer, tiny_qwen3_dir: Path) -> InprocProxy:
    """Quick mode as a user of vLLM starts it: the model folder's generation_config.json, `--engine vllm`."""
    return tapfix_in_front(vllm, "--engine", "vllm", "--generation-config", str(tiny_qwen3_dir))


def sampling_logged(server: VllmServer, request_id: str, timeout: float = 10.0) -> dict[str, float]:
    """The numbers of the `SamplingParams(...)` vLLM logged for the request with this response id."""
    pattern = re.compile(rf"Received request {re.escape(request_id)}: params: SamplingParams\((.*?)\), lora_request")
    deadline = time.monotonic() + timeout
    while not (found := pattern.findall(server.log())):
        assert time.monotonic() < deadline, f"no request log line for {request_id}"
        time.sleep(0.1)
    [params] = found
    return {k: float(v) for k, v in re.findall(r"(\w+)=(-?[\d.]+)(?=,|$)", params)}


def chat(url: str, body: dict) -> httpx.Response:
    response = httpx.post(url + CHAT, json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response


def test_generation_config_values_are_the_ones_vllm_samples_with(card_proxy: InprocProxy, vllm: VllmServer) -> None:
    body = {"model": "tiny-qwen3", "messages": GREETING, "max_tokens": 50}  # opencode sends no sampling values
    direct = chat(vllm.url, body)
    assert {k: sampling_logged(vllm, direct.json()["id"])[k] for k in VLLM_DEFAULTS} == VLLM_DEFAULTS

    proxied = chat(card_proxy.url, body)
    capture = shown(card_proxy, proxied)
    injected = {c["path"].removeprefix("$."): c["after"] for c in capture["changes"] if c["stage"] == "sampling"}
    assert injected == tiny_qwen3.SAMPLING, capture["changes"]
    forwarded = json.loads(capture["bodies"]["forwarded"]["text"])
    used = sampling_logged(vllm, proxied.json()["id"])
    assert {k: used[k] for k in tiny_qwen3.SAMPLING} == pytest.approx(tiny_qwen3.SAMPLING)
    assert {k: forwarded[k] for k in tiny_qwen3.SAMPLING} == tiny_qwen3.SAMPLING


def test_the_clients_own_values_stand(card_proxy: InprocProxy, vllm: VllmServer) -> None:
    body = {"model": "tiny-qwen3", "messages": GREETING, "max_tokens": 50, "temperature": 0.2, "top_k": 5}
    proxied = chat(card_proxy.url, body)
    used = sampling_logged(vllm, proxied.json()["id"])
    assert (used["temperature"], used["top_k"], used["top_p"]) == pytest.approx((0.2, 5, tiny_qwen3.SAMPLING["top_p"]))


# A client's "no reasoning" in forms vLLM doesn't read (it reads reasoning_effort and
# chat_template_kwargs.enable_thinking): omp's top-level switch, OpenRouter's and Anthropic's objects.
NO_REASONING_FORMS = {
    "omp": {"enable_thinking": False},
    "openrouter": {"reasoning": {"enabled": False}},
    "anthropic": {"thinking": {"type": "disabled"}},
}


@pytest.mark.parametrize("form", list(NO_REASONING_FORMS))
def test_no_reasoning_reaches_vllm_in_its_own_dialect(card_proxy: InprocProxy, vllm: VllmServer, form: str) -> None:
    body = chat_body(GREETING, **NO_REASONING_FORMS[form])
    direct = chat_choice(chat(vllm.url, body).content, False)
    assert direct.reasoning == tiny_qwen3.REASONING, "vLLM reads this form itself"
    response = chat(card_proxy.url, body)
    through = chat_choice(response.content, False)
    assert (through.reasoning, through.content) == ("", "Hello!")
    capture = shown(card_proxy, response)
    forwarded = json.loads(capture["bodies"]["forwarded"]["text"])
    reasoning = [c for c in capture["changes"] if c["stage"] == "reasoning"]
    assert any(c["kind"] == "inject" and c["path"] == "$.reasoning_effort" for c in reasoning), reasoning
    assert forwarded["reasoning_effort"] == "none"


@pytest.mark.parametrize(
    "form",
    [{"reasoning_effort": "none"}, {"chat_template_kwargs": {"enable_thinking": False}}],
    ids=["reasoning_effort", "enable_thinking"],
)
def test_vllms_own_forms_pass_unchanged_and_work(card_proxy: InprocProxy, vllm: VllmServer, form: dict) -> None:
    body = chat_body(GREETING, **form)
    assert chat_choice(chat(vllm.url, body).content, False).reasoning == ""
    response = chat(card_proxy.url, body)
    assert chat_choice(response.content, False).reasoning == ""
    capture = shown(card_proxy, response)
    assert not [c for c in capture["changes"] if c["stage"] == "reasoning"], capture["changes"]


def test_reasoning_asked_for_still_arrives(card_proxy: InprocProxy) -> None:
    """The other way round: a foreign "reason hard" is translated, not turned into "off"."""
    response = chat(card_proxy.url, chat_body(GREETING, reasoning={"effort": "high"}))
    assert chat_choice(response.content, False).reasoning == tiny_qwen3.REASONING
    forwarded = json.loads(shown(card_proxy, response)["bodies"]["forwarded"]["text"])
    assert "reasoning" not in forwarded and forwarded["reasoning_effort"] == "high"
