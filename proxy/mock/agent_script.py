"""The default scripted model: tiny, deterministic, and good enough to drive a real coding agent.

It is also the healthy reference for the deep probe, so each thing a probe checks has an honest
answer here: a coherent reply to a short prompt, a valid tool call when one is required, the planted
passphrase when asked for it, the dominant colour of a PNG, and reasoning that grows with the effort
knob. Scenario behaviours (ignore_images, forget_needle, ignore_effort) switch single abilities off
through `Knobs`, so a probe can be shown to catch each failure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tapfix.proxy.mock.after_tool import closing_answer, last_call, retry_with_absolute_path
from tapfix.proxy.mock.chat import Reply, ToolCall
from tapfix.proxy.mock.edit_formats import edit_answer
from tapfix.proxy.mock.jsonish import obj
from tapfix.proxy.mock.reading import ToolResult, prompt_message, turn_index, working_directory
from tapfix.proxy.mock.toolargs import analyze, is_custom, pick_tool, tool_call_arguments, tool_name
from tapfix.proxy.mock.vision import decode_data_url, dominant_colour

EFFORT_LEVELS = {"none": 0, "minimal": 1, "low": 2, "medium": 3, "high": 4, "xhigh": 5, "max": 5}
# Sentences of reasoning per effort level: strictly growing, so a probe sees the knob act.
REASONING_SENTENCES = (0, 1, 3, 5, 8, 12)

_CAPITALS = {
    "france": "Paris",
    "germany": "Berlin",
    "italy": "Rome",
    "spain": "Madrid",
    "japan": "Tokyo",
    "china": "Beijing",
    "canada": "Ottawa",
    "australia": "Canberra",
    "england": "London",
    "united kingdom": "London",
    "portugal": "Lisbon",
    "poland": "Warsaw",
    "egypt": "Cairo",
}
_NEEDLE = re.compile(
    r"\b(passphrase|password|secret (?:word|code|key|phrase)|magic (?:word|number)|code ?word)\s+is\s*:?\s*"
    r"(?:[\"“']([^\"”'\n]{1,200})[\"”']|([\w-]{1,100}))",
    re.I,
)


@dataclass(frozen=True)
class Knobs:
    """Abilities a scenario can switch off (see scenario.py)."""

    ignore_images: bool = False
    forget_needle: bool = False
    ignore_effort: bool = False


ALL_ABILITIES = Knobs()


def text_of(content: Any) -> str:
    """The text of a message's content; omp's `<system-reminder>` parts are not the user's words."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") in ("text", "input_text"):
            text = part.get("text")
            if isinstance(text, str) and not text.lstrip().startswith("<system-reminder>"):
                parts.append(text)
    return "\n".join(parts)


def image_urls(content: Any) -> list[str]:
    urls = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("image_url", "input_image"):
                ref = part.get("image_url")
                url = ref.get("url") if isinstance(ref, dict) else ref
                if isinstance(url, str):
                    urls.append(url)
    return urls


def _prompt_text(text: str) -> str:
    """opencode wraps a prompt with spaces in literal quotes: take them off."""
    stripped = text.strip()
    if len(stripped) >= 2 and stripped[0] == stripped[-1] == '"' and stripped.count('"') == 2:
        return stripped[1:-1]
    return stripped


def effort_level(req: dict[str, Any]) -> int:
    """0 (none) to 5 (max) from any of the dialects clients and engines use (engines.md §2)."""
    kwargs = obj(req.get("chat_template_kwargs"))
    thinking = req.get("thinking")
    if kwargs.get("enable_thinking") is False or req.get("enable_thinking") is False or kwargs.get("thinking") is False:
        return 0
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        return 0
    effort = req.get("reasoning_effort")
    if effort is None:
        effort = obj(req.get("reasoning")).get("effort")
    if isinstance(effort, str) and effort.lower() in EFFORT_LEVELS:
        return EFFORT_LEVELS[effort.lower()]
    if isinstance(effort, (int, float)) and not isinstance(effort, bool):
        return 0 if effort <= 0 else 2 if effort < 0.34 else 3 if effort < 0.67 else 4
    if kwargs.get("enable_thinking") or req.get("enable_thinking") or kwargs.get("thinking") is True:
        return 3
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"):
        return 3
    return 0


