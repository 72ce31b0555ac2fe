"""Regeneration as the mock sees it: which requests are the same conversation, and how it continues
a partial assistant message the way vLLM does (`continue_final_message`).

A client (tapfix, issue 19) that regenerates a broken answer either resends the conversation with a
fresh `seed`, or sends it with the text the client already has as a trailing assistant message and
`continue_final_message: true, add_generation_prompt: false`. Both are the next attempt of the same
conversation, so the scenario counter `attempt` keys on the body without those parts.

vLLM's rules, as read in `vllm-project/vllm` (commit 5e91864 / d5dba2d):
- `chat_completion/protocol.py`, `check_generation_prompt`: both flags true in the body is a 400
  "Cannot set both `continue_final_message` and `add_generation_prompt` to True." The check reads the
  raw body, so an omitted `add_generation_prompt` (default true) passes it and the chat template
  refuses the pair instead (transformers' `apply_chat_template`: "continue_final_message and
  add_generation_prompt are not compatible. ..."), which `render_chat_request` returns as a 400.
- `chat_completion/serving.py`, `get_chat_request_role`: with `add_generation_prompt` false the reply's
  role is the last message's role. Nothing refuses a last message that isn't the assistant's: the
  template continues whatever the final message is.
- `echo: true` prepends the last message's content when its role is the reply's role (a separate
  content chunk after the role chunk when streamed; text parts joined by newlines).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson
from tapfix.proxy.mock.chat import Reply
from tapfix.proxy.mock.jsonish import arr, obj

# Body keys a regeneration may change without starting a new conversation.
ATTEMPT_NEUTRAL = ("seed", "continue_final_message", "add_generation_prompt")
BOTH_FLAGS = "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
TEMPLATE_REFUSES = (
    "continue_final_message and add_generation_prompt are not compatible. Use continue_final_message when you "
    "want the model to continue the final message, and add_generation_prompt when you want to add a header that "
    "will prompt it to start a new assistant message instead."
)


class ContinuationError(ValueError):
    """A request vLLM refuses with a 400; the message is the one it sends."""


def conversation_key(req: dict[str, Any], surface: str) -> str:
    """The attempt counter's key: the body without `ATTEMPT_NEUTRAL` keys and without a trailing
    continuation prefix (a chat or Messages assistant message without calls; the trailing run of
    assistant `message` and `reasoning` items of a Responses `input`). Keys are sorted, so a client
    that adds `seed` at the end or reorders keys still sends the same conversation."""
    body = {k: v for k, v in req.items() if k not in ATTEMPT_NEUTRAL}
    if surface in ("chat", "messages") and isinstance(body.get("messages"), list):
        messages = body["messages"]
        if messages and _is_prefix_message(messages[-1], surface):
            body["messages"] = messages[:-1]
    elif surface == "responses" and isinstance(body.get("input"), list):
        items = list(body["input"])
        while items and _is_prefix_item(items[-1]):
            items.pop()
        body["input"] = items
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _is_prefix_message(message: Any, surface: str) -> bool:
    m = obj(message)
    if m.get("role") != "assistant":
        return False
    if surface == "messages":
        return not any(isinstance(b, dict) and b.get("type") == "tool_use" for b in arr(m.get("content")))
    return not m.get("tool_calls") and not m.get("function_call")


def _is_prefix_item(item: Any) -> bool:
    i = obj(item)
    kind = i.get("type", "message")
    return kind == "reasoning" or (kind == "message" and i.get("role") == "assistant")


@dataclass(frozen=True)
class Continuation:
    """How a chat request asks to be answered: in which role, continuing which text, echoing which."""

    role: str = "assistant"  # vLLM's get_chat_request_role
    continues: bool = False  # continue_final_message with an assistant message last
    prefix: str = ""  # that message's text
    prefix_reasoning: bool = False  # it carries reasoning (`reasoning` or `reasoning_content`)
    echo: str = ""  # text vLLM's `echo` prepends to the reply

    def script_request(self, req: dict[str, Any]) -> dict[str, Any]:
        """The request the scripted model answers: a continued message is the reply, not the prompt."""
        if not self.continues:
            return req
        return {**req, "messages": req["messages"][:-1]}


PLAIN = Continuation()


def continuation_of(req: dict[str, Any]) -> Continuation:
    """Read a chat request's continuation fields; raises ContinuationError where vLLM answers 400."""
    continue_final = bool(req.get("continue_final_message"))
    given = req.get("add_generation_prompt")
    if continue_final and given:
        raise ContinuationError(BOTH_FLAGS)
    generation_prompt = True if given is None else bool(given)
    if continue_final and generation_prompt:
        raise ContinuationError(TEMPLATE_REFUSES)
    if not continue_final and generation_prompt and not req.get("echo"):
        return PLAIN
    last = obj(arr(req.get("messages"))[-1]) if arr(req.get("messages")) else {}
    role = "assistant" if generation_prompt else str(last.get("role") or "assistant")
    text = _text(last.get("content"))
    echo = ""
    if req.get("echo") and last.get("role") == role:
        if text is None:
            raise ContinuationError("echo is not supported by tapfix mock for a message that is not plain text")
        echo = text
    continues = continue_final and last.get("role") == "assistant"
    if continues and text is None:  # transformers' render_jinja_template refuses it the same way
        raise ContinuationError(
            "continue_final_message is set but we could not find any text to continue in the final message!"
        )
    reasoning = bool(last.get("reasoning") or last.get("reasoning_content"))
    return Continuation(role, continues, (text or "") if continues else "", continues and reasoning, echo)


def _text(content: Any) -> str | None:
    """A message's text as the chat template sees it (text parts joined by newlines); None when a
    part is not text (an image), which the mock can neither continue nor echo."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = arr(content)
    if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in parts):
        return None
    return "\n".join(p["text"] for p in parts)


def continue_reply(reply: Reply, cont: Continuation) -> Reply:
    """The mock's answer after the continued text (before tokenization).

    - Nothing given (no text, no reasoning): the whole answer, as a fresh message.
    - Otherwise the thinking is over (the text comes after it), so the answer has no reasoning, and:
      - the given text is a prefix of the answer's content: the rest of that content, then the calls;
      - it is not: the mock takes that text as said and goes on as it would after its own content:
        its tool calls if it would call one, else nothing more (empty content, `stop`).
    """
    if not cont.continues or (not cont.prefix and not cont.prefix_reasoning):
        return reply
    reply.reasoning = ""
    reply.content = reply.content[len(cont.prefix) :] if reply.content.startswith(cont.prefix) else ""
    return reply
