"""Client-side replay: resend a captured request (or a whole agent session) to an upstream, N times.

A replay answers "does the server still do that, and how often?": the stored bytes go out
unchanged (the body as forwarded by default, or the client's original), edits from `--set` and
`--unset` are spliced into those bytes (never re-serialized), and every run is stored as a capture
of its own, tagged `replay` and linked to its source, through the same queued writer `tapfix run`
uses: a running proxy may be writing to the same database, so transactions stay short and wait
on the busy timeout instead of failing.

Nothing here prints; `cli_replay` drives it and `replay_summary` judges the runs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
from tapfix.proxy import net
from tapfix.proxy.assemble import Assembled, assemble
from tapfix.proxy.assemble.flags import response_flags
from tapfix.proxy.config.upstream import UpstreamTarget, UpstreamURLError
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.http_headers import HOP_BY_HOP, SESSION_HEADERS, head_bytes
from tapfix.proxy.ids import new_capture_id
from tapfix.proxy.jsonsplice import Edit, SpliceError, splice
from tapfix.proxy.replay.edits import ReplayError, check_edits
from tapfix.proxy.store.errors import CaptureNotFound
from tapfix.proxy.store.reader import CaptureReader
from tapfix.proxy.store.redact import REDACTED, SECRET_HEADERS

# Headers httpx must write itself, or that would change what comes back (compressed bytes).
_NOT_RESENT = HOP_BY_HOP | {"host", "content-length", "accept-encoding", "cookie"}


@dataclass(frozen=True)
class ReplayRequest:
    """One stored request, ready to resend."""

    source: dict[str, Any]
    method: str
    url: str
    path: str
    body: bytes
    headers: list[tuple[str, str]]
    model: str | None
    stream: bool
    tools: list[Any] | None

    @property
    def source_id(self) -> str:
        return str(self.source["id"])


@dataclass
class RunResult:
    """What one resend produced, in memory (the store gets the same as an `Exchange`)."""

    run: int
    turn: int
    request: ReplayRequest
    capture_id: str | None = None  # None: nothing stored (the connection never opened)
    status: int | None = None
    content_type: str = ""
    response_headers: list[tuple[str, str]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    chunk_times: list[float] = field(default_factory=list)  # seconds after the request was sent
    first_byte: float | None = None
    duration: float | None = None
    error: str | None = None
    assembled: Assembled = field(default_factory=Assembled)
    flags: set[str] = field(default_factory=set)

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    @property
    def unsent(self) -> bool:
        """The connection never opened: there is nothing to store."""
        return bool(self.error and self.error.startswith("connect:"))


# --- building the requests --------------------------------------------------------------------


def session_capture_ids(reader: CaptureReader, session_id: str) -> list[str]:
    """The session's turns as recorded, oldest first, without earlier replays of them (nor regeneration
    attempts, which belong to no session)."""
    rows = reader.list_captures(limit=0, session=session_id)
    ids = sorted(r["id"] for r in rows if r["attempt_of"] is None and "replay" not in r["tags"])
    if not ids:
        raise CaptureNotFound(f"no session {session_id!r} (see `tapfix captures list`)")
    return ids


def build_request(
    reader: CaptureReader,
    capture_id: str,
    *,
    which: str = "forwarded",
    edits: Sequence[Edit] = (),
    upstream: str | None = None,
    credential: tuple[str, str] | None = None,
) -> ReplayRequest:
    """The stored request, edited, aimed at `upstream` (default: the capture's own upstream origin).

    `credential` is a (header, value) pair from the environment; the capture's own secrets were
    redacted before storage and are never resent.
    """
    capture = reader.load_capture(capture_id)
    body = reader.capture_body(capture, which)
    if edits:
        check_edits(_json_object(body), edits)
        try:
            body = splice(body, edits)
        except SpliceError as e:
            raise ReplayError(f"capture {capture['id']}: can't apply --set/--unset: {e}") from e
    stored_url = capture.get("upstream_url") or capture.get("url") or ""
    parts = urlsplit(stored_url)
    path = (parts.path or capture.get("path") or "/") + (f"?{parts.query}" if parts.query else "")
    origin = upstream or (f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else None)
    if not origin:
        raise ReplayError(f"capture {capture['id']} has no upstream URL: pass --upstream URL")
    try:
        target = UpstreamTarget.parse(origin)
    except UpstreamURLError as e:
        raise ReplayError(str(e)) from e
    stored = capture.get("forwarded_headers") if which == "forwarded" else None
    headers = resend_headers(stored or capture.get("request_headers") or [], credential)
    obj = _json_object(body)
    tools = obj.get("tools") if isinstance(obj.get("tools"), list) else None
    model = obj.get("model") if isinstance(obj.get("model"), str) else capture.get("model")
    return ReplayRequest(
        capture,
        capture.get("method") or "POST",
        target.origin + target.join(path),
        path,
        body,
        headers,
        model,
        bool(obj.get("stream", capture.get("stream"))),
        tools,
    )


def resend_headers(stored: Sequence[Sequence[str]], credential: tuple[str, str] | None) -> list[tuple[str, str]]:
    """The stored headers minus framing and secrets, plus the credential where the capture had one."""
    out: list[tuple[str, str]] = []
    had_secret: str | None = None
    for name, value in stored:
        lower = name.lower()
        if lower in SECRET_HEADERS or value == REDACTED:
            had_secret = had_secret or lower
            continue
        if lower in _NOT_RESENT or lower.startswith("x-tapfix-"):
            continue
        out.append((_as_received(name), _as_received(value)))
    out.append(("accept-encoding", "identity"))  # the bytes as the server produced them
    if credential is not None:
        header, key = credential
        if header == "auto":
            header = "x-api-key" if had_secret in ("x-api-key", "api-key") else "authorization"
        out.append((header, key if header != "authorization" else f"Bearer {key}"))
    return out


def _as_received(text: str) -> str:
    """Stored head text (`\\xNN`, `\\\\`) back to mitmproxy's form: the bytes, surrogate-escaped."""
    return head_bytes(text).decode("utf-8", "surrogateescape")


def _wire(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("utf-8", "surrogateescape"), v.encode("utf-8", "surrogateescape")) for k, v in headers]


