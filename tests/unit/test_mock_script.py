"""The default scripted model: tool choice and arguments for real agents' schemas, probes' skills."""

from __future__ import annotations

import base64
import json

import jsonschema
import pytest
from tapfix.proxy.mock.agent_script import Knobs, effort_level, respond
from tapfix.proxy.mock.vision import encode_png

from tests.support.builders import tool

SCHEMA_2020 = "https://json-schema.org/draft/2020-12/schema"


def fn(name: str, params: dict, **extra: object) -> dict:
    """A client's tool as these tests' clients describe it: "<name> tool"."""
    return tool(name, description=f"{name} tool", parameters=params, **extra)


def _opencode(name: str, props: dict, required: list[str], **more: object) -> dict:
    """opencode's tool shape: JSON Schema 2020-12, named by `$schema`."""
    return fn(name, {"$schema": SCHEMA_2020, "type": "object", "properties": props, "required": required, **more})


# Shapes as clients.md describes them: opencode (`$schema`, filePath), omp (`i` required,
# additionalProperties false), pi (path, strict false).
OPENCODE_TOOLS = [
    _opencode(
        "bash",
        {
            "command": {"type": "string"},
            "timeout": {"type": "number", "description": "ms"},
            "description": {"type": "string"},
        },
        ["command", "description"],
        additionalProperties=False,
    ),
    _opencode(
        "edit",
        {
            "filePath": {"type": "string"},
            "oldString": {"type": "string"},
            "newString": {"type": "string"},
            "replaceAll": {"type": "boolean"},
        },
        ["filePath", "oldString", "newString"],
    ),
    _opencode("glob", {"pattern": {"type": "string"}, "path": {"type": "string"}}, ["pattern"]),
    _opencode(
        "read",
        {"filePath": {"type": "string"}, "offset": {"type": "number"}, "limit": {"type": "number"}},
        ["filePath"],
    ),
    _opencode(
        "todowrite",
        {
            "todos": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "content": {"type": "string"},
                        "status": {"type": "string"},
                        "priority": {"type": "string"},
                        "id": {"type": "string"},
                    },
                    "required": ["content", "status", "priority", "id"],
                },
            }
        },
        ["todos"],
    ),
    _opencode(
        "webfetch",
        {
            "url": {"type": "string"},
            "format": {"type": "string", "enum": ["text", "markdown", "html"]},
            "timeout": {"type": "number"},
        },
        ["url", "format"],
    ),
    _opencode("write", {"content": {"type": "string"}, "filePath": {"type": "string"}}, ["content", "filePath"]),
]


def _omp(name: str, props: dict, required: list[str]) -> dict:
    return fn(
        name,
        {
            "type": "object",
            "properties": {"i": {"type": "string", "description": "intent"}, **props},
            "required": ["i", *required],
            "additionalProperties": False,
        },
    )


OMP_TOOLS = [
    _omp("read", {"path": {"type": "string"}, "offset": {"type": "integer", "minimum": 1}}, ["path"]),
    _omp(
        "bash",
        {
            "command": {"type": "string"},
            "timeout": {"type": "integer", "minimum": 1, "maximum": 600},
            "cwd": {"type": "string"},
        },
        ["command"],
    ),
    _omp(
        "edit",
        {
            "path": {"type": "string"},
            "edits": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {"oldText": {"type": "string"}, "newText": {"type": "string"}},
                    "required": ["oldText", "newText"],
                    "additionalProperties": False,
                },
            },
        },
        ["path", "edits"],
    ),
    fn(
        "eval",
        {
            "type": "object",
            "properties": {"code": {"type": "string"}},
            "required": ["code"],
            "additionalProperties": False,
        },
    ),
    _omp(
        "todo",
        {
            "ops": {
                "type": "array",
                "items": {
                    "anyOf": [
                        {"type": "null"},
                        {
                            "type": "object",
                            "properties": {"op": {"type": "string", "enum": ["add", "done"]}},
                            "required": ["op"],
                        },
                    ]
                },
            }
        },
        ["ops"],
    ),
    _omp("write", {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]),
]


def _pi(name: str, props: dict, required: list[str]) -> dict:
    """pi's tool shape: plain JSON Schema, not strict."""
    return fn(name, {"type": "object", "properties": props, "required": required}, strict=False)


