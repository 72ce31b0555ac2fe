"""A request that went out on a kept-alive upstream connection the upstream had just closed is sent again,
once, on a new connection.

Engines close idle keep-alive connections (llama-server after 5 s, others after an error answer), and the
close can cross tapfix's next request on the wire: mitmproxy reuses the connection before it has read the
upstream's FIN, the request goes out, and no answer comes. The close then says nothing about the request
(HTTP clients resend in this case: httpcore, urllib3, Go's transport), while the client's own connection to
tapfix is healthy, so a 502 "server closed connection" would be tapfix's doing. Only a reused connection
closed before any answer byte qualifies; a new connection the upstream closes unanswered is its answer.

The answer of the new connection is read whole and sent in place of mitmproxy's error page (as the route
fallback's is: mitmproxy has sent no head and can send only one), through the stream owner's body stages;
the capture records the resend as a change. Runs after the route fallback (a route's missing head is its
case) and before the stream owner (whose `error` hook sends the reply).
"""

from __future__ import annotations

import logging

import httpx
from mitmproxy import http
from tapfix.addons.runner.reset_tail import REPLY_AFTER_ERROR
from tapfix.addons.runner.runtime import Runtime, ended_by_attempts, exchange_of
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses
from tapfix.addons.runner.whole_answer import answered_whole, fetch_whole, upstream_client
from tapfix.proxy.changes import Change

log = logging.getLogger("tapfix")
RESENT = "resent_on_new_connection"  # ex.extra: at most once per request
REASON = "the upstream closed the reused connection the request went out on, unanswered: sent again on a new one"


def closed_a_reused_connection(flow: http.HTTPFlow) -> bool:
    """No answer byte came, on a connection opened before this request arrived, and the upstream's side
    ended it (not the client, not a timeout of tapfix's)."""
    server, error = flow.server_conn, flow.error
    opened, arrived = server.timestamp_start, flow.request.timestamp_start
    if flow.response is not None or error is None or opened is None or opened >= arrived:
        return False
    message = error.msg.lower()
    return "server" in message and ("closed" in message or "disconnect" in message or "reset" in message)


class ResendOnStaleConnection:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._client: httpx.AsyncClient | None = None

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            settings = self.runtime.settings
            verify: bool | str = not settings.insecure
            if settings.upstream_ca is not None and verify:
                verify = str(settings.upstream_ca)
            self._client = upstream_client(settings.connect_timeout, verify)
        return self._client

    async def done(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def error(self, flow: http.HTTPFlow) -> None:
        ex = exchange_of(flow)
        if ex is None or ex.extra.get(RESENT) or not closed_a_reused_connection(flow):
            return
        ex.extra[RESENT] = True
        request = flow.request
        log.warning("capture %s: %s", ex.id, REASON)
        try:
            response = await fetch_whole(self.client(), request, request.url, request.raw_content)
        except httpx.HTTPError as e:
            log.warning("capture %s: sent again, and that failed too: %s", ex.id, e)
            return  # mitmproxy's error stands
        flow.response = response
        response.headers["connection"] = "close"  # the reply is sent in place of the error, then closed
        answered_whole(ex, response)
        ex.changes.append(Change("router", "resend", "connection", None, None, REASON))
        ex.extra[REPLY_AFTER_ERROR] = True
        ended_by_attempts(ex)  # the client's answer came whole from the new connection: no error of the exchange
