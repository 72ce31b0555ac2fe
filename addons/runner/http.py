"""Answers the addons make themselves (health, the models listing, tapfix's own errors): one JSON response
builder, and one way to answer a request locally so its capture says tapfix answered it."""

from __future__ import annotations

from collections.abc import Mapping

from mitmproxy import http
from tapfix.proxy.errors import LocalAnswer
from tapfix.proxy.exchange import Exchange


def json_response(
    status: int, body: bytes, capture_id: str | None = None, headers: Mapping[str, str] | None = None
) -> http.Response:
    """`body` is already JSON (see `tapfix.proxy.errors` for the error bodies); `capture_id` names the capture."""
    fields = {"content-type": "application/json"}
    if capture_id:
        fields["x-tapfix-capture-id"] = capture_id
    fields.update(headers or {})
    return http.Response.make(status, body, fields)


def answer_locally(
    flow: http.HTTPFlow,
    ex: Exchange | None,
    answer: LocalAnswer | tuple[int, bytes],
    headers: Mapping[str, str] | None = None,
) -> http.Response:
    """Answer `flow` without forwarding it: an error (`LocalAnswer`, in the request's surface's shape) or
    (status, body). Its exchange, when recorded, is tapfix's answer (`Exchange.answered_by_tapfix`): never
    the upstream's."""
    if isinstance(answer, LocalAnswer):
        status, body, error = answer.status, answer.body, answer.error_text()
    else:
        (status, body), error = answer, None
    flow.response = response = json_response(status, body, ex.id if ex is not None else None, headers)
    if ex is not None:
        ex.answered_by_tapfix(error)
    return response
