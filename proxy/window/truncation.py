"""Silent truncation: an engine that cuts a prompt to its window and answers as if nothing happened (Ollama
cuts to `num_ctx`: `runner/ollamarunner/runner.go`, `NewSequence`, "truncating input prompt"; its
`prompt_eval_count`, `usage.prompt_tokens` on its OpenAI API, is the count after the cut). The agent's
instructions at the front are gone, and only the engine's own count of prompt tokens shows it.

The flag needs proof, never an estimate: the prompt's tokens are at least `lower_bound` (its words: every
pre-tokenizer agents' models use, GPT-2's and Llama 3's and Qwen's regex splits and SentencePiece's
whitespace split, starts a new piece at each run of non-space characters, so a token never holds two words),
or the engine's own count where tapfix has it. Flagged only when that is more than the window (a prompt that
fits is not cut: this also keeps an engine that leaves cached tokens out of its count, as Ollama 0.30 did until
ollama#16428, from looking like one that cut) and the engine reports clearly fewer (`MARGIN`).
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.exchange import Exchange
from tapfix.proxy.jsonbody import json_object
from tapfix.proxy.surfaces import Surface, api_surface, surface_for

FLAG = "prompt_truncated"
MARGIN_MIN = 64  # tokens; and a tenth of the prompt's, whichever is more
# The roles every chat template renders whole. An assistant turn is left out: templates drop the reasoning of
# earlier turns (Qwen3's strips everything before `</think>`), so its words are no proof.
_COUNTED_ROLES = ("system", "developer", "user")


def words(text: str) -> int:
    return len(text.split())


def _text_words(content: Any) -> int:
    """Words of a message's content: a string, or the text of its parts (chat, Messages, Responses)."""
    if isinstance(content, str):
        return words(content)
    if not isinstance(content, list):
        return 0
    total = 0
    for part in content:
        if isinstance(part, dict) and part.get("type") in ("text", "input_text") and isinstance(part.get("text"), str):
            total += words(part["text"])
    return total


def lower_bound(surface: Surface | None, parsed: dict[str, Any]) -> int:
    """Tokens the request's prompt has at least, whatever the tokenizer and template: the words of its
    system, developer and user text (Messages' `system`, Responses' `instructions` and input text)."""
    api = api_surface(surface)
    if api.conversation is None:
        return 0
    total = _text_words(parsed.get(api.instructions)) if api.instructions is not None else 0
    messages = parsed.get(api.conversation)
    if api.item_turns and isinstance(messages, str):
        return total + words(messages)
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict) and message.get("role", "user") in _COUNTED_ROLES:
            total += _text_words(message.get("content"))
    return total


def reported_prompt_tokens(usage: Any) -> int | None:
    """The prompt's tokens as the engine reported them: chat's `prompt_tokens`, Responses' `input_tokens`,
    Messages' `input_tokens` plus its cache reads and writes (counted apart there)."""
    if not isinstance(usage, dict):
        return None
    for key in ("prompt_tokens", "input_tokens"):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            cached = 0
            for apart in ("cache_read_input_tokens", "cache_creation_input_tokens"):
                extra = usage.get(apart)
                cached += extra if isinstance(extra, int) and not isinstance(extra, bool) else 0
            return value + cached
    return None


def truncated(reported: int | None, at_least: int, window: int | None) -> bool:
    """The engine answered a prompt of `at_least` tokens, more than its `window`, reporting fewer by a margin."""
    if reported is None or window is None or at_least <= window:
        return False
    return reported + max(MARGIN_MIN, at_least // 10) < at_least


def describe(reported: int, at_least: int, window: int, counted_by: str) -> str:
    return (
        f"the engine reported {reported} prompt tokens for a prompt of at least {at_least} ({counted_by}) "
        f"on a {window}-token window: it cut the prompt"
    )


def prompt_truncation(ex: Exchange, usage: Any) -> str | None:
    """Why the exchange's prompt was cut (for the flag and the log line), or None. The window is the one
    addons/window.py knew for the request (`window_hints`: the window and the engine's count, when asked);
    the prompt is the request as forwarded."""
    window, counted = ex.extra.get("window_hints", (None, None))
    reported = reported_prompt_tokens(usage)
    if not isinstance(window, int) or reported is None or reported > window:  # a cut leaves at most the window
        return None
    body = ex.forwarded if ex.forwarded is not None else ex.readable_request()
    if len(body) <= window and (counted if isinstance(counted, int) else 0) <= window:
        return None  # its words are fewer than its bytes: the prompt fits, so it wasn't cut (not parsed to see)
    parsed = json_object(body)
    if parsed is None:
        return None
    bound = lower_bound(surface_for(ex.path), parsed)
    at_least, by = (
        (counted, "the engine's count") if isinstance(counted, int) and counted > bound else (bound, "its words")
    )
    if not truncated(reported, at_least, window):
        return None
    return describe(reported, at_least, window, by)
