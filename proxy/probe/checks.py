"""One function per check. Each sends a few small, deterministic requests and judges the answer.

A check returns a `Verdict`: pass/fail/skip, and a detail a user can act on — the server's own
error text, the start of the wrong answer, the numbers that did not move. Prompts are ones every
instruction-tuned model answers the same way (the capital of France, counting to 20), so a
wrong answer means a broken model, template or server, not a hard question. `tapfix mock`
answers each of them correctly (docs/mock.md) and its `probe_failures/*` scenarios break each one.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tapfix.proxy.probe import images, needle
from tapfix.proxy.probe.client import Answer, ProbeClient, shorten
from tapfix.proxy.probe.judge import THINK, judge_text, judge_tool_call, quote, scan_stream, visible
from tapfix.proxy.probe.report import Status

CHAT = "/v1/chat/completions"


@dataclass(slots=True)
class Verdict:
    status: Status
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Ctx:
    """What every check needs: the client, the model name to send, and the run's options."""

    client: ProbeClient
    model: str
    entry: dict[str, Any] | None = None  # the model's entry in /v1/models (max_model_len, owned_by)
    needle_tokens: int = 2000
    needle_depth: float = 0.5
    max_tokens: int = 512
    sampling: Callable[[], Verdict] | None = None  # what tapfix would inject (runner builds it)


def _chat(ctx: Ctx, content: Any, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": ctx.model,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": ctx.max_tokens,
        "stream": False,
    }
    body.update(extra)
    return body


def listed_ids(answer: Answer) -> list[str]:
    """The model ids a `/v1/models` answer lists (OpenAI shape; llama.cpp and Ollama use it too)."""
    obj = answer.json()
    data = obj.get("data") if isinstance(obj, dict) else None
    return [m["id"] for m in data or () if isinstance(m, dict) and isinstance(m.get("id"), str)]


def listed_entry(answer: Answer, model_id: str) -> dict[str, Any] | None:
    obj = answer.json()
    data = obj.get("data") if isinstance(obj, dict) else None
    return next((m for m in data or () if isinstance(m, dict) and m.get("id") == model_id), None)


# --- models -----------------------------------------------------------------------------------


def models_quick(answer: Answer, model: str | None, explicit: bool) -> Verdict:
    """Quick mode: `--model` must be listed — the naming trap (`qwen3` vs `Qwen/Qwen3-32B`)."""
    if not answer.ok:
        return Verdict("fail", f"/v1/models failed: {answer.error_text()}")
    ids = listed_ids(answer)
    if not ids:
        return Verdict("fail", "/v1/models lists no model: is the model still loading?")
    listing = ", ".join(ids)
    if explicit and model not in ids:
        close = difflib.get_close_matches(model or "", ids, n=1, cutoff=0.4)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return Verdict("fail", f"model {model!r} is not served; /v1/models lists: {listing}{hint}", {"ids": ids})
    how = "" if explicit else " (the first listed; pass --model to choose)"
    return Verdict("pass", f"{model!r} is served{how}; /v1/models lists: {listing}", {"ids": ids})


# --- completion -------------------------------------------------------------------------------

COMPLETION_PROMPT = "What is the capital of France? Answer in one short sentence."
COMPLETION_EXPECT, COMPLETION_LABEL = r"\bparis\b", "Paris"  # what the answer must say, and how a failure names it


async def completion(ctx: Ctx) -> Verdict:
    answer = await ctx.client.post(CHAT, _chat(ctx, COMPLETION_PROMPT), "completion")
    if not answer.ok:
        return Verdict("fail", answer.error_text())
    msg = answer.message()
    problem = judge_text(
        msg.content, msg.reasoning, msg.finish_reason, ctx.max_tokens, COMPLETION_EXPECT, COMPLETION_LABEL
    )
    if problem:
        return Verdict("fail", problem)
    return Verdict("pass", f"{quote(visible(msg.content), 70)} (finish_reason {msg.finish_reason})")


# --- streaming --------------------------------------------------------------------------------

STREAM_PROMPT = "Count from 1 to 20, separated by commas."
STREAM_EXPECT, STREAM_LABEL = r"\b20\b", "20"


