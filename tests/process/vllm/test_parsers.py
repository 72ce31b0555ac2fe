"""vLLM's own tool-call parsers of the seed's model families, behind tapfix: the call the model wrote reaches
the client as that call, and tapfix records no change on it. And the misconfiguration the seed hit (a parser
that doesn't match the model's format) arrives as text, from which tapfix recovers the call.

One server serves every parser: the per-request switch (tests/process/vllm/served/tapfix_parser_switch.py) builds
the parser `chat_template_kwargs.tool_parser` names, as vLLM builds a parser configured by name. The model
writes each family's native markup (forced), after a closed think block (the server's `qwen3` reasoning
parser reads text before `</think>` as reasoning). What vLLM sent is read from the independent relay.

Without `--enable-auto-tool-choice` at all, vLLM refuses `tool_choice: "auto"` with a 400, which tapfix
passes on as the engine's own error.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from tests.process.engine_suite import relayed
from tests.process.realengine.relay import Relay
from tests.process.realengine.test_passthrough import recorded_changes
from tests.process.vllm.engine import VllmServer
from tests.process.vllm.test_passthrough import post, the_request, through
from tests.process.vllm.wire import CHAT, TOOLS, ask, chat_body, chat_choice, hermes_call, shown, think
from tests.support.inproc import InprocProxy

pytestmark = [pytest.mark.vllm]

ARGS = {"path": "/tmp/hello.py", "content": "print('hello')"}  # no edge newlines: qwen3_coder strips them
ARGS_JSON = json.dumps(ARGS)

# parser -> the markup a model of that family writes for write(ARGS)
MARKUP = {
    "hermes": hermes_call("write", ARGS),
    "qwen3_coder": (
        "<tool_call>\n<function=write>\n<parameter=path>\n/tmp/hello.py\n</parameter>\n"
        "<parameter=content>\nprint('hello')\n</parameter>\n</function>\n</tool_call>"
    ),
    "glm47": (
        "<tool_call>write<arg_key>path</arg_key><arg_value>/tmp/hello.py</arg_value>"
        "<arg_key>content</arg_key><arg_value>print('hello')</arg_value></tool_call>"
    ),
    "deepseek_v31": (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>write<｜tool▁sep｜>"
        + ARGS_JSON
        + "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    ),
    "kimi_k2": (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.write:0<|tool_call_argument_begin|>"
        + ARGS_JSON
        + "<|tool_call_end|><|tool_calls_section_end|>"
    ),
}


relay, proxy = relayed("vllm")


def body_for(parser: str, markup: str, stream: bool) -> dict:
    messages = ask("Write hello.py.", think() + markup)
    return chat_body(messages, tools=TOOLS, stream=stream, chat_template_kwargs={"tool_parser": parser})


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("parser", list(MARKUP))
def test_each_parser_of_the_seed_reaches_the_client_as_the_call(
    proxy: InprocProxy, relay: Relay, parser: str, stream: bool
) -> None:
    received, exchange, changes = through(proxy, relay, CHAT, body_for(parser, MARKUP[parser], stream))
    assert exchange.response.status == 200, exchange.response.body[:500]
    by_vllm = chat_choice(exchange.response.body, stream)
    assert by_vllm.parsed_calls() == [("write", ARGS)], (parser, by_vllm)
    assert (by_vllm.content.strip(), by_vllm.finish_reason) == ("", "tool_calls")
    if parser == "kimi_k2":
        assert [c["id"] for c in by_vllm.calls] == ["functions.write:0"]  # the model's own id, kept
    else:
        assert all(c["id"].startswith("chatcmpl-tool-") for c in by_vllm.calls)
    # the client reads the same call (through() compared the bytes), and no change was recorded on it
    assert chat_choice(received.body, stream).calls == by_vllm.calls
    assert not [c for c in changes if c["stage"] in ("toolcalls", "stream")], changes


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_parser_that_does_not_match_leaves_text_that_tapfix_turns_back_into_the_call(
    proxy: InprocProxy, relay: Relay, stream: bool
) -> None:
    """`pythonic` in front of a model that writes Hermes markup: vLLM finds no call and sends the markup as
    content; tapfix recovers the call from it and records the change."""
    mark = relay.mark()
    _, received = post(proxy, CHAT, body_for("pythonic", MARKUP["hermes"], stream))
    exchange = the_request(relay.exchanges_since(mark), CHAT)
    by_vllm = chat_choice(exchange.response.body, stream)
    assert by_vllm.calls == [] and by_vllm.finish_reason == "stop"
    assert MARKUP["hermes"] in by_vllm.content, by_vllm.content
    got = chat_choice(received.body, stream)
    assert got.parsed_calls() == [("write", ARGS)], got
    assert got.finish_reason == "tool_calls" and MARKUP["hermes"] not in got.content
    changes = recorded_changes(proxy.extra["db"], received.headers["x-tapfix-capture-id"])
    assert [c for c in changes if c["stage"] == "toolcalls"], changes


def test_without_auto_tool_choice_vllms_400_is_passed_on(
    tapfix_in_front: Callable[..., InprocProxy], vllm_no_auto: VllmServer
) -> None:
    body = chat_body(ask("Write hello.py.", hermes_call("write", ARGS)), tools=TOOLS, tool_choice="auto")
    direct = httpx.post(vllm_no_auto.url + CHAT, json=body, timeout=60)
    assert direct.status_code == 400
    error = direct.json()["error"]
    assert (error["type"], error["code"]) == ("BadRequestError", 400)
    assert "--enable-auto-tool-choice" in error["message"], error
    proxy = tapfix_in_front(vllm_no_auto)
    through_tapfix = httpx.post(proxy.url + CHAT, json=body, timeout=60)
    assert (through_tapfix.status_code, through_tapfix.content) == (400, direct.content)
    assert through_tapfix.headers["content-type"] == direct.headers["content-type"]
    capture = shown(proxy, through_tapfix)  # recorded as the engine's own error
    assert capture["status"] == 400 and "upstream_error" in capture["flags"]
    assert capture["upstream_error"] == error
