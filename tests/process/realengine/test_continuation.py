"""tapfix's continuation rules (proxy/regenerate/continuation.py) against the real llama-server.

When a held tool call is lost after the client already got some text, the next attempt continues that
text (`next_attempt` for engine "llamacpp": a trailing assistant message, `continue_final_message: true`,
`add_generation_prompt: false`), and the relay strips any repeated prefix (`echo.PrefixEcho`). Those
rules were read from llama.cpp's source (docs/regenerate.md); here the body `next_attempt` builds goes
straight to llama-server, and what a user relies on is checked on the server's own answer:

- llama-server accepts the body (no 400: it refuses `continue_final_message` with
  `add_generation_prompt: true`, and a trailing message with `tool_calls`), and the attempt ends cleanly;
- the new text continues exactly what the client had: prefix + new == what the model says uninterrupted
  (a plain request to the same server, not a literal);
- after `PrefixEcho`, the attempt's fields hold exactly the new text, streamed (llama.cpp leaves the
  prefix out of the deltas with the explicit form) and whole (it repeats the prefix in `message`);
- with nothing received there is no trailing message (never an empty prefix, which llama.cpp drops with
  the assistant header), and the server's answer is the uninterrupted one.

The tiny model continues a prefix cut where the pre-tokenizer cuts (tiny_model.ANSWER_PIECES), so the
client's text is always cut between the pieces the server streamed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from tapfix.proxy.regenerate.continuation import NextAttempt, Received, Skip, next_attempt
from tapfix.proxy.regenerate.echo import PrefixEcho

from tests.process.realengine import tiny_model as tm

pytestmark = [pytest.mark.realengine]

ENGINE = "llamacpp"
TIMEOUT = 60.0
FIXED_SEED = 1234  # the seed source of the from-scratch attempt, so its request is the same every run
# A response field's name on the wire, and the name `NextAttempt.prefix` / `PrefixEcho` give it.
FIELDS = {"content": "content", "reasoning_content": "reasoning"}

# Conversations that end in a text answer (tiny_model: no tools, or tools with the call's result in).
CONVERSATIONS: dict[str, dict[str, Any]] = {
    "no_tools": {"messages": [{"role": "user", "content": "hi"}]},
    "after_tool_result": {"messages": tm.after_the_call(), "tools": [tm.WRITE_TOOL]},
}


@dataclass
class Answer:
    """One choice as llama-server sent it: each field's text pieces in arrival order (one piece for a
    whole message), the finish reason, and any error the server reported."""

    pieces: list[tuple[str, str]] = field(default_factory=list)  # (tapfix field name, text)
    finish_reason: str | None = None
    errors: list[Any] = field(default_factory=list)

    def text(self, name: str) -> str:
        return "".join(text for field_name, text in self.pieces if field_name == name)

    def first(self, name: str, count: int) -> str:
        """The first `count` pieces of a field, joined: what a client interrupted there has."""
        return "".join([text for field_name, text in self.pieces if field_name == name][:count])


def _ask(url: str, body: Mapping[str, Any]) -> Answer:
    """Send a Chat Completions body as it is; fail on anything but a clean 200."""
    with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        response = client.post("/v1/chat/completions", json=dict(body))
    assert response.status_code == 200, f"llama-server refused the body ({response.status_code}): {response.text}"
    answer = Answer()
    if not body.get("stream"):
        choice = response.json()["choices"][0]
        for wire, name in FIELDS.items():
            if choice["message"].get(wire):
                answer.pieces.append((name, choice["message"][wire]))
        answer.finish_reason = choice["finish_reason"]
        return answer
    for line in response.text.splitlines():
        if line.startswith("error"):
            answer.errors.append(line)
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        payload = json.loads(line[5:])
        if "error" in payload:
            answer.errors.append(payload["error"])
        for choice in payload.get("choices") or []:
            for wire, name in FIELDS.items():
                if choice["delta"].get(wire):
                    answer.pieces.append((name, choice["delta"][wire]))
            answer.finish_reason = choice.get("finish_reason") or answer.finish_reason
    return answer


def _request(conversation: str, stream: bool, **extra: Any) -> dict[str, Any]:
    return {**CONVERSATIONS[conversation], "temperature": 0, "stream": stream, **extra}


def _continued(request: Mapping[str, Any], received: Received) -> NextAttempt:
    attempt = next_attempt(request, "chat", ENGINE, received)
    assert isinstance(attempt, NextAttempt) and attempt.how == "continuation", attempt
    trailing = attempt.body["messages"][-1]
    assert trailing["role"] == "assistant" and "tool_calls" not in trailing
    assert (attempt.body["continue_final_message"], attempt.body["add_generation_prompt"]) == (True, False)
    return attempt


def _new_text(attempt: NextAttempt, answer: Answer, stream: bool) -> tuple[dict[str, str], frozenset[str]]:
    """What the relay would forward for the attempt, per field, after PrefixEcho; and the fields whose
    prefix the server repeated."""
    echo = PrefixEcho(attempt.prefix)
    if not stream:
        return echo.strip({name: answer.text(name) for name in FIELDS.values()}), echo.echoed
    out = dict.fromkeys(FIELDS.values(), "")
    previous = None
    for name, text in answer.pieces:
        if previous is not None and name != previous:  # the relay flushes before another kind of event
            for held_name, held in echo.flush().items():
                out[held_name] += held
        out[name] += echo.feed(name, text)
        previous = name
    for held_name, held in echo.flush().items():
        out[held_name] += held
    return out, echo.echoed


def _check_continues(
    attempt: NextAttempt, answer: Answer, uninterrupted: Answer, stream: bool, echoed: frozenset[str]
) -> None:
    assert not answer.errors, answer.errors
    assert answer.finish_reason == uninterrupted.finish_reason == "stop"
    new, seen_echo = _new_text(attempt, answer, stream)
    for name in FIELDS.values():
        prefix = attempt.prefix.get(name, "")
        assert prefix + new[name] == uninterrupted.text(name), name
    assert seen_echo == echoed, "which fields llama.cpp repeated the prefix in"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("cut", range(1, len(tm.ANSWER_PIECES)))
def test_a_continuation_of_received_content_carries_on_exactly(llama, conversation, stream, cut):
    """The client got the answer's first `cut` pieces; the attempt's new text is exactly the rest."""
    uninterrupted = _ask(llama.url, _request(conversation, stream=True))
    assert uninterrupted.text("content") == tm.ANSWER  # the model's own answer, before any cut
    received = Received(content=uninterrupted.first("content", cut))
    assert received.content == "".join(tm.ANSWER_PIECES[:cut]), "the server streams the answer piece by piece"

    request = _request(conversation, stream=stream)
    attempt = _continued(request, received)
    assert attempt.prefix == {"content": received.content}
    answer = _ask(llama.url, attempt.body)
    # Explicit continuation: the stream leaves the prefix out, the whole message repeats it.
    _check_continues(attempt, answer, uninterrupted, stream, frozenset() if stream else frozenset({"content"}))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("cut", [1, 2, len(tm.REASONING_PIECES) // 2])
def test_a_continuation_of_received_reasoning_carries_on_exactly(llama_reasoning, stream, cut):
    """The client got the first `cut` reasoning deltas (exactly as llama-server sent them, its leading
    newline included) and no content: the attempt continues the reasoning, then answers."""
    uninterrupted = _ask(llama_reasoning.url, _request("no_tools", stream=True))
    assert uninterrupted.text("reasoning").strip() == tm.REASONING and uninterrupted.text("content") == tm.ANSWER
    received = Received(reasoning=uninterrupted.first("reasoning", cut))

    attempt = _continued(_request("no_tools", stream=stream), received)
    assert attempt.prefix == {"content": "", "reasoning": received.reasoning}
    assert attempt.body["messages"][-1]["reasoning_content"] == received.reasoning
    answer = _ask(llama_reasoning.url, attempt.body)
    _check_continues(attempt, answer, uninterrupted, stream, frozenset() if stream else frozenset({"reasoning"}))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("cut", [1, 2])
def test_a_continuation_after_the_reasoning_carries_the_content_on(llama_reasoning, stream, cut):
    """The client got all the reasoning and the answer's first `cut` pieces: both fields go as the
    prefix (content alone would render an empty think block), and only the rest of the answer is new."""
    uninterrupted = _ask(llama_reasoning.url, _request("no_tools", stream=True))
    received = Received(content=uninterrupted.first("content", cut), reasoning=uninterrupted.text("reasoning"))
    assert received.content == "".join(tm.ANSWER_PIECES[:cut])

    attempt = _continued(_request("no_tools", stream=stream), received)
    answer = _ask(llama_reasoning.url, attempt.body)
    echoed = frozenset() if stream else frozenset({"content", "reasoning"})
    _check_continues(attempt, answer, uninterrupted, stream, echoed)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_with_nothing_received_the_attempt_starts_again_without_a_prefix(llama, conversation, stream):
    """Nothing reached the client: no trailing assistant message (an empty one would drop llama.cpp's
    assistant header), and the server answers as it does uninterrupted. At temperature 0 a fresh start
    would only repeat itself, so that request gets no attempt at all."""
    uninterrupted = _ask(llama.url, _request(conversation, stream=stream))
    greedy = next_attempt(_request(conversation, stream=stream), "chat", ENGINE, Received())
    assert isinstance(greedy, Skip) and greedy.reason == "deterministic", greedy

    # The engine's own sampling (no temperature: llama-server's defaults) with the attempt's seed.
    request = {**CONVERSATIONS[conversation], "stream": stream}
    attempt = next_attempt(request, "chat", ENGINE, Received(), seed=lambda: FIXED_SEED)
    assert isinstance(attempt, NextAttempt) and attempt.how == "fresh_seed", attempt
    assert attempt.body["messages"] == request["messages"] and attempt.prefix == {}
    assert "continue_final_message" not in attempt.body and "add_generation_prompt" not in attempt.body
    answer = _ask(llama.url, attempt.body)
    assert not answer.errors, answer.errors
    assert (answer.text("content"), answer.finish_reason) == (uninterrupted.text("content"), "stop")
