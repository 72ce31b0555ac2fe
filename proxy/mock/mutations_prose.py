"""Prose with examples: a format's markup placed where a reader sees an example, not a call.

The leak's decoys (`mutations_leak.decoy_wire`) put a format's markup of a turn's calls in each container
docs/formats.md names ("What counts as a call"): the middle of a sentence, a sentence hard-wrapped around
it, straight and curly quotes, a list item, a table cell, a blockquote, `<pre>`, an indented code block,
fences of backticks and of tildes. The prose around it is what assistants write when they explain a
format (English and Chinese, several phrasings per container), so the stage meets the text a user's
question about tool calls gets back. Each such decoy must reach the client byte for byte.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Final

_MID: Final = (
    "Never let a model emit {m} unchecked; that is why agents ask first.",
    "For example, a model answers {m} when it wants the tool, and the parser turns that into a call.",
    "If you see {m} in the output, the server ran without a tool parser.",
    "模型会输出 {m} 来调用工具，这只是一个例子。",
    "{m} is what the model writes; never run it without asking.",
)
_WRAPPED: Final = (
    "Never let a model emit\n{m}\nunchecked; that is why agents ask first.",
    "The model writes\n{m}\nwhen it wants to call a tool, and the parser reads it.",
    "A Qwen model answers with {m}\nand vLLM's parser turns that into a call.",
)
_QUOTES: Final = (
    'The string "{m}" is what the model emits.',
    'It answered "{m}" instead of calling the tool.',
    "The model answers “{m}” when it wants the tool.",
    "He pasted this:\n“{m}”",
    "Le modèle écrit «{m}» pour appeler l'outil.",
    "模型输出了「{m}」，但服务器没有解析它。",
)
_LIST: Final = (
    "What the models write:\n\n- {m}\n- plain text otherwise\n",
    "Steps:\n\n1. Read the file.\n2. {m}\n3. Check the result.",
    "Two forms:\n\n* a structured call\n* {m}",
    "1. The model writes:\n\n   {m}\n\n2. The server parses it.",
)
_TABLE: Final = (
    "| model | output |\n|---|---|\n| Qwen3 | {m} |\n",
    "| format | example |\n| --- | --- |\n| leaked | {m}",
    "model | output\n--- | ---\nQwen3 | {m}",
)
_QUOTE_BLOCK: Final = (
    "The docs say:\n\n> {m}\n\nSo that is the format.",
    "> Example from the model card:\n> {m}",
    "> {m}",
)
_PRE: Final = ("Raw output:\n<pre>{m}</pre>", "<pre>\n{m}\n</pre>\n", "It looks like <code>{m}</code> in the logs.")
_BACKTICKS: Final = (
    "Here is how it looks:\n\n```\n{m}\n```\n",
    "```text\n{m}\n```",
    "Example:\n\n````markdown\n{m}\n````\n\nThat is the raw output.",
    "Output:\n```\n{m}\n",
)
_TILDES: Final = ("Example:\n~~~\n{m}\n~~~\n", "~~~~ xml\n{m}\n~~~~", "The log:\n\n~~~\n{m}\n~~~\n\nNothing else.")


def _indented(rng: random.Random, m: str) -> str:
    pad = rng.choice(("    ", "\t", "      "))
    body = "\n".join(pad + line for line in m.split("\n"))
    return rng.choice(("Example of the format:\n\n{b}\n\nThat is all.", "Example:\n\n{b}\n", "{b}")).format(b=body)


def _from(templates: tuple[str, ...]) -> Callable[[random.Random, str], str]:
    return lambda rng, m: rng.choice(templates).replace("{m}", m)


CONTAINERS: Final[dict[str, Callable[[random.Random, str], str]]] = {
    "mid_sentence": _from(_MID),
    "wrapped_sentence": _from(_WRAPPED),
    "quotes": _from(_QUOTES),
    "list_item": _from(_LIST),
    "table_cell": _from(_TABLE),
    "blockquote": _from(_QUOTE_BLOCK),
    "pre": _from(_PRE),
    "indented_code": _indented,
    "backtick_fence": _from(_BACKTICKS),
    "tilde_fence": _from(_TILDES),
}


def in_container(rng: random.Random, kind: str, markup: str) -> str | None:
    """`markup` as an example in prose of container `kind` (None: it can't stand there as one: a blank
    line inside it would end the container before the markup does)."""
    markup = markup.strip()
    if not markup or any(not line.strip() for line in markup.split("\n")):
        return None
    return CONTAINERS[kind](rng, markup)
