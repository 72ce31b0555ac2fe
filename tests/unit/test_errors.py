"""tapfix's own errors, each in the shape of the surface it answers on (proxy/errors.py, issue 31 item 15).

Table tests over every answer function and every surface: Messages gets Anthropic's
`{"type": "error", "error": {"type", "message"}}` typed by Anthropic's own words, every other surface
OpenAI's `{"error": {"message", "type", "param", "code"}}`; the `error` a LocalAnswer carries is exactly
the object inside its body (what the capture's `error` column holds)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from tapfix.proxy import errors
from tapfix.proxy.errors import LocalAnswer
from tapfix.proxy.surfaces import anthropic_type

SURFACES = ["chat", "completions", "responses", "messages", None]
# (function, its arguments after the surface, status, Anthropic type, OpenAI type, OpenAI code)
BAD = "invalid_request_error"
ANSWERS: list[tuple[Callable[..., LocalAnswer], tuple, int, str, str, str | None]] = [
    (errors.request_error, (400, "bad", "invalid_body"), 400, BAD, BAD, "invalid_body"),
    (errors.request_error, (404, "no", "model_not_found", "model"), 404, "not_found_error", BAD, "model_not_found"),
    (errors.request_error, (413, "big", "request_too_large"), 413, "request_too_large", BAD, "request_too_large"),
    (errors.internal_error, ("broke",), 500, "api_error", "tapfix_error", "internal"),
    (errors.unauthorized, ("who are you",), 401, "authentication_error", BAD, "invalid_api_key"),
    (errors.upstream_unreachable, ("upstream down",), 502, "api_error", "upstream_unreachable", None),
    (errors.shutting_down, (), 503, "overloaded_error", "server_error", "proxy_shutdown"),
]


@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize(("make", "args", "status", "anthropic", "openai", "code"), ANSWERS)
def test_every_answer_in_its_surfaces_shape(make, args, status, anthropic, openai, code, surface) -> None:
    answer = make(surface, *args)
    body = json.loads(answer.body)
    assert answer.status == status
    if surface == "messages":
        assert body == {"type": "error", "error": answer.error}
        assert set(answer.error) == {"type", "message"} and answer.error["type"] == anthropic
    else:
        assert body == {"error": answer.error}
        assert answer.error["type"] == openai and answer.error["code"] == code
        assert set(answer.error) == {"message", "type", "param", "code"}
    assert isinstance(answer.error["message"], str) and answer.error["message"]
    assert json.loads(answer.error_text()) == answer.error


def test_anthropic_types_follow_anthropics_status_table() -> None:
    assert [anthropic_type(s) for s in (400, 401, 403, 404, 409, 413, 422, 429)] == [
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "invalid_request_error",
        "request_too_large",
        "invalid_request_error",
        "rate_limit_error",
    ]
    assert [anthropic_type(s) for s in (500, 502, 503, 504, 529)] == [
        "api_error",
        "api_error",
        "overloaded_error",
        "api_error",
        "overloaded_error",
    ]


@pytest.mark.parametrize("surface", SURFACES)
def test_a_lone_surrogate_in_the_message_is_carried(surface) -> None:
    """A model name may hold a lone surrogate escape (legal JSON): the body and the recorded text carry it."""
    answer = errors.request_error(surface, 404, "model '\ud83dx' is not served here", "model_not_found")
    assert "\ud83d" in json.loads(answer.body)["error"]["message"]
    assert json.loads(answer.error_text()) == answer.error
