"""The mock's Chat Completions wire format: byte builders for vLLM's OpenAI-compatible chunks.

Every end-to-end test compares bytes, so the chunks copy what vLLM 0.32.0 puts on the wire when it serves a
Qwen3-style model with a tool-call and a reasoning parser (`--tool-call-parser hermes --reasoning-parser
qwen3`, the usual agent deployment; checked against the real server's bytes by tests/process/vllm/test_mock.py;
pydantic `model_dump_json(exclude_unset=True)`):
key order id, object, created, model, choices; `"prompt_token_ids":null,"prompt_text":null` on the role
chunk; `"token_ids":null` on each later choice; a tool call's deltas with `"content":null`, its first one
keyed id, type, index, function with the name alone; the finish chunk with an empty delta,
`"stop_reason":null` and the server's `system_fingerprint` (on the usage chunk instead when one follows);
the usage chunk with `"choices":[]`, usage keys prompt, total, completion and `completion_tokens_details`
(the reasoning tokens, 0 for an answer that didn't reason; dumped with `exclude_none`). Reasoning goes in
`reasoning`. (Without any parser vLLM ends a text answer with `"delta":{"content":""}` and leaves the
reasoning count out; the mock doesn't imitate that configuration.)

Chunks are assembled from pre-encoded byte prefixes: only the small delta is serialized per chunk.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import orjson

DONE = b"data: [DONE]\n\n"
VLLM_VERSION = "0.32.0"  # the vLLM whose bytes the mock copies (tests/process/vllm/ runs it)

# A word with its leading space, a run of punctuation, or a newline: roughly one BPE token each.
_TOKEN = re.compile(r"\n|[ \t]*[A-Za-z0-9_']+|[ \t]*[^\sA-Za-z0-9_']|[ \t]+")


def split_tokens(text: str) -> list[str]:
    """Split text into token-sized pieces whose concatenation is exactly `text`.

    Long words are cut into pieces of at most 6 characters, as a BPE tokenizer would.
    """
    pieces: list[str] = []
    pos = 0
    for m in _TOKEN.finditer(text):
        if m.start() != pos:  # characters the pattern skipped (never expected): keep them
            pieces.append(text[pos : m.start()])
        piece = m.group()
        if len(piece) > 7:  # cut by index: re-slicing the rest each time made a long word quadratic
            cut = 6 * -(-(len(piece) - 7) // 6)  # whole 6-character pieces until at most 7 are left
            pieces.extend(piece[i : i + 6] for i in range(0, cut, 6))
            piece = piece[cut:]
        pieces.append(piece)
        pos = m.end()
    if pos < len(text):
        pieces.append(text[pos:])
    return pieces


def split_fragments(text: str, per_fragment: int = 2) -> list[str]:
    """Tool-call argument fragments: a couple of tokens each, like a tool parser's diffs."""
    tokens = split_tokens(text)
    return ["".join(tokens[i : i + per_fragment]) for i in range(0, len(tokens), per_fragment)]


def fingerprint(model: str) -> str:
    """vLLM's `system_fingerprint`: its version and 8 hex digits of its configuration (here: the model name)."""
    return f"vllm-{VLLM_VERSION}-{hash_text(model) & 0xFFFFFFFF:08x}"


def dumps(obj: object) -> bytes:
    """Compact JSON, UTF-8 left unescaped (pydantic's and llama-server's output)."""
    return orjson.dumps(obj)


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str
    custom: bool = False  # a Responses custom (freeform) tool call: `arguments` is its raw input text


