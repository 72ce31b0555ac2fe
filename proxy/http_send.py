"""Sending over a kept-alive connection the upstream may already have closed.

llama-server closes its side a moment after the last chunk of a streamed response while announcing
`Keep-Alive: timeout=5`. A client that sends its next request at once, over that connection, gets no
answer at all (httpx: "Server disconnected without sending a response"): measured against the real
llama-server, 14 of 30 back-to-back requests after a stream. The server never read such a request, so it
is sent once more, on a new connection; a second failure is the server's own and is reported as it is.
"""

from __future__ import annotations

import httpx


async def send(client: httpx.AsyncClient, request: httpx.Request, *, stream: bool = True) -> httpx.Response:
    """`client.send`, once more if the connection closed before any byte of a response came back."""
    try:
        return await client.send(request, stream=stream)
    except httpx.RemoteProtocolError:
        return await client.send(request, stream=stream)