async def streaming(ctx: Ctx) -> Verdict:
    body = _chat(ctx, STREAM_PROMPT, stream=True, stream_options={"include_usage": True})
    answer = await ctx.client.post(CHAT, body, "streaming")
    if not answer.ok:
        return Verdict("fail", answer.error_text())
    if "event-stream" not in answer.content_type:
        return Verdict(
            "fail",
            f"stream: true was answered with content-type {answer.content_type or '(none)'}, not text/event-stream",
        )
    scan = scan_stream(answer.chunks, answer.times)
    data = {
        "ttft_ms": scan.ttft_ms,
        "tokens_per_s": scan.tokens_per_s,
        "tokens": scan.tokens,
        "events": scan.events,
    }
    problems = scan.problems()
    if not problems:  # well-formed: is what it carried an answer?
        msg = answer.message()
        problem = judge_text(msg.content, msg.reasoning, msg.finish_reason, ctx.max_tokens, STREAM_EXPECT, STREAM_LABEL)
        problems = [problem] if problem else []
    if problems:
        return Verdict("fail", "; ".join(problems), data)
    rate = f"{scan.tokens_per_s:.0f} tok/s decode" if scan.tokens_per_s else "decode rate n/a"
    return Verdict(
        "pass",
        f"TTFT {scan.ttft_ms:.0f} ms, {rate} ({scan.tokens} tokens, {scan.events} events, "
        f"finish_reason {scan.finish_reason}, [DONE])",
        data,
    )


# --- tools ------------------------------------------------------------------------------------

TOOL_NAME = "write_file"
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Write text to a file, creating the file if it does not exist.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Path of the file to write"},
                "content": {"type": "string", "description": "The complete text to write"},
            },
            "required": ["path", "content"],
            "additionalProperties": False,
        },
    },
}
TOOL_PROMPT = f'Create a file named hello.txt containing "Hello, world!". Use the {TOOL_NAME} tool.'


async def tools(ctx: Ctx) -> Verdict:
    """Streamed and non-streamed: agents use both, and parsers break differently in each."""
    results: dict[str, str | None] = {}
    shown = ""
    for mode in ("non-streamed", "streamed"):
        extra: dict[str, Any] = {"tools": [TOOL], "tool_choice": "auto", "stream": mode == "streamed"}
        answer = await ctx.client.post(CHAT, _chat(ctx, TOOL_PROMPT, **extra), "tools")
        if not answer.ok:
            results[mode] = answer.error_text()
            continue
        error = scan_stream(answer.chunks, answer.times).error if answer.stream else None
        if error is not None:  # an error event mid-stream (llama.cpp's grammar failures end a 200 this way)
            results[mode] = f"the stream carried an error: {error}"
            continue
        msg = answer.message()
        results[mode] = judge_tool_call(
            msg.tool_calls, msg.content, msg.finish_reason, TOOL_NAME, TOOL["function"]["parameters"]
        )
        if results[mode] is None and msg.tool_calls:
            shown = f"{TOOL_NAME}({shorten(msg.tool_calls[0]['arguments'], 60)})"
    failed = {m: p for m, p in results.items() if p}
    if not failed:
        return Verdict("pass", f"{shown} valid, streamed and non-streamed")
    if len(failed) == 2 and len(set(failed.values())) == 1:
        return Verdict("fail", f"{next(iter(failed.values()))} (streamed and non-streamed)")
    return Verdict("fail", "; ".join(f"{m}: {p}" for m, p in failed.items()))


# --- reasoning --------------------------------------------------------------------------------

REASONING_PROMPT = "Is 391 a prime number? Answer yes or no."


async def reasoning(ctx: Ctx) -> Verdict:
    """Effort none vs high: the knob must be accepted and must change the reasoning."""
    lengths: dict[str, int] = {}
    inline = False
    for effort in ("none", "high"):
        body = _chat(ctx, REASONING_PROMPT, reasoning_effort=effort, max_tokens=max(ctx.max_tokens, 1024))
        answer = await ctx.client.post(CHAT, body, "reasoning")
        if not answer.ok:
            return Verdict("fail", f"reasoning_effort {effort!r} was rejected: {answer.error_text()}")
        msg = answer.message()
        think = "".join(THINK.findall(msg.content))
        inline = inline or bool(think and not msg.reasoning)
        lengths[effort] = len(msg.reasoning) or len(think)
    numbers = f"none={lengths['none']} chars, high={lengths['high']} chars"
    data = {"none_chars": lengths["none"], "high_chars": lengths["high"]}
    if inline:
        return Verdict(
            "fail",
            f"reasoning arrives inside the content as <think>…</think> ({numbers}): start the "
            "server with a reasoning parser (vLLM/SGLang --reasoning-parser)",
            data,
        )
    if lengths["none"] == lengths["high"] == 0:
        return Verdict(
            "skip",
            "no reasoning at effort none or high: not a reasoning model, or the server drops the reasoning field",
            data,
        )
    if lengths["high"] <= lengths["none"]:
        return Verdict("fail", f"reasoning length did not change with effort: {numbers}", data)
    return Verdict("pass", numbers, data)


# --- vision -----------------------------------------------------------------------------------

VISION_COLOUR = "red"
VISION_PROMPT = "What is the main colour of this image? Answer in one short sentence."


