"""Where a request goes: an upstream's root URL, and joining the client's path onto it.

`host` is the bare name or address (what a socket connects to: `::1`); wherever it is written into a
URL or a Host header it goes through `authority`, which brackets an IPv6 literal (`[::1]:8080`, RFC 3986
§3.2.2): `::1:8080` is no address at all, and an upstream behind a virtual host would not know itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit


class UpstreamURLError(ValueError):
    pass


DEFAULT_PORTS = {"http": 80, "https": 443}


def authority(host: str, port: int | None = None, scheme: str | None = None) -> str:
    """`host[:port]` as a URL or a Host header writes it: an IPv6 literal in brackets, the port left
    out when it is the scheme's default (given a scheme) or not given."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    if port is None or (scheme is not None and DEFAULT_PORTS.get(scheme) == port):
        return shown
    return f"{shown}:{port}"


@dataclass(frozen=True, slots=True)
class UpstreamTarget:
    name: str
    url: str
    scheme: str
    host: str
    port: int
    prefix: str  # path prefix without a trailing slash, "" for none

    @classmethod
    def parse(cls, url: str, name: str = "default") -> UpstreamTarget:
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https"):
            raise UpstreamURLError(f"upstream URL {url!r} must start with http:// or https://")
        if not parts.hostname:
            if parts.netloc.count(":") > 1:
                raise UpstreamURLError(
                    f"upstream URL {url!r}: write an IPv6 address in brackets, e.g. http://[::1]:8080"
                )
            raise UpstreamURLError(f"upstream URL {url!r} has no host")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as e:
            raise UpstreamURLError(f"upstream URL {url!r}: {e}") from e
        if parts.query or parts.fragment:
            raise UpstreamURLError(f"upstream URL {url!r} must not carry a query or fragment")
        return cls(name, url.rstrip("/"), parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    def join(self, client_path: str) -> str:
        """The upstream path for a client path; `/v1` is never doubled (root URL may end in /v1)."""
        path, sep, query = client_path.partition("?")
        if not path.startswith("/"):
            path = "/" + path
        if self.prefix.endswith("/v1") and (path == "/v1" or path.startswith("/v1/")):
            path = path[3:] or ""
        joined = (self.prefix + path) or "/"
        return joined + (sep + query if sep else "")

    @property
    def authority(self) -> str:
        """What the upstream's Host header says: `host[:port]`, the scheme's default port left out."""
        return authority(self.host, self.port, self.scheme)

    @property
    def origin(self) -> str:
        return f"{self.scheme}://{self.authority}"
