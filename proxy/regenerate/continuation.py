"""The next attempt's request body: continue what the client already has, or start again with a fresh seed.

When a held tool call is lost, the client may already hold part of the choice (content, reasoning). The
new attempt must stay consistent with it, so, in this order (docs/regenerate.md has each engine's
mechanism and its source):

1. `n > 1` is skipped (`n_gt_1`): the error is not per choice on the wire, and one choice can't be
   asked for again alone.
2. A tool-call byte the client already has is skipped (`tool_call_sent`): a structured call can't be a
   prefix (llama.cpp answers 400 "Cannot continue an assistant message that contains tool calls") and
   a call can't be taken back.
3. **Continuation** where the engine continues a partial assistant message and the client has text to
   continue: the text is appended as a trailing `assistant` message, with `continue_final_message: true`
   and `add_generation_prompt: false` (both engines refuse the two flags true together).
   - llama.cpp: the explicit form, not the implicit prefill (whose stream repeats the prefix).
     `reasoning_content` goes exactly as received (a leading newline kept: the prefill rebuilds
     `<think>` + reasoning_content), and with content sent both fields go (content alone renders an
     empty think block, i.e. "no reasoning"). A reasoning-only prefix continues the reasoning.
   - vLLM, SGLang: the prompt is cut at the end of the trailing message's *content* (transformers'
     `continue_final_message`; SGLang tokenizes the content on its own), so content must be non-empty;
     a reasoning-only prefix has nothing to cut at and is not continued. Received reasoning rides along
     in the field the engine hands the chat template (`_REASONING_FIELD`): vLLM reads an assistant
     message's `reasoning` (0.32.0 drops `reasoning_content`: tests/process/vllm/test_facts.py), SGLang and
     llama.cpp `reasoning_content`. A template that drops it, or strips the content's edge whitespace,
     continues from less than the client has: check on the target model.
   - Never an empty prefix: with nothing received, no trailing message (llama.cpp drops an empty one
     and the assistant header with it).
   - A request that already ends with an `assistant` message (the client's own prefill) is not
     continued: two trailing assistant messages are a 400 on llama.cpp, and whether the client's
     prefill was echoed is the engine's business.
4. Otherwise **from scratch**. A deterministic request (a client `seed`, `temperature: 0`, or `top_k: 1`,
   all greedy or replayable) would reproduce the same broken call, so it is skipped (`deterministic`).
   Else the body is the request as it was, plus a fresh `seed` where the engine and the surface take
   one (`fresh_seed`), or unchanged where they don't (`fresh`: the engine's own sampling differs anyway).

Surfaces: Chat Completions gets every rule. Responses and Messages get rules 1, 2 and 4 without a seed
(OpenAI's Responses and Anthropic's Messages have no `seed` field, and the engines' continuation on
those routes is not established), so there a regeneration is always from scratch.

`request` is the body as forwarded to the upstream (after tapfix's policy), since that is what was
sampled; it is never mutated. `Received` is what the client got for this choice after tapfix's own edits.
The body edits come back as `Change` rows too, so the wiring records why the attempt looks as it does.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeGuard

from tapfix.proxy.changes import Change
from tapfix.proxy.surfaces import Surface, api_surface

STAGE: Final = "toolcalls"  # the tool-call stage's unrecoverable outcome is what an attempt answers

How = Literal["continuation", "fresh_seed", "fresh"]
SkipReason = Literal["n_gt_1", "tool_call_sent", "deterministic", "unsupported_surface", "malformed_request"]
SeedSource = Callable[[], int]

# A seed every engine takes: llama.cpp reads a uint32 (0xFFFFFFFF means "random"), vLLM and SGLang an
# int; OpenAI documents an integer. 31 bits keep clear of every sign and sentinel.
SEED_LIMIT: Final = 2**31

# Engines whose Chat Completions route continues a trailing assistant message through
# `continue_final_message`, and whether a reasoning-only prefix can be continued there.
_CONTINUES: Final[dict[str, bool]] = {"llamacpp": True, "vllm": False, "sglang": False}
# The assistant-message field each of those engines passes to the chat template as the reasoning.
_REASONING_FIELD: Final[dict[str, str]] = {
    "llamacpp": "reasoning_content",
    "vllm": "reasoning",
    "sglang": "reasoning_content",
}
# Engines whose Chat Completions route takes `seed` (None: an unknown OpenAI-compatible server; `seed`
# is a documented Chat Completions field). TabbyAPI's is not established (docs/regenerate.md).
_SEEDED_CHAT: Final[frozenset[str | None]] = frozenset({None, "vllm", "sglang", "llamacpp", "ollama", "openai"})


@dataclass(frozen=True, slots=True)
class Received:
    """What the client already has for this choice: visible text per field, and whether any byte of a
    tool call (an opened delta, a name, an argument fragment) went out."""

    content: str = ""
    reasoning: str = ""
    tool_call_sent: bool = False


@dataclass(frozen=True, slots=True)
class NextAttempt:
    body: dict[str, Any]
    how: How
    reason: str  # why the attempt looks as it does, for the record even when the body is unchanged
    # The text sent as the prefix, keyed "content" / "reasoning" (empty unless continued): what the
    # response may repeat, for `echo.PrefixEcho`.
    prefix: Mapping[str, str] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Skip:
    reason: SkipReason
    detail: str


def system_seed() -> int:
    """A seed from the OS's random source, in the range every engine takes."""
    return secrets.randbelow(SEED_LIMIT)


