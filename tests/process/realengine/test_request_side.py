"""The request side reaches the real server: what tapfix records as a change to the request is what
llama-server used.

Sampling values are read back from llama-server's `GET /slots`: each slot shows the `params` of its
last task, and the slot is found by a `seed` no other request of the run sent. The reasoning dialect
is read back from behaviour: with QwQ's template the model reasons unless thinking is off, so a
client's "no reasoning" in a form llama-server doesn't read gives reasoning sent directly, and none
through `tapfix run --engine llamacpp`, which writes llama.cpp's own form.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.process.realengine import tiny_model
from tests.process.realengine.engine import LlamaServer
from tests.support.inproc import InprocProxy, cli, start
from tests.support.procs import wait_capture

pytestmark = [pytest.mark.realengine]

GREETING = [{"role": "user", "content": "Say hello"}]
# A model card's sampling values, each unlike llama-server's own default (temperature 0.8, top_p 0.95,
# top_k 40, min_p 0.05, repeat_penalty 1.0, n_predict -1), so a value that didn't arrive shows.
GENERATION_CONFIG = {
    "temperature": 0.35,
    "top_p": 0.8,
    "top_k": 20,
    "min_p": 0.02,
    "repetition_penalty": 1.05,
    "max_new_tokens": 48,
}
# The body key tapfix writes for llama.cpp, and the name of the value in a slot's params.
SLOT_NAME = {"repetition_penalty": "repeat_penalty", "max_tokens": "n_predict"}
# Per-model policy in a config file: override, clamp, fill and llama.cpp's "top_k off" spelling.
MODEL_SAMPLING = """
temperature = { mode = "override", value = 0.3 }
top_p = { max = 0.9 }
top_k = -1
presence_penalty = 0.4
frequency_penalty = 0.25
max_tokens = { mode = "clamp", max = 40 }
"""


@pytest.fixture(scope="module")
def card_proxy(
    tapfix_in_front: Callable[..., InprocProxy], llama_reasoning: LlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> InprocProxy:
    """Quick mode as a user of llama-server starts it: `--engine llamacpp --generation-config FILE`."""
    card = tmp_path_factory.mktemp("card") / "generation_config.json"
    card.write_text(json.dumps(GENERATION_CONFIG))
    return tapfix_in_front(llama_reasoning, "--engine", "llamacpp", "--generation-config", str(card))


@pytest.fixture(scope="module")
def config_proxy(llama: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InprocProxy]:
    """Config mode: one llama.cpp upstream, one model with its own sampling policy."""
    tmp = tmp_path_factory.mktemp("config")
    config = tmp / "tapfix.toml"
    config.write_text(
        f'[upstreams.llama]\nbase_url = "{llama.url}/v1"\nengine = "llamacpp"\n\n'
        f'[models.tiny]\nupstream = "llama"\n\n[models.tiny.sampling]\n{MODEL_SAMPLING}'
    )
    db = tmp / "captures.db"
    proxy = start(["--config", str(config), "--db", str(db)], tmp / "proxy-config.log", shared=True)
    proxy.extra["db"] = db
    yield proxy
    proxy.stop()


def _chat(url: str, body: dict) -> httpx.Response:
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response


def _capture(proxy: InprocProxy, response: httpx.Response) -> dict:
    capture_id = response.headers["x-tapfix-capture-id"]
    wait_capture(proxy.extra["db"], capture_id)
    result = cli("captures", "show", capture_id, "--json", "--db", str(proxy.extra["db"]))
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return json.loads(result.stdout)


def _forwarded(capture: dict) -> dict:
    return json.loads(capture["bodies"]["forwarded"]["text"])


def _slot_params(server: LlamaServer, seed: int) -> dict:
    """The params llama-server ran the request with the unique `seed` under."""
    slots = httpx.get(f"{server.url}/slots", timeout=10).json()
    found = [slot["params"] for slot in slots if slot.get("params", {}).get("seed") == seed]
    assert len(found) == 1, f"no single slot ran seed {seed}: {slots}"
    return found[0]


def _sampling_changes(capture: dict) -> dict[str, dict]:
    """tapfix's sampling changes, by the body key they changed."""
    return {c["path"].removeprefix("$."): c for c in capture["changes"] if c["stage"] == "sampling"}


def _assert_engine_used(params: dict, forwarded: dict, keys: set[str]) -> None:
    for key in keys:
        used = params[SLOT_NAME.get(key, key)]
        assert used == pytest.approx(forwarded[key], rel=1e-6), (key, used, forwarded[key])


