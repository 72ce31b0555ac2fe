"""What the vLLM tests send and how they read vLLM's answers, independently of tapfix.

The model's words are forced (tests/process/vllm/served/forcing_plan.py): a test states the exact text, markup
included, and reads back what vLLM's parsers made of it. Nothing here depends on how the text was cut into
SSE chunks (that varies with timing): answers are assembled from every chunk first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.process.realengine.tiny_model import BYTES
from tests.process.vllm import tiny_qwen3
from tests.process.vllm.engine import MODEL, VllmServer
from tests.process.vllm.served.forcing_plan import directive
from tests.support.builders import tool
from tests.support.inproc import InprocProxy, cli
from tests.support.procs import wait_capture

CHAT = "/v1/chat/completions"
WRITE = tool(
    "write",
    {"path": {"type": "string"}, "content": {"type": "string"}},
    ["path", "content"],
    description="Write a file",
)
READ = tool("read", {"path": {"type": "string"}}, ["path"], description="Read a file")
TOOLS = [WRITE, READ]
WRITE_ARGS = {"path": "/tmp/hello.py", "content": "print('hello')\n"}
READ_ARGS = {"path": "src/main.py"}
REGEX_META = frozenset(".^$*+?()[]{}|\\/-")
THINKING = "\nThe user wants hello.py. I will call write.\n"  # what vLLM's qwen3 parser gives as reasoning


def hermes_call(name: str, arguments: dict[str, Any]) -> str:
    """A call as Hermes/Qwen markup: what a Qwen model writes and vLLM's `hermes` parser reads."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def exactly(text: str) -> str:
    """A regex for vLLM's `structured_outputs` that matches `text` alone (xgrammar's syntax: metacharacters
    escaped, a newline as `\\n`)."""
    return "".join("\\n" if c == "\n" else "\\" + c if c in REGEX_META else c for c in text)


def think(reasoning: str = THINKING) -> str:
    """A closed reasoning block. With the `qwen3` reasoning parser on, text before `</think>` is reasoning,
    so an answer without one would be read as reasoning alone."""
    return "<think>" + reasoning + "</think>\n\n"


def ask(text: str, *answers: str) -> list[dict[str, Any]]:
    """A one-message conversation whose model answers `answers` in order, turn by turn."""
    return [{"role": "user", "content": f"{text} {directive(*answers)}"}]


def chat_body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 400, **extra}


def parsed_events(body: bytes) -> list[tuple[str | None, Any]]:
    """(event name, parsed data) per SSE event; `[DONE]` as the string."""
    out: list[tuple[str | None, Any]] = []
    for block in body.decode().split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data:
            text = "\n".join(data)
            out.append((name, text if text == "[DONE]" else json.loads(text)))
    return out


@dataclass
class Choice:
    """One Chat Completions choice as a client assembles it."""

    content: str = ""
    reasoning: str = ""
    calls: list[dict[str, str]] = field(default_factory=list)  # id, name, arguments (text)
    finish_reason: str | None = None

    def parsed_calls(self) -> list[tuple[str, Any]]:
        return [(c["name"], json.loads(c["arguments"])) for c in self.calls]


def chat_choice(body: bytes, stream: bool) -> Choice:
    """Choice 0 of a Chat Completions answer, streamed (every delta assembled) or whole."""
    choice = Choice()
    if not stream:
        data = json.loads(body)["choices"][0]
        message = data["message"]
        choice.content = message.get("content") or ""
        choice.reasoning = message.get("reasoning") or ""
        choice.calls = [{"id": c["id"], **c["function"]} for c in message.get("tool_calls") or []]
        choice.finish_reason = data["finish_reason"]
        return choice
    calls: dict[int, dict[str, str]] = {}
    for _, data in parsed_events(body):
        if not isinstance(data, dict):
            continue
        for c in data.get("choices") or []:
            delta = c.get("delta") or {}
            choice.content += delta.get("content") or ""
            choice.reasoning += delta.get("reasoning") or ""
            for t in delta.get("tool_calls") or []:
                call = calls.setdefault(t["index"], {"id": "", "name": "", "arguments": ""})
                call["id"] = t.get("id") or call["id"]
                call["name"] += (t.get("function") or {}).get("name") or ""
                call["arguments"] += (t.get("function") or {}).get("arguments") or ""
            choice.finish_reason = c.get("finish_reason") or choice.finish_reason
    choice.calls = [calls[i] for i in sorted(calls)]
    return choice


def messages_blocks(body: bytes, stream: bool) -> list[dict[str, Any]]:
    """An Anthropic Messages answer's content blocks (thinking, text, tool_use with its input parsed)."""
    if not stream:
        return json.loads(body)["content"]
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, str] = {}
    for name, data in parsed_events(body):
        if name == "content_block_start":
            blocks[data["index"]] = dict(data["content_block"])
        elif name == "content_block_delta":
            delta, block = data["delta"], blocks[data["index"]]
            if delta["type"] == "text_delta":
                block["text"] = block.get("text", "") + delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta["thinking"]
            elif delta["type"] == "input_json_delta":
                partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
    for index, text in partial.items():
        blocks[index]["input"] = json.loads(text)
    return [blocks[i] for i in sorted(blocks)]


def token_text(token_strs: list[str]) -> str:
    """The text of tokens given as vLLM's `token_strs` (byte-level symbols; added tokens as they are)."""
    out = bytearray()
    for piece in token_strs:
        if piece in dict(tiny_qwen3.ADDED):
            out += piece.encode()
        else:
            out += bytes(BYTES.index(c) for c in piece)
    return out.decode()


def rendered_prompt(server: VllmServer, body: dict[str, Any]) -> str:
    """The prompt vLLM builds for a chat request, as text: its /tokenize renders it as a generation does."""
    keys = ("messages", "tools", "continue_final_message", "add_generation_prompt", "chat_template_kwargs")
    request = {"model": MODEL, "return_token_strs": True, **{k: body[k] for k in keys if k in body}}
    answer = httpx.post(server.url + "/tokenize", json=request, timeout=60)
    assert answer.status_code == 200, answer.text
    return token_text(answer.json()["token_strs"])


def shown(proxy: InprocProxy, response: httpx.Response) -> dict[str, Any]:
    """The capture of a response through tapfix, as `tapfix captures show --json` prints it."""
    capture_id = response.headers["x-tapfix-capture-id"]
    wait_capture(proxy.extra["db"], capture_id)
    result = cli("captures", "show", capture_id, "--json", "--db", str(proxy.extra["db"]))
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    captured: dict[str, Any] = json.loads(result.stdout)
    return captured