def deterministic(request: Mapping[str, Any]) -> str | None:
    """Why a from-scratch attempt would sample the same tokens again, or None."""
    seed = request.get("seed")
    if seed is not None:
        return f"the request sets seed {seed!r}"
    temperature = request.get("temperature")
    if _number(temperature) and temperature == 0:
        return "the request sets temperature 0 (greedy)"
    top_k = request.get("top_k")
    if _number(top_k) and top_k == 1:
        return "the request sets top_k 1 (greedy)"
    return None


def next_attempt(
    request: Mapping[str, Any],
    surface: Surface,
    engine: str | None,
    received: Received,
    *,
    attempt: int = 2,
    seed: SeedSource = system_seed,
) -> NextAttempt | Skip:
    """The body of attempt `attempt` (2 for the first regeneration), or why there is none."""
    api = api_surface(surface)
    turns_key = api.conversation
    if turns_key is None:
        return Skip("unsupported_surface", f"no regeneration on the {surface} surface")
    turns = request.get(turns_key)
    if not isinstance(turns, list | str) or not turns:
        return Skip("malformed_request", f"the request has no {turns_key} to send again")
    n = request.get("n")
    if _number(n) and n > 1:
        return Skip("n_gt_1", f"the request asks for n={n} choices")
    if received.tool_call_sent:
        return Skip("tool_call_sent", "part of a tool call already reached the client")
    label = f"regenerate attempt {attempt}"
    if api.continuable and isinstance(turns, list):
        why_not = _why_not_continued(turns, engine, received)
        if why_not is None:
            return _continued(request, turns, engine or "", received, label)
    else:
        why_not = f"no continuation on the {surface} surface"
    why_same = deterministic(request)
    if why_same is not None:
        return Skip("deterministic", f"{why_same}, and the attempt can't continue the client's text ({why_not})")
    if not api.seeded or engine not in _SEEDED_CHAT:
        reason = f"{label}: from scratch, the request unchanged (no seed to set here; {why_not})"
        return NextAttempt(dict(request), "fresh", reason)
    value = seed()
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < SEED_LIMIT:
        raise ValueError(f"seed source gave {value!r}, expected an integer from 0 to {SEED_LIMIT - 1}")
    body = dict(request)
    body["seed"] = value
    reason = f"{label}: from scratch with a fresh seed ({why_not})"
    return NextAttempt(body, "fresh_seed", reason, changes=[Change(STAGE, "inject", "$.seed", None, value, reason)])


def _why_not_continued(turns: list[Any], engine: str | None, received: Received) -> str | None:
    if engine is None or engine not in _CONTINUES:
        return f"engine {engine or 'unknown'} can't continue a partial assistant message"
    if not received.content and not received.reasoning:
        return "the client has received no text to continue"
    if not received.content and not _CONTINUES[engine]:
        return f"{engine} continues only content, and the client has received reasoning alone"
    last = turns[-1]
    if isinstance(last, Mapping) and last.get("role") == "assistant":
        return "the request already ends with an assistant message (the client's own prefill)"
    return None


def _continued(
    request: Mapping[str, Any], turns: list[Any], engine: str, received: Received, label: str
) -> NextAttempt:
    message: dict[str, Any] = {"role": "assistant", "content": received.content}
    prefix = {"content": received.content}
    if received.reasoning:
        message[_REASONING_FIELD[engine]] = received.reasoning
        prefix["reasoning"] = received.reasoning
    body = dict(request)
    body["messages"] = [*turns, message]
    reason = f"{label}: continue the text the client already has ({engine} continue_final_message)"
    changes = [Change(STAGE, "inject", f"$.messages[{len(turns)}]", None, message, reason)]
    for key, value in (("continue_final_message", True), ("add_generation_prompt", False)):
        before = request.get(key)
        if before is not value:
            kind = "inject" if key not in request else "override"
            changes.append(Change(STAGE, kind, f"$.{key}", before, value, reason))
        body[key] = value
    return NextAttempt(body, "continuation", reason, prefix, changes)


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)