@dataclass
class Reply:
    """What the scripted model says, independent of framing (stream or not)."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    # Token-sized pieces; filled by `tokenize()` so streamed and non-streamed agree on truncation.
    reasoning_pieces: list[str] = field(default_factory=list)
    content_pieces: list[str] = field(default_factory=list)
    arg_pieces: list[list[str]] = field(default_factory=list)
    completion_tokens: int = 0

    def tokenize(self, max_tokens: int | None) -> Reply:
        """Cut the reply into tokens; past `max_tokens`, stop with finish_reason length."""
        budget = max_tokens if max_tokens and max_tokens > 0 else None
        used = 0

        def take(pieces: list[str]) -> list[str]:
            nonlocal used
            if budget is None:
                used += len(pieces)
                return pieces
            room = max(0, budget - used)
            used += min(room, len(pieces))
            if room < len(pieces):
                self.finish_reason = "length"
            return pieces[:room]

        self.reasoning_pieces = take(split_tokens(self.reasoning))
        self.content_pieces = take(split_tokens(self.content))
        self.arg_pieces = []
        for call in self.tool_calls:
            frags = take(split_fragments(call.arguments))
            self.arg_pieces.append(frags)
            call.arguments = "".join(frags)
        self.reasoning = "".join(self.reasoning_pieces)
        self.content = "".join(self.content_pieces)
        self.completion_tokens = used
        return self

    def reasoning_tokens(self) -> int:
        return len(self.reasoning_pieces)


class ChunkBuilder:
    """Builds the `data: …\\n\\n` events of one chat completion stream."""

    def __init__(self, completion_id: str, created: int, model: str) -> None:
        head = b'{"id":' + dumps(completion_id) + b',"object":"chat.completion.chunk","created":'
        head += str(created).encode() + b',"model":' + dumps(model) + b',"choices":'
        self._head = b"data: " + head
        self._delta_open = self._head + b'[{"index":0,"delta":'
        self._fingerprint = b',"system_fingerprint":' + dumps(fingerprint(model))

    def role(self, role: str = "assistant") -> bytes:
        """The first chunk; `role` is vLLM's get_chat_request_role (the last message's role when the
        request sets `add_generation_prompt: false`)."""
        return self._delta_open + (
            b'{"role":'
            + dumps(role)
            + b',"content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}\n\n'
        )

    def echo(self, text: str) -> bytes:
        """vLLM's `echo` chunk: a choice built without token_ids, so `exclude_unset` leaves it out."""
        return self._delta_open + dumps({"content": text}) + b',"logprobs":null,"finish_reason":null}]}\n\n'

    def delta(self, delta: dict[str, object]) -> bytes:
        return self._delta_open + dumps(delta) + b',"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'

    def content(self, text: str) -> bytes:
        return self.delta({"content": text})

    def reasoning(self, text: str) -> bytes:
        return self.delta({"reasoning": text})

    def tool_open(self, index: int, call_id: str, name: str) -> bytes:
        """A call's first delta: vLLM's tool parsers send the name alone, and `content: null` beside it."""
        call = {"id": call_id, "type": "function", "index": index, "function": {"name": name}}
        return self.delta({"content": None, "tool_calls": [call]})

    def tool_args(self, index: int, fragment: str) -> bytes:
        return self.delta({"content": None, "tool_calls": [{"index": index, "function": {"arguments": fragment}}]})

    def finish(self, reason: str, usage_follows: bool = False) -> bytes:
        """The last choice chunk: an empty delta; the fingerprint goes on the usage chunk when one follows."""
        return (
            self._delta_open
            + b'{},"logprobs":null,"finish_reason":'
            + dumps(reason)
            + b',"stop_reason":null,"token_ids":null}]'
            + (b"" if usage_follows else self._fingerprint)
            + b"}\n\n"
        )

    def usage(self, prompt_tokens: int, completion_tokens: int, reasoning_tokens: int = 0) -> bytes:
        usage: dict[str, object] = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        }
        return self._head + b'[],"usage":' + dumps(usage) + self._fingerprint + b"}\n\n"


def stream_events(
    reply: Reply,
    builder: ChunkBuilder,
    prompt_tokens: int,
    include_usage: bool,
    role: str = "assistant",
    echo: str = "",
) -> list[bytes]:
    """The whole stream of a tokenized reply, `[DONE]` included (`echo` right after the role chunk)."""
    events = [builder.role(role)] + ([builder.echo(echo)] if echo else [])
    events += [builder.reasoning(p) for p in reply.reasoning_pieces]
    events += [builder.content(p) for p in reply.content_pieces]
    for index, (call, frags) in enumerate(zip(reply.tool_calls, reply.arg_pieces, strict=True)):
        events.append(builder.tool_open(index, call.id, call.name))
        events += [builder.tool_args(index, f) for f in frags]
    events.append(builder.finish(reply.finish_reason, usage_follows=include_usage))
    if include_usage:
        events.append(builder.usage(prompt_tokens, reply.completion_tokens, reply.reasoning_tokens()))
    events.append(DONE)
    return events


def usage_object(prompt_tokens: int, completion_tokens: int, reasoning_tokens: int = 0) -> dict[str, object]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
    }


