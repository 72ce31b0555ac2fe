"""Shutdown: on SIGTERM (or Ctrl-C) stop accepting connections and let in-flight exchanges finish.

A deploy or a Ctrl-C must neither cut the streams agents are reading nor leave a log that tells
another story. So the first signal closes the listening sockets and gives the exchanges in flight
`--shutdown-grace` seconds. Meanwhile a new request on a connection that is still open gets a 503
`server_error` with `Connection: close`: agents retry it. When the grace ends, or at a second signal,
each remaining exchange is flagged `proxy_shutdown` and its upstream connection is closed: mitmproxy
then runs the error hooks as for a reset, and the stream owner ends the stream with the retryable
error event (a client still waiting for a response head gets the JSON 503 instead, via
`reset_tail.REPLY_ATTR`). Then mitmproxy stops and the runner drains the capture writer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from mitmproxy import http
from mitmproxy.net.http import http1
from tapfix.addons.runner.http import answer_locally, json_response
from tapfix.addons.runner.reset_tail import REPLY_ATTR
from tapfix.addons.runner.runtime import SHUTDOWN_FLAG, Runtime, exchange_of, request_url
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses
from tapfix.proxy.errors import shutting_down
from tapfix.proxy.response.pipeline import StreamPipeline
from tapfix.proxy.surfaces import surface_for

log = logging.getLogger("tapfix")
ENDING_S = 3.0  # after the grace: how long the cut exchanges get to run their error hooks
_POLL_S = 0.05


class Shutdown:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.in_flight: set[http.HTTPFlow] = set()
        self.draining = False
        self._now = asyncio.Event()  # set by a second signal: the grace ends at once
        self._task: asyncio.Task[None] | None = None

    # -- hooks -----------------------------------------------------------------------------------
    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live:
            return
        if not self.draining:
            self.in_flight.add(flow)
            return
        ex = exchange_of(flow)
        answer_locally(flow, ex, shutting_down(surface_for(flow.request.path)), {"connection": "close"})
        if ex is not None:
            ex.flags.add(SHUTDOWN_FLAG)

    def response(self, flow: http.HTTPFlow) -> None:
        if not _may_get_another_attempt(flow):
            self.in_flight.discard(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        if not _may_get_another_attempt(flow):
            self.in_flight.discard(flow)

    # -- signals ---------------------------------------------------------------------------------
    def signal(self, master: Any) -> None:
        """The first SIGTERM / SIGINT starts the grace; another ends it at once."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.drain(master))
        else:
            self._now.set()

    async def drain(self, master: Any) -> None:
        self.draining = True
        try:
            proxyserver = master.addons.get("proxyserver")
            for server in list(proxyserver.servers):  # stop accepting; open connections stay
                await server.stop()
            grace = self.runtime.settings.shutdown_grace
            if self.in_flight:
                log.warning(
                    "tapfix: shutting down; %d exchange(s) in flight get %g s (SIGTERM or Ctrl-C again ends them now)",
                    len(self.in_flight),
                    grace,
                )
            await self._wait(grace, interruptible=True)
            if self.in_flight:
                log.warning("tapfix: ending %d exchange(s) still in flight", len(self.in_flight))
                self.end_all(proxyserver)
                await self._wait(ENDING_S, interruptible=False)
        finally:
            master.shutdown()

    async def _wait(self, seconds: float, *, interruptible: bool) -> None:
        deadline = time.monotonic() + seconds
        while self._prune() and time.monotonic() < deadline and not (interruptible and self._now.is_set()):
            await asyncio.sleep(_POLL_S)

    def _prune(self) -> bool:
        """Drop the flows mitmproxy has ended (a stream kept in flight for its later attempts); any left?"""
        self.in_flight = {flow for flow in self.in_flight if flow.live}
        return bool(self.in_flight)

    def end_all(self, proxyserver: Any) -> None:
        """Flag each exchange, then close its upstream connection: mitmproxy's error path ends it."""
        for flow in list(self.in_flight):
            ex = exchange_of(flow)
            if ex is not None:
                ex.flags.add(SHUTDOWN_FLAG)
            if flow.response is None or not flow.response.stream:  # the client has no head yet
                answer = shutting_down(surface_for(flow.request.path))
                reply = json_response(answer.status, answer.body, ex.id if ex else None, {"connection": "close"})
                setattr(flow.client_conn, REPLY_ATTR, http1.assemble_response(reply))
                if ex is not None:
                    sent = flow.server_conn.timestamp_tcp_setup is not None  # it went upstream, unanswered
                    ex.answered_by_tapfix(answer.error_text(), request_url(flow.request) if sent else "")
                    ex.status, ex.client_response = answer.status, answer.body
            stream = flow.response.stream if flow.response is not None else None
            if isinstance(stream, StreamPipeline) and stream.pending:
                continue  # a later attempt runs in the stream owner's hook: it sees the flag and ends the stream
            handler = proxyserver.connections.get(flow.client_conn.id)
            if handler is not None and flow.server_conn in handler.transports:
                handler.close_connection(flow.server_conn)
            elif flow.killable:  # no upstream connection yet: mitmproxy ends it at its next step
                flow.kill()


def _may_get_another_attempt(flow: http.HTTPFlow) -> bool:
    """A stream whose splice hasn't ended it (issue 19): the stream owner's hook may still send later
    attempts after this hook, so the flow stays in flight until mitmproxy ends it."""
    stream = flow.response.stream if flow.response is not None else None
    return isinstance(stream, StreamPipeline) and stream.splice is not None and not stream.finished
