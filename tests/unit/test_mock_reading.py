"""How the mock reads a conversation (proxy/mock/reading.py and its users), on every surface, in-process.

What real clients send that the mock used to misread (issue 31, item 18): an instruction after the
user's prompt (Claude Code's `role: "system"` message), a tool that requires absolute paths (Qwen Code's
`write_file`), a tool result that failed, a client that edits from the reply's text (aider), an image
inside a tool result.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from tapfix.proxy.mock import MockOptions, create_app
from tapfix.proxy.mock.agent_script import respond
from tapfix.proxy.mock.reading import ToolResult, working_directory
from tapfix.proxy.mock.vision import encode_png

from tests.support.builders import message_tool_call, tool

PROMPT = "Create hello.txt containing a greeting"
GREETING = "Hello, world!\n"
WRITE = tool(
    "write",
    {"filePath": {"type": "string"}, "content": {"type": "string"}},
    ["filePath", "content"],
    description="Writes a file",
)
# Qwen Code's write_file (gemini-cli's): the path must be absolute, and its tool says so.
QWEN_WRITE = tool(
    "write_file",
    {
        "file_path": {
            "type": "string",
            "description": "The absolute path to the file to write to (e.g., '/home/user/project/file.txt'). "
            "Relative paths are not supported.",
        },
        "content": {"type": "string", "description": "The content to write to the file."},
    },
    ["file_path", "content"],
    description="Writes content to a specified file in the local filesystem.",
)
QWEN_ENV = (
    "This is the Qwen Code. We are setting up the context for our chat.\n"
    "Today's date is Monday.\nMy operating system is: linux\n"
    "I'm currently working in the directory: /home/dev/project\n"
    "Here is the folder structure of the current working directories:"
)


def _png(rgb: tuple[int, int, int]) -> str:
    return base64.b64encode(encode_png(4, 4, rgb)).decode()


def _the_call(reply) -> dict:
    (call,) = reply.tool_calls
    return {"name": call.name, "arguments": json.loads(call.arguments)}


def _after(result: dict, call_args: dict | None = None, tools: list | None = None) -> str:
    call = message_tool_call(json.dumps(call_args or {}), "c1", "write")
    messages = [
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", **result},
    ]
    return respond({"messages": messages, "tools": tools or [WRITE]}, "c2").content


# ---- an instruction after the prompt ----------------------------------------------------------------


def test_a_system_message_after_the_prompt_leaves_the_turn_to_the_prompt() -> None:
    messages = [
        {"role": "user", "content": PROMPT},
        {"role": "system", "content": "Remember the git attribution rules."},
    ]
    reply = respond({"messages": messages, "tools": [WRITE]}, "c1")
    assert _the_call(reply) == {"name": "write", "arguments": {"filePath": "hello.txt", "content": GREETING}}


def test_a_system_message_after_a_tool_result_leaves_the_turn_to_the_result() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "write", "arguments": '{"filePath": "hello.txt"}'}}
    messages = [
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "Wrote file successfully."},
        {"role": "developer", "content": "Keep answers short."},
    ]
    reply = respond({"messages": messages, "tools": [WRITE]}, "c2")
    assert not reply.tool_calls and reply.content.startswith("Done.")


# Claude Code's first turn on /v1/messages, as 2.1.332 sends it: reminders in the user's message, and a
# system message after it.
CLAUDE_FIRST_TURN = {
    "model": "m",
    "max_tokens": 32000,
    "system": [{"type": "text", "text": "You are a Claude agent."}],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>\nAs you answer, use this context.\n</system-reminder>"},
                {"type": "text", "text": PROMPT},
            ],
        },
        {"role": "system", "content": [{"type": "text", "text": "# Environment\n - Primary working directory: /w"}]},
    ],
    "tools": [
        {
            "name": "Write",
            "description": "Writes a file to the local filesystem.",
            "input_schema": {
                "type": "object",
                "properties": {
                    "file_path": {
                        "type": "string",
                        "description": "The absolute path to the file to write (must be absolute, not relative)",
                    },
                    "content": {"type": "string"},
                },
                "required": ["file_path", "content"],
            },
        }
    ],
}


def test_break_first_turn_breaks_claude_codes_first_turn() -> None:
    c = TestClient(create_app(MockOptions(scenario="break_first_turn")))
    first = c.post("/v1/messages", json=CLAUDE_FIRST_TURN).json()
    assert first["stop_reason"] == "max_tokens", first  # the first attempt is cut
    again = c.post("/v1/messages", json=CLAUDE_FIRST_TURN).json()
    assert again["stop_reason"] == "tool_use"
    (use,) = [b for b in again["content"] if b["type"] == "tool_use"]
    # ... and the whole call writes under the working directory the client declared.
    assert use["input"] == {"file_path": "/w/hello.txt", "content": GREETING}


@pytest.mark.parametrize("surface", ["chat", "responses", "messages"])
def test_last_role_skips_trailing_instructions_on_every_surface(tmp_path: Path, surface: str) -> None:
    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps({"rules": [{"when": {"last_role": "user"}, "do": "http_error", "status": 418}]}))
    c = TestClient(create_app(MockOptions(scenario=scenario)))
    if surface == "chat":
        path, body = (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": PROMPT}, {"role": "system", "content": "x"}]},
        )
    elif surface == "responses":
        items = [{"role": "user", "content": PROMPT}, {"type": "message", "role": "developer", "content": "x"}]
        path, body = "/v1/responses", {"input": items}
    else:
        path, body = "/v1/messages", {"max_tokens": 9, "messages": CLAUDE_FIRST_TURN["messages"]}
    assert c.post(path, json={"model": "m", **body}).status_code == 418


# ---- absolute paths ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, workdir",
    [
        (QWEN_ENV, "/home/dev/project"),
        ("<env>\n  Working directory: /tmp/run/work\n  Is directory a git repo: yes\n</env>", "/tmp/run/work"),
        ("# Environment\n - Primary working directory: /srv/app\n - Is a git repository: true", "/srv/app"),
        ("<environment_context>\n  <cwd>/Users/me/code</cwd>\n</environment_context>", "/Users/me/code"),
        ("The current working directory is `/opt/x/`.", "/opt/x"),
        ("Answer in English. Paths like /etc/passwd are off limits.", None),
    ],
)
def test_the_working_directory_is_read_from_what_introduces_it(text: str, workdir: str | None) -> None:
    assert working_directory([text]) == workdir


def test_a_tool_that_wants_an_absolute_path_gets_one_under_the_working_directory() -> None:
    messages = [{"role": "user", "content": QWEN_ENV}, {"role": "user", "content": PROMPT}]
    reply = respond({"messages": messages, "tools": [QWEN_WRITE]}, "c1")
    assert _the_call(reply)["arguments"] == {"file_path": "/home/dev/project/hello.txt", "content": GREETING}
    # A tool that takes relative paths keeps them; without a declared directory nothing is made up.
    assert _the_call(respond({"messages": messages, "tools": [WRITE]}, "c1"))["arguments"]["filePath"] == "hello.txt"
    alone = [{"role": "user", "content": PROMPT}]
    assert _the_call(respond({"messages": alone, "tools": [QWEN_WRITE]}, "c1"))["arguments"]["file_path"] == "hello.txt"


def test_an_absolute_path_in_the_prompt_is_used_as_given() -> None:
    messages = [{"role": "user", "content": "Create /data/out/hello.txt containing a greeting"}]
    assert _the_call(respond({"messages": messages, "tools": [QWEN_WRITE]}, "c1"))["arguments"]["file_path"] == (
        "/data/out/hello.txt"
    )


def test_a_path_refused_for_being_relative_is_sent_again_absolute_once() -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "write", "arguments": '{"filePath": "hello.txt", "content": "Hi"}'},
    }
    messages = [
        {"role": "system", "content": "Working directory: /w"},
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "File path must be absolute: hello.txt"},
    ]
    reply = respond({"messages": messages, "tools": [WRITE]}, "c2")
    assert _the_call(reply) == {"name": "write", "arguments": {"filePath": "/w/hello.txt", "content": "Hi"}}
    assert reply.finish_reason == "tool_calls"
    # The absolute path failing too is a failure, not another try.
    call2 = {**call, "id": "c2", "function": {"name": "write", "arguments": '{"filePath": "/w/hello.txt"}'}}
    messages += [
        {"role": "assistant", "content": "", "tool_calls": [call2]},
        {"role": "tool", "tool_call_id": "c2", "content": "Error: path must be absolute and inside the workspace"},
    ]
    again = respond({"messages": messages, "tools": [WRITE]}, "c3")
    assert not again.tool_calls and "failed" in again.content


# ---- tool results that failed ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "result",
    [
        {"content": "File path must be absolute: hello.txt"},
        {"content": "Error: missing required parameter 'content'"},
        {"content": "The user rejected this tool call."},
        {"content": "The user doesn't want to proceed with this tool use. The tool use was rejected."},
        {"content": "Tool execution was denied by policy"},
        {"content": "Command exited with code 2\nbash: x: command not found"},
        {"content": "<tool_use_error>File has not been read yet. Read it first before writing to it.</tool_use_error>"},
        {"content": "Wrote 3 of 14 bytes", "is_error": True},  # the client's flag decides
        {"content": [{"type": "text", "text": "ENOENT: no such file or directory, open 'a/hello.txt'"}]},
    ],
)
def test_a_failed_tool_call_is_never_reported_as_done(result: dict) -> None:
    answer = _after(result, {"filePath": "hello.txt", "content": GREETING})
    assert "Done" not in answer and "created" not in answer, answer
    assert "failed" in answer and "could not" in answer


@pytest.mark.parametrize("text", ["Wrote file successfully.", "File created successfully at: /w/hello.txt", ""])
def test_a_successful_tool_call_is_reported_as_done(text: str) -> None:
    assert _after({"content": text}, {"filePath": "hello.txt", "content": GREETING}).startswith("Done. I created")


def test_the_failure_line_is_the_tools_own_words() -> None:
    result = ToolResult("<tool_use_error>File does not exist.</tool_use_error>", flagged=True)
    assert result.failure == "File does not exist."
    assert ToolResult("Hello, world!\n").failure is None


def test_an_error_flag_on_a_messages_tool_result_reaches_the_answer() -> None:
    c = TestClient(create_app(MockOptions()))
    use = {"type": "tool_use", "id": "toolu_1", "name": "Write", "input": {"file_path": "hello.txt", "content": "x"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Cancelled by the hook", "is_error": True}
    body = {
        "model": "m",
        "max_tokens": 500,
        "messages": [
            {"role": "user", "content": PROMPT},
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
        ],
        "tools": CLAUDE_FIRST_TURN["tools"],
    }
    text = "".join(b["text"] for b in c.post("/v1/messages", json=body).json()["content"] if b["type"] == "text")
    assert "failed: Cancelled by the hook" in text


# ---- aider: edits in the reply's text ----------------------------------------------------------------

WHOLE = (
    "Act as an expert software developer.\nTo suggest changes to a file you MUST return the entire content of "
    "the updated file.\nYou MUST use this *file listing* format:\n\npath/to/filename.js\n```\n// entire file "
    "content ...\n// ... goes in between\n```\n\nEvery *file listing* MUST use this format:\n- First line: the "
    "filename with any originally provided path\n- Second line: opening ```\n"
)
DIFF = (
    "Describe each change with a *SEARCH/REPLACE block* per the examples below.\n\nmathweb/flask/app.py\n"
    "```python\n<<<<<<< SEARCH\nfrom flask import Flask\n=======\nimport math\nfrom flask import Flask\n"
    ">>>>>>> REPLACE\n```\n\nTo create a new file use an empty `SEARCH` section.\n"
)
DIFF_FENCED = (
    "Every *SEARCH/REPLACE block* must use this format:\n```python\nmathweb/flask/app.py\n<<<<<<< SEARCH\n"
    "from flask import Flask\n=======\nimport math\n>>>>>>> REPLACE\n```\n"
)
UDIFF = (
    "Return edits similar to unified diffs that `diff -U0` would produce.\n\n```diff\n--- mathweb/flask/app.py\n"
    "+++ mathweb/flask/app.py\n@@ ... @@\n-class MathWeb:\n+import sympy\n```\n\nTo make a new file, show a "
    "diff from `--- /dev/null` to `+++ path/to/new/file.ext`.\n"
)
PATCH = "Use the V4A diff format:\n*** Begin Patch\n*** Update File: [path]\n...\n*** End Patch\n"
FENCED_FOUR = WHOLE.replace("```", "````")


@pytest.mark.parametrize(
    "instructions, answer",
    [
        (WHOLE, "hello.txt\n```\nHello, world!\n```\n"),
        (FENCED_FOUR, "hello.txt\n````\nHello, world!\n````\n"),
        (DIFF, "hello.txt\n```\n<<<<<<< SEARCH\n=======\nHello, world!\n>>>>>>> REPLACE\n```\n"),
        (DIFF_FENCED, "```\nhello.txt\n<<<<<<< SEARCH\n=======\nHello, world!\n>>>>>>> REPLACE\n```\n"),
        (UDIFF, "```diff\n--- /dev/null\n+++ hello.txt\n@@ ... @@\n+Hello, world!\n```\n"),
        (PATCH, "*** Begin Patch\n*** Add File: hello.txt\n+Hello, world!\n*** End Patch\n"),
    ],
)
def test_a_client_without_tools_gets_its_own_edit_format(instructions: str, answer: str) -> None:
    messages = [{"role": "system", "content": instructions}, {"role": "user", "content": PROMPT}]
    assert respond({"messages": messages}, "c1").content == answer


def test_instructions_that_teach_no_format_get_prose() -> None:
    messages = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": PROMPT}]
    assert "```" not in respond({"messages": messages}, "c1").content


def test_aider_whole_format_through_the_served_chat_stream() -> None:
    """What ../shared/evidence/clients3/aider_whole.json had to script by hand, from the default script."""
    c = TestClient(create_app(MockOptions()))
    body = {
        "model": "m",
        "stream": True,
        "messages": [{"role": "system", "content": WHOLE}, {"role": "user", "content": PROMPT}],
    }
    text = ""
    for line in c.post("/v1/chat/completions", json=body).text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                text += choice["delta"].get("content") or ""
    assert text == "hello.txt\n```\nHello, world!\n```\n"


# ---- images in tool results, on every surface ---------------------------------------------------------

RED, BLUE = (220, 20, 20), (30, 60, 220)


def _text_of_answer(surface: str, data: dict) -> str:
    if surface == "chat":
        return data["choices"][0]["message"]["content"]
    if surface == "responses":
        return "".join(p["text"] for item in data["output"] if item["type"] == "message" for p in item["content"])
    return "".join(b["text"] for b in data["content"] if b["type"] == "text")


@pytest.mark.parametrize("surface", ["chat", "responses", "messages"])
def test_an_image_inside_a_tool_result_is_looked_at(surface: str) -> None:
    c = TestClient(create_app(MockOptions()))
    data = _png(RED)
    read = tool("read", {"path": {"type": "string"}})
    if surface == "chat":
        call = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"path": "shot.png"}'}}
        image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}
        messages = [
            {"role": "user", "content": "Read shot.png"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "Image read"}, image]},
        ]
        path, body = "/v1/chat/completions", {"messages": messages, "tools": [read]}
    elif surface == "responses":
        output = [{"type": "input_image", "image_url": f"data:image/png;base64,{data}"}]
        items = [
            {"role": "user", "content": "Read shot.png"},
            {"type": "function_call", "call_id": "c1", "name": "read", "arguments": '{"path": "shot.png"}'},
            {"type": "function_call_output", "call_id": "c1", "output": output},
        ]
        path, body = "/v1/responses", {"input": items, "tools": [{"type": "function", **read["function"]}]}
    else:
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
        result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [image]}
        use = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "shot.png"}}
        messages = [
            {"role": "user", "content": "Read shot.png"},
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
        ]
        schema = {"type": "object", "properties": {"file_path": {"type": "string"}}}
        path, body = (
            "/v1/messages",
            {"max_tokens": 500, "messages": messages, "tools": [{"name": "Read", "input_schema": schema}]},
        )
    answer = _text_of_answer(surface, c.post(path, json={"model": "m", **body}).json())
    assert "mostly red" in answer, answer


def test_an_image_in_a_messages_prompt_is_looked_at() -> None:
    c = TestClient(create_app(MockOptions()))
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _png(BLUE)}}
    body = {
        "model": "m",
        "max_tokens": 200,
        "messages": [{"role": "user", "content": [image, {"type": "text", "text": "What colour is this?"}]}],
    }
    assert "mostly blue" in _text_of_answer("messages", c.post("/v1/messages", json=body).json())