def credential_from_env(name: str | None) -> tuple[str, str] | None:
    if not name:
        return None
    key = os.environ.get(name)
    if not key:
        raise ReplayError(f"--key-env {name}: that environment variable is not set")
    return ("auto", key)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(body) if body[:1] in (b"{", b" ", b"\n", b"\t", b"\r") else None
    except orjson.JSONDecodeError:
        return {}
    return obj if isinstance(obj, dict) else {}


async def check_reachable(url: str, timeout: float = 5.0) -> None:
    """Fail fast, before anything is written, when nothing listens at the upstream."""
    target = UpstreamTarget.parse(url)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(target.host, target.port), timeout)
    except (TimeoutError, OSError) as e:
        raise ReplayError(f"upstream {target.origin} is unreachable ({e or 'timed out'})") from e
    writer.close()


# --- sending ----------------------------------------------------------------------------------


async def send_one(client: httpx.AsyncClient, req: ReplayRequest, run: int, turn: int) -> RunResult:
    """Send once, reading the response as it streams in and timing every chunk."""
    result = RunResult(run, turn, req)
    started = time.perf_counter()
    try:
        request = client.build_request(req.method, req.url, content=req.body, headers=_wire(req.headers))
        response = await net.send(client, request)
        try:
            result.first_byte = time.perf_counter() - started
            result.status = response.status_code
            result.content_type = response.headers.get("content-type", "")
            result.response_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw]
            async for chunk in response.aiter_raw():
                result.chunk_times.append(time.perf_counter() - started)
                result.chunks.append(chunk)
        finally:
            await response.aclose()
    except (httpx.ConnectError, httpx.ConnectTimeout) as e:
        result.error = f"connect: {e or type(e).__name__}"
        result.duration = time.perf_counter() - started
        return result
    except httpx.HTTPError as e:
        result.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    result.duration = time.perf_counter() - started
    result.assembled = assemble(result.body, result.content_type) if result.status else Assembled()
    result.flags = response_flags(
        result.assembled, result.status, _is_stream(result), tools=req.tools, request_body=req.body
    )
    if result.error and result.status is not None:
        result.flags.add("stream_incomplete" if _is_stream(result) else "upstream_error")
    return result


