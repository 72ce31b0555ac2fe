"""Where a request goes: an upstream's root URL, and joining the client's path onto it."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit


class UpstreamURLError(ValueError):
    pass


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
    def origin(self) -> str:
        default = 443 if self.scheme == "https" else 80
        port = "" if self.port == default else f":{self.port}"
        return f"{self.scheme}://{self.host}{port}"