async def vision(ctx: Ctx) -> Verdict:
    content = [
        {"type": "text", "text": VISION_PROMPT},
        {"type": "image_url", "image_url": {"url": images.colour_png(VISION_COLOUR)}},
    ]
    answer = await ctx.client.post(CHAT, _chat(ctx, content), "vision")
    if not answer.ok:
        return Verdict("fail", f"the server rejected the image: {answer.error_text()}")
    msg = answer.message()
    text = visible(msg.content)
    words = images.COLOURS[VISION_COLOUR][1]
    problem = judge_text(msg.content, msg.reasoning, msg.finish_reason, ctx.max_tokens)
    if problem and text:
        return Verdict("fail", problem)
    if re.search(r"\b(" + "|".join(words) + r")\b", text, re.I):
        return Verdict("pass", f"solid {VISION_COLOUR} PNG: {quote(text, 70)}")
    others = [n for n in images.COLOURS if n != VISION_COLOUR and re.search(rf"\b{n}\b", text, re.I)]
    if others:
        return Verdict(
            "fail", f"the answer names the wrong colour for a solid {VISION_COLOUR} image: {quote(text, 90)}"
        )
    return Verdict("fail", f"the answer ignored the image: {quote(text, 90)}")


# --- long context -----------------------------------------------------------------------------


async def long_context(ctx: Ctx) -> Verdict:
    limit = (ctx.entry or {}).get("max_model_len")
    if isinstance(limit, int) and ctx.needle_tokens + 256 > limit:
        return Verdict(
            "fail",
            f"--needle-tokens {ctx.needle_tokens} does not fit the model's context "
            f"(max_model_len {limit}); use at most {max(0, limit - 256)}",
        )
    secret = needle.new_passphrase()
    text = needle.question(needle.haystack(ctx.needle_tokens, ctx.needle_depth, secret))
    answer = await ctx.client.post(CHAT, _chat(ctx, text), "long_context")
    where = f"depth {ctx.needle_depth:g} of ~{ctx.needle_tokens} tokens"
    if not answer.ok:
        return Verdict("fail", f"{where}: {answer.error_text()}{_overflow(answer)}")
    msg = answer.message()
    usage = msg.usage if isinstance(msg.usage, dict) else {}
    prompt_tokens = usage.get("prompt_tokens")
    data = {"needle_tokens": ctx.needle_tokens, "depth": ctx.needle_depth, "prompt_tokens": prompt_tokens}
    counted = f", prompt_tokens {prompt_tokens}" if prompt_tokens else ""
    content = visible(msg.content)
    problem = judge_text(msg.content, msg.reasoning, msg.finish_reason, ctx.max_tokens)
    if problem and content:
        return Verdict("fail", f"{where}: {problem}", data)
    if needle.recalled(content, secret):
        return Verdict("pass", f"passphrase recalled at {where}{counted}", data)
    return Verdict("fail", f"the passphrase planted at {where} was not recalled{counted}: {quote(content, 80)}", data)


def _overflow(answer: Answer) -> str:
    """The error's kind and counts when the server says the prompt overflowed its context:
    llama.cpp's `exceed_context_size_error` carries `n_prompt_tokens` and `n_ctx` beside its message,
    and the kind is what a user searches for (the message's wording changes between versions)."""
    obj = answer.json()
    err = obj.get("error") if isinstance(obj, dict) else None
    if not isinstance(err, dict):
        return ""
    kind = err.get("type")
    if not isinstance(kind, str) or "context" not in kind:
        return ""
    counts = [f"{k} {err[k]}" for k in ("n_prompt_tokens", "n_ctx") if isinstance(err.get(k), int)]
    return f" ({kind}{': ' + ', '.join(counts) if counts else ''})"


# --- sampling ---------------------------------------------------------------------------------


async def sampling(ctx: Ctx) -> Verdict:
    """Informational: what tapfix would fill in, and the server's own defaults when it shows them."""
    verdict = (
        ctx.sampling()
        if ctx.sampling
        else Verdict("pass", "no policy: tapfix injects nothing; the server's own defaults apply")
    )
    server = await _server_defaults(ctx)
    if server:
        verdict.detail += f"; server defaults ({server})"
    return verdict


async def _server_defaults(ctx: Ctx) -> str:
    """llama-server shows its effective sampling defaults at /props; other engines do not."""
    if (ctx.entry or {}).get("owned_by") != "llamacpp":
        return ""
    prefix = ctx.client.target.prefix.removesuffix("/v1")
    answer = await ctx.client.get(prefix + "/props", "sampling")
    obj = answer.json() if answer.ok else None
    params = (obj or {}).get("default_generation_settings", {}).get("params", {}) if isinstance(obj, dict) else {}
    keys = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty")
    shown = [f"{k} {params[k]:g}" for k in keys if isinstance(params.get(k), int | float)]
    return "llama.cpp /props: " + ", ".join(shown) if shown else ""


CHECK_FUNCTIONS: dict[str, Callable[[Ctx], Any]] = {
    "completion": completion,
    "streaming": streaming,
    "tools": tools,
    "reasoning": reasoning,
    "vision": vision,
    "long_context": long_context,
    "sampling": sampling,
}