def _is_stream(result: RunResult) -> bool:
    return "event-stream" in result.content_type


def to_exchange(result: RunResult, session_hint: str, wall: float) -> Exchange:
    """The store's record of a run: linked to its source, tagged `replay`, timed like a proxied flow."""
    req = result.request
    mark = time.perf_counter() - (result.duration or 0.0)
    stream = _is_stream(result)
    ex = Exchange(
        started_at=wall,
        method=req.method,
        path=req.path,
        url=req.url,
        upstream_url=req.url,
        user_agent=next((v for k, v in req.headers if k.lower() == "user-agent"), "tapfix-replay"),
        model=req.model,
        stream=stream,
        tools=req.tools,
        request=req.body,
        forwarded=req.body,
        # The session headers stay out of the record: they would file the replay under the original session.
        request_headers=[(k, v) for k, v in req.headers if k.lower() not in SESSION_HEADERS],
        status=result.status,
        response_headers=result.response_headers,
        content_type=result.content_type,
        response_started_at=None if result.first_byte is None else mark + result.first_byte,
        ended_at=mark + (result.duration or 0.0),
        error=result.error,
        flags=set(result.flags),
        tags={"replay"},
        session_hint=session_hint,
        source_id=req.source_id,
        mark=mark,
    )
    if stream:
        ex.response_chunks = list(result.chunks)
        ex.chunk_times = list(result.chunk_times)
    else:
        ex.response = result.body
    return ex


@dataclass
class ReplayOutcome:
    results: list[RunResult]
    interrupted: bool


async def run_replays(
    turns: Sequence[ReplayRequest],
    times: int,
    concurrency: int,
    *,
    submit: Callable[[Exchange], None] | None = None,
    on_result: Callable[[RunResult], None] | None = None,
    timeout: float = 600.0,
    verify: bool | str = True,
) -> ReplayOutcome:
    """`times` runs of the turns (each run sends its turns in order), `concurrency` runs in flight.

    Every finished turn is handed to `submit` at once, so Ctrl-C (SIGINT) keeps what finished:
    it cancels the runs in flight and returns what is done, with `interrupted` set.
    """
    results: list[RunResult] = []
    batch = new_capture_id()
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(10.0, read=timeout, write=60.0, pool=None),
        limits=limits,
        verify=verify,
        trust_env=False,
    ) as client:

        async def one_run(run: int) -> None:
            async with gate:
                hint = f"replay-{batch}" if len(turns) == 1 else f"replay-{batch}-{run}"
                for turn, req in enumerate(turns):
                    wall = time.time()
                    result = await send_one(client, req, run, turn)
                    if submit is not None and not result.unsent:
                        exchange = to_exchange(result, hint, wall)
                        result.capture_id = exchange.id
                        submit(exchange)
                    results.append(result)
                    if on_result is not None:
                        on_result(result)

        tasks = [asyncio.create_task(one_run(run)) for run in range(1, times + 1)]
        interrupted = _on_sigint(tasks)
        await asyncio.gather(*tasks, return_exceptions=True)
        _restore_sigint()
    results.sort(key=lambda r: (r.run, r.turn))
    return ReplayOutcome(results, interrupted[0])


def _on_sigint(tasks: list[asyncio.Task[None]]) -> list[bool]:
    flag = [False]

    def interrupt() -> None:
        flag[0] = True
        for task in tasks:
            task.cancel()

    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, interrupt)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
        pass
    return flag


def _restore_sigint() -> None:
    try:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)
    except (NotImplementedError, RuntimeError, ValueError):
        pass