def test_generation_config_values_are_the_ones_llama_server_samples_with(
    card_proxy: InprocProxy, llama_reasoning: LlamaServer
) -> None:
    seed = secrets.randbelow(2**31)
    # The client chooses its temperature (kept: fill mode) and sends the repetition penalty in vLLM's
    # spelling, which llama-server doesn't read (tapfix renames it); the rest comes from the card.
    body = {"model": "tiny", "messages": GREETING, "seed": seed, "temperature": 0, "repetition_penalty": 1.1}
    capture = _capture(card_proxy, _chat(card_proxy.url, body))
    changes, forwarded = _sampling_changes(capture), _forwarded(capture)
    filled = {"top_p", "top_k", "min_p", "max_tokens"}
    assert {k for k, c in changes.items() if c["kind"] == "inject"} == filled
    for key in filled:
        card_key = "max_new_tokens" if key == "max_tokens" else key
        assert changes[key]["after"] == forwarded[key] == GENERATION_CONFIG[card_key]
    assert "temperature" not in changes and forwarded["temperature"] == 0
    assert "repetition_penalty" not in forwarded and forwarded["repeat_penalty"] == body["repetition_penalty"]
    _assert_engine_used(_slot_params(llama_reasoning, seed), forwarded, filled | {"temperature", "repeat_penalty"})


def test_per_model_policy_values_are_the_ones_llama_server_samples_with(
    config_proxy: InprocProxy, llama: LlamaServer
) -> None:
    seed = secrets.randbelow(2**31)
    body = {"model": "tiny", "messages": GREETING, "seed": seed, "temperature": 1.0, "top_p": 0.99, "max_tokens": 500}
    capture = _capture(config_proxy, _chat(config_proxy.url, body))
    changes, forwarded = _sampling_changes(capture), _forwarded(capture)
    kinds = {key: change["kind"] for key, change in changes.items()}
    assert kinds == {
        "temperature": "override",
        "top_p": "clamp",
        "top_k": "inject",
        "presence_penalty": "inject",
        "frequency_penalty": "inject",
        "max_tokens": "clamp",
    }
    for key, change in changes.items():
        assert change["before"] == body.get(key) and change["after"] == forwarded[key]
    assert forwarded["top_k"] == 0  # "off" as llama.cpp spells it
    _assert_engine_used(_slot_params(llama, seed), forwarded, set(changes))


# A client's "no reasoning" in forms llama-server doesn't read (it reads reasoning_effort and
# chat_template_kwargs.enable_thinking): omp's top-level switch, OpenRouter's and Anthropic's objects.
NO_REASONING_FORMS = {
    "omp": {"enable_thinking": False},
    "openrouter": {"reasoning": {"enabled": False}},
    "anthropic": {"thinking": {"type": "disabled"}},
}


@pytest.mark.parametrize("form", NO_REASONING_FORMS, ids=list(NO_REASONING_FORMS))
def test_no_reasoning_reaches_llama_server_in_its_own_dialect(
    card_proxy: InprocProxy, llama_reasoning: LlamaServer, form: str
) -> None:
    body = {"model": "tiny", "messages": GREETING, "temperature": 0, **NO_REASONING_FORMS[form]}
    direct = _chat(llama_reasoning.url, body).json()["choices"][0]["message"]
    assert tiny_model.REASONING in direct["reasoning_content"], "llama-server reads this form itself"
    response = _chat(card_proxy.url, body)
    message = response.json()["choices"][0]["message"]
    assert not message.get("reasoning_content") and message["content"] == tiny_model.ANSWER
    capture = _capture(card_proxy, response)
    reasoning = [c for c in capture["changes"] if c["stage"] == "reasoning"]
    forwarded = _forwarded(capture)
    assert any(c["kind"] == "inject" and c["after"] == forwarded["reasoning_effort"] for c in reasoning), reasoning
    assert not capture["assembled"]["reasoning"]


def test_reasoning_asked_for_still_arrives(card_proxy: InprocProxy, llama_reasoning: LlamaServer) -> None:
    """The other way round: a foreign "reason hard" is translated, not turned into "off"."""
    body = {"model": "tiny", "messages": GREETING, "temperature": 0, "reasoning": {"effort": "high"}}
    response = _chat(card_proxy.url, body)
    message = response.json()["choices"][0]["message"]
    assert tiny_model.REASONING in message["reasoning_content"]
    forwarded = _forwarded(_capture(card_proxy, response))
    assert "reasoning" not in forwarded and forwarded["reasoning_effort"] == "high"
