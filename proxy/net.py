"""Listen addresses: how `--listen` is read, whether a host is loopback, how its URL is written; and sending
to an upstream over a kept-alive connection it may already have closed (`send`, below).

One home for these because the loopback rule guards the captures (prompts, code, the upstream's key):
`tapfix run` and `tapfix browse` refuse to leave loopback without a token, and a second, looser copy
of the rule (one treated any name starting with "127." as loopback) is a hole.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `tapfix --help` reads this module and imports no HTTP client
    import httpx

LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost", "ip6-loopback"})
DEFAULT_HOST = "127.0.0.1"
FORMS = "HOST:PORT, :PORT, PORT or [IPv6]:PORT"


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _resolve(host: str) -> set[str] | None:
    """Every address `host` resolves to, or None when it doesn't resolve."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return None
    return {str(info[4][0]).partition("%")[0] for info in infos} or None


def is_loopback(host: str, *, resolve: bool = True) -> bool:
    """An IP literal when `ipaddress` says so; `localhost`; another name when every address it resolves to is.

    `resolve=False` answers for IP literals and the localhost names only: a Host header must be judged
    that way, since a rebound DNS name resolving to 127.0.0.1 is exactly the attack it guards against.
    """
    host = host.strip().strip("[]").lower()
    if not host:
        return False
    ip = _ip(host)
    if ip is not None:
        return ip.is_loopback
    if host in LOOPBACK_NAMES:
        return True
    if not resolve:
        return False
    ips = [_ip(a) for a in _resolve(host) or ()]
    return bool(ips) and all(ip is not None and ip.is_loopback for ip in ips)


def parse_listen(value: str, default_port: int) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT`, `PORT` or `[v6]:PORT` → (host, port); HOST an IP literal or a name that resolves.

    `default_port` is the command's own port (8080, 8000, 8081): the error message shows it as an example.
    Anything else is a ValueError whose message names the value.
    """
    text = value.strip()
    if text.startswith("["):
        inside, bracket, rest = text[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise ValueError(f"{value!r}: expected [IPv6]:PORT, e.g. [::1]:{default_port}")
        host, port = inside, rest[1:]
        if _ip(host) is None or ":" not in host:
            raise ValueError(f"{value!r}: {host!r} inside the brackets is not an IPv6 address")
    elif text.count(":") > 1:
        raise ValueError(f"{value!r}: a second colon; write an IPv6 address in brackets, e.g. [::1]:{default_port}")
    elif ":" in text:
        host, port = text.split(":")
    elif text.isdigit():
        host, port = "", text
    else:
        raise ValueError(f"{value!r}: expected {FORMS}, e.g. 127.0.0.1:{default_port}")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r}: the port must be a number from 0 to 65535")
    host = host or DEFAULT_HOST
    if _ip(host) is None and _resolve(host) is None:
        raise ValueError(f"{value!r}: the host {host!r} does not resolve")
    return host, int(port)


def url(host: str, port: int, scheme: str = "http") -> str:
    """`http://127.0.0.1:8080`, `http://[::1]:8080`: IPv6 hosts in brackets, as RFC 3986 writes them."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{scheme}://{shown}:{port}"


async def send(client: httpx.AsyncClient, request: httpx.Request, *, stream: bool = True) -> httpx.Response:
    """`client.send`, once more, on a new connection, if the connection closed before any byte of a response.

    llama-server closes its side a moment after the last chunk of a streamed response while announcing
    `Keep-Alive: timeout=5`. A client that sends its next request at once, over that connection, gets no
    answer at all (httpx: "Server disconnected without sending a response"): measured against the real
    llama-server, 14 of 30 back-to-back requests after a stream. The server never read such a request, so it
    is sent once more; a second failure is the server's own and is reported as it is."""
    import httpx

    try:
        return await client.send(request, stream=stream)
    except httpx.RemoteProtocolError:
        return await client.send(request, stream=stream)
