"""Later attempts of a regenerated request (issue 19), sent only when one is needed (issue 34).

Attempt 1 is mitmproxy's own upstream request on every path: its bytes are read, parsed and handed to the
flow's pipeline once, as without regeneration. At its end the pipeline's splice decides
(proxy/regenerate/splice.py). Only when it asks for another attempt does tapfix send one, with this
addon's own upstream client (httpx: the same TLS settings and connect timeout as the router's checks), from
the stream owner's `response` hook (attempt 1 ended) or `error` hook (the upstream cut attempt 1 off).
The attempt's bytes go through the same pipeline (`feed_attempt`) and on to the client
(addons/runner/client_write.py) before mitmproxy ends the response; at its end the splice decides again.

While a later attempt is awaited (its headers, or the next bytes of its body) the client gets a
`: keep-alive` comment every `keepalive_s`; the attempt gets what is left of the regeneration budget as
its deadline; its admission slot is freed as soon as it ends. A client that leaves, or the shutdown
grace ending, cancels it within `wire.CLOSE_CHECK_S`. A non-streamed regeneration uses the same client:
`fetch_whole` (addons/regenerate_body.py). Registered only with `--regenerate` above 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import httpx
from mitmproxy import ctx, http
from tapfix.addons.runner.client_write import ClientWriter
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses
from tapfix.proxy import net
from tapfix.proxy.content_encoding import DecodeError, Decoder, codings
from tapfix.proxy.regenerate import wire
from tapfix.proxy.regenerate.session import CUT, ENDED, LEFT, SHUTDOWN, Attempt, AttemptSession
from tapfix.proxy.response.pipeline import StreamPipeline

log = logging.getLogger("tapfix")


class LaterAttempts:
    """The mitmproxy addon: the upstream client, opened in `running`, closed in `done`."""

    def __init__(self, keepalive_s: float = 5.0, verify: bool | str = True, connect_timeout: float = 10.0) -> None:
        self.keepalive_s = keepalive_s
        self.sent = 0  # later attempts sent upstream since start, streamed and not (`/tapfix/health`)
        self._client: httpx.AsyncClient | None = None
        self._proxyserver: Any = None
        self._verify = verify
        self._connect_timeout = connect_timeout

    async def running(self) -> None:
        if self._client is not None:
            return
        # No read timeout: the upstream's own pace (long thinking) is not tapfix's to cut; the regeneration
        # budget bounds the later attempts.
        timeout = httpx.Timeout(None, connect=self._connect_timeout)
        self._client = httpx.AsyncClient(timeout=timeout, verify=self._verify)
        # The upstream gets the headers mitmproxy forwarded and no others: httpx's defaults (an
        # accept-encoding the router stripped, its user-agent) would change what the record says was sent.
        self._client.headers.clear()  # (assigning `headers` would put the defaults back)
        self._proxyserver = ctx.master.addons.get("proxyserver")

    async def done(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def writer(self, flow: http.HTTPFlow) -> ClientWriter:
        """Sends more of `flow`'s streamed response to its client from a hook."""
        return ClientWriter(flow, self._proxyserver)

    def open(self) -> AttemptSession:
        """The attempts of a streamed response. Attempt 1 is the request mitmproxy forwarded, recorded on the
        exchange itself: its entry here only counts it (what it sent is read when a later attempt needs it)."""
        return AttemptSession(Attempt(1, b""), self.keepalive_s)

    async def _send(self, method: str, url: str, headers: list[tuple[str, str]], body: bytes) -> httpx.Response:
        assert self._client is not None
        self.sent += 1
        request = self._client.build_request(method, url, headers=headers, content=body)
        return await net.send(self._client, request)

    async def fetch_whole(self, attempt: Attempt, method: str, url: str, timeout_s: float) -> None:
        """One whole-body upstream request (a non-streamed regeneration, addons/regenerate_body.py), recorded
        on `attempt`: status, headers, the raw bytes, or the error. `timeout_s` bounds it all (the
        regeneration budget left)."""
        try:
            async with asyncio.timeout(timeout_s):
                response = await self._send(method, url, attempt.headers_sent, attempt.body)
                try:
                    _note(attempt, response)
                    async for data in response.aiter_raw():
                        attempt.chunks.append(data)
                        attempt.times.append(time.perf_counter())
                finally:
                    await response.aclose()
        except (httpx.HTTPError, OSError, TimeoutError) as e:
            attempt.error = _why(e)
        attempt.ended = time.perf_counter()

    async def stream(
        self, flow: http.HTTPFlow, pipeline: StreamPipeline, session: AttemptSession, stopping: Callable[[], bool]
    ) -> str:
        """Send the attempts the splice plans, one after another, their bytes through `pipeline` to the
        client, until the splice ends the stream (ENDED) or an attempt ends it otherwise (CUT, LEFT,
        SHUTDOWN: `stopping()` says the shutdown grace ended). The caller sends what ends the stream."""
        client = self.writer(flow)
        method, url = flow.request.method, flow.request.url
        headers = wire.forwardable(flow.request.headers.items(multi=True))  # what attempt 1 sent, less its hop's
        loop = asyncio.get_running_loop()
        while pipeline.pending and (plan := session.take()) is not None:
            body, timeout_s = plan
            if len(session.attempts) == 1:
                self._let_go_of_attempt_1(flow)
            attempt = Attempt(len(session.attempts) + 1, body, headers)
            session.attempts.append(attempt)
            kept = pipeline.exchange.client_response_chunks
            waiter = _Waiter(client, session.keepalive_s, loop.time() + timeout_s, stopping, kept)
            try:
                ending = await self._one(attempt, method, url, pipeline, waiter)
            finally:
                session.release()  # its admission slot, as soon as it ended
            if ending != ENDED:
                return ending
            await client.send(pipeline.end_of_attempt())
        return ENDED

    def _let_go_of_attempt_1(self, flow: http.HTTPFlow) -> None:
        """Attempt 1's upstream connection (idle now, kept for the client's next request) is closed, so the
        upstream holds one connection per client request while a later attempt runs."""
        handler = self._proxyserver.connections.get(flow.client_conn.id) if self._proxyserver else None
        if handler is not None and flow.server_conn in handler.transports:
            handler.close_connection(flow.server_conn)

    async def _one(self, attempt: Attempt, method: str, url: str, pipeline: StreamPipeline, waiter: _Waiter) -> str:
        """One later attempt: its headers and body within the waiter's deadline. Its events go to the client
        when its answer is an event stream the pipeline can read, decoded when it came compressed; any other
        answer fails the attempt (`Attempt.fail`): its body is read for the record, and nothing of it
        reaches the client."""
        try:
            response = await waiter.wait(self._send(method, url, attempt.headers_sent, attempt.body))
        except _Stopped as e:
            attempt.cancel(e.why)
            return e.ending
        except (httpx.HTTPError, OSError, TimeoutError) as e:
            attempt.fail(_why(e))
            attempt.ended = time.perf_counter()
            return ENDED
        try:
            _note(attempt, response)
            why = wire.unspliceable(response.status_code, response.headers.get("content-type", ""))
            decoder = None
            encoding = response.headers.get("content-encoding", "")
            if why is None and codings(encoding):
                try:
                    decoder = Decoder(encoding)
                except DecodeError as e:
                    why = f"the attempt's answer can't be decoded: {e}"
                    attempt.flags.add("undecodable_body")
            if why is None:
                return await self._pump(response, attempt, pipeline, waiter, decoder)
            attempt.fail(why)
            return await self._record_rest(response, attempt, waiter)
        finally:
            await response.aclose()

    @staticmethod
    async def _record_rest(response: httpx.Response, attempt: Attempt, waiter: _Waiter) -> str:
        """A failed attempt's body, for its record only, read within the deadline (a body that stalls holds
        nobody past the budget)."""
        try:
            async with contextlib.aclosing(_recorded(response, attempt, waiter)) as chunks:
                async for _ in chunks:
                    pass
        except _Stopped as e:
            attempt.cancel(e.why)
            return e.ending
        except (httpx.HTTPError, OSError, TimeoutError) as e:
            attempt.error = f"{attempt.error}; then {_why(e)}"
        attempt.ended = time.perf_counter()
        return ENDED

    @staticmethod
    async def _pump(
        response: httpx.Response,
        attempt: Attempt,
        pipeline: StreamPipeline,
        waiter: _Waiter,
        decoder: Decoder | None,
    ) -> str:
        """The attempt's bytes (recorded on `attempt` as they came) through the pipeline to the client. When
        the upstream breaks off before a whole event of it came, the attempt failed (nothing of it reached
        the stages); after, the stream is cut there (CUT)."""
        if decoder is not None:
            attempt.decoded = []
        try:
            async with contextlib.aclosing(_recorded(response, attempt, waiter)) as chunks:
                async for data in chunks:
                    if decoder is not None:
                        data = decoder.feed(data)
                        assert attempt.decoded is not None
                        attempt.decoded.append(data)
                    await waiter.client.send(pipeline.feed_attempt(data))
            if decoder is not None:
                tail = decoder.finish()
                if tail and attempt.decoded:
                    attempt.decoded[-1] += tail
                await waiter.client.send(pipeline.feed_attempt(tail))
        except _Stopped as e:
            attempt.cancel(e.why)
            return e.ending
        except DecodeError as e:
            attempt.flags.add("undecodable_body")
            if pipeline.attempt_events == 0:
                attempt.fail(f"the attempt's answer can't be decoded: {e}")
            else:
                attempt.error = f"the attempt's answer stopped decoding: {e}"
        except (httpx.HTTPError, OSError, TimeoutError) as e:
            if pipeline.attempt_events == 0:
                attempt.fail(_why(e))  # nothing of it came: no answer
            else:
                attempt.error = _why(e)
        attempt.ended = time.perf_counter()
        if attempt.failed:
            pipeline.drop_partial()
            return ENDED
        return CUT if attempt.error is not None else ENDED