def reasoning_text(level: int, task: str, tool: str | None) -> str:
    sentences = [
        f"The user wants me to {task}.",
        f"The {tool} tool fits this request, so I will call it." if tool else "No tool is needed here.",
        "Let me make sure I understand what is being asked.",
        "I should keep the answer short and precise.",
        "First I check the inputs, then I decide on the exact wording.",
        "Nothing in the request looks ambiguous.",
        "I will not add anything that was not asked for.",
        "Let me double-check the details once more before answering.",
        "The request is simple, and a direct answer is the right choice.",
        "I have considered the obvious alternatives and none of them is better.",
        "The result should be easy to verify.",
        "All right, I have everything I need.",
    ]
    return " ".join(sentences[: REASONING_SENTENCES[max(0, min(level, 5))]])


def respond(req: dict[str, Any], call_id: str, knobs: Knobs = ALL_ABILITIES) -> Reply:
    """The scripted model's reply to a chat request (before tokenization and max_tokens)."""
    messages = [m for m in req.get("messages") or [] if isinstance(m, dict)]
    turn = turn_index(messages)  # a trailing system message never hides the prompt or the tool result
    last = messages[turn] if messages else {}
    user = prompt_message(messages, text_of)
    prompt = _prompt_text(text_of(user.get("content")))
    workdir = working_directory(
        [text_of(m.get("content")) for m in messages if m.get("role") in ("system", "developer")]
        + [_all_text(m.get("content")) for m in messages if m.get("role") == "user"]
    )
    intent = analyze(prompt, workdir)
    tools = [t for t in req.get("tools") or [] if isinstance(t, dict)]
    choice = req.get("tool_choice")
    level = 3 if knobs.ignore_effort else effort_level(req)

    if last.get("role") == "tool":
        called, result = last_call(messages[:turn]), tool_result(last)
        retry = retry_with_absolute_path(called, result, workdir, call_id)
        if retry is not None:
            reasoning = reasoning_text(level, "retry with an absolute path", retry.name)
            return Reply(tool_calls=[retry], reasoning=reasoning, finish_reason="tool_calls")
        content = closing_answer(called, result)
        return Reply(content=content, reasoning=reasoning_text(level, "report the tool result", None))

    tool: dict[str, Any] | None = None
    if tools and choice != "none":
        if isinstance(choice, dict):
            wanted = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
            tool = next((t for t in tools if tool_name(t) == wanted), None) or (
                {"type": "function", "function": {"name": wanted, "parameters": {}}} if wanted else None
            )
        else:
            tool = pick_tool(tools, intent, required=choice == "required")
    if tool is not None:
        call = ToolCall(call_id, tool_name(tool), tool_call_arguments(tool, intent), custom=is_custom(tool))
        task = intent.summary[0].lower() + intent.summary[1:]
        named = isinstance(choice, dict)  # vLLM: named tool choice finishes with "stop"
        return Reply(
            tool_calls=[call],
            reasoning=reasoning_text(level, task, tool_name(tool)),
            finish_reason="stop" if named else "tool_calls",
        )
    system = _system_text(messages)
    taught = "\n".join([system, *(_all_text(m.get("content")) for m in messages if m.get("role") == "user")])
    content = (edit_answer(taught, intent) if not tools else None) or answer_text(
        messages, user, prompt, knobs, system=system
    )
    return Reply(content=content, reasoning=reasoning_text(level, _task(prompt), None))


def tool_result(message: dict[str, Any]) -> ToolResult:
    """A tool message as the mock reads it: its text, its images and the client's error flag."""
    content = message.get("content")
    return ToolResult(_all_text(content), image_urls(content), flagged=bool(message.get("is_error")))


