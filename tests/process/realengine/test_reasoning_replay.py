"""Reasoning replay reaches the prompt the real llama-server renders (issue 36).

Qwen3's template (`Qwen-Qwen3-0.6B.jinja`, from the llama-cpp-python sdist the build came from) renders an
assistant turn after the last user query as `<think>\\n` + `reasoning_content` + `\\n</think>`, so the
prompt shows whether the turn's reasoning arrived where llama.cpp reads it. Turn 1's answer (reasoning and
a tool call) comes from a loopback upstream of the test's own, as the tiny model can't be made to reason on
demand; what tapfix forwards on turn 2, and what the client sent, are both rendered by the real server's
`/apply-template`.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.process.engine_suite import ReasoningTurns, replay_two_turns
from tests.process.realengine.engine import Build, LlamaServer
from tests.support.ci import unavailable
from tests.support.inproc import InprocProxy

pytestmark = [pytest.mark.realengine]

QWEN3_TEMPLATE = "Qwen-Qwen3-0.6B.jinja"
REASONING = "The user wants a.py read. I will call read with path a.py."
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
FIRST = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "read a.py"}]


def _qwen3_template(build: Build, tmp: Path) -> Path:
    """The template out of the sdist scripts/build-llama-server downloaded (its templates/ holds others)."""
    for tarball in sorted((build.dir.parent / "sdist").glob("llama_cpp_python-*.tar.gz")):
        with tarfile.open(tarball) as archive:
            member = next(
                (m for m in archive.getmembers() if m.name.endswith(f"models/templates/{QWEN3_TEMPLATE}")), None
            )
            if member is not None and (source := archive.extractfile(member)) is not None:
                path = tmp / QWEN3_TEMPLATE
                path.write_bytes(source.read())
                return path
    unavailable(f"real-engine suite: no {QWEN3_TEMPLATE} in the llama-cpp-python sdist under {build.dir.parent}")
    raise AssertionError  # unavailable() skips or fails


# As llama-server answers a reasoning model: `reasoning_content`, then a tool call, its arguments in a delta apart.
TURNS = ReasoningTurns("reasoning_content", REASONING, ("", '{"path":"a.py"}'), "It prints 1.", result="print(1)")


@pytest.fixture(scope="module")
def qwen3_llama(llama_server: Callable[..., LlamaServer], llama_build: Build, tmp_path_factory) -> LlamaServer:
    template = _qwen3_template(llama_build, tmp_path_factory.mktemp("qwen3"))
    return llama_server("--chat-template-file", str(template))


def _rendered(server: LlamaServer, messages: list[dict]) -> str:
    response = httpx.post(server.url + "/apply-template", json={"messages": messages, "tools": TOOLS}, timeout=30)
    response.raise_for_status()
    return str(response.json()["prompt"])


def test_turn_2_rendered_by_llama_server_holds_turn_1s_reasoning_through_tapfix_only(
    qwen3_llama: LlamaServer, tapfix_in_front: Callable[..., InprocProxy]
):
    messages, forwarded = replay_two_turns(tapfix_in_front, "llamacpp", TURNS, FIRST, TOOLS)

    direct, through = _rendered(qwen3_llama, messages), _rendered(qwen3_llama, forwarded)
    assert "<think>\n" + REASONING + "\n</think>" in through
    assert REASONING not in direct
    assert through.replace("<think>\n" + REASONING + "\n</think>\n\n", "") == direct  # nothing else differs
