"""tapfix's streamed regeneration (issue 19) against the real llama-server: relay, splice, Seam, PrefixEcho.

The engine never breaks a call on demand, so a fault relay (tests/process/realengine/fault_relay.py) between
`tapfix run --engine llamacpp` and llama-server cuts the first streamed answer inside its tool-call part,
after the engine's real bytes up to there went out, and passes every later request untouched. The client
is the OpenAI SDK (`max_retries=0`, streamed, tools=[write]). What a user relies on:

- with `--regenerate 1` the SDK reads one whole, valid call (the model's own name and arguments), no error
  event, one completion id (attempt 1's, as llama-server sent it), and text it already had only once;
- the store holds the client-facing exchange (flag `regenerated`) and attempt 2 (`attempt_of`, `attempt` 2);
- attempt 2's body, as llama-server received it, is what docs/regenerate.md says for llama.cpp: the client
  got nothing → the request again with a fresh `seed`; the client got reasoning and content → a trailing
  assistant message with exactly that text, `continue_final_message: true, add_generation_prompt: false`;
- with `--regenerate 0` the same cut is today's retryable error event.

The continuation case uses the QwQ template and `tool_choice: "required"`: left to itself the tiny model
never calls after reasoning (after `</think>` its bigram table goes straight to the answer, and its call
unit fires only at a newline), but llama.cpp's required-call grammar keeps it from ending after the
answer, so it samples on until a newline, where the call opens. Attempt 1 then streams reasoning, the
answer plus a sampled tail ending in that newline, then the call; the continuation's prompt ends in the
same newline, so attempt 2 is the call alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Store
from tests.inproc.test_e2e_regenerate import all_exchanges, rows
from tests.process import engine_suite
from tests.process.engine_suite import Read
from tests.process.realengine import tiny_model as tm
from tests.process.realengine.fault_relay import Cut, FaultRelay
from tests.support.inproc import InprocProxy
from tests.support.stage_io import client_view

pytestmark = [pytest.mark.realengine]

HI = [{"role": "user", "content": "hi"}]
# Right after the first tool_calls delta (the name and `{"content": "`), the chunked body ended cleanly.
AFTER_THE_FIRST_CALL_DELTA = Cut(b'"tool_calls"', event_end=True)
# Inside the call's first string value ("Hel|lo from ..."), then a TCP reset.
RESET_MID_ARGUMENTS = Cut(b'"arguments":"Hello', offset=len('"arguments":"Hel'), reset=True)
CUTS = {"end_after_first_call_delta": AFTER_THE_FIRST_CALL_DELTA, "reset_mid_arguments": RESET_MID_ARGUMENTS}


cut_in_front = engine_suite.cut_in_front
LLAMACPP = ("--engine", "llamacpp")


def sdk_stream(proxy: InprocProxy, **extra: Any) -> Read:
    return engine_suite.sdk_stream(
        proxy, "reasoning_content", 60, model="tiny", messages=HI, tools=[tm.WRITE_TOOL], **extra
    )


def fields(body: bytes) -> dict[str, Any]:
    """An SSE chat body's id(s), text per field and calls, assembled from its complete events."""
    view = client_view(body[: body.rfind(b"\n\n") + 2])  # a cut event at the end is no event
    out: dict[str, Any] = {"ids": set(), "content": "", "reasoning": "", "calls": {}, "errors": view.errors}
    for chunk in view.chunks:
        out["ids"].add(chunk.get("id"))
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            out["content"] += delta.get("content") or ""
            out["reasoning"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                got = out["calls"].setdefault(call["index"], {"name": "", "arguments": ""})
                got["name"] += (call.get("function") or {}).get("name") or ""
                got["arguments"] += (call.get("function") or {}).get("arguments") or ""
    return out


def attempts(db: Path, parent: str, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The client-facing exchange and its attempts, once `count` of them are committed; nothing else is stored."""
    found = rows(db, parent, count, timeout)
    assert all_exchanges(db) == len(found), "every exchange in the store belongs to this one client request"
    return found


def the_models_call() -> list[tuple[str, dict[str, Any]]]:
    return [(tm.CALL_NAME, tm.CALL_ARGUMENTS)]


def calls_of(calls: dict[int, dict[str, str]]) -> list[tuple[str, dict[str, Any]]]:
    return [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)]


def check_regenerated(relay: FaultRelay, proxy: InprocProxy, read: Read) -> tuple[Store, dict, dict, dict]:
    """What every regenerated request shows: the cut was real, the client read one whole call under
    attempt 1's id and no error, and the store holds the parent and attempt 2. Returns the store, the
    two exchanges that crossed the fault relay's chat route as parsed bodies, and attempt 2's row."""
    first, second = relay.chat(2)[:2]
    assert (first.cut, second.cut) == (True, False) and len(relay.chat(2)) == 2 and not relay.errors
    assert len(first.delivered) == relay.cut.at(first.upstream), "the cut is where the test put it"
    sent_1, delivered_1, sent_2 = fields(first.upstream), fields(first.delivered), fields(second.upstream)
    assert calls_of(sent_1["calls"]) == the_models_call(), "llama-server sent the whole call; the relay cut it"
    assert delivered_1["calls"] and delivered_1["calls"] != sent_1["calls"], "tapfix got part of the call"
    assert calls_of(sent_2["calls"]) == the_models_call() and not sent_2["errors"]

    assert read.error is None, read.error
    assert calls_of(read.calls) == the_models_call(), "one whole call, the model's own"
    assert read.finish == ["tool_calls"]
    assert read.ids == sent_1["ids"] and len(read.ids) == 1, "one completion id: attempt 1's"

    store = Store(proxy.extra["db"])
    parent, attempt_2 = attempts(store.db, read.capture_id, 2)
    assert [(r["attempt"], r["attempt_of"]) for r in (parent, attempt_2)] == [(1, None), (2, read.capture_id)]
    assert "regenerated" in json.loads(parent["flags"])
    client_bytes = store.body(read.capture_id, "client_response")
    view = client_view(client_bytes)
    assert (view.errors, view.done, view.after_done) == ([], 1, 0), "no error event, one [DONE]"
    assert b"tapfix-attempt-end" not in client_bytes and b": keep-alive" not in client_bytes
    roles = [ch for c in view.chunks for ch in c["choices"] if (ch.get("delta") or {}).get("role")]
    assert len(roles) == 1, "one opening role chunk"
    assert store.body(read.capture_id, "response") == first.delivered, "tapfix read attempt 1 up to the cut"
    # The store's attempt 2 body is the one llama-server received, byte for byte.
    assert store.body(attempt_2["id"], "request") == second.request.body
    return store, first.json, second.json, attempt_2


def regenerate_rows(store: Store, capture_id: str) -> list[tuple[str, str, Any, Any]]:
    return [(c["kind"], c["path"], c["before"], c["after"]) for c in store.changes(capture_id)]


@pytest.mark.parametrize("cut", CUTS.values(), ids=CUTS.keys())
def test_a_cut_call_with_nothing_before_it_is_asked_again_with_a_fresh_seed(llama, cut_in_front, cut):
    """The Qwen2.5 template: the model calls at once, so the client has nothing when the call breaks;
    attempt 2 is the forwarded body plus a fresh seed (llama.cpp's sampling is the request's own)."""
    relay, proxy = cut_in_front(llama, cut, *LLAMACPP, "--regenerate", "1")
    read = sdk_stream(proxy)
    assert (read.content, read.reasoning) == ("", "")
    store, sent_1, sent_2, attempt_2 = check_regenerated(relay, proxy, read)

    assert sent_1 == store.json_body(read.capture_id, "forwarded")
    assert "seed" not in sent_1 and isinstance(sent_2["seed"], int)
    assert sent_2 == {**sent_1, "seed": sent_2["seed"]}, "from scratch: no trailing message, no continuation flags"
    assert regenerate_rows(store, attempt_2["id"]) == [
        ("regenerate", "attempt[2]", "unrecoverable", "fresh_seed"),
        ("inject", "$.seed", None, sent_2["seed"]),
    ]


@pytest.mark.parametrize("cut", CUTS.values(), ids=CUTS.keys())
def test_a_cut_call_after_reasoning_and_text_is_continued_from_what_the_client_read(llama_reasoning, cut_in_front, cut):
    """The QwQ template: the client read the reasoning and some content before the call broke. Attempt 2
    continues exactly that text (a trailing assistant message, llama.cpp's explicit form), llama-server
    streams only the call, and the client reads its reasoning and content once."""
    relay, proxy = cut_in_front(llama_reasoning, cut, *LLAMACPP, "--regenerate", "1")
    read = sdk_stream(proxy, tool_choice="required")
    store, sent_1, sent_2, attempt_2 = check_regenerated(relay, proxy, read)

    answer_1 = fields(relay.chat(2)[0].upstream)
    assert answer_1["reasoning"].strip() == tm.REASONING and answer_1["content"].startswith(tm.ANSWER)
    # The client has the text attempt 1 streamed before its call, once: no copy from attempt 2.
    assert (read.reasoning, read.content) == (answer_1["reasoning"], answer_1["content"])
    prefix = {"role": "assistant", "content": read.content, "reasoning_content": read.reasoning}
    assert sent_1 == store.json_body(read.capture_id, "forwarded")
    assert sent_2 == {
        **sent_1,
        "messages": [*sent_1["messages"], prefix],
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    answer_2 = fields(relay.chat(2)[1].upstream)
    # llama.cpp's explicit form leaves the prefix out of the deltas, so PrefixEcho had nothing to drop.
    assert (answer_2["reasoning"], answer_2["content"]) == ("", "")
    n = len(sent_1["messages"])
    assert regenerate_rows(store, attempt_2["id"]) == [
        ("regenerate", "attempt[2]", "unrecoverable", "continuation"),
        ("inject", f"$.messages[{n}]", None, prefix),
        ("inject", "$.continue_final_message", None, True),
        ("inject", "$.add_generation_prompt", None, False),
    ]


@pytest.mark.parametrize("cut", CUTS.values(), ids=CUTS.keys())
def test_regenerate_0_gives_todays_retryable_error_event(llama, cut_in_front, cut):
    """The same cut without regeneration: the client reads no call and one retryable error event."""
    relay, proxy = cut_in_front(llama, cut, *LLAMACPP, "--regenerate", "0")
    read = sdk_stream(proxy)
    assert read.error is not None and read.calls == {}
    assert isinstance(read.error.body, dict) and read.error.body.get("type") == "server_error", read.error.body
    store = Store(proxy.extra["db"])
    (only,) = attempts(store.db, read.capture_id, 1, timeout=1.0)
    assert "regenerated" not in json.loads(only["flags"])
    view = client_view(store.body(read.capture_id, "client_response"))
    assert [e["type"] for e in view.errors] == ["server_error"]
    assert not [ch for chunk in view.chunks for ch in chunk["choices"] if (ch.get("delta") or {}).get("tool_calls")]
    (passed,) = relay.chat(1)
    assert passed.cut and not relay.errors, "the engine was asked once, and that answer was cut"
    assert store.body(read.capture_id, "response") == passed.delivered == passed.upstream[: cut.at(passed.upstream)]