PI_TOOLS = [
    _pi("read", {"path": {"type": "string"}, "limit": {"type": "number"}}, ["path"]),
    _pi("bash", {"command": {"type": "string"}, "timeout": {"type": "number"}}, ["command"]),
    _pi(
        "edit",
        {"path": {"type": "string"}, "oldText": {"type": "string"}, "newText": {"type": "string"}},
        ["path", "oldText", "newText"],
    ),
    _pi("write", {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]),
]

AGENTS = {"opencode": OPENCODE_TOOLS, "omp": OMP_TOOLS, "pi": PI_TOOLS}
OPENCODE_PROMPT = '"Create a file hello.txt containing a greeting"'  # opencode wraps prompts in quotes
OMP_CONTENT = [
    {"type": "text", "text": "<system-reminder>Today is 2026-05-01, cwd /tmp/w</system-reminder>"},
    {"type": "text", "text": "Create a file hello.txt containing a greeting"},
]


def request(
    tools: list[dict],
    prompt: object = "Create a file hello.txt containing a greeting",
    **extra: object,
) -> dict:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": prompt},
        ],
        "tools": tools,
        **extra,
    }


def schema_of(tools: list[dict], name: str) -> dict:
    return next(t["function"]["parameters"] for t in tools if t["function"]["name"] == name)


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize(
    ("prompt", "tool"),
    [
        ("Create a file hello.txt containing a greeting", "write"),
        ("Please show me the contents of notes.md", "read"),
        ("Run `ls -la` in the project", "bash"),
    ],
)
def test_calls_the_fitting_tool_with_schema_valid_arguments(agent: str, prompt: str, tool: str) -> None:
    tools = AGENTS[agent]
    reply = respond(request(tools, prompt), "chatcmpl-tool-x")
    assert [c.name for c in reply.tool_calls] == [tool]
    assert reply.finish_reason == "tool_calls"
    args = json.loads(reply.tool_calls[0].arguments)
    jsonschema.validate(args, schema_of(tools, tool))
    if agent == "omp":
        assert args["i"].strip()


@pytest.mark.parametrize(
    ("agent", "prompt", "path_key"),
    [
        ("opencode", OPENCODE_PROMPT, "filePath"),
        ("omp", OMP_CONTENT, "path"),
        ("pi", [{"type": "text", "text": "Create a file hello.txt containing a greeting"}], "path"),
    ],
)
def test_write_arguments_name_the_file_and_a_greeting(agent: str, prompt: object, path_key: str) -> None:
    reply = respond(request(AGENTS[agent], prompt), "id")
    args = json.loads(reply.tool_calls[0].arguments)
    assert args[path_key] == "hello.txt"
    assert args["content"] == "Hello, world!\n"


def test_quoted_content_and_command_are_taken_from_the_prompt() -> None:
    reply = respond(request(PI_TOOLS, 'Write src/app.py with the text "print(42)"'), "id")
    assert json.loads(reply.tool_calls[0].arguments) == {"path": "src/app.py", "content": "print(42)\n"}
    reply = respond(request(PI_TOOLS, "Run `echo hi` please"), "id")
    assert json.loads(reply.tool_calls[0].arguments) == {"command": "echo hi"}


def test_after_a_tool_result_it_answers_in_text() -> None:
    req = request(PI_TOOLS)
    req["messages"] += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {
                        "name": "write",
                        "arguments": '{"path":"hello.txt","content":"Hello, world!\\n"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "Successfully wrote 14 bytes to hello.txt"},
    ]
    reply = respond(req, "id")
    assert reply.tool_calls == []
    assert reply.finish_reason == "stop"
    assert "hello.txt" in reply.content


def test_plain_chat_with_tools_offered_but_no_fitting_intent_answers_in_text() -> None:
    reply = respond(request(PI_TOOLS, "Hello there"), "id")
    assert reply.tool_calls == [] and reply.content == "Hello! How can I help you today?"


