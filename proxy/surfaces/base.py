"""What an API surface is on the request side and on the wire, one object per surface (`chat.py`,
`completions.py`, `responses.py`, `messages.py`; `other.py` for a path that names none).

Code that reads or writes a body asks the surface (`surface.conversation`, `surface.max_tokens_fields`,
`surface.error_body(...)`) instead of comparing its name, so what a surface is has one home. The parts
that live in higher layers (the assembler, the tool-call stream stage, the regeneration seam) are kept
per surface by their own layer in a `PerSurface` table keyed by these objects (`registry.py`).

The defaults here are OpenAI's (Chat Completions): a surface states what it does differently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from tapfix.proxy.sse import format_event

Surface = Literal["chat", "completions", "responses", "messages"]
# The surfaces whose streams are named events (`event: NAME`) and whose bodies are not chat-shaped.
Evented = Literal["responses", "messages"]
# How a surface's stream is framed: bare `data:` events (chat, legacy completions) or named ones.
Framing = Literal["data", "events"]

# Every sampling parameter tapfix sets (request/sampling.py): what the OpenAI-compatible surfaces take.
ALL_SAMPLING = frozenset(
    {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
     "max_tokens"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ApiSurface:
    """One API surface. `name` is what the store records (`chat`, `completions`, `responses`, `messages`;
    `other` for a path that names no surface)."""

    name: str
    path: str | None = None  # the path's tail that names it (with or without `/v1`, any prefix before)
    # -- the request
    conversation: str | None = None  # the field holding the turns (`messages`, `input`); None: no conversation
    item_turns: bool = False  # the turns are typed items, or one string: the user's message (Responses' `input`)
    instructions: str | None = None  # the system prompt's own field beside the turns (`system`, `instructions`)
    typed_content: bool = False  # a turn's content is typed blocks (`thinking`, `tool_use`), not OpenAI's parts
    max_tokens_fields: tuple[str, ...] = ()  # the budget's fields, the first one present counts
    sampling_params: frozenset[str] = frozenset()  # the sampling parameters the surface takes
    sampling_defaults: bool = True  # a request without sampling parameters is worth a flag (Messages: always some)
    reasoning_effort: tuple[str, ...] = ("reasoning_effort",)  # where a reasoning effort is asked
    openai_levels_only: bool = False  # engines validate its reasoning effort with OpenAI's type (no `max`)
    seeded: bool = False  # a documented `seed`: a fresh attempt can differ by its seed
    continuable: bool = False  # a next attempt can continue the client's own text (a final assistant message)
    reasoning_fields: bool = False  # the answer's reasoning can be renamed per field (`reasoning_content`)
    # -- the answer
    asks_stream_usage: bool = False  # a stream carries usage only when asked (`stream_options.include_usage`)
    framing: Framing = "data"
    numbered: bool = False  # its stream's events carry `sequence_number`
    item_field: str | None = None  # events: where an item (block) that starts is (`item`, `content_block`)
    index_field: str | None = None  # events: the item's position (`output_index`, `index`)
    answer_field: str | None = None  # the list a whole answer is made of (`choices`, `output`, `content`)
    chains_ids: bool = False  # an answer's id is named by the next request (`previous_response_id`)
    # -- metrics (OpenTelemetry's GenAI conventions)
    operation: str = "other"  # gen_ai.operation.name
    provider: str | None = None  # gen_ai.provider.name when the engine is unknown: whose API it is

    def __str__(self) -> str:
        return self.name

    @property
    def evented(self) -> bool:
        """Its stream is named events and its bodies are not chat-shaped (Responses, Messages)."""
        return self.framing == "events"

    @property
    def inference(self) -> bool:
        """A surface of model inference, not some other path."""
        return self.path is not None

    @property
    def turns(self) -> bool:
        """Its requests carry a conversation of turns (not legacy completions' prompt, not another path)."""
        return self.conversation is not None

    @property
    def prompt_only(self) -> bool:
        """A surface of inference whose request is one `prompt`, no turns (legacy completions)."""
        return self.inference and not self.turns

    def max_tokens_field(self, engine: str | None) -> str:
        """The field a token budget is written under for this engine: OpenAI's own API takes the newest of
        the surface's fields (chat's `max_completion_tokens`), the engines the one they all read."""
        if not self.max_tokens_fields:
            return "max_tokens"
        return self.max_tokens_fields[0] if engine == "openai" else self.max_tokens_fields[-1]

    # -- every error tapfix makes, in this surface's shape (tapfix.proxy.errors words them) ----------
    def error_object(
        self, status: int, message: str, kind: str, code: str | None = None, param: str | None = None
    ) -> dict[str, Any]:
        """The error object a client reads for an answer tapfix gives instead of forwarding."""
        return {"message": message, "type": kind, "param": param, "code": code}

    def error_body(self, error: dict[str, Any]) -> dict[str, Any]:
        """The whole error body around an error object."""
        return {"error": error}

    def error_shaped(self, obj: dict[str, Any]) -> bool:
        """A whole answer that is an error body of this surface's own shape rather than an answer (the chat
        fold reads those). OpenAI's surfaces fold their own error bodies: none here."""
        return False

    def error_json(self, error: dict[str, Any]) -> bytes:
        """`error_body` as bytes. json, not orjson: a model name may hold a lone surrogate escape, which only
        ASCII output can carry."""
        return json.dumps(self.error_body(error)).encode()

    @property
    def overflow_param(self) -> str:
        """The request field a context overflow names."""
        return "messages"

    def overflow_message(self, prompt_tokens: int | None, window: int | None) -> str:
        """The overflow text the agents' pattern lists recognise (opencode's `provider/error.ts`, pi's
        `utils/overflow.ts`); the real numbers where they are known, never made up."""
        if window is None:
            return (
                "This model's maximum context length was exceeded (context_length_exceeded): your messages do not "
                "fit. Please reduce the length of the messages."
            )
        resulted = f"{prompt_tokens} tokens" if prompt_tokens is not None else "more tokens than that"
        return (
            f"This model's maximum context length is {window} tokens. However, your messages resulted in "
            f"{resulted}. Please reduce the length of the messages."
        )

    def overflow_events(self, error: dict[str, Any], newline: bytes = b"\n", seq: int = 0) -> bytes:
        """A context overflow's error once a stream has started, in the stream's own framing."""
        return format_event(orjson.dumps({"error": error}), newline)

    def reset_events(self, message: str, tapfix: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
        """The retryable error each SDK raises on mid-stream: (the bytes to send, the error object to record)."""
        error = {"message": message, "type": "server_error", "code": 502, "tapfix": tapfix}
        return format_event(orjson.dumps({"error": error})) + format_event(b"[DONE]"), error
