"""Issue 38 against a real llama-server run with `-np 2`: tapfix pins each thread to a slot with `id_slot`, and the
engine itself says so: its log selects the slot by id, its `/slots` shows each thread's prompt on the slot
tapfix recorded, and a thread's later turn reports in `timings.cache_n` the prompt tokens the slot kept.

The server runs as `-np 2` does by default: each slot its own part of the KV cache (`-no-kvu` undoes the
fixture's unified cache, with which this llama-server parks idle slots in its RAM prompt cache and clears them
whenever another slot starts a task). `--slot-prompt-similarity 0` makes the engine's own choice plain least
recently used, so the turns' order below (A, B, B, A) moves both threads to the other's slot unless they are
pinned: the test fails without tapfix's pin.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.process.realengine.engine import LlamaServer
from tests.support.inproc import InprocProxy, cli, start
from tests.support.procs import wait_capture

pytestmark = [pytest.mark.realengine]


@pytest.fixture(scope="module")
def two_slots(llama_server: Callable[..., LlamaServer]) -> LlamaServer:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LLAMA_SERVER_SLOTS_DEBUG", "1")  # its /slots then shows each slot's last prompt
        return llama_server("-no-kvu", "--slot-prompt-similarity", "0", parallel=2)


@pytest.fixture(scope="module")
def proxy(two_slots: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InprocProxy]:
    tmp: Path = tmp_path_factory.mktemp("slots")
    served = httpx.get(f"{two_slots.url}/v1/models", timeout=10).json()["data"][0]["id"]
    config = tmp / "tapfix.toml"
    config.write_text(
        f'[upstreams.llama]\nbase_url = "{two_slots.url}/v1"\nengine = "llamacpp"\nslots = 2\n\n'
        f'[models.tiny]\nupstream = "llama"\nupstream_model = "{served}"\n'
    )
    handle = start(["--config", str(config), "--db", str(tmp / "captures.db")], tmp / "proxy.log")
    handle.extra["db"] = tmp / "captures.db"
    yield handle
    handle.stop()


def turn(proxy: InprocProxy, task: str, n: int, stream: bool = False) -> dict:
    """Thread `task`'s `n`-th turn; the capture's slot record."""
    messages = [{"role": "system", "content": f"You answer briefly. Thread {task}."}]
    messages.append({"role": "user", "content": f"Say something about {task}."})
    for i in range(1, n):
        messages += [{"role": "assistant", "content": "Sure."}, {"role": "user", "content": f"More, part {i}."}]
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0, timeout=60)
    if stream:
        with client.chat.completions.with_streaming_response.create(
            model="tiny", messages=messages, max_tokens=4, stream=True
        ) as raw:
            list(raw.parse())
            capture_id = raw.headers["x-tapfix-capture-id"]
    else:
        raw = client.chat.completions.with_raw_response.create(model="tiny", messages=messages, max_tokens=4)
        capture_id = raw.headers["x-tapfix-capture-id"]
    row = wait_capture(proxy.extra["db"], capture_id)
    return {**json.loads(row["route_decision"])["slot"], "cached_tokens": row["cached_tokens"]}


def test_two_interleaved_threads_each_stay_on_their_slot(proxy: InprocProxy, two_slots: LlamaServer) -> None:
    a1 = turn(proxy, "apples", 1)
    b1 = turn(proxy, "boats", 1)
    b2 = turn(proxy, "boats", 2, stream=True)  # plain LRU would send it to the apples' slot
    a2 = turn(proxy, "apples", 2)
    assert a1["slot"] != b1["slot"]
    assert (a2["slot"], a2["how"]) == (a1["slot"], "kept") and (b2["slot"], b2["how"]) == (b1["slot"], "kept")

    # The engine's own account: each slot's last prompt is its thread's, and each request chose its slot by id.
    slots = {s["id"]: s.get("prompt", "") for s in httpx.get(f"{two_slots.url}/slots", timeout=10).json()}
    assert "apples" in slots[a1["slot"]] and "More, part 1" in slots[a1["slot"]]
    assert "boats" in slots[b1["slot"]] and "More, part 1" in slots[b1["slot"]]
    chosen = [line for line in two_slots.log().splitlines() if "selected slot by id" in line]
    assert len(chosen) >= 4, two_slots.log()[-3000:]

    # The later turns found their earlier prompt in the slot's cache, as the engine's timings say.
    for later in (a2, b2):
        assert later["cache_n"] > 0 and later["cached_tokens"] >= later["cache_n"]
    assert a1["cache_n"] == 0


def test_a_responses_request_is_pinned_too(proxy: InprocProxy, two_slots: LlamaServer) -> None:
    """llama-server copies a Responses body into the chat request it makes of it, `id_slot` with it."""
    before = two_slots.log().count("selected slot by id")
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0, timeout=60)
    raw = client.responses.with_raw_response.create(
        model="tiny", instructions="You answer briefly.", input="Name a colour.", max_output_tokens=16
    )
    row = wait_capture(proxy.extra["db"], raw.headers["x-tapfix-capture-id"])
    slot = json.loads(row["route_decision"])["slot"]["slot"]
    chosen = [line for line in two_slots.log().splitlines() if "selected slot by id" in line][before:]
    assert [f"selected slot by id ({slot})" in line for line in chosen] == [True], two_slots.log()[-2000:]


@pytest.mark.parametrize(("slots", "code", "said"), [(2, 0, None), (4, 1, "error: upstreams.llama.slots: slots = 4")])
def test_check_compares_slots_with_what_llama_server_runs(two_slots: LlamaServer, tmp_path, slots, code, said) -> None:
    served = httpx.get(f"{two_slots.url}/v1/models", timeout=10).json()["data"][0]["id"]
    config = tmp_path / "tapfix.toml"
    config.write_text(
        f'[upstreams.llama]\nbase_url = "{two_slots.url}/v1"\nengine = "llamacpp"\nslots = {slots}\n\n'
        f'[models.tiny]\nupstream = "llama"\nupstream_model = "{served}"\ncontext_window = 1024\n'
    )
    result = cli("check", "--config", str(config))
    out = result.stdout.decode()
    assert [line for line in out.splitlines() if ".slots" in line] == (
        [f"{said}, but llama-server runs 2 (-np 2): pinned threads share slots"] if said else []
    ), out
    assert result.returncode == code, out
