"""Reasoning replay reaches the prompt the real vLLM 0.32 renders (issue 36).

The tiny Qwen3 model's template renders an assistant turn after the last user query as `<think>` + its
reasoning + `</think>`. Turn 1's answer (reasoning and a tool call) comes from a loopback upstream of the
test's own, as the tiny model can't be made to reason on demand; what tapfix forwards on turn 2, and what the
client sent, are both rendered by the real server (`/tokenize`, as a generation renders it).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.process.engine_suite import ReasoningTurns, replay_two_turns
from tests.process.vllm.engine import VllmServer
from tests.process.vllm.wire import rendered_prompt
from tests.support.inproc import InprocProxy

pytestmark = [pytest.mark.vllm]

REASONING = "I should read a.py before I change it."
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
FIRST = [{"role": "user", "content": "hi"}]


# As vLLM answers a reasoning model: `reasoning` deltas, then a tool call.
TURNS = ReasoningTurns("reasoning", REASONING, ("{}",), "ok", result="ok")


def test_turn_2_rendered_by_vllm_holds_turn_1s_reasoning_through_tapfix_only(
    vllm: VllmServer, tapfix_in_front: Callable[..., InprocProxy]
) -> None:
    messages, forwarded = replay_two_turns(tapfix_in_front, "vllm", TURNS, FIRST, TOOLS)
    assert forwarded[1]["reasoning"] == REASONING
    through = rendered_prompt(vllm, {"messages": forwarded, "tools": TOOLS})
    direct = rendered_prompt(vllm, {"messages": messages, "tools": TOOLS})
    assert "<|im_start|>assistant\n<think>\n" + REASONING + "\n</think>\n\n" in through
    assert REASONING not in direct
