"""What keeps captured prompts (secrets, code, customer data) inside the browser that should see them.

- Every response carries a strict Content-Security-Policy: no inline script or style, scripts and
  styles from 'self' only, so even a template bug that let captured HTML through could not run it.
- Bound to loopback without a token, requests must name a loopback Host: a web page that rebinds its
  DNS name to 127.0.0.1 can't read the captures.
- With a token (required to bind elsewhere), each request needs `Authorization: Bearer`, the cookie
  set by one visit with `?token=`, or that query parameter (then redirected to the URL without it).
"""

from __future__ import annotations

import hashlib
import hmac
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse, RedirectResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from tapfix.proxy.net import is_loopback

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self';"
    " base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]
COOKIE = "tapfix_browse"


def _host_name(host_header: str) -> str:
    if host_header.startswith("["):
        return host_header[1:].partition("]")[0]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in message.get("headers", [])}
                message["headers"] = list(message.get("headers", [])) + [h for h in HEADERS if h[0] not in names]
            await send(message)

        await self.app(scope, receive, send_with_headers)


class HostGuard:
    """Loopback only, no token: refuse Host headers that aren't loopback (DNS rebinding).

    Judged without resolving: a rebound name resolves to 127.0.0.1, and that is the attack.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = Headers(scope=scope).get("host", "")
            if not is_loopback(_host_name(host), resolve=False):
                response = PlainTextResponse(
                    f"tapfix browse answers only to loopback host names, not {host!r}", status_code=421
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class TokenGate:
    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token
        self.cookie_value = hmac.new(token.encode(), b"tapfix-browse-cookie", hashlib.sha256).hexdigest()

    def _ok(self, candidate: str | None, expected: str) -> bool:
        return candidate is not None and hmac.compare_digest(candidate.encode(), expected.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer " and self._ok(auth[7:].strip(), self.token):
            await self.app(scope, receive, send)
            return
        cookies = SimpleCookie()
        try:
            cookies.load(headers.get("cookie", ""))
        except Exception:  # noqa: BLE001 - a malformed cookie header is just no cookie
            cookies = SimpleCookie()
        morsel = cookies.get(COOKIE)
        if morsel is not None and self._ok(morsel.value, self.cookie_value):
            await self.app(scope, receive, send)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = [v for k, v in query if k == "token"]
        if given and self._ok(given[0], self.token):
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            # ASGI's raw_path has no query string, but some servers (and starlette's TestClient before
            # 0.41) put it there: cut it, or the redirect would carry the token on.
            raw = (scope.get("raw_path") or b"/").decode("latin-1").split("?", 1)[0]
            path = "/" + raw.lstrip("/")  # never //host: no open redirect
            redirect = RedirectResponse(path + (f"?{rest}" if rest else ""), status_code=303)
            redirect.set_cookie(COOKIE, self.cookie_value, httponly=True, samesite="strict", path="/")
            await redirect(scope, receive, send)
            return
        response = PlainTextResponse(
            "tapfix browse needs its token: open the URL with ?token=..., or send 'Authorization: Bearer ...'",
            status_code=401,
            headers={"www-authenticate": "Bearer"},
        )
        await response(scope, receive, send)
