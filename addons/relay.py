"""The regeneration relay (issue 19): one streamed client response that may carry several upstream attempts.

mitmproxy streams only bytes that arrive from the server connection (docs/regenerate.md, "Where a new
attempt can plug in"), so the router points a regenerable request at this relay: a loopback HTTP/1.1
server on mitmproxy's own event loop. It forwards to the real upstream with httpx and streams the bytes
back unchanged; at the upstream's end it writes the session's attempt-end marker (proxy/regenerate/wire.py)
and waits for the pipeline's decision, made synchronously as mitmproxy hands it the marker
(proxy/regenerate/splice.py): `end()` ends the response, `next_attempt(body, timeout_s)` sends another
upstream request whose bytes join the same response. `: keep-alive` comments go out while the next
attempt's bytes are awaited. When mitmproxy drops the connection (the client left) the pending upstream
request is cancelled. The relay only runs with `--regenerate` above 0: the default path never sees it.
A non-streamed regeneration needs no relay server, only its upstream client: `fetch_whole`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable

import httpx
from mitmproxy import http
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses
from tapfix.proxy.content_encoding import DecodeError, Decoder, codings
from tapfix.proxy.regenerate import wire
from tapfix.proxy.regenerate.session import Attempt, RelaySession
from tapfix.proxy.sse import last_event_end

log = logging.getLogger("tapfix")


class Relay:
    """The mitmproxy addon: the loopback server, started in `running`, closed in `done`."""

    def __init__(self, keepalive_s: float = 5.0, verify: bool | str = True, connect_timeout: float = 10.0) -> None:
        self.keepalive_s = keepalive_s
        self.sessions: dict[str, RelaySession] = {}
        self.opened = 0  # requests routed through the relay since start (`/tapfix/health`)
        self.port: int | None = None
        self._server: asyncio.Server | None = None
        self._client: httpx.AsyncClient | None = None
        self._verify = verify
        self._connect_timeout = connect_timeout

    async def running(self) -> None:
        if self._server is not None:
            return
        # No read timeout: the upstream's own pace (long thinking) is not the relay's to cut; the
        # regeneration budget bounds the later attempts.
        timeout = httpx.Timeout(None, connect=self._connect_timeout)
        self._client = httpx.AsyncClient(timeout=timeout, verify=self._verify)
        # The upstream gets the headers mitmproxy forwarded and no others: httpx's defaults (an
        # accept-encoding the router stripped, its user-agent) would change what the record says was sent.
        self._client.headers.clear()  # (assigning `headers` would put the defaults back)
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("regenerate relay on 127.0.0.1:%d", self.port)

    async def done(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def open(self, origin: str) -> tuple[str, RelaySession]:
        token = secrets.token_hex(12)
        session = RelaySession(origin, self.keepalive_s)
        self.sessions[token] = session
        self.opened += 1
        return token, session

    # -- the flow's side: the session token never reaches the record -------------------------------
    def responseheaders(self, flow: http.HTTPFlow) -> None:
        self._forget(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._forget(flow)

    def _forget(self, flow: http.HTTPFlow) -> None:
        token = flow.request.headers.pop(wire.SESSION_HEADER, None)
        if token is not None:
            self.sessions.pop(token, None)  # never served (the connection failed): nothing waits on it

    # -- the HTTP/1.1 server side (mitmproxy is the only client) ------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # mitmproxy reuses the server connection for the client connection's next request
                head = await reader.readuntil(b"\r\n\r\n")
                method, path, headers = wire.parse_head(head)
                body = await _read_body(reader, headers)
                token = wire.header(headers, wire.SESSION_HEADER)
                session = self.sessions.pop(token, None) if token else None
                if session is None:
                    writer.write(wire.BAD_GATEWAY)
                    await writer.drain()
                    continue
                try:
                    await self._relay(session, method, path, wire.forwardable(headers), body, reader, writer)
                finally:
                    session.release()
                    session.closed = True
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    async def _send(self, method: str, url: str, headers: list[tuple[str, str]], body: bytes) -> httpx.Response:
        assert self._client is not None
        request = self._client.build_request(method, url, headers=headers, content=body)
        return await self._client.send(request, stream=True)

    async def fetch_whole(self, attempt: Attempt, method: str, url: str, timeout_s: float) -> None:
        """One whole-body upstream request (a non-streamed regeneration, addons/regenerate_body.py) with
        the relay's client (its TLS settings and connect timeout), recorded on `attempt`: status, headers,
        the raw bytes, or the error. `timeout_s` bounds it all (the regeneration budget left)."""
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

    async def _relay(
        self,
        session: RelaySession,
        method: str,
        path: str,
        headers: list[tuple[str, str]],
        body: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        url = session.origin + path
        attempt = Attempt(1, body, headers)
        session.attempts.append(attempt)
        try:
            response = await self._send(method, url, headers, body)
        except httpx.HTTPError as e:
            attempt.error, attempt.ended = _why(e), time.perf_counter()
            writer.write(wire.BAD_GATEWAY)
            await writer.drain()
            return
        _note(attempt, response)
        writer.write(wire.response_head(response.status_code, response.reason_phrase, response.headers.multi_items()))
        # A compressed stream can't carry a plain marker after it (the pipeline decodes what it reads):
        # it goes through whole, as one attempt.
        stream = wire.unspliceable(response.status_code, response.headers.get("content-type", "")) is None
        splice = stream and not codings(response.headers.get("content-encoding", ""))
        try:
            last = await self._pump(response, attempt, writer, whole_events=splice)
        finally:
            await response.aclose()
        cut = attempt.error is not None  # the upstream broke off the last attempt: mitmproxy must see a reset too
        if splice and await session.spliced:
            loop = asyncio.get_running_loop()
            while True:
                decision = session._arm()
                writer.write(wire.chunk(wire.marker_after(last, session.marker)))
                await writer.drain()
                plan = await _keepalive_until(decision, reader, writer, session.keepalive_s, None)
                if plan is None:
                    break
                body_next, timeout_s = plan
                attempt = Attempt(len(session.attempts) + 1, body_next, headers)
                session.attempts.append(attempt)
                try:
                    later = _Later(reader, writer, session.keepalive_s, loop.time() + timeout_s)
                    last = await self._later(later, attempt, method, url, headers)
                finally:
                    session.release()  # its admission slot, as soon as it ended
                cut = attempt.error is not None and not attempt.failed
        if cut:
            # As the upstream did: no last chunk, so mitmproxy's error hook ends the client's stream
            # with the retryable error event a direct reset gets (addons/stream.py, `error`).
            writer.transport.abort()
            return
        writer.write(wire.LAST_CHUNK)
        await writer.drain()

    async def _later(
        self, later: _Later, attempt: Attempt, method: str, url: str, headers: list[tuple[str, str]]
    ) -> bytes:
        """A later attempt, its headers and body within `later.deadline` (what is left of the budget), with
        keep-alives while nothing comes. Its events go out when its answer is an event stream the pipeline
        can read, decoded when it came compressed; any other answer fails the attempt (`Attempt.fail`): its
        body is read for the record, and nothing of it reaches the client. Returns the stream's last bytes."""
        try:
            response = await later.wait(self._send(method, url, headers, attempt.body))
        except _ClientLeft:
            attempt.cancel()
            raise
        except (httpx.HTTPError, TimeoutError) as e:
            attempt.fail(_why(e))
            attempt.ended = time.perf_counter()
            return b""
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
                return await self._pump(response, attempt, later.writer, True, later, decoder)
            attempt.fail(why)
            await self._record_rest(response, attempt, later)
            return b""
        finally:
            await response.aclose()

    @staticmethod
    async def _record_rest(response: httpx.Response, attempt: Attempt, later: _Later) -> None:
        """A failed attempt's body, for its record only, read within the deadline (a body that stalls
        holds nobody past the budget)."""
        chunks = response.aiter_raw()
        try:
            while True:
                data = await later.wait(anext(chunks, None))
                if data is None:
                    break
                attempt.chunks.append(data)
                attempt.times.append(time.perf_counter())
        except _ClientLeft:
            attempt.cancel()
            raise
        except (httpx.HTTPError, OSError, TimeoutError) as e:
            attempt.error = f"{attempt.error}; then {_why(e)}"
        attempt.ended = time.perf_counter()

    @staticmethod
    async def _pump(
        response: httpx.Response,
        attempt: Attempt,
        writer: asyncio.StreamWriter,
        whole_events: bool = False,
        later: _Later | None = None,
        decoder: Decoder | None = None,
    ) -> bytes:
        """Forward the upstream's bytes (recorded on `attempt` as they came); the stream's last 4 bytes sent.
        With `whole_events` (an SSE stream), bytes after the last whole event wait for the rest of it: when
        the upstream breaks off inside an event, that piece is never sent (the client would read broken
        JSON before the retryable error), though the record keeps it. A later attempt's reads wait within
        its deadline, keep-alives going out meanwhile (`later`); `decoder` undoes its Content-Encoding."""
        last = pending = b""
        sent = False
        if decoder is not None:
            attempt.decoded = []
        chunks = response.aiter_raw()
        try:
            while True:
                data = await (anext(chunks, None) if later is None else later.wait(anext(chunks, None)))
                if data is None:
                    break
                attempt.chunks.append(data)
                attempt.times.append(time.perf_counter())
                if decoder is not None:
                    data = decoder.feed(data)
                    assert attempt.decoded is not None
                    attempt.decoded.append(data)
                if whole_events:
                    data = pending + data
                    end = last_event_end(data)
                    data, pending = data[:end], data[end:]
                if data:
                    writer.write(wire.chunk(data))
                    await writer.drain()
                    sent = True
                    last = (last + data)[-4:]  # the stream's tail, wherever the reads fell
            if decoder is not None:
                tail = decoder.finish()
                if tail and attempt.decoded:
                    attempt.decoded[-1] += tail
                pending += tail
        except _ClientLeft:
            attempt.cancel()
            raise
        except DecodeError as e:
            attempt.flags.add("undecodable_body")
            if not sent:
                attempt.fail(f"the attempt's answer can't be decoded: {e}")
            else:
                attempt.error = f"the attempt's answer stopped decoding: {e}"
        except (httpx.HTTPError, OSError, TimeoutError) as e:
            if isinstance(e, ConnectionError) and writer.is_closing():
                if later is not None:
                    attempt.cancel()
                raise  # mitmproxy dropped the connection: the client left
            if later is not None and not sent:
                attempt.fail(_why(e))  # nothing of it came: no answer
            else:
                attempt.error = _why(e)
        if pending and attempt.error is None:  # a clean end: what is left goes too, as it came
            writer.write(wire.chunk(pending))
            await writer.drain()
            last = (last + pending)[-4:]
        attempt.ended = time.perf_counter()
        await response.aclose()
        return last


