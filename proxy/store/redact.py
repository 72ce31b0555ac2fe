"""Secrets never reach the store: headers, URL query keys, key-looking values."""

from __future__ import annotations

import re
from collections.abc import Iterable

SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "api-key",
        "x-api-key",
        "cookie",
        "set-cookie",
        "x-goog-api-key",
        "openai-api-key",
        "anthropic-api-key",
        "x-auth-token",
        "x-access-token",
    }
)
_SECRET_NAME = re.compile(r"(key|token|secret|password|passwd|auth|session-?id-?secret)", re.I)
_KEYLIKE_VALUE = re.compile(r"\b(sk|pk|rk|sess|key|tok|ghp|gho|xox[abp]|hf)[-_][A-Za-z0-9_\-]{12,}")
_URL_SECRET = re.compile(r"([?&](?:key|api_key|api-key|apikey|token|access_token|auth|password|secret)=)[^&#\s]*", re.I)
REDACTED = "[redacted]"


def redact_header(name: str, value: str) -> str:
    lower = name.lower()
    if lower in SECRET_HEADERS or (_SECRET_NAME.search(lower) and lower not in _NOT_SECRET):
        return REDACTED
    return redact_text(value)


_NOT_SECRET = frozenset({"x-session-id", "x-session-affinity", "x-tapfix-capture-id", "x-stainless-retry-count"})


def redact_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, redact_header(k, v)) for k, v in headers]


def redact_url(url: str) -> str:
    return _URL_SECRET.sub(lambda m: m.group(1) + REDACTED, url)


def redact_text(text: str) -> str:
    if "-" not in text and "_" not in text:
        return text
    return _KEYLIKE_VALUE.sub(REDACTED, text)