def chat_completion(
    completion_id: str,
    created: int,
    model: str,
    message: dict[str, object],
    finish_reason: str | None,
    usage: dict[str, object] | None,
) -> dict[str, object]:
    """A non-streamed `chat.completion` body (vLLM's key order and nulls)."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "token_ids": None,
                "routed_experts": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": fingerprint(model),
        "usage": usage,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def reply_message(
    content: str | None, reasoning: str | None, tool_calls: list[dict[str, object]], role: str = "assistant"
) -> dict[str, object]:
    """vLLM's ChatMessage: `tool_calls` is dropped when empty, `reasoning` comes last."""
    message: dict[str, object] = {
        "role": role,
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if tool_calls:
        message["tool_calls"] = tool_calls
    message["reasoning"] = reasoning
    return message


def reply_body(
    reply: Reply,
    completion_id: str,
    created: int,
    model: str,
    prompt_tokens: int,
    role: str = "assistant",
    echo: str = "",
) -> bytes:
    calls: list[dict[str, object]] = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in reply.tool_calls
    ]
    content = reply.content if (reply.content or not calls) else None
    if echo:  # vLLM: last_msg_content + (message.content or "")
        content = echo + (content or "")
    message = reply_message(content, reply.reasoning or None, calls, role)
    finish = "tool_calls" if calls and reply.finish_reason == "stop" else reply.finish_reason
    usage = usage_object(prompt_tokens, reply.completion_tokens, reply.reasoning_tokens())
    return dumps(chat_completion(completion_id, created, model, message, finish, usage))


def error_body(message: str, status: int, err_type: str | None = None, param: str | None = None) -> bytes:
    """vLLM's ErrorResponse: `{"error": {message, type, param, code}}`."""
    kind = err_type or {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return dumps({"error": {"message": message, "type": kind, "param": param, "code": status}})


def validation_error_body(detail: str, loc: str) -> bytes:
    """vLLM's 400 for a body its request model can't read (FastAPI's validation error, as its handler
    words it): type `Bad Request`, the pydantic error's repr as the message, its location as `param`."""
    message = f"1 validation error:\n  {{{detail}}}"
    return dumps({"error": {"message": message, "type": "Bad Request", "param": loc, "code": 400}})


def invalid_json_body(body: bytes) -> bytes:
    """The 400 for a body that is not JSON: Python's json error, located by its character offset."""
    try:
        json.loads(body)
    except ValueError as e:
        what, at = (e.msg, e.pos) if isinstance(e, json.JSONDecodeError) else (str(e), 0)
    else:  # valid for Python's json but not for orjson (a lone surrogate): located at the start
        what, at = "JSON decode error", 0
    detail = f"'type': 'json_invalid', 'loc': 'body.{at}', 'msg': 'JSON decode error', 'input': '<dict of 0 items>', "
    return validation_error_body(detail + f"'ctx': {{'error': {what!r}}}", f"body.{at}")


def missing_field_body(name: str, items: int) -> bytes:
    """The 400 for a body without a required field (`items`: how many keys the body has)."""
    loc = f"body.{name}"
    detail = f"'type': 'missing', 'loc': {loc!r}, 'msg': 'Field required', 'input': '<dict of {items} items>'"
    return validation_error_body(detail, loc)


def models_body(model_ids: list[str], created: int, max_model_len: int = 32768) -> bytes:
    data = [
        {
            "id": mid,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": mid,
            "parent": None,
            "max_model_len": max_model_len,
            "permission": [
                {
                    "id": "modelperm-" + format(abs(hash_text(mid)), "x")[:16],
                    "object": "model_permission",
                    "created": created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        for mid in model_ids
    ]
    return dumps({"object": "list", "data": data})


def hash_text(text: str) -> int:
    """A stable (not per-process salted) integer hash for ids derived from names."""
    value = 1469598103934665603
    for byte in text.encode():
        value = ((value ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return value


def completion_events(
    text_pieces: list[str],
    completion_id: str,
    created: int,
    model: str,
    finish_reason: str,
    usage: dict[str, object] | None,
) -> list[bytes]:
    """Legacy /v1/completions stream (`text_completion` objects)."""
    head = {"id": completion_id, "object": "text_completion", "created": created, "model": model}
    events = []
    for piece in text_pieces:
        choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": None, "stop_reason": None}
        events.append(b"data: " + dumps({**head, "choices": [choice]}) + b"\n\n")
    last = {"index": 0, "text": "", "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
    events.append(b"data: " + dumps({**head, "choices": [last]}) + b"\n\n")
    if usage is not None:
        events.append(b"data: " + dumps({**head, "choices": [], "usage": usage}) + b"\n\n")
    events.append(DONE)
    return events


def completion_body(
    text: str, completion_id: str, created: int, model: str, finish_reason: str, usage: dict[str, object]
) -> bytes:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "prompt_logprobs": None,
    }
    body = {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage,
        "kv_transfer_params": None,
    }
    return dumps(body)
