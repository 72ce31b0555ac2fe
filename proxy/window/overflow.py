"""Each engine's own words for "the prompt does not fit", read back into numbers.

Agents compact a conversation only when the error text matches their list of overflow messages (opencode's
`provider/error.ts`, adapted from pi's `packages/ai/src/utils/overflow.ts`). Several engines' texts are in
none of those lists (SGLang's "is longer than the model's context length", Ollama's "the input length exceeds
the context length", TabbyAPI's "Prompt length N exceeds the available context size"), so the agent retries
the same request until it gives up. tapfix recognises each engine's text here and the surface's standard
overflow error (`tapfix.proxy.errors.context_overflow`) replaces it.

Only an error that says the *prompt alone* can't fit is an overflow: vLLM's and SGLang's "prompt plus
max_tokens" refusals are not (the prompt fits; the max_tokens clamp is the answer to those).
The texts, and where each engine writes them, are listed in docs/window.md.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

# (pattern, group of the prompt's tokens, group of the window), the engine named for the record.
_TEXTS: list[tuple[str, re.Pattern[str], int | None, int | None]] = [
    # vLLM 0.32 (real sample): "This model's maximum context length is 4096 tokens. However, your prompt
    # contains at least 4097 input tokens, which exceeds this limit even without any output tokens."
    (
        "vllm",
        re.compile(
            r"maximum context length is (\d+) tokens\. However, your prompt contains at least (\d+) input tokens, "
            r"which exceeds this limit even without any output tokens",
            re.I,
        ),
        2,
        1,
    ),
    # SGLang: "The input (N tokens) is longer than the model's context length (M tokens)."
    (
        "sglang",
        re.compile(r"The input \((\d+) tokens\) is longer than the model's context length \((\d+) tokens\)"),
        1,
        2,
    ),
    # llama.cpp: "request (N tokens) exceeds the available context size (M tokens), try increasing it";
    # older builds: "the request exceeds the available context size, try increasing it".
    ("llamacpp", re.compile(r"request \((\d+) tokens\) exceeds the available context size \((\d+) tokens\)"), 1, 2),
    ("llamacpp", re.compile(r"input \((\d+) tokens\) is larger than the max context size \((\d+) tokens\)"), 1, 2),
    ("llamacpp", re.compile(r"the request exceeds the available context size"), None, None),
    # TabbyAPI: "Prompt length N exceeds the available context size of M tokens"; older "... is greater than
    # max_seq_len M".
    ("tabbyapi", re.compile(r"Prompt length (\d+) exceeds the available context size of (\d+) tokens"), 1, 2),
    ("tabbyapi", re.compile(r"Prompt length (\d+) is greater than max_seq_len (\d+)"), 1, 2),
    # Ollama (no numbers): "the input length exceeds the context length".
    ("ollama", re.compile(r"the input length exceeds the context length"), None, None),
]


@dataclass(frozen=True, slots=True)
class EngineOverflow:
    """An engine said the prompt does not fit: its numbers where its text gives them."""

    engine: str
    prompt_tokens: int | None
    window: int | None
    message: str


def error_object(obj: Any) -> dict[str, Any] | None:
    """The error object of a body or an event, in any engine's framing: OpenAI's `{"error": {...}}`,
    Anthropic's `{"type": "error", "error": {...}}`, SGLang's flat `{"object": "error", "message": ...}`,
    Ollama's native `{"error": "text"}`."""
    if not isinstance(obj, dict):
        return None
    inner = obj.get("error")
    if isinstance(inner, dict):
        return inner
    if isinstance(inner, str):
        return {"message": inner}
    if obj.get("object") == "error" and isinstance(obj.get("message"), str):
        return obj
    return None


def recognise(obj: Any) -> EngineOverflow | None:
    """The overflow an engine's error body or error event reports, or None when it is another error."""
    error = error_object(obj)
    if error is None:
        return None
    message = error.get("message")
    if not isinstance(message, str):
        return None
    for engine, pattern, prompt_group, window_group in _TEXTS:
        match = pattern.search(message)
        if match is None:
            continue
        prompt = int(match.group(prompt_group)) if prompt_group else _int(error.get("n_prompt_tokens"))
        window = int(match.group(window_group)) if window_group else _int(error.get("n_ctx"))
        return EngineOverflow(engine, prompt, window, message)
    if error.get("type") == "exceed_context_size_error":  # llama.cpp's type, whatever the words
        return EngineOverflow("llamacpp", _int(error.get("n_prompt_tokens")), _int(error.get("n_ctx")), message)
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class RepeatedOverflows:
    """The prompts tapfix answered as overflowing, by digest (the client and the body it sent), the oldest
    forgotten first: a request that overflows again, byte for byte, is an agent caught in a compaction cycle."""

    def __init__(self, kept: int = 4096) -> None:
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._kept = kept

    def again(self, client: str, body: bytes) -> bool:
        """Whether this client sent this body, answered as an overflow, before; noted either way."""
        key = hashlib.sha256(client.encode(errors="surrogatepass") + b"\0" + body).digest()
        seen = key in self._seen
        self._seen[key] = None
        self._seen.move_to_end(key)
        while len(self._seen) > self._kept:
            self._seen.popitem(last=False)
        return seen