def test_tool_choice_required_and_named_force_a_call() -> None:
    required = respond(request(PI_TOOLS, "Hello there", tool_choice="required"), "id")
    assert len(required.tool_calls) == 1 and required.finish_reason == "tool_calls"
    named = respond(
        request(PI_TOOLS, "Hello there", tool_choice={"type": "function", "function": {"name": "bash"}}), "id"
    )
    assert [c.name for c in named.tool_calls] == ["bash"]
    assert named.finish_reason == "stop"  # vLLM: a named tool choice finishes with "stop"
    none = respond(request(PI_TOOLS, "Create a file a.txt", tool_choice="none"), "id")
    assert none.tool_calls == []


def test_reasoning_grows_with_effort() -> None:
    lengths = [
        len(respond(request([], "Hi", reasoning_effort=e), "id").reasoning) for e in ("none", "low", "medium", "high")
    ]
    assert lengths[0] == 0
    assert lengths[0] < lengths[1] < lengths[2] < lengths[3]


@pytest.mark.parametrize(
    ("extra", "level"),
    [
        ({}, 0),
        ({"reasoning_effort": "minimal"}, 1),
        ({"reasoning_effort": "xhigh"}, 5),
        ({"chat_template_kwargs": {"enable_thinking": True}}, 3),
        ({"enable_thinking": True}, 3),
        ({"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": False}}, 0),
        ({"reasoning": {"effort": "low"}}, 2),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, 3),
    ],
)
def test_effort_dialects(extra: dict, level: int) -> None:
    assert effort_level(extra) == level


def test_ignore_effort_keeps_reasoning_constant() -> None:
    knobs = Knobs(ignore_effort=True)
    texts = {respond(request([], "Hi", reasoning_effort=e), "id", knobs).reasoning for e in ("none", "low", "high")}
    assert len(texts) == 1 and texts.pop()


FILLER = "The quick brown fox jumps over the lazy dog. " * 400


def test_needle_recall_and_forgetting() -> None:
    prompt = FILLER + '\nThe passphrase is "cobalt-harbor-42".\n' + FILLER + "\nWhat is the passphrase?"
    assert respond(request([], prompt), "id").content == 'The passphrase is "cobalt-harbor-42".'
    forgot = respond(request([], prompt), "id", Knobs(forget_needle=True)).content
    assert "cobalt-harbor-42" not in forgot


def image_request(rgb: tuple[int, int, int]) -> dict:
    url = "data:image/png;base64," + base64.b64encode(encode_png(8, 8, rgb)).decode()
    content = [
        {"type": "text", "text": "What colour is this image? Answer with one word."},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    return {"model": "m", "messages": [{"role": "user", "content": content}]}


@pytest.mark.parametrize(
    ("rgb", "name"),
    [
        ((255, 0, 0), "red"),
        ((0, 200, 0), "green"),
        ((0, 0, 255), "blue"),
        ((255, 255, 0), "yellow"),
        ((255, 255, 255), "white"),
        ((0, 0, 0), "black"),
    ],
)
def test_vision_names_the_dominant_colour(rgb: tuple[int, int, int], name: str) -> None:
    assert name in respond(image_request(rgb), "id").content.split(" ")[-1]


def test_ignore_images_never_names_the_colour() -> None:
    answer = respond(image_request((255, 0, 0)), "id", Knobs(ignore_images=True)).content
    assert "red" not in answer


def test_undecodable_image_is_not_guessed() -> None:
    req = image_request((255, 0, 0))
    req["messages"][0]["content"][1]["image_url"]["url"] = "data:image/png;base64,AAAA"
    answer = respond(req, "id").content
    assert not any(c in answer for c in ("red", "green", "blue", "white", "black"))


@pytest.mark.parametrize(
    ("prompt", "answer"),
    [
        ("What is 2 + 3?", "2 + 3 = 5."),
        ("Count to 5", "1, 2, 3, 4, 5."),
        ("What is the capital of France?", "The capital of France is Paris."),
        ('Reply with exactly "pong"', "pong"),
        ("hello", "Hello! How can I help you today?"),
    ],
)
def test_canned_answers(prompt: str, answer: str) -> None:
    assert respond(request([], prompt), "id").content == answer


def test_generic_answer_is_plain_english() -> None:
    text = respond(request([], "Explain why the sky looks blue in one paragraph"), "id").content
    assert text.isascii() and len(text.split()) > 10