class _ClientLeft(ConnectionResetError):
    """mitmproxy closed the relay's connection while a later attempt was awaited: the client left."""


class _Later:
    """How a later attempt waits: within `deadline` (loop time), a keep-alive to the client every `every_s`
    while nothing comes, and cancelled when the client leaves. (No dataclass in an addon file: see
    proxy/regenerate/session.py.)"""

    __slots__ = ("reader", "writer", "every_s", "deadline")

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, every_s: float, deadline: float
    ) -> None:
        self.reader, self.writer, self.every_s, self.deadline = reader, writer, every_s, deadline

    def wait[T](self, waitable: Awaitable[T]) -> Awaitable[T]:
        return _keepalive_until(waitable, self.reader, self.writer, self.every_s, self.deadline)


def _note(attempt: Attempt, response: httpx.Response) -> None:
    attempt.status, attempt.headers = response.status_code, list(response.headers.multi_items())


def _why(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return "the regeneration budget ran out during the attempt"
    return str(e) or type(e).__name__


async def _keepalive_until[T](
    waitable: Awaitable[T],
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    every_s: float,
    deadline: float | None,
) -> T:
    """Await `waitable`, a keep-alive comment to the client every `every_s` meanwhile; TimeoutError at
    `deadline` (loop time). Any failure, or mitmproxy closing the connection, cancels what was awaited.
    The close is seen on the reader (end of stream) within `wire.CLOSE_CHECK_S`: a write to a closed socket
    can still succeed once, so waiting for a keep-alive to fail would let the upstream run on for seconds."""
    task = asyncio.ensure_future(waitable)
    loop = asyncio.get_running_loop()
    next_keepalive = loop.time() + every_s
    try:
        while True:
            now = loop.time()
            wait = min(wire.CLOSE_CHECK_S, max(0.0, next_keepalive - now))
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - now))
            done, _ = await asyncio.wait({task}, timeout=wait)
            if done:
                return task.result()
            if reader.at_eof():
                raise _ClientLeft("mitmproxy closed the connection: the client left")
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError
            if loop.time() >= next_keepalive:
                writer.write(wire.chunk(wire.KEEPALIVE))
                await writer.drain()
                next_keepalive = loop.time() + every_s
    except BaseException:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise


async def _read_body(reader: asyncio.StreamReader, headers: list[tuple[str, str]]) -> bytes:
    length = wire.header(headers, "content-length")
    if length is not None:
        return await reader.readexactly(int(length))
    if "chunked" in (wire.header(headers, "transfer-encoding") or "").lower():
        parts: list[bytes] = []
        while True:
            size = wire.chunk_size(await reader.readuntil(b"\r\n"))
            if size == 0:
                await reader.readuntil(b"\r\n")
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    return b""
