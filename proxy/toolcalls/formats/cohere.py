"""Cohere: Command R / R+'s `Action:` fenced JSON list, and Command R7B / Command A's `<|START_ACTION|>` list.

Command R+ (CohereForAI-c4ai-command-r-plus-tool_use.jinja) writes
`Action:\n```json\n[{"tool_name": N, "parameters": {…}}, …]```` at the end of its turn: a fence, so a
call only when it is the last thing in the text (`directly_answer` is its no-tool action, never offered).
Command R7B and Command A (CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja, Cohere2MoE.jinja) write
`<|START_ACTION|>[{"tool_call_id": "0", "tool_name": N, "parameters": {…}}, …]<|END_ACTION|>` after their
plan in `<|START_THINKING|>…<|END_THINKING|>`; markup inside that plan is thinking, not a call.
`parameters` is an object, or a JSON text when the arguments were a string.
"""

from __future__ import annotations

import json
from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, RawCall, ToolFormat, closed_by, dumps, json_value, skip_ws
from tapfix.proxy.toolcalls.formats.tagged import TaggedJson

ACTION, JSON_FENCE, FENCE = "Action:", "```json", "```"
START, END = "<|START_ACTION|>", "<|END_ACTION|>"
THINKING = ("<|START_THINKING|>", "<|END_THINKING|>")
END_OF_TURN = "<|END_OF_TURN_TOKEN|>"  # the template ends a turn of calls with it: a token, never text


def _actions(value: Any) -> list[RawCall]:
    items = value if isinstance(value, list) else [value]
    calls: list[RawCall] = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("tool_name"), str) or not item["tool_name"]:
            raise ValueError("an action has a tool_name")
        params = item.get("parameters", {})
        calls.append((item["tool_name"], {} if params is None else params))
    return calls


class CommandR(ToolFormat):
    name = "command_r"
    family = "Cohere Command R, Command R+"
    openers = (ACTION,)
    fence = True

    def claims(self, text: str, at: int) -> bool:
        return text.startswith(JSON_FENCE, skip_ws(text, at + len(ACTION)))

    def parse(self, text: str, at: int) -> Markup | None:
        pos = skip_ws(text, at + len(ACTION))
        if not text.startswith(JSON_FENCE, pos):
            return None
        value, pos = json_value(text, pos + len(JSON_FENCE))
        return closed_by(text, at, pos, FENCE, _actions(value))

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        items = []
        for name, args in calls:
            params = _indent(json.dumps(args, indent=4, ensure_ascii=False), 8) if args else "{}"
            items.append(f'    {{\n        "tool_name": "{name}",\n        "parameters": {params}\n    }}')
        return f"{ACTION}\n{JSON_FENCE}\n[\n" + ",\n".join(items) + "\n]" + FENCE


def _indent(text: str, width: int) -> str:
    """Jinja's `indent(width)`: every line but the first, blank lines left alone."""
    first, *rest = text.split("\n")
    return "\n".join([first] + [(" " * width + line) if line else line for line in rest])


class CommandA(TaggedJson):
    name = "command_a"
    family = "Cohere Command R7B, Command A"

    def __init__(self) -> None:
        # markup inside the plan is thinking; the template ends a turn of calls with END_OF_TURN
        super().__init__(self.name, self.family, START, END, reader=_actions, thinking=THINKING, trailer=END_OF_TURN)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        items = [
            f'    {{"tool_call_id": "{k}", "tool_name": "{name}", "parameters": {dumps(args)}}}'
            for k, (name, args) in enumerate(calls)
        ]
        return f"{START}[\n" + ",\n".join(items) + f"\n]{END}"
