"""Answers the addons make themselves (health, the models listing, tapfix's own errors): one JSON response builder."""

from __future__ import annotations

from collections.abc import Mapping

from mitmproxy import http


def json_response(
    status: int, body: bytes, capture_id: str | None = None, headers: Mapping[str, str] | None = None
) -> http.Response:
    """`body` is already JSON (see `tapfix.proxy.errors` for the error bodies); `capture_id` names the capture."""
    fields = {"content-type": "application/json"}
    if capture_id:
        fields["x-tapfix-capture-id"] = capture_id
    fields.update(headers or {})
    return http.Response.make(status, body, fields)
