"""An answer tapfix fetches itself, whole, to send in place of mitmproxy's error page (the next route's after an
upstream failed, a request sent again on a new connection): mitmproxy has sent no head yet and can send only
one, so the answer is read whole. One httpx client per addon, and the copy into a mitmproxy response."""

from __future__ import annotations

import asyncio
import time

import httpx
from mitmproxy import http
from tapfix.proxy.exchange import Exchange

# Framing httpx has undone (it decodes the body and reads it whole): not copied to the whole answer.
NOT_COPIED = frozenset({"content-encoding", "content-length", "transfer-encoding", "connection", "keep-alive"})


def upstream_client(connect_timeout: float, verify: bool | str) -> httpx.AsyncClient:
    """No read timeout (an engine may think for minutes); only the headers a request carries (no httpx defaults)."""
    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=connect_timeout), verify=verify)
    client.headers.clear()
    return client


async def fetch_whole(
    client: httpx.AsyncClient, request: http.Request, url: str, content: bytes | None, head_timeout: float | None = None
) -> http.Response:
    """Send `request`'s method and headers (httpx sets Host and Content-Length from `url` and `content`) to `url`,
    wait at most `head_timeout` for the answer's head, read the answer whole."""
    headers = [(k, v) for k, v in request.headers.items(multi=True) if k.lower() not in ("host", "content-length")]
    outgoing = client.build_request(request.method, url, headers=headers, content=content)
    async with asyncio.timeout(head_timeout):
        answer = await client.send(outgoing, stream=True)
    try:
        await answer.aread()
    finally:
        await answer.aclose()
    copied = [(k.encode(), v.encode()) for k, v in answer.headers.multi_items() if k.lower() not in NOT_COPIED]
    return http.Response.make(answer.status_code, answer.content, copied)


def answered_whole(ex: Exchange, response: http.Response) -> None:
    """The exchange's answer is now `response`, fetched whole: its capture id, the upstream's status, its time."""
    response.headers["x-tapfix-capture-id"] = ex.id
    ex.upstream_status = response.status_code
    ex.response_started_at = time.perf_counter()
    ex.response = None
