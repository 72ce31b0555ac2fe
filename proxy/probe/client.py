"""The probe's HTTP client: one request at a time, timed, and handed to the capture store.

Probe traffic goes straight to the upstream (the probe proves the server, not the proxy), but it is
captured like any proxied exchange, tagged `probe` (and `probe:<check>`), so a failed check can be
opened with `tapfix captures show ID`. In config mode a body goes through the same request policy
the proxy applies (model rename, sampling defaults, reasoning dialect), and the changes are
recorded beside the original body, as for proxied traffic.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from tapfix.proxy import net
from tapfix.proxy.assemble import Assembled, assemble_json, assemble_sse
from tapfix.proxy.changes import Change
from tapfix.proxy.config.upstream import UpstreamTarget
from tapfix.proxy.exchange import Exchange

USER_AGENT = "tapfix-probe/0.1"
Capture = Callable[[Exchange], None]


@dataclass(slots=True)
class Prepared:
    """A probe body as the proxy would forward it (see runner.policy_hook)."""

    body: bytes
    changes: list[Change] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)  # e.g. the upstream's credential
    refused: tuple[int, bytes] | None = None  # the proxy would answer this itself


PolicyHook = Callable[[str, bytes], Prepared]


@dataclass(slots=True)
class Answer:
    """What came back for one request, with the timings the streaming check needs."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    stream: bool
    chunks: list[bytes] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # seconds from the request's start, per chunk
    elapsed: float = 0.0
    capture_id: str = ""
    sent: bytes = b""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None

    def message(self) -> Assembled:
        """The answer as one message (content, reasoning, tool calls, finish reason)."""
        if self.stream and "event-stream" in self.content_type:
            return assemble_sse(self.chunks or [self.body])
        return assemble_json(self.body)

    @property
    def content_type(self) -> str:
        return next((v for k, v in self.headers if k.lower() == "content-type"), "")

    def error_text(self) -> str:
        """`HTTP 404: The model `x` does not exist.` — the server's own words, shortened."""
        obj = self.json()
        message = None
        if isinstance(obj, dict):
            err = obj.get("error", obj.get("detail", obj.get("message")))
            message = err.get("message") if isinstance(err, dict) else err
        if not isinstance(message, str) or not message:
            message = self.body[:200].decode("utf-8", "replace").strip() or "(empty body)"
        return f"HTTP {self.status}: {shorten(message, 240)}"


def shorten(text: str, limit: int = 120) -> str:
    """One line, at most `limit` characters, for a table cell."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class ProbeClient:
    """Sends probe requests to one upstream and records each one."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        capture: Capture | None = None,
        policy: PolicyHook | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.target = UpstreamTarget.parse(base_url)
        self.headers = {
            "user-agent": USER_AGENT,
            "accept-encoding": "identity",
            **{k.lower(): v for k, v in (headers or {}).items()},
        }
        self.timeout = timeout
        self.capture = capture
        self.policy = policy
        self.sent: list[str] = []  # capture ids, in order (each check takes its own slice)
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            transport=transport,
            follow_redirects=False,
        )

    def url(self, path: str) -> str:
        return self.target.origin + self.target.join(path)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> ProbeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def get(self, path: str, check: str) -> Answer:
        return await self._send("GET", path, None, check)

    async def post(self, path: str, body: dict[str, Any], check: str) -> Answer:
        return await self._send("POST", path, body, check)

    async def _send(self, method: str, path: str, body: dict[str, Any] | None, check: str) -> Answer:
        raw = orjson.dumps(body) if body is not None else b""
        prepared = Prepared(raw)
        if self.policy is not None and body is not None:
            prepared = self.policy(path, raw)
        sent, changes, extra, refused = prepared.body, prepared.changes, prepared.headers, prepared.refused
        headers = {**self.headers, **extra}
        if body is not None:
            headers["content-type"] = "application/json"
        stream = bool(body and body.get("stream"))
        ex = Exchange(
            method=method,
            path=path,
            url=self.url(path),
            upstream_url=self.url(path),
            user_agent=USER_AGENT,
            client_addr="tapfix-probe",
            request=raw,
            forwarded=sent if sent != raw else None,
            request_headers=list(headers.items()),
            stream=stream,
            tags={"probe", f"probe:{check}"},
            changes=list(changes),
        )
        if isinstance(body, dict):
            ex.model = body.get("model") if isinstance(body.get("model"), str) else None
            tools = body.get("tools")
            ex.tools = tools if isinstance(tools, list) and tools else None
            parsed = _loads(sent)
            ex.served_model = parsed.get("model") if isinstance(parsed, dict) else ex.model
        answer = Answer(status=0, headers=[], body=b"", stream=stream, capture_id=ex.id, sent=sent)
        self.sent.append(ex.id)
        if refused is not None:  # the policy answers itself (e.g. an unmappable reasoning value)
            answer.status, answer.body = refused
            answer.headers = [("content-type", "application/json")]
            self._finish(ex, answer, time.perf_counter())
            return answer
        start = time.perf_counter()
        ex.mark = start
        try:
            request = self._http.build_request(method, self.url(path), content=sent or None, headers=headers)
            response = await net.send(self._http, request)
            try:
                ex.response_started_at = time.perf_counter()
                answer.status = response.status_code
                answer.headers = list(response.headers.multi_items())
                async for chunk in response.aiter_raw():
                    answer.chunks.append(chunk)
                    answer.times.append(time.perf_counter() - start)
            finally:
                await response.aclose()
        except httpx.HTTPError as e:
            ex.error = f"{type(e).__name__}: {e}"
            answer.body = b"".join(answer.chunks)
            self._finish(ex, answer, start)
            raise
        answer.body = b"".join(answer.chunks)
        self._finish(ex, answer, start)
        return answer

    def _finish(self, ex: Exchange, answer: Answer, start: float) -> None:
        ex.ended_at = time.perf_counter()
        answer.elapsed = ex.ended_at - start
        ex.status = answer.status or None
        ex.response_headers = answer.headers
        ex.content_type = answer.content_type
        if "event-stream" in ex.content_type:
            ex.response_chunks = list(answer.chunks)
            ex.chunk_times = list(answer.times)
        else:
            ex.response = answer.body
        if self.capture is not None:
            try:
                self.capture(ex)
            except Exception:  # noqa: BLE001 - a capture failure never fails a probe
                pass


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
