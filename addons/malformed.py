"""Malformed requests leave a record, flagged `malformed_request`, instead of nothing.

mitmproxy refuses them itself, with its HTML 400 (or by closing), before any `request` hook, so the
recorder never sees them. Two kinds:
- the head parsed, then the request was refused (a bad Content-Length or Transfer-Encoding, both at
  once, bad chunking): mitmproxy made a flow and runs the `error` hook; the record is an exchange
  with the head, mitmproxy's error and what the client got;
- the head did not parse: there is no flow, only the bytes addons/runner/raw_head.py kept on the
  connection; at `client_disconnected` they become a connection record (tag `connection`): the
  peer, the first 4 KiB as the request body, mitmproxy's message and its 400.
A request whose client went away before its body was complete is recorded the same way, flagged
`client_disconnected` instead.

With a token (a listen address beyond loopback) these records are written before anyone could be
authenticated, so each peer gets a budget of them (`PEER_BUDGET` a minute); the rest are only counted
(`malformed_unrecorded` in health), so a stranger can't fill the store with 4 KiB records.
"""

from __future__ import annotations

import time

from mitmproxy import connection, http
from mitmproxy.connection import ConnectionState
from mitmproxy.net.http import http1
from mitmproxy.proxy.layers.http import _http1
from tapfix.addons.runner.raw_head import REJECTED_ATTR, RejectedHead
from tapfix.addons.runner.runtime import META, Runtime, exchange_from_request, peer_of
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses
from tapfix.proxy.exchange import Exchange

FLAG = "malformed_request"
TAG = "connection"
PEER_BUDGET = 20  # records a minute per peer, with a token
BUDGET_WINDOW_S = 60.0


class PeerBudget:
    """At most `limit` records per peer in any `window` seconds (a sliding log; peers are few)."""

    def __init__(self, limit: int = PEER_BUDGET, window: float = BUDGET_WINDOW_S) -> None:
        self.limit = limit
        self.window = window
        self._seen: dict[str, list[float]] = {}

    def allow(self, peer: str, now: float) -> bool:
        recent = [t for t in self._seen.get(peer, ()) if now - t < self.window]
        if len(recent) >= self.limit:
            self._seen[peer] = recent
            return False
        recent.append(now)
        self._seen[peer] = recent
        if len(self._seen) > 4096:  # forget idle peers
            self._seen = {k: v for k, v in self._seen.items() if v and now - v[-1] < self.window}
        return True


class RecordMalformed:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.budget = PeerBudget()

    def error(self, flow: http.HTTPFlow) -> None:
        """A flow that errored before its `request` hook: mitmproxy refused the request itself."""
        if META in flow.metadata or flow.request is None or not self.runtime.intercepted(flow):
            return
        message = flow.error.msg if flow.error else "malformed request"
        ex = exchange_from_request(flow, self.runtime.settings.store_bodies)
        ex.error = message
        ex.flags.add("client_disconnected" if "peer closed connection" in message else FLAG)
        self._answered(ex, self._sent(flow.client_conn, message))
        self._submit(ex)

    def client_disconnected(self, client: connection.Client) -> None:
        """A head that did not parse: no flow, only what raw_head kept."""
        rejected: RejectedHead | None = getattr(client, REJECTED_ATTR, None)
        if rejected is None or rejected.message is None:
            return
        setattr(client, REJECTED_ATTR, None)
        ex = Exchange(
            client_addr=peer_of(client),
            request=rejected.data,
            store_bodies=self.runtime.settings.store_bodies,
            error=rejected.message,
        )
        ex.started_at = client.timestamp_start or time.time()
        ex.flags.add(FLAG)
        ex.tags.add(TAG)
        self._answered(ex, rejected.sent)
        self._submit(ex)

    @staticmethod
    def _sent(client: connection.Client, message: str) -> bytes:
        """What mitmproxy answered: the 400 read_headers sent (raw_head kept it), or the 400 its HTTP/1
        server sends next for a request refused by validation (the client is still writable then);
        after bad chunking it only closes."""
        rejected: RejectedHead | None = getattr(client, REJECTED_ATTR, None)
        if rejected is not None:
            setattr(client, REJECTED_ATTR, None)
            return rejected.sent
        if client.state & ConnectionState.CAN_WRITE:
            return _http1.make_error_response(400, message)
        return b""

    @staticmethod
    def _answered(ex: Exchange, sent: bytes) -> None:
        if not sent:
            return
        ex.answered_by_tapfix()  # mitmproxy's 400, in tapfix's process: no upstream saw the request
        head, _, body = sent.partition(b"\r\n\r\n")
        response = http1.read_response_head(head.split(b"\r\n"))
        ex.status = response.status_code
        ex.response_headers = list(response.headers.items(multi=True))
        ex.content_type = response.headers.get("content-type", "")
        ex.client_response = body

    def _submit(self, ex: Exchange) -> None:
        if self.runtime.settings.token and not self.budget.allow(ex.client_addr, time.monotonic()):
            self.runtime.malformed_unrecorded += 1
            return
        ex.ended_at = time.perf_counter()
        self.runtime.exchanges_seen += 1
        self.runtime.submit(ex)
