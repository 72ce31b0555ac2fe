"""Issue 31 items 10-13 end to end: `tapfix run` (regeneration on, `--regenerate 1`) in front of `tapfix mock`
serving the broken answers, read by the openai SDK (Chat Completions, Responses) and the anthropic SDK
(Messages), streamed and not, `max_retries=0`.

- item 10, a leaked call cut by `max_tokens`, and item 13, a `length` turn with a complete call and a sign
  of more (its calls section left open; text after a structured call): the first attempt is broken and
  a second one is healthy, so regeneration hands the SDK the healthy call; when every attempt is broken
  the SDK raises the retryable error (never half-written markup, never a call with the sign removed);
- item 11, a trailing `stop` after `finish_reason: "tool_calls"`: the SDK's stream helper, which keeps the
  last finish it read, finishes with `tool_calls`;
- item 12, a second call glued into the first call's arguments: the SDK gets two calls.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.support.builders import chat_chunk, tool, tool_call_delta
from tests.support.inproc import InprocProxy, mock_and_proxy

WRITE = tool("write", {"filePath": {"type": "string"}, "content": {"type": "string"}}, ["filePath", "content"])
BASH = tool("bash", {"command": {"type": "string"}}, ["command"])
TOOLS = [WRITE, BASH]
R_TOOLS: list[Any] = [{"type": "function", **t["function"]} for t in TOOLS]
M_TOOLS: list[Any] = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]
HI = {"filePath": "a.txt", "content": "hi"}
LS = {"command": "ls"}
SURFACES = ["chat", "responses", "messages"]


chunk = partial(chat_chunk, id="chatcmpl-qa31")


def text(pieces: list[str], finish: str) -> dict[str, Any]:
    return {
        "stream": [
            chunk({"role": "assistant", "content": ""}),
            *[chunk({"content": p}) for p in pieces],
            chunk(finish_reason=finish),
        ]
    }


def calls(
    *entries: tuple[str, str], after: list[dict[str, Any]] | None = None, finish: str = "tool_calls"
) -> dict[str, Any]:
    stream = [chunk({"role": "assistant", "content": ""})]
    for k, (name, args) in enumerate(entries):
        stream.append(chunk({"tool_calls": [tool_call_delta(k, f"call_{k}", name, "")]}))
        stream += [
            chunk({"tool_calls": [tool_call_delta(k, arguments=args[i : i + 9])]}) for i in range(0, len(args), 9)
        ]
    return {"stream": [*stream, *(after or []), chunk(finish_reason=finish)]}


CUT = '<tool_call>\n{"name": "write", "arguments": {"filePath": "a.txt", "content": "hi'
KIMI_OPEN = (  # one complete call, its calls section left open
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>"
    '{"command": "ls"}<|tool_call_end|>'
)
BROKEN = {
    "cut10": text([CUT[:9], CUT[9:40], CUT[40:]], "length"),  # a leaked call cut by max_tokens
    "open13": text([KIMI_OPEN[:30], KIMI_OPEN[30:]], "length"),
    # text after a complete structured call: only a stream says it came after (a body's content comes first)
    "after13": calls(("bash", json.dumps(LS)), after=[chunk({"content": "Now I will"})], finish="length"),
}
HEALTHY = calls(("write", json.dumps(HI)))
TRAILING_STOP = calls(("write", json.dumps(HI)), after=[chunk(finish_reason="tool_calls")], finish="stop")
GLUED = calls(("write", json.dumps(HI) + "bash" + json.dumps(LS)))


def model(mode: str, kind: str, surface: str, stream: bool) -> str:
    return f"{mode}-{kind}-{surface}-{'stream' if stream else 'whole'}"


def models(mode: str, kind: str) -> list[str]:
    return [model(mode, kind, s, st) for s in SURFACES for st in (True, False)]


def scenario() -> dict[str, Any]:
    rules: list[dict[str, Any]] = []
    for kind, case in BROKEN.items():
        rules.append({"when": {"model": models("once", kind), "attempt": 1}, "do": "serve_case", "case": case})
        rules.append({"when": {"model": models("always", kind)}, "do": "serve_case", "case": case})
    once = [m for kind in BROKEN for m in models("once", kind)]
    rules.append({"when": {"model": once}, "do": "serve_case", "case": HEALTHY})
    rules.append({"when": {"model": models("as", "fin11")}, "do": "serve_case", "case": TRAILING_STOP})
    rules.append({"when": {"model": models("as", "glue12")}, "do": "serve_case", "case": GLUED})
    return {"description": "issue 31 items 10-13", "rules": rules}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InprocProxy]:
    tmp: Path = tmp_path_factory.mktemp("repair31")
    with mock_and_proxy(tmp, scenario(), "--regenerate", "1", shared=True) as (_, proxy):
        yield proxy


# -- what each SDK assembles -------------------------------------------------------------------------
def chat(proxy: InprocProxy, name: str, stream: bool) -> tuple[list[tuple[str, Any]], str | None]:
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0, timeout=30)
    messages: Any = [{"role": "user", "content": "write a.txt"}]
    if not stream:
        done = client.chat.completions.create(model=name, messages=messages, tools=TOOLS)  # type: ignore[arg-type]
        message = done.choices[0].message
        got = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]  # type: ignore[union-attr]
        return got, done.choices[0].finish_reason
    with client.chat.completions.stream(model=name, messages=messages, tools=TOOLS) as events:  # type: ignore[arg-type]
        for _ in events:
            pass
        final = events.get_final_completion()  # the helper keeps the last finish reason it read
    message = final.choices[0].message
    got = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]  # type: ignore[union-attr]
    return got, final.choices[0].finish_reason


def responses(proxy: InprocProxy, name: str, stream: bool) -> tuple[list[tuple[str, Any]], str | None]:
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0, timeout=30)
    if stream:
        with client.responses.stream(model=name, input="write a.txt", tools=R_TOOLS) as events:
            for _ in events:
                pass
            final = events.get_final_response()
    else:
        final = client.responses.create(model=name, input="write a.txt", tools=R_TOOLS)
    got = [(i.name, json.loads(i.arguments)) for i in final.output if i.type == "function_call"]
    return got, final.status


def messages(proxy: InprocProxy, name: str, stream: bool) -> tuple[list[tuple[str, Any]], str | None]:
    client = anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0, timeout=30)
    prompt: Any = [{"role": "user", "content": "write a.txt"}]
    if stream:
        with client.messages.stream(model=name, max_tokens=512, messages=prompt, tools=M_TOOLS) as events:
            for _ in events:
                pass
            final = events.get_final_message()
    else:
        final = client.messages.create(model=name, max_tokens=512, messages=prompt, tools=M_TOOLS)
    return [(b.name, b.input) for b in final.content if b.type == "tool_use"], final.stop_reason


CLIENTS = {"chat": chat, "responses": responses, "messages": messages}
FINISHED = {"chat": "tool_calls", "responses": "completed", "messages": "tool_use"}
CASES = [(kind, s, st) for kind in BROKEN for s in SURFACES for st in (True, False) if st or kind != "after13"]
IDS = [f"{k}-{s}-{'stream' if st else 'whole'}" for k, s, st in CASES]


@pytest.mark.parametrize(("kind", "surface", "stream"), CASES, ids=IDS)
def test_regeneration_hands_the_sdk_the_second_attempts_call(
    proxy: InprocProxy, kind: str, surface: str, stream: bool
) -> None:
    got, finish = CLIENTS[surface](proxy, model("once", kind, surface, stream), stream)
    assert got == [("write", HI)] and finish == FINISHED[surface]


@pytest.mark.parametrize(("kind", "surface", "stream"), CASES, ids=IDS)
def test_every_attempt_cut_is_the_retryable_error(proxy: InprocProxy, kind: str, surface: str, stream: bool) -> None:
    error = anthropic.APIError if surface == "messages" else openai.APIError
    with pytest.raises(error) as raised:
        CLIENTS[surface](proxy, model("always", kind, surface, stream), stream)
    assert "max_tokens reached" in str(raised.value) or "max_tokens reached" in json.dumps(
        getattr(raised.value, "body", None) or {}
    )


def test_a_trailing_stop_after_tool_calls_leaves_the_call_to_the_sdk(proxy: InprocProxy) -> None:
    got, finish = chat(proxy, model("as", "fin11", "chat", True), True)
    assert got == [("write", HI)] and finish == "tool_calls"


@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_glued_call_reaches_the_sdk_as_two_calls(proxy: InprocProxy, surface: str, stream: bool) -> None:
    got, finish = CLIENTS[surface](proxy, model("as", "glue12", surface, stream), stream)
    assert got == [("write", HI), ("bash", LS)] and finish == FINISHED[surface]
