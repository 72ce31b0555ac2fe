"""tapfix's streamed regeneration by continuation against the real vLLM (`tapfix run --engine vllm`).

vLLM never breaks a call on demand, so the realengine suite's fault relay (tests/process/realengine/fault_relay.py)
between tapfix and vLLM cuts vLLM's first streamed answer inside its tool call, after vLLM's real bytes up
to there went out, and passes every later request untouched. The model reasons, says a line, then calls
`write` (forced), so when the call breaks the client has already read reasoning and content. The client is
the OpenAI SDK (`max_retries=0`, streamed). What a user relies on:

- the SDK reads one whole, valid call (the model's own), no error, one completion id (attempt 1's), and the
  text it already had only once;
- attempt 2, as vLLM received it, continues exactly that text: a trailing assistant message,
  `continue_final_message: true`, `add_generation_prompt: false` (docs/regenerate.md); and vLLM's own
  rendering of that request (its `/tokenize`) holds the reasoning and ends with the content the client read,
  so the model continues after what the client saw, not after an empty think block;
- the store holds the client-facing exchange (flag `regenerated`) and attempt 2.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import openai
import pytest

from tests.e2e.conftest import Store
from tests.inproc.test_e2e_regenerate import all_exchanges, rows
from tests.process.realengine.fault_relay import Cut, FaultRelay
from tests.process.vllm.engine import MODEL, VllmServer
from tests.process.vllm.wire import (
    THINKING,
    TOOLS,
    WRITE_ARGS,
    ask,
    chat_choice,
    hermes_call,
    parsed_events,
    rendered_prompt,
    think,
)
from tests.support.inproc import InprocProxy

pytestmark = [pytest.mark.vllm]

SAID = "I will write the file now.\n"
MESSAGES = ask("Write hello.py.", think() + SAID + hermes_call("write", WRITE_ARGS))
# Right after vLLM's first tool_calls delta (the id and the name), the chunked body ends cleanly.
AFTER_THE_FIRST_CALL_DELTA = Cut(b'"tool_calls"', event_end=True)
# Inside the first fragment of the call's arguments (one byte into its JSON string), then a TCP reset. Both
# cuts hold however vLLM happened to group the tokens into chunks.
RESET_MID_ARGUMENTS = Cut(b'"arguments":"', offset=len(b'"arguments":"') + 1, reset=True)
CUTS = {"end_after_first_call_delta": AFTER_THE_FIRST_CALL_DELTA, "reset_mid_arguments": RESET_MID_ARGUMENTS}


@pytest.fixture
def cut_in_front(
    tapfix_in_front: Callable[..., InprocProxy], vllm: VllmServer
) -> Iterator[Callable[[Cut], tuple[FaultRelay, InprocProxy]]]:
    relays: list[FaultRelay] = []

    def start(cut: Cut) -> tuple[FaultRelay, InprocProxy]:
        relay = FaultRelay(vllm.port, cut)
        relays.append(relay)
        return relay, tapfix_in_front(relay, "--engine", "vllm", "--regenerate", "1")

    yield start
    for relay in relays:
        relay.close()


@dataclass
class Read:
    """What the SDK assembled from the stream."""

    capture_id: str
    ids: set[str] = field(default_factory=set)
    content: str = ""
    reasoning: str = ""
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    finish: list[str] = field(default_factory=list)
    error: openai.APIError | None = None


def sdk_stream(proxy: InprocProxy) -> Read:
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0, timeout=120)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        stream=True,
        max_tokens=400,
    )
    read = Read(raw.headers["x-tapfix-capture-id"])
    try:
        for chunk in raw.parse():
            read.ids.add(chunk.id)
            for choice in chunk.choices:
                delta = choice.delta
                read.content += delta.content or ""
                read.reasoning += getattr(delta, "reasoning", None) or ""  # vLLM's field, kept by the SDK
                for call in delta.tool_calls or []:
                    got = read.calls.setdefault(call.index, {"name": "", "arguments": ""})
                    got["name"] += (call.function and call.function.name) or ""
                    got["arguments"] += (call.function and call.function.arguments) or ""
                if choice.finish_reason:
                    read.finish.append(choice.finish_reason)
    except openai.APIError as e:
        read.error = e
    return read


@pytest.mark.parametrize("cut", CUTS.values(), ids=CUTS.keys())
def test_a_cut_call_after_reasoning_and_text_is_continued_from_what_the_client_read(
    cut_in_front: Callable[[Cut], tuple[FaultRelay, InprocProxy]], vllm: VllmServer, cut: Cut
) -> None:
    relay, proxy = cut_in_front(cut)
    read = sdk_stream(proxy)
    first, second = relay.chat(2)[:2]
    assert (first.cut, second.cut) == (True, False) and len(relay.chat(2)) == 2 and not relay.errors
    assert len(first.delivered) == cut.at(first.upstream), "the cut is where the test put it"
    attempt_1 = chat_choice(first.upstream, True)
    assert attempt_1.parsed_calls() == [("write", WRITE_ARGS)], "vLLM sent the whole call; the relay cut it"
    assert (attempt_1.reasoning, attempt_1.content) == (THINKING, "\n\n" + SAID)

    # The client: one valid call, no error, attempt 1's id, and the text it read before the cut once.
    assert read.error is None, read.error
    assert [(c["name"], json.loads(c["arguments"])) for c in read.calls.values()] == [("write", WRITE_ARGS)]
    assert read.finish == ["tool_calls"]
    assert read.ids == {data["id"] for _, data in parsed_events(first.upstream) if isinstance(data, dict)}
    assert (read.reasoning, read.content) == (attempt_1.reasoning, attempt_1.content)

    # Attempt 2 as vLLM received it: the request plus the text the client read, continued.
    sent_1, sent_2 = first.json, second.json
    trailing = sent_2["messages"][-1]
    assert trailing["role"] == "assistant" and trailing["content"] == read.content
    assert sent_2 == {
        **sent_1,
        "messages": [*sent_1["messages"], trailing],
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    prompt = rendered_prompt(vllm, sent_2)
    assert prompt.endswith("<think>\n" + read.reasoning.strip("\n") + "\n</think>\n\n" + read.content.lstrip("\n")), (
        "vLLM's prompt for attempt 2 must hold the reasoning and content the client read:\n" + prompt[-300:]
    )
    attempt_2 = chat_choice(second.upstream, True)
    assert attempt_2.parsed_calls() == [("write", WRITE_ARGS)]
    assert (attempt_2.reasoning, attempt_2.content.strip()) == ("", ""), "vLLM doesn't repeat the prefix"

    # The store: the client-facing exchange, flagged, and attempt 2 with the body vLLM received.
    store = Store(proxy.extra["db"])
    parent, attempt = rows(store.db, read.capture_id, 2)
    assert all_exchanges(store.db) == 2
    assert [(r["attempt"], r["attempt_of"]) for r in (parent, attempt)] == [(1, None), (2, read.capture_id)]
    assert "regenerated" in json.loads(parent["flags"])
    assert store.body(attempt["id"], "request") == second.request.body
    assert [c["kind"] for c in store.changes(attempt["id"])][0] == "regenerate"
