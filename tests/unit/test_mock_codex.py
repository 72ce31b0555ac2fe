"""The scripted model with Codex CLI's tools (`/v1/responses`): file creation, shell commands, numbers.

The schemas are data written from Codex's own tool specs (openai/codex, `codex-rs/core/src/tools/spec.rs`
and `handlers/apply_patch.rs`, `plan.rs`): `exec_command` (`cmd` required, `additionalProperties: false`),
`write_stdin` (`session_id` a JSON Schema `number` that Codex parses as an i32), the older argv `shell`
and the string `shell_command`, `update_plan`, `view_image`, and `apply_patch` both as a freeform
(`type: custom`, lark grammar) and as a function tool (`input`).
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from starlette.testclient import TestClient
from tapfix.proxy.mock import MockOptions, create_app
from tapfix.proxy.mock.agent_script import respond
from tapfix.proxy.mock.prompt_intent import analyze
from tapfix.proxy.mock.schema_args import build_arguments
from tapfix.proxy.mock.surface_script import chat_from_responses

from tests.support.builders import sse_json as events
from tests.support.builders import tool


def _fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "name": name,
        "description": description,
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        },
    }


def _s(description: str) -> dict:
    return {"type": "string", "description": description}


def _n(description: str) -> dict:
    return {"type": "number", "description": description}


EXEC_COMMAND = _fn(
    "exec_command",
    "Runs a command in a PTY, returning output or a session ID for ongoing interaction.",
    {
        "cmd": _s("Shell command to execute."),
        "workdir": _s("Optional working directory to run the command in; defaults to the turn cwd."),
        "shell": _s("Shell binary to launch. Defaults to the user's default shell."),
        "tty": {"type": "boolean", "description": "Whether to allocate a TTY for the command."},
        "login": {"type": "boolean", "description": "Whether to run the shell with -l/-i semantics."},
        "yield_time_ms": _n("How long to wait (in milliseconds) for output before yielding."),
        "max_output_tokens": _n("Maximum number of tokens to return. Excess output will be truncated."),
        "sandbox_permissions": _s("Sandbox permissions for the command."),
        "justification": _s('Only set if sandbox_permissions is "require_escalated".'),
    },
    ["cmd"],
)
WRITE_STDIN = _fn(
    "write_stdin",
    "Writes characters to an existing unified exec session and returns recent output.",
    {
        "session_id": _n("Identifier of the running unified exec session."),
        "chars": _s("Bytes to write to stdin (may be empty to poll)."),
        "yield_time_ms": _n("How long to wait (in milliseconds) for output before yielding."),
        "max_output_tokens": _n("Maximum number of tokens to return. Excess output will be truncated."),
    },
    ["session_id"],
)
SHELL = _fn(
    "shell",
    "Runs a shell command and returns its output.",
    {
        "command": {"type": "array", "items": {"type": "string"}, "description": "The command to execute"},
        "workdir": _s("The working directory to execute the command in"),
        "timeout_ms": _n("The timeout for the command in milliseconds"),
    },
    ["command"],
)
SHELL_COMMAND = _fn(
    "shell_command",
    "Runs a shell command and returns its output.",
    {
        "command": _s("The shell script to execute in the user's default shell"),
        "workdir": _s("The working directory to execute the command in"),
        "timeout_ms": _n("The timeout for the command in milliseconds"),
    },
    ["command"],
)
UPDATE_PLAN = _fn(
    "update_plan",
    "Updates the task plan.\nProvide an optional explanation and a list of plan items, each with a step and status.",
    {
        "explanation": {"type": "string"},
        "plan": {
            "type": "array",
            "description": "The list of steps",
            "items": {
                "type": "object",
                "properties": {
                    "step": {"type": "string"},
                    "status": _s("One of: pending, in_progress, completed"),
                },
                "required": ["step", "status"],
                "additionalProperties": False,
            },
        },
    },
    ["plan"],
)
VIEW_IMAGE = _fn(
    "view_image",
    "View a local image from the filesystem (only use if given a full filepath by the user).",
    {"path": _s("Local filesystem path to an image file")},
    ["path"],
)
APPLY_PATCH_FREEFORM = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files. "
    "This is a FREEFORM tool, so do not wrap the patch in JSON.",
    "format": {
        "type": "grammar",
        "syntax": "lark",
        "definition": 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\n'
        'end_patch: "*** End Patch" LF?\nhunk: add_hunk | delete_hunk | update_hunk\n'
        'add_hunk: "*** Add File: " filename LF add_line+\n',
    },
}
APPLY_PATCH_FUNCTION = _fn(
    "apply_patch",
    "Use the `apply_patch` tool to edit files.\n"
    "*** Begin Patch\n[ one or more file sections ]\n*** End Patch\n"
    "*** Add File: <path> - create a new file. Every following line is a + line (the initial contents).",
    {"input": _s("The entire contents of the apply_patch command")},
    ["input"],
)
# What Codex offers with unified exec and without apply_patch (the run that picked write_stdin).
CODEX_UNIFIED = [EXEC_COMMAND, WRITE_STDIN, UPDATE_PLAN, VIEW_IMAGE]
CODEX_FREEFORM = [EXEC_COMMAND, WRITE_STDIN, UPDATE_PLAN, APPLY_PATCH_FREEFORM, VIEW_IMAGE]
CODEX_FUNCTION_PATCH = [SHELL, UPDATE_PLAN, APPLY_PATCH_FUNCTION, VIEW_IMAGE]
PROMPT = "Create hello.txt containing a greeting"
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+Hello, world!\n*** End Patch"


def responses_request(tools: list[dict], prompt: str = PROMPT, **extra: object) -> dict:
    return {
        "model": "gpt-oss-20b",
        "instructions": "You are Codex, a coding agent.",
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [
                    {
                        "type": "input_text",
                        "text": "<environment_context><cwd>/tmp/w</cwd></environment_context>",
                    }
                ],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]},
        ],
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        **extra,
    }


def call_of(tools: list[dict], prompt: str = PROMPT, **extra: object) -> tuple[str, str, bool]:
    reply = respond(chat_from_responses(responses_request(tools, prompt, **extra)), "call-x")
    assert len(reply.tool_calls) == 1, reply.content
    call = reply.tool_calls[0]
    return call.name, call.arguments, call.custom


def test_file_creation_never_goes_to_write_stdin() -> None:
    name, args, custom = call_of(CODEX_UNIFIED)
    assert (name, custom) == ("exec_command", False)
    parsed = json.loads(args)
    assert parsed == {"cmd": "printf 'Hello, world!\\n' > hello.txt"}
    jsonschema.validate(parsed, EXEC_COMMAND["parameters"])
    # The order tools are offered in does not matter.
    assert call_of([WRITE_STDIN, UPDATE_PLAN, EXEC_COMMAND])[0] == "exec_command"


def test_file_creation_prefers_apply_patch_freeform_with_a_valid_patch() -> None:
    assert call_of(CODEX_FREEFORM) == ("apply_patch", PATCH, True)


def test_apply_patch_as_a_function_tool_gets_the_patch_in_input() -> None:
    name, args, custom = call_of(CODEX_FUNCTION_PATCH)
    assert (name, custom) == ("apply_patch", False)
    assert json.loads(args) == {"input": PATCH}


def test_argv_shell_and_string_shell_command_get_a_creating_command() -> None:
    name, args, _ = call_of([SHELL, UPDATE_PLAN])
    assert name == "shell"
    assert json.loads(args) == {"command": ["bash", "-lc", "printf 'Hello, world!\\n' > hello.txt"]}
    jsonschema.validate(json.loads(args), SHELL["parameters"])
    name, args, _ = call_of([SHELL_COMMAND, WRITE_STDIN])
    assert (name, json.loads(args)) == ("shell_command", {"command": "printf 'Hello, world!\\n' > hello.txt"})


@pytest.mark.parametrize(
    ("prompt", "tool", "expected"),
    [
        ("Show me the contents of notes.md", "exec_command", {"cmd": "cat notes.md"}),
        ("Run `ls -la` please", "exec_command", {"cmd": "ls -la"}),
        ("List the files here", "exec_command", {"cmd": "ls -la"}),
        ("Search for TODO", "exec_command", {"cmd": "grep -rn TODO ."}),
    ],
)
def test_other_intents_use_exec_command_not_view_image_or_mcp(prompt: str, tool: str, expected: dict) -> None:
    mcp = _fn("list_mcp_resources", "Lists resources provided by MCP servers.", {"server": _s("server")}, [])
    name, args, _ = call_of([*CODEX_UNIFIED, mcp], prompt)
    assert (name, json.loads(args)) == (tool, expected)


def test_a_topic_tool_is_used_when_the_prompt_names_its_topic() -> None:
    name, _, _ = call_of(CODEX_UNIFIED, "View the image at cat.png")
    assert name == "view_image"


def test_every_codex_function_tool_gets_schema_valid_whole_numbers() -> None:
    for spec in (*CODEX_UNIFIED, SHELL, SHELL_COMMAND, APPLY_PATCH_FUNCTION):
        choice = {"type": "function", "name": spec["name"]}
        name, args, _ = call_of([spec], "Hello", tool_choice=choice)
        parsed = json.loads(args)
        jsonschema.validate(parsed, spec["parameters"])
        assert ".0" not in args, args
    _, args, _ = call_of([WRITE_STDIN], "Hello", tool_choice={"type": "function", "name": "write_stdin"})
    assert json.loads(args) == {"session_id": 1} and isinstance(json.loads(args)["session_id"], int)


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "number"}, 1),
        ({"type": "number", "minimum": 5}, 5),
        ({"type": "number", "minimum": 1.5}, 1.5),
        ({"type": "number", "default": 0.7}, 0.7),
        ({"type": "number", "multipleOf": 0.1}, 0.5),
        ({"type": "number", "multipleOf": 4}, 4),
        ({"type": "number", "description": "Sampling probability between 0 and 1"}, 0.5),
        ({"type": "number", "description": "A fraction of the budget", "maximum": 0.25}, 0.25),
        ({"type": "integer", "minimum": 1.5}, 2),
        ({"type": "number", "description": "timeout in ms", "maximum": 600}, 600),
    ],
)
def test_numbers_are_whole_unless_the_schema_asks_for_fractions(schema: dict, expected: float) -> None:
    name = "timeout" if "timeout" in str(schema.get("description")) else "n"
    args = build_arguments({"type": "object", "properties": {name: schema}, "required": [name]}, analyze("x"))
    assert args[name] == expected and type(args[name]) is type(expected)
    jsonschema.validate(args, {"type": "object", "properties": {name: schema}})


def test_an_editor_with_create_semantics_is_told_to_create() -> None:
    editor = tool(
        "str_replace_based_edit_tool",
        {
            "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert"]},
            "path": {"type": "string"},
            "file_text": {"type": "string"},
        },
        ["command", "path"],
        description="Custom editing tool for viewing, creating and editing files",
    )
    bash = tool("bash", {"command": {"type": "string"}}, ["command"])
    reply = respond({"messages": [{"role": "user", "content": PROMPT}], "tools": [bash, editor]}, "id")
    assert reply.tool_calls[0].name == "str_replace_based_edit_tool"
    args = json.loads(reply.tool_calls[0].arguments)
    assert args["command"] == "create" and args["path"] == "hello.txt" and args["file_text"] == "Hello, world!\n"
    reply = respond({"messages": [{"role": "user", "content": "Show me notes.md"}], "tools": [editor]}, "id")
    assert json.loads(reply.tool_calls[0].arguments)["command"] == "view"


def test_a_todo_writer_is_no_file_writer() -> None:
    todo = tool("todowrite", {"todos": {"type": "array", "items": {"type": "string"}}}, ["todos"])
    bash = tool("bash", {"command": {"type": "string"}}, ["command"])
    reply = respond({"messages": [{"role": "user", "content": PROMPT}], "tools": [todo, bash]}, "id")
    assert [c.name for c in reply.tool_calls] == ["bash"]


# -- over HTTP: what Codex sees on /v1/responses --------------------------------------------------
@pytest.fixture
def client() -> TestClient:
    return TestClient(create_app(MockOptions(chunk_delay_ms=0)))


def test_custom_tool_call_streamed_and_not(client: TestClient) -> None:
    raw = client.post("/v1/responses", json=responses_request(CODEX_FREEFORM, stream=True)).content
    evs = events(raw)
    kinds = [e["type"] for e in evs]
    assert "response.custom_tool_call_input.delta" in kinds and "response.custom_tool_call_input.done" in kinds
    assert "response.function_call_arguments.delta" not in kinds
    deltas = "".join(e["delta"] for e in evs if e["type"] == "response.custom_tool_call_input.delta")
    assert deltas == PATCH
    done = next(e for e in evs if e["type"] == "response.output_item.done")["item"]
    assert done["type"] == "custom_tool_call" and done["name"] == "apply_patch" and done["input"] == PATCH
    assert done["id"].startswith("ctc_") and done["call_id"].startswith("call_")
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    body = client.post("/v1/responses", json=responses_request(CODEX_FREEFORM)).json()
    assert [(o["type"], o["input"]) for o in body["output"]] == [("custom_tool_call", PATCH)]


@pytest.mark.parametrize(
    ("tools", "call", "output"),
    [
        (
            CODEX_FREEFORM,
            {"type": "custom_tool_call", "call_id": "call_1", "name": "apply_patch", "input": PATCH},
            {
                "type": "custom_tool_call_output",
                "call_id": "call_1",
                "output": "Success. Updated the following files:\nA hello.txt\n",
            },
        ),
        (
            CODEX_UNIFIED,
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "exec_command",
                "arguments": json.dumps({"cmd": "printf 'Hello, world!\\n' > hello.txt"}),
            },
            {
                "type": "function_call_output",
                "call_id": "call_1",
                "output": "Process exited with code 0\nOutput:\n",
            },
        ),
    ],
)
def test_after_the_tool_result_codex_gets_a_closing_answer(
    client: TestClient, tools: list[dict], call: dict, output: dict
) -> None:
    req = responses_request(tools)
    req["input"] += [call, output]
    body = client.post("/v1/responses", json=req).json()
    assert [o["type"] for o in body["output"]] == ["message"]
    text = body["output"][0]["content"][0]["text"]
    assert text == "Done. I created hello.txt with the requested content."


def test_function_call_for_exec_command_over_http(client: TestClient) -> None:
    body = client.post("/v1/responses", json=responses_request(CODEX_UNIFIED)).json()
    (item,) = body["output"]
    assert item["type"] == "function_call" and item["name"] == "exec_command"
    assert json.loads(item["arguments"]) == {"cmd": "printf 'Hello, world!\\n' > hello.txt"}