def _all_text(content: Any) -> str:
    """Every text of a content, reminders included (`text_of` leaves them out of the user's words)."""
    if isinstance(content, str):
        return content
    return (
        "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        if isinstance(content, list)
        else ""
    )


def _system_text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(text_of(m.get("content")) for m in messages if m.get("role") in ("system", "developer"))


def _task(prompt: str) -> str:
    words = re.findall(r"[\w'.-]+", prompt)[:10]
    return ("answer: " + " ".join(words)) if words else "reply"


def answer_text(
    messages: list[dict[str, Any]], user: dict[str, Any], prompt: str, knobs: Knobs, system: str = ""
) -> str:
    """A plain-text answer: needle, vision, a few canned skills, else a short generic reply."""
    low = prompt.lower()
    urls = image_urls(user.get("content"))
    if urls:
        if knobs.ignore_images:
            return "I don't see an image in your message. Could you describe it or attach it again?"
        data = next((d for d in (decode_data_url(u) for u in urls) if d), None)
        colour = dominant_colour(data) if data else None
        if colour is None:
            return "I can see that an image was attached, but I can't make out its colours."
        return f"The image is mostly {colour}. The dominant colour is {colour}."
    if re.search(r"passphrase|password|secret|magic (?:word|number)|code ?word|needle", low):
        everything = "\n".join(text_of(m.get("content")) for m in messages)
        found = list(_NEEDLE.finditer(everything))
        if found and not knobs.forget_needle:
            m = found[-1]
            return f'The {m.group(1).lower()} is "{m.group(2) or m.group(3)}".'
        return "I could not find a passphrase in the text you gave me."
    if "title" in system.lower() and "generat" in system.lower():
        words = re.findall(r"[\w'.-]+", prompt)[:6]
        return " ".join(words).capitalize() if words else "New conversation"
    return _canned(prompt, low)


def _canned(prompt: str, low: str) -> str:
    m = re.search(
        r"\b(?:say|repeat|reply with|respond with|answer with)(?: only| exactly| just)?:?\s*"
        r"[\"“'`]([^\"”'`]{1,200})[\"”'`]",
        prompt,
        re.I,
    )
    if m:
        return m.group(1)
    m = re.search(r"count (?:from 1 )?(?:up )?to (\d{1,2})\b", low)
    if m and 0 < int(m.group(1)) <= 50:
        return ", ".join(str(i) for i in range(1, int(m.group(1)) + 1)) + "."
    # A number starts after a non-digit and is taken whole (possessive): a long digit run is scanned
    # once, not once per digit (the backtracking form was quadratic on a prompt of one long number).
    m = re.search(r"(?<!\d)(-?\d++(?:\.\d++)?+)\s*+([-+*/×x])\s*(-?\d+(?:\.\d+)?)", prompt)
    if m:
        result = _arith(float(m.group(1)), m.group(2), float(m.group(3)))
        if result is not None:
            return f"{m.group(1)} {m.group(2)} {m.group(3)} = {result}."
    m = re.search(r"capital of ([a-z ]+?)\??$|capital of ([a-z ]+?)[?.,]", low)
    if m:
        country = (m.group(1) or m.group(2) or "").strip().removeprefix("the ")
        if country in _CAPITALS:
            return f"The capital of {country.title()} is {_CAPITALS[country]}."
    if re.match(r"^(hi|hello|hey|good (morning|afternoon|evening))\b", low) or not low:
        return "Hello! How can I help you today?"
    words = re.findall(r"[\w'.-]+", prompt)[:8]
    topic = " ".join(words) if words else "your message"
    return (
        f'Thanks for your message about "{topic}". I am a small scripted model, so my answer is short: '
        "the request was received and understood, and there is nothing more I can add with confidence."
    )


def _arith(a: float, op: str, b: float) -> str | None:
    if op == "+":
        value = a + b
    elif op == "-":
        value = a - b
    elif op in "*x×":
        value = a * b
    elif b == 0:
        return None
    else:
        value = a / b
    return str(int(value)) if value == int(value) else f"{value:.4g}"
