"""Token check for a proxy that listens beyond loopback: first in the addon chain.

Coding agents let their user set only a base URL and an API key, so the key *is* the token: a
client sends `Authorization: Bearer TOKEN` or `x-api-key: TOKEN`. tapfix compares it in constant
time, strips it (the upstream never sees tapfix's token; the request policy adds the upstream's
own key from `api_key_env`), and answers anything else with the 401 body OpenAI-compatible clients
recognise as a bad key (`invalid_api_key`), so agents stop instead of retrying.

Rejected requests are neither forwarded nor recorded: an unauthenticated caller can't fill the disk.
In regular (forward-proxy) mode a CONNECT is let through only to the intercepted hosts (whose
requests are then checked here) or with `Proxy-Authorization` carrying the token, so the proxy is
never an open relay.
"""

from __future__ import annotations

import base64
import hmac
import logging
import time

from mitmproxy import http
from tapfix.addons.runner.http import json_response
from tapfix.addons.runner.runtime import Runtime
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses
from tapfix.proxy.errors import unauthorized
from tapfix.proxy.surfaces import surface_for

log = logging.getLogger("tapfix")
TOKEN_ENV = "TAPFIX_TOKEN"
_KEY_HEADERS = ("x-api-key", "api-key")
_LOG_EVERY_S = 10.0


def _same(given: str, token: bytes) -> bool:
    return hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"), token)


def _bearer(value: str) -> str | None:
    scheme, _, rest = value.strip().partition(" ")
    return rest.strip() if scheme.lower() == "bearer" and rest.strip() else None


def _proxy_secret(value: str) -> str | None:
    """`Proxy-Authorization: Bearer TOKEN` or `Basic base64(any:TOKEN)` (what `HTTPS_PROXY=http://u:TOKEN@…` sends)."""
    bearer = _bearer(value)
    if bearer is not None:
        return bearer
    scheme, _, rest = value.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(rest.strip(), validate=True).decode("utf-8", "replace")
    except ValueError:
        return None
    return decoded.partition(":")[2]


class TokenAuth:
    """Checks the token on every request (including `/tapfix/health`, which names the upstreams)."""

    def __init__(self, runtime: Runtime, token: str) -> None:
        if not token or len(token) < 8:
            raise ValueError("the token must be at least 8 characters")
        self.runtime = runtime
        self._token = token.encode("utf-8")
        self.rejected = 0
        self._logged_at = 0.0

    def authorized(self, request: http.Request) -> bool:
        """True when the token is present; strips every header that carried it."""
        ok = False
        auth = request.headers.get("authorization")
        if auth is not None and (given := _bearer(auth)) is not None and _same(given, self._token):
            request.headers.pop("authorization", None)
            ok = True
        for name in _KEY_HEADERS:
            value = request.headers.get(name)
            if value is not None and _same(value, self._token):
                request.headers.pop(name, None)
                ok = True
        return ok

    def http_connect(self, flow: http.HTTPFlow) -> None:
        value = flow.request.headers.get("proxy-authorization")
        if value is not None and (secret := _proxy_secret(value)) is not None and _same(secret, self._token):
            flow.request.headers.pop("proxy-authorization", None)
            return
        if flow.request.pretty_host in self.runtime.intercept_hosts:
            return  # requests inside the tunnel are checked one by one
        self._reject(
            flow,
            407,
            "tapfix: proxy authentication required (the tapfix token as proxy password)",
            {"proxy-authenticate": 'Basic realm="tapfix"'},
        )

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        """Headers only, as mitmproxy's own `proxyauth`: no addon sees the body of a rejected request."""
        if flow.response or flow.error or not flow.live:
            return
        if self.authorized(flow.request):
            return
        self._reject(
            flow,
            401,
            "tapfix: invalid or missing API key; this proxy needs its token as the API key "
            "(Authorization: Bearer TOKEN or x-api-key: TOKEN)",
            {"www-authenticate": 'Bearer realm="tapfix"'},
        )

    def _reject(self, flow: http.HTTPFlow, status: int, message: str, extra: dict[str, str]) -> None:
        self.rejected += 1
        now = time.monotonic()
        if now - self._logged_at >= _LOG_EVERY_S:  # at most one line per interval: no log flooding
            self._logged_at = now
            peer = flow.client_conn.peername[0] if flow.client_conn.peername else "?"
            log.warning("rejected a request without the tapfix token from %s (%d so far)", peer, self.rejected)
        answer = unauthorized(surface_for(flow.request.path), message, status)
        flow.response = json_response(answer.status, answer.body, headers=extra)
