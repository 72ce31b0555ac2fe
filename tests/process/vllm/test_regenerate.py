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
from collections.abc import Callable

import pytest

from tests.e2e.conftest import Store
from tests.inproc.test_e2e_regenerate import all_exchanges, rows
from tests.process import engine_suite
from tests.process.engine_suite import Read
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


cut_in_front = engine_suite.cut_in_front


def sdk_stream(proxy: InprocProxy) -> Read:
    return engine_suite.sdk_stream(proxy, "reasoning", 120, model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=400)


@pytest.mark.parametrize("cut", CUTS.values(), ids=CUTS.keys())
def test_a_cut_call_after_reasoning_and_text_is_continued_from_what_the_client_read(
    cut_in_front: Callable[..., tuple[FaultRelay, InprocProxy]], vllm: VllmServer, cut: Cut
) -> None:
    relay, proxy = cut_in_front(vllm, cut, "--engine", "vllm", "--regenerate", "1")
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
