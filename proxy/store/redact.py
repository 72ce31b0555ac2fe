"""Secrets never reach the store, and never leave with telemetry: one home for what counts as a secret.

The store redacts headers (a credential header's whole value; elsewhere key-looking values) and URL
query keys; bodies it keeps verbatim (they are the record). What leaves the host as span content
(`redact_content`) is held to the same rule: the very values the store hides in this exchange's headers,
wherever they appear, plus what reads as a credential in text: key-looking values, `Bearer`/`Basic`
credentials, secret-named fields (`"api_key": "…"`, `password=…`, `Authorization: …`) and secret URL
query keys.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

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
    return REDACTED if _secret_name(name) else redact_text(value)


@lru_cache(maxsize=1024)
def _secret_name(name: str) -> bool:
    """Remembered by name (a name is no secret, and the same few dozen come on every exchange: the regex
    for each was most of the capture writer's ~10 µs per header list, three lists per exchange)."""
    lower = name.lower()
    return lower in SECRET_HEADERS or (bool(_SECRET_NAME.search(lower)) and lower not in _NOT_SECRET)


_NOT_SECRET = frozenset({"x-session-id", "x-session-affinity", "x-tapfix-capture-id", "x-stainless-retry-count"})


def redact_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, redact_header(k, v)) for k, v in headers]


def redact_url(url: str) -> str:
    return _URL_SECRET.sub(lambda m: m.group(1) + REDACTED, url)


def redact_text(text: str) -> str:
    if "-" not in text and "_" not in text:
        return text
    return _KEYLIKE_VALUE.sub(REDACTED, text)


# `Authorization: Bearer <credential>` and the like, in text.
_SCHEME_CREDENTIAL = re.compile(r"\b(Bearer|Basic|Token)(\s+)[A-Za-z0-9._~+/=-]{8,}", re.I)
# A secret-named field and its value: `"api_key": "v"` (JSON, quotes possibly escaped), `password=v`,
# `x-api-key: v`. The name is a credential header's, or says key/token/secret/password.
_NAMED = (
    r"(?:[\w-]*(?:api[_-]?key|access[_-]?token|auth[_-]?token|secret|password|passwd)[\w-]*"
    r"|authorization|proxy-authorization|x-api-key|api-key|cookie|x-goog-api-key|x-auth-token)"
)
_NAMED_VALUE = re.compile(
    r"((?:\\?[\"'])?" + _NAMED + r"(?:\\?[\"'])?\s*[:=]\s*(?:\\?[\"'])?)([^\s\"'\\,;&}]{4,})", re.I
)


_NOT_A_VALUE = frozenset({REDACTED, "Bearer", "bearer", "Basic", "basic", "Token", "token"})


def secret_values(headers: Iterable[tuple[str, str]]) -> list[str]:
    """The values the store hides whole in these headers (and a `Bearer` credential's bare token), longest
    first: where one of them shows up in content, it is the same secret."""
    found: set[str] = set()
    for name, value in headers:
        if redact_header(name, value) != REDACTED or len(value) < 8:
            continue
        found.add(value)
        scheme, _, credential = value.partition(" ")
        if credential and scheme.lower() in ("bearer", "basic", "token") and len(credential) >= 8:
            found.add(credential.strip())
    return sorted(found, key=len, reverse=True)


def redact_content(text: str, secrets: Iterable[str] = ()) -> str:
    """Prompts, answers and a change's before/after as they leave in span content: every secret the
    store would hide (see the module's docstring) replaced by `[redacted]`."""
    for secret in secrets:
        if secret and secret in text:
            text = text.replace(secret, REDACTED)
    text = _SCHEME_CREDENTIAL.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    text = _NAMED_VALUE.sub(lambda m: m.group(0) if m.group(2) in _NOT_A_VALUE else m.group(1) + REDACTED, text)
    return redact_url(redact_text(text))
