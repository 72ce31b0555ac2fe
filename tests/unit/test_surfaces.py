"""The surface objects: which one a path names, and what each says about its wire (issue 33)."""

from __future__ import annotations

import pytest
from tapfix.proxy.surfaces import (
    CHAT,
    COMPLETIONS,
    MESSAGES,
    OTHER,
    RESPONSES,
    SURFACES,
    PerSurface,
    api_surface,
    evented_stream,
    surface_for,
)
from tapfix.proxy.toolcalls import body_repair_for, stage_for


@pytest.mark.parametrize(
    ("path", "surface"),
    [
        ("/v1/chat/completions", CHAT),
        ("/chat/completions?x=1", CHAT),
        ("/openai/v1/completions", COMPLETIONS),
        ("/v1/responses/", RESPONSES),
        ("/v1/messages", MESSAGES),
        ("/v1/models", OTHER),
        ("/v1/embeddings", OTHER),
    ],
)
def test_a_path_names_its_surface(path, surface):
    assert api_surface(surface_for(path)) is surface


def test_each_surface_is_found_by_its_name():
    assert [api_surface(s.name) for s in SURFACES] == list(SURFACES)
    assert api_surface(None) is OTHER and api_surface("other") is OTHER


def test_the_path_decides_the_stream_framing_before_the_bytes():
    assert evented_stream("/v1/chat/completions", b"event: response.created\n") is None
    assert evented_stream("/v1/messages", b"data: {}\n") == "messages"
    assert evented_stream(None, b"event: message_start\n") == "messages"


@pytest.mark.parametrize(
    ("surface", "engine", "field"),
    [
        (CHAT, "openai", "max_completion_tokens"),
        (CHAT, "vllm", "max_tokens"),
        (COMPLETIONS, "openai", "max_tokens"),
        (RESPONSES, None, "max_output_tokens"),
        (MESSAGES, "anthropic", "max_tokens"),
        (OTHER, None, "max_tokens"),
    ],
)
def test_the_budget_field_a_surface_writes(surface, engine, field):
    assert surface.max_tokens_field(engine) == field


def test_error_bodies_are_in_each_surfaces_shape():
    error = MESSAGES.error_object(404, "no such model", "invalid_request_error", "model_not_found")
    assert MESSAGES.error_body(error) == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "no such model"},
    }
    error = CHAT.error_object(404, "no such model", "invalid_request_error", "model_not_found")
    assert CHAT.error_body(error) == {
        "error": {"message": "no such model", "type": "invalid_request_error", "param": None, "code": "model_not_found"}
    }
    assert RESPONSES.overflow_param == "input" and CHAT.overflow_param == "messages"


def test_only_legacy_completions_is_one_prompt():
    assert [s.name for s in (*SURFACES, OTHER) if s.prompt_only] == ["completions"]


def test_the_tool_call_repairs_cover_the_surfaces_with_turns():
    for surface in SURFACES:
        has = surface.turns
        assert (stage_for(surface.name, [], "error", "c") is not None) == has, surface
        assert (body_repair_for(surface.name) is not None) == has, surface


def test_a_per_surface_table_looks_up_by_object_or_name():
    table = PerSurface({RESPONSES: 1, MESSAGES: 2})
    assert table.get(RESPONSES) == 1 and table["messages"] == 2 and table.get("chat") is None
    assert table.get(None) is None and table.surfaces() == (RESPONSES, MESSAGES)
    with pytest.raises(KeyError):
        table[CHAT]