async def _recorded(response: httpx.Response, attempt: Attempt, waiter: _Waiter) -> AsyncGenerator[bytes]:
    """The upstream's chunks as they come, each awaited within the deadline and recorded on `attempt`."""
    chunks = response.aiter_raw()
    while (data := await waiter.wait(anext(chunks, None))) is not None:
        attempt.chunks.append(data)
        attempt.times.append(time.perf_counter())
        yield data


class _Stopped(Exception):
    """The client left, or the shutdown grace ended, while a later attempt was awaited."""

    def __init__(self, ending: str) -> None:
        super().__init__(ending)
        self.ending = ending
        self.why = "shutdown" if ending == SHUTDOWN else "client_left"


class _Waiter:
    """How a later attempt waits: within `deadline` (loop time), a keep-alive to the client every `every_s`
    while nothing comes, and cancelled when the client leaves or the shutdown grace ends. (No dataclass in
    an addon file: see proxy/regenerate/session.py.)"""

    __slots__ = ("client", "every_s", "deadline", "stopping", "kept")

    def __init__(
        self,
        client: ClientWriter,
        every_s: float,
        deadline: float,
        stopping: Callable[[], bool],
        kept: list[bytes] | None,
    ) -> None:
        self.client, self.every_s, self.deadline, self.stopping = client, every_s, deadline, stopping
        self.kept = kept  # the client-bound bytes of the record: a keep-alive is one of them

    async def wait[T](self, waitable: Awaitable[T]) -> T:
        """Await `waitable`, a keep-alive comment to the client every `every_s` meanwhile; TimeoutError at the
        deadline. Any failure, the client leaving or the shutdown cancels what was awaited."""
        task = asyncio.ensure_future(waitable)
        loop = asyncio.get_running_loop()
        next_keepalive = loop.time() + self.every_s
        try:
            while True:
                now = loop.time()
                wait = min(wire.CLOSE_CHECK_S, max(0.0, next_keepalive - now), max(0.0, self.deadline - now))
                done, _ = await asyncio.wait({task}, timeout=wait)
                if done:
                    return task.result()
                if not self.client.connected:
                    raise _Stopped(LEFT)
                if self.stopping():
                    raise _Stopped(SHUTDOWN)
                if loop.time() >= self.deadline:
                    raise TimeoutError
                if loop.time() >= next_keepalive:
                    if self.kept is not None:
                        self.kept.append(wire.KEEPALIVE)
                    await self.client.send(wire.KEEPALIVE)
                    next_keepalive = loop.time() + self.every_s
        except BaseException:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise


def _note(attempt: Attempt, response: httpx.Response) -> None:
    attempt.status, attempt.headers = response.status_code, list(response.headers.multi_items())


def _why(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return "the regeneration budget ran out during the attempt"
    return str(e) or type(e).__name__
