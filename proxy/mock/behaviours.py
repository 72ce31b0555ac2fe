"""From (request, matched rule) to bytes: what the model says, then how the server frames it.

Two steps keep behaviours composable: `make_reply` decides the words (healthy script, degenerate
text, a broken tool call), `apply_faults` edits the list of wire operations (stalls, resets,
CRLF framing, malformed SSE). Corpus cases skip the first step: their bytes are fixed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from tapfix.proxy.mock.agent_script import Knobs, respond
from tapfix.proxy.mock.chat import ChunkBuilder, Reply, dumps
from tapfix.proxy.mock.continuation import PLAIN, Continuation, continue_reply
from tapfix.proxy.mock.degenerate import degenerate_reply
from tapfix.proxy.mock.scenario import Rule
from tapfix.proxy.mock.wire import Op, Reset, Send, Sleep, insert_after_sends, split_body

_KNOB_BEHAVIOURS = {
    "ignore_images": Knobs(ignore_images=True),
    "forget_needle": Knobs(forget_needle=True),
    "ignore_effort": Knobs(ignore_effort=True),
}


@dataclass(frozen=True)
class Ids:
    """Response ids and timestamp derived from the request body, so equal requests get equal bytes."""

    digest: str

    @classmethod
    def of(cls, body: bytes) -> Ids:
        return cls(hashlib.sha256(body).hexdigest())

    @property
    def chat_id(self) -> str:
        return "chatcmpl-" + self.digest[:16]

    @property
    def tool_call_id(self) -> str:
        return "chatcmpl-tool-" + self.digest[16:32]

    @property
    def completion_id(self) -> str:
        return "cmpl-" + self.digest[:32]

    @property
    def created(self) -> int:
        # Fixed per body but realistic: a moment between late 2025 and mid 2026.
        return 1_760_000_000 + int(self.digest[32:40], 16) % 20_000_000


def max_tokens_of(req: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = req.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def make_reply(req: dict[str, Any], rule: Rule | None, ids: Ids, cont: Continuation = PLAIN) -> Reply:
    """The words of the answer (not yet cut to max_tokens); a continuation gets what follows its text,
    and a rule damages that (a regeneration by continuation can be broken too)."""
    do = rule.do if rule else "answer"
    script_req = cont.script_request(req)
    reply = continue_reply(respond(script_req, ids.tool_call_id, _KNOB_BEHAVIOURS.get(do, Knobs())), cont)
    if rule is None:
        return reply
    if do == "degenerate":
        english = reply.content or "Sure, here is the answer you asked for."
        default_tokens = min(max_tokens_of(req) or 600, 4000)
        return degenerate_reply(
            rule.params.get("style", "cjk_drift"), english, int(rule.params.get("tokens", default_tokens))
        )
    if do == "break_tool_call" and reply.tool_calls:
        mode = rule.params.get("mode", "truncate")
        if mode in ("truncate", "unclosed"):  # the fragment-level modes act after tokenization
            return break_tool_call(reply, mode)
    return reply


def break_tool_call(reply: Reply, mode: str) -> Reply:
    """The same call with its arguments damaged the way engines damage them (corpus classes).

    truncate: generation stops inside the last string value (finish_reason length): unrecoverable.
    unclosed: the final `}` never arrives, finish_reason tool_calls: repairable.
    """
    call = reply.tool_calls[-1]
    args = call.arguments
    if mode == "unclosed":
        call.arguments = args[:-1] if args.endswith("}") else args
        return reply
    opening = args.rfind('": "')
    if opening >= 0:
        start = opening + 4
        end = args.rfind('"')
        cut = start + max(1, (end - start) // 2) if end > start else start
        call.arguments = args[:cut]
    else:
        call.arguments = args[: max(1, len(args) // 2)]
    reply.finish_reason = "length"
    return reply


def error_event(message: str = "Internal server error", code: int = 500) -> bytes:
    """vLLM's in-stream error (create_streaming_error_response)."""
    err = {"error": {"message": message, "type": "InternalServerError", "param": None, "code": code}}
    return b"data: " + dumps(err) + b"\n\n"


def apply_faults(ops: list[Op], rule: Rule | None, builder: ChunkBuilder | None, stream: bool) -> list[Op]:
    """Edit the wire operations of a (streamed or not) response for framing/transport faults."""
    if rule is None:
        return ops
    do, p = rule.do, rule.params
    if do == "reset_mid_stream":
        if not stream:
            body = b"".join(o.data for o in ops if isinstance(o, Send))
            return [split_body(body)[0], Reset()]
        return insert_after_sends(ops, int(p.get("after_chunks", 3)), [Reset()], drop_rest=True)
    if do == "stall":
        pause: list[Op] = [Sleep(float(p.get("seconds", 30)))]
        if not stream:
            body = b"".join(o.data for o in ops if isinstance(o, Send))
            first, second = split_body(body)
            return [first, *pause, second]
        return insert_after_sends(ops, int(p.get("after_chunks", 1)), pause)
    if not stream:
        return ops
    if do == "crlf":
        return _crlf(ops, bool(p.get("ping", True)))
    if do == "malformed_sse":
        return _malformed(ops, p, builder)
    return ops


def _crlf(ops: list[Op], ping: bool) -> list[Op]:
    out: list[Op] = []
    sends = sum(isinstance(o, Send) for o in ops)
    seen = 0
    for op in ops:
        if not isinstance(op, Send):
            out.append(op)
            continue
        seen += 1
        data = op.data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
        if ping and seen < sends:
            data += b": ping\r\n\r\n"
        out.append(Send(data))
    return out


def _malformed(ops: list[Op], p: dict[str, Any], builder: ChunkBuilder | None) -> list[Op]:
    kind = p["kind"]
    after = int(p.get("after_chunks", 2))
    if kind == "no_blank_lines":
        return [Send(o.data[:-1]) if isinstance(o, Send) and o.data.endswith(b"\n\n") else o for o in ops]
    if kind == "error_object_midstream":
        return insert_after_sends(ops, after, [Send(error_event()), Send(b"data: [DONE]\n\n")], drop_rest=True)
    if kind == "huge_line":
        size = int(p.get("size", 1 << 20))
        event = builder.content("x" * size) if builder else b"data: " + dumps({"content": "x" * size}) + b"\n\n"
        return insert_after_sends(ops, after, [Send(event)])
    # invalid_utf8: bytes that are no UTF-8 at all, inside a JSON string of a content delta.
    bad = b'"content":"caf\xc3\x28 \xff\xfe"'
    event = (builder.content("@@") if builder else b'data: {"content":"@@"}\n\n').replace(b'"content":"@@"', bad)
    return insert_after_sends(ops, after, [Send(event)])
